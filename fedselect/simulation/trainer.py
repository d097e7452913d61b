"""FederatedTrainer: a fast FedAvg / FedProx simulator that consumes any selector and counts its costs."""

from __future__ import annotations

import math
import os
import random
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from sklearn.base import BaseEstimator
from typing_extensions import Self

from .._console import bars_wanted
from .._validation import Constraint, InstanceOf, Interval, StrOptions, validate_parameters
from ..aggregation import aggregation_weights, apply_deltas
from ..clock import RoundClock, SimulatedClock
from ..ledger import PARTIAL_WEIGHTS, Costs, RoundLedger
from ..round import Aggregate, OpenRound, Reports, open_round
from ..selection import (
    BaseSelector,
    ClientOracle,
    Selection,
    check_param,
    is_int,
    is_real,
)
from ._compiled import PATHS
from .checkpoint import (
    CheckpointMismatchError,
    JSONValue,
    Pickled,
    UnsafeStateError,
    check_state,
    describe_differences,
    move_aside,
    open_checkpoint,
    restore_selector_state,
    selector_state,
    write_checkpoint,
)
from .engine import DEVICE_CONSTRAINTS, LOSSES, Engine, LocalSchedule, aggregate_buffers, device_setting
from .history import History, RoundRecord
from .models import build_model

__all__ = [
    "DivergenceError",
    "FederatedTrainer",
    "SimulationOracle",
    "TestRequest",
    "TrainedNobodyWarning",
    "TrainingRequest",
    "lr_at",
]

_AGGREGATIONS = ("mean", "data-size")
STRAGGLER_POLICIES = ("fail", "overselect")
CHOOSE_AMONG = ("online", "all")
FEEDBACK_LOSSES = ("auto", "always")  # FederatedTrainer(feedback_losses=...)
_CEIL_EPS = 1e-9  # absorbs float error in ceil(K * overselect), e.g. 10 * 1.1 = 11.000000000000002


class _SelectorSpecs(Constraint):
    """A selector in any form :func:`fedselect.plugins.resolve_selector` takes (names are looked up at fit)."""

    def is_satisfied_by(self, value: Any) -> bool:
        from ..plugins import is_selector_spec_shape

        return is_selector_spec_shape(value)

    def __str__(self) -> str:
        return ("a registered selector name, a (name, params) pair, a BaseSelector instance or subclass, "
                "or a (class, params) pair")

    def invalid_examples(self) -> list[Any]:
        return [object(), 1.5, ("random",), (int, {})]
# The name format 1 (a pickle) used, kept so that such a file is found and refused rather than ignored.
CHECKPOINT_FILE = "checkpoint.pkl"
_CHECKPOINT_FORMAT = 2


class DivergenceError(FloatingPointError):
    """Training diverged: the global model or the test loss became non-finite, or the test
    loss exceeded ``divergence`` times the initial model's test loss.

    Attributes
    ----------
    round : int
        The round in which divergence was detected (rounds start at 0).
    test_loss : float or None
        The offending test loss (None when the model itself became non-finite).
    threshold : float or None
        The test loss that counts as divergence in this run.
    """

    def __init__(self, message: str, *, round: int, test_loss: float | None = None,
                 threshold: float | None = None) -> None:
        super().__init__(message)
        self.round = int(round)
        self.test_loss = test_loss
        self.threshold = threshold


def lr_at(lr: float, schedule: Any, t: int) -> float:
    """The learning rate of round ``t``.

    ``schedule`` is None (constant), a callable ``f(t) -> lr``, the string ``"fedcor"``
    (halve at rounds 150 and 300, FedCor appendix C), or a mapping ``{round: factor}``
    whose factors multiply from that round on (``{150: 0.5, 300: 0.5}`` is ``"fedcor"``).
    """
    if schedule is None:
        return float(lr)
    if callable(schedule):
        return float(schedule(t))
    if schedule == "fedcor":
        schedule = {150: 0.5, 300: 0.5}
    out = float(lr)
    for milestone, factor in schedule.items():
        if t >= int(milestone):
            out *= float(factor)
    return out


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
    lr: float
    weight_decay: float
    prox_mu: float
    momentum: float
    nesterov: bool
    dropout_seed: int
    buffers: Mapping[str, torch.Tensor] | None
    sample_losses: bool = False

    def run(self) -> tuple[Any, ...]:
        """The deltas and each client's buffers (and, with ``sample_losses``, each client's mean squared
        per-sample loss), by :meth:`Engine.train` alone."""
        return self.engine.train(  # type: ignore[return-value]
            self.theta, self.batches, lr=self.lr, weight_decay=self.weight_decay, prox_mu=self.prox_mu,
            momentum=self.momentum, nesterov=self.nesterov, dropout_seed=self.dropout_seed, buffers=self.buffers,
            return_buffers=True, sample_losses=self.sample_losses,
        )


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


def _samples(batches: list[list[np.ndarray]]) -> np.ndarray:
    """The samples each client's minibatches hold (its sample-gradients this round)."""
    return np.array([sum(len(x) for x in b) for b in batches], dtype=np.int64)


def _lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """``values`` of each entry of ``query`` found in the distinct ``keys``, 0 where absent."""
    out = np.zeros(query.size, dtype=np.asarray(values).dtype if len(values) else np.int64)
    if keys.size:
        order = np.argsort(keys)
        pos = np.clip(np.searchsorted(keys[order], query), 0, keys.size - 1)
        hit = keys[order][pos] == query
        out[hit] = np.asarray(values)[order][pos[hit]]
    return out


@dataclass
class _Started:
    """:meth:`SimulationOracle.run_selection` between its halves: the chosen clients, those it trains, the
    request training them (None: none to run) and the over-selected clients to cut after training."""

    ids: np.ndarray
    todo: np.ndarray
    request: TrainingRequest | None
    cut: np.ndarray | None


