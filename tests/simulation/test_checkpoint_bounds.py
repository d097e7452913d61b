"""A checkpoint's objects cost what their file's size allows (issue 36, item 4).

The attacks: a 262-byte object pickle that calls the allow-listed ``builtins.str`` on a DAG of lists (each level
referencing the one below twice through the memo, so the text doubles with every 8 bytes); a dict keyed by a DAG
of tuples (hashing walks the whole tree; no global needed); and torch layers given a forward hook or a
``forward`` attribute through ``BUILD`` after ``_rebuild_module``, or built by calling the layer class itself.
"""

from __future__ import annotations

import collections
import io
import pickle
import tracemalloc

import pytest
import torch

from fedselect import FederatedTrainer, get_selector
from fedselect._pickle_scan import scan_pickle, tree_budget
from fedselect.simulation import CorruptFileWarning
from fedselect.simulation import checkpoint as ck

from .test_checkpoint import _Stop, _stop_at
from .test_safe_checkpoint import _Call, _rewrite, _selector_member

KW = dict(rounds=6, clients_per_round=3, local_steps=1, random_state=2)


def _list_dag(depth: int) -> list:
    node: list = []
    for _ in range(depth):
        node = [node, node]
    return node


def _tuple_dag_key(depth: int, *, popped: bool = False) -> bytes:
    """``{T: 1}`` with ``T = (T', T')`` ``depth`` levels deep, written opcode by opcode (building it in Python
    would hash it)."""
    levels = b"".join(b"h" + bytes([i]) + b"h" + bytes([i]) + b"\x86\x940" for i in range(depth))
    data = b"\x80\x05}" + b")\x940" + levels + b"h" + bytes([depth]) + b"K\x01s"
    return data + (b"0N." if popped else b".")  # popped: the dict is dropped and None returned


class _Hooked:
    """A Linear rebuilt by ``_rebuild_module``, then given a forward hook by ``BUILD``."""

    def __reduce__(self):
        return ck._rebuild_module, (torch.nn.Linear, {}), {"_forward_hooks": collections.OrderedDict({0: str})}


class _CalledLayer:
    """A Linear made by calling its class (``REDUCE``), then given a forward hook by ``BUILD``."""

    def __reduce__(self):
        return torch.nn.Linear, (2, 2), {"_forward_hooks": collections.OrderedDict({0: str})}


def _load(data: bytes):
    return ck.SafeUnpickler(io.BytesIO(data), {}).load()


def test_the_tuple_dag_fixture_is_what_it_claims():
    assert pickle.loads(_tuple_dag_key(2)) == {(((), ()), ((), ())): 1}
    assert pickle.loads(_tuple_dag_key(2, popped=True)) is None


@pytest.mark.parametrize("depth", [20, 40])
def test_str_over_a_dag_of_lists_is_refused_in_bounded_memory(depth):
    data = pickle.dumps(_Call(str, _list_dag(depth)), protocol=5)
    assert len(data) < 300
    _load(pickle.dumps([1], protocol=5))  # imports and the plugin registry, before measuring
    tracemalloc.start()
    try:
        with pytest.raises(pickle.UnpicklingError, match=r"calls builtins\.str on a container"):
            _load(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20


def test_str_of_an_atom_still_loads():
    assert _load(pickle.dumps(_Call(str, 12), protocol=5)) == "12"


@pytest.mark.parametrize("make", ["list dag", "tuple dag as a dict key", "the same, dict dropped"])
def test_shared_references_expanding_past_the_budget_are_refused(make):
    data = {
        "list dag": lambda: pickle.dumps(_list_dag(40), protocol=5),
        "tuple dag as a dict key": lambda: _tuple_dag_key(40),
        "the same, dict dropped": lambda: _tuple_dag_key(40, popped=True),
    }[make]()
    with pytest.raises(pickle.UnpicklingError, match=r"walk more than 1048576 nodes"):
        _load(data)


def test_shared_references_within_the_budget_load():
    assert _load(pickle.dumps(_list_dag(12), protocol=5)) == _list_dag(12)
    assert tree_budget(10) == 2**20 and tree_budget(2**20) == 2**24


def test_deep_nesting_is_refused_before_a_walk_could_recurse_past_the_limit():
    deep: list = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises(pickle.UnpicklingError, match="nested more than 200 deep"):
        _load(pickle.dumps(deep, protocol=5))


@pytest.mark.parametrize("payload", ["hook after rebuild", "layer class called", "forward attribute"])
def test_torch_layers_come_only_through_the_rebuild_path(payload):
    obj, match = {
        "hook after rebuild": (_Hooked(), "sets attributes on a fedselect.simulation.checkpoint._rebuild_module"),
        "layer class called": (_CalledLayer(), "calls torch.nn.modules.linear.Linear"),
        "forward attribute": (_Call(ck._rebuild_module, torch.nn.Linear, {"forward": str}), "shadow its methods"),
    }[payload]
    with pytest.raises(pickle.UnpicklingError, match=match):
        _load(pickle.dumps(obj, protocol=5))


def test_a_rebuilt_layer_without_hooks_still_loads():
    layer = _load(pickle.dumps(_Call(ck._rebuild_module, torch.nn.ReLU, {"inplace": False}), protocol=5))
    assert isinstance(layer, torch.nn.ReLU) and not layer._forward_hooks


def test_malformed_streams_are_unpickling_errors():
    for data in (b"\x80\x05", b"\x80\x05a.", b"\x80\x05h\x07."):
        with pytest.raises(pickle.UnpicklingError):
            scan_pickle(data)


def test_a_dag_planted_in_a_checkpoint_is_moved_aside_and_the_run_redone(digits_fed, tmp_path):
    kw = dict(KW, selector=get_selector("power-of-choice", d=5))
    reference = FederatedTrainer(**kw).fit(digits_fed)
    with pytest.raises(_Stop):
        FederatedTrainer(**kw, checkpoint_dir=tmp_path, checkpoint_every=3, callback=_stop_at(4)).fit(digits_fed)
    path = tmp_path / "checkpoint.pkl"
    _rewrite(path, {_selector_member(path): pickle.dumps(_Call(str, _list_dag(40)), protocol=5)})
    with pytest.warns(CorruptFileWarning, match=r"calls builtins\.str on a container") as w:
        again = FederatedTrainer(**kw, checkpoint_dir=tmp_path, checkpoint_every=3).fit(digits_fed)
    assert str(path) in str(w[0].message)
    assert again.resumed_from_ == 0 and again.history_ == reference.history_
