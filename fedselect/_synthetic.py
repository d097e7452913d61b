"""The synthetic test world: quadratic clients, a thin transport for :class:`fedselect.round.RoundOracle`.

:class:`QuadraticClients` is the world (its primitives: train, losses at a model, combine);
:class:`SyntheticOracle` is the oracle the conformance checks of :mod:`fedselect.testing` and
the selectors' doctests ask, the same :class:`~fedselect.round.RoundOracle` the simulator's
oracle is, kept across rounds, with every question recorded and its costs summed over the run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.utils import check_random_state

from ._validation import renamed
from .ledger import Costs, RoundLedger
from .round import Aggregate, RoundOracle, TransportPolicies, play_round
from .round.play import conclude_round
from .selection import BaseSelector, ClientPool, RoundFeedback, Selection

__all__ = ["QuadraticClients", "SyntheticOracle"]


@dataclass
class _Steps:
    """One full-batch gradient step of each of ``ids`` (:meth:`QuadraticClients.prepare`)."""

    world: QuadraticClients
    ids: np.ndarray

    def run(self) -> np.ndarray:
        return self.world.deltas(self.ids)

    @property
    def samples(self) -> np.ndarray:
        return self.world.n_samples[self.ids]

    @property
    def steps(self) -> int:
        return int(self.ids.size)


class QuadraticClients(TransportPolicies):
    """N quadratic clients, ``l_k(w) = 0.5 * ||w - o_k||^2`` plus noise (see :class:`SyntheticOracle`).

    The world's primitives (:class:`fedselect.round.OracleTransport`); every noise comes from a
    stream keyed by ``(seed, round, what)``, so no question shifts another's answers.

    Parameters
    ----------
    n_samples : ndarray of int
        n_k.
    optima : ndarray of float64, shape (N, dim)
        o_k.
    seed : int
        Seeds the noise streams.
    noise, lr : float
        As :class:`SyntheticOracle`'s.

    Attributes
    ----------
    round : int
        The round whose streams answer.
    w : ndarray of float32
        w^t.
    """

    def __init__(self, n_samples: np.ndarray, optima: np.ndarray, *, seed: int, noise: float, lr: float) -> None:
        self.n_samples = n_samples
        self.optima = optima
        self.n_clients, self.dim = optima.shape
        self.seed = int(seed)
        self.noise = float(noise)
        self.lr = float(lr)
        self.round = 0
        self.w = np.zeros(self.dim, dtype=np.float32)
        self.n_trials = 0  # this round's trial models so far: each is evaluated with its own noise

    def stream(self, *key: int) -> np.random.Generator:
        """The noise stream ``(seed, round, *key)``."""
        return np.random.default_rng([self.seed, self.round, *key])

    def loss_at(self, w: Any, eval_noise: Any) -> np.ndarray:
        """Every client's loss at ``w`` plus ``eval_noise``."""
        diff = np.asarray(w).astype(np.float64)[None, :] - self.optima
        return 0.5 * np.einsum("ij,ij->i", diff, diff) + eval_noise

    def eval_noise(self, tag: int) -> np.ndarray:
        return self.noise * self.stream(0, tag).normal(size=self.n_clients)

    def deltas(self, ids: np.ndarray) -> np.ndarray:
        """The local updates of ``ids`` from w^t (float32 rows): one gradient step each, plus noise."""
        noise = self.noise * self.stream(1).normal(size=(self.n_clients, self.dim))
        full = self.lr * (self.optima - self.w.astype(np.float64)[None, :]) + noise
        return full[ids].astype(np.float32)

    # -- fedselect.round.OracleTransport ------------------------------------------------------
    def prepare(self, ids: np.ndarray, purpose: str) -> _Steps:
        return _Steps(self, ids)

    def keep(self, work: _Steps, mask: np.ndarray) -> _Steps:
        return _Steps(self, work.ids[mask])

    def at_once(self, work: _Steps) -> bool:
        return True  # the round trains at once: nothing for the caller to answer

    def received(self, ids: np.ndarray, work: _Steps, result: np.ndarray) -> np.ndarray:
        return result

    def losses_at(self, ids: np.ndarray | None, model: Any = None) -> np.ndarray:
        if model is None:
            values = self.loss_at(self.w, self.eval_noise(0))
        else:  # a trial model
            self.n_trials += 1
            values = self.loss_at(model, self.eval_noise(self.n_trials))
        return values if ids is None else values[ids]

    def eval_samples(self, ids: np.ndarray) -> np.ndarray:
        return self.n_samples[ids]

    def combine(self, ids: np.ndarray, updates: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """w^t plus the mean update (this world's rule is ``"mean"``: equal weights)."""
        theta = self.w + updates.mean(axis=0)
        return theta, theta

    def aggregate_buffers(self, ids: np.ndarray, weights: np.ndarray) -> None:
        """The quadratic clients have no buffers."""
        return None

    def sample_loss_sq(self, ids: np.ndarray) -> np.ndarray:
        """A quadratic client's squared loss on w^t stands for Oort's statistic."""
        return np.square(self.loss_at(self.w, self.eval_noise(0))[ids])

    def global_parameters(self) -> np.ndarray:
        return self.w.copy()

    def stack(self, rows: Sequence[np.ndarray]) -> np.ndarray:
        return np.stack(rows) if len(rows) else np.zeros((0, self.dim), dtype=np.float32)


class SyntheticOracle(RoundOracle):
    """A recording, cost-counting oracle over a small federation of quadratic clients.

    Client ``k`` has an optimum ``o_k`` = its group's centre + a small offset, and the
    loss ``l_k(w) = 0.5 * ||w - o_k||^2`` (plus a tiny evaluation noise). A local update
    from ``w`` is one gradient step, ``lr * (o_k - w)`` (plus noise). Clients of one group
    pull the global model the same way, so their loss changes are correlated, as on a
    real non-IID federation (FedCor's Gaussian process should find the groups).

    All noise comes from streams keyed by ``(random_state, round, what)``, so asking a
    question never shifts the answers to other questions: a client's loss on ``w^t``
    and its local update in round ``t`` are the same however often and in whatever
    order they are asked for, and two oracles built with one seed answer identically.

    Parameters
    ----------
    n_clients : int
        N, the number of clients.
    n_samples : array-like of int, optional
        n_k of each client (used for costs and reported in feedback). By default drawn
        at random between 10 and 300.
    dim : int, default=20
        Dimension of the model vector ``w``.
    n_groups : int, default=4
        Number of client groups (clients ``k`` with equal ``k % n_groups`` share a centre).
    noise : float, default=0.01
        Standard deviation of the evaluation noise and of the per-coordinate update noise.
    lr : float, default=0.5
        Local learning rate of the single local gradient step.
    spread : float, default=0.1
        Standard deviation of each client's optimum around its group's centre.
    client_dropout : float, default=0.0
        Probability that a client does not answer in a round (drawn per round from its
        own stream): it answers NaN to every question, is charged as sent, and does not
        report if chosen (see :class:`fedselect.ClientOracle`).
    offline : float, default=0.0
        Probability that a client is offline at a round's start (its own stream; at least one
        client stays online): the server knows it, :meth:`available` leaves it out, and it
        answers NaN if asked anyway.
    random_state : None, int or numpy RandomState
        Seeds the problem (centres, optima, default n_samples) and every noise stream.
    dropout : deprecated
        The former name of ``client_dropout`` (warns; both set: an error).

    Attributes
    ----------
    n_clients : int
        N.
    n_samples : ndarray of int
        n_k.
    round : int
        The round being chosen for (advanced by :meth:`run_round`).
    w : ndarray of float32, shape (dim,)
        The current global model w^t (starts at zero).
    optima : ndarray of float64, shape (n_clients, dim)
        o_k.
    groups : ndarray of int
        Each client's group.
    costs : Costs
        Everything paid so far (queries and rounds), cumulative.
    ledger : RoundLedger
        This round's bookkeeping (:class:`fedselect.ledger.RoundLedger`).
    calls : list of (str, tuple of int)
        Every query in order: the method name and the ids asked about
        (``("global_parameters", ())`` for the free query).

    Examples
    --------
    >>> from fedselect.selection import Selection
    >>> oracle = SyntheticOracle(10, random_state=0)
    >>> oracle.losses([0, 3]).shape
    (2,)
    >>> feedback = oracle.run_round(Selection([0, 3]))
    >>> oracle.round, feedback.clients.tolist()
    (1, [0, 3])
    """

    name = "SyntheticOracle"

    def __init__(
        self,
        n_clients: int,
        *,
        n_samples: Any = None,
        dim: int = 20,
        n_groups: int = 4,
        noise: float = 0.01,
        lr: float = 0.5,
        spread: float = 0.1,
        client_dropout: float = 0.0,
        offline: float = 0.0,
        random_state: Any = None,
        dropout: float | None = None,
    ) -> None:
        # dropout: the former name of client_dropout (warns; both set: an error)
        client_dropout = renamed("SyntheticOracle", "dropout", dropout, "client_dropout", client_dropout, 0.0)
        if isinstance(n_clients, bool) or not isinstance(n_clients, (int, np.integer)) or n_clients < 1:
            raise ValueError(f"SyntheticOracle: n_clients={n_clients!r} must be an integer >= 1")
        bad = isinstance(client_dropout, bool) or not isinstance(client_dropout, (int, float, np.floating))
        if bad or not 0 <= client_dropout < 1:
            raise ValueError(f"SyntheticOracle: client_dropout={client_dropout!r} must be a number in [0, 1)")
        if isinstance(offline, bool) or not isinstance(offline, (int, float, np.floating)) or not 0 <= offline < 1:
            raise ValueError(f"SyntheticOracle: offline={offline!r} must be a number in [0, 1)")
        rng = check_random_state(random_state)
        self.offline = float(offline)
        self.n_clients = int(n_clients)
        self.dim = int(dim)
        self.noise = float(noise)
        self.lr = float(lr)
        self.client_dropout = float(client_dropout)
        if n_samples is None:
            n_samples = rng.randint(10, 301, size=self.n_clients)
        self.n_samples = ClientPool(np.asarray(n_samples)).n_samples
        if self.n_samples.shape[0] != self.n_clients:
            raise ValueError(
                f"SyntheticOracle: n_samples has {self.n_samples.shape[0]} entries for {self.n_clients} clients"
            )
        n_groups = max(1, min(int(n_groups), self.n_clients))
        centres = rng.normal(size=(n_groups, self.dim))
        self.groups = np.arange(self.n_clients) % n_groups
        self.optima = centres[self.groups] + spread * rng.normal(size=(self.n_clients, self.dim))
        world = QuadraticClients(
            self.n_samples, self.optima, seed=int(rng.randint(2**31 - 1)), noise=self.noise, lr=self.lr
        )
        self._past = Costs()  # the rounds before this one
        self.calls: list[tuple[str, tuple[int, ...]]] = []
        super().__init__(world, self._new_ledger(world), aggregation_weights=_equal_weights, available=self._online)

    # -- rounds ------------------------------------------------------------------------

    @property
    def dropout(self) -> float:
        """Deprecated: the former name of :attr:`client_dropout` (warns; removed in fedselect 1.0)."""
        import warnings

        from ._validation import outside_stacklevel

        warnings.warn(
            "SyntheticOracle.dropout is deprecated and will be removed in fedselect 1.0; use client_dropout",
            DeprecationWarning,
            stacklevel=outside_stacklevel(),
        )
        return self.client_dropout
    def _new_ledger(self, world: QuadraticClients) -> RoundLedger:
        """This round's ledger, its dropout and offline clients drawn from their streams; sets ``_online``."""
        if self.client_dropout > 0:
            unavailable = np.flatnonzero(world.stream(3).random(self.n_clients) < self.client_dropout)
        else:
            unavailable = np.zeros(0, dtype=np.int64)
        self._online = None
        if self.offline > 0:
            off = world.stream(4).random(self.n_clients) < self.offline
            off[int(world.stream(5).integers(self.n_clients))] = False  # somebody is online
            self._online = np.flatnonzero(~off)
            unavailable = np.union1d(unavailable, np.flatnonzero(off))
        world.n_trials = 0
        return RoundLedger(self.n_clients, world.round, unavailable=unavailable)

    def _advance(self, theta: np.ndarray) -> None:
        """Move to the next round with w^{t+1} = ``theta``."""
        world = self.transport
        self._past += self.ledger.costs
        world.w = theta
        world.round += 1
        self.open(self._new_ledger(world), available=self._online)

    @property
    def round(self) -> int:
        """The round being chosen for (advanced by :meth:`run_round` and :meth:`play`)."""
        return self.transport.round

    @round.setter
    def round(self, value: int) -> None:
        self.transport.round = int(value)

    @property
    def w(self) -> np.ndarray:
        """The current global model w^t (float32)."""
        return self.transport.w

    @w.setter
    def w(self, value: np.ndarray) -> None:
        self.transport.w = value

    @property
    def costs(self) -> Costs:
        """Everything paid so far (queries and rounds), cumulative."""
        return self._past + self.ledger.costs

    @property
    def unavailable(self) -> frozenset[int]:
        """The clients that do not answer this round (drawn from ``client_dropout``) or that failed."""
        return self.ledger.failed

    def true_losses(self) -> np.ndarray:
        """Every client's noiseless loss on w^t; free and not recorded (for tests and diagnostics)."""
        return self.transport.loss_at(self.w, 0.0)

    def _asked(self, method: str, ids: np.ndarray) -> None:
        """Record the question (:attr:`calls`)."""
        self.calls.append((method, tuple(ids.tolist())))

    # -- running a round ------------------------------------------------------------------
    def play(
        self, selector: BaseSelector, n: int, *, after_aggregate: Callable[[Aggregate], Any] | None = None
    ) -> Aggregate:
        """Play this round with ``selector`` (fitted) through :func:`fedselect.round.play_round`, then move on.

        The round's rule is the mean of the reporters' deltas (``aggregation="mean"``, accumulated in
        float64); ``after_aggregate`` runs before the selector's update, as in
        :func:`~fedselect.round.play_round`.
        """
        self._sample_losses = "sample_losses" in selector.needs
        try:
            agg = play_round(
                self,
                self,
                selector,
                n,
                self.w,
                round=self.round,
                n_clients=self.n_clients,
                after_aggregate=after_aggregate,
                aggregation="mean",
                accumulate="float64",
            )
        finally:
            self._sample_losses = False
        assert agg is not None  # nothing is contained
        self._advance(agg.theta)
        return agg

    def run_round(self, selection: Selection, needs: frozenset[str] = frozenset()) -> RoundFeedback:
        """Train the selected clients, aggregate what the reporting ones sent, and return the feedback.

        The selection is used as given (validate it first with
        :meth:`Selection.validated`). Clients that fail this round (``client_dropout``) do not
        report. Without weights the update is the mean of the reporting clients' deltas,
        a client counted ``selection.counts`` times when counts are present; with
        weights, each reporting client's delta is multiplied by its weight (as given, or
        rescaled to keep the selection's total when some chosen clients failed:
        :func:`fedselect.ledger.reporter_weights`) and added.

        Parameters
        ----------
        selection : Selection
            The (validated) clients of this round.
        needs : frozenset of str
            The selector's ``needs``: ``"updates"`` adds the per-client deltas to the
            feedback, ``"global"`` the global model before and after aggregation,
            ``"sample_losses"`` each reporter's squared loss as its ``sample_loss_sq``
            (one scalar up each). This test world sends every reporter's loss whatever
            ``needs`` says (:func:`fedselect.testing.check_declared_losses` hides it from
            selectors that do not declare ``"losses"``).

        Returns
        -------
        RoundFeedback
            Only the clients that reported.
        """
        self.ledger.ids(selection.clients, "SyntheticOracle.run_round")
        self._sample_losses = "sample_losses" in needs  # read when the reports are made (finish_training)
        try:
            self.start_training(selection.clients)  # trains at once: nothing for the caller to answer
            agg = conclude_round(
                self, selection, self.w, round=self.round, needs=needs, aggregation="mean", accumulate="float64"
            )
        finally:
            self._sample_losses = False
        self._advance(agg.theta)
        return agg.feedback


def _equal_weights(selection: Selection) -> np.ndarray:
    """The ``"mean"`` rule's weights of a (validated, distinct) trial selection."""
    return np.full(len(selection), 1.0 / len(selection))
