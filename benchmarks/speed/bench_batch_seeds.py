"""Wall and CPU time of S seeds of a scheme, one run after another against batched (``batch_seeds``).

The grid: a preset's schemes (default: FedCor's FMNIST 2SPC Table 1 setting, Random, AFL, Pow-d and
FedCor) x ``--seeds`` seeds, a fixed slice of ``--rounds`` rounds from round 0 of each run (not the
preset's 500; the slice holds FedCor's 15 warm-up rounds and its first GP refits, so its mix of
work is the first rounds', and the scaled figures below assume the rest of the run costs what the
slice costs per round), one torch thread, no checkpoints. Each repetition times, scheme by scheme,
the S runs one after another (``FederatedTrainer.fit``, what ``fedselect compare`` does by default)
and then the same S runs batched (:func:`fedselect.simulation.batched.fit_runs`, what
``--batch-seeds`` does), on the same federations (built once, one per seed), after one untimed
two-round run of each scheme. Both the wall time and the process's CPU time are printed: on a shared machine the
wall time includes waiting for a core, the CPU time does not.

Also printed: how the batched runs compare with the runs alone (identical selections for
Random; for the others, how many runs chose identically in every round and the largest
difference in test accuracy), the load average before and after, and the medians over
``--reps`` repetitions with their ratio one-at-a-time / batched.

Usage::

    python -m benchmarks.speed.bench_batch_seeds [--seeds 5] [--rounds 30] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch

from fedselect import FederatedTrainer
from fedselect.compare import machine_info, share_pools
from fedselect.data import make_federation
from fedselect.presets import get_preset
from fedselect.simulation.batched import fit_runs


def _load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def _timed(fn: Any) -> tuple[float, float, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="fedcor-fmnist-2spc")
    ap.add_argument("--schemes", nargs="+", help="labels of the preset's schemes (default: all)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    preset = get_preset(args.preset)
    labels = args.schemes or list(preset.selectors)
    seeds = list(range(args.seeds))
    trainer = {**preset.trainer, "rounds": args.rounds, "n_threads": 1, "stop_at_target": False}
    info = machine_info()
    print(
        f"bench_batch_seeds: {args.preset}, schemes {', '.join(labels)}, {args.seeds} seeds, a slice of "
        f"{args.rounds} rounds from round 0 of each run (the preset runs {preset.trainer['rounds']}), 1 torch "
        f"thread, {args.reps} repetition(s)"
    )
    print(f"machine: {info['cpu']}, {info['cpus']} cpu(s), python {info['python']}, torch {info['torch']}")
    print(f"load average before: {_load()} (1 / 5 / 15 min)")
    feds = share_pools([make_federation(random_state=s, **preset.federation) for s in seeds])
    times: dict[str, dict[str, list[float]]] = {
        lab: {"seq": [], "bat": [], "seq_cpu": [], "bat_cpu": []} for lab in labels
    }
    checks: dict[str, str] = {}
    for label in labels:  # warm-up, untimed: imports done on first use (FedCor's optimiser pulls in torch._dynamo)
        FederatedTrainer(selector=preset.selectors[label], random_state=0, **{**trainer, "rounds": 2}).fit(feds[0])
    for rep in range(args.reps):
        for label in labels:
            sel = preset.selectors[label]

            def alone(sel: Any = sel) -> list[FederatedTrainer]:
                return [FederatedTrainer(selector=sel, random_state=s, **trainer).fit(f) for s, f in zip(seeds, feds)]

            def together(sel: Any = sel) -> list[FederatedTrainer]:
                trs = [FederatedTrainer(selector=sel, random_state=s, **trainer) for s in seeds]
                errors = fit_runs(trs, feds, log=print)
                if any(e is not None for e in errors):
                    raise RuntimeError(f"batched runs failed: {errors}")
                return trs

            w1, c1, a = _timed(alone)
            w2, c2, b = _timed(together)
            t = times[label]
            t["seq"].append(w1)
            t["bat"].append(w2)
            t["seq_cpu"].append(c1)
            t["bat_cpu"].append(c2)
            same = sum(
                all(x.clients == y.clients for x, y in zip(ra.history_.rounds, rb.history_.rounds))
                for ra, rb in zip(a, b)
            )
            dacc = max(
                abs(x.test_accuracy - y.test_accuracy)
                for ra, rb in zip(a, b)
                for x, y in zip(ra.history_.rounds, rb.history_.rounds)
            )
            checks[label] = f"{same}/{len(seeds)} runs chose identically in every round, max |accuracy diff| {dacc:.2g}"
            print(
                f"rep {rep} {label:<8} one at a time {w1:7.1f} s wall ({c1:7.1f} s cpu), batched {w2:7.1f} s wall "
                f"({c2:7.1f} s cpu): ratio {w1 / w2:.2f} wall, {c1 / c2:.2f} cpu  (load {_load()})"
            )
    print("\nmedians over the repetitions (S runs of the slice):")
    tot = {k: 0.0 for k in ("seq", "bat", "seq_cpu", "bat_cpu")}
    for label in labels:
        m = {k: statistics.median(v) for k, v in times[label].items()}
        for k in tot:
            tot[k] += m[k]
        per_round = m["bat"] / (args.seeds * args.rounds)
        print(
            f"  {label:<8} one at a time {m['seq']:7.1f} s, batched {m['bat']:7.1f} s, "
            f"ratio {m['seq'] / m['bat']:.2f} "
            f"(cpu {m['seq_cpu']:.1f} / {m['bat_cpu']:.1f} s = {m['seq_cpu'] / m['bat_cpu']:.2f}); "
            f"batched {per_round * 1e3:.0f} ms per run-round; {checks[label]}"
        )
    print(
        f"  all      one at a time {tot['seq']:7.1f} s, batched {tot['bat']:7.1f} s, "
        f"ratio {tot['seq'] / tot['bat']:.2f} "
        f"(cpu {tot['seq_cpu']:.1f} / {tot['bat_cpu']:.1f} s = {tot['seq_cpu'] / tot['bat_cpu']:.2f})"
    )
    scale = preset.trainer["rounds"] / args.rounds * len(preset.seeds) / args.seeds
    print(
        f"scaled linearly to the preset's {preset.trainer['rounds']} rounds x {len(preset.seeds)} seeds (an "
        f"estimate from the slice, see above): one at a time {tot['seq'] * scale / 60:.0f} min, batched "
        f"{tot['bat'] * scale / 60:.0f} min of wall time on one core at this load"
    )
    print(f"load average after: {_load()} (1 / 5 / 15 min)")


if __name__ == "__main__":
    main()
