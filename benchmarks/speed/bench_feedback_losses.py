"""Seconds per round of FedAvg with random selection, with and without the reporters' loss evaluation.

Random selection never reads ``RoundFeedback.losses``; ``FederatedTrainer(feedback_losses="auto")`` (the
default) therefore skips the forward pass over the chosen clients' evaluation data that
``feedback_losses="always"`` (every run's charging before the option) makes each round. The two settings train the
same model bit for bit (checked here); the difference is the work skipped. Jobs: digits (20 clients, 2 label shards
each, 5 a round, the built-in MLP) and, when its files are found, the Fashion-MNIST job of issue 34 (100 clients of 2
label shards, 10 a round, MLP 784-200-200-10, plain SGD lr 0.05, batch 50, one local epoch). One thread; the two
settings alternate, the ratio is the median of the per-pair ratios.

Usage::

    python -m benchmarks.speed.bench_feedback_losses [--repeats 5] [--rounds 20] [--fmnist DIR]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from fedselect import FederatedTrainer, make_federation

FMNIST = Path("/usr/share/datasets/fashion-mnist")


def jobs(fmnist: Path) -> dict[str, tuple[Any, dict[str, Any]]]:
    out = {
        "digits": (
            make_federation("digits", partition="shards", n_clients=20, shards_per_client=2, random_state=0),
            dict(model="mlp", clients_per_round=5, local_epochs=1, batch_size=16, lr=0.05),
        )
    }
    if fmnist.is_dir():
        fed = make_federation(
            "fmnist", data_dir=str(fmnist), partition="shards", n_clients=100, shards_per_client=2, random_state=0
        )
        out["fmnist"] = (
            fed,
            dict(
                model="mlp",
                model_params={"hidden": (200, 200)},
                clients_per_round=10,
                local_epochs=1,
                batch_size=50,
                lr=0.05,
            ),
        )
    return out


def per_round(fed: Any, params: dict[str, Any], rounds: int, setting: str) -> tuple[float, bytes]:
    tr = FederatedTrainer(
        selector="random",
        rounds=rounds,
        random_state=0,
        n_threads=1,
        feedback_losses=setting,
        eval_every=rounds,
        **params,
    )
    start = time.perf_counter()
    tr.fit(fed)
    return (time.perf_counter() - start) / rounds, tr.parameters_.tobytes()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--fmnist", type=Path, default=FMNIST)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    for name, (fed, params) in jobs(args.fmnist).items():
        per_round(fed, params, 2, "auto")  # warm-up
        auto, always, ratios = [], [], []
        for _ in range(args.repeats):
            a, bits_a = per_round(fed, params, args.rounds, "auto")
            b, bits_b = per_round(fed, params, args.rounds, "always")
            assert bits_a == bits_b, "feedback_losses changed the training"
            auto.append(a)
            always.append(b)
            ratios.append(a / b)
        print(
            f"{name}: s/round auto {statistics.median(auto):.4f} (min {min(auto):.4f}), always "
            f"{statistics.median(always):.4f} (min {min(always):.4f}); auto/always median of pairs "
            f"{statistics.median(ratios):.3f} ({', '.join(f'{r:.3f}' for r in ratios)}); same final model: yes"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
