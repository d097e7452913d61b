"""The models the simulator trains: logistic regression, FedCor's MLP and CNN, FLSim's CNN and a ResNet with GroupNorm.

Every builder has the signature ``builder(input_shape, n_classes, **params)`` and is
registered through the ``register_models`` hook, so plugins can add models the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["FLSimCNN", "FedCorCNN", "FedCorMLP", "LogisticRegression", "ResNetGN", "build_model"]


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


def _image_shape(input_shape: Sequence[int], n_classes: int, who: str) -> tuple[int, int, int]:
    shape = _check_shape(input_shape, n_classes, who)
    if len(shape) != 3:
        raise ValueError(f"{who}: input_shape={input_shape!r} must be (channels, height, width)")
    return shape[0], shape[1], shape[2]


class FLSimCNN(nn.Module):
    """FLSim's CIFAR-10 CNN, the one FedLDCS's experiments ran on FLSim.

    ``SimpleConvNet`` of FLSim's CIFAR-10 tutorial (facebookresearch/FLSim,
    ``flsim/utils/example_utils.py``, used by ``examples/cifar10_example.py``), layer for layer:
    four blocks of conv3x3(32 channels, stride 1, padding 2) - GroupNorm(32 groups, 32 channels,
    affine) - ReLU - maxpool2, then dropout and fc(n_classes). As in FLSim, the four blocks share
    one GroupNorm module (one affine weight and bias applied after every convolution). On 32 x 32
    inputs the maps are 34 -> 17, 19 -> 9, 11 -> 5, 7 -> 3, so the fc layer takes 32 x 3 x 3 = 288
    features (FLSim's ``out_channels * (stride + padding) ** 2``); here the size is computed from
    ``input_shape``, so the same network runs on 1 x 28 x 28 images too (288 features as well).
    31,594 parameters for CIFAR-10. GroupNorm keeps no running statistics and normalises each
    sample by itself, so the batched engine trains it on its padded path, like a model without
    normalisation.

    Parameters
    ----------
    input_shape : tuple of int
        ``(channels, height, width)``.
    n_classes : int
    dropout : float, default 0.0
        Dropout before the fc layer (FLSim's ``dropout_rate``, default 0).
    """

    def __init__(self, input_shape: Sequence[int], n_classes: int, *, dropout: float = 0.0) -> None:
        super().__init__()
        channels, height, width = _image_shape(input_shape, n_classes, "FLSimCNN")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"FLSimCNN: dropout={dropout!r} must be in [0, 1)")
        out = 32
        self.layers = nn.ModuleList([nn.Conv2d(channels if i == 0 else out, out, 3, 1, 2) for i in range(4)])
        self.gn_relu = nn.Sequential(nn.GroupNorm(out, out, affine=True), nn.ReLU(), nn.MaxPool2d(2, 2))
        for _ in range(4):  # each block: +2 from the padding, then halved by the pooling
            height, width = (height + 2) // 2, (width + 2) // 2
        self.dropout = nn.Dropout(float(dropout))
        self.fc = nn.Linear(out * height * width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.layers:
            x = self.gn_relu(conv(x))
        return self.fc(self.dropout(x.flatten(start_dim=1)))


class _BasicBlock(nn.Module):
    """conv3x3-GN-ReLU-conv3x3-GN plus a shortcut (identity, or conv1x1-GN where the shape changes), ReLU."""

    def __init__(self, inputs: int, outputs: int, stride: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.norm1 = nn.GroupNorm(groups, outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.norm2 = nn.GroupNorm(groups, outputs)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.GroupNorm(groups, outputs)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.norm1(self.conv1(x)))
        return torch.relu(self.norm2(self.conv2(out)) + self.shortcut(x))


class ResNetGN(nn.Module):
    """A small CIFAR ResNet with GroupNorm in place of batch norm.

    The CIFAR-10 ResNets of He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016),
    Sec. 4.2: ``depth = 6 n + 2`` layers, a conv3x3(w) - GN - ReLU stem, three stages of n basic
    blocks with w, 2 w and 4 w channels (the first block of stages 2 and 3 halves the map with
    stride 2), global average pooling and fc(n_classes). Each block is conv3x3-GN-ReLU-conv3x3-GN
    plus a shortcut, then ReLU; the shortcut is the identity, or conv1x1-GN where the shape changes
    (He et al.'s projection shortcut, option B). Every batch norm is a GroupNorm (Wu and He, ECCV
    2018) with ``groups`` groups, as federated work does because GroupNorm keeps no running
    statistics to average and does not mix the samples of a batch (Hsieh et al., ICML 2020, "The
    Non-IID Data Quagmire of Decentralized Machine Learning"; Reddi et al., ICLR 2021, "Adaptive
    Federated Optimization", ResNet-18 with two groups per GroupNorm). The defaults (depth 8, width
    16, 2 groups) give ResNet-8 with 16 / 32 / 64 channels, 78,042 parameters for CIFAR-10;
    ``depth=20`` is He et al.'s ResNet-20 (272,474).

    Parameters
    ----------
    input_shape : tuple of int
        ``(channels, height, width)``, e.g. ``(3, 32, 32)``.
    n_classes : int
    depth : int, default 8
        6 n + 2 for n >= 1 (8, 14, 20, 32, 44, 56, ...).
    width : int, default 16
        Channels of the stem and the first stage (w).
    groups : int, default 2
        Groups of every GroupNorm; must divide ``width``.
    """

    def __init__(
        self, input_shape: Sequence[int], n_classes: int, *, depth: int = 8, width: int = 16, groups: int = 2
    ) -> None:
        super().__init__()
        channels, _, _ = _image_shape(input_shape, n_classes, "ResNetGN")
        for name, value in (("depth", depth), ("width", width), ("groups", groups)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ResNetGN: {name}={value!r} must be a positive int")
        if depth < 8 or (depth - 2) % 6:
            raise ValueError(f"ResNetGN: depth={depth!r} must be 6 n + 2 with n >= 1 (8, 14, 20, 32, ...)")
        if width % groups:
            raise ValueError(f"ResNetGN: groups={groups!r} must divide width={width!r}")
        n = (depth - 2) // 6
        self.stem = nn.Sequential(
            nn.Conv2d(channels, width, 3, 1, 1, bias=False), nn.GroupNorm(groups, width), nn.ReLU()
        )
        blocks: list[nn.Module] = []
        inputs = width
        for stage, outputs in enumerate((width, 2 * width, 4 * width)):
            for i in range(n):
                blocks.append(_BasicBlock(inputs, outputs, 2 if stage > 0 and i == 0 else 1, groups))
                inputs = outputs
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(inputs, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def logistic(input_shape: Sequence[int], n_classes: int, **params: Any) -> nn.Module:
    if params:
        raise TypeError(f"model 'logistic' takes no parameters, got {sorted(params)}")
    return LogisticRegression(input_shape, n_classes)


def build_model(name: str | nn.Module, input_shape: Sequence[int], n_classes: int, **params: Any) -> nn.Module:
    """Build a registered model by name (``"logistic"``, ``"mlp"``, ``"cnn"``, ``"cnn-flsim"``, ``"resnet-gn"``, a
    plugin's), or pass a module through."""
    if isinstance(name, nn.Module):
        return name
    from ..plugins import get_model_builder

    builder = get_model_builder(name)
    return builder(tuple(input_shape), int(n_classes), **params)
