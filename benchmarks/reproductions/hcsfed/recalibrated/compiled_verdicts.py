"""The recalibrated HCSFed q = 0.1 table on the compiled engine path against the eager reference: the same verdicts?

Issue 23's condition for a faster engine path that rounds differently: one full reproduction table gives the same
verdicts (the paired tables agree) on the new path as on the eager reference. The eager table is
``table/q0.1`` (``fedselect reproduce hcsfed-fmnist-q0.1-recalibrated``); the compiled one is ``compiled/q0.1`` (the
same command with ``--engine compiled``, seeds 0-4 and 5-9 run as two processes and their runs put in one folder).
For every HCSFed row and each of the paper's baselines (Random, Importance (OCS), Cluster) the verdict is what the
report's first lines say: paired by seed, Wilcoxon, Holm over the row's three comparisons, a miss counted as the cap
plus one: "faster" or "slower" where p_Holm < 0.05, else "level". Writes ``compiled/VERDICTS.md``.

Usage::

    python -m benchmarks.reproductions.hcsfed.recalibrated.compiled_verdicts
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.reproductions.hcsfed.hcsfed_report import ALPHA, _relabel, claim_family
from fedselect.compare import holm, load_comparison
from fedselect.experiments.stats import paired_summary
from fedselect.presets import get_preset

HERE = Path(__file__).resolve().parent
PRESET = "hcsfed-fmnist-q0.1-recalibrated"
PATHS = {"eager": HERE / "table" / "q0.1", "compiled": HERE / "compiled" / "q0.1"}


def _verdict(row: dict) -> str:
    if not row["p_holm"] < ALPHA:  # a p-value of nan (too few seeds to test) is no verdict either way
        return "level"
    return "faster" if row["mean"] > 0 else "slower"


def _rounds(comp, label: str) -> str:
    vals = [h.rounds_to_accuracy(comp.target) for h in comp.histories[label].values()]
    reached = [v for v in vals if v is not None]
    if not reached:
        return f"none of {len(vals)} reached"
    text = f"{statistics.fmean(reached):.1f} ± {statistics.pstdev(reached):.1f}"
    return text if len(reached) == len(vals) else f"{text} ({len(reached)}/{len(vals)} reached)"


def main() -> list[str]:
    preset = get_preset(PRESET)
    cap = preset.trainer["rounds"]
    comps, cells = {}, {}
    for path, folder in PATHS.items():
        comps[path], cells[path] = _relabel(
            *load_comparison(folder, preset.target, labels=list(preset.selectors), paper=preset.paper,
                             title=preset.description)
        )
    labels = [label for label in comps["eager"].histories if label in comps["compiled"].histories]
    seeds = {p: sorted({int(s) for h in c.histories.values() for s in h}) for p, c in comps.items()}
    engines = {p: sorted({str((h.config or {}).get("trainer", {}).get("engine", "eager"))
                          for runs in c.histories.values() for h in runs.values()}) for p, c in comps.items()}
    commits = {p: sorted({str(c.get("commit", "?"))[:12] for c in cells[p]}) for p in PATHS}
    rows, agree, total = [], 0, 0
    for row in (label for label in labels if label.startswith("HCSFed")):
        fams = {p: {r["scheme"]: r for r in claim_family(comps[p], row, cap + 1)} for p in PATHS}
        for base in fams["eager"]:
            e, c = fams["eager"][base], fams["compiled"].get(base)
            if c is None:
                continue
            same = _verdict(e) == _verdict(c)
            agree += same
            total += 1
            rows.append(
                f"| {row} | {base} | {_verdict(e)} ({e['mean']:+.1f}, p_Holm {e['p_holm']:.3f}) | "
                f"{_verdict(c)} ({c['mean']:+.1f}, p_Holm {c['p_holm']:.3f}) | {'yes' if same else '**no**'} |"
            )
    # does the path move a scheme's rounds? compiled - eager on the same seed (same federation and start)
    shifts = []
    for label in labels:
        e_runs, c_runs = comps["eager"].histories[label], comps["compiled"].histories[label]
        seeds_both = sorted(set(e_runs) & set(c_runs))
        diffs = [_or_cap(c_runs[s], comps["eager"].target, cap) - _or_cap(e_runs[s], comps["eager"].target, cap)
                 for s in seeds_both]
        shifts.append((label, paired_summary(diffs)))
    for (_, summary), p in zip(shifts, holm([s["p"] for _, s in shifts])):
        summary["p_holm"] = p
    moved = [label for label, s in shifts if s["p_holm"] < ALPHA]
    lines = [
        "# The recalibrated HCSFed q = 0.1 table: compiled engine path against the eager reference",
        "",
        f"- **Verdicts: {agree} of {total} agree**"
        + (" - the compiled path gives the eager table's verdicts." if agree == total else
           " - the compiled path does not give every verdict of the eager table (rows marked **no**)."),
        f"- Eager: {len(seeds['eager'])} seeds, engine {', '.join(engines['eager'])}, commit "
        f"{', '.join(commits['eager'])}; compiled: {len(seeds['compiled'])} seeds, engine "
        f"{', '.join(engines['compiled'])}, commit {', '.join(commits['compiled'])}; one machine (AMD EPYC, 2 cores).",
        f"- **Does the path move a scheme's rounds?** Compiled − eager rounds to 80 %, paired by seed, Holm over "
        f"{len(shifts)} schemes: " + (f"significant for {', '.join(moved)}." if moved else "significant for none."),
        "",
        "Generated by `python -m benchmarks.reproductions.hcsfed.recalibrated.compiled_verdicts`. A verdict is the "
        "report's: paired by seed (Wilcoxon), Holm over each HCSFed row's comparisons with Random, Importance (OCS) "
        f"and Cluster, a miss counted as {cap + 1} rounds; faster / slower where p_Holm < {ALPHA}, else level. "
        "In brackets: baseline − HCSFed, mean rounds over the seeds.",
        "",
        "| HCSFed row | baseline | eager | compiled | same verdict |",
        "|---|---|---|---|---|",
        *rows,
        "",
        "## Compiled − eager rounds to 80 %, per scheme (paired by seed)",
        "",
        f"A miss counts as {cap + 1} rounds; p: two-sided Wilcoxon (nan: every seed the same); p_Holm over the "
        f"{len(shifts)} rows.",
        "",
        "| scheme | mean ± std | median | compiled faster / tie / slower | p | p_Holm |",
        "|---|---|---|---|---|---|",
        *(f"| {label} | {s['mean']:+.1f} ± {s['std']:.1f} | {s['median']:+.1f} | {s['slower']} / {s['ties']} / "
          f"{s['faster']} | {s['p']:.3f} | {s['p_holm']:.3f} |" for label, s in shifts),
        "",
        "## Rounds to 80 % (mean ± std over seeds)",
        "",
        "| scheme | eager | compiled |",
        "|---|---|---|",
        *(f"| {label} | {_rounds(comps['eager'], label)} | {_rounds(comps['compiled'], label)} |" for label in labels),
        "",
    ]
    out = HERE / "compiled" / "VERDICTS.md"
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    return lines


def _or_cap(history, target: float, cap: int) -> int:
    r = history.rounds_to_accuracy(target)
    return cap + 1 if r is None else r


if __name__ == "__main__":
    main()