class SimulationOracle(ClientOracle):
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
    lr : float
        The round's learning rate.
    schedule : LocalSchedule
        Local work per client.
    train_seed : int
        Seeds the minibatch streams ``(train_seed, round, k)``.
    weight_decay, prox_mu, momentum : float
        As in :class:`FederatedTrainer`.
    nesterov : bool
        As in :class:`FederatedTrainer`.
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
        lr: float,
        schedule: LocalSchedule,
        train_seed: int,
        weight_decay: float = 0.0,
        prox_mu: float = 0.0,
        momentum: float = 0.0,
        nesterov: bool = False,
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
        self.ledger = ledger
        self.round = ledger.round
        self.n_clients = ledger.n_clients
        self._engine = engine
        self._client_indices = client_indices
        self._theta = theta
        self._lr = lr
        self._schedule = schedule
        self._train_seed = int(train_seed)
        self._weight_decay = weight_decay
        self._prox_mu = prox_mu
        self._momentum = momentum
        self._nesterov = nesterov
        self._buffers = buffers
        self._client_buffers: dict[int, dict[str, torch.Tensor]] = {}  # each trained client's buffers
        self._aggregation_weights = aggregation_weights
        self._dropout_seed = dropout_seed
        self._n_samples = np.zeros(self.n_clients, dtype=np.int64) if n_samples is None else np.asarray(n_samples)
        self.clock = clock
        self._keep = keep
        self._sample_losses = bool(sample_losses)
        self._available = None if available is None else np.asarray(available, dtype=np.int64)
        self._observed = bool(observed)
        self._report_losses = bool(report_losses)
        self._sample_sq: dict[int, float] = {}  # each trained client's mean squared per-sample loss
        self._timed_out: tuple[np.ndarray, np.ndarray] | None = None  # the clock's censored clients this round
        self._started: _Started | None = None  # run_selection between its halves

    @property
    def costs(self) -> Costs:
        """What the round has cost so far (the ledger's)."""
        return self.ledger.costs

    # -- helpers --------------------------------------------------------------------
    def _train(self, ids: np.ndarray, *, purpose: str) -> np.ndarray:
        """Train ``ids`` from w^t (all at once), charge it and keep the updates in the ledger; the samples
        each trained on."""
        request = self._training_request(ids, purpose)
        self._record_training(ids, request, request.run())
        return _samples(request.batches)

    def _training_request(self, ids: np.ndarray, purpose: str,
                          batches: list[list[np.ndarray]] | None = None) -> TrainingRequest:
        if batches is None:
            batches = self._engine.client_batches(self._client_indices, self._schedule, self._train_seed, self.round,
                                                  ids)
        return TrainingRequest(
            engine=self._engine,
            theta=self._theta,
            batches=batches,
            lr=self._lr,
            weight_decay=self._weight_decay,
            prox_mu=self._prox_mu,
            momentum=self._momentum,
            nesterov=self._nesterov,
            dropout_seed=self._dropout_seed(purpose),
            buffers=self._buffers,
            sample_losses=self._sample_losses,
        )

    def _record_training(self, ids: np.ndarray, request: TrainingRequest, result: tuple[Any, ...]) -> torch.Tensor:
        deltas, bufs = result[0], result[1]
        if request.sample_losses:
            self._sample_sq.update(zip(ids.tolist(), np.asarray(result[2], dtype=np.float64).tolist()))
        batches = request.batches
        for i, k in enumerate(ids.tolist()):
            self._client_buffers[int(k)] = {name: b[i] for name, b in bufs.items()}
        bad = ~torch.isfinite(deltas).all(dim=1)
        if bool(bad.any()):  # NaN means "did not answer" to a selector: a diverged update must not pass as one
            raise FloatingPointError(
                f"round {self.round}: the local training of client(s) {ids[bad.numpy()][:5].tolist()} diverged "
                f"(non-finite update at lr={self._lr:g}); lower the learning rate"
            )
        self.ledger.record_training(
            ids,
            list(deltas),
            steps=sum(len(b) for b in batches),
            sample_gradients=int(sum(len(x) for b in batches for x in b)),
        )
        return deltas

    def _ask_losses(self, ids: np.ndarray, late: np.ndarray | None = None) -> None:
        """Evaluate l_k(w^t) for ``ids`` (distinct, alive) and record the answers; those of ``late``
        (a mask: past the clock's timeout) arrive too late and count as failures."""
        if not ids.size:
            return
        eng = self._engine
        everyone = ids.size == self.n_clients
        values = eng.client_losses(self._theta, None if everyone else ids, self._buffers)
        if late is not None and late.any():
            values = np.where(late, np.nan, values)
        self.ledger.record_losses(ids, values, samples_evaluated=int(eng.eval_sizes[ids].sum()))

    def _failed_mask(self, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` have failed this round."""
        return self.ledger.failed_mask(ids)

    def _not_uploaded(self, ids: np.ndarray) -> np.ndarray:
        return ~self.ledger.uploaded_mask(ids)

    def buffers_of(self, ids: np.ndarray) -> dict[str, torch.Tensor]:
        """The buffers of trained clients ``ids`` after their local training, stacked per buffer."""
        names = self._engine.buffers
        if not len(ids):
            return {k: v.unsqueeze(0)[:0] for k, v in names.items()}
        return {k: torch.stack([self._client_buffers[int(c)][k] for c in ids]) for k in names}

    def _updates_of(self, ids: np.ndarray) -> torch.Tensor:
        if not ids.size:
            return self._theta.new_zeros((0, self._theta.numel()))
        return torch.stack([self.ledger.update(int(k)) for k in ids])

    # -- the oracle -----------------------------------------------------------------
    def losses(self, ids: Any) -> np.ndarray:
        led = self.ledger
        ids = led.ids(ids, "oracle.losses")
        new = led.send_model(ids)
        ask = led.losses_to_ask(ids)
        late = None
        if self.clock is not None:  # one exchange: the model to those without it, a loss back from those asked
            if new.size == ask.size and np.array_equal(new, ask):  # the usual question: fresh clients, all alive
                reached, down, asked, failed = ask, 1, np.ones(ask.size, dtype=bool), None
            else:
                reached = np.union1d(new, ask)
                down, asked = np.isin(reached, new), np.isin(reached, ask)
                failed = led.failed_mask(reached)
            late_reached = self.clock.exchange(
                reached, failed=failed, models_down=down,
                eval_samples=np.where(asked, self._engine.eval_sizes[reached], 0), scalars_up=asked,
            )
            if late_reached.any():
                late = np.isin(ask, reached[late_reached])
        self._ask_losses(ask, late)
        return led.loss(ids)

    def trial(self, ids: Any) -> np.ndarray:
        led = self.ledger
        ids = np.unique(led.ids(ids, "oracle.trial"))
        if ids.size == 0:
            raise ValueError("oracle.trial: needs at least one client id")
        base = self.losses(np.arange(self.n_clients))  # paid once per round
        todo = led.to_train(ids)
        samples = np.zeros(0, dtype=np.int64)
        if todo.size:
            samples = self._train(todo, purpose="trial")
        alive = led.alive(ids)
        if self.clock is not None and alive.size:  # the trial clients train and send their updates
            late = self.clock.exchange(alive, models_up=self._not_uploaded(alive),
                                       train_samples=_lookup(todo, samples, alive))
            if late.any():
                led.mark_failed(alive[late])
                alive = alive[~late]
        if not alive.size:  # no trial client answered: nothing was learned
            return np.full(self.n_clients, np.nan)
        led.upload(alive)
        w = self._aggregation_weights(Selection(alive).validated(self.n_clients, alive.size))
        theta_trial = apply_deltas(self._theta, self._updates_of(alive), w)
        buffers_trial = None
        if self._buffers is not None:
            buffers_trial = aggregate_buffers(self._buffers, self.buffers_of(alive), w)
        # The trial model goes down to every client; those who answer send one scalar back.
        answering = led.answering()
        eng = self._engine
        after = eng.client_losses(theta_trial, None, buffers_trial)
        n_sent = self.n_clients - len(led.known_failed)
        n_answered = answering.size
        if self.clock is not None:  # the trial model to every client not known to have failed, a loss back
            known = np.fromiter(led.known_failed, dtype=np.int64)
            sent = np.setdiff1d(np.arange(self.n_clients), known)
            quiet = ~np.isin(sent, answering)
            late = self.clock.exchange(sent, failed=quiet, models_down=1, eval_samples=eng.eval_sizes[sent],
                                       scalars_up=~quiet)
            if late.any():
                led.mark_failed(sent[late])
                n_answered -= int(late.sum())
        led.record_trial(n_answered, samples_evaluated=int(eng.eval_sizes[answering].sum()), n_sent=n_sent)
        led.contacted(np.arange(self.n_clients))
        out = after - base
        out[list(led.failed)] = np.nan
        return out

    def local_updates(self, ids: Any, transform: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
        led = self.ledger
        ids = led.ids(ids, "oracle.local_updates")
        new = led.send_model(ids)
        todo = led.to_train(ids)
        samples = np.zeros(0, dtype=np.int64)
        if todo.size:
            samples = self._train(todo, purpose="main")
        rows: list[np.ndarray | None] = []
        for k in ids.tolist():
            if led.is_failed(k):
                rows.append(None)
                continue
            u = led.update(k).numpy().astype(np.float32, copy=True)
            rows.append(u if transform is None else np.asarray(transform(u), dtype=np.float32).reshape(-1))
        if self.clock is not None:
            rows = self._time_local_updates(ids, rows, new, todo, samples, full=transform is None)
        for k, r in zip(ids.tolist(), rows):  # what reached the server is charged
            if r is None:
                continue
            if transform is None:
                led.upload([k])  # the server keeps what it received
            else:
                led.record_floats_up(r.size)
        if not rows:
            return np.zeros((0, self._theta.numel()), dtype=np.float32)
        sizes = {r.size for r in rows if r is not None}
        if len(sizes) > 1:
            raise ValueError("oracle.local_updates: the transform returned vectors of different lengths")
        if sizes:
            width = sizes.pop()
        elif transform is None:
            width = self._theta.numel()
        else:  # nobody answered: the width of a transformed update, from a zero update
            width = np.asarray(transform(np.zeros(self._theta.numel(), dtype=np.float32))).size
        return np.stack([np.full(width, np.nan, dtype=np.float32) if r is None else r for r in rows])

    def _time_local_updates(self, ids: np.ndarray, rows: list[np.ndarray | None], new: np.ndarray, todo: np.ndarray,
                            samples: np.ndarray, *, full: bool) -> list[np.ndarray | None]:
        """Time :meth:`local_updates`' exchange on the clock; the rows with late answers set to None (failed)."""
        led = self.ledger
        reached = np.unique(ids)
        floats = np.zeros(reached.size)
        for k, r in zip(ids.tolist(), rows):
            if r is not None and not full:
                floats[np.searchsorted(reached, k)] += r.size
        failed = self._failed_mask(reached)
        late = self.clock.exchange(  # type: ignore[union-attr]
            reached, failed=failed, models_down=np.isin(reached, new), train_samples=_lookup(todo, samples, reached),
            models_up=(~failed & self._not_uploaded(reached)) if full else 0, floats_up=floats,
        )
        if not late.any():
            return rows
        led.mark_failed(reached[late])
        gone = set(reached[late].tolist())
        return [None if k in gone else r for k, r in zip(ids.tolist(), rows)]

    def available(self) -> np.ndarray | None:
        """The clients online at the round's start (sorted ids), None when every client is a candidate."""
        return None if self._available is None else self._available.copy()

    def global_parameters(self) -> np.ndarray:
        return self._theta.numpy().astype(np.float32, copy=True)

    # -- the round itself --------------------------------------------------------------
    def run_selection(self, ids: np.ndarray) -> tuple[np.ndarray, torch.Tensor, np.ndarray]:
        """Run round t for the chosen (distinct) ``ids``: what the server receives.

        Clients not yet holding w^t receive it; those not yet trained this round train;
        each client that reports sends its loss on w^t (unless already known; only with
        ``report_losses``) and its update (unless already uploaded). Failed clients do not report.

        Returns
        -------
        reporters : ndarray of int
            The chosen clients that reported, in the order of ``ids``.
        updates : Tensor, shape (len(reporters), D)
            Their updates w_k - w^t.
        losses : ndarray of float, or None
            Their losses l_k(w^t) before local training (None without ``report_losses``).
        """
        request = self._start_selection(ids)
        return self._finish_selection(None if request is None else request.run())

    def start_training(self, ids: np.ndarray) -> TrainingRequest | None:
        """The round's transport (:class:`fedselect.round.Transport`): start :meth:`run_selection` of the chosen
        ``ids``; the main training for the caller to run (:meth:`TrainingRequest.run`, or batched with other
        runs'), None when there is none to run (every chosen client trained by an oracle question, failed, or
        trained here because the selector needs ``"sample_losses"``)."""
        self._timed_out = None
        return self._start_selection(ids)

    def finish_training(self, reply: tuple[Any, ...] | None) -> Reports:
        """Finish :meth:`start_training` with ``reply``, the result of its request (None when it made none):
        :meth:`run_selection` as reports, with each reporter's observed seconds (with a clock) and mean squared
        per-sample loss (when asked)."""
        reporters, updates, losses = self._finish_selection(reply)
        durations = timed_out = after = None
        if self.clock is not None and self._observed:
            durations = self.clock.spent[reporters].copy()
            timed_out, after = self._timed_out if self._timed_out is not None else (np.zeros(0, np.int64), np.zeros(0))
        sq = None
        if self._sample_losses:
            sq = np.array([self._sample_sq[int(k)] for k in reporters.tolist()], dtype=np.float64)
        return Reports(reporters, updates, losses, self._n_samples[reporters], durations, sq, timed_out, after)

    def aggregate_buffers(self, reporters: np.ndarray, weights: np.ndarray) -> dict[str, torch.Tensor] | None:
        """The global buffers averaged over ``reporters`` (:func:`aggregate_buffers`); None without buffers."""
        if self._buffers is None:
            return None
        return aggregate_buffers(self._buffers, self.buffers_of(reporters), weights)

    def _start_selection(self, ids: np.ndarray) -> TrainingRequest | None:
        """The first half of :meth:`run_selection`, up to its one training: the request to run, or None."""
        led = self.ledger
        new = led.send_model(ids)
        todo = led.to_train(ids)
        batches = None
        cut = None
        if self.clock is not None:
            todo, batches, cut = self._settle(ids, new, todo)
        request = None
        if todo.size:
            request = self._training_request(todo, "main", batches)
            if request.sample_losses:  # run here: the batched driver of several runs does not compute them
                self._record_training(todo, request, request.run())
                request = None
        self._started = _Started(ids, todo, request, cut)
        return request

    def _finish_selection(self, reply: tuple[Any, ...] | None) -> tuple[np.ndarray, torch.Tensor, np.ndarray | None]:
        """The second half of :meth:`run_selection`, given the result of the request of the first."""
        led = self.ledger
        sel, self._started = self._started, None
        if sel is None:
            raise RuntimeError("SimulationOracle: finish_training without start_training")
        if sel.request is not None:
            self._record_training(sel.todo, sel.request, reply)
        if sel.cut is not None and sel.cut.size:  # over-selected clients that finished after the first `keep`
            led.mark_failed(sel.cut)
        ids = sel.ids
        if self._report_losses:
            self._ask_losses(led.losses_to_ask(ids))
        reporters = led.alive(ids)  # after the losses: a client whose loss is not finite did not report
        led.upload(reporters)
        if self._sample_losses and reporters.size:
            led.record_scalars_up(int(reporters.size))  # each reporter's sample_loss_sq, sent with its update
        return reporters, self._updates_of(reporters), led.loss(reporters) if self._report_losses else None

    def _settle(self, ids: np.ndarray, new: np.ndarray,
                todo: np.ndarray) -> tuple[np.ndarray, list[list[np.ndarray]], np.ndarray]:
        """Time the training exchange of the chosen ``ids`` on the clock (:meth:`RoundClock.settle`).

        Stragglers and clients offline at their completion are marked failed before training;
        returns the clients still to train, their minibatches, and the over-selected clients
        to cut after training.
        """
        led = self.ledger
        assert self.clock is not None
        batches = self._engine.client_batches(self._client_indices, self._schedule, self._train_seed, self.round,
                                              todo) if todo.size else []
        failed = led.failed_mask(ids)
        if new.size == ids.size:  # none held w^t: none has trained, sent its loss or uploaded this round
            down, ask, up = 1, ~failed, ~failed
        else:
            down = np.isin(ids, new)
            ask = ~led.has_loss_mask(ids) & ~failed
            up = ~failed & ~led.uploaded_mask(ids)
        if not self._report_losses:  # no loss on w^t asked: neither its evaluation nor its scalar is timed
            ask = np.zeros(ids.size, dtype=bool)
        scalars = np.add(ask, ~failed, dtype=np.int64) if self._sample_losses else ask  # + sample_loss_sq
        settled = self.clock.settle(
            ids, failed=failed, keep=self._keep, models_down=down, models_up=up, scalars_up=scalars,
            train_samples=_samples(batches) if todo.size == ids.size else _lookup(todo, _samples(batches), ids),
            eval_samples=np.where(ask, self._engine.eval_sizes[ids], 0),
        )
        if settled.drop.size:
            led.mark_failed(settled.drop)
            stay = ~np.isin(todo, settled.drop)
            todo = todo[stay]
            batches = [b for b, s in zip(batches, stay.tolist()) if s]
        self._timed_out = (settled.timed_out, settled.timed_out_after)
        return todo, batches, settled.cut


class FederatedTrainer(BaseEstimator):
    """Simulate federated training with a client-selection scheme and count what it costs.

    Each round t: the selector chooses clients (optionally asking the paid :class:`~fedselect.ClientOracle`), the
    chosen clients train together in one batched computation from w^t, their model deltas are aggregated into
    w^{t+1}, the test set is evaluated, and the selector learns from the :class:`~fedselect.RoundFeedback`.

    Parameters
    ----------
    selector : str, tuple, BaseSelector or BaseSelector subclass, default None
        The scheme: a registered name (``"power-of-choice"``), a ``(name, params)`` pair, an instance, a class, or
        a ``(class, params)`` pair (:func:`fedselect.plugins.resolve_selector`); None means uniform random. ``fit``
        trains a clone, never the given object; ``set_params(selector__d=10)`` works for every form.
    model : str, torch.nn.Module or callable, default "mlp"
        A registered model name (``"logistic"``, ``"mlp"``, ``"cnn"``) or a builder
        ``model(input_shape, n_outputs, **model_params) -> nn.Module``, built under ``random_state``; or a module,
        used as given (its parameters are w^0; ``fit`` never changes it). See :ref:`user_guide_training_options`.
    model_params : dict, optional
        Passed to the model builder (e.g. ``{"dropout": 0.5}``).
    loss : {"cross-entropy", "mse"} or callable, default "cross-entropy"
        The per-sample loss of local training, of the losses selectors see and of the test loss: cross-entropy
        (integer labels), the squared error (a regression federation, no accuracy), or ``loss(outputs, targets)``
        returning the m per-sample losses (see :ref:`user_guide_training_options`).
    clients_per_round : int, default 5
        C, the number of clients asked for each round.
    rounds : int, default 100
        Maximum number of rounds.
    local_steps, local_epochs : int, optional
        Local work per client per round: a fixed number of SGD steps, or epochs over the
        client's data (partial last batch). Exactly one may be set; default 1 epoch.
    batch_size : int, default 32
    lr : float, default 0.05
        Local SGD learning rate.
    momentum : float, default 0.0
        Local SGD momentum m in [0, 1) (heavy ball, dampening 0, as ``torch.optim.SGD``); the buffer starts empty
        each round, so it acts within one client's local steps only (no server momentum). 0 is plain SGD.
    nesterov : bool, default False
        Nesterov momentum (needs ``momentum > 0``).
    lr_schedule : None, "fedcor", mapping or callable
        See :func:`lr_at`.
    weight_decay : float, default 0.0
        L2 penalty added to each local gradient.
    aggregation : {"data-size", "mean"}, default "data-size"
        How deltas are weighted when the selection carries no weights: by n_k over the
        chosen clients (FedAvg) or uniformly (FedCor's Eq. 4). Duplicated draws count
        with their multiplicity. Weights a selection carries are applied as given.
    prox_mu : float, default 0.0
        FedProx's proximal term coefficient (0 = FedAvg).
    target_accuracy : float, optional
        Stop once the test accuracy reaches it (when ``stop_at_target``).
    stop_at_target : bool, default True
    time_budget : float or None, default None
        Seconds of simulated time a run may use: it stops after the first round whose end
        (``sim_time``) reaches the budget, or at ``rounds``, whichever comes first, so every scheme
        of a comparison is observed for the same simulated time (see :ref:`user_guide_time`).
        A round that is not evaluated (``eval_every``) records no accuracy even when it is the
        last. None: the round cap alone. Needs a clock.
    eval_every : int, default 1
        Evaluate the test set every this many rounds (and at the last round).
    track_global_loss : bool, default False
        Record sum_k p_k l_k(w^{t+1}) each evaluated round (bookkeeping, not charged).
    feedback_losses : {"auto", "always"}, default "auto"
        When the chosen clients evaluate l_k(w^t) before training (computed, charged, timed;
        ``RoundFeedback.losses``): ``"auto"`` only for a selector whose ``needs`` has ``"losses"``,
        ``"always"`` every round (how every run before this option was charged). See :ref:`user_guide_time`.
    random_state : int or None
        Seeds the model initialisation (not of a module instance), the minibatch streams, dropout, and any selector
        whose own random_state is None: one seed gives the same run bit for bit on one machine.
    progress : bool, default False
        Show a progress bar of the rounds, on a terminal or in a notebook only: when stderr is
        redirected to a file there is no bar (its redraws would fill the log).
    n_threads : int or None, default 1
        torch intra-op threads during ``fit`` (restored afterwards). One thread by default: the
        batched small models fedselect trains gain nothing from more on an idle machine, and
        torch's own count (every core) was reported 10-80x slower when another process uses the
        cores (``benchmarks/speed/bench_threads.py`` times both). None keeps torch's setting; raise it for one
        large model (a CNN on 32x32 images) on cores nothing else uses, and run grids with
        ``--jobs`` rather than more threads. Not part of a run's key; it changes only how
        torch splits float sums.
    callback : callable, optional
        Called as ``callback(trainer, record)`` after every round.
    dropout : float, default 0.0
        Client failures: the probability that a client fails to answer in a round (it
        is unavailable: a chosen client does not report, an oracle question to it is
        charged as sent and answered NaN; see :class:`fedselect.ClientOracle`).
    availability : None, array-like of float or callable, default None
        Per-client probabilities of being available in a round, or ``f(federation) -> array``: client k answers
        with probability ``availability[k] * (1 - dropout)``, drawn from a stream keyed by (seed, round), so every
        selector of one seed faces the same failures (see :ref:`user_guide_failures`).
    partial_weights : {"rescale", "as-given"}, default "rescale"
        When some chosen clients fail, the reporters' weights are rescaled to keep the selection's total, or kept
        as given (the failed share is lost); see :func:`fedselect.ledger.reporter_weights`.
    divergence : float or None, default 10.0
        :meth:`fit` raises :class:`DivergenceError` at the first evaluated round whose test loss exceeds
        ``divergence`` times the initial model's, or is non-finite; None keeps only the non-finite check (see
        :ref:`user_guide_checkpoints`).
    checkpoint_dir : path or None, default None
        Where :meth:`fit` keeps a checkpoint of the run in progress (a format that carries no code); a ``fit``
        that finds one of the same configuration resumes from it and returns exactly an uninterrupted run's
        history, one of another configuration raises (see :ref:`user_guide_checkpoints`).
    checkpoint_every : int, default 10
        Write the checkpoint after every k-th round (and when the run ends): a kill redoes at
        most k rounds. Each write serialises the selector's state and the model and fsyncs one file.
    checkpoint_trusted : bool, default False
        True checkpoints selector state outside the allow-list (else :meth:`fit` raises
        :class:`~fedselect.simulation.checkpoint.UnsafeStateError` before training) with full pickle, which runs
        code from the file: only for a ``checkpoint_dir`` no one else can write to.
    clock : bool or None, default None
        Keep simulated time (:mod:`fedselect.clock`): each round lasts its critical path on the
        clients' device profiles and every record gets ``sim_seconds`` and ``sim_time``. None: always, on
        the federation's ``profiles`` or else on homogeneous devices (:func:`fedselect.profiles.homogeneous`)
        that only record time: selectors observe no durations and Oort's over-commitment is not cut, so
        every selection is what it was before runs had a default clock; True: always, the homogeneous
        default observed like declared profiles; False: never. See :ref:`user_guide_time`.
    deadline : float or None, default None
        Seconds a chosen client has for its training exchange (download, local training, upload,
        after the round's oracle questions); a client past it is a straggler, handled by
        ``straggler_policy``. Needs a clock.
    query_timeout : float or None, default None
        Seconds the server waits for the answers to one oracle question; later answers count as
        failures (NaN). Needs a clock.
    straggler_policy : {"fail", "overselect"}, default "fail"
        What a round does about slow clients. With ``"fail"``, stragglers fail as dropped
        clients do (charged as asked, absent from the feedback). With ``"overselect"`` (FedCS),
        the selector is asked for ``ceil(clients_per_round * overselect)`` clients and the first
        ``clients_per_round`` to finish are aggregated, with the weights the aggregation gives a
        round whose other clients failed (``partial_weights``). Needs a clock.
    overselect : float, default 1.3
        The over-selection factor of ``straggler_policy="overselect"`` (1.3: FedScale's default
        over-commitment).
    choose_among : {"online", "all"}, default "online"
        With availability intervals (profiles): ``"online"`` lets the selector choose only among the
        clients online at the round's start (:meth:`ClientOracle.available`), all of them when fewer than
        ``clients_per_round`` are; ``"all"`` reproduces blind selection (offline picks fail at once), for
        studies. See :ref:`availability <user_guide_availability>`.
    server_knows_profiles : bool, default False
        Give the clock's profiles to a selector that takes a ``profiles`` parameter (left None)
        before it is fitted: the server knows the declared devices. False: the selector learns
        speed only from the durations it observes. Needs a clock.
    device : str or torch.device, default "cpu"
        Where local training and evaluation run: cpu, cuda, cuda:N, mps or auto (the first of cuda, mps,
        cpu that torch sees). Also a torch.device; "cuda" is the current CUDA GPU, "mps" an Apple GPU. Checked
        before anything is built: a device this machine lacks is an error naming those it has. The
        federation's data is copied to the device once; the global model, the aggregation, the selector's
        view and the checkpoints stay on the CPU. One seed gives the same bits on every machine of one kind
        (the CPU's are those of every earlier version); other kinds round differently. The run's settings
        (``history_.config``) record the kind ``"auto"`` chose. See :ref:`devices`.
    engine : {"eager", "compiled"}, default "eager"
        How local steps are computed: ``"eager"``, the bit-stable reference, or ``"compiled"``, each step
        one ``torch.compile`` graph (faster, rounded differently). The compiled path takes the built-in
        Flatten/Linear/ReLU/Dropout chains (``logistic``, ``mlp``) with ``loss="cross-entropy"``; another
        model, or a machine where torch.compile fails, is refused before training. Its float rounding
        and dropout masks differ from eager's (the same call still gives the same bits), so a compiled
        run is another run: its settings, key and checkpoints record the path. See :ref:`devices_compiled`.

    Attributes
    ----------
    history_ : History
    selector_ : BaseSelector
        The fitted clone of ``selector``.
    model_ : torch.nn.Module
        The final global model as a module (a copy of the model, parameters and buffers
        loaded, in eval mode): ``trainer.model_(X)`` predicts; ``torch.save(trainer.model_.state_dict(),
        path)`` keeps it and ``build_model`` plus ``load_state_dict`` gets it back.
    parameters_ : ndarray
        The final global model, flattened.
    buffers_ : dict of str to ndarray
        The final global buffers (batch norm running statistics), by name; empty for a model
        without buffers.
    resumed_from_ : int
        The round this call started from: 0, or the round after the checkpoint it resumed.

    Notes
    -----
    Batch norm: the global buffers are the reporters' weighted mean (FedAvg of buffers, not FedBN).

    Examples
    --------
    >>> from fedselect import FederatedTrainer, make_federation
    >>> fed = make_federation("digits", partition="shards", n_clients=20, random_state=0)
    >>> trainer = FederatedTrainer(selector="random", rounds=5, random_state=0).fit(fed)
    >>> len(trainer.history_)
    5
    """

    def __init__(
        self,
        *,
        selector: BaseSelector | str | None = None,
        model: str | torch.nn.Module | Callable[..., torch.nn.Module] = "mlp",
        model_params: Mapping[str, Any] | None = None,
        loss: str | Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = "cross-entropy",
        clients_per_round: int = 5,
        rounds: int = 100,
        local_steps: int | None = None,
        local_epochs: int | None = None,
        batch_size: int = 32,
        lr: float = 0.05,
        momentum: float = 0.0,
        nesterov: bool = False,
        lr_schedule: Any = None,
        weight_decay: float = 0.0,
        aggregation: str = "data-size",
        prox_mu: float = 0.0,
        target_accuracy: float | None = None,
        stop_at_target: bool = True,
        time_budget: float | None = None,
        eval_every: int = 1,
        track_global_loss: bool = False,
        feedback_losses: str = "auto",
        random_state: int | None = None,
        progress: bool = False,
        n_threads: int | None = 1,
        callback: Callable[..., Any] | None = None,
        dropout: float = 0.0,
        availability: Any = None,
        partial_weights: str = "rescale",
        divergence: float | None = 10.0,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_every: int = 10,
        checkpoint_trusted: bool = False,
        clock: bool | None = None,
        deadline: float | None = None,
        query_timeout: float | None = None,
        straggler_policy: str = "fail",
        overselect: float = 1.3,
        choose_among: str = "online",
        server_knows_profiles: bool = False,
        device: str | torch.device = "cpu",
        engine: str = "eager",
    ) -> None:
        self.selector = selector
        self.model = model
        self.model_params = model_params
        self.loss = loss
        self.clients_per_round = clients_per_round
        self.rounds = rounds
        self.local_steps = local_steps
        self.local_epochs = local_epochs
        self.batch_size = batch_size
        self.lr = lr
        self.momentum = momentum
        self.nesterov = nesterov
        self.lr_schedule = lr_schedule
        self.weight_decay = weight_decay
        self.aggregation = aggregation
        self.prox_mu = prox_mu
        self.target_accuracy = target_accuracy
        self.stop_at_target = stop_at_target
        self.time_budget = time_budget
        self.eval_every = eval_every
        self.track_global_loss = track_global_loss
        self.feedback_losses = feedback_losses
        self.random_state = random_state
        self.progress = progress
        self.n_threads = n_threads
        self.callback = callback
        self.dropout = dropout
        self.availability = availability
        self.partial_weights = partial_weights
        self.divergence = divergence
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.checkpoint_trusted = checkpoint_trusted
        self.clock = clock
        self.deadline = deadline
        self.query_timeout = query_timeout
        self.straggler_policy = straggler_policy
        self.overselect = overselect
        self.choose_among = choose_among
        self.server_knows_profiles = server_knows_profiles
        self.device = device
        self.engine = engine

    # -- validation -----------------------------------------------------------------
    # Each parameter's allowed values, as data (see fedselect._validation): _validate checks them
    # all before anything is built, and the tests generate invalid values for each one.
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "selector": [None, _SelectorSpecs()],
        "model": [InstanceOf(str, "a registered model name"), InstanceOf(torch.nn.Module, "a torch.nn.Module"),
                  callable],
        "model_params": [None, InstanceOf(Mapping, "a mapping of keyword arguments")],
        "loss": [StrOptions(LOSSES), callable],
        "clients_per_round": [Interval(Integral, 1, None, closed="left")],
        "rounds": [Interval(Integral, 1, None, closed="left")],
        "local_steps": [None, Interval(Integral, 1, None, closed="left")],
        "local_epochs": [None, Interval(Integral, 1, None, closed="left")],
        "batch_size": [Interval(Integral, 1, None, closed="left")],
        "lr": [Interval(Real, 0, None, closed="neither")],
        "momentum": [Interval(Real, 0, 1, closed="left")],
        "nesterov": ["boolean"],
        "lr_schedule": [None, StrOptions(("fedcor",)), InstanceOf(Mapping, "a {round: factor} mapping"), callable],
        "weight_decay": [Interval(Real, 0, None, closed="left")],
        "aggregation": [StrOptions(_AGGREGATIONS)],
        "prox_mu": [Interval(Real, 0, None, closed="left")],
        "target_accuracy": [None, Interval(Real, 0, 1, closed="right")],
        "stop_at_target": ["boolean"],
        "time_budget": [None, Interval(Real, 0, None, closed="neither")],
        "eval_every": [Interval(Integral, 1, None, closed="left")],
        "track_global_loss": ["boolean"],
        "feedback_losses": [StrOptions(FEEDBACK_LOSSES)],
        "random_state": [None, Interval(Integral, 0, None, closed="left")],
        "progress": ["boolean"],
        "n_threads": [None, Interval(Integral, 1, None, closed="left")],
        "callback": [None, callable],
        "dropout": [Interval(Real, 0, 1, closed="left")],
        "availability": [None, "array-like", callable],  # its length and range are checked against the federation
        "partial_weights": [StrOptions(PARTIAL_WEIGHTS)],
        "divergence": [None, Interval(Real, 1, None, closed="neither")],
        "checkpoint_dir": [None, InstanceOf(str, "a directory path"), InstanceOf(os.PathLike, "a directory path")],
        "checkpoint_every": [Interval(Integral, 1, None, closed="left")],
        "checkpoint_trusted": ["boolean"],
        "clock": [None, "boolean"],
        "deadline": [None, Interval(Real, 0, None, closed="neither")],
        "query_timeout": [None, Interval(Real, 0, None, closed="neither")],
        "straggler_policy": [StrOptions(STRAGGLER_POLICIES)],
        "overselect": [Interval(Real, 1, None, closed="left")],
        "choose_among": [StrOptions(CHOOSE_AMONG)],
        "server_knows_profiles": ["boolean"],
        "device": DEVICE_CONSTRAINTS,  # a name or torch.device this machine has (resolve_device)
        "engine": [StrOptions(PATHS)],  # Engine's path: eager (the reference) or compiled
    }

    def _validate(self, fed: Any) -> None:
        """Check every parameter, the federation and the selector's parameters before anything is built."""
        from ..data.federation import Federation

        if not isinstance(fed, Federation):
            raise TypeError(
                f"FederatedTrainer.fit expects a Federation, got {type(fed).__name__} {fed!r:.60}; build one with "
                "fedselect.data.make_federation(...), e.g. make_federation('digits', n_clients=20)"
            )
        validate_parameters(self, self.get_params(deep=False), self._parameter_constraints)
        c = self.checkpoint_dir
        if c is not None and Path(c).exists() and not Path(c).is_dir():
            raise ValueError(f"FederatedTrainer: checkpoint_dir={str(c)!r} exists and is not a directory")
        n = fed.n_clients
        check_param(
            self,
            "clients_per_round",
            self.clients_per_round,
            self.clients_per_round <= n,
            f"an integer between 1 and the federation's {n} clients",
        )
        if self.local_steps is not None and self.local_epochs is not None:
            raise ValueError("FederatedTrainer: set local_steps or local_epochs, not both")
        if self.nesterov and not self.momentum:
            raise ValueError("FederatedTrainer: nesterov=True needs momentum > 0 (got momentum=0)")
        if self.target_accuracy is not None and not np.issubdtype(np.asarray(fed.y).dtype, np.integer):
            raise ValueError(
                f"FederatedTrainer: target_accuracy={self.target_accuracy!r} but the federation's targets are floats "
                "(regression), which have no accuracy; set target_accuracy=None and read the test loss in history_"
            )
        if self.overselect != 1.3 and self.straggler_policy != "overselect":
            allowed = (
                f"left at 1.3 unless straggler_policy='overselect' (it is {self.straggler_policy!r}, which "
                "ignores overselect); pass straggler_policy='overselect' to over-select"
            )
            check_param(self, "overselect", self.overselect, False, allowed)
        self._report_prob = self._report_probabilities(fed)  # kept for fit: a callable availability runs once
        self._profiles = self._clock_profiles(fed)
        s = self.lr_schedule
        if isinstance(s, Mapping):
            ok = all(is_int(k) and k >= 0 and is_real(v) and v > 0 for k, v in s.items())
            check_param(self, "lr_schedule", s, ok, "a mapping of rounds (int >= 0) to factors (finite > 0)")
        # The selector's own parameters, now rather than after the model is built (a name is resolved,
        # which names the registered ones when it is unknown).
        if self.selector is not None:
            from ..plugins import resolve_selector

            resolve_selector(self.selector)._validate_params()

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The trainer's parameters; with ``deep``, also the selector's as ``selector__<name>``.

        The selector's parameters are listed however it was given: for a name, a class or
        a ``(name or class, params)`` pair they are those of the selector it builds (its
        defaults, overridden by the pair's params).
        """
        out = super().get_params(deep=False)
        if not deep:
            return out
        sel = "random" if self.selector is None else self.selector
        if isinstance(sel, BaseSelector):
            return super().get_params(deep=True)
        from ..plugins import resolve_selector

        try:
            built = resolve_selector(sel)
        except (KeyError, ValueError, TypeError):  # an invalid selector: fit names what is wrong
            return out
        out.update({f"selector__{k}": v for k, v in built.get_params(deep=False).items()})
        return out

    def set_params(self, **params: Any) -> Self:
        """Set parameters, including the selector's as ``selector__<name>=value`` however it was given.

        A selector given as an instance is updated in place (scikit-learn's rule for nested
        estimators). A selector given by name or class is not resolved to an object: it
        becomes a ``(name or class, params)`` pair, the given parameters merged into the
        pair's, and is built at :meth:`fit` (so ``set_params(selector__d=10)`` on
        ``selector="power-of-choice"`` gives ``selector=("power-of-choice", {"d": 10})`` and
        the trainer still records the registered name). None stands for ``"random"``.
        This makes ``ParameterGrid({"selector__d": [5, 10]})`` loops work for any selector.

        Raises
        ------
        ValueError
            A ``selector__`` parameter the selector does not have; the message lists those
            it has.
        """
        nested = {k[len("selector__"):]: v for k, v in params.items() if k.startswith("selector__")}
        rest = {k: v for k, v in params.items() if not k.startswith("selector__")}
        if rest:
            super().set_params(**rest)
        if not nested:
            return self
        from ..plugins import as_selector_spec

        sel = "random" if self.selector is None else self.selector
        spec = as_selector_spec(sel)  # unknown names and bad shapes are errors here, naming the selector
        allowed = spec.cls._get_param_names()
        unknown = sorted(set(nested) - set(allowed))
        if unknown:
            raise ValueError(
                f"FederatedTrainer: selector {spec.display!r} ({spec.cls.__name__}) has no parameter "
                f"{', '.join(map(repr, unknown))} (given as selector__<name>); its parameters: "
                f"{', '.join(allowed) or '(none)'}"
            )
        if isinstance(sel, BaseSelector):
            sel.set_params(**nested)
        else:
            what = spec.name if spec.name is not None else spec.cls
            self.selector = (what, {**spec.params, **nested})
        return self

    def _report_probabilities(self, fed: Any) -> np.ndarray | None:
        """Each client's probability of answering in a round, or None when every client always answers."""
        avail = self.availability
        if avail is None:
            return None if self.dropout == 0 else np.full(fed.n_clients, 1.0 - float(self.dropout))
        if callable(avail):
            avail = avail(fed)
        try:
            arr = np.asarray(avail, dtype=np.float64)
        except (TypeError, ValueError):
            arr = None
        ok = arr is not None and arr.shape == (fed.n_clients,) and bool(np.all((arr >= 0) & (arr <= 1)))
        check_param(
            self,
            "availability",
            self.availability if not callable(self.availability) else f"{self.availability!r} -> {avail!r}",
            ok,
            f"None, or {fed.n_clients} probabilities in [0, 1] (one per client), or a callable returning them",
        )
        assert arr is not None
        return arr * (1.0 - float(self.dropout))

    def _clock_profiles(self, fed: Any) -> Any:
        """The profiles the clock runs on, or None when no clock runs (``clock`` and the federation decide)."""
        from ..profiles import homogeneous

        profiles = getattr(fed, "profiles", None)
        needing = {"deadline": self.deadline is not None, "query_timeout": self.query_timeout is not None,
                   "straggler_policy": self.straggler_policy != "fail",
                   "server_knows_profiles": bool(self.server_knows_profiles)}
        # The default clock on homogeneous devices only records time (see ``clock``): what the round does
        # and what the selector observes stay as without a clock. Anything that asks for time observes it;
        # a time budget only reads the recorded time.
        self._clock_observed = profiles is not None or self.clock is True or any(needing.values())
        needing["time_budget"] = self.time_budget is not None
        if self.clock is False:
            for name, set_ in needing.items():
                if set_:
                    raise ValueError(
                        f"FederatedTrainer: parameter {name}={getattr(self, name)!r} needs a clock, but clock=False; "
                        "pass clock=None or clock=True (homogeneous devices when the federation has no profiles)"
                    )
            return None
        return homogeneous(fed.n_clients) if profiles is None else profiles

    def _make_selector(self) -> BaseSelector:
        from ..plugins import resolve_selector

        sel = resolve_selector("random" if self.selector is None else self.selector)  # a new, unfitted object
        params = sel.get_params(deep=False)
        if "random_state" in params and params["random_state"] is None:
            sel.set_params(random_state=int(self._seeds[1]))
        if self.server_knows_profiles and "profiles" in params and params["profiles"] is None:
            sel.set_params(profiles=self._profiles)  # the server knows the declared devices
        return sel

    def _rule_weights(self, selection: Selection, reported: np.ndarray | None = None) -> np.ndarray:
        """Aggregation weights of a validated selection, one per client (0 for those that did not report).

        Weights the selection carries are applied as given (unnormalised, so unbiased
        estimators stay unbiased), those of reporters rescaled or not by
        ``partial_weights`` when some chosen clients failed; otherwise the trainer's rule,
        normalised over the clients that reported.
        """
        return aggregation_weights(selection, reported, rule=self.aggregation, n_samples=self._fed.n_samples,
                                   partial_weights=self.partial_weights)

    def _dropout_seed(self, round: int, purpose: str) -> int:
        tag = {"main": 0, "trial": 1}.get(purpose, 2)
        return int(np.random.SeedSequence([int(self._seeds[0]), round, tag]).generate_state(1)[0])

    # -- fit ------------------------------------------------------------------------
    def fit(self, federation: Any) -> Self:
        """Run the federation for up to ``rounds`` rounds.

        Parameters
        ----------
        federation : Federation
            From :func:`fedselect.data.make_federation`.

        Returns
        -------
        self
            With ``history_``, ``selector_`` and ``parameters_`` set.

        Raises
        ------
        DivergenceError
            When the divergence rule fires (see ``divergence``); ``history_`` then holds the
            rounds run so far, the diverged round included when it was evaluated.
        CheckpointMismatchError
            When ``checkpoint_dir`` holds a checkpoint of another configuration.
        """
        run = _Fit(self, federation)
        try:
            request = run.step()
            while request is not None:  # each round's main training, then its test evaluation, run here
                try:
                    reply = request.run()
                except Exception as exc:
                    request = run.step(error=exc)
                else:
                    request = run.step(reply)
        finally:
            run.close()
        return self

    # -- divergence and checkpoints -------------------------------------------------
    def _check_divergence(self, record: RoundRecord, threshold: float | None, selector: BaseSelector) -> None:
        loss = record.test_loss
        if loss is None or threshold is None or loss <= threshold:
            return
        raise DivergenceError(
            f"FederatedTrainer: training diverged in round {record.round} (selector {type(selector).__name__}, "
            f"lr={record.lr:g}): test loss {loss:.4g} > {threshold:.4g} = divergence={self.divergence:g} x the "
            f"initial test loss {threshold / float(self.divergence):.4g}; lower the learning rate, or set "
            "divergence=None to disable this check",
            round=record.round, test_loss=float(loss), threshold=threshold,
        )

    def _fingerprint(self, fed: Any, selector: BaseSelector, theta0: torch.Tensor) -> dict[str, Any]:
        """Everything that fixes the run's numbers, flattened to comparable values (see
        :func:`fedselect.experiments.provenance.checkpoint_fingerprint`)."""
        from ..identity import checkpoint_fingerprint

        out = checkpoint_fingerprint(self, fed, selector, theta0)
        if self._profiles is not None and self._clock_observed:  # the clock's devices fix which clients fail and when
            out["clock.profiles"] = self._profiles.fingerprint()
        return out

    def _check_checkpointable(self, selector: BaseSelector) -> None:
        """Refuse, before training, a selector whose fitted state the safe format cannot hold."""
        try:
            check_state({"selector": Pickled(selector_state(selector), classes=(type(selector),))})
        except UnsafeStateError as exc:
            raise UnsafeStateError(_unsafe_message(selector, exc)) from exc

    def _read_checkpoint(self, path: Path, fingerprint: dict[str, Any], selector: BaseSelector,
                         theta: torch.Tensor) -> dict[str, Any] | None:
        """The checkpoint's run state, decoded and checked against this run; None to start afresh.

        The fingerprint is compared before any object is unpickled; the selector's state is
        unpickled by the allow-listed unpickler (full pickle only for state written with
        ``checkpoint_trusted=True`` and read with it) and applied to a copy of ``selector``.
        """
        ckpt = open_checkpoint(path)  # LegacyCheckpointError for format 1, propagated
        if ckpt is None:
            return None
        plain = ckpt.plain
        if plain.get("format") != _CHECKPOINT_FORMAT or not isinstance(plain.get("fingerprint"), dict):
            move_aside(path, f"checkpoint format {plain.get('format')!r}, expected {_CHECKPOINT_FORMAT}")
            return None
        diff = describe_differences(plain["fingerprint"], fingerprint)
        if diff:
            shown = "; ".join(f"{k}: checkpoint {a!r}, now {b!r}" for k, (a, b) in list(diff.items())[:8])
            more = f" (and {len(diff) - 8} more)" if len(diff) > 8 else ""
            raise CheckpointMismatchError(
                f"FederatedTrainer: the checkpoint {path} was written by a run with other settings: {shown}{more}. "
                "Use another checkpoint_dir, or delete this one to start the run over",
                path=path, differences=diff,
            )
        state = ckpt.load(classes=(type(selector),), trusted=bool(self.checkpoint_trusted))
        if state is None:
            return None
        try:
            out = {
                "theta": _checked_tensor(state["theta"], theta, "theta"),
                "buffers": None if state["buffers"] is None else {
                    k: _checked_tensor(state["buffers"][k], v, f"buffer {k}")
                    for k, v in (self._buffers or {}).items()},
                "selector": restore_selector_state(selector, state["selector"]),
                "rounds": [RoundRecord.from_dict(r) for r in state["rounds"]],
                "next_round": _checked_int(state["next_round"], "next_round"),
                "finished": _checked_bool(state["finished"], "finished"),
                "rng": _rng_from_checkpoint(state["rng"]),
            }
            if (out["buffers"] is None) != (self._buffers is None) or (
                    out["buffers"] is not None and set(state["buffers"]) != set(out["buffers"])):
                raise ValueError("its buffers are not the model's")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            move_aside(path, f"its state does not fit this run: {type(exc).__name__}: {exc}")
            return None
        return out

    def _write_checkpoint(self, path: Path, fingerprint: dict[str, Any] | None, theta: torch.Tensor,
                          selector: BaseSelector, history: History, next_round: int, finished: bool) -> None:
        try:
            write_checkpoint(path, {
                "format": _CHECKPOINT_FORMAT,
                "fingerprint": fingerprint,
                "next_round": int(next_round),
                "finished": bool(finished),
                "theta": theta.numpy(),
                "buffers": None if self._buffers is None else {k: v.numpy() for k, v in self._buffers.items()},
                "selector_class": f"{type(selector).__module__}.{type(selector).__qualname__}",
                "selector": Pickled(selector_state(selector), classes=(type(selector),),
                                    trusted=bool(self.checkpoint_trusted)),
                "rounds": JSONValue(self._rounds_as_json(history)),
                "rng": _get_rng_state(),
                "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            })
        except UnsafeStateError as exc:
            raise UnsafeStateError(_unsafe_message(selector, exc, path)) from exc

    def _rounds_as_json(self, history: History) -> list[dict[str, Any]]:
        """The history's rounds as plain dicts, converting only those added since the last write (a
        round's record is final once appended), so a write costs O(new rounds) Python work."""
        done = self.__dict__.setdefault("_ckpt_rounds", [])
        n = len(done)
        if n > len(history.rounds) or (n and done[-1]["round"] != history.rounds[n - 1].round):
            done.clear()
        done.extend(_json_ready(r.to_dict()) for r in history.rounds[len(done):])
        return done

    def _unavailable(self, t: int) -> np.ndarray:
        """The clients that will not answer in round ``t``: their own stream, the same for every selector."""
        if self._report_prob is None:
            return np.zeros(0, dtype=np.int64)
        u = np.random.default_rng([int(self._seeds[3]), int(t)]).random(self._fed.n_clients)
        return np.flatnonzero(u >= self._report_prob)

    def _round_size(self, selector: BaseSelector, n_clients: int) -> tuple[int, int | None]:
        """With a clock: the clients to ask the selector for, and how many of the first to finish report.

        ``straggler_policy="overselect"`` asks for ``ceil(K * overselect)`` and keeps K; a selector
        that over-commits by itself (a fitted ``overcommit_`` > 1, Oort's) has its first K kept.
        """
        K = self.clients_per_round
        if self.straggler_policy == "overselect":
            return min(n_clients, math.ceil(K * float(self.overselect) - _CEIL_EPS)), K
        factor = getattr(selector, "overcommit_", None)
        if is_real(factor) and factor > 1:
            return K, K
        return K, None

    def _config(self, fed: Any, selector: BaseSelector) -> dict[str, Any]:
        params = {k: v for k, v in self.get_params(deep=False).items()
                  if k not in ("selector", "callback", "checkpoint_dir", "checkpoint_every", "checkpoint_trusted")}
        if isinstance(params.get("model"), torch.nn.Module):
            params["model"] = type(params["model"]).__name__
        for key in ("model", "loss"):
            if callable(params.get(key)):
                params[key] = getattr(params[key], "__qualname__", repr(params[key]))
        params["device"] = device_setting(self.device)  # "auto" as the kind it chose on this machine
        return {
            "trainer": params,
            "selector": {"name": type(selector).__name__, "params": _plain(selector.get_params(deep=False))},
            "federation": _plain(getattr(fed, "metadata", {})),
            "n_clients": fed.n_clients,
            # the default clock only records time (see ``clock``): comparisons keep to rounds for such runs
            **({"clock": "recorded-only"} if not self._clock_observed and self._profiles is not None else {}),
        }


@dataclass
class _Round:
    """Round t between its phases (:class:`_Fit`)."""

    t: int
    started: float  # perf_counter at its start
    ledger: RoundLedger
    clock: RoundClock | None
    record: RoundRecord
    opened: OpenRound
    aggregate: Aggregate | None = None
    tested: bool = False  # whether phase 2 asked for a test evaluation


@dataclass
class _Fit:
    """One :meth:`FederatedTrainer.fit` in progress: its state between phases, and the phases.

    A fit is ``start`` (validation, the engine, the selector, a checkpoint to resume), then per
    round the three phases of :mod:`fedselect.round`, then ``end`` (the final checkpoint and the
    fitted attributes). :meth:`step` runs the fit's own code up to the next thing it needs
    computed: round t's main training (a :class:`TrainingRequest`, after selection) or its test
    evaluation (a :class:`TestRequest`, after aggregation and the checks); the caller computes
    it (:meth:`FederatedTrainer.fit` by itself, :func:`fedselect.simulation.batched.fit_runs`
    batched with other runs') and passes the result, or the exception computing it raised, to
    the next :meth:`step`. A round with nothing to train or test goes on without stopping.
    """

    trainer: FederatedTrainer
    federation: Any
    phase: str = "start"  # "start", then per round "open", "train", "test", then "end", "done"
    t: int = 0  # the round in play
    last: int = 0  # the round after the last to play
    selector: BaseSelector | None = None  # the fitted selector (or the checkpoint's)
    history: History | None = None
    theta: torch.Tensor | None = None  # w^t
    threshold: float | None = None
    finished: bool = False  # resumed from the checkpoint of a finished run
    ckpt_path: Path | None = None
    fingerprint: dict[str, Any] | None = None
    bar: Any = None
    old_threads: int | None = None  # torch's threads before the fit (None: nothing to restore)
    round: _Round | None = None

    def step(self, reply: Any = None, error: Exception | None = None) -> TrainingRequest | TestRequest | None:
        """Run the fit up to its next request; None when it has ended (the trainer's attributes set).

        ``reply`` is the result of the last request (:meth:`TrainingRequest.run`'s or
        :meth:`TestRequest.run`'s), ``error`` the exception computing it raised instead: raised
        here, where the round asked. Raises what :meth:`FederatedTrainer.fit` raises, and then
        the fit is closed.
        """
        try:
            while self.phase != "done":
                if self.phase == "start":
                    self._start()
                elif self.phase == "end":
                    self._end()
                else:
                    request = self._round_phase(reply, error)
                    reply = error = None
                    if request is not None:
                        return request
            return None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Restore what the fit changed (torch's threads, the progress bar) and drop its working attributes;
        also for a fit stopped between phases. Idempotent."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.old_threads is not None:
            torch.set_num_threads(self.old_threads)
            self.old_threads = None
            for attr in ("_engine", "_fed", "_buffers", "_ckpt_rounds", "_clock"):
                self.trainer.__dict__.pop(attr, None)

    # -- the fit's phases ---------------------------------------------------------------
    def _start(self) -> None:
        tr, fed = self.trainer, self.federation
        tr._validate(fed)
        seed = tr.random_state
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        check_param(tr, "random_state", tr.random_state, seed is not None and is_int(seed), "None or an int")
        # [training streams, selector, model init, client failures]; adding a word keeps the first three.
        tr._seeds = np.random.SeedSequence(int(seed)).generate_state(4)
        tr._fed = fed
        tr._train_seed = int(tr._seeds[0])
        if tr.local_steps is not None:
            tr._schedule = LocalSchedule(tr.batch_size, steps=tr.local_steps)
        else:
            tr._schedule = LocalSchedule(tr.batch_size, epochs=tr.local_epochs or 1)

        self.old_threads = torch.get_num_threads()
        if tr.n_threads:
            torch.set_num_threads(int(tr.n_threads))
        torch.manual_seed(int(tr._seeds[2]))
        tr._engine = build_engine(tr.model, tr.model_params, fed, batch_size=tr.batch_size,
                                  local_steps=tr.local_steps, loss=tr.loss, owner="FederatedTrainer",
                                  device=tr.device, path=tr.engine)
        tr._buffers = dict(tr._engine.buffers) or None
        selector = tr._make_selector()
        selector.fit(fed.client_pool())
        own = getattr(selector, "overcommit_", None)
        if tr.straggler_policy == "overselect" and is_real(own) and own > 1:  # ceil(f K) asked, then f' more
            raise ValueError(
                f"FederatedTrainer: straggler_policy='overselect' over-commits the round (overselect={tr.overselect}) "
                f"and {type(selector).__name__} over-commits by itself (overcommit {own:g}): the round would "
                f"over-commit twice; set {type(selector).__name__}(overcommit=1.0) to leave it to the round"
            )
        history = History(model_size=tr._engine.n_params, config=tr._config(fed, selector))
        theta = tr._engine.initial_parameters()
        if tr.divergence is not None:
            self.threshold = float(tr.divergence) * tr._engine.test(theta, tr._buffers)[0]
        start, finished = 0, False
        if tr.checkpoint_dir is not None:
            self.ckpt_path = Path(tr.checkpoint_dir) / CHECKPOINT_FILE
            self.fingerprint = tr._fingerprint(fed, selector, theta)
            tr._ckpt_rounds = []  # the rounds as JSON, kept between writes
            if not tr.checkpoint_trusted:
                tr._check_checkpointable(selector)
            state = tr._read_checkpoint(self.ckpt_path, self.fingerprint, selector, theta)
            if state is not None:
                selector = state["selector"]
                theta = state["theta"]
                if state["buffers"] is not None:
                    tr._buffers = state["buffers"]
                history.rounds = state["rounds"]
                start, finished = state["next_round"], state["finished"]
                _set_rng_state(state["rng"])
        tr._clock = None
        if tr._profiles is not None:
            resumed_at = next((r.sim_time for r in reversed(history.rounds) if r.sim_time is not None), 0.0)
            tr._clock = SimulatedClock(tr._profiles, model_size=tr._engine.n_params, deadline=tr.deadline,
                                       query_timeout=tr.query_timeout, start=resumed_at)
        tr.selector_ = selector
        tr.history_ = history
        tr.resumed_from_ = start
        self.selector, self.history, self.theta, self.finished = selector, history, theta, finished
        if tr.progress and not finished and bars_wanted():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=tr.rounds, initial=start, desc=type(selector).__name__, unit="round", leave=False)
        self.t, self.last = start, tr.rounds if not finished else start
        self.phase = "open" if self.t < self.last else "end"

    def _round_phase(self, reply: Any, error: Exception | None) -> TrainingRequest | TestRequest | None:
        """Round t's next phase; a FloatingPointError in the round is the run's divergence."""
        try:
            if error is not None:
                raise error  # computing the round's request failed: raised where the round asked
            if self.phase == "open":
                return self._open()
            if self.phase == "train":
                return self._trained(reply)
            record = self._tested(reply)
        except DivergenceError:
            raise
        except FloatingPointError as exc:
            raise DivergenceError(str(exc), round=self.t) from exc
        self._recorded(record)
        return None

    def _open(self) -> TrainingRequest | None:
        """Phase 1: the round's clients and oracle, the selection; the main training to run (None: none)."""
        tr, t = self.trainer, self.t
        started = time.perf_counter()
        lr = lr_at(tr.lr, tr.lr_schedule, t)
        fed = tr._fed
        n = tr.clients_per_round
        unavailable = tr._unavailable(t)
        rc = keep = online = None
        if tr._clock is not None:
            rc = tr._clock.start_round()
            if rc.offline.size:  # offline at the round's start: failed, as the per-round draw's clients are
                unavailable = np.union1d(unavailable, rc.offline)
            if tr._clock_observed:
                n, keep = tr._round_size(self.selector, fed.n_clients)
            if rc.offline.size and tr.choose_among == "online" and rc.offline.size < fed.n_clients:
                # the server chooses among the clients that checked in; all of them when fewer than asked
                online = np.setdiff1d(np.arange(fed.n_clients), rc.offline, assume_unique=True)
                n = min(n, int(online.size))
                keep = None if keep is None else min(keep, n)
        ledger = RoundLedger(fed.n_clients, t, unavailable=unavailable)
        oracle = SimulationOracle(
            tr._engine,
            fed.client_indices,
            ledger,
            theta=self.theta,
            lr=lr,
            schedule=tr._schedule,
            train_seed=tr._train_seed,
            weight_decay=tr.weight_decay,
            prox_mu=tr.prox_mu,
            momentum=float(tr.momentum),
            nesterov=bool(tr.nesterov),
            buffers=tr._buffers,
            aggregation_weights=tr._rule_weights,
            dropout_seed=lambda purpose: tr._dropout_seed(t, purpose),
            n_samples=fed.n_samples,
            clock=rc,
            keep=keep,
            sample_losses="sample_losses" in self.selector.needs,
            available=online,
            observed=tr._clock_observed,
            report_losses=tr.feedback_losses == "always" or "losses" in self.selector.needs,
        )
        record = RoundRecord(round=t, clients=[], weights=[], lr=lr)
        opened = open_round(oracle, oracle, self.selector, n, self.theta, round=t, n_clients=fed.n_clients,
                            rule=tr.aggregation, n_samples=fed.n_samples, partial_weights=tr.partial_weights)
        assert opened is not None  # nothing is contained: a selector's error is the user's to see
        self.round = _Round(t, started, ledger, rc, record, opened)
        self.phase = "train"
        return opened.request

    def _trained(self, reply: Any) -> TestRequest | None:
        """Phase 2: aggregation and the model's checks, given the main training's result; the test evaluation
        to run (None: not this round)."""
        tr, rnd = self.trainer, self.round
        assert rnd is not None
        t, record, lr = rnd.t, rnd.record, rnd.record.lr
        agg = rnd.aggregate = rnd.opened.conclude(reply)
        self.phase = "test"
        new_theta = agg.theta
        if agg.buffers is not None:
            tr._buffers = agg.buffers
        if not bool(torch.isfinite(new_theta).all()):
            raise FloatingPointError(
                f"FederatedTrainer: the global model became NaN/inf in round {t} (selector "
                f"{type(self.selector).__name__}, lr={lr}); lower the learning rate or check the selection weights"
            )
        ids = agg.selection.clients
        record.clients = ids.tolist()
        record.weights = [float(w) for w in agg.weights]
        record.failed = ids[~agg.reported].tolist()
        if (t + 1) % tr.eval_every == 0 or t == tr.rounds - 1:
            rnd.tested = True
            return TestRequest(tr._engine, new_theta, tr._buffers)
        return None

    def _tested(self, reply: tuple[float, float | None] | None) -> RoundRecord:
        """Phase 3: the test evaluation's result (when one was asked for), the selector's update; the record."""
        tr, rnd = self.trainer, self.round
        assert rnd is not None and rnd.aggregate is not None
        t, record, agg = rnd.t, rnd.record, rnd.aggregate
        if rnd.tested:
            assert reply is not None
            test_loss, test_acc = reply
            if not np.isfinite(test_loss):
                raise FloatingPointError(
                    f"FederatedTrainer: the test loss became NaN/inf in round {t} (selector "
                    f"{type(self.selector).__name__}, lr={record.lr}); lower the learning rate"
                )
            record.test_loss, record.test_accuracy = test_loss, test_acc
            if tr.track_global_loss:
                losses = tr._engine.client_losses(agg.theta, None, tr._buffers)
                record.global_loss = float(np.dot(tr._fed.weights, losses))
        rnd.opened.learn(agg)
        record.costs = rnd.ledger.costs
        if rnd.clock is not None:
            record.sim_seconds, record.sim_time = tr._clock.end_round(rnd.clock)  # type: ignore[union-attr]
        record.seconds = time.perf_counter() - rnd.started
        self.theta, self.round = agg.theta, None
        return record

    def _recorded(self, record: RoundRecord) -> None:
        """After round t: its record kept, the divergence rule, the callback, the target, a checkpoint."""
        tr, t = self.trainer, self.t
        self.history.rounds.append(record)
        if self.bar is not None:
            self.bar.update(1)
            if record.test_accuracy is not None:
                self.bar.set_postfix(acc=f"{record.test_accuracy:.3f}")
        tr._check_divergence(record, self.threshold, self.selector)
        if tr.callback is not None:
            tr.callback(tr, record)
        if (
            tr.stop_at_target
            and tr.target_accuracy is not None
            and record.test_accuracy is not None
            and record.test_accuracy >= tr.target_accuracy
        ) or (tr.time_budget is not None and record.sim_time is not None and record.sim_time >= tr.time_budget):
            self.phase = "end"
            return
        if self.ckpt_path is not None and (t + 1) % int(tr.checkpoint_every) == 0 and t + 1 < tr.rounds:
            tr._write_checkpoint(self.ckpt_path, self.fingerprint, self.theta, self.selector, self.history, t + 1,
                                 False)
        self.t += 1
        self.phase = "open" if self.t < self.last else "end"

    def _end(self) -> None:
        """The final checkpoint and the fitted attributes; the fit closed."""
        tr = self.trainer
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.ckpt_path is not None and not self.finished:
            tr._write_checkpoint(self.ckpt_path, self.fingerprint, self.theta, self.selector, self.history,
                                 len(self.history.rounds), True)
        _warn_trained_nobody(self.history, tr)
        tr.parameters_ = self.theta.numpy().copy()
        tr.buffers_ = {k: v.numpy().copy() for k, v in (tr._buffers or {}).items()}
        tr.model_ = tr._engine.module_at(self.theta, tr._buffers)
        self.phase = "done"
        self.close()


class TrainedNobodyWarning(RuntimeWarning):
    """Rounds of a run trained nobody: every chosen client failed (offline, past the deadline or the timeout)."""


def _warn_trained_nobody(history: History, trainer: Any) -> None:
    """One warning per run counting its rounds in which no chosen client reported (``rounds_trained_nobody``)."""
    empty = history.rounds_trained_nobody()
    if not empty:
        return
    n = len(history.rounds)
    settings = ", ".join(
        f"{k}={getattr(trainer, k)!r}" for k in ("deadline", "query_timeout") if getattr(trainer, k) is not None
    )
    if empty == n:
        msg = (
            f"FederatedTrainer: the run trained nobody at all: in every one of its {n} rounds every chosen client "
            f"failed, so the model is the initial one. Check the deadline and query timeout ({settings or 'none set'}) "
            "against the devices, and the availability (is any client ever online?)"
        )
    else:
        msg = (
            f"FederatedTrainer: {empty} of {n} rounds trained nobody (every chosen client failed); each lasted what "
            "the server waited. history_.rounds_trained_nobody() counts them"
        )
    warnings.warn(msg, TrainedNobodyWarning, stacklevel=5)  # _warn, _end, step, fit: the caller of fit


def _get_rng_state() -> dict[str, Any]:
    """The global random generators, as JSON values and arrays. The run itself draws from keyed
    streams (minibatches from (seed, round, client), dropout reseeded per round) and from the
    selector's own generators, which are saved with its state; the global ones are saved too so
    that a selector or model that draws from them still resumes identically."""
    name, key, pos, has_gauss, gauss = np.random.get_state()  # noqa: NPY002 (the legacy global generator)
    version, internal, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state().numpy(),
        "numpy": {"bit_generator": str(name), "key": np.asarray(key, dtype=np.uint32), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(gauss)},
        "python": {"version": int(version), "internal": np.asarray(internal, dtype=np.int64),
                   "gauss_next": None if gauss_next is None else float(gauss_next)},
    }


def _rng_from_checkpoint(state: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """:func:`_get_rng_state`'s values read back and checked (ValueError, TypeError, KeyError if malformed)."""
    t, n, p = state["torch"], state["numpy"], state["python"]
    if not (isinstance(t, np.ndarray) and t.dtype == np.uint8 and t.ndim == 1):
        raise TypeError("the torch generator state is not a uint8 vector")
    key = n["key"]
    if not (isinstance(key, np.ndarray) and key.dtype == np.uint32 and key.shape == (624,)
            and n["bit_generator"] == "MT19937" and 0 <= _checked_int(n["pos"], "pos") <= 624
            and n["has_gauss"] in (0, 1) and isinstance(n["cached_gaussian"], float)):
        raise ValueError("the numpy generator state is malformed")
    internal = p["internal"]
    if not (isinstance(internal, np.ndarray) and internal.dtype == np.int64 and internal.shape == (625,)
            and bool(np.all((internal >= 0) & (internal < 2**32))) and p["version"] == 3
            and (p["gauss_next"] is None or isinstance(p["gauss_next"], float))):
        raise ValueError("the Python generator state is malformed")
    return (torch.from_numpy(t.copy()),
            ("MT19937", key, int(n["pos"]), int(n["has_gauss"]), float(n["cached_gaussian"])),
            (3, tuple(int(x) for x in internal), p["gauss_next"]))


def _set_rng_state(state: tuple[Any, Any, Any]) -> None:
    torch.set_rng_state(state[0])
    np.random.set_state(state[1])  # noqa: NPY002
    random.setstate(state[2])


def _checked_tensor(value: Any, like: torch.Tensor, what: str) -> torch.Tensor:
    if not (isinstance(value, np.ndarray) and value.dtype == like.numpy().dtype and value.shape == tuple(like.shape)):
        raise ValueError(f"its {what} is not a {like.numpy().dtype} array of shape {tuple(like.shape)}")
    return torch.from_numpy(np.ascontiguousarray(value))


def _checked_int(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"its {what} is not a non-negative int")
    return value


def _checked_bool(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise ValueError(f"its {what} is not a bool")
    return value


def _json_ready(value: Any) -> Any:
    """A round's dict with numpy scalars as Python numbers (JSON, not pickled objects)."""
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    return value.item() if isinstance(value, np.generic) else value


def _unsafe_message(selector: BaseSelector, exc: Exception, path: Path | None = None) -> str:
    kept = f"; the last checkpoint in {path.parent} is kept" if path is not None and path.exists() else ""
    return (f"FederatedTrainer: the state of selector {type(selector).__name__} cannot be checkpointed without "
            f"pickle: {exc}{kept}. A checkpoint holds plain values, numpy arrays and torch tensors, numpy and torch "
            "random generators, torch modules, scipy CSR/CSC/COO matrices and objects of classes defined in the "
            "selector's own module. Keep other objects out of its fitted attributes, or pass "
            "checkpoint_trusted=True to write and read them with pickle, which runs code from the file: only for a "
            "checkpoint_dir no one else can write to (fedselect run/compare: --checkpoint-every 0 runs without "
            "checkpoints)")


def _plain(d: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in dict(d).items():
        if isinstance(v, (str, int, float, bool, type(None))):
            out[k] = v
        elif isinstance(v, (list, tuple)):
            out[k] = [x if isinstance(x, (str, int, float, bool, type(None))) else repr(x) for x in v]
        else:
            out[k] = repr(v)
    return out


def build_engine(model: Any, model_params: Mapping[str, Any] | None, fed: Any, *, batch_size: int,
                 local_steps: int | None, loss: Any = "cross-entropy", owner: str,
                 device: str | torch.device = "cpu", path: str = "eager") -> Engine:
    """The initial model on ``fed``'s data, as :class:`FederatedTrainer` and the Flower clients start.

    :func:`build_initial_model` (on the CPU, under the caller's seed, so the initial weights do not
    depend on the device), then an :class:`Engine` on ``device`` (whose probe runs the model once,
    so a model or loss that cannot run fails here, prefixed with ``owner``; the data is copied to
    the device here; ``path`` is the Engine's, eager or compiled), then :func:`check_single_sample_batches`.
    The caller seeds torch first.
    """
    module = build_initial_model(model, model_params, fed, owner=owner)
    try:
        engine = Engine(module, fed.X, fed.y, fed.loss_indices, fed.X_test, fed.y_test, loss=loss, device=device,
                        path=path)
    except ValueError as exc:
        # the Engine names its own parameter (path=); the trainer's user set engine=
        said = f" engine={path!r}:" if str(exc).startswith("path=") else ""
        raise ValueError(f"{owner}:{said} {exc}") from exc
    check_single_sample_batches(engine, fed.n_train_samples, batch_size, local_steps, owner=owner)
    return engine


def build_initial_model(model: Any, model_params: Mapping[str, Any] | None, fed: Any, *,
                        owner: str) -> torch.nn.Module:
    """The initial global model, as :class:`FederatedTrainer` and the Flower clients build it.

    A ``torch.nn.Module`` is used as given (``model_params`` must then be empty); a
    registered name or a builder is called as ``model(input_shape, n_outputs, **model_params)``,
    ``n_outputs`` being the federation's ``n_outputs`` (its ``n_classes`` when it has none).
    The caller seeds torch first, so the initial weights are reproducible.
    """
    params = dict(model_params or {})
    n_out = int(getattr(fed, "n_outputs", fed.n_classes))
    if isinstance(model, torch.nn.Module):
        if params:
            raise ValueError(f"{owner}: model_params={params!r} cannot apply to a module instance; "
                             "pass the module's builder (class or function) to have them used")
        return model
    if isinstance(model, str):
        return build_model(model, fed.input_shape, n_out, **params)
    built = model(tuple(fed.input_shape), n_out, **params)
    if not isinstance(built, torch.nn.Module):
        raise TypeError(f"{owner}: model={model!r} returned {type(built).__name__}, not a "
                        "torch.nn.Module; a model builder is called as "
                        "model(input_shape, n_outputs, **model_params)")
    return built


def check_single_sample_batches(engine: Engine, n_train_samples: np.ndarray, batch_size: int,
                                local_steps: int | None, *, owner: str) -> None:
    """Refuse a schedule that would give some client a one-sample minibatch its batch norm cannot normalise.

    With ``local_steps`` a client trains on batches of ``min(batch_size, n_k)`` samples; with
    whole epochs the last batch of a pass holds ``n_k % batch_size`` samples. Either is a
    problem only when ``engine.min_batch_size`` is 2 (batch norm over flat features).

    Raises
    ------
    ValueError
        Naming the clients, their sizes and the ways out.
    """
    if engine.min_batch_size < 2:
        return
    n = np.asarray(n_train_samples)
    b = int(batch_size)
    if local_steps is not None:
        bad = np.flatnonzero(np.minimum(b, n) == 1)
    else:
        bad = np.flatnonzero((n == 1) | (b == 1) | (n % b == 1))
    if bad.size:
        raise ValueError(
            f"{owner}: the model has a batch norm layer that cannot normalise a single sample in "
            f"training mode, and with batch_size={b} and "
            f"{'local steps' if local_steps is not None else 'whole local epochs'} client(s) "
            f"{bad[:10].tolist()}{' ...' if bad.size > 10 else ''} (training sizes {n[bad[:10]].tolist()}) would "
            "train on a one-sample minibatch; choose a batch_size that leaves no last batch of one sample "
            "(n_k % batch_size != 1), use local_steps (full batches of min(batch_size, n_k)), give every client "
            "at least 2 samples, or use a normalisation that works per sample (nn.GroupNorm, nn.LayerNorm)"
        )
