"""The fit of :class:`~fedselect.simulation.trainer.FederatedTrainer` as one loop, read top to bottom.

:func:`run_fit` is the whole fit: build the run (:class:`~.setup.RunSetup`), the engine and the selector, resume
from a checkpoint (:class:`~.resume.Checkpointer`), then per round open it (select, ask the oracle), train the
chosen clients, aggregate, test, let the selector learn, record, and after the last round set the fitted
attributes. Its state between rounds is one object, :class:`RunState`.

It is a generator: where it needs something computed (round t's main training, its test evaluation) it yields
the request (a :class:`~fedselect.simulation.trainer.TrainingRequest` or
:class:`~fedselect.simulation.trainer.TestRequest`) and goes on with the answer sent back, or with the exception
computing it raised, thrown in where the round asked. :meth:`FederatedTrainer.fit` answers each request itself;
:func:`fedselect.simulation.batched.fit_runs` answers many fits' requests in one batched computation. :class:`_Fit`
is the driver both use (``step(reply, error)``, ``close()``).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._console import bars_wanted
from .._validation import InvalidParameterError
from ..aggregation import all_finite
from ..clock import SimulatedClock
from ..ledger import RoundLedger
from ..round import OpenRound, open_round
from ..round.record import History, RoundRecord
from ..selection import BaseSelector
from .engine import Engine
from .resume import Checkpointer
from .setup import RunSetup, build_engine
from .transport import SimulationOracle, TestRequest

__all__ = ["DivergenceError", "RunState", "TrainedNobodyWarning", "lr_at", "run_fit"]


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

    def __init__(
        self, message: str, *, round: int, test_loss: float | None = None, threshold: float | None = None
    ) -> None:
        super().__init__(message)
        self.round = int(round)
        self.test_loss = test_loss
        self.threshold = threshold


class TrainedNobodyWarning(RuntimeWarning):
    """Rounds of a run trained nobody: every chosen client failed (offline, past the deadline or the timeout)."""


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
class RunState:
    """One fit's state, carried from round to round: all the loop reads and changes.

    The global random generators are the rest of it (the checkpoint saves them); the selector's own
    generators are in its state.
    """

    setup: RunSetup  # the checked settings and the run's streams
    fed: Any  # the federation
    engine: Engine  # local training and evaluation on the federation's data
    selector: BaseSelector  # the fitted selector (or the checkpoint's)
    history: History
    theta: torch.Tensor  # w^t, the global model, flat, on the CPU
    buffers: dict[str, torch.Tensor] | None  # b^t, the global buffers (None: a model without)
    clock: SimulatedClock | None  # simulated time (None: no clock)
    t: int  # the next round to play
    last: int  # the round after the last to play
    finished: bool  # resumed from the checkpoint of a finished run
    threshold: float | None  # the test loss that is divergence (None: only the non-finite check)
    checkpoints: Checkpointer | None  # None: no checkpoint_dir


Request = Any  # a TrainingRequest or a TestRequest (simulation/trainer.py)


def run_fit(trainer: Any, fed: Any) -> Generator[Request, Any, None]:
    """The fit of ``trainer`` on ``fed``, yielding each computation it needs (see the module's docstring).

    Raises what :meth:`FederatedTrainer.fit` raises; torch's thread count and the progress bar are restored
    however it ends (also when closed between requests).
    """
    old_threads = bar = None
    try:
        setup = RunSetup(trainer, fed)  # every parameter checked before anything is built
        trainer._setup = setup
        old_threads = torch.get_num_threads()
        if trainer.n_threads:
            torch.set_num_threads(int(trainer.n_threads))
        state = _start(trainer, fed, setup)
        if trainer.progress and not state.finished and bars_wanted():
            from tqdm.auto import tqdm

            bar = tqdm(
                total=trainer.rounds, initial=state.t, desc=type(state.selector).__name__, unit="round", leave=False
            )
        while state.t < state.last:
            try:
                record = yield from _play_round(trainer, state)
            except DivergenceError:
                raise
            except FloatingPointError as exc:  # a non-finite model or loss in the round is the run's divergence
                raise DivergenceError(str(exc), round=state.t) from exc
            state.history.rounds.append(record)
            if bar is not None:
                bar.update(1)
                if record.test_accuracy is not None:
                    bar.set_postfix(acc=f"{record.test_accuracy:.3f}")
            _check_divergence(trainer, record, state)
            if trainer.callback is not None:
                trainer.callback(trainer, record)
            if _reached_target(trainer, record):
                break
            if state.checkpoints is not None and state.checkpoints.due(state.t, trainer.rounds):
                state.checkpoints.write(state.theta, state.buffers, state.selector, state.history, state.t + 1, False)
            state.t += 1
        if bar is not None:
            bar.close()
            bar = None
        if state.checkpoints is not None and not state.finished:
            state.checkpoints.write(
                state.theta, state.buffers, state.selector, state.history, len(state.history.rounds), True
            )
        _warn_trained_nobody(state.history, trainer)
        trainer.parameters_ = state.theta.numpy().copy()
        trainer.buffers_ = {k: v.numpy().copy() for k, v in (state.buffers or {}).items()}
        trainer.model_ = state.engine.module_at(state.theta, state.buffers)
    finally:
        if bar is not None:
            bar.close()
        if old_threads is not None:
            torch.set_num_threads(old_threads)


def _start(trainer: Any, fed: Any, setup: RunSetup) -> RunState:
    """The engine, the fitted selector, w^0, the divergence threshold, a checkpoint to resume; the state."""
    torch.manual_seed(int(setup.seeds[2]))
    engine = build_engine(
        trainer.model,
        trainer.model_params,
        fed,
        batch_size=trainer.batch_size,
        local_steps=trainer.local_steps,
        loss=trainer.loss,
        owner="FederatedTrainer",
        device=trainer.device,
        path=setup.path,
    )
    buffers = dict(engine.buffers) or None
    selector = setup.make_selector()
    selector.fit(fed.client_pool())
    setup.check_overcommit(selector)
    history = History(model_size=engine.n_params, config=setup.config(fed, selector))
    local_path = engine.local_path.name if engine.local_path.recorded else None
    if local_path is not None:  # the run's bits are this path's (runs recorded before it took another)
        history.config["local_path"] = local_path
    theta = engine.initial_parameters()
    threshold = None
    if trainer.divergence is not None:
        threshold = float(trainer.divergence) * engine.test(theta, buffers)[0]
    start, finished, checkpoints = 0, False, None
    if trainer.checkpoint_dir is not None:
        checkpoints = Checkpointer(setup, fed, selector, theta)
        checkpoints.check_checkpointable(selector)
        resumed = checkpoints.read(selector, theta, buffers)
        if resumed is not None:
            selector, theta = resumed.selector, resumed.theta
            if resumed.buffers is not None:
                buffers = resumed.buffers
            history.rounds = resumed.rounds
            start, finished = resumed.next_round, resumed.finished
            resumed.restore_rng()
    resumed_at = next((r.sim_time for r in reversed(history.rounds) if r.sim_time is not None), 0.0)
    trainer.selector_ = selector
    trainer.history_ = history
    trainer.resumed_from_ = start
    return RunState(
        setup=setup,
        fed=fed,
        engine=engine,
        selector=selector,
        history=history,
        theta=theta,
        buffers=buffers,
        clock=setup.start_clock(engine.n_params, resumed_at),
        t=start,
        last=start if finished else trainer.rounds,
        finished=finished,
        threshold=threshold,
        checkpoints=checkpoints,
    )


def _play_round(trainer: Any, state: RunState) -> Generator[Request, Any, RoundRecord]:
    """Round t: open it (selection, the oracle's questions), train, aggregate, test, learn; its record.

    Updates ``state.theta`` (w^{t+1}), ``state.buffers`` and the clock. Raises FloatingPointError when the
    global model or the test loss is not finite.
    """

    t = state.t
    started = time.perf_counter()
    opened, ledger, round_clock, record = _open(trainer, state)
    reply = (yield opened.request) if opened.request is not None else None
    agg = opened.conclude(reply)
    if agg.buffers is not None:
        state.buffers = agg.buffers
    if not all_finite(agg.theta):
        raise FloatingPointError(
            f"FederatedTrainer: the global model became NaN/inf in round {t} (selector "
            f"{type(state.selector).__name__}, lr={record.lr}); lower the learning rate or check the selection weights"
        )
    ids = agg.selection.clients
    record.clients = ids.tolist()
    record.weights = [float(w) for w in agg.weights]
    record.failed = ids[~agg.reported].tolist()
    if (t + 1) % trainer.eval_every == 0 or t == trainer.rounds - 1:
        test_loss, test_acc = yield TestRequest(state.engine, agg.theta, state.buffers)
        if not np.isfinite(test_loss):
            raise FloatingPointError(
                f"FederatedTrainer: the test loss became NaN/inf in round {t} (selector "
                f"{type(state.selector).__name__}, lr={record.lr}); lower the learning rate"
            )
        record.test_loss, record.test_accuracy = test_loss, test_acc
        if trainer.track_global_loss:
            losses = state.engine.client_losses(agg.theta, None, state.buffers)
            record.global_loss = float(np.dot(state.fed.weights, losses))
    opened.learn(agg)
    record.costs = ledger.costs
    if round_clock is not None:
        assert state.clock is not None
        record.sim_seconds, record.sim_time = state.clock.end_round(round_clock)
    record.seconds = time.perf_counter() - started
    state.theta = agg.theta
    return record


def _open(trainer: Any, state: RunState) -> tuple[OpenRound, RoundLedger, Any, RoundRecord]:
    """Round t's clients and oracle, and the selection: the open round, its ledger, its clock, its record."""

    t, setup, fed = state.t, state.setup, state.fed
    lr = lr_at(setup.optimizer.lr, trainer.lr_schedule, t)
    try:
        opt = setup.optimizer.with_lr(lr)
    except InvalidParameterError:
        raise InvalidParameterError(
            f"FederatedTrainer: lr_schedule gave lr={lr!r} for round {t}; a step size must be a finite number > 0"
        ) from None
    n = trainer.clients_per_round
    unavailable = setup.unavailable(t)
    rc = keep = online = None
    if state.clock is not None:
        rc = state.clock.start_round()
        if rc.offline.size:  # offline at the round's start: failed, as the per-round draw's clients are
            unavailable = np.union1d(unavailable, rc.offline)
        if setup.clock_observed:
            n, keep = setup.round_size(state.selector)
        if rc.offline.size and trainer.choose_among == "online" and rc.offline.size < fed.n_clients:
            # the server chooses among the clients that checked in; all of them when fewer than asked
            online = np.setdiff1d(np.arange(fed.n_clients), rc.offline, assume_unique=True)
            n = min(n, int(online.size))
            keep = None if keep is None else min(keep, n)
    ledger = RoundLedger(fed.n_clients, t, unavailable=unavailable)
    oracle = SimulationOracle(
        state.engine,
        fed.client_indices,
        ledger,
        theta=state.theta,
        optimizer=opt,
        schedule=setup.schedule,
        train_seed=setup.train_seed,
        buffers=state.buffers,
        aggregation_weights=setup.rule_weights,
        dropout_seed=lambda purpose: setup.dropout_seed(t, purpose),
        n_samples=fed.n_samples,
        clock=rc,
        keep=keep,
        sample_losses="sample_losses" in state.selector.needs,
        available=online,
        observed=setup.clock_observed,
        report_losses=trainer.feedback_losses == "always" or "losses" in state.selector.needs,
    )
    record = RoundRecord(round=t, clients=[], weights=[], lr=lr)
    opened = open_round(
        oracle,
        oracle,
        state.selector,
        n,
        state.theta,
        round=t,
        n_clients=fed.n_clients,
        aggregation=trainer.aggregation,
        n_samples=fed.n_samples,
        partial_weights=trainer.partial_weights,
    )
    assert opened is not None  # nothing is contained: a selector's error is the user's to see
    return opened, ledger, rc, record


def _check_divergence(trainer: Any, record: RoundRecord, state: RunState) -> None:
    """Raise DivergenceError when the round's test loss exceeds the run's threshold."""
    loss, threshold = record.test_loss, state.threshold
    if loss is None or threshold is None or loss <= threshold:
        return
    raise DivergenceError(
        f"FederatedTrainer: training diverged in round {record.round} (selector {type(state.selector).__name__}, "
        f"lr={record.lr:g}): test loss {loss:.4g} > {threshold:.4g} = divergence={trainer.divergence:g} x the "
        f"initial test loss {threshold / float(trainer.divergence):.4g}; lower the learning rate, or set "
        "divergence=None to disable this check",
        round=record.round,
        test_loss=float(loss),
        threshold=threshold,
    )


def _reached_target(trainer: Any, record: RoundRecord) -> bool:
    """Whether the run stops after this round: the target accuracy reached, or the time budget spent."""
    return bool(
        trainer.stop_at_target
        and trainer.target_accuracy is not None
        and record.test_accuracy is not None
        and record.test_accuracy >= trainer.target_accuracy
    ) or (trainer.time_budget is not None and record.sim_time is not None and record.sim_time >= trainer.time_budget)


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
    warnings.warn(msg, TrainedNobodyWarning, stacklevel=5)  # _warn, run_fit, _Fit.step, fit: the caller of fit


class _Fit:
    """One fit in progress, driven by its requests: :meth:`step` answers the last and returns the next.

    Parameters
    ----------
    trainer : FederatedTrainer
    federation : Federation
    """

    def __init__(self, trainer: Any, federation: Any) -> None:
        self._run = run_fit(trainer, federation)
        self._started = self._done = False

    def step(self, reply: Any = None, error: Exception | None = None) -> Request | None:
        """Run the fit up to its next request; None when it has ended (the trainer's attributes set).

        ``reply`` is the result of the last request (:meth:`TrainingRequest.run`'s or
        :meth:`TestRequest.run`'s), ``error`` the exception computing it raised instead: raised
        where the round asked. Raises what :meth:`FederatedTrainer.fit` raises, and then the fit is closed.
        """
        if self._done:
            return None
        try:
            if not self._started:
                self._started = True
                return next(self._run)
            if error is not None:
                return self._run.throw(error)
            return self._run.send(reply)
        except StopIteration:
            self._done = True
            return None
        except BaseException:
            self._done = True
            raise

    def close(self) -> None:
        """Stop the fit where it is, restoring what it changed (torch's threads, the progress bar). Idempotent."""
        self._done = True
        self._run.close()
