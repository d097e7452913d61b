"""Flower as a transport: the live clients' primitives for :class:`fedselect.round.RoundOracle`.

:class:`FlowerClients` reaches the clients of one round through the strategy's wire and screens every reply
with its reply checks; :class:`FlowerOracle` is the round's :class:`~fedselect.round.RoundOracle` over it, built
by :class:`~fedselect.flower.SelectorStrategy` every round, with the steps that are this world's own (the trial
model's norm-bound screen and message count; the round's training handed to Flower as messages).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import ERROR
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.supercore import log

from ..aggregation import aggregation_weights, apply_deltas, average_buffer_arrays
from ..ledger import RoundLedger
from ..round import Reports, RoundOracle, TransportPolicies
from . import _protocol as P

if TYPE_CHECKING:
    from .strategy import SelectorStrategy

__all__ = ["FlowerClients", "FlowerOracle", "TrainMessages", "UpdateExchange"]


@dataclass
class TrainMessages:
    """What :meth:`FlowerOracle.start_training` returns: the round's train messages.

    ``SelectorStrategy.configure_train`` returns them to Flower, which sends them;
    ``aggregate_train`` hands the replies to the round (:meth:`fedselect.round.OpenRound.conclude`).
    """

    messages: list[Message]


@dataclass
class _Training:
    """:meth:`FlowerOracle.start_training`'s training until :meth:`~FlowerOracle.finish_training`: the chosen
    clients, those sent a train message, the messages, whose loss they ask, and when they left."""

    ids: np.ndarray
    todo: np.ndarray
    messages: list[Message]
    need_loss: set[int]
    sent: float


@dataclass
class UpdateExchange:
    """One oracle question's local training of some clients (:class:`fedselect.round.TrainingWork`): update
    messages to ``ids``, prepared by :meth:`FlowerClients.prepare`, sent by :meth:`run`.

    ``samples`` and ``steps`` are what the usable replies said (known once :meth:`FlowerClients.received` has
    read them; this world has no clock to time them beforehand).
    """

    clients: FlowerClients
    ids: np.ndarray
    purpose: str
    samples: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    steps: int = 0

    def run(self) -> tuple[dict[int, RecordDict], dict[int, float]]:
        """Send the messages; the usable replies by client id and each reply's seconds by the server's clock."""
        times: dict[int, float] = {}
        extra: dict[str, Any] = {P.PURPOSE: self.purpose}
        if self.clients.needs_sample_losses:  # a client trained now and chosen later is not trained again
            extra[P.NEED_SAMPLE_LOSS] = True
        kind = "update" if self.purpose == "main" else "trial"
        got, _ = self.clients.send(self.ids, P.UPDATE, kind, extra, times=times)
        return got, times


class FlowerClients(TransportPolicies):
    """The live clients of one Flower round, reached through the Grid (:class:`fedselect.round.OracleTransport`).

    Each primitive is a message to exactly the nodes asked, through the strategy's
    :class:`~fedselect.flower.wire.Wire` (``strategy.wire_``), and every reply passes its
    :class:`~fedselect.flower.checks.ReplyChecks` (``strategy.checks_``) before the oracle sees it: an unusable
    reply is refused (logged, kept in ``rejected``, its client failed) and its client answers NaN (a loss) or
    None (an update), as a client that did not answer. Where this world differs from the simulator's:

    * ``transforms_on = "server"``: a transform is arbitrary server code, not shipped; each client uploads its
      full update (a model up) and the server applies the transform.
    * ``reaches_offline = False``: the server sees its node map, so a client without a live node gets no
      message and is charged nothing.
    * :meth:`screen_updates` applies the opt-in ``update_norm_bound`` to the updates a trial model is built
      from; :meth:`note` logs what went wrong and was contained (``FlowerRound.errors``).

    Parameters
    ----------
    strategy : SelectorStrategy
        The strategy whose wire, checks, model layout and configuration the messages use.
    grid : Grid
        Flower's Grid.
    ledger : RoundLedger
        The round's bookkeeping.
    theta : ndarray of shape (D,)
        w^t's parameters.
    config : ConfigRecord
        The configuration every message carries.
    buffers : mapping of str to ndarray, optional
        The global buffers b^t by name (None: a model without).
    """

    transforms_on = "server"
    reaches_offline = False

    def __init__(
        self,
        strategy: SelectorStrategy,
        grid: Grid,
        ledger: RoundLedger,
        theta: np.ndarray,
        config: ConfigRecord,
        buffers: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        self.strategy = strategy
        self.grid = grid
        self.ledger = ledger
        self.theta = theta
        self.config = config
        self.buffers = dict(buffers or {})  # b^t, by name (empty: a model without)
        self.buffer_deltas: dict[int, dict[str, np.ndarray]] = {}  # b_k - b^t of each trained client
        self.sample_sq: dict[int, float] = {}  # each trained client's sample_loss_sq (when the selector needs it)
        self.holding: set[int] = set()  # the clients sent w^t's arrays this round (the others get it cached)
        self.evaluated: dict[int, int] = {}  # the samples each client's latest loss reply said it evaluated

    @property
    def n_samples(self) -> np.ndarray:
        """Every client's n_k, from its hello."""
        return self.strategy.wire_.n_samples_array()

    @property
    def needs_sample_losses(self) -> bool:
        """Whether each trained client sends its mean squared per-sample loss (the selector needs it)."""
        return "sample_losses" in self.strategy.selector_.needs

    # -- messages ---------------------------------------------------------------------------
    def content(self, k: int, extra: Mapping[str, Any], model: tuple[Any, Any] | None = None) -> RecordDict:
        """The message to client ``k``: the configuration with ``extra``, and ``model`` (a trial model), or w^t's
        arrays the first time it is sent this round (else the node's cached copy)."""
        cfg = ConfigRecord(dict(self.config))
        cfg[P.ROUND] = int(self.ledger.round)
        cfg.update(dict(extra))
        if model is not None:
            cfg[P.MODEL_KIND] = "trial"
            return RecordDict({"arrays": self.strategy.layout_.record(*model), "config": cfg})
        cfg[P.MODEL_KIND] = "global"
        if k not in self.holding:
            self.holding.add(k)
            return RecordDict({"arrays": self.strategy.global_arrays_, "config": cfg})
        cfg[P.CACHED] = True
        return RecordDict({"config": cfg})

    def send(
        self,
        ids: np.ndarray,
        message_type: str,
        kind: str,
        extra: Mapping[str, Any],
        model: tuple[Any, Any] | None = None,
        times: dict[int, float] | None = None,
    ) -> tuple[dict[int, RecordDict], int]:
        """One message per id with a live node (:meth:`fedselect.flower.wire.Wire.exchange`, ``times`` receiving
        each reply's seconds); the usable replies by client id (:meth:`ReplyChecks.valid_replies`) and the
        number of messages sent. A client absent from the replies did not answer: it is failed for the round."""
        wire = self.strategy.wire_
        messages = []
        for k in ids.tolist():
            node = wire.node_of(k)
            if node is None:  # the node vanished during the round: no message, the client fails
                continue
            content = self.content(k, extra, model)
            messages.append(Message(content, node, message_type, group_id=str(self.ledger.round + 1)))
        replies = wire.exchange(self.grid, messages, self.strategy.query_timeout, kind, times)
        got = self.strategy.checks_.valid_replies(replies)
        silent = [k for k in ids.tolist() if k not in got]
        if silent:  # timed out, answered with an error, or its node is gone
            self.ledger.mark_failed(np.asarray(silent, dtype=np.int64))
        return got, len(messages)

    def take_update(
        self, k: int, content: RecordDict, what: str, *, need_loss: bool = False
    ) -> tuple[np.ndarray, int, int, tuple[float, int] | None] | None:
        """Client ``k``'s update reply, checked: (delta, steps, sample gradients, its loss on w^t and the samples
        it evaluated when ``need_loss``), keeping its buffers and sample loss; None (refused) if unusable."""
        checks = self.strategy.checks_
        try:  # anything a reply makes go wrong (overflow, memory, a bad layout) fails its client only
            delta, steps, grads, buffer_deltas = checks.parse_update(content)
            loss = P.parse_loss(content, float(self.strategy.max_abs_loss)) if need_loss else None
            sq = (
                P.sample_loss_sq(P.reply_metrics(content), float(self.strategy.max_abs_loss))
                if self.needs_sample_losses
                else None
            )
        except Exception as exc:
            checks.reject(self.ledger, k, what, exc)
            return None
        if sq is not None:
            self.sample_sq[k] = sq
        self.buffer_deltas[k] = buffer_deltas
        return delta, steps, grads, loss

    def ask_losses(
        self, ids: np.ndarray, model: tuple[Any, Any] | None = None
    ) -> tuple[list[int], list[float], int, int]:
        """The usable loss replies of ``ids`` at w^t (or at ``model``, a trial model): ids, values, samples
        evaluated, messages sent; the others' clients are refused or did not answer.

        The values pass the strategy's loss rules (``on_global``: losses on w^t enter each client's history, a
        trial model's do not). When most clients cannot evaluate a trial model, the model is at fault (built
        from a hostile update), not they: nobody is refused and no value returned.
        """
        on_global = model is None
        extra = {} if on_global else {P.PURPOSE: "trial"}
        got, n_sent = self.send(ids, P.LOSS, "loss" if on_global else "trial", extra, model=model)
        ok, values, evaluated, bad = [], [], 0, []
        for k in ids.tolist():
            if k not in got:
                continue
            try:
                value, n = P.parse_loss(got[k], float(self.strategy.max_abs_loss))
            except Exception as exc:
                bad.append((k, exc))
                continue
            ok.append(k)
            values.append(value)
            evaluated += n
            if on_global:
                self.evaluated[k] = n
        if not on_global and len(bad) > len(ok):
            self.note(
                f"round {self.ledger.round}: {len(bad)} of {len(bad) + len(ok)} clients could not evaluate the "
                f"trial model (e.g. {P.why(bad[0][1])}); the trial answers NaN and nobody is failed"
            )
            return [], [], evaluated, n_sent
        for k, exc in bad:
            self.strategy.checks_.reject(self.ledger, k, "loss", exc)
        return ok, self.strategy.checks_.clip_losses(ok, values, on_global=on_global), evaluated, n_sent

    def note(self, message: str) -> None:
        """Log what went wrong and was contained; it goes to the round's ``errors``."""
        log(ERROR, "fedselect: %s", message)
        self.strategy.note_error(message)

    # -- OracleTransport ----------------------------------------------------------------------
    def prepare(self, ids: np.ndarray, purpose: str) -> UpdateExchange:
        """The update messages to ``ids`` for ``purpose`` (not sent yet)."""
        return UpdateExchange(self, np.asarray(ids, dtype=np.int64), purpose)

    def keep(self, work: UpdateExchange, mask: np.ndarray) -> UpdateExchange:
        """``work`` for the clients of ``mask`` only."""
        return UpdateExchange(self, work.ids[mask], work.purpose)

    def at_once(self, work: UpdateExchange) -> bool:
        """An oracle question's training is sent at once (the round's is :class:`TrainMessages`)."""
        return True

    def received(
        self, ids: np.ndarray, work: UpdateExchange, result: tuple[dict[int, RecordDict], dict[int, float]]
    ) -> list[np.ndarray | None]:
        """Each of ``ids``' checked update (None: no usable reply), in the order the replies came; the reply's
        seconds become the client's ``reply_seconds``."""
        got, times = result
        wire = self.strategy.wire_
        taken: dict[int, tuple[np.ndarray, int, int]] = {}
        for k, content in got.items():
            update = self.take_update(k, content, "update")
            if update is None:
                continue
            taken[k] = update[:3]
            if k in times:
                wire.reply_seconds[k] = times[k]
        work.steps = sum(s for _, s, _ in taken.values())
        work.samples = np.array([g for _, _, g in taken.values()], dtype=np.int64)
        return [taken[k][0] if k in taken else None for k in ids.tolist()]

    def losses_at(self, ids: np.ndarray | None, model: Any = None) -> np.ndarray:
        """The checked losses of ``ids`` (None: every client) at w^t or ``model``; NaN where none came."""
        ids = np.arange(self.ledger.n_clients) if ids is None else np.asarray(ids, dtype=np.int64)
        ok, values, _, _ = self.ask_losses(ids, model)
        out = np.full(ids.size, np.nan)
        where = {k: i for i, k in enumerate(ids.tolist())}
        out[[where[k] for k in ok]] = values
        return out

    def eval_samples(self, ids: np.ndarray) -> np.ndarray:
        """What each of ``ids``' latest loss reply said it evaluated (0 without one)."""
        return np.array([self.evaluated.get(int(k), 0) for k in ids], dtype=np.int64)

    def combine(
        self, ids: np.ndarray, updates: np.ndarray, weights: np.ndarray
    ) -> tuple[np.ndarray, tuple[np.ndarray, dict[str, np.ndarray]]]:
        """The trial model w^t + sum_k a_k delta_k with its buffers averaged with the same weights."""
        theta = apply_deltas(self.theta, updates, weights)
        return theta, (theta, self.aggregate_buffers(ids, weights))

    def aggregate_buffers(self, ids: np.ndarray, weights: np.ndarray) -> dict[str, np.ndarray]:
        """The global buffers after averaging trained clients ``ids`` with ``weights``
        (:func:`fedselect.aggregation.average_buffer_arrays`); empty for a model without buffers."""
        if not self.buffers:
            return {}
        return average_buffer_arrays(self.buffers, [self.buffer_deltas[int(k)] for k in ids], weights)

    def screen_updates(self, ids: np.ndarray, updates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The opt-in ``update_norm_bound`` on updates aggregated together: the rows (clipped under ``"clip"``)
        and the mask of those kept (the others' clients refused)."""
        stacked, keep, _ = self.strategy.checks_.bound_norms(ids, updates, self.ledger, self.theta)
        return stacked, keep

    def sample_loss_sq(self, ids: np.ndarray) -> np.ndarray:
        """Each of ``ids``' sample_loss_sq as it sent it."""
        return np.array([self.sample_sq[int(k)] for k in ids], dtype=np.float64)

    def global_parameters(self) -> np.ndarray:
        """A copy of w^t's parameters."""
        return self.theta.copy()

    def stack(self, rows: Sequence[Any]) -> np.ndarray:
        """The rows as one (len(rows), D) array."""
        return np.stack([np.asarray(r) for r in rows]) if rows else np.zeros((0, self.theta.size), np.float32)


class FlowerOracle(RoundOracle):
    """A selector's paid questions, asked of the live clients through the Flower Grid, and the round's transport.

    The :class:`~fedselect.round.RoundOracle` over :class:`FlowerClients`: ``losses``, ``local_updates``,
    ``global_parameters`` and ``available`` are the oracle's, written once for every world, with this world's
    policies (transforms run on the server, charged as the full update's model up; a client without a live node
    gets no message). One per round, built by :class:`SelectorStrategy`, which plays the round's phases
    (:mod:`fedselect.round`) against it. Every question is a message to exactly the nodes whose answer is not
    known yet this round, charged on the round's :class:`~fedselect.ledger.RoundLedger` as in the simulator. A
    client that does not answer within ``query_timeout``, answers with an error or sends a reply that cannot be
    used (no finite ``loss``, no update, non-integer counts, no usable sample loss when the selector needs one)
    is failed for the round: its answer is NaN and it is not contacted again. Each trained client's reply is
    timed by the server's own clock: its ``reply_seconds``, the feedback's ``durations``.

    Its policies are :class:`FlowerClients`' (:class:`~fedselect.round.oracle.TransportPolicies`): the trial
    clients' updates pass the opt-in ``update_norm_bound`` before the trial model is built, and a non-finite trial
    model is noted in the round's ``errors``. Two steps are this world's own: the trial model goes to every client
    alive with a live node and is charged per message sent (``_evaluate_trial``), and the round's training
    is handed to Flower: :meth:`start_training` returns the train messages (:class:`TrainMessages`),
    :meth:`finish_training` reads the replies. With buffers (``SelectorStrategy(buffers=...)``) the server keeps
    each trained client's ``b_k - b^t``; no answer to the selector holds a buffer.

    Parameters
    ----------
    clients : FlowerClients
        The round's clients (built by the strategy with its Grid, the round's ledger, w^t and the configuration).
    """

    def __init__(self, clients: FlowerClients) -> None:
        strategy = clients.strategy
        weights = functools.partial(aggregation_weights, **strategy.weight_rule())
        super().__init__(clients, clients.ledger, aggregation_weights=weights)
        self.strategy = strategy
        self._training: _Training | None = None  # start_training's, until finish_training

    @property
    def _needs_losses(self) -> bool:
        """Whether the chosen clients evaluate their loss on w^t before training (the selector needs
        ``"losses"``), as the simulator's ``feedback_losses="auto"`` does."""
        return "losses" in self.strategy.selector_.needs

    def _evaluate_trial(self, model: Any, base: np.ndarray) -> np.ndarray:
        """This world's trial-model exchange: the model goes to every client still alive with a live node,
        charged per message sent; a scalar back from each usable answer; no answers (all NaN, nobody failed)
        when most clients cannot evaluate it (:meth:`FlowerClients.ask_losses`)."""
        led = self.ledger
        ok, values, evaluated, n_sent = self.transport.ask_losses(led.alive(np.arange(self.n_clients)), model)
        after = np.full(self.n_clients, np.nan)
        after[ok] = values
        led.record_trial(len(ok), samples_evaluated=evaluated, n_sent=n_sent)
        out = after - base
        out[sorted(led.failed)] = np.nan
        return out

    def start_training(self, ids: np.ndarray) -> TrainMessages:
        """Start training the chosen (distinct) ``ids``: their train messages, for Flower to send.

        The round's transport (:class:`fedselect.round.Transport`) with :meth:`finish_training`, which
        takes the replies (``aggregate_train``'s) and returns the reports.

        The chosen clients whose update the server does not already hold get a ``train``
        message (with ``w^t`` unless they received it earlier this round, asking their loss on
        ``w^t`` too when not yet known and the selector needs ``"losses"``); clients without a live node
        fail. Each reply is checked as the oracle's are
        (layout, counts, finite and bounded loss, size, and the sample loss when the selector
        needs it: :func:`fedselect.flower._protocol.sample_loss_sq`); a chosen client already trained for an
        oracle question is asked only its loss, when unknown and needed (the cached model: no model down,
        one scalar up), as the simulator asks every reporter's loss
        (``SimulationOracle.run_selection``). Then the opt-in ``update_norm_bound`` rejects or
        clips the reporters' updates, before any weight: the reports are what is left. Their
        ``durations`` are the server's measured seconds of each reporter's training reply
        (:attr:`FlowerRound.reply_seconds`); their ``sample_loss_sq``, when the selector needs
        ``"sample_losses"``, what each sent with its update (one scalar up per reporter, charged
        as the simulator charges it), after the opt-in loss rules. Clients sent a train message
        that sent nothing back within the round's wait (not even an error) are ``timed_out``,
        with the seconds waited as the lower bound on their durations (``deadline`` under
        :meth:`SelectorStrategy.start`, else the wait measured between the messages and the replies).
        """
        st, led, world = self.strategy, self.ledger, self.transport
        server_round = self.round + 1
        todo = led.to_train(ids)
        led.send_model(todo)
        messages, need_loss = [], set()
        for k in todo.tolist():
            node = st.wire_.node_of(k)
            if node is None:
                continue
            extra = {P.PURPOSE: "main", P.MODEL_KIND: "global", "server-round": server_round}
            extra[P.NEED_LOSS] = self._needs_losses and not led.has_loss(k)
            if world.needs_sample_losses:
                extra[P.NEED_SAMPLE_LOSS] = True
            if extra[P.NEED_LOSS]:
                need_loss.add(k)
            messages.append(Message(world.content(k, extra), node, P.TRAIN, group_id=str(server_round)))
        gone = [k for k in todo.tolist() if st.wire_.node_of(k) is None]
        if gone:
            led.mark_failed(np.asarray(gone, dtype=np.int64))
        st.wire_.count("train", messages, down=True)
        st.wire_.take_train_arrivals()  # none from an earlier round's exchange
        self._training = _Training(ids, todo, messages, need_loss, time.monotonic())
        return TrainMessages(messages)

    def finish_training(self, reply: Iterable[Message] | None) -> Reports:
        """The reports of :meth:`start_training`'s clients, given ``reply``, the train replies (see there)."""
        st, led, world, tr = self.strategy, self.ledger, self.transport, self._training
        if tr is None:
            raise RuntimeError("FlowerOracle.finish_training: call start_training first")
        self._training = None
        ids, todo, messages, need_loss = tr.ids, tr.todo, tr.messages, tr.need_loss
        replies = list(reply or [])
        waited = time.monotonic() - tr.sent
        if messages:
            st.wire_.add_wait(waited)
        st.wire_.count("train", replies, down=False)
        # Each reply's seconds as start() measured them; the whole wait (the server's clock, an upper bound)
        # for replies that came back another way (configure_train and aggregate_train driven by someone else).
        arrivals = st.wire_.take_train_arrivals()
        times = st.wire_.reply_times(messages, [(m, min(arrivals.get(id(m), waited), waited)) for m in replies])
        # Clients sent a train message that sent nothing back, not even an error: the server stopped waiting
        # for them after `waited` seconds, a lower bound on their durations (RoundFeedback.timed_out).
        asked = {int(m.metadata.dst_node_id): st.wire_.client_of(int(m.metadata.dst_node_id)) for m in messages}
        # The SuperLink's own error reply for a message (its node offline, the message expired) answers for the
        # node that message went to: that client failed, with an error, rather than sent nothing back.
        sent_to = P.destinations(messages)
        answered = set()
        for m in replies:
            try:  # a reply's metadata is the client's: anything odd in it only loses this sighting
                node = int(m.metadata.src_node_id)
                if node == SUPERLINK_NODE_ID and m.has_error():
                    node = sent_to.get(str(m.metadata.reply_to_message_id), node)
                answered.add(node)
            except Exception:
                continue
        silent = sorted(k for node, k in asked.items() if k is not None and node not in answered)
        got = st.checks_.valid_replies(replies)
        ok, updates, steps, grads, loss_ids, losses, evaluated = [], [], 0, 0, [], [], 0
        for k in todo.tolist():
            content = got.get(k)
            if content is None or led.is_failed(k):
                continue
            update = world.take_update(k, content, "train", need_loss=k in need_loss)
            if update is None:
                continue
            delta, s, g, loss = update
            if loss is not None:
                loss_ids.append(k)
                losses.append(loss[0])
                evaluated += loss[1]
            ok.append(k)
            updates.append(delta)
            if k in times:
                st.wire_.reply_seconds[k] = times[k]
            steps += s
            grads += g
        missing = [k for k in todo.tolist() if k not in ok and not led.is_failed(k)]
        if missing:
            led.mark_failed(np.asarray(missing, dtype=np.int64))
        if ok:
            led.record_training(np.asarray(ok, dtype=np.int64), updates, steps=steps, sample_gradients=grads)
        if loss_ids:
            losses = st.checks_.clip_losses(loss_ids, losses, on_global=True)
            led.record_losses(np.asarray(loss_ids, dtype=np.int64), np.asarray(losses), samples_evaluated=evaluated)
        held = np.array([k for k in ids.tolist() if not led.is_failed(k) and led.trained(k)], dtype=np.int64)
        ask = led.losses_to_ask(held) if held.size and self._needs_losses else held[:0]
        if ask.size:
            self.losses(ask)
        keep = np.array([not led.is_failed(int(k)) and led.trained(int(k)) for k in ids], dtype=bool)
        if st.update_norm_bound is not None and keep.any():  # the opt-in bound, before any weight
            held_ids = ids[keep]
            bounded, _, within = st.checks_.bound_norms(
                held_ids,
                np.stack([np.asarray(led.update(int(k)), dtype=np.float32) for k in held_ids]),
                led,
                world.theta,
            )
            clipped = dict(zip(held_ids.tolist(), bounded))
            accepted = set(held_ids[within].tolist())  # clipped or rejected norms stay out of the reference
            keep = np.array([not led.is_failed(int(k)) and led.trained(int(k)) for k in ids], dtype=bool)
        else:
            clipped, accepted = {}, set()
        reported = ids[keep]
        led.upload(reported)
        # What the server measured of each reporter's training reply (its own clock; the round's whole wait
        # for a reply it has no measurement of), and, when the selector needs them, the sample losses sent
        # with the updates: one scalar up per reporter, as the simulator charges them.
        durations = np.array([st.wire_.reply_seconds.get(int(k), st.wire_.wall) for k in reported], dtype=np.float64)
        sq = None
        if world.needs_sample_losses:
            sq = np.array(
                st.checks_.clip_sample_losses(reported.tolist(), world.sample_loss_sq(reported).tolist()),
                dtype=np.float64,
            )
            led.record_scalars_up(int(reported.size))
        timed_out = np.array([k for k in silent if k not in set(reported.tolist())], dtype=np.int64)
        # start() waited the deadline for a silent client (a grid that times itself, LocalGrid, knows at once that
        # a message is lost, "as if the timeout expired"); replies sent in by another loop: the wait measured here
        after = np.full(
            timed_out.size, float(waited) if st.wire_.train_wait is None else max(float(waited), st.wire_.train_wait)
        )
        if not reported.size:
            return Reports(
                reported,
                np.zeros((0, world.theta.size), np.float32),
                led.loss(reported) if self._needs_losses else None,
                np.zeros(0, dtype=np.int64),
                durations,
                sq,
                timed_out,
                after,
            )
        stacked = np.stack(
            [
                clipped[int(k)] if int(k) in clipped else np.asarray(led.update(int(k)), dtype=np.float32)
                for k in reported
            ]
        )
        if st.update_norm_bound is not None:  # the reference of later rounds' bounds: norms accepted unclipped
            norms = np.linalg.norm(stacked.astype(np.float64), axis=1)
            st.checks_.remember_norms(v for k, v in zip(reported.tolist(), norms) if k in accepted)
        n_k = np.array([st.wire_.n_samples[int(k)] for k in reported], dtype=np.int64)
        losses = led.loss(reported) if self._needs_losses else None
        return Reports(reported, stacked, losses, n_k, durations, sq, timed_out, after)
