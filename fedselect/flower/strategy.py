"""SelectorStrategy: any fedselect selector as a Flower strategy on the Message API."""

from __future__ import annotations

import copy
import functools
import json
import os
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from logging import ERROR, INFO, WARNING
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result, Strategy
from flwr.supercore import log
from sklearn.base import clone

from .._validation import (
    InstanceOf,
    Interval,
    InvalidParameterError,
    Predicate,
    StrOptions,
    parameter_message,
    renamed,
    validate_parameters,
)
from ..aggregation import apply_deltas, average_buffer_arrays
from ..ledger import PARTIAL_WEIGHTS, RoundLedger
from ..round import Aggregate, Reports, open_round
from ..round.record import History, Traffic
from ..selection import BaseSelector, ClientPool, Selection
from . import _protocol as P
from .binding import is_node_binding
from .checks import ReplyChecks, loo_median_fence, reply_limit
from .records import FlowerRound, check_records_path
from .transport import FlowerClients, FlowerOracle, TrainMessages
from .wire import Wire

#: FlowerOracle and TrainMessages (flower/transport.py) and FlowerRound (flower/records.py) stay importable from here.
__all__ = ["FlowerOracle", "FlowerRound", "SelectorStrategy", "TrainMessages", "loo_median_fence", "trimmed_mean"]

_AGGREGATIONS = (None, "data-size", "mean")


class FlowerRoundWarning(UserWarning):
    """A round ran with fewer clients than asked for."""


#: The name tests/flower/test_buffers.py imports: the server's buffer arithmetic is fedselect.aggregation's.
_aggregate_buffers = average_buffer_arrays


def _test_metrics(evaluation: Mapping[str, float]) -> tuple[float | None, float | None]:
    """(test accuracy, test loss) of a centralised evaluation: ``test-accuracy``/``test-loss``, else
    ``accuracy``/``loss``; None for what it does not report."""
    acc = evaluation.get("test-accuracy", evaluation.get("accuracy"))
    loss = evaluation.get("test-loss", evaluation.get("loss"))
    return acc, loss


