"""Time FedCor's GP: one full fit (1000 Adam steps) and one selection of C = 10, for N up to 100,000.

Synthetic loss-change vectors from a known low-rank (8 groups) plus diagonal covariance,
``--vectors`` of them in the objective (the paper's warm-up uses 11). Each fit runs with both
``gp_solver`` values on every device asked for (default: the CPU, and CUDA where torch sees a
GPU: FedCor's ``gp_device``), and each row's fit time is divided by the CPU's for the same N and
solver, measured in the same run: where that ratio is below 1 the GP is faster there. The header
counts the aten operations of one Adam step, views left out (on a GPU about one kernel launch
each, which bounds a small fit's step from below). Prints a table and writes it to
``benchmarks/speed/bench_fedcor_gp.txt``. Goals: N = 100, fit < 2.5 s and selection < 5 ms;
N = 100,000, fit + selection < 2 min.

    python -m benchmarks.speed.bench_fedcor_gp            # N = 100, 1,000, 10,000, 100,000
    python -m benchmarks.speed.bench_fedcor_gp --quick    # N = 100, 1,000
    python -m benchmarks.speed.bench_fedcor_gp --device cpu --device cuda --output $OUT/gp.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fedselect.selectors import _gp
from fedselect.simulation.engine import resolve_device


def synthetic_vectors(n_clients: int, n_vectors: int, rng: np.random.Generator) -> np.ndarray:
    groups = rng.integers(0, 8, n_clients)
    loadings = 0.2 * rng.uniform(0.5, 1.5, n_clients)
    factors = rng.normal(size=(n_vectors, 8))
    return -(factors[:, groups] * loadings) + 0.01 * rng.normal(size=(n_vectors, n_clients))


def bench(n_clients: int, *, iterations: int, n_vectors: int, rank: int, n_select: int, device: str,
          solver: str) -> dict:
    rng = np.random.default_rng(0)
    values = synthetic_vectors(n_clients, n_vectors, rng)
    weights = 0.9 ** np.arange(n_vectors)[::-1]
    gp = _gp.LossChangeGP(n_clients, rank, 0.01, generator=torch.Generator().manual_seed(0),
                          device=torch.device(device))
    gp.fit(values, weights, iterations=2, lr=0.01, solver=solver)  # first-call overheads (lazy imports, allocator)
    # fit() reads its final objective back to the host, so its seconds include every queued kernel
    result = gp.fit(values, weights, iterations=iterations, lr=0.01, solver=solver)
    p = np.full(n_clients, 1.0 / n_clients)
    alpha = np.ones(n_clients)
    x = gp.embeddings  # Algorithm 1 runs in numpy on the host, wherever the GP lives
    _gp.greedy_select(x, 0.01, p, alpha, n_select)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        _gp.greedy_select(x, 0.01, p, alpha, n_select)
        times.append(time.perf_counter() - start)
    return dict(
        n=n_clients,
        fit_s=result.seconds,
        step_ms=1000 * result.seconds / iterations,
        select_ms=1000 * min(times),
        threads=(_gp.threads_for(n_clients) or torch.get_num_threads()) if device == "cpu" else "-",
    )


class _CountOps(TorchDispatchMode):
    """Counts the aten operations that run, views left out (they move no data: on a GPU each counted op launches
    at least one kernel, save the few a fused kernel or a host-side shortcut serves)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not getattr(func, "is_view", False)
        return func(*args, **(kwargs or {}))


def ops_per_step(solver: str, *, n_clients: int = 100, n_vectors: int = 11, rank: int = 15) -> int:
    """The aten operations of one Adam step (a 4-step fit minus a 1-step fit, so the fit's set-up cancels)."""
    values = synthetic_vectors(n_clients, n_vectors, np.random.default_rng(0))
    weights = 0.9 ** np.arange(n_vectors)[::-1]
    counts = []
    for steps in (1, 4):
        gp = _gp.LossChangeGP(n_clients, rank, 0.01, generator=torch.Generator().manual_seed(0))
        with _CountOps() as mode:
            gp.fit(values, weights, iterations=steps, lr=0.01, solver=solver)
        counts.append(mode.count)
    return (counts[1] - counts[0]) // 3


def devices(asked: list[str] | None) -> list[str]:
    """The devices to time: those asked for, else the CPU and each kind of GPU torch sees that has float64."""
    if asked:
        for d in asked:
            resolve_device(d)  # a clear error for a device this machine lacks
        return asked
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def device_name(device: str) -> str:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(resolve_device(device))
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only N = 100 and 1,000")
    parser.add_argument("--iterations", type=int, default=1000, help="Adam steps per fit (default 1000)")
    parser.add_argument("--vectors", type=int, default=11, help="loss-change vectors in the objective (default 11)")
    parser.add_argument("--rank", type=int, default=15, help="embedding dimension d (default 15)")
    parser.add_argument("--device", action="append", default=None,
                        help="a device to time the GP on (repeatable; default: the CPU and CUDA if torch sees it)")
    parser.add_argument("--solver", action="append", choices=_gp.SOLVERS, default=None,
                        help="gp_solver to time (repeatable; default: both)")
    parser.add_argument("--output", default=str(Path(__file__).with_suffix(".txt")))
    args = parser.parse_args()
    sizes = [100, 1_000] if args.quick else [100, 1_000, 10_000, 100_000]
    solvers = args.solver or list(_gp.SOLVERS)
    where = devices(args.device)
    lines = [
        f"FedCor GP benchmark: {args.iterations} Adam steps on {args.vectors} vectors, d = {args.rank}, "
        f"selection of C = 10 (numpy, on the host); torch {torch.__version__}",
        *(f"  {d}: {device_name(d)}" for d in where),
        "  aten operations per Adam step, views left out (N = 100; on a GPU about one kernel launch each): "
        + ", ".join(f"{s} {ops_per_step(s, rank=args.rank, n_vectors=args.vectors)}" for s in solvers),
        "  'x cpu': this row's fit time over the CPU's for the same N and solver, measured in this run",
        f"{'device':>7} {'solver':>12} {'N':>8} {'fit s':>8} {'ms/step':>8} {'x cpu':>7} {'select ms':>10} "
        f"{'threads':>8} {'loadavg (1, 5, 15 min)':>24}",
    ]
    print("\n".join(lines), flush=True)
    for n in sizes:
        for solver in solvers:
            cpu_s = None
            for d in where:
                row = bench(n, iterations=args.iterations, n_vectors=args.vectors, rank=args.rank, n_select=10,
                            device=d, solver=solver)
                if torch.device(d).type == "cpu":
                    cpu_s = row["fit_s"]
                ratio = f"{row['fit_s'] / cpu_s:.2f}" if cpu_s else "-"
                load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
                line = (
                    f"{d:>7} {solver:>12} {row['n']:>8} {row['fit_s']:>8.2f} {row['step_ms']:>8.2f} {ratio:>7} "
                    f"{row['select_ms']:>10.2f} {row['threads']:>8} {load:>24}"
                )
                print(line, flush=True)
                lines.append(line)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
