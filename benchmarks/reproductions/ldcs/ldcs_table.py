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

    python -m benchmarks.reproductions.ldcs.ldcs_table --seeds 0 1 2 --threads 1
    python -m benchmarks.reproductions.ldcs.ldcs_table --table-only

(``--out`` defaults to this script's folder, ``benchmarks/reproductions/ldcs``.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.reproductions._holds import dirty_note, short_commit
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


def load_cell(cell_dir: Path) -> tuple[dict[str, dict[int, object]], dict[str, dict[int, str]]]:
    """(label -> {seed: History} of the finished runs, label -> {seed: error} of the failed ones) in one cell."""
    from fedselect.simulation.history import History

    out: dict[str, dict[int, object]] = {}
    failed: dict[str, dict[int, str]] = {}
    for path in run_files(cell_dir / "runs"):
        saved = json.loads(read_text(path))
        if saved.get("status") == "failed":
            err = saved.get("error") or {}
            failed.setdefault(saved["label"], {})[int(saved["seed"])] = f"{err.get('type')} in round {err.get('round')}"
            continue
        out.setdefault(saved["label"], {})[int(saved["seed"])] = History.from_dict(saved["history"])
    return out, failed


def cell_stats(runs: dict[int, object], at_round: int = 100, target: float = 0.85) -> dict[str, object]:
    """Per finished seed: convergent rounds (1 and 2 points), accuracy after ``at_round`` rounds, rounds to ``target``.

    Every list is aligned with ``seed_list`` (the sorted seeds), so two methods pair by seed; the
    accuracy is None for a run without round ``at_round``.
    """
    seeds = sorted(runs)
    acc: list[float | None] = []
    for s in seeds:
        hit = [r.test_accuracy for r in runs[s].rounds if r.round == at_round - 1 and r.test_accuracy is not None]
        acc.append(hit[0] if hit else None)
    return {
        "seeds": len(seeds),
        "seed_list": seeds,
        "convergent_each": [runs[s].convergent_round() for s in seeds],
        "convergent_2pp_each": [runs[s].convergent_round(tolerance=0.02) for s in seeds],
        "to_target_each": [runs[s].rounds_to_accuracy(target) for s in seeds],
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
        head = [
            "method",
            "partition",
            "runs",
            "conv. round (1 pt)",
            "conv. round (2 pt)",
            "acc. @ 100",
            f"rounds to {target:.0%}",
            "paper conv. round",
            "paper acc. @ 100",
        ]
        lines = [f"## K = {k}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for split in splits:
            cell, failed = load_cell(out / f"k{k}-{split}")
            for label in methods:
                st = cell_stats(cell.get(label, {}), target=target)
                st["failed"] = {str(seed): e for seed, e in sorted(failed.get(label, {}).items())}
                summary.setdefault(f"k{k}-{split}", {})[label] = st
                s = st["seeds"]
                paper = PRESETS[f"ldcs-fmnist-k{k}-{split}"].paper.get(label)
                p_round, p_acc = ("-", "-") if not paper else paper.replace(" (CIFAR-10)", "").split(" rounds, ")
                at_100 = [a for a in st["accuracy"] if a is not None]
                acc = _fmt(at_100, 2, 100.0) + (" %" if at_100 else "")
                runs = str(s) + (f" ({len(st['failed'])} failed)" if st["failed"] else "")
                lines.append(
                    "| "
                    + " | ".join(
                        [
                            label,
                            SPLIT_LABEL[split],
                            runs,
                            _some(st["convergent_each"], s),
                            _some(st["convergent_2pp_each"], s),
                            acc,
                            _some(st["to_target_each"], s),
                            p_round,
                            p_acc,
                        ]
                    )
                    + " |"
                )
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n", summary


PAPER_ROWS = ("Random", "Round robin (FLSim)", "Importance sampling (FLSim)")


def _pairs(summary: dict, method: str, key: str, ref: str = "LDCS", ks=KS, censor: float | None = None):
    """(method, ref) value pairs over every (cell, seed) of the given K; ``censor`` replaces None."""
    out = []
    for name, cell in summary.items():
        if int(name[1:].split("-")[0]) not in ks:
            continue
        a, b = cell.get(method), cell.get(ref)
        if not a or not b:
            continue
        by_seed = dict(zip(b["seed_list"], b[key]))
        for seed, x in zip(a["seed_list"], a[key]):
            if seed not in by_seed:
                continue
            y = by_seed[seed]
            x, y = (censor if x is None else x), (censor if y is None else y)
            if x is not None and y is not None:
                out.append((x, y))
    return out


def paired_vs(summary: dict, ref: str = "LDCS", target: float = 0.85) -> str:
    """Markdown table: ``ref`` against every other method over all (cell, seed) pairs.

    Runs of one seed share the federation (same partition and model start), so the
    differences are paired; the statistics are :func:`fedselect.compare.paired_summary`'s
    (two-sided Wilcoxon signed-rank test, ties dropped), and each column's p-values are
    Holm-adjusted over the methods compared (:func:`fedselect.compare.holm`).
    """
    from fedselect.compare import holm, paired_summary

    methods = [m for m in next(iter(summary.values())) if m != ref]
    head = [
        "method",
        f"pairs (rounds to {target:.0%})",
        "rounds: method − LDCS",
        "LDCS fewer / tie / more",
        "p",
        "p (Holm)",
        "pairs (acc.)",
        "acc. @ 100: LDCS − method (points)",
        "LDCS higher / tie / lower",
        "p",
        "p (Holm)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rounds = {m: _pairs(summary, m, "to_target_each", ref) for m in methods}
    acc = {m: [(b, a) for a, b in _pairs(summary, m, "accuracy", ref)] for m in methods}
    r_sum = {m: paired_summary([a - b for a, b in rounds[m]]) for m in methods}
    a_sum = {m: paired_summary([(a - b) * 100.0 for a, b in acc[m]]) for m in methods}
    r_holm = dict(zip(methods, holm([r_sum[m]["p"] for m in methods])))
    a_holm = dict(zip(methods, holm([a_sum[m]["p"] for m in methods])))

    def _cells(n: int, r: dict, ph: float) -> list[str]:
        if not n:
            return ["0", "-", "-", "-", "-"]
        return [
            str(n),
            f"{r['mean']:+.1f} ± {r['std']:.1f}",
            f"{r['faster']} / {r['ties']} / {r['slower']}",
            f"{r['p']:.3f}",
            f"{ph:.3f}",
        ]

    for m in methods:
        lines.append(
            "| "
            + " | ".join([m, *_cells(len(rounds[m]), r_sum[m], r_holm[m]), *_cells(len(acc[m]), a_sum[m], a_holm[m])])
            + " |"
        )
    return "\n".join(lines)


def paper_claim(k: int, ref: str = "LDCS") -> str:
    """What the paper's Table 1 shows for LDCS at this K against its three baselines (one run per cell)."""
    from fedselect.presets import PRESETS

    best_round = best_acc = 0
    for split in SPLITS:
        paper = PRESETS[f"ldcs-fmnist-k{k}-{split}"].paper
        vals = {m: paper[m].replace(" (CIFAR-10)", "").replace(" %", "").split(" rounds, ") for m in paper}
        rounds = {m: int(v[0]) for m, v in vals.items()}
        acc = {m: float(v[1]) for m, v in vals.items()}
        best_round += rounds[ref] <= min(rounds.values())
        best_acc += acc[ref] >= max(acc.values())
    return (
        f"LDCS has the earliest convergent round (ties included) in {best_round} of {len(SPLITS)} partitions "
        f"and the highest accuracy after 100 rounds in {best_acc} of {len(SPLITS)}"
    )


def verdicts(summary: dict, ref: str = "LDCS", alpha: float = 0.05, horizon: int = 100) -> list[str]:
    """The report's first lines: per K, does LDCS beat the paper's baselines here?

    Per K the pairs are every (partition, seed) with a finished run of both methods; the family is
    the paper's three baselines x two metrics (convergent round, a run that never converged
    counting as ``horizon``; accuracy after 100 rounds), Holm-adjusted over those of the six
    tests that have a p-value. *Reproduces*: LDCS is significantly better than every baseline on
    at least one metric and significantly worse on none; *partly*: better than some, named;
    *does not reproduce*: better than none.
    """
    from fedselect.compare import holm, paired_summary

    lines = []
    for k in KS:
        tests = []
        for m in PAPER_ROWS:
            conv = _pairs(summary, m, "convergent_each", ref, ks=(k,), censor=horizon)
            acc = _pairs(summary, m, "accuracy", ref, ks=(k,))
            # positive = LDCS better: fewer rounds, higher accuracy
            tests.append((m, "convergent round", paired_summary([a - b for a, b in conv]), "rounds"))
            tests.append((m, "accuracy @ 100", paired_summary([(b - a) * 100.0 for a, b in acc]), "points"))
        if not any(t[2]["diffs"] for t in tests):
            lines.append(f"- **K = {k}: no finished runs.**")
            continue
        adj = holm([t[2]["p"] for t in tests])
        better, worse, parts = set(), set(), []
        for (m, metric, r, unit), p in zip(tests, adj):
            sig = np.isfinite(p) and p < alpha
            if sig and r["mean"] > 0:
                better.add(m)
            if sig and r["mean"] < 0:
                worse.add(m)
            parts.append(f"{m} {metric} {r['mean']:+.1f} {unit} (p_Holm = {p:.3f})")
        if better == set(PAPER_ROWS) and not worse:
            verdict = "reproduces"
        elif better:
            verdict = f"partly reproduces (better than {', '.join(m for m in PAPER_ROWS if m in better)} only)"
        else:
            verdict = "does not reproduce"
        n = max(len(t[2]["diffs"]) for t in tests)
        n_tests = sum(1 for p in adj if np.isfinite(p))
        level = [m for m in PAPER_ROWS if m not in better | worse]
        lines.append(
            f"- **K = {k}: {verdict}.** Paper (CIFAR-10, one run per cell): {paper_claim(k, ref)}. Here "
            f"(up to {n} pairs: every partition and seed with both runs; LDCS's advantage, positive = LDCS better; "
            f"a run that never converged counts as {horizon}; Holm over {n_tests} tests): "
            + "; ".join(parts)
            + "."
            + (f" Significantly better than {', '.join(sorted(better))}." if better else "")
            + (f" Significantly worse than {', '.join(sorted(worse))}." if worse else "")
            + (f" Level with {', '.join(level)}." if level else "")
        )
    return lines


def provenance(out: Path) -> str:
    """One sentence: the commits and machines the finished runs under ``out`` record."""
    commits, machines, n, cells = set(), set(), 0, []
    for cell in sorted(out.glob("k*-*")):
        for path in run_files(cell / "runs"):
            saved = json.loads(read_text(path))
            n += 1
            cells.append({"label": saved.get("label"), "commit": saved.get("commit")})
            commits.add(short_commit(saved.get("commit")))
            m = saved.get("machine")
            machines.add(f"{m.get('cpu')}, {m.get('cpus')} CPUs" if m else "not recorded")
    note = dirty_note(cells)
    return (
        f"All {n} runs come from commit{'s' if len(commits) > 1 else ''} {', '.join(sorted(commits))}; "
        f"machine as the runs record it: {'; '.join(sorted(machines))}." + (f" {note}" if note else "")
    )


def plot_accuracy(comp, path: Path) -> None:
    """A cell's accuracy curves, drawn as ``Comparison.plot`` draws its ``accuracy.png``.

    The one picture of a cell the report shows; the cells' runs are compact records (no chosen
    clients), from which a selection-frequency picture would be empty.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedselect.plotting import figure_size
    from fedselect.plotting import plot_accuracy as draw

    res = {k: [v[s] for s in sorted(v)] for k, v in comp.histories.items()}
    failed = {label: len(runs) for label, runs in comp.failed.items() if runs}
    for label in failed:
        res.setdefault(label, [])
    fig, ax = plt.subplots(figsize=figure_size("accuracy", list(res), comp.n_clients), constrained_layout=True)
    draw(res, target=comp.target, ax=ax, title=comp.title, failed=failed)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def write_outputs(out: Path, methods: list[str]) -> str:
    """Write table.md, summary.json and REPORT.md (the table with a title and its cells' curves)."""
    text, summary = make_table(out, methods, ks=KS, splits=SPLITS)
    (out / "table.md").write_text(text)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    from fedselect.compare import load_comparison

    done = []
    for d in sorted(out.glob("k*-*")):
        if not run_files(d / "runs"):
            continue
        comp, _ = load_comparison(d, 0.85, title=f"FedLDCS {d.name}")
        plot_accuracy(comp, d / "accuracy.png")
        done.append(f"![{d.name}]({d.name}/accuracy.png)")
    report = [
        "# FedLDCS Table 1 on Fashion-MNIST: what reproduces and what does not",
        "",
        *verdicts(summary),
        "",
        provenance(out),
        "",
        "Generated by `python -m benchmarks.reproductions.ldcs.ldcs_table --table-only` from the runs of "
        "`python -m benchmarks.reproductions.ldcs.ldcs_table --seeds 0 1 2 --threads 1` (each run's JSON under "
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
            f"p (Holm): adjusted over the {len(methods) - 1} other methods, per column.",
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
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
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
                print(
                    f"[{time.strftime('%H:%M:%S')}] {preset.name}: done in {time.perf_counter() - start:.0f} s",
                    flush=True,
                )
                write_outputs(args.out, methods)
    text = write_outputs(args.out, methods)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
