"""The two bit-neutral savings of the eager chain path's round, measured alone (one torch thread).

1. The SGD update of the MLP job's first layer (10 clients, a 200 x 784 weight each): ``w -= factor * g`` with
   the gradient as autograd lays it out (a transposed view of a (10, 784, 200) product) against the gradient
   laid out as the weight (what the chain path computes where :func:`~fedselect.simulation.engine.chain.
   same_bits_contiguous` finds the same bits). Both scale the gradient in place first, as the path does.
2. The finiteness check of a round's updates (10 x 199,210: the job's model): ``torch.isfinite(d).all(1)``
   against :func:`fedselect.aggregation.finite_rows` (row sums first).

Usage::

    python -m benchmarks.speed.bench_update_layout [--repeats 50] [--out benchmarks/speed/bench_update_layout.txt]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch

from fedselect.aggregation import finite_rows


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median milliseconds of ``repeats`` calls after one warm-up call."""
    fn()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1e3)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(10, 200, 784, generator=gen)
    factor = torch.ones(10, 1, 1)  # 1: repeated in-place scaling must not drift the values into denormals
    g_autograd = torch.randn(10, 784, 200, generator=gen).transpose(1, 2)  # autograd's layout, as a view
    g_weight = torch.randn(10, 200, 784, generator=gen)  # laid out as the weight
    updates = torch.randn(10, 199_210, generator=gen)
    rows = [
        ("update, gradient as autograd lays it out", timed(lambda: w.sub_(g_autograd.mul_(factor)), args.repeats)),
        ("update, gradient laid out as the weight", timed(lambda: w.sub_(g_weight.mul_(factor)), args.repeats)),
        ("isfinite(updates).all(1)", timed(lambda: torch.isfinite(updates).all(dim=1), args.repeats)),
        ("finite_rows(updates)", timed(lambda: finite_rows(updates), args.repeats)),
    ]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        "$ python -m benchmarks.speed.bench_update_layout " + " ".join(f"--{k} {v}" for k, v in vars(args).items()
                                                                       if v is not None),
        f"commit {head}; {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, one thread",
        f"load average at start {os.getloadavg()[0]:.2f}; median ms of {args.repeats} calls",
        *(f"{name:45s} {ms:8.3f} ms" for name, ms in rows),
        f"update: autograd's layout / the weight's {rows[0][1] / rows[1][1]:.1f}x; "
        f"isfinite / finite_rows {rows[2][1] / rows[3][1]:.1f}x",
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
