from __future__ import annotations

import numpy as np
import pytest

from fedselect import get_selector
from fedselect.selection import ClientPool
from fedselect.selectors._compress import grouping_compressor, kmeans_1d, projection_compressor
from fedselect.selectors.hcsfed import (
    HCSFedSelector,
    allocate,
    cluster_cohesion,
    kmeans,
    round_shares,
    systematic_pps,
)
from fedselect.testing import SyntheticOracle, check_selector

from .test_unbiased import FixedUpdatesOracle, make_problem


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"compressor": "projection", "compression_rate": 0.3, "cohesion": "mean-pairwise"},
        {"rounding": "largest-remainder", "n_clusters": 2, "compression_rate": 1.0},
        {"cohesion": "std", "kmeans_init": "k-means++"},
        {"uniform_mix": 0.3},
        {"weighting": "paper"},
    ],
)
def test_conformance(params):
    check_selector(HCSFedSelector(**params), n_rounds=12)


def test_registered():
    assert isinstance(get_selector("hcsfed", n_clusters=3), HCSFedSelector)


# -- the pieces ----------------------------------------------------------------------
def test_kmeans_1d_is_a_fixed_point_of_lloyd():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-2, 0.3, 500), rng.normal(0, 0.1, 300), rng.normal(3, 0.5, 200)])
    labels = kmeans_1d(x, 3)
    assert labels.max() + 1 == 3
    centres = np.array([x[labels == g].mean() for g in range(3)])
    assert np.all(np.diff(centres) > 0)
    nearest = np.abs(x[:, None] - centres[None, :]).argmin(1)
    assert np.array_equal(nearest, labels)  # converged: every value sits with its nearest centre
    np.testing.assert_allclose(np.sort(centres), [-2, 0, 3], atol=0.15)


def test_kmeans_1d_degenerate_and_large():
    assert np.all(kmeans_1d(np.zeros(100), 10) == 0)
    assert kmeans_1d(np.array([1.0, 1.0, 2.0, 2.0, 3.0]), 10).max() + 1 == 3
    x = np.random.default_rng(1).normal(size=50_000)
    labels = kmeans_1d(x, 500)
    assert labels.shape == x.shape and labels.max() < 500


def test_grouping_compressor_sends_group_means():
    rng = np.random.RandomState(0)
    w = np.random.default_rng(0).normal(size=200).astype(np.float32)
    transform = grouping_compressor(w, rng, rate=0.05)
    labels = kmeans_1d(w, 10)
    u = np.random.default_rng(1).normal(size=200).astype(np.float32)
    out = transform(u)
    assert out.dtype == np.float32 and out.shape == (labels.max() + 1,) and out.size <= 10
    np.testing.assert_allclose(out, [u[labels == g].mean() for g in range(out.size)], rtol=1e-5)
    # Rate 1 with distinct values: one group per parameter, so the upload is the update itself (permuted).
    full = grouping_compressor(w, rng, rate=1.0)(u)
    np.testing.assert_allclose(np.sort(full), np.sort(u), rtol=1e-6)


def test_projection_compressor_seeded_from_rng():
    w = np.zeros(300, dtype=np.float32)
    u = np.random.default_rng(0).normal(size=300).astype(np.float32)
    a = projection_compressor(w, np.random.RandomState(5), rate=0.1)(u)
    b = projection_compressor(w, np.random.RandomState(5), rate=0.1)(u)
    c = projection_compressor(w, np.random.RandomState(6), rate=0.1)(u)
    assert a.shape == (30,) and np.array_equal(a, b) and not np.array_equal(a, c)


