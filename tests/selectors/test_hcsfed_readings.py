"""HCSFed's readings named for what they compute: the cohesion S_h of Eq. 5, the k-means runs, the presets' rows.

Each reading is checked against numbers worked out by hand on a tiny case, so swapping two readings (or their
names) fails; the default is the reading under which the paper's Eq. 8 holds, checked on the identity itself.
"""

from __future__ import annotations

import hashlib
import json
import math
import pickle
import warnings

import numpy as np
import pytest

from fedselect import get_selector
from fedselect.presets import HCSFED_READINGS, get_preset
from fedselect.selection import ClientPool
from fedselect.selectors import hcsfed as hcsfed_module
from fedselect.selectors.hcsfed import COHESIONS, HCSFedSelector, allocate, cluster_cohesion, kmeans
from fedselect.testing import _run, make_pools

from .test_unbiased import FixedUpdatesOracle, make_problem

# Three clusters: {0, 1, 2} (a right triangle), {3, 4} (one unit apart) and the singleton {5}.
TINY = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 4.0], [10.0, 10.0], [11.0, 10.0], [-20.0, -20.0]])
TINY_LABELS = np.array([0, 0, 0, 1, 1, 2])
# By hand. Cluster 0: squared distances 4, 16 and 20, so 80 over the 6 ordered pairs; its mean is (2/3, 4/3) and
# the squared distances to it sum to 20/9 + 32/9 + 68/9 = 40/3. Cluster 1: one pair at 1, so 2 over the ordered
# pairs; squared distances to its mean 1/4 + 1/4. A singleton has S_h = 0.
TINY_COHESION = {
    "pairwise-sum": [80 / 2, 2 / 1, 0.0],  # ordered-pair sum / (N_h - 1)
    "mean-pairwise": [80 / 6, 2 / 2, 0.0],  # ordered-pair sum / (N_h (N_h - 1))
    "std": [math.sqrt((40 / 3) / 2), math.sqrt(0.5 / 1), 0.0],  # sqrt(sum ||X^i - mean||^2 / (N_h - 1))
}


def _identity(global_params, rng):
    return lambda u: u


def test_the_readings_are_named_for_what_they_compute():
    assert COHESIONS == ("std", "mean-pairwise", "pairwise-sum")
    assert HCSFedSelector().cohesion == "std" and HCSFedSelector().kmeans_n_init == 1


@pytest.mark.parametrize("kind", COHESIONS)
def test_each_cohesion_reading_against_a_hand_computation(kind):
    np.testing.assert_allclose(cluster_cohesion(TINY, TINY_LABELS, kind), TINY_COHESION[kind], rtol=1e-12)


def test_cluster_cohesion_defaults_to_std_and_paper_is_a_deprecated_alias_of_pairwise_sum():
    np.testing.assert_allclose(cluster_cohesion(TINY, TINY_LABELS), TINY_COHESION["std"], rtol=1e-12)
    with pytest.warns(FutureWarning, match=r"cohesion='paper' is deprecated.*'pairwise-sum'"):
        old = cluster_cohesion(TINY, TINY_LABELS, "paper")
    np.testing.assert_allclose(old, TINY_COHESION["pairwise-sum"], rtol=1e-12)
    with pytest.raises(ValueError, match="cohesion='variance'"):
        cluster_cohesion(TINY, TINY_LABELS, "variance")


@pytest.mark.parametrize("kind", [None, *COHESIONS])
def test_the_selector_allocates_eq5_by_the_reading_it_is_given(kind):
    """cohesion_ and the shares of Eq. 5 (m N_h S_h / sum N_h S_h) are the hand-computed ones of the reading."""
    params = {} if kind is None else {"cohesion": kind}
    sel = HCSFedSelector(n_clusters=3, compressor=_identity, kmeans_n_init=10, random_state=0, **params)
    sel.fit(ClientPool([10] * 6))
    oracle = FixedUpdatesOracle(TINY, np.zeros(2), np.ones(6))
    want = np.array(TINY_COHESION[kind or "std"])
    sizes = np.array([3, 2, 1])
    for t in range(3):
        sel.select(2, round=t, oracle=oracle)
        # the clusters in TINY's order (k-means numbers them by its own order)
        order = [int(sel.labels_[i]) for i in (0, 3, 5)]
        assert [set(np.flatnonzero(sel.labels_ == h)) for h in order] == [{0, 1, 2}, {3, 4}, {5}]
        np.testing.assert_allclose(sel.cohesion_[order], want, rtol=1e-9)
        np.testing.assert_allclose(sel.shares_[order], 2 * sizes * want / np.sum(sizes * want), rtol=1e-9)


