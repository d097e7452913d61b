"""Federations from data the user already has: torch Datasets and Flower Datasets partitioners.

Both are materialised into the arrays a :class:`~fedselect.data.Federation` holds, because the
simulator's batched engine gathers every client's minibatches from one in-memory pool. That
takes ``n_samples * prod(input_shape) * 4`` bytes for the inputs (float32): 60,000 images of
1 x 28 x 28 are 188 MB, 50,000 of 3 x 32 x 32 are 614 MB. Transforms a Dataset applies run once,
when it is read, not per epoch (no random augmentation).

This module reads the data into :class:`FederationParts`; :meth:`Federation.from_datasets` and
:meth:`Federation.from_partitioner` assemble them (split each client's holdout, build the
Federation), so this module never imports :mod:`fedselect.data.federation` and the two do not
import each other.

Neither ``flwr_datasets`` nor ``datasets`` is imported here: a partitioner and its Hugging Face
datasets are used through their public methods (``load_partition``, ``num_partitions``,
``column_names``, ``with_format``), so importing fedselect never imports Flower Datasets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.utils import check_random_state

from .partition import PARTITIONS
from .partition import partition as _partition_by_name

__all__ = ["FederationParts", "parts_from_datasets", "parts_from_partitioner"]

_CHUNK = 512  # samples per DataLoader batch while materialising


def _as_array(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor
        return value.detach().cpu().numpy()
    return np.asarray(value)


def dataset_arrays(dataset: Any, what: str = "dataset") -> tuple[np.ndarray, np.ndarray]:
    """Read a map-style torch Dataset of ``(input, target)`` items into ``(X, y)`` arrays.

    Parameters
    ----------
    dataset : torch.utils.data.Dataset
        Map-style (``len(dataset)`` and ``dataset[i]``); each item is ``(input, target)``
        with ``input`` a tensor or array (for torchvision image datasets, a transform such as
        ``transforms.ToTensor()`` that returns a tensor) and ``target`` an integer class label
        or a float (or float vector) regression target.
    what : str
        How error messages name the dataset.

    Returns
    -------
    X : ndarray of float32, shape (n, *input_shape)
    y : ndarray of int64 (labels) or float32 (regression targets), shape (n,) or (n, d)
    """
    from torch.utils.data import DataLoader

    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise TypeError(f"{what}: expected a map-style torch Dataset (with __len__ and __getitem__), "
                        f"got {type(dataset).__name__}; an IterableDataset must be read into arrays first")
    if len(dataset) == 0:
        raise ValueError(f"{what}: the dataset is empty")
    first = dataset[0]
    if not isinstance(first, (tuple, list)) or len(first) != 2:
        raise ValueError(f"{what}: each item must be an (input, target) pair, item 0 is {type(first).__name__}"
                         f"{f' of length {len(first)}' if isinstance(first, (tuple, list)) else ''}")
    xs, ys = [], []
    try:
        for xb, yb in DataLoader(dataset, batch_size=_CHUNK, shuffle=False, num_workers=0):
            xs.append(_as_array(xb))
            ys.append(_as_array(yb))
    except TypeError as exc:  # default_collate refuses PIL images and other objects
        raise TypeError(
            f"{what}: its items cannot be stacked into arrays ({exc}); each input must be a tensor or an array "
            "(for a torchvision dataset pass transform=transforms.ToTensor()) and each target a number or a tensor"
        ) from exc
    X = np.concatenate(xs).astype(np.float32, copy=False)
    y = _targets(np.concatenate(ys), what)
    if X.ndim == 1:
        X = X[:, None]
    return X, y


def _targets(y: np.ndarray, what: str) -> np.ndarray:
    if y.dtype == np.bool_ or np.issubdtype(y.dtype, np.integer):
        return y.astype(np.int64)
    if np.issubdtype(y.dtype, np.floating):
        return y.astype(np.float32)
    raise ValueError(f"{what}: targets of dtype {y.dtype}; expected integer labels or float regression targets")


def _test_arrays(test: Any, what: str, column: Callable[[Any], tuple[np.ndarray, np.ndarray]] | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The test split from an ``(X, y)`` pair of arrays or tensors, a Hugging Face Dataset or a torch Dataset."""
    if isinstance(test, tuple) and len(test) == 2 and all(isinstance(a, np.ndarray) or hasattr(a, "detach")
                                                          for a in test):
        X = _as_array(test[0]).astype(np.float32, copy=False)
        return (X[:, None] if X.ndim == 1 else X), _targets(_as_array(test[1]), what)
    if column is not None and hasattr(test, "column_names"):
        return column(test)
    return dataset_arrays(test, what)