@pytest.mark.parametrize("init", ["random", "k-means++"])
def test_kmeans_finds_separated_groups(init):
    _, oracle = make_problem(0)
    X = oracle.updates / np.linalg.norm(oracle.updates, axis=1, keepdims=True)
    truth = np.arange(24) % 4
    for seed in range(20):  # 10 runs: one run from random clients often merges two groups (test_hcsfed_readings)
        labels = kmeans(X, 4, np.random.RandomState(seed), init=init, n_init=10)
        # Same partition up to renaming.
        assert labels.max() + 1 == 4 and len({(a, b) for a, b in zip(labels, truth)}) == 4, seed
    assert kmeans(np.ones((5, 3)), 3, np.random.RandomState(0), init=init).tolist() == [0] * 5
    with pytest.raises(ValueError, match="init='bad'"):
        kmeans(X, 4, np.random.RandomState(0), init="bad")


def test_cohesion_matches_pairwise_definition():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(9, 4))
    labels = np.array([0, 0, 0, 1, 1, 1, 1, 2, 0])
    paper = cluster_cohesion(X, labels, "pairwise-sum")
    mean = cluster_cohesion(X, labels, "mean-pairwise")
    std = cluster_cohesion(X, labels, "std")
    for h in range(3):
        Xh = X[labels == h]
        nh = len(Xh)
        pair = sum(np.sum((Xh[i] - Xh[j]) ** 2) for i in range(nh) for j in range(nh) if i != j)
        assert paper[h] == pytest.approx(pair / (nh - 1) if nh > 1 else 0.0)
        assert mean[h] == pytest.approx(pair / (nh * (nh - 1)) if nh > 1 else 0.0)
        # the within-cluster standard deviation: its square is half the mean pairwise distance
        assert std[h] == pytest.approx(np.sqrt(np.sum(Xh.var(0, ddof=1))) if nh > 1 else 0.0)
    assert paper[2] == 0.0 == std[2]  # singleton


def test_allocate_eq5_caps_and_fallbacks():
    sizes = np.array([10, 5, 3])
    S = np.array([1.0, 2.0, 0.5])
    np.testing.assert_allclose(allocate(sizes, S, 6), 6 * sizes * S / np.sum(sizes * S))
    # Cluster 1 would get 9 * 40/55 > 2 places: capped at N_h = 2, the excess re-shared.
    capped = allocate(np.array([2, 10, 10]), np.array([20.0, 1.0, 0.5]), 9)
    assert capped[0] == pytest.approx(2.0) and capped.sum() == pytest.approx(9.0)
    assert capped[1] / capped[2] == pytest.approx(2.0)
    # All S_h = 0: plain cluster sampling, m N_h / N.
    np.testing.assert_allclose(allocate(sizes, np.zeros(3), 9), 9 * sizes / 18)
    # Positive clusters full, budget left: the rest goes to zero-cohesion clusters by size.
    left = allocate(np.array([2, 1, 3]), np.array([1.0, 0.0, 0.0]), 4)
    np.testing.assert_allclose(left, [2.0, 0.5, 1.5])
    rng = np.random.default_rng(1)
    for _ in range(200):
        sizes = rng.integers(1, 8, size=rng.integers(1, 7))
        S = rng.exponential(size=sizes.size) * (rng.random(sizes.size) < 0.7)
        m = int(rng.integers(1, sizes.sum() + 1))
        shares = allocate(sizes, S, m)
        assert shares.sum() == pytest.approx(m) and np.all(shares <= sizes + 1e-9) and np.all(shares >= 0)


def test_systematic_rounding_exact_total_and_unbiased():
    rng = np.random.RandomState(0)
    shares = np.array([0.3, 2.45, 1.0, 0.0, 3.25])  # sum 7
    draws = np.array([round_shares(shares, rng) for _ in range(20_000)])
    assert np.all(draws.sum(1) == 7)
    assert np.all((draws == np.floor(shares)) | (draws == np.ceil(shares)))
    se = np.sqrt((shares % 1) * (1 - shares % 1) / len(draws)) + 1e-12
    assert np.all(np.abs(draws.mean(0) - shares) <= 4 * se)
    np.testing.assert_array_equal(round_shares(shares, rng, "largest-remainder"), [0, 3, 1, 0, 3])


