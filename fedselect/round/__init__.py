"""One round of federated training and the oracle's questions, each written once, over a transport.

:mod:`fedselect.round.play` plays the round (select, validate, train, weigh, apply, feedback,
update); :mod:`fedselect.round.oracle` answers the selector's questions and carries the round's
training for any world that implements :class:`~fedselect.round.oracle.OracleTransport`.
"""

from .oracle import OracleTransport, RoundOracle, TrainingWork, TransportPolicies
from .play import (  # noqa: F401  (Contain: re-exported as before)
    Aggregate,
    Apply,
    Contain,
    OpenRound,
    Reports,
    Transport,
    conclude_round,
    open_round,
    play_round,
)

__all__ = [
    "Aggregate",
    "Apply",
    "OpenRound",
    "OracleTransport",
    "Reports",
    "RoundOracle",
    "TrainingWork",
    "TransportPolicies",
    "Transport",
    "conclude_round",
    "open_round",
    "play_round",
]
