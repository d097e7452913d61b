"""The Flower path against FederatedTrainer, measured in one run on one setting.

Prints, per selector: seconds per round of FederatedTrainer, of SelectorStrategy on an
in-process LocalGrid, and (with --ray) of SelectorStrategy under Flower's simulation engine;
and the messages and bytes the selector's oracle queries add per round on top of the round's
own train messages. Usage::

    FLWR_TELEMETRY_ENABLED=0 python benchmarks/bench_flower.py [--rounds 10] [--ray]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
import warnings

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_HOME", tempfile.mkdtemp(prefix="fedselect-bench-flwr-"))

import numpy as np
import torch

import fedselect
from fedselect.flower import FederationClients, LocalGrid, SelectorStrategy

SCHEMES = {
    "random": {},
    "power-of-choice": {"d": 8},
    "afl": {},
    "fedcor": {"warmup_rounds": 3, "gp_interval": 3, "warmup_iters": 30, "gp_iters": 30},
    "ocs": {},
    "hcsfed": {"n_clusters": 3},
}
TRAIN = dict(model="mlp", local_steps=10, batch_size=16, lr=0.05)


def ray_seconds(fed, name, rounds, seed):
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    clients = FederationClients(fed, random_state=seed, **TRAIN)
    out = {}
    server = ServerApp()

    @server.main()
    def main(grid, context):
        st = SelectorStrategy(fedselect.get_selector(name, **SCHEMES[name]), clients_per_round=4,
                              aggregation="data-size", random_state=seed)
        st.start(grid, clients.initial_arrays(), num_rounds=rounds)
        out["st"] = st

    run_simulation(server_app=server, client_app=clients.client_app(), num_supernodes=fed.n_clients,
                   backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 2}})
    return float(np.mean([r.seconds for r in out["st"].rounds_[1:]]))  # round 0 includes the hellos and fit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ray", action="store_true", help="also time random and fedcor under the simulation engine")
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    fed = fedselect.make_federation("digits", partition="shards", n_clients=args.clients, random_state=args.seed)
    print(f"# digits, {args.clients} clients (shards), 4 per round, {args.rounds} rounds, MLP, 10 local steps; "
          f"torch threads 1; {platform.processor() or platform.machine()}")
    print("| selector | simulator s/round | Flower LocalGrid s/round | ratio | Flower Ray s/round "
          "| query msgs/round | query MB/round | train msgs/round | train MB/round |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, params in SCHEMES.items():
        t0 = time.perf_counter()
        fedselect.FederatedTrainer(selector=fedselect.get_selector(name, **params), clients_per_round=4,
                                   rounds=args.rounds, aggregation="data-size", random_state=args.seed,
                                   **TRAIN).fit(fed)
        sim = (time.perf_counter() - t0) / args.rounds
        clients = FederationClients(fed, random_state=args.seed, **TRAIN)
        grid = LocalGrid(clients.client_app(), fed.n_clients, seed=args.seed)
        st = SelectorStrategy(fedselect.get_selector(name, **params), clients_per_round=4, aggregation="data-size",
                              random_state=args.seed)
        t0 = time.perf_counter()
        st.start(grid, clients.initial_arrays(), num_rounds=args.rounds, evaluate_fn=clients.evaluate_fn())
        flw = (time.perf_counter() - t0) / args.rounds
        rays = f"{ray_seconds(fed, name, args.rounds, args.seed):.3f}" if args.ray and name in ("random",
                                                                                                "fedcor") else "-"
        q_msgs = q_bytes = t_msgs = t_bytes = 0
        for rec in st.rounds_:
            for kind, tr in rec.traffic.items():
                msgs, size = tr.messages_down + tr.messages_up, tr.bytes_down + tr.bytes_up
                if kind in ("loss", "update", "trial"):
                    q_msgs, q_bytes = q_msgs + msgs, q_bytes + size
                elif kind == "train":
                    t_msgs, t_bytes = t_msgs + msgs, t_bytes + size
        R = len(st.rounds_)
        print(f"| {name} | {sim:.3f} | {flw:.3f} | {flw / sim:.1f} | {rays} | {q_msgs / R:.1f} | "
              f"{q_bytes / R / 1e6:.3f} | {t_msgs / R:.1f} | {t_bytes / R / 1e6:.3f} |", flush=True)


if __name__ == "__main__":
    main()
