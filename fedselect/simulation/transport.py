"""The simulator as a transport: the engine's primitives for :class:`fedselect.round.RoundOracle`.

:class:`EngineClients` trains clients from w^t (:class:`TrainingRequest`, which the trainer runs
at once or :func:`fedselect.simulation.batched.fit_runs` answers in bulk with other runs'), tells
their losses at a model and averages their buffers; :class:`SimulationOracle` is the round's
:class:`~fedselect.round.RoundOracle` over it, built by :class:`FederatedTrainer` every round.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..aggregation import apply_deltas, finite_rows
from ..clock import RoundClock
from ..ledger import RoundLedger
from ..optim import LocalSGD
from ..round import RoundOracle, TransportPolicies
from ..selection import Selection
from .engine import Engine, LocalSchedule, aggregate_buffers

__all__ = ["EngineClients", "SimulationOracle", "TestRequest", "TrainingRequest"]


@dataclass
class TrainingRequest:
    """One batched local training a run asks for: :meth:`Engine.train` of its chosen clients from w^t.

    A round's first phase ends with its main training as a request (what
    :meth:`SimulationOracle.start_training` returns), its second with its test evaluation
    (a :class:`TestRequest`); :meth:`FederatedTrainer.fit` runs each at once (:meth:`run`)
    and hands the result to the next phase, while :func:`fedselect.simulation.batched.fit_runs`
    gathers the requests of several runs and answers them in one computation. A request with
    ``sample_losses`` (a selector that needs ``"sample_losses"``) is run where it is made,
    never returned, so the batched driver never sees it.
    """

    engine: Engine
    theta: torch.Tensor
    batches: list[list[np.ndarray]]
    optimizer: LocalSGD  # the round's: lr is w^t's scheduled step size
    dropout_seed: int
    buffers: Mapping[str, torch.Tensor] | None
    sample_losses: bool = False

    def run(self) -> tuple[Any, ...]:
        """The deltas and each client's buffers (and, with ``sample_losses``, each client's mean squared
        per-sample loss), by :meth:`Engine.train` alone."""
        return self.engine.train(  # type: ignore[return-value]
            self.theta,
            self.batches,
            **self.optimizer.to_dict(),
            dropout_seed=self.dropout_seed,
            buffers=self.buffers,
            return_buffers=True,
            sample_losses=self.sample_losses,
        )

    @property
    def lr(self) -> float:
        """The round's step size."""
        return self.optimizer.lr

    @property
    def samples(self) -> np.ndarray:
        """The samples each client's minibatches hold (its sample-gradients this round)."""
        return np.array([sum(len(x) for x in b) for b in self.batches], dtype=np.int64)

    @property
    def steps(self) -> int:
        """The local SGD steps of all its clients together."""
        return sum(len(b) for b in self.batches)


@dataclass
class TestRequest:
    """One test evaluation a run asks for after a round's aggregation: :meth:`Engine.test` of its new global
    model (answered as a :class:`TrainingRequest` is)."""

    __test__ = False  # not a pytest test class

    engine: Engine
    theta: torch.Tensor
    buffers: Mapping[str, torch.Tensor] | None

    def run(self) -> tuple[float, float | None]:
        return self.engine.test(self.theta, self.buffers)


