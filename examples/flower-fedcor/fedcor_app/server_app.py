"""The ServerApp: FedCor chooses the clients of every round; everything else is Flower's FedAvg."""

from logging import INFO
from pathlib import Path

from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

import fedselect
from fedselect.flower import SelectorStrategy, read_node_binding

from .task import federation_clients

app = ServerApp()


def records_path(context: Context) -> Path:
    """Where the run's records go: the run config's ``records-path``, ``{run_id}`` replaced by the run's id.

    A relative path is relative to the ServerApp process's working directory (the SuperLink's).
    """
    path = Path(str(context.run_config["records-path"]).replace("{run_id}", str(context.run_id))).expanduser()
    path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def node_binding(context: Context) -> dict[int, int] | None:
    """The run config's ``node-binding-path`` read (node id -> client id), or None when it is empty.

    The operator writes the file from what ``flwr supernode register`` printed for each SuperNode's key
    (deploy/run_local.sh writes node-binding.json); a relative path is relative to the SuperLink's
    working directory. With it, a node that is not bound gets no message and a bound node may claim
    only its own client id.
    """
    value = str(context.run_config.get("node-binding-path", "")).strip()
    return read_node_binding(Path(value).expanduser()) if value else None


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    params = {}
    if cfg["selector"] == "fedcor":
        params = {"warmup_rounds": int(cfg["warmup-rounds"]), "gp_interval": int(cfg["gp-interval"])}
    strategy = SelectorStrategy(
        fedselect.get_selector(str(cfg["selector"]), **params),
        clients_per_round=int(cfg["clients-per-round"]),
        # N comes from the server's own run config, never from what the clients report: the run must
        # set num-clients to the number of SuperNodes (flwr run ... --run-config "num-clients=5").
        n_clients=int(cfg["num-clients"]),
        aggregation="data-size",
        query_timeout=60.0,
        deadline=120.0,
        random_state=int(cfg["seed"]),
        node_binding=node_binding(context),
    )
    clients = federation_clients(cfg)  # the server evaluates the global model on the test split
    path = records_path(context)
    log(
        INFO,
        "fedselect: run %s: %d clients, %s rounds; one JSON line per finished round in %s",
        context.run_id,
        int(cfg["num-clients"]),
        cfg["num-server-rounds"],
        path,
    )
    # The strategy logs every round as it finishes (chosen, reported and failed clients, rejoins, the
    # test accuracy) and appends the round's record to `path`.
    strategy.start(
        grid,
        clients.initial_arrays(),
        num_rounds=int(cfg["num-server-rounds"]),
        evaluate_fn=clients.evaluate_fn(),
        records_path=path,
    )
