"""FedCor's FMNIST Table 1 on the compiled engine path against the eager reference: the same verdicts?

Issue 23's condition for a faster engine path that rounds differently: one full reproduction table gives the same
verdicts (the paired tables agree) on the new path as on the eager reference. The eager table is
``fedcor-fmnist-<setting>`` (``fedselect reproduce fedcor-fmnist-<setting>``, the report's runs); the compiled one is
``compiled/fedcor-fmnist-<setting>``: the same preset's four paper rows (Random, AFL, Pow-d, FedCor) with
``--engine compiled --batch-seeds``, its runs packed to their accuracy curves once committed
(``python -m benchmarks.reproductions._records <folder> --accuracy-only --raw-commit <commit>``).
A verdict is what the report's first lines say (``_holds.what_holds``): FedCor
against each baseline, paired by seed, Wilcoxon, Holm over the setting's three comparisons, a miss counted as the
cap plus one; "faster" or "slower" where p_Holm < 0.05, else "level". Writes ``compiled/VERDICTS.md``.

Usage::

    python -m benchmarks.reproductions.fedcor.compiled_verdicts [--compiled DIR]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from benchmarks.reproductions._holds import ALPHA
from benchmarks.reproductions._records import ACCURACY_FILE, load_accuracy
from benchmarks.reproductions.fedcor.fedcor_report import PAPER_METHODS, ROOT, SETTINGS, _only
from fedselect.compare import holm, load_comparison
from fedselect.presets import get_preset


def _verdict(row: dict) -> str:
    if not row["p_holm"] < ALPHA:  # a p-value of nan (too few seeds to test) is no verdict either way
        return "level"
    return "faster" if row["mean"] > 0 else "slower"


def _family(comp) -> dict[str, dict]:
    """FedCor against the paper's three baselines, Holm over the three (as the report's first lines)."""
    rows = [r for r in comp.paired("FedCor", diverged="not-reached") if r["scheme"] in PAPER_METHODS and r["seeds"]]
    for r, p in zip(rows, holm([r["p"] for r in rows])):
        r["p_holm"] = p
    return {r["scheme"]: r for r in rows}


def _rounds(comp, label: str, target: float) -> str:
    vals = [h.rounds_to_accuracy(target) for h in comp.histories[label].values()]
    reached = [v for v in vals if v is not None]
    if not reached:
        return f"none of {len(vals)} reached"
    text = f"{statistics.fmean(reached):.1f} ± {statistics.pstdev(reached):.1f}"
    return text if len(reached) == len(vals) else f"{text} ({len(reached)}/{len(vals)} reached)"


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compiled", default=str(ROOT / "compiled"), help="the compiled runs' folder")
    args = parser.parse_args(argv)
    compiled_root = Path(args.compiled)
    rows, rounds, provenance = [], [], []
    agree = total = 0
    done = []
    for setting in SETTINGS:
        name = f"fedcor-fmnist-{setting}"
        if not (compiled_root / name / "runs").exists() and not (compiled_root / name / ACCURACY_FILE).exists():
            continue
        preset = get_preset(name)
        comps, info = {}, {}
        for path, folder in (("eager", ROOT / name), ("compiled", compiled_root / name)):
            if (folder / ACCURACY_FILE).exists():  # the runs packed to their accuracy curves (_records.py)
                comp, cells = load_accuracy(folder / ACCURACY_FILE, preset.target, labels=list(PAPER_METHODS))
            else:
                comp, cells = load_comparison(folder, preset.target, labels=list(PAPER_METHODS), paper=preset.paper)
            comps[path] = _only(comp, [m for m in PAPER_METHODS if comp.histories.get(m)])
            runs = [h for label in PAPER_METHODS for h in comps[path].histories.get(label, {}).values()]
            engines = sorted({str((h.config or {}).get("trainer", {}).get("engine", "eager")) for h in runs})
            commits = sorted({str(c.get("commit", "?"))[:12] for c in cells if c.get("label") in PAPER_METHODS})
            info[path] = f"{len(runs)} runs, engine {', '.join(engines)}, commit {', '.join(commits)}"
        if set(comps["compiled"].histories) != set(PAPER_METHODS):
            continue  # a setting whose four rows have not all finished on the compiled path
        done.append(setting.upper())
        provenance.append(f"- {setting.upper()}: eager {info['eager']}; compiled {info['compiled']}.")
        fams = {p: _family(c) for p, c in comps.items()}
        for base, e in fams["eager"].items():
            c = fams["compiled"].get(base)
            if c is None:
                continue
            same = _verdict(e) == _verdict(c)
            agree += same
            total += 1
            rows.append(
                f"| {setting.upper()} | {base} | {_verdict(e)} ({e['mean']:+.1f}, p_Holm {e['p_holm']:.3f}) | "
                f"{_verdict(c)} ({c['mean']:+.1f}, p_Holm {c['p_holm']:.3f}) | {'yes' if same else '**no**'} |"
            )
        rounds += [
            f"| {setting.upper()} ({preset.target:.0%}) | {label} | {_rounds(comps['eager'], label, preset.target)} | "
            f"{_rounds(comps['compiled'], label, preset.target)} |"
            for label in PAPER_METHODS
        ]
    cap = get_preset("fedcor-fmnist-2spc").trainer["rounds"]
    lines = [
        "# FedCor's FMNIST Table 1: compiled engine path against the eager reference",
        "",
        f"- **Verdicts: {agree} of {total} agree** ({', '.join(done) or 'no setting'} finished on the compiled path)"
        + (" - the compiled path gives the eager table's verdicts." if total and agree == total else
           " - the compiled path does not give every verdict of the eager table (rows marked **no**)."),
        *provenance,
        "- One machine (AMD EPYC, 2 cores). The compiled runs: `fedselect reproduce fedcor-fmnist-<setting> "
        "--engine compiled --batch-seeds --threads 1 --selectors Random=random AFL=afl Pow-d=power-of-choice:d=<2C> "
        "FedCor=fedcor:warmup_rounds=15,gp_interval=10,beta=0.95,theta=0.9 --paired FedCor` (the preset's four "
        "paper rows with its parameters; the records keep the exact command).",
        "",
        "Generated by `python -m benchmarks.reproductions.fedcor.compiled_verdicts`. A verdict is the report's: "
        "FedCor against each baseline paired by seed (Wilcoxon), Holm over the setting's three comparisons, a miss "
        f"counted as {cap + 1} rounds; faster / slower where p_Holm < {ALPHA}, else level. In brackets: baseline − "
        "FedCor, mean rounds over the seeds.",
        "",
        "| setting | baseline | eager | compiled | same verdict |",
        "|---|---|---|---|---|",
        *rows,
        "",
        "## Rounds to the target (mean ± std over the seeds that reached it)",
        "",
        "| setting | scheme | eager | compiled |",
        "|---|---|---|---|",
        *rounds,
        "",
    ]
    out = compiled_root / "VERDICTS.md"
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