def test_systematic_pps_inclusion_probabilities_exact():
    rng = np.random.RandomState(0)
    pi = np.array([1.0, 0.1, 0.5, 0.9, 0.0, 0.25, 0.25])  # sum 3
    T = 20_000
    counts = np.zeros(pi.size)
    for _ in range(T):
        chosen = systematic_pps(pi, rng)
        assert chosen.size == 3 and np.unique(chosen).size == 3
        counts[chosen] += 1
    se = np.sqrt(pi * (1 - pi) / T) + 1e-12
    assert np.all(np.abs(counts / T - pi) <= 4 * se)


# -- the selector ----------------------------------------------------------------------
def test_every_round_allocation_sums_to_n_within_cluster_sizes():
    pool = ClientPool(np.random.default_rng(0).integers(10, 200, size=30))
    sel = HCSFedSelector(n_clusters=6, compression_rate=0.3, random_state=0).fit(pool)
    oracle = SyntheticOracle(30, n_samples=pool.n_samples, random_state=0)
    for t in range(15):
        s = sel.select(7, round=t, oracle=oracle)
        sizes = np.bincount(sel.labels_)
        assert sel.allocation_.sum() == 7 and len(s) == 7 and np.unique(s.clients).size == 7
        assert np.all(sel.allocation_ <= sizes)
        assert np.all(sel.shares_ <= sizes + 1e-9)
        assert sel.inclusion_.sum() == pytest.approx(7.0)  # sum_k pi_k = sum_h E[m_h] = m
        assert np.all(np.bincount(sel.labels_[s.clients], minlength=sizes.size) == sel.allocation_)
        np.testing.assert_allclose(s.weights, pool.weights[s.clients] / sel.inclusion_[s.clients])
        oracle.run_round(s)


def test_marginal_inclusion_probabilities_match_frequencies():
    # Four far-apart groups with unequal spreads: k-means finds them every round, the shares are fractional.
    rng = np.random.default_rng(0)
    groups = np.arange(24) % 4
    spread = np.array([0.2, 0.5, 1.0, 0.3])[groups, None]
    updates = 10 * np.eye(4, 8)[groups] + spread * rng.normal(size=(24, 8))
    oracle = FixedUpdatesOracle(updates, rng.normal(size=8), np.ones(24))
    pool = ClientPool(rng.integers(10, 300, size=24))
    # 10 k-means++ runs find the four groups every round, so the design is the same every round.
    sel = HCSFedSelector(n_clusters=4, compression_rate=1.0, kmeans_init="k-means++", kmeans_n_init=10,
                         random_state=0).fit(pool)
    T = 1500
    counts = np.zeros(pool.n_clients)
    shares = []
    for t in range(T):
        counts[sel.select(5, round=t, oracle=oracle).clients] += 1
        shares.append(np.sort(sel.shares_))
        if t == 0:
            pi = sel.inclusion_.copy()
        else:  # fixed updates and well-separated groups: the same design every round
            np.testing.assert_allclose(sel.inclusion_, pi, atol=1e-9)
    assert np.any(np.asarray(shares)[0] % 1 > 0.05)  # the rounding is really random here
    se = np.sqrt(pi * (1 - pi) / T) + 1e-12
    assert np.all(np.abs(counts / T - pi) <= 4.5 * se)


def test_every_client_trains_and_uploads_compressed():
    oracle = SyntheticOracle(20, dim=40, random_state=0)
    sel = HCSFedSelector(n_clusters=3, compression_rate=0.1, random_state=0).fit(ClientPool(oracle.n_samples))
    sel.select(4, round=0, oracle=oracle)
    assert oracle.costs.local_trainings == 20
    assert oracle.costs.floats_up == 20 * sel.compressed_dim_ and sel.compressed_dim_ <= 4


