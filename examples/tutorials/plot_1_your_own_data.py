"""
Your own data
=============

A built-in data set name is a shortcut. Underneath, every simulation runs on a
:class:`~fedselect.Federation`: one pool of training samples, the indices of each
client's share of it, optionally a held-out part of each share, and a shared test set.
This tutorial builds federations from data fedselect has never seen (NumPy arrays,
torch ``Dataset``\\ s, a Flower Datasets partitioner), splits it with the built-in
partitions and with a partition of your own, makes a regression federation, and hands
federations to :func:`~fedselect.compare.run_comparison`, either as one object or as a
factory that draws a new split for every seed. It ends with what a saved comparison
records about data it cannot name.
"""

# %%
# A federation is arrays
# ----------------------
# We use scikit-learn's ``digits`` (8 x 8 images of handwritten digits) as "your" data,
# loaded as plain arrays: inputs of shape ``(n, 1, 8, 8)`` in float32 and integer labels.
# A Federation needs:
#
# * ``X``, ``y``: the pool every client indexes into. Inputs are float32 of shape
#   ``(n, *input_shape)``; ``y`` holds integer labels ``0 .. n_classes - 1`` (or floats,
#   for regression, below);
# * ``client_indices``: one integer array per client, the rows of ``X`` it trains on;
# * ``X_test``, ``y_test``: the test set the global model is evaluated on;
# * optionally ``eval_indices``: per client, held-out rows on which its *loss* is
#   measured. Loss-based selectors (power-of-choice, AFL, FedCor) rank clients by those
#   losses. Measured on the data a client just trained on, a loss says how well the
#   client fits its own data; measured on held-out data, how well the model generalises
#   on that client. FedCor's official code holds out 20 % per client.
#
# The partition functions in ``fedselect.data.partition`` and
# :func:`~fedselect.data.split_holdout` work on plain arrays, so the whole federation
# can be assembled by hand:

import json
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
from sklearn.datasets import load_diabetes
from sklearn.utils import check_random_state
from torch.utils.data import TensorDataset

import fedselect
from fedselect.compare import run_comparison
from fedselect.data import (
    Federation,
    dirichlet_partition,
    dirichlet_qp_partition,
    iid_partition,
    load_digits_data,
    make_synthetic,
    shard_partition,
    split_holdout,
)
from fedselect.plotting import plot_accuracy

X, y, X_test, y_test = load_digits_data()
print(f"pool: X {X.shape} {X.dtype}, y {y.shape} {y.dtype}; test: {X_test.shape}")

parts = dirichlet_partition(y, 20, alpha=0.3, random_state=0)
train_idx, held_idx = split_holdout(parts, 0.2, random_state=0)
fed = Federation(X, y, train_idx, X_test, y_test, eval_indices=held_idx, n_classes=10,
                 name="digits, Dirichlet(0.3), 20 clients")
print(fed.summary())
print("client 0 trains on", fed.n_train_samples[0], "samples and is measured on", len(fed.eval_indices[0]),
      "; its weight p_0 =", round(float(fed.weights[0]), 4))

# %%
# The constructor checks what it is given and names the argument at fault, e.g. a label
# outside ``0 .. n_classes - 1`` or a client without data:

for bad in (dict(n_classes=9), dict(client_indices=[parts[0], np.array([], dtype=np.int64)])):
    try:
        Federation(**{"X": X, "y": y, "client_indices": parts, "X_test": X_test, "y_test": y_test, **bad})
    except ValueError as exc:
        print("ValueError:", exc)

# %%
# Partitions, built in and your own
# ---------------------------------
# How the pool is split decides how hard the federation is and how much client selection
# can matter. The built-in schemes take the labels and return one index array per client:
#
# * ``iid``: shuffle and deal evenly; every client looks like the whole data set;
# * ``shards``: McMahan et al.'s split: sort by label, cut into ``2 N`` shards, deal two
#   to each client, so most clients see two digits;
# * ``dirichlet``: each class is spread over the clients by Dir(alpha) shares; small
#   ``alpha`` gives strong label skew *and* unequal sizes;
# * ``dirichlet-qp``: FedCor's variant: each client draws its own label mix from
#   Dir(alpha p) and the client sizes solve a quadratic programme.
#
# A partition of your own is any function ``f(y, n_clients, random_state=..., **params)``
# returning one index array per client. This one gives *quantity* skew without label
# skew: every client's labels follow the data set's, but its size is drawn from a
# Dirichlet, so a few clients hold most of the data. (Every client keeps at least a
# quarter of an equal share, so none is empty.)


