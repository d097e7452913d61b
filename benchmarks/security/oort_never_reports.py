"""docs/security.rst's Oort table, rows "never reports": how often Oort chooses a client that always fails.

Label-skewed digits, 10 clients, 30 rounds on LocalGrid (as tests/flower/test_oort.py), client 5 answering every
training message with an error reply; Oort's defaults except round_penalty=0 (runs repeat exactly). Seeds 0-2 set
the clients' and the strategy's random_state. Run: ``python benchmarks/security/oort_never_reports.py``.

Measured (issue 36, default ``straggler_reward="capped"``): honest 7, 8, 9 (2 per round, overcommit=1.0) and
11, 10, 11 (overcommit=1.5); never reporting 2, 2, 2 under both.
"""

from __future__ import annotations

import logging
import warnings

from flwr.app import Error, Message

import fedselect
from fedselect.flower import FederationClients, LocalGrid, SelectorStrategy
from fedselect.flower import _protocol as P
from fedselect.selectors.oort import OortSelector

FAILING, ROUNDS, N = 5, 30, 10
TRAINING = ("train", P.UPDATE)


def times_chosen(seed: int, *, fail: bool, per_round: int, overcommit: float) -> int:
    fed = fedselect.make_federation("digits", partition="shards", n_clients=N, random_state=2)
    clients = FederationClients(fed, random_state=seed, model="mlp", local_steps=10, batch_size=16, lr=0.1)
    app = clients.client_app()

    def failing(message, context):
        if fail and int(context.node_config["partition-id"]) == FAILING and message.metadata.message_type in TRAINING:
            return Message(Error(code=0, reason="always fails"), reply_to=message)
        return app(message, context)

    strategy = SelectorStrategy(
        OortSelector(round_penalty=0.0, overcommit=overcommit),
        clients_per_round=per_round,
        n_clients=N,
        aggregation="data-size",
        random_state=seed,
        connect_timeout=1.0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        strategy.start(LocalGrid(failing, N, seed=5), clients.initial_arrays(), num_rounds=ROUNDS)
    return sum(FAILING in rec.clients for rec in strategy.rounds_)


if __name__ == "__main__":
    logging.getLogger("flwr").setLevel(logging.WARNING)
    for label, kw in [
        ("honest, 2 chosen per round, overcommit=1.0", dict(fail=False, per_round=2, overcommit=1.0)),
        ("never reports, the same settings", dict(fail=True, per_round=2, overcommit=1.0)),
        ("honest, overcommit=1.5 (3 chosen for 2)", dict(fail=False, per_round=2, overcommit=1.5)),
        ("never reports, overcommit=1.5", dict(fail=True, per_round=2, overcommit=1.5)),
    ]:
        print(label, [times_chosen(s, **kw) for s in (0, 1, 2)], flush=True)
