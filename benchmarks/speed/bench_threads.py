"""Seconds per fit under each torch thread setting, on an idle machine and beside busy processes.

Issue 34 item 3: the Python default ``n_threads`` must stay within 1.2x of the best setting both idle
and when other processes use the cores. Three jobs, each a fresh ``FederatedTrainer.fit`` in a
subprocess of its own (so torch's thread pool starts from the setting under test):

- ``quickstart``: the README's Quickstart run (digits, 20 clients with one label shard each, 5 a
  round, an MLP, 2 local epochs of batch 16), 20 rounds;
- ``fedavg-mlp``: issue 34's FedAvg job (Fashion-MNIST, 100 clients of 2 label shards, 10 a round,
  MLP 784-200-200-10, one epoch of batch 50, lr 0.05), 10 rounds; skipped without the data;
- ``fedavg-cnn``: the same federation with fedselect's CNN, 5 rounds: the model where more threads
  could pay.

Settings: ``n_threads=1`` (the default), ``n_threads=None`` (torch's own count: every core) and, with
more than two cores, half the cores. Loads: ``idle`` (nothing else started by the benchmark; the load
average is printed, as this cannot see other users) and ``busy-K``: K pure-Python busy loops, one per
process, running throughout the fit (K = 1 and K = cores); ``torch-1``: one process running torch
matrix products with torch's own thread count (another user's training job). Each (job, load) alternates the settings
``--repeats`` times; the table gives the median seconds per fit and each setting's ratio to the
fastest setting of that (job, load), the figure the issue's goal is stated in.

Usage::

    python -m benchmarks.speed.bench_threads [--repeats 3] [--jobs quickstart fedavg-mlp fedavg-cnn]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

JOBS: dict[str, dict] = {
    "quickstart": {
        "federation": {"dataset": "digits", "partition": "shards", "shards_per_client": 1, "n_clients": 20},
        "trainer": {
            "clients_per_round": 5,
            "rounds": 20,
            "local_epochs": 2,
            "batch_size": 16,
            "lr": 0.1,
            "aggregation": "mean",
            "stop_at_target": False,
        },
    },
    "fedavg-mlp": {
        "federation": {"dataset": "fmnist", "partition": "shards", "shards_per_client": 2, "n_clients": 100},
        "trainer": {
            "clients_per_round": 10,
            "rounds": 10,
            "local_epochs": 1,
            "batch_size": 50,
            "lr": 0.05,
            "aggregation": "mean",
            "stop_at_target": False,
            "model": "mlp",
            "model_params": {"hidden": [200, 200]},
        },
    },
    "fedavg-cnn": {
        "federation": {"dataset": "fmnist", "partition": "shards", "shards_per_client": 2, "n_clients": 100},
        "trainer": {
            "clients_per_round": 10,
            "rounds": 5,
            "local_epochs": 1,
            "batch_size": 50,
            "lr": 0.05,
            "aggregation": "mean",
            "stop_at_target": False,
            "model": "cnn",
        },
    },
}

_CHILD = r"""
import json, sys, time
import fedselect
spec = json.loads(sys.argv[1])
fed = fedselect.make_federation(random_state=0, **spec["federation"])
kw = dict(spec["trainer"], selector="random", random_state=0)
if spec["threads"] != "default":
    kw["n_threads"] = spec["threads"]
trainer = fedselect.FederatedTrainer(**kw)
start = time.perf_counter()
trainer.fit(fed)
print(json.dumps({"seconds": time.perf_counter() - start, "acc": trainer.history_.rounds[-1].test_accuracy}))
"""


def _spin() -> None:  # a process that keeps one core busy until it is terminated
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def _torch_spin() -> None:  # a process running torch with its own thread count (another user's training job)
    import torch

    a = torch.randn(256, 256)
    while True:
        a = torch.tanh(a @ a)


def _fit_seconds(job: str, threads: object) -> float:
    spec = dict(JOBS[job], threads=threads)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(spec)],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, OMP_NUM_THREADS="", MKL_NUM_THREADS=""),
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])


def _fmnist_present() -> bool:
    try:
        import fedselect

        fedselect.make_federation("fmnist", n_clients=2, random_state=0)
        return True
    except Exception:
        return False


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    args = ap.parse_args(argv)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    settings: list[object] = [1, None] + ([cores // 2] if cores > 2 else [])
    loads: list[tuple[str, int]] = (
        [("idle", 0), ("busy", 1)] + ([("busy", cores)] if cores > 1 else []) + [("torch", 1)]
    )
    jobs = [j for j in args.jobs if not j.startswith("fedavg") or _fmnist_present()]
    import torch

    print(
        f"# bench_threads: {platform.processor() or platform.machine()}, {cores} cores, torch {torch.__version__}, "
        f"torch's own thread count {torch.get_num_threads()}, load average at start "
        f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(
        f"# jobs {jobs}{'' if len(jobs) == len(args.jobs) else ' (fedavg jobs skipped: no Fashion-MNIST)'}; "
        f"{args.repeats} alternating repeats; seconds per fit, median (min-max); ratio to the fastest setting"
    )
    print("| job | load | n_threads | s per fit | x fastest |")
    print("|---|---|---|---|---|")
    ctx = mp.get_context("spawn")
    for job in jobs:
        for kind, k in loads:
            spinners = [ctx.Process(target=_spin if kind == "busy" else _torch_spin, daemon=True) for _ in range(k)]
            for p in spinners:
                p.start()
            try:
                time.sleep(0.5 if k else 0.0)
                seconds: dict[object, list[float]] = {s: [] for s in settings}
                for _ in range(args.repeats):
                    for s in settings:
                        seconds[s].append(_fit_seconds(job, "default" if s is None else s))
            finally:
                for p in spinners:
                    p.terminate()
                    p.join()
            med = {s: statistics.median(v) for s, v in seconds.items()}
            best = min(med.values())
            load = "idle" if k == 0 else f"{kind}-{k}"
            for s in settings:
                v = seconds[s]
                name = f"{s} (default)" if s == 1 else ("None (torch's own)" if s is None else str(s))
                print(
                    f"| {job} | {load} | {name} | {med[s]:.2f} ({min(v):.2f}-{max(v):.2f}) | {med[s] / best:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    main()
