"""Where every client's loss is measured: index arrays into the one shared data pool.

The engine keeps the federation's data once (``X``, ``y``); each client's loss samples are rows
of it (``loss_indices[k]``), and clients may share rows (duplicated clients, bootstrap splits,
a large federation drawn with replacement). :class:`LossPool` holds only indices: per client
its size and offset into the concatenation ``cat`` of the loss indices in client order, and the
distinct rows of ``cat`` in the order they first occur (``order``). Nothing of size
``sum(n_k) x d`` is ever built.

Evaluating every client (``Engine.client_losses``) is one forward pass over ``order`` in chunks,
then a per-client float64 sum of the per-sample losses in ``cat`` order (``index_add_``, the
reduction the engine has always used). When no row is shared, ``order`` *is* ``cat``: the
chunks, the per-sample losses and the sums are the ones the engine computed before it indexed
the pool, bit for bit. When rows are shared each is evaluated once, and the per-sample losses
are gathered back into ``cat`` order before the same sum.

The forward's input rows are read in place when ``order`` is a contiguous range of the pool;
otherwise they are gathered into one array of ``len(order) <= len(X)`` rows on the first
all-client evaluation (never at start, and never for a run that does not ask every client's
loss): a gather per chunk and round cost about twice the forward itself on FedCor's MLP
(measured on this project's 2-core host), so the gathered rows are kept.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def first_occurrence(cat: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The distinct values of ``cat`` in the order they first occur, and where each entry of ``cat`` is in it.

    Returns ``(order, inverse)`` with ``order[inverse] == cat``; ``inverse`` is None when the
    values are already distinct (``order`` is then ``cat`` itself). O(n log n) for n = ``cat.size``.
    """
    uniq, first, inverse = np.unique(cat, return_index=True, return_inverse=True)
    if uniq.size == cat.size:
        return cat, None
    rank = np.argsort(first, kind="stable")  # unique values ranked by first occurrence
    position = np.empty_like(rank)
    position[rank] = np.arange(rank.size)
    return uniq[rank], position[inverse.reshape(-1)]


class LossPool:
    """The clients' loss samples as indices into the shared pool (see the module docstring).

    Parameters
    ----------
    loss_indices : sequence of ndarray of int
        Client k's loss is the mean over rows ``loss_indices[k]`` of the pool.

    Attributes
    ----------
    sizes : ndarray of int64
        Loss samples per client (n_k).
    offsets : ndarray of int64
        Client k's entries of ``cat`` are ``cat[offsets[k]:offsets[k + 1]]``.
    cat : ndarray of int64
        The loss indices concatenated in client order (``sum(n_k)`` integers).
    order : ndarray of int64
        The distinct rows of ``cat`` in first-occurrence order: the rows one all-client pass
        evaluates.
    inverse : ndarray of int64 or None
        ``order[inverse] == cat``; None when no row is shared.
    """

    def __init__(self, loss_indices: Sequence[np.ndarray]) -> None:
        self.sizes = np.array([len(ix) for ix in loss_indices], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])
        self.cat = np.concatenate([np.asarray(ix, dtype=np.int64).reshape(-1) for ix in loss_indices])
        self.order, self.inverse = first_occurrence(self.cat)
        n = self.order.size
        start = int(self.order[0]) if n else 0
        contiguous = n > 0 and bool(np.array_equal(self.order, np.arange(start, start + n)))
        self._range = (start, start + n) if contiguous else None
        self._rows: tuple[torch.Tensor, torch.Tensor] | None = None
        self._owner: torch.Tensor | None = None
        self._sizes_f64: torch.Tensor | None = None

    @property
    def shared(self) -> bool:
        """Whether some pool row is a loss sample of more than one client (or twice of one)."""
        return self.inverse is not None

    def rows(self, X: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The inputs and targets of ``order``: views of the pool when ``order`` is a range, else gathered once."""
        if self._range is not None:
            a, b = self._range
            return X[a:b], y[a:b]
        if self._rows is None:
            at = torch.from_numpy(self.order).to(X.device)
            self._rows = (X[at], y[at])
        return self._rows

    def subset(self, clients: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """What evaluating ``clients`` (distinct ids) reads: ``(order, inverse, owner)``.

        ``order`` are the distinct pool rows of their loss samples (client after client, first
        occurrence), ``order[inverse]`` (``inverse`` None: ``order`` itself) the samples in client
        order and ``owner`` the position in ``clients`` of each sample's client.
        """
        rows = np.concatenate([self.cat[self.offsets[k] : self.offsets[k + 1]] for k in clients])
        order, inverse = first_occurrence(rows)
        return order, inverse, np.repeat(np.arange(clients.size), self.sizes[clients])

    def reduce(self, per_row: torch.Tensor, acc: torch.device) -> torch.Tensor:
        """Every client's mean loss (float64, on ``acc``) from the per-sample losses of ``order``.

        The sum runs over each client's samples in ``cat`` order (``index_add_`` of float64
        values, as the engine summed before it indexed the pool).
        """
        if self._owner is None:
            self._owner = torch.from_numpy(np.repeat(np.arange(self.sizes.size), self.sizes)).to(acc)
            self._sizes_f64 = torch.from_numpy(self.sizes).to(acc, torch.float64)
        assert self._sizes_f64 is not None
        return segment_means(per_row, self.inverse, self._owner, self._sizes_f64, acc)


def segment_means(
    per_row: torch.Tensor,
    inverse: np.ndarray | None,
    owner: torch.Tensor | np.ndarray,
    sizes: torch.Tensor | np.ndarray,
    acc: torch.device,
) -> torch.Tensor:
    """Per-client means of per-sample losses: ``per_row[inverse]`` summed in float64 by ``owner``, over ``sizes``.

    The values are added in sample order (``index_add_``), so a client's sum is the same
    whichever other clients are evaluated with it.
    """
    values = per_row.to(acc, torch.float64)
    if inverse is not None:
        values = values[torch.from_numpy(inverse).to(acc)]
    # from_numpy, not as_tensor: a tensor made here must not follow a default-device context
    owner_t = (owner if isinstance(owner, torch.Tensor) else torch.from_numpy(owner)).to(acc)
    sizes_t = (sizes if isinstance(sizes, torch.Tensor) else torch.from_numpy(sizes)).to(acc, torch.float64)
    sums = torch.zeros(sizes_t.shape[0], dtype=torch.float64, device=acc).index_add_(0, owner_t, values)
    return sums / sizes_t
