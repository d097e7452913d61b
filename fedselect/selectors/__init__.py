"""Selection schemes, one module each; every module registers its classes through ``register_selectors``.

The built-in selector classes are importable from here (``from fedselect.selectors import
FedCorSelector``); each module is imported on first use, so ``import fedselect`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

#: class name -> the module (under fedselect.selectors) that defines it
_CLASSES = {
    "ActiveFLSelector": "afl",
    "ClusteredSamplingSelector": "clustered",
    "DataSizeSelector": "data_size",
    "DeadlineRandomSelector": "deadline_random",
    "FedCorSelector": "fedcor",
    "HCSFedSelector": "hcsfed",
    "LargestDistanceSelector": "ldcs",
    "OptimalClientSamplingSelector": "ocs",
    "OortSelector": "oort",
    "PowerOfChoiceSelector": "power_of_choice",
    "RandomSelector": "random",
    "RoundRobinSelector": "round_robin",
}

__all__ = sorted(_CLASSES)


def __getattr__(name: str) -> Any:
    module = _CLASSES.get(name)
    if module is None:
        raise AttributeError(f"module 'fedselect.selectors' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_CLASSES])
