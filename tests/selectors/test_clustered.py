from __future__ import annotations

import numpy as np
import pytest

from fedselect.plugins import get_selector
from fedselect.selection import ClientOracle, ClientPool, RoundFeedback
from fedselect.selectors.clustered import ClusteredSamplingSelector, allocate
from fedselect.testing import SyntheticOracle, check_selector, make_pools

VARIANTS = [
    {},
    {"method": "similarity"},
    {"method": "similarity", "init": "probe"},
    {"method": "similarity", "init": "size", "distance": "l2", "linkage": "average"},
    {"method": "similarity", "distance": "l1", "linkage": "complete", "linkage_input": "rows"},
    {"method": "similarity", "similarity": "knn", "linkage": "single", "n_neighbors": 3},
]


@pytest.mark.parametrize("params", VARIANTS, ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()) or "default")
def test_conformance(params):
    check_selector(ClusteredSamplingSelector(**params), n_rounds=15)


def test_registered_with_aliases():
    for name in ("clustered", "clustered-sampling", "fraboni"):
        assert isinstance(get_selector(name), ClusteredSamplingSelector)
    assert get_selector("clustered", method="similarity").needs == frozenset({"updates"})
    assert ClusteredSamplingSelector().needs == frozenset() and ClusteredSamplingSelector().variable_size


def _check_distributions(r, p, m):
    np.testing.assert_allclose(r.sum(axis=1), np.ones(m), atol=1e-9)  # each distribution sums to 1
    np.testing.assert_allclose(r.sum(axis=0), m * p, atol=1e-9)  # client k gets m p_k in total (Eq. 6)
    assert (r >= -1e-12).all()


@pytest.mark.parametrize("m", [1, 2, 5, 7, 20])
def test_algorithm1_distributions(m):
    for pool in make_pools(3, (7, 20, 53)):
        if m > pool.n_clients:
            continue
        sel = ClusteredSamplingSelector().fit(pool)
        _check_distributions(sel.distributions(m), pool.weights, m)


def test_algorithm1_pours_by_decreasing_size_and_splits_heavy_clients():
    # p = (0.6, 0.25, 0.15), m = 3: masses 1.8, 0.75, 0.45 in that order.
    sel = ClusteredSamplingSelector().fit(ClientPool([60, 25, 15]))
    r = sel.distributions(3)
    np.testing.assert_allclose(r, [[1.0, 0, 0], [0.8, 0.2, 0], [0, 0.55, 0.45]])
    # The heavy client can be drawn twice; duplicates are merged by the runtime with weights summed.
    oracle = SyntheticOracle(3)
    seen_twice = False
    for t in range(50):
        s = sel.select(3, round=t, oracle=oracle)
        assert s.clients.size == 3 and np.allclose(s.weights, 1 / 3)
        v = s.validated(3, 3, variable_size=True)
        seen_twice |= bool(v.weights.max() > 0.5)
        assert np.isclose(v.weights.sum(), 1.0)
    assert seen_twice and not oracle.calls


def test_allocate_algorithm2_heads_and_fill():
    mass = np.array([0.3, 0.3, 0.2, 0.6, 0.4, 0.2])  # m = 2
    clients, lengths, rows = allocate([np.array([2]), np.array([0, 1]), np.array([3, 5]), np.array([4])], mass, 2,
                                      heads=True)
    r = np.zeros((2, 6))
    np.add.at(r, (rows, clients), lengths)
    _check_distributions(r, mass / 2, 2)
    # The two heaviest groups ({3, 5}: 0.8 and {0, 1}: 0.6) head the distributions; the rest fills in order.
    assert r[0, [0, 1]].sum() == pytest.approx(0.6) and r[1, [3, 5]].sum() == pytest.approx(0.8)