def quantity_skew(y, n_clients, *, random_state=None, concentration=0.5):
    """IID labels, unequal sizes: client shares ~ Dir(concentration), floored at 1 / (4 N)."""
    rng = check_random_state(random_state)
    shares = 0.25 / n_clients + 0.75 * rng.dirichlet(np.full(n_clients, concentration))
    cuts = np.round(np.cumsum(shares)[:-1] * len(y)).astype(int)
    return [np.sort(p) for p in np.split(rng.permutation(len(y)), cuts)]


splits = {
    "iid": iid_partition(y, 20, random_state=0),
    "shards, 2 per client": shard_partition(y, 20, shards_per_client=2, random_state=0),
    "dirichlet, alpha=0.3": dirichlet_partition(y, 20, alpha=0.3, random_state=0),
    "dirichlet-qp, alpha=0.3": dirichlet_qp_partition(y, 20, alpha=0.3, random_state=0),
    "quantity_skew (ours)": quantity_skew(y, 20, concentration=0.3, random_state=0),
}
fig, axes = plt.subplots(1, len(splits), figsize=(16, 3.6), sharey=True, constrained_layout=True)
colors = plt.get_cmap("tab10").colors
for ax, (title, split) in zip(axes, splits.items()):
    counts = np.stack([np.bincount(y[idx], minlength=10) for idx in split])
    bottom = np.zeros(len(split))
    for digit in range(10):
        ax.bar(np.arange(len(split)), counts[:, digit], bottom=bottom, color=colors[digit], width=0.85,
               label=str(digit))
        bottom += counts[:, digit]
    ax.set_title(title, fontsize="medium")
    ax.set_xlabel("client")
axes[0].set_ylabel("training samples, by digit")
axes[-1].legend(title="digit", bbox_to_anchor=(1.02, 1), loc="upper left", fontsize="small")
fig.suptitle("One pool (digits, 1,347 training images), five ways to split it over 20 clients")
plt.show()

# %%
# The same picture in numbers: how many digits each client sees, and how unequal the
# client sizes are.

for title, split in splits.items():
    sizes = np.array([len(p) for p in split])
    labels = np.array([len(np.unique(y[p])) for p in split])
    print(f"{title:>24}: digits per client {labels.mean():4.1f} (min {labels.min():2d}), "
          f"sizes {sizes.min():3d} .. {sizes.max():3d}")

# %%
# From torch Datasets
# -------------------
# Data often arrives as a torch ``Dataset``. :meth:`Federation.from_datasets
# <fedselect.Federation.from_datasets>` takes a map-style Dataset of ``(input,
# target)`` items and partitions it by a scheme name or by a function such as ours
# (its parameters follow as keywords); the test split is a Dataset or an ``(X_test,
# y_test)`` pair. A *list* of Datasets is taken as one client each instead (the natural
# partition, for data that comes already split by user, hospital or device; the gallery
# example "Your own data and model" does that).
#
# The Datasets are read once, into the in-memory pool the batched engine draws every
# client's minibatches from: the inputs take ``n x prod(input_shape) x 4`` bytes
# (60,000 images of 28 x 28 take 188 MB), and a Dataset's ``transform`` runs once, when
# it is read, so random augmentation is not redrawn per epoch.

train_ds = TensorDataset(torch.from_numpy(X), torch.from_numpy(y))
skewed = Federation.from_datasets(train_ds, (X_test, y_test), partition=quantity_skew, n_clients=20,
                                  concentration=0.3, holdout=0.2, random_state=0, name="digits, quantity skew")
print(skewed)
print(skewed.metadata)

# %%
# From a Flower Datasets partitioner
# ----------------------------------
# Flower Datasets (``flwr-datasets``) has partitioners fedselect does not reimplement:
# ``NaturalIdPartitioner`` (one client per writer or user id), ``PathologicalPartitioner``,
# ``ShardPartitioner`` and more, all over Hugging Face ``datasets``.
# :meth:`Federation.from_partitioner <fedselect.Federation.from_partitioner>` turns
# any partitioner whose ``dataset`` is set into a Federation (partition k is client k).
# It needs an optional extra, ``pip install "fedselect[flwr-datasets]"``, about 300 MB
# on top of fedselect (``datasets``, ``pyarrow``, ``pandas``). The extra is not installed
# where this documentation is built, so the following code is shown, not executed::
#
#     from datasets import Dataset
#     from flwr_datasets.partitioner import DirichletPartitioner
#
#     part = DirichletPartitioner(num_partitions=20, partition_by="label", alpha=0.3, seed=0)
#     part.dataset = Dataset.from_dict({"x": X.reshape(len(X), -1), "label": y})
#     fed = Federation.from_partitioner(part, test=(X_test.reshape(len(X_test), -1), y_test),
#                                       holdout=0.2, random_state=0)
#
# fedselect never downloads data here: give the partitioner a dataset you loaded
# yourself. An ``Image`` column becomes float32 in [0, 1], channels first; the input and
# target columns are named by ``features=`` and ``target=`` when there are more than two.
#
# Clients that differ in their inputs: FedProx's synthetic data
# -------------------------------------------------------------
# :func:`~fedselect.data.make_synthetic` generates FedProx's Synthetic(alpha, beta): each
# client has its own model (alpha: how much the models differ) and its own input
# distribution (beta: how much the inputs differ), and client sizes follow a power law.
# It returns one ``(X_k, y_k)`` pair per client, exactly what a natural partition is, so
# the arrays constructor takes it after stacking (here each client keeps 20 % of its
# samples for the shared test set). ``make_federation("synthetic", alpha=1, beta=1)`` is
# the same in one call.

