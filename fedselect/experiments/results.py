"""A comparison's results: :class:`Comparison` (tables, paired tests, pictures) and the result files.

A comparison writes one result file per (scheme, seed) run, ``<out>/runs/<label>__seed<k>.json``
(gzipped ``.json.gz`` once :func:`compress_runs` has run), read back by a resumed comparison and by
:func:`load_comparison`. Files read back never make fedselect run code: they are JSON, bounded in
size (:data:`MAX_RESULT_BYTES`, also after decompression) and checked before use; one that fails
is reported (and, when a comparison resumes, moved aside and its run redone).

A folder holds one comparison's report at the plain names (``table.md``, ``paired.md``,
``summary.json``, ``results.csv`` and the pictures). :meth:`Comparison.write` and
:meth:`Comparison.plot` first move a report of other runs or another target aside, to the same
names with its id (``table-<id>.md``, ...), so a rerun with other schemes or seeds never rewrites
an earlier table, and ``table.md`` says which runs it covers.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import math
import os
import textwrap
import time
import warnings
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from ..simulation.checkpoint import CorruptFileWarning, atomic_write_bytes, move_aside
from ..simulation.history import History
from . import provenance
from .stats import holm, paired_summary
from .stats import min_pairs as _min_pairs

__all__ = [
    "MAX_CLIENTS",
    "MAX_RESULT_BYTES",
    "Comparison",
    "ResultFileError",
    "compress_runs",
    "load_comparison",
    "read_result",
    "read_text",
    "result_payload",
    "run_files",
    "write_result",
]


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


def _clocked(h: History) -> bool:
    """Whether a run kept simulated time for comparisons (its records carry ``sim_time``; a Flower run's do not;
    the trainer's default clock, which only records time on homogeneous devices, is left to the run's records)."""
    if h.config.get("clock") == "recorded-only":
        return False
    return any(r.sim_time is not None for r in h.rounds)


def _end_time(h: History) -> float | None:
    """Simulated seconds at the end of a run's last timed round (None without a clock)."""
    return next((float(r.sim_time) for r in reversed(h.rounds) if r.sim_time is not None), None)


def _trainer_setting(h: History, name: str) -> Any:
    """A trainer setting a run recorded (``config["trainer"][name]``), or None when it recorded none."""
    trainer = h.config.get("trainer") if isinstance(h.config, dict) else None
    return trainer.get(name) if isinstance(trainer, dict) else None


def _round_seconds(histories: Sequence[History]) -> float:
    """The median simulated duration of a round over ``histories`` (1.0 s when no round took any time)."""
    durations = [float(r.sim_seconds) for h in histories for r in h.rounds if r.sim_seconds]
    return float(np.median(durations)) if durations else 1.0


def _reach_cell(values: Sequence[float | None], complete: bool, digits: int = 1) -> str:
    """A to-target cell: mean ± std when every seed reached it, else N/A and what those that reached it took."""
    ok = [float(v) for v in values if v is not None]
    if complete:
        return _fmt_mean_std(ok, digits)
    return "N/A" if not ok else f"N/A ({len(ok)} reached: {_fmt_mean_std(ok, digits)})"


