"""Tests of the DivFL plugin: conformance, the greedy itself, and discovery through its entry point.

This file is the template for testing a fedselect plugin: run ``fedselect.testing.check_selector``
on every configuration, test the scheme's own behaviour on a case small enough to check by hand,
and check that fedselect finds the plugin through real entry-point metadata.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
from fedselect_divfl import PRESETS, DivFLSelector, facility_location_greedy, pairwise_distances, power_law_partition

import fedselect
from fedselect import ClientPool, RoundFeedback, _registry
from fedselect import plugins as fs_plugins
from fedselect.testing import SyntheticOracle, check_selector

SRC = Path(__file__).resolve().parents[1] / "src"
PLUGIN_NAME = "divfl (fedselect-divfl)"  # how fedselect names an entry-point plugin: "<ep name> (<dist name>)"


# -- conformance ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "params",
    [
        {},
        {"projection_dim": 8},
        {"source": "probe"},
        {"source": "probe", "projection_dim": 8},
        {"source": "probe-once"},
    ],
    ids=["stale", "stale-projected", "probe", "probe-projected", "probe-once"],
)
def test_conforms(params):
    check_selector(DivFLSelector(**params), n_rounds=8)


def test_needs_follow_the_source():
    assert DivFLSelector().needs == frozenset({"updates"})
    assert DivFLSelector(source="probe").needs == frozenset()
    assert DivFLSelector(source="probe-once").needs == frozenset({"updates"})


@pytest.mark.parametrize(
    "params, match",
    [
        ({"source": "fresh"}, r"DivFLSelector: parameter source='fresh' is invalid; expected one of"),
        ({"projection_dim": 0}, r"parameter projection_dim=0 is invalid; expected None or an int in \[1, inf\)"),
        ({"projection_dim": 2.5}, r"parameter projection_dim=2.5"),
        ({"random_state": "x"}, r"parameter random_state='x'"),
    ],
)
def test_bad_parameters_are_named(params, match):
    with pytest.raises(ValueError, match=match):
        DivFLSelector(**params).fit(ClientPool([10] * 4))


# -- the greedy -----------------------------------------------------------------------------
def _clustered_updates(sizes=(4, 3, 2, 1), dim=6, seed=0):
    """Clusters of identical updates, far apart; returns the updates and each client's cluster."""
    rng = np.random.default_rng(seed)
    centres = 10.0 * rng.normal(size=(len(sizes), dim))
    labels = np.repeat(np.arange(len(sizes)), sizes)
    perm = rng.permutation(labels.size)  # interleave the clusters over the ids
    return centres[labels[perm]].astype(np.float32), labels[perm]


def test_greedy_picks_one_client_per_cluster_of_identical_updates():
    updates, labels = _clustered_updates()
    picks = facility_location_greedy(pairwise_distances(updates, updates), 4)
    assert sorted(labels[picks].tolist()) == [0, 1, 2, 3]
    # The first pick covers the most: a member of the largest cluster (or the most central one).
    fewer = facility_location_greedy(pairwise_distances(updates, updates), 2)
    assert len(set(labels[fewer].tolist())) == 2


def test_greedy_is_the_brute_force_optimum_on_a_tiny_case():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(7, 3))
    d = pairwise_distances(x, x)
    picks = facility_location_greedy(d, 1)
    assert d[:, picks[0]].sum() == pytest.approx(d.sum(axis=0).min())  # the first step is exact


def _objective(d, subset):
    """G(S) = sum_k min_{j in S} d(k, j), by a plain loop."""
    return sum(min(d[k, j] for j in subset) for k in range(d.shape[0]))


@pytest.mark.parametrize("seed", range(5))
def test_greedy_steps_and_guarantee_against_brute_force(seed):
    """For n = 1..5 of 8 clients: each step adds the client that lowers G the most (every candidate tried by
    hand), and the result is within the greedy guarantee of the best subset found by enumerating all of them:
    with f(S) = sum_k (C - min_{j in S} d(k, j)), C = max d (so f of the empty set is 0), f(greedy) >=
    (1 - 1/e) f(best) (Nemhauser, Wolsey and Fisher, 1978)."""
    from itertools import combinations

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(8, 3))
    d = pairwise_distances(x, x)
    C = d.max()
    for n in range(1, 6):
        picks = facility_location_greedy(d, n).tolist()
        chosen: list[int] = []
        for step in range(n):
            gains = {j: _objective(d, [*chosen, j]) for j in range(8) if j not in chosen}
            assert picks[step] == min(gains, key=gains.get), (n, step)
            chosen.append(picks[step])
        best = min(_objective(d, list(s)) for s in combinations(range(8), n))
        f_greedy, f_best = 8 * C - _objective(d, picks), 8 * C - best
        assert f_greedy >= (1 - 1 / np.e) * f_best - 1e-9
        assert _objective(d, picks) >= best - 1e-9
        if n == 1:
            assert _objective(d, picks) == pytest.approx(best)  # the first step is exact


