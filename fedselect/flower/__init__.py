"""Run fedselect selectors in a Flower federation (needs the ``flower`` extra: ``pip install fedselect[flower]``).

- :class:`SelectorStrategy`: any selector as a strategy on Flower's Message API, with
  the oracle's queries sent through the Grid and costs counted by the same ledger as the
  simulator's;
- :func:`make_client_app`: your own train and evaluate functions as a ClientApp that
  answers training, evaluation and every fedselect query;
- :class:`FederationClients`: the clients of a fedselect ``Federation`` served through
  Flower with the simulator's training arithmetic (same experiment, both worlds);
- :class:`LocalGrid`: an in-process Grid for tests and debugging (no Ray);
- :func:`read_node_binding`: the operator's binding of client ids to authenticated nodes.
"""

from __future__ import annotations

try:
    import flwr  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "fedselect.flower needs Flower: pip install 'fedselect[flower]' (flwr>=1.41,<2)"
    ) from exc

from .binding import read_node_binding
from .client import make_client_app
from .federation import FederationClients
from .grid import LocalGrid
from .strategy import FlowerOracle, FlowerRound, FlowerRoundWarning, SelectorStrategy, Traffic

__all__ = [
    "FederationClients",
    "FlowerOracle",
    "FlowerRound",
    "FlowerRoundWarning",
    "LocalGrid",
    "SelectorStrategy",
    "Traffic",
    "make_client_app",
    "read_node_binding",
]
