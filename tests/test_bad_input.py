"""Input that used to pass silently or fail vaguely: each now gets an error naming what is wrong."""

from __future__ import annotations

import gzip
import warnings
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from fedselect.data import load_cifar10, load_mnist, make_federation
from fedselect.selection import BaseSelector, ClientPool, Selection, SelectionError
from fedselect.testing import SyntheticOracle, check_selector

from .data.test_datasets import write_idx, write_idx_dataset


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    monkeypatch.delenv("FEDSELECT_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    return tmp_path


# -- data files ------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
def test_a_corrupted_label_byte_names_the_file(clean_env, gz):
    d = clean_env / "m"
    arrays = write_idx_dataset(d, gz=gz)
    labels = arrays["train-labels-idx1-ubyte"].copy()
    labels[5] = 200  # one flipped byte: formerly a 201-class model
    path = write_idx(d / "train-labels-idx1-ubyte", labels, gz=gz)
    with pytest.raises(ValueError, match=rf"{path.name}: 1 label\(s\) outside 0..9 .* first 200 at position 5"):
        load_mnist(d)
    with pytest.raises(ValueError, match=r"outside 0..9"):
        make_federation("mnist", data_dir=d, n_clients=2)


def test_a_truncated_gz_names_the_file(clean_env):
    d = clean_env / "m"
    write_idx_dataset(d, gz=True)
    path = d / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(ValueError, match=rf"{path.name}: corrupted or truncated gzip file"):
        load_mnist(d)
    path.write_bytes(b"\x1f\x8b" + b"garbage" * 10)
    with pytest.raises(ValueError, match=rf"{path.name}: corrupted or truncated gzip file"):
        load_mnist(d)


def test_cifar_batches_corrupted_or_with_bad_labels_name_the_file(clean_env):
    import pickle

    d = clean_env / "cifar-10-batches-py"
    d.mkdir()
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        batch = {b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]}
        (d / name).write_bytes(pickle.dumps(batch))
    load_cifar10(d)
    (d / "data_batch_3").write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}))
    with pytest.raises(ValueError, match=r"data_batch_3: 1 label\(s\) outside 0..9"):
        load_cifar10(d)
    (d / "data_batch_3").write_bytes(pickle.dumps({b"data": [1]})[:-3])
    with pytest.raises(ValueError, match=r"data_batch_3: corrupted or truncated CIFAR-10 batch"):
        load_cifar10(d)


# -- selections ------------------------------------------------------------------------


class _Weighted(BaseSelector):
    def __init__(self, *, weights=(1.0, 1.0), random_state=None):
        self.weights = weights
        self.random_state = random_state

    _parameter_constraints: ClassVar[dict] = {"weights": ["array-like"], "random_state": ["random_state"]}

    def _fit(self, pool):
        pass

    def _select(self, n, *, round, oracle):
        return Selection(np.arange(len(self.weights)), np.asarray(self.weights, float))


@pytest.mark.parametrize(
    "weights, match",
    [
        ((0.5, -0.25), r"_Weighted returned negative aggregation weight\(s\) \[-0.25\] for client\(s\) \[1\]"),
        ((0.0, 0.0), r"_Weighted returned aggregation weights that are all zero"),
    ],
)
def test_negative_or_all_zero_weights_are_refused(weights, match):
    sel = _Weighted(weights=weights).fit(ClientPool([1, 2, 3]))
    with pytest.raises(SelectionError, match=match):
        sel.select(2, round=0, oracle=SyntheticOracle(3))
    raw = Selection([0, 1], weights)
    with pytest.raises(SelectionError, match=match.replace("_Weighted", "Mine")):
        raw.validated(3, 2, source="Mine")
    # check_selector, which plugin authors run, catches it too
    with pytest.raises(AssertionError, match="_Weighted"):
        check_selector(_Weighted(weights=weights), n_rounds=2)


def test_some_zero_weights_are_fine():
    sel = _Weighted(weights=(0.0, 2.0)).fit(ClientPool([1, 2, 3]))
    assert sel.select(2, round=0, oracle=SyntheticOracle(3)).weights.tolist() == [0.0, 2.0]


def test_non_finite_weights_are_a_selection_error():
    with pytest.raises(SelectionError, match=r"Selection.weights must be finite, got \[nan\]"):
        Selection([0, 1], [1.0, np.nan])


class _Returns(BaseSelector):
    def __init__(self, *, value=None):
        self.value = value

    _parameter_constraints: ClassVar[dict] = {"value": ["no_validation"]}

    def _fit(self, pool):
        pass

    def _select(self, n, *, round, oracle):
        return self.value


def test_select_returning_none_names_the_selector():
    sel = _Returns(value=None).fit(ClientPool([1, 2]))
    with pytest.raises(TypeError, match=r"_Returns._select returned None; it must return a Selection"):
        sel.select(1, round=0, oracle=SyntheticOracle(2))


def test_select_returning_garbage_names_the_selector():
    sel = _Returns(value={"clients": [0]}).fit(ClientPool([1, 2]))
    with pytest.raises(SelectionError, match=r"_Returns._select returned dict .*not a Selection"):
        sel.select(1, round=0, oracle=SyntheticOracle(2))
    assert _Returns(value=[1]).fit(ClientPool([1, 2])).select(1, round=0, oracle=SyntheticOracle(2)).clients == [1]


# -- FedCor's Gaussian process ---------------------------------------------------------


def _run_fedcor(gp_lr, rounds=6):
    from fedselect.selectors.fedcor import FedCorSelector

    sel = FedCorSelector(warmup_rounds=3, gp_interval=2, warmup_iters=50, gp_iters=20, random_state=0)
    sel.fit(ClientPool([10] * 20))
    sel.gp_lr = gp_lr  # past the parameter check, as a custom schedule or a subclass could be
    oracle = SyntheticOracle(20, random_state=0)
    for t in range(rounds):
        oracle.round = t
        sel.select(4, round=t, oracle=oracle)
    return sel


def test_a_diverging_gp_fit_warns_naming_gp_lr():
    with pytest.warns(RuntimeWarning, match=r"FedCorSelector: the GP fit of round \d+ .* below the current 1000000.0"):
        _run_fedcor(1e6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _run_fedcor(0.01)  # the paper's rate: no warning


def test_a_non_finite_gp_fit_is_an_error_naming_gp_lr():
    with pytest.raises(FloatingPointError, match=r"GP fit of round \d+ .*diverged .*gp_lr below the current inf"):
        _run_fedcor(float("inf"))


def test_fixture_helpers_still_write_gz(tmp_path):
    # the helpers above come from the dataset tests; a sanity check that .gz really is gzip
    p = write_idx(tmp_path / "x-idx1-ubyte", np.arange(3, dtype=np.uint8), gz=True)
    assert Path(p).suffix == ".gz" and gzip.decompress(p.read_bytes())[:2] == b"\x00\x00"