@dataclass
class Comparison:
    """The results of :func:`run_comparison`.

    Attributes
    ----------
    histories : dict
        Label -> {seed: History}.
    target : float
    n_clients : int
    out_dir : Path or None
    paper : dict
        Label -> the paper's figure, shown beside ours when given.
    title : str
    failed : dict
        Label -> {seed: failure}, the runs that raised (a diverged run raises
        :class:`~fedselect.simulation.DivergenceError`). Each failure is a dict with ``type``,
        ``message``, ``round`` (the round it failed in) and ``rounds_completed``. Failed runs are
        not in ``histories``; they count as not reaching the target.
    time_horizon : float or None
        The simulated-time horizon H of every time verdict, table cell and picture (seconds);
        None: :meth:`horizon`'s rule (the runs' common time budget, else the earliest end of a
        run that missed the target).
    """

    histories: dict[str, dict[int, History]]
    target: float
    n_clients: int
    out_dir: Path | None = None
    paper: dict[str, str] = field(default_factory=dict)
    title: str = ""
    failed: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    time_horizon: float | None = None

    def _n_failed(self) -> dict[str, int]:
        return {label: len(runs) for label, runs in self.failed.items() if runs}

    def _runs(self, label: str) -> list[History]:
        runs = self.histories.get(label, {})
        return [runs[s] for s in sorted(runs)]

    def has_clock(self) -> bool:
        """Whether any run kept simulated time (records with ``sim_time``): then the tables show time to the
        target beside rounds, :meth:`paired_report` adds a family of tests on it, and :meth:`plot` draws
        accuracy against simulated time. Without a clock every report is what it always was."""
        return any(_clocked(h) for runs in self.histories.values() for h in runs.values())

    def time_to_target(self) -> dict[str, dict[int, float | None]]:
        """Label -> {seed: simulated seconds to the target} (:meth:`History.time_to_accuracy`), like
        ``rows()[i]["rounds_to_target_each"]``; None where a run missed the target or kept no clock."""
        return {
            label: {int(s): runs[s].time_to_accuracy(self.target) for s in sorted(runs)}
            for label, runs in self.histories.items()
        }

    def horizon(self, metric: str = "time", *, horizon: float | None = None) -> tuple[float | None, str]:
        """The horizon H every scheme of this comparison is judged at, and the rule that gave it.

        A run that has not reached the target by H is *censored* there, whatever its own end: in
        the paired tests and the table it ties with every other censored run, above every hit,
        and a hit after H counts as censored too. One H serves every scheme, so a scheme whose
        runs end early (fast clients, a fixed round budget) is never credited with its own end.

        Parameters
        ----------
        metric : {"time", "rounds"}, default "time"
            Simulated seconds, or rounds.
        horizon : float, optional
            H as given (the rule is then "given"); default: the comparison's ``time_horizon`` on
            time when set, else derived as below.

        Returns
        -------
        H : float or None
            None on time when no run kept a clock.
        rule : str
            How H was chosen, in words, for the reports.

        Notes
        -----
        On time, H is the runs' common time budget (``FederatedTrainer(time_budget=...)``, when
        every clocked run records the same one), lowered to the earliest end of a clocked run
        that missed the target when one ended before it (a round cap reached first): the longest
        time every run was observed for. Without a budget it is that earliest end of a miss; when
        every run reached the target, the latest end of any run (nothing is censored). A run that
        stopped at its target, or diverged, does not lower H. On rounds, H is the round budget
        (the smallest ``rounds`` the runs record; else the longest run), as the tables always had,
        lowered the same way to the earliest end of a miss that stopped before it (a time budget).
        """
        if metric not in ("rounds", "time"):
            raise ValueError(f"Comparison.horizon: metric={metric!r}; expected 'rounds' or 'time'")
        every = [h for runs in self.histories.values() for h in runs.values()]
        if metric == "rounds":
            if horizon is not None:
                return float(horizon), "given"
            caps = [_trainer_setting(h, "rounds") for h in every]
            if every and all(isinstance(c, int) and not isinstance(c, bool) for c in caps):
                cap, rule = float(min(caps)), "the round budget"
            else:
                cap, rule = float(max((len(h) for h in every), default=0)), "the longest run's rounds"
            short = min((len(h) for h in every if h.rounds_to_accuracy(self.target) is None), default=cap)
            if short < cap:  # a miss stopped before the round budget (a time budget): it was observed no longer
                return float(short), "the earliest end of a run that missed the target, before the round budget"
            return cap, rule
        if horizon is not None:
            return float(horizon), "given"
        if self.time_horizon is not None:
            return float(self.time_horizon), "given"
        clocked = [h for h in every if _clocked(h)]
        if not clocked:
            return None, "no run kept a simulated clock"
        budgets = {_trainer_setting(h, "time_budget") for h in clocked}
        budget = next(iter(budgets)) if len(budgets) == 1 else None
        missed = [_end_time(h) or 0.0 for h in clocked if h.time_to_accuracy(self.target) is None]
        earliest = min(missed, default=None)
        if budget is not None and (earliest is None or earliest >= budget):
            return float(budget), "the time budget every run was given"
        if earliest is not None:
            rule = "the earliest end of a run that missed the target: the longest time every run was observed for"
            return float(earliest), rule
        latest = max(_end_time(h) or 0.0 for h in clocked)
        return float(latest), "the latest end of a run (every run reached the target)"

    def rows(self) -> list[dict[str, Any]]:
        """One row per scheme: rounds to target, accuracies and costs to the target.

        ``seeds`` counts finished runs; ``failed`` (present when a run of the scheme failed)
        lists the failed ones as ``{"seed", "type", "message", "round"}``, and a scheme with a
        failed run has no mean rounds to the target (like one whose run missed it).

        When a run kept simulated time (:meth:`has_clock`), every row also has
        ``time_horizon`` (H, :meth:`horizon`: one for every scheme), ``time_to_target`` and
        ``time_to_target_std`` (simulated seconds to the target, mean and std over seeds; None,
        as for rounds, when a seed had not reached it by H or failed), ``time_to_target_each``
        (per finished seed, None when not reached by H: censored) and ``sim_time`` /
        ``sim_time_std`` (simulated seconds at a run's last round); all None for a scheme whose
        runs kept no clock (a Flower run measures wall-clock seconds, not simulated ones).
        """
        out = []
        clock = self.has_clock()
        time_horizon = self.horizon("time")[0] if clock else None
        labels = list(self.histories) + [k for k in self.failed if k not in self.histories and self.failed[k]]
        for label in labels:
            runs = self.histories.get(label, {})
            fails = self.failed.get(label, {})
            hs = [runs[s] for s in sorted(runs)]
            reached = [h.rounds_to_accuracy(self.target) for h in hs]
            ok = [r for r in reached if r is not None]
            costs = [h.costs_to_accuracy(self.target) for h in hs]
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
                    float(np.mean([c.floats_communicated(h.model_size) for c, h in costs_ok]) / 1e6)
                    if costs_ok
                    else None
                ),
                "models_down_to_target": float(np.mean([c.models_down for c, _ in costs_ok])) if costs_ok else None,
                "scalars_up_to_target": float(np.mean([c.scalars_up for c, _ in costs_ok])) if costs_ok else None,
                "trainings_to_target": float(np.mean([c.local_trainings for c, _ in costs_ok])) if costs_ok else None,
                "seconds": float(np.mean([sum(r.seconds for r in h.rounds) for h in hs])) if hs else None,
            }
            if clock:
                timed = bool(hs) and all(_clocked(h) for h in hs)
                times = [h.time_to_accuracy(self.target) if timed else None for h in hs]
                times = [t if t is not None and time_horizon is not None and t <= time_horizon else None for t in times]
                t_ok = [t for t in times if t is not None]
                t_complete = timed and len(t_ok) == len(hs) and not fails
                ends = [_end_time(h) for h in hs] if timed else []
                row.update(
                    time_to_target=float(np.mean(t_ok)) if t_complete else None,
                    time_to_target_std=float(np.std(t_ok)) if t_complete else None,
                    time_to_target_each=times,
                    time_horizon=time_horizon,
                    sim_time=float(np.mean(ends)) if timed else None,
                    sim_time_std=float(np.std(ends)) if timed else None,
                )
            if label in self.paper:
                row["paper"] = self.paper[label]
            if fails:
                row["failed"] = [
                    {"seed": seed, **{k: fails[seed].get(k) for k in ("type", "message", "round")}}
                    for seed in sorted(fails)
                ]
            out.append(row)
        return out

    def to_markdown(self) -> str:
        """The table as Markdown.

        A rounds cell is N/A when any seed missed the target or failed (followed by the mean
        of the seeds that reached it). Every header says what its cell averages over: rounds,
        accuracies and seconds are means over the finished seeds, the cost columns (what one
        run spent until it reached the target) are means over the seeds that reached it.
        When a run failed, a last column names each failed seed, its error type and round,
        and "seeds reaching" counts it among the seeds.
        """
        head, body, notes = self._table(short=False)
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(vals) + " |" for vals in body]
        return "\n".join(lines + (["", *notes] if notes else []))

    def to_text(self) -> str:
        """The table for a terminal: short headers, aligned columns, and a legend below.

        The same cells as :meth:`to_markdown`, whose long headers say what each cell averages
        over; the legend says it here.
        """
        head, body, notes = self._table(short=True)
        widths = [max([len(h), *(len(vals[i]) for vals in body)]) for i, h in enumerate(head)]
        left = {0, len(head) - 1} if head[-1] == "failed" else {0}  # text columns; numbers align right

        def fmt(vals: list[str]) -> str:
            return "  ".join(
                v.ljust(w) if i in left else v.rjust(w) for i, (v, w) in enumerate(zip(vals, widths, strict=True))
            ).rstrip()

        target = f"{self.target:.0%}"
        legend = (
            f"rounds: to {target}, mean ± std over seeds (N/A when a seed missed it or failed: then the mean of "
            "those that reached it); reached: seeds reaching it; final, best: test accuracy, mean over seeds; "
            f"Mfloats, down, losses, trainings: floats communicated, models sent down, losses sent up and "
            f"local trainings of one run until it reached {target}, mean over the seeds that reached it; "
            "s/run: seconds per run"
        )
        if self.has_clock():
            legend += (
                f"; time to {target}: simulated seconds to it by the horizon H every scheme shares (below), mean ± "
                "std over seeds (N/A as for rounds); time at "
                "end: simulated seconds at the last round, mean ± std over seeds; - : the runs kept no clock"
            )
        lines = [fmt(head), *(fmt(vals) for vals in body), "", *textwrap.wrap(legend, 100)]
        return "\n".join(lines + (["", *notes] if notes else []))

    def _table(self, *, short: bool) -> tuple[list[str], list[list[str]], list[str]]:
        """The table's header, its rows of cells and the notes below it (long or short headers)."""
        rows = self.rows()
        paper = any("paper" in r for r in rows)
        any_failed = any("failed" in r for r in rows)
        target = f"{self.target:.0%}"
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
        clock = self.has_clock()
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
                        _fmt_mean_std([_end_time(h) or 0.0 for h in self._runs(r["scheme"])]),
                    ]
            if paper:
                vals.insert(2, r.get("paper", "-"))
            if any_failed:
                vals.append("; ".join(f"seed {f['seed']}: {f['type']} in round {f['round']}" for f in fails) or "-")
            body.append(vals)
        notes: list[str] = []
        if clock:
            H, rule = self.horizon("time")
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
            n_rounds = max((len(h) for runs in self.histories.values() for h in runs.values()), default=0)
            notes.append(
                f"No run reached {target} in {n_rounds} rounds, so the rounds columns and a paired "
                "comparison say nothing; lower the target (--target) or train longer (--rounds)."
            )
        return head, body, notes

    def paired(
        self,
        reference: str,
        *,
        not_reached: float | None = None,
        diverged: str = "leave-out",
        metric: str = "rounds",
        horizon: float | None = None,
        min_pairs: int | None = None,
    ) -> list[dict[str, Any]]:
        """Each other scheme against ``reference``, paired by seed, with misses censored at one horizon.

        Runs of one seed share the federation (partition, model start, minibatch streams), so
        per-seed differences remove the variation the schemes have in common; with few seeds
        this is a far more sensitive comparison than two means and standard deviations.

        Every outcome is read at the comparison's horizon H (:meth:`horizon`, shared by every
        scheme): a run that reached the target by H counts its rounds (or seconds) to it; any
        other run is censored and counts as one common value C above every hit: H + 1 round,
        or on time H + the median simulated round of the comparison. The test is the two-sided
        Wilcoxon signed-rank test on these values: a pair of two censored runs differs by 0 and
        is dropped (it carries no information), a hit against a censored run counts with the
        sign it surely has and the magnitude C - hit (a lower bound on the true one), two hits
        as measured. A row whose pairs with information (not both censored) are fewer than
        ``min_pairs`` gets no verdict: ``p`` and ``p_holm`` are NaN (printed "-") and the row is
        left out of Holm's family, as a row whose differences are all zero always was.

        Parameters
        ----------
        reference : str
            The label every other scheme is compared with.
        not_reached : float, optional
            The value C a censored run counts as, in the metric's unit (default: as above).
        diverged : {"leave-out", "not-reached"}, default "leave-out"
            What a run that failed with a :class:`~fedselect.simulation.DivergenceError` counts as:
            ``"leave-out"``, its seed leaves the pairs (``failed_seeds``); ``"not-reached"``, it is
            censored like any miss, so a scheme that diverges on most seeds is judged on all of
            them. Runs that failed otherwise are always left out.
        metric : {"rounds", "time"}, default "rounds"
            Rounds to the target, or simulated seconds to it (:meth:`History.time_to_accuracy`;
            a seed whose run of either scheme kept no clock leaves the pairs, ``unclocked_seeds``).
            Each metric is its own family of tests for Holm's adjustment.
        horizon : float, optional
            H, in the metric's unit; default :meth:`horizon`'s rule.
        min_pairs : int, optional
            The fewest pairs with information for a verdict; default :func:`~.stats.min_pairs`
            (6: with fewer the exact two-sided test cannot reach p < 0.05).

        Returns
        -------
        rows : list of dict
            Per other scheme: ``scheme``, ``seeds`` (in the pairs), ``diffs`` (other - reference
            values per seed: positive means the reference was faster), ``horizon`` and
            ``horizon_rule``, ``censored_value`` (C), ``informative`` (pairs not both censored),
            ``both_censored``, ``verdict`` (whether a p-value is given), ``failed_seeds``,
            ``diverged_seeds`` / ``reference_diverged_seeds`` (with ``diverged="not-reached"``),
            ``unclocked_seeds`` (on time), the statistics of :func:`paired_summary`, and
            ``p_holm`` (Holm's step-down adjustment over this metric's rows with a verdict).
        """
        if reference not in self.histories:
            raise KeyError(f"no scheme {reference!r} in this comparison; schemes: {list(self.histories)}")
        if diverged not in ("leave-out", "not-reached"):
            raise ValueError(f"Comparison.paired: diverged={diverged!r}; expected 'leave-out' or 'not-reached'")
        if metric not in ("rounds", "time"):
            raise ValueError(f"Comparison.paired: metric={metric!r}; expected 'rounds' or 'time'")
        if min_pairs is not None and (not isinstance(min_pairs, int) or isinstance(min_pairs, bool) or min_pairs < 1):
            raise ValueError(f"Comparison.paired: min_pairs={min_pairs!r}; expected an integer >= 1")
        needed = _min_pairs() if min_pairs is None else min_pairs
        on_time = metric == "time"
        H, rule = self.horizon(metric, horizon=horizon)
        if on_time:
            clocked = [h for runs in self.histories.values() for h in runs.values() if _clocked(h)]
            censored = float(not_reached) if not_reached is not None else (H or 0.0) + _round_seconds(clocked)
        else:
            censored = float(not_reached) if not_reached is not None else float(H) + 1.0

        def value(h: History | None) -> tuple[float, bool]:
            """The run's value and whether it is censored (None: diverged, counted as not reached)."""
            r = None if h is None else h.time_to_accuracy(self.target) if on_time else h.rounds_to_accuracy(self.target)
            if r is not None and H is not None and r <= H:
                return float(r), False
            return censored, True

        def usable(label: str) -> dict[int, History | None]:
            """seed -> History, or None for a diverged run counted as not reached."""
            runs: dict[int, History | None] = dict(self.histories.get(label, {}))
            if diverged == "not-reached":
                for seed, f in self.failed.get(label, {}).items():
                    if f.get("type") == "DivergenceError":
                        runs[int(seed)] = None
            return runs

        def unclocked(runs: Mapping[int, History | None]) -> set[int]:
            return {s for s, h in runs.items() if on_time and h is not None and not _clocked(h)}

        ref = usable(reference)
        out = []
        for label in self.histories:
            runs = usable(label)
            shared = set(ref) & set(runs)
            no_clock = sorted(shared & (unclocked(ref) | unclocked(runs)))
            seeds = sorted(shared - set(no_clock))
            failed = sorted((set(self.failed.get(label, {})) | set(self.failed.get(reference, {}))) - shared)
            if label == reference or not (seeds or failed or no_clock):
                continue
            pairs = [(value(runs[s]), value(ref[s])) for s in seeds]
            both = sum(1 for (_, c1), (_, c2) in pairs if c1 and c2)
            stats = paired_summary([v1 - v2 for (v1, _), (v2, _) in pairs])
            informative = len(pairs) - both
            if informative < needed:
                stats["p"] = float("nan")
            row = {
                "scheme": label,
                "seeds": seeds,
                "failed_seeds": failed,
                "diverged_seeds": [s for s in seeds if runs[s] is None],
                "reference_diverged_seeds": [s for s in seeds if ref[s] is None],
                **({"unclocked_seeds": no_clock} if on_time else {}),
                "horizon": H,
                "horizon_rule": rule,
                "censored_value": censored,
                "informative": informative,
                "both_censored": both,
                "verdict": informative >= needed,
                **stats,
            }
            out.append(row)
        for row, p in zip(out, holm([r["p"] for r in out])):
            row["p_holm"] = p
        return out

    def paired_markdown(
        self,
        reference: str,
        *,
        not_reached: float | None = None,
        diverged: str = "leave-out",
        metric: str = "rounds",
        horizon: float | None = None,
        min_pairs: int | None = None,
    ) -> str:
        """:meth:`paired` as a markdown table (``metric="time"``: on simulated seconds to the target).

        The last column counts the pairs that carry information (not both censored at the
        horizon); a row with too few has no verdict, its p-values shown as "-" and said below.
        """
        on_time = metric == "time"
        unit = "simulated s" if on_time else "rounds"
        lines = [
            f"| scheme | seeds | scheme − {reference} ({unit}, mean ± std) | median | "
            f"{reference} faster / tie / slower | p (Wilcoxon) | p (Holm) | pairs with information |",
            "|---|---|---|---|---|---|---|---|",
        ]
        rows = self.paired(
            reference, not_reached=not_reached, diverged=diverged, metric=metric, horizon=horizon, min_pairs=min_pairs
        )
        for r in rows:
            lines.append(
                f"| {r['scheme']} | {len(r['seeds'])} | {r['mean']:+.1f} ± {r['std']:.1f} | {r['median']:+.1f} | "
                f"{r['faster']} / {r['ties']} / {r['slower']} | {_fmt_p(r['p'])} | {_fmt_p(r['p_holm'])} | "
                f"{r['informative']} of {len(r['seeds'])} |"
            )
        most = max((len(r["seeds"]) for r in rows), default=0)
        if 0 < most and 2.0 / 2**most > 0.05:  # the exact two-sided Wilcoxon test's smallest p with `most` pairs
            lines.append("")
            lines.append(
                f"With {most} seed(s) the smallest p-value the test can give is {2.0 / 2**most:.3f}: "
                "no difference can reach p < 0.05; run at least 6 seeds."
            )
        if rows:
            H, rule, needed = (
                rows[0]["horizon"],
                rows[0]["horizon_rule"],
                _min_pairs() if min_pairs is None else min_pairs,
            )
            where = f"{H:.1f} simulated s" if on_time else f"round {H:.0f}"
            lines.append("")
            lines.append(
                f"Horizon H = {where} for every scheme ({rule}). A run that has not reached the target by H is "
                f"censored there and counts as {rows[0]['censored_value']:.{1 if on_time else 0}f} {unit}, tied "
                "above every hit: a pair of two censored runs carries no information."
            )
            silent = [r for r in rows if not r["verdict"]]
            if silent:
                lines.append("")
                lines.append(
                    "No verdict (p shown as -, left out of Holm's family) where fewer than "
                    f"{needed} pairs carry information: "
                    + "; ".join(f"{r['scheme']} ({r['informative']} of {len(r['seeds'])})" for r in silent)
                    + "."
                )
        ref_gone = sorted({s for r in rows for s in r["reference_diverged_seeds"]})
        counted = ([f"{reference} (the reference): seed(s) {ref_gone}"] if ref_gone else []) + [
            f"{r['scheme']}: seed(s) {r['diverged_seeds']}" for r in rows if r["diverged_seeds"]
        ]
        if counted:
            lines.append("")
            lines.append("Counted as not reached because a run diverged (DivergenceError): " + "; ".join(counted) + ".")
        left_out = [f"{r['scheme']}: seed(s) {r['failed_seeds']}" for r in rows if r["failed_seeds"]]
        if left_out:
            lines.append("")
            lines.append("Left out because a run failed (see the table's failed column): " + "; ".join(left_out) + ".")
        no_clock = [f"{r['scheme']}: seed(s) {r['unclocked_seeds']}" for r in rows if r.get("unclocked_seeds")]
        if no_clock:
            lines.append("")
            lines.append(
                "Left out because a run (of the scheme or of the reference) kept no simulated clock: "
                + "; ".join(no_clock)
                + "."
            )
        if rows:
            lines.append("")
            family = f"p (Holm) is adjusted over this family of {len(rows)} comparison(s) with {reference}"
            if on_time:
                family += " on simulated time to the target"
            lines.append(
                f"{family}, and no other: "
                f"{', '.join(r['scheme'] for r in rows)} (seeds {_seed_list({s for r in rows for s in r['seeds']})}). "
                "Another set of schemes is another family, with other adjusted p-values."
                + (
                    " Rounds to the target (family 1) and simulated time to it (family 2) are two families, each "
                    "adjusted on its own."
                    if self.has_clock()
                    else ""
                )
            )
        elif on_time:
            lines.append("")
            lines.append(f"No pair of runs with a simulated clock to compare with {reference}.")
        return "\n".join(lines)

    def paired_report(
        self,
        reference: str,
        *,
        not_reached: float | None = None,
        diverged: str = "leave-out",
        horizon: float | None = None,
    ) -> str:
        """The text of ``paired.md``: :meth:`paired_markdown` against ``reference`` with its heading.

        Family 1 pairs rounds to the target (horizon: the round budget); when a run kept
        simulated time (:meth:`has_clock`) family 2 pairs simulated seconds to the target, below
        it, at the time horizon ``horizon`` (default :meth:`horizon`'s rule). Holm's adjustment
        runs within each family. Misses are censored at each family's horizon (:meth:`paired`).
        """
        target = f"{self.target:.0%}"
        head = (
            f"Paired by seed against {reference} (rounds to {target}; a run that has not reached it by the round "
            "budget is censored there and counts as the budget + 1;"
        )
        text = (
            f"{head} two-sided Wilcoxon signed-rank test)\n\n"
            f"{self.paired_markdown(reference, not_reached=not_reached, diverged=diverged)}\n"
        )
        if self.has_clock():
            text = text.replace(head, f"{head} family 1 of 2;", 1)
            text += (
                f"\nPaired by seed against {reference} on simulated seconds to {target} (family 2 of 2; a run that "
                "has not reached it by the horizon H shared by every scheme is censored at H, never at its own "
                "end, and counts as H + one median round; two-sided Wilcoxon signed-rank test)\n\n"
                f"{self.paired_markdown(reference, diverged=diverged, metric='time', horizon=horizon)}\n"
            )
        return text

    def plot(self, out_dir: str | os.PathLike[str] | None = None) -> list[Path]:
        """Write accuracy.png, reached.png, selection_frequency.png and communication.png; return their paths.

        reached.png is the fraction of each scheme's seeds at the target against rounds, with the
        round horizon marked (:func:`~fedselect.plotting.plot_reached`). When a run kept simulated
        time (:meth:`has_clock`), also accuracy_time.png (accuracy against simulated seconds, with
        the same marks, :func:`~fedselect.plotting.plot_accuracy` with ``x="time"``) and
        reached_time.png (the fraction at the target against simulated seconds, the time horizon
        H marked).

        A report of other runs in the folder is first moved aside, as :meth:`write` does.
        """
        import matplotlib

        if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from ..plotting import figure_size, plot_accuracy, plot_communication, plot_reached, plot_selection_frequency

        out = Path(out_dir or self.out_dir or ".")
        out.mkdir(parents=True, exist_ok=True)
        self._claim(out)
        res = {k: [v[s] for s in sorted(v)] for k, v in self.histories.items()}
        failed = self._n_failed()
        for label in failed:
            res.setdefault(label, [])
        paths = []
        pictures = [
            ("accuracy.png", lambda ax: plot_accuracy(res, target=self.target, ax=ax, title=self.title, failed=failed)),
            (
                "accuracy_time.png",
                lambda ax: plot_accuracy(res, target=self.target, ax=ax, title=self.title, failed=failed, x="time"),
            ),
            (
                "reached.png",
                lambda ax: plot_reached(
                    res, self.target, ax=ax, title=self.title, failed=failed, horizon=self.horizon("rounds")[0]
                ),
            ),
            (
                "reached_time.png",
                lambda ax: plot_reached(
                    res, self.target, x="time", ax=ax, title=self.title, failed=failed, horizon=self.horizon("time")[0]
                ),
            ),
            (
                "selection_frequency.png",
                lambda ax: plot_selection_frequency(res, self.n_clients, ax=ax, title=self.title),
            ),
            (
                "communication.png",
                lambda ax: plot_communication(res, self.target, ax=ax, title=self.title, failed=failed),
            ),
        ]
        if not _records_choices(res):
            # Histories whose rounds keep no chosen clients (compacted records): a selection-frequency
            # picture of them would be empty, so none is drawn and an earlier one is left as it is.
            pictures = [p for p in pictures if p[0] != "selection_frequency.png"]
        if not self.has_clock():  # no simulated time to draw against: the pictures are what they always were
            pictures = [p for p in pictures if p[0] not in ("accuracy_time.png", "reached_time.png")]
        for name, draw in pictures:
            size = figure_size(name.removesuffix(".png"), list(res), self.n_clients)
            fig, ax = plt.subplots(figsize=size, constrained_layout=True)
            draw(ax)
            fig.savefig(out / name, dpi=120, bbox_inches="tight")  # long labels and titles stay whole
            plt.close(fig)
            paths.append(out / name)
        return paths

    def report_id(self) -> str:
        """Eight hex digits naming this report: a hash of its runs (the (scheme, seed) pairs, finished or failed)
        and its target. Reports of the same runs and target share it."""
        return _report_id(self._cells(), float(self.target))

    def _cells(self) -> list[tuple[str, int]]:
        return sorted(
            {(label, int(seed)) for runs in (self.histories, self.failed) for label in runs for seed in runs[label]}
        )

    def _claim(self, out: Path) -> None:
        """Make the plain report names of ``out`` this report's: a report of other runs or another target there is
        moved aside (``table.md`` -> ``table-<its id>.md``, and so on), and this report's own copy moved aside by an
        earlier such move, which this one supersedes, is removed."""
        mine, theirs = self.report_id(), _report_in(out)
        if theirs is not None and theirs != mine:
            for name in REPORT_FILES:
                if (out / name).exists():
                    os.replace(out / name, out / _aside(name, theirs))
        for name in REPORT_FILES:
            (out / _aside(name, mine)).unlink(missing_ok=True)

    def _runs_note(self, out: Path) -> str:
        """What the report covers, for table.md: its runs, its id and the earlier reports beside it."""
        runs = []
        for label in dict.fromkeys([*self.histories, *self.failed]):
            done, fails = sorted(self.histories.get(label, {})), sorted(self.failed.get(label, {}))
            runs.append(
                f"{label} (seeds {_seed_list(done) if done else 'none'}"
                + (f"; failed: {_seed_list(fails)}" if fails else "")
                + ")"
            )
        rid = self.report_id()
        note = [
            f"This report covers {len(self._cells())} run(s) saved in runs/, target {self.target:.0%}: "
            + "; ".join(runs)
            + ".",
            "",
            f"Report {rid}. A comparison of other schemes or seeds, or with another target, written into this "
            f"folder moves this report to table-{rid}.md, paired-{rid}.md, summary-{rid}.json, results-{rid}.csv "
            "and the pictures' names with the same suffix, and takes these names.",
        ]
        earlier = sorted(p.name for p in out.glob("table-*.md"))
        if earlier:
            note += ["", f"Earlier reports of other runs in this folder: {', '.join(earlier)}."]
        return "\n".join(note)

    def write(self, out_dir: str | os.PathLike[str] | None = None) -> list[Path]:
        """Write table.md, summary.json and results.csv (one row per scheme and seed).

        A folder holds one report at these names: a report of other runs (another set of schemes
        or seeds) or of another target already there is first moved aside to the same names
        suffixed with its :meth:`report_id` (``table-<id>.md``, ``paired-<id>.md``,
        ``summary-<id>.json``, ``results-<id>.csv``, ``accuracy-<id>.png``, ...), so no earlier
        table is lost; table.md ends by saying which runs it covers. A report of the same runs
        and target is rewritten in place.

        When a run failed, results.csv gains a ``status`` column (``finished`` or ``failed``;
        a failed row has empty results and the rounds it completed).
        """
        out = Path(out_dir or self.out_dir or ".")
        out.mkdir(parents=True, exist_ok=True)
        self._claim(out)
        (out / "table.md").write_text(self.to_markdown() + "\n\n" + self._runs_note(out) + "\n")
        seeds_of = {
            label: sorted(int(s) for s in [*self.histories.get(label, {}), *self.failed.get(label, {})])
            for label in dict.fromkeys([*self.histories, *self.failed])
        }
        summary = {"target": self.target, "rows": self.rows(), "report": self.report_id(), "runs": seeds_of}
        clock = self.has_clock()
        rounds_h, rounds_rule = self.horizon("rounds")
        time_h, time_rule = self.horizon("time") if clock else (None, "no run kept a simulated clock")
        summary["horizon"] = {"rounds": rounds_h, "rounds_rule": rounds_rule, "time": time_h, "time_rule": time_rule}
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        any_failed = bool(self._n_failed())
        head = [
            "scheme",
            "seed",
            "rounds_to_target",
            "final_accuracy",
            "best_accuracy",
            "rounds_run",
            "floats_to_target",
        ]
        if clock:  # reached by the time horizon (1/0), simulated seconds to the target (empty: missed) and at the end
            head += ["reached_by_horizon", "time_to_target", "sim_time"]
        rows: list[list[Any]] = [head + (["status"] if any_failed else [])]
        for label in dict.fromkeys([*self.histories, *self.failed]):
            runs = self.histories.get(label, {})
            for seed in sorted(runs):
                h = runs[seed]
                c = h.costs_to_accuracy(self.target)
                rows.append(
                    [
                        label,
                        seed,
                        h.rounds_to_accuracy(self.target) or "",
                        h.final_accuracy(),
                        h.best_accuracy(),
                        len(h),
                        "" if c is None else c.floats_communicated(h.model_size),
                    ]
                    + (
                        [
                            _by(h.time_to_accuracy(self.target), time_h if _clocked(h) else None),
                            *_blank(h.time_to_accuracy(self.target), _end_time(h)),
                        ]
                        if clock
                        else []
                    )
                    + (["finished"] if any_failed else [])
                )
            for seed, f in sorted(self.failed.get(label, {}).items()):
                rows.append(
                    [
                        label,
                        seed,
                        "",
                        "",
                        "",
                        f.get("rounds_completed", ""),
                        "",
                        *(["", "", ""] if clock else []),
                        "failed",
                    ]
                )
        # The csv module quotes a label such as "fedcor(rank=5,beta=0.9)", whose commas would split its row.
        with open(out / "results.csv", "w", newline="") as fh:
            csv.writer(fh, lineterminator="\n").writerows(rows)
        return [out / "table.md", out / "summary.json", out / "results.csv"]


