from __future__ import annotations

import numpy as np
import pytest

from fedselect.plugins import get_selector
from fedselect.selection import ClientOracle, ClientPool, RoundFeedback
from fedselect.selectors.ldcs import LargestDistanceSelector
from fedselect.testing import SyntheticOracle, check_selector


class FakeOracle(ClientOracle):
    """Answers global_parameters() with a fixed model and local_updates() from a table; records calls."""

    def __init__(self, global_model, updates=None):
        self.n_clients = 0 if updates is None else len(updates)
        self.round = 0
        self.g = np.asarray(global_model, dtype=np.float32)
        self.table = None if updates is None else np.asarray(updates, dtype=np.float32)
        self.calls = []

    def losses(self, ids):
        raise AssertionError("LDCS must not ask for losses")

    def trial(self, ids):
        raise AssertionError("LDCS must not ask for trials")

    def local_updates(self, ids, transform=None):
        self.calls.append(("local_updates", list(ids)))
        return self.table[np.asarray(ids)]

    def global_parameters(self):
        self.calls.append(("global_parameters", ()))
        return self.g.copy()


def _feedback(round, clients, global_before, local_models):
    clients = np.asarray(clients)
    g = np.asarray(global_before, dtype=np.float32)
    local = np.asarray(local_models, dtype=np.float32)
    return RoundFeedback(
        round=round,
        clients=clients,
        weights=np.full(clients.size, 1.0 / clients.size),
        losses=np.ones(clients.size),
        n_samples=np.full(clients.size, 10),
        updates=local - g,
        global_before=g,
        global_after=g,
    )


@pytest.mark.parametrize("initial", ["all", "probe"])
def test_conformance(initial):
    check_selector(LargestDistanceSelector(initial=initial))


def test_registered_with_aliases():
    for name in ("ldcs", "fedldcs", "largest-distance"):
        assert isinstance(get_selector(name), LargestDistanceSelector)


def test_round_zero_takes_everyone_then_exactly_k():
    sel = LargestDistanceSelector(random_state=0).fit(ClientPool([5] * 8))
    assert sel.variable_size and not LargestDistanceSelector(initial="probe").variable_size
    oracle = SyntheticOracle(8, random_state=0)
    first = sel.select(3, round=0, oracle=oracle)
    np.testing.assert_array_equal(first.clients, np.arange(8))
    assert first.weights is None and not oracle.calls  # nothing asked, nothing paid
    fb = oracle.run_round(first.validated(8, 3, variable_size=True), needs=sel.needs)
    sel.update(fb)
    assert sel.known_.all() and (sel.last_trained_ == 0).all()
    for t in range(1, 6):
        s = sel.select(3, round=t, oracle=oracle)
        assert len(s) == 3 and np.unique(s.clients).size == 3
        sel.update(oracle.run_round(s.validated(8, 3), needs=sel.needs))


def test_picks_exactly_the_farthest_over_all_parameters():
    # Six clients, D = 6 seen as two "tensors" of 3. The distance is decided by the second tensor for some
    # clients, so a first-tensor-only distance (the public fork's bug) would choose differently.
    g = np.zeros(6, dtype=np.float32)
    local = np.array(
        [
            [1.0, 0, 0, 0, 0, 0],  # distance 1
            [0, 0, 0, 0, 0, 5.0],  # 5 (all in the second tensor)
            [2.0, 0, 0, 0, 0, 0],  # 2
            [0, 0, 0, 3.0, 4.0, 0],  # sqrt(9 + 16) = 5, across both tensors
            [0.5, 0, 0, 0, 0, 0],  # 0.5
            [3.0, 0, 0, 0, 0, 3.0],  # sqrt(18) = 4.24
        ],
        dtype=np.float32,
    )
    sel = LargestDistanceSelector(random_state=0).fit(ClientPool([10] * 6))
    sel.select(3, round=0, oracle=FakeOracle(g))
    sel.update(_feedback(0, np.arange(6), g, local))
    np.testing.assert_allclose(sel.distances(g), [1, 5, 2, 5, 0.5, np.sqrt(18)], rtol=1e-6)
    oracle = FakeOracle(g)
    chosen = sel.select(3, round=1, oracle=oracle)
    np.testing.assert_array_equal(chosen.clients, [1, 3, 5])
    assert oracle.calls == [("global_parameters", ())]
    # Against another global model the ranking follows the new distances.
    g2 = np.array([2.0, 0, 0, 0, 0, 0], dtype=np.float32)
    chosen = sel.select(2, round=2, oracle=FakeOracle(g2))
    d2 = np.linalg.norm(local - g2, axis=1)
    np.testing.assert_array_equal(np.sort(chosen.clients), np.sort(np.argsort(-d2)[:2]))


