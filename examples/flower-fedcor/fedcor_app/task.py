"""What the server and every client agree on: the federation and the local training, from the run config."""

from __future__ import annotations

from functools import lru_cache

from fedselect import make_federation
from fedselect.flower import FederationClients


def _key(run_config) -> tuple:
    keys = ("dataset", "partition", "shards-per-client", "num-clients", "local-steps", "batch-size", "lr", "seed")
    return tuple((k, run_config[k]) for k in keys)


@lru_cache(maxsize=2)
def _clients(key: tuple) -> FederationClients:
    cfg = dict(key)
    # Every process loads the same dataset and partitions it with the same seed, then serves its own share.
    federation = make_federation(
        cfg["dataset"],
        partition=cfg["partition"],
        shards_per_client=int(cfg["shards-per-client"]),
        n_clients=int(cfg["num-clients"]),
        random_state=int(cfg["seed"]),
    )
    return FederationClients(
        federation,
        model="mlp",
        local_steps=int(cfg["local-steps"]),
        batch_size=int(cfg["batch-size"]),
        lr=float(cfg["lr"]),
        random_state=int(cfg["seed"]),
    )


def federation_clients(run_config) -> FederationClients:
    """The clients of the federation described by ``run_config`` (built once per process)."""
    return _clients(_key(run_config))
