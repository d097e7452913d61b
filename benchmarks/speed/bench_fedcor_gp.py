"""Time FedCor's GP: one full fit (1000 Adam steps) and one selection of C = 10, for N up to 100,000.

Synthetic loss-change vectors from a known low-rank (8 groups) plus diagonal covariance,
``--vectors`` of them in the objective (the paper's warm-up uses 11). Prints a table and
writes it to ``benchmarks/speed/bench_fedcor_gp.txt``. Goals: N = 100, fit < 2.5 s and
selection < 5 ms; N = 100,000, fit + selection < 2 min.

    python -m benchmarks.speed.bench_fedcor_gp            # N = 100, 1,000, 10,000, 100,000
    python -m benchmarks.speed.bench_fedcor_gp --quick    # N = 100, 1,000
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from fedselect.selectors import _gp


def synthetic_vectors(n_clients: int, n_vectors: int, rng: np.random.Generator) -> np.ndarray:
    groups = rng.integers(0, 8, n_clients)
    loadings = 0.2 * rng.uniform(0.5, 1.5, n_clients)
    factors = rng.normal(size=(n_vectors, 8))
    return -(factors[:, groups] * loadings) + 0.01 * rng.normal(size=(n_vectors, n_clients))


def bench(n_clients: int, *, iterations: int, n_vectors: int, rank: int, n_select: int) -> dict:
    rng = np.random.default_rng(0)
    values = synthetic_vectors(n_clients, n_vectors, rng)
    weights = 0.9 ** np.arange(n_vectors)[::-1]
    gp = _gp.LossChangeGP(n_clients, rank, 0.01, generator=torch.Generator().manual_seed(0))
    gp.fit(values, weights, iterations=2, lr=0.01)  # first-call overheads (lazy imports, allocator)
    result = gp.fit(values, weights, iterations=iterations, lr=0.01)
    p = np.full(n_clients, 1.0 / n_clients)
    alpha = np.ones(n_clients)
    x = gp.embeddings
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
        threads=_gp.threads_for(n_clients) or torch.get_num_threads(),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only N = 100 and 1,000")
    parser.add_argument("--iterations", type=int, default=1000, help="Adam steps per fit (default 1000)")
    parser.add_argument("--vectors", type=int, default=11, help="loss-change vectors in the objective (default 11)")
    parser.add_argument("--rank", type=int, default=15, help="embedding dimension d (default 15)")
    parser.add_argument("--output", default=str(Path(__file__).with_suffix(".txt")))
    args = parser.parse_args()
    sizes = [100, 1_000] if args.quick else [100, 1_000, 10_000, 100_000]
    lines = [
        f"FedCor GP benchmark: {args.iterations} Adam steps on {args.vectors} vectors, d = {args.rank}, "
        f"selection of C = 10; torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs",
        f"{'N':>8} {'fit s':>8} {'ms/step':>8} {'select ms':>10} {'threads':>8} {'loadavg (1, 5, 15 min)':>24}",
    ]
    print("\n".join(lines), flush=True)
    for n in sizes:
        row = bench(n, iterations=args.iterations, n_vectors=args.vectors, rank=args.rank, n_select=10)
        load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
        line = (
            f"{row['n']:>8} {row['fit_s']:>8.2f} {row['step_ms']:>8.2f} {row['select_ms']:>10.2f} "
            f"{row['threads']:>8} {load:>24}"
        )
        print(line, flush=True)
        lines.append(line)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
