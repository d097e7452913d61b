"""Federation: validation, derived quantities, the holdout split and make_federation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedselect.data import Federation, make_federation, split_holdout
from fedselect.selection import ClientPool

FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


def tiny(**overrides):
    kwargs = {
        "X": np.zeros((6, 2), np.float32),
        "y": np.array([0, 1, 0, 1, 2, 2]),
        "client_indices": [np.array([0, 1]), np.array([2, 3, 4]), np.array([5])],
        "X_test": np.zeros((2, 2), np.float32),
        "y_test": np.array([0, 1]),
        "n_classes": 3,
    }
    kwargs.update(overrides)
    return Federation(**kwargs)


def test_federation_properties():
    fed = tiny()
    assert fed.n_clients == 3 and fed.input_shape == (2,)
    np.testing.assert_array_equal(fed.n_samples, [2, 3, 1])
    assert fed.n_samples.dtype == np.int64
    np.testing.assert_allclose(fed.weights, [2 / 6, 3 / 6, 1 / 6])
    assert fed.loss_indices is fed.client_indices
    np.testing.assert_array_equal(fed.label_histogram(), [[1, 1, 0], [1, 1, 1], [0, 0, 1]])
    pool = fed.client_pool()
    assert isinstance(pool, ClientPool) and pool.n_clients == 3
    np.testing.assert_array_equal(pool.metadata["labels"], fed.label_histogram())
    assert "3 clients" in fed.summary()
    assert fed.client_indices[0].dtype == np.int64 and not fed.client_indices[0].flags.writeable


def test_federation_with_eval_indices():
    fed = tiny(
        client_indices=[np.array([0]), np.array([2, 3]), np.array([5])],
        eval_indices=[np.array([1]), np.array([4]), np.array([3])],
    )
    np.testing.assert_array_equal(fed.n_train_samples, [1, 2, 1])
    np.testing.assert_array_equal(fed.n_samples, [2, 3, 2])
    assert fed.loss_indices is fed.eval_indices
    assert "held out" in fed.summary()


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"client_indices": [np.array([0, 1]), np.array([], dtype=np.int64), np.array([5])]}, "client 1 has no data"),
        ({"client_indices": [np.array([0]), np.array([9])]}, r"client 1 has indices outside \[0, 6\)"),
        ({"client_indices": [np.array([0]), np.array([-1])]}, "client 1"),
        ({"client_indices": []}, "at least one client"),
        ({"y": np.array([0, 1, 0])}, "X has shape"),
        ({"X_test": np.zeros((0, 2), np.float32), "y_test": np.array([], np.int64)}, "test split is empty"),
        ({"X_test": np.zeros((2, 3), np.float32)}, "test inputs"),
        ({"eval_indices": [np.array([1])]}, "eval_indices has 1 entries"),
        ({"eval_indices": [np.array([1]), np.array([], np.int64), np.array([2])]}, "client 1 has no held-out data"),
        ({"n_classes": 2}, "n_classes=2"),
    ],
)
def test_federation_validation(overrides, match):
    with pytest.raises(ValueError, match=match):
        tiny(**overrides)


def test_split_holdout_sizes_and_determinism():
    parts = [np.arange(0, 10), np.arange(10, 12), np.arange(12, 17)]
    train, held = split_holdout(parts, 0.2, random_state=0)
    assert [t.size for t in train] == [8, 1, 4] and [h.size for h in held] == [2, 1, 1]
    for p, t, h in zip(parts, train, held):
        np.testing.assert_array_equal(np.sort(np.concatenate([t, h])), p)
    again = split_holdout(parts, 0.2, random_state=0)
    assert all(np.array_equal(a, b) for a, b in zip(held, again[1]))
    with pytest.raises(ValueError, match="client 1 has 1 sample"):
        split_holdout([np.arange(3), np.array([7])], 0.2)


def test_make_federation_digits_shards():
    fed = make_federation("digits", partition="shards", n_clients=20, shards_per_client=2, random_state=0)
    assert fed.n_clients == 20 and fed.input_shape == (1, 8, 8)
    assert fed.X.dtype == np.float32 and fed.y.dtype == np.int64
    assert fed.n_samples.sum() == 1347 and fed.y_test.size == 450
    assert fed.n_samples.max() - fed.n_samples.min() <= 2  # 40 shards of 33 or 34 samples
    assert fed.metadata["partition"] == "shards" and fed.metadata["shards_per_client"] == 2
    assert np.mean((fed.label_histogram() > 0).sum(axis=1)) < 3.5
    again = make_federation("digits", partition="shards", n_clients=20, shards_per_client=2, random_state=0)
    assert all(np.array_equal(a, b) for a, b in zip(fed.client_indices, again.client_indices))


def test_make_federation_holdout():
    fed = make_federation("digits", partition="dirichlet", n_clients=10, alpha=0.5, holdout=0.2, random_state=0)
    n = fed.n_samples
    np.testing.assert_array_equal(fed.n_train_samples, np.minimum(np.maximum((0.8 * n).astype(int), 1), n - 1))
    assert n.sum() == 1347
    for t, h in zip(fed.client_indices, fed.eval_indices):
        assert h.size >= 1 and np.intersect1d(t, h).size == 0
    assert fed.loss_indices is fed.eval_indices
    assert fed.weights.sum() == pytest.approx(1.0)


def test_make_federation_callable_partition():
    def halves(y, n_clients, random_state=None, offset=0):
        return np.array_split(np.arange(y.size), n_clients)

    fed = make_federation("digits", partition=halves, n_clients=3, offset=1)
    assert fed.n_clients == 3 and fed.metadata["partition"] == "halves"
    with pytest.raises(ValueError, match="rejected the parameters"):
        make_federation("digits", partition=halves, n_clients=3, nope=1)
    with pytest.raises(ValueError, match="returned 2 parts for 3 clients"):
        make_federation(
            "digits", partition=lambda y, n, random_state=None: [np.arange(2), np.arange(2, 4)], n_clients=3
        )
    with pytest.raises(ValueError, match="more than one client"):
        make_federation(
            "digits", partition=lambda y, n, random_state=None: [np.arange(3), np.arange(2, 5)], n_clients=2
        )


def test_make_federation_errors():
    with pytest.raises(ValueError, match="n_clients"):
        make_federation("digits", n_clients=0)
    with pytest.raises(ValueError, match="holdout"):
        make_federation("digits", holdout=1.0)
    with pytest.raises(ValueError, match="n_clients=5000"):
        make_federation("digits", n_clients=5000)
    with pytest.raises(KeyError, match=r"digits.*synthetic"):
        make_federation("no-such-dataset")
    with pytest.raises(ValueError, match="shards_per_clients"):
        make_federation("digits", partition="shards", shards_per_clients=2)
    with pytest.raises(ValueError, match=r"parameter partition='pathological' is invalid; expected one"):
        make_federation("digits", partition="pathological")
    with pytest.raises(ValueError, match=r"make_federation: parameter random_state=-1 is invalid"):
        make_federation("digits", random_state=-1)
    with pytest.raises(ValueError, match=r"make_federation: parameter n_clients=2.0 is invalid"):
        make_federation("digits", n_clients=2.0)


def test_make_federation_synthetic():
    fed = make_federation("synthetic", n_clients=12, alpha=0.5, beta=0.5, random_state=0)
    assert fed.n_clients == 12 and fed.input_shape == (60,)
    assert fed.X.dtype == np.float32
    assert fed.metadata["alpha"] == 0.5
    sizes = fed.n_samples
    assert sizes.min() >= 40  # 80 % of at least 50
    # the test split is the union of the clients' 20 % parts
    data_total = sizes.sum() + fed.y_test.size
    assert fed.y_test.size == pytest.approx(0.2 * data_total, abs=12)
    with pytest.raises(ValueError, match="synthetic"):
        make_federation("synthetic", partition="shards", n_clients=3)
    with pytest.raises(ValueError, match="gamma"):
        make_federation("synthetic", n_clients=3, gamma=1.0)


def test_make_federation_synthetic_sizes():
    """A cross-device federation: many small clients, sizes recorded by a digest, a size of 1 refused."""
    sizes = np.arange(5, 25)
    fed = make_federation("synthetic", n_clients=20, sizes=sizes, random_state=0)
    assert (fed.n_samples == (0.8 * sizes).astype(int)).all()
    assert fed.y_test.size == int(sizes.sum() - fed.n_samples.sum())
    assert fed.metadata["sizes"].startswith("20 sizes, min 5, mean 14.5, max 24, sha256 ")
    assert make_federation("synthetic", n_clients=3, sizes=4, random_state=0).metadata["sizes"] == 4
    with pytest.raises(ValueError, match="fewer than 2 samples"):
        make_federation("synthetic", n_clients=3, sizes=[1, 4, 4])


def test_federation_sizes_are_copies():
    """n_samples / n_train_samples are counted once but handed out as copies a caller may change."""
    fed = make_federation("digits", n_clients=5, holdout=0.2, random_state=0)
    n = fed.n_samples
    n += 1000
    assert (fed.n_samples < 1000).all()
    assert (fed.n_samples == fed.n_train_samples + [len(ix) for ix in fed.eval_indices]).all()


@pytest.mark.skipif(not (FMNIST_DIR / "train-images-idx3-ubyte.gz").is_file(), reason="Fashion-MNIST not installed")
def test_make_federation_fmnist_2spc(monkeypatch, tmp_path):
    monkeypatch.delenv("FEDSELECT_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    fed = make_federation("fmnist", partition="shards", shards_per_client=2, n_clients=100, random_state=0)
    assert fed.n_clients == 100
    np.testing.assert_array_equal(fed.n_samples, np.full(100, 600))
    assert (fed.label_histogram() > 0).sum(axis=1).max() <= 2
    assert fed.X_test.shape == (10000, 1, 28, 28)


def test_n_classes_is_inferred_from_the_labels_unless_given():
    X = np.zeros((6, 2), np.float32)
    y = np.array([0, 1, 2, 0, 1, 2])
    parts = [np.arange(3), np.arange(3, 6)]
    fed = Federation(X, y, parts, X[:2], np.array([0, 1]))
    assert fed.n_classes == 3 and fed.n_outputs == 3  # not a silent 10
    assert fed.label_histogram().shape == (2, 3)
    assert Federation(X, y, parts, X[:2], np.array([0, 4])).n_classes == 5  # a class seen only in the test split
    assert Federation(X, y, parts, X[:2], np.array([0, 1]), n_classes=7).n_classes == 7
