"""Registers the built-in models; torch is imported only when a model is built."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .hookspecs import hookimpl


def logistic(input_shape: Sequence[int], n_classes: int, **params: Any) -> Any:
    """Multinomial logistic regression (HCSFed's model)."""
    from .simulation.models import logistic as build

    return build(input_shape, n_classes, **params)


def mlp(input_shape: Sequence[int], n_classes: int, **params: Any) -> Any:
    """FedCor's MLP, input-64-30-classes, optional dropout (see FedCorMLP)."""
    from .simulation.models import FedCorMLP

    return FedCorMLP(input_shape, n_classes, **params)


def cnn(input_shape: Sequence[int], n_classes: int, **params: Any) -> Any:
    """FedCor's CIFAR-10 CNN (see FedCorCNN)."""
    from .simulation.models import FedCorCNN

    return FedCorCNN(input_shape, n_classes, **params)


def cnn_flsim(input_shape: Sequence[int], n_classes: int, **params: Any) -> Any:
    """FLSim's CIFAR-10 CNN, FedLDCS's (see FLSimCNN)."""
    from .simulation.models import FLSimCNN

    return FLSimCNN(input_shape, n_classes, **params)


def resnet_gn(input_shape: Sequence[int], n_classes: int, **params: Any) -> Any:
    """A CIFAR ResNet with GroupNorm, ResNet-8 by default (see ResNetGN)."""
    from .simulation.models import ResNetGN

    return ResNetGN(input_shape, n_classes, **params)


@hookimpl
def register_models(register: Any) -> None:
    register(logistic, name="logistic", aliases=("logreg",))
    register(mlp, name="mlp")
    register(cnn, name="cnn")
    register(cnn_flsim, name="cnn-flsim")
    register(resnet_gn, name="resnet-gn")
