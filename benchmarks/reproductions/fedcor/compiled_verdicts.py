"""FedCor's FMNIST Table 1 on the compiled engine path against the eager reference: the same verdicts?

Issue 23's condition for a faster engine path that rounds differently: one full reproduction table gives the same
verdicts (the paired tables agree) on the new path as on the eager reference. The eager table is
``fedcor-fmnist-<setting>`` (``fedselect reproduce fedcor-fmnist-<setting>``, the report's runs); the compiled one is
``compiled/fedcor-fmnist-<setting>``: the same preset's four paper rows (Random, AFL, Pow-d, FedCor) with
``--path compiled --batch-seeds`` (then ``--engine``), its runs packed to their accuracy curves once committed
(``python -m benchmarks.reproductions._records <folder> --accuracy-only --raw-commit <commit>``).
A verdict is what the report's first lines say (``_holds.what_holds``): FedCor
against each baseline, paired by seed, Wilcoxon, Holm over the setting's three comparisons, a miss counted as the
cap plus one; "faster" or "slower" where p_Holm < 0.05, else "level". Writes ``compiled/VERDICTS.md``.

Usage::

    python -m benchmarks.reproductions.fedcor.compiled_verdicts [--compiled DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.reproductions._holds import ALPHA, path_shift, rounds_text, short_commit, verdict
from benchmarks.reproductions._records import ACCURACY_FILE, load_accuracy
from benchmarks.reproductions.fedcor.fedcor_report import PAPER_METHODS, ROOT, SETTINGS, _only
from fedselect.compare import holm, load_comparison
from fedselect.presets import get_preset


def _family(comp) -> dict[str, dict]:
    """FedCor against the paper's three baselines, Holm over the three (as the report's first lines)."""
    rows = [r for r in comp.paired("FedCor", diverged="not-reached") if r["scheme"] in PAPER_METHODS and r["seeds"]]
    for r, p in zip(rows, holm([r["p"] for r in rows])):
        r["p_holm"] = p
    return {r["scheme"]: r for r in rows}


def _load(folder: Path, preset) -> tuple[object, list[dict]]:
    if (folder / ACCURACY_FILE).exists():  # the runs packed to their accuracy curves (_records.py)
        return load_accuracy(folder / ACCURACY_FILE, preset.target, labels=list(PAPER_METHODS))
    return load_comparison(folder, preset.target, labels=list(PAPER_METHODS), paper=preset.paper)


def _has_runs(folder: Path) -> bool:
    return (folder / "runs").exists() or (folder / ACCURACY_FILE).exists()


def _cell(row: dict) -> str:
    return f"{verdict(row)} ({row['mean']:+.1f}, p_Holm {row['p_holm']:.3f})"


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compiled", default=str(ROOT / "compiled"), help="the compiled runs' folder")
    args = parser.parse_args(argv)
    compiled_root = Path(args.compiled)
    rows, rounds, provenance, shifts = [], [], [], []
    agree = {"compiled": [0, 0], "control": [0, 0]}
    done = []
    for setting in SETTINGS:
        name = f"fedcor-fmnist-{setting}"
        control = compiled_root / f"control-{setting}"
        folders = {"eager": ROOT / name, "compiled": compiled_root / name, "control": control}
        if not _has_runs(folders["compiled"]):
            continue
        preset = get_preset(name)
        cap = preset.trainer["rounds"]
        comps, info = {}, {}
        for path, folder in folders.items():
            if not _has_runs(folder):
                continue
            comp, cells = _load(folder, preset)
            comps[path] = _only(comp, [m for m in PAPER_METHODS if comp.histories.get(m)])
            runs = [h for label in PAPER_METHODS for h in comps[path].histories.get(label, {}).values()]
            engines = sorted({str((h.config or {}).get("trainer", {}).get("engine", "eager")) for h in runs})
            commits = sorted({short_commit(c.get("commit", "?")) for c in cells if c.get("label") in PAPER_METHODS})
            info[path] = f"{len(runs)} runs, engine {', '.join(engines)}, commit {', '.join(commits)}"
        comps = {p: c for p, c in comps.items() if set(c.histories) == set(PAPER_METHODS)}  # all four rows done
        if "compiled" not in comps:
            continue
        done.append(setting.upper())
        provenance.append(f"- {setting.upper()}: " + "; ".join(f"{p} {info[p]}" for p in comps) + ".")
        fams = {p: _family(c) for p, c in comps.items()}
        for base, e in fams["eager"].items():
            cells_ = [_cell(e)]
            for path in ("compiled", "control"):
                c = fams.get(path, {}).get(base)
                if c is None:
                    cells_ += ["-", "-"]
                    continue
                same = verdict(e) == verdict(c)
                agree[path][0] += same
                agree[path][1] += 1
                cells_ += [_cell(c), "yes" if same else "**no**"]
            rows.append(f"| {setting.upper()} | {base} | " + " | ".join(cells_) + " |")
        rounds += [
            f"| {setting.upper()} ({preset.target:.0%}) | {label} | "
            + " | ".join(rounds_text(comps[p], label, preset.target) if p in comps else "-"
                         for p in ("eager", "compiled", "control")) + " |"
            for label in PAPER_METHODS
        ]
        # does the path move a scheme's rounds? compiled (or control) - eager on the same seed (same partition
        # and start)
        for label in PAPER_METHODS:
            e_runs = comps["eager"].histories[label]
            row = {}
            for path in ("compiled", "control"):
                if path not in comps:
                    continue
                row[path] = path_shift(e_runs, comps[path].histories[label], preset.target, cap)
            shifts.append((setting.upper(), label, row))
    for path in ("compiled", "control"):  # Holm within each path's family of rows
        fam = [row[path] for _, _, row in shifts if path in row]
        for summary, p in zip(fam, holm([x["p"] for x in fam])):
            summary["p_holm"] = p
    cap = get_preset("fedcor-fmnist-2spc").trainer["rounds"]
    comp_ok, comp_n = agree["compiled"]
    ctrl_ok, ctrl_n = agree["control"]
    significant = [f"{st} {label}" for st, label, row in shifts if row["compiled"]["p_holm"] < ALPHA]
    n_control = sum("control" in row for _, _, row in shifts)

    def shift(row: dict, path: str) -> str:
        if path not in row:
            return "- | - | -"
        x = row[path]
        return f"{x['mean']:+.1f} ± {x['std']:.1f} | {x['p']:.3f} | {x['p_holm']:.3f}"

    lines = [
        "# FedCor's FMNIST Table 1: compiled engine path against the eager reference",
        "",
        f"- **Verdicts: {comp_ok} of {comp_n} agree** ({', '.join(done) or 'no setting'} finished on the compiled "
        "path)" + (" - the compiled path gives the eager table's verdicts." if comp_n and comp_ok == comp_n else
                   " - the compiled path does not give every verdict of the eager table (rows marked **no**)."),
        (f"- **Control, the eager path with another dropout stream: {ctrl_ok} of {ctrl_n} agree** with the stored "
         "eager table (benchmarks/reproductions/fedcor/stream_control.py: the eager path, seeds batched as the "
         "compiled runs were, dropout masks from other seeds; no compilation)." if ctrl_n else
         "- Control (the eager path with another dropout stream): not run."),
        f"- **Does the path move a scheme's rounds?** Compiled − eager rounds to the target, paired by seed, "
        f"Holm over {len(shifts)} schemes x settings: "
        + (f"significant for {', '.join(significant)}." if significant else "significant for none (table below)."),
        *provenance,
        "- One machine (AMD EPYC, 2 cores). The compiled runs: `fedselect reproduce fedcor-fmnist-<setting> "
        "--path compiled --batch-seeds --threads 1 --selectors Random=random AFL=afl Pow-d=power-of-choice:d=<2C> "
        "FedCor=fedcor:warmup_rounds=15,gp_interval=10,beta=0.95,theta=0.9 --paired FedCor` (the preset's four "
        "paper rows with its parameters; `--path` was then spelled `--engine`); the control: the same without "
        "`--path compiled`, with `--plugin "
        "benchmarks/reproductions/fedcor/stream_control.py`; the records keep the exact commands.",
        "",
        "Generated by `python -m benchmarks.reproductions.fedcor.compiled_verdicts`. A verdict is the report's: "
        "FedCor against each baseline paired by seed (Wilcoxon), Holm over the setting's three comparisons, a miss "
        f"counted as {cap + 1} rounds; faster / slower where p_Holm < {ALPHA}, else level. In brackets: baseline − "
        "FedCor, mean rounds over the seeds.",
        "",
        "| setting | baseline | eager | compiled | same verdict | eager, other dropout stream | same verdict |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "## Compiled − eager and control − eager rounds to the target, per scheme (paired by seed)",
        "",
        f"A miss counts as {cap + 1} rounds; mean ± std over the seeds; p: two-sided Wilcoxon; p_Holm over each "
        f"column's rows ({len(shifts)} compiled, {n_control} control).",
        "",
        "| setting | scheme | compiled − eager | p | p_Holm | control − eager | p | p_Holm |",
        "|---|---|---|---|---|---|---|---|",
        *(f"| {st} | {label} | {shift(row, 'compiled')} | {shift(row, 'control')} |" for st, label, row in shifts),
        "",
        "## Rounds to the target (mean ± std over the seeds that reached it)",
        "",
        "| setting | scheme | eager | compiled | eager, other dropout stream |",
        "|---|---|---|---|---|",
        *rounds,
        "",
    ]
    out = compiled_root / "VERDICTS.md"
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
