"""What a client\'s local training is (:class:`LocalSchedule`) and what it gives back (:class:`LocalTraining`,
:func:`aggregate_buffers`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...aggregation import average_buffer_deltas

__all__ = ["LocalSchedule", "LocalTraining", "aggregate_buffers"]


def aggregate_buffers(
    buffers: Mapping[str, torch.Tensor], client_buffers: Mapping[str, torch.Tensor], weights: Any
) -> dict[str, torch.Tensor]:
    """The global buffers after a round: the weighted mean of the reporting clients' buffers.

    With b the global buffer (e.g. a batch norm running mean or variance), b_k client k's
    after its local training and a_k the weights the round aggregates parameters with,

    .. math:: b^{t+1} = b^t + \\sum_k \\tilde a_k (b_k - b^t), \\qquad \\tilde a_k = a_k / \\sum_j a_j,

    i.e. the a-weighted mean of the b_k (FedAvg of buffers, as most federated code does;
    batch norm statistics are not kept local as in FedBN). The weights are normalised so a
    variance stays a convex combination of variances even when a selection carries
    unnormalised weights; the trainer's own rules already sum to 1, so then the buffers
    follow exactly the parameters' rule. Written as a delta, a buffer that no client changed
    stays bit for bit unchanged. Integer buffers (``num_batches_tracked``) get the rounded
    weighted mean of the clients' counts; boolean buffers (masks) keep the global value.
    All-zero weights leave the buffers unchanged. The arithmetic is
    :func:`fedselect.aggregation.average_buffer_deltas` on the differences ``b_k - b^t``, the
    one the Flower server applies to the differences its clients report.

    Parameters
    ----------
    buffers : dict of str to Tensor
        The global buffers b^t.
    client_buffers : dict of str to Tensor
        Each buffer stacked over the reporting clients, shape ``(C, *b.shape)``.
    weights : array-like of float, shape (C,)
        The clients' aggregation weights (non-negative).

    Returns
    -------
    dict of str to Tensor
    """
    differences = {name: client_buffers[name] - b.unsqueeze(0) for name, b in buffers.items() if b.dtype != torch.bool}
    return average_buffer_deltas(buffers, differences, weights)


@dataclass(frozen=True)
class LocalSchedule:
    """How a client trains locally.

    Exactly one of ``steps`` and ``epochs`` is set. ``steps``: that many SGD steps of
    ``min(batch_size, n_k)`` samples, cycling through freshly shuffled passes over the
    client's data. ``epochs``: that many shuffled passes of ``ceil(n_k / batch_size)``
    steps each, the last batch of a pass partial (as a PyTorch DataLoader with
    ``shuffle=True, drop_last=False`` does).
    """

    batch_size: int
    steps: int | None = None
    epochs: int | None = None

    def __post_init__(self) -> None:
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("LocalSchedule: set exactly one of steps and epochs")
        if self.batch_size < 1:
            raise ValueError(f"LocalSchedule: batch_size={self.batch_size} must be >= 1")
        n = self.steps if self.steps is not None else self.epochs
        if n is None or n < 1:
            raise ValueError(f"LocalSchedule: steps/epochs must be >= 1, got {n}")

    def n_steps(self, n_k: int) -> int:
        if self.steps is not None:
            return self.steps
        assert self.epochs is not None
        return self.epochs * math.ceil(n_k / self.batch_size)

    def batches(self, indices: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        """The minibatches (arrays of sample indices) one client trains on."""
        n_k = indices.shape[0]
        b = self.batch_size
        if self.epochs is not None:
            out: list[np.ndarray] = []
            for _ in range(self.epochs):
                perm = indices[rng.permutation(n_k)]
                out.extend(perm[i : i + b] for i in range(0, n_k, b))
            return out
        assert self.steps is not None
        b = min(b, n_k)
        passes = math.ceil(self.steps * b / n_k)
        stream = np.concatenate([indices[rng.permutation(n_k)] for _ in range(passes)])
        return [stream[i * b : (i + 1) * b] for i in range(self.steps)]


@dataclass(frozen=True)
class LocalTraining:
    """One run's part of :meth:`Engine.train_many`: what its chosen clients' local training produced.

    Attributes
    ----------
    deltas : Tensor, shape (C, D)
        Each client's local update w_k - w^t (on the CPU).
    buffers : dict of str to Tensor, each of shape (C, ...)
        Each client's buffers after its local training (the run's starting buffers, stacked, for a
        model without batch statistics; empty for a model without buffers).
    sample_loss_sq : ndarray of float64, shape (C,), or None
        Each client's mean squared per-sample training loss, when asked for (``sample_losses``).
    """

    deltas: torch.Tensor
    buffers: dict[str, torch.Tensor]
    sample_loss_sq: np.ndarray | None = None