def _is_names(value: Any) -> bool:
    """A sequence (not a string) of distinct strings."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        return False
    return all(isinstance(v, str) for v in value) and len(set(value)) == len(value)


def trimmed_mean(deltas: Any, f: int) -> np.ndarray:
    """The coordinate-wise mean of ``deltas`` (one row per reporter) without the ``f`` largest and ``f`` smallest
    values of each coordinate; the coordinate-wise median when there are ``2 f`` rows or fewer.

    Parameters
    ----------
    deltas : array-like of shape (R, P)
        The round's reporters' updates.
    f : int
        How many hostile reporters the round may hold (counted in the round, not as a share of the population).

    Returns
    -------
    ndarray of shape (P,), float32
        The robust mean update. Up to f rows of any values move each coordinate at most to the range of the
        others' values.
    """
    d = np.asarray(deltas, dtype=np.float64)
    r = d.shape[0]
    if r <= 2 * f:
        return np.median(d, axis=0).astype(np.float32)
    return np.sort(d, axis=0)[f : r - f].mean(axis=0).astype(np.float32)


class SelectorStrategy(Strategy):
    """Run a fedselect selector in a Flower federation (Message API).

    Each round t (Flower's ``server_round`` is t + 1) is :mod:`fedselect.round`'s, played against a
    :class:`FlowerOracle`: ``configure_train`` refreshes the node map (:attr:`wire_`: each new node answers a
    ``query.fedselect_hello`` with its client id and n_k; the first round waits for all N and fits the selector
    on their n_k), opens the round (:func:`fedselect.round.open_round`: the selector chooses, its oracle
    questions are messages through the Grid charged on a :class:`~fedselect.ledger.RoundLedger`) and returns
    the chosen clients' train messages; ``aggregate_train`` concludes it with the replies (checked by
    :attr:`checks_`, weighted by :func:`fedselect.aggregation.aggregation_weights`, applied as
    w^{t+1} = w^t + sum_k a_k (w_k - w^t), buffers averaged) and teaches the selector a
    :class:`~fedselect.RoundFeedback` of the clients that reported. :meth:`start` is Flower's loop with
    ``deadline``, the centralised evaluation and a JSON line per round.

    The server trusts its own configuration, not its clients (:doc:`/security`): a client that does not answer
    in time, answers with an error, sends a reply that fails a check (layout, counts, finite and bounded
    losses, size) or whose node is gone is left out of the round (NaN to the oracle, absent from the feedback,
    :attr:`FlowerRound.rejected`); a selector's exception fed by the clients' answers skips that step for the
    round (:attr:`FlowerRound.errors`). A client without a live node is unavailable for the round; fewer live
    clients than ``clients_per_round`` shrinks it with a :class:`FlowerRoundWarning`.
    :doc:`/flower` says what each step sends and costs.

    Parameters
    ----------
    selector : BaseSelector or str
        The scheme (an instance, cloned, or a registered name).
    inner : flwr Strategy, optional
        Evaluation (``configure_evaluate``/``aggregate_evaluate``) and the aggregation rule
        when the selection has no weights and ``aggregation`` is None. Default:
        ``FedAvg(fraction_evaluate=0.0, min_available_nodes=1)`` (no federated evaluation;
        pass ``evaluate_fn`` to ``start`` for a centralised one).
    clients_per_round : int
        C, the clients asked for each round.
    n_clients : int
        N, required: from the server's own configuration (e.g. the run config), never from
        the clients (a client's hello may carry a ``num-partitions``; it is ignored). Client
        ids are 0..N-1; a hello claiming another id is refused.
    aggregation : {None, "data-size", "mean"}
        Rule for selections without weights: None defers to ``inner``; ``"data-size"``
        (n_k over the reporting clients, FedAvg) and ``"mean"`` apply the simulator's rules.
    query_timeout : float
        Seconds to wait for the answers to one oracle query.
    deadline : float, default 600.0
        Seconds to wait for the train replies: a later update is late and its client fails (the trainer's
        ``deadline``, on the wall clock). ``train_timeout`` is its deprecated name (warns).
    connect_timeout : float
        Seconds the first round waits for all N clients to connect.
    random_state : int in [0, 2**32 - 1], optional
        Seeds a selector whose own ``random_state`` is None, derived as
        :class:`fedselect.FederatedTrainer` derives it, so one seed chooses the same
        clients in both worlds.
    partial_weights : {"rescale", "as-given"}, default "rescale"
        Weights a selection carries, when some chosen clients do not report: rescaled to
        keep their total or kept as given, as in the simulator
        (:func:`fedselect.ledger.reporter_weights`).
    buffers : sequence of str, default ()
        The arrays of the model's ``ArrayRecord`` that are buffers, not parameters: batch
        norm's ``running_mean``, ``running_var`` and ``num_batches_tracked`` (e.g.
        :attr:`FederationClients.buffer_names <fedselect.flower.FederationClients.buffer_names>`,
        or the names of ``module.named_buffers()``). Each client trains its own copy from the
        global buffers and reports ``b_k - b^t`` in its update, in the buffer's dtype; the
        server averages them as step 4 says. Buffers are not part of the parameter vector the
        selector sees (``oracle.local_updates``, ``oracle.global_parameters``, the feedback's
        ``updates`` and ``global_before``/``global_after`` have the D parameters only). Every
        name must be an array of the initial model (:meth:`start` checks it before any
        message). With ``aggregation=None`` the buffers are averaged with FedAvg's weights
        (n_k times the selection count), whatever ``inner`` does with the parameters. Default:
        no buffers (every array is a parameter and must be floating-point).
    max_num_examples : int, default 10**9
        The largest n_k a client may claim; a hello above it is refused. n_k weighs
        FedAvg-style aggregation and data-size selection, so a liar's weight is bounded by
        this over the others' total: set it near the largest real client. The same bound
        holds for the ``num-examples`` of a federated evaluation reply (it weighs the inner
        strategy's average loss and metrics); a reply above it is left out.
    max_reply_bytes : int, "auto" or None, default "auto"
        The most bytes one reply may carry, every byte counted before decoding (arrays' data,
        each string's and bytes value's length, inside lists too, 8 per number, keys and
        names: :func:`fedselect.flower._protocol.content_nbytes`); ``"auto"``: four times the
        model's size plus 1 MiB; None: no limit.
    update_norm_bound : float, optional
        Opt-in bound on update magnitudes: an update whose norm exceeds c (this factor) times
        the median of the norms accepted unclipped in earlier rounds (at most 50; not the
        round's own, not clipped or rejected ones) is rejected or clipped to it
        (``update_norm_action``), before its weight is applied. Until three norms are
        accepted, the reference is the median of the round's norms and at most ``||w^t||``
        (when not zero). Off by default (honest rounds are then aggregated bit for bit as in
        the simulator).
    update_norm_action : {"reject", "clip"}, default "reject"
    loss_clip_quantile : float in (0, 1], optional
        Opt-in rule for loss-based selectors: each batch of loss answers (an oracle
        question, the trial model's losses, the train replies' losses, the round's reporters'
        sample losses) is clipped from above to its ``q``-quantile, so one fabricated loss
        counts no more than the ``q``-quantile client of the same batch.
    loss_clip_history : float, optional
        Opt-in rule: a client's loss on ``w^t`` is clipped into [m / f, f m], with f this
        factor and m the median of its own earlier answers on global models that needed no
        clipping (the last 20); a clipped answer does not enter that history, so a lie cannot
        move its own bounds. A sample loss (a mean of squares) is held likewise to
        [m / f**2, f**2 m] around its own history.
    loss_outlier_factor : float, optional
        Opt-in rule against colluding liars, the *leave-one-out median fence*: a loss answer
        above c times the median m_-k of the other clients' answers (the others in the same
        batch, and for losses on ``w^t`` each other client's latest answer of earlier batches)
        is replaced by the median of the answers not fenced (:func:`loo_median_fence`). A lie
        repeated by several clients does not enter its own reference, so while colluders are
        a minority of it they are ranked as a typical client, not first. A sample loss is
        fenced at c**2 m_-k. Applied before the two rules above.
    trim_clients : int, optional
        Opt-in robust aggregation counted in the round: f, the hostile clients a round may
        hold. A selection without weights is aggregated as ``w^t`` plus the coordinate-wise
        mean of the reporters' deltas without the f largest and f smallest values of each
        coordinate (the coordinate-wise median when there are 2f reporters or fewer), instead
        of ``aggregation`` or ``inner``; O(R P log R) for R reporters of P parameters.
    max_abs_loss : float, default 1e6
        A loss answer with a larger magnitude is refused (its client fails the round): no
        training loss is that large, and a selector squaring or differencing it would
        overflow or be captured by it. A sample loss above its square is refused too.
    node_binding : mapping of int to int, optional
        Flower node id -> the one client id that node may claim (distinct ids, each client id
        below ``n_clients``; :func:`fedselect.flower.read_node_binding` reads one from JSON).
        With SuperNode authentication a node id stands for one registered key, so this binds
        client ids to authenticated identities: a node not in the binding gets no message at
        all, and a bound node whose hello claims another id is refused (both logged, not asked
        again while connected). Default None: the first usable claim of an id holds it.

    Raises
    ------
    fedselect._validation.InvalidParameterError
        (a ValueError and a TypeError) at construction for a parameter outside the
        declared ``_parameter_constraints``, naming it; :meth:`start` checks them again
        and resolves and validates the selector before sending any message.
    ValueError
        From :meth:`start`, before any message, when ``buffers`` names an array the initial
        model does not hold (naming them); TypeError when an array not named in ``buffers``
        is not floating-point.

    Attributes
    ----------
    selector_ : BaseSelector
        The fitted clone.
    rounds_ : list of FlowerRound
        What every round did and cost.
    history_ : History
        The rounds as a :class:`~fedselect.simulation.History`, which
        :class:`fedselect.compare.Comparison`, its tables and plots take like a simulated run's.
    client_nodes_ : dict of int to int
        Client id to Flower node id, as of the last round.
    wire_ : fedselect.flower.wire.Wire
        The node map, the hellos and the exchanges with their bytes and seconds (from the first round).
    checks_ : fedselect.flower.checks.ReplyChecks
        The screening of every reply and the opt-in rules' references (from the first round).
    layout_ : ModelLayout
        The model's arrays as the initial model gave them: names, shapes, dtypes, buffers.
    global_arrays_ : ArrayRecord
        This round's global model w^t as Flower passed it to ``configure_train``.
    """

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "selector": [InstanceOf(str, "a registered selector name"), InstanceOf(BaseSelector, "a BaseSelector")],
        "inner": [None, InstanceOf(Strategy, "a flwr Strategy")],
        "clients_per_round": [Interval(Integral, 1, None, closed="left")],
        "n_clients": [Interval(Integral, 1, None, closed="left")],
        "aggregation": [None, StrOptions([a for a in _AGGREGATIONS if a is not None])],
        "query_timeout": [Interval(Real, 0, None, closed="neither")],
        "deadline": [Interval(Real, 0, None, closed="neither")],
        "train_timeout": [None, Interval(Real, 0, None, closed="neither")],
        "connect_timeout": [Interval(Real, 0, None, closed="neither")],
        "random_state": [None, Interval(Integral, 0, 2**32 - 1, closed="both")],
        "partial_weights": [StrOptions(PARTIAL_WEIGHTS)],
        "buffers": [
            Predicate(
                _is_names,
                "a sequence of distinct array names (str), e.g. ('bn.running_mean',)",
                examples=["bn.running_mean", [3], ("a", "a"), None],
            )
        ],
        "max_num_examples": [Interval(Integral, 1, None, closed="left")],
        "max_reply_bytes": [None, StrOptions(["auto"]), Interval(Integral, 1, None, closed="left")],
        "update_norm_bound": [None, Interval(Real, 1, None, closed="left")],
        "update_norm_action": [StrOptions(["reject", "clip"])],
        "loss_clip_quantile": [None, Interval(Real, 0, 1, closed="right")],
        "loss_clip_history": [None, Interval(Real, 1, None, closed="left")],
        "loss_outlier_factor": [None, Interval(Real, 1, None, closed="left")],
        "trim_clients": [None, Interval(Integral, 1, None, closed="left")],
        "max_abs_loss": [Interval(Real, 0, None, closed="neither")],
        "node_binding": [
            None,
            Predicate(
                is_node_binding,
                "a non-empty mapping of distinct node ids (int >= 0) to distinct client ids (int >= 0)",
                examples=[{}, {1: -1}, {1: 0, 2: 0}, {"1": 0}, [(1, 0)], {1: True}],
            ),
        ],
    }

    def wait_for_training(self) -> float:
        """Seconds to wait for the train replies: ``deadline`` (or the deprecated ``train_timeout`` when set)."""
        return self.deadline if self.train_timeout is None else self.train_timeout

    def _params(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._parameter_constraints}

    def __init__(
        self,
        selector: BaseSelector | str,
        *,
        inner: Strategy | None = None,
        clients_per_round: int = 10,
        n_clients: int,
        aggregation: str | None = None,
        query_timeout: float = 60.0,
        deadline: float = 600.0,
        connect_timeout: float = 120.0,
        random_state: int | None = None,
        partial_weights: str = "rescale",
        buffers: Sequence[str] = (),
        max_num_examples: int = 10**9,
        max_reply_bytes: int | str | None = "auto",
        update_norm_bound: float | None = None,
        update_norm_action: str = "reject",
        loss_clip_quantile: float | None = None,
        loss_clip_history: float | None = None,
        loss_outlier_factor: float | None = None,
        trim_clients: int | None = None,
        max_abs_loss: float = 1e6,
        node_binding: Mapping[int, int] | None = None,
        train_timeout: float | None = None,
    ) -> None:
        self.selector = selector
        self.inner = inner
        self.clients_per_round = clients_per_round
        self.n_clients = n_clients
        self.aggregation = aggregation
        self.query_timeout = query_timeout
        self.deadline = deadline
        self.train_timeout = train_timeout  # deprecated name of deadline: it wins when given (it warns here)
        renamed("SelectorStrategy", "train_timeout", train_timeout, "deadline", deadline)
        self.connect_timeout = connect_timeout
        self.random_state = random_state
        self.partial_weights = partial_weights
        self.buffers = buffers
        self.max_num_examples = max_num_examples
        self.max_reply_bytes = max_reply_bytes
        self.update_norm_bound = update_norm_bound
        self.update_norm_action = update_norm_action
        self.loss_clip_quantile = loss_clip_quantile
        self.loss_clip_history = loss_clip_history
        self.loss_outlier_factor = loss_outlier_factor
        self.trim_clients = trim_clients
        self.max_abs_loss = max_abs_loss
        self.node_binding = node_binding
        validate_parameters(self, self._params(), self._parameter_constraints)
        self._check_binding_ids()
        self._inner = inner if inner is not None else FedAvg(fraction_evaluate=0.0, min_available_nodes=1)
        self._errors: list[str] = []  # this round's contained errors
        self.rounds_: list[FlowerRound] = []
        self._pending: dict[str, Any] | None = None

    # -- Flower's Strategy ----------------------------------------------------------
    def summary(self) -> None:
        log(INFO, "\t├──> fedselect selector: %r", self.selector)
        log(INFO, "\t├──> clients per round: %d, aggregation: %s", self.clients_per_round, self.aggregation or "inner")
        if self.buffers:
            log(INFO, "\t├──> buffers (averaged): %s", ", ".join(self.buffers))
        log(INFO, "\t└──> timeouts: query %.1fs, train (deadline) %.1fs", self.query_timeout, self.wait_for_training())

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Start round ``server_round - 1``: its first phase, :func:`fedselect.round.open_round` against a
        :class:`FlowerOracle` (the selection, its questions answered by the clients); return the train messages
        of the chosen clients. The round waits in ``_pending`` for :meth:`aggregate_train`."""
        start = time.perf_counter()
        t = int(server_round) - 1
        self._pending = None  # a round opened earlier and never aggregated is dropped, even if this call raises
        self._errors = []
        if not hasattr(self, "selector_"):
            self._setup(grid, arrays)
        else:
            self.wire_.begin_round()
            self.wire_.refresh_nodes(grid)
        N = self.n_clients_
        live = sorted(self.wire_.client_nodes())
        unavailable = [k for k in range(N) if self.wire_.node_of(k) is None]
        led = RoundLedger(N, t, unavailable=unavailable)
        self.global_arrays_ = arrays
        theta = self.layout_.flatten(arrays, "global model")
        buffers = self.layout_.buffers(arrays, "global model")
        self.checks_.begin_round(buffers)
        n = int(self.clients_per_round)
        if len(live) < n:
            if not live:
                raise RuntimeError(f"SelectorStrategy: no client is connected in round {t}")
            warnings.warn(
                f"SelectorStrategy: round {t} has {len(live)} live client(s) for clients_per_round={n}; "
                f"choosing {len(live)}",
                FlowerRoundWarning,
                stacklevel=2,
            )
            n = len(live)
        n = min(n, N)
        oracle = FlowerOracle(FlowerClients(self, grid, led, theta, config, buffers))
        state: dict[str, Any] = {"t": t, "ledger": led, "start": start}
        opened = open_round(
            oracle,
            oracle,
            self.selector_,
            n,
            theta,
            round=t,
            n_clients=N,
            contain=functools.partial(self._contain, state),
            apply=functools.partial(self._apply, int(server_round)),
            **self.weight_rule(),
        )
        state["round"] = opened  # None: the selector raised after clients answered (contained): nobody trains
        self._pending = state
        if opened is None:
            return []
        return opened.request.messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Finish the round with the train replies: its other phases (:meth:`fedselect.round.OpenRound.conclude`:
        the replies' checks, weights, aggregation; then this strategy's checks of the aggregate and
        :meth:`~fedselect.round.OpenRound.learn`, the selector's update); the new model and the round's metrics."""
        st = self._pending
        if st is None or st["t"] != int(server_round) - 1:
            raise RuntimeError("SelectorStrategy.aggregate_train: call configure_train for this round first")
        self._pending = None
        replies = list(replies)
        t, led = st["t"], st["ledger"]
        opened = st["round"]
        if opened is None:
            self.wire_.count("train", replies, down=False)
            self._finish(FlowerRound(round=t, clients=[], failed=sorted(int(k) for k in led.failed)), led, st["start"])
            return None, None
        agg = opened.conclude(replies)
        stands = self._after_aggregate(t, agg)
        if stands:
            opened.learn(agg)
        fb = agg.feedback
        record = FlowerRound(
            round=t,
            clients=agg.selection.clients.tolist(),
            reported=fb.clients.tolist(),
            failed=sorted(int(k) for k in led.failed),
        )
        if not stands:
            self._finish(record, led, st["start"])
            return None, None
        record.weights = [float(w) for w in fb.weights]
        self._finish(record, led, st["start"])
        values: dict[str, Any] = {"fedselect-reported": int(fb.clients.size), "fedselect-failed": len(record.failed)}
        if fb.losses is not None:  # asked only for a selector that needs "losses"
            values["fedselect-train-loss-before"] = float(np.average(fb.losses, weights=fb.n_samples))
        metrics = MetricRecord(values)
        return self.layout_.record(agg.theta, agg.buffers), metrics

    # -- the round's hooks (fedselect.round) ----------------------------------------------
    def weight_rule(self) -> dict[str, Any]:
        """The keywords of :func:`fedselect.aggregation.aggregation_weights` for this server: its rule
        (FedAvg's, ``"data-size"``, when ``aggregation`` is None: the buffers and the record use it while
        ``inner`` combines the parameters), n_k from the hellos, ``partial_weights``."""
        return {
            "aggregation": self.aggregation or "data-size",
            "n_samples": self.wire_.n_samples_array(),
            "partial_weights": self.partial_weights,
        }

    def _apply(
        self, server_round: int, theta: np.ndarray, selection: Selection, reports: Reports, weights: np.ndarray
    ) -> np.ndarray | None:
        """w^{t+1}: the reporters' weighted deltas (:func:`fedselect.aggregation.apply_deltas`), or, for a
        selection without weights and ``aggregation=None``, ``inner``'s ``aggregate_train`` on the local
        models ``w^t + delta`` with num-examples n_k times the selection count (None if it returns nothing);
        with ``trim_clients`` and no weights, the trimmed mean (:func:`trimmed_mean`)."""
        if self.trim_clients is not None and selection.weights is None and reports.clients.size:
            return (theta + trimmed_mean(reports.updates, int(self.trim_clients))).astype(theta.dtype)
        if selection.weights is not None or self.aggregation is not None:
            return apply_deltas(theta, reports.updates, weights)
        keep = np.isin(selection.clients, reports.clients)
        counts = selection.counts[keep] if selection.counts is not None else np.ones(reports.clients.size)
        fake = []
        for k, d, c in zip(reports.clients.tolist(), reports.updates, counts):
            content = RecordDict(
                {  # the parameters only: buffers are averaged by the round, not by inner
                    "arrays": self.layout_.record(theta + d, parameters_only=True),
                    "metrics": MetricRecord({P.NUM_EXAMPLES: int(self.wire_.n_samples[k] * c)}),
                }
            )
            node = self.wire_.node_of(k)
            fake.append(Message(content, 0 if node is None else node, P.TRAIN, group_id=str(server_round)))
        agg, _ = self._inner.aggregate_train(server_round, fake)
        return None if agg is None else self.layout_.flatten(agg, "aggregated model")

    def _after_aggregate(self, t: int, agg: Aggregate) -> bool:
        """Whether round ``t`` stands (else it is dropped: model unchanged, the selector not taught): someone
        reported, ``inner`` produced a model, and the aggregate is finite."""
        reported = agg.feedback.clients
        if not reported.size:
            warnings.warn(
                f"SelectorStrategy: no chosen client reported in round {t}; the model is unchanged",
                FlowerRoundWarning,
                stacklevel=2,
            )
        elif agg.theta is not None and not (
            np.all(np.isfinite(agg.theta))
            and all(np.all(np.isfinite(b)) for b in agg.buffers.values() if np.issubdtype(b.dtype, np.floating))
        ):
            # Each update was finite and its squared norm fit in float32, so the sum overflowed: clients'
            # doing, not the server's. The round is dropped; update_norm_bound is what prevents it.
            note = (
                f"round {t}: the aggregate of clients {reported.tolist()[:20]} is not finite; the round is "
                "dropped (model unchanged; update_norm_bound bounds update magnitudes)"
            )
            log(ERROR, "fedselect: %s", note)
            self.note_error(note)
        elif agg.theta is not None:
            return True
        return False

    def _contain(self, state: dict[str, Any], step: str, exc: Exception, agg: Aggregate | None) -> bool:
        """Whether a selector's exception is contained: one in ``select`` after clients answered its questions
        (one of them may be hostile and the server cannot tell which: the round trains nobody), and any in
        ``update`` (fed by the clients' reports: the round stands, the selector does not learn from it).
        Logged, and kept in the round's ``errors``. One in ``select`` before any answer is the server's."""
        t, name = state["t"], type(self.selector_).__name__
        if step == "select":
            answered = state["ledger"].answered().tolist()
            if not answered:
                return False
            note = (
                f"round {t}: {name}.select raised {P.why(exc)} after clients {answered[:20]} "
                "answered its questions; the round is skipped (model unchanged)"
            )
        else:
            reported = agg.feedback.clients if agg is not None else np.zeros(0, dtype=np.int64)
            note = (
                f"round {t}: {name}.update raised {P.why(exc)} on the feedback of "
                f"clients {reported.tolist()[:20]}; the selector did not learn from this round"
            )
        log(ERROR, "fedselect: %s", note)
        self.note_error(note)
        return True

    def note_error(self, note: str) -> None:
        """Keep ``note``, an error contained in this round (the caller logs it), in the round's ``errors``."""
        self._errors.append(note)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self._inner.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self._inner.aggregate_evaluate(server_round, replies)

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        records_path: str | os.PathLike[str] | None = None,
    ) -> Result:
        """Run ``num_rounds`` rounds (Flower's ``Strategy.start``, with ``deadline`` for training).

        ``timeout`` bounds the federated evaluation's wait; ``evaluate_fn(server_round, arrays)``
        is a centralised evaluation run before the first round and after every round. Each
        round is logged as it ends (chosen, reported, failed and rejected clients, contained
        errors, the centralised evaluation). ``records_path``: a JSON-lines file that gets one
        line per round as it ends (:meth:`FlowerRound.to_dict`), appended and flushed, so a
        run that stops keeps every finished round. It must be a path (``str`` or
        ``os.PathLike``; an int would be a file descriptor: TypeError), in an existing,
        writable directory and not itself a directory (ValueError), checked before any
        message or evaluation.
        """
        # Again (attributes may have been changed since construction), and the selector: an unknown
        # name or a bad selector parameter fails here, before any message is sent.
        validate_parameters(self, self._params(), self._parameter_constraints)
        self._check_binding_ids()
        self._resolved_selector()
        P.ModelLayout(initial_arrays, self.buffers)  # unknown buffer names, non-float parameters
        if records_path is not None:
            check_records_path(records_path)
        train_config = ConfigRecord() if train_config is None else train_config
        evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
        result = Result()
        self.summary()
        if evaluate_fn is not None:
            res = evaluate_fn(0, initial_arrays)
            if res is not None:
                result.evaluate_metrics_serverapp[0] = res
        arrays = initial_arrays
        for server_round in range(1, int(num_rounds) + 1):
            log(INFO, "[ROUND %s/%s]", server_round, num_rounds)
            messages = list(self.configure_train(server_round, arrays, train_config, grid))
            wait = float(self.wait_for_training())
            timed = self.wire_.send_and_receive(grid, messages, wait) if messages else []
            with self.wire_.waited_for_training(timed, wait):  # the round's transport reads it
                new_arrays, metrics = self.aggregate_train(server_round, [m for m, _ in timed])
            if new_arrays is not None:
                arrays = result.arrays = new_arrays
            if metrics is not None:
                result.train_metrics_clientapp[server_round] = metrics
            eval_messages = list(self.configure_evaluate(server_round, arrays, evaluate_config, grid))
            if eval_messages:
                eval_replies = self.checks_.usable_evaluations(
                    self.wire_.exchange(grid, eval_messages, timeout, "evaluate")
                )
                try:
                    agg = self.aggregate_evaluate(server_round, eval_replies) if eval_replies else None
                except Exception as exc:  # the inner strategy choked on what clients sent: no evaluation
                    note = f"round {server_round - 1}: the federated evaluation failed ({P.why(exc)}); skipped"
                    log(ERROR, "fedselect: %s", note)
                    if self.rounds_:
                        self.rounds_[-1].errors.append(note)
                    agg = None
                if agg is not None:
                    result.evaluate_metrics_clientapp[server_round] = agg
                self.rounds_[-1].traffic["evaluate"] = self.wire_.traffic.get("evaluate", Traffic())
            if evaluate_fn is not None:
                res = evaluate_fn(server_round, arrays)
                if res is not None:
                    result.evaluate_metrics_serverapp[server_round] = res
                    if self.rounds_:
                        rec = self.rounds_[-1]
                        rec.evaluation = {
                            k: float(v)
                            for k, v in res.items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool)
                        }
                        rec.test_accuracy, rec.test_loss = _test_metrics(rec.evaluation)
            if self.rounds_ and self.rounds_[-1].round == server_round - 1:
                self._log_round(self.rounds_[-1])
                if records_path is not None:
                    with open(records_path, "a", encoding="utf-8") as f:
                        f.write(json.dumps(self.rounds_[-1].to_dict()) + "\n")
                        f.flush()
                        os.fsync(f.fileno())
        if not result.arrays:
            result.arrays = arrays
        return result

    @staticmethod
    def _log_round(rec: FlowerRound) -> None:
        evaluation = ", ".join(f"{k} {v:.4f}" for k, v in rec.evaluation.items())
        log(
            INFO,
            "fedselect round %d: chose %s, reported %s, failed %s%s%s (%.2f s)",
            rec.round,
            rec.clients,
            rec.reported,
            rec.failed,
            f", {evaluation}" if evaluation else "",
            f", rejected {rec.rejected}" if rec.rejected else "",
            rec.seconds,
        )
        for note in rec.errors:
            log(ERROR, "fedselect round %d: %s", rec.round, note)

    # -- nodes ------------------------------------------------------------------------
    def _setup(self, grid: Grid, arrays: ArrayRecord) -> None:
        """The first round's setup: the model's layout, the wire and the reply checks, the wait until all N clients
        said hello (or ``connect_timeout``), and the selector fitted on their n_k."""
        self.layout_ = P.ModelLayout(arrays, self.buffers)
        limit = reply_limit(self.max_reply_bytes, self.layout_)
        self.wire_ = wire = Wire(
            n_clients=self.n_clients,
            query_timeout=self.query_timeout,
            max_num_examples=self.max_num_examples,
            node_binding=self.node_binding,
            reply_limit=limit,
        )
        self.checks_ = ReplyChecks(
            self.layout_,
            wire.client_of,
            reply_limit=limit,
            max_num_examples=self.max_num_examples,
            max_abs_loss=self.max_abs_loss,
            update_norm_bound=self.update_norm_bound,
            update_norm_action=self.update_norm_action,
            loss_clip_quantile=self.loss_clip_quantile,
            loss_clip_history=self.loss_clip_history,
            loss_outlier_factor=self.loss_outlier_factor,
        )
        N = int(self.n_clients)
        started = time.monotonic()
        deadline = started + float(self.connect_timeout)
        next_note = started + 10.0
        while True:
            wire.refresh_nodes(grid, connecting=True)
            if all(k in wire.n_samples for k in range(N)):
                break
            if time.monotonic() >= next_note:  # a wait of minutes must not look like a hang
                log(
                    INFO,
                    "fedselect: waiting for the clients to connect: %d of %d so far (%.0f s of connect_timeout=%.0f s)",
                    len(wire.n_samples),
                    N,
                    time.monotonic() - started,
                    float(self.connect_timeout),
                )
                next_note += 10.0
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        lost = [k for k in range(N) if k not in wire.n_samples]
        if lost:
            if not wire.n_samples:
                refused = "; ".join(f"node {n}: {why}" for n, why in wire.refusals()[:5])
                raise RuntimeError(
                    f"SelectorStrategy: after connect_timeout={self.connect_timeout}s no client of N={N} has sent a "
                    f"usable hello{' (refused: ' + refused + ')' if refused else ''}; nothing to train"
                )
            # The selector needs N sizes; a client that never said a usable hello gets the smallest n_k
            # reported (the least weight), and is unavailable until its node connects.
            fill = min(wire.n_samples.values())
            log(
                WARNING,
                "fedselect: after connect_timeout=%.0f s, client(s) %s of N=%d have not sent a usable "
                "hello; they join the pool with n_k=%d (the smallest reported) and stay unavailable until "
                "they connect",
                float(self.connect_timeout),
                lost[:20],
                N,
                fill,
            )
            wire.fill_sizes(lost, fill)
        self.n_clients_ = N
        sel = clone(self._resolved_selector())
        params = sel.get_params(deep=False)
        if "random_state" in params and params["random_state"] is None and self.random_state is not None:
            sel.set_params(random_state=int(np.random.SeedSequence(int(self.random_state)).generate_state(3)[1]))
        sel.fit(ClientPool(wire.n_samples_array()))
        self.selector_ = sel

    def _check_binding_ids(self) -> None:
        """Every client id of ``node_binding`` is below ``n_clients``."""
        if self.node_binding is None:
            return
        out = sorted({int(k) for k in self.node_binding.values() if int(k) >= int(self.n_clients)})
        if out:
            raise InvalidParameterError(
                parameter_message(
                    self, "node_binding", self.node_binding, f"client ids below n_clients={self.n_clients}, not {out}"
                )
            )

    def _resolved_selector(self) -> BaseSelector:
        """The selector (a registered name resolved), its own parameters validated."""
        sel = self.selector
        if isinstance(sel, str):
            from ..plugins import get_selector

            sel = get_selector(sel)
        sel._validate_params()
        return sel

    @property
    def client_nodes_(self) -> dict[int, int]:
        """Client id to Flower node id of the live clients (empty before the first round)."""
        wire = getattr(self, "wire_", None)
        return {} if wire is None else wire.client_nodes()

    @property
    def history_(self) -> History:
        """The run so far as a :class:`~fedselect.simulation.History`, for :class:`fedselect.compare.Comparison`,
        its tables and plots: one plain :class:`~fedselect.simulation.RoundRecord` per round (test accuracy
        and loss from ``start(evaluate_fn=...)``), ``model_size`` the D parameters."""
        layout = getattr(self, "layout_", None)
        sel = getattr(self, "selector_", None)
        config = {
            "strategy": {
                "clients_per_round": int(self.clients_per_round),
                "n_clients": int(self.n_clients),
                "aggregation": self.aggregation,
                "partial_weights": self.partial_weights,
                "random_state": self.random_state,
            },
            "selector": {"name": type(sel).__name__ if sel is not None else str(self.selector)},
            "n_clients": int(self.n_clients),
        }
        return History(
            rounds=[r.as_round_record() for r in self.rounds_],
            model_size=layout.size if layout is not None else 0,
            config=config,
        )

    def _finish(self, record: FlowerRound, led: RoundLedger, start: float) -> None:
        record.costs = copy.copy(led.costs)
        record.traffic = dict(self.wire_.traffic)
        record.seconds = time.perf_counter() - start
        record.wall_seconds = float(self.wire_.wall)
        record.reply_seconds = dict(self.wire_.reply_seconds)
        record.rejected = dict(self.checks_.rejected)
        record.errors = list(self._errors)
        self.rounds_.append(record)