REPORT_FILES = (
    "table.md",
    "paired.md",
    "summary.json",
    "results.csv",
    "accuracy.png",
    "selection_frequency.png",
    "communication.png",
    "accuracy_time.png",
    "reached.png",
    "reached_time.png",
)
"""The files of a comparison's report in its folder (``paired.md`` is written by the command line;
``accuracy_time.png`` only when runs kept simulated time)."""


def _aside(name: str, report: str) -> str:
    stem, _, ext = name.partition(".")
    return f"{stem}-{report}.{ext}"


def _fmt_p(p: float) -> str:
    """A p-value for a table: three decimals, "-" when there is none (no verdict, or nothing to test)."""
    return "-" if p is None or not math.isfinite(p) else f"{p:.3f}"


def _seed_list(seeds: Any) -> str:
    return ", ".join(str(s) for s in sorted(seeds))


def _by(t: float | None, horizon: float | None) -> Any:
    """A CSV cell: 1 when a run reached the target by the horizon, 0 when not, empty without a clock."""
    if horizon is None:
        return ""
    return int(t is not None and t <= horizon)


def _blank(*values: Any) -> list[Any]:
    """CSV cells: None as an empty cell."""
    return ["" if v is None else v for v in values]


def _report_id(cells: Sequence[tuple[str, int]], target: Any) -> str:
    payload = json.dumps({"runs": [[label, int(seed)] for label, seed in sorted(cells)], "target": target})
    return hashlib.sha256(payload.encode()).hexdigest()[:8]


