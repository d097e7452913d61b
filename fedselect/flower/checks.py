"""The server's screening of its clients' replies: layout and size checks, the update norm bound, the loss rules."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Message, RecordDict
from flwr.supercore import log

from ..ledger import RoundLedger
from . import _protocol as P

__all__ = ["ReplyChecks", "loo_median_fence", "reply_limit"]

#: an update whose squared norm does not fit in float32 (a norm above ~1.8e19) cannot be aggregated
MAX_SQ_NORM = float(np.finfo(np.float32).max)
#: a floating-point buffer (batch norm's statistics) may move by at most this times max(1, |b^t|) in one round
BUFFER_STEP = 1e6
#: the accepted update norms of earlier rounds kept as the norm bound's reference
NORM_HISTORY = 50
#: each client's earlier answers kept as the reference of ``loss_clip_history``
LOSS_HISTORY = 20


def reply_limit(max_reply_bytes: int | str | None, layout: P.ModelLayout) -> int | None:
    """The most bytes one reply may carry: ``max_reply_bytes``, ``"auto"`` four times the model's bytes plus 1 MiB,
    None for no limit."""
    if max_reply_bytes is None:
        return None
    if max_reply_bytes == "auto":
        return 4 * layout.nbytes + (1 << 20)
    return int(max_reply_bytes)


def loo_median_fence(values: Any, factor: float, context: Sequence[float] = ()) -> np.ndarray:
    """The leave-one-out median fence: a value above ``factor`` times the median m_-k of the *other* values (the
    batch without it, plus ``context``) is flagged, and every flagged value is replaced by the median of the values
    not flagged (with ``context``).

    Parameters
    ----------
    values : array-like of float
        One batch of answers (losses, sample losses), one per client.
    factor : float
        c >= 1: how far above the others' median an answer may be.
    context : sequence of float
        Further reference values from clients outside the batch (their latest answers).

    Returns
    -------
    ndarray of float
        The values, the flagged ones replaced; a value whose reference has fewer than two values, or a
        non-positive median, is never flagged.

    Notes
    -----
    m_-k never holds the answer it judges, so identical lies do not raise their own reference while the liars are
    fewer than half of the others; replacing them by the median of the unflagged answers (not by m_-k, which the
    other lies raise) ranks each liar as the typical honest client. O(B (B + C)) for B values and C context values.
    """
    vals = np.asarray(values, dtype=np.float64)
    ctx = np.asarray(context, dtype=np.float64)
    flagged = np.zeros(vals.size, dtype=bool)
    for i in range(vals.size):
        ref = np.concatenate([vals[:i], vals[i + 1 :], ctx])
        if ref.size < 2:
            continue
        m = float(np.median(ref))
        flagged[i] = m > 0 and vals[i] > factor * m
    out = vals.copy()
    if flagged.any():
        out[flagged] = float(np.median(np.concatenate([vals[~flagged], ctx])))
    return out


class ReplyChecks:
    """What a :class:`~fedselect.flower.SelectorStrategy` server checks of every reply before using it, and the
    references its opt-in rules keep across rounds.

    A reply counts only from a mapped node, without an error, below the reply limit, not naming another client
    (:meth:`valid_replies`); an update is read against the model's layout, finite, with a squared norm that fits
    in float32 and buffers that move by at most ``BUFFER_STEP`` x max(1, |b^t|) (:meth:`parse_update`). A reply
    that fails fails its client for the round (:meth:`reject`, kept in :attr:`rejected`). The opt-in rules keep
    their references here: the norms accepted unclipped in earlier rounds (:meth:`bound_norms`), each client's
    loss and sample-loss history and latest answer (:meth:`clip_losses`, :meth:`clip_sample_losses`).

    Parameters
    ----------
    layout : ModelLayout
        The model's arrays: names, shapes, dtypes, which are buffers.
    client_of : callable
        Node id -> the client id that node holds, or None (:meth:`fedselect.flower.wire.Wire.client_of`).
    reply_limit : int, optional
        The most bytes one reply may carry (:func:`reply_limit`); None for no limit.
    max_num_examples, max_abs_loss : int, float
        The largest count an evaluation reply may claim; the largest loss magnitude.
    update_norm_bound, update_norm_action, loss_clip_quantile, loss_clip_history, loss_outlier_factor
        The opt-in rules: :class:`~fedselect.flower.SelectorStrategy`'s parameters of the same names.

    Attributes
    ----------
    rejected : dict of int to str
        This round's refused replies: client id -> reason.
    """

    def __init__(
        self,
        layout: P.ModelLayout,
        client_of: Callable[[int], int | None],
        *,
        reply_limit: int | None = None,
        max_num_examples: int = 10**9,
        max_abs_loss: float = 1e6,
        update_norm_bound: float | None = None,
        update_norm_action: str = "reject",
        loss_clip_quantile: float | None = None,
        loss_clip_history: float | None = None,
        loss_outlier_factor: float | None = None,
    ) -> None:
        self.layout = layout
        self.client_of = client_of
        self.reply_limit = reply_limit
        self.max_num_examples = int(max_num_examples)
        self.max_abs_loss = float(max_abs_loss)
        self.update_norm_bound = update_norm_bound
        self.update_norm_action = update_norm_action
        self.loss_clip_quantile = loss_clip_quantile
        self.loss_clip_history = loss_clip_history
        self.loss_outlier_factor = loss_outlier_factor
        self._norm_history: list[float] = []  # accepted update norms of earlier rounds (update_norm_bound)
        self._loss_history: dict[int, list[float]] = {}
        self._sq_history: dict[int, list[float]] = {}  # each client's earlier sample_loss_sq (loss_clip_history)
        # each client's latest loss on a global model and sample loss, after the rules (loss_outlier_factor)
        self._latest_loss: dict[int, float] = {}
        self._latest_sq: dict[int, float] = {}
        self.begin_round({})

    def begin_round(self, global_buffers: Mapping[str, np.ndarray]) -> None:
        """Start a round whose global buffers are ``global_buffers`` (b^t): forget its refusals."""
        self.rejected: dict[int, str] = {}
        self._global_buffers = global_buffers

    @property
    def norm_history(self) -> list[float]:
        """The update norms accepted unclipped in earlier rounds (the last ``NORM_HISTORY``): the norm bound's
        reference."""
        return list(self._norm_history)

    # -- refusing ---------------------------------------------------------------------
    def reject(self, ledger: RoundLedger, k: int, what: str, exc: BaseException) -> None:
        """Log an unusable reply (naming the client and the reason), keep it in :attr:`rejected` and mark its
        client failed for the round."""
        reason = P.why(exc)
        log(
            WARNING,
            "fedselect: round %d: client %d sent an unusable %s reply (%s); left out of the round",
            ledger.round,
            k,
            what,
            reason,
        )
        self.rejected.setdefault(int(k), f"{what}: {reason}")
        ledger.mark_failed(np.array([k], dtype=np.int64))

    def valid_replies(self, replies: Iterable[Message]) -> dict[int, RecordDict]:
        """The replies of mapped nodes by client id; error replies, oversized ones and ones naming another
        client are left out (their client then fails)."""
        out: dict[int, RecordDict] = {}
        limit = self.reply_limit
        for msg in replies:
            k = None
            try:
                k = self.client_of(int(msg.metadata.src_node_id))
                if k is None:
                    continue
                if msg.has_error():
                    log(INFO, "fedselect: client %d answered with an error: %s", k, P.safe_text(msg.error.reason))
                    continue
                content = msg.content
                if limit is not None:
                    size = P.content_nbytes(content)
                    if size > limit:
                        raise P.BadReply(f"about {size} bytes, above max_reply_bytes={limit}")
                metrics = content.metric_records.get("metrics")
                if metrics is not None and P.CLIENT_ID in metrics and metrics[P.CLIENT_ID] != k:
                    raise P.BadReply(
                        f"the reply names client {metrics[P.CLIENT_ID]!r}, but node "
                        f"{msg.metadata.src_node_id} holds client {k}"
                    )
            except Exception as exc:
                if k is not None:
                    reason = P.why(exc)
                    log(WARNING, "fedselect: client %d sent an unusable reply (%s); left out of the round", k, reason)
                    self.rejected.setdefault(int(k), f"reply: {reason}")
                continue
            out[k] = content
        return out

    def usable_evaluations(self, replies: list[Message]) -> list[Message]:
        """The evaluate replies the inner strategy may aggregate: from mapped nodes, not errors, below the
        size limit, with a ``metrics`` record of finite numbers whose ``num-examples`` is a count in
        [0, ``max_num_examples``] (it weighs the inner strategy's average, as n_k weighs training), all with
        the key set most of them have (Flower's FedAvg refuses the whole round over one odd reply)."""
        usable = self.valid_replies(replies)
        good: list[tuple[Message, frozenset[str]]] = []
        for msg in replies:
            k = self.client_of(int(msg.metadata.src_node_id)) if not msg.has_error() else None
            if k is None or k not in usable:
                continue
            try:
                metrics = P.reply_metrics(msg.content)
                for key, value in metrics.items():
                    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
                        raise P.BadReply(f"{key!r}={value!r} is not a finite number")
                # bounded like a hello's n_k: one client's claimed count weighs the inner strategy's average
                P.metric_int(metrics, P.NUM_EXAMPLES, maximum=self.max_num_examples)
                good.append((msg, frozenset(metrics.keys())))
            except Exception as exc:
                log(WARNING, "fedselect: client %d sent an unusable evaluate reply (%s); left out", k, P.why(exc))
        if not good:
            return []
        keys = max({ks for _, ks in good}, key=lambda ks: (sum(g == ks for _, g in good), sorted(ks)))
        for msg, ks in good:
            if ks != keys:
                log(
                    WARNING,
                    "fedselect: client %d's evaluate reply has metrics %s, the others %s; left out",
                    self.client_of(int(msg.metadata.src_node_id)),
                    sorted(ks)[:10],
                    sorted(keys)[:10],
                )
        return [msg for msg, ks in good if ks == keys]

    def parse_update(self, content: RecordDict) -> tuple[np.ndarray, int, int, dict[str, np.ndarray]]:
        """(delta, local steps, sample gradients, buffer differences) of an update reply; BadReply if unusable.

        The arrays' names are checked before any is decoded, each array's header before its
        bytes (:func:`fedselect.flower._protocol.decode_array`).
        """
        record = content.array_records.get("update")
        if record is None:
            raise P.BadReply("the reply has no 'update' arrays")
        self.layout.check_names(record, "update")
        delta = self.layout.flatten(record, "update")
        if not np.all(np.isfinite(delta)):
            raise P.BadReply("the update holds NaN or inf")
        sq = float(np.dot(delta.astype(np.float64), delta.astype(np.float64)))
        if not sq <= MAX_SQ_NORM:
            raise P.BadReply(f"the update's norm {np.sqrt(sq):.3g} is beyond what float32 can aggregate")
        buffer_deltas = self.layout.buffer_deltas(record)
        for name, d in buffer_deltas.items():
            if d.dtype == np.bool_ or not np.issubdtype(d.dtype, np.floating):
                continue
            if not np.all(np.isfinite(d)):
                raise P.BadReply(f"buffer {name!r}'s update holds NaN or inf")
            b = np.asarray(self._global_buffers[name], dtype=np.float64)
            if np.any(np.abs(d) > BUFFER_STEP * np.maximum(1.0, np.abs(b))):
                raise P.BadReply(f"buffer {name!r}'s update moves it by more than {BUFFER_STEP:g} x max(1, |b^t|)")
            if name.endswith("running_var") and np.any(b + d < 0):
                raise P.BadReply(f"buffer {name!r}'s update makes a variance negative")
        m = P.reply_metrics(content)
        steps = P.metric_int(m, P.STEPS, default=0)
        return delta, steps, P.metric_int(m, P.SAMPLE_GRADIENTS, default=0), buffer_deltas

    # -- the update norm bound ------------------------------------------------------------
    def bound_norms(
        self, ids: np.ndarray, stacked: np.ndarray, led: RoundLedger, model: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``update_norm_bound`` applied to the updates ``stacked`` of clients ``ids`` aggregated together.

        The bound is c times a reference the round's own clients do not control: the median of the
        norms accepted unclipped in earlier rounds (at most ``NORM_HISTORY``), once three are known. Before that
        (the warm-up), the median of these updates' norms with the earlier ones, and at most c times the
        norm of ``model`` (w^t) when it is not zero: in the first round, colluders who are most of the
        round pass at most that. Returns the updates (rows clipped to the bound under ``"clip"``), a mask
        of the rows kept (under ``"reject"`` the others' clients are marked failed for the round, with a
        warning) and a mask of the rows within the bound (only those may enter the reference,
        :meth:`remember_norms`). Does nothing when the bound is off.
        """
        keep = np.ones(len(ids), dtype=bool)
        if self.update_norm_bound is None:
            return stacked, keep, keep.copy()
        c = float(self.update_norm_bound)
        norms = np.linalg.norm(stacked.astype(np.float64), axis=1)
        earlier = np.asarray(self._norm_history, dtype=np.float64)
        if earlier.size >= 3:
            median = float(np.median(earlier))
        else:
            reference = np.concatenate([norms, earlier])
            median = float(np.median(reference)) if reference.size >= 3 else np.inf
            scale = float(np.linalg.norm(np.asarray(model, dtype=np.float64)))
            if scale > 0:
                median = min(median, scale)
        bound = c * median
        within = norms <= bound
        over = np.flatnonzero(~within)
        if not over.size:
            return stacked, keep, within
        if self.update_norm_action == "clip":
            stacked = stacked.copy()
            for i in over.tolist():
                stacked[i] = (stacked[i].astype(np.float64) * (bound / norms[i])).astype(np.float32)
                log(
                    WARNING,
                    "fedselect: round %d: client %d's update norm %.3g clipped to %.3g (%g x the reference)",
                    led.round,
                    int(ids[i]),
                    norms[i],
                    bound,
                    c,
                )
            return stacked, keep, within
        for i in over.tolist():
            exc = P.BadReply(f"update norm {norms[i]:.3g} above {c:g} x the reference {median:.3g}")
            self.reject(led, int(ids[i]), "update", exc)
            keep[i] = False
        return stacked, keep, within

    def remember_norms(self, norms: Iterable[float]) -> None:
        """Add the norms of a round's updates accepted unclipped to the bound's reference (the last
        ``NORM_HISTORY`` are kept)."""
        self._norm_history.extend(float(v) for v in norms)
        del self._norm_history[:-NORM_HISTORY]

    # -- the loss rules -------------------------------------------------------------------
    def _fence(self, ids: Sequence[int], values: Sequence[float], latest: dict[int, float] | None, scale: float) -> Any:
        """``loss_outlier_factor`` (times ``scale``) applied to one batch; ``latest`` (None: the batch alone) holds
        each client's latest answer of earlier batches, which joins the reference of the clients not in this one."""
        vals = np.asarray(values, dtype=np.float64)
        if self.loss_outlier_factor is None or not vals.size:
            return vals
        inside = {int(k) for k in ids}
        context = [v for k, v in (latest or {}).items() if k not in inside]
        return loo_median_fence(vals, float(self.loss_outlier_factor) * scale, context)

    def _clip(
        self, ids: Sequence[int], values: Sequence[float], history: dict[int, list[float]] | None, power: int
    ) -> np.ndarray:
        """``loss_clip_quantile``, then (with a ``history``) ``loss_clip_history`` with factor f**power, on one
        fenced batch ``values``; a value within its client's bounds enters ``history`` as given."""
        vals = np.asarray(values, dtype=np.float64)
        if vals.size and self.loss_clip_quantile is not None:
            vals = np.minimum(vals, np.quantile(vals, float(self.loss_clip_quantile)))
        if history is None:
            return vals
        raw = np.asarray(values, dtype=np.float64)
        for i, k in enumerate(ids):
            past = history.setdefault(int(k), [])
            if past and self.loss_clip_history is not None:
                f, m = float(self.loss_clip_history) ** power, float(np.median(past))
                low, high = (m / f, m * f) if m >= 0 else (m * f, m / f)
                if not low <= raw[i] <= high:  # clipped: kept out of the history, a lie cannot move its bounds
                    vals[i] = min(max(vals[i], low), high)
                    continue
            past.append(float(raw[i]))  # the answer as given (before the quantile rule)
            del past[:-LOSS_HISTORY]
        return vals

    def clip_losses(self, ids: Sequence[int], values: Sequence[float], *, on_global: bool) -> list[float]:
        """The opt-in loss rules (``loss_outlier_factor``, ``loss_clip_quantile``, ``loss_clip_history``) applied
        to one batch of answers; the later rules see the fenced values as the answers. ``on_global``: losses on
        w^t, which enter each client's history, rather than a trial model's (only fenced and quantile-clipped)."""
        values = self._fence(ids, values, self._latest_loss if on_global else None, 1.0)
        vals = self._clip(ids, values, self._loss_history if on_global else None, 1)
        if on_global and self.loss_outlier_factor is not None:
            self._latest_loss.update(zip((int(k) for k in ids), vals.tolist()))
        return vals.tolist()

    def clip_sample_losses(self, ids: Sequence[int], values: Sequence[float]) -> list[float]:
        """The opt-in loss rules applied to the round's reporters' ``sample_loss_sq`` (Oort's utility is their
        square root): ``loss_clip_quantile`` clips the batch from above to its ``q``-quantile, and
        ``loss_clip_history=f`` each value into [m / f**2, m f**2] around the median m of the client's own
        earlier values that needed no clipping (the last ``LOSS_HISTORY``): the loss rule on the square's scale.
        Before them, ``loss_outlier_factor=c`` fences each value at c**2 times the others' median
        (:func:`loo_median_fence`)."""
        factor = float(self.loss_outlier_factor or 1.0)
        values = self._fence(ids, values, self._latest_sq, factor)
        vals = self._clip(ids, values, self._sq_history, 2)
        if self.loss_outlier_factor is not None:
            self._latest_sq.update(zip((int(k) for k in ids), vals.tolist()))
        return vals.tolist()
