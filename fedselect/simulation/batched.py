"""Several runs that differ only in their seed, trained in lockstep as one computation.

A research grid repeats every scheme over seeds (ten, in this project's tables). Runs that
differ only in ``random_state`` do the same arithmetic on different numbers: S global models,
S x C chosen clients each round, S passes over the test set. :func:`fit_runs` advances S
:class:`~fedselect.FederatedTrainer` runs round by round and does each round's main training
(all S x C clients, each starting from its own run's global model) and its test evaluation
(all S models, one pass over the test data) as one batched computation, on
:meth:`Engine.train_runs <fedselect.simulation.engine.Engine.train_runs>` and
:meth:`Engine.test_runs <fedselect.simulation.engine.Engine.test_runs>`.

It drives S fits at once. A fit is one loop (:func:`fedselect.simulation.loop.run_fit`, a
generator, its state one :class:`~fedselect.simulation.loop.RunState`) that yields what it needs
computed next: its round's main training (a
:class:`~fedselect.simulation.trainer.TrainingRequest`) or its test evaluation (a
:class:`~fedselect.simulation.trainer.TestRequest`). ``fit`` computes each request by itself;
:func:`fit_runs` runs every run up to its next request, answers the runs waiting on a training
together (then, when none is, those waiting on a test), sends each run its result and goes on.
A run whose round needs no training or no test goes on without waiting.

Everything else stays per run, as in ``trainer.fit(federation)``: each run has its own
selector object, selection and asks its oracle its own questions (losses, trials, local
updates are computed for that run alone, inside ``select``), keeps its own random streams
(minibatches from ``(seed, round, client)``, dropout from its own seeded generator, the
selector's own generator) and its own history, checkpoints and callback. Each run also sees
its own copy of torch's, numpy's and Python's global generators, swapped in whenever its code
runs, so a selector or model that draws from them draws what it would alone.

What equals what: a batched run's history equals the same run alone up to float rounding
(the matrix products of the batched step and of the test pass are shaped differently, so
their sums round differently); the minibatches and the dropout masks are the same numbers.
A selector that ignores the model (random, round-robin, data-size) therefore makes
identical selections; one that ranks clients by loss can, rarely, break a near-tie
differently once the rounding has grown over many rounds, and its run then follows another,
equally valid, path.

Which runs batch: those whose engines train the same architecture on equal data (the same
training pool and test set, compared by content) with the same weight decay, proximal term
and momentum; run r's clients are index arrays into that shared pool, so federations that
partition one pool differently per seed (every built-in preset) batch. The model must be
one the engine can batch exactly (:meth:`Engine.batch_support
<fedselect.simulation.engine.Engine.batch_support>`: the built-in ``logistic``, ``mlp`` and
``cnn``, without batch norm). A run that cannot be batched with others runs its requests
alone, exactly as ``fit`` would, and ``log`` says why, once per run.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .engine import Engine
from .trainer import FederatedTrainer, TestRequest, TrainingRequest, _Fit

__all__ = ["fit_runs"]


@dataclass
class _Run:
    index: int
    trainer: FederatedTrainer
    fit: _Fit  # the trainer's fit in progress, between its phases
    rng: tuple[Any, Any, Any]  # torch, numpy, python global generator states of this run
    request: TrainingRequest | TestRequest | None = None
    reply: Any = None
    error: Exception | None = None  # what computing its request raised, to raise in the run at its next step
    done: bool = False
    failure: BaseException | None = None  # what the run raised
    noted: set[str] = field(default_factory=set)
    started: float = field(default_factory=time.perf_counter)
    seconds: float = 0.0


def _global_rng() -> tuple[Any, Any, Any]:
    return torch.get_rng_state(), np.random.get_state(), random.getstate()  # noqa: NPY002


def _set_global_rng(state: tuple[Any, Any, Any]) -> None:
    torch.set_rng_state(state[0])
    np.random.set_state(state[1])  # noqa: NPY002
    random.setstate(state[2])


class _Data:
    """Which engines share their data (content compared once per pair of arrays)."""

    def __init__(self) -> None:
        self._equal: dict[tuple[int, int], bool] = {}

    def same(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        if a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()):
            return True
        key = (id(a), id(b))
        if key not in self._equal:
            self._equal[key] = a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
        return self._equal[key]

    def train_compatible(self, a: TrainingRequest, b: TrainingRequest) -> bool:
        ea, eb = a.engine, b.engine
        return (ea.batch_key() == eb.batch_key()
                and a.optimizer.with_lr(1.0) == b.optimizer.with_lr(1.0)  # all but the step size, per run
                and self.same(ea.X, eb.X) and self.same(ea.y, eb.y))

    def test_compatible(self, ea: Engine, eb: Engine) -> bool:
        return (ea.batch_key() == eb.batch_key() and ea.eval_batch == eb.eval_batch
                and self.same(ea.X_test, eb.X_test) and self.same(ea.y_test, eb.y_test))


def fit_runs(
    trainers: Sequence[FederatedTrainer],
    federations: Sequence[Any],
    *,
    on_finish: Callable[[int, BaseException | None], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> list[BaseException | None]:
    """Fit several trainers in lockstep, batching their main training and test evaluation.

    Equivalent to ``[t.fit(f) for t, f in zip(trainers, federations)]`` up to float rounding
    (see the module's docstring for what is batched, what stays per run, and which runs can
    be batched); each trainer ends with the attributes ``fit`` gives it (``history_``,
    ``selector_``, ``parameters_``, ...), and its checkpoints are written as ``fit`` writes
    them. Runs may start at different rounds (resumed from checkpoints) and end at different
    rounds (``stop_at_target``, failures); the batch shrinks as runs end.

    Parameters
    ----------
    trainers : sequence of FederatedTrainer
        Typically one configuration with different ``random_state``. Nothing requires equal
        settings: requests that cannot share a computation are answered separately.
    federations : sequence of Federation
        The federation of each trainer (same length).
    on_finish : callable, optional
        Called as ``on_finish(i, error)`` the moment run i ends, ``error`` being None or the
        exception its ``fit`` raised. An exception raised by ``on_finish`` stops every run
        (each unfinished fit is closed: its cleanup runs) and propagates.
    log : callable, optional
        Receives one line per run that cannot be batched, saying why (default: no messages).

    Returns
    -------
    list of (BaseException or None)
        What each run's ``fit`` raised (an ``Exception``; a ``KeyboardInterrupt`` or other
        ``BaseException`` stops every run and propagates), in the order of ``trainers``.

    Notes
    -----
    Cost: per round, one batched local training of all runs' chosen clients (the longest
    client of any run sets the number of steps; padding costs arithmetic on masked samples,
    little when the runs' clients are alike, as the seeds of one federation recipe are), one
    test pass for all runs, and per run whatever its selector asks its oracle. torch's
    intra-op threads are set to the trainers' ``n_threads`` (when given) for the whole call
    and restored afterwards.
    """
    if len(trainers) != len(federations):
        raise ValueError(f"fit_runs: {len(trainers)} trainers but {len(federations)} federations; give one "
                         "federation per trainer")
    note = log or (lambda msg: None)
    outer = _global_rng()
    old_threads = torch.get_num_threads()
    threads = {int(t.n_threads) for t in trainers if t.n_threads}
    runs = [_Run(i, t, _Fit(t, f), outer) for i, (t, f) in enumerate(zip(trainers, federations))]
    data = _Data()
    try:
        if len(threads) == 1:
            torch.set_num_threads(threads.pop())
        while True:
            for run in runs:
                if not run.done and run.request is None:
                    _advance(run, on_finish)
            waiting = [r for r in runs if not r.done and r.request is not None]
            if not waiting:
                break
            training = [r for r in waiting if isinstance(r.request, TrainingRequest)]
            if training:
                _answer_training(training, data, note)
            else:
                _answer_tests(waiting, data, note)
    finally:
        for run in runs:
            if not run.done:
                run.fit.close()  # the trainer's cleanup (threads, engine) of an interrupted batch
        torch.set_num_threads(old_threads)
        _set_global_rng(outer)
    return [run.failure for run in runs]


def _advance(run: _Run, on_finish: Callable[[int, BaseException | None], None] | None) -> None:
    """Run ``run``'s own code up to its next request (or its end), with its own global generators."""
    _set_global_rng(run.rng)
    try:
        reply, error, run.reply, run.error = run.reply, run.error, None, None
        run.request = run.fit.step(reply, error)
        run.done = run.request is None
    except Exception as exc:  # the run's failure, as fit would have raised it; the other runs go on
        run.done, run.request, run.failure = True, None, exc
    finally:
        run.rng = _global_rng()
    if run.done:
        run.seconds = time.perf_counter() - run.started
        if on_finish is not None:
            on_finish(run.index, run.failure)


