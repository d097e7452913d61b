"""The oracle's questions and the round's training, written once over a transport.

:class:`RoundOracle` answers a selector's questions (:class:`fedselect.ClientOracle`:
``losses``, ``trial``, ``local_updates``, ``available``, ``global_parameters``) and carries
the round's own training (:class:`fedselect.round.Transport`: ``start_training``,
``finish_training``, ``aggregate_buffers``) for any world that implements the few
primitives of :class:`OracleTransport`: prepare a local training of some clients from w^t
(and run it, or hand it to the caller), tell the losses of some clients at a model, combine
some clients' updates into a model, average their buffers. What each answer costs is
charged on one :class:`~fedselect.ledger.RoundLedger`, and with a
:class:`~fedselect.clock.RoundClock` every exchange is timed on it.

The worlds: the simulator (:mod:`fedselect.simulation.transport`), Flower
(``fedselect.flower.transport``) and the synthetic test world of the conformance checks
(:mod:`fedselect._synthetic`); :class:`TransportPolicies` holds what they may choose differently.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from ..aggregation import all_finite
from ..clock import RoundClock
from ..ledger import Costs, RoundLedger
from ..selection import ClientOracle, Selection
from .play import Reports

__all__ = ["OracleTransport", "RoundOracle", "TrainingWork", "TransportPolicies"]


class TrainingWork(Protocol):
    """One local training of some clients from w^t, prepared by a transport and not yet run."""

    def run(self) -> Any:
        """Train; the result the transport's :meth:`OracleTransport.received` reads."""

    @property
    def samples(self) -> np.ndarray:
        """The sample-gradients each client computes (its training time on a clock)."""

    @property
    def steps(self) -> int:
        """The local SGD steps of all clients together."""


class TransportPolicies:
    """The policies a transport may choose differently, with the simulator's and the synthetic world's choices.

    A transport subclasses this and overrides what its world does otherwise (Flower's
    :class:`~fedselect.flower.transport.FlowerClients` overrides each).
    """

    #: Where ``local_updates``' transform runs: ``"client"`` (the transformed rows go up, ``floats_up``) or
    #: ``"server"`` (the code cannot be shipped: the full update goes up, a model up, and the server transforms).
    transforms_on = "client"
    #: Whether the server sends (and pays for) messages to clients it does not know are offline (it cannot see
    #: them); False: the server sees who is offline (Flower's node map) and sends them nothing.
    reaches_offline = True

    def screen_updates(self, ids: np.ndarray, updates: Any) -> tuple[Any, np.ndarray]:
        """The updates of ``ids`` a trial model may be built from (rows possibly clipped) and the mask of those
        kept (the others' clients failed by the screen): every one, unchanged."""
        return updates, np.ones(len(ids), dtype=bool)

    def note(self, message: str) -> None:
        """Record what went wrong in the round and was contained (a non-finite trial model): nothing kept."""


