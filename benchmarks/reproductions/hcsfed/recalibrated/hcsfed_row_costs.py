"""CPU seconds per round of every row of HCSFed's FMNIST table in a candidate shared setting.

Times each row of the ``hcsfed-fmnist-q<q>-calibrated`` preset (Random, Importance (OCS), Importance-size,
Cluster, Cluster-size (Alg. 1)), each HCSFed reading of ``hcsfed-fmnist-q<q>-readings`` and full
participation (random with C = N) for a few rounds on one seed, in the setting given (partition, alpha, lr),
without stopping at the target, one torch thread, one row after another in this process. Each row's
result (wall and CPU seconds for the rounds, per round) is appended to ``row_costs.jsonl`` beside this file
as it finishes; a rerun skips rows already there. The per-round figures, times the rounds each run takes,
give the core-hours of the full table (CALIBRATION.md).

    PYTHONPATH=. nice -n 19 python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_row_costs.py \\
        --partition dirichlet-qp --alpha 0.1 --lr 0.02 --q 0.1 0.3 0.5 --rounds 10
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "row_costs.jsonl"


def _rows(q: float) -> dict[str, tuple[str, dict[str, Any]]]:
    from fedselect.presets import get_preset

    calibrated = get_preset(f"hcsfed-fmnist-q{q}-calibrated")
    readings = get_preset(f"hcsfed-fmnist-q{q}-readings")
    rows = {k: v for k, v in calibrated.selectors.items() if not k.startswith("HCSFed")}
    rows.update(readings.selectors)
    rows["Full participation"] = ("random", {})
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--partition", default="dirichlet-qp", choices=("dirichlet", "dirichlet-qp"))
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--q", type=float, nargs="+", default=[0.1, 0.3, 0.5], choices=(0.1, 0.3, 0.5))
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--rows", nargs="+", default=None, help="only the rows whose label starts with one of these")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.lr <= 0 or args.alpha <= 0:
        p.error("--rounds must be at least 1, --lr and --alpha positive")

    import torch

    from fedselect import FederatedTrainer, get_selector
    from fedselect.data import make_federation
    from fedselect.presets import get_preset

    torch.set_num_threads(1)
    done = set()
    if args.results.exists():
        for line in args.results.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done.add((r["setting"], r["q"], r["row"]))
    setting = f"{args.partition}-{args.alpha:g}-lr{args.lr:g}-seed{args.seed}-r{args.rounds}"
    for q in args.q:
        base = get_preset(f"hcsfed-fmnist-q{q}-calibrated")
        fed_kw = {**base.federation, "partition": args.partition, "alpha": args.alpha}
        if args.partition == "dirichlet-qp":
            fed_kw.pop("min_samples", None)
        fed = make_federation(random_state=args.seed, **fed_kw)
        for row, (name, params) in _rows(q).items():
            if (setting, q, row) in done or (args.rows and not any(row.startswith(x) for x in args.rows)):
                continue
            c = fed.n_clients if row == "Full participation" else base.trainer["clients_per_round"]
            trainer = {
                **base.trainer,
                "lr": args.lr,
                "rounds": args.rounds,
                "stop_at_target": False,
                "clients_per_round": c,
            }
            tr = FederatedTrainer(selector=get_selector(name, **params), random_state=args.seed, n_threads=1, **trainer)
            t0, c0 = time.perf_counter(), time.process_time()
            error = None
            try:
                tr.fit(fed)
                n = len(tr.history_.rounds)
            except Exception as exc:  # a diverging reading still tells its cost per round
                error, n = f"{type(exc).__name__}: {exc}"[:200], int(getattr(exc, "round", 0)) + 1
            t1, c1 = time.perf_counter(), time.process_time()
            out = {
                "setting": setting,
                "q": q,
                "row": row,
                "rounds": n,
                "wall_s": round(t1 - t0, 3),
                "cpu_s": round(c1 - c0, 3),
                "cpu_s_per_round": round((c1 - c0) / n, 4),
                "error": error,
                "load_avg": os.getloadavg()[0],
            }
            with args.results.open("a") as fh:
                fh.write(json.dumps(out) + "\n")
            print(f"q={q} {row}: {(c1 - c0) / n:.3f} CPU s/round over {n} rounds ({t1 - t0:.1f} s wall)", flush=True)


if __name__ == "__main__":
    main()
