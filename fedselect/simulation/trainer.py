"""FederatedTrainer: a fast FedAvg / FedProx simulator that consumes any selector and counts its costs."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
import torch
from sklearn.base import BaseEstimator
from typing_extensions import Self

from .._validation import Constraint, InstanceOf, Interval, StrOptions
from ..aggregation import apply_deltas
from ..clock import RoundClock
from ..ledger import PARTIAL_WEIGHTS, Costs, RoundLedger
from ..round import Reports
from ..selection import BaseSelector, ClientOracle, Selection
from ._compiled import PATHS
from .engine import DEVICE_CONSTRAINTS, LOSSES, Engine, LocalSchedule, aggregate_buffers
from .loop import DivergenceError, TrainedNobodyWarning, _Fit, lr_at

# Names that moved out of this module and stay importable from it (and patchable in tests): the fit's loop
# (loop.py), building the run (setup.py), resuming it (resume.py).
from .models import build_model as build_model
from .resume import CHECKPOINT_FILE as CHECKPOINT_FILE
from .setup import build_engine as build_engine
from .setup import build_initial_model as build_initial_model
from .setup import check_single_sample_batches as check_single_sample_batches

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
        run = _Fit(self, federation)  # the fit itself: simulation/loop.py's run_fit, read top to bottom
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

    # The run's settings and streams are its RunSetup's (simulation/setup.py), kept after the fit; readers
    # from before (the checkpoint fingerprint, tests of the minibatch stream) find these two here.
    @property
    def _report_prob(self) -> np.ndarray | None:
        setup = self.__dict__.get("_setup")
        return None if setup is None else setup.report_prob

    @property
    def _train_seed(self) -> int:
        return self.__dict__["_setup"].train_seed
