"""The contracts: ClientPool, Selection, RoundFeedback and BaseSelector's own checks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError

from fedselect.selection import BaseSelector, ClientPool, RoundFeedback, Selection, SelectionError
from fedselect.testing import SyntheticOracle


# -- ClientPool -------------------------------------------------------------------------------
def test_pool_shape_and_weights():
    pool = ClientPool([10, 30, 60])
    assert pool.n_clients == 3
    np.testing.assert_allclose(pool.weights, [0.1, 0.3, 0.6])
    assert pool.n_samples.dtype == np.int64
    assert "n_clients=3" in repr(pool)


def test_pool_names_a_client_without_data():
    with pytest.raises(ValueError, match=r"client 2 has no data \(n_samples=0\)"):
        ClientPool([5, 4, 0, 3])
    with pytest.raises(ValueError, match=r"client 0 has no data \(n_samples=-1\).*2 client"):
        ClientPool([-1, 4, 0])


@pytest.mark.parametrize("bad", [[], [[1, 2]], 5])
def test_pool_needs_a_non_empty_1d_array(bad):
    with pytest.raises(ValueError, match="non-empty 1-D"):
        ClientPool(bad)


def test_pool_needs_whole_numbers():
    with pytest.raises(ValueError, match="whole numbers"):
        ClientPool([1.5, 2.0])
    assert ClientPool([1.0, 2.0]).n_samples.tolist() == [1, 2]


def test_pool_is_immutable():
    source = np.array([1, 2, 3])
    pool = ClientPool(source)
    source[0] = 99
    assert pool.n_samples[0] == 1
    with pytest.raises(ValueError):
        pool.n_samples[0] = 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        pool.n_samples = np.array([1])


# -- Selection -------------------------------------------------------------------------------
def test_selection_coerces_ids():
    assert Selection(3).clients.tolist() == [3]
    assert Selection(np.array([1, 2], dtype=np.int32)).clients.dtype == np.int64
    with pytest.raises(ValueError, match="1-D"):
        Selection([[0, 1]])


@pytest.mark.parametrize(
    "ids, match",
    [
        ([0.5], "must be integers, got dtype float64"),
        (np.array([1.0, 2.0]), r"must be integers.*astype\(int\)"),
        ([True, False], "must be integers, got dtype bool"),
        (["a"], "must be integers"),
        ([[0, 1]], "1-D"),
    ],
)
def test_one_rule_for_client_ids(ids, match):
    """Selection, the simulator's oracle, the synthetic oracle and the ledger reject the same ids alike."""
    from fedselect.ledger import RoundLedger
    from fedselect.selection import check_client_ids
    from fedselect.testing import SyntheticOracle

    with pytest.raises(ValueError, match=match):
        check_client_ids(ids, 5)
    with pytest.raises(ValueError, match=match):
        Selection(ids)
    with pytest.raises(ValueError, match=match):
        SyntheticOracle(5, random_state=0).losses(ids)
    with pytest.raises(ValueError, match=match):
        RoundLedger(5, 0).send_model(ids)


def test_client_ids_out_of_range_named():
    from fedselect.selection import check_client_ids

    with pytest.raises(ValueError, match=r"oracle.losses: client id\(s\) \[5, -1\] out of range.*0..4"):
        check_client_ids([0, 5, -1], 5, what="oracle.losses")
    assert check_client_ids([], 5).dtype == np.int64


def test_selection_weights_shape_and_finiteness():
    with pytest.raises(ValueError, match="one entry per client"):
        Selection([0, 1], weights=[1.0])
    with pytest.raises(ValueError, match="finite"):
        Selection([0, 1], weights=[1.0, np.nan])


def test_validated_names_out_of_range_ids():
    with pytest.raises(SelectionError, match=r"MySel returned client id\(s\) \[5, -1\] out of range.*0\.\.4"):
        Selection([0, 5, -1]).validated(5, 3, source="MySel")


def test_validated_empty_and_wrong_count():
    with pytest.raises(SelectionError, match=r"empty selection \(asked for 2"):
        Selection([]).validated(5, 2)
    with pytest.raises(SelectionError, match=r"returned 2 distinct clients but 3 were requested.*variable_size"):
        Selection([0, 1]).validated(5, 3)
    with pytest.raises(SelectionError, match=r"1 duplicate\(s\) merged"):
        Selection([0, 1, 1]).validated(5, 3)
    assert len(Selection([0, 1]).validated(5, 3, variable_size=True)) == 2


