"""fedselect: client selection for federated learning, pluggable and measured.

The public API::

    import fedselect
    fed = fedselect.make_federation("digits", partition="shards", n_clients=20, random_state=0)
    trainer = fedselect.FederatedTrainer(selector=fedselect.get_selector("power-of-choice"), rounds=30)
    trainer.fit(fed).history_.rounds_to_accuracy(0.8)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .hookspecs import hookimpl
from .optim import LocalSGD
from .plugins import get_selector, get_selector_class, list_datasets, list_models, list_selectors
from .selection import BaseSelector, ClientOracle, ClientPool, RoundFeedback, Selection, SelectionError

if TYPE_CHECKING:
    from .data import Federation, make_federation
    from .profiles import SystemProfiles
    from .simulation import FederatedTrainer, History

# The simulator and the data loaders pull in torch; load them on first use so that
# ``import fedselect`` (and ``fedselect list``) stays quick.
_LAZY = {
    "Federation": "fedselect.data",
    "make_federation": "fedselect.data",
    "FederatedTrainer": "fedselect.simulation",
    "History": "fedselect.simulation",
    "SystemProfiles": "fedselect.profiles",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fedselect' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "BaseSelector",
    "ClientOracle",
    "ClientPool",
    "FederatedTrainer",
    "Federation",
    "History",
    "LocalSGD",
    "RoundFeedback",
    "Selection",
    "SelectionError",
    "SystemProfiles",
    "__version__",
    "get_selector",
    "get_selector_class",
    "hookimpl",
    "list_datasets",
    "list_models",
    "list_selectors",
    "make_federation",
]
