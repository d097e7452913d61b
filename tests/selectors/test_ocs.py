from __future__ import annotations

import numpy as np
import pytest

from fedselect import get_selector
from fedselect.selection import ClientPool
from fedselect.selectors.ocs import OptimalClientSamplingSelector, capped_probabilities, optimal_probabilities
from fedselect.testing import SyntheticOracle, check_selector

from .test_unbiased import FixedUpdatesOracle, make_problem


def _variance(pi: np.ndarray, u: np.ndarray) -> float:
    """Variance (trace) of sum_{k in S} U_k / pi_k under independent inclusion, ||U_k|| = u_k."""
    live = u > 0
    return float(np.sum((1 - pi[live]) / pi[live] * u[live] ** 2))


def test_conformance():
    # Not with a fixed ``budget``: it overrides the n the runtime asks for, which the size checks rightly flag.
    check_selector(OptimalClientSamplingSelector(), n_rounds=15)


def test_registered_with_alias():
    assert isinstance(get_selector("optimal-client-sampling"), OptimalClientSamplingSelector)
    assert isinstance(get_selector("ocs"), OptimalClientSamplingSelector)


def test_closed_form_sums_to_m_in_unit_interval_and_equals_capping():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 30))
        u = rng.lognormal(sigma=float(rng.uniform(0.1, 3)), size=n)
        m = int(rng.integers(1, n + 1))
        pi = optimal_probabilities(u, m)
        assert pi.sum() == pytest.approx(m) and np.all((pi > 0) & (pi <= 1 + 1e-12))
        np.testing.assert_allclose(pi, capped_probabilities(u, m), atol=1e-9)
        free = pi < 1 - 1e-12  # the uncapped ones are proportional to u
        if free.sum() > 1:
            ratio = pi[free] / u[free]
            np.testing.assert_allclose(ratio, ratio[0], rtol=1e-9)


def test_closed_form_example_by_hand():
    # Sorted u = 1, 1, 2, 10, m = 2: l = 3 (m + l - n = 1 <= 4 / 2), so pi = 1 * u / 4 for the first three.
    np.testing.assert_allclose(optimal_probabilities([10.0, 1.0, 2.0, 1.0], 2), [1.0, 0.25, 0.5, 0.25])


def test_minimises_variance():
    rng = np.random.default_rng(1)
    for _ in range(50):
        n, m = 12, 4
        u = rng.lognormal(sigma=1.5, size=n)
        best = _variance(optimal_probabilities(u, m), u)
        assert best <= _variance(np.full(n, m / n), u) + 1e-12
        for _ in range(20):  # random feasible competitors never do better
            pi = capped_probabilities(rng.exponential(size=n), m)
            if np.all(pi > 0):
                assert best <= _variance(pi, u) + 1e-9


def test_zero_norms():
    np.testing.assert_allclose(optimal_probabilities(np.zeros(4), 2), [0.5] * 4)
    np.testing.assert_allclose(optimal_probabilities([0.0, 3.0, 0.0, 0.0], 2), [1 / 3, 1.0, 1 / 3, 1 / 3])
    pi = optimal_probabilities([0.0, 1.0, 2.0, 0.0], 1)
    np.testing.assert_allclose(pi, [0.0, 1 / 3, 2 / 3, 0.0])


def test_bad_budget_and_m():
    with pytest.raises(ValueError, match="budget=0"):
        OptimalClientSamplingSelector(budget=0).fit(ClientPool([10] * 5))
    with pytest.raises(ValueError, match="m=5"):
        optimal_probabilities([1.0, 2.0], 5)
    with pytest.raises(ValueError, match="finite"):
        optimal_probabilities([1.0, -2.0], 1)