def test_paper_is_pairwise_sum_with_a_future_warning_and_old_pickles_keep_working():
    oracle = FixedUpdatesOracle(TINY, np.zeros(2), np.ones(6))
    with pytest.warns(FutureWarning, match=r"HCSFedSelector: cohesion='paper' is deprecated"):
        old = HCSFedSelector(n_clusters=3, compressor=_identity, cohesion="paper", random_state=0)
        old.fit(ClientPool([10] * 6))
    new = HCSFedSelector(n_clusters=3, compressor=_identity, cohesion="pairwise-sum", random_state=0)
    new.fit(ClientPool([10] * 6))
    for t in range(5):
        a, b = old.select(2, round=t, oracle=oracle), new.select(2, round=t, oracle=oracle)
        np.testing.assert_array_equal(a.clients, b.clients)
        np.testing.assert_array_equal(a.weights, b.weights)
    # A selector pickled before kmeans_n_init existed (e.g. in a checkpoint) ran 10 k-means runs per round.
    state = old.__getstate__()
    del state["kmeans_n_init"]
    revived = HCSFedSelector.__new__(HCSFedSelector)
    revived.__setstate__(state)
    assert revived.kmeans_n_init == 10 and revived.cohesion == "paper"
    assert pickle.loads(pickle.dumps(revived)).select(2, round=5, oracle=oracle).clients.size == 2


def test_old_runs_are_reproduced_bit_for_bit_by_pinning_their_reading():
    """The selections recorded at commit f8f7fa0 (tests/test_golden.py) with cohesion='paper' and 10 k-means runs,
    then the defaults, come back from the names the readings have now."""
    pool = make_pools(0, (20,))[0]

    def digest(**params):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runs = _run(get_selector("hcsfed", random_state=0, n_clusters=3, **params), pool, 5, 15, 0)
        rows = [(c, None if w is None else [round(x, 10) for x in w]) for c, w in runs]
        return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]

    assert digest(cohesion="pairwise-sum", kmeans_n_init=10) == "5af48bc97dd82a13"
    assert digest(cohesion="paper", kmeans_n_init=10) == "5af48bc97dd82a13"
    assert digest() != "5af48bc97dd82a13"  # the defaults are another reading now


def test_identifying_params_record_the_pinned_old_reading_as_the_old_runs_did():
    """Checkpoints and comparisons identify a selector by identifying_params: the old reading pinned under its new
    names is identified as the old default was (cohesion 'paper', no kmeans_n_init); the new defaults are not."""
    old = HCSFedSelector(cohesion="pairwise-sum", kmeans_n_init=10).identifying_params()
    assert old["cohesion"] == "paper" and "kmeans_n_init" not in old
    new = HCSFedSelector().identifying_params()
    assert new["cohesion"] == "std" and new["kmeans_n_init"] == 1


# -- the theory the default is chosen by ---------------------------------------------------------------------
def test_only_the_std_reading_makes_eq8_hold():
    """Eq. 8: V(cluster) = V(cludiv) + sum_h N_h (S_h - S)^2 / (m N), S = sum_h N_h S_h / N.

    With V(alloc) = sum_h (N_h / N)^2 s_h^2 / m_h (stratified sampling of the cluster means, s_h the within-cluster
    standard deviation of the compressed updates), Eq. 4's m_h = m N_h / N and Eq. 5's shares: the identity holds
    when S_h is the standard deviation (Neyman allocation, which then has the least variance) and not under the
    other readings.
    """
    rng = np.random.default_rng(0)
    sizes = np.array([12, 30, 8, 25, 25])
    spreads = np.array([0.3, 1.0, 2.5, 0.6, 1.6])
    labels = np.repeat(np.arange(5), sizes)
    X = 20 * np.eye(5, 6)[labels] + spreads[labels, None] * rng.normal(size=(labels.size, 6))
    N, m = labels.size, 10
    s2 = np.array([np.sum((X[labels == h] - X[labels == h].mean(0)) ** 2) / (sizes[h] - 1) for h in range(5)])

    def variance(shares):
        return float(np.sum((sizes / N) ** 2 * s2 / shares))

    v_cluster = variance(m * sizes / N)
    v = {}
    for kind in COHESIONS:
        S = cluster_cohesion(X, labels, kind)
        shares = allocate(sizes, S, m)
        assert np.all(shares < sizes)  # no cap binds: the shares are Eq. 5's own
        v[kind] = variance(shares)
        gap = float(np.sum(sizes * (S - sizes @ S / N) ** 2) / (m * N))
        if kind == "std":
            assert v_cluster == pytest.approx(v[kind] + gap, rel=1e-12)
        else:
            assert v_cluster != pytest.approx(v[kind] + gap, rel=1e-3), kind
    assert v["std"] < min(v["mean-pairwise"], v["pairwise-sum"], v_cluster)


# -- the k-means runs ----------------------------------------------------------------------------------------
def _inertia(X, labels):
    return sum(float(((X[labels == h] - X[labels == h].mean(0)) ** 2).sum()) for h in np.unique(labels))


@pytest.mark.parametrize("n_init", [1, 3, 10])
def test_kmeans_n_init_is_the_best_of_that_many_single_runs(n_init):
    """``n_init=k`` equals k single runs drawn one after the other from the same stream, the lowest inertia kept."""
    _, oracle = make_problem(0)
    X = np.asarray(oracle.updates, dtype=np.float64)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    for seed in range(8):
        rng = np.random.RandomState(seed)
        singles = [kmeans(X, 4, rng, n_init=1) for _ in range(n_init)]
        best = min(singles, key=lambda lab: _inertia(X, lab))  # min keeps the first of equals, as kmeans does
        got = kmeans(X, 4, np.random.RandomState(seed), n_init=n_init)
        assert len({(a, b) for a, b in zip(got, best)}) == len(set(best)), (seed, n_init)  # same partition
        assert rng.randint(2**31) == _draws_after(X, seed, n_init)  # and k runs use the stream as k single runs do


