"""The first lines of a reproduction report: per setting, what reproduces and what does not.

A paper's table makes one claim per setting: its scheme needs fewer rounds to the target than
every baseline. :func:`what_holds` states, from the stored runs alone, whether that claim holds
here: the scheme against each baseline paired by seed (two-sided Wilcoxon signed-rank test,
Holm-adjusted over the baselines of that setting, alpha 0.05), and how many seeds each scheme
reached the target on: a ranking in which the scheme misses on some seeds (a miss ranks after
every hit) is said to be a ranking, with the seeds it missed. :func:`provenance` says whether
the table comes from one commit on one machine, and which runs were recorded at a ``-dirty``
commit (a tree with uncommitted changes). Nothing here is hard-coded: rerun the report and the
lines follow the runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fedselect.compare import holm

ALPHA = 0.05


# -- the same table on two engine paths (compiled_verdicts.py of FedCor and HCSFed) ---------------------------------
def verdict(row: Mapping[str, Any], alpha: float = ALPHA) -> str:
    """A paired row's verdict: "faster" / "slower" (the reference) where p_Holm < alpha, else "level" (a nan
    p-value, too few seeds to test, is no verdict either way)."""
    if not row["p_holm"] < alpha:
        return "level"
    return "faster" if row["mean"] > 0 else "slower"


def rounds_text(comp: Any, label: str, target: float) -> str:
    """Mean ± std rounds to ``target`` over the seeds of ``label`` that reached it, with how many did."""
    import statistics

    vals = [h.rounds_to_accuracy(target) for h in comp.histories[label].values()]
    reached = [v for v in vals if v is not None]
    if not reached:
        return f"none of {len(vals)} reached"
    text = f"{statistics.fmean(reached):.1f} ± {statistics.pstdev(reached):.1f}"
    return text if len(reached) == len(vals) else f"{text} ({len(reached)}/{len(vals)} reached)"


def path_shift(reference: Mapping[int, Any], other: Mapping[int, Any], target: float, cap: int) -> dict[str, Any]:
    """``other`` - ``reference`` rounds to ``target`` over their common seeds (a miss counts as ``cap + 1``):
    :func:`fedselect.experiments.stats.paired_summary` of the differences (``p`` not yet Holm-adjusted)."""
    from fedselect.experiments.stats import paired_summary

    def rounds(h: Any) -> int:
        r = h.rounds_to_accuracy(target)
        return cap + 1 if r is None else r

    return paired_summary([rounds(other[s]) - rounds(reference[s]) for s in sorted(set(reference) & set(other))])


def _fmt_p(p: float) -> str:
    return "n/a" if p != p else f"{p:.3f}"


def what_holds(
    comp: Any, reference: str, *, setting: str, claim: str, baselines: Iterable[str] | None = None, alpha: float = ALPHA
) -> str:
    """One markdown bullet: does ``reference`` beat every baseline of the paper's table here?

    ``baselines``: the paper's rows to test against (default: every other scheme of ``comp``);
    extra rows of ours (variants, other readings) are not part of the paper's claim. The Holm
    adjustment runs over exactly these comparisons. Verdict: *reproduces* when ``reference`` is
    significantly faster (Holm-adjusted p < alpha) than every baseline and reached the target on
    every seed; *ranking reproduces* when faster than every baseline but it missed the target on
    some seed (the paired test ranks a miss after every hit: the paper's figure, a mean over runs
    that reached it, is not reproduced); *partly* when faster than some; *does not reproduce* when
    than none. The bold head says on how many seeds ``reference`` reached the target when not on
    all, and the line ends with every compared scheme's count. A run that diverged (``DivergenceError``) counts as never
    reaching the target (``Comparison.paired(diverged="not-reached")``), so a scheme that diverges
    on most seeds is judged on all of them; runs that failed otherwise leave the pairs and are named.
    """
    failed = (getattr(comp, "failed", None) or {}).get(reference, {})
    if not comp.histories.get(reference) and not failed:
        return f"- **{setting}: not run** ({reference} has no finished run)."
    rows = comp.paired(reference, diverged="not-reached")
    if baselines is not None:
        keep = set(baselines)
        rows = [r for r in rows if r["scheme"] in keep]
        for r, p in zip(rows, holm([r["p"] for r in rows])):
            r["p_holm"] = p
    rows = [r for r in rows if r["seeds"]]
    if not rows:
        return f"- **{setting}: nothing to compare** (no seed has a usable run of {reference} and of a baseline)."
    seeds = max(len(r["seeds"]) for r in rows)
    faster = [r for r in rows if r["p_holm"] < alpha and r["mean"] > 0]
    slower = [r for r in rows if r["p_holm"] < alpha and r["mean"] < 0]
    level = [r for r in rows if r not in faster and r not in slower]
    reached = {name: _reached(comp, name) for name in [reference, *(r["scheme"] for r in rows)]}
    hit, runs = reached[reference]
    if len(faster) == len(rows):
        verdict = "reproduces" if hit == runs else "ranking reproduces"
    elif faster:
        verdict = "partly reproduces"
    else:
        verdict = "does not reproduce"

    def names(rs: Iterable[Mapping[str, Any]]) -> str:
        return ", ".join(f"{r['scheme']} (mean {r['mean']:+.1f} rounds, p_Holm = {_fmt_p(r['p_holm'])})" for r in rs)

    parts = []
    if faster:
        parts.append(f"significantly faster than {names(faster)}")
    if level:
        parts.append(f"not significantly different from {names(level)}")
    if slower:
        parts.append(f"significantly slower than {names(slower)}")
    small = " With so few seeds no paired difference can reach significance." if 2.0 / 2**seeds > alpha else ""
    notes = []
    if failed:
        notes.append(f"{reference} failed on {len(failed)} of the seeds run ({_failures(failed)})")
    others = sorted({s for r in rows for s in r["diverged_seeds"]})
    if others:
        notes.append(f"a baseline diverged on seed(s) {others}")
    tail = ""
    if notes:
        tail = (
            " " + "; ".join(notes) + ": a diverged run counts as not reaching the target, any other failure "
            "leaves its seed out."
        )
    target = f"{float(comp.target):.0%}"
    missed = "" if hit == runs else f"; {reference} reached {target} on {hit} of {runs} seeds"
    counts = ", ".join(f"{name} {k}/{n}" for name, (k, n) in reached.items())
    return (
        f"- **{setting}: {verdict}{missed}.** Paper: {claim} Here ({seeds} seeds, paired by seed, Holm over "
        f"{len(rows)} comparisons): {reference} is "
        + "; ".join(parts)
        + "."
        + small
        + tail
        + f" Seeds reaching {target}: {counts} (in the paired test a miss ranks after every hit)."
    )


def _reached(comp: Any, label: str) -> tuple[int, int]:
    """(runs of ``label`` that reached the target, its runs): finished runs and divergences (a miss); other
    failures are left out, as in the paired tests."""
    runs = comp.histories.get(label, {})
    hit = sum(h.rounds_to_accuracy(comp.target) is not None for h in runs.values())
    failed = (getattr(comp, "failed", None) or {}).get(label, {})
    diverged = sum(str(f.get("type")) == "DivergenceError" for f in failed.values())
    return hit, len(runs) + diverged


def _failures(failed: Mapping[int, Mapping[str, Any]]) -> str:
    """ "10/10 seeds: DivergenceError in rounds 14-340" style summary of a scheme's failed runs."""
    by_type: dict[str, list[int]] = {}
    for f in failed.values():
        by_type.setdefault(str(f.get("type") or "error"), []).append(int(f.get("round") or 0))
    return "; ".join(
        f"{len(r)} seed(s): {t} in round{'s' if len(r) > 1 else ''} "
        f"{min(r)}{'-' + str(max(r)) if max(r) != min(r) else ''}"
        for t, r in sorted(by_type.items())
    )


