from __future__ import annotations

import numpy as np
import pytest

from fedselect.selection import ClientOracle, ClientPool, RoundFeedback
from fedselect.selectors.afl import ActiveFLSelector
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
        raise AssertionError("AFL must not run trials")

    def local_updates(self, ids, transform=None):
        raise AssertionError("AFL must not ask for updates")

    def global_parameters(self):
        raise AssertionError("AFL does not need the model")


@pytest.mark.parametrize(
    "params", [{}, {"alpha1": 0.0, "alpha2": 1e6, "alpha3": 0.0}, {"alpha1": 0.9, "alpha3": 1.0}, {"alpha2": 0.0}]
)
def test_conformance(params):
    check_selector(ActiveFLSelector(**params))


def test_initial_losses_paid_once_then_feedback_drives_valuations():
    oracle = SyntheticOracle(20, random_state=0)
    sel = ActiveFLSelector(random_state=0).fit(ClientPool(oracle.n_samples))
    for t in range(10):
        chosen = sel.select(4, round=t, oracle=oracle)
        if t == 0:
            assert oracle.costs.scalars_up == 20
        feedback = oracle.run_round(chosen)
        sel.update(feedback)
        np.testing.assert_allclose(
            sel.valuations_[feedback.clients], feedback.losses * np.sqrt(oracle.n_samples[feedback.clients])
        )
    assert oracle.calls == [("losses", tuple(range(20)))]


def test_initial_valuations_are_loss_times_sqrt_n():
    table = np.linspace(1.0, 2.0, 6)
    n_samples = np.array([1, 4, 9, 16, 25, 36])
    sel = ActiveFLSelector(random_state=0).fit(ClientPool(n_samples))
    sel.select(2, round=0, oracle=FixedLossOracle(table))
    np.testing.assert_allclose(sel.valuations_, table * np.sqrt(n_samples))
    assert sel.known_.all()


def test_drops_the_lowest_valuations():
    n_clients = 20
    table = np.arange(1.0, n_clients + 1)  # equal n_k: valuation order = loss order
    sel = ActiveFLSelector(alpha1=0.5, alpha3=0.0, random_state=0).fit(ClientPool([10] * n_clients))
    oracle = FixedLossOracle(table)
    seen = np.zeros(n_clients, dtype=bool)
    for t in range(200):
        seen[sel.select(4, round=t, oracle=oracle).clients] = True
    assert not seen[:10].any() and seen[10:].all()


def test_uniform_fill_reaches_dropped_clients():
    sel = ActiveFLSelector(alpha1=0.5, alpha3=1.0, random_state=0).fit(ClientPool([10] * 20))
    oracle = FixedLossOracle(np.arange(20.0))
    seen = np.zeros(20, dtype=bool)
    for t in range(200):
        seen[sel.select(4, round=t, oracle=oracle).clients] = True
    assert seen.all()


def test_softmax_share_is_floor_of_one_minus_alpha3_times_n():
    # alpha2 huge: the softmax draw is the top valuations; (1 - 0.1) * 5 -> 4 places, the 5th uniform.
    sel = ActiveFLSelector(alpha1=0.5, alpha2=1e6, alpha3=0.1, random_state=0).fit(ClientPool([10] * 20))
    oracle = FixedLossOracle(np.arange(20.0))
    fifth = set()
    with np.errstate(all="raise"):  # no overflow anywhere
        for t in range(100):
            chosen = set(sel.select(5, round=t, oracle=oracle).clients.tolist())
            assert {16, 17, 18, 19} <= chosen
            fifth |= chosen - {16, 17, 18, 19}
    assert len(fifth) > 5


