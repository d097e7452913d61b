"""One round of federated training, played against a transport.

select -> validate -> train the chosen clients -> reporters -> weights -> apply -> RoundFeedback
-> update, written once. A *transport* is what carries the round to clients: the simulator's
engine (:class:`fedselect.simulation.trainer.SimulationOracle`, which answers by yielding
:class:`~fedselect.simulation.trainer.TrainingRequest` so that
:func:`fedselect.simulation.batched.fit_runs` can batch several runs) or the synthetic test
oracle (:class:`fedselect.testing.SyntheticOracle`). The round is a generator: whatever the
transport yields (a request to run) passes through to the caller, whose reply is sent back in.
Aggregation itself is :mod:`fedselect.aggregation`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from .aggregation import aggregation_weights, apply_deltas
from .selection import BaseSelector, ClientOracle, RoundFeedback, Selection

__all__ = ["Aggregate", "Reports", "Transport", "conclude_round", "play_round"]


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
    """

    clients: np.ndarray
    updates: Any
    losses: np.ndarray
    n_samples: np.ndarray


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
    theta : Tensor or ndarray
        w^{t+1} (w^t when nobody reported).
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


def conclude_round(
    transport: Transport, selection: Selection, theta: Any, *, round: int, needs: frozenset[str] = frozenset(),
    rule: str = "data-size", n_samples: Any = None, partial_weights: str = "rescale", accumulate: str = "float32",
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
        The selector's ``needs`` (``"updates"``, ``"global"``): what the feedback carries.
    rule, n_samples, partial_weights
        As :func:`fedselect.aggregation.aggregation_weights`.
    accumulate : {"float32", "float64"}
        As :func:`fedselect.aggregation.apply_deltas`.

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
        new_theta = apply_deltas(theta, reports.updates, weights[reported], accumulate=accumulate)
        buffers = transport.aggregate_buffers(reporters, weights[reported])
    feedback = RoundFeedback(
        round=round,
        clients=reporters,
        weights=np.asarray(weights[reported], dtype=np.float64),
        losses=reports.losses,
        n_samples=reports.n_samples,
        updates=_numpy(reports.updates) if "updates" in needs else None,
        global_before=_numpy(theta) if "global" in needs else None,
        global_after=_numpy(new_theta) if "global" in needs else None,
    )
    return Aggregate(selection, weights, reported, new_theta, buffers, feedback)


def play_round(
    transport: Transport, oracle: ClientOracle, selector: BaseSelector, n: int, theta: Any, *, round: int,
    n_clients: int, after_aggregate: Callable[[Aggregate], Generator[Any, Any, None]] | None = None,
    **aggregation: Any,
) -> Generator[Any, Any, Aggregate]:
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
        ``after_aggregate(aggregate)``, a generator run after aggregation and before the
        selector's update (the runtime's checks and evaluation); what it yields passes through.
    **aggregation
        ``rule``, ``n_samples``, ``partial_weights``, ``accumulate`` of :func:`conclude_round`.

    Returns
    -------
    Aggregate
    """
    name = type(selector).__name__
    raw = selector.select(n, round=round, oracle=oracle)
    selection = raw.validated(n_clients, n, variable_size=bool(selector.variable_size), source=name)
    agg = yield from conclude_round(transport, selection, theta, round=round, needs=selector.needs, **aggregation)
    if after_aggregate is not None:
        yield from after_aggregate(agg)
    selector.update(agg.feedback)
    return agg