def test_max_trained_trains_a_uniform_subset_each_round():
    """max_trained=M: M trainings and M compressed uploads a round, clustering and choice inside the subset."""
    oracle = SyntheticOracle(60, dim=40, random_state=0)
    sel = HCSFedSelector(n_clusters=3, compression_rate=0.1, max_trained=15, random_state=0)
    sel.fit(ClientPool(oracle.n_samples))
    for t in range(5):
        before = (oracle.costs.local_trainings, oracle.costs.floats_up)
        s = sel.select(4, round=t, oracle=oracle)
        assert oracle.costs.local_trainings - before[0] == 15
        assert oracle.costs.floats_up - before[1] == 15 * sel.compressed_dim_
        probed = set(sel.probed_.tolist())
        assert len(probed) == 15 and set(s.clients.tolist()) <= probed and len(s) == 4
        assert (sel.labels_ >= 0).sum() == 15 and sel.inclusion_[sorted(set(range(60)) - probed)].max() == 0
        # each chosen weight is (N / M) p_k / pi_k
        np.testing.assert_allclose(s.weights, 4 * sel.weights_[s.clients] / sel.inclusion_[s.clients])
        oracle.run_round(s.validated(60, 4))
    with pytest.raises(ValueError, match=r"HCSFedSelector: parameter max_trained=3 is smaller than the n=4"):
        HCSFedSelector(n_clusters=3, max_trained=3, random_state=0).fit(ClientPool(oracle.n_samples)).select(
            4, round=0, oracle=oracle)
    off = HCSFedSelector(n_clusters=3, compression_rate=0.1, max_trained=60, random_state=0)
    ref = HCSFedSelector(n_clusters=3, compression_rate=0.1, random_state=0)
    a = off.fit(ClientPool(oracle.n_samples)).select(4, round=9, oracle=oracle)
    b = ref.fit(ClientPool(oracle.n_samples)).select(4, round=9, oracle=oracle)
    np.testing.assert_array_equal(a.clients, b.clients)  # M >= N: the option is off
    assert off.probed_ is None


def test_callable_compressor():
    calls = []

    def first_two(global_params, rng):
        calls.append(global_params.shape)
        return lambda u: u[:2]

    oracle = SyntheticOracle(12, random_state=0)
    sel = HCSFedSelector(n_clusters=2, compressor=first_two, random_state=0).fit(ClientPool(oracle.n_samples))
    sel.select(3, round=0, oracle=oracle)
    assert calls == [(20,)] and sel.compressed_dim_ == 2


@pytest.mark.parametrize(
    "params, match",
    [
        ({"n_clusters": 0}, "n_clusters=0"),
        ({"n_clusters": 2.5}, "n_clusters=2.5"),
        ({"compression_rate": 0.0}, "compression_rate=0.0"),
        ({"compression_rate": 1.5}, "compression_rate=1.5"),
        ({"compressor": "topk"}, "compressor='topk'"),
        ({"cohesion": "variance"}, "cohesion='variance'"),
        ({"rounding": "floor"}, "rounding='floor'"),
        ({"kmeans_init": "kmeans"}, "kmeans_init='kmeans'"),
        ({"uniform_mix": 1.0}, "uniform_mix=1.0"),
        ({"uniform_mix": -0.1}, "uniform_mix=-0.1"),
        ({"max_trained": 0}, "max_trained=0"),
        ({"max_trained": 2.5}, "max_trained=2.5"),
    ],
)
def test_bad_parameters(params, match):
    with pytest.raises(ValueError, match=match):
        HCSFedSelector(**params).fit(ClientPool([10] * 8))


def test_too_many_clusters_named_in_fit():
    with pytest.raises(ValueError, match=r"n_clusters=9.*N=8"):
        HCSFedSelector(n_clusters=9).fit(ClientPool([10] * 8))


def test_infinite_updates_name_the_round():
    updates = np.ones((6, 4), dtype=np.float32)
    updates[2, 1] = np.inf
    oracle = FixedUpdatesOracle(updates, np.arange(4.0), np.ones(6))
    sel = HCSFedSelector(n_clusters=2, compression_rate=1.0, random_state=0).fit(ClientPool([10] * 6))
    with pytest.raises(ValueError, match=r"round 3.*client\(s\) \[2\].*infinite"):
        sel.select(2, round=3, oracle=oracle)


