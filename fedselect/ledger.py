"""One cost ledger: what a round's oracle knows and what every answer cost.

Every runtime that answers a selector's questions (the simulator's
:class:`~fedselect.simulation.transport.SimulationOracle`, :class:`fedselect.testing.SyntheticOracle`
and the Flower strategy's oracle) keeps its bookkeeping in one :class:`RoundLedger` per round,
so the three count the same questions the same way (what a deployment cannot do alike, such
as applying a ``transform`` on the client, is documented where it happens):

* a client receives the round's global model ``w^t`` at most once per round (one model down);
* a client's loss ``l_k(w^t)`` reaches the server at most once per round (one scalar up),
  and is reused by later questions and by the round itself;
* a client trains from ``w^t`` at most once per round: a client whose update was computed
  for an oracle question and that is then chosen is not trained (nor charged) again;
* a full update reaches the server at most once per round (one model up);
* a client that did not answer (unavailable in simulation, a timeout or an error reply in
  deployment) is charged for what was sent to it, answers NaN, is not contacted again in
  that round and does not report (see :class:`fedselect.ClientOracle`).

The ledger holds no model arithmetic and imports no torch; the runtime computes, the ledger
charges and remembers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from .selection import check_client_ids

__all__ = ["PARTIAL_WEIGHTS", "Costs", "RoundLedger", "reporter_weights"]

PARTIAL_WEIGHTS = ("rescale", "as-given")


@dataclass
class Costs:
    """Communication and computation, counted per round and summed over a run.

    Attributes
    ----------
    models_down : int
        Global models sent to clients (one per client per round at most for the
        round's own model; trial rounds send their trial model again).
    models_up : int
        Full local models (or full-size updates) sent to the server.
    scalars_up : int
        Single numbers sent up (losses).
    floats_up : int
        Floats of compressed updates sent up (e.g. HCSFed's compressed gradients).
    local_trainings : int
        Client local-training runs (the round's own, trials' and probes').
    local_steps : int
        Local SGD steps summed over clients.
    sample_gradients : int
        Per-sample gradients computed (samples in all local SGD minibatches).
    samples_evaluated : int
        Forward passes for losses (clients' losses and the test set).
    """

    models_down: int = 0
    models_up: int = 0
    scalars_up: int = 0
    floats_up: int = 0
    local_trainings: int = 0
    local_steps: int = 0
    sample_gradients: int = 0
    samples_evaluated: int = 0

    def __add__(self, other: Costs) -> Costs:
        return Costs(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def __iadd__(self, other: Costs) -> Costs:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def to_dict(self) -> dict[str, int]:
        return {k: int(v) for k, v in asdict(self).items()}

    def floats_communicated(self, model_size: int) -> int:
        """Total floats on the wire: models both ways at ``model_size`` floats, plus scalars and compressed floats."""
        return (self.models_down + self.models_up) * model_size + self.scalars_up + self.floats_up


class RoundLedger:
    """What one round's oracle knows and has charged.

    A runtime creates one ledger per round, asks it which clients still need a message
    (:meth:`send_model`, :meth:`losses_to_ask`, :meth:`to_train`), does the work, and
    records what came back (:meth:`record_losses`, :meth:`record_training`,
    :meth:`upload`, :meth:`record_floats_up`, :meth:`record_trial`). The ledger charges
    :attr:`costs` as it records.

    Parameters
    ----------
    n_clients : int
        N, the number of clients in the federation.
    round : int
        t, the round whose questions are recorded.
    unavailable : iterable of int, optional
        Clients known before the round starts not to answer in it (the simulator's
        dropout draw). They count as failed from the start: messages to them are still
        charged (the server does not know they will not answer), they answer NaN.

    Attributes
    ----------
    costs : Costs
        Everything charged so far this round.
    """

    def __init__(self, n_clients: int, round: int, *, unavailable: Iterable[int] = ()) -> None:
        if isinstance(n_clients, bool) or not isinstance(n_clients, (int, np.integer)) or n_clients < 1:
            raise ValueError(f"RoundLedger: n_clients={n_clients!r} must be an integer >= 1")
        self.n_clients = int(n_clients)
        self.round = int(round)
        self.costs = Costs()
        # One flag (or value) per client, so that a question about all N clients costs a few vectorised
        # passes rather than N dictionary operations (100,000 clients: milliseconds, not a second).
        n = self.n_clients
        self._holding = np.zeros(n, dtype=bool)
        self._has_loss = np.zeros(n, dtype=bool)
        self._loss_values = np.full(n, np.nan)
        self._trained = np.zeros(n, dtype=bool)
        self._updates: dict[int, Any] = {}
        self._uploaded = np.zeros(n, dtype=bool)
        self._failed = np.zeros(n, dtype=bool)
        self._failed[self.ids(np.fromiter(unavailable, dtype=np.int64), "unavailable")] = True
        self._unknown_failures = self._failed.copy()  # unavailable, but the server has not sent them anything yet

    # -- ids and failures ------------------------------------------------------------
    def ids(self, ids: Any, what: str) -> np.ndarray:
        """``ids`` validated by :func:`fedselect.selection.check_client_ids` (errors name ``what``)."""
        return check_client_ids(ids, self.n_clients, what=what)

    @property
    def failed(self) -> frozenset[int]:
        """Clients that did not answer this round (unavailable, timed out, or replied with an error)."""
        return frozenset(np.flatnonzero(self._failed).tolist())

    def answering(self) -> np.ndarray:
        """Every client id that has not failed (so far) this round, ascending."""
        return np.flatnonzero(~self._failed)

    def is_failed(self, k: int) -> bool:
        return bool(self._failed[int(k)])

    def failed_mask(self, ids: Any) -> np.ndarray:
        """For each of ``ids``, whether it has failed this round (one vectorised lookup)."""
        return self._failed[self.ids(ids, "failed_mask")]

    def mark_failed(self, ids: Any) -> None:
        """Record that these clients did not answer; they are not contacted again this round."""
        self._failed[self.ids(ids, "mark_failed")] = True

    @property
    def known_failed(self) -> frozenset[int]:
        """Failed clients the server knows about: it sent them a message this round and got no answer.

        An unavailable client the server has not contacted yet is failed but not known;
        the first message sent to it (and charged) makes it known, and it is not contacted
        again.
        """
        return frozenset(np.flatnonzero(self._failed & ~self._unknown_failures).tolist())

    def contacted(self, ids: Any) -> None:
        """Record that a message went to these clients (an unavailable one among them is now known to fail)."""
        self._unknown_failures[self.ids(ids, "contacted")] = False

    def alive(self, ids: Any) -> np.ndarray:
        """The entries of ``ids`` (order kept) that have not failed."""
        arr = self.ids(ids, "alive")
        return arr[~self._failed[arr]]

    # -- the global model -------------------------------------------------------------
    def holds_model(self, k: int) -> bool:
        return bool(self._holding[int(k)])

    def send_model(self, ids: Any) -> np.ndarray:
        """Charge one model down per client not yet holding ``w^t``; return those (distinct, in order).

        Failed clients that were never sent the model are charged too when a runtime
        sends them a message (the server cannot know they will not answer).
        """
        arr = self.ids(ids, "send_model")
        self._unknown_failures[arr] = False
        new = _distinct(arr)
        new = new[~self._holding[new]]
        self.costs.models_down += int(new.size)
        self._holding[new] = True
        return new

    # -- losses on w^t -------------------------------------------------------------------
    def losses_to_ask(self, ids: Any) -> np.ndarray:
        """Distinct ids (in order) whose ``l_k(w^t)`` is not known and that have not failed."""
        arr = _distinct(self.ids(ids, "losses"))
        return arr[~(self._has_loss[arr] | self._failed[arr])]

    def record_losses(self, ids: Any, values: Any, *, samples_evaluated: int = 0) -> None:
        """Store the losses that came back: one scalar up per finite value.

        A NaN value means the client did not answer: it is marked failed.
        ``samples_evaluated`` is the number of forward passes the clients made.
        """
        arr = self.ids(ids, "record_losses")
        vals = np.asarray(values, dtype=np.float64).reshape(-1)
        if vals.shape[0] != arr.shape[0]:
            raise ValueError(f"RoundLedger.record_losses: {vals.shape[0]} values for {arr.shape[0]} clients")
        finite = np.isfinite(vals)
        self._failed[arr[~finite]] = True
        # The first finite value of each client not known yet is kept (and charged); later ones are ignored.
        got, first = np.unique(arr[finite], return_index=True)
        new = ~self._has_loss[got]
        self._loss_values[got[new]] = vals[finite][first[new]]
        self._has_loss[got[new]] = True
        self.costs.scalars_up += int(new.sum())
        self.costs.samples_evaluated += int(samples_evaluated)

    def loss(self, ids: Any) -> np.ndarray:
        """Known losses of ``ids`` (NaN where unknown or failed)."""
        arr = self.ids(ids, "losses")
        return np.where(self._failed[arr], np.nan, self._loss_values[arr])

    def has_loss(self, k: int) -> bool:
        return bool(self._has_loss[int(k)] and not self._failed[int(k)])

    def has_loss_mask(self, ids: Any) -> np.ndarray:
        """For each of ``ids``, whether its ``l_k(w^t)`` reached the server this round (and it has not failed)."""
        arr = self.ids(ids, "has_loss_mask")
        return self._has_loss[arr] & ~self._failed[arr]

    # -- local training from w^t -------------------------------------------------------------
    def to_train(self, ids: Any) -> np.ndarray:
        """Distinct ids (in order) not yet trained from ``w^t`` this round and not failed."""
        arr = _distinct(self.ids(ids, "train"))
        return arr[~(self._trained[arr] | self._failed[arr])]

    def record_training(
        self,
        ids: Any,
        updates: Sequence[Any] | None = None,
        *,
        steps: int = 0,
        sample_gradients: int = 0,
    ) -> None:
        """Charge one local training per id (plus the SGD steps and per-sample gradients given); keep the updates.

        ``updates`` holds one object per id (whatever the runtime computes with: a
        tensor, an array); None keeps a placeholder (the runtime holds the update
        elsewhere, e.g. on the client). An id already trained this round is not charged a
        second training (a repeated id keeps its last update); ``steps`` and
        ``sample_gradients`` are added as given, so a runtime passes only the work it
        actually did (it asks :meth:`to_train` first).
        """
        arr = self.ids(ids, "record_training")
        if updates is not None and len(updates) != arr.shape[0]:
            raise ValueError(f"RoundLedger.record_training: {len(updates)} updates for {arr.shape[0]} clients")
        fresh = _distinct(arr)
        new = int((~self._trained[fresh]).sum())
        self._trained[arr] = True
        keys = arr.tolist()
        self._updates.update(dict.fromkeys(keys) if updates is None else zip(keys, updates))
        self.costs.local_trainings += new
        self.costs.local_steps += int(steps)
        self.costs.sample_gradients += int(sample_gradients)

    def trained(self, k: int) -> bool:
        return bool(self._trained[int(k)])

    def answered(self) -> np.ndarray:
        """Clients whose loss or update has reached the server this round, ascending."""
        return np.flatnonzero(self._trained | self._has_loss)

    def update(self, k: int) -> Any:
        """The update client ``k`` computed from ``w^t`` this round (KeyError if it did not train)."""
        return self._updates[int(k)]

    # -- uploads ------------------------------------------------------------------------------
    def upload(self, ids: Any) -> int:
        """Charge one model up per client whose full update has not reached the server this round."""
        new = _distinct(self.ids(ids, "upload"))
        new = new[~self._uploaded[new]]
        self.costs.models_up += int(new.size)
        self._uploaded[new] = True
        return int(new.size)

    def uploaded(self, k: int) -> bool:
        return bool(self._uploaded[int(k)])

    def uploaded_mask(self, ids: Any) -> np.ndarray:
        """For each of ``ids``, whether its full update has reached the server this round."""
        return self._uploaded[self.ids(ids, "uploaded_mask")]

    def record_floats_up(self, n: int) -> None:
        """Charge ``n`` floats of compressed (transformed) updates sent up."""
        self.costs.floats_up += int(n)

    def record_scalars_up(self, n: int) -> None:
        """Charge ``n`` scalars sent up besides the losses on ``w^t``.

        A transport whose selector ``needs`` ``"sample_losses"`` charges one per reporter
        (its ``RoundFeedback.sample_loss_sq``, sent with its update).
        """
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"RoundLedger.record_scalars_up: n={n!r} must be an integer >= 0")
        self.costs.scalars_up += int(n)

    def record_evaluation(self, samples: int) -> None:
        """Charge forward passes that are not a client's loss on ``w^t`` (e.g. the test set)."""
        self.costs.samples_evaluated += int(samples)

    def record_trial(self, n_answered: int, *, samples_evaluated: int = 0, n_sent: int | None = None) -> None:
        """Charge a trial model sent to ``n_sent`` clients (default all N), of whom ``n_answered`` sent a loss back.

        It goes to every client not known to have failed this round (:attr:`known_failed`):
        an unavailable client not contacted yet is charged as sent; a deployment also leaves
        out the clients without a node.
        """
        self.costs.models_down += self.n_clients if n_sent is None else int(n_sent)
        self.costs.scalars_up += int(n_answered)
        self.costs.samples_evaluated += int(samples_evaluated)

    def __repr__(self) -> str:
        return (
            f"RoundLedger(round={self.round}, holding={int(self._holding.sum())}, "
            f"losses={int(self._has_loss.sum())}, trained={int(self._trained.sum())}, "
            f"uploaded={int(self._uploaded.sum())}, failed={int(self._failed.sum())})"
        )


def _distinct(arr: np.ndarray) -> np.ndarray:
    """The distinct entries of ``arr`` in the order they first appear (O(n log n), no Python loop)."""
    if arr.size < 2:
        return arr
    _, first = np.unique(arr, return_index=True)
    return arr[np.sort(first)]


def reporter_weights(weights: Any, reported: Any, *, mode: str = "rescale") -> np.ndarray:
    """The aggregation weights of the chosen clients that reported, from the weights a selection carries.

    A selection's weights are applied to the deltas as given (unnormalised, so unbiased
    estimators stay unbiased). When some chosen clients fail to report, their weight is lost
    and the others' total shrinks; two readings are offered, and every runtime applies the
    same one:

    ``"rescale"`` (default)
        multiply the reporters' weights by ``sum(w) / sum(w_reporters)``: the round keeps the
        total weight the selector intended (a ratio estimator), so a scheme whose weights sum
        to 1 (clustered sampling's ``1/m``) aggregates the mean of its reporters, as FedAvg
        does with stragglers;
    ``"as-given"``
        keep each reporter's weight as given: the missing clients' share of the update is
        simply lost (the step shrinks with the failure rate).

    Parameters
    ----------
    weights : array-like of float, shape (k,)
        The selection's weights, one per chosen client.
    reported : array-like of bool, shape (k,)
        Which chosen clients reported.
    mode : {"rescale", "as-given"}

    Returns
    -------
    ndarray of float64
        One weight per reporter (in order); empty if nobody reported.
    """
    if mode not in PARTIAL_WEIGHTS:
        raise ValueError(f"reporter_weights: mode={mode!r} must be one of {PARTIAL_WEIGHTS}")
    w = np.asarray(weights, dtype=np.float64)
    ok = np.asarray(reported, dtype=bool)
    out = w[ok]
    if mode == "rescale" and out.size and not ok.all():
        part = out.sum()
        if part > 0:
            out = out * (w.sum() / part)
    return out
