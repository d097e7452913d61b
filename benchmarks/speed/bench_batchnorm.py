"""What batch norm costs in the batched engine: seconds per round, batched vs a per-client loop.

One small CNN on digits (8 x 8 images), with and without a BatchNorm2d after its convolution,
10 clients per round, trained three ways in one run, interleaved round by round so that machine
noise hits every contender alike:

1. ``Engine.train`` on a model with batch norm (the stateful path: per-client buffers, clients
   grouped by minibatch length at each step);
2. ``Engine.train`` on the same model without batch norm (the padded path);
3. research-style code: clients one after another, a deepcopy of the model each, torch.optim.SGD.

Two schedules: ``local_steps`` (every client's batches have one length: one group per step) and
``local_epochs`` over unequal clients (partial last batches: up to one vmapped forward per
distinct length at a step). Medians are printed with the ratios.

Usage::

    python -m benchmarks.speed.bench_batchnorm [--rounds 12] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedselect.data import make_federation
from fedselect.simulation.engine import Engine, LocalSchedule


def cnn(bn: bool) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(1, 16, 3, padding=1)]
    if bn:
        layers.append(nn.BatchNorm2d(16))
    layers += [nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 16, 10)]
    return nn.Sequential(*layers)


def loop(model: nn.Module, batches, X: torch.Tensor, y: torch.Tensor, lr: float) -> None:
    for bs in batches:
        local = copy.deepcopy(model)
        local.train()
        opt = torch.optim.SGD(local.parameters(), lr=lr)
        for ix in bs:
            opt.zero_grad()
            F.cross_entropy(local(X[ix]), y[ix]).backward()
            opt.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    fed = make_federation("digits", partition="dirichlet", alpha=0.5, n_clients=40, random_state=0)
    X, y = torch.from_numpy(fed.X), torch.from_numpy(fed.y)
    torch.manual_seed(0)
    with_bn, without = cnn(True), cnn(False)
    engines = {
        "bn": Engine(with_bn, fed.X, fed.y, fed.loss_indices, fed.X_test, fed.y_test),
        "plain": Engine(without, fed.X, fed.y, fed.loss_indices, fed.X_test, fed.y_test),
    }
    rng = np.random.default_rng(0)
    for label, sched in (
        ("local_steps=10, batch 16", LocalSchedule(16, steps=10)),
        ("local_epochs=1, batch 16", LocalSchedule(16, epochs=1)),
    ):
        times: dict[str, list[float]] = {
            "batched, batch norm": [],
            "batched, no batch norm": [],
            "per-client loop, batch norm": [],
        }
        lengths = []
        for t in range(args.rounds + 1):
            clients = rng.choice(fed.n_clients, 10, replace=False)
            batches = engines["bn"].client_batches(fed.client_indices, sched, 0, t, clients)
            lengths.append(
                np.mean([len({len(b[s]) for b in batches if s < len(b)}) for s in range(max(len(b) for b in batches))])
            )
            bn, plain = engines["bn"], engines["plain"]
            runs = (
                ("batched, batch norm", bn.train, (bn.initial_parameters(), batches), {"return_buffers": True}),
                ("batched, no batch norm", plain.train, (plain.initial_parameters(), batches), {}),
                ("per-client loop, batch norm", loop, (with_bn, batches, X, y), {}),  # lr by keyword too
            )
            for name, func, pos, kw in runs:
                start = time.perf_counter()
                func(*pos, lr=0.05, **kw)
                if t:  # round 0 warms up
                    times[name].append(time.perf_counter() - start)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"\n{label}: 10 clients per round, median of {args.rounds} rounds, {args.threads} threads; "
            f"distinct minibatch lengths per step {np.mean(lengths):.2f} on average"
        )
        for name, v in med.items():
            print(f"  {name:30s} {1000 * v:8.1f} ms/round")
        ratio = med["batched, batch norm"] / med["batched, no batch norm"]
        print(f"  batch norm / no batch norm (batched): {ratio:.2f}x")
        print(
            f"  per-client loop / batched (batch norm): "
            f"{med['per-client loop, batch norm'] / med['batched, batch norm']:.2f}x"
        )


if __name__ == "__main__":
    main()
