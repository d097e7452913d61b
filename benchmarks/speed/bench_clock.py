"""What the simulated clock costs: a round's wall time with and without a clock, and N = 100,000 clients.

Part 1 runs the same small federation (digits, 50 clients, logistic regression, C = 10, one
local epoch of batch 10) with and without a clock in pairs of short runs, alternating which goes
first, and reports the median over the pairs of the ratio of their summed per-round wall seconds
(``RoundRecord.seconds``, which excludes building the model and the selector): adjacent runs
see about the same load from the rest of the machine. The clocked run
has heterogeneous devices (:func:`fedselect.profiles.sample_profiles`) whose availability
intervals cover the whole run (``mean_online`` far longer than the run), so both runs train the
same clients on the same data and the difference is the clock alone: the per-client times of
every exchange, the availability tracker, the observed durations. Two selectors: ``random``
(the cheapest round, where a fixed cost shows most) and ``power-of-choice`` (an oracle question
each round, one more timed exchange). On a shared machine the medians move with the other
load, which the pairing cancels to first order; the clock's own work is also timed alone.

Part 2 runs a few rounds at N = 100,000 clients (FedProx's Synthetic(1, 1), client sizes
``8 + int(lognormal(1, 1))`` as in ``bench_scale.py``; logistic regression, C = 10) without a
clock and with one on profiles with availability (the same whole-run intervals, 100,000
clients x about 2 intervals each), alternating, and prints the median seconds per round (round
0 apart: it builds the availability tracker), the clock's own work per round measured alone
(the whole-round comparison is at the mercy of the machine's other load), and the memory the
clock holds (its arrays: profiles, intervals, the tracker's state, one round's observed times).

Usage::

    nice python -m benchmarks.speed.bench_clock [--reps 40] [--rounds 10] [--large 100000] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _always_online(n: int, seed: int) -> Any:
    """Heterogeneous devices whose availability intervals span the run: the tracker works, nobody drops."""
    from fedselect.profiles import sample_profiles

    return sample_profiles(n, random_state=seed, mean_online=1e9, mean_offline=1.0, horizon=4e9)


def _round_seconds(fed: Any, selector: str, rounds: int, clock: bool) -> tuple[float, Any]:
    """Fit; the summed wall seconds of its rounds and the history (``history.cpu``: each round's CPU seconds
    after round 0, from the process's CPU clock read at the end of every round)."""
    from fedselect import FederatedTrainer

    stamps: list[float] = []
    tr = FederatedTrainer(
        selector=selector,
        model="logistic",
        clients_per_round=10,
        rounds=rounds,
        local_epochs=1,
        batch_size=10,
        random_state=0,
        n_threads=1,
        clock=clock,
        callback=lambda trainer, record: stamps.append(time.process_time()),
    )
    tr.fit(fed)
    tr.history_.cpu = np.diff(stamps).tolist()  # type: ignore[attr-defined]
    return sum(r.seconds for r in tr.history_.rounds), tr.history_


def _paired(values_off: list[float], values_on: list[float]) -> tuple[float, float, float]:
    """Median and quartiles of the ratio clock / no clock over adjacent pairs of runs."""
    r = np.array(values_on) / np.array(values_off)
    return float(np.median(r)), float(np.percentile(r, 25)), float(np.percentile(r, 75))


def part1(reps: int, rounds: int, out: list[str]) -> None:
    from fedselect import make_federation

    fed = make_federation("digits", partition="shards", n_clients=50, random_state=0)
    clocked = dataclasses.replace(fed, profiles=_always_online(fed.n_clients, 0))
    out.append(
        f"part 1: digits, 50 clients, logistic, C = 10, 1 local epoch of batch 10, {rounds} rounds per run, "
        f"{reps} pairs of runs (no clock, clock; which goes first alternates); a run's seconds: the sum of its "
        "rounds' wall seconds; ratio: clock / no clock within each pair, median and quartiles over the pairs; CPU "
        "ratio: the same with the process's CPU seconds of rounds 1.. (what the other load on the machine disturbs "
        "least)"
    )
    out.append(
        f"{'selector':18} {'no clock (s)':>13} {'clock (s)':>10} {'paired ratio':>13} {'quartiles':>15} "
        f"{'CPU ratio':>11} {'quartiles':>15}  same selections"
    )
    for selector in ("random", "power-of-choice"):
        plain: list[float] = []
        timed: list[float] = []
        cpu: dict[bool, list[float]] = {False: [], True: []}
        hists = {}
        for rep in range(reps):
            order = (False, True) if rep % 2 == 0 else (True, False)
            for on in order:
                s, hist = _round_seconds(clocked if on else fed, selector, rounds, on)
                (timed if on else plain).append(s)
                cpu[on].append(sum(hist.cpu))
                hists[on] = hist
        same = [r.clients for r in hists[True].rounds] == [r.clients for r in hists[False].rounds]
        med, q1, q3 = _paired(plain, timed)
        cmed, cq1, cq3 = _paired(cpu[False], cpu[True])
        out.append(
            f"{selector:18} {statistics.median(plain):13.4f} {statistics.median(timed):10.4f} {med:13.3f} "
            f"{q1:7.3f} {q3:7.3f} {cmed:11.3f} {cq1:7.3f} {cq3:7.3f}  {same}"
        )
        print(out[-1], flush=True)
        last_plain = statistics.median(plain)
    ops = _clock_ops(clocked.profiles, 650)
    out.append(
        f"the clock's own work per round measured alone (start, a question to 10 clients, the training exchange of "
        f"10, end): {ops * 1e6:.0f} us = {ops / (last_plain / rounds) * 100:.1f} % of a power-of-choice round "
        "without a clock"
    )
    print(out[-1], flush=True)


def _synthetic(n: int) -> Any:
    from fedselect.data import Federation, make_federation

    sizes = np.random.default_rng(0).lognormal(1.0, 1.0, n).astype(np.int64) + 8
    fed = make_federation("synthetic", n_clients=n, random_state=0, sizes=sizes)
    return Federation(
        X=fed.X,
        y=fed.y,
        client_indices=fed.client_indices,
        X_test=fed.X_test[:10_000],
        y_test=fed.y_test[:10_000],
        n_classes=fed.n_classes,
        name=fed.name,
    )


def _clock_bytes(profiles: Any, n: int) -> int:
    arrays = [profiles.seconds_per_sample, profiles.download_bandwidth, profiles.upload_bandwidth, profiles.latency]
    av = profiles.availability
    if av is not None:
        arrays += [av.offsets, av.starts, av.ends, av.period]
    tracker = n * (1 + 8)  # online flags and their valid-until times
    spent = n * 8  # one round's observed seconds per client
    return sum(a.nbytes for a in arrays) + tracker + spent


def _clock_ops(profiles: Any, model_size: int, reps: int = 200) -> float:
    """Median seconds of one round's clock work alone at this N: start, one question to 10 clients,
    the training exchange of 10, end."""
    from fedselect.clock import SimulatedClock

    clock = SimulatedClock(profiles, model_size=model_size)
    n = profiles.n_clients
    ids = np.linspace(0, n - 1, 10).astype(np.int64)
    no = np.zeros(10, dtype=bool)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        rc = clock.start_round()
        rc.exchange(ids, failed=no, models_down=1, eval_samples=12, scalars_up=1)
        rc.settle(ids, failed=no, train_samples=10, models_up=1, scalars_up=1)
        clock.end_round(rc)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def part2(n: int, rounds: int, reps: int, out: list[str]) -> None:
    t0 = time.perf_counter()
    fed = _synthetic(n)
    built = time.perf_counter() - t0
    profiles = _always_online(n, 1)
    clocked = dataclasses.replace(fed, profiles=profiles)
    out.append("")
    out.append(
        f"part 2: N = {n:,} clients (Synthetic(1, 1), sizes 8 + int(lognormal(1, 1)); built in {built:.0f} s), "
        f"logistic, C = 10, 1 local epoch of batch 10, random selection, {rounds} rounds per run, {reps} alternating "
        f"repetitions; availability intervals: {profiles.availability.n_intervals:,}"
    )
    seconds: dict[bool, list[float]] = {False: [], True: []}
    firsts: dict[bool, list[float]] = {False: [], True: []}
    runs: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    for rep in range(reps):
        for on in (False, True) if rep % 2 == 0 else (True, False):
            _, hist = _round_seconds(clocked if on else fed, "random", rounds, on)
            secs = [r.seconds for r in hist.rounds]
            firsts[on].append(secs[0])
            seconds[on].extend(secs[1:])
            runs[on].append(sum(secs[1:]))
            cpu[on].append(sum(hist.cpu))
            if on:
                sim = hist.rounds[-1].sim_time
    for on in (False, True):
        s = seconds[on]
        out.append(
            f"  {'clock   ' if on else 'no clock'}  s/round after round 0: median {statistics.median(s):.4f} "
            f"(quartiles {np.percentile(s, 25):.4f} .. {np.percentile(s, 75):.4f}); round 0: median "
            f"{statistics.median(firsts[on]):.4f}" + (f"; sim_time after {rounds} rounds {sim:.1f} s" if on else "")
        )
        print(out[-1], flush=True)
    ratio = statistics.median(seconds[True]) / statistics.median(seconds[False])
    low = np.percentile(seconds[True], 10) / np.percentile(seconds[False], 10)
    med, q1, q3 = _paired(runs[False], runs[True])
    cmed, cq1, cq3 = _paired(cpu[False], cpu[True])
    ops = _clock_ops(profiles, 610)
    out.append(
        f"  paired ratio of runs (rounds 1..): wall median {med:.3f}, quartiles {q1:.3f} .. {q3:.3f}; CPU median "
        f"{cmed:.3f}, quartiles {cq1:.3f} .. {cq3:.3f}; ratio of the "
        f"rounds' medians {ratio:.3f}, of their 10th percentiles (the least disturbed rounds) {low:.3f}; "
        f"the clock's own work per round (start, a question to 10 clients, the "
        f"training exchange of 10, end), measured alone: {ops * 1e6:.0f} us, "
        f"{ops / statistics.median(seconds[False]) * 100:.1f} % of a round"
    )
    out.append(
        f"  clock memory: {_clock_bytes(profiles, n) / 2**20:.1f} MiB for {n:,} clients "
        f"({_clock_bytes(profiles, n) / n:.0f} bytes per client: profiles, intervals, tracker, one round's "
        "observed times)"
    )
    print("\n".join(out[-2:]), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--large-rounds", type=int, default=8)
    parser.add_argument("--large-reps", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    out = [
        "bench_clock: a round's wall time with and without the simulated clock",
        f"command: python -m benchmarks.speed.bench_clock {' '.join(argv if argv is not None else sys.argv[1:])}",
        f"commit {_commit()} (plus the working tree); {platform.machine()}, {os.cpu_count()} cpus; python "
        f"{platform.python_version()}, torch {torch.__version__}, 1 torch thread",
        f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        "",
    ]
    part1(args.reps, args.rounds, out)
    if args.large:
        part2(args.large, args.large_rounds, args.large_reps, out)
    out.append(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    text = "\n".join(out) + "\n"
    if args.out is not None:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