def test_validated_merges_duplicates_summing_weights_and_counting():
    merged = Selection([3, 1, 3, 3], weights=[0.5, 1.0, 0.25, 0.25]).validated(5, 2)
    assert merged.clients.tolist() == [1, 3]
    np.testing.assert_allclose(merged.weights, [1.0, 1.0])
    np.testing.assert_array_equal(merged.counts, [1, 3])
    plain = Selection([2, 2, 0]).validated(4, 2)
    assert plain.weights is None
    np.testing.assert_array_equal(plain.counts, [1, 2])


def test_selection_repr():
    assert repr(Selection([1, 2], weights=[0.5, 0.5])) == "Selection(clients=[1, 2], weights=[0.5, 0.5])"


# -- RoundFeedback ---------------------------------------------------------------------------
def _feedback(**overrides):
    fields = dict(
        round=3,
        clients=np.array([0, 2]),
        weights=np.array([0.5, 0.5]),
        losses=np.array([1.0, 2.0]),
        n_samples=np.array([10, 20]),
        updates=np.ones((2, 4), dtype=np.float32),
        global_before=np.zeros(4, dtype=np.float32),
        global_after=np.ones(4, dtype=np.float32),
    )
    fields.update(overrides)
    return RoundFeedback(**fields)


def test_feedback_is_immutable_and_copies_its_inputs():
    losses = np.array([1.0, 2.0])
    fb = _feedback(losses=losses)
    losses[0] = 42.0
    assert fb.losses[0] == 1.0
    for name in ("clients", "weights", "losses", "n_samples", "updates", "global_before", "global_after"):
        with pytest.raises(ValueError, match="read-only"):
            getattr(fb, name)[0] = 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        fb.round = 4


def test_feedback_lengths_must_match():
    with pytest.raises(ValueError, match=r"RoundFeedback.losses has 1 entries for 2 clients"):
        _feedback(losses=np.array([1.0]))
    with pytest.raises(ValueError, match=r"RoundFeedback.updates has 3 rows for 2 clients"):
        _feedback(updates=np.zeros((3, 4)))
    assert _feedback(updates=None, global_before=None, global_after=None).updates is None


# -- BaseSelector ------------------------------------------------------------------------------
class _First(BaseSelector):
    def __init__(self, *, random_state=None):
        self.random_state = random_state

    def _fit(self, pool):
        pass

    def _select(self, n, *, round, oracle):
        return np.arange(n)  # a bare array is wrapped into a Selection


def test_base_selector_guards():
    sel = _First()
    oracle = SyntheticOracle(4)
    with pytest.raises(NotFittedError):
        sel.select(1, round=0, oracle=oracle)
    with pytest.raises(TypeError, match=r"_First.fit expects a ClientPool, got list"):
        sel.fit([1, 2, 3])
    sel.fit(ClientPool([1, 2, 3, 4]))
    assert isinstance(sel.select(2, round=0, oracle=oracle), Selection)
    for n in (0, 5, 2.0, True):
        with pytest.raises(ValueError, match=rf"_First.select: n={n!r} clients requested.*1\.\.4"):
            sel.select(n, round=0, oracle=oracle)
    with pytest.raises(ValueError, match=r"round=-1 must be an integer >= 0"):
        sel.select(1, round=-1, oracle=oracle)


def test_base_selector_learns_the_pool():
    sel = _First().fit(ClientPool([1, 3]))
    assert sel.n_clients_ == 2
    np.testing.assert_allclose(sel.weights_, [0.25, 0.75])


def test_random_state_is_validated():
    with pytest.raises(ValueError, match=r"_First: parameter random_state=1.5 is invalid; expected None, an int"):
        _First(random_state=1.5).fit(ClientPool([1]))


def test_subclass_missing_methods_says_what_to_implement():
    class _Nothing(BaseSelector):
        pass

    with pytest.raises(NotImplementedError, match=r"_Nothing must implement _fit"):
        _Nothing().fit(ClientPool([1]))