def test_allocate_heavy_single_client_in_algorithm2():
    mass = np.array([2.4, 0.3, 0.3])  # m = 3
    clients, lengths, rows = allocate([np.array([1]), np.array([2]), np.array([0])], mass, 3, heads=True)
    r = np.zeros((3, 3))
    np.add.at(r, (rows, clients), lengths)
    _check_distributions(r, mass / 3, 3)


def _grouped_feedback(round, clients, updates):
    clients = np.asarray(clients)
    return RoundFeedback(
        round=round,
        clients=clients,
        weights=np.full(clients.size, 1.0 / clients.size),
        losses=np.ones(clients.size),
        n_samples=np.full(clients.size, 10),
        updates=updates[clients],
    )


def _two_groups(seed=0):
    rng = np.random.default_rng(seed)
    centres = np.array([[5.0, 0, 0, 0], [0, 0, 5.0, 0]])
    groups = np.arange(8) % 2
    return groups, (centres[groups] + 0.1 * rng.normal(size=(8, 4))).astype(np.float32)


@pytest.mark.parametrize("distance", ["cosine", "l2", "l1"])
def test_algorithm2_puts_similar_clients_in_one_distribution(distance):
    groups, updates = _two_groups()
    sel = ClusteredSamplingSelector(method="similarity", distance=distance, random_state=0).fit(ClientPool([1] * 8))
    sel.update(_grouped_feedback(0, np.arange(8), updates))
    oracle = SyntheticOracle(8)
    for t in range(30):
        s = sel.select(2, round=t, oracle=oracle)
        assert sorted(groups[s.clients].tolist()) == [0, 1]  # one client of each group, every round
    r = sel.distributions()
    _check_distributions(r, np.full(8, 1 / 8), 2)
    assert len(set(sel.clusters_[groups == 0])) == 1 and len(set(sel.clusters_[groups == 1])) == 1
    assert sel.n_clusterings_ == 1  # not rebuilt while nothing changed


def test_algorithm2_reclusters_after_new_updates_and_keeps_old_representatives():
    _, updates = _two_groups()
    sel = ClusteredSamplingSelector(method="similarity", random_state=0).fit(ClientPool([1] * 8))
    oracle = SyntheticOracle(8)
    sel.select(2, round=0, oracle=oracle)  # zeros: every representative alike
    assert sel.n_clusterings_ == 1 and not sel.seen_.any()
    _check_distributions(sel.distributions(), np.full(8, 1 / 8), 2)
    sel.update(_grouped_feedback(0, [0, 3], updates))
    sel.select(2, round=1, oracle=oracle)
    assert sel.n_clusterings_ == 2
    np.testing.assert_array_equal(sel.representatives_[[0, 3]], updates[[0, 3]])
    assert not sel.representatives_[[1, 2]].any()
    sel.update(_grouped_feedback(1, [3], updates * 2))
    np.testing.assert_array_equal(sel.representatives_[0], updates[0])  # untouched until client 0 trains again


def test_init_size_uses_algorithm1_until_everyone_reported():
    _, updates = _two_groups()
    pool = ClientPool([1] * 8)
    sel = ClusteredSamplingSelector(method="similarity", init="size", random_state=0).fit(pool)
    oracle = SyntheticOracle(8)
    sel.select(2, round=0, oracle=oracle)
    np.testing.assert_allclose(sel.distributions(), sel.distributions(2))
    assert sel.n_clusterings_ == 0
    sel.update(_grouped_feedback(0, np.arange(8), updates))
    sel.select(2, round=1, oracle=oracle)
    assert sel.n_clusterings_ == 1


def test_init_probe_asks_everyone_once():
    sel = ClusteredSamplingSelector(method="similarity", init="probe", random_state=0).fit(ClientPool([3] * 6))
    oracle = SyntheticOracle(6, random_state=0)
    sel.select(2, round=0, oracle=oracle)
    assert [c[0] for c in oracle.calls] == ["local_updates"] and len(oracle.calls[0][1]) == 6
    assert sel.seen_.all()
    sel.select(2, round=0, oracle=oracle)
    assert len(oracle.calls) == 1


