import os
import tempfile

import pytest

# Flower reads these at import time: no telemetry, and no writes to the user's ~/.flwr.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_HOME", tempfile.mkdtemp(prefix="fedselect-flwr-home-"))

pytest.importorskip("flwr")

from fedselect import make_federation

TRAIN = dict(model="mlp", local_steps=3, batch_size=16, lr=0.05)


@pytest.fixture(scope="module")
def fed20():
    return make_federation("digits", partition="shards", n_clients=20, random_state=0)


@pytest.fixture(scope="module")
def fed8():
    return make_federation("digits", partition="shards", n_clients=8, random_state=1)


@pytest.fixture(scope="module")
def fed10_digits():
    return make_federation("digits", partition="shards", n_clients=10, random_state=2)