def _draws_after(X: np.ndarray, seed: int, n_init: int) -> int:
    """The stream's next draw after ``kmeans(X, 4, ..., n_init)``."""
    rng = np.random.RandomState(seed)
    kmeans(X, 4, rng, n_init=n_init)
    return rng.randint(2**31)


def test_one_kmeans_run_merges_separated_groups_that_ten_runs_keep_apart():
    """The restarts matter: Algorithm 1's single run from random clients often merges two of four groups."""
    _, oracle = make_problem(0)
    X = np.asarray(oracle.updates, dtype=np.float64)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    truth = np.arange(24) % 4

    def found(n_init, seed):
        labels = kmeans(X, 4, np.random.RandomState(seed), n_init=n_init)
        return len({(a, b) for a, b in zip(labels, truth)}) == 4 and labels.max() == 3

    assert sum(found(1, s) for s in range(30)) < 25
    assert all(found(10, s) for s in range(30))


@pytest.mark.parametrize("n_init", [None, 1, 7])
def test_the_selector_runs_kmeans_n_init_times(n_init, monkeypatch):
    seen = []
    real = hcsfed_module.kmeans

    def spy(*args, **kwargs):
        seen.append(kwargs["n_init"])
        return real(*args, **kwargs)

    monkeypatch.setattr(hcsfed_module, "kmeans", spy)
    params = {} if n_init is None else {"kmeans_n_init": n_init}
    sel = HCSFedSelector(n_clusters=3, compressor=_identity, random_state=0, **params).fit(ClientPool([10] * 6))
    oracle = FixedUpdatesOracle(TINY, np.zeros(2), np.ones(6))
    for t in range(3):
        sel.select(2, round=t, oracle=oracle)
    assert seen == [n_init or 1] * 3


def test_kmeans_n_init_must_be_a_positive_int():
    for bad in (0, 2.5, "10"):
        with pytest.raises(ValueError, match=f"kmeans_n_init={bad!r}"):
            HCSFedSelector(kmeans_n_init=bad).fit(ClientPool([10] * 8))


# -- the presets' rows, named for what they run ------------------------------------------------------------
@pytest.mark.parametrize("name", ["hcsfed-fmnist-q0.1", "hcsfed-fmnist-q0.5-calibrated"])
def test_the_recorded_tables_rows_pin_the_reading_they_ran(name):
    """The rows behind the stored tables ran cohesion 'paper' (now 'pairwise-sum') or 'std', 10 k-means runs and
    the unbiased weights: pinned, so the defaults that moved do not move what the rows mean."""
    rows = get_preset(name).selectors
    assert rows["HCSFed"][1]["cohesion"] == "pairwise-sum" and rows["HCSFed (cohesion=std)"][1]["cohesion"] == "std"
    for label in ("HCSFed", "HCSFed (cohesion=std)"):
        built = HCSFedSelector(**rows[label][1])
        assert built.kmeans_n_init == 10 and built.weighting == "inclusion" and built.rounding == "systematic"


@pytest.mark.parametrize("q", ["0.1", "0.3", "0.5"])
def test_the_readings_presets_label_each_row_by_what_it_runs(q):
    preset = get_preset(f"hcsfed-fmnist-q{q}-readings")
    cal = get_preset(f"hcsfed-fmnist-q{q}-calibrated")
    assert (preset.federation, preset.trainer, preset.seeds, preset.target) == (
        cal.federation, cal.trainer, cal.seeds, cal.target)
    assert list(preset.selectors) == list(HCSFED_READINGS) and len(preset.selectors) == 9
    assert "systematic rounding" in preset.notes and "uniform_mix" in preset.notes
    for label, (name, params) in preset.selectors.items():
        sel = get_selector(name, **params)
        # every reading is pinned: no row depends on a default
        assert {"cohesion", "weighting", "rounding", "kmeans_n_init", "uniform_mix"} <= set(params)
        assert sel.kmeans_n_init == 1 and sel.rounding == "systematic" and sel.kmeans_init == "random"
        assert label.startswith("HCSFed as printed") == (sel.weighting == "paper")
        assert label.startswith("HCSFed unbiased (our reading)") == (sel.weighting == "inclusion")
        assert (f"cohesion={sel.cohesion}" in label) == (sel.cohesion != "std")  # unnamed: the default, std
        assert ("uniform_mix=0.1" in label) == (sel.uniform_mix == 0.1)
    # "as printed" is line-15 weights with the default cohesion
    name, params = preset.selectors["HCSFed as printed"]
    printed = get_selector(name, **params)
    assert printed.weighting == "paper" and printed.cohesion == HCSFedSelector().cohesion