def _report_in(out: Path) -> str | None:
    """The id of the report at the plain names of ``out``; None when there is none.

    Read from its results.csv (its runs) and summary.json (its target), as every report has
    written them; a report without them is named by a hash of its files' bytes instead.
    """
    present = [out / name for name in REPORT_FILES if (out / name).exists()]
    if not present:
        return None
    try:
        with open(out / "results.csv", newline="") as fh:
            rows = list(csv.reader(fh))
        cells = [(r[0], int(r[1])) for r in rows[1:] if r]
        target = json.loads((out / "summary.json").read_text())["target"]
        if rows and rows[0][:2] == ["scheme", "seed"] and isinstance(target, (int, float)):
            return _report_id(cells, float(target))
    except (OSError, ValueError, IndexError, KeyError, TypeError):
        pass
    digest = hashlib.sha256()
    for path in present:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return "x" + digest.hexdigest()[:7]


# What a result file read back may make fedselect hold: its text, decompressed, and the number of clients it claims
# (figures are sized by it). A genuine result is far smaller (500 rounds of 5 clients: under 1 MB) and a simulation
# on one machine far fewer clients; a file beyond either is reported unusable before anything of that size exists.
MAX_RESULT_BYTES = 64 * 2**20
MAX_CLIENTS = 10_000_000
_GZIP_CHUNK = 2**20
# A .gz result may unpack to this many times its own size (genuine ones: at most 11x, 1141 stored runs measured),
# or to _GZIP_FLOOR bytes, whichever is more.
_GZIP_RATIO = 64
_GZIP_FLOOR = 4 * 2**20
# JSON containers (``{`` and ``[``) per byte of text: genuine results hold one per 72 bytes or more; a dict costs 64
# bytes in memory, so text of ``{}`` objects would cost 20-30x its size. With at most one per 16 bytes (and 1024
# more), parsed JSON holds about 12x its text at worst.
_BYTES_PER_CONTAINER = 16


