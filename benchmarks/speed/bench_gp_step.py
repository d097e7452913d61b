"""Seconds per Adam step of FedCor's closed-form GP fit at large N, for this checkout and optionally another.

One step of ``LossChangeGP.fit(..., solver="closed-form")`` on M = 11 loss-change vectors (the warm-up's
window) at rank d = 15: ``(fit(K steps) - fit(0 steps)) / K`` in a fresh process per measurement, one torch
thread. ``--other PATH`` times the fedselect at PATH too (a git worktree of an older commit, e.g.
``git worktree add /tmp/old 17b5b80``), alternating with this one, so that a layout change is measured side by
side on one machine at one time.

Usage::

    python -m benchmarks.speed.bench_gp_step [--n 100000 1000000] [--steps 20] [--repeats 3] [--other PATH]
        [--out benchmarks/speed/bench_gp_step.txt]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def worker(n: int, steps: int) -> dict[str, object]:
    import numpy as np
    import torch

    from fedselect.selectors import _gp

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    values = rng.normal(scale=0.01, size=(11, n))
    weights = 0.9 ** np.arange(11.0)
    gp = _gp.LossChangeGP(n, 15, 0.01, generator=torch.Generator().manual_seed(0))
    gp.fit(values, weights, iterations=1, lr=0.01, solver="closed-form")  # first-call costs (LAPACK, allocator)
    start = time.perf_counter()
    gp.fit(values, weights, iterations=0, lr=0.01, solver="closed-form")
    setup = time.perf_counter() - start
    start = time.perf_counter()
    gp.fit(values, weights, iterations=steps, lr=0.01, solver="closed-form")
    total = time.perf_counter() - start
    import fedselect

    return {"step": (total - setup) / steps, "setup": setup, "fedselect": fedselect.__file__}


def measure(checkout: Path, n: int, steps: int) -> dict[str, object]:
    # this file run as a script (its own folder first on the path, not a checkout's root), fedselect from ``checkout``
    env = dict(os.environ, PYTHONPATH=str(checkout), OMP_NUM_THREADS="1")
    cmd = [sys.executable, __file__, "--worker", str(n), str(steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=checkout, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if Path(result["fedselect"]).resolve().parents[1] != checkout.resolve():
        raise RuntimeError(f"the worker imported {result['fedselect']}, not the checkout {checkout}")
    return result


def commit(path: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--other", type=Path, default=None, help="another fedselect checkout to time alternately")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--worker", type=int, nargs=2, metavar=("N", "STEPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    sides = [("this", ROOT)] + ([("other", args.other.resolve())] if args.other else [])
    lines = [
        f"$ python -m benchmarks.speed.bench_gp_step {' '.join(sys.argv[1:])}",
        f"{platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}; one torch thread",
        "checkouts: " + ", ".join(f"{name} = {path.name} at {commit(path)}" for name, path in sides),
        f"load average at start {os.getloadavg()[0]:.2f}",
        "seconds per Adam step of the closed-form fit (M = 11 vectors, d = 15): median of the repeats (each its own"
        " process), then each repeat",
    ]
    for n in args.n:
        got: dict[str, list[float]] = {name: [] for name, _ in sides}
        for _ in range(args.repeats):
            for name, path in sides:
                got[name].append(float(measure(path, n, args.steps)["step"]))  # type: ignore[arg-type]
        for name, path in sides:
            row = " ".join(f"{v:.4f}" for v in got[name])
            lines.append(f"N = {n:>9,}  {name:5s} ({commit(path)}): {statistics.median(got[name]):.4f} s  [{row}]")
        if len(sides) == 2:
            ratios = [o / t for t, o in zip(got["this"], got["other"])]
            lines.append(f"N = {n:>9,}  other / this: median {statistics.median(ratios):.2f}x (paired per repeat)")
    lines.append(f"load average at end {os.getloadavg()[0]:.2f}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
