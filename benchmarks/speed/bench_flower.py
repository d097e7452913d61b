"""The Flower path against FederatedTrainer, measured in one run on one setting.

Prints, per selector: seconds per round of FederatedTrainer, of SelectorStrategy on an
in-process LocalGrid, and (with --ray) of SelectorStrategy under Flower's simulation engine
(``flwr.simulation.run_simulation``, Ray backend, one SuperNode per client); and the messages
and bytes the selector's oracle queries add per round on top of the round's own train messages.

Seconds per round are taken the same way for all three: a timestamp at the end of every round
(after that round's evaluation: the trainer's ``callback``, the strategy's ``evaluate_fn``), and
s/round = (end of round R - end of round 1) / (R - 1). Round 1 is left out everywhere; under Ray
it holds the start-up (Ray and its actors, the ClientApp loaded in each actor, every node's
hello, the selector's fit), which is printed on its own: from the call of ``run_simulation`` to
the end of round 1. Usage::

    FLWR_TELEMETRY_ENABLED=0 python -m benchmarks.speed.bench_flower [--rounds 10] [--ray]
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
RAY_SCHEMES = ("random", "power-of-choice", "fedcor")
TRAIN = dict(model="mlp", local_steps=10, batch_size=16, lr=0.05)


def per_round(ends: list[float]) -> float:
    """Seconds per round over rounds 2..R from the end-of-round timestamps (round 1 left out)."""
    return (ends[-1] - ends[0]) / (len(ends) - 1)


def timed_evaluate_fn(clients: FederationClients, ends: list[float]):
    """The clients' centralised evaluation, stamping the end of every round (not the one before round 1)."""
    evaluate = clients.evaluate_fn()

    def fn(server_round, arrays):
        res = evaluate(server_round, arrays)
        if server_round > 0:
            ends.append(time.perf_counter())
        return res

    return fn


def simulator_seconds(fed, name, rounds, seed) -> float:
    # A short throwaway run first: the simulator is timed first for each selector, so without it the
    # one-time costs of first use (GPyTorch's and torch's first calls on these shapes) would land in its
    # rounds and not in the Flower paths' that follow.
    fedselect.FederatedTrainer(
        selector=fedselect.get_selector(name, **SCHEMES[name]),
        clients_per_round=4,
        rounds=min(rounds, 6),
        aggregation="data-size",
        random_state=seed,
        **TRAIN,
    ).fit(fed)
    ends: list[float] = []
    fedselect.FederatedTrainer(
        selector=fedselect.get_selector(name, **SCHEMES[name]),
        clients_per_round=4,
        rounds=rounds,
        aggregation="data-size",
        random_state=seed,
        callback=lambda trainer, record: ends.append(time.perf_counter()),
        **TRAIN,
    ).fit(fed)
    return per_round(ends)


def localgrid_run(fed, name, rounds, seed) -> tuple[float, SelectorStrategy]:
    clients = FederationClients(fed, random_state=seed, **TRAIN)
    grid = LocalGrid(clients.client_app(), fed.n_clients, seed=seed)
    st = SelectorStrategy(
        fedselect.get_selector(name, **SCHEMES[name]),
        clients_per_round=4,
        n_clients=fed.n_clients,
        aggregation="data-size",
        random_state=seed,
    )
    ends: list[float] = []
    st.start(grid, clients.initial_arrays(), num_rounds=rounds, evaluate_fn=timed_evaluate_fn(clients, ends))
    return per_round(ends), st


def ray_run(fed, name, rounds, seed) -> tuple[float, float, list[int]]:
    """(s/round over rounds 2..R, start-up + round 1 in s, the clients chosen) under the simulation engine."""
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    clients = FederationClients(fed, random_state=seed, **TRAIN)
    ends: list[float] = []
    out = {}
    server = ServerApp()

    @server.main()
    def main(grid, context):
        st = SelectorStrategy(
            fedselect.get_selector(name, **SCHEMES[name]),
            clients_per_round=4,
            n_clients=fed.n_clients,
            aggregation="data-size",
            random_state=seed,
        )
        st.start(grid, clients.initial_arrays(), num_rounds=rounds, evaluate_fn=timed_evaluate_fn(clients, ends))
        out["st"] = st

    t0 = time.perf_counter()
    run_simulation(
        server_app=server,
        client_app=clients.client_app(),
        num_supernodes=fed.n_clients,
        backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 2}},
    )
    if "st" not in out or len(ends) != rounds:
        raise RuntimeError(f"bench_flower: the simulation engine run of {name} did not finish its {rounds} rounds")
    chosen = [k for rec in out["st"].rounds_ for k in rec.clients]
    return per_round(ends), ends[0] - t0, chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--ray", action="store_true", help=f"also time {', '.join(RAY_SCHEMES)} under Flower's simulation engine (Ray)"
    )
    args = ap.parse_args()
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (round 1 is left out of the seconds per round)")
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    fed = fedselect.make_federation("digits", partition="shards", n_clients=args.clients, random_state=args.seed)
    print(
        f"# digits, {args.clients} clients (shards), 4 per round, {args.rounds} rounds, MLP, 10 local steps; "
        f"torch threads 1; Ray: 2 CPUs, 1 per client; s/round over rounds 2..{args.rounds}; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    )
    print(
        "| selector | simulator s/round | LocalGrid s/round | ratio | Ray s/round | ratio | Ray start-up + round 1 s "
        "| query msgs/round | query MB/round | train msgs/round | train MB/round |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in SCHEMES:
        sim = simulator_seconds(fed, name, args.rounds, args.seed)
        flw, st = localgrid_run(fed, name, args.rounds, args.seed)
        ray = ray_ratio = ray_start = "-"
        if args.ray and name in RAY_SCHEMES:
            r, r0, chosen = ray_run(fed, name, args.rounds, args.seed)
            if chosen != [k for rec in st.rounds_ for k in rec.clients]:
                print(f"# note: {name} chose other clients under Ray than on the LocalGrid")
            ray, ray_ratio, ray_start = f"{r:.3f}", f"{r / sim:.1f}", f"{r0:.1f}"
        q_msgs = q_bytes = t_msgs = t_bytes = 0
        for rec in st.rounds_:
            for kind, tr in rec.traffic.items():
                msgs, size = tr.messages_down + tr.messages_up, tr.bytes_down + tr.bytes_up
                if kind in ("loss", "update", "trial"):
                    q_msgs, q_bytes = q_msgs + msgs, q_bytes + size
                elif kind == "train":
                    t_msgs, t_bytes = t_msgs + msgs, t_bytes + size
        R = len(st.rounds_)
        print(
            f"| {name} | {sim:.3f} | {flw:.3f} | {flw / sim:.1f} | {ray} | {ray_ratio} | {ray_start} | "
            f"{q_msgs / R:.1f} | {q_bytes / R / 1e6:.3f} | {t_msgs / R:.1f} | {t_bytes / R / 1e6:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
