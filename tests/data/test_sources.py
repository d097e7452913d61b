"""Federations from torch Datasets and from Flower Datasets partitioners (offline, from arrays)."""

from __future__ import annotations

import subprocess
import sys
from itertools import pairwise

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from fedselect import FederatedTrainer
from fedselect.data import Federation, make_federation


def _arrays(n=240, seed=0, n_classes=4, shape=(1, 8, 8)):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, *shape)).astype(np.float32), rng.integers(0, n_classes, size=n)


class Pairs(Dataset):
    """A map-style Dataset returning (numpy input, python int) pairs, as user code often does."""

    def __init__(self, X, y):
        self.X, self.y = X, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.X[i], int(self.y[i])


def test_from_dataset_materialises_and_partitions_like_make_federation():
    X, y = _arrays()
    fed = Federation.from_datasets(Pairs(X[:200], y[:200]), (X[200:], y[200:]), partition="shards", n_clients=10,
                                   shards_per_client=1, random_state=0, holdout=0.2)
    np.testing.assert_array_equal(fed.X, X[:200])
    np.testing.assert_array_equal(fed.y, y[:200])
    assert fed.y.dtype == np.int64 and fed.n_classes == 4 and fed.n_clients == 10
    assert (fed.label_histogram() > 0).sum(axis=1).max() <= 2  # one shard: one or two labels
    assert fed.eval_indices is not None
    # the same partition as partitioning the arrays directly with the same seed
    from fedselect.data.partition import shard_partition

    direct = shard_partition(y[:200], 10, shards_per_client=1, random_state=np.random.RandomState(0))
    together = [np.sort(np.concatenate([a, b])) for a, b in zip(fed.client_indices, fed.eval_indices)]
    for a, b in zip(together, direct):
        np.testing.assert_array_equal(a, b)
    again = Federation.from_datasets(TensorDataset(torch.from_numpy(X[:200]), torch.from_numpy(y[:200])),
                                     Pairs(X[200:], y[200:]), partition="shards", n_clients=10, shards_per_client=1,
                                     random_state=0, holdout=0.2)
    for a, b in zip(again.client_indices, fed.client_indices):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(again.X_test, X[200:])


def test_per_client_datasets_are_the_natural_partition_and_train():
    X, y = _arrays(n=300)
    sizes = [30, 70, 50, 60, 40]
    cuts = np.cumsum([0, *sizes])
    clients = [TensorDataset(torch.from_numpy(X[a:b]), torch.from_numpy(y[a:b])) for a, b in pairwise(cuts)]
    fed = Federation.from_datasets(clients, TensorDataset(torch.from_numpy(X[250:]), torch.from_numpy(y[250:])))
    assert fed.n_samples.tolist() == sizes
    for k, (a, b) in enumerate(pairwise(cuts)):
        np.testing.assert_array_equal(fed.X[fed.client_indices[k]], X[a:b])
    assert fed.metadata["partition"] == "natural"
    FederatedTrainer(rounds=2, clients_per_round=2, random_state=0).fit(fed)
    with pytest.raises(ValueError, match="each Dataset is one client"):
        Federation.from_datasets(clients, (X[:10], y[:10]), partition="shards")
    with pytest.raises(ValueError, match="n_clients=3 but 5 per-client Datasets"):
        Federation.from_datasets(clients, (X[:10], y[:10]), n_clients=3)


def test_regression_datasets_and_label_partitions():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 3)).astype(np.float32)
    y = (X.sum(1) + 0.1).astype(np.float32)
    ds = TensorDataset(torch.from_numpy(X[:100]), torch.from_numpy(y[:100]))
    fed = Federation.from_datasets(ds, (X[100:], y[100:]), n_clients=4, random_state=0)
    assert fed.regression and fed.n_outputs == 1 and fed.y.dtype == np.float32
    assert "labels" not in fed.client_pool().metadata
    with pytest.raises(ValueError, match="regression"):
        fed.label_histogram()
    with pytest.raises(ValueError, match=r"partition='dirichlet' splits by class label.*floats"):
        Federation.from_datasets(ds, (X[100:], y[100:]), partition="dirichlet", n_clients=4, alpha=0.5)
    tr = FederatedTrainer(model="logistic", loss="mse", rounds=5, clients_per_round=2, random_state=0).fit(fed)
    assert tr.history_.rounds[-1].test_loss < tr.history_.rounds[0].test_loss