def _feedback(round, clients, updates):
    clients = np.asarray(clients)
    k = clients.size
    return RoundFeedback(round, clients, np.full(k, 1.0 / k), np.ones(k), np.full(k, 10), updates=updates)


@pytest.mark.parametrize("projection_dim", [None, 4])
def test_stale_source_picks_one_per_cluster_once_everyone_reported(projection_dim):
    updates, labels = _clustered_updates()
    n_clients = labels.size
    sel = DivFLSelector(projection_dim=projection_dim, random_state=0).fit(ClientPool([20] * n_clients))
    oracle = SyntheticOracle(n_clients, random_state=0)  # not asked anything by the stale source
    sel.update(_feedback(0, np.arange(n_clients), updates))
    for t in range(1, 6):
        chosen = sel.select(4, round=t, oracle=oracle).clients
        assert sorted(labels[chosen].tolist()) == [0, 1, 2, 3], f"round {t}: {chosen}"
        assert sel.last_objective_ == pytest.approx(0.0, abs=1e-3)  # every cluster covered exactly
    assert oracle.calls == []


def test_stale_source_takes_unseen_clients_first_at_random():
    sel = DivFLSelector(random_state=0).fit(ClientPool([20] * 10))
    oracle = SyntheticOracle(10, random_state=0)
    first = set(sel.select(4, round=0, oracle=oracle).clients.tolist())
    sel.update(_feedback(0, sorted(first), np.ones((4, 3), dtype=np.float32)))
    second = set(sel.select(4, round=1, oracle=oracle).clients.tolist())
    assert not first & second  # still 6 unseen clients: all 4 picks are new
    sel.update(_feedback(1, sorted(second), np.ones((4, 3), dtype=np.float32)))
    third = set(sel.select(4, round=2, oracle=oracle).clients.tolist())
    assert (set(range(10)) - first - second) <= third  # the last 2 unseen are taken, 2 more chosen greedily
    assert oracle.calls == []


def test_stale_source_needs_the_updates():
    sel = DivFLSelector().fit(ClientPool([20] * 4))
    with pytest.raises(ValueError, match=r"lacks the updates; the runtime must honour needs=\{'updates'\}"):
        sel.update(_feedback(0, [0, 1], None))


def test_probe_source_asks_everyone_and_picks_one_per_group():
    oracle = SyntheticOracle(12, n_groups=4, random_state=0)
    sel = DivFLSelector(source="probe", random_state=0).fit(ClientPool(oracle.n_samples))
    chosen = sel.select(4, round=0, oracle=oracle).clients
    assert sorted(oracle.groups[chosen].tolist()) == [0, 1, 2, 3]
    assert oracle.calls == [("local_updates", tuple(range(12)))]
    assert oracle.costs.models_up == 12 and oracle.costs.floats_up == 0


def test_probe_once_asks_everyone_at_the_first_round_then_goes_stale():
    """The official code: every client's update at round 0, then only the chosen clients' (stale)."""
    oracle = SyntheticOracle(12, n_groups=4, random_state=0)
    sel = DivFLSelector(source="probe-once", random_state=0).fit(ClientPool(oracle.n_samples))
    chosen = sel.select(4, round=0, oracle=oracle)
    assert sorted(oracle.groups[chosen.clients].tolist()) == [0, 1, 2, 3]  # greedy over all 12 at once
    assert oracle.calls == [("local_updates", tuple(range(12)))]
    assert sel.seen_.all() and sel.last_objective_ is not None
    probed = sel.representations_.copy()
    sel.update(oracle.run_round(chosen, needs=sel.needs))
    oracle.calls.clear()
    trained_later: set[int] = set()
    for t in range(1, 4):
        chosen = sel.select(4, round=t, oracle=oracle)
        assert oracle.calls == []  # no probe after the first round
        feedback = oracle.run_round(chosen, needs=sel.needs)
        sel.update(feedback)
        np.testing.assert_array_equal(sel.representations_[feedback.clients], np.asarray(feedback.updates))
        trained_later |= set(feedback.clients.tolist())
    stale = np.setdiff1d(np.arange(12), sorted(trained_later))
    assert stale.size > 0
    np.testing.assert_array_equal(sel.representations_[stale], probed[stale])  # still round 0's probe
    # a refit starts over: the next first round probes again
    sel.fit(ClientPool(oracle.n_samples))
    oracle.calls.clear()
    sel.select(4, round=0, oracle=oracle)
    assert [c[0] for c in oracle.calls] == ["local_updates"]


def test_probe_projection_is_applied_client_side():
    oracle = SyntheticOracle(12, n_groups=4, dim=20, random_state=0)
    sel = DivFLSelector(source="probe", projection_dim=5, random_state=0).fit(ClientPool(oracle.n_samples))
    chosen = sel.select(4, round=0, oracle=oracle).clients
    assert sorted(oracle.groups[chosen].tolist()) == [0, 1, 2, 3]
    assert oracle.costs.models_up == 0 and oracle.costs.floats_up == 12 * 5
    assert sel.representations_.shape == (12, 5)


