"""A comparison's table: one row per scheme (:func:`rows`), as Markdown and for a terminal.

A row holds, per scheme, the rounds (and, with a simulated clock, the seconds) to the target,
the accuracies, and what a run spent until it reached the target; a cell is N/A when a seed
missed the target or failed. :class:`~fedselect.experiments.results.Comparison` documents each
form (``rows``, ``to_markdown``, ``to_text``); the cell formats below are shared with the paired
tables and the report's notes.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..round.record import History
from .horizon import clocked, end_time

if TYPE_CHECKING:
    from .results import Comparison

__all__ = ["rows", "seed_list", "to_markdown", "to_text"]


def _mean_or_none(values: Sequence[float | None]) -> float | None:
    """The mean of the values that are not None; None when there are none (e.g. no accuracy in regression)."""
    kept = [float(v) for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def _fmt_mean_std(values: Sequence[float], digits: int = 1) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{np.mean(values):.{digits}f} ± {np.std(values, ddof=0):.{digits}f}"


def _reach_cell(values: Sequence[float | None], complete: bool, digits: int = 1) -> str:
    """A to-target cell: mean ± std when every seed reached it, else N/A and what those that reached it took."""
    ok = [float(v) for v in values if v is not None]
    if complete:
        return _fmt_mean_std(ok, digits)
    return "N/A" if not ok else f"N/A ({len(ok)} reached: {_fmt_mean_std(ok, digits)})"


def seed_list(seeds: Any) -> str:
    """Seeds as the reports list them: sorted, comma-separated."""
    return ", ".join(str(s) for s in sorted(seeds))


def _runs(comp: Comparison, label: str) -> list[History]:
    runs = comp.histories.get(label, {})
    return [runs[s] for s in sorted(runs)]


def rows(comp: Comparison) -> list[dict[str, Any]]:
    """:meth:`Comparison.rows <fedselect.experiments.results.Comparison.rows>`: one row per scheme."""
    out = []
    clock = comp.has_clock()
    time_horizon = comp.horizon("time")[0] if clock else None
    labels = list(comp.histories) + [k for k in comp.failed if k not in comp.histories and comp.failed[k]]
    for label in labels:
        runs = comp.histories.get(label, {})
        fails = comp.failed.get(label, {})
        hs = [runs[s] for s in sorted(runs)]
        reached = [h.rounds_to_accuracy(comp.target) for h in hs]
        ok = [r for r in reached if r is not None]
        costs = [h.costs_to_accuracy(comp.target) for h in hs]
        costs_ok = [(c, h) for c, h in zip(costs, hs) if c is not None]
        complete = hs and len(ok) == len(hs) and not fails
        row = {
            "scheme": label,
            "seeds": len(hs),
            "reached": len(ok),
            "rounds_to_target": float(np.mean(ok)) if complete else None,
            "rounds_to_target_std": float(np.std(ok)) if complete else None,
            "rounds_to_target_each": reached,
            "final_accuracy": _mean_or_none([h.final_accuracy() for h in hs]),
            "best_accuracy": _mean_or_none([h.best_accuracy() for h in hs]),
            "final_test_loss": _mean_or_none([h.rounds[-1].test_loss if h.rounds else None for h in hs]),
            "mfloats_to_target": (
                float(np.mean([c.floats_communicated(h.model_size) for c, h in costs_ok]) / 1e6) if costs_ok else None
            ),
            "models_down_to_target": float(np.mean([c.models_down for c, _ in costs_ok])) if costs_ok else None,
            "scalars_up_to_target": float(np.mean([c.scalars_up for c, _ in costs_ok])) if costs_ok else None,
            "trainings_to_target": float(np.mean([c.local_trainings for c, _ in costs_ok])) if costs_ok else None,
            "seconds": float(np.mean([sum(r.seconds for r in h.rounds) for h in hs])) if hs else None,
        }
        if clock:
            timed = bool(hs) and all(clocked(h) for h in hs)
            times = [h.time_to_accuracy(comp.target) if timed else None for h in hs]
            times = [t if t is not None and time_horizon is not None and t <= time_horizon else None for t in times]
            t_ok = [t for t in times if t is not None]
            t_complete = timed and len(t_ok) == len(hs) and not fails
            ends = [end_time(h) for h in hs] if timed else []
            row.update(
                time_to_target=float(np.mean(t_ok)) if t_complete else None,
                time_to_target_std=float(np.std(t_ok)) if t_complete else None,
                time_to_target_each=times,
                time_horizon=time_horizon,
                sim_time=float(np.mean(ends)) if timed else None,
                sim_time_std=float(np.std(ends)) if timed else None,
            )
        if label in comp.paper:
            row["paper"] = comp.paper[label]
        if fails:
            row["failed"] = [
                {"seed": seed, **{k: fails[seed].get(k) for k in ("type", "message", "round")}}
                for seed in sorted(fails)
            ]
        out.append(row)
    return out


def to_markdown(comp: Comparison) -> str:
    """:meth:`Comparison.to_markdown <fedselect.experiments.results.Comparison.to_markdown>`: the table as Markdown."""
    head, body, notes = _table(comp, short=False)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(vals) + " |" for vals in body]
    return "\n".join(lines + (["", *notes] if notes else []))


def to_text(comp: Comparison) -> str:
    """:meth:`Comparison.to_text <fedselect.experiments.results.Comparison.to_text>`: the table for a terminal."""
    head, body, notes = _table(comp, short=True)
    widths = [max([len(h), *(len(vals[i]) for vals in body)]) for i, h in enumerate(head)]
    left = {0, len(head) - 1} if head[-1] == "failed" else {0}  # text columns; numbers align right

    def fmt(vals: list[str]) -> str:
        return "  ".join(
            v.ljust(w) if i in left else v.rjust(w) for i, (v, w) in enumerate(zip(vals, widths, strict=True))
        ).rstrip()

    target = f"{comp.target:.0%}"
    legend = (
        f"rounds: to {target}, mean ± std over seeds (N/A when a seed missed it or failed: then the mean of "
        "those that reached it); reached: seeds reaching it; final, best: test accuracy, mean over seeds; "
        f"Mfloats, down, losses, trainings: floats communicated, models sent down, losses sent up and "
        f"local trainings of one run until it reached {target}, mean over the seeds that reached it; "
        "s/run: seconds per run"
    )
    if comp.has_clock():
        legend += (
            f"; time to {target}: simulated seconds to it by the horizon H every scheme shares (below), mean ± "
            "std over seeds (N/A as for rounds); time at "
            "end: simulated seconds at the last round, mean ± std over seeds; - : the runs kept no clock"
        )
    lines = [fmt(head), *(fmt(vals) for vals in body), "", *textwrap.wrap(legend, 100)]
    return "\n".join(lines + (["", *notes] if notes else []))


def _table(comp: Comparison, *, short: bool) -> tuple[list[str], list[list[str]], list[str]]:
    """The table's header, its rows of cells and the notes below it (long or short headers)."""
    rows = comp.rows()
    paper = any("paper" in r for r in rows)
    any_failed = any("failed" in r for r in rows)
    target = f"{comp.target:.0%}"
    to_target = f"to {target} per run, mean over seeds reaching it"
    if short:
        head = [
            "scheme",
            f"rounds to {target}",
            "reached",
            "final",
            "best",
            "Mfloats",
            "down",
            "losses",
            "trainings",
            "s/run",
        ]
    else:
        head = [
            "scheme",
            f"rounds to {target}, mean ± std over seeds",
            f"seeds reaching {target}",
            "final acc, mean over seeds",
            "best acc, mean over seeds",
            f"Mfloats communicated {to_target}",
            f"models down {to_target}",
            f"losses up {to_target}",
            f"local trainings {to_target}",
            "seconds per run, mean over seeds",
        ]
    clock = comp.has_clock()
    if clock:  # beside the rounds: the same question in simulated seconds, and how long the runs lasted
        head[2:2] = (
            [f"time to {target}", "time at end"]
            if short
            else [
                f"simulated s to {target} by the horizon H, mean ± std over seeds",
                "simulated s at the last round, mean ± std over seeds",
            ]
        )
    if paper:
        head.insert(2, "paper")
    if any_failed:
        head.append("failed")
    body: list[list[str]] = []
    for r in rows:
        fails = r.get("failed", [])
        # the paper's N/A when a seed missed the target or failed, and what the seeds that did reach it took
        cell = _reach_cell(r["rounds_to_target_each"], r["reached"] == r["seeds"] and not fails)
        vals = [
            r["scheme"],
            cell,
            f"{r['reached']}/{r['seeds'] + len(fails)}",
            "-" if r["final_accuracy"] is None else f"{r['final_accuracy']:.3f}",
            "-" if r["best_accuracy"] is None else f"{r['best_accuracy']:.3f}",
            "-" if r["mfloats_to_target"] is None else f"{r['mfloats_to_target']:.2f}",
            "-" if r["models_down_to_target"] is None else f"{r['models_down_to_target']:.0f}",
            "-" if r["scalars_up_to_target"] is None else f"{r['scalars_up_to_target']:.0f}",
            "-" if r["trainings_to_target"] is None else f"{r['trainings_to_target']:.0f}",
            "-" if r["seconds"] is None else f"{r['seconds']:.1f}",
        ]
        if clock:
            if r["sim_time"] is None:  # these runs kept no clock
                vals[2:2] = ["-", "-"]
            else:
                done = r["time_to_target_each"]
                vals[2:2] = [
                    _reach_cell(done, len([t for t in done if t is not None]) == r["seeds"] and not fails),
                    _fmt_mean_std([end_time(h) or 0.0 for h in _runs(comp, r["scheme"])]),
                ]
        if paper:
            vals.insert(2, r.get("paper", "-"))
        if any_failed:
            vals.append("; ".join(f"seed {f['seed']}: {f['type']} in round {f['round']}" for f in fails) or "-")
        body.append(vals)
    notes: list[str] = []
    if clock:
        H, rule = comp.horizon("time")
        if H is not None:
            notes.append(
                f"Time to {target} is read at one horizon for every scheme, H = {H:.1f} simulated s ({rule}): "
                "a run that had not reached it by H counts as not reached (N/A), whatever its own end. Give "
                "every scheme the same simulated time with --time-budget (FederatedTrainer(time_budget=...))."
            )
    finished = [r for r in rows if r["seeds"]]
    if finished and all(r["final_accuracy"] is None for r in finished):
        losses = ", ".join(
            f"{r['scheme']} {r['final_test_loss']:.4g}" for r in rows if r.get("final_test_loss") is not None
        )
        notes.append(
            "These runs record no accuracy (a regression loss): the rounds-to-target and accuracy "
            f"columns do not apply. Final test loss, mean over seeds: {losses or '-'}."
        )
    elif rows and not any(r["reached"] for r in rows):
        n_rounds = max((len(h) for runs in comp.histories.values() for h in runs.values()), default=0)
        notes.append(
            f"No run reached {target} in {n_rounds} rounds, so the rounds columns and a paired "
            "comparison say nothing; lower the target (--target) or train longer (--rounds)."
        )
    return head, body, notes
