"""A comparison's results: :class:`Comparison` (tables, paired tests, pictures) and :func:`load_comparison`.

:class:`Comparison` holds the histories of a comparison's (scheme, seed) runs and answers every
question about them; each kind of answer is a module of its own, which its methods call:

* :mod:`~fedselect.experiments.horizon`: what a run says about simulated time, and the horizon
  H every scheme is judged at (:meth:`Comparison.horizon`);
* :mod:`~fedselect.experiments.tables`: the table, one row per scheme (:meth:`Comparison.rows`,
  :meth:`Comparison.to_markdown`, :meth:`Comparison.to_text`);
* :mod:`~fedselect.experiments.paired`: the paired tests by seed against a reference, misses
  censored at H (:meth:`Comparison.paired`, :meth:`Comparison.paired_report`);
* :mod:`~fedselect.experiments.report`: the report's files in its folder, each report under its
  own id (:meth:`Comparison.write`, :meth:`Comparison.plot`);
* :mod:`~fedselect.experiments.result_files`: one run's result file, written as the run finishes
  and read back, bounded and checked, by :func:`load_comparison` and a resumed comparison.

The names of the result files and of the report that were defined here are re-exported, so
``fedselect.experiments.results`` keeps them.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..round.record import History
from ..storage import CorruptFileWarning
from . import horizon as _horizon
from . import paired as _paired
from . import report as _report
from . import tables as _tables
from .report import REPORT_FILES  # noqa: F401 - defined here before the split
from .result_files import (  # noqa: F401 - defined here before the split; _history_problem for old callers
    _READ_ERRORS,
    MAX_CLIENTS,
    MAX_RESULT_BYTES,
    ResultFileError,
    _history_problem,
    compress_runs,
    failure_of,
    parse_result,
    read_result,
    read_text,
    result_payload,
    run_files,
    write_result,
)

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

    def has_clock(self) -> bool:
        """Whether any run kept simulated time (records with ``sim_time``): then the tables show time to the
        target beside rounds, :meth:`paired_report` adds a family of tests on it, and :meth:`plot` draws
        accuracy against simulated time. Without a clock every report is what it always was."""
        return any(_horizon.clocked(h) for runs in self.histories.values() for h in runs.values())

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
        return _horizon.horizon(self, metric, horizon=horizon)

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
        return _tables.rows(self)

    def to_markdown(self) -> str:
        """The table as Markdown.

        A rounds cell is N/A when any seed missed the target or failed (followed by the mean
        of the seeds that reached it). Every header says what its cell averages over: rounds,
        accuracies and seconds are means over the finished seeds, the cost columns (what one
        run spent until it reached the target) are means over the seeds that reached it.
        When a run failed, a last column names each failed seed, its error type and round,
        and "seeds reaching" counts it among the seeds.
        """
        return _tables.to_markdown(self)

    def to_text(self) -> str:
        """The table for a terminal: short headers, aligned columns, and a legend below.

        The same cells as :meth:`to_markdown`, whose long headers say what each cell averages
        over; the legend says it here.
        """
        return _tables.to_text(self)

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
        return _paired.paired(
            self,
            reference,
            not_reached=not_reached,
            diverged=diverged,
            metric=metric,
            horizon=horizon,
            min_pairs=min_pairs,
        )

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
        return _paired.paired_markdown(
            self,
            reference,
            not_reached=not_reached,
            diverged=diverged,
            metric=metric,
            horizon=horizon,
            min_pairs=min_pairs,
        )

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
        return _paired.paired_report(self, reference, not_reached=not_reached, diverged=diverged, horizon=horizon)

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
        return _report.plot(self, out_dir)

    def report_id(self) -> str:
        """Eight hex digits naming this report: a hash of its runs (the (scheme, seed) pairs, finished or failed)
        and its target. Reports of the same runs and target share it."""
        return _report.report_id(self)

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
        return _report.write(self, out_dir)


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
