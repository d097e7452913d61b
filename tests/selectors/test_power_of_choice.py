from __future__ import annotations

import numpy as np
import pytest

from fedselect.selection import ClientOracle, ClientPool
from fedselect.selectors.power_of_choice import PowerOfChoiceSelector
from fedselect.testing import SyntheticOracle, check_selector


class FixedLossOracle(ClientOracle):
    """Answers losses from a fixed table and records the questions."""

    def __init__(self, table):
        self.table = np.asarray(table, dtype=float)
        self.n_clients = self.table.size
        self.round = 0
        self.asked = []

    def losses(self, ids):
        ids = np.asarray(ids)
        self.asked.append(ids.copy())
        return self.table[ids]

    def trial(self, ids):
        raise AssertionError("power-of-choice must not run trials")

    def local_updates(self, ids, transform=None):
        raise AssertionError("power-of-choice must not ask for updates")

    def global_parameters(self):
        raise AssertionError("power-of-choice does not need the model")


@pytest.mark.parametrize("d", [None, 60])
def test_conformance(d):
    check_selector(PowerOfChoiceSelector(d=d))


def test_keeps_the_candidates_with_largest_loss():
    rng = np.random.default_rng(0)
    oracle = FixedLossOracle(rng.permutation(30).astype(float))
    sel = PowerOfChoiceSelector(d=8, random_state=0).fit(ClientPool(rng.integers(5, 100, size=30)))
    for t in range(20):
        chosen = sel.select(3, round=t, oracle=oracle).clients
        candidates = oracle.asked[-1]
        assert candidates.size == 8 and np.unique(candidates).size == 8
        top = np.sort(candidates[np.argsort(oracle.table[candidates])[-3:]])
        np.testing.assert_array_equal(np.sort(chosen), top)
        np.testing.assert_array_equal(sel.last_candidates_, candidates)


def test_default_d_is_2n_and_clipped_to_n_clients():
    oracle = FixedLossOracle(np.arange(10.0))
    sel = PowerOfChoiceSelector(random_state=0).fit(ClientPool([10] * 10))
    sel.select(3, round=0, oracle=oracle)
    assert oracle.asked[-1].size == 6
    sel.select(7, round=1, oracle=oracle)
    assert oracle.asked[-1].size == 10
    chosen = PowerOfChoiceSelector(d=50, random_state=0).fit(ClientPool([10] * 10)).select(2, round=0, oracle=oracle)
    np.testing.assert_array_equal(np.sort(chosen.clients), [8, 9])  # all 10 are candidates: the 2 largest losses


def test_oracle_calls_are_recorded_and_paid():
    oracle = SyntheticOracle(20, random_state=0)
    sel = PowerOfChoiceSelector(d=10, random_state=0).fit(ClientPool(oracle.n_samples))
    chosen = sel.select(5, round=0, oracle=oracle)
    assert len(oracle.calls) == 1
    name, ids = oracle.calls[0]
    assert name == "losses" and len(ids) == 10
    assert oracle.costs.scalars_up == 10 and oracle.costs.models_down == 10
    assert oracle.costs.samples_evaluated == int(oracle.n_samples[list(ids)].sum())
    losses = oracle.losses(list(ids))
    expected = np.array(ids)[np.argsort(losses)[-5:]]
    np.testing.assert_array_equal(np.sort(chosen.clients), np.sort(expected))


def test_candidates_are_drawn_by_data_size():
    n_samples = np.array([1] * 10 + [1000] * 2)
    oracle = FixedLossOracle(np.zeros(12))
    sel = PowerOfChoiceSelector(d=3, random_state=0).fit(ClientPool(n_samples))
    counts = np.zeros(12)
    for t in range(300):
        sel.select(1, round=t, oracle=oracle)
        counts[oracle.asked[-1]] += 1
    assert counts[10:].min() > 290 and counts[:10].max() < 100


def test_d_smaller_than_n_is_an_error_at_select_time():
    sel = PowerOfChoiceSelector(d=3).fit(ClientPool([10] * 10))
    with pytest.raises(ValueError, match=r"PowerOfChoiceSelector: parameter d=3 .* n=5"):
        sel.select(5, round=0, oracle=FixedLossOracle(np.zeros(10)))
    assert len(sel.select(3, round=0, oracle=FixedLossOracle(np.zeros(10)))) == 3


@pytest.mark.parametrize("d", [0, -2, 2.5, "10", True])
def test_parameter_errors(d):
    with pytest.raises(ValueError, match=rf"PowerOfChoiceSelector: parameter d={d!r} is invalid; expected None or"):
        PowerOfChoiceSelector(d=d).fit(ClientPool([1, 2]))


def test_candidates_that_did_not_answer_rank_last():
    for seed in range(20):
        oracle = SyntheticOracle(30, client_dropout=0.4, random_state=seed)
        sel = PowerOfChoiceSelector(d=12, random_state=seed).fit(ClientPool(oracle.n_samples))
        chosen = sel.select(4, round=0, oracle=oracle)
        answered = [k for k in sel.last_candidates_.tolist() if k not in oracle.ledger.failed]
        if len(answered) >= 4:
            assert not set(chosen.clients.tolist()) & oracle.ledger.failed, f"seed {seed}"
