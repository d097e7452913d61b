"""HCSFed's sensitivity to the number of clusters H and the compression rate R (the paper's Fig. 4).

The paper runs logistic regression on non-IID MNIST with H in {5, ..., 10} (R fixed) and
R in {5, 10, 20, 40, 100} % (H fixed) and reports the best test accuracy and the rounds
needed to reach it. Here the setting is the ``hcsfed-fmnist-q0.1`` preset (Fashion-MNIST
in place of MNIST, SPEC), with the same two sweeps; each cell also reports rounds to
the preset's 80 % target. HCSFed runs the reading the recorded sweep ran (:data:`READING`:
cohesion="pairwise-sum", 10 k-means runs per round from random clients), not the current defaults. Results go to
``benchmarks/reproductions/hcsfed/sensitivity.{json,md}``; finished cells are kept in the JSON and
skipped on a rerun.

    python -m benchmarks.reproductions.hcsfed.hcsfed_sensitivity  # full: 200 rounds, 3 seeds, both sweeps
    python -m benchmarks.reproductions.hcsfed.hcsfed_sensitivity --rounds 60 --seeds 0 --clusters 5 10 \\
        --rates 0.01 0.05 0.2
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedselect import FederatedTrainer
from fedselect.data import make_federation
from fedselect.presets import get_preset
from fedselect.selectors.hcsfed import HCSFedSelector

OUT = Path(__file__).resolve().parent
# The reading the recorded sweep ran (the defaults then): S_h as the all-pairs sum (cohesion="pairwise-sum", named
# "paper" then) and the best of 10 k-means runs per round, each from H random clients. Pinned, so a rerun extends
# the sweep with the same scheme now that the defaults are cohesion="std" and one k-means run.
READING = {"cohesion": "pairwise-sum", "kmeans_n_init": 10, "kmeans_init": "random"}


def run_cell(fed: Any, trainer: dict[str, Any], n_clusters: int, rate: float, seed: int) -> dict[str, Any]:
    """One training run of HCSFed with ``n_clusters`` and ``rate``; its headline numbers."""
    tr = FederatedTrainer(
        selector=HCSFedSelector(n_clusters=n_clusters, compression_rate=rate, **READING),
        **trainer,
        random_state=seed,
        n_threads=1,
    )
    start = time.perf_counter()
    history = tr.fit(fed).history_
    acc = [a for _, a in history.accuracies()]
    best = float(np.max(acc))
    return {
        "n_clusters": n_clusters,
        "rate": rate,
        "seed": seed,
        "rounds_run": len(history),
        "best_accuracy": best,
        "rounds_to_best": int(np.argmax(acc)) + 1,
        "rounds_to_target": history.rounds_to_accuracy(trainer["target_accuracy"]),
        "floats_up_per_round": history.total_costs().floats_up / len(history),
        "seconds": time.perf_counter() - start,
    }


def table(cells: list[dict[str, Any]], target: float) -> str:
    """A markdown table: mean over seeds of each (H, R) cell."""
    keys = sorted({(c["n_clusters"], c["rate"]) for c in cells})
    lines = [
        f"| H | R | seeds | best accuracy | rounds to best | rounds to {target:.0%} | floats up / round |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for h, r in keys:
        cs = [c for c in cells if (c["n_clusters"], c["rate"]) == (h, r)]
        hits = [c["rounds_to_target"] for c in cs if c["rounds_to_target"] is not None]
        reached = "N/A" if not hits else f"{np.mean(hits):.1f}"
        if hits and len(hits) < len(cs):
            reached += f" ({len(hits)}/{len(cs)})"
        lines.append(
            f"| {h} | {r:g} | {len(cs)} | {np.mean([c['best_accuracy'] for c in cs]):.4f} | "
            f"{np.mean([c['rounds_to_best'] for c in cs]):.1f} | {reached} | "
            f"{np.mean([c['floats_up_per_round'] for c in cs]):.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="hcsfed-fmnist-q0.1")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per run (default: the preset's)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--clusters", type=int, nargs="+", default=[5, 6, 7, 8, 9, 10], help="H sweep (R fixed)")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.4, 1.0], help="R sweep")
    parser.add_argument("--fixed-rate", type=float, default=0.05, help="R during the H sweep")
    parser.add_argument("--fixed-clusters", type=int, default=5, help="H during the R sweep")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    preset = get_preset(args.preset)
    trainer = dict(preset.trainer)
    trainer["stop_at_target"] = False  # "rounds to the best accuracy" needs the whole run
    if args.rounds is not None:
        trainer["rounds"] = args.rounds
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "sensitivity.json"
    cells: list[dict[str, Any]] = json.loads(path.read_text())["cells"] if path.exists() else []
    done = {(c["n_clusters"], c["rate"], c["seed"], c["rounds_run"]) for c in cells}
    grid = [(h, args.fixed_rate) for h in args.clusters] + [(args.fixed_clusters, r) for r in args.rates]
    for seed in args.seeds:
        fed = make_federation(**preset.federation, random_state=seed)
        for h, r in dict.fromkeys(grid):
            if (h, r, seed, trainer["rounds"]) in done:
                continue
            cell = run_cell(fed, trainer, h, r, seed)
            cells.append(cell)
            print(json.dumps(cell), flush=True)
            path.write_text(
                json.dumps(
                    {
                        "preset": args.preset,
                        "trainer": trainer,
                        "fixed_rate": args.fixed_rate,
                        "fixed_clusters": args.fixed_clusters,
                        "cells": cells,
                    },
                    indent=1,
                )
            )
    text = table(cells, trainer["target_accuracy"])
    (args.out / "sensitivity.md").write_text(
        f"HCSFed sensitivity ({args.preset}, {trainer['rounds']} rounds; the paper's Fig. 4 on FMNIST)\n\n{text}\n"
    )
    print(text)


if __name__ == "__main__":
    main()
