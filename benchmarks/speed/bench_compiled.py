"""Local training per round, eager vs compiled (``Engine(path="compiled")``), against the compute bound.

The FedCor FMNIST 2SPC setting's local training (``fedselect reproduce fedcor-fmnist-2spc``): 5 clients x
3 local epochs of batch 64 on 480 samples each, FedCor's MLP 784-64-30-10 with dropout 0.5, lr 0.005,
weight decay 1e-4. S = 1: :meth:`Engine.train` of one round, what ``FederatedTrainer.fit`` runs;
S = ``--runs``: :meth:`Engine.train_runs` of that many runs' rounds at once (batched seeds). The data are
random (the time does not depend on the values); one torch thread.

The two engines are timed round by round, interleaved (the order alternates), on the same minibatches;
medians after the warm-up rounds. The compiled engine's first call (tracing and compiling its graph) is
reported separately as compile time, with the number of graphs torch compiled and whether any was
compiled again during the measured rounds.

The bound is :mod:`benchmarks.speed.bench_grid`'s: ``3 f`` FLOP per sample of a local SGD step (``f``: one
sample's forward matrix products, :func:`~benchmarks.speed.bench_grid.forward_flop` of the preset) at
the throughput of a 2048 x 2048 float32 matrix product on one thread, measured in this run.

Usage::

    python -m benchmarks.speed.bench_compiled [--rounds 30] [--runs 10] [--warmup 2] [--profile 5 [--name-kernels]]

``--profile N`` then profiles N more rounds of S = ``--runs`` on each path (``torch.profiler``, CPU) and
prints where the distance to the bound goes: the matrix products (``mm``/``bmm``/``baddbmm``/``addmm``, their
achieved GFLOP/s against the 2048^3 product's), inductor's fused kernels (compiled) or the element-wise ops
(eager), the dropout draws, index/gather, other ops, and the time outside any op (Python, dispatch, the
graph's call), each as a share of the round and as a multiple of the bound. Inductor's kernels are not
aten ops: they count as time outside any op unless ``--name-kernels`` wraps each in a ``record_function``
(set before compiling), which slows the compiled round and inflates the times around them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np
import torch
from torch._dynamo.utils import counters

from benchmarks.speed.bench_engine import cpu_model, med
from benchmarks.speed.bench_grid import forward_flop, matmul_gflops
from fedselect.simulation.engine import Engine, LocalSchedule
from fedselect.simulation.models import FedCorMLP

PRESET = "fedcor-fmnist-2spc"
PER_CLIENT, CLIENTS, EPOCHS, BATCH, LR, WD, DROPOUT = 480, 5, 3, 64, 0.005, 1e-4, 0.5


def _round(eng: Engine, theta: torch.Tensor, batches: list, rnd: int) -> float:
    """Seconds of one round's local training of ``len(batches)`` runs (``train`` for one run)."""
    start = time.perf_counter()
    if len(batches) == 1:
        eng.train(theta, batches[0], lr=LR, weight_decay=WD, dropout_seed=rnd)
    else:
        runs = len(batches)
        eng.train_runs(
            [theta] * runs, batches, lrs=[LR] * runs, dropout_seeds=list(range(rnd, rnd + runs)), weight_decay=WD
        )
    return time.perf_counter() - start


_KINDS = (
    ("matrix products", ("aten::mm", "aten::bmm", "aten::baddbmm", "aten::addmm", "aten::addbmm")),
    ("dropout draws", ("aten::uniform_", "aten::rand", "aten::bernoulli_", "aten::bernoulli")),
    ("index / gather", ("aten::index", "aten::index_select", "aten::gather", "aten::take", "aten::embedding")),
)


def _kind(name: str) -> str:
    for kind, ops in _KINDS:
        if name in ops:
            return kind
    if name.startswith(("cpp_fused", "kernel_cpp", "triton_", "graph_")) or "CompiledFxGraph" in name:
        return "inductor fused kernels"
    if name.startswith("aten::"):
        return "other aten ops (element-wise, reductions, copies)"
    return "other"


def _profile(eng: Engine, theta: torch.Tensor, batches_of: list, rounds: int, bound: float, gflops: float) -> None:
    """Print where one path's round goes (see the module docstring, ``--profile``)."""
    from torch.profiler import ProfilerActivity, profile

    walls = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for rnd in range(rounds):
            walls.append(_round(eng, theta, batches_of[rnd % len(batches_of)], rnd))
    wall = sum(walls) / rounds
    shares: dict[str, float] = {}
    for evt in prof.key_averages():
        if evt.key.startswith(("ProfilerStep", "Torch-Compiled Region", "## ")):
            continue  # wrappers: their children are counted
        kind = _kind(evt.key)
        shares[kind] = shares.get(kind, 0.0) + evt.self_cpu_time_total / 1e6 / rounds
    inside = sum(shares.values())
    shares["outside any aten op (Python, dispatch; inductor kernels unless named)"] = max(wall - inside, 0.0)
    print(f"  {eng.path}: {wall * 1e3:.1f} ms per round under the profiler ({wall / bound:.2f}x bound)")
    mm = shares.get("matrix products", 0.0)
    for kind, sec in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"    {kind:68s} {sec * 1e3:8.1f} ms  {sec / wall:6.1%}  {sec / bound:5.2f}x bound")
    if mm > 0:
        print(f"    the matrix products do the bound's FLOP at {gflops * bound / mm:.1f} GFLOP/s "
              f"({bound / mm:.0%} of the 2048^3 product's {gflops:.1f}): {mm / bound:.2f}x bound by themselves")


