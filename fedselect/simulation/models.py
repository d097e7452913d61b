"""The models the simulator trains: logistic regression, FedCor's MLP and FedCor's CNN.

Every builder has the signature ``builder(input_shape, n_classes, **params)`` and is
registered through the ``register_models`` hook, so plugins can add models the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["FedCorCNN", "FedCorMLP", "LogisticRegression", "build_model"]


def _check_shape(input_shape: Sequence[int], n_classes: int, who: str) -> tuple[int, ...]:
    shape = tuple(int(s) for s in input_shape)
    if not shape or any(s <= 0 for s in shape):
        raise ValueError(f"{who}: input_shape={input_shape!r} must be a non-empty tuple of positive sizes")
    if int(n_classes) < 1:  # 1 output serves a regression with one target
        raise ValueError(f"{who}: n_classes={n_classes!r} (the number of outputs) must be at least 1")
    return shape


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: flatten, one linear layer (HCSFed's model)."""

    def __init__(self, input_shape: Sequence[int], n_classes: int) -> None:
        super().__init__()
        shape = _check_shape(input_shape, n_classes, "LogisticRegression")
        self.linear = nn.Linear(math.prod(shape), n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(start_dim=1))


class FedCorMLP(nn.Module):
    """FedCor's MLP for FMNIST: input-64-30-classes with ReLU (FedCor appendix C).

    Parameters
    ----------
    input_shape : tuple of int
        Shape of one sample, e.g. ``(1, 28, 28)``.
    n_classes : int
    hidden : tuple of int, default (64, 30)
        Hidden widths.
    dropout : float, default 0.0
        Dropout after each hidden Linear layer, before its ReLU, as the official FedCor
        code (src/models.py) does with p = 0.5; 0 disables it.
    """

    def __init__(
        self, input_shape: Sequence[int], n_classes: int, *, hidden: Sequence[int] = (64, 30), dropout: float = 0.0
    ) -> None:
        super().__init__()
        shape = _check_shape(input_shape, n_classes, "FedCorMLP")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"FedCorMLP: dropout={dropout!r} must be in [0, 1)")
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(shape)
        for h in hidden:
            layers.append(nn.Linear(width, int(h)))
            if dropout > 0:
                layers.append(nn.Dropout(float(dropout)))
            layers.append(nn.ReLU())
            width = int(h)
        layers.append(nn.Linear(width, n_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class FedCorCNN(nn.Module):
    """FedCor's CNN for CIFAR-10 (appendix C).

    conv3x3(32)-ReLU-maxpool2, conv3x3(64)-ReLU-maxpool2, conv3x3(64)-ReLU (no padding),
    fc(64)-ReLU, fc(n_classes). The flattened size is computed from ``input_shape``, so the
    same architecture also runs on 1 x 28 x 28 images.
    """

    def __init__(self, input_shape: Sequence[int], n_classes: int) -> None:
        super().__init__()
        shape = _check_shape(input_shape, n_classes, "FedCorCNN")
        if len(shape) != 3:
            raise ValueError(f"FedCorCNN: input_shape={input_shape!r} must be (channels, height, width)")
        self.features = nn.Sequential(
            nn.Conv2d(shape[0], 32, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3),
            nn.ReLU(),
            nn.Flatten(),
        )
        try:
            with torch.no_grad():
                flat = self.features(torch.zeros(1, *shape)).shape[1]
        except RuntimeError:
            flat = 0
        if flat == 0:
            raise ValueError(f"FedCorCNN: input_shape={input_shape!r} is too small for three 3x3 convolutions")
        self.classifier = nn.Sequential(nn.Linear(flat, 64), nn.ReLU(), nn.Linear(64, n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def logistic(input_shape: Sequence[int], n_classes: int, **params: Any) -> nn.Module:
    if params:
        raise TypeError(f"model 'logistic' takes no parameters, got {sorted(params)}")
    return LogisticRegression(input_shape, n_classes)


def build_model(name: str | nn.Module, input_shape: Sequence[int], n_classes: int, **params: Any) -> nn.Module:
    """Build a registered model by name (``"logistic"``, ``"mlp"``, ``"cnn"``, a plugin's), or pass a module through."""
    if isinstance(name, nn.Module):
        return name
    from ..plugins import get_model_builder

    builder = get_model_builder(name)
    return builder(tuple(input_shape), int(n_classes), **params)
