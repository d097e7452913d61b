"""Reproduce FedLDCS's Table 1 (Hou and Kong, FedKDD 2024) on Fashion-MNIST, resumably.

Runs the ``ldcs-fmnist-k{K}-{split}`` presets (N = 10 clients, K in {7, 8, 9}, Dirichlet
beta 0.6 / 0.9 and IID; random, round robin and importance sampling in their textbook and
FLSim readings, and LDCS) over the given seeds, one :func:`fedselect.compare.run_comparison`
per (K, split) cell, each run saved under ``<out>/k<K>-<split>/runs/`` as it finishes; a
rerun skips finished runs. Cells run in the order K = 7, 8, 9 x dir0.6, dir0.9, iid, every
method and seed of a cell before the next, so a partial run still gives complete rows.

The table reports, per method and cell, the *convergent round* (SPEC / the paper's Table 1:
the first round t whose test accuracy stays within 1 percentage point over rounds t..t+9
and so to the end; :meth:`History.convergent_round`) and the test accuracy after round 100,
as mean ± std over seeds (``n/s`` when only n of s seeds converged), beside the paper's
CIFAR-10 figures.

Usage::

    python benchmarks/ldcs_table.py --seeds 0 1 2 --out benchmarks/results/ldcs --threads 1
    python benchmarks/ldcs_table.py --out benchmarks/results/ldcs --table-only
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from fedselect.compare import read_text, run_files

SPLITS = ("dir0.6", "dir0.9", "iid")
KS = (7, 8, 9)
SPLIT_LABEL = {"dir0.6": "β = 0.6", "dir0.9": "β = 0.9", "iid": "IID"}


def _fmt(values: list[float], digits: int = 1, scale: float = 1.0) -> str:
    if not values:
        return "-"
    v = np.asarray(values, dtype=float) * scale
    if v.size == 1:
        return f"{v[0]:.{digits}f}"
    return f"{v.mean():.{digits}f} ± {v.std():.{digits}f}"


def load_cell(cell_dir: Path) -> dict[str, dict[int, object]]:
    """Label -> {seed: History} of the finished runs in one cell directory."""
    from fedselect.simulation.history import History

    out: dict[str, dict[int, object]] = {}
    for path in run_files(cell_dir / "runs"):
        saved = json.loads(read_text(path))
        out.setdefault(saved["label"], {})[int(saved["seed"])] = History.from_dict(saved["history"])
    return out


def cell_stats(runs: dict[int, object], at_round: int = 100, target: float = 0.85) -> dict[str, object]:
    """Convergent rounds (1 and 2 points), accuracy after ``at_round`` rounds and rounds to ``target``."""
    hs = list(runs.values())
    acc = []
    for h in hs:
        hit = [r.test_accuracy for r in h.rounds if r.round == at_round - 1 and r.test_accuracy is not None]
        if hit:
            acc.append(hit[0])
    return {
        "seeds": len(hs),
        "convergent_each": [h.convergent_round() for h in hs],
        "convergent_2pp_each": [h.convergent_round(tolerance=0.02) for h in hs],
        "to_target_each": [h.rounds_to_accuracy(target) for h in hs],
        "accuracy": acc,
    }


def _some(each: list, seeds: int) -> str:
    """mean ± std of the seeds that got there, with 'n/s' when not all did."""
    ok = [x for x in each if x is not None]
    if not seeds:
        return "-"
    if not ok:
        return f"never (0/{seeds})"
    return _fmt(ok) + ("" if len(ok) == seeds else f" ({len(ok)}/{seeds})")


def make_table(out: Path, methods: list[str], ks=KS, splits=SPLITS, target: float = 0.85) -> tuple[str, dict]:
    """Markdown tables (one per K) and a JSON-able summary of every finished run under ``out``."""
    from fedselect.presets import PRESETS

    summary: dict[str, dict] = {}
    parts = [
        "Ours: Fashion-MNIST, FedCor's MLP, N = 10, 1 local epoch, batch 32, lr 0.01, 100 rounds, data-size "
        "aggregation; mean ± std (population) over the seeds finished, `(n/s)` = only n of s seeds got there. "
        "Convergent round (SPEC, the paper's Table 1): first round t (0-based) whose accuracy stays within 1 point "
        f"over t..t+9 and so to the end; the 2-point column relaxes that. Rounds to {target:.0%}: t + 1 of the "
        "first round at or above it. Paper: CIFAR-10 with a CNN, one run per cell (FLSim's round robin and "
        "importance sampling).",
    ]
    for k in ks:
        head = ["method", "partition", "runs", "conv. round (1 pt)", "conv. round (2 pt)", "acc. @ 100",
                f"rounds to {target:.0%}", "paper conv. round", "paper acc. @ 100"]
        lines = [f"## K = {k}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for split in splits:
            cell = load_cell(out / f"k{k}-{split}")
            for label in methods:
                st = cell_stats(cell.get(label, {}), target=target)
                summary.setdefault(f"k{k}-{split}", {})[label] = st
                s = st["seeds"]
                paper = PRESETS[f"ldcs-fmnist-k{k}-{split}"].paper.get(label)
                p_round, p_acc = ("-", "-") if not paper else paper.replace(" (CIFAR-10)", "").split(" rounds, ")
                acc = _fmt(st["accuracy"], 2, 100.0) + (" %" if st["accuracy"] else "")
                lines.append("| " + " | ".join([
                    label, SPLIT_LABEL[split], str(s), _some(st["convergent_each"], s),
                    _some(st["convergent_2pp_each"], s), acc, _some(st["to_target_each"], s), p_round, p_acc,
                ]) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n", summary


def paired_vs(summary: dict, ref: str = "LDCS", target: float = 0.85) -> str:
    """Markdown table: ``ref`` against every other method over all (cell, seed) pairs.

    Runs of one seed share the federation (same partition and model start), so the
    differences are paired; the statistics are :func:`fedselect.compare.paired_summary`'s
    (two-sided Wilcoxon signed-rank test, ties dropped).
    """
    from fedselect.compare import paired_summary

    methods = [m for m in next(iter(summary.values())) if m != ref]
    head = ["method", f"pairs (rounds to {target:.0%})", "rounds: method − LDCS", "LDCS fewer / tie / more",
            "p", "pairs (acc.)", "acc. @ 100: LDCS − method (points)", "LDCS higher / tie / lower", "p"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def _row(pairs: list[tuple[float, float]], scale: float) -> list[str]:
        if not pairs:
            return ["0", "-", "-", "-"]
        r = paired_summary([(a - b) * scale for a, b in pairs])
        return [str(len(pairs)), f"{r['mean']:+.1f} ± {r['std']:.1f}",
                f"{r['faster']} / {r['ties']} / {r['slower']}", f"{r['p']:.2f}"]

    for m in methods:
        rounds, acc = [], []
        for cell in summary.values():
            a, b = cell.get(m), cell.get(ref)
            if not a or not b:
                continue
            for x, y in zip(a["to_target_each"], b["to_target_each"]):
                if x is not None and y is not None:
                    rounds.append((x, y))
            acc.extend(zip(b["accuracy"], a["accuracy"]))
        lines.append("| " + " | ".join([m, *_row(rounds, 1.0), *_row(acc, 100.0)]) + " |")
    return "\n".join(lines)


def write_outputs(out: Path, methods: list[str]) -> str:
    """Write table.md, summary.json and REPORT.md (the table with a title and its cells' curves)."""
    text, summary = make_table(out, methods, ks=KS, splits=SPLITS)
    (out / "table.md").write_text(text)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    from fedselect.compare import load_comparison

    done = []
    for d in sorted(out.glob("k*-*")):
        if not run_files(d / "runs"):
            continue
        comp, _ = load_comparison(d, 0.85, title=f"FedLDCS {d.name}")
        comp.plot(d)
        done.append(f"![{d.name}]({d.name}/accuracy.png)")
    report = [
        "# FedLDCS Table 1 on Fashion-MNIST",
        "",
        "Generated by `python benchmarks/ldcs_table.py --table-only` from the runs of "
        "`python benchmarks/ldcs_table.py --seeds 0 1 2 --threads 1` (each run's JSON under "
        "`k<K>-<partition>/runs/` records its command and commit). A cell with fewer runs than seeds is "
        "still running or was not run; a cell with 0 runs is missing.",
        "",
        text,
    ]
    if "LDCS" in methods and len(methods) > 1:
        report += [
            "## LDCS against each method, paired by seed over all cells",
            "",
            "Each pair is one (K, partition, seed): both runs share the partition and the model's start. "
            "Positive numbers favour LDCS. The rounds column counts only pairs where both runs reached 85 %. "
            "The p-values are not corrected for the five comparisons (Bonferroni: multiply by 5).",
            "",
            paired_vs(summary),
            "",
        ]
    if done:
        report += ["## Accuracy curves of the finished cells", "", *done, ""]
    (out / "REPORT.md").write_text("\n".join(report))
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/ldcs"))
    ap.add_argument("--k", type=int, nargs="+", default=list(KS), choices=KS)
    ap.add_argument("--splits", nargs="+", default=list(SPLITS), choices=SPLITS)
    ap.add_argument("--methods", nargs="+", default=None, help="row labels of the presets (default: all)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (not part of a run's settings)")
    ap.add_argument("--table-only", action="store_true", help="aggregate finished runs, run nothing")
    args = ap.parse_args(argv)

    import torch

    from fedselect.compare import run_comparison
    from fedselect.presets import PRESETS

    torch.set_num_threads(args.threads)
    first = PRESETS[f"ldcs-fmnist-k{args.k[0]}-{args.splits[0]}"]
    methods = args.methods or list(first.selectors)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        for k in args.k:
            for split in args.splits:
                preset = PRESETS[f"ldcs-fmnist-k{k}-{split}"]
                selectors = {label: preset.selectors[label] for label in methods}
                start = time.perf_counter()
                run_comparison(
                    selectors,
                    federation=preset.federation,
                    trainer=preset.trainer,
                    seeds=args.seeds,
                    target=preset.target,
                    out_dir=args.out / f"k{k}-{split}",
                    progress=False,
                    paper=preset.paper,
                    title=preset.name,
                    command=[sys.executable, *sys.argv],
                )
                print(f"[{time.strftime('%H:%M:%S')}] {preset.name}: done in {time.perf_counter() - start:.0f} s",
                      flush=True)
                write_outputs(args.out, methods)
    text = write_outputs(args.out, methods)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