def _load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30, help="measured rounds for S = 1 (a third of them for S = runs)")
    ap.add_argument("--runs", type=int, default=10, help="runs trained at once in the batched case")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up rounds per S, not counted")
    ap.add_argument("--profile", type=int, default=0, help="then profile this many rounds of S = runs per path")
    ap.add_argument("--name-kernels", action="store_true", help="name inductor's fused kernels in the profile "
                    "(instrumented: slows the compiled round; without it they count as time outside any aten op)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.profile and args.name_kernels:  # a record_function around each inductor C++ kernel, set before compiling
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"command: python -m benchmarks.speed.bench_compiled {' '.join(sys.argv[1:])}".rstrip())
    print(f"code: working tree on {head or '?'}; torch {torch.__version__}, 1 thread; {cpu_model()}")
    print(f"load average before: {_load()}")
    gflops = matmul_gflops(threads=1)
    flop = forward_flop(PRESET)
    print(
        f"bound: {3 * flop:,} FLOP per sample step (3 x forward {flop:,}) at {gflops:.1f} GFLOP/s (2048^3 mm, 1 thread)"
    )
    rng = np.random.default_rng(0)
    n_clients = CLIENTS * args.runs
    X = rng.normal(size=(n_clients * PER_CLIENT, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, size=n_clients * PER_CLIENT)
    parts = [np.arange(i * PER_CLIENT, (i + 1) * PER_CLIENT) for i in range(n_clients)]
    torch.manual_seed(0)
    model = FedCorMLP((1, 28, 28), 10, dropout=DROPOUT)
    engines = {path: Engine(model, X, y, parts, X[:100], y[:100], path=path) for path in ("eager", "compiled")}
    theta = engines["eager"].initial_parameters()
    schedule = LocalSchedule(BATCH, epochs=EPOCHS)
    for runs, rounds in ((1, args.rounds), (args.runs, max(args.rounds // 3, 3))):
        batches_of = [
            [
                engines["eager"].client_batches(parts, schedule, r, rnd, range(CLIENTS * r, CLIENTS * r + CLIENTS))
                for r in range(runs)
            ]
            for rnd in range(rounds + args.warmup)
        ]
        graphs0 = counters["stats"]["unique_graphs"]
        first = _round(engines["compiled"], theta, batches_of[0], 0)
        graphs1 = counters["stats"]["unique_graphs"]
        eager_first = _round(engines["eager"], theta, batches_of[0], 0)
        times: dict[str, list[float]] = {"eager": [], "compiled": []}
        for rnd in range(1, rounds + args.warmup):
            for path in ("eager", "compiled") if rnd % 2 else ("compiled", "eager"):
                t = _round(engines[path], theta, batches_of[rnd], rnd)
                if rnd >= args.warmup:
                    times[path].append(t)
        graphs2 = counters["stats"]["unique_graphs"]
        samples = sum(len(x) for run in batches_of[0] for client in run for x in client)
        bound = 3 * flop * samples / (gflops * 1e9)
        e, c = med(times["eager"]), med(times["compiled"])
        print(
            f"S = {runs:2d} ({CLIENTS * runs} clients, {samples} sample steps/round, {rounds} rounds): "
            f"bound {bound * 1e3:6.1f} ms | eager {e * 1e3:7.1f} ms ({e / bound:.2f}x bound) | "
            f"compiled {c * 1e3:7.1f} ms ({c / bound:.2f}x bound) | eager / compiled {e / c:.2f}"
        )
        print(
            f"        first compiled call {first:.1f} s (eager's first {eager_first * 1e3:.0f} ms): "
            f"{graphs1 - graphs0} graph(s) compiled there, {graphs2 - graphs1} during the measured rounds"
        )
        if args.profile and runs > 1:
            print(f"profile of S = {runs} ({args.profile} rounds per path, torch.profiler, CPU):")
            for path in ("compiled", "eager"):
                _profile(engines[path], theta, batches_of, args.profile, bound, gflops)
    print(f"load average after: {_load()}")


if __name__ == "__main__":
    main()
