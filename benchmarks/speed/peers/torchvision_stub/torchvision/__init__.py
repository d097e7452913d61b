"""Import-only stand-in for torchvision, for the peers' environments of ``bench_peers``.

FLGo 0.4.4 and FedLab 1.3.0 import ``torchvision``, ``torchvision.datasets`` (``MNIST``, ``CIFAR10``,
``utils``, ``vision``), ``torchvision.transforms`` (``Compose``, ``ToTensor``, ``Normalize``,
``RandomCrop``, ``functional``, ...) and ``torchvision.models`` at module level, while the benchmark
hands them tensors and never loads an image. Every module here answers any attribute with a
placeholder, so those imports succeed, and the placeholder raises as soon as it is called.
"""

from __future__ import annotations

import sys
import types
from typing import Any, NoReturn

__version__ = "0.28.0+fedselectstub"


class _Missing:
    """A name of torchvision that this stand-in does not provide."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError(f"{self._name} is not available: this torchvision is fedselect's import-only stub")

    def __getattr__(self, attr: str) -> _Missing:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)  # ``class X(torchvision.datasets.VisionDataset)`` still defines X


def _module(name: str) -> types.ModuleType:
    module = types.ModuleType(name, f"fedselect's import-only stub of {name}")

    def __getattr__(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{name}.{attr}")

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    module.__path__ = []  # a package: ``import torchvision.datasets.utils`` finds the registered child
    sys.modules[name] = module
    return module


for _parent, _child in (
    ("torchvision", "datasets"),
    ("torchvision", "transforms"),
    ("torchvision", "models"),
    ("torchvision", "io"),
    ("torchvision", "ops"),
    ("torchvision", "utils"),
    ("torchvision.datasets", "utils"),
    ("torchvision.datasets", "vision"),
    ("torchvision.transforms", "functional"),
    ("torchvision.models", "detection"),
    ("torchvision.models", "segmentation"),
):
    setattr(sys.modules[_parent], _child, _module(f"{_parent}.{_child}"))


def __getattr__(attr: str) -> Any:
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _Missing(f"torchvision.{attr}")