class OracleTransport(Protocol):
    """The world's primitives a :class:`RoundOracle` is written over.

    Models are opaque to the oracle except ``theta``, the parameter vector it checks for
    finiteness; updates are rows (a Tensor or an ndarray per client).
    """

    n_samples: np.ndarray  # every client's n_k, reported with its update
    transforms_on: str  # the policies of TransportPolicies, which a transport subclasses
    reaches_offline: bool

    def screen_updates(self, ids: np.ndarray, updates: Any) -> tuple[Any, np.ndarray]:
        """:meth:`TransportPolicies.screen_updates`."""

    def note(self, message: str) -> None:
        """:meth:`TransportPolicies.note`."""

    def prepare(self, ids: np.ndarray, purpose: str) -> TrainingWork:
        """The local training of ``ids`` (distinct) from w^t for ``purpose`` (``"main"`` or ``"trial"``)."""

    def keep(self, work: TrainingWork, mask: np.ndarray) -> TrainingWork:
        """``work`` restricted to the clients of ``mask`` (a clock dropped the others before training)."""

    def at_once(self, work: TrainingWork) -> bool:
        """Whether the round's own training is run by the oracle rather than handed to the caller."""

    def received(self, ids: np.ndarray, work: TrainingWork, result: Any) -> Sequence[Any]:
        """The updates of ``ids`` (one row each) from ``work``'s ``result``; keeps what else came with them.

        A row is None where the client's answer was lost or refused (its reply screened out): it fails.
        """

    def losses_at(self, ids: np.ndarray | None, model: Any = None) -> np.ndarray:
        """The losses of ``ids`` (None: every client) at ``model`` (None: w^t); NaN where no usable answer came."""

    def eval_samples(self, ids: np.ndarray) -> np.ndarray:
        """The samples each of ``ids`` evaluates for one loss."""

    def combine(self, ids: np.ndarray, updates: Any, weights: np.ndarray) -> tuple[Any, Any]:
        """``(theta, model)``: the model w^t + sum_k weights_k updates_k of ``ids`` and its parameter vector."""

    def aggregate_buffers(self, ids: np.ndarray, weights: np.ndarray) -> Any:
        """The global buffers averaged over ``ids`` with ``weights`` (None for a model without)."""

    def sample_loss_sq(self, ids: np.ndarray) -> np.ndarray:
        """Each trained client's mean squared per-sample loss, sent with its update."""

    def global_parameters(self) -> np.ndarray:
        """A float32 copy of w^t."""

    def stack(self, rows: Sequence[Any]) -> Any:
        """The updates ``rows`` as one (len(rows), D) array or tensor (shape (0, D) when empty)."""


def _numpy(x: Any) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _finite(theta: Any) -> bool:
    return all_finite(theta) if isinstance(theta, torch.Tensor) else bool(np.isfinite(theta).all())


def _lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """``values`` of each entry of ``query`` found in the distinct ``keys``, 0 where absent."""
    out = np.zeros(query.size, dtype=np.asarray(values).dtype if len(values) else np.int64)
    if keys.size:
        order = np.argsort(keys)
        pos = np.clip(np.searchsorted(keys[order], query), 0, keys.size - 1)
        hit = keys[order][pos] == query
        out[hit] = np.asarray(values)[order][pos[hit]]
    return out


