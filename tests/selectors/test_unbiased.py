"""Unbiasedness harness for selectors that return aggregation weights meant to be unbiased.

On fixed synthetic updates U_k (a fake oracle returns the same updates every round),
the aggregated update ``sum_{k in S} w_k U_k`` of many selections must average to full
participation ``sum_k p_k U_k``: every coordinate within 4 standard errors.

To add a scheme, append a row to ``UNBIASED_SELECTORS``: an id, a factory
``(random_state) -> selector`` and the number of clients asked for per round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from fedselect.selection import BaseSelector, ClientOracle, ClientPool, RoundFeedback, Selection
from fedselect.selectors.clustered import ClusteredSamplingSelector
from fedselect.selectors.hcsfed import HCSFedSelector
from fedselect.selectors.ocs import OptimalClientSamplingSelector

N_DRAWS = 5000
N_CLIENTS = 24
DIM = 8


class FixedUpdatesOracle(ClientOracle):
    """Every round, client k's local update is the fixed row ``updates[k]``."""

    def __init__(self, updates: np.ndarray, global_params: np.ndarray, losses: np.ndarray) -> None:
        self.updates = np.asarray(updates, dtype=np.float32)
        self.n_clients = self.updates.shape[0]
        self.round = 0
        self._w = np.asarray(global_params, dtype=np.float32)
        self._losses = np.asarray(losses, dtype=np.float64)

    def losses(self, ids: Any) -> np.ndarray:
        return self._losses[np.asarray(ids, dtype=np.int64)]

    def trial(self, ids: Any) -> np.ndarray:
        return np.zeros(self.n_clients)

    def local_updates(self, ids: Any, transform: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
        rows = self.updates[np.asarray(ids, dtype=np.int64)]
        if transform is None:
            return rows.copy()
        return np.stack([np.asarray(transform(r.copy()), dtype=np.float32).ravel() for r in rows])

    def global_parameters(self) -> np.ndarray:
        return self._w.copy()


def make_problem(seed: int = 0) -> tuple[ClientPool, FixedUpdatesOracle]:
    """24 clients in 4 well-separated groups of 6, unequal norms and unequal data sizes."""
    rng = np.random.default_rng(seed)
    groups = np.arange(N_CLIENTS) % 4
    centres = 3.0 * rng.normal(size=(4, DIM))
    scale = rng.uniform(0.3, 2.0, size=(N_CLIENTS, 1))
    updates = scale * (centres[groups] + 0.4 * rng.normal(size=(N_CLIENTS, DIM)))
    pool = ClientPool(rng.integers(10, 300, size=N_CLIENTS))
    oracle = FixedUpdatesOracle(updates, rng.normal(size=DIM), rng.uniform(0.5, 2.0, size=N_CLIENTS))
    return pool, oracle


UNBIASED_SELECTORS: list[tuple[str, Callable[[int], BaseSelector], int]] = [
    ("hcsfed-grouping", lambda rs: HCSFedSelector(n_clusters=4, compression_rate=0.5, random_state=rs), 6),
    (
        "hcsfed-projection",
        lambda rs: HCSFedSelector(n_clusters=4, compression_rate=0.5, compressor="projection", random_state=rs),
        6,
    ),
    (
        "hcsfed-max-trained",
        lambda rs: HCSFedSelector(n_clusters=3, compression_rate=0.5, uniform_mix=0.2, max_trained=12, random_state=rs),
        5,
    ),
    ("ocs", lambda rs: OptimalClientSamplingSelector(random_state=rs), 6),
    ("ocs-max-trained", lambda rs: OptimalClientSamplingSelector(max_trained=10, random_state=rs), 4),
    ("ocs-small", lambda rs: OptimalClientSamplingSelector(random_state=rs), 1),
    ("clustered-size", lambda rs: ClusteredSamplingSelector(random_state=rs), 6),
    ("clustered-similarity", lambda rs: ClusteredSamplingSelector(method="similarity", random_state=rs), 6),
    (
        "clustered-similarity-knn",
        lambda rs: ClusteredSamplingSelector(method="similarity", similarity="knn", linkage="single", n_neighbors=4,
                                             random_state=rs),
        6,
    ),
    (
        "clustered-similarity-l2-rows",
        lambda rs: ClusteredSamplingSelector(method="similarity", distance="l2", linkage_input="rows", random_state=rs),
        5,
    ),
]


def aggregates(selector: BaseSelector, pool: ClientPool, oracle: FixedUpdatesOracle, n: int, draws: int) -> np.ndarray:
    """``sum_k w_k U_k`` of ``draws`` successive selections (rows)."""
    selector.fit(pool)
    out = np.empty((draws, oracle.updates.shape[1]))
    U = oracle.updates.astype(np.float64)
    for t in range(draws):
        oracle.round = t
        raw = selector.select(n, round=t, oracle=oracle)
        assert isinstance(raw, Selection) and raw.weights is not None, "an unbiased selector must return weights"
        sel = raw.validated(pool.n_clients, n, variable_size=bool(selector.variable_size))
        out[t] = sel.weights @ U[sel.clients]
        if selector.needs or type(selector)._update is not BaseSelector._update:
            selector.update(
                RoundFeedback(
                    round=t,
                    clients=sel.clients,
                    weights=sel.weights,
                    losses=oracle.losses(sel.clients),
                    n_samples=pool.n_samples[sel.clients],
                    updates=oracle.updates[sel.clients] if "updates" in selector.needs else None,
                )
            )
    return out


def assert_unbiased(agg: np.ndarray, target: np.ndarray, n_se: float = 4.0) -> None:
    mean = agg.mean(0)
    se = agg.std(0, ddof=1) / np.sqrt(agg.shape[0])
    z = np.abs(mean - target) / np.maximum(se, 1e-12)
    assert np.all(z <= n_se), f"mean aggregate is {z.max():.1f} standard errors from full participation: z={z.round(2)}"


@pytest.mark.parametrize("factory, n", [pytest.param(f, n, id=i) for i, f, n in UNBIASED_SELECTORS])
def test_unbiased(factory: Callable[[int], BaseSelector], n: int) -> None:
    pool, oracle = make_problem(0)
    agg = aggregates(factory(0), pool, oracle, n, N_DRAWS)
    target = pool.weights @ oracle.updates.astype(np.float64)
    assert_unbiased(agg, target)


def make_outlier_problem() -> tuple[ClientPool, FixedUpdatesOracle]:
    """``make_problem`` plus one far outlier with 7 % of the data: k-means isolates it (S_h = 0)."""
    pool, oracle = make_problem(0)
    rng = np.random.default_rng(1)
    outlier = 12.0 * rng.normal(size=(1, DIM))
    updates = np.vstack([oracle.updates, outlier])
    sizes = np.append(pool.n_samples, int(0.075 * pool.n_samples.sum()))
    return ClientPool(sizes), FixedUpdatesOracle(updates, oracle.global_parameters(), np.ones(N_CLIENTS + 1))


def test_hcsfed_skips_a_singleton_cluster_as_eq5_says_and_uniform_mix_restores_unbiasedness():
    pool, oracle = make_outlier_problem()
    target = pool.weights @ oracle.updates.astype(np.float64)
    outlier = N_CLIENTS

    # 10 k-means runs per round (kmeans_n_init; the default is Algorithm 1's single run) isolate the outlier reliably.
    paper = HCSFedSelector(n_clusters=5, compression_rate=0.5, kmeans_n_init=10, random_state=0).fit(pool)
    alone = 0
    for t in range(40):
        chosen = paper.select(6, round=t, oracle=oracle).clients
        if paper.labels_[outlier] not in paper.labels_[:outlier]:  # k-means isolated it: S_h = 0
            alone += 1
            assert outlier not in chosen and paper.inclusion_[outlier] == 0.0
    assert alone >= 20  # k-means (10 random starts) isolates the outlier in most rounds
    agg = aggregates(HCSFedSelector(n_clusters=5, compression_rate=0.5, kmeans_n_init=10, random_state=0), pool, oracle,
                     6, 1000)
    with pytest.raises(AssertionError, match="standard errors"):
        assert_unbiased(agg, target)

    mixed = HCSFedSelector(n_clusters=5, compression_rate=0.5, uniform_mix=0.2, kmeans_n_init=10, random_state=0)
    agg = aggregates(mixed, pool, oracle, 6, N_DRAWS)
    assert mixed.inclusion_[outlier] > 0
    assert int(mixed.allocation_.sum()) == 6
    assert_unbiased(agg, target)


class _TopNorm(BaseSelector):
    """A deliberately biased selector: the n largest updates, weights p_k N / n."""

    def __init__(self, *, random_state: Any = None) -> None:
        self.random_state = random_state

    def _fit(self, pool: ClientPool) -> None:
        pass

    def _select(self, n: int, *, round: int, oracle: ClientOracle) -> Selection:
        norms = np.linalg.norm(oracle.local_updates(np.arange(self.n_clients_)), axis=1)
        chosen = np.argsort(-norms)[:n]
        return Selection(chosen, self.weights_[chosen] * self.n_clients_ / n)


@pytest.mark.parametrize("scheme", ["ocs", "hcsfed"])
def test_max_trained_without_the_n_over_m_factor_is_biased(scheme, monkeypatch) -> None:
    """The N / M factor of max_trained is what keeps the two-stage aggregate unbiased: drop it and the harness fails."""
    pool, oracle = make_problem(0)
    if scheme == "ocs":
        selector = OptimalClientSamplingSelector(max_trained=10, random_state=0)
    else:
        selector = HCSFedSelector(n_clusters=3, compression_rate=0.5, uniform_mix=0.2, max_trained=12, random_state=0)
    original = type(selector)._select_subset

    def without_factor(self, n, M, **kw):
        sel = original(self, n, M, **kw)
        return Selection(sel.clients, sel.weights * M / self.n_clients_)

    monkeypatch.setattr(type(selector), "_select_subset", without_factor)
    agg = aggregates(selector, pool, oracle, 4, 1000)
    with pytest.raises(AssertionError, match="standard errors"):
        assert_unbiased(agg, pool.weights @ oracle.updates.astype(np.float64))


def test_harness_catches_bias() -> None:
    pool, oracle = make_problem(0)
    agg = aggregates(_TopNorm(), pool, oracle, 6, 200)
    agg = agg + np.random.default_rng(0).normal(scale=1e-3, size=agg.shape)  # a deterministic selector has se = 0
    with pytest.raises(AssertionError, match="standard errors"):
        assert_unbiased(agg, pool.weights @ oracle.updates.astype(np.float64))
