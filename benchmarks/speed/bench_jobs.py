"""Wall time of a fixed comparison grid: one run after another (jobs=1) against N runs at once (jobs=N).

The grid: 4 schemes (random, round-robin, power-of-choice d=10, AFL) x ``--seeds`` seeds on digits
split into 20 clients by 2 label shards each, 5 clients per round, 1 local epoch of batch 32,
``--rounds`` rounds, every run with one torch thread (``n_threads=1``, the command line's
default), no target stop and no checkpoints. Each repetition runs the whole grid serially and then
with ``jobs=--jobs`` worker processes, into fresh output directories, so nothing is resumed; the
runs' histories are checked equal to the serial ones.

Worker processes fork from a server that imports torch and fedselect once per Python process
(the ``forkserver`` start method); that start-up is timed on its own before the repetitions and
reported apart, since a ``fedselect compare --jobs N`` command pays it once however long its grid.

Printed: the machine (CPU, cores this process may use, torch), the load average before and after,
each repetition's two wall times, and the ratio serial / parallel of the medians. On a machine
shared with other work the load average says how many cores the grid really had: with other
processes on the cores the ratio is a lower bound on what an idle machine gives (at most
``min(jobs, cores)``).

Usage::

    python -m benchmarks.speed.bench_jobs [--jobs 2] [--rounds 100] [--seeds 2] [--reps 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fedselect import _grid
from fedselect.compare import machine_info, run_comparison

SCHEMES = {
    "random": ("random", {}),
    "round-robin": ("round-robin", {}),
    "power-of-choice(d=10)": ("power-of-choice", {"d": 10}),
    "afl": ("afl", {}),
}
FEDERATION = {"dataset": "digits", "partition": "shards", "shards_per_client": 2, "n_clients": 20}


def _spin(n: int) -> int:
    x = 0
    for i in range(n):
        x ^= i
    return x


def _capacity(jobs: int, ctx, n: int = 20_000_000) -> tuple[float, float, float]:
    """How many cores this session gets right now: (1 busy process's wall time, ``jobs`` processes', ratio).

    Each process runs the same pure-Python loop; on an idle machine ``jobs`` of them take as long as
    one (ratio ``jobs``). On a loaded machine with the kernel's per-session fair scheduling
    (``/proc/sys/kernel/sched_autogroup_enabled``), this session's processes share one session's
    slice, and the ratio says how much parallelism there was to gain.
    """
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(jobs, mp_context=ctx) as ex:
        list(ex.map(abs, range(jobs)))  # started before timing
        start = time.perf_counter()
        list(ex.map(_spin, [n]))
        one = time.perf_counter() - start
        start = time.perf_counter()
        list(ex.map(_spin, [n] * jobs))
        many = time.perf_counter() - start
    return one, many, jobs * one / many


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f} (1 / 5 / 15 min)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="runs at once in the parallel grid (default: 2)")
    ap.add_argument("--rounds", type=int, default=100, help="rounds per run (default: 100)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per scheme (default: 2; 4 schemes)")
    ap.add_argument("--reps", type=int, default=2, help="repetitions of (serial, parallel) (default: 2)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    trainer = {
        "rounds": args.rounds,
        "clients_per_round": 5,
        "local_epochs": 1,
        "batch_size": 32,
        "n_threads": 1,
        "stop_at_target": False,
    }
    seeds = tuple(range(args.seeds))
    info = machine_info()
    print(
        f"bench_jobs: {len(SCHEMES)} schemes x {len(seeds)} seeds = {len(SCHEMES) * len(seeds)} runs of "
        f"{args.rounds} rounds on digits (20 clients, 2 shards each, 5 per round), 1 torch thread per run"
    )
    print(
        f"machine: {info['cpu']}, {_grid.cores()} core(s) usable, python {platform.python_version()}, "
        f"torch {info['torch']}"
    )
    print(f"load average before: {_load()}")

    def grid(out: Path, jobs: int) -> tuple[float, dict]:
        start = time.perf_counter()
        comp = run_comparison(
            SCHEMES,
            federation=FEDERATION,
            trainer=trainer,
            seeds=seeds,
            target=0.9,
            out_dir=out,
            progress=False,
            checkpoint_every=0,
            jobs=jobs,
            log=lambda m: None,
        )
        return time.perf_counter() - start, comp.histories

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        # Start-up alone: the forkserver and its preloaded imports, then one worker per job doing nothing.
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(args.jobs, mp_context=_grid._mp_context()) as ex:
            list(ex.map(abs, range(args.jobs)))
        startup = time.perf_counter() - start
        print(
            f"worker start-up (once per process: forkserver with torch and fedselect imported, "
            f"{args.jobs} workers): {startup:.1f} s"
        )
        serial_t, parallel_t, capacity = [], [], []
        for rep in range(args.reps):
            one, many, cap = _capacity(args.jobs, _grid._mp_context())
            ts, hs = grid(Path(tmp) / f"serial{rep}", 1)
            tp, hp = grid(Path(tmp) / f"parallel{rep}", args.jobs)
            serial_t.append(ts)
            parallel_t.append(tp)
            capacity.append(cap)
            print(
                f"rep {rep}: serial {ts:.1f} s, jobs={args.jobs} {tp:.1f} s, ratio {ts / tp:.2f}, "
                f"histories equal: {hs == hp}; capacity probe: 1 busy loop {one:.2f} s, {args.jobs} at once "
                f"{many:.2f} s, {cap:.2f} cores available  (load now {_load()})"
            )
    ms, mp = statistics.median(serial_t), statistics.median(parallel_t)
    cap = statistics.median(capacity)
    print(
        f"median: serial {ms:.1f} s, jobs={args.jobs} {mp:.1f} s: speed-up {ms / mp:.2f}x; the capacity probe "
        f"found {cap:.2f} of {min(args.jobs, _grid.cores())} cores' parallelism available, so the grid reached "
        f"{ms / mp / cap:.0%} of what the machine offered (ideal on an idle machine: "
        f"{min(args.jobs, _grid.cores())}x)"
    )
    print(f"load average after: {_load()}")
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if autogroup.exists() and autogroup.read_text().strip() == "1":
        print(
            "The kernel shares the CPU between sessions (sched_autogroup_enabled = 1): with other sessions busy, "
            "this session's processes split one session's share, so more processes gain little."
        )
    print(
        "The machine is shared with other work: the load average above counts processes wanting a core, and "
        "with more of them than cores the speed-up is a lower bound on an idle machine's."
    )


if __name__ == "__main__":
    main()