# -- discovery through a real entry point -----------------------------------------------------
def write_dist_info(where: Path) -> Path:
    """Metadata as ``pip install`` would leave it: importlib.metadata finds it on sys.path."""
    info = where / "fedselect_divfl-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fedselect-divfl\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fedselect]\ndivfl = fedselect_divfl\n")
    return info


def test_found_through_its_entry_point(tmp_path, monkeypatch):
    write_dist_info(tmp_path)
    monkeypatch.syspath_prepend(str(SRC))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.delenv("FEDSELECT_PLUGINS", raising=False)
    monkeypatch.setattr(_registry, "_loaded", False)  # load the entry points again, now with ours
    already = fs_plugins.pm.get_plugin(PLUGIN_NAME) is not None  # e.g. the plugin is pip-installed
    try:
        assert "divfl" in fedselect.list_selectors()
        assert fs_plugins.registry("selectors")["divfl"].plugin == PLUGIN_NAME
        selector = fedselect.get_selector("divfl", projection_dim=16, random_state=0)
        assert type(selector).__name__ == "DivFLSelector" and selector.projection_dim == 16
        fed = fedselect.make_federation("digits", partition="shards", n_clients=10, random_state=0)
        trainer = fedselect.FederatedTrainer(
            selector="divfl", model="logistic", clients_per_round=3, rounds=3, local_steps=2, random_state=0
        ).fit(fed)
        rounds = trainer.history_.rounds
        assert len(rounds) == 3
        assert all(len(r.clients) == 3 for r in rounds)
        # Stale source: the first rounds take clients never seen, so no client repeats over 3 x 3 of 10.
        assert len({c for r in rounds for c in np.asarray(r.clients).tolist()}) == 9
        # The paper's setting arrives through the same entry point: the partition and the presets.
        assert fs_plugins.registry("partitions")["power-law"].plugin == PLUGIN_NAME
        assert {"divfl-synthetic", "divfl-mnist"} <= set(fs_plugins.list_presets())
    finally:
        if not already and fs_plugins.pm.get_plugin(PLUGIN_NAME) is not None:
            fs_plugins.pm.unregister(name=PLUGIN_NAME)


# -- the paper's setting: the partition and the presets ----------------------------------------
def test_power_law_partition_gives_each_client_consecutive_labels_in_heavy_tailed_amounts():
    y = np.repeat(np.arange(10), 600)
    parts = power_law_partition(y, 100, random_state=0)
    for k, p in enumerate(parts):  # client k holds labels k and k + 1 (mod 10), at least 5 of each
        counts = np.bincount(y[p], minlength=10)
        assert set(np.flatnonzero(counts)) == {k % 10, (k + 1) % 10} and counts[counts > 0].min() >= 5
    flat = np.concatenate(parts)
    assert np.unique(flat).size == flat.size == y.size  # disjoint, and every sample given out
    sizes = np.sort([p.size for p in parts])
    assert sizes[-10:].sum() > 0.4 * y.size  # heavy tail: the largest 10 % hold a large share
    again = power_law_partition(y, 100, random_state=0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_power_law_partition_with_sigma_0_shares_each_label_equally():
    y = np.repeat(np.arange(4), 40)
    sizes = [p.size for p in power_law_partition(y, 4, sigma=0.0, random_state=0)]
    assert sizes == [40, 40, 40, 40]  # two labels each, 20 of each
    # 31 samples of each label over its two holders: 16 and 15, the extra one by largest remainder (a tie: the
    # lower client id), not left to whichever holder comes last
    y = np.repeat(np.arange(3), 31)
    assert [p.size for p in power_law_partition(y, 3, sigma=0.0, random_state=0)] == [32, 31, 30]


@pytest.mark.parametrize(
    "params, match",
    [
        ({"labels_per_client": 0}, "labels_per_client must be an integer >= 1"),
        ({"labels_per_client": 11}, "more than the 10 labels"),
        ({"sigma": -1.0}, "sigma must be a finite number >= 0"),
        ({"sigma": float("nan")}, "sigma must be a finite number >= 0"),
        ({"min_per_label": 700}, "fewer than min_per_label=700"),
        ({"min_per_label": 1.5}, "min_per_label must be an integer >= 0"),
    ],
)
def test_power_law_partition_refuses_bad_parameters(params, match):
    with pytest.raises(ValueError, match=match):
        power_law_partition(np.repeat(np.arange(10), 600), 20, random_state=0, **params)


def test_the_presets_are_valid_and_name_the_plugins_scheme_and_partition():
    from fedselect.presets import check_preset

    assert [p.name for p in PRESETS] == ["divfl-synthetic", "divfl-mnist"]
    for preset in PRESETS:
        check_preset(preset)
        assert ("divfl", {}) in preset.selectors.values()
    assert PRESETS[1].federation["partition"] == "power-law"
