"""Each scheme against a reference, paired by seed, with the runs that missed the target censored at one horizon.

Runs of one seed share the federation, so per-seed differences remove what the schemes have in
common. Every run is read at the comparison's horizon H (:mod:`~fedselect.experiments.horizon`):
a hit by H counts its rounds (or simulated seconds), any other run counts as one censored value
above every hit. :func:`paired` gives the two-sided Wilcoxon signed-rank test per scheme with
Holm's adjustment (:mod:`~fedselect.experiments.stats`); :func:`paired_markdown` and
:func:`paired_report` write it as ``paired.md``. The rules are documented on
:meth:`~fedselect.experiments.results.Comparison.paired`, which calls them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..round.record import History
from .horizon import clocked, round_seconds
from .stats import holm, paired_summary
from .stats import min_pairs as _min_pairs
from .tables import seed_list

if TYPE_CHECKING:
    from .results import Comparison

__all__ = ["paired", "paired_markdown", "paired_report"]


def paired(
    comp: Comparison,
    reference: str,
    *,
    not_reached: float | None = None,
    diverged: str = "leave-out",
    metric: str = "rounds",
    horizon: float | None = None,
    min_pairs: int | None = None,
) -> list[dict[str, Any]]:
    """:meth:`Comparison.paired <fedselect.experiments.results.Comparison.paired>`: one row per other scheme."""
    if reference not in comp.histories:
        raise KeyError(f"no scheme {reference!r} in this comparison; schemes: {list(comp.histories)}")
    if diverged not in ("leave-out", "not-reached"):
        raise ValueError(f"Comparison.paired: diverged={diverged!r}; expected 'leave-out' or 'not-reached'")
    if metric not in ("rounds", "time"):
        raise ValueError(f"Comparison.paired: metric={metric!r}; expected 'rounds' or 'time'")
    if min_pairs is not None and (not isinstance(min_pairs, int) or isinstance(min_pairs, bool) or min_pairs < 1):
        raise ValueError(f"Comparison.paired: min_pairs={min_pairs!r}; expected an integer >= 1")
    needed = _min_pairs() if min_pairs is None else min_pairs
    on_time = metric == "time"
    H, rule = comp.horizon(metric, horizon=horizon)
    if on_time:
        timed = [h for runs in comp.histories.values() for h in runs.values() if clocked(h)]
        censored = float(not_reached) if not_reached is not None else (H or 0.0) + round_seconds(timed)
    else:
        censored = float(not_reached) if not_reached is not None else float(H) + 1.0

    def value(h: History | None) -> tuple[float, bool]:
        """The run's value and whether it is censored (None: diverged, counted as not reached)."""
        r = None if h is None else h.time_to_accuracy(comp.target) if on_time else h.rounds_to_accuracy(comp.target)
        if r is not None and H is not None and r <= H:
            return float(r), False
        return censored, True

    def usable(label: str) -> dict[int, History | None]:
        """seed -> History, or None for a diverged run counted as not reached."""
        runs: dict[int, History | None] = dict(comp.histories.get(label, {}))
        if diverged == "not-reached":
            for seed, f in comp.failed.get(label, {}).items():
                if f.get("type") == "DivergenceError":
                    runs[int(seed)] = None
        return runs

    def unclocked(runs: Mapping[int, History | None]) -> set[int]:
        return {s for s, h in runs.items() if on_time and h is not None and not clocked(h)}

    ref = usable(reference)
    out = []
    for label in comp.histories:
        runs = usable(label)
        shared = set(ref) & set(runs)
        no_clock = sorted(shared & (unclocked(ref) | unclocked(runs)))
        seeds = sorted(shared - set(no_clock))
        failed = sorted((set(comp.failed.get(label, {})) | set(comp.failed.get(reference, {}))) - shared)
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
    comp: Comparison,
    reference: str,
    *,
    not_reached: float | None = None,
    diverged: str = "leave-out",
    metric: str = "rounds",
    horizon: float | None = None,
    min_pairs: int | None = None,
) -> str:
    """:meth:`Comparison.paired_markdown <fedselect.experiments.results.Comparison.paired_markdown>`: a table."""
    on_time = metric == "time"
    unit = "simulated s" if on_time else "rounds"
    lines = [
        f"| scheme | seeds | scheme − {reference} ({unit}, mean ± std) | median | "
        f"{reference} faster / tie / slower | p (Wilcoxon) | p (Holm) | pairs with information |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = comp.paired(
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
            f"{', '.join(r['scheme'] for r in rows)} (seeds {seed_list({s for r in rows for s in r['seeds']})}). "
            "Another set of schemes is another family, with other adjusted p-values."
            + (
                " Rounds to the target (family 1) and simulated time to it (family 2) are two families, each "
                "adjusted on its own."
                if comp.has_clock()
                else ""
            )
        )
    elif on_time:
        lines.append("")
        lines.append(f"No pair of runs with a simulated clock to compare with {reference}.")
    return "\n".join(lines)


def paired_report(
    comp: Comparison,
    reference: str,
    *,
    not_reached: float | None = None,
    diverged: str = "leave-out",
    horizon: float | None = None,
) -> str:
    """:meth:`Comparison.paired_report <fedselect.experiments.results.Comparison.paired_report>`: ``paired.md``."""
    target = f"{comp.target:.0%}"
    head = (
        f"Paired by seed against {reference} (rounds to {target}; a run that has not reached it by the round "
        "budget is censored there and counts as the budget + 1;"
    )
    text = (
        f"{head} two-sided Wilcoxon signed-rank test)\n\n"
        f"{comp.paired_markdown(reference, not_reached=not_reached, diverged=diverged)}\n"
    )
    if comp.has_clock():
        text = text.replace(head, f"{head} family 1 of 2;", 1)
        text += (
            f"\nPaired by seed against {reference} on simulated seconds to {target} (family 2 of 2; a run that "
            "has not reached it by the horizon H shared by every scheme is censored at H, never at its own "
            "end, and counts as H + one median round; two-sided Wilcoxon signed-rank test)\n\n"
            f"{comp.paired_markdown(reference, diverged=diverged, metric='time', horizon=horizon)}\n"
        )
    return text


def _fmt_p(p: float) -> str:
    """A p-value for a table: three decimals, "-" when there is none (no verdict, or nothing to test)."""
    return "-" if p is None or not math.isfinite(p) else f"{p:.3f}"
