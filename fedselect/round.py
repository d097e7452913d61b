"""One round of federated training, played against a transport.

select -> validate -> train the chosen clients -> reporters -> weights -> apply -> RoundFeedback
-> update, written once. A *transport* is what carries the round to clients: the simulator's
engine (:class:`fedselect.simulation.trainer.SimulationOracle`, which answers by yielding
:class:`~fedselect.simulation.trainer.TrainingRequest` so that
:func:`fedselect.simulation.batched.fit_runs` can batch several runs), a Flower grid
(:class:`fedselect.flower.FlowerOracle`, which yields the round's train messages: Flower's
``configure_train`` returns them and ``aggregate_train`` sends the replies back in) or the
synthetic test oracle (:class:`fedselect.testing.SyntheticOracle`). The round is a generator:
whatever the transport yields (a request to run) passes through to the caller, whose reply is
sent back in. Aggregation itself is :mod:`fedselect.aggregation`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from .aggregation import aggregation_weights, apply_deltas
from .selection import BaseSelector, ClientOracle, RoundFeedback, Selection

__all__ = ["Aggregate", "Apply", "Reports", "Transport", "conclude_round", "play_round"]


@dataclass
class Reports:
    """What the chosen clients that reported sent: each reporter's update, loss before training and n_k.

    Attributes
    ----------
    clients : ndarray of int
        The reporters, in the order of the selection's clients.
    updates : Tensor or ndarray, shape (len(clients), D)
        Their updates w_k - w^t (float32).
    losses : ndarray of float
        Their losses l_k(w^t) before local training.
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
    losses: np.ndarray
    n_samples: np.ndarray
    durations: np.ndarray | None = None
    sample_loss_sq: np.ndarray | None = None
    timed_out: np.ndarray | None = None
    timed_out_after: np.ndarray | None = None


class Transport(Protocol):
    """What a round needs of the world that carries it to the clients."""

    def train_chosen(self, ids: np.ndarray) -> Generator[Any, Any, Reports]:
        """Train the chosen (distinct) ``ids`` not yet trained this round; the reports of those that answer."""

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
    """

    selection: Selection
    weights: np.ndarray
    reported: np.ndarray
    theta: Any
    buffers: Any
    feedback: RoundFeedback


def _numpy(x: Any) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


#: ``apply(theta, selection, reports, weights)``: a runtime's own way of combining the reports (Flower's inner
#: strategy), given the reporters' weights; returns w^{t+1}, or None when it produces no model.
Apply = Callable[[Any, Selection, Reports, np.ndarray], Any]


def conclude_round(
    transport: Transport, selection: Selection, theta: Any, *, round: int, needs: frozenset[str] = frozenset(),
    rule: str = "data-size", n_samples: Any = None, partial_weights: str = "rescale", accumulate: str = "float32",
    apply: Apply | None = None,
) -> Generator[Any, Any, Aggregate]:
    """Train a validated selection, weigh and apply what its reporters sent, and build the feedback.

    Parameters
    ----------
    transport : Transport
    selection : Selection
        Validated (:meth:`Selection.validated`).
    theta : Tensor or ndarray, shape (D,)
        w^t.
    round : int
    needs : frozenset of str
        The selector's ``needs`` (``"updates"``, ``"global"``, ``"durations"``,
        ``"sample_losses"``): what the feedback carries (the last two as the reports bring them).
    rule, n_samples, partial_weights
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
    reports = yield from transport.train_chosen(ids)
    reporters = reports.clients
    reported = np.isin(ids, reporters)
    weights = aggregation_weights(selection, reported, rule=rule, n_samples=n_samples,
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


def play_round(
    transport: Transport, oracle: ClientOracle, selector: BaseSelector, n: int, theta: Any, *, round: int,
    n_clients: int, after_aggregate: Callable[[Aggregate], Any] | None = None,
    contain: Callable[[str, Exception, Aggregate | None], bool] | None = None, **aggregation: Any,
) -> Generator[Any, Any, Aggregate | None]:
    """Play round ``round``: select, validate, :func:`conclude_round`, then let the selector learn.

    Parameters
    ----------
    transport : Transport
    oracle : ClientOracle
        What the selector may ask before choosing.
    selector : BaseSelector
        Fitted.
    n : int
        The clients asked for.
    theta : Tensor or ndarray
        w^t.
    round : int
    n_clients : int
        N.
    after_aggregate : callable, optional
        ``after_aggregate(aggregate)``, run after aggregation and before the selector's update
        (the runtime's checks and evaluation): a generator, whose yields pass through, or a
        plain function. Returning False skips the selector's update (a round the runtime drops).
    contain : callable, optional
        ``contain(step, exc, aggregate)``, called when the selector raises in ``step``
        (``"select"``, with ``aggregate`` None, or ``"update"``): True contains the exception
        (a failed ``select`` skips the round: nobody trains and the result is None; a failed
        ``update`` leaves the selector untaught), False lets it propagate. Without it,
        everything propagates (the simulator: a selector's error is the user's to see).
    **aggregation
        ``rule``, ``n_samples``, ``partial_weights``, ``accumulate``, ``apply`` of :func:`conclude_round`.

    Returns
    -------
    Aggregate or None
        None only when ``contain`` contained a failed ``select``.
    """
    name = type(selector).__name__
    try:
        raw = selector.select(n, round=round, oracle=oracle)
    except Exception as exc:
        if contain is None or not contain("select", exc, None):
            raise
        return None
    selection = raw.validated(n_clients, n, variable_size=bool(selector.variable_size), source=name)
    agg = yield from conclude_round(transport, selection, theta, round=round, needs=selector.needs, **aggregation)
    learn: Any = None
    if after_aggregate is not None:
        step = after_aggregate(agg)
        learn = (yield from step) if isinstance(step, Generator) else step
    if learn is not False:
        try:
            selector.update(agg.feedback)
        except Exception as exc:
            if contain is None or not contain("update", exc, agg):
                raise
    return agg
