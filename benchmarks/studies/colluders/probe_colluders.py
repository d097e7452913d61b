"""Colluders against the Flower server's opt-in defences (issue 36 item 1): the probe of docs/security.rst.

Ten label-skewed digits clients (two labels each), 3 chosen a round, LocalGrid, FederationClients (MLP, 10 local
steps at lr 0.1). Clients 2, 5 and 8 collude: they answer every loss question with ``--lie`` and send their honest
update sign-flipped and scaled 2.5x; for Oort they report ``sample_loss_sq`` = 1e12 instead. Each line: selector,
defences, honest or attacked, seed, how many of the round's places the colluders took, final test accuracy.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/studies/colluders/probe_colluders.py --rounds 12 --seeds 0 1
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

import fedselect
from fedselect.flower import FederationClients, FlowerRoundWarning, LocalGrid, SelectorStrategy
from fedselect.flower import _protocol as P

N, COLLUDERS = 10, (2, 5, 8)
DEFENCES = {
    "none": {},
    "quantile-only": dict(loss_clip_quantile=0.3),
    "loo-only": dict(loss_outlier_factor=3.0),
    "quantile": dict(loss_clip_quantile=0.3, update_norm_bound=3.0),
    "loo": dict(loss_outlier_factor=3.0, update_norm_bound=3.0),
}


def colluding(app, lie, flip, sq_lie=None):
    def answer(message, context):
        reply = app(message, context)
        if int(context.node_config["partition-id"]) not in COLLUDERS or reply.has_error():
            return reply
        m = dict(reply.content["metrics"])
        if "loss" in m:
            m["loss"] = lie
        if sq_lie is not None and P.SAMPLE_LOSS_SQ in m:
            m[P.SAMPLE_LOSS_SQ] = sq_lie
        content = RecordDict({"metrics": MetricRecord(m)})
        if "update" in reply.content.array_records:
            upd = reply.content["update"]
            content["update"] = (
                upd if flip == 1 else ArrayRecord({k: Array(np.ascontiguousarray(flip * upd[k].numpy())) for k in upd})
            )
        return Message(content, reply_to=message)

    return answer


def run(clients, selector, attacked, seed, rounds, lie, flip, sq_lie, inner=None, **kw):
    app = clients.client_app()
    if attacked:
        app = colluding(app, lie, flip, sq_lie)
    if inner is not None:
        kw["aggregation"] = None
        kw["inner"] = inner
    else:
        kw.setdefault("aggregation", "data-size")
    if selector == "oort":  # no system penalty: measured durations would make runs differ
        from fedselect.selectors.oort import OortSelector

        selector = OortSelector(round_penalty=0.0)
    strategy = SelectorStrategy(selector, n_clients=N, random_state=seed, connect_timeout=1.0, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = strategy.start(
            LocalGrid(app, N, seed=5), clients.initial_arrays(), num_rounds=rounds, evaluate_fn=clients.evaluate_fn()
        )
    picks = sum(len(set(COLLUDERS) & set(rec.clients)) for rec in strategy.rounds_)
    return picks, float(result.evaluate_metrics_serverapp[rounds]["test-accuracy"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--selectors", nargs="+", default=["power-of-choice", "afl"])
    ap.add_argument("--defences", nargs="+", default=list(DEFENCES))
    ap.add_argument("--inner", default=None, help="FedMedian or FedTrimmedAvg: Flower's rule as the inner strategy")
    ap.add_argument("--per-round", type=int, default=3, help="clients chosen a round")
    ap.add_argument("--trim", type=int, default=None, help="trim_clients: f hostile clients a round may hold")
    ap.add_argument("--lie", type=float, default=1e5)
    ap.add_argument("--flip", type=float, default=-2.5)
    args = ap.parse_args()
    warnings.simplefilter("ignore", FlowerRoundWarning)
    fed = fedselect.make_federation("digits", partition="shards", n_clients=N, random_state=2)
    clients = FederationClients(fed, random_state=0, model="mlp", local_steps=10, batch_size=16, lr=0.1)
    for sel in args.selectors:
        sq_lie = 1e12 if sel == "oort" else None
        for name in args.defences:
            for attacked in (False, True):
                for seed in args.seeds:
                    inner = None
                    if args.inner:
                        from flwr.serverapp import strategy as fs

                        extra = {"beta": 0.34} if args.inner == "FedTrimmedAvg" else {}
                        inner = getattr(fs, args.inner)(fraction_evaluate=0.0, min_available_nodes=1, **extra)
                    picks, acc = run(
                        clients,
                        sel,
                        attacked,
                        seed,
                        args.rounds,
                        args.lie,
                        args.flip,
                        sq_lie,
                        inner=inner,
                        trim_clients=args.trim,
                        clients_per_round=args.per_round,
                        **DEFENCES[name],
                    )
                    print(
                        f"{sel:16s} {name:9s} {'attacked' if attacked else 'honest':8s} seed {seed}: "
                        f"colluders took {picks:2d} of {args.per_round * args.rounds} places, accuracy {acc:.3f}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
