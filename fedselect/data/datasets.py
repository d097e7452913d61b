"""Dataset loaders: digits, Fashion-MNIST, MNIST, CIFAR-10 and FedProx's Synthetic(alpha, beta).

Every loader has the signature ``load_<name>(data_dir=None, download=False)`` and
returns ``(X_train, y_train, X_test, y_test)``: images as ``float32`` arrays of shape
``(n, C, H, W)``, normalised, and labels as ``int64``. Nothing touches the network
unless ``download=True`` is passed.

Where files are looked for
--------------------------
An explicit ``data_dir`` is searched alone (the directory itself and its
dataset-named subdirectories), so a typo fails loudly instead of silently falling
back to another copy. Without one, the search goes through, in order:

1. ``$FEDSELECT_DATA`` (the directory itself and its dataset-named subdirectories);
2. the user cache, ``$XDG_CACHE_HOME/fedselect/<dataset>`` (``~/.cache/fedselect/<dataset>``);
3. for Fashion-MNIST, ``/usr/share/datasets/fashion-mnist`` (Debian's
   ``dataset-fashion-mnist`` package).

``download=True`` fetches missing files into ``data_dir`` (or the user cache) and
checks their SHA-256 digests.

Parsed raw arrays are cached in memory per directory (keyed on the files' sizes and
modification times), so repeated loads only pay for the normalisation; every call
returns fresh arrays, so callers cannot corrupt the cache.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import os
import pickle
import shutil
import tarfile
import tempfile
import urllib.request
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.utils import check_random_state

from .._pickle_scan import scan_pickle
from ..hookspecs import hookimpl
from ..plugins import get_dataset_loader

__all__ = [
    "CIFAR10_NORMALIZE",
    "MNIST_NORMALIZE",
    "load_cifar10",
    "load_dataset",
    "load_digits_data",
    "load_fmnist",
    "load_mnist",
    "make_synthetic",
    "read_idx",
]

PathLike = str | os.PathLike
Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]

#: Mean and standard deviation of MNIST pixels in [0, 1]. FedCor's official code
#: normalises Fashion-MNIST with these too (not with Fashion-MNIST's own 0.2860, 0.3530).
MNIST_NORMALIZE: tuple[float, float] = (0.1307, 0.3081)
#: Per-channel mean and standard deviation of CIFAR-10 pixels in [0, 1].
CIFAR10_NORMALIZE: tuple[tuple[float, float, float], tuple[float, float, float]] = (
    (0.4914, 0.4822, 0.4465),
    (0.2470, 0.2435, 0.2616),
)

IDX_FILES: tuple[str, ...] = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
CIFAR10_FILES: tuple[str, ...] = (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch")
SYSTEM_FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


@dataclass(frozen=True)
class _Remote:
    """A downloadable file; ``payload=True`` when ``sha256`` is of the gunzipped content."""

    name: str
    url: str
    sha256: str
    payload: bool = False


# MNIST: digests of the .gz files of the canonical distribution (PyTorch's mirror).
_MNIST_REMOTE = tuple(
    _Remote(f"{name}.gz", f"https://ossci-datasets.s3.amazonaws.com/mnist/{name}.gz", digest)
    for name, digest in zip(
        IDX_FILES,
        (
            "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
            "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
            "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
            "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
        ),
    )
)
# Fashion-MNIST: digests of the decompressed IDX payloads (gzip repacks, e.g. Debian's, keep them).
_FMNIST_REMOTE = tuple(
    _Remote(f"{name}.gz", f"http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/{name}.gz", digest, True)
    for name, digest in zip(
        IDX_FILES,
        (
            "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
            "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
            "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
            "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
        ),
    )
)
_CIFAR10_REMOTE = _Remote(
    "cifar-10-python.tar.gz",
    "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
)

# IDX type codes (third magic byte) -> big-endian numpy dtypes.
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


# --------------------------------------------------------------------------- locations


def user_cache_dir() -> Path:
    """fedselect's cache directory: ``$XDG_CACHE_HOME/fedselect`` or ``~/.cache/fedselect``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fedselect"