class _Fixed(ClientOracle):
    def __init__(self, updates):
        self.updates, self.n_clients, self.round = updates, len(updates), 0

    def losses(self, ids):
        return np.zeros(len(ids))

    def trial(self, ids):
        return np.zeros(self.n_clients)

    def local_updates(self, ids, transform=None):
        return self.updates[np.asarray(ids)]

    def global_parameters(self):
        return np.zeros(self.updates.shape[1], dtype=np.float32)


@pytest.mark.parametrize(
    "params, n",
    [({}, 4), ({}, 7), ({"method": "similarity"}, 4), ({"method": "similarity", "init": "probe"}, 3),
     ({"method": "similarity", "similarity": "knn", "linkage": "single", "n_neighbors": 4}, 4)],
)
def test_unbiased_with_a_heavy_client(params, n):
    # One client holds half the data (m p_k > 1 for n >= 3): its mass spans several distributions.
    rng = np.random.default_rng(1)
    pool = ClientPool(np.r_[600, rng.integers(10, 120, size=11)])
    U = rng.normal(size=(12, 5)).astype(np.float32) * rng.uniform(0.5, 3, size=(12, 1)).astype(np.float32)
    oracle = _Fixed(U)
    sel = ClusteredSamplingSelector(random_state=0, **params).fit(pool)
    draws = 5000
    agg = np.empty((draws, 5))
    for t in range(draws):
        s = sel.select(n, round=t, oracle=oracle).validated(12, n, variable_size=True)
        agg[t] = s.weights @ U[s.clients].astype(np.float64)
        if sel.needs:
            sel.update(_grouped_feedback(t, s.clients, U))
    target = pool.weights @ U.astype(np.float64)
    se = agg.std(0, ddof=1) / np.sqrt(draws)
    assert np.all(np.abs(agg.mean(0) - target) <= 4 * np.maximum(se, 1e-12))
    if params.get("method") == "similarity":
        _check_distributions(sel.distributions(), pool.weights, n)


def test_nan_update_names_the_round():
    sel = ClusteredSamplingSelector(method="similarity").fit(ClientPool([1, 1, 1]))
    bad = np.array([[0.0, 1.0], [np.nan, 0.0], [1.0, 1.0]], dtype=np.float32)
    with pytest.raises(ValueError, match=r"round 7: .*client\(s\) \[1\].*NaN"):
        sel.update(_grouped_feedback(7, [0, 1, 2], bad))


def test_size_method_ignores_feedback():
    sel = ClusteredSamplingSelector().fit(ClientPool([1, 1, 1]))
    bad = np.full((3, 2), np.nan, dtype=np.float32)
    sel.update(_grouped_feedback(0, [0, 1, 2], bad))  # Algorithm 1 does not look at updates
    assert sel.representatives_ is None


@pytest.mark.parametrize(
    "name, value",
    [("method", "kmeans"), ("linkage", "centroids"), ("distance", "cos"), ("init", "random"),
     ("linkage_input", "matrix"), ("random_state", "0")],
)
def test_parameter_errors(name, value):
    with pytest.raises(ValueError, match=rf"ClusteredSamplingSelector: parameter {name}='{value}' is invalid"):
        ClusteredSamplingSelector(**{name: value}).fit(ClientPool([1, 2]))


def test_single_client_federation():
    sel = ClusteredSamplingSelector(method="similarity", random_state=0).fit(ClientPool([5]))
    s = sel.select(1, round=0, oracle=SyntheticOracle(1))
    assert s.clients.tolist() == [0] and s.weights.tolist() == [1.0]


KNN = {"method": "similarity", "similarity": "knn", "linkage": "single"}