class EngineClients(TransportPolicies):
    """The simulated clients of one round, on the batched engine (:class:`fedselect.round.OracleTransport`).

    Parameters
    ----------
    engine : Engine
        The batched training and evaluation engine.
    client_indices : sequence of ndarray
        Each client's training sample indices.
    round : int
        t: the minibatch streams are ``(train_seed, t, k)``.
    theta : Tensor, shape (D,)
        w^t.
    optimizer, schedule, train_seed, buffers, dropout_seed, n_samples,
    sample_losses
        As :class:`SimulationOracle`'s.
    """

    def __init__(
        self,
        engine: Engine,
        client_indices: Any,
        *,
        round: int,
        theta: torch.Tensor,
        optimizer: LocalSGD,
        schedule: LocalSchedule,
        train_seed: int,
        buffers: Mapping[str, torch.Tensor] | None,
        dropout_seed: Callable[[str], int],
        n_samples: np.ndarray,
        sample_losses: bool,
    ) -> None:
        self.engine = engine
        self.client_indices = client_indices
        self.round = int(round)
        self.theta = theta
        self.optimizer = optimizer
        self.schedule = schedule
        self.train_seed = int(train_seed)
        self.buffers = buffers
        self.dropout_seed = dropout_seed
        self.n_samples = n_samples
        self.sample_losses = bool(sample_losses)
        self.client_buffers: dict[int, dict[str, torch.Tensor]] = {}  # each trained client's buffers
        self.sample_sq: dict[int, float] = {}  # each trained client's mean squared per-sample loss

    def prepare(self, ids: np.ndarray, purpose: str) -> TrainingRequest:
        """The engine's training of ``ids`` from w^t, their minibatches drawn from ``(train_seed, t, k)``."""
        batches = self.engine.client_batches(self.client_indices, self.schedule, self.train_seed, self.round, ids)
        return TrainingRequest(
            engine=self.engine,
            theta=self.theta,
            batches=batches,
            optimizer=self.optimizer,
            dropout_seed=self.dropout_seed(purpose),
            buffers=self.buffers,
            sample_losses=self.sample_losses,
        )

    def keep(self, work: TrainingRequest, mask: np.ndarray) -> TrainingRequest:
        return dataclasses.replace(work, batches=[b for b, s in zip(work.batches, mask.tolist()) if s])

    def at_once(self, work: TrainingRequest) -> bool:
        """A request with ``sample_losses`` is run where it is made: the batched driver does not compute them."""
        return work.sample_losses

    def received(self, ids: np.ndarray, work: TrainingRequest, result: tuple[Any, ...]) -> list[torch.Tensor]:
        """The deltas of ``result``; keeps each client's buffers (and mean squared per-sample loss).

        Raises FloatingPointError on a non-finite update: NaN means "did not answer" to a
        selector, and a diverged local training is the user's learning rate to lower, not a
        client failure.
        """
        deltas, bufs = result[0], result[1]
        if work.sample_losses:
            self.sample_sq.update(zip(ids.tolist(), np.asarray(result[2], dtype=np.float64).tolist()))
        for i, k in enumerate(ids.tolist()):
            self.client_buffers[int(k)] = {name: b[i] for name, b in bufs.items()}
        bad = ~finite_rows(deltas)
        if bool(bad.any()):
            raise FloatingPointError(
                f"round {self.round}: the local training of client(s) {ids[bad.numpy()][:5].tolist()} diverged "
                f"(non-finite update at lr={self.optimizer.lr:g}); lower the learning rate"
            )
        return list(deltas)

    def losses_at(self, ids: np.ndarray | None, model: Any = None) -> np.ndarray:
        theta, buffers = (self.theta, self.buffers) if model is None else model
        return self.engine.client_losses(theta, ids, buffers)

    def eval_samples(self, ids: np.ndarray) -> np.ndarray:
        return self.engine.eval_sizes[ids]

    def combine(
        self, ids: np.ndarray, updates: torch.Tensor, weights: np.ndarray
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, Any]]:
        theta = apply_deltas(self.theta, updates, weights)
        return theta, (theta, self.aggregate_buffers(ids, weights))

    def buffers_of(self, ids: np.ndarray) -> dict[str, torch.Tensor]:
        """The buffers of trained clients ``ids`` after their local training, stacked per buffer."""
        names = self.engine.buffers
        if not len(ids):
            return {k: v.unsqueeze(0)[:0] for k, v in names.items()}
        return {k: torch.stack([self.client_buffers[int(c)][k] for c in ids]) for k in names}

    def aggregate_buffers(self, ids: np.ndarray, weights: np.ndarray) -> dict[str, torch.Tensor] | None:
        """The global buffers averaged over ``ids`` (:func:`~fedselect.simulation.engine.aggregate_buffers`)."""
        if self.buffers is None:
            return None
        return aggregate_buffers(self.buffers, self.buffers_of(ids), weights)

    def sample_loss_sq(self, ids: np.ndarray) -> np.ndarray:
        return np.array([self.sample_sq[int(k)] for k in ids.tolist()], dtype=np.float64)

    def global_parameters(self) -> np.ndarray:
        return self.theta.numpy().astype(np.float32, copy=True)

    def stack(self, rows: Sequence[torch.Tensor]) -> torch.Tensor:
        if not len(rows):
            return self.theta.new_zeros((0, self.theta.numel()))
        return torch.stack(list(rows))


