"""How much of the federation HCSFed's Eq. 5 leaves out, round by round.

Eq. 5 gives a cluster of zero cohesion (a singleton, in practice an outlying client that
k-means isolates) no places, so its clients have inclusion probability 0 that round and the
aggregate misses their term (``HCSFedSelector`` docstring, "known limit"). This script runs
the ``hcsfed-fmnist-q<q>`` preset's HCSFed for a fixed number of rounds (no early stop) and
records, after every selection, the clusters with S_h = 0, the clients with pi_k = 0 and their
share of the data (sum of p_k), for the paper's allocation (``uniform_mix = 0``) and the
defensive mixture (``uniform_mix > 0``). Output: ``benchmarks/reproductions/hcsfed/skipped.{json,md}``.

    python -m benchmarks.reproductions.hcsfed.hcsfed_skipped --q 0.1 --seeds 0 1 2 --rounds 40 --mix 0 0.1 \
        --kmeans-init random k-means++
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
from fedselect.selection import Selection
from fedselect.selectors.hcsfed import HCSFedSelector

OUT = Path(__file__).resolve().parent


class RecordingHCSFed(HCSFedSelector):
    """HCSFed that keeps, per round, its zero-cohesion clusters and zero-probability clients."""

    def _fit(self, pool: Any) -> None:
        super()._fit(pool)
        self.record_: list[dict[str, Any]] = []

    def _select(self, n: int, *, round: int, oracle: Any) -> Selection:
        sel = super()._select(n, round=round, oracle=oracle)
        skipped = self.inclusion_ == 0
        self.record_.append(
            {
                "round": round,
                "clusters": int(self.labels_.max()) + 1,
                "zero_cohesion_clusters": int((self.cohesion_ == 0).sum()),
                "skipped_clients": int(skipped.sum()),
                "skipped_weight": float(self.weights_[skipped].sum()),
                "weight_sum": float(np.sum(sel.weights)),
            }
        )
        return sel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--q", type=float, default=0.1, help="sampling ratio of the preset (0.1, 0.3, 0.5)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--mix", type=float, nargs="+", default=[0.0, 0.1], help="uniform_mix values")
    ap.add_argument("--kmeans-init", nargs="+", default=["random"], choices=["random", "k-means++"])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    preset = get_preset(f"hcsfed-fmnist-q{args.q:g}")
    params = dict(preset.selectors["HCSFed"][1])
    trainer = dict(preset.trainer, rounds=args.rounds, stop_at_target=False)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "skipped.json"
    cells: list[dict[str, Any]] = json.loads(path.read_text())["cells"] if path.exists() else []
    done = {(c["q"], c["params"]["kmeans_init"], c["uniform_mix"], c["seed"], c["rounds"]) for c in cells}
    for seed in args.seeds:
        fed = make_federation(**preset.federation, random_state=seed)
        for init, mix in [(i, m) for i in args.kmeans_init for m in args.mix]:
            if (args.q, init, mix, seed, args.rounds) in done:
                continue
            params["kmeans_init"] = init
            start = time.perf_counter()
            tr = FederatedTrainer(
                selector=RecordingHCSFed(**params, uniform_mix=mix), **trainer, random_state=seed, n_threads=1
            ).fit(fed)
            rec = tr.selector_.record_
            cells.append(
                {
                    "q": args.q,
                    "uniform_mix": mix,
                    "seed": seed,
                    "rounds": args.rounds,
                    "params": dict(params),
                    "final_accuracy": tr.history_.final_accuracy(),
                    "rounds_to_80": tr.history_.rounds_to_accuracy(0.8),
                    "per_round": rec,
                    "seconds": time.perf_counter() - start,
                }
            )
            print(
                f"q={args.q} init={init} mix={mix} seed={seed}: skipped clients/round "
                f"{np.mean([r['skipped_clients'] for r in rec]):.2f}, data share "
                f"{np.mean([r['skipped_weight'] for r in rec]):.3f}",
                flush=True,
            )
            path.write_text(json.dumps({"trainer": trainer, "cells": cells}, indent=1))

    lines = [
        f"HCSFed: what Eq. 5 leaves out per round (hcsfed-fmnist presets, {args.rounds} rounds, no early stop; "
        "`python -m benchmarks.reproductions.hcsfed.hcsfed_skipped`)",
        "",
        "| q | k-means start | uniform_mix | seeds | rounds with a skipped client | "
        "skipped clients / round (mean, max) | their data share / round (mean, max) | "
        "total weight / round (min-max) | rounds to 80 % |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for q, init, mix in sorted({(c["q"], c["params"]["kmeans_init"], c["uniform_mix"]) for c in cells}):
        cs = [c for c in cells if (c["q"], c["params"]["kmeans_init"], c["uniform_mix"]) == (q, init, mix)]
        recs = [r for c in cs for r in c["per_round"]]
        k = np.array([r["skipped_clients"] for r in recs])
        w = np.array([r["skipped_weight"] for r in recs])
        ws = np.array([r["weight_sum"] for r in recs])
        hits = [c["rounds_to_80"] for c in cs if c["rounds_to_80"] is not None]
        reach = "-"
        if hits:
            reach = f"{np.mean(hits):.1f}" + ("" if len(hits) == len(cs) else f" ({len(hits)}/{len(cs)})")
        lines.append(
            f"| {q:g} | {init} | {mix:g} | {len(cs)} | {(k > 0).mean():.0%} | {k.mean():.2f}, {k.max()} | "
            f"{w.mean():.2%}, {w.max():.2%} | {ws.min():.2f}-{ws.max():.2f} | {reach} |"
        )
    (args.out / "skipped.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
