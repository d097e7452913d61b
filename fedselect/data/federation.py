"""A federation: a pool of training data, each client's share of it, and a shared test set."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any

import numpy as np
from sklearn.utils import check_random_state

from .._validation import InstanceOf, Interval, validate_parameters
from ..profiles import SystemProfiles
from ..selection import ClientPool
from .datasets import PathLike, _check_sizes, load_dataset, make_synthetic
from .partition import RegisteredPartition
from .partition import partition as _partition_by_name
from .profile_spec import PROFILE_KINDS, PROFILES_CONSTRAINTS, describe_profiles, resolve_profiles
from .sources import FederationParts, parts_from_datasets, parts_from_partitioner

__all__ = ["PROFILE_KINDS", "Federation", "describe_profiles", "make_federation", "resolve_profiles", "split_holdout"]


def _as_index_list(parts: Any, n: int, what: str) -> list[np.ndarray]:
    out = []
    for k, idx in enumerate(parts):
        arr = np.asarray(idx)
        if arr.ndim != 1:
            raise ValueError(f"{what}: client {k} has an index array of shape {arr.shape}; expected 1-D")
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{what}: client {k} has indices of dtype {arr.dtype}; expected integers")
        arr = arr.astype(np.int64)
        if arr.size and (arr.min() < 0 or arr.max() >= n):
            raise ValueError(f"{what}: client {k} has indices outside [0, {n}) (min {arr.min()}, max {arr.max()})")
        arr.setflags(write=False)
        out.append(arr)
    return out


@dataclass(frozen=True, eq=False)
class Federation:
    """The data of a simulated federation.

    Parameters
    ----------
    X : ndarray of float32, shape (n, ``*input_shape``)
        The pool every client's data indexes into.
    y : ndarray, shape (n,) or (n, d)
        Targets of the pool: integer class labels, shape (n,) (classification), or float
        regression targets, shape (n,) or (n, d) (a *regression* federation: train it with
        ``FederatedTrainer(loss="mse")`` or a callable loss; it has no labels, so no label
        histogram, and label-based partitions and selector metadata do not apply).
    client_indices : list of ndarray of int
        Per client, the indices into ``X`` it trains on.
    X_test, y_test : ndarray
        The shared test split the global model is evaluated on.
    eval_indices : list of ndarray of int, optional
        Per client, a held-out part of its data (indices into ``X``) on which its loss
        is measured (FedCor's official code: the last 20 % of its shuffled indices).
        ``None``: losses are measured on ``client_indices``.
    n_classes : int, optional
        Number of classes (ignored for float targets). Default: inferred from the labels,
        ``max(y.max(), y_test.max()) + 1``; give it when some classes appear in neither split.
    name : str, default=""
        A short label.
    metadata : dict
        How the federation was made (dataset, partition, parameters, seed).
    profiles : SystemProfiles, optional
        Each client's compute speed, bandwidth, latency and availability over simulated
        time (:mod:`fedselect.profiles`), one per client. None: homogeneous devices, always
        available; leaves every earlier result, fingerprint and run key unchanged.

    Attributes
    ----------
    n_clients : int
    input_shape : tuple
    regression : bool
        True when the targets are floats.
    n_outputs : int
        What a model must output per sample: ``n_classes``, or the number of regression targets.
    n_train_samples : ndarray of int64
        Size of each client's training part.
    n_samples : ndarray of int64
        n_k, the size of each client's full data (training and held-out parts).
    weights : ndarray of float
        p_k = n_k / sum_j n_j.
    loss_indices : list of ndarray
        Where each client's loss is measured: ``eval_indices`` or ``client_indices``.

    Examples
    --------
    >>> import numpy as np
    >>> fed = Federation(np.zeros((4, 2), np.float32), np.array([0, 1, 0, 1]), [np.array([0, 1]), np.array([2, 3])],
    ...                  np.zeros((1, 2), np.float32), np.array([0]), n_classes=2)
    >>> fed.n_clients, fed.weights.tolist()
    (2, [0.5, 0.5])
    """

    X: np.ndarray
    y: np.ndarray
    client_indices: list[np.ndarray]
    X_test: np.ndarray
    y_test: np.ndarray
    eval_indices: list[np.ndarray] | None = None
    n_classes: int | None = None  # type: ignore[assignment]  # inferred in __post_init__
    name: str = ""
    metadata: dict = field(default_factory=dict)
    profiles: SystemProfiles | None = None

    def __post_init__(self) -> None:
        X, y = np.asarray(self.X), np.asarray(self.y)
        X_test, y_test = np.asarray(self.X_test), np.asarray(self.y_test)
        regression = np.issubdtype(y.dtype, np.floating)
        max_dim = 2 if regression else 1
        if not 1 <= y.ndim <= max_dim or X.ndim < 2 or X.shape[0] != y.shape[0]:
            want = "(n,) or (n, d) float targets" if regression else "(n,) integer labels"
            raise ValueError(
                f"Federation: X has shape {X.shape} but y has shape {y.shape}; expected X of shape (n, ...) and {want}"
            )
        if y_test.shape[1:] != y.shape[1:] or X_test.shape[0] != y_test.shape[0]:
            raise ValueError(
                f"Federation: X_test has shape {X_test.shape} but y_test has shape {y_test.shape} "
                f"(training targets: {y.shape})"
            )
        if np.issubdtype(y_test.dtype, np.floating) != regression:
            raise ValueError(
                f"Federation: y has dtype {y.dtype} but y_test has dtype {y_test.dtype}; both must be "
                "integer labels (classification) or both floats (regression)"
            )
        if regression and not (np.isfinite(y).all() and np.isfinite(y_test).all()):
            raise ValueError("Federation: the regression targets y / y_test contain NaN or inf")
        if y_test.size == 0:
            raise ValueError("Federation: the test split is empty")
        if X_test.shape[1:] != X.shape[1:]:
            raise ValueError(f"Federation: test inputs are {X_test.shape[1:]} but training inputs {X.shape[1:]}")
        if self.n_classes is None:  # inferred from the labels (a float target makes it irrelevant)
            inferred = 1
            if not regression and y.size and np.issubdtype(y.dtype, np.integer):
                inferred = int(max(y.max(), y_test.max() if y_test.size else 0)) + 1
            object.__setattr__(self, "n_classes", inferred)
        for name, labels in (("y", y), ("y_test", y_test)) if not regression else ():
            if labels.size and (not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0):
                raise ValueError(f"Federation: {name} must hold non-negative integer labels")
            if labels.size and labels.max() >= self.n_classes:
                raise ValueError(f"Federation: {name} has label {labels.max()} but n_classes={self.n_classes}")
        clients = _as_index_list(self.client_indices, y.size, "client_indices")
        if not clients:
            raise ValueError("Federation: client_indices is empty; a federation needs at least one client")
        for k, idx in enumerate(clients):
            if idx.size == 0:
                raise ValueError(f"Federation: client {k} has no data (client_indices[{k}] is empty)")
        evals = None
        if self.eval_indices is not None:
            evals = _as_index_list(self.eval_indices, y.size, "eval_indices")
            if len(evals) != len(clients):
                raise ValueError(
                    f"Federation: eval_indices has {len(evals)} entries but there are {len(clients)} clients"
                )
            for k, idx in enumerate(evals):
                if idx.size == 0:
                    raise ValueError(f"Federation: client {k} has no held-out data (eval_indices[{k}] is empty)")
        if self.profiles is not None:
            if not isinstance(self.profiles, SystemProfiles):
                raise TypeError(
                    f"Federation: profiles must be a fedselect.profiles.SystemProfiles or None, got "
                    f"{type(self.profiles).__name__}"
                )
            if self.profiles.n_clients != len(clients):
                raise ValueError(
                    f"Federation: profiles describe {self.profiles.n_clients} clients but there are {len(clients)}"
                )
        object.__setattr__(self, "X", X)
        tdtype = np.float32 if regression else np.int64
        object.__setattr__(self, "y", y.astype(tdtype, copy=False))
        object.__setattr__(self, "X_test", X_test)
        object.__setattr__(self, "y_test", y_test.astype(tdtype, copy=False))
        object.__setattr__(self, "client_indices", clients)
        object.__setattr__(self, "eval_indices", evals)
        # Client sizes, counted once: the trainer reads them every round (a loop over 100,000 index arrays
        # costs tens of milliseconds); the properties hand out copies.
        n_train = np.array([idx.size for idx in clients], dtype=np.int64)
        n_held = np.zeros_like(n_train) if evals is None else np.array([idx.size for idx in evals], dtype=np.int64)
        object.__setattr__(self, "_n_train_samples", n_train)
        object.__setattr__(self, "_n_samples", n_train + n_held)

    @classmethod
    def from_datasets(
        cls,
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
    ) -> Federation:
        """A federation from torch Datasets: one pool to partition, or one Dataset per client.

        The Datasets are read once into arrays (``n * prod(input_shape) * 4`` bytes of
        float32 inputs: 60,000 images of 1 x 28 x 28 take 188 MB), because the batched engine
        gathers every client's minibatches from one in-memory pool; a Dataset's transform
        runs once, when it is read (random augmentation is not redrawn per epoch).

        Parameters
        ----------
        train : torch.utils.data.Dataset or list of Dataset
            A map-style Dataset of ``(input, target)`` items, partitioned across ``n_clients``
            by ``partition``; or a list of Datasets, one per client (the natural partition:
            client k holds exactly ``train[k]``). Inputs are tensors or arrays of one shape
            (torchvision: ``transform=transforms.ToTensor()``); targets are integer class
            labels, or floats for a regression federation (train it with ``loss="mse"``).
        test : Dataset or tuple of (X_test, y_test)
            The shared test split: a Dataset like ``train``, or two arrays / tensors.
        partition : {"iid", "shards", "dirichlet", "dirichlet-qp"}, callable or None
            For a single Dataset: a named scheme (default ``"iid"``; the label-based ones need
            integer labels) or ``f(y, n_clients, random_state=..., **partition_params)``
            returning one index array per client. Must be left None (or ``"natural"``) for a
            list of per-client Datasets.
        n_clients : int, optional
            Number of clients for a single Dataset (default 10); for a list, its length.
        holdout : float, default 0.0
            Fraction of each client's data held out to measure its loss (see :func:`split_holdout`).
        random_state : int, RandomState instance or None
            Seed of the partition and the holdout split.
        n_classes : int, optional
            Number of classes (default: the largest label + 1 over train and test).
        name : str, default ""
            A short label (also the ``dataset`` entry of ``metadata``).
        **partition_params
            Parameters of the partition scheme (``shards_per_client``, ``alpha``, ...).

        Returns
        -------
        Federation

        Examples
        --------
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> X, y = torch.randn(100, 3, 8, 8), torch.arange(100) % 4
        >>> fed = Federation.from_datasets(TensorDataset(X[:80], y[:80]), (X[80:], y[80:]),
        ...                                partition="shards", n_clients=8, shards_per_client=2, random_state=0)
        >>> fed.n_clients, fed.input_shape, fed.n_classes
        (8, (3, 8, 8), 4)
        >>> per_client = [TensorDataset(X[i : i + 20], y[i : i + 20]) for i in range(0, 80, 20)]
        >>> Federation.from_datasets(per_client, (X[80:], y[80:])).n_samples.tolist()
        [20, 20, 20, 20]
        """
        return _assemble(
            parts_from_datasets(
                train,
                test,
                partition=partition,
                n_clients=n_clients,
                holdout=holdout,
                random_state=random_state,
                n_classes=n_classes,
                name=name,
                **partition_params,
            )
        )

    @classmethod
    def from_partitioner(
        cls,
        partitioner: Any,
        test: Any,
        *,
        features: str | None = None,
        target: str = "label",
        holdout: float = 0.0,
        random_state: Any = None,
        n_classes: int | None = None,
        name: str = "",
    ) -> Federation:
        """A federation from a Flower Datasets partitioner: partition k is client k.

        Needs the optional extra ``pip install "fedselect[flwr-datasets]"`` (flwr-datasets
        0.6, which brings Hugging Face ``datasets``, ``pyarrow`` and ``pandas``: about 300 MB
        installed on top of fedselect's own dependencies, measured with pip into an empty
        target directory). fedselect itself never imports it, and never downloads data: give
        the partitioner a dataset first (``partitioner.dataset = ds``, e.g. a
        ``datasets.Dataset.from_dict({...})`` built from arrays, or one loaded by your own code).
        Every partition is loaded and read into arrays (see :meth:`from_datasets` for the memory).

        Parameters
        ----------
        partitioner : flwr_datasets.partitioner.Partitioner
            Any partitioner whose ``dataset`` is set (IidPartitioner, DirichletPartitioner,
            NaturalIdPartitioner, ...); ``num_partitions`` clients.
        test : datasets.Dataset, torch Dataset or tuple of (X_test, y_test)
            The shared test split (a Hugging Face Dataset with the same columns, a torch
            Dataset of (input, target) items, or two arrays).
        features : str, optional
            The input column; default: the one column other than ``target``. An ``Image``
            column becomes float32 in [0, 1], channels first (n, C, H, W).
        target : str, default "label"
            The target column: integer labels, or floats for regression.
        holdout : float, default 0.0
            Fraction of each client's data held out to measure its loss.
        random_state : int, RandomState instance or None
            Seed of the holdout split (the partition is the partitioner's, seeded by its own ``seed``).
        n_classes : int, optional
            Number of classes (default: the largest label + 1).
        name : str, default ""
            A short label.

        Returns
        -------
        Federation

        Raises
        ------
        ValueError
            The partitioner has no dataset, a partition is empty, or a column is missing or ambiguous.

        Examples
        --------
        >>> from datasets import Dataset  # doctest: +SKIP
        >>> from flwr_datasets.partitioner import DirichletPartitioner  # doctest: +SKIP
        >>> part = DirichletPartitioner(num_partitions=10, partition_by="label", alpha=0.3, seed=0)  # doctest: +SKIP
        >>> part.dataset = Dataset.from_dict({"x": X_train, "label": y_train})  # doctest: +SKIP
        >>> fed = Federation.from_partitioner(part, test=(X_test, y_test))  # doctest: +SKIP
        """
        return _assemble(
            parts_from_partitioner(
                partitioner,
                test,
                features=features,
                target=target,
                holdout=holdout,
                random_state=random_state,
                n_classes=n_classes,
                name=name,
            )
        )

    @property
    def n_clients(self) -> int:
        """N, the number of clients."""
        return len(self.client_indices)

    @property
    def regression(self) -> bool:
        """True when the targets are floats (regression), False for integer class labels."""
        return bool(np.issubdtype(self.y.dtype, np.floating))

    @property
    def n_outputs(self) -> int:
        """Outputs a model needs per sample: ``n_classes``, or the number of regression targets."""
        if not self.regression:
            return int(self.n_classes)
        return int(np.prod(self.y.shape[1:], dtype=np.int64)) if self.y.ndim > 1 else 1

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input (e.g. (1, 28, 28) or (60,))."""
        return tuple(self.X.shape[1:])

    @property
    def n_train_samples(self) -> np.ndarray:
        """Size of each client's training part."""
        return self._n_train_samples.copy()

    @property
    def n_samples(self) -> np.ndarray:
        """n_k: size of each client's full data, training plus held-out part."""
        return self._n_samples.copy()

    @property
    def weights(self) -> np.ndarray:
        """p_k = n_k / sum_j n_j."""
        n = self.n_samples
        return n / n.sum()

    @property
    def loss_indices(self) -> list[np.ndarray]:
        """Where each client's loss is measured: ``eval_indices`` if set, else ``client_indices``."""
        return self.eval_indices if self.eval_indices is not None else self.client_indices

    def label_histogram(self) -> np.ndarray:
        """Label counts of each client's full data, shape (n_clients, n_classes), int64.

        Raises
        ------
        ValueError
            For a regression federation (float targets have no labels).
        """
        if self.regression:
            raise ValueError("Federation.label_histogram: this federation has float (regression) targets, no labels")
        hist = np.zeros((self.n_clients, self.n_classes), dtype=np.int64)
        for k in range(self.n_clients):
            idx = self.client_indices[k]
            if self.eval_indices is not None:
                idx = np.concatenate([idx, self.eval_indices[k]])
            hist[k] = np.bincount(self.y[idx], minlength=self.n_classes)
        return hist

    def client_pool(self) -> ClientPool:
        """The federation as a selector sees it: client sizes n_k and label histograms (metadata "labels",
        absent for a regression federation)."""
        if self.regression:
            return ClientPool(self.n_samples, metadata={})
        return ClientPool(self.n_samples, metadata={"labels": self.label_histogram()})

    def summary(self) -> str:
        """One short paragraph describing the federation."""
        n = self.n_samples
        if self.regression:
            text = (
                f"Federation{' ' + repr(self.name) if self.name else ''}: {self.n_clients} clients holding "
                f"{int(n.sum())} samples of shape {self.input_shape} with {self.n_outputs} float target(s) "
                f"(regression); client sizes min {int(n.min())}, median {int(np.median(n))}, max {int(n.max())}; "
                f"{self.y_test.shape[0]} test samples."
            )
            if self.eval_indices is not None:
                text += f" {int(n.sum() - self.n_train_samples.sum())} samples are held out to measure losses."
            return text
        labels_per_client = (self.label_histogram() > 0).sum(axis=1)
        text = (
            f"Federation{' ' + repr(self.name) if self.name else ''}: {self.n_clients} clients holding "
            f"{int(n.sum())} samples of shape {self.input_shape} in {self.n_classes} classes; client sizes "
            f"min {int(n.min())}, median {int(np.median(n))}, max {int(n.max())}; labels per client "
            f"{labels_per_client.mean():.1f} on average (min {labels_per_client.min()}, "
            f"max {labels_per_client.max()}); {self.y_test.size} test samples."
        )
        if self.eval_indices is not None:
            held = int(n.sum() - self.n_train_samples.sum())
            text += f" {held} samples are held out across clients to measure their losses."
        return text

    def __repr__(self) -> str:
        kind = f"n_outputs={self.n_outputs} (regression)" if self.regression else f"n_classes={self.n_classes}"
        return (
            f"Federation(name={self.name!r}, n_clients={self.n_clients}, n_samples={int(self.n_samples.sum())}, "
            f"input_shape={self.input_shape}, {kind}, "
            f"holdout={'yes' if self.eval_indices is not None else 'no'})"
        )


def split_holdout(
    client_indices: list[np.ndarray], holdout: float, random_state: Any = None
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split each client's indices into a training part and a held-out part.

    Each client's indices are shuffled; the first ``int((1 - holdout) * n_k)`` form the
    training part and the rest the held-out part, and each part keeps at least one
    sample. FedCor's official code trains on the first 80 % of a client's indices and
    measures its loss on the other 20 % (``holdout=0.2``); its partition functions
    shuffle each client's indices first (``rs.shuffle(dict_users[i])`` in
    ``src/sampling.py`` for the shard and Dirichlet splits), so its held-out part is a
    random 20 % of the client's data, as here (with another random stream).

    Parameters
    ----------
    client_indices : list of ndarray
        Each client's indices.
    holdout : float
        Fraction held out, in (0, 1).
    random_state : int, RandomState instance or None
        Seed of the shuffles.

    Returns
    -------
    train, held_out : list of ndarray of int64
        Sorted index arrays.
    """
    if not 0.0 < holdout < 1.0:
        raise ValueError(f"holdout must be in (0, 1), got holdout={holdout}")
    rng = check_random_state(random_state)
    train, held = [], []
    for k, idx in enumerate(client_indices):
        idx = np.asarray(idx, dtype=np.int64)
        if idx.size < 2:
            raise ValueError(
                f"client {k} has {idx.size} sample(s); holdout={holdout} needs at least 2 per client "
                "(one to train on, one to measure the loss on)"
            )
        idx = rng.permutation(idx)
        n_train = min(max(int((1.0 - holdout) * idx.size), 1), idx.size - 1)
        train.append(np.sort(idx[:n_train]))
        held.append(np.sort(idx[n_train:]))
    return train, held


def _assemble(parts: FederationParts) -> Federation:
    """The Federation of what a source read (:mod:`fedselect.data.sources`), each client's holdout split off."""
    client, held = parts.client_indices, None
    if parts.holdout > 0:
        client, held = split_holdout(client, parts.holdout, parts.rng)
    return Federation(
        X=parts.X,
        y=parts.y,
        client_indices=client,
        X_test=parts.X_test,
        y_test=parts.y_test,
        eval_indices=held,
        n_classes=parts.n_classes,
        name=parts.name,
        metadata=parts.metadata,
    )


def _synthetic_pool(
    n_clients: int, rng: np.random.RandomState, alpha: float = 1.0, beta: float = 1.0, **params: Any
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], np.ndarray, np.ndarray, int]:
    if params.get("sizes") is not None and _check_sizes(params["sizes"], n_clients).min() < 2:
        raise ValueError(
            f"make_federation('synthetic'): sizes={params['sizes']!r:.60} gives some client fewer than 2 samples; "
            "each client keeps 80 % to train on and 20 % for the test split, so every size must be at least 2"
        )
    data = make_synthetic(alpha, beta, n_clients, random_state=rng, **params)
    X_tr, y_tr, X_te, y_te, parts = [], [], [], [], []
    start = 0
    for X, y in data:
        order = rng.permutation(y.size)
        n_train = int(0.8 * y.size)
        X_tr.append(X[order[:n_train]])
        y_tr.append(y[order[:n_train]])
        X_te.append(X[order[n_train:]])
        y_te.append(y[order[n_train:]])
        parts.append(np.arange(start, start + n_train, dtype=np.int64))
        start += n_train
    n_classes = int(params.get("n_classes", 10))
    return np.concatenate(X_tr), np.concatenate(y_tr), parts, np.concatenate(X_te), np.concatenate(y_te), n_classes


_MAKE_FEDERATION_CONSTRAINTS: dict[str, list[Any]] = {
    "dataset": [InstanceOf(str, "a registered dataset name or 'synthetic'")],
    "partition": [RegisteredPartition(extra=("natural",)), callable],  # plugins' schemes too
    "n_clients": [Interval(Integral, 1, None, closed="left")],
    "holdout": [Interval(Real, 0, 1, closed="left")],
    "random_state": ["random_state"],
    "download": ["boolean"],
    "profiles": PROFILES_CONSTRAINTS,
}


def make_federation(
    dataset: str = "digits",
    *,
    partition: str | Callable[..., list[np.ndarray]] = "iid",
    n_clients: int = 10,
    holdout: float = 0.0,
    random_state: Any = None,
    data_dir: PathLike | None = None,
    download: bool = False,
    profiles: Any = None,
    **partition_params: Any,
) -> Federation:
    """Load a dataset, partition its training split across clients and return the :class:`Federation`.

    Parameters
    ----------
    dataset : str, default="digits"
        A registered dataset (``digits``, ``fmnist``, ``mnist``, ``cifar10``, or a
        plugin's) or ``"synthetic"``: FedProx's Synthetic(alpha, beta), see
        :func:`~fedselect.data.make_synthetic` (``partition_params`` ``alpha`` and
        ``beta`` default to 1; ``n_features``, ``n_classes``, ``iid`` and ``sizes`` are passed on).
        Its clients are the generator's; each keeps a random 80 % for training and
        the union of the other 20 % parts is the test split. ``partition`` is ignored.
    partition : {"iid", "shards", "dirichlet", "dirichlet-qp"} or callable, default="iid"
        The scheme (see :mod:`fedselect.data.partition`), or a function
        ``f(y, n_clients, random_state=..., **partition_params)`` returning one index
        array per client.
    n_clients : int, default=10
        Number of clients N.
    holdout : float, default=0.0
        Fraction of each client's data held out to measure its loss (FedCor's official
        code: 0.2); see :func:`split_holdout`. 0 measures losses on the training data.
    random_state : int, RandomState instance or None
        Seed of everything random (partition, holdout split, synthetic data).
    data_dir : str or os.PathLike, optional
        Where the dataset's files are.
    download : bool, default=False
        Allow fetching missing files.
    profiles : None, str, path, mapping or SystemProfiles, default=None
        The clients' devices: ``"homogeneous"``, ``"mobile"`` (sampled phones), a profiles file,
        a mapping ``{"kind": ..., **generator parameters}`` or a SystemProfiles. None: no
        profiles, and no simulated clock unless the trainer asks for one. Each form is defined
        in :func:`resolve_profiles`; bad values raise before any data is loaded. The
        federation's ``metadata`` records ``profiles`` (as given) and ``profiles_fingerprint``
        (of the content) only when set, so federations without profiles keep their metadata and
        every comparison's run keys.
    **partition_params
        Parameters of the partition scheme (``shards_per_client``, ``alpha``, ...).

    Returns
    -------
    Federation

    Raises
    ------
    ValueError
        Bad ``n_clients``, ``holdout``, ``profiles`` or partition parameters, or more clients than samples.
    KeyError
        Unknown dataset; the message names the known ones.

    Examples
    --------
    >>> fed = make_federation("digits", partition="shards", n_clients=20, shards_per_client=2, random_state=0)
    >>> fed.n_clients, fed.input_shape
    (20, (1, 8, 8))
    """
    validate_parameters(
        "make_federation",
        {
            "dataset": dataset,
            "partition": partition,
            "n_clients": n_clients,
            "holdout": holdout,
            "random_state": random_state,
            "download": download,
            "profiles": profiles,
        },
        _MAKE_FEDERATION_CONSTRAINTS,
    )
    if profiles is not None and not isinstance(random_state, np.random.RandomState):
        # checked before the data is loaded; a RandomState is drawn from only once the data has been
        resolve_profiles(profiles, int(n_clients), random_state)
    rng = check_random_state(random_state)
    seed = random_state if isinstance(random_state, int | np.integer) or random_state is None else "RandomState"
    metadata: dict[str, Any] = {
        "dataset": dataset,
        "n_clients": int(n_clients),
        "holdout": holdout,
        "random_state": seed,
    }

    if dataset == "synthetic":
        if not isinstance(partition, str) or partition not in ("iid", "natural"):
            raise ValueError(
                f"partition={partition!r} cannot be used with dataset='synthetic': its clients are the generator's "
                "(leave partition at its default)"
            )
        try:
            X, y, parts, X_test, y_test, n_classes = _synthetic_pool(int(n_clients), rng, **partition_params)
        except TypeError as exc:
            raise ValueError(
                f"dataset 'synthetic' takes the parameters alpha, beta, n_features, n_classes, iid and sizes, "
                f"got {sorted(partition_params)}: {exc}"
            ) from exc
        metadata.update({"partition": "synthetic", "alpha": 1.0, "beta": 1.0, **partition_params})
        if np.ndim(partition_params.get("sizes")) == 1:  # a per-client array: recorded by a digest, not in full
            sz = np.asarray(partition_params["sizes"], dtype=np.int64)
            digest = hashlib.sha256(sz.tobytes()).hexdigest()[:16]
            metadata["sizes"] = (
                f"{sz.size} sizes, min {sz.min()}, mean {sz.mean():.1f}, max {sz.max()}, sha256 {digest}"
            )
        name = f"synthetic({metadata['alpha']}, {metadata['beta']})"
    else:
        try:
            X, y, X_test, y_test = load_dataset(dataset, data_dir=data_dir, download=download)
        except KeyError as exc:
            raise KeyError(f"{exc.args[0] if exc.args else exc}; also available: synthetic") from exc
        if n_clients > y.size:
            raise ValueError(f"n_clients={n_clients} is more than the {y.size} training samples of {dataset!r}")
        n_classes = int(max(y.max(), y_test.max()) + 1)
        if callable(partition):
            scheme = getattr(partition, "__name__", type(partition).__name__)
            try:
                parts = partition(y, int(n_clients), random_state=rng, **partition_params)
            except TypeError as exc:
                raise ValueError(
                    f"partition function {scheme!r} rejected the parameters {sorted(partition_params)}: {exc}"
                ) from exc
            parts = list(parts)
            if len(parts) != n_clients:
                raise ValueError(f"partition function {scheme!r} returned {len(parts)} parts for {n_clients} clients")
            flat = np.concatenate([np.asarray(p, dtype=np.int64).ravel() for p in parts])
            if np.unique(flat).size != flat.size:
                raise ValueError(f"partition function {scheme!r} gave the same sample to more than one client")
        else:
            scheme = partition
            parts = _partition_by_name(y, partition, int(n_clients), random_state=rng, **partition_params)
        metadata.update(partition=scheme, **partition_params)
        params = ", ".join(f"{k}={v}" for k, v in partition_params.items())
        name = f"{dataset}/{scheme}{f'({params})' if params else ''}/{n_clients} clients"

    eval_parts = None
    if holdout > 0:
        parts, eval_parts = split_holdout(parts, holdout, rng)
    devices = None
    if profiles is not None:  # after every draw of the data: the data is the same with or without profiles
        devices = resolve_profiles(profiles, int(n_clients), random_state)  # a RandomState: rng itself
        metadata.update(profiles=describe_profiles(profiles), profiles_fingerprint=devices.fingerprint())
    return Federation(
        X=X,
        y=y,
        client_indices=parts,
        X_test=X_test,
        y_test=y_test,
        eval_indices=eval_parts,
        n_classes=n_classes,
        name=name,
        metadata=metadata,
        profiles=devices,
    )
