"""FedCor's GP fit with clients that did not answer, against the same fit with every answer.

A loss-change vector with missing entries (clients that did not answer) contributes the exact
marginal likelihood of its observed entries; all such vectors are computed in one batched
Woodbury step (``LossChangeGP._partial_log_probs``). This prints, measured in one run, the median
seconds of a fit of ``--iters`` Adam steps on M = 11 vectors (FedCor's warm-up window) with no
entry missing and with a fraction missing, and their ratio.

Usage::

    python -m benchmarks.speed.bench_gp_missing [--clients 100] [--missing 0.3] [--reps 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import torch

from fedselect.selectors import _gp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--rank", type=int, default=15)
    ap.add_argument("--vectors", type=int, default=11)
    ap.add_argument("--missing", type=float, default=0.3)
    ap.add_argument("--iters", type=int, default=150)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    full = rng.normal(size=(args.vectors, args.clients))
    partial = full.copy()
    partial[rng.random(partial.shape) < args.missing] = np.nan
    weights = 0.9 ** np.arange(args.vectors)
    times: dict[str, list[float]] = {"complete": [], "partial": []}
    for _ in range(args.reps):  # interleaved, so both see the same machine load
        for name, values in (("complete", full), ("partial", partial)):
            gp = _gp.LossChangeGP(args.clients, args.rank, 0.01, generator=torch.Generator().manual_seed(0))
            start = time.perf_counter()
            gp.fit(values, weights, iterations=args.iters, lr=0.01)
            times[name].append(time.perf_counter() - start)
    med = {k: float(np.median(v)) for k, v in times.items()}
    print(
        f"FedCor GP fit, N={args.clients}, d={args.rank}, M={args.vectors}, {args.iters} Adam steps, "
        f"{args.missing:.0%} of entries missing; {args.reps} interleaved reps; {platform.machine()}, "
        f"{os.cpu_count()} cpus, torch {torch.__version__}, load {os.getloadavg()[0]:.2f}"
    )
    print(f"  every answer: {med['complete']:.3f} s per fit (median)")
    print(f"  with missing: {med['partial']:.3f} s per fit (median)")
    print(f"  ratio: {med['partial'] / med['complete']:.2f}x")


if __name__ == "__main__":
    main()