def test_softmax_draw_at_the_default_alpha2():
    """At the default alpha2 = 0.01 the draw is successive sampling with P(k) proportional to exp(alpha2 v_k).

    Two places out of five, nothing dropped, nothing uniform: the chosen pair {i, j} has probability
    p_i p_j / (1 - p_i) + p_j p_i / (1 - p_j), with p = softmax(alpha2 * v). The valuations span 0..300,
    so the default temperature gives neither a uniform draw nor the top two.
    """
    from itertools import combinations

    v = np.array([0.0, 50.0, 100.0, 200.0, 300.0])
    n_samples = np.full(5, 100)  # v = loss * sqrt(100)
    sel = ActiveFLSelector(alpha1=0.0, alpha3=0.0, random_state=0).fit(ClientPool(n_samples))
    assert sel.alpha2 == 0.01
    oracle = FixedLossOracle(v / 10.0)
    p = np.exp(0.01 * v) / np.exp(0.01 * v).sum()
    pairs = list(combinations(range(5), 2))
    expected = np.array([p[i] * p[j] / (1 - p[i]) + p[j] * p[i] / (1 - p[j]) for i, j in pairs])
    assert expected.sum() == pytest.approx(1.0)
    T = 20_000
    counts = dict.fromkeys(pairs, 0)
    for t in range(T):
        counts[tuple(sorted(sel.select(2, round=t, oracle=oracle).clients.tolist()))] += 1
    observed = np.array([counts[pair] for pair in pairs])
    chi2 = (((observed - T * expected) ** 2) / (T * expected)).sum()
    assert chi2 < 27.9  # 9 degrees of freedom, p = 0.001


def test_too_few_survivors_still_gives_n_distinct():
    table = np.arange(8.0)
    sel = ActiveFLSelector(alpha1=0.75, alpha2=1e3, alpha3=0.0, random_state=0).fit(ClientPool([10] * 8))
    for t in range(30):
        chosen = sel.select(6, round=t, oracle=FixedLossOracle(table)).clients
        assert chosen.size == 6 and np.unique(chosen).size == 6
        assert {6, 7} <= set(chosen.tolist())


def test_update_refreshes_only_reporting_clients():
    sel = ActiveFLSelector(random_state=0).fit(ClientPool([4, 9, 16, 25]))
    sel.select(2, round=0, oracle=FixedLossOracle([1.0, 1.0, 1.0, 1.0]))
    before = sel.valuations_.copy()
    feedback = RoundFeedback(round=0, clients=[1, 3], weights=[0.5, 0.5], losses=[2.0, 0.5], n_samples=[9, 25])
    sel.update(feedback)
    np.testing.assert_allclose(sel.valuations_, [before[0], 6.0, before[2], 2.5])


def test_update_before_first_select_is_kept_and_not_queried_again():
    sel = ActiveFLSelector(random_state=0).fit(ClientPool([1, 1, 1, 1]))
    sel.update(RoundFeedback(round=0, clients=[0], weights=[1.0], losses=[3.0], n_samples=[1]))
    oracle = FixedLossOracle([9.0, 1.0, 1.0, 1.0])
    sel.select(1, round=1, oracle=oracle)
    np.testing.assert_array_equal(oracle.asked[0], [1, 2, 3])
    assert sel.valuations_[0] == 3.0


@pytest.mark.parametrize(
    "name, value",
    [("alpha1", 1.0), ("alpha1", -0.1), ("alpha2", -1.0), ("alpha2", float("inf")), ("alpha3", 1.5), ("alpha3", "0.1")],
)
def test_parameter_errors(name, value):
    with pytest.raises(ValueError, match=rf"ActiveFLSelector: parameter {name}={value!r} is invalid"):
        ActiveFLSelector(**{name: value}).fit(ClientPool([1, 2]))


def test_a_client_that_did_not_answer_is_asked_again_and_ranks_lowest_meanwhile():
    from fedselect.testing import SyntheticOracle

    oracle = SyntheticOracle(12, client_dropout=0.5, random_state=3)
    sel = ActiveFLSelector(random_state=0).fit(ClientPool(oracle.n_samples))
    sel.select(3, round=0, oracle=oracle)
    silent = sorted(oracle.ledger.failed)
    assert silent and not sel.known_[silent].any() and sel.known_.sum() == 12 - len(silent)
    feedback = oracle.run_round(sel.select(3, round=0, oracle=oracle).validated(12, 3))
    sel.update(feedback)
    oracle.calls.clear()
    sel.select(3, round=1, oracle=oracle)
    asked = set(oracle.calls[0][1]) if oracle.calls else set()
    assert set(silent) - set(feedback.clients.tolist()) <= asked  # asked again in the next round