@dataclass(frozen=True)
class FederationParts:
    """What a source read, for :class:`~fedselect.data.Federation` to assemble.

    Attributes
    ----------
    X, y : ndarray
        The training pool.
    client_indices : list of ndarray
        Each client's indices into the pool, before any holdout.
    X_test, y_test : ndarray
    holdout : float
        Fraction of each client's data to hold out (split by the Federation's assembly).
    rng : numpy.random.RandomState
        The stream the holdout split draws from.
    n_classes : int
    name : str
    metadata : dict
    """

    X: np.ndarray
    y: np.ndarray
    client_indices: list[np.ndarray]
    X_test: np.ndarray
    y_test: np.ndarray
    holdout: float
    rng: np.random.RandomState
    n_classes: int
    name: str
    metadata: dict[str, Any]


def _finish(
    X: np.ndarray, y: np.ndarray, parts: list[np.ndarray], X_test: np.ndarray, y_test: np.ndarray, *,
    holdout: float, rng: np.random.RandomState, n_classes: int | None, name: str, metadata: dict[str, Any],
) -> FederationParts:
    if np.issubdtype(y.dtype, np.integer):
        found = int(max(y.max(), np.asarray(y_test).max()) + 1)
        if n_classes is None:
            n_classes = found
        elif found > n_classes:
            raise ValueError(f"n_classes={n_classes} but the data has label {found - 1}")
    return FederationParts(X=X, y=y, client_indices=parts, X_test=X_test, y_test=y_test, holdout=holdout, rng=rng,
                           n_classes=int(n_classes if n_classes is not None else 10), name=name, metadata=metadata)


def _check_holdout(holdout: float) -> float:
    if isinstance(holdout, bool) or not isinstance(holdout, (int, float, np.floating)) or not 0 <= holdout < 1:
        raise ValueError(f"holdout={holdout!r} must be a number in [0, 1)")
    return float(holdout)


def split_pool(
    y: np.ndarray, partition: str | Callable[..., list[np.ndarray]], n_clients: int, rng: np.random.RandomState,
    partition_params: Mapping[str, Any], what: str,
) -> tuple[list[np.ndarray], str]:
    """Partition a pool by a named scheme or a function; float targets only allow label-free schemes."""
    if isinstance(n_clients, bool) or not isinstance(n_clients, (int, np.integer)) or n_clients < 1:
        raise ValueError(f"{what}: n_clients={n_clients!r} must be a positive integer")
    if n_clients > y.shape[0]:
        raise ValueError(f"{what}: n_clients={n_clients} is more than the {y.shape[0]} training samples")
    regression = np.issubdtype(y.dtype, np.floating)
    if callable(partition):
        scheme = getattr(partition, "__name__", type(partition).__name__)
        try:
            parts = list(partition(y, int(n_clients), random_state=rng, **partition_params))
        except TypeError as exc:
            raise ValueError(
                f"{what}: partition function {scheme!r} rejected the parameters {sorted(partition_params)}: {exc}"
            ) from exc
        if len(parts) != n_clients:
            raise ValueError(f"{what}: partition function {scheme!r} returned {len(parts)} parts for "
                             f"{n_clients} clients")
        flat = np.concatenate([np.asarray(p, dtype=np.int64).ravel() for p in parts])
        if np.unique(flat).size != flat.size:
            raise ValueError(f"{what}: partition function {scheme!r} gave the same sample to more than one client")
        return parts, scheme
    if partition not in PARTITIONS:
        raise ValueError(f"{what}: partition={partition!r} is not one of {sorted(PARTITIONS)} or a function "
                         "f(y, n_clients, random_state=..., **params) -> one index array per client")
    if regression and partition != "iid":
        raise ValueError(
            f"{what}: partition={partition!r} splits by class label, but the targets are floats (regression); "
            "use partition='iid', a partition function of your own, or one Dataset per client"
        )
    labels = np.zeros(y.shape[0], dtype=np.int64) if regression else y
    return _partition_by_name(labels, partition, int(n_clients), random_state=rng, **partition_params), partition


