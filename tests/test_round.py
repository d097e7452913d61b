"""One round, one aggregation: the runtimes play their rounds through fedselect.round and weigh by
fedselect.aggregation's rules."""

import numpy as np
import pytest
import torch

import fedselect.round as round_module
import fedselect.testing
from fedselect import FederatedTrainer, Selection, make_federation
from fedselect.aggregation import aggregation_weights, apply_deltas, average_buffer_deltas
from fedselect.testing import SyntheticOracle

N_SAMPLES = np.array([10, 20, 30, 40, 50, 60])


def test_data_size_rule_weighs_by_n_k_times_counts_over_the_reporters():
    sel = Selection([1, 3, 3, 5]).validated(6, 4, variable_size=True)  # client 3 drawn twice
    np.testing.assert_allclose(aggregation_weights(sel, rule="data-size", n_samples=N_SAMPLES),
                               np.array([20, 80, 60]) / 160)
    got = aggregation_weights(sel, [True, False, True], rule="data-size", n_samples=N_SAMPLES)
    np.testing.assert_allclose(got, [20 / 80, 0.0, 60 / 80])


def test_mean_rule_counts_duplicates_and_ignores_n_k():
    sel = Selection([1, 3, 3, 5]).validated(6, 4, variable_size=True)
    np.testing.assert_allclose(aggregation_weights(sel, rule="mean", n_samples=N_SAMPLES), [0.25, 0.5, 0.25])
    np.testing.assert_allclose(aggregation_weights(sel, [False, True, True], rule="mean"), [0.0, 2 / 3, 1 / 3])
    assert not aggregation_weights(sel, [False] * 3, rule="mean").any()  # nobody reported: nothing moves


def test_selection_weights_are_applied_as_given_or_rescaled_over_the_reporters():
    sel = Selection([0, 2, 4], weights=[0.3, 0.5, 0.7]).validated(6, 3)
    np.testing.assert_allclose(aggregation_weights(sel, rule="data-size", n_samples=N_SAMPLES), [0.3, 0.5, 0.7])
    ok = [True, False, True]
    np.testing.assert_allclose(aggregation_weights(sel, ok, n_samples=N_SAMPLES), [0.3 * 1.5, 0.0, 0.7 * 1.5])
    np.testing.assert_allclose(aggregation_weights(sel, ok, partial_weights="as-given"), [0.3, 0.0, 0.7])
    with pytest.raises(ValueError, match="rule"):
        aggregation_weights(Selection([0]).validated(6, 1), rule="median")


def test_apply_deltas_is_float32_and_buffers_average_differences():
    theta = np.array([1.0, 2.0], dtype=np.float32)
    deltas = np.array([[1.0, 0.0], [0.0, 4.0]], dtype=np.float32)
    out = apply_deltas(theta, deltas, [0.5, 0.25])
    assert out.dtype == np.float32 and out.tolist() == [1.5, 3.0]
    assert torch.equal(apply_deltas(torch.from_numpy(theta), torch.from_numpy(deltas), [0.5, 0.25]),
                       torch.from_numpy(out))
    b = {"m": torch.tensor([1.0, 1.0]), "n": torch.tensor(10), "mask": torch.tensor([True])}
    d = {"m": torch.tensor([[2.0, 0.0], [0.0, 4.0]]), "n": torch.tensor([3, 4])}
    got = average_buffer_deltas(b, d, [1.0, 3.0])  # weights normalised: 1/4, 3/4
    assert got["m"].tolist() == [1.5, 4.0] and int(got["n"]) == 14 and got["mask"].tolist() == [True]


@pytest.fixture(scope="module")
def fed():
    return make_federation("digits", partition="shards", n_clients=8, random_state=0)


def _counting(monkeypatch, module=round_module):
    """Count the rounds concluded by ``module``'s ``conclude_round`` (fedselect.round's, which play_round calls)."""
    calls = []
    real = round_module.conclude_round

    def counted(*args, **kwargs):
        calls.append(kwargs.get("round"))
        return (yield from real(*args, **kwargs))

    monkeypatch.setattr(module, "conclude_round", counted)
    return calls


def test_the_simulator_plays_every_round_through_the_round_module(fed, monkeypatch):
    calls = _counting(monkeypatch)
    trainer = FederatedTrainer(selector="random", clients_per_round=3, rounds=4, local_steps=2, random_state=0)
    trainer.fit(fed)
    assert calls == [0, 1, 2, 3]
    for rec in trainer.history_.rounds:  # and weighs by the data-size rule
        n_k = fed.n_samples[rec.clients]
        np.testing.assert_allclose(rec.weights, n_k / n_k.sum())


def test_the_synthetic_oracle_plays_its_rounds_through_the_round_module(monkeypatch):
    calls = _counting(monkeypatch, fedselect.testing)
    oracle = SyntheticOracle(n_clients=6, random_state=0)
    fb = oracle.run_round(Selection([1, 3, 3]).validated(6, 3, variable_size=True))
    assert calls == [0]
    np.testing.assert_allclose(fb.weights, [1 / 3, 2 / 3])  # the mean rule, duplicates counted