def test_stored_models_are_replaced_after_each_round():
    g0 = np.zeros(4, dtype=np.float32)
    local0 = np.arange(12, dtype=np.float32).reshape(3, 4)
    sel = LargestDistanceSelector().fit(ClientPool([1, 2, 3]))
    sel.select(1, round=0, oracle=FakeOracle(g0))
    sel.update(_feedback(0, [0, 1, 2], g0, local0))
    np.testing.assert_array_equal(sel.models_, local0)
    g1 = np.full(4, 0.5, dtype=np.float32)
    new = np.array([[9.0, 9, 9, 9]], dtype=np.float32)
    sel.update(_feedback(1, [1], g1, new))
    np.testing.assert_allclose(sel.models_[1], new[0])  # global_before + update
    np.testing.assert_array_equal(sel.models_[[0, 2]], local0[[0, 2]])
    assert sel.last_trained_.tolist() == [0, 1, 0]
    assert sel.models_.dtype == np.float32 and sel.models_.shape == (3, 4)


def test_unseen_clients_count_as_infinitely_far():
    g = np.zeros(3, dtype=np.float32)
    sel = LargestDistanceSelector(random_state=0).fit(ClientPool([1] * 5))
    sel.select(2, round=0, oracle=FakeOracle(g))
    # Clients 1 and 3 failed to report in round 0.
    sel.update(_feedback(0, [0, 2, 4], g, np.full((3, 3), 100.0)))
    chosen = sel.select(2, round=1, oracle=FakeOracle(g))
    np.testing.assert_array_equal(chosen.clients, [1, 3])
    assert np.isinf(sel.last_distances_[[1, 3]]).all()


def test_ties_are_broken_by_the_random_state():
    g = np.zeros(2, dtype=np.float32)

    def chosen(seed):
        sel = LargestDistanceSelector(random_state=seed).fit(ClientPool([1] * 10))
        sel.select(1, round=0, oracle=FakeOracle(g))
        sel.update(_feedback(0, np.arange(10), g, np.ones((10, 2))))  # every client at the same distance
        return tuple(sel.select(3, round=1, oracle=FakeOracle(g)).clients)

    assert chosen(0) == chosen(0)
    assert len({chosen(s) for s in range(8)}) > 1


def test_probe_gets_every_local_model_and_picks_exactly_k():
    g = np.ones(3, dtype=np.float32)
    updates = np.array([[0, 0, 1.0], [0, 0, 3.0], [2.0, 0, 0], [0, 0.1, 0]], dtype=np.float32)
    oracle = FakeOracle(g, updates)
    sel = LargestDistanceSelector(initial="probe").fit(ClientPool([3] * 4))
    chosen = sel.select(2, round=0, oracle=oracle)
    np.testing.assert_array_equal(chosen.clients, [1, 2])
    assert ("local_updates", [0, 1, 2, 3]) in oracle.calls
    np.testing.assert_allclose(sel.models_, g + updates)


