"""Write REPORT.md and the pictures of the time-to-accuracy reproduction from the runs that exist.

Reads the jsonl records beside this script (whatever has finished, see
:mod:`benchmarks.reproductions.time.time_run`) and writes beside them:

- REPORT.md: first, per claim, what holds (Oort against random at equal over-commitment: 1.1 for
  both, none, FedScale's set at 1.3 for both; what over-commitment alone buys; the old headline's
  unequal setting; Oort against deadline-random; whether rounds and time rank the schemes alike),
  with numbers; then the time model, the horizon and its rule, the tables and the paired tests
  (with the pairs that carry information), the side tables and where the runs were made;
- accuracy_time.png, reached_time.png, reached_rounds.png (main table) and overcommit_time.png
  (random and Oort at each over-commitment): :func:`fedselect.plotting.plot_accuracy` and
  :func:`fedselect.plotting.plot_reached`, each seed carried to the horizon.

Every verdict is :meth:`fedselect.experiments.results.Comparison.paired` on
:class:`~fedselect.simulation.history.History` objects made from the records
(:func:`comparison_of`): one horizon H per comparison, every miss censored there (tied above every
hit), no verdict below :func:`fedselect.experiments.stats.min_pairs` pairs with information.
Nothing is hard-coded but the stored headline this run redoes (:data:`STORED`). Usage::

    python -m benchmarks.reproductions.time.time_report
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.reproductions.time.time_run import (
    CALIBRATION_SETTING,
    DEADLINE_SCHEMES,
    NO_OVERCOMMIT_SETTING,
    ROOT,
    SEEDS,
    SETTING,
    SIDE_TABLES,
    TARGET_GRID,
    TARGET_WITHIN,
    builtin_selectors,
    calibrated_target,
    read_records,
    setting_id,
    time_budget_of,
)
from fedselect.experiments.results import Comparison
from fedselect.experiments.stats import holm, min_pairs
from fedselect.simulation.history import History, RoundRecord

ALPHA = 0.05
REFERENCE = "random"
PAPER_SPEEDUP = "1.2-14.1x"  # Oort (OSDI 2021): time-to-accuracy over random, with FedScale's device traces
#: The stored headline this run redoes (REPORT.md at commit a6bb7d5: Oort over-committing 1.1, random not at all).
STORED = {"oort_vs_random": 2.63, "oort_vs_deadline_random": 1.49, "commit": "a6bb7d5"}
#: What was uncommitted when a runner process read a ``-dirty`` commit (provenance, written down when it happened).
DIRTY_NOTES = {
    "21d2c1a": "the old records' deletion only; its runner differs from eaaeb93's only at over-commitment 1.0, "
    "which the calibration does not use",
    "dcbb091": "time_report.py and the tests only",
    "8a63b80": "test edits, and perhaps a mutation test's edit of time_run.py or time_report.py (those edits touch "
    "Oort and over-commitment 1.0 only; that process ran neither, and no run errored)",
}

# -------------------------------------------------------------------------- records -> Comparison


def history_of(record: Mapping[str, Any]) -> History:
    """A record as a :class:`History`: per round its test accuracy, simulated seconds and time, failures.

    The config carries what :meth:`Comparison.horizon` reads: the round cap (``rounds``) and the
    time budget (``time_budget``) the run was given.
    """
    times = np.cumsum(np.asarray(record["sim_seconds"], dtype=np.float64))
    rounds = [
        RoundRecord(
            round=t,
            clients=[],
            test_accuracy=a,
            failed=list(range(int(f))),
            sim_seconds=float(s),
            sim_time=float(times[t]),
        )
        for t, (a, s, f) in enumerate(zip(record["test_accuracy"], record["sim_seconds"], record["failed"]))
    ]
    setting = record.get("setting", {})
    config = {"trainer": {"rounds": int(setting.get("rounds", len(rounds))), "time_budget": record.get("time_budget")}}
    return History(rounds, 0, config)


def comparison_of(labelled: Mapping[str, Iterable[Mapping[str, Any]]], target: float) -> Comparison:
    """A :class:`Comparison` of the records under each label (label -> records, one per seed).

    A run that raised (``error`` set) is a failed run (:attr:`Comparison.failed`, with its type and
    the rounds it completed): a ``DivergenceError`` is censored like any miss in the paired tests
    (``diverged="not-reached"``), any other failure leaves its seed out.
    """
    histories: dict[str, dict[int, History]] = {}
    failed: dict[str, dict[int, dict[str, Any]]] = {}
    n_clients = 0
    for label, records in labelled.items():
        histories[label] = {}
        for r in records:
            n_clients = max(n_clients, int(r.get("setting", {}).get("n_clients", 0) or 0))
            if r.get("error"):
                kind, _, message = str(r["error"]).partition(":")
                n = int(r["rounds_run"])
                failed.setdefault(label, {})[int(r["seed"])] = {
                    "type": kind.strip(),
                    "message": message.strip(),
                    "round": n,
                    "rounds_completed": n,
                }
            else:
                histories[label][int(r["seed"])] = history_of(r)
    return Comparison(histories, float(target), n_clients, failed=failed)


def paired_rows(comp: Comparison, metric: str = "time", reference: str = REFERENCE) -> dict[str, dict[str, Any]]:
    """:meth:`Comparison.paired` against ``reference`` (misses censored at the horizon; one Holm family), by scheme."""
    if not comp.histories.get(reference):
        return {}
    return {r["scheme"]: r for r in comp.paired(reference, metric=metric, diverged="not-reached")}


def verdict(row: Mapping[str, Any], alpha: float = ALPHA) -> str:
    """ "faster" / "slower" than the reference (Holm-adjusted p < alpha, by the sign of the mean difference),
    "no verdict" when too few pairs carry information, else "not different"."""
    if not row.get("verdict", True):
        return "no verdict"
    p = row.get("p_holm", math.nan)
    if p == p and p < alpha:
        return "faster" if row["mean"] < 0 else "slower"
    return "not different"


def _fmt_p(p: float) -> str:
    return "-" if p != p else f"{p:.3f}"


def _reached(comp: Comparison, label: str, metric: str = "time") -> tuple[int, int]:
    """Seeds of ``label`` at the target by the horizon, and all its seeds (failed runs included)."""
    H, _ = comp.horizon(metric)
    hits = 0
    for h in comp.histories.get(label, {}).values():
        v = h.time_to_accuracy(comp.target) if metric == "time" else h.rounds_to_accuracy(comp.target)
        hits += v is not None and H is not None and v <= H
    return hits, len(comp.histories.get(label, {})) + len(comp.failed.get(label, {}))


def speedup(comp: Comparison, label: str, reference: str = REFERENCE) -> tuple[float, float, int] | None:
    """Ratio of mean times to the target (reference / label) and per-seed median ratio, over the seeds both reached
    by the horizon, and how many those are; None when there is none."""
    H, _ = comp.horizon("time")
    a, b = comp.histories.get(label, {}), comp.histories.get(reference, {})
    pairs = []
    for s in sorted(set(a) & set(b)):
        ta, tb = a[s].time_to_accuracy(comp.target), b[s].time_to_accuracy(comp.target)
        if ta is not None and tb is not None and H is not None and ta <= H and tb <= H and ta > 0:
            pairs.append((tb, ta))
    if not pairs:
        return None
    tb, ta = np.array(pairs).T
    return float(tb.mean() / ta.mean()), float(np.median(tb / ta)), len(pairs)


def claim_line(
    comp: Comparison,
    label: str,
    reference: str,
    *,
    title: str,
    family: str,
    row: Mapping[str, Any] | None = None,
    stored: float | None = None,
    word: str = "reproduces",
) -> str:
    """One bullet: is ``label`` faster than ``reference`` in simulated time to the target here, with its numbers.

    ``row`` is the paired row (default: ``comp.paired`` of the two); *reproduces* when its verdict is
    "faster" (p_Holm < alpha over ``family``), *no verdict* when fewer than ``min_pairs()`` pairs
    carry information, else *does not reproduce* with the direction (``word="holds"``: *holds* / *does not
    hold*, for a claim that is not a paper's).
    """
    if row is None:
        row = paired_rows(comp, "time", reference).get(label)
    if row is None or not row["seeds"]:
        return f"- **{title}: not tested** (no seed with finished runs of both)."
    v = verdict(row)
    negated = {"reproduces": "does not reproduce", "holds": "does not hold"}[word]
    status = {
        "faster": word,
        "slower": f"{negated} ({label} is slower)",
        "not different": f"{negated} (no significant difference)",
        "no verdict": f"no verdict (only {row['informative']} pair(s) carry information; {min_pairs(ALPHA)} needed)",
    }[v]
    hit_l, n_l = _reached(comp, label)
    hit_r, n_r = _reached(comp, reference)
    sp = speedup(comp, label, reference)
    ratio = (
        f"a speed-up of {sp[0]:.2f}x (ratio of mean times over the {sp[2]} seeds both reached; per-seed median "
        f"{sp[1]:.2f}x)"
        if sp
        else "no seed on which both reached the target"
    )
    then = f"; the stored report (commit {STORED['commit']}) said {stored:.2f}x" if stored is not None else ""
    return (
        f"- **{title}: {status}.** {label} reached the target on {hit_l} of {n_l} seed(s) by H = "
        f"{row['horizon']:.0f} s, {reference} on {hit_r} of {n_r}; {ratio}{then}. {label} − {reference} "
        f"{row['mean']:+.0f} s (median {row['median']:+.0f}; misses censored at H), {label} faster on "
        f"{row['slower']}, slower on {row['faster']}, tied on {row['ties']}; pairs with information "
        f"{row['informative']} of {len(row['seeds'])}; p = {_fmt_p(row['p'])}, p_Holm = {_fmt_p(row['p_holm'])} "
        f"({family})."
    )


def cross(
    first: Iterable[Mapping[str, Any]], second: Iterable[Mapping[str, Any]], scheme: str, labels: tuple[str, str]
) -> dict[str, list[Mapping[str, Any]]]:
    """``scheme``'s records of two tables under two labels (the second is the reference), paired by seed."""
    return {
        labels[1]: [r for r in second if r["scheme"] == scheme],
        labels[0]: [r for r in first if r["scheme"] == scheme],
    }


def overcommit_alone(
    main: Sequence[Mapping[str, Any]], none: Sequence[Mapping[str, Any]], target: float, schemes: Sequence[str]
) -> list[str]:
    """Bullets: each scheme at the main table's over-commitment against itself at none, paired by seed across the
    two tables (one Holm family over the schemes)."""
    f_main, f_none = SETTING["overcommit"], NO_OVERCOMMIT_SETTING["overcommit"]
    tests = []
    for scheme in schemes:
        labels = (f"{scheme} @ {f_main:.1f}", f"{scheme} @ {f_none:.1f}")
        comp = comparison_of(cross(main, none, scheme, labels), target)
        row = paired_rows(comp, "time", labels[1]).get(labels[0]) if comp.histories.get(labels[1]) else None
        if row is not None and row["seeds"]:
            tests.append((scheme, labels, comp, row))
    for (_, _, _, row), p in zip(tests, holm([row["p"] for *_, row in tests])):
        row["p_holm"] = p
    names = ", ".join(s for s, *_ in tests)
    return [
        claim_line(
            comp,
            labels[0],
            labels[1],
            row=row,
            title=f"What over-commitment alone buys {scheme} ({f_main:.1f} against {f_none:.1f}, across two tables)",
            family=f"Holm over {names}",
            word="holds",
        )
        for scheme, labels, comp, row in tests
    ]


# -------------------------------------------------------------------------- rounds against time


def ranking(comp: Comparison, metric: str) -> list[str]:
    """Schemes by their mean censored value (a miss counts as the censored value C) over their seeds, fastest
    first: the values :meth:`Comparison.paired` tests."""
    H, _ = comp.horizon(metric)
    rows = paired_rows(comp, metric)
    C = next(iter(rows.values()))["censored_value"] if rows else (H or 0.0) + 1.0

    def value(h: History) -> float:
        v = h.time_to_accuracy(comp.target) if metric == "time" else h.rounds_to_accuracy(comp.target)
        return float(v) if v is not None and H is not None and v <= H else C

    means = {k: float(np.mean([value(h) for h in runs.values()])) for k, runs in comp.histories.items() if runs}
    return sorted(means, key=lambda k: (means[k], k))


def headline(comp: Comparison, *, reference: str = REFERENCE) -> list[str]:
    """Bullets: do rounds and time rank the schemes alike, and which verdicts against ``reference`` flip.

    Each scheme gets a verdict in rounds and in simulated time (:meth:`Comparison.paired`, each at
    its own horizon, two Holm families); a scheme whose two verdicts differ is named with both.
    """
    from scipy.stats import kendalltau

    if reference not in comp.histories or len(comp.histories) < 2:
        return [f"- **Nothing to compare yet**: {reference} and at least one other scheme need finished runs."]
    by_rounds, by_time = ranking(comp, "rounds"), ranking(comp, "time")
    rows_r, rows_t = paired_rows(comp, "rounds"), paired_rows(comp, "time")
    if rows_r and all(r["both_censored"] == len(r["seeds"]) for r in rows_r.values()):
        H, rule = comp.horizon("rounds")
        return [
            f"- **Rounds give no ranking and no verdict here**: every run is censored at the rounds horizon (round "
            f"{H:.0f}: {rule}"
            + (f"; set by {_short_misses(comp, 'rounds')}" if "earliest end" in rule else "")
            + "): a run that missed stopped at the time budget before any scheme reached the target, so no run reached "
            f"it within the rounds every run was observed for. By simulated time: {', '.join(by_time)}."
        ]
    flips, silent = [], {"rounds": [], "time": []}
    for scheme in by_rounds:
        if scheme in rows_r and scheme in rows_t:
            vr, vt = verdict(rows_r[scheme]), verdict(rows_t[scheme])
            for metric, v in (("rounds", vr), ("time", vt)):
                if v == "no verdict":
                    silent[metric].append(scheme)
            if vr != vt and "no verdict" not in (vr, vt):
                flips.append(
                    f"{scheme} is {vr} in rounds ({rows_r[scheme]['mean']:+.1f} rounds, p_Holm "
                    f"{_fmt_p(rows_r[scheme]['p_holm'])}) but {vt} in time ({rows_t[scheme]['mean']:+.0f} s, "
                    f"p_Holm {_fmt_p(rows_t[scheme]['p_holm'])})"
                )
    pos_t = {k: i for i, k in enumerate(by_time)}
    shared = [k for k in by_rounds if k in pos_t]
    tau = float(kendalltau(list(range(len(shared))), [pos_t[k] for k in shared]).statistic) if len(shared) > 1 else 1.0
    same = by_rounds == by_time
    lines = [
        f"- **{'Rounds and time rank the schemes alike' if same else 'Rounds and time rank the schemes differently'}** "
        f"(mean over the seeds, a miss counted at its horizon's censored value, fastest first; Kendall's tau = "
        f"{tau:.2f}). By rounds: {', '.join(by_rounds)}. By simulated time: {', '.join(by_time)}."
    ]
    if flips:
        lines.append(
            f"- **Verdicts against {reference} that change from rounds to time** (paired by seed, misses censored, "
            f"Wilcoxon, Holm within each family, alpha {ALPHA}): " + "; ".join(flips) + "."
        )
    else:
        lines.append(
            f"- Every scheme's verdict against {reference} (faster / slower / not different / no verdict; paired by "
            f"seed, misses censored, Wilcoxon, Holm within each family, alpha {ALPHA}) is the same in rounds and in "
            "time."
        )
    for metric, names in silent.items():
        if names:
            H, rule = comp.horizon(metric)
            at = f"round {H:.0f}" if metric == "rounds" else f"{H:.0f} s"
            lines.append(
                f"- No verdict in {metric} against {reference} for {', '.join(names)}: fewer than "
                f"{min_pairs(ALPHA)} pairs carry information at the horizon ({at}: {rule}"
                + (f"; set by {_short_misses(comp, metric)}" if "earliest end" in rule else "")
                + ")."
            )
    return lines


def _short_misses(comp: Comparison, metric: str) -> str:
    """The runs that missed the target and ended at the horizon: they set it (the earliest end of a miss)."""
    H, _ = comp.horizon(metric)
    ends = []
    for label, runs in comp.histories.items():
        for seed, h in sorted(runs.items()):
            if h.rounds_to_accuracy(comp.target) is None:
                end = len(h) if metric == "rounds" else (h.rounds[-1].sim_time if h.rounds else None)
                if end is not None and H is not None and float(end) <= H:
                    ends.append(f"{label} seed {seed}")
    return ", ".join(ends) or "no run"


def where_time_goes(
    records: Sequence[Mapping[str, Any]], *, reference: str = REFERENCE, share: float = 0.1, shorter: float = 0.75
) -> str | None:
    """One bullet: the schemes that spend at least ``share`` of their simulated time on oracle questions, and those
    whose rounds last under ``shorter`` x the reference's (means over all their runs)."""
    by: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        by.setdefault(r["scheme"], []).append(r)
    if reference not in by:
        return None

    def mean(scheme: str, key: str) -> float:
        if key == "round_seconds":
            xs = [float(np.mean(r["sim_seconds"])) for r in by[scheme] if r["sim_seconds"]]
        else:
            xs = [r[key] for r in by[scheme] if r.get(key) is not None]
        return float(np.mean(xs)) if xs else math.nan

    ref_round = mean(reference, "round_seconds")
    asking = sorted((k for k in by if mean(k, "question_share") >= share), key=lambda k: -mean(k, "question_share"))
    quick = sorted(
        (k for k in by if k != reference and mean(k, "round_seconds") < shorter * ref_round),
        key=lambda k: mean(k, "round_seconds"),
    )
    parts = []
    if asking:
        parts.append(
            "waiting on oracle questions takes "
            + ", ".join(f"{100 * mean(k, 'question_share'):.0f} % ({k})" for k in asking)
            + " of the simulated time"
        )
    if quick:
        parts.append(
            "rounds last "
            + ", ".join(f"{mean(k, 'round_seconds'):.1f} s ({k})" for k in quick)
            + f" on average against {reference}'s {ref_round:.1f} s"
        )
    return f"- Where the time goes: {'; '.join(parts)}." if parts else None


def identical_runs(records: Iterable[Mapping[str, Any]], a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` share seeds and, on each, have equal per-round accuracy, seconds and failures."""
    keys = ("test_accuracy", "sim_seconds", "failed")
    runs = {(r["scheme"], r["seed"]): r for r in records}
    seeds = {s for k, s in runs if k == a} & {s for k, s in runs if k == b}
    return bool(seeds) and all(runs[a, s][k] == runs[b, s][k] for s in seeds for k in keys)


# -------------------------------------------------------------------------- tables


def _mean_std(xs: Sequence[float], digits: int) -> str:
    return f"{np.mean(xs):.{digits}f} ± {np.std(xs):.{digits}f}"


def summary_table(
    comp: Comparison, records: Sequence[Mapping[str, Any]], order: Sequence[str], expected_seeds: int
) -> str:
    """Per scheme: seeds at the target by each horizon, rounds and time to it, final accuracy, round length,
    question share, failures, cost."""
    by: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        by.setdefault(r["scheme"], []).append(r)
    H_t, _ = comp.horizon("time")
    H_r, _ = comp.horizon("rounds")
    lines = [
        f"| scheme | runs | at the target by {H_t:.0f} s | rounds to target | time to target (sim. s) | final accuracy "
        "| rounds run | mean round (sim. s) | time in oracle questions | failed / round | CPU s / run |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for scheme in order:
        runs = by.get(scheme, [])
        if not runs:
            lines.append(f"| {scheme} | 0/{expected_seeds} | | not run | | | | | | | |")
            continue
        hs = list(comp.histories.get(scheme, {}).values())
        rounds = [h.rounds_to_accuracy(comp.target) for h in hs]
        times = [h.time_to_accuracy(comp.target) for h in hs]
        hit_r = [float(v) for v in rounds if v is not None and v <= H_r]
        hit_t = [float(v) for v in times if v is not None and v <= H_t]
        n = len(runs)
        cell_r = _mean_std(hit_r, 1) if len(hit_r) == n else f"N/A ({len(hit_r)}/{n} by round {H_r:.0f})"
        cell_t = (
            _mean_std(hit_t, 0)
            if len(hit_t) == n
            else f"N/A ({len(hit_t)}/{n}" + (f"; they took {_mean_std(hit_t, 0)})" if hit_t else ")")
        )
        finals = [r["final_accuracy"] for r in runs if r["final_accuracy"] is not None]
        errors = sum(1 for r in runs if r.get("error"))
        lines.append(
            f"| {scheme} | {n}/{expected_seeds}{f' ({errors} failed)' if errors else ''} | {len(hit_t)}/{n} | "
            f"{cell_r} | {cell_t} | {_mean_std(finals, 4) if finals else ''} | "
            f"{np.mean([r['rounds_run'] for r in runs]):.0f} | "
            f"{np.mean([np.mean(r['sim_seconds']) for r in runs if r['sim_seconds']]):.1f} | "
            f"{100 * np.mean([r['question_share'] or 0.0 for r in runs]):.1f} % | "
            f"{np.mean([np.mean(r['failed']) for r in runs if r['failed']]):.2f} | "
            f"{np.mean([r['cpu_seconds'] for r in runs]):.1f} |"
        )
    return "\n".join(lines)


# -------------------------------------------------------------------------- pictures


def _save(fig: Any, path: Path) -> None:
    """Save a figure as a small PNG (a 256-colour palette)."""
    fig.savefig(path, dpi=90, bbox_inches="tight")
    try:
        from PIL import Image

        with Image.open(path) as im:
            small = im.convert("RGB").quantize(colors=256)
        small.save(path, optimize=True)
    except ImportError:  # matplotlib's own PNG, larger
        pass


def plot_pictures(
    comp: Comparison,
    order: Sequence[str],
    out_dir: Path,
    *,
    prefix: str = "",
    kinds: Sequence[str] = ("accuracy_time", "reached_time", "reached_rounds"),
) -> list[str]:
    """accuracy_time.png, reached_time.png and reached_rounds.png of ``comp`` (each seed carried to its end, the
    horizons marked): :func:`fedselect.plotting.plot_accuracy` and :func:`fedselect.plotting.plot_reached`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedselect.plotting import plot_accuracy, plot_reached

    res = {k: [comp.histories[k][s] for s in sorted(comp.histories[k])] for k in order if comp.histories.get(k)}
    failed = {k: len(v) for k, v in comp.failed.items() if v}
    H_t, H_r = comp.horizon("time")[0], comp.horizon("rounds")[0]
    draws = {
        "accuracy_time.png": lambda ax: plot_accuracy(
            res, target=comp.target, ax=ax, failed=failed, x="time", setting=False, title="accuracy vs simulated time"
        ),
        "reached_time.png": lambda ax: plot_reached(
            res, comp.target, x="time", horizon=H_t, ax=ax, failed=failed, setting=False, title="seeds at the target"
        ),
        "reached_rounds.png": lambda ax: plot_reached(
            res, comp.target, horizon=H_r, ax=ax, failed=failed, setting=False, title="seeds at the target"
        ),
    }
    names = []
    for name, draw in draws.items():
        if name.removesuffix(".png") not in kinds:
            continue
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        draw(ax)
        if "time" in name and H_t is not None:
            ax.set_xlim(0, H_t * 1.02)
        _save(fig, out_dir / f"{prefix}{name}")
        plt.close(fig)
        names.append(f"{prefix}{name}")
    return names


# -------------------------------------------------------------------------- the report


def _setting_text(setting: Mapping[str, Any]) -> str:
    pp = ", ".join(f"{k} {v}" for k, v in setting["partition_params"].items())
    deadline = "none" if setting["deadline"] is None else f"{setting['deadline']:g} s (stragglers fail)"
    known = "known to the server (declared)" if setting.get("server_knows_profiles") else "not known to the server"
    oc = float(setting["overcommit"])
    over = (
        f"over-commitment {oc:g} for every scheme (ceil({oc:g} K) asked, the first K to finish kept)"
        if oc > 1
        else "no over-commitment"
    )
    return (
        f"{setting['dataset']} over {setting['n_clients']} clients ({setting['partition']} partition, {pp}), "
        f"model {setting['model']}, {setting['clients_per_round']} clients a round, {setting['local_steps']} local "
        f"steps of batch {setting['batch_size']}, lr {setting['lr']}, at most {setting['rounds']} rounds; devices "
        f"{setting['profiles']}({', '.join(f'{k}={v}' for k, v in setting['profile_params'].items()) or 'defaults'}) "
        f"seeded by the run's seed; profiles {known}; deadline {deadline}; {over}; Oort's parameter set "
        f"{setting.get('oort_variant', 'oort')!r}"
    )


def _provenance(records: Sequence[Mapping[str, Any]]) -> str:
    if not records:
        return "no runs."
    commits = sorted({r["commit"] for r in records})
    cpus = sorted(
        {
            f"{r['machine']['cpu']} ({r['machine']['cpus']} cores, torch {r['machine']['torch']}, "
            f"{r['machine']['torch_threads']} thread)"
            for r in records
        }
    )
    dates = sorted(r["finished"] for r in records)
    dirty = [c for c in commits if c.endswith("-dirty")]
    said = [f"{c[:7]}: {DIRTY_NOTES[c[:7]]}" for c in dirty if c[:7] in DIRTY_NOTES]
    note = (
        f" Runs at {', '.join(f'`{c}`' for c in dirty)} were made from a working tree with uncommitted changes "
        f"({sum(1 for r in records if r['commit'] in dirty)} runs)"
        + (f"; uncommitted then: {'; '.join(said)}." if said else ".")
        if dirty
        else " Every run at a clean commit."
    )
    return (
        f"{len(records)} runs, commit(s) {', '.join(f'`{c}`' for c in commits)}; machine(s): {'; '.join(cpus)}; "
        f"finished {dates[0]} to {dates[-1]}; {sum(float(r['cpu_seconds']) for r in records) / 60:.1f} "
        f"CPU-minutes.{note}"
    )


def _seed_list(seeds: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    parts: list[str] = []
    for s in sorted(seeds):
        if parts and s == int(parts[-1].split("-")[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{s}"
        else:
            parts.append(str(s))
    return ", ".join(parts)


def _missing(records: Sequence[Mapping[str, Any]], schemes: Sequence[str], seeds: Sequence[int]) -> list[str]:
    have = {(r["scheme"], r["seed"]) for r in records}
    return [
        f"{k} seed(s) {_seed_list([s for s in seeds if (k, s) not in have])}"
        for k in schemes
        if any((k, s) not in have for s in seeds)
    ]


def _loss_term(schemes: Sequence[str]) -> str:
    """The schemes whose runs were charged the chosen clients' pre-training loss evaluation (``needs`` has
    "losses": ``FederatedTrainer(feedback_losses="auto")``)."""
    from fedselect.plugins import get_selector_class

    out = []
    for s in schemes:
        try:
            if "losses" in get_selector_class(s).needs:
                out.append(s)
        except Exception:  # a scheme no longer registered: not named
            continue
    return ", ".join(out) or "none"


def _load(root: Path, name: str, setting: Mapping[str, Any], target: float, budget: float | None) -> list[dict]:
    """The records of ``name`` with these settings, target and budget; of a (scheme, seed) run twice (two runner
    processes), the first."""
    out: dict[tuple[str, int], dict] = {}
    for r in read_records(root / name):
        if r.get("setting_id") == setting_id(setting) and r.get("target") == target and r.get("time_budget") == budget:
            out.setdefault((r["scheme"], int(r["seed"])), r)
    return list(out.values())


def write_report(
    root: Path = ROOT,
    *,
    main_schemes: Sequence[str] | None = None,
    seeds: Sequence[int] = SEEDS,
    main_setting: Mapping[str, Any] = SETTING,
    side_tables: Sequence[tuple[str, Mapping[str, Any]]] = SIDE_TABLES,
    calibration_setting: Mapping[str, Any] = CALIBRATION_SETTING,
) -> Path:
    """Write ``root/REPORT.md`` and its pictures from the jsonl records in ``root``; return the report's path."""
    calib = [
        r for r in read_records(root / "calibration.jsonl.gz") if r["setting_id"] == setting_id(calibration_setting)
    ]
    if not calib:
        raise SystemExit(f"no calibration runs in {root}: run time_run first")
    target = calibrated_target(calib, rounds=int(calibration_setting["rounds"]))
    budget = time_budget_of(calib, target, float(main_setting["time_budget_factor"]))
    main = _load(root, "main.jsonl.gz", main_setting, target, budget)
    sides = [(name, setting, _load(root, name, setting, target, budget)) for name, setting in side_tables]
    side = {setting["table"]: recs for _, setting, recs in sides}
    schemes = list(main_schemes) if main_schemes is not None else builtin_selectors()
    comp = comparison_of({k: [r for r in main if r["scheme"] == k] for k in schemes}, target)
    comp.histories = {k: v for k, v in comp.histories.items() if v or comp.failed.get(k)}
    order = ranking(comp, "time") if REFERENCE in comp.histories else [k for k in schemes if comp.histories.get(k)]
    missing = _missing(main, schemes, seeds)
    H_t, rule_t = comp.horizon("time")
    H_r, rule_r = comp.horizon("rounds")
    rows_t = paired_rows(comp, "time") if REFERENCE in comp.histories else {}
    oc = float(main_setting["overcommit"])

    claims = [
        claim_line(
            comp,
            "oort",
            REFERENCE,
            row=rows_t.get("oort"),
            title=f"Oort faster than random at equal over-commitment ({oc:g} for both, the main table)",
            family=f"Holm over the main table's {len(rows_t)} schemes against random",
        )
    ]
    for table, what in (
        ("no-overcommit", "with no over-commitment for either"),
        ("fedscale", "with FedScale's set"),
        ("deadline", "with a {deadline:g} s deadline (stragglers fail), profiles not known"),
        ("deadline-known", "with the same deadline, profiles declared to the server"),
    ):
        recs = side.get(table, [])
        setting = next(s for _, s in side_tables if s["table"] == table) if recs else None
        if setting is None:
            claims.append(f"- **Oort faster than random {what}: not run yet** (`{table}.jsonl.gz`).")
            continue
        scomp = comparison_of({k: [r for r in recs if r["scheme"] == k] for k in DEADLINE_SCHEMES}, target)
        srows = paired_rows(scomp, "time") if scomp.histories.get(REFERENCE) else {}
        what = what.format(deadline=float(setting["deadline"] or 0.0))
        extra = f" (Oort variant 'fedscale', {float(setting['overcommit']):g} for both)" if table == "fedscale" else ""
        claims.append(
            claim_line(
                scomp,
                "oort",
                REFERENCE,
                row=srows.get("oort"),
                title=f"Oort faster than random {what}{extra}",
                family=f"Holm over the `{table}` table's {len(srows)} schemes against random",
            )
        )
    none = side.get("no-overcommit", [])
    if none:
        claims += overcommit_alone(main, none, target, DEADLINE_SCHEMES)
        f_none = float(NO_OVERCOMMIT_SETTING["overcommit"])
        labels = (f"oort @ {oc:.1f}", f"random @ {f_none:.1f}")
        old = comparison_of(
            {
                labels[1]: [r for r in none if r["scheme"] == REFERENCE],
                labels[0]: [r for r in main if r["scheme"] == "oort"],
            },
            target,
        )
        claims.append(
            claim_line(
                old,
                labels[0],
                labels[1],
                title=f"The old headline's setting (Oort at {oc:.1f}, random at {f_none:.1f}; two tables)",
                family="one test",
                stored=STORED["oort_vs_random"],
            )
        )
    dr = comparison_of({k: [r for r in main if r["scheme"] == k] for k in ("deadline-random", "oort")}, target)
    claims.append(
        claim_line(
            dr,
            "oort",
            "deadline-random",
            title=f"Oort faster than deadline-random at equal over-commitment ({oc:g} for both)",
            family="one test",
            stored=STORED["oort_vs_deadline_random"],
        )
        if dr.histories.get("deadline-random")
        else "- **Oort against deadline-random: not tested** (no runs of deadline-random)."
    )

    n_done, n_all = len(main), len(schemes) * len(seeds)
    calib_hits = [h.rounds_to_accuracy(target) or 0 for h in (history_of(r) for r in calib)]
    out = [
        "# Time to accuracy: every built-in scheme in rounds and in simulated seconds (our setting)",
        "",
        f"Issues 22 (item 5) and 33 (item 3). **Our setting, not a paper's**; {n_done} of {n_all} runs of the main "
        "table finished" + (f" (missing: {'; '.join(missing)})." if missing else "."),
        "",
        "## What holds",
        "",
        f"Every scheme of every table runs to the target {target:.3f} or to one time budget, H = {budget:.1f} "
        "simulated seconds, whichever comes first; a run that misses is censored at H (tied above every hit), "
        f"never at its own end. Paired by seed, two-sided Wilcoxon; no verdict below {min_pairs(ALPHA)} pairs with "
        "information.",
        "",
        *claims,
        *headline(comp),
        *([line] if (line := where_time_goes(main)) else []),
        "",
        "## The time model, the target and the horizon",
        "",
        f"- Main table: {_setting_text(main_setting)}.",
        "- Device profiles: `fedselect.profiles.sample_profiles` with its defaults: a forward pass per sample takes "
        "4.53 ms x LogNormal(0, 0.6) (FedScale's `get_completion_time_lognormal`: 0.005 s per trained sample x "
        "LogNormal(1, 0.6), divided by training's 3 forward passes; drawn once per client), bandwidth 6,100 kbit/s "
        "x LogNormal(0, 1.1) both ways (a reading of FedScale's MobiPerf device-capacity trace), no latency, always "
        "online; selectors choose among the clients online at the round's start.",
        '- A round lasts its critical path (SPEC "Time"): each oracle question waits for its slowest answer, then '
        "the training exchange waits for the slowest kept client's download, training and upload. Two terms are "
        "ours, not FedScale's: (1) the chosen clients' loss on the global model before training (a forward pass over "
        'their data) is computed, charged and timed only for selectors whose `needs` has "losses" '
        f'(`feedback_losses="auto"`; here: {_loss_term(schemes)}); (2) a client lost mid-round is waited for until '
        "its update was due. With over-commitment the round ends when the first K of the ceil(f K) asked have "
        "reported; the others are cut (counted in failed / round).",
        f"- Target {target:.3f}: the highest multiple of {TARGET_GRID} that random (over-committing "
        f"{float(calibration_setting['overcommit']):g}) reaches within the first "
        f"{int(TARGET_WITHIN * calibration_setting['rounds'])} rounds on every one of {len(calib)} calibration "
        f"seeds ({_seed_list([r['seed'] for r in calib])}; not the tables' seeds); there it took "
        f"{min(calib_hits)}-{max(calib_hits)} rounds.",
        f"- Time budget {budget:.1f} s = {float(main_setting['time_budget_factor']):g} x the longest simulated time "
        "a calibration run took to the target: the same for every scheme of every table; each run stops after the "
        "first round ending at or past it (or at the target, or at the round cap). Horizon of the time verdicts: "
        f"H = {H_t:.1f} s ({rule_t}). Horizon of the rounds verdicts: round {H_r:.0f} ({rule_r}"
        + (f"; set by {_short_misses(comp, 'rounds')}" if "earliest end" in rule_r else "")
        + "). The rule "
        "(`Comparison.horizon`): what every run was observed for. A run stopped by the time budget was observed for "
        "no more rounds than it ran, so when one missed, the rounds family is read at the fewest rounds such a run "
        "ran, and a hit after that round counts as censored.",
        "- Seed s fixes the partition, the devices, the model's start, the minibatches and the selection stream: "
        "runs of one seed pair up, within a table and across tables. Paired tests: "
        "`fedselect.experiments.results.Comparison.paired` on these records (misses censored at the horizon; a pair "
        "of two misses carries no information and is dropped).",
        "",
        "## Main table",
        "",
        f"Schemes in the order of their mean time to the target (misses at the censored value). Target {target:.3f}.",
        "",
        summary_table(comp, main, order, len(seeds)),
        "",
    ]
    if REFERENCE in comp.histories and len(comp.histories) > 1:
        out += [
            "### Paired against random: rounds to the target (one Holm family)",
            "",
            comp.paired_markdown(REFERENCE, metric="rounds", diverged="not-reached"),
            "",
            "### Paired against random: simulated seconds to the target (another Holm family)",
            "",
            comp.paired_markdown(REFERENCE, metric="time", diverged="not-reached"),
            "",
        ]
    pictures = plot_pictures(comp, order, root) if main else []
    oc_recs = {
        f"{k} @ {float(s['overcommit']):g}{' fedscale' if s.get('oort_variant') == 'fedscale' else ''}": [
            r for r in recs if r["scheme"] == k
        ]
        for s, recs in (
            (main_setting, main),
            *((s, r) for _, s, r in sides if s["table"] in ("no-overcommit", "fedscale")),
        )
        for k in ("random", "oort")
    }
    oc_comp = comparison_of({k: v for k, v in oc_recs.items() if v}, target)
    if oc_comp.histories:
        pictures += plot_pictures(
            oc_comp, list(oc_comp.histories), root, prefix="overcommit_", kinds=("accuracy_time", "reached_time")
        )
    if pictures:
        out += [
            "## Pictures",
            "",
            "Main table: accuracy against simulated time (the mean over seeds, each seed carried at its last value "
            "after its run ended, up to H), and the fraction of seeds at the target against time and rounds (the "
            "horizon dotted). `overcommit_*`: random and Oort at each over-commitment (main, no-overcommit and "
            "fedscale tables).",
            "",
            *(f"![{p}]({p})" for p in pictures),
            "",
        ]
    for name, setting, recs in sides:
        out += [f"## Side table `{setting['table']}` (`{name}`)", ""]
        if not recs:
            out += ["Not run yet.", ""]
            continue
        scomp = comparison_of({k: [r for r in recs if r["scheme"] == k] for k in DEADLINE_SCHEMES}, target)
        scomp.histories = {k: v for k, v in scomp.histories.items() if v or scomp.failed.get(k)}
        smissing = _missing(recs, DEADLINE_SCHEMES, seeds)
        out += [
            f"{_setting_text(setting)}." + (f" Missing: {'; '.join(smissing)}." if smissing else ""),
            "",
            summary_table(scomp, recs, list(DEADLINE_SCHEMES), len(seeds)),
            "",
        ]
        if REFERENCE in scomp.histories and len(scomp.histories) > 1:
            out += [
                "Paired against random, simulated seconds:",
                "",
                scomp.paired_markdown(REFERENCE, metric="time", diverged="not-reached"),
                "",
            ]
    out += [
        "## Where the runs were made",
        "",
        f"- Main table: {_provenance(main)}",
        *(f"- Side table `{setting['table']}`: {_provenance(recs)}" for _, setting, recs in sides),
        f"- Calibration: {_provenance(calib)}",
        f"- History: the stored report of commit {STORED['commit']} (Oort {STORED['oort_vs_random']:.2f}x faster "
        f"than random, {STORED['oort_vs_deadline_random']:.2f}x than deadline-random) gave Oort over-commitment 1.1 "
        "and random none, censored misses at each run's own end and ran 100 rounds; its records are in git history.",
        "- Records: `main.jsonl.gz`, "
        + ", ".join(f"`{name}`" for name, _, _ in sides)
        + ", `calibration.jsonl.gz` (one line per run: settings, scheme and parameters, seed, commit, machine, "
        "target, time budget, per-round simulated seconds, question seconds, test accuracy, failed clients). "
        "Commands: `OMP_NUM_THREADS=1 nice -n 19 python -m benchmarks.reproductions.time.time_run all` (resumable; "
        "`main` and `side` run the same tables in two processes), then "
        "`python -m benchmarks.reproductions.time.time_report`.",
        "",
    ]
    path = root / "REPORT.md"
    path.write_text("\n".join(out))
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="where the jsonl records are (default: beside this)")
    args = parser.parse_args(argv)
    print(write_report(args.root))
    return 0


__all__ = [
    "claim_line",
    "comparison_of",
    "headline",
    "history_of",
    "identical_runs",
    "main",
    "overcommit_alone",
    "paired_rows",
    "ranking",
    "speedup",
    "verdict",
    "where_time_goes",
    "write_report",
]

if __name__ == "__main__":
    sys.exit(main())
