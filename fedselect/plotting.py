"""Pictures of comparisons: accuracy curves, selection frequencies, communication to the target."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .simulation.history import History

__all__ = ["plot_accuracy", "plot_communication", "plot_selection_frequency"]


def _axes(ax: Any, figsize: tuple[float, float] = (7.0, 4.5)) -> Any:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=figsize, constrained_layout=True)
    return ax


def _curve(histories: Sequence[History]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and std of test accuracy per round over runs (rounds evaluated in every run)."""
    per_run = [dict(h.accuracies()) for h in histories]
    rounds = sorted(set.intersection(*(set(d) for d in per_run))) if per_run else []
    acc = np.array([[d[r] for r in rounds] for d in per_run]) if rounds else np.zeros((0, 0))
    return np.array(rounds) + 1, acc.mean(0) if acc.size else acc, acc.std(0) if acc.size else acc


def plot_accuracy(
    results: Mapping[str, Sequence[History]],
    *,
    target: float | None = None,
    ax: Any = None,
    title: str | None = None,
    failed: Mapping[str, int] | None = None,
) -> Any:
    """Test accuracy against rounds, mean over seeds with a +-1 std band (like FedCor's Fig. 4).

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

    Returns
    -------
    matplotlib Axes
    """
    ax = _axes(ax)
    failed = dict(failed or {})
    for label, hs in results.items():
        note = f", {failed[label]} failed" if failed.get(label) else ""
        if not hs:
            if note:
                ax.plot([], [], ls="none", label=f"{label} (all {failed[label]} failed)")
            continue
        x, mean, std = _curve(list(hs))
        if x.size == 0:
            continue
        (line,) = ax.plot(x, mean, label=f"{label} (n={len(hs)}{note})", lw=1.6)
        if len(hs) > 1:
            ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.18, lw=0)
    if target is not None:
        ax.axhline(target, ls="--", color="0.4", lw=1, label=f"target {target:.0%}")
    ax.set_xlabel("communication round")
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    if title:
        ax.set_title(title)
    return ax


def plot_selection_frequency(
    results: Mapping[str, Sequence[History]],
    n_clients: int,
    *,
    ax: Any = None,
    title: str | None = None,
) -> Any:
    """How often each client was chosen, per scheme, summed over seeds (FedCor's Fig. 6).

    Parameters
    ----------
    results : mapping
        Label -> histories.
    n_clients : int
    ax : matplotlib Axes, optional
    title : str, optional

    Returns
    -------
    matplotlib Axes
    """
    labels = [k for k, v in results.items() if v]
    ax = _axes(ax, (max(7.0, n_clients * 0.09), 1.2 + 0.45 * len(labels)))
    if not labels:  # every run failed: say so instead of drawing an empty frame
        ax.text(0.5, 0.5, "no finished run to show", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return ax
    freq = np.array(
        [np.sum([h.selection_counts(n_clients) for h in results[label]], axis=0) / len(results[label])
         for label in labels]
    ).reshape(len(labels), n_clients)
    image = ax.imshow(freq, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_yticks(np.arange(len(labels)), labels)
    ax.set_xlabel("client id")
    ax.figure.colorbar(image, ax=ax, label="times chosen per run", pad=0.01)
    for i in range(len(labels)):
        row = freq[i]
        cv = row.std() / row.mean() if row.mean() > 0 else 0.0
        ax.text(n_clients - 0.5, i, f" cv {cv:.2f}", va="center", ha="left", fontsize="x-small",
                clip_on=False)
    if title:
        ax.set_title(title)
    return ax


def plot_communication(
    results: Mapping[str, Sequence[History]],
    target: float,
    *,
    ax: Any = None,
    title: str | None = None,
    failed: Mapping[str, int] | None = None,
) -> Any:
    """Floats communicated until the target was reached, per scheme (mean over seeds that reached it).

    Model transfers count ``model_size`` floats each; loss reports and compressed updates count
    their floats. Schemes whose runs never reached the target are shown as missing; failed runs
    (``failed``: label -> count) count as not reaching it and are named beside the bar.
    """
    ax = _axes(ax)
    failed = dict(failed or {})
    labels, means, stds, notes = [], [], [], []
    for label, hs in results.items():
        vals = []
        for h in hs:
            c = h.costs_to_accuracy(target)
            if c is not None:
                vals.append(c.floats_communicated(h.model_size))
        labels.append(label)
        means.append(np.mean(vals) if vals else 0.0)
        stds.append(np.std(vals) if len(vals) > 1 else 0.0)
        n_failed = int(failed.get(label, 0))
        notes.append(f"{len(vals)}/{len(hs) + n_failed}" + (f" ({n_failed} failed)" if n_failed else ""))
    y = np.arange(len(labels))
    ax.barh(y, means, xerr=stds, color="tab:blue", alpha=0.8)
    for yi, m, s, note in zip(y, means, stds, notes):
        ax.text(m + s, yi + 0.3, f" reached {note}", va="center", fontsize="small")
    ends = [m + s for m, s in zip(means, stds)]
    if ends and max(ends) > 0:
        ax.set_xlim(0, 1.3 * max(ends))  # room for the "reached" notes of the longest bars
    ax.set_yticks(y, labels)
    ax.set_xlabel(f"floats communicated until {target:.0%} test accuracy")
    ax.grid(alpha=0.3, axis="x")
    if title:
        ax.set_title(title)
    return ax
