"""The ServerApp: FedCor chooses the clients of every round; everything else is Flower's FedAvg."""

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

import fedselect
from fedselect.flower import SelectorStrategy

from .task import federation_clients

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    params = {}
    if cfg["selector"] == "fedcor":
        params = {"warmup_rounds": int(cfg["warmup-rounds"]), "gp_interval": int(cfg["gp-interval"])}
    strategy = SelectorStrategy(
        fedselect.get_selector(str(cfg["selector"]), **params),
        clients_per_round=int(cfg["clients-per-round"]),
        n_clients=int(cfg["num-clients"]),
        aggregation="data-size",
        query_timeout=60.0,
        train_timeout=120.0,
        random_state=int(cfg["seed"]),
    )
    clients = federation_clients(cfg)  # the server evaluates the global model on the test split
    result = strategy.start(
        grid,
        clients.initial_arrays(),
        num_rounds=int(cfg["num-server-rounds"]),
        evaluate_fn=clients.evaluate_fn(),
    )
    for rec in strategy.rounds_:
        acc = result.evaluate_metrics_serverapp[rec.round + 1]["test-accuracy"]
        print(
            f"fedselect round {rec.round}: chose {rec.clients}, reported {rec.reported}, "
            f"failed {rec.failed}, test accuracy {acc:.4f}, costs {rec.costs.to_dict()}",
            flush=True,
        )