def test_probe_on_the_synthetic_oracle_trains_each_client_once_in_round_zero():
    sel = LargestDistanceSelector(initial="probe", random_state=0).fit(ClientPool([5] * 6))
    oracle = SyntheticOracle(6, n_samples=[5] * 6, random_state=0)
    s = sel.select(2, round=0, oracle=oracle)
    assert len(s) == 2
    oracle.run_round(s.validated(6, 2), needs=sel.needs)
    assert oracle.costs.local_trainings == 6  # the two chosen ones were not trained again


def test_nan_update_names_the_round():
    g = np.zeros(2, dtype=np.float32)
    sel = LargestDistanceSelector().fit(ClientPool([1, 1]))
    sel.select(1, round=0, oracle=FakeOracle(g))
    with pytest.raises(ValueError, match=r"round 4: .*client\(s\) \[1\].*NaN"):
        sel.update(_feedback(4, [0, 1], g, [[1.0, 1.0], [np.nan, 0.0]]))


def test_feedback_without_updates_is_an_error():
    sel = LargestDistanceSelector().fit(ClientPool([1, 1]))
    fb = RoundFeedback(round=0, clients=np.array([0]), weights=np.ones(1), losses=np.ones(1), n_samples=np.ones(1))
    with pytest.raises(ValueError, match="needs"):
        sel.update(fb)


def test_parameter_and_size_errors():
    with pytest.raises(ValueError, match=r"LargestDistanceSelector: parameter initial='first' is invalid"):
        LargestDistanceSelector(initial="first").fit(ClientPool([1, 2]))
    sel = LargestDistanceSelector().fit(ClientPool([1, 2]))
    with pytest.raises(ValueError, match=r"n=3"):
        sel.select(3, round=0, oracle=FakeOracle(np.zeros(1)))


def test_trainer_round_zero_and_memory():
    from fedselect import FederatedTrainer
    from fedselect.data import make_federation

    fed = make_federation("digits", partition="dirichlet", alpha=0.6, n_clients=6, random_state=0)
    tr = FederatedTrainer(selector="ldcs", clients_per_round=3, rounds=4, model="logistic", random_state=0).fit(fed)
    sizes = [len(r.clients) for r in tr.history_.rounds]
    assert sizes == [6, 3, 3, 3]
    sel = tr.selector_
    assert sel.models_.shape == (6, tr.history_.model_size) and sel.models_.dtype == np.float32


def test_probe_round_does_not_choose_clients_that_did_not_answer():
    for seed in range(20):
        oracle = SyntheticOracle(20, client_dropout=0.3, random_state=seed)
        sel = LargestDistanceSelector(initial="probe", random_state=seed).fit(ClientPool(oracle.n_samples))
        chosen = sel.select(5, round=0, oracle=oracle)
        failed = oracle.ledger.failed
        assert len(failed) <= 15  # at least n answered
        assert not set(chosen.clients.tolist()) & failed


def _trajectory_models(n_clients=300, dim=400, seed=0):
    """Local models near a shared trajectory: weights of size ~1, each client a little away from the global."""
    rng = np.random.default_rng(seed)
    g = rng.normal(size=dim).astype(np.float32)
    local = g + rng.normal(scale=rng.uniform(0.01, 0.2, size=(n_clients, 1)), size=(n_clients, dim)).astype(np.float32)
    g_next = g + rng.normal(scale=0.02, size=dim).astype(np.float32)
    return g, local, g_next


