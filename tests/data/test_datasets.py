"""Dataset loaders: digits, the IDX reader, MNIST-style search and caching, CIFAR-10 batches, synthetic data."""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
from pathlib import Path

import numpy as np
import pytest

from fedselect.data import datasets as ds
from fedselect.data import (
    load_cifar10,
    load_dataset,
    load_digits_data,
    load_fmnist,
    load_mnist,
    make_synthetic,
    read_idx,
)
from fedselect.plugins import get_dataset_loader, list_datasets

FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
needs_fmnist = pytest.mark.skipif(
    not (FMNIST_DIR / "train-images-idx3-ubyte.gz").is_file(),
    reason="Fashion-MNIST not installed (Debian package dataset-fashion-mnist)",
)


def write_idx(path: Path, arr: np.ndarray, gz: bool = False, magic: bytes | None = None) -> Path:
    codes = {np.dtype(np.uint8): 0x08, np.dtype(np.int32): 0x0C}
    header = magic if magic is not None else bytes([0, 0, codes[arr.dtype], arr.ndim])
    payload = header + np.asarray(arr.shape, dtype=">u4").tobytes() + arr.astype(arr.dtype.newbyteorder(">")).tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        payload = gzip.compress(payload)
    path.write_bytes(payload)
    return path


def write_idx_dataset(directory: Path, n_train: int = 12, n_test: int = 4, gz: bool = False, seed: int = 0) -> dict:
    rng = np.random.RandomState(seed)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train-images-idx3-ubyte": rng.randint(0, 256, (n_train, 5, 5)).astype(np.uint8),
        "train-labels-idx1-ubyte": rng.randint(0, 10, n_train).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.randint(0, 256, (n_test, 5, 5)).astype(np.uint8),
        "t10k-labels-idx1-ubyte": rng.randint(0, 10, n_test).astype(np.uint8),
    }
    for name, arr in arrays.items():
        write_idx(directory / name, arr, gz=gz)
    return arrays


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No $FEDSELECT_DATA and an empty user cache."""
    monkeypatch.delenv("FEDSELECT_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    return tmp_path


# --------------------------------------------------------------------------- digits


def test_digits_shapes_dtypes_and_standardisation():
    X, y, X_test, y_test = load_digits_data()
    assert X.shape == (1347, 1, 8, 8) and X_test.shape == (450, 1, 8, 8)
    assert X.dtype == np.float32 and X_test.dtype == np.float32
    assert y.dtype == np.int64 and y_test.dtype == np.int64
    assert abs(float(X.mean())) < 1e-4 and abs(float(X.std()) - 1) < 1e-3
    assert set(np.unique(y)) == set(range(10)) == set(np.unique(y_test))
    # stratified: class proportions agree between the splits
    np.testing.assert_allclose(np.bincount(y) / y.size, np.bincount(y_test) / y_test.size, atol=0.01)


def test_digits_is_deterministic_and_returns_copies():
    X, y, _, _ = load_digits_data()
    X[:] = 0
    y[:] = -1
    X2, y2, _, _ = load_digits_data()
    assert X2.std() > 0.5 and y2.min() == 0


# --------------------------------------------------------------------------- IDX reader


@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_roundtrip(tmp_path, gz):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = write_idx(tmp_path / "images-idx3-ubyte", images, gz=gz)
    np.testing.assert_array_equal(read_idx(path), images)
    ints = np.array([1, -2, 70000], dtype=np.int32)
    path = write_idx(tmp_path / "ints-idx1", ints, gz=gz)
    out = read_idx(path)
    np.testing.assert_array_equal(out, ints)
    assert out.dtype.isnative


def test_read_idx_rejects_bad_magic(tmp_path):
    path = write_idx(tmp_path / "bad", np.zeros((2, 2), np.uint8), magic=b"\x01\x00\x08\x02")
    with pytest.raises(ValueError, match="magic"):
        read_idx(path)
    path = write_idx(tmp_path / "badtype", np.zeros((2, 2), np.uint8), magic=b"\x00\x00\x07\x02")
    with pytest.raises(ValueError, match="magic"):
        read_idx(path)


def test_read_idx_rejects_wrong_size(tmp_path):
    path = write_idx(tmp_path / "short", np.zeros((3, 2), np.uint8))
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ValueError, match=r"\(3, 2\)"):
        read_idx(path)


# --------------------------------------------------------------------------- MNIST-style loaders


@pytest.mark.parametrize("gz", [False, True])
def test_load_mnist_from_explicit_dir(tmp_path, gz):
    arrays = write_idx_dataset(tmp_path / "m", gz=gz)
    X, y, X_test, y_test = load_mnist(tmp_path / "m")
    assert X.shape == (12, 1, 5, 5) and X_test.shape == (4, 1, 5, 5)
    assert X.dtype == np.float32 and y.dtype == np.int64 and y_test.dtype == np.int64
    np.testing.assert_array_equal(y, arrays["train-labels-idx1-ubyte"])
    expected = (arrays["train-images-idx3-ubyte"][:, None] / 255.0 - 0.1307) / 0.3081
    np.testing.assert_allclose(X, expected, rtol=1e-5, atol=1e-5)
    raw = load_mnist(tmp_path / "m", normalize=None)[0]
    assert raw.min() >= 0 and raw.max() <= 1


def test_loader_returns_fresh_arrays_from_cache(tmp_path):
    write_idx_dataset(tmp_path / "m")
    X, y, _, _ = load_mnist(tmp_path / "m")
    X[:] = 123.0
    y[:] = 99
    X2, y2, _, _ = load_mnist(tmp_path / "m")
    assert X2.max() < 10 and y2.max() < 10
    # a rewritten file is re-read, not served stale from the cache
    new = write_idx_dataset(tmp_path / "m", n_train=7, seed=1)
    _, y3, _, _ = load_mnist(tmp_path / "m")
    np.testing.assert_array_equal(y3, new["train-labels-idx1-ubyte"])


def test_fedselect_data_env_and_subdir(tmp_path, clean_env, monkeypatch):
    write_idx_dataset(tmp_path / "root" / "mnist", gz=True)
    monkeypatch.setenv("FEDSELECT_DATA", str(tmp_path / "root"))
    X, _, _, _ = load_mnist()
    assert X.shape == (12, 1, 5, 5)
    write_idx_dataset(tmp_path / "root" / "fmnist", n_train=9)
    assert load_fmnist()[0].shape == (9, 1, 5, 5)
    assert load_dataset("fashion-mnist")[0].shape == (9, 1, 5, 5)


def test_user_cache_is_searched(clean_env):
    write_idx_dataset(clean_env / "xdg-cache" / "fedselect" / "mnist", n_train=8)
    assert load_mnist()[0].shape == (8, 1, 5, 5)


def test_missing_files_error_names_searched_dirs(tmp_path, clean_env, monkeypatch):
    monkeypatch.setenv("FEDSELECT_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError) as info:
        load_mnist()
    msg = str(info.value)
    assert str(tmp_path / "nowhere") in msg
    assert str(tmp_path / "xdg-cache" / "fedselect" / "mnist") in msg
    assert "train-images-idx3-ubyte" in msg and "download=True" in msg


def test_explicit_dir_is_searched_alone_and_missing_file_is_named(tmp_path, clean_env):
    write_idx_dataset(tmp_path / "cache" / "mnist")
    write_idx_dataset(tmp_path / "partial")
    (tmp_path / "partial" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing t10k-labels-idx1-ubyte") as info:
        load_mnist(tmp_path / "partial")
    assert str(tmp_path / "partial") in str(info.value)


def test_inconsistent_idx_files(tmp_path):
    write_idx_dataset(tmp_path / "m")
    write_idx(tmp_path / "m" / "train-labels-idx1-ubyte", np.zeros(5, np.uint8))
    with pytest.raises(ValueError, match="12 images but 5 labels"):
        load_mnist(tmp_path / "m")


def test_download_checks_sha256(tmp_path, monkeypatch):
    body = b"not the real file"

    def fake_urlopen(url, timeout):
        return io.BytesIO(body)

    monkeypatch.setattr(ds.urllib.request, "urlopen", fake_urlopen)
    bad = ds._Remote("f.bin", "https://example.invalid/f.bin", "0" * 64)
    with pytest.raises(OSError, match="checksum mismatch"):
        ds._fetch(bad, tmp_path)
    assert list(tmp_path.iterdir()) == []
    good = ds._Remote("f.bin", "https://example.invalid/f.bin", hashlib.sha256(body).hexdigest())
    assert ds._fetch(good, tmp_path).read_bytes() == body


@needs_fmnist
def test_fmnist_from_debian_package(clean_env):
    X, y, X_test, y_test = load_fmnist()  # found through the search order, not an explicit path
    assert X.shape == (60000, 1, 28, 28) and X_test.shape == (10000, 1, 28, 28)
    assert X.dtype == np.float32 and y.dtype == np.int64
    np.testing.assert_array_equal(np.bincount(y), np.full(10, 6000))
    np.testing.assert_array_equal(np.bincount(y_test), np.full(10, 1000))
    assert X.min() == pytest.approx(-0.1307 / 0.3081, rel=1e-5)


# --------------------------------------------------------------------------- CIFAR-10


def write_cifar(directory: Path, n: int = 3) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(0)
    for i, name in enumerate(ds.CIFAR10_FILES):
        batch = {b"data": rng.randint(0, 256, (n, 3072)).astype(np.uint8), b"labels": [(i + j) % 10 for j in range(n)]}
        with open(directory / name, "wb") as fh:
            pickle.dump(batch, fh)


def test_cifar10_from_fake_batches(tmp_path, clean_env, monkeypatch):
    write_cifar(tmp_path / "c" / "cifar-10-batches-py")
    X, y, X_test, y_test = load_cifar10(tmp_path / "c")
    assert y_test.tolist() == [5, 6, 7]
    assert X.shape == (15, 3, 32, 32) and X_test.shape == (3, 3, 32, 32)
    assert X.dtype == np.float32 and y.dtype == np.int64
    raw = load_cifar10(tmp_path / "c", normalize=None)[0]
    mean = np.array([0.4914, 0.4822, 0.4465], np.float32).reshape(1, 3, 1, 1)
    std = np.array([0.2470, 0.2435, 0.2616], np.float32).reshape(1, 3, 1, 1)
    np.testing.assert_allclose(X, (raw - mean) / std, rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("FEDSELECT_DATA", str(tmp_path / "c"))
    assert load_dataset("cifar-10")[0].shape == (15, 3, 32, 32)


def test_cifar10_bad_batch(tmp_path):
    write_cifar(tmp_path)
    with open(tmp_path / "test_batch", "wb") as fh:
        pickle.dump({b"data": np.zeros((2, 10), np.uint8), b"labels": [0, 1]}, fh)
    with pytest.raises(ValueError, match="test_batch"):
        load_cifar10(tmp_path)


# --------------------------------------------------------------------------- registry


def test_registry_and_load_dataset():
    assert {"digits", "fmnist", "mnist", "cifar10"} <= set(list_datasets())
    assert get_dataset_loader("fashion-mnist") is load_fmnist
    assert load_dataset("digits")[0].shape == (1347, 1, 8, 8)
    with pytest.raises(KeyError, match="digits"):
        load_dataset("no-such-dataset")


# --------------------------------------------------------------------------- synthetic


def test_synthetic_shapes_and_determinism():
    data = make_synthetic(1.0, 1.0, 8, random_state=0)
    assert len(data) == 8
    for X, y in data:
        assert X.dtype == np.float32 and X.shape[1] == 60 and X.shape[0] >= 50
        assert y.dtype == np.int64 and y.shape == (X.shape[0],) and 0 <= y.min() and y.max() < 10
    again = make_synthetic(1.0, 1.0, 8, random_state=0)
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(data, again))
    small = make_synthetic(0.0, 0.0, 3, n_features=5, n_classes=3, random_state=1)
    assert small[0][0].shape[1] == 5 and max(y.max() for _, y in small) < 3


def test_synthetic_heterogeneity():
    def spread(data):
        means = np.array([X.mean(axis=0) for X, _ in data])
        hists = np.array([np.bincount(y, minlength=10) / y.size for _, y in data])
        label_tv = 0.5 * np.abs(hists[:, None] - hists[None]).sum(-1).mean()
        return means.std(axis=0).mean(), label_tv

    hetero_x, hetero_y = spread(make_synthetic(1.0, 1.0, 20, random_state=0))
    iid_x, iid_y = spread(make_synthetic(1.0, 1.0, 20, random_state=0, iid=True))
    assert hetero_x > 3 * iid_x
    assert hetero_y > iid_y + 0.2


def test_synthetic_sizes():
    """Given sizes replace FedProx's power law: one int for everyone, or one per client."""
    data = make_synthetic(1.0, 1.0, 4, random_state=0, sizes=3)
    assert [X.shape[0] for X, _ in data] == [3, 3, 3, 3]
    data = make_synthetic(1.0, 1.0, 3, random_state=0, sizes=np.array([2, 5, 1]))
    assert [X.shape[0] for X, _ in data] == [2, 5, 1] and all(y.shape == (X.shape[0],) for X, y in data)
    # the default still draws the power law, unchanged
    default = make_synthetic(1.0, 1.0, 8, random_state=0)
    assert min(X.shape[0] for X, _ in default) >= 50
    for bad in (0, [1, 2], [1, 0, 1], 2.5, "many", [[1, 2, 3]]):
        with pytest.raises(ValueError, match=r"make_synthetic: parameter sizes=.* expected None, an integer >= 1"):
            make_synthetic(1.0, 1.0, 3, sizes=bad)


def test_synthetic_bad_params():
    with pytest.raises(ValueError, match="alpha"):
        make_synthetic(-1.0, 1.0, 3)
    with pytest.raises(ValueError, match="n_clients"):
        make_synthetic(1.0, 1.0, 0)