def _alone(run: _Run) -> None:
    """Answer ``run``'s request by itself, exactly as ``fit`` does (its global generators in place)."""
    assert run.request is not None
    _set_global_rng(run.rng)
    try:
        run.reply = run.request.run()
    except Exception as exc:
        run.error = exc
    finally:
        run.rng = _global_rng()
        run.request = None


def _unbatchable(run: _Run, why: str, note: Callable[[str], None]) -> None:
    if why not in run.noted:
        run.noted.add(why)
        note(f"batch_seeds: run {run.index} (random_state={run.trainer.random_state}) trains on its own: {why}")


def _groups(runs: list[_Run], same: Callable[[_Run, _Run], bool]) -> list[list[_Run]]:
    groups: list[list[_Run]] = []
    for run in runs:
        for g in groups:
            if same(g[0], run):
                g.append(run)
                break
        else:
            groups.append([run])
    return groups


def _answer_training(runs: list[_Run], data: _Data, note: Callable[[str], None]) -> None:
    batchable = []
    for run in runs:
        req = run.request
        assert isinstance(req, TrainingRequest)
        why = req.engine.batch_support()
        if why is None and req.buffers:
            why = "the model has buffers"
        if why is not None:
            _unbatchable(run, why, note)
            _alone(run)
        else:
            batchable.append(run)
    for group in _groups(batchable, lambda a, b: data.train_compatible(a.request, b.request)):  # type: ignore[arg-type]
        if len(group) == 1:
            _alone(group[0])
            continue
        reqs: list[TrainingRequest] = [r.request for r in group]  # type: ignore[misc]
        lead = reqs[0]
        try:
            deltas, states = lead.engine.train_runs(
                [q.theta for q in reqs], [q.batches for q in reqs], lrs=[q.lr for q in reqs],
                dropout_seeds=[q.dropout_seed for q in reqs],
                **{k: v for k, v in lead.optimizer.to_dict().items() if k != "lr"},
            )
        except Exception as exc:  # raised in every run of the group, where fit would have raised it
            for run in group:
                run.error, run.request = exc, None
            continue
        for run, d, state in zip(group, deltas, states):
            run.reply = (d, {})
            # what torch's global generator holds after the run's training alone (seeded, then the masks drawn)
            run.rng = (state, run.rng[1], run.rng[2])
            run.request = None


def _answer_tests(runs: list[_Run], data: _Data, note: Callable[[str], None]) -> None:
    batchable = []
    for run in runs:
        req = run.request
        assert isinstance(req, TestRequest)
        why = req.engine.batch_support()
        if why is None and req.buffers:
            why = "the model has buffers"
        if why is not None:
            _unbatchable(run, why, note)
            _alone(run)
        else:
            batchable.append(run)
    for group in _groups(batchable, lambda a, b: data.test_compatible(a.request.engine, b.request.engine)):  # type: ignore[union-attr]
        if len(group) == 1:
            _alone(group[0])
            continue
        lead = group[0].request
        assert lead is not None
        try:
            results = lead.engine.test_runs([r.request.theta for r in group])  # type: ignore[union-attr]
        except Exception as exc:
            for run in group:
                run.error, run.request = exc, None
            continue
        for run, res in zip(group, results):
            run.reply, run.request = res, None
