"""The same scheme in both worlds: Flower chooses the clients FederatedTrainer chooses, at the same costs."""

import numpy as np
import pytest

pytest.importorskip("flwr")

import fedselect
from fedselect import FederatedTrainer
from fedselect.flower import FederationClients, LocalGrid, SelectorStrategy
from fedselect.flower import _protocol as P

from .conftest import TRAIN, recording

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
    strategy = SelectorStrategy(selector, clients_per_round=4, n_clients=fed20.n_clients, aggregation="data-size",
                                random_state=seed)
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


# Selectors that train clients inside ``select`` (oracle.local_updates with a transform): the chosen
# clients' updates are on the server before the round trains anyone, and their losses must still be asked.
PROBING = {
    "ocs": {},
    "hcsfed": {"n_clusters": 2},
}


@pytest.mark.parametrize("name", sorted(PROBING))
def test_probing_selectors_match_the_simulator(fed20, name):
    rounds, seed, N = 8, 5, fed20.n_clients
    cls = type(fedselect.get_selector(name))
    selector = recording(cls)(**PROBING[name])
    trainer = FederatedTrainer(
        selector=selector, clients_per_round=4, rounds=rounds, aggregation="data-size", random_state=seed, **TRAIN
    ).fit(fed20)
    clients = FederationClients(fed20, random_state=seed, pooled_losses=True, **TRAIN)
    grid = LocalGrid(clients.client_app(), N, seed=11)
    strategy = SelectorStrategy(selector, clients_per_round=4, n_clients=fed20.n_clients, aggregation="data-size",
                                random_state=seed)
    result = strategy.start(grid, clients.initial_arrays(), num_rounds=rounds)

    dim = 1 if name == "ocs" else trainer.selector_.compressed_dim_
    for sim, fl, fb_sim, fb_fl in zip(trainer.history_.rounds, strategy.rounds_, trainer.selector_.feedbacks_,
                                      strategy.selector_.feedbacks_):
        assert fl.clients == sim.clients, f"round {sim.round}"
        assert fl.reported == sim.clients and fl.failed == []
        a, b = fl.costs.to_dict(), sim.costs.to_dict()
        # Neither scheme needs the losses on w^t: no chosen client evaluates or sends one, in either world.
        assert a["scalars_up"] == 0 and a["samples_evaluated"] == 0
        assert {k: v for k, v in a.items() if k not in ("models_up", "floats_up")} == \
            {k: v for k, v in b.items() if k not in ("models_up", "floats_up")}, f"round {sim.round}"
        # The documented difference: Flower cannot ship the transform, so every probed client uploads its
        # full update (N models up, no compressed floats); the simulator uploads N transformed vectors of
        # `dim` floats and the full updates of the reporters only.
        assert a["models_up"] == N and a["floats_up"] == 0
        assert b["models_up"] == len(sim.clients) and b["floats_up"] == N * dim
        assert fb_fl.clients.tolist() == fb_sim.clients.tolist()
        assert fb_fl.losses is None and fb_sim.losses is None
        assert fl.weights == pytest.approx(sim.weights, rel=1e-12)
    assert len(strategy.selector_.feedbacks_) == rounds
    assert "fedselect-train-loss-before" not in result.train_metrics_clientapp[rounds]  # no loss was asked


@pytest.mark.parametrize("name", ["random", "power-of-choice", "fedcor"])
def test_the_same_silent_clients_give_the_same_rounds_and_costs_in_both_worlds(fed20, name):
    """Clients that never answer: simulator availability 0, Flower nodes whose messages time out.

    Both worlds send them what they send (charged), get NaN, leave them out of the round, and
    the selector sees the same partial feedback: same clients, same failures, same costs.
    """
    rounds, seed, silent = 14, 5, [2, 7, 11]
    avail = np.ones(fed20.n_clients)
    avail[silent] = 0.0
    selector = fedselect.get_selector(name, **SCHEMES[name])
    trainer = FederatedTrainer(selector=selector, clients_per_round=4, rounds=rounds, aggregation="data-size",
                               availability=avail, random_state=seed, **TRAIN).fit(fed20)
    clients = FederationClients(fed20, random_state=seed, pooled_losses=True, **TRAIN)
    grid = LocalGrid(clients.client_app(), fed20.n_clients, seed=11)
    for k in silent:  # connected (they answer the hello that maps them to their client id) but never again
        grid.faults[grid.node_of_partition(k)] = lambda m: None if m.metadata.message_type == P.HELLO else "timeout"
    strategy = SelectorStrategy(selector, clients_per_round=4, n_clients=fed20.n_clients, aggregation="data-size",
                                random_state=seed,
                                query_timeout=5, train_timeout=5)
    strategy.start(grid, clients.initial_arrays(), num_rounds=rounds, evaluate_fn=clients.evaluate_fn())
    asked = sum(1 for m in grid.sent if grid.contexts[m.metadata.dst_node_id].node_config["partition-id"] in silent)
    assert asked > 0  # the silent clients were asked (and charged), not skipped
    if name == "fedcor":
        assert sum(1 for r in strategy.rounds_ if "trial" in r.traffic) >= 1
    if name == "random":
        assert any(r.failed for r in trainer.history_.rounds)  # silent clients were chosen and did not report
    for sim, fl in zip(trainer.history_.rounds, strategy.rounds_):
        assert fl.clients == sim.clients, f"round {sim.round}"
        assert sorted(set(fl.clients) - set(fl.reported)) == sorted(sim.failed), f"round {sim.round}"
        assert fl.costs.to_dict() == sim.costs.to_dict(), f"round {sim.round}"