@pytest.mark.parametrize("distance", ["cosine", "l2", "l1"])
@pytest.mark.parametrize("m", [2, 3, 5])
def test_knn_with_a_complete_graph_is_dense_single_linkage(distance, m):
    """n_neighbors = N - 1: the graph holds every pair, so the cut is the dense single-linkage tree's."""
    rng = np.random.default_rng(m)
    updates = (rng.normal(size=(30, 6)) * rng.uniform(0.2, 3.0, size=(30, 1))).astype(np.float32)
    pool = ClientPool(rng.integers(5, 60, size=30))
    out = {}
    for name, params in (("dense", {}), ("knn", {"similarity": "knn", "n_neighbors": 29})):
        sel = ClusteredSamplingSelector(method="similarity", linkage="single", distance=distance, init="probe",
                                        random_state=0, **params).fit(pool)
        sel.select(m, round=0, oracle=_Fixed(updates))
        out[name] = sel
    a, b = out["dense"].clusters_, out["knn"].clusters_
    pairs = lambda lab: lab[:, None] == lab[None, :]  # noqa: E731 (the same partition, whatever the labels)
    np.testing.assert_array_equal(pairs(a), pairs(b))
    for sel in out.values():
        _check_distributions(sel.distributions(), pool.weights, m)
    assert out["knn"]._gram is None


def test_knn_graph_lists_carry_current_distances_and_changed_clients_have_exact_lists():
    rng = np.random.default_rng(0)
    U = rng.normal(size=(40, 5)).astype(np.float32)
    sel = ClusteredSamplingSelector(n_neighbors=4, random_state=0, **KNN).fit(ClientPool([1] * 40))
    oracle = SyntheticOracle(40)
    sel.select(3, round=0, oracle=oracle)  # nothing seen: a graph of zero distances
    assert (sel._knn[1] == 0).all()
    for t in range(1, 30):
        ids = rng.choice(40, 6, replace=False)
        U[ids] = rng.normal(size=(6, 5))
        sel.update(_grouped_feedback(t, ids, U))
        sel.select(3, round=t, oracle=oracle)
        nbr, dist = sel._knn
        full = sel._distance_rows(np.arange(40))
        np.testing.assert_allclose(dist, np.take_along_axis(full, nbr, axis=1), rtol=1e-6, atol=1e-7)
        assert (nbr != np.arange(40)[:, None]).all()
        for i in ids:  # a client that just reported knows its k nearest exactly
            np.testing.assert_allclose(np.sort(dist[i]), np.sort(np.delete(full[i], i))[:4], rtol=1e-6)
        _check_distributions(sel.distributions(), np.full(40, 1 / 40), 3)


def test_knn_puts_similar_clients_in_one_distribution():
    groups, updates = _two_groups()
    sel = ClusteredSamplingSelector(n_neighbors=3, random_state=0, **KNN).fit(ClientPool([1] * 8))
    sel.update(_grouped_feedback(0, np.arange(8), updates))
    for t in range(20):
        s = sel.select(2, round=t, oracle=SyntheticOracle(8))
        assert sorted(groups[s.clients].tolist()) == [0, 1]


def test_knn_needs_single_linkage_and_a_positive_k():
    with pytest.raises(ValueError, match=r"linkage='ward' cannot be used with similarity='knn'.*linkage='single'"):
        ClusteredSamplingSelector(method="similarity", similarity="knn").fit(ClientPool([1, 2, 3]))
    with pytest.raises(ValueError, match=r"ClusteredSamplingSelector: parameter n_neighbors=0 is invalid"):
        ClusteredSamplingSelector(n_neighbors=0, **KNN).fit(ClientPool([1, 2, 3]))
    with pytest.raises(ValueError, match=r"ClusteredSamplingSelector: parameter similarity='sparse' is invalid"):
        ClusteredSamplingSelector(similarity="sparse").fit(ClientPool([1, 2, 3]))
    ClusteredSamplingSelector(similarity="knn").fit(ClientPool([1, 2, 3]))  # Algorithm 1 ignores the similarity