def _search_dirs(data_dir: PathLike | None, subdirs: Sequence[str], extra: Sequence[Path] = ()) -> list[Path]:
    """Directories to search, in order: ``data_dir`` alone, or $FEDSELECT_DATA, the cache and ``extra``.

    ``subdirs[0]`` also names the dataset's directory in the user cache.
    """
    if data_dir is not None:
        root = Path(data_dir).expanduser()
        return [root, *(root / s for s in subdirs)]
    dirs: list[Path] = []
    env = os.environ.get("FEDSELECT_DATA")
    if env:
        root = Path(env).expanduser()
        dirs += [root, *(root / s for s in subdirs)]
    dirs.append(user_cache_dir() / subdirs[0])
    dirs += list(extra)
    return dirs


def _find_file(directory: Path, name: str) -> Path | None:
    for candidate in (directory / name, directory / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _locate(dirs: Sequence[Path], names: Sequence[str], dataset: str, gz_ok: bool = True) -> list[Path]:
    """The paths of ``names`` in the first directory of ``dirs`` that holds all of them."""
    report = []
    for directory in dirs:
        if not directory.is_dir():
            report.append(f"  {directory} (no such directory)")
            continue
        found = [
            (_find_file(directory, n) if gz_ok else (directory / n if (directory / n).is_file() else None))
            for n in names
        ]
        if all(f is not None for f in found):
            return [f for f in found if f is not None]
        missing = [n + (" (or .gz)" if gz_ok else "") for n, f in zip(names, found) if f is None]
        report.append(f"  {directory} (missing {', '.join(missing)})")
    raise FileNotFoundError(
        f"{dataset} files not found. Searched, in order:\n" + "\n".join(report) + "\n"
        f"Put the files {', '.join(names)} in one of these directories, set $FEDSELECT_DATA, "
        "or pass download=True."
    )


# --------------------------------------------------------------------------- IDX


def _open_maybe_gzip(path: Path) -> bytes:
    with open(path, "rb") as fh:
        head = fh.read(2)
    if head != b"\x1f\x8b":
        with open(path, "rb") as fh:
            return fh.read()
    try:
        with gzip.open(path, "rb") as fh:
            return fh.read()
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ValueError(
            f"{path}: corrupted or truncated gzip file ({exc}); delete it and copy or download it again"
        ) from exc


def _check_labels(labels: np.ndarray, n_classes: int, path: Path | str, dataset: str) -> None:
    """Refuse labels outside ``0..n_classes - 1``: a corrupted byte would otherwise add classes to the model."""
    bad = np.flatnonzero((labels < 0) | (labels >= n_classes))
    if bad.size:
        raise ValueError(
            f"{path}: {bad.size} label(s) outside 0..{n_classes - 1} ({dataset} has {n_classes} classes), first "
            f"{int(labels[bad[0]])} at position {int(bad[0])}; the file is corrupted: replace it (downloads are "
            "SHA-256 checked)"
        )


def read_idx(path: PathLike) -> np.ndarray:
    """Read an IDX file (plain or gzip-compressed) into a native-endian numpy array.

    The format (LeCun et al., MNIST): two zero bytes, a type code, the number of
    dimensions, the dimensions as big-endian uint32, then the data in C order.

    Parameters
    ----------
    path : str or os.PathLike
        The file; gzip compression is detected from its first bytes.

    Returns
    -------
    ndarray
        The data, with the dimensions from the header.

    Raises
    ------
    ValueError
        Bad magic number, unknown type code, or a payload whose size does not match
        the header.
    """
    path = Path(path)
    raw = _open_maybe_gzip(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path}: not an IDX file (bad magic number {raw[:4].hex() or 'empty'})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header ({ndim} dimensions, {len(raw)} bytes)")
    shape = tuple(int(v) for v in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(
            f"{path}: IDX header announces shape {shape} ({expected} bytes of data) but the file holds "
            f"{len(raw) - header} bytes"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def _stamp(paths: Sequence[Path]) -> tuple[tuple[str, int, int], ...]:
    return tuple((str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in paths)


@functools.lru_cache(maxsize=8)
def _read_idx_set(stamp: tuple[tuple[str, int, int], ...]) -> tuple[np.ndarray, ...]:
    """Parse and check the four IDX files; the arrays are read-only (they live in the cache)."""
    images_tr, labels_tr, images_te, labels_te = (read_idx(s[0]) for s in stamp)
    for images, labels, split in ((images_tr, labels_tr, "training"), (images_te, labels_te, "test")):
        if images.ndim != 3 or labels.ndim != 1:
            raise ValueError(
                f"{split} IDX files have {images.ndim}-D images and {labels.ndim}-D labels; expected 3-D and 1-D"
            )
        if images.shape[0] != labels.shape[0]:
            raise ValueError(f"{split} IDX files disagree: {images.shape[0]} images but {labels.shape[0]} labels")
    if images_tr.shape[1:] != images_te.shape[1:]:
        raise ValueError(f"training images are {images_tr.shape[1:]} but test images {images_te.shape[1:]}")
    out = (images_tr, labels_tr, images_te, labels_te)
    for a in out:
        a.setflags(write=False)
    return out


def _images_to_float(images: np.ndarray, normalize: tuple[Any, Any] | None, scale: float = 255.0) -> np.ndarray:
    """uint8 (n, C, H, W) -> float32 in [0, 1], then (x - mean) / std per channel."""
    X = images.astype(np.float32)
    X *= np.float32(1.0 / scale)
    if normalize is not None:
        mean, std = (np.asarray(v, dtype=np.float32).reshape(1, -1, 1, 1) for v in normalize)
        X -= mean
        X /= std
    return X


# --------------------------------------------------------------------------- downloads


def _sha256(path: Path, payload: bool = False) -> str:
    digest = hashlib.sha256()
    opener = gzip.open if payload else open
    with opener(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fetch(remote: _Remote, dest_dir: Path) -> Path:
    """Download ``remote`` into ``dest_dir`` unless present, verify its SHA-256, return its path."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / remote.name
    if not target.is_file():
        fd, tmp_name = tempfile.mkstemp(dir=dest_dir, prefix=f".{remote.name}.")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(remote.url, timeout=60) as response:
                shutil.copyfileobj(response, out)
            got = _sha256(tmp, remote.payload)
            if got != remote.sha256:
                raise OSError(f"checksum mismatch for {remote.url}: expected SHA-256 {remote.sha256}, got {got}")
            tmp.replace(target)
        finally:
            tmp.unlink(missing_ok=True)
    return target


# --------------------------------------------------------------------------- loaders


def _load_idx_dataset(
    dataset: str,
    subdirs: Sequence[str],
    remotes: Sequence[_Remote],
    data_dir: PathLike | None,
    download: bool,
    normalize: tuple[float, float] | None,
    system: Sequence[Path] = (),
    n_classes: int = 10,
) -> Arrays:
    dirs = _search_dirs(data_dir, subdirs, system)
    try:
        paths = _locate(dirs, IDX_FILES, dataset)
    except FileNotFoundError:
        if not download:
            raise
        dest = Path(data_dir).expanduser() if data_dir is not None else user_cache_dir() / subdirs[0]
        for remote in remotes:
            _fetch(remote, dest)
        paths = _locate([dest], IDX_FILES, dataset)
    images_tr, labels_tr, images_te, labels_te = _read_idx_set(_stamp(paths))
    _check_labels(labels_tr, n_classes, paths[1], dataset)
    _check_labels(labels_te, n_classes, paths[3], dataset)
    return (
        _images_to_float(images_tr[:, None], normalize),
        labels_tr.astype(np.int64),
        _images_to_float(images_te[:, None], normalize),
        labels_te.astype(np.int64),
    )


def load_fmnist(
    data_dir: PathLike | None = None,
    download: bool = False,
    *,
    normalize: tuple[float, float] | None = MNIST_NORMALIZE,
) -> Arrays:
    """Fashion-MNIST (Xiao et al. 2017): 60,000 + 10,000 grey 28 x 28 images of 10 clothing classes.

    Reads the four IDX files (plain or ``.gz``), see the module docstring for where.
    Pixels are scaled to [0, 1] and then normalised with MNIST's statistics
    (0.1307, 0.3081), as FedCor's official code does.

    Parameters
    ----------
    data_dir : str or os.PathLike, optional
        Directory holding the files (or a ``fashion-mnist`` / ``fmnist`` subdirectory).
    download : bool, default=False
        Fetch missing files into ``data_dir`` or the user cache (SHA-256 checked).
    normalize : (mean, std) or None, default=(0.1307, 0.3081)
        Applied after scaling to [0, 1]; ``None`` leaves pixels in [0, 1].

    Returns
    -------
    X_train : ndarray of float32, shape (60000, 1, 28, 28)
    y_train : ndarray of int64, shape (60000,)
    X_test : ndarray of float32, shape (10000, 1, 28, 28)
    y_test : ndarray of int64, shape (10000,)

    Raises
    ------
    FileNotFoundError
        The files are in none of the searched directories (all are named).
    ValueError
        A file is not a valid IDX file or the files disagree.
    """
    return _load_idx_dataset(
        "Fashion-MNIST",
        ("fashion-mnist", "fmnist", "FashionMNIST/raw"),
        _FMNIST_REMOTE,
        data_dir,
        download,
        normalize,
        (SYSTEM_FMNIST_DIR,),
    )


def load_mnist(
    data_dir: PathLike | None = None,
    download: bool = False,
    *,
    normalize: tuple[float, float] | None = MNIST_NORMALIZE,
) -> Arrays:
    """MNIST (LeCun et al. 1998): 60,000 + 10,000 grey 28 x 28 handwritten digits.

    Same reader and search order as :func:`load_fmnist`, with the subdirectory
    ``mnist`` (or torchvision's ``MNIST/raw``).

    Parameters
    ----------
    data_dir : str or os.PathLike, optional
        Directory holding the files (or an ``mnist`` subdirectory).
    download : bool, default=False
        Fetch missing files into ``data_dir`` or the user cache (SHA-256 checked).
    normalize : (mean, std) or None, default=(0.1307, 0.3081)
        Applied after scaling to [0, 1]; ``None`` leaves pixels in [0, 1].

    Returns
    -------
    X_train, y_train, X_test, y_test : ndarray
        Images float32 (n, 1, 28, 28), labels int64.
    """
    return _load_idx_dataset("MNIST", ("mnist", "MNIST/raw"), _MNIST_REMOTE, data_dir, download, normalize)


class _NdarrayToken:
    """What ``numpy.ndarray`` resolves to in a batch: accepted by ``_reconstruct`` only, never called."""


_NDARRAY = _NdarrayToken()


def _batch_dtype(spec: Any, align: bool = False, copy: bool = False) -> np.dtype:
    dtype = np.dtype(spec, align, copy)
    if dtype.hasobject:
        raise pickle.UnpicklingError("object arrays are not read from a CIFAR-10 batch")
    return dtype


def _batch_reconstruct(subtype: Any, shape: Any, typecode: Any) -> np.ndarray:
    if subtype is not _NDARRAY or tuple(shape) != (0,):  # what numpy's pickles always give; the state sets the rest
        raise pickle.UnpicklingError("an array reconstruction other than numpy's own")
    return np.ndarray((0,), dtype=np.uint8)


def _batch_frombuffer(buf: Any, dtype: Any, shape: Any, order: str) -> np.ndarray:
    return np.frombuffer(buf, dtype=_batch_dtype(dtype)).reshape(shape, order=order)


def _latin1(text: Any, encoding: str = "utf-8") -> bytes:  # how protocol-2 pickles from Python 3 hold bytes
    if not isinstance(text, str) or encoding != "latin1":
        raise pickle.UnpicklingError("_codecs.encode other than latin1 text")
    return text.encode("latin1")


_BATCH_GLOBALS = {
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): _batch_dtype,
    ("numpy.core.multiarray", "_reconstruct"): _batch_reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _batch_reconstruct,
    ("numpy.core.numeric", "_frombuffer"): _batch_frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _batch_frombuffer,
    ("_codecs", "encode"): _latin1,
}


class _BatchUnpickler(pickle.Unpickler):
    """Reads a CIFAR-10 python batch: dicts, lists, bytes, str, numbers and numpy arrays of plain dtypes.

    Every other global (``os.system``, ``builtins.eval``, any class or function) is refused, so a
    planted batch cannot run code; array sizes are checked by numpy against their data.
    """

    def find_class(self, module: str, name: str) -> Any:
        obj = _BATCH_GLOBALS.get((module, name))
        if obj is None:
            raise pickle.UnpicklingError(f"refused global {module}.{name}: a CIFAR-10 batch holds only arrays")
        return obj


def _unpickle_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        raw = path.read_bytes()
        scan_pickle(raw, what=str(path))  # shared references that np.asarray would walk exponentially: refused
        batch = _BatchUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except (EOFError, pickle.UnpicklingError, ValueError, TypeError) as exc:
        raise ValueError(
            f"{path}: corrupted or truncated CIFAR-10 batch, or not a CIFAR-10 python batch ({exc}); replace the file"
        ) from exc
    try:
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a CIFAR-10 python batch (needs keys b'data' and b'labels')") from exc
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or labels.shape != (data.shape[0],):
        raise ValueError(
            f"{path}: CIFAR-10 batch has data of shape {data.shape} and {labels.size} labels; "
            f"expected (n, 3072) and n labels"
        )
    _check_labels(labels, 10, path, "CIFAR-10")
    return data.reshape(-1, 3, 32, 32), labels


@functools.lru_cache(maxsize=4)
def _read_cifar10(stamp: tuple[tuple[str, int, int], ...]) -> tuple[np.ndarray, ...]:
    batches = [_unpickle_batch(Path(s[0])) for s in stamp]
    out = (
        np.concatenate([b[0] for b in batches[:-1]]),
        np.concatenate([b[1] for b in batches[:-1]]),
        batches[-1][0],
        batches[-1][1],
    )
    for a in out:
        a.setflags(write=False)
    return out


def load_cifar10(
    data_dir: PathLike | None = None,
    download: bool = False,
    *,
    normalize: tuple[Any, Any] | None = CIFAR10_NORMALIZE,
) -> Arrays:
    """CIFAR-10 (Krizhevsky 2009): 50,000 + 10,000 colour 32 x 32 images of 10 classes.

    Reads the python batches ``data_batch_1`` ... ``data_batch_5`` and ``test_batch``
    from a directory or its ``cifar-10-batches-py`` (or ``cifar10``) subdirectory,
    searched like :func:`load_fmnist`. The batches are pickles, read by a restricted
    unpickler that admits only plain containers and numpy arrays: a planted batch runs no code.

    Parameters
    ----------
    data_dir : str or os.PathLike, optional
        Directory holding the batches.
    download : bool, default=False
        Fetch and unpack ``cifar-10-python.tar.gz`` into ``data_dir`` or the user cache
        (SHA-256 checked).
    normalize : (mean, std) per channel, or None
        Default: mean (0.4914, 0.4822, 0.4465), std (0.2470, 0.2435, 0.2616), applied
        after scaling to [0, 1].

    Returns
    -------
    X_train, y_train, X_test, y_test : ndarray
        Images float32 (n, 3, 32, 32), labels int64.
    """
    subdirs = ("cifar10", "cifar-10-batches-py", "cifar10/cifar-10-batches-py")
    dirs = _search_dirs(data_dir, subdirs, (user_cache_dir() / "cifar10" / "cifar-10-batches-py",))
    try:
        paths = _locate(dirs, CIFAR10_FILES, "CIFAR-10", gz_ok=False)
    except FileNotFoundError:
        if not download:
            raise
        dest = Path(data_dir).expanduser() if data_dir is not None else user_cache_dir() / "cifar10"
        archive = _fetch(_CIFAR10_REMOTE, dest)
        with tarfile.open(archive, "r:gz") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, filter="data")
            else:  # Python < 3.10.12 has no extraction filters
                tar.extractall(dest)
        paths = _locate([dest / "cifar-10-batches-py"], CIFAR10_FILES, "CIFAR-10", gz_ok=False)
    images_tr, labels_tr, images_te, labels_te = _read_cifar10(_stamp(paths))
    return (
        _images_to_float(images_tr, normalize),
        labels_tr.astype(np.int64),
        _images_to_float(images_te, normalize),
        labels_te.astype(np.int64),
    )


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    X = (digits.images / 16.0).astype(np.float32)[:, None]
    y = digits.target.astype(np.int64)
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.25, stratify=y, random_state=0)
    mean, std = X_tr.mean(), X_tr.std()
    out = ((X_tr - mean) / std, y_tr, (X_te - mean) / std, y_te)
    for a in out:
        a.setflags(write=False)
    return out


def load_digits_data(data_dir: PathLike | None = None, download: bool = False) -> Arrays:
    """scikit-learn's 8 x 8 handwritten digits: 1,347 training and 450 test images, 10 classes.

    Ships with scikit-learn, so it needs no files and no network (``data_dir`` and
    ``download`` are accepted for the common signature and ignored). Pixels are
    scaled to [0, 1] and standardised with the mean and standard deviation of all
    training pixels; the split is a stratified 75/25 split with seed 0.

    Returns
    -------
    X_train : ndarray of float32, shape (1347, 1, 8, 8)
    y_train : ndarray of int64, shape (1347,)
    X_test : ndarray of float32, shape (450, 1, 8, 8)
    y_test : ndarray of int64, shape (450,)

    Examples
    --------
    >>> X, y, X_test, y_test = load_digits_data()
    >>> X.shape, X.dtype, y.dtype
    ((1347, 1, 8, 8), dtype('float32'), dtype('int64'))
    """
    return tuple(a.copy() for a in _digits())  # type: ignore[return-value]


def load_dataset(name: str, data_dir: PathLike | None = None, download: bool = False, **kwargs: Any) -> Arrays:
    """Load the dataset registered as ``name`` (built-ins: digits, fmnist, mnist, cifar10).

    Parameters
    ----------
    name : str
        Registered name or alias (see :func:`fedselect.list_datasets`).
    data_dir : str or os.PathLike, optional
        Where the files are.
    download : bool, default=False
        Allow fetching missing files.
    **kwargs
        Further loader options (e.g. ``normalize``).

    Returns
    -------
    X_train, y_train, X_test, y_test : ndarray

    Raises
    ------
    KeyError
        Unknown name; the message lists the registered datasets.
    """
    return get_dataset_loader(name)(data_dir=data_dir, download=download, **kwargs)


# --------------------------------------------------------------------------- synthetic


def make_synthetic(
    alpha: float,
    beta: float,
    n_clients: int,
    *,
    n_features: int = 60,
    n_classes: int = 10,
    random_state: Any = None,
    iid: bool = False,
    sizes: Any = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """FedProx's Synthetic(alpha, beta) federated data (Li et al. 2020, Sec. 5.1 and its generator).

    For client k: u_k ~ N(0, alpha), B_k ~ N(0, beta); W_k ~ N(u_k, 1) of shape
    (n_features, n_classes) and b_k ~ N(u_k, 1); v_k ~ N(B_k, 1) per feature;
    x ~ N(v_k, Sigma) with Sigma = diag(j^-1.2), j = 1..n_features; and
    y = argmax softmax(x W_k + b_k). alpha controls how much the local models differ,
    beta how much the local inputs differ. As in FedProx's ``generate_niid.py`` the
    second argument of N(.,.) is used as a standard deviation, and client sizes are
    ``int(lognormal(4, 2)) + 50`` (a power law: a few clients are large), unless ``sizes``
    gives them.

    With ``iid=True`` every client shares one W, b ~ N(0, 1) and draws x ~ N(0, Sigma)
    (FedProx's Synthetic-IID); alpha and beta are then unused.

    Parameters
    ----------
    alpha, beta : float
        Heterogeneity of the models and of the inputs (>= 0).
    n_clients : int
        Number of clients.
    n_features : int, default=60
        Dimension of x.
    n_classes : int, default=10
        Number of classes.
    random_state : int, RandomState instance or None
        Seed.
    iid : bool, default=False
        Draw every client from the same distribution.
    sizes : None, int or array-like of int, default=None
        The number of samples of each client. None draws FedProx's sizes
        ``int(lognormal(4, 2)) + 50`` (mean about 450: 100,000 clients would hold 45 million
        samples, 11 GB of float32 features); an int gives every client that many; an array
        gives client k ``sizes[k]``. Cross-device federations (many clients holding a few
        samples each) pass small sizes. Given sizes are not drawn, so the rest of the
        stream starts earlier and the data differ from a run with ``sizes=None``.

    Returns
    -------
    list of (X_k, y_k)
        Client k's features (float32, shape (n_k, n_features)) and labels (int64).

    Examples
    --------
    >>> data = make_synthetic(1.0, 1.0, 5, random_state=0)
    >>> len(data), data[0][0].shape[1]
    (5, 60)
    """
    if alpha < 0 or beta < 0:
        raise ValueError(f"alpha and beta must be >= 0, got alpha={alpha}, beta={beta}")
    if n_clients < 1 or n_features < 1 or n_classes < 2:
        raise ValueError(
            f"need n_clients >= 1, n_features >= 1 and n_classes >= 2, got n_clients={n_clients}, "
            f"n_features={n_features}, n_classes={n_classes}"
        )
    if sizes is not None:
        sizes = _check_sizes(sizes, n_clients)
    rng = check_random_state(random_state)
    if sizes is None:
        sizes = rng.lognormal(4, 2, n_clients).astype(np.int64) + 50
    sd_x = np.arange(1, n_features + 1, dtype=float) ** (-1.2 / 2)
    u = rng.normal(0, alpha, n_clients)
    B = rng.normal(0, beta, n_clients)
    if iid:
        W_global = rng.normal(0, 1, (n_features, n_classes))
        b_global = rng.normal(0, 1, n_classes)
    data = []
    for k in range(n_clients):
        if iid:
            W, b, v = W_global, b_global, np.zeros(n_features)
        else:
            W = rng.normal(u[k], 1, (n_features, n_classes))
            b = rng.normal(u[k], 1, n_classes)
            v = rng.normal(B[k], 1, n_features)
        X = v + rng.standard_normal((sizes[k], n_features)) * sd_x
        y = np.argmax(X @ W + b, axis=1)  # softmax is monotone: argmax softmax = argmax of the logits
        data.append((X.astype(np.float32), y.astype(np.int64)))
    return data


def _check_sizes(sizes: Any, n_clients: int) -> np.ndarray:
    """``sizes`` of :func:`make_synthetic` as n_clients positive int64 counts, or a ValueError naming it."""
    arr = np.asarray(sizes)
    ok = arr.ndim in (0, 1) and np.issubdtype(arr.dtype, np.integer) and not np.issubdtype(arr.dtype, np.bool_)
    if ok and arr.ndim == 1 and arr.shape[0] != n_clients:
        ok = False
    if not ok or (arr.size and arr.min() < 1):
        shown = f"{sizes!r:.60}"
        raise ValueError(
            f"make_synthetic: parameter sizes={shown} is invalid; expected None, an integer >= 1, or "
            f"{n_clients} integers >= 1 (one per client)"
        )
    return np.broadcast_to(arr.astype(np.int64), (n_clients,)).copy()


# --------------------------------------------------------------------------- registration


@hookimpl
def register_datasets(register: Callable[..., Any]) -> None:
    """Register the built-in loaders."""
    register(load_digits_data, name="digits")
    register(load_fmnist, name="fmnist", aliases=("fashion-mnist",))
    register(load_mnist, name="mnist")
    register(load_cifar10, name="cifar10", aliases=("cifar-10",))
