"""The same scheme in both worlds: Flower chooses the clients FederatedTrainer chooses, at the same costs."""

import pytest

pytest.importorskip("flwr")

import fedselect
from fedselect import FederatedTrainer
from fedselect.flower import FederationClients, LocalGrid, SelectorStrategy

from .conftest import TRAIN

SCHEMES = {
    "random": {},
    "power-of-choice": {"d": 8},
    # a short warm-up and GP interval so that 20 rounds include two trial rounds (10 and 15)
    "fedcor": {"warmup_rounds": 5, "gp_interval": 5, "warmup_iters": 30, "gp_iters": 30},
}


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_flower_chooses_what_the_simulator_chooses(fed20, name):
    rounds, seed = 20, 3
    selector = fedselect.get_selector(name, **SCHEMES[name])
    trainer = FederatedTrainer(
        selector=selector, clients_per_round=4, rounds=rounds, aggregation="data-size", random_state=seed, **TRAIN
    ).fit(fed20)
    clients = FederationClients(fed20, random_state=seed, pooled_losses=True, **TRAIN)
    grid = LocalGrid(clients.client_app(), fed20.n_clients, seed=11)
    strategy = SelectorStrategy(selector, clients_per_round=4, aggregation="data-size", random_state=seed)
    result = strategy.start(grid, clients.initial_arrays(), num_rounds=rounds, evaluate_fn=clients.evaluate_fn())

    assert len(strategy.rounds_) == rounds
    if name == "fedcor":
        assert sum(1 for r in strategy.rounds_ if "trial" in r.traffic) == 2
    for sim, fl in zip(trainer.history_.rounds, strategy.rounds_):
        assert fl.clients == sim.clients, f"round {sim.round}"
        assert fl.reported == sim.clients and fl.failed == []
        assert fl.costs.to_dict() == sim.costs.to_dict(), f"round {sim.round}"
        assert fl.weights == pytest.approx(sim.weights, rel=1e-12)
    # Same arithmetic: the final models agree to the last bit, hence the same test accuracy.
    assert result.evaluate_metrics_serverapp[rounds]["test-accuracy"] == trainer.history_.rounds[-1].test_accuracy
    assert result.evaluate_metrics_serverapp[rounds]["test-loss"] == pytest.approx(
        trainer.history_.rounds[-1].test_loss, abs=1e-12
    )
