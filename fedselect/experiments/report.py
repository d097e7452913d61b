"""A comparison's report in its folder: table.md, summary.json, results.csv and the pictures.

A folder holds one comparison's report at the plain names (:data:`REPORT_FILES`).
:func:`write` and :func:`plot` first move a report of other runs or another target aside, to the
same names with its id (``table-<id>.md``, ...), so a rerun with other schemes or seeds never
rewrites an earlier table, and ``table.md`` says which runs it covers. A report's id
(:func:`report_id`) is a hash of its (scheme, seed) runs and its target.
:class:`~fedselect.experiments.results.Comparison`'s ``write``, ``plot`` and ``report_id``
call these and document them.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..round.record import History
from .horizon import clocked, end_time
from .tables import seed_list

if TYPE_CHECKING:
    from .results import Comparison

__all__ = ["REPORT_FILES", "plot", "report_id", "write"]

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


def plot(comp: Comparison, out_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """:meth:`Comparison.plot <fedselect.experiments.results.Comparison.plot>`: the pictures; their paths."""
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..plotting import figure_size, plot_accuracy, plot_communication, plot_reached, plot_selection_frequency

    out = Path(out_dir or comp.out_dir or ".")
    out.mkdir(parents=True, exist_ok=True)
    _claim(comp, out)
    res = {k: [v[s] for s in sorted(v)] for k, v in comp.histories.items()}
    failed = _n_failed(comp)
    for label in failed:
        res.setdefault(label, [])
    paths = []
    pictures = [
        ("accuracy.png", lambda ax: plot_accuracy(res, target=comp.target, ax=ax, title=comp.title, failed=failed)),
        (
            "accuracy_time.png",
            lambda ax: plot_accuracy(res, target=comp.target, ax=ax, title=comp.title, failed=failed, x="time"),
        ),
        (
            "reached.png",
            lambda ax: plot_reached(
                res, comp.target, ax=ax, title=comp.title, failed=failed, horizon=comp.horizon("rounds")[0]
            ),
        ),
        (
            "reached_time.png",
            lambda ax: plot_reached(
                res, comp.target, x="time", ax=ax, title=comp.title, failed=failed, horizon=comp.horizon("time")[0]
            ),
        ),
        (
            "selection_frequency.png",
            lambda ax: plot_selection_frequency(res, comp.n_clients, ax=ax, title=comp.title),
        ),
        (
            "communication.png",
            lambda ax: plot_communication(res, comp.target, ax=ax, title=comp.title, failed=failed),
        ),
    ]
    if not _records_choices(res):
        # Histories whose rounds keep no chosen clients (compacted records): a selection-frequency
        # picture of them would be empty, so none is drawn and an earlier one is left as it is.
        pictures = [p for p in pictures if p[0] != "selection_frequency.png"]
    if not comp.has_clock():  # no simulated time to draw against: the pictures are what they always were
        pictures = [p for p in pictures if p[0] not in ("accuracy_time.png", "reached_time.png")]
    for name, draw in pictures:
        size = figure_size(name.removesuffix(".png"), list(res), comp.n_clients)
        fig, ax = plt.subplots(figsize=size, constrained_layout=True)
        draw(ax)
        fig.savefig(out / name, dpi=120, bbox_inches="tight")  # long labels and titles stay whole
        plt.close(fig)
        paths.append(out / name)
    return paths


def report_id(comp: Comparison) -> str:
    """:meth:`Comparison.report_id <fedselect.experiments.results.Comparison.report_id>`: eight hex digits."""
    return _report_id(_cells(comp), float(comp.target))


def write(comp: Comparison, out_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """:meth:`Comparison.write <fedselect.experiments.results.Comparison.write>`: table.md, summary.json, the CSV."""
    out = Path(out_dir or comp.out_dir or ".")
    out.mkdir(parents=True, exist_ok=True)
    _claim(comp, out)
    (out / "table.md").write_text(comp.to_markdown() + "\n\n" + _runs_note(comp, out) + "\n")
    seeds_of = {
        label: sorted(int(s) for s in [*comp.histories.get(label, {}), *comp.failed.get(label, {})])
        for label in dict.fromkeys([*comp.histories, *comp.failed])
    }
    summary = {"target": comp.target, "rows": comp.rows(), "report": comp.report_id(), "runs": seeds_of}
    clock = comp.has_clock()
    rounds_h, rounds_rule = comp.horizon("rounds")
    time_h, time_rule = comp.horizon("time") if clock else (None, "no run kept a simulated clock")
    summary["horizon"] = {"rounds": rounds_h, "rounds_rule": rounds_rule, "time": time_h, "time_rule": time_rule}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    any_failed = bool(_n_failed(comp))
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
    for label in dict.fromkeys([*comp.histories, *comp.failed]):
        runs = comp.histories.get(label, {})
        for seed in sorted(runs):
            h = runs[seed]
            c = h.costs_to_accuracy(comp.target)
            rows.append(
                [
                    label,
                    seed,
                    h.rounds_to_accuracy(comp.target) or "",
                    h.final_accuracy(),
                    h.best_accuracy(),
                    len(h),
                    "" if c is None else c.floats_communicated(h.model_size),
                ]
                + (
                    [
                        _by(h.time_to_accuracy(comp.target), time_h if clocked(h) else None),
                        *_blank(h.time_to_accuracy(comp.target), end_time(h)),
                    ]
                    if clock
                    else []
                )
                + (["finished"] if any_failed else [])
            )
        for seed, f in sorted(comp.failed.get(label, {}).items()):
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


def _n_failed(comp: Comparison) -> dict[str, int]:
    return {label: len(runs) for label, runs in comp.failed.items() if runs}


def _cells(comp: Comparison) -> list[tuple[str, int]]:
    return sorted(
        {(label, int(seed)) for runs in (comp.histories, comp.failed) for label in runs for seed in runs[label]}
    )


def _claim(comp: Comparison, out: Path) -> None:
    """Make the plain report names of ``out`` this report's: a report of other runs or another target there is
    moved aside (``table.md`` -> ``table-<its id>.md``, and so on), and this report's own copy moved aside by an
    earlier such move, which this one supersedes, is removed."""
    mine, theirs = comp.report_id(), _report_in(out)
    if theirs is not None and theirs != mine:
        for name in REPORT_FILES:
            if (out / name).exists():
                os.replace(out / name, out / _aside(name, theirs))
    for name in REPORT_FILES:
        (out / _aside(name, mine)).unlink(missing_ok=True)


def _runs_note(comp: Comparison, out: Path) -> str:
    """What the report covers, for table.md: its runs, its id and the earlier reports beside it."""
    runs = []
    for label in dict.fromkeys([*comp.histories, *comp.failed]):
        done, fails = sorted(comp.histories.get(label, {})), sorted(comp.failed.get(label, {}))
        runs.append(
            f"{label} (seeds {seed_list(done) if done else 'none'}"
            + (f"; failed: {seed_list(fails)}" if fails else "")
            + ")"
        )
    rid = comp.report_id()
    note = [
        f"This report covers {len(_cells(comp))} run(s) saved in runs/, target {comp.target:.0%}: "
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


def _aside(name: str, report: str) -> str:
    stem, _, ext = name.partition(".")
    return f"{stem}-{report}.{ext}"


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


def _records_choices(res: Mapping[str, Sequence[History]]) -> bool:
    """Whether any round of any history in ``res`` records its chosen clients (a run with no rounds counts)."""
    histories = [h for runs in res.values() for h in runs]
    if not any(len(h.rounds) for h in histories):
        return True
    return any(len(r.clients) for h in histories for r in h.rounds)
