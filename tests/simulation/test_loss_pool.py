"""Clients index one shared data pool: the engine holds no per-client copy of the data (issue 34, item 4)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedselect.simulation._pool import LossPool, first_occurrence
from fedselect.simulation.engine import Engine
from fedselect.simulation.models import FedCorMLP


def _overlapping(n_base=10, per=30, copies=40, shape=(1, 8, 8), seed=0):
    """``n_base * copies`` clients: client k holds base client ``k mod n_base``'s samples (as 10,000 FMNIST clients
    sharing the 60,000 images)."""
    rng = np.random.default_rng(seed)
    n = n_base * per
    X = rng.normal(size=(n, *shape)).astype(np.float32)
    y = rng.integers(0, 10, size=n)
    base = np.split(rng.permutation(n), n_base)
    return X, y, [base[k % n_base] for k in range(n_base * copies)]


def _tensors(obj, seen=None):
    """Every tensor reachable from ``obj``'s attributes (dicts, lists, tuples and objects of this package)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v, seen)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v, seen)
    elif type(obj).__module__.startswith("fedselect") and hasattr(obj, "__dict__"):
        for v in vars(obj).values():
            yield from _tensors(v, seen)


def test_overlapping_clients_hold_no_copy_of_their_data():
    X, y, parts = _overlapping()
    total, d = sum(len(p) for p in parts), int(np.prod(X.shape[1:]))
    torch.manual_seed(0)
    eng = Engine(FedCorMLP((1, 8, 8), 10), X, y, parts, X[:20], y[:20])
    theta = eng.initial_parameters()
    forwarded = []
    forward = eng._forward
    eng._forward = lambda flat, x, bufs=None: forwarded.append(x.shape[0]) or forward(flat, x, bufs)
    eng.client_losses(theta)
    eng.client_losses(theta, np.arange(0, len(parts), 7))
    # each shared sample is evaluated once per pass, by every client and by a subset alike
    assert sum(forwarded) == 2 * X.shape[0], forwarded
    # the largest data the engine may hold is the pool itself (and one gathered copy of its distinct loss rows)
    big = [t.shape for t in _tensors(eng) if t.numel() > X.size]
    assert not big, f"the engine holds arrays larger than the pool ({X.size} values): {big}"
    assert total * d > 10 * X.size  # the federation's clients really overlap: a per-client copy would be caught


def test_losses_of_overlapping_clients_equal_each_clients_own_mean():
    X, y, parts = _overlapping(copies=5)
    torch.manual_seed(0)
    model = FedCorMLP((1, 8, 8), 10)
    eng = Engine(model, X, y, parts, X[:20], y[:20])
    theta = eng.initial_parameters() + 0.05 * torch.randn(eng.n_params)
    got = eng.client_losses(theta)
    torch.nn.utils.vector_to_parameters(theta.clone(), model.parameters())
    model.eval()
    with torch.no_grad():
        want = [float(F.cross_entropy(model(torch.from_numpy(X[p])), torch.from_numpy(y[p]))) for p in parts]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # clients holding the same samples get the same loss, bit for bit (each shared sample is evaluated once)
    n_base = 10
    assert all(got[k] == got[k % n_base] for k in range(len(parts)))
    np.testing.assert_array_equal(eng.client_losses(theta, np.arange(len(parts))), got)


def test_first_occurrence():
    cat = np.array([5, 3, 5, 9, 3, 1])
    order, inverse = first_occurrence(cat)
    np.testing.assert_array_equal(order, [5, 3, 9, 1])
    np.testing.assert_array_equal(order[inverse], cat)
    distinct = np.array([4, 0, 2])
    order, inverse = first_occurrence(distinct)
    assert inverse is None and order is distinct


def test_pool_reads_a_contiguous_range_in_place():
    X = torch.arange(40.0).view(20, 2)
    y = torch.arange(20)
    pool = LossPool([np.arange(4, 9), np.arange(9, 12)])
    xs, _ = pool.rows(X, y)
    assert not pool.shared and xs.data_ptr() == X[4].data_ptr()  # a view: nothing gathered
    shuffled = LossPool([np.array([3, 1]), np.array([1, 7])])
    xs, ys = shuffled.rows(X, y)
    assert shuffled.shared and ys.tolist() == [3, 1, 7]
