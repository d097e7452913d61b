"""A Flower run's rounds are the simulator's record type: its history feeds Comparison, tables and plots."""

import json
import warnings

import pytest

pytest.importorskip("flwr")

from fedselect import FederatedTrainer
from fedselect.compare import Comparison
from fedselect.flower import FederationClients, FlowerRound, FlowerRoundWarning, LocalGrid, SelectorStrategy
from fedselect.simulation import History, RoundRecord

from .conftest import TRAIN


def _flower_run(fed, selector, seed, rounds=4):
    clients = FederationClients(fed, random_state=seed, pooled_losses=True, **TRAIN)
    grid = LocalGrid(clients.client_app(), fed.n_clients, seed=11)
    strategy = SelectorStrategy(selector, clients_per_round=3, n_clients=fed.n_clients, aggregation="data-size",
                                random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlowerRoundWarning)
        strategy.start(grid, clients.initial_arrays(), num_rounds=rounds, evaluate_fn=clients.evaluate_fn())
    return strategy


def test_flower_rounds_are_round_records_and_keep_their_keys(fed8):
    strategy = _flower_run(fed8, "random", seed=0, rounds=2)
    rec = strategy.rounds_[0]
    assert isinstance(rec, FlowerRound) and isinstance(rec, RoundRecord)
    assert set(rec.to_dict()) == {"round", "clients", "reported", "failed", "weights", "costs", "traffic", "seconds",
                                  "rejected", "errors", "evaluation", "wall_seconds", "reply_seconds"}
    assert rec.test_accuracy == rec.evaluation["test-accuracy"] and rec.test_loss == rec.evaluation["test-loss"]
    # The plain record round-trips through JSON with what only a Flower run knows (bytes on the wire).
    plain = rec.as_round_record()
    assert type(plain) is RoundRecord and plain.reported == rec.reported and plain.traffic == rec.traffic
    assert RoundRecord.from_dict(json.loads(json.dumps(plain.to_dict()))) == plain
    assert plain.traffic["train"].bytes_down > 0


def test_a_simulated_record_writes_no_new_keys(fed8):
    # the Flower-only fields stay out; the default clock's simulated seconds are in every simulated record (issue 33)
    rec = FederatedTrainer(selector="random", clients_per_round=3, rounds=1, random_state=0, **TRAIN).fit(
        fed8).history_.rounds[0]
    assert set(rec.to_dict()) == {"round", "clients", "weights", "lr", "test_accuracy", "test_loss", "global_loss",
                                  "costs", "failed", "seconds", "sim_seconds", "sim_time"}


def test_a_comparison_of_two_flower_runs_renders_its_table_and_plots(fed8, tmp_path):
    runs = {name: _flower_run(fed8, name, seed=1) for name in ("random", "round-robin")}
    histories = {name: {1: s.history_} for name, s in runs.items()}
    for name, s in runs.items():
        h = histories[name][1]
        assert isinstance(h, History) and len(h) == 4 and h.model_size > 0
        assert [a for _, a in h.accuracies()] == [r.evaluation["test-accuracy"] for r in s.rounds_]
        assert History.from_json(h.to_json()) == h
    comp = Comparison(histories=histories, target=0.0, n_clients=fed8.n_clients, title="Flower")
    table = comp.to_markdown()
    assert "random" in table and "round-robin" in table
    rows = {r["scheme"]: r for r in comp.rows()}
    assert rows["random"]["rounds_to_target"] == 1.0 and rows["random"]["final_accuracy"] is not None
    paths = comp.plot(tmp_path)
    assert paths and all(p.exists() and p.stat().st_size > 0 for p in paths)
