"""Without failures, every selector chooses exactly what it chose before client failures existed.

The digests below were recorded at commit f8f7fa0, before the cost ledger, NaN answers and
partial feedback were added: 15 rounds of each registered selector (FedCor aside: its GP runs
in torch, whose last bits may differ between CPUs) on :class:`fedselect.testing.SyntheticOracle`,
which is pure NumPy. Support for clients that do not answer must leave these runs bit for bit
unchanged.
"""

from __future__ import annotations

import hashlib
import json
import warnings

import numpy as np
import pytest
import torch

from fedselect import get_selector
from fedselect.testing import _run, make_pools

RECORDED_AT_F8F7FA0 = {
    "afl": "a467d0e872321fab",
    "clustered": "bfa362e2f2ace01b",
    "data-size": "5aa4fd8f82ed6bf8",
    "hcsfed": "5af48bc97dd82a13",
    "ldcs": "e967c8d28ec608ef",
    "ocs": "526fb9e0b9df1b83",
    "power-of-choice": "cd368d9b1d30d5e0",
    "random": "4b19d7808b71419e",
    "round-robin": "fc4756c54bb3fdaa",
}


@pytest.mark.parametrize("name", sorted(RECORDED_AT_F8F7FA0))
def test_selections_without_failures_are_unchanged(name):
    pool = make_pools(0, (20,))[0]
    # HCSFed's defaults moved (cohesion="std", one k-means run) after the digest was recorded: pin what it ran.
    params = {"n_clusters": 3, "cohesion": "pairwise-sum", "kmeans_n_init": 10} if name == "hcsfed" else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = _run(get_selector(name, random_state=0, **params), pool, 5, 15, 0)
    rows = [(c, None if w is None else [round(x, 10) for x in w]) for c, w in runs]
    assert hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16] == RECORDED_AT_F8F7FA0[name]


def test_gp_mean_without_missing_values_is_the_plain_weighted_mean():
    """FedCor's update_mean: with every value present the mean is computed exactly as before (w @ v / sum w)."""
    from fedselect.selectors import _gp

    rng = np.random.default_rng(0)
    v, w = rng.normal(size=(11, 30)), 0.9 ** np.arange(11.0)
    gp = _gp.LossChangeGP(30, 3, 0.1, generator=torch.Generator().manual_seed(0))
    gp.set_mean(v, w)
    assert np.array_equal(gp.mean.numpy(), w @ v / w.sum())