def short_commit(commit: Any) -> str:
    """A run's commit as the reports list it: 12 hex digits, and ``-dirty`` kept when the run recorded it (the
    runner's tree had uncommitted changes on top of that commit: :func:`fedselect.experiments.provenance.commit`)."""
    text = str(commit if commit is not None else "?")
    dirty = text.endswith("-dirty")
    return text.removesuffix("-dirty")[:12] + ("-dirty" if dirty else "")


def dirty_note(cells: Iterable[Mapping[str, Any]]) -> str:
    """One sentence naming the runs recorded at a ``-dirty`` commit, or "" when none was."""
    dirty = [c for c in cells if str(c.get("commit", "")).endswith("-dirty")]
    if not dirty:
        return ""
    commits = sorted({short_commit(c.get("commit")) for c in dirty})
    labels = sorted({str(c.get("label", "?")) for c in dirty})
    return (
        f"**Uncommitted changes:** {len(dirty)} run(s) ({', '.join(labels)}) were recorded at a `-dirty` commit "
        f"({', '.join(commits)}): the tree that ran them had uncommitted changes, so the commit alone does not "
        "name their code."
    )


def provenance(cells: Iterable[Mapping[str, Any]]) -> str:
    """Whether the runs come from one commit on one machine; lists them when not; names runs recorded at a
    ``-dirty`` commit (:func:`dirty_note`)."""
    cells = list(cells)
    commits = sorted({short_commit(c.get("commit", "?")) for c in cells})
    cpus = sorted({str((c.get("machine") or {}).get("cpu", "not recorded")) for c in cells})
    if not cells:
        return "No runs yet."
    note = dirty_note(cells)
    if len(commits) == 1 and len(cpus) == 1:
        return f"All {len(cells)} runs come from one commit ({commits[0]}) on one machine ({cpus[0]})." + (
            f" {note}" if note else ""
        )
    return (
        f"**Not one engine:** the {len(cells)} runs come from {len(commits)} commit(s) ({', '.join(commits)}) on "
        f"{len(cpus)} CPU model(s) ({'; '.join(cpus)}); a model-dependent scheme's path depends on the engine's "
        "last bits, so cells from different engines are not strictly comparable." + (f" {note}" if note else "")
    )
