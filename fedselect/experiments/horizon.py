"""Time in a comparison: what each run's history says about it, and the horizon H every scheme is judged at.

A run *kept a clock* when its records carry simulated time (:func:`clocked`); it ends at its last
timed round (:func:`end_time`) and records the budgets it was given (:func:`trainer_setting`).
:func:`horizon` turns these into the one horizon of a comparison, on rounds or on simulated
time, at which the tables, the paired tests and the pictures censor a run that has not reached
the target (:meth:`~fedselect.experiments.results.Comparison.horizon` documents the rule).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..round.record import History

if TYPE_CHECKING:
    from .results import Comparison

__all__ = ["clocked", "end_time", "horizon", "round_seconds", "trainer_setting"]


def clocked(h: History) -> bool:
    """Whether a run kept simulated time for comparisons (its records carry ``sim_time``; a Flower run's do not;
    the trainer's default clock, which only records time on homogeneous devices, is left to the run's records)."""
    if h.config.get("clock") == "recorded-only":
        return False
    return any(r.sim_time is not None for r in h.rounds)


def end_time(h: History) -> float | None:
    """Simulated seconds at the end of a run's last timed round (None without a clock)."""
    return next((float(r.sim_time) for r in reversed(h.rounds) if r.sim_time is not None), None)


def trainer_setting(h: History, name: str) -> Any:
    """A trainer setting a run recorded (``config["trainer"][name]``), or None when it recorded none."""
    trainer = h.config.get("trainer") if isinstance(h.config, dict) else None
    return trainer.get(name) if isinstance(trainer, dict) else None


def round_seconds(histories: Sequence[History]) -> float:
    """The median simulated duration of a round over ``histories`` (1.0 s when no round took any time)."""
    durations = [float(r.sim_seconds) for h in histories for r in h.rounds if r.sim_seconds]
    return float(np.median(durations)) if durations else 1.0


def horizon(comp: Comparison, metric: str = "time", *, horizon: float | None = None) -> tuple[float | None, str]:
    """:meth:`Comparison.horizon <fedselect.experiments.results.Comparison.horizon>`: H and the rule that gave it."""
    if metric not in ("rounds", "time"):
        raise ValueError(f"Comparison.horizon: metric={metric!r}; expected 'rounds' or 'time'")
    every = [h for runs in comp.histories.values() for h in runs.values()]
    if metric == "rounds":
        if horizon is not None:
            return float(horizon), "given"
        caps = [trainer_setting(h, "rounds") for h in every]
        if every and all(isinstance(c, int) and not isinstance(c, bool) for c in caps):
            cap, rule = float(min(caps)), "the round budget"
        else:
            cap, rule = float(max((len(h) for h in every), default=0)), "the longest run's rounds"
        short = min((len(h) for h in every if h.rounds_to_accuracy(comp.target) is None), default=cap)
        if short < cap:  # a miss stopped before the round budget (a time budget): it was observed no longer
            return float(short), "the earliest end of a run that missed the target, before the round budget"
        return cap, rule
    if horizon is not None:
        return float(horizon), "given"
    if comp.time_horizon is not None:
        return float(comp.time_horizon), "given"
    timed = [h for h in every if clocked(h)]
    if not timed:
        return None, "no run kept a simulated clock"
    budgets = {trainer_setting(h, "time_budget") for h in timed}
    budget = next(iter(budgets)) if len(budgets) == 1 else None
    missed = [end_time(h) or 0.0 for h in timed if h.time_to_accuracy(comp.target) is None]
    earliest = min(missed, default=None)
    if budget is not None and (earliest is None or earliest >= budget):
        return float(budget), "the time budget every run was given"
    if earliest is not None:
        rule = "the earliest end of a run that missed the target: the longest time every run was observed for"
        return float(earliest), rule
    latest = max(end_time(h) or 0.0 for h in timed)
    return float(latest), "the latest end of a run (every run reached the target)"