class SimulationOracle(RoundOracle):
    """The simulator's answers to a selector's questions in one round, each paid for.

    Created by :class:`FederatedTrainer` for every round; see :class:`fedselect.ClientOracle`
    for what each question costs and :class:`fedselect.ledger.RoundLedger` for the
    bookkeeping (who holds w^t, which losses and updates the server already has, who
    failed). The trainer then runs the round itself through :meth:`start_training` and
    :meth:`finish_training` (:meth:`run_selection` in two halves), on the same ledger, so a
    client whose update an oracle question already computed is neither trained nor charged
    again.

    Parameters
    ----------
    engine : Engine
        The batched training and evaluation engine.
    client_indices : sequence of ndarray
        Each client's training sample indices.
    ledger : RoundLedger
        The round's bookkeeping (clients unavailable this round are already marked failed).
    theta : Tensor, shape (D,)
        w^t.
    optimizer : LocalSGD
        The local optimiser with the round's learning rate.
    schedule : LocalSchedule
        Local work per client.
    train_seed : int
        Seeds the minibatch streams ``(train_seed, round, k)``.
    buffers : dict of str to Tensor, optional
        The global model's buffers at w^t (batch norm statistics); None for a model without.
    aggregation_weights : callable
        Maps a validated :class:`~fedselect.Selection` to the weights the round's rule
        gives its clients (used by :meth:`trial`).
    dropout_seed : callable
        Maps a purpose (``"main"``, ``"trial"``) to the seed of the model's dropout masks.
    n_samples : ndarray of int, optional
        Every client's n_k (reported with each update to the round, :meth:`finish_training`).
    clock : RoundClock, optional
        The round's simulated clock (:mod:`fedselect.clock`): every question and the training
        are timed on it, late answers fail, stragglers fail, reporters' durations are observed.
        None: no time is kept (every question and the round are computed as without a clock).
    keep : int, optional
        With a clock: only the first ``keep`` chosen clients to finish report (over-selection).
    sample_losses : bool, default False
        Every local training also computes each client's mean squared per-sample loss, sent
        with its update (one scalar up per reporter) as ``Reports.sample_loss_sq``.
    available : ndarray of int, optional
        The clients online at the round's start, the candidates :meth:`available` gives the selector;
        None: every client.
    observed : bool, default True
        With a clock: the reporters' durations and the timed-out clients go to the reports. False
        (the default clock, which only records time): they do not.
    report_losses : bool, default True
        Each reporter also evaluates its loss on w^t before training (unless already known this
        round) and sends it with its update: a forward pass over its evaluation data, charged
        (samples evaluated, one scalar up) and timed (the training exchange's evaluation term).
        False (a selector that does not need ``"losses"``): no such work; ``Reports.losses`` is None.
    """

    def __init__(
        self,
        engine: Engine,
        client_indices: Any,
        ledger: RoundLedger,
        *,
        theta: torch.Tensor,
        optimizer: LocalSGD,
        schedule: LocalSchedule,
        train_seed: int,
        buffers: Mapping[str, torch.Tensor] | None = None,
        aggregation_weights: Callable[[Selection], np.ndarray],
        dropout_seed: Callable[[str], int],
        n_samples: np.ndarray | None = None,
        clock: RoundClock | None = None,
        keep: int | None = None,
        sample_losses: bool = False,
        available: np.ndarray | None = None,
        observed: bool = True,
        report_losses: bool = True,
    ) -> None:
        world = EngineClients(
            engine,
            client_indices,
            round=ledger.round,
            theta=theta,
            optimizer=optimizer,
            schedule=schedule,
            train_seed=train_seed,
            buffers=buffers,
            dropout_seed=dropout_seed,
            sample_losses=sample_losses,
            n_samples=np.zeros(ledger.n_clients, dtype=np.int64) if n_samples is None else np.asarray(n_samples),
        )
        super().__init__(
            world,
            ledger,
            aggregation_weights=aggregation_weights,
            clock=clock,
            keep=keep,
            sample_losses=sample_losses,
            available=available,
            observed=observed,
            report_losses=report_losses,
        )

    def buffers_of(self, ids: np.ndarray) -> dict[str, torch.Tensor]:
        """The buffers of trained clients ``ids`` after their local training, stacked per buffer."""
        return self.transport.buffers_of(ids)

    def run_selection(self, ids: np.ndarray) -> tuple[np.ndarray, torch.Tensor, np.ndarray | None]:
        """Run round t for the chosen (distinct) ``ids`` at once: what the server receives.

        :meth:`start_training`, its request run here, then :meth:`finish_training`.

        Returns
        -------
        reporters : ndarray of int
            The chosen clients that reported, in the order of ``ids``.
        updates : Tensor, shape (len(reporters), D)
            Their updates w_k - w^t.
        losses : ndarray of float, or None
            Their losses l_k(w^t) before local training (None without ``report_losses``).
        """
        request = self.start_training(ids)
        reports = self.finish_training(None if request is None else request.run())
        return reports.clients, reports.updates, reports.losses