def test_clients_that_did_not_answer_are_left_out():
    """NaN rows (no answer) are never chosen; Algorithm 1 runs on the others with p_k renormalised over them."""
    rng = np.random.default_rng(0)
    updates = rng.normal(size=(8, 4)).astype(np.float32)
    updates[[1, 6]] = np.nan
    sizes = np.arange(10, 90, 10)
    oracle = FixedUpdatesOracle(updates, np.zeros(4), np.ones(8))
    sel = HCSFedSelector(n_clusters=2, compression_rate=1.0, random_state=0).fit(ClientPool(sizes))
    answered = np.array([0, 2, 3, 4, 5, 7])
    p = sizes[answered] / sizes[answered].sum()
    for t in range(30):
        chosen = sel.select(3, round=t, oracle=oracle)
        assert not set(chosen.clients.tolist()) & {1, 6}
        pi = sel.inclusion_
        assert pi[[1, 6]].tolist() == [0.0, 0.0] and sel.labels_[[1, 6]].tolist() == [-1, -1]
        np.testing.assert_allclose(chosen.weights, p[np.searchsorted(answered, chosen.clients)] / pi[chosen.clients])


# -- Eq. 5 with the all-pairs cohesion and Eq. 6, checked against the paper's formulas -----------------
def _four_groups(sizes=(8, 12, 16, 10), spreads=(0.4, 0.8, 1.6, 0.6), seed=0):
    """Four far-apart groups of unequal sizes and spreads, with update norms varying inside each group."""
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(4), sizes)
    radial = 10.0 * rng.uniform(0.75, 1.25, size=(groups.size, 1))
    updates = radial * np.eye(4, 8)[groups] + np.asarray(spreads)[groups, None] * rng.normal(size=(groups.size, 8))
    oracle = FixedUpdatesOracle(updates, rng.normal(size=8), np.ones(groups.size))
    return groups, np.asarray(oracle.updates, dtype=np.float64), oracle


def test_pairwise_sum_cohesion_is_eq5_over_all_ordered_pairs():
    """``cohesion="pairwise-sum"``: S_h = 1/(N_h - 1) sum_{i != j in h} ||X^i - X^j||^2 over the ordered pairs and
    shares m N_h S_h / sum_h N_h S_h (Eq. 5).

    The clusters have unequal sizes and spreads, so the other readings ("mean-pairwise" divides by N_h more,
    "std" takes a square root) give other shares. Each reading against a hand computation: test_hcsfed_readings.
    """
    groups, X, oracle = _four_groups()
    sel = HCSFedSelector(n_clusters=4, compression_rate=1.0, kmeans_init="k-means++", kmeans_n_init=10,
                         cohesion="pairwise-sum", random_state=0)
    sel.fit(ClientPool(np.full(groups.size, 50)))
    m = 4
    for t in range(5):
        sel.select(m, round=t, oracle=oracle)
        labels = sel.labels_
        assert len({(a, b) for a, b in zip(labels, groups)}) == 4  # k-means found the four groups
        S = np.zeros(4)
        for h in range(4):
            Xh = X[labels == h]
            pairs = sum(np.sum((Xh[i] - Xh[j]) ** 2) for i in range(len(Xh)) for j in range(len(Xh)) if i != j)
            S[h] = pairs / (len(Xh) - 1)
        N_h = np.bincount(labels, minlength=4)
        np.testing.assert_allclose(sel.cohesion_, S, rtol=1e-5)
        np.testing.assert_allclose(sel.shares_, m * N_h * S / np.sum(N_h * S), rtol=1e-5)
    for other in ("mean-pairwise", "std"):  # the alternative readings really allocate differently here
        alt = cluster_cohesion(X, labels, other)
        assert not np.allclose(m * N_h * alt / np.sum(N_h * alt), sel.shares_, rtol=1e-3), other


