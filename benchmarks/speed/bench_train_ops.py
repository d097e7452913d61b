"""Where one round's local training goes, operation by operation, beside its matrix arithmetic.

``bench_profile.py`` splits a round into phases; this script opens the largest one, the
chosen clients' local training (:meth:`fedselect.simulation.engine.Engine.train`), with
:mod:`torch.profiler` and groups the CPU time of its operations:

* ``matrix products``: ``bmm`` / ``baddbmm`` (the arithmetic the compute bound counts),
* ``dropout masks``: ``bernoulli_`` (drawn from torch's generator exactly as ``F.dropout``
  draws them, so that runs are reproducible bit for bit),
* ``element-wise``: the SGD update, weight decay, masks and activations (``mul``, ``add_``,
  ``sub_``, ``div_``, ``threshold_backward``, ``relu``, ...),
* ``gathers``: the minibatches gathered from the training pool (``index_select``, ``index``),
* ``softmax``: ``_log_softmax`` and its backward,
* ``other``: everything else (copies, views, scatters, allocation).

Beside it: the round's matrix arithmetic (forward, weight gradients and the hidden layers'
input gradients, counted from the layer shapes), the rate the matrix products ran at, and a
large float32 matrix product's rate measured in the same run. The setting is FedCor's FMNIST
2SPC round (C = 5 clients of 480 training samples, 3 epochs of batch 64, FedCor's MLP with
dropout 0.5, weight decay 1e-4) and, with ``--clients 10``, the 1SPC round; the data are
random (the time does not depend on the values), one torch thread.

Usage::

    python -m benchmarks.speed.bench_train_ops [--clients 5] [--calls 10]
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from collections import defaultdict

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from fedselect.simulation.engine import Engine, LocalSchedule
from fedselect.simulation.models import FedCorMLP

GROUPS = {
    "matrix products": ("aten::bmm", "aten::baddbmm", "aten::mm", "aten::addmm"),
    "dropout masks": ("aten::bernoulli_",),
    "element-wise": (
        "aten::mul",
        "aten::mul_",
        "aten::add_",
        "aten::add",
        "aten::sub_",
        "aten::sub",
        "aten::div_",
        "aten::div",
        "aten::threshold_backward",
        "aten::relu",
        "aten::clamp_min",
        "aten::neg",
    ),
    "gathers": ("aten::index_select", "aten::index"),
    "softmax": ("aten::_log_softmax", "aten::_log_softmax_backward_data"),
}


def _matmul_gflops(n: int = 1024, reps: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    times = []
    for _ in range(reps):
        start = time.process_time()
        a @ b
        times.append(time.process_time() - start)
    return 2 * n**3 / sorted(times)[reps // 2] / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=5, help="clients trained in the round (2SPC: 5, 1SPC: 10)")
    ap.add_argument("--calls", type=int, default=10, help="rounds profiled")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"load average before: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rng = np.random.default_rng(0)
    n_clients, per = 100, 600
    X = rng.normal(size=(n_clients * per, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, n_clients * per)
    parts = np.split(rng.permutation(n_clients * per), n_clients)
    train_parts = [p[: int(0.8 * per)] for p in parts]
    torch.manual_seed(0)
    model = FedCorMLP((1, 28, 28), 10, dropout=0.5)
    eng = Engine(model, X, y, parts, X[:100], y[:100])
    theta = eng.initial_parameters()
    batches = eng.client_batches(train_parts, LocalSchedule(64, epochs=3), 0, 1, list(range(args.clients)))
    eng.train(theta, batches, lr=0.005, weight_decay=1e-4, dropout_seed=1)  # warm up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.calls):
            eng.train(theta, batches, lr=0.005, weight_decay=1e-4, dropout_seed=1)
    spent: dict[str, float] = defaultdict(float)
    total = 0.0
    for ev in prof.key_averages():
        total += ev.self_cpu_time_total
        group = next((g for g, names in GROUPS.items() if ev.key in names), "other")
        spent[group] += ev.self_cpu_time_total
    per_call = total / args.calls / 1e3  # ms
    # arithmetic: forward 2 * in * out per sample and layer, weight gradient as much again, input gradient
    # for every layer but the first
    widths = [784, 64, 30, 10]
    samples = sum(len(b) for bs in batches for b in bs)
    fwd = sum(2 * a * b for a, b in itertools.pairwise(widths))
    flop = samples * (2 * fwd + (fwd - 2 * widths[0] * widths[1]))
    rate = flop / (spent["matrix products"] / args.calls / 1e6) / 1e9
    big = _matmul_gflops()
    print(
        f"FedCor FMNIST round: {args.clients} clients x 3 epochs of batch 64 on 480 samples, FedCor's MLP "
        f"(dropout 0.5); {samples} sample gradients, {flop / 1e9:.2f} GFLOP of matrix products per round"
    )
    print(f"profiled: {args.calls} rounds, {per_call:.1f} ms CPU per round (under the profiler)")
    print(f"{'group':18s} {'ms/round':>9s} {'share':>7s}")
    for group in (*GROUPS, "other"):
        ms = spent[group] / args.calls / 1e3
        print(f"{group:18s} {ms:9.1f} {ms / per_call:7.1%}")
    print(
        f"matrix products ran at {rate:.1f} GFLOP/s; a 1024^3 float32 matmul at {big:.1f} GFLOP/s on this "
        f"thread; the round's arithmetic at that rate: {flop / big / 1e6:.1f} ms, "
        f"so training runs at {per_call / (flop / big / 1e6):.2f}x its bound"
    )
    print(f"load average after: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
