"""Peak memory of a fit whose clients overlap: 10,000 clients sharing Fashion-MNIST's 60,000 images.

The federation (issue 34's memory finding): FedCor's FMNIST 2SPC partition into 100 base clients
of 600 images (2 label shards each), and N clients where client k holds base client
``k mod 100``'s samples (so N = 10,000 clients hold 6,000,000 samples that are 100 copies of the
pool). Before the engine indexed the pool it gathered every client's loss samples into one
array at start (``sum(n_k) x 784`` float32: 18.8 GB at N = 10,000); now it keeps indices, and an
all-client loss pass evaluates the 60,000 distinct samples once.

Each (selector, N) point runs in a fresh subprocess (its peak memory is its own):
``FederatedTrainer(selector=..., model="mlp")`` (FedCor's MLP 784-64-30-10) fits ``--rounds``
rounds of 10 clients x 5 local steps of batch 64 on one thread. The selectors: ``random``
(asks only the chosen clients' losses), ``afl`` (asks every client's loss in round 0) and
``fedcor`` (every client's loss in each warm-up round). Peak memory is the worker's
``ru_maxrss`` (interpreter, torch, the data and the run); ``+fit`` is that peak minus the
resident size just before ``fit``. ``--pythonpath`` runs the workers against another checkout
(e.g. the code before this change), and points whose old per-client copy alone would exceed
``--max-gb`` are skipped with that size printed.

Usage::

    nice python -m benchmarks.speed.bench_memory [--n 10000] [--selectors random afl fedcor] [--rounds 3]
        [--pythonpath DIR] [--out benchmarks/speed/bench_memory.txt]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BASE_CLIENTS = 100


def overlapping_federation(n: int) -> Any:
    """N clients; client k holds base client ``k mod 100``'s samples of FedCor's FMNIST 2SPC partition."""
    from fedselect.data import Federation, make_federation

    base = make_federation("fmnist", partition="shards", shards_per_client=2, n_clients=BASE_CLIENTS, random_state=0)
    return Federation(
        X=base.X,
        y=base.y,
        client_indices=[base.client_indices[k % BASE_CLIENTS] for k in range(n)],
        X_test=base.X_test,
        y_test=base.y_test,
        n_classes=base.n_classes,
        name=f"fmnist-2spc-x{n // BASE_CLIENTS}",
    )


def rss_gb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from fedselect import FederatedTrainer

    torch.set_num_threads(1)
    fed = overlapping_federation(int(spec["n"]))
    before = rss_gb()
    start = time.perf_counter()
    trainer = FederatedTrainer(
        selector=spec["selector"],
        model="mlp",
        clients_per_round=10,
        rounds=int(spec["rounds"]),
        local_steps=5,
        batch_size=64,
        lr=0.005,
        random_state=0,
        n_threads=1,
    ).fit(fed)
    return {
        "samples": int(sum(len(ix) for ix in fed.loss_indices)),
        "rss_before_fit_gb": before,
        "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
        "seconds": time.perf_counter() - start,
        "round_seconds": [r.seconds for r in trainer.history_.rounds],
        "samples_evaluated": [r.costs.samples_evaluated for r in trainer.history_.rounds],
        "accuracy": trainer.history_.rounds[-1].test_accuracy,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[10_000])
    ap.add_argument("--selectors", nargs="+", default=["random", "afl", "fedcor"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pythonpath", default=None, help="run the workers with this PYTHONPATH (another checkout)")
    ap.add_argument("--max-gb", type=float, default=8.0, help="skip points whose per-client copy would exceed this")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".txt"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    # the workers import fedselect from this checkout (or from --pythonpath), not from an installed copy
    code = args.pythonpath or str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = code
    commit = subprocess.run(
        ["git", "-C", code, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        "bench_memory: peak memory of FederatedTrainer.fit with N clients sharing Fashion-MNIST's 60,000 images",
        f"command: python -m benchmarks.speed.bench_memory {' '.join(sys.argv[1:])}",
        f"code: {code} (commit {commit}); {platform.machine()}, {os.cpu_count()} cpus; one thread per worker",
        f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}",
        "client k holds base client k mod 100's 600 samples (FMNIST 2SPC); MLP 784-64-30-10, 10 clients x 5 steps "
        f"of batch 64 per round, {args.rounds} rounds",
        "per-client copy: what gathering every client's loss samples at start would take (sum n_k x 784 float32)",
        "",
        f"{'selector':<10} {'N':>7} {'per-client copy':>16} {'peak GB':>8} {'+fit GB':>8} {'fit s':>7}  samples "
        "evaluated per round",
    ]
    print("\n".join(lines), flush=True)
    for n in args.n:
        copy_gb = n * 600 * 784 * 4 / 1e9
        for sel in args.selectors:
            head = f"{sel:<10} {n:>7} {copy_gb:>13.1f} GB"
            if args.pythonpath and copy_gb > args.max_gb:
                line = f"{head}  skipped: the old code's copy alone exceeds --max-gb {args.max_gb:g}"
            else:
                spec = json.dumps({"n": n, "selector": sel, "rounds": args.rounds})
                proc = subprocess.run(
                    [sys.executable, __file__, "--worker", spec],
                    capture_output=True,
                    text=True,
                    env=env,
                )
                if proc.returncode != 0:
                    tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-2:])
                    line = f"{head}  failed (exit {proc.returncode}): {tail}"
                else:
                    r = json.loads(proc.stdout.strip().splitlines()[-1])
                    line = (
                        f"{head} {r['peak_gb']:>8.2f} {r['peak_gb'] - r['rss_before_fit_gb']:>+8.2f} "
                        f"{r['seconds']:>7.1f}  {r['samples_evaluated']}"
                    )
            print(line, flush=True)
            lines.append(line)
    lines += ["", f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}"]
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
