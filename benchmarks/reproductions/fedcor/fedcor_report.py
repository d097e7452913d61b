"""Build the FedCor FMNIST reproduction report from the runs `fedselect reproduce` saved.

Reads benchmarks/reproductions/fedcor/fedcor-fmnist-{2spc,1spc,dir}/runs/*.json (whatever has
finished), and writes beside itself, into benchmarks/reproductions/fedcor/:

- REPORT.md: per setting, rounds to the target (mean ± std over seeds; N/A if any seed
  missed, then the seeds that reached it)
  side by side with the paper's Table 1, communication to the target, every (method, seed) cell
  with the command and commit that produced it (missing cells listed as missing);
- accuracy_<setting>.png (like the paper's Fig. 4), selection_<setting>.png (Fig. 6),
  communication_<setting>.png;
- tsne_1spc.png: t-SNE of FedCor's learned client embeddings normalised to unit length,
  coloured by each client's label (Fig. 7), when a 1SPC FedCor run has finished;

and, into each setting's folder, the comparison's own files from the same stored runs, with every
row the report shows: table.md, summary.json and results.csv (``Comparison.write``) and paired.md
(the report's paired tables). No run is trained again.

Usage::

    python -m benchmarks.reproductions.fedcor.fedcor_report
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from benchmarks.reproductions._holds import provenance, short_commit, what_holds
from fedselect.compare import load_comparison
from fedselect.presets import get_preset

ROOT = Path(__file__).resolve().parent  # the runs of each setting: ROOT / "fedcor-fmnist-<setting>"
OUT = "benchmarks/reproductions/fedcor"  # as the commands in the report name it
SETTINGS = ("2spc", "1spc", "dir")
PAPER_METHODS = ("Random", "AFL", "Pow-d", "FedCor")  # the paper's Table 1 rows
# Extra rows of the presets, shown where their runs exist: "FedCor (2022 code)" is the official code of July 2022
# (fedselect.selectors.fedcor.CODE_2022), the code behind the paper's Table 1.
METHODS = (*PAPER_METHODS, "FedCor (2022 code)")
CODE_2022_ROW = "FedCor (2022 code)"


def _gp_timing(cells: list[dict]) -> str:
    """What the stored 2022-code runs of ``cells`` ran for ``gp_round_offset`` (read from each run's settings): the
    sentence the report puts beside that row, or "" without such runs."""
    offsets = set()
    for c in cells:
        if c["label"] != CODE_2022_ROW:
            continue
        path = Path(c["path"])
        raw = path.read_bytes()
        saved = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
        offsets.add(int((saved.get("settings") or {}).get("params", {}).get("gp_round_offset", 0)))
    if not offsets:
        return ""
    if offsets == {1}:
        return f"The {CODE_2022_ROW} runs ran the 2022 code's GP rounds (`gp_round_offset=1`: rounds 21, 31, ...)."
    return (
        f"**The {CODE_2022_ROW} row is the 2022 code but for one difference:** its runs were recorded before "
        "`gp_round_offset` existed, with the paper's GP rounds (20, 30, ...: each GP round one round earlier than "
        "the 2022 code's, whose GP step runs after round e's aggregation and chooses round e + 1, i.e. rounds 21, "
        "31, ...). `CODE_2022`, and so the presets' row, now set `gp_round_offset=1`; the row was not rerun "
        "with it (10 seeds x 500 rounds per setting). `fedselect reproduce fedcor-fmnist-<setting>` into this "
        "folder now names that difference and refuses; with `--overwrite` it reruns this row only."
    )


def _command(argv: list[str] | None) -> str:
    if not argv:
        return ""
    return " ".join([Path(argv[0]).name, *argv[1:]])


def _tsne(cells: list[dict], preset_name: str, out: Path) -> str | None:
    from sklearn.manifold import TSNE

    from fedselect.data import make_federation

    fedcor = [c for c in cells if c["label"] == "FedCor" and c.get("selector_state")]
    if not fedcor:
        return None
    cell = sorted(fedcor, key=lambda c: c["seed"])[0]
    X = np.asarray(cell["selector_state"]["embeddings_"], dtype=float).T  # (N, d)
    X = X / np.linalg.norm(X, axis=1, keepdims=True).clip(1e-12)
    preset = get_preset(preset_name)
    fed = make_federation(random_state=int(cell["seed"]), **preset.federation)
    label = fed.label_histogram().argmax(1)
    emb = TSNE(n_components=2, perplexity=min(30, len(X) - 1), random_state=0, init="pca").fit_transform(X)
    fig, ax = plt.subplots(figsize=(5.5, 4.8), constrained_layout=True)
    sc = ax.scatter(emb[:, 0], emb[:, 1], c=label, cmap="tab10", s=28)
    ax.legend(*sc.legend_elements(), title="label", fontsize="x-small", loc="best", ncols=2)
    ax.set_title(
        f"FedCor embeddings, {preset_name}, seed {cell['seed']}\n(t-SNE of the unit-normalised embeddings)",
        fontsize="medium",
    )
    ax.set_xticks([])
    ax.set_yticks([])
    fig.savefig(out / "tsne_1spc.png", dpi=120)
    plt.close(fig)
    return f"tsne_1spc.png (seed {cell['seed']}, commit {cell['commit']})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    head = ["# FedCor Table 1 (FMNIST): what reproduces and what does not", ""]
    holds: list[str] = []
    every_cell: list[dict] = []
    lines = [
        "Generated by `python -m benchmarks.reproductions.fedcor.fedcor_report` from the runs of "
        f"`fedselect reproduce fedcor-fmnist-<setting> --out {OUT}/fedcor-fmnist-<setting>`.",
        "",
    ]
    for setting in SETTINGS:
        name = f"fedcor-fmnist-{setting}"
        preset = get_preset(name)
        run_dir = ROOT / name
        if not (run_dir / "runs").exists():
            lines += [f"## {setting.upper()}: no runs yet", ""]
            continue
        comp, cells = load_comparison(
            run_dir, preset.target, labels=METHODS, paper=preset.paper, title=preset.description.split(":")[0]
        )
        methods = [m for m in METHODS if m in PAPER_METHODS or comp.histories.get(m) or comp.failed.get(m)]
        comp = _only(comp, methods)
        every_cell += cells
        timing = _gp_timing(cells)
        paired_md: list[str] = []
        paper = ", ".join(f"{k} {v}" for k, v in preset.paper.items())
        holds.append(
            what_holds(
                comp,
                "FedCor",
                setting=f"{setting.upper()} (rounds to {preset.target:.0%})",
                claim=f"FedCor needs the fewest rounds ({paper}).",
                baselines=[m for m in PAPER_METHODS if m != "FedCor"],
            )
        )
        lines += [
            f"## {setting.upper()}, target {preset.target:.0%}",
            "",
            preset.description,
            "",
            comp.to_markdown(),
            "",
        ]
        extra = [m for m in preset.selectors if m not in methods]
        if extra:
            lines += [
                f"Not run yet (pending a rerun: `fedselect reproduce {name} --out {OUT}/{name}` "
                f"resumes and runs only these rows): {', '.join(extra)}.",
                "",
            ]
        if comp.histories.get("FedCor"):
            paired_md += [
                "FedCor against each scheme, paired by seed (rounds to the target of the scheme minus "
                "FedCor's on the same seed; positive: FedCor faster; a run that never reached it counts as "
                "501; p: two-sided Wilcoxon signed-rank test; p (Holm): adjusted over the three comparisons):",
                "",
                _only(comp, PAPER_METHODS).paired_markdown("FedCor"),
                "",
            ]
        first_end = len(paired_md)
        if comp.histories.get("FedCor") and comp.histories.get("FedCor (2022 code)"):
            paired_md += [
                "The paper's reading (FedCor) against the 2022 code, paired by seed (positive: the 2022 code faster):",
                "",
                _only(comp, ["FedCor", "FedCor (2022 code)"]).paired_markdown("FedCor (2022 code)"),
                "",
            ]
            # Issue 24, item 6: does the 2022 code's reading move the verdict? The same claim, its row as FedCor.
            baselines = [m for m in PAPER_METHODS if m != "FedCor"]
            comp22 = _only(comp, [*baselines, "FedCor (2022 code)"])
            holds.append(
                what_holds(
                    comp22,
                    "FedCor (2022 code)",
                    setting=f"{setting.upper()} with the 2022 code's FedCor (rounds to {preset.target:.0%})",
                    claim=f"FedCor needs the fewest rounds ({paper}).",
                    baselines=baselines,
                )
                + (f" {timing}" if timing else "")
            )
            paired_md += [
                "The 2022 code's FedCor against each baseline of the paper, paired by seed (Holm over the "
                "three comparisons; positive: the 2022 code faster):",
                "",
                comp22.paired_markdown("FedCor (2022 code)"),
                "",
            ]
        lines += paired_md
        if timing:
            lines += [timing, ""]
        # the setting's own files, from the stored runs, with every row shown above (issue 33, item 7)
        comp.write(run_dir)
        if timing:
            table = run_dir / "table.md"
            table.write_text(table.read_text() + "\n" + timing + "\n")
        if comp.histories.get("FedCor"):  # as `--paired FedCor` writes it, then the 2022 code's tables
            extra = paired_md[first_end:]  # the report's tables after its first (the paper's rows against FedCor)
            (run_dir / "paired.md").write_text(
                _only(comp, PAPER_METHODS).paired_report("FedCor") + ("\n" + "\n".join(extra) if extra else "")
            )
        res = {k: [v[s] for s in sorted(v)] for k, v in comp.histories.items() if v}
        if res:
            from fedselect.plotting import plot_accuracy, plot_communication, plot_selection_frequency

            tgt, ttl = preset.target, f"FMNIST {setting.upper()}"
            for fname, draw, size in (
                (
                    f"accuracy_{setting}.png",
                    lambda ax, r=res, t=tgt, s=ttl: plot_accuracy(r, target=t, ax=ax, title=s),
                    (7, 4.5),
                ),
                (
                    f"selection_{setting}.png",
                    lambda ax, r=res: plot_selection_frequency(r, 100, ax=ax),
                    (9, 1.2 + 0.45 * len(res)),
                ),
                (f"communication_{setting}.png", lambda ax, r=res, t=tgt: plot_communication(r, t, ax=ax), (7, 3.5)),
            ):
                fig, ax = plt.subplots(figsize=size, constrained_layout=True)
                draw(ax)
                fig.savefig(out / fname, dpi=120)
                plt.close(fig)
            lines += [
                f"![accuracy](accuracy_{setting}.png)",
                f"![selection](selection_{setting}.png)",
                f"![communication](communication_{setting}.png)",
                "",
            ]
        lines += [
            "Cells (method, seed): rounds to target, command, commit",
            "",
            "| method | seed | rounds to target | final acc | seconds | CPU | commit | command |",
            "|---|---|---|---|---|---|---|---|",
        ]
        have = {(c["label"], int(c["seed"])): c for c in cells}
        for m in methods:
            for seed in preset.seeds:
                c = have.get((m, seed))
                if c is None:
                    lines.append(f"| {m} | {seed} | missing | | | | | |")
                    continue
                h = comp.histories[m][seed]
                r = h.rounds_to_accuracy(preset.target)
                cpu = (c.get("machine") or {}).get("cpu", "not recorded")
                lines.append(
                    f"| {m} | {seed} | {r if r is not None else 'not reached'} | {h.final_accuracy():.3f} | "
                    f"{c['seconds']:.0f} | {cpu} | {short_commit(c['commit'])} | `{_command(c['command'])}` |"
                )
        lines.append("")
        if setting == "1spc":
            note = _tsne(cells, name, out)
            if note:
                lines += ["![t-SNE](tsne_1spc.png)", "", f"t-SNE: {note}", ""]
    lines += _variants()
    head += [*holds, "", provenance(every_cell), ""]
    lines = head + lines
    (out / "REPORT.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _only(comp, labels):
    """``comp`` with the rows ``labels`` only, in that order."""
    return type(comp)(
        histories={k: comp.histories.get(k, {}) for k in labels},
        target=comp.target,
        n_clients=comp.n_clients,
        out_dir=comp.out_dir,
        paper={k: v for k, v in comp.paper.items() if k in labels},
        title=comp.title,
        failed={k: v for k, v in comp.failed.items() if k in labels},
    )


def _variants() -> list[str]:
    """Other readings of FedCor on the Dirichlet split, beside the default row, if they were run."""
    run_dir = ROOT / "fedcor-fmnist-dir-variants"
    if not (run_dir / "runs").exists():
        return []
    preset = get_preset("fedcor-fmnist-dir")
    base, _ = load_comparison(ROOT / "fedcor-fmnist-dir", preset.target, labels=["Pow-d", "FedCor"])
    comp, cells = load_comparison(run_dir, preset.target)
    merged = type(comp)(histories={**base.histories, **comp.histories}, target=preset.target, n_clients=comp.n_clients)
    each = ["| scheme | " + " | ".join(f"seed {s}" for s in preset.seeds) + " |", "|---|" + "---|" * len(preset.seeds)]
    for label, runs in merged.histories.items():
        row = [
            str(runs[s].rounds_to_accuracy(preset.target) or "not reached") if s in runs else "missing"
            for s in preset.seeds
        ]
        each.append(f"| {label} | " + " | ".join(row) + " |")
    commits = sorted({short_commit(c["commit"]) for c in cells})
    return [
        "## Other readings of FedCor on the Dirichlet split",
        "",
        "FedCor's default (the paper's schedule: at each GP round the GP is refitted on 2 loss-change vectors, "
        "mu = 0, Eq. 11's noise-free posterior) does not reproduce the paper on DIR. Two other readings, run "
        'with `fedselect compare --preset fedcor-fmnist-dir --selectors "FedCor (noisy posterior, 2022 '
        'code)=fedcor:posterior_noise=True" "FedCor (2023 README)=fedcor:schedule=readme2023,'
        f'update_mean=True,beta=0.95" --out {OUT}/fedcor-fmnist-dir-variants` (commit '
        f"{', '.join(commits)}); the default FedCor and Power-of-choice rows are the table's above. The 2023 "
        "reading uses the README command's beta = 0.95, as the table's FedCor row does. Earlier versions of "
        "these rows (from other commits, with beta = 0.9, and before the 2023 schedule annealed the clients of "
        "its first selection after each reset) are in git history.",
        "",
        merged.to_markdown(),
        "",
        "Rounds to the target, per seed:",
        "",
        *each,
        "",
        *(
            [
                "The 2023 reading against the others, paired by seed (positive: the 2023 reading faster; "
                "two-sided Wilcoxon signed-rank test):",
                "",
                merged.paired_markdown("FedCor (2023 README)"),
                "",
            ]
            if merged.histories.get("FedCor (2023 README)")
            else []
        ),
    ]


if __name__ == "__main__":
    main()
