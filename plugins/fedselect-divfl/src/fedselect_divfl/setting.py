"""The paper's setting as a plugin ships it: a partition scheme and presets.

DivFL's experiments (Balakrishnan et al., ICLR 2022, run with the FedProx code base) use
FedProx's federated data: Synthetic(1, 1) with 30 devices, and MNIST over 1,000 devices
where each device holds two digits in amounts that follow a power law. fedselect builds
Synthetic(alpha, beta) itself (``make_federation("synthetic", alpha=1, beta=1)``); the MNIST
split is :func:`power_law_partition`, registered as partition ``"power-law"``. The presets
:data:`PRESETS` carry the training settings of the official script
(``submod_scripts.sh``: learning rate 0.1, batch 10, one local epoch, 800 rounds, 10 clients
per round) and register under ``divfl-synthetic`` and ``divfl-mnist``.
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import Any

import numpy as np
from sklearn.utils import check_random_state

from fedselect.presets import Preset

__all__ = ["PRESETS", "power_law_partition"]


def power_law_partition(
    y: np.ndarray,
    n_clients: int,
    *,
    labels_per_client: int = 2,
    sigma: float = 2.0,
    min_per_label: int = 5,
    random_state: Any = None,
) -> list[np.ndarray]:
    """FedProx's MNIST split: each client holds a few consecutive labels, in power-law amounts.

    With the C labels sorted, client k holds labels ``k, k + 1, ..., k + labels_per_client - 1``
    (mod C). Every holder of a label first receives ``min_per_label`` of its samples; the rest of
    the label is shared among its holders in proportions drawn from a log-normal distribution
    ``LogNormal(0, sigma)`` (heavy-tailed: a few clients hold most of the data), rounded to whole
    samples by largest remainders (ties to the lower client id). FedProx's generator (1,000
    devices, 5 samples of each of two digits first, ``lognormal(0, 2)`` shares) is the default.
    Unlike FedProx's generator, every sample of a held label is given out (the generator drops
    the few that overflow); with fewer clients than labels, the labels nobody holds are left out.

    Parameters
    ----------
    y : ndarray of shape (n_samples,)
        Labels.
    n_clients : int
        Number of clients N.
    labels_per_client : int, default=2
        Labels each client holds, at most the number of labels.
    sigma : float, default=2.0
        Standard deviation of the log of the shares; 0 shares each label equally among its holders.
    min_per_label : int, default=5
        Samples of each of its labels every client receives first.
    random_state : int, RandomState instance or None
        Seed of the shuffles and the shares.

    Returns
    -------
    list of ndarray of int64
        Client k's sample indices, sorted.

    Raises
    ------
    ValueError
        A parameter out of range, or a label with fewer samples than its holders' minimum.

    Examples
    --------
    >>> y = np.repeat(np.arange(4), 25)
    >>> parts = power_law_partition(y, 4, random_state=0)
    >>> [sorted(set(y[p].tolist())) for p in parts]
    [[0, 1], [1, 2], [2, 3], [0, 3]]
    """
    y = np.asarray(y)
    if y.ndim != 1 or y.size == 0:
        raise ValueError(f"power-law partition: y must be a non-empty 1-D array of labels, got shape {y.shape}")
    classes = np.unique(y)
    for name, value in (("n_clients", n_clients), ("labels_per_client", labels_per_client)):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
            raise ValueError(f"power-law partition: {name} must be an integer >= 1, got {name}={value!r}")
    if labels_per_client > classes.size:
        raise ValueError(
            f"power-law partition: labels_per_client={labels_per_client} is more than the {classes.size} labels"
        )
    if isinstance(min_per_label, bool) or not isinstance(min_per_label, Integral) or min_per_label < 0:
        raise ValueError(f"power-law partition: min_per_label must be an integer >= 0, got {min_per_label!r}")
    if isinstance(sigma, bool) or not isinstance(sigma, Real) or not np.isfinite(sigma) or sigma < 0:
        raise ValueError(f"power-law partition: sigma must be a finite number >= 0, got sigma={sigma!r}")
    rng = check_random_state(random_state)
    parts: list[list[np.ndarray]] = [[] for _ in range(int(n_clients))]
    for c, label in enumerate(classes):
        holders = [k for k in range(int(n_clients)) if (c - k) % classes.size < labels_per_client]
        if not holders:
            continue
        idx = rng.permutation(np.flatnonzero(y == label))
        floor = int(min_per_label) * len(holders)
        if floor > idx.size:
            raise ValueError(
                f"power-law partition: label {label!r} has {idx.size} samples, fewer than "
                f"min_per_label={min_per_label} for each of its {len(holders)} holders; lower "
                "min_per_label or n_clients"
            )
        shares = rng.lognormal(0.0, float(sigma), len(holders))
        expected = shares / shares.sum() * (idx.size - floor)
        counts = np.floor(expected).astype(np.int64)
        short = idx.size - floor - int(counts.sum())
        counts[np.argsort(-(expected - counts), kind="stable")[:short]] += 1
        counts += int(min_per_label)
        for k, chunk in zip(holders, np.split(idx, np.cumsum(counts)[:-1]), strict=True):
            parts[k].append(chunk)
    return [np.sort(np.concatenate(p)).astype(np.int64) if p else np.zeros(0, dtype=np.int64) for p in parts]


_TRAINING = {
    "model": "logistic",
    "clients_per_round": 10,
    "rounds": 800,
    "local_epochs": 1,
    "batch_size": 10,
    "lr": 0.1,
    "aggregation": "data-size",
    "stop_at_target": False,
}
_ROWS = {
    "Random": ("random", {}),
    "Pow-d": ("power-of-choice", {}),
    "DivFL": ("divfl", {}),
    "DivFL (probe once)": ("divfl", {"source": "probe-once"}),
}
_NOTES = (
    "Training as in the official script (submod_scripts.sh): FedAvg, lr 0.1, batch 10, one local epoch, 800 "
    "rounds, 10 clients per round, multinomial logistic regression (FedProx's mclr), updates averaged by data size. "
    "Our choices: rounds-to-target at the stated target (the paper shows curves), 3 seeds, power-of-choice at its "
    "defaults. 'DivFL' uses the stale updates chosen clients send anyway (free); 'DivFL (probe once)' asks every "
    "client for an update at the first round, as the official code does."
)

#: The paper's settings, registered by :func:`fedselect_divfl.register_presets`.
PRESETS: tuple[Preset, ...] = (
    Preset(
        name="divfl-synthetic",
        description="DivFL (ICLR 2022) on FedProx's Synthetic(1, 1): 30 clients of power-law sizes, 10 per round, "
        "logistic regression, 800 rounds (generated data, runs anywhere).",
        federation={"dataset": "synthetic", "n_clients": 30, "alpha": 1.0, "beta": 1.0},
        trainer={**_TRAINING, "target_accuracy": 0.7},
        selectors=dict(_ROWS),
        seeds=(0, 1, 2),
        target=0.7,
        notes=_NOTES + " fedselect's Synthetic keeps 80 % of each client's samples for training (the official data: "
        "90 %).",
    ),
    Preset(
        name="divfl-mnist",
        description="DivFL (ICLR 2022) on MNIST split as FedProx does: 1,000 clients holding two digits each in "
        "power-law amounts (partition power-law), 10 per round, logistic regression, 800 rounds (needs the MNIST IDX "
        "files: --data-dir or $FEDSELECT_DATA).",
        federation={"dataset": "mnist", "n_clients": 1000, "partition": "power-law"},
        trainer={**_TRAINING, "target_accuracy": 0.8},
        selectors=dict(_ROWS),
        seeds=(0, 1, 2),
        target=0.8,
        notes=_NOTES + " MNIST's training split (60,000 images; FedProx splits all 70,000 and holds out 10 % of each "
        "client) is partitioned; the test split is MNIST's.",
    ),
)