def test_eq6_samples_by_update_norm_inside_each_cluster():
    """Eq. 6: inside cluster h the m_h clients are drawn with probability proportional to ||X_t^k||.

    No inclusion probability reaches 1 here, so client k's marginal inclusion probability is
    ``s_h ||X^k|| / sum_{j in h} ||X^j||`` (s_h the real share of Eq. 5): checked exactly against the
    selector's pi_k and its aggregation weights, and statistically against the draws. Uniform sampling
    inside the cluster or sampling by the squared norm gives other probabilities.
    """
    groups, X, oracle = _four_groups()
    norms = np.linalg.norm(X, axis=1)
    for h in range(4):  # the norms really vary inside each group
        assert norms[groups == h].max() / norms[groups == h].min() > 1.15
    pool = ClientPool(np.random.default_rng(3).integers(20, 200, size=groups.size))
    sel = HCSFedSelector(n_clusters=4, compression_rate=1.0, kmeans_init="k-means++", kmeans_n_init=10,
                         random_state=0).fit(pool)
    T = 1500
    counts = np.zeros(groups.size)
    first = None
    for t in range(T):
        chosen = sel.select(4, round=t, oracle=oracle)
        counts[chosen.clients] += 1
        labels = sel.labels_
        want = sel.shares_[labels] * norms / np.bincount(labels, weights=norms)[labels]
        if t < 20:
            assert len({(a, b) for a, b in zip(labels, groups)}) == 4  # k-means found the four groups
            assert want.max() < 1
            np.testing.assert_allclose(sel.inclusion_, want, rtol=1e-6)
            np.testing.assert_allclose(chosen.weights, pool.weights[chosen.clients] / want[chosen.clients], rtol=1e-6)
        if first is None:
            first = want
        else:  # fixed updates, well-separated groups: the same design every round
            np.testing.assert_allclose(want, first, rtol=1e-9)
    se = np.sqrt(want * (1 - want) / T)
    assert np.all(np.abs(counts / T - want) <= 4.5 * se)


def test_paper_weighting_is_algorithm2_line15_and_leaves_the_draw_alone():
    """``weighting="paper"``: each chosen client gets (N/m) omega_k (Algorithm 2, line 15), not p_k / pi_k.

    The draw is the same as with the default weighting (same stream, same clients); only the weights differ,
    and they differ here because the inclusion probabilities are far from uniform.
    """
    groups, _, oracle = _four_groups()
    pool = ClientPool(np.random.default_rng(3).integers(20, 200, size=groups.size))
    N, n = groups.size, 4
    paper = HCSFedSelector(n_clusters=4, compression_rate=1.0, kmeans_init="k-means++", weighting="paper",
                           random_state=0).fit(pool)
    unbiased = HCSFedSelector(n_clusters=4, compression_rate=1.0, kmeans_init="k-means++", random_state=0).fit(pool)
    for t in range(30):
        a, b = paper.select(n, round=t, oracle=oracle), unbiased.select(n, round=t, oracle=oracle)
        np.testing.assert_array_equal(a.clients, b.clients)
        np.testing.assert_allclose(a.weights, pool.weights[a.clients] * N / n, rtol=1e-12)
        np.testing.assert_allclose(b.weights, pool.weights[b.clients] / unbiased.inclusion_[b.clients], rtol=1e-12)
        assert not np.allclose(a.weights, b.weights)


def test_paper_weighting_with_max_trained_scales_by_the_subset():
    """With ``max_trained`` = M the round draws from a uniform subset A: line 15's N/m over A is (M/m) * (N/M) p_k."""
    oracle = SyntheticOracle(30, random_state=1)
    pool = ClientPool(np.random.default_rng(0).integers(10, 100, size=30))
    sel = HCSFedSelector(n_clusters=3, compression_rate=1.0, weighting="paper", max_trained=12, random_state=0)
    sel.fit(pool)
    for t in range(5):
        s = sel.select(5, round=t, oracle=oracle)
        A = sel.probed_
        p = pool.weights[A] * (30 / 12)
        p = p * (pool.weights[A].sum() * (30 / 12) / p.sum())
        np.testing.assert_allclose(s.weights, p[np.searchsorted(A, s.clients)] * 12 / 5, rtol=1e-12)