@pytest.mark.parametrize("storage, rtol, kept", [("float16", 2e-3, 19), ("sketch", 0.25, 10)])
def test_bounded_storage_keeps_distances_and_finds_the_farthest(storage, rtol, kept):
    """float16 differences and sketches store less, and still rank the farthest clients first."""
    g, local, g_next = _trajectory_models()
    exact = LargestDistanceSelector(random_state=0).fit(ClientPool([10] * 300))
    small = LargestDistanceSelector(storage=storage, sketch_dim=128, random_state=0).fit(ClientPool([10] * 300))
    for sel in (exact, small):
        sel.select(20, round=0, oracle=FakeOracle(g))
        sel.update(_feedback(0, np.arange(300), g, local))
    d_exact, d_small = exact.distances(g_next), small.distances(g_next)
    np.testing.assert_allclose(d_small, d_exact, rtol=rtol)
    top_exact = set(exact.select(20, round=1, oracle=FakeOracle(g_next)).clients.tolist())
    top_small = set(small.select(20, round=1, oracle=FakeOracle(g_next)).clients.tolist())
    assert len(top_exact & top_small) >= kept
    assert d_exact[sorted(top_small)].min() >= np.quantile(d_exact, 0.8)  # every pick is among the farthest fifth
    assert small.models_.nbytes <= exact.models_.nbytes / (2 if storage == "float16" else 3)
    if storage == "float16":
        assert small.models_.dtype == np.float16 and small.reference_.shape == (400,)
        # what is stored is the difference from the reference, so it is far more precise than the model in float16
        naive = np.linalg.norm(local.astype(np.float16).astype(np.float64) - g_next, axis=1)
        assert np.abs(d_small - d_exact).mean() < np.abs(naive - d_exact).mean() / 4
    else:
        assert small.models_.shape == (300, 128) and small.projection_.shape == (128, 400)


def test_sketch_is_seeded_and_default_stream_unchanged():
    g, local, g_next = _trajectory_models(n_clients=50, dim=200)

    def run(**params):
        sel = LargestDistanceSelector(random_state=3, **params).fit(ClientPool([10] * 50))
        sel.select(5, round=0, oracle=FakeOracle(g))
        sel.update(_feedback(0, np.arange(50), g, local))
        return sel, sel.select(5, round=1, oracle=FakeOracle(g_next)).clients

    a, ca = run(storage="sketch", sketch_dim=64)
    b, cb = run(storage="sketch", sketch_dim=64)
    assert (a.projection_ != b.projection_).nnz == 0 and np.array_equal(ca, cb)
    with pytest.raises(ValueError, match=r"LargestDistanceSelector: parameter sketch_dim=200 is not below"):
        run(storage="sketch", sketch_dim=200)
    with pytest.raises(ValueError, match=r"LargestDistanceSelector: parameter storage='int8' is invalid"):
        run(storage="int8")
    with pytest.raises(ValueError, match=r"LargestDistanceSelector: parameter sketch_dim=0 is invalid"):
        run(storage="sketch", sketch_dim=0)


def test_float16_refuses_a_model_beyond_its_range():
    g = np.zeros(3, dtype=np.float32)
    sel = LargestDistanceSelector(storage="float16").fit(ClientPool([1, 1]))
    sel.select(1, round=0, oracle=FakeOracle(g))
    sel.update(_feedback(0, [0, 1], g, np.zeros((2, 3))))
    with pytest.raises(ValueError, match=r"round 1: the local model of client\(s\) \[1\] is farther"):
        sel.update(_feedback(1, [1], g, np.array([[1e6, 0, 0]])))


def test_a_selector_pickled_before_storage_existed_resumes_with_float32():
    import pickle

    g, local, g_next = _trajectory_models(n_clients=20, dim=30)
    sel = LargestDistanceSelector(random_state=0).fit(ClientPool([10] * 20))
    sel.select(4, round=0, oracle=FakeOracle(g))
    sel.update(_feedback(0, np.arange(20), g, local))
    for name in ("storage", "sketch_dim", "reference_", "projection_", "_sketch_seed"):
        del sel.__dict__[name]  # what an earlier version pickled
    again = pickle.loads(pickle.dumps(sel))
    assert again.storage == "float32" and again.sketch_dim == 1024
    np.testing.assert_array_equal(again.distances(g_next), np.linalg.norm(local - g_next.astype(np.float64), axis=1)
                                  .astype(np.float64))