class RoundOracle(ClientOracle):
    """One round's answers to a selector's questions and the round's own training, each paid for.

    Every question is a few ledger steps around one transport primitive: who still needs
    w^t (one model down each), whose loss or update is not known yet (asked once per round),
    what came back (charged). The policies are decided here, once, for every world:

    * **A failed answer.** A client that does not answer (unavailable, past the clock's
      timeout, a NaN loss, an update the transport lost or refused) is marked failed on the
      ledger, answers NaN to every question and does not report; what was sent to it is charged.
    * **Finite trial models.** A trial model that is not finite (the updates were finite but
      their sum overflowed) is not sent: every entry of :meth:`trial` is NaN, the trial model is
      not charged, and the transport notes it (:meth:`TransportPolicies.note`).
    * **Screened trial updates.** The trial model is built from the updates the transport's
      :meth:`TransportPolicies.screen_updates` keeps (clipped or refused ones), re-weighted.
    * **Where transforms run** (``transforms_on``). ``local_updates(ids, transform)`` applies the
      transform to each answering client's update; on the client, the transformed rows are
      charged as ``floats_up``; on the server, each client's full update as a model up.
    * **Who is reached** (``reaches_offline``). One model down to each client asked that does not
      hold w^t, offline ones included unless the server sees who is offline.
    * **Buffers** are averaged by the transport's :meth:`OracleTransport.aggregate_buffers`, the
      one call both the trial model and the round make.

    The simulator and the synthetic world keep :class:`TransportPolicies`' choices (transforms on
    the client, offline clients reached, every update kept, nothing noted); Flower's
    :class:`~fedselect.flower.transport.FlowerClients` chooses otherwise each one (transforms on the
    server, no message to a client without a live node, the opt-in norm bound, notes in the
    round's ``errors``), and :class:`~fedselect.flower.transport.FlowerOracle` keeps its own
    trial-model exchange and hands the round's training to Flower as messages.

    Parameters
    ----------
    transport : OracleTransport
        The world.
    ledger : RoundLedger
        The round's bookkeeping (clients unavailable this round already marked failed).
    aggregation_weights : callable
        Maps a validated :class:`~fedselect.Selection` to the weights the round's rule gives
        its clients (the trial model's weights).
    clock : RoundClock, optional
        The round's simulated clock: every exchange is timed, late answers fail, stragglers
        fail, reporters' durations are observed. None: no time is kept.
    keep : int, optional
        With a clock: only the first ``keep`` chosen clients to finish report (over-selection).
    sample_losses : bool, default False
        Reporters send their mean squared per-sample loss (one scalar up each).
    available : ndarray of int, optional
        The clients online at the round's start; None: every client.
    observed : bool, default True
        With a clock: reporters' durations and the timed-out clients go to the reports.
    report_losses : bool, default True
        Each reporter sends its loss on w^t with its update (evaluated, charged and timed).

    Attributes
    ----------
    ledger : RoundLedger
    round, n_clients : int
    """

    name = "oracle"  # how errors name the methods

    def __init__(
        self,
        transport: OracleTransport,
        ledger: RoundLedger,
        *,
        aggregation_weights: Callable[[Selection], np.ndarray],
        clock: RoundClock | None = None,
        keep: int | None = None,
        sample_losses: bool = False,
        available: np.ndarray | None = None,
        observed: bool = True,
        report_losses: bool = True,
    ) -> None:
        self.transport = transport
        self._aggregation_weights = aggregation_weights
        self._keep = keep
        self._sample_losses = bool(sample_losses)
        self._observed = bool(observed)
        self._report_losses = bool(report_losses)
        self.open(ledger, clock=clock, available=available)

    def open(
        self, ledger: RoundLedger, *, clock: RoundClock | None = None, available: np.ndarray | None = None
    ) -> None:
        """Start answering for ``ledger``'s round (a transport that lives across rounds calls it each round)."""
        self.ledger = ledger
        self.round = ledger.round
        self.n_clients = ledger.n_clients
        self._clock = clock
        self._available = None if available is None else np.asarray(available, dtype=np.int64)
        self._timed_out: tuple[np.ndarray, np.ndarray] | None = None  # the clock's censored clients
        self._started: tuple[np.ndarray, np.ndarray, TrainingWork | None, np.ndarray | None] | None = None

    @property
    def costs(self) -> Costs:
        """What the round has cost so far (the ledger's)."""
        return self.ledger.costs

    # -- work on the ledger ---------------------------------------------------------------
    def _train(self, ids: np.ndarray, *, purpose: str) -> np.ndarray:
        """Train ``ids`` from w^t at once, charge it and keep the updates; the samples each trained on."""
        work = self.transport.prepare(ids, purpose)
        self._record(ids, work, work.run())
        return work.samples

    def _record(self, ids: np.ndarray, work: TrainingWork, result: Any) -> None:
        rows = list(self.transport.received(ids, work, result))
        if any(r is None for r in rows):  # lost or refused answers: those clients failed
            lost = np.array([r is None for r in rows])
            self.ledger.mark_failed(ids[lost])
            ids, rows = ids[~lost], [r for r in rows if r is not None]
            if not ids.size:
                return
        samples = work.samples
        self.ledger.record_training(
            ids, rows, steps=work.steps, sample_gradients=int(samples.sum()) if samples.size else 0
        )

    def _send_model(self, ids: np.ndarray) -> np.ndarray:
        """One model down to each of ``ids`` not holding w^t (those reached: see ``reaches_offline``); those."""
        return self.ledger.send_model(ids if self.transport.reaches_offline else self.ledger.alive(ids))

    def _ask_losses(self, ids: np.ndarray, late: np.ndarray | None = None) -> None:
        """Ask ``ids`` (distinct, alive) their loss on w^t; those of ``late`` answer too late (failed)."""
        if not ids.size:
            return
        values = self.transport.losses_at(None if ids.size == self.n_clients else ids)
        if late is not None and late.any():
            values = np.where(late, np.nan, values)
        self.ledger.record_losses(ids, values, samples_evaluated=int(self.transport.eval_samples(ids).sum()))

    def _asked(self, method: str, ids: np.ndarray) -> None:
        """Called with each question and the ids asked about, validated (a world that records questions)."""

    def _updates_of(self, ids: np.ndarray) -> Any:
        return self.transport.stack([self.ledger.update(int(k)) for k in ids])

    # -- the oracle -----------------------------------------------------------------------
    def losses(self, ids: Any) -> np.ndarray:
        """l_k(w^t) for each id (one model down per client not yet holding w^t, one scalar up); NaN if it failed."""
        ids = self.ledger.ids(ids, f"{self.name}.losses")
        self._asked("losses", ids)
        return self._losses(ids)

    def _losses(self, ids: np.ndarray) -> np.ndarray:
        led = self.ledger
        new = self._send_model(ids)
        ask = led.losses_to_ask(ids)
        late = None
        if self._clock is not None:  # one exchange: the model to those without it, a loss back from those asked
            if new.size == ask.size and np.array_equal(new, ask):  # the usual question: fresh clients, all alive
                reached, down, asked, failed = ask, 1, np.ones(ask.size, dtype=bool), None
            else:
                reached = np.union1d(new, ask)
                down, asked = np.isin(reached, new), np.isin(reached, ask)
                failed = led.failed_mask(reached)
            late_reached = self._clock.exchange(
                reached,
                failed=failed,
                models_down=down,
                eval_samples=np.where(asked, self.transport.eval_samples(reached), 0),
                scalars_up=asked,
            )
            if late_reached.any():
                late = np.isin(ask, reached[late_reached])
        self._ask_losses(ask, late)
        return led.loss(ids)

    def trial(self, ids: Any) -> np.ndarray:
        """The length-N vector l(w_trial) - l(w^t) if ``ids`` trained this round (not applied).

        Costs the baseline losses not yet paid this round, the local trainings not yet done
        (kept: a trial client chosen later is not trained again) and their uploads, then the
        trial model to every client not known to have failed and a scalar back from each that
        answers. NaN for failed clients; all NaN when no trial client answered or the trial
        model is not finite.
        """
        led = self.ledger
        ids = np.unique(led.ids(ids, f"{self.name}.trial"))
        if ids.size == 0:
            raise ValueError(f"{self.name}.trial: needs at least one client id")
        self._asked("trial", ids)
        base = self._losses(np.arange(self.n_clients))  # paid once per round: every client now holds w^t
        todo = led.to_train(ids)
        samples = np.zeros(0, dtype=np.int64)
        if todo.size:
            samples = self._train(todo, purpose="trial")
        alive = led.alive(ids)
        if self._clock is not None and alive.size:  # the trial clients train and send their updates
            late = self._clock.exchange(
                alive, models_up=~led.uploaded_mask(alive), train_samples=_lookup(todo, samples, alive)
            )
            if late.any():
                led.mark_failed(alive[late])
                alive = alive[~late]
        if not alive.size:  # no trial client answered: nothing was learned
            return np.full(self.n_clients, np.nan)
        led.upload(alive)
        w = self._aggregation_weights(Selection(alive).validated(self.n_clients, alive.size))
        updates, kept = self.transport.screen_updates(alive, self._updates_of(alive))
        if not kept.all():  # the screen refused some (failed): the trial is what the others would produce
            alive, updates = alive[kept], updates[kept]
            if not alive.size:
                return np.full(self.n_clients, np.nan)
            w = self._aggregation_weights(Selection(alive).validated(self.n_clients, alive.size))
        theta, model = self.transport.combine(alive, updates, w)
        if not _finite(theta):  # not sent: nobody can answer for it
            self.transport.note(
                f"round {self.round}: the trial model of clients {alive.tolist()[:20]} is not finite; NaN answers"
            )
            return np.full(self.n_clients, np.nan)
        return self._evaluate_trial(model, base)

    def _evaluate_trial(self, model: Any, base: np.ndarray) -> np.ndarray:
        """l(w_trial) - ``base`` for every client: the trial model goes down to every client not known to have
        failed, and those who answer send a scalar back (each charged); NaN for failed clients."""
        led = self.ledger
        answering = led.answering()
        after = self.transport.losses_at(None, model)
        n_sent = self.n_clients - len(led.known_failed)
        n_answered = answering.size
        if self._clock is not None:
            known = np.fromiter(led.known_failed, dtype=np.int64)
            sent = np.setdiff1d(np.arange(self.n_clients), known)
            quiet = ~np.isin(sent, answering)
            late = self._clock.exchange(
                sent, failed=quiet, models_down=1, eval_samples=self.transport.eval_samples(sent), scalars_up=~quiet
            )
            if late.any():
                led.mark_failed(sent[late])
                n_answered -= int(late.sum())
        led.record_trial(n_answered, samples_evaluated=int(self.transport.eval_samples(answering).sum()), n_sent=n_sent)
        led.contacted(np.arange(self.n_clients))
        out = after - base
        out[list(led.failed)] = np.nan
        return out

    def local_updates(self, ids: Any, transform: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
        """Each id's local update from w^t (float32 rows), transformed client-side; NaN rows for failed clients.

        Without ``transform`` each answering client uploads its full update (a model up, once
        per round); with it, the transformed rows are counted in ``floats_up``.
        """
        led = self.ledger
        ids = led.ids(ids, f"{self.name}.local_updates")
        self._asked("local_updates", ids)
        new = self._send_model(ids)
        todo = led.to_train(ids)
        samples = np.zeros(0, dtype=np.int64)
        if todo.size:
            samples = self._train(todo, purpose="main")
        full = transform is None or self.transport.transforms_on == "server"  # the full update goes up
        rows: list[np.ndarray | None] = []
        for k in ids.tolist():
            if led.is_failed(k):
                rows.append(None)
                continue
            u = _numpy(led.update(k)).astype(np.float32, copy=True)
            rows.append(u if transform is None else np.asarray(transform(u), dtype=np.float32).reshape(-1))
        if self._clock is not None:
            rows = self._time_local_updates(ids, rows, new, todo, samples, full=full)
        for k, r in zip(ids.tolist(), rows):  # what reached the server is charged
            if r is None:
                continue
            if full:
                led.upload([k])  # the server keeps what it received
            else:
                led.record_floats_up(r.size)
        sizes = {r.size for r in rows if r is not None}
        if len(sizes) > 1:
            raise ValueError(f"{self.name}.local_updates: the transform returned vectors of different lengths")
        if sizes:
            width = sizes.pop()
        else:  # nobody answered: the width of an update (or of a transformed one, from a zero update)
            width = self.transport.global_parameters().size
            if transform is not None and rows:
                width = np.asarray(transform(np.zeros(width, dtype=np.float32))).size
        if not rows:
            return np.zeros((0, width), dtype=np.float32)
        return np.stack([np.full(width, np.nan, dtype=np.float32) if r is None else r for r in rows])

    def _time_local_updates(
        self,
        ids: np.ndarray,
        rows: list[np.ndarray | None],
        new: np.ndarray,
        todo: np.ndarray,
        samples: np.ndarray,
        *,
        full: bool,
    ) -> list[np.ndarray | None]:
        """Time :meth:`local_updates`' exchange on the clock; the rows with late answers set to None (failed)."""
        led = self.ledger
        reached = np.unique(ids)
        floats = np.zeros(reached.size)
        for k, r in zip(ids.tolist(), rows):
            if r is not None and not full:
                floats[np.searchsorted(reached, k)] += r.size
        failed = led.failed_mask(reached)
        late = self._clock.exchange(  # type: ignore[union-attr]
            reached,
            failed=failed,
            models_down=np.isin(reached, new),
            train_samples=_lookup(todo, samples, reached),
            models_up=(~failed & ~led.uploaded_mask(reached)) if full else 0,
            floats_up=floats,
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
        """A float32 copy of w^t. Free."""
        self._asked("global_parameters", np.zeros(0, dtype=np.int64))
        return self.transport.global_parameters()

    # -- the round's own training (fedselect.round.Transport) -----------------------------------
    def start_training(self, ids: np.ndarray) -> Any:
        """Start the round's training of the chosen (distinct) ``ids``: the work for the caller to run
        (:meth:`TrainingWork.run`, or in bulk with other runs'), None when there is none (every chosen client
        trained by an oracle question or failed, or the transport trains at once)."""
        led = self.ledger
        self._timed_out = None
        new = self._send_model(ids)
        todo = led.to_train(ids)
        work = cut = None
        if self._clock is not None:
            todo, work, cut = self._settle(ids, new, todo)
        elif todo.size:
            work = self.transport.prepare(todo, "main")
        if work is not None and self.transport.at_once(work):
            self._record(todo, work, work.run())
            work = None
        self._started = (ids, todo, work, cut)
        return work

    def finish_training(self, reply: Any) -> Reports:
        """The reports of the chosen clients that answer, given the result of :meth:`start_training`'s work.

        Each reporter sends its loss on w^t (unless already known; only with ``report_losses``)
        and its update (unless already uploaded), with a clock its observed seconds, and its
        mean squared per-sample loss when asked. Failed clients do not report.
        """
        led = self.ledger
        started, self._started = self._started, None
        if started is None:
            raise RuntimeError(f"{type(self).__name__}: finish_training without start_training")
        ids, todo, work, cut = started
        if work is not None:
            self._record(todo, work, reply)
        if cut is not None and cut.size:  # over-selected clients that finished after the first `keep`
            led.mark_failed(cut)
        if self._report_losses:
            self._ask_losses(led.losses_to_ask(ids))
        reporters = led.alive(ids)  # after the losses: a client whose loss is not finite did not report
        led.upload(reporters)
        sq = None
        if self._sample_losses:
            if reporters.size:
                led.record_scalars_up(int(reporters.size))  # each reporter's sample_loss_sq, sent with its update
            sq = self.transport.sample_loss_sq(reporters)
        durations = timed_out = after = None
        if self._clock is not None and self._observed:
            durations = self._clock.spent[reporters].copy()
            timed_out, after = self._timed_out if self._timed_out is not None else (np.zeros(0, np.int64), np.zeros(0))
        losses = led.loss(reporters) if self._report_losses else None
        return Reports(
            reporters,
            self._updates_of(reporters),
            losses,
            self.transport.n_samples[reporters],
            durations,
            sq,
            timed_out,
            after,
        )

    def aggregate_buffers(self, reporters: np.ndarray, weights: np.ndarray) -> Any:
        """The global buffers averaged over ``reporters`` (None for a model without)."""
        return self.transport.aggregate_buffers(reporters, weights)

    def _settle(
        self, ids: np.ndarray, new: np.ndarray, todo: np.ndarray
    ) -> tuple[np.ndarray, TrainingWork | None, np.ndarray]:
        """Time the training exchange of the chosen ``ids`` on the clock (:meth:`RoundClock.settle`).

        Stragglers and clients offline at their completion are marked failed before training;
        returns the clients still to train, their work, and the over-selected clients to cut
        after training.
        """
        led = self.ledger
        assert self._clock is not None
        work = self.transport.prepare(todo, "main") if todo.size else None
        samples = work.samples if work is not None else np.zeros(0, dtype=np.int64)
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
        settled = self._clock.settle(
            ids,
            failed=failed,
            keep=self._keep,
            models_down=down,
            models_up=up,
            scalars_up=scalars,
            train_samples=samples if todo.size == ids.size else _lookup(todo, samples, ids),
            eval_samples=np.where(ask, self.transport.eval_samples(ids), 0),
        )
        if settled.drop.size:
            led.mark_failed(settled.drop)
            stay = ~np.isin(todo, settled.drop)
            todo = todo[stay]
            work = None if work is None or not todo.size else self.transport.keep(work, stay)
        self._timed_out = (settled.timed_out, settled.timed_out_after)
        return todo, work, settled.cut
