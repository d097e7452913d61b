"""The per-round record of a Flower run (:class:`FlowerRound`) and the check of the file its lines go to."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..round.record import RoundRecord

__all__ = ["FlowerRound", "check_records_path"]


@dataclass
class FlowerRound(RoundRecord):
    """What one round of a :class:`SelectorStrategy` did: a :class:`~fedselect.simulation.RoundRecord`.

    The one per-round record type of every world, with the fields only a Flower run fills
    (``reported``, ``traffic``, ``rejected``, ``errors``, ``evaluation``, and the measured
    ``wall_seconds`` and ``reply_seconds``), and ``test_accuracy``/``test_loss`` taken from the
    centralised evaluation when it reports ``"test-accuracy"``/``"test-loss"`` (or
    ``"accuracy"``/``"loss"``). The subclass adds no field: only the line format of
    ``records_path`` (:meth:`to_dict`) and :meth:`as_round_record`.

    Attributes
    ----------
    round : int
        t, from 0 (Flower's ``server_round`` is t + 1).
    clients : list of int
        The selection (after merging duplicates).
    reported : list of int
        The chosen clients whose update reached the server and was aggregated.
    failed : list of int
        Clients that did not answer a query or a train message this round (timeout,
        error reply, node gone).
    weights : list of float
        The aggregation weight each reporting client's delta received (the selection's
        own weights as given, or the rule's normalised weights).
    costs : Costs
        The round's costs, counted by the same :class:`~fedselect.ledger.RoundLedger`
        the simulator uses.
    traffic : dict of str to Traffic
        Messages and bytes per kind: ``hello``, ``loss``, ``update``, ``trial``,
        ``train`` and ``evaluate``.
    seconds : float
        Wall-clock time of selection, training and aggregation (not evaluation), the server's
        own computation included.
    wall_seconds : float
        Measured seconds the round waited on its clients: each exchange of its oracle questions
        (``loss``, ``update``, ``trial``) and its training, from sending to the last reply (or the
        timeout), summed; not the hellos of new nodes nor the evaluation. The measured
        counterpart of a simulated round's duration.
    reply_seconds : dict of int to float
        For each client whose training reply was used (a ``train`` message, or an oracle's
        update question), seconds from sending it the message to the server's first sight of
        its reply, by the server's own clock (never the reply's timestamp, a client's claim):
        a client can look slower than it was, by answering late, never faster. These are
        the ``durations`` a selector that needs ``"durations"`` learns (Oort's system speed).
    rejected : dict of int to str
        Clients whose reply was refused this round, with the reason (also logged).
    errors : list of str
        What went wrong this round and was contained: a selector's exception in ``select``
        or ``update`` fed by the clients' answers, a non-finite aggregate.
    evaluation : dict of str to float
        The centralised evaluation after the round (``start(evaluate_fn=...)``), if any.
    """

    reported: list[int] = field(default_factory=list)  # type: ignore[assignment]

    def to_dict(self) -> dict[str, Any]:
        """The record as plain JSON-able values: the keys ``records_path`` lines have always had, then
        ``wall_seconds`` and ``reply_seconds`` when measured."""
        out = {
            "round": self.round,
            "clients": list(self.clients),
            "reported": list(self.reported),
            "failed": list(self.failed),
            "weights": list(self.weights),
            "costs": self.costs.to_dict(),
            "traffic": {k: v.to_dict() for k, v in self.traffic.items()},
            "seconds": self.seconds,
            "rejected": {str(k): v for k, v in self.rejected.items()},
            "errors": list(self.errors),
            "evaluation": dict(self.evaluation),
        }
        optional = self._optional_dict()
        out.update({k: optional[k] for k in ("wall_seconds", "reply_seconds") if k in optional})
        return out

    def as_round_record(self) -> RoundRecord:
        """The same round as a plain :class:`~fedselect.simulation.RoundRecord` (for a :class:`History`)."""
        return RoundRecord.from_dict(RoundRecord.to_dict(self))


def check_records_path(path: Any) -> None:
    """TypeError unless ``path`` is a ``str`` or ``os.PathLike`` (an int would be opened as a file descriptor);
    ValueError unless it names a file that can be appended to: its directory exists and is writable, and it is
    not a directory (or an existing file that is not writable)."""
    if not isinstance(path, str | os.PathLike):
        raise TypeError(
            f"SelectorStrategy.start: records_path must be a path (str or os.PathLike), got {type(path).__name__} "
            f"{path!r}"
        )
    name = os.fspath(path)
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    parent = os.path.dirname(os.path.abspath(name))
    problem = None
    if not name:
        problem = "is empty"
    elif not os.path.isdir(parent):
        problem = f"is in {parent!r}, which is not an existing directory"
    elif os.path.isdir(name):
        problem = "is a directory"
    elif os.path.exists(name) and not os.access(name, os.W_OK):
        problem = "is a file that cannot be written"
    elif not os.path.exists(name) and not os.access(parent, os.W_OK | os.X_OK):
        problem = f"is in {parent!r}, which cannot be written"
    if problem is not None:
        raise ValueError(f"SelectorStrategy.start: records_path={name!r} {problem}")
