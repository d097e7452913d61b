"""How a round combines what its clients reported: one implementation for every runtime.

The simulator (:class:`fedselect.FederatedTrainer`), the Flower server
(:class:`fedselect.flower.SelectorStrategy`) and the synthetic test oracle
(:class:`fedselect.testing.SyntheticOracle`) all aggregate through these functions, so the
worlds agree by construction, to the last bit:

- :func:`aggregation_weights`: the weight each chosen client's delta receives (a selection's
  own weights, or the runtime's rule ``"data-size"`` / ``"mean"``), given who reported;
- :func:`apply_deltas`: ``w^{t+1} = w^t + sum_k a_k delta_k`` in float32 torch arithmetic;
- :func:`average_buffer_deltas`: the buffers' (batch norm statistics') weighted mean, from the
  clients' differences ``b_k - b^t`` (:func:`average_buffer_arrays`: the same on numpy arrays,
  as a Flower server holds them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import torch

from ._validation import renamed
from .ledger import PARTIAL_WEIGHTS, reporter_weights
from .selection import Selection

__all__ = [
    "RULES",
    "aggregation_weights",
    "all_finite",
    "apply_deltas",
    "average_buffer_arrays",
    "average_buffer_deltas",
    "finite_rows",
]

#: The rules a runtime applies to a selection that carries no weights.
RULES = ("data-size", "mean")

_Vector = TypeVar("_Vector", np.ndarray, torch.Tensor)


def aggregation_weights(selection: Selection, reported: Any = None, *, aggregation: str = "data-size",
                        n_samples: Any = None, partial_weights: str = "rescale", rule: str | None = None) -> np.ndarray:
    """The aggregation weight of each client of a validated selection (0 for those that did not report).

    Weights the selection carries are applied as given (unnormalised, so unbiased estimators
    stay unbiased), the reporters' rescaled or not by ``partial_weights`` when some chosen
    clients failed (:func:`fedselect.ledger.reporter_weights`). Without weights, the rule
    (``aggregation``, the trainer's and the strategy's parameter of that name):
    ``"data-size"`` weighs client k by ``counts_k * n_k`` (FedAvg), ``"mean"`` by ``counts_k``
    (FedCor's Eq. 4), normalised over the clients that reported; ``counts`` are the
    multiplicities of duplicated draws (1 without duplicates).

    Parameters
    ----------
    selection : Selection
        Validated (:meth:`Selection.validated`): distinct clients, merged counts and weights.
    reported : array-like of bool, shape (len(selection),), optional
        Which chosen clients reported; default everyone.
    aggregation : {"data-size", "mean"}
    n_samples : array-like of int, shape (N,)
        n_k of every client of the federation, indexed by client id (needed by ``"data-size"``).
    partial_weights : {"rescale", "as-given"}
    rule : {"data-size", "mean"}, optional
        Deprecated name of ``aggregation`` (warns).

    Returns
    -------
    ndarray of float64, shape (len(selection),)
    """
    aggregation = renamed("aggregation_weights", "rule", rule, "aggregation", aggregation)
    k = len(selection)
    ok = np.ones(k, dtype=bool) if reported is None else np.asarray(reported, dtype=bool)
    if selection.weights is not None:
        out = np.zeros(k)
        out[ok] = reporter_weights(selection.weights, ok, mode=partial_weights)
        return out
    if partial_weights not in PARTIAL_WEIGHTS:
        raise ValueError(f"aggregation_weights: partial_weights={partial_weights!r} must be one of {PARTIAL_WEIGHTS}")
    counts = selection.counts if selection.counts is not None else np.ones(k)
    if aggregation == "mean":
        w = counts * ok
    elif aggregation == "data-size":
        if n_samples is None:
            raise ValueError("aggregation_weights: aggregation='data-size' needs n_samples")
        w = counts * np.asarray(n_samples)[selection.clients] * ok
    else:
        raise ValueError(f"aggregation_weights: aggregation={aggregation!r} must be one of {RULES}")
    total = w.sum()
    return w / total if total > 0 else w


def finite_rows(updates: torch.Tensor) -> torch.Tensor:
    """Whether each row of a 2-D tensor is finite everywhere (a bool tensor, one entry per row).

    Exact, and fast when every row is: a row whose sum is finite has no NaN or infinite entry (an
    infinite term makes every partial sum after it infinite or NaN, and NaN stays NaN), so the
    row sums (one pass, about 40x faster than ``torch.isfinite`` on the CPU) settle the usual case;
    when some sum is not finite (a non-finite entry, or finite entries whose sum overflows), the
    entries themselves decide.
    """
    ok = torch.isfinite(updates.sum(dim=1))
    return ok if bool(ok.all()) else torch.isfinite(updates).all(dim=1)


def all_finite(values: torch.Tensor) -> bool:
    """Whether every entry of ``values`` is finite (:func:`finite_rows`' shortcut, on the whole tensor)."""
    return bool(torch.isfinite(values.sum())) or bool(torch.isfinite(values).all())


def apply_deltas(theta: _Vector, deltas: Any, weights: Any, *, accumulate: str = "float32") -> _Vector:
    """``theta + sum_k weights[k] * deltas[k]``, in float32 torch arithmetic by default.

    Parameters
    ----------
    theta : Tensor or ndarray, shape (D,)
        w^t; the result has its type (a float32 array for an array).
    deltas : Tensor or array-like, shape (C, D)
        The reporters' updates w_k - w^t.
    weights : array-like of float, shape (C,)
        Their aggregation weights (cast to float32 first).
    accumulate : {"float32", "float64"}
        ``"float32"``: the simulator's and the Flower server's arithmetic. ``"float64"``: the
        synthetic test oracle's (numpy arrays only), ``theta`` and ``weights @ deltas`` in float64,
        then rounded to float32 once; its recorded selections depend on it.

    Returns
    -------
    Tensor or ndarray, shape (D,)
    """
    if accumulate == "float64":
        if isinstance(theta, torch.Tensor):
            raise TypeError("apply_deltas: accumulate='float64' takes numpy arrays")
        w64 = np.asarray(weights, dtype=np.float64)
        return (np.asarray(theta, dtype=np.float64) + w64 @ np.asarray(deltas, dtype=np.float64)).astype(np.float32)
    if accumulate != "float32":
        raise ValueError(f"apply_deltas: accumulate={accumulate!r} must be 'float32' or 'float64'")
    as_array = not isinstance(theta, torch.Tensor)
    t = torch.from_numpy(np.ascontiguousarray(theta, dtype=np.float32)) if as_array else theta
    d = deltas if isinstance(deltas, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(deltas, dtype=np.float32))
    w = torch.from_numpy(np.asarray(weights, dtype=np.float32))
    out = t + (w.unsqueeze(1) * d).sum(0)
    return out.numpy() if as_array else out  # type: ignore[return-value]


def average_buffer_deltas(buffers: Mapping[str, torch.Tensor], differences: Mapping[str, torch.Tensor],
                          weights: Any) -> dict[str, torch.Tensor]:
    """The global buffers after a round, from the reporting clients' differences ``b_k - b^t``.

    With a_k the weights the round aggregates parameters with,

    .. math:: b^{t+1} = b^t + \\sum_k \\tilde a_k (b_k - b^t), \\qquad \\tilde a_k = a_k / \\sum_j a_j,

    in the buffer's dtype for floating-point buffers, ``b^t + round(sum_k ...)`` (in float64)
    for integer ones (``num_batches_tracked``), and ``b^t`` for boolean ones (masks, for which
    ``differences`` need not hold an entry). All-zero (or no) weights leave the buffers unchanged.
    The simulator passes the differences of its clients' buffers
    (:func:`fedselect.simulation.engine.aggregate_buffers`), the Flower server those its
    clients report: the operations are the same, hence the same bits.

    Parameters
    ----------
    buffers : dict of str to Tensor
        The global buffers b^t.
    differences : dict of str to Tensor
        Each non-boolean buffer's differences stacked over the reporting clients, shape ``(C, *b.shape)``.
    weights : array-like of float, shape (C,)
        The clients' aggregation weights (non-negative).

    Returns
    -------
    dict of str to Tensor
    """
    w = torch.as_tensor(np.asarray(weights, dtype=np.float64))
    total = float(w.sum()) if w.numel() else 0.0
    if not buffers or total <= 0:
        return dict(buffers)
    w = w / total
    out: dict[str, torch.Tensor] = {}
    for name, b in buffers.items():
        shape = (-1,) + (1,) * b.dim()
        if b.dtype == torch.bool:  # a mask: no mean exists; the global one stays
            out[name] = b
            continue
        d = differences[name]
        if b.is_floating_point():
            out[name] = b + (w.to(b.dtype).view(shape) * d.to(b.dtype)).sum(0)
        else:
            out[name] = b + torch.round((w.view(shape) * d.double()).sum(0)).to(b.dtype)
    return out


def average_buffer_arrays(buffers: Mapping[str, np.ndarray], deltas: Sequence[Mapping[str, np.ndarray]],
                          weights: Any) -> dict[str, np.ndarray]:
    """:func:`average_buffer_deltas` on numpy arrays, with each client's differences as one mapping.

    What a Flower server holds: the global buffers b^t and, per reporting client, the
    differences ``b_k - b^t`` it reported (boolean buffers need no entry). The arithmetic is
    :func:`average_buffer_deltas`' (torch, in each buffer's dtype), so the result is the
    simulator's to the last bit.

    Parameters
    ----------
    buffers : dict of str to ndarray
        The global buffers b^t.
    deltas : sequence of dict of str to ndarray
        One mapping per reporting client: each non-boolean buffer's difference ``b_k - b^t``.
    weights : array-like of float, shape (len(deltas),)
        The clients' aggregation weights (non-negative).

    Returns
    -------
    dict of str to ndarray
        The buffers after the round (``buffers`` unchanged when ``deltas`` is empty).
    """
    if not len(deltas):
        return dict(buffers)
    b = {name: torch.as_tensor(np.array(value)) for name, value in buffers.items()}
    d = {name: torch.as_tensor(np.stack([np.asarray(x[name]) for x in deltas]))
         for name, value in b.items() if value.dtype != torch.bool}
    return {name: value.numpy() for name, value in average_buffer_deltas(b, d, weights).items()}