rng = np.random.RandomState(0)
pool_X, pool_y, test_X, test_y, clients = [], [], [], [], []
start = 0
for Xk, yk in make_synthetic(1.0, 1.0, 30, random_state=0):
    order = rng.permutation(len(yk))
    n_train = int(0.8 * len(yk))
    pool_X.append(Xk[order[:n_train]])
    pool_y.append(yk[order[:n_train]])
    test_X.append(Xk[order[n_train:]])
    test_y.append(yk[order[n_train:]])
    clients.append(np.arange(start, start + n_train))
    start += n_train
synthetic = Federation(np.concatenate(pool_X), np.concatenate(pool_y), clients, np.concatenate(test_X),
                       np.concatenate(test_y), n_classes=10, name="Synthetic(1, 1)")
print(synthetic.summary())

# %%
# Regression: float targets
# -------------------------
# A Federation whose targets are floats is a *regression* federation: ``fed.regression``
# is True, ``fed.n_outputs`` is the number of targets per sample (the model's output
# size), and there are no labels. Here scikit-learn's diabetes data (442 patients, 10
# features, disease progression after a year) is split over 8 clinics by patient age,
# youngest first; features and target are standardised with the training rows'
# statistics.

diabetes = load_diabetes()
order = np.random.RandomState(0).permutation(len(diabetes.target))
test_rows, train_rows = order[:88], order[88:]
Xd = diabetes.data
Xd = ((Xd - Xd[train_rows].mean(axis=0)) / Xd[train_rows].std(axis=0)).astype(np.float32)
yd = ((diabetes.target - diabetes.target[train_rows].mean()) / diabetes.target[train_rows].std()).astype(np.float32)
by_age = train_rows[np.argsort(Xd[train_rows, 0], kind="stable")]
regression = Federation(Xd, yd, np.array_split(by_age, 8), Xd[test_rows], yd[test_rows],
                        name="diabetes, 8 clinics by age")
print(regression.summary())
print("regression:", regression.regression, "| n_outputs:", regression.n_outputs)

# %%
# Partitions that split by label have nothing to split here, and say so:

try:
    Federation.from_datasets(TensorDataset(torch.from_numpy(Xd), torch.from_numpy(yd)), (Xd[:10], yd[:10]),
                             partition="shards", n_clients=8)
except ValueError as exc:
    print("ValueError:", exc)

# %%
# A regression federation trains with ``loss="mse"`` (or a per-sample loss of your own);
# there is no accuracy, so the history records the test loss and ``test_accuracy`` is
# None. The registered ``"logistic"`` model is one linear layer, so with ``loss="mse"``
# this is federated linear regression (a standardised target has variance 1, so a test
# MSE of 1 is what predicting the mean gives). The next tutorial, "Your own model",
# goes further: losses of your own and selectors ranking clients by them.

history = fedselect.FederatedTrainer(model="logistic", loss="mse", clients_per_round=3, rounds=20,
                                     batch_size=16, lr=0.1, random_state=0, n_threads=1).fit(regression).history_
print(f"test MSE after round 0: {history.rounds[0].test_loss:.3f}, after round 19: "
      f"{history.rounds[-1].test_loss:.3f}; test_accuracy: {history.rounds[-1].test_accuracy}")

# %%
# Into a comparison: one object, or a factory per seed
# ----------------------------------------------------
# :func:`~fedselect.compare.run_comparison` takes your data in two forms, and they
# answer different questions:
#
# * **a Federation object** is used for every seed. The seed then varies only the model's
#   initial weights, the minibatch order and the selection: the spread over seeds is the
#   training noise on *this* split of the data;
# * **a factory** ``f(seed) -> Federation`` builds each seed's federation. Drawing the
#   split with the seed makes the spread include the luck of the split too, which is
#   what a claim about "Dirichlet(0.3) federations" in general needs. Within one seed,
#   every scheme still sees the same federation, so the comparison stays paired.
#
# (For a built-in data set, the mapping ``federation={"dataset": "digits", "partition":
# "dirichlet", "alpha": 0.3, ...}`` is such a factory already.) The factory must build
# the same federation whenever it is given the same seed, so it seeds every random draw
# with it:


def dirichlet_digits(seed):
    """Seed ``seed``'s federation: a new Dirichlet(0.3) split of the digits pool."""
    return Federation.from_datasets(train_ds, (X_test, y_test), partition="dirichlet", alpha=0.3, n_clients=20,
                                    holdout=0.2, random_state=seed, name=f"digits, Dirichlet(0.3), split {seed}")


TARGET = 0.8
trainer = {"model": "logistic", "clients_per_round": 4, "rounds": 20, "local_epochs": 1, "batch_size": 16,
           "lr": 0.1, "n_threads": 1}
schemes = ["random", "power-of-choice"]
out_dir = Path(tempfile.mkdtemp()) / "factory"
one_split = run_comparison(schemes, federation=fed, trainer=trainer, seeds=range(5), target=TARGET, progress=False)
new_splits = run_comparison(schemes, federation=dirichlet_digits, trainer=trainer, seeds=range(5), target=TARGET,
                            progress=False, out_dir=out_dir)
for source, comparison in (("one Federation object", one_split), ("a factory, one split per seed", new_splits)):
    print(source)
    for row in comparison.rows():
        each = [r if r is not None else f">{trainer['rounds']}" for r in row["rounds_to_target_each"]]
        print(f"  {row['scheme']:>15}: rounds to {TARGET:.0%} per seed {each}, "
              f"final accuracy {row['final_accuracy']:.3f}")

# %%
# The curves: mean over the five seeds, with a band of plus and minus one standard
# deviation.

fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True, constrained_layout=True)
for ax, (title, comparison) in zip(axes, (("one split (a Federation object), 5 seeds", one_split),
                                          ("a new split per seed (a factory), 5 seeds", new_splits))):
    plot_accuracy({k: [v[s] for s in sorted(v)] for k, v in comparison.histories.items()}, target=TARGET, ax=ax,
                  title=title, setting=False)
axes[1].set_ylabel("")
fig.suptitle("digits, Dirichlet(0.3), 20 clients with 20 % held out, 4 per round, logistic regression")
plt.show()

# %%
# Read the two panels as answers to two questions. On the left, every seed trains on
# the same clients, so a difference between the schemes is a statement about *this*
# federation. On the right, each seed also draws a new split, so the same difference
# is a statement about Dirichlet(0.3) splits of digits in general, and the spread
# includes how lucky each split was. Both stay paired: within a seed, both schemes see
# one federation. Five seeds give no verdict either way (the gallery example on the
# paired test says how many one needs); the per-seed numbers above show how much
# individual seeds move.
#
# What the saved runs know about your data
# ----------------------------------------
# With ``out_dir``, each (scheme, seed) run is saved as it finishes, keyed by its
# settings, and a rerun skips finished runs. A data set name identifies built-in data,
# but your federation has no name the library can trust, so the settings identify it by
# content: a SHA-256 fingerprint of its arrays and client index lists (one pass over
# the data), and for a factory also its ``module:qualname``:

saved = json.loads(next((out_dir / "runs").glob("power-of-choice__seed0.json")).read_text())
print(json.dumps(saved["settings"]["federation"]))

# %%
# Rerunning the same call loads the finished runs instead of training (``log``
# receives the note that ``fedselect compare`` prints):

again = run_comparison(schemes, federation=dirichlet_digits, trainer=trainer, seeds=range(5), target=TARGET,
                       progress=False, out_dir=out_dir, log=print)
print("same histories as before:", again.histories == new_splits.histories)

# %%
# Because the fingerprint is of the content, a changed split is a settings mismatch,
# not a silent mix of old and new runs. And a factory that forgets to seed its split
# builds two different federations for one seed; the comparison notices before it
# trains anything:


def unseeded_digits(seed):
    return Federation.from_datasets(train_ds, (X_test, y_test), partition="dirichlet", alpha=0.3, n_clients=20)


try:
    run_comparison(["random"], federation=unseeded_digits, trainer=trainer, seeds=[0, 1], progress=False)
except ValueError as exc:
    print("ValueError:", exc)

# %%
# Where next
# ----------
# * :doc:`plot_2_your_own_model`: your own ``torch.nn.Module``, batch norm, regression
#   losses and momentum on federations like these.
# * :doc:`plot_3_your_own_scheme`: your own selection scheme, without packaging it.