def parts_from_datasets(
    train: Any,
    test: Any,
    *,
    partition: str | Callable[..., list[np.ndarray]] | None = None,
    n_clients: int | None = None,
    holdout: float = 0.0,
    random_state: Any = None,
    n_classes: int | None = None,
    name: str = "",
    **partition_params: Any,
) -> FederationParts:
    """The parts of a :class:`~fedselect.data.Federation` from torch Datasets; see :meth:`Federation.from_datasets`."""
    from torch.utils.data import Dataset

    holdout = _check_holdout(holdout)
    rng = check_random_state(random_state)
    seed = random_state if isinstance(random_state, int | np.integer) or random_state is None else "RandomState"
    per_client = isinstance(train, Sequence) and not isinstance(train, Dataset) and len(train) > 0 \
        and all(isinstance(d, Dataset) for d in train)
    if per_client:
        if partition not in (None, "natural"):
            raise ValueError(f"Federation.from_datasets: partition={partition!r} cannot split a list of per-client "
                             "Datasets (each Dataset is one client); leave partition unset, or pass one Dataset")
        if partition_params:
            raise ValueError(f"Federation.from_datasets: per-client Datasets take no partition parameters, got "
                             f"{sorted(partition_params)}")
        if n_clients is not None and n_clients != len(train):
            raise ValueError(f"Federation.from_datasets: n_clients={n_clients} but {len(train)} per-client "
                             "Datasets were given (one client each)")
        arrays = [dataset_arrays(d, f"Federation.from_datasets: train[{k}]") for k, d in enumerate(train)]
        shapes = {a[0].shape[1:] for a in arrays}
        if len(shapes) > 1:
            raise ValueError(f"Federation.from_datasets: the per-client Datasets have inputs of different shapes "
                             f"{sorted(shapes)}")
        X = np.concatenate([a[0] for a in arrays])
        y = np.concatenate([a[1] for a in arrays])
        sizes = np.cumsum([0] + [a[1].shape[0] for a in arrays])
        parts = [np.arange(sizes[k], sizes[k + 1], dtype=np.int64) for k in range(len(arrays))]
        scheme = "natural"
        n_clients = len(arrays)
    else:
        if partition == "natural":
            raise ValueError("Federation.from_datasets: partition='natural' needs one Dataset per client (a list)")
        X, y = dataset_arrays(train, "Federation.from_datasets: train")
        n_clients = 10 if n_clients is None else n_clients
        parts, scheme = split_pool(y, "iid" if partition is None else partition, n_clients, rng, partition_params,
                                   "Federation.from_datasets")
    X_test, y_test = _test_arrays(test, "Federation.from_datasets: test")
    metadata: dict[str, Any] = {"dataset": name or "torch-datasets", "n_clients": int(n_clients), "holdout": holdout,
                                "random_state": seed, "partition": scheme, **partition_params}
    label = name or f"datasets/{scheme}/{n_clients} clients"
    return _finish(X, y, parts, X_test, y_test, holdout=holdout, rng=rng, n_classes=n_classes, name=label,
                   metadata=metadata)