class ResultFileError(ValueError):
    """A result file fedselect will not use: larger than :data:`MAX_RESULT_BYTES`, or not a valid result."""


def read_text(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> str:
    """A result file's text, gunzipped when its name ends in ``.gz``.

    Parameters
    ----------
    path : path
    max_bytes : int, optional
        Refuse a file whose (decompressed) text is longer; default :data:`MAX_RESULT_BYTES`
        (genuine results are under 1 MB). A ``.gz`` file may also unpack to at most 64 times
        its compressed size (or 4 MiB if that is more; genuine ones unpack to about 10x). It
        is first decompressed in 1 MiB chunks that are counted and dropped, so a gzip bomb
        costs that much memory and at most the limit of decompression.

    Raises
    ------
    ResultFileError
        The file is larger than the limit, naming it and the limit.
    """
    path = Path(path)
    limit = MAX_RESULT_BYTES if max_bytes is None else int(max_bytes)
    if path.suffix == ".gz":
        limit = min(limit, max(_GZIP_FLOOR, _GZIP_RATIO * path.stat().st_size))
        with gzip.open(path, "rb") as f:
            size = 0
            while chunk := f.read(_GZIP_CHUNK):
                size += len(chunk)
                if size > limit:
                    raise ResultFileError(
                        f"{path.name}: more than {limit} bytes once decompressed (a gzip bomb? at most "
                        f"{_GZIP_RATIO}x the compressed size, {MAX_RESULT_BYTES} in all)"
                    )
        with gzip.open(path, "rb") as f:
            data = f.read(limit + 1)
    else:
        if path.stat().st_size > limit:
            raise ResultFileError(f"{path.name}: more than {limit} bytes")
        data = path.read_bytes()
    if len(data) > limit:  # the file grew between the checks
        raise ResultFileError(f"{path.name}: more than {limit} bytes")
    return data.decode("utf-8")


def run_files(runs_dir: str | os.PathLike[str]) -> list[Path]:
    """The result files in ``runs_dir``, plain (``*.json``) or compressed (``*.json.gz``), sorted by name."""
    runs = Path(runs_dir)
    return sorted([*runs.glob("*.json"), *runs.glob("*.json.gz")], key=lambda p: p.name)


def compress_runs(runs_dir: str | os.PathLike[str]) -> int:
    """Gzip every plain result file of ``runs_dir`` in place (``x.json`` -> ``x.json.gz``); return how many.

    Stored comparisons stay small this way; :func:`load_comparison` and a resumed
    :func:`run_comparison` read either form.
    """
    n = 0
    for path in sorted(Path(runs_dir).glob("*.json")):
        data = path.read_bytes()
        target = path.with_name(path.name + ".gz")
        atomic_write_bytes(target, gzip.compress(data, mtime=0))
        path.unlink()
        n += 1
    return n


# What reading a result file may raise besides ResultFileError: I/O, a bad gzip stream, bad UTF-8.
_READ_ERRORS = (OSError, UnicodeDecodeError, EOFError, zlib.error, ResultFileError)


def read_result(path: Path) -> dict[str, Any] | None:
    """A run's result file (``path``, or ``path`` + ``.gz``), or None if absent; an unreadable one is moved aside."""
    if not path.exists() and Path(str(path) + ".gz").exists():
        path = Path(str(path) + ".gz")
    try:
        text = read_text(path)
    except FileNotFoundError:
        return None
    except _READ_ERRORS as exc:
        move_aside(path, f"{type(exc).__name__}: {exc}")
        return None
    saved, reason = parse_result(text)
    if reason is None:
        return saved
    move_aside(path, reason)
    return None


def result_payload(
    *,
    key: str,
    settings: Mapping[str, Any],
    label: str,
    selector: Any,
    seed: int,
    command: Sequence[str],
    commit: str,
    outcome: Any,
) -> dict[str, Any]:
    """The content of one run's result file (format :data:`~fedselect.experiments.provenance.RESULT_FORMAT`).

    ``outcome`` is the run's :class:`~fedselect.experiments.executors.Outcome`; ``selector`` the
    selector as its settings record it.
    """
    error = outcome.error
    payload = {
        "key": key,
        "settings": json.loads(json.dumps(settings, default=repr)),
        "label": label,
        "selector": selector,
        "seed": int(seed),
        "status": "finished" if error is None else "failed",
        "command": list(command),
        "commit": commit,
        "seconds": outcome.seconds,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": outcome.machine,
    }
    if error is not None:
        payload["error"] = error
    payload["history"] = outcome.history.to_dict() if outcome.history is not None else None
    if outcome.diagnostics:
        payload["selector_state"] = outcome.diagnostics
    return payload


def write_result(path: Path, payload: Mapping[str, Any]) -> None:
    """Write a result file atomically; a compressed earlier result of the same run is superseded (deleted)."""
    atomic_write_bytes(path, json.dumps(payload, default=repr).encode())
    Path(str(path) + ".gz").unlink(missing_ok=True)


def parse_result(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """The result in ``text`` and None, or None and why it is not a usable result file."""
    if not text.strip():
        return None, "empty file"
    containers = text.count("{") + text.count("[")
    if containers > len(text) // _BYTES_PER_CONTAINER + 1024:  # before json.loads builds them
        return None, (
            f"{containers} JSON objects and arrays in {len(text)} bytes (at most one per {_BYTES_PER_CONTAINER} "
            "bytes: parsed, they would hold many times the file's size)"
        )
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, over-long integers, deep nesting
        return None, f"not valid JSON, probably truncated: {type(exc).__name__}: {exc}"
    except MemoryError:  # under a memory limit: the file is unusable here, never a crash of the caller
        return None, f"{len(text)} bytes of JSON do not fit in memory"
    if not isinstance(d, dict) or "key" not in d or "label" not in d or "seed" not in d:
        return None, "not a fedselect result (no key, label or seed)"
    d, reason = provenance.migrate_result(d)
    if d is None:
        return None, reason
    if not isinstance(d["label"], str) or not isinstance(d["seed"], int) or isinstance(d["seed"], bool):
        return None, "its label is not a string or its seed not an integer"
    if d["status"] == "failed":
        return (d, None) if isinstance(d.get("error"), dict) else (None, "a failed run without its error")
    try:
        h = History.from_dict(d["history"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return None, f"its history cannot be read: {type(exc).__name__}: {exc}"
    problem = _history_problem(h)
    return (None, problem) if problem is not None else (d, None)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _history_problem(h: History) -> str | None:
    """Why a history read from a file cannot be used (tables and figures would fail or blow up on it), or None."""
    sections = (h.config.get(k) or {} for k in ("federation", "trainer")) if isinstance(h.config, dict) else [None]
    if not all(isinstance(v, dict) for v in sections):
        return "its config is not a mapping of the run's settings"
    n = h.config.get("n_clients")
    if n is not None and not (_is_int(n) and 1 <= n <= MAX_CLIENTS):
        return f"it claims n_clients = {n!r}; fedselect reads back at most {MAX_CLIENTS} clients"
    bound = MAX_CLIENTS if n is None else n
    if not _is_number(h.model_size) or h.model_size < 0:
        return f"its model_size {h.model_size!r} is not a non-negative number"
    for r in h.rounds:
        if not (
            _is_int(r.round)
            and isinstance(r.clients, list)
            and isinstance(r.failed, list)
            and all(_is_int(k) and 0 <= k < bound for k in (*r.clients, *r.failed))
        ):
            return f"round {r.round!r} names clients outside 0 .. {bound - 1}"
        if not (
            isinstance(r.weights, list)
            and all(_is_number(w) for w in r.weights)
            and (r.lr is None or _is_number(r.lr))  # None: the server does not set it (Flower)
            and all(v is None or _is_number(v) for v in (r.test_accuracy, r.test_loss, r.global_loss))
            and _is_number(r.seconds)
            and all(_is_number(getattr(r.costs, f.name)) for f in fields(r.costs))
        ):
            return f"round {r.round!r} holds values that are not numbers"
        if not all(v is None or (_is_number(v) and math.isfinite(v) and v >= 0) for v in (r.sim_seconds, r.sim_time)):
            return f"round {r.round!r} holds simulated times that are not finite non-negative numbers"
    return _sim_time_problem(h)


def _sim_time_problem(h: History) -> str | None:
    """Why a history's simulated clock is inconsistent (times in some rounds only, or going backwards), or None.

    A clock runs from the first round to the last; a file in which it does not was edited or damaged,
    and its time to the target (or its end time) would change the table.
    """
    times = [r.sim_time for r in h.rounds]
    if all(t is None for t in times):
        return None
    if any(t is None for t in times):
        missing = [r.round for r in h.rounds if r.sim_time is None]
        return f"rounds {missing[:5]}{'...' if len(missing) > 5 else ''} have no sim_time while others have one"
    for prev, r in zip(h.rounds, h.rounds[1:]):
        if r.sim_time < prev.sim_time:
            return f"its sim_time goes backwards at round {r.round!r} ({prev.sim_time} s, then {r.sim_time} s)"
    return None


def failure_of(saved: Mapping[str, Any]) -> dict[str, Any]:
    err = dict(saved.get("error") or {})
    return {k: err.get(k) for k in ("type", "message", "round", "rounds_completed")}


def load_comparison(
    out_dir: str | os.PathLike[str],
    target: float,
    *,
    labels: Sequence[str] | None = None,
    paper: Mapping[str, str] | None = None,
    title: str = "",
) -> tuple[Comparison, list[dict[str, Any]]]:
    """Read the finished runs a comparison wrote into ``out_dir/runs``.

    Parameters
    ----------
    out_dir : path
    target : float
    labels : sequence of str, optional
        Row order (and filter); default: the labels found, sorted.
    paper : mapping, optional
    title : str

    Returns
    -------
    comparison : Comparison
    cells : list of dict
        One per (label, seed) file: label, seed, status, command, commit, seconds, finished,
        path, and ``selector_state`` when the run saved one. Failed runs are in the
        comparison's ``failed``; unreadable files are skipped with a
        :class:`~fedselect.simulation.CorruptFileWarning` naming them (left in place).
    """
    runs = Path(out_dir) / "runs"
    found: dict[str, dict[int, History]] = {}
    failed: dict[str, dict[int, dict[str, Any]]] = {}
    cells: list[dict[str, Any]] = []
    n_clients = 0
    for path in run_files(runs):
        try:
            d, problem = parse_result(read_text(path))
        except _READ_ERRORS as exc:
            d, problem = None, f"{type(exc).__name__}: {exc}"
        if d is None:
            warnings.warn(f"{path} is unreadable ({problem}); skipped", CorruptFileWarning, stacklevel=2)
            continue
        info = {k: d.get(k) for k in ("label", "seed", "command", "commit", "seconds", "finished", "machine")}
        info["status"] = d["status"]
        if info["status"] == "failed":
            failed.setdefault(d["label"], {})[int(d["seed"])] = failure_of(d)
            cells.append(info | {"path": str(path), "selector_state": None})
            continue
        h = History.from_dict(d["history"])
        found.setdefault(d["label"], {})[int(d["seed"])] = h
        n_clients = max(n_clients, int(h.config.get("n_clients", 0) or 0))
        cells.append(info | {"path": str(path), "selector_state": d.get("selector_state")})
    order = list(labels) if labels is not None else sorted(set(found) | set(failed))
    histories = {label: found.get(label, {}) for label in order}
    failed = {label: failed[label] for label in order if label in failed}
    return Comparison(histories, float(target), n_clients, Path(out_dir), dict(paper or {}), title, failed), cells


def _records_choices(res: Mapping[str, Sequence[History]]) -> bool:
    """Whether any round of any history in ``res`` records its chosen clients (a run with no rounds counts)."""
    histories = [h for runs in res.values() for h in runs]
    if not any(len(h.rounds) for h in histories):
        return True
    return any(len(r.clients) for h in histories for r in h.rounds)
