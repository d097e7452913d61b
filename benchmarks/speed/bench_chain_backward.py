"""What the linear chain's hand-written backward pass buys over autograd, bits checked.

FedCor's MLP trains on the engine's hand-batched chain path. With the built-in cross-entropy its
gradients come from :func:`~fedselect.simulation.engine.chain.chain_backward`, the chain's backward
pass written out (the same operations autograd runs, one private ``aten`` op among them); any other
loss goes through autograd over the same chain. This script times one engine's local training both
ways, interleaved call by call on the same minibatches and dropout seeds, and checks that both give
the same deltas and leave torch's generator in the same state, bit for bit:

* S = 1: :meth:`Engine.train` of one FedCor FMNIST 2SPC round (5 clients x 3 epochs of batch 64 on
  480 samples each, dropout 0.5, weight decay 1e-4), what ``FederatedTrainer.fit`` runs;
* S = ``--runs``: :meth:`Engine.train_runs` of that many runs' rounds at once (batched seeds).

The data are random (the time does not depend on the values); one torch thread. It prints medians
and minima over ``--rounds`` after two warm-up rounds, and autograd / by hand.

Usage::

    python -m benchmarks.speed.bench_chain_backward [--rounds 40] [--runs 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from fedselect.simulation.engine import Engine, LocalSchedule
from fedselect.simulation.models import FedCorMLP


def _train(eng: Engine, theta: torch.Tensor, batches: list, rnd: int) -> tuple[float, torch.Tensor, torch.Tensor]:
    """One round's local training of ``len(batches)`` runs (``train`` for one): seconds, deltas, generator state."""
    runs = len(batches)
    start = time.perf_counter()
    if runs == 1:
        deltas = eng.train(theta, batches[0], lr=0.005, weight_decay=1e-4, dropout_seed=rnd)
    else:
        out, _ = eng.train_runs(
            [theta] * runs, batches, lrs=[0.005] * runs, dropout_seeds=list(range(rnd, rnd + runs)), weight_decay=1e-4
        )
        deltas = torch.cat(out)
    return time.perf_counter() - start, deltas, torch.get_rng_state()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40, help="rounds timed for S = 1 (a quarter of them for S = runs)")
    ap.add_argument("--runs", type=int, default=10, help="runs trained at once in the batched case")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}, 1 thread, load average before: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    rng = np.random.default_rng(0)
    n_clients, per = 5 * args.runs, 480
    X = rng.normal(size=(n_clients * per, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, size=n_clients * per)
    parts = [np.arange(i * per, (i + 1) * per) for i in range(n_clients)]
    torch.manual_seed(0)
    eng = Engine(FedCorMLP((1, 28, 28), 10, dropout=0.5), X, y, parts, X[:100], y[:100])
    theta = eng.initial_parameters()
    schedule = LocalSchedule(64, epochs=3)
    ways = {"by hand": True, "autograd": False}  # the chain path's choice (ChainPath.by_hand)
    for runs, rounds in ((1, args.rounds), (args.runs, max(args.rounds // 4, 3))):
        times: dict[str, list[float]] = {way: [] for way in ways}
        for rnd in range(rounds + 2):
            batches = [eng.client_batches(parts, schedule, r, rnd, range(5 * r, 5 * r + 5)) for r in range(runs)]
            results = {}
            for way in ways if rnd % 2 else reversed(list(ways)):
                eng.local_path.by_hand = ways[way]
                results[way] = _train(eng, theta, batches, rnd)
                if rnd >= 2:
                    times[way].append(results[way][0])
            (_, a, sa), (_, b, sb) = results.values()
            if not (torch.equal(a, b) and torch.equal(sa, sb)):
                raise AssertionError(f"S = {runs}, round {rnd}: the two backward passes gave different bits")
        hand, auto = (statistics.median(times[w]) for w in ways)
        print(
            f"S = {runs:2d} ({5 * runs} clients, {rounds} rounds): by hand {hand * 1e3:7.1f} ms "
            f"(min {min(times['by hand']) * 1e3:7.1f}), autograd {auto * 1e3:7.1f} ms "
            f"(min {min(times['autograd']) * 1e3:7.1f}): autograd / by hand {auto / hand:.3f}; bits identical"
        )
    print(f"load average after: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
