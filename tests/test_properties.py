"""Property-based tests over every registered selector (hypothesis).

For any pool, any n, any oracle answers (NaN included: clients that did not answer) and any
feedback sequence (partial or empty included), a selector returns valid selections with
finite, non-negative weights, and its fitted state survives a pickle round trip and then
continues exactly as the original does.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fedselect import get_selector, list_selectors  # noqa: E402
from fedselect.selection import ClientOracle, ClientPool, RoundFeedback  # noqa: E402

D = 4  # model size of the scripted federation
SMALL = {
    "fedcor": {"warmup_rounds": 2, "gp_interval": 2, "rank": 2, "warmup_iters": 3, "gp_iters": 3},
    "hcsfed": {"n_clusters": 2},
}
MIN_CLIENTS = {"fedcor": 3, "hcsfed": 2}

maybe_nan = st.one_of(st.just(float("nan")), st.floats(0.0, 50.0))
change = st.one_of(st.just(float("nan")), st.floats(-5.0, 5.0))


class Script:
    """Answers drawn by hypothesis, recorded so a second selector can be given exactly the same ones."""

    def __init__(self, data):
        self.data = data
        self.tape = []
        self.replay = None

    def draw(self, strategy):
        if self.replay is not None:
            return self.replay.pop(0)
        value = self.data.draw(strategy)
        self.tape.append(value)
        return value


class ScriptedOracle(ClientOracle):
    def __init__(self, n_clients, script, round):
        self.n_clients, self.script, self.round = n_clients, script, round

    def losses(self, ids):
        ids = np.atleast_1d(np.asarray(ids))
        return np.array(self.script.draw(st.lists(maybe_nan, min_size=ids.size, max_size=ids.size)), dtype=float)

    def trial(self, ids):
        n = self.n_clients
        return np.array(self.script.draw(st.lists(change, min_size=n, max_size=n)), dtype=float)

    def local_updates(self, ids, transform=None):
        ids = np.atleast_1d(np.asarray(ids))
        missing = self.script.draw(st.lists(st.booleans(), min_size=ids.size, max_size=ids.size))
        seed = self.script.draw(st.integers(0, 2**16))
        rows = np.random.default_rng(seed).normal(size=(ids.size, D)).astype(np.float32)
        if transform is not None:
            out = [np.asarray(transform(r), dtype=np.float32).ravel() for r in rows]
            rows = np.stack(out) if out else np.zeros((0, 1), np.float32)
        rows[np.asarray(missing, dtype=bool)] = np.nan
        return rows

    def global_parameters(self):
        return np.zeros(D, dtype=np.float32)


def _feedback(script, t, sel, needs):
    """Partial feedback: any subset of the chosen clients reports (possibly none)."""
    ids = sel.clients
    keep = np.asarray(script.draw(st.lists(st.booleans(), min_size=ids.size, max_size=ids.size)), dtype=bool)
    rep = ids[keep]
    seed = script.draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    w = sel.weights[keep] if sel.weights is not None else np.full(rep.size, 1.0 / max(rep.size, 1))
    return RoundFeedback(
        round=t, clients=rep, weights=w, losses=rng.uniform(0, 5, rep.size), n_samples=np.full(rep.size, 10),
        updates=rng.normal(size=(rep.size, D)).astype(np.float32) if "updates" in needs else None,
        global_before=np.zeros(D, np.float32) if "global" in needs else None,
        global_after=np.zeros(D, np.float32) if "global" in needs else None,
    )


def _step(selector, pool, n, t, script):
    raw = selector.select(n, round=t, oracle=ScriptedOracle(pool.n_clients, script, t))
    sel = raw.validated(pool.n_clients, n, variable_size=bool(selector.variable_size), source=type(selector).__name__)
    if sel.weights is not None:
        assert np.all(np.isfinite(sel.weights)) and np.all(sel.weights >= 0), sel.weights
    selector.update(_feedback(script, t, sel, selector.needs))
    return sel.clients.tolist(), None if sel.weights is None else sel.weights.tolist()


@pytest.mark.parametrize("name", list_selectors())
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_any_answers_and_feedback_give_valid_selections_and_state_pickles(name, data):
    n_clients = data.draw(st.integers(MIN_CLIENTS.get(name, 1), 9), label="N")
    sizes = data.draw(st.lists(st.integers(1, 500), min_size=n_clients, max_size=n_clients), label="n_k")
    n = data.draw(st.integers(1, n_clients), label="n")
    rounds = data.draw(st.integers(1, 6), label="rounds")
    cut = data.draw(st.integers(0, rounds), label="pickle after round")
    pool = ClientPool(sizes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        selector = get_selector(name, random_state=0, **SMALL.get(name, {})).fit(pool)
    script = Script(data)
    for t in range(cut):
        _step(selector, pool, n, t, script)
    twin = pickle.loads(pickle.dumps(selector))
    script.tape = []
    ours = [_step(selector, pool, n, t, script) for t in range(cut, rounds)]
    replay = Script(data)
    replay.replay = list(script.tape)
    theirs = [_step(twin, pool, n, t, replay) for t in range(cut, rounds)]
    assert ours == theirs
