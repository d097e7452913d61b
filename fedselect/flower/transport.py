"""FlowerOracle: the oracle's questions asked of live clients through the Flower Grid, and the round's transport."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from logging import ERROR
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.supercore import log

from ..aggregation import aggregation_weights, apply_deltas, average_buffer_arrays
from ..ledger import RoundLedger
from ..round import Reports
from ..selection import ClientOracle, Selection
from . import _protocol as P

if TYPE_CHECKING:
    from .strategy import SelectorStrategy

__all__ = ["FlowerOracle", "TrainMessages"]


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


class FlowerOracle(ClientOracle):
    """A selector's paid questions, asked of the live clients through the Flower Grid, and the round's transport.

    One per round, built by :class:`SelectorStrategy`, which plays the round's phases
    (:mod:`fedselect.round`) against it (:meth:`start_training`, :meth:`finish_training`,
    :meth:`aggregate_buffers`: a :class:`fedselect.round.Transport`). Every question is a message to
    exactly the nodes whose answer is not known yet this round; what it costs is charged
    on the round's :class:`~fedselect.ledger.RoundLedger`, exactly as in the simulator.
    A client that does not answer within ``query_timeout`` or answers with an error is
    marked failed for the round: its answer is NaN and it is not contacted again.

    ``local_updates(ids, transform)`` cannot ship ``transform`` (arbitrary server code) to
    the clients: each client uploads its full update (one model up, charged) and the
    server applies ``transform``; the simulator charges the transformed floats instead
    (``floats_up``), and a full model up only for the clients then chosen. The update is
    then held by the server, so a client chosen later in the round is not trained again
    (only its loss on ``w^t`` is asked, as every reporter's is).

    With buffers (``SelectorStrategy(buffers=...)``) the server also keeps each trained
    client's ``b_k - b^t``; the trial model of ``trial`` carries the trial clients' buffers
    averaged with the trial's weights (:func:`fedselect.aggregation.average_buffer_arrays`), and
    no answer to the selector holds a buffer: updates and parameters have the model's D
    parameters only.

    Clients without a live node are failed from the start of the round: questions about
    them answer NaN without a message. A reply that cannot be used (no finite ``loss``, no
    update, non-integer counts, no usable sample loss when the selector needs one) fails its
    client for the round, like a timeout. Each trained client's reply is timed by the server's
    own clock (:meth:`fedselect.flower.wire.Wire.send_and_receive`): its ``reply_seconds``, the
    feedback's ``durations``.
    """

    def __init__(
        self,
        strategy: SelectorStrategy,
        grid: Grid,
        ledger: RoundLedger,
        theta: np.ndarray,
        config: ConfigRecord,
        buffers: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        self._st = strategy
        self._grid = grid
        self._led = ledger
        self._theta = theta
        self._buffers = dict(buffers or {})  # the global buffers b^t, by name (empty: a model without)
        self._buffer_deltas: dict[int, dict[str, np.ndarray]] = {}  # b_k - b^t of each trained client
        self._sample_sq: dict[int, float] = {}  # each trained client's sample_loss_sq (when the selector needs it)
        self._config = config
        self.n_clients = ledger.n_clients
        self.round = ledger.round
        self._training: _Training | None = None  # start_training's, until finish_training

    # -- plumbing -------------------------------------------------------------------
    def _content(
        self,
        k: int,
        newly_sent: set[int],
        extra: dict[str, Any],
        model: tuple[np.ndarray, dict[str, np.ndarray]] | None = None,
    ) -> RecordDict:
        cfg = ConfigRecord(dict(self._config))
        cfg[P.ROUND] = int(self.round)
        cfg.update(extra)
        if model is not None:
            cfg[P.MODEL_KIND] = "trial"
            return RecordDict({"arrays": self._st.layout_.record(*model), "config": cfg})
        cfg[P.MODEL_KIND] = "global"
        if k in newly_sent:
            return RecordDict({"arrays": self._st.global_arrays_, "config": cfg})
        cfg[P.CACHED] = True
        return RecordDict({"config": cfg})

    def _ask(
        self,
        ids: np.ndarray,
        message_type: str,
        kind: str,
        extra: dict[str, Any],
        model: tuple[np.ndarray, dict[str, np.ndarray]] | None = None,
        times: dict[int, float] | None = None,
    ) -> tuple[dict[int, RecordDict], int]:
        """Send one message per id; return the content of each reply by client id, and the messages sent.

        ``times``, if given, receives each reply's seconds by client id, by the server's clock
        (:meth:`fedselect.flower.wire.Wire.exchange`). Ids that time out or answer with an error are
        marked failed on the ledger. The
        callers pass only clients that have not failed; a client without a live node is
        failed from the start of the round (``RoundLedger(unavailable=...)``), so it gets
        no message and is charged nothing.
        """
        led = self._led
        newly = set(led.send_model(ids).tolist()) if model is None else set()
        messages = []
        for k in ids.tolist():
            node = self._st.wire_.node_of(k)
            if node is None:  # the node vanished during the round: no message, the client fails below
                continue
            content = self._content(k, newly, extra, model)
            messages.append(Message(content, node, message_type, group_id=str(self.round + 1)))
        replies = self._st.wire_.exchange(self._grid, messages, self._st.query_timeout, kind, times)
        got = self._st.checks_.valid_replies(replies)
        failed = [k for k in ids.tolist() if k not in got]
        if failed:
            led.mark_failed(np.asarray(failed, dtype=np.int64))
        return got, len(messages)

    def _train(self, ids: np.ndarray, purpose: str) -> dict[int, tuple[np.ndarray, int, int]]:
        times: dict[int, float] = {}
        extra: dict[str, Any] = {P.PURPOSE: purpose}
        if self._needs_sample_losses:  # a client trained now and chosen later is not trained again
            extra[P.NEED_SAMPLE_LOSS] = True
        got, _ = self._ask(ids, P.UPDATE, "update" if purpose == "main" else "trial", extra, times=times)
        out = {}
        for k, content in got.items():
            try:  # anything a reply makes go wrong (overflow, memory, a bad layout) fails its client only
                delta, steps, grads, buffer_deltas = self._st.checks_.parse_update(content)
                sq = self._parse_sample_loss(content)
            except Exception as exc:
                self._st.checks_.reject(self._led, k, "update", exc)
                continue
            out[k] = (delta, steps, grads)
            self._buffer_deltas[k] = buffer_deltas
            if sq is not None:
                self._sample_sq[k] = sq
            if k in times:
                self._st.wire_.reply_seconds[k] = times[k]
        return out

    @property
    def _needs_sample_losses(self) -> bool:
        return "sample_losses" in self._st.selector_.needs

    @property
    def _needs_losses(self) -> bool:
        """Whether the chosen clients evaluate their loss on w^t before training (the selector needs
        ``"losses"``), as the simulator's ``feedback_losses="auto"`` does."""
        return "losses" in self._st.selector_.needs

    def _parse_sample_loss(self, content: RecordDict) -> float | None:
        """The reply's checked ``sample_loss_sq`` when the selector needs it (:func:`fedselect.flower._protocol.
        sample_loss_sq`), else None (not asked, not read)."""
        if not self._needs_sample_losses:
            return None
        return P.sample_loss_sq(P.reply_metrics(content), float(self._st.max_abs_loss))

    def _loss_replies(
        self, ids: np.ndarray, got: dict[int, RecordDict], *, on_global: bool = True
    ) -> tuple[list[int], list[float], int]:
        """The usable loss replies of ``ids`` (in order): ids, values, samples evaluated; the others fail.

        The values pass the strategy's loss rule (``loss_clip_quantile``, ``loss_clip_history``;
        ``on_global``: losses on w^t, which enter each client's history, rather than a trial model's).
        """
        ok, values, evaluated, bad = [], [], 0, []
        for k in ids.tolist():
            if k not in got:
                continue
            try:
                value, n = P.parse_loss(got[k], float(self._st.max_abs_loss))
            except Exception as exc:
                bad.append((k, exc))
                continue
            ok.append(k)
            values.append(value)
            evaluated += n
        if not on_global and len(bad) > len(ok):
            # Most clients could not evaluate the trial model: the model is at fault (built from a hostile
            # update), not they. Nobody is failed; the trial answers NaN.
            note = (
                f"round {self.round}: {len(bad)} of {len(bad) + len(ok)} clients could not evaluate the "
                f"trial model (e.g. {P.why(bad[0][1])}); the trial answers NaN and nobody is failed"
            )
            log(ERROR, "fedselect: %s", note)
            self._st.note_error(note)
            return [], [], evaluated
        for k, exc in bad:
            self._st.checks_.reject(self._led, k, "loss", exc)
        return ok, self._st.checks_.clip_losses(ok, values, on_global=on_global), evaluated

    # -- the oracle -----------------------------------------------------------------
    def losses(self, ids: Any) -> np.ndarray:
        led = self._led
        ids = led.ids(ids, "oracle.losses")
        ask = led.losses_to_ask(ids)
        if ask.size:
            got, _ = self._ask(ask, P.LOSS, "loss", {})
            ok, values, evaluated = self._loss_replies(ask, got)
            led.record_losses(np.asarray(ok, dtype=np.int64), np.asarray(values), samples_evaluated=evaluated)
        return led.loss(ids)

    def trial(self, ids: Any) -> np.ndarray:
        led = self._led
        ids = np.unique(led.ids(ids, "oracle.trial"))
        if ids.size == 0:
            raise ValueError("oracle.trial: needs at least one client id")
        base = self.losses(np.arange(self.n_clients))  # paid once per round
        self._train_and_record(led.to_train(ids), "trial")  # kept: a trial client chosen later is not retrained
        alive = led.alive(ids)
        if not alive.size:  # no trial client answered: nothing was learned
            return np.full(self.n_clients, np.nan)
        led.upload(alive)
        w = aggregation_weights(Selection(alive).validated(self.n_clients, alive.size), **self._st.weight_rule())
        stacked, keep, _ = self._st.checks_.bound_norms(
            alive, np.stack([np.asarray(led.update(int(k))) for k in alive]), led, self._theta
        )
        if not keep.all():  # the norm bound rejected some: the trial is what the others would produce
            alive = alive[keep]
            if not alive.size:
                return np.full(self.n_clients, np.nan)
            w = aggregation_weights(Selection(alive).validated(self.n_clients, alive.size), **self._st.weight_rule())
            stacked = stacked[keep]
        theta_trial = apply_deltas(self._theta, stacked, w)
        buffers_trial = self.aggregate_buffers(alive, w)
        if not np.all(np.isfinite(theta_trial)):
            note = f"round {self.round}: the trial model of clients {alive.tolist()[:20]} is not finite; NaN answers"
            log(ERROR, "fedselect: %s", note)
            self._st.note_error(note)
            return np.full(self.n_clients, np.nan)
        everyone = led.alive(np.arange(self.n_clients))
        answers, n_sent = self._ask(everyone, P.LOSS, "trial", {P.PURPOSE: "trial"}, model=(theta_trial, buffers_trial))
        ok, values, evaluated = self._loss_replies(everyone, answers, on_global=False)
        after = np.full(self.n_clients, np.nan)
        after[ok] = values
        # The trial model is charged per message actually sent (clients with a live node that had not failed).
        led.record_trial(len(ok), samples_evaluated=evaluated, n_sent=n_sent)
        out = after - base
        out[sorted(led.failed)] = np.nan
        return out

    def _train_and_record(self, todo: np.ndarray, purpose: str) -> None:
        if not todo.size:
            return
        got = self._train(todo, purpose)
        ok = np.array(sorted(got), dtype=np.int64)
        if ok.size:
            self._led.record_training(
                ok,
                [got[k][0] for k in ok.tolist()],
                steps=sum(got[k][1] for k in ok.tolist()),
                sample_gradients=sum(got[k][2] for k in ok.tolist()),
            )

    def local_updates(self, ids: Any, transform: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
        led = self._led
        ids = led.ids(ids, "oracle.local_updates")
        self._train_and_record(led.to_train(ids), "main")
        alive = [k for k in ids.tolist() if not led.is_failed(k)]
        led.upload(np.asarray(alive, dtype=np.int64))  # the full update went up (transforms run on the server)
        rows: list[np.ndarray | None] = []
        for k in ids.tolist():
            if led.is_failed(k):
                rows.append(None)
                continue
            u = np.asarray(led.update(k), dtype=np.float32).copy()
            rows.append(u if transform is None else np.asarray(transform(u), dtype=np.float32).reshape(-1))
        sizes = {r.size for r in rows if r is not None}
        if len(sizes) > 1:
            raise ValueError("oracle.local_updates: the transform returned vectors of different lengths")
        if sizes:
            dim = sizes.pop()
        elif transform is None:
            dim = self._theta.size
        else:
            dim = int(np.asarray(transform(np.zeros(self._theta.size, np.float32))).size)
        return (
            np.stack([r if r is not None else np.full(dim, np.nan, np.float32) for r in rows])
            if rows
            else np.zeros((0, dim), np.float32)
        )

    def global_parameters(self) -> np.ndarray:
        return self._theta.copy()

    # -- the round's transport (fedselect.round.Transport) ----------------------------
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
        with the seconds waited as the lower bound on their durations (``train_timeout`` under
        :meth:`SelectorStrategy.start`, else the wait measured between the messages and the replies).
        """
        st, led, t = self._st, self._led, self.round
        server_round = t + 1
        todo = led.to_train(ids)
        newly = set(led.send_model(todo).tolist())
        messages, need_loss = [], set()
        for k in todo.tolist():
            node = st.wire_.node_of(k)
            if node is None:
                continue
            cfg = ConfigRecord(dict(self._config))
            cfg[P.ROUND] = t
            cfg[P.PURPOSE] = "main"
            cfg[P.MODEL_KIND] = "global"
            cfg["server-round"] = server_round
            cfg[P.NEED_LOSS] = self._needs_losses and not led.has_loss(k)
            if self._needs_sample_losses:
                cfg[P.NEED_SAMPLE_LOSS] = True
            if cfg[P.NEED_LOSS]:
                need_loss.add(k)
            if k in newly:
                content = RecordDict({"arrays": st.global_arrays_, "config": cfg})
            else:
                cfg[P.CACHED] = True
                content = RecordDict({"config": cfg})
            messages.append(Message(content, node, P.TRAIN, group_id=str(server_round)))
        gone = [k for k in todo.tolist() if st.wire_.node_of(k) is None]
        if gone:
            led.mark_failed(np.asarray(gone, dtype=np.int64))
        st.wire_.count("train", messages, down=True)
        st.wire_.take_train_arrivals()  # none from an earlier round's exchange
        self._training = _Training(ids, todo, messages, need_loss, time.monotonic())
        return TrainMessages(messages)

    def finish_training(self, reply: Iterable[Message] | None) -> Reports:
        """The reports of :meth:`start_training`'s clients, given ``reply``, the train replies (see there)."""
        st, led, tr = self._st, self._led, self._training
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
            try:  # anything a reply makes go wrong (overflow, memory, a bad layout) fails its client only
                delta, s, g, buffer_deltas = st.checks_.parse_update(content)
                loss = P.parse_loss(content, float(st.max_abs_loss)) if k in need_loss else None
                sq = self._parse_sample_loss(content)
            except Exception as exc:
                st.checks_.reject(led, k, "train", exc)
                continue
            if sq is not None:
                self._sample_sq[k] = sq
            if loss is not None:
                loss_ids.append(k)
                losses.append(loss[0])
                evaluated += loss[1]
            ok.append(k)
            updates.append(delta)
            self._buffer_deltas[k] = buffer_deltas
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
                self._theta,
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
        if self._needs_sample_losses:
            sq = np.array(
                st.checks_.clip_sample_losses(reported.tolist(), [self._sample_sq[int(k)] for k in reported]),
                dtype=np.float64,
            )
            led.record_scalars_up(int(reported.size))
        timed_out = np.array([k for k in silent if k not in set(reported.tolist())], dtype=np.int64)
        # start() waited train_timeout for a silent client (a grid that times itself, LocalGrid, knows at once that
        # a message is lost, "as if the timeout expired"); replies sent in by another loop: the wait measured here
        after = np.full(
            timed_out.size, float(waited) if st.wire_.train_wait is None else max(float(waited), st.wire_.train_wait)
        )
        if not reported.size:
            return Reports(
                reported,
                np.zeros((0, self._theta.size), np.float32),
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

    def aggregate_buffers(self, ids: np.ndarray, weights: np.ndarray) -> dict[str, np.ndarray]:
        """The global buffers after averaging trained clients ``ids`` with ``weights``
        (:func:`fedselect.aggregation.average_buffer_arrays`); empty for a model without buffers."""
        if not self._buffers:
            return {}
        return average_buffer_arrays(self._buffers, [self._buffer_deltas[int(k)] for k in ids], weights)
