"""Pictures of comparisons: accuracy curves, selection frequencies, communication to the target."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .round.record import History

__all__ = [
    "describe_setting",
    "plot_accuracy",
    "plot_communication",
    "plot_reached",
    "plot_selection_frequency",
    "reached_fraction",
]

# Federation metadata that is not a partition parameter (the rest, e.g. shards_per_client or alpha, is).
_NOT_PARTITION_PARAMS = (
    "dataset",
    "n_clients",
    "holdout",
    "random_state",
    "partition",
    "data_dir",
    "download",
    "profiles",
    "profiles_fingerprint",
)
# Columns of the selection-frequency image: above this many clients each column is a group of consecutive clients,
# so the figure's width and memory stay bounded whatever n_clients is (Agg cannot draw 65,536 pixels wide).
MAX_COLUMNS = 500


def _seed_list(seeds: Sequence[int]) -> str:
    if len(seeds) > 1 and list(seeds) == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 2 else f"{seeds[0]}, {seeds[1]}"
    return ", ".join(str(s) for s in seeds)


def describe_setting(results: Mapping[str, Sequence[History]]) -> str:
    """The setting the histories ran in, for a figure's title, from what each history recorded.

    For example ``"digits, shards (shards_per_client=2), N = 30, C = 5, mlp, seeds 0-2 (3 per scheme)"``:
    the data set, the partition and its parameters, the number of clients N, the clients per round C,
    the model, and the seeds (the trainers' ``random_state``). An item the runs recorded differently
    lists every value (``"C = 5 or C = 10"``); items no history recorded (a federation built by hand
    has no partition name) are left out; "" when there is no history.
    """
    hs = [h for runs in results.values() for h in runs]
    if not hs:
        return ""

    def items(h: History) -> list[str | None]:
        config = h.config or {}
        fed = dict(config.get("federation") or {})
        trainer = dict(config.get("trainer") or {})
        partition = None
        if fed.get("partition"):
            params = {k: v for k, v in fed.items() if k not in _NOT_PARTITION_PARAMS and v is not None}
            partition = str(fed["partition"]) + (
                f" ({', '.join(f'{k}={v}' for k, v in params.items())})" if params else ""
            )
        n_clients = config.get("n_clients") or fed.get("n_clients")
        devices = fed.get("profiles")
        if isinstance(devices, Mapping):
            devices = ", ".join(f"{k}={v}" for k, v in devices.items())
        return [
            str(fed["dataset"]) if fed.get("dataset") else None,
            partition,
            f"N = {n_clients}" if n_clients else None,
            f"devices {devices}" if devices else None,
            f"C = {trainer['clients_per_round']}" if trainer.get("clients_per_round") else None,
            trainer["model"] if isinstance(trainer.get("model"), str) else None,
        ]

    # each item as the runs recorded it; where they differ, every value, so no run's setting stands for all
    columns = zip(*(items(h) for h in hs), strict=True)
    parts = []
    for values in columns:
        seen = list(dict.fromkeys(v for v in values if v is not None))
        if seen:
            parts.append(seen[0] if len(seen) == 1 else " or ".join(seen))
    seeds = sorted({h.config.get("trainer", {}).get("random_state") for h in hs if h.config} - {None})
    if seeds:
        per_scheme = sorted({len(runs) for runs in results.values() if runs})
        count = f"{per_scheme[0]}" if len(per_scheme) == 1 else f"{per_scheme[0]}-{per_scheme[-1]}"
        parts.append(f"seed{'s' if len(seeds) > 1 else ''} {_seed_list(seeds)} ({count} per scheme)")
    return ", ".join(parts)


def _set_title(ax: Any, title: str | None, results: Mapping[str, Sequence[History]], setting: bool) -> None:
    """The title and the setting, each wrapped to the width of the axes so neither runs past the figure."""
    import textwrap

    from matplotlib.font_manager import FontProperties

    points = FontProperties(size="medium").get_size_in_points()
    axes_inches = ax.get_position().width * ax.figure.get_figwidth()
    # ~0.6 em per character of DejaVu Sans (wider than its average, so lines rather fall short than overrun)
    width = max(30, int(axes_inches * 72 / (0.6 * points)))
    lines = [textwrap.fill(line, width) for line in title.splitlines()] if title else []
    text = describe_setting(results) if setting else ""
    if text:
        lines.append(textwrap.fill(text, min(width, 90)))
    if lines:
        # wrap=True: at draw time, after the layout has placed the axes, matplotlib breaks a line again
        # where it would still pass the figure's edge (a legend beside the axes narrows them)
        ax.set_title("\n".join(lines), fontsize="medium", wrap=True)


def figure_size(kind: str, labels: Sequence[str], n_clients: int = 0) -> tuple[float, float]:
    """Width and height in inches for a plot of ``kind`` ("accuracy", "selection_frequency" or
    "communication"): room for the longest label (tick labels and legend entries are never cut)."""
    room = 0.075 * max((len(str(label)) for label in labels), default=0)  # ~ the width of 10 pt characters
    if kind == "selection_frequency":
        return (max(7.0, min(n_clients, MAX_COLUMNS) * 0.09) + room, 1.6 + 0.45 * len(labels))
    if kind == "communication":
        return (7.0 + room, 2.2 + 0.4 * len(labels))
    return (7.0 + room, 4.5)


def _axes(ax: Any, figsize: tuple[float, float] = (7.0, 4.5)) -> Any:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=figsize, constrained_layout=True)
    return ax


def _carried(points: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and std over runs of step functions ``(x, value)``, each carried at its last value past its end.

    The grid is every run's x from the latest first one to the latest last one: each point
    averages every run, a run that ended (a round budget spent early, the target reached, fewer
    rounds) counting with the value it ended at, so no curve stops at the earliest-ending run.
    """
    if not points:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    lo, hi = max(x[0] for x, _ in points), max(x[-1] for x, _ in points)
    grid = np.unique(np.concatenate([x[(x >= lo) & (x <= hi)] for x, _ in points]))
    if grid.size == 0:
        return grid, grid, grid
    acc = np.array([v[np.searchsorted(x, grid, side="right") - 1] for x, v in points])
    return grid, acc.mean(0), acc.std(0)


def _time_curve(histories: Sequence[History]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and std of test accuracy over runs against simulated seconds, each run carried at its last value.

    A run's accuracy at time t is that of its last evaluated round ended by t (a step function:
    the model the server holds then), and after its last round the accuracy it ended with.
    """
    per_run = []
    for h in histories:
        pts = [
            (r.sim_time, r.test_accuracy) for r in h.rounds if r.test_accuracy is not None and r.sim_time is not None
        ]
        if not pts:
            return np.zeros(0), np.zeros(0), np.zeros(0)
        per_run.append((np.array([t for t, _ in pts], dtype=float), np.array([a for _, a in pts], dtype=float)))
    return _carried(per_run)


def _curve(histories: Sequence[History]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and std of test accuracy per round over runs (rounds counted from 1), each carried at its last value."""
    per_run = []
    for h in histories:
        pts = h.accuracies()
        if not pts:
            return np.zeros(0), np.zeros(0), np.zeros(0)
        per_run.append((np.array([r + 1 for r, _ in pts], dtype=float), np.array([a for _, a in pts], dtype=float)))
    return _carried(per_run)


def reached_fraction(
    histories: Sequence[History], target: float, *, x: str = "rounds", n_failed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The fraction of runs at the target against rounds or simulated seconds: a step function.

    Parameters
    ----------
    histories : sequence of History
        One scheme's finished runs.
    target : float
    x : {"rounds", "time"}, default "rounds"
        Rounds to the target (:meth:`History.rounds_to_accuracy`) or simulated seconds to it.
    n_failed : int, default 0
        Failed runs, which never reach it but count in the denominator.

    Returns
    -------
    xs, fraction : ndarray
        ``fraction[i]`` of the runs had reached the target by ``xs[i]`` (``xs[0]`` is 0, fraction 0).

    Examples
    --------
    >>> from fedselect.round.record import History, RoundRecord
    >>> def run(accs):
    ...     return History([RoundRecord(round=t, clients=[0], weights=[1.0], lr=0.1, test_accuracy=a)
    ...                     for t, a in enumerate(accs)])
    >>> reached_fraction([run([0.5, 0.9]), run([0.9]), run([0.1])], 0.8)
    (array([0., 1., 2.]), array([0.        , 0.33333333, 0.66666667]))
    """
    if x not in ("rounds", "time"):
        raise ValueError(f"reached_fraction: x={x!r}; expected 'rounds' or 'time'")
    n = len(histories) + int(n_failed)
    hits = [h.time_to_accuracy(target) if x == "time" else h.rounds_to_accuracy(target) for h in histories]
    xs = np.array(sorted({0.0, *(float(v) for v in hits if v is not None)}))
    done = np.array(sorted(float(v) for v in hits if v is not None))
    frac = np.searchsorted(done, xs, side="right") / n if n else np.zeros(xs.size)
    return xs, frac


def plot_reached(
    results: Mapping[str, Sequence[History]],
    target: float,
    *,
    x: str = "rounds",
    horizon: float | None = None,
    ax: Any = None,
    title: str | None = None,
    failed: Mapping[str, int] | None = None,
    setting: bool = True,
) -> Any:
    """The fraction of each scheme's seeds at the target against rounds or simulated seconds (steps).

    What happened to every seed, including those that never reached the target (the curve stays
    below 1) or failed (counted in the denominator): :func:`reached_fraction` per scheme. With a
    ``horizon`` a dotted vertical line marks H, where the comparison's verdicts are read.

    Parameters
    ----------
    results : mapping
        Label -> the histories of that scheme (one per seed).
    target : float
    x : {"rounds", "time"}, default "rounds"
    horizon : float, optional
        The comparison's horizon in x's unit (:meth:`~fedselect.experiments.Comparison.horizon`).
    ax : matplotlib Axes, optional
    title : str, optional
    failed : mapping, optional
        Label -> number of failed runs.
    setting : bool, default True
        Add the setting the runs share (:func:`describe_setting`) to the title.

    Returns
    -------
    matplotlib Axes
    """
    on_time = x == "time"
    ax = _axes(ax, figure_size("accuracy", list(results)))
    failed = dict(failed or {})
    end = 0.0
    for label, hs in results.items():
        if on_time and hs and not all(any(r.sim_time is not None for r in h.rounds) for h in hs):
            ax.plot([], [], ls="none", label=f"{label} (no simulated clock)")
            continue
        n_failed = failed.get(label, 0)
        if not hs and not n_failed:
            continue
        xs, frac = reached_fraction(list(hs), target, x=x, n_failed=n_failed)
        last = max(
            [float(xs[-1])] + [float((h.rounds[-1].sim_time or 0.0) if on_time else len(h)) for h in hs if h.rounds]
        )
        end = max(end, last)
        note = f", {n_failed} failed" if n_failed else ""
        ax.step(
            np.append(xs, last),
            np.append(frac, frac[-1]),
            where="post",
            lw=1.6,
            label=f"{label} (n={len(hs) + n_failed}{note})",
        )
    if horizon is not None:
        ax.axvline(horizon, ls=":", color="0.3", lw=1.2, label=f"horizon H = {horizon:g}" + (" s" if on_time else ""))
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("simulated time (s)" if on_time else "communication round")
    ax.set_ylabel(f"fraction of seeds at {target:.0%}")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    _set_title(ax, title, results, setting)
    return ax


def plot_accuracy(
    results: Mapping[str, Sequence[History]],
    *,
    target: float | None = None,
    ax: Any = None,
    title: str | None = None,
    failed: Mapping[str, int] | None = None,
    setting: bool = True,
    x: str = "rounds",
) -> Any:
    """Test accuracy against rounds (or simulated time), mean over seeds with a +-1 std band (like FedCor's Fig. 4).

    The line is the mean over a scheme's seeds, the shaded band the mean plus and minus one
    standard deviation over them (``np.std``, ddof=0). A seed whose run ended (its round
    budget or time spent, the target reached) is carried at its last value to the end of the
    scheme's longest run, so no curve stops at its earliest-ending seed; the legend says so.
    A scheme with one seed has no band. :func:`plot_reached` shows how many seeds got there.

    With a ``target``, the target line carries what the comparison table reports: a tick
    ``|`` at each seed's first round at the target (:meth:`History.rounds_to_accuracy`) and
    a diamond at their mean, the table's "rounds to target", in the scheme's colour. The
    diamond is hollow when some seed never reached the target or failed (the table's N/A,
    followed by the mean of the seeds that reached it). The mean curve usually crosses the
    target later than that diamond: one seed's single good round counts as its crossing,
    while the mean curve crosses only once the seeds' accuracies average above the target.
    Read rounds to target from the diamonds, not from where the line meets the target.

    With ``x="time"`` the horizontal axis is simulated seconds (``sim_time``, kept when a run
    had a simulated clock) and the marks are each seed's and the mean time to the target
    (:meth:`History.time_to_accuracy`, the table's time column). Seeds end their rounds at
    different times, so a run's accuracy at time t is that of its last evaluated round ended by
    t, drawn as steps, and carried at its last value after its end. A scheme
    whose runs kept no clock is named in the legend with no curve.

    Parameters
    ----------
    results : mapping
        Label -> the histories of that scheme (one per seed).
    target : float, optional
        Draws the target accuracy as a dashed line.
    ax : matplotlib Axes, optional
    title : str, optional
    failed : mapping, optional
        Label -> number of failed runs (diverged or raised), named in the legend; a scheme
        whose every run failed appears in the legend with no curve.
    setting : bool, default True
        Add the setting the runs share (:func:`describe_setting`) to the title.
    x : {"rounds", "time"}, default "rounds"
        The horizontal axis: communication rounds, or simulated seconds.

    Returns
    -------
    matplotlib Axes
    """
    if x not in ("rounds", "time"):
        raise ValueError(f"plot_accuracy: x={x!r}; expected 'rounds' or 'time'")
    on_time = x == "time"
    ax = _axes(ax, figure_size("accuracy", list(results)))
    failed = dict(failed or {})
    banded = False
    crossings: list[tuple[Any, list[float], bool]] = []  # (colour, each reaching seed's first x, all reached)
    for label, hs in results.items():
        note = f", {failed[label]} failed" if failed.get(label) else ""
        if not hs:
            if note:
                ax.plot([], [], ls="none", label=f"{label} (all {failed[label]} failed)")
            continue
        if on_time and not all(any(r.sim_time is not None for r in h.rounds) for h in hs):
            ax.plot([], [], ls="none", label=f"{label} (n={len(hs)}{note}; no simulated clock)")
            continue
        xs, mean, std = _time_curve(list(hs)) if on_time else _curve(list(hs))
        if xs.size == 0:
            continue
        step = {"drawstyle": "steps-post"} if on_time else {}
        (line,) = ax.plot(xs, mean, label=f"{label} (n={len(hs)}{note})", lw=1.6, **step)
        if len(hs) > 1:
            ax.fill_between(
                xs,
                mean - std,
                mean + std,
                color=line.get_color(),
                alpha=0.18,
                lw=0,
                **({"step": "post"} if on_time else {}),
            )
            banded = True
        if target is not None:
            firsts = [h.time_to_accuracy(target) if on_time else h.rounds_to_accuracy(target) for h in hs]
            reached = [float(f) if on_time else int(f) for f in firsts if f is not None]
            if reached:
                crossings.append((line.get_color(), reached, len(reached) == len(hs) and not failed.get(label)))
    handles, labels = ax.get_legend_handles_labels()
    if target is not None:
        handles.append(ax.axhline(target, ls="--", color="0.4", lw=1))
        labels.append(f"target {target:.0%}")
        proxies = _draw_crossings(ax, target, crossings)
        if proxies:
            handles += proxies
            labels += (
                ["each seed's first time at the target", "their mean: the table's time to target"]
                if on_time
                else ["each seed's first round at the target", "their mean: the table's rounds to target"]
            )
        if any(not complete for _, _, complete in crossings):
            handles.append(ax.plot([], [], ls="none", marker="D", ms=6, mfc="white", mec="0.3", mew=1.4)[0])
            labels.append("hollow: not every seed reached it\n(the table's N/A), mean of those that did")
    ax.set_xlabel("simulated time (s)" if on_time else "communication round")
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    # Beside the axes: long labels (selector parameters) never cover the curves.
    ax.legend(
        handles,
        labels,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize="small",
        title_fontsize="small",
        title=(
            "line: mean over the n seeds, each carried\nat its last value after its run ended\nband: ± 1 std over them"
            if banded
            else "one seed: no band; carried at its\nlast value after its run ended"
        ),
    )
    _set_title(ax, title, results, setting)
    return ax


def _draw_crossings(ax: Any, target: float, crossings: Sequence[tuple[Any, Sequence[float], bool]]) -> list[Any]:
    """On the target line, per scheme: a tick at each seed's first round (or time) at the target and a diamond at
    their mean.

    Returns the legend's proxies (a grey tick, a grey diamond), none when no seed reached the target.
    """
    for colour, reached, complete in crossings:
        ax.plot(
            reached, [target] * len(reached), ls="none", marker="|", ms=10, mew=1.5, color=colour, alpha=0.75, zorder=3
        )
        ax.plot(
            [float(np.mean(reached))],
            [target],
            ls="none",
            marker="D",
            ms=7,
            zorder=4,
            **(
                {"mfc": colour, "mec": "black", "mew": 0.9} if complete else {"mfc": "white", "mec": colour, "mew": 1.6}
            ),
        )
    if not crossings:
        return []
    tick = ax.plot([], [], ls="none", marker="|", ms=10, mew=1.5, color="0.2")[0]
    diamond = ax.plot([], [], ls="none", marker="D", ms=6, mfc="0.5", mec="black", mew=0.9)[0]
    return [tick, diamond]


def plot_selection_frequency(
    results: Mapping[str, Sequence[History]],
    n_clients: int,
    *,
    ax: Any = None,
    title: str | None = None,
    setting: bool = True,
) -> Any:
    """How often each client was chosen per run, per scheme, averaged over seeds (FedCor's Fig. 6).

    Beside each row, ``cv`` is the coefficient of variation of the counts across clients (std /
    mean): 0 when every client was chosen equally often. Above :data:`MAX_COLUMNS` clients, each
    column shows the mean count of a group of ``ceil(n_clients / MAX_COLUMNS)`` consecutive
    clients (``cv`` is still over single clients): memory is O(selections + MAX_COLUMNS), not
    O(n_clients).

    Parameters
    ----------
    results : mapping
        Label -> histories.
    n_clients : int
        Client ids chosen must lie in ``0 .. n_clients - 1``.
    ax : matplotlib Axes, optional
    title : str, optional
    setting : bool, default True
        Add the setting the runs share (:func:`describe_setting`) to the title.

    Returns
    -------
    matplotlib Axes
    """
    n_clients = int(n_clients)
    labels = [k for k, v in results.items() if v]
    ax = _axes(ax, figure_size("selection_frequency", labels, n_clients))
    if not labels:  # every run failed: say so instead of drawing an empty frame
        ax.text(0.5, 0.5, "no finished run to show", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return ax
    if n_clients < 1:
        raise ValueError(f"plot_selection_frequency: n_clients={n_clients} must be at least 1")
    group = -(-n_clients // MAX_COLUMNS)  # clients per column
    columns = -(-n_clients // group)
    rows, cvs = [], []
    for label in labels:
        hs = results[label]
        ids = np.fromiter((k for h in hs for r in h.rounds for k in r.clients), dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= n_clients):
            raise ValueError(
                f"plot_selection_frequency: runs of {label!r} chose client ids outside 0 .. {n_clients - 1}"
            )
        if group == 1:
            row = np.bincount(ids, minlength=n_clients) / len(hs)
            cvs.append(row.std() / row.mean() if row.mean() > 0 else 0.0)
        else:  # from the chosen clients' counts alone: the others count 0
            chosen, counts = np.unique(ids, return_counts=True)
            c = counts / len(hs)
            mean = c.sum() / n_clients
            cvs.append(float(np.sqrt(max((c**2).sum() / n_clients - mean**2, 0.0)) / mean) if mean > 0 else 0.0)
            sizes = np.full(columns, group)
            sizes[-1] = n_clients - group * (columns - 1)
            row = np.bincount(chosen // group, weights=c, minlength=columns) / sizes
        rows.append(row)
    freq = np.array(rows).reshape(len(labels), columns)
    if group == 1:
        image = ax.imshow(freq, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_xlabel("client id   (cv: std / mean of the counts across clients)")
    else:
        image = ax.imshow(
            freq,
            aspect="auto",
            cmap="viridis",
            interpolation="nearest",
            extent=(-0.5, n_clients - 0.5, len(labels) - 0.5, -0.5),
        )
        ax.set_xlabel(f"client id, in groups of {group}   (cv: std / mean of the counts across clients)")
    ax.set_yticks(np.arange(len(labels)), labels)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # client ids are whole numbers: no 2.5 tick
    ax.figure.colorbar(
        image,
        ax=ax,
        label="times chosen per run\n(mean over seeds" + (")" if group == 1 else " and the group)"),
        pad=0.08,
    )
    for i, cv in enumerate(cvs):
        ax.text(n_clients - 0.5, i, f" cv {cv:.2f}", va="center", ha="left", fontsize="x-small", clip_on=False)
    _set_title(ax, title, {k: results[k] for k in labels}, setting)
    return ax


def plot_communication(
    results: Mapping[str, Sequence[History]],
    target: float,
    *,
    ax: Any = None,
    title: str | None = None,
    failed: Mapping[str, int] | None = None,
    setting: bool = True,
) -> Any:
    """Floats communicated until the target was reached, per scheme (mean over seeds that reached it).

    Model transfers count ``model_size`` floats each; loss reports and compressed updates count
    their floats. The bar is the mean over the seeds that reached the target, the error bar one
    standard deviation over them (ddof=0). Schemes whose runs never reached the target are shown
    as missing; failed runs (``failed``: label -> count) count as not reaching it and are named
    beside the bar. ``setting`` adds :func:`describe_setting` to the title.
    """
    ax = _axes(ax, figure_size("communication", list(results)))
    failed = dict(failed or {})
    labels, means, stds, notes = [], [], [], []
    for label, hs in results.items():
        vals = []
        for h in hs:
            c = h.costs_to_accuracy(target)
            if c is not None:
                vals.append(c.floats_communicated(h.model_size) / 1e6)
        labels.append(label)
        means.append(np.mean(vals) if vals else 0.0)
        stds.append(np.std(vals) if len(vals) > 1 else 0.0)
        n_failed = int(failed.get(label, 0))
        notes.append(f"{len(vals)}/{len(hs) + n_failed}" + (f" ({n_failed} failed)" if n_failed else ""))
    y = np.arange(len(labels))
    ax.barh(y, means, xerr=stds, color="tab:blue", alpha=0.8)
    for yi, m, s, note in zip(y, means, stds, notes):
        ax.text(m + s, yi, f" reached {note}", va="center", fontsize="small")
    ends = [m + s for m, s in zip(means, stds)]
    if ends and max(ends) > 0:
        ax.set_xlim(0, 1.3 * max(ends))  # room for the "reached" notes of the longest bars
    ax.set_yticks(y, labels)
    ax.invert_yaxis()  # first scheme on top, in the table's order
    ax.set_xlabel(
        f"million floats communicated until {target:.0%} test accuracy\n"
        "(bar: mean over the seeds that reached it; error bar: ± 1 std over them)"
    )
    ax.grid(alpha=0.3, axis="x")
    _set_title(ax, title, results, setting)
    return ax
