"""End to end under Flower's simulation engine (Ray): 10 SuperNodes, FedCor choosing, failures none."""

import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")

pytestmark = pytest.mark.flower_simulation


def test_fedcor_runs_under_the_simulation_engine(fed10_digits):
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    import fedselect
    from fedselect.flower import FederationClients, SelectorStrategy

    clients = FederationClients(fed10_digits, model="mlp", local_steps=3, batch_size=16, lr=0.05, random_state=0)
    out = {}
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = SelectorStrategy(
            fedselect.get_selector("fedcor", warmup_rounds=1, gp_interval=2, warmup_iters=5, gp_iters=5),
            clients_per_round=3, n_clients=10, aggregation="data-size", random_state=0, connect_timeout=60.0,
        )
        out["result"] = strategy.start(grid, clients.initial_arrays(), num_rounds=4,
                                       evaluate_fn=clients.evaluate_fn())
        out["strategy"] = strategy

    run_simulation(
        server_app=server,
        client_app=clients.client_app(),
        num_supernodes=10,
        backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 2}},
    )
    strategy = out["strategy"]
    assert strategy.n_clients_ == 10 and sorted(strategy.client_nodes_) == list(range(10))
    assert [len(r.clients) for r in strategy.rounds_] == [3, 3, 3, 3]
    assert all(r.failed == [] and r.reported == r.clients for r in strategy.rounds_)
    assert "trial" in strategy.rounds_[2].traffic  # FedCor's GP round 2 ran a trial through Ray
    assert out["result"].evaluate_metrics_serverapp[4]["test-accuracy"] > 0.2