def test_inclusion_frequencies_and_weights():
    pool, oracle = make_problem(0)
    sel = OptimalClientSamplingSelector(random_state=0).fit(pool)
    T = 3000
    counts = np.zeros(pool.n_clients)
    sizes = []
    for t in range(T):
        s = sel.select(2, round=t, oracle=oracle)
        counts[s.clients] += 1
        sizes.append(len(s))
    pi = sel.last_probabilities_
    norms = np.linalg.norm(oracle.updates, axis=1)
    np.testing.assert_allclose(pi, optimal_probabilities(pool.weights * norms, 2), rtol=1e-6)
    cond = pi / (1 - np.prod(1 - pi))  # inclusion given a non-empty draw
    se = np.sqrt(cond * (1 - cond) / T) + 1e-12
    assert np.all(np.abs(counts / T - cond) <= 4 * se)
    assert min(sizes) >= 1 and np.mean(sizes) == pytest.approx(cond.sum(), abs=0.1)
    np.testing.assert_allclose(s.weights, pool.weights[s.clients] * (1 - np.prod(1 - pi)) / pi[s.clients])


def test_budget_overrides_n_and_costs():
    oracle = SyntheticOracle(10, random_state=0)
    sel = OptimalClientSamplingSelector(budget=4, random_state=0).fit(ClientPool(oracle.n_samples))
    sel.select(1, round=0, oracle=oracle)
    assert sel.last_probabilities_.sum() == pytest.approx(4.0)
    assert oracle.costs.local_trainings == 10 and oracle.costs.floats_up == 10


def test_max_trained_trains_a_uniform_subset_each_round():
    """max_trained=M: M trainings and M norms up a round, the chosen inside the subset, each client probed alike."""
    oracle = SyntheticOracle(40, random_state=0)
    sel = OptimalClientSamplingSelector(max_trained=8, random_state=0).fit(ClientPool(oracle.n_samples))
    seen = np.zeros(40)
    for t in range(300):
        before = oracle.costs.local_trainings
        s = sel.select(3, round=t, oracle=oracle)
        assert oracle.costs.local_trainings - before == 8 and oracle.costs.floats_up == (t + 1) * 8
        assert sel.last_probed_.shape == (8,) and set(s.clients.tolist()) <= set(sel.last_probed_.tolist())
        assert sel.last_probabilities_.sum() == pytest.approx(3.0) and np.isnan(sel.last_norms_).sum() == 32
        seen[sel.last_probed_] += 1
        oracle.run_round(s.validated(40, 3, variable_size=True))
    assert np.all(np.abs(seen / 300 - 8 / 40) < 4 * np.sqrt(0.2 * 0.8 / 300))  # uniform subsets
    full = OptimalClientSamplingSelector(max_trained=40, random_state=0).fit(ClientPool(oracle.n_samples))
    ref = OptimalClientSamplingSelector(random_state=0).fit(ClientPool(oracle.n_samples))
    a, b = full.select(3, round=0, oracle=oracle), ref.select(3, round=0, oracle=oracle)
    np.testing.assert_array_equal(a.clients, b.clients)  # M >= N: the option is off
    assert full.last_probed_ is None


def test_max_trained_below_the_budget_is_refused():
    with pytest.raises(ValueError, match=r"OptimalClientSamplingSelector: parameter max_trained=2 is smaller than"):
        OptimalClientSamplingSelector(max_trained=2, random_state=0).fit(ClientPool([10] * 9)).select(
            3, round=0, oracle=SyntheticOracle(9))
    with pytest.raises(ValueError, match=r"OptimalClientSamplingSelector: parameter max_trained=0"):
        OptimalClientSamplingSelector(max_trained=0).fit(ClientPool([10] * 9))


def test_nan_norm_names_the_round():
    updates = np.ones((5, 3), dtype=np.float32)
    updates[4, 0] = np.inf
    oracle = FixedUpdatesOracle(updates, np.zeros(3), np.ones(5))
    sel = OptimalClientSamplingSelector(random_state=0).fit(ClientPool([10] * 5))
    with pytest.raises(ValueError, match=r"round 7.*\[4\]"):
        sel.select(2, round=7, oracle=oracle)
