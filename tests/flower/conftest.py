import logging
import os
import tempfile

import pytest

# Flower reads these at import time: no telemetry, and no writes to the user's ~/.flwr.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_HOME", tempfile.mkdtemp(prefix="fedselect-flwr-home-"))

pytest.importorskip("flwr")

import numpy as np

from fedselect import make_federation
from fedselect.selection import BaseSelector, Selection

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


def recording(cls):
    """A subclass of selector class ``cls`` that keeps every RoundFeedback it learns from (``feedbacks_``)."""

    class Recording(cls):
        def _fit(self, pool):
            super()._fit(pool)
            self.feedbacks_ = []

        def update(self, feedback):
            self.feedbacks_.append(feedback)
            return super().update(feedback)

    Recording.__name__ = cls.__name__
    return Recording


class Everyone(BaseSelector):
    """Chooses every client each round and keeps each feedback (``feedbacks_``); ``needs`` as given."""

    def __init__(self, needs=("durations",)):
        self.needs_ = needs

    @property
    def needs(self):  # type: ignore[override]
        return frozenset(self.needs_)

    def _fit(self, pool):
        self.feedbacks_ = []

    def _select(self, n, *, round, oracle):
        return Selection(np.arange(self.n_clients_))

    def _update(self, feedback):
        self.feedbacks_.append(feedback)


class ProbeAll(BaseSelector):
    """Trains every client for an oracle question (``local_updates``), then chooses the first n: the chosen
    clients are not trained again (their sample losses and reply seconds come from that training)."""

    def __init__(self, needs=()):
        self.needs_ = needs

    @property
    def needs(self):  # type: ignore[override]
        return frozenset(self.needs_)

    def _fit(self, pool):
        pass

    def _select(self, n, *, round, oracle):
        oracle.local_updates(np.arange(self.n_clients_))
        return Selection(np.arange(n))

    def _update(self, feedback):
        pass


def round_messages(grid, t):
    """The fedselect messages (queries and train) the strategy sent in round t (hellos excluded)."""
    return [m for m in grid.sent if m.metadata.group_id == str(t + 1)]


def models_sent(grid, t):
    """How many of round t's messages carried a model (w^t or a trial model): what models_down must count."""
    return sum(1 for m in round_messages(grid, t) if "arrays" in m.content.array_records)


@pytest.fixture
def flwr_log():
    """Records what Flower's logger (which fedselect's server logs through) prints."""
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Keep(level=logging.DEBUG)
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)