def _columns(ds: Any, features: str | None, target: str, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(X, y) of a Hugging Face ``datasets.Dataset`` (duck-typed: column_names, features, with_format)."""
    names = list(ds.column_names)
    if target not in names:
        raise ValueError(f"{what}: no target column {target!r}; the columns are {names} (set target=...)")
    if features is None:
        others = [c for c in names if c != target]
        if len(others) != 1:
            raise ValueError(f"{what}: cannot tell which of the columns {others} holds the inputs; set features=...")
        features = others[0]
    elif features not in names:
        raise ValueError(f"{what}: no feature column {features!r}; the columns are {names}")
    table = ds.with_format("numpy")[:]
    X, y = np.asarray(table[features]), np.asarray(table[target])
    if type(ds.features[features]).__name__ == "Image":  # uint8 (n, H, W[, C]) -> float (n, C, H, W) in [0, 1]
        X = X.astype(np.float32) / 255.0
        X = X[:, None] if X.ndim == 3 else np.moveaxis(X, -1, 1)
    if X.dtype == object:
        raise ValueError(f"{what}: column {features!r} holds items of different shapes; make every input one shape")
    X = X.astype(np.float32, copy=False)
    if X.ndim == 1:
        X = X[:, None]
    return X, _targets(y, f"{what}: column {target!r}")


def parts_from_partitioner(
    partitioner: Any,
    test: Any,
    *,
    features: str | None = None,
    target: str = "label",
    holdout: float = 0.0,
    random_state: Any = None,
    n_classes: int | None = None,
    name: str = "",
) -> FederationParts:
    """The parts of a :class:`~fedselect.data.Federation` from a Flower Datasets partitioner; see
    :meth:`Federation.from_partitioner`."""
    what = "Federation.from_partitioner"
    if not (hasattr(partitioner, "load_partition") and hasattr(partitioner, "num_partitions")):
        raise TypeError(f"{what}: expected a flwr_datasets Partitioner (with load_partition and num_partitions), "
                        f"got {type(partitioner).__name__}")
    assigned = getattr(partitioner, "is_dataset_assigned", None)
    if callable(assigned) and not assigned():
        raise ValueError(f"{what}: the partitioner has no dataset; set partitioner.dataset = <datasets.Dataset> "
                         "first (fedselect never downloads one)")
    holdout = _check_holdout(holdout)
    rng = check_random_state(random_state)
    n = int(partitioner.num_partitions)
    arrays = []
    for k in range(n):
        arrays.append(_columns(partitioner.load_partition(k), features, target, f"{what}: partition {k}"))
    empty = [k for k, a in enumerate(arrays) if a[1].shape[0] == 0]
    if empty:
        raise ValueError(f"{what}: partition(s) {empty[:10]} are empty; every client needs data (lower "
                         "num_partitions, or set the partitioner's min_partition_size)")
    X = np.concatenate([a[0] for a in arrays])
    y = np.concatenate([a[1] for a in arrays])
    sizes = np.cumsum([0] + [a[1].shape[0] for a in arrays])
    parts = [np.arange(sizes[k], sizes[k + 1], dtype=np.int64) for k in range(n)]
    X_test, y_test = _test_arrays(test, f"{what}: test", column=lambda ds: _columns(ds, features, target,
                                                                                    f"{what}: test"))
    seed = random_state if isinstance(random_state, int | np.integer) or random_state is None else "RandomState"
    kind = type(partitioner).__name__
    metadata = {"dataset": name or "flwr-datasets", "partition": kind, "n_clients": n, "holdout": holdout,
                "random_state": seed}
    return _finish(X, y, parts, X_test, y_test, holdout=holdout, rng=rng, n_classes=n_classes,
                   name=name or f"flwr-datasets/{kind}/{n} clients", metadata=metadata)
