"""The per-sample losses the engine trains and evaluates with: the built-in ones by name, or a user's callable."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["LOSSES", "LossFn", "check_losses", "resolve_loss"]

LOSSES = ("cross-entropy", "mse")
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if targets.is_floating_point():
        raise ValueError(
            "loss='cross-entropy' needs integer class labels, but the targets are floats (a regression "
            "federation?); use loss='mse' or a callable loss(outputs, targets) -> per-sample losses"
        )
    return F.cross_entropy(outputs, targets, reduction="none")


def _mse(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if not targets.is_floating_point():
        raise ValueError(
            "loss='mse' needs float targets (regression), but the targets are integer class labels; "
            "cast y to float for a regression, or pass a callable loss (e.g. MSE against one-hot labels)"
        )
    if targets.numel() != outputs.numel():
        raise ValueError(
            f"loss='mse': the model gives {math.prod(outputs.shape[1:])} outputs per sample but there are "
            f"{math.prod(targets.shape[1:])} targets per sample; build the model with as many outputs as targets "
            "(Federation.n_outputs; 1-D float targets need one output)"
        )
    d = (outputs - targets.reshape(outputs.shape)) ** 2
    return d.reshape(d.shape[0], -1).mean(1)


def resolve_loss(loss: str | LossFn) -> LossFn:
    """The per-sample loss function named by ``loss`` (see :class:`Engine`)."""
    if callable(loss):
        return loss
    if loss == "cross-entropy":
        return _cross_entropy
    if loss == "mse":
        return _mse
    raise ValueError(f"loss={loss!r} is not one of {LOSSES} or a callable loss(outputs, targets) -> per-sample losses")


def check_losses(values: Any, n: int, loss: Any) -> torch.Tensor:
    """``values`` (what a user's ``loss`` returned for ``n`` samples), checked to be one loss per sample."""
    if not isinstance(values, torch.Tensor) or tuple(values.shape) != (n,):
        got = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
        raise ValueError(
            f"loss={loss!r} must return one loss per sample, a tensor of shape ({n},) for {n} samples "
            f"(reduction 'none'), got {got}"
        )
    return values


def is_cross_entropy(loss_fn: LossFn) -> bool:
    """Whether ``loss_fn`` is the built-in cross-entropy (whose gradient the chain paths write out by hand)."""
    return loss_fn is _cross_entropy
