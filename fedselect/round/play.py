"""One round of federated training, played against a transport.

select -> validate -> train the chosen clients -> reporters -> weights -> apply -> RoundFeedback
-> update, written once. A *transport* is what carries the round to clients (the oracle's
questions are written once too, :class:`fedselect.round.oracle.RoundOracle`): the simulator's
engine (:class:`fedselect.simulation.transport.SimulationOracle`), a Flower grid
(:class:`fedselect.flower.FlowerOracle`) or the synthetic test oracle
(:class:`fedselect.testing.SyntheticOracle`).

A round is three plain phases, its state between them an :class:`OpenRound`:

1. :func:`open_round`: the selector selects (its oracle questions answered as it asks them),
   the selection is validated and the transport starts the chosen clients' training
   (:meth:`Transport.start_training`), which returns what the runtime must run or send for it,
   ``OpenRound.request``: the simulator's :class:`~fedselect.simulation.transport.TrainingRequest`
   (so that :func:`fedselect.simulation.batched.fit_runs` can answer several runs' requests in
   one computation), Flower's train messages (``configure_train`` returns them), or None (the
   transport trained the clients itself);
2. :meth:`OpenRound.conclude` with the answer (the training's result, Flower's replies):
   :func:`conclude_round`, the reports weighed and applied, the feedback built;
3. the runtime's own checks and evaluation, then :meth:`OpenRound.learn`: the selector's update.

:func:`play_round` runs the three in one call for a runtime that answers the request at once.
Aggregation itself is :mod:`fedselect.aggregation`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from .._validation import renamed
from ..aggregation import aggregation_weights, apply_deltas
from ..selection import BaseSelector, ClientOracle, RoundFeedback, Selection, available_clients, restrict_to_available

__all__ = ["Aggregate", "Apply", "OpenRound", "Reports", "Transport", "conclude_round", "open_round", "play_round"]


@dataclass
class Reports:
    """What the chosen clients that reported sent: each reporter's update, loss before training and n_k.

    Attributes
    ----------
    clients : ndarray of int
        The reporters, in the order of the selection's clients.
    updates : Tensor or ndarray, shape (len(clients), D)
        Their updates w_k - w^t (float32).
    losses : ndarray of float, or None
        Their losses l_k(w^t) before local training; None when the transport did not ask for
        them (the selector's ``needs`` lacks ``"losses"``): passed on as ``RoundFeedback.losses``.
    n_samples : ndarray of int
        Their n_k.
    durations : ndarray of float, optional
        Each reporter's seconds this round as the server observed them (a transport with a
        clock); passed on as ``RoundFeedback.durations`` when the selector needs ``"durations"``.
    sample_loss_sq : ndarray of float, optional
        Each reporter's mean squared per-sample training loss (sent with its update, charged by
        the transport); passed on when the selector needs ``"sample_losses"``.
    timed_out, timed_out_after : ndarray, optional
        The chosen clients the server stopped waiting for without a reply, and how long it had
        waited for each (a lower bound on their durations); passed on with ``durations``.
    """

    clients: np.ndarray
    updates: Any
    losses: np.ndarray | None
    n_samples: np.ndarray
    durations: np.ndarray | None = None
    sample_loss_sq: np.ndarray | None = None
    timed_out: np.ndarray | None = None
    timed_out_after: np.ndarray | None = None


class Transport(Protocol):
    """What a round needs of the world that carries it to the clients.

    Training is two calls, so that the runtime can run or send the work in between (and batch
    it with other runs'): :meth:`start_training` returns the request, the runtime answers it and
    hands the answer to :meth:`finish_training`. A transport that trains at once returns None
    and is given None back.
    """

    def start_training(self, ids: np.ndarray) -> Any:
        """Start training the chosen (distinct) ``ids`` not yet trained this round; what the runtime must run
        or send for it (None: nothing, the transport trained them itself)."""

    def finish_training(self, reply: Any) -> Reports:
        """The reports of the chosen clients that answer, given the answer to :meth:`start_training`'s
        request (None when it asked for nothing)."""

    def aggregate_buffers(self, reporters: np.ndarray, weights: np.ndarray) -> Any:
        """The global buffers averaged over ``reporters`` with ``weights`` (None for a model without)."""


@dataclass
class Aggregate:
    """A concluded round: the new model and what the selector is told.

    Attributes
    ----------
    selection : Selection
        The validated selection.
    weights : ndarray of float
        Each chosen client's aggregation weight (0 for those that did not report).
    reported : ndarray of bool
        Which chosen clients reported.
    theta : Tensor or ndarray or None
        w^{t+1} (w^t when nobody reported; None when the runtime's own ``apply`` produced no model).
    buffers : Any
        The global buffers after the round, as the transport gives them (None: unchanged or none).
    feedback : RoundFeedback
    chosen : Selection or None
        The selection as the selector returned it (restricted to the available clients, not
        validated: duplicates and order kept); set by :meth:`OpenRound.conclude`.
    """

    selection: Selection
    weights: np.ndarray
    reported: np.ndarray
    theta: Any
    buffers: Any
    feedback: RoundFeedback
    chosen: Selection | None = None


def _numpy(x: Any) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


#: ``apply(theta, selection, reports, weights)``: a runtime's own way of combining the reports (Flower's inner
#: strategy), given the reporters' weights; returns w^{t+1}, or None when it produces no model.
Apply = Callable[[Any, Selection, Reports, np.ndarray], Any]

#: ``contain(step, exc, aggregate)``: whether a selector's exception in ``step`` is contained (see :func:`open_round`).
Contain = Callable[[str, Exception, Aggregate | None], bool]


def conclude_round(
    transport: Transport, selection: Selection, theta: Any, reply: Any = None, *, round: int,
    needs: frozenset[str] = frozenset(), aggregation: str = "data-size", n_samples: Any = None,
    partial_weights: str = "rescale", accumulate: str = "float32", apply: Apply | None = None, rule: str | None = None,
) -> Aggregate:
    """Finish a validated selection's training, weigh and apply what its reporters sent, and build the feedback.

    Phase 2 of a round (:meth:`OpenRound.conclude`): the transport turns ``reply`` into the
    reports (:meth:`Transport.finish_training`).

    Parameters
    ----------
    transport : Transport
        Its training of ``selection``'s clients started (:meth:`Transport.start_training`).
    selection : Selection
        Validated (:meth:`Selection.validated`).
    theta : Tensor or ndarray, shape (D,)
        w^t.
    reply : object, optional
        The answer to the request :meth:`Transport.start_training` returned (None when it
        returned None).
    round : int
    needs : frozenset of str
        The selector's ``needs`` (``"updates"``, ``"global"``, ``"durations"``,
        ``"sample_losses"``): what the feedback carries (the last two as the reports bring them;
        ``"losses"`` too, which the transport asks for or not when it starts the training).
    aggregation, n_samples, partial_weights
        As :func:`fedselect.aggregation.aggregation_weights`.
    accumulate : {"float32", "float64"}
        As :func:`fedselect.aggregation.apply_deltas`.
    apply : callable, optional
        ``apply(theta, selection, reports, weights)`` in place of
        :func:`~fedselect.aggregation.apply_deltas` (``weights``: the reporters', in their order);
        returns w^{t+1}, or None when it produces no model (the feedback then has no
        ``global_after``). Flower's strategy passes its inner strategy's aggregation here.

    Returns
    -------
    Aggregate
    """
    ids = selection.clients
    reports = transport.finish_training(reply)
    reporters = reports.clients
    reported = np.isin(ids, reporters)
    aggregation = renamed("conclude_round", "rule", rule, "aggregation", aggregation)
    weights = aggregation_weights(selection, reported, aggregation=aggregation, n_samples=n_samples,
                                  partial_weights=partial_weights)
    new_theta, buffers = theta, None
    if reporters.size:
        if apply is None:
            new_theta = apply_deltas(theta, reports.updates, weights[reported], accumulate=accumulate)
        else:
            new_theta = apply(theta, selection, reports, weights[reported])
        buffers = transport.aggregate_buffers(reporters, weights[reported])
    timed = "durations" in needs and reports.timed_out is not None and reports.timed_out_after is not None
    feedback = RoundFeedback(
        round=round,
        clients=reporters,
        weights=np.asarray(weights[reported], dtype=np.float64),
        losses=reports.losses,
        n_samples=reports.n_samples,
        updates=_numpy(reports.updates) if "updates" in needs else None,
        global_before=_numpy(theta) if "global" in needs else None,
        global_after=_numpy(new_theta) if "global" in needs and new_theta is not None else None,
        durations=reports.durations if "durations" in needs else None,
        sample_loss_sq=reports.sample_loss_sq if "sample_losses" in needs else None,
        timed_out=reports.timed_out if timed else None,
        timed_out_after=reports.timed_out_after if timed else None,
    )
    return Aggregate(selection, weights, reported, new_theta, buffers, feedback)


@dataclass
class OpenRound:
    """A round between its phases: selected and validated, its training started (:func:`open_round`).

    Attributes
    ----------
    transport : Transport
    selector : BaseSelector
    selection : Selection
        The validated selection.
    theta : Tensor or ndarray
        w^t.
    round : int
    request : object or None
        What the transport asked the runtime to run or send for the training
        (:meth:`Transport.start_training`); None when nothing.
    aggregation : dict
        The keywords of :func:`conclude_round` (``aggregation``, ``n_samples``, ``partial_weights``,
        ``accumulate``, ``apply``).
    contain : callable, optional
        As :func:`open_round`'s.
    chosen : Selection, optional
        The selection as the selector returned it (restricted to the available clients), before validation.
    """

    transport: Transport
    selector: BaseSelector
    selection: Selection
    theta: Any
    round: int
    request: Any = None
    aggregation: dict[str, Any] = field(default_factory=dict)
    contain: Contain | None = None
    chosen: Selection | None = None

    def conclude(self, reply: Any = None) -> Aggregate:
        """Phase 2: :func:`conclude_round` with ``reply``, the answer to :attr:`request` (None when it is None).

        A request left unanswered (``reply`` None) is an error, not a round whose clients all failed;
        so is an answer to no request.
        """
        if (self.request is None) != (reply is None):
            raise TypeError(
                f"OpenRound.conclude: the round's request is {type(self.request).__name__} but the reply is "
                f"{type(reply).__name__}; pass the answer to OpenRound.request (None only when it is None)"
            )
        agg = conclude_round(self.transport, self.selection, self.theta, reply, round=self.round,
                             needs=self.selector.needs, **self.aggregation)
        agg.chosen = self.chosen
        return agg

    def learn(self, aggregate: Aggregate) -> None:
        """Phase 3: the selector learns from the round's feedback (after the runtime's checks and evaluation).

        An exception of the selector's ``update`` propagates unless ``contain("update", exc,
        aggregate)`` contains it (the selector then stays untaught by this round).
        """
        try:
            self.selector.update(aggregate.feedback)
        except Exception as exc:
            if self.contain is None or not self.contain("update", exc, aggregate):
                raise


def open_round(
    transport: Transport, oracle: ClientOracle, selector: BaseSelector, n: int, theta: Any, *, round: int,
    n_clients: int, contain: Contain | None = None, **aggregation: Any,
) -> OpenRound | None:
    """Phase 1 of round ``round``: select, validate, and start the chosen clients' training.

    Parameters
    ----------
    transport : Transport
    oracle : ClientOracle
        What the selector may ask before choosing.
    selector : BaseSelector
        Fitted.
    n : int
        The clients asked for (at most the clients ``oracle.available()`` lists, when it lists some:
        the selection is restricted to them, :func:`fedselect.selection.restrict_to_available`).
    theta : Tensor or ndarray
        w^t.
    round : int
    n_clients : int
        N.
    contain : callable, optional
        ``contain(step, exc, aggregate)``, called when the selector raises in ``step``
        (``"select"``, with ``aggregate`` None, or ``"update"``): True contains the exception
        (a failed ``select`` skips the round: nobody trains and the result is None; a failed
        ``update`` leaves the selector untaught), False lets it propagate. Without it,
        everything propagates (the simulator: a selector's error is the user's to see).
    **aggregation
        ``aggregation``, ``n_samples``, ``partial_weights``, ``accumulate``, ``apply`` of :func:`conclude_round`
        (``rule``: the deprecated name of ``aggregation``).

    Returns
    -------
    OpenRound or None
        The round's state until :meth:`OpenRound.conclude`, its ``request`` what the runtime must
        answer; None only when ``contain`` contained a failed ``select``.
    """
    try:
        raw = selector.select(n, round=round, oracle=oracle)
    except Exception as exc:
        if contain is None or not contain("select", exc, None):
            raise
        return None
    available = available_clients(oracle)
    if available is not None:  # the clients online at the round's start: a selection lies among them
        raw = restrict_to_available(selector, raw, available, n, round=round)
    selection = raw.validated(n_clients, n, variable_size=bool(selector.variable_size), source=type(selector).__name__)
    request = transport.start_training(selection.clients)
    return OpenRound(transport, selector, selection, theta, round, request, aggregation, contain, chosen=raw)


def play_round(
    transport: Transport, oracle: ClientOracle, selector: BaseSelector, n: int, theta: Any, *, round: int,
    n_clients: int, answer: Callable[[Any], Any] | None = None,
    after_aggregate: Callable[[Aggregate], Any] | None = None, contain: Contain | None = None, **aggregation: Any,
) -> Aggregate | None:
    """Play round ``round`` in one call: :func:`open_round`, ``answer``, :meth:`~OpenRound.conclude`, then
    :meth:`~OpenRound.learn`.

    Parameters
    ----------
    transport, oracle, selector, n, theta, round, n_clients, contain, **aggregation
        As :func:`open_round`.
    answer : callable, optional
        ``answer(request)``: the answer to the transport's training request; required when the
        transport returns one (a transport that trains at once needs none).
    after_aggregate : callable, optional
        ``after_aggregate(aggregate)``, run after aggregation and before the selector's update
        (the runtime's checks and evaluation). Returning False skips the selector's update (a
        round the runtime drops).

    Returns
    -------
    Aggregate or None
        None only when ``contain`` contained a failed ``select``.
    """
    opened = open_round(transport, oracle, selector, n, theta, round=round, n_clients=n_clients, contain=contain,
                        **aggregation)
    if opened is None:
        return None
    reply = None
    if opened.request is not None:
        if answer is None:
            raise TypeError(f"play_round: the transport asked for {type(opened.request).__name__}; pass answer= "
                            "to answer it")
        reply = answer(opened.request)
    agg = opened.conclude(reply)
    if after_aggregate is None or after_aggregate(agg) is not False:
        opened.learn(agg)
    return agg