def test_clear_errors_for_datasets_that_cannot_be_read():
    class Images(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return object(), 1

    with pytest.raises(TypeError, match=r"ToTensor"):
        Federation.from_datasets(Images(), (np.zeros((1, 2), np.float32), np.zeros(1, np.int64)), n_clients=2)

    class Triples(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.zeros(2), 1, 2

    with pytest.raises(ValueError, match=r"\(input, target\) pair"):
        Federation.from_datasets(Triples(), (np.zeros((1, 2), np.float32), np.zeros(1, np.int64)), n_clients=2)


def test_importing_fedselect_does_not_import_flower_datasets():
    code = ("import sys, fedselect, fedselect.data, fedselect.data.sources; "
            "bad = [m for m in ('flwr_datasets', 'datasets') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- Flower Datasets (optional extra): offline, a Dataset built from arrays -------------------------------------------
def test_from_partitioner_equals_the_partitions():
    pytest.importorskip("flwr_datasets")
    from datasets import Dataset as HFDataset
    from flwr_datasets.partitioner import DirichletPartitioner

    X, y = _arrays(n=300)
    part = DirichletPartitioner(num_partitions=6, partition_by="label", alpha=0.5, seed=0, min_partition_size=5)
    part.dataset = HFDataset.from_dict({"x": X[:250], "label": y[:250]})
    fed = Federation.from_partitioner(part, test=(X[250:], y[250:]))
    assert fed.n_clients == 6 and fed.input_shape == (1, 8, 8) and fed.n_classes == 4
    for k in range(6):
        p = part.load_partition(k).with_format("numpy")[:]
        np.testing.assert_array_equal(fed.X[fed.client_indices[k]], p["x"])
        np.testing.assert_array_equal(fed.y[fed.client_indices[k]], p["label"])
    # the test split may also be a Hugging Face Dataset with the same columns
    fed2 = Federation.from_partitioner(part, test=HFDataset.from_dict({"x": X[250:], "label": y[250:]}), holdout=0.2,
                                       random_state=0)
    np.testing.assert_array_equal(fed2.X_test, X[250:])
    assert fed2.eval_indices is not None
    FederatedTrainer(rounds=2, clients_per_round=3, random_state=0).fit(fed2)


def test_from_partitioner_errors():
    pytest.importorskip("flwr_datasets")
    from datasets import Dataset as HFDataset
    from flwr_datasets.partitioner import IidPartitioner

    X, y = _arrays(n=60)
    part = IidPartitioner(num_partitions=3)
    with pytest.raises(ValueError, match="partitioner has no dataset"):
        Federation.from_partitioner(part, test=(X, y))
    part.dataset = HFDataset.from_dict({"x": X, "extra": y, "label": y})
    with pytest.raises(ValueError, match="set features="):
        Federation.from_partitioner(part, test=(X, y))
    with pytest.raises(ValueError, match="no target column 'y'"):
        Federation.from_partitioner(part, test=(X, y), features="x", target="y")
    assert Federation.from_partitioner(part, test=(X, y), features="x").n_clients == 3
    with pytest.raises(TypeError, match="expected a flwr_datasets Partitioner"):
        Federation.from_partitioner(make_federation("digits", n_clients=2), test=(X, y))


def test_from_partitioner_image_column_becomes_channels_first_floats():
    pytest.importorskip("flwr_datasets")
    from datasets import Dataset as HFDataset
    from datasets import Image
    from flwr_datasets.partitioner import IidPartitioner
    from PIL import Image as PILImage

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(12, 6, 5, 3), dtype=np.uint8)
    ds = HFDataset.from_dict({"img": [PILImage.fromarray(p) for p in pixels], "label": list(range(12))})
    part = IidPartitioner(num_partitions=3)
    part.dataset = ds.cast_column("img", Image())
    fed = Federation.from_partitioner(part, test=part.dataset)
    assert fed.input_shape == (3, 6, 5) and fed.X.dtype == np.float32
    for k in range(3):
        labels = fed.y[fed.client_indices[k]]
        np.testing.assert_allclose(fed.X[fed.client_indices[k]], pixels[labels].transpose(0, 3, 1, 2) / 255.0,
                                   rtol=1e-6)
