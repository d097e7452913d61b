"""Issue 36, item 3: what a slow or junk node, a large reply, an evaluation count or a records path can cost the
server is bounded. Each test failed on the code before: the mutation it guards is named in its docstring."""

import os
import time
import warnings

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

import fedselect
from fedselect.flower import FederationClients, FlowerRoundWarning, LocalGrid, SelectorStrategy
from fedselect.flower import _protocol as P

from .test_attacks import accuracy, hostile, is_update, run
from .test_timing import PolledGrid

N = 10
TRAIN = dict(model="mlp", local_steps=3, batch_size=16, lr=0.1)


@pytest.fixture(scope="module")
def clients():
    fed = fedselect.make_federation("digits", partition="iid", n_clients=N, random_state=2)
    return FederationClients(fed, random_state=0, **TRAIN)


# -- every byte of a reply counts against max_reply_bytes -------------------------------------------------------------
def _with_strings(reply, strings):
    content = RecordDict({"metrics": reply.content["metrics"], "junk": ConfigRecord({"s": strings})})
    if "update" in reply.content.array_records:
        content["update"] = reply.content["update"]
    return content


def test_strings_inside_a_list_count_against_max_reply_bytes(clients):
    """8 MiB of strings inside a ConfigRecord list were counted as 8 bytes each and passed max_reply_bytes
    (about 1.1 MB here). Now every string's bytes count (``content_nbytes``; mutation: count a list's
    strings as 8 bytes each again)."""
    big = ["x" * (1 << 20)] * 8
    app = hostile(clients.client_app(), {3}, lambda m, r: _with_strings(r, big) if is_update(m) else None)
    strategy, _, _, _ = run(clients, app, "round-robin", rounds=2, clients_per_round=N, evaluate=False)
    for rec in strategy.rounds_:
        assert 3 in rec.failed and "max_reply_bytes" in rec.rejected[3]
        assert sorted(rec.reported) == [k for k in range(N) if k != 3]


def test_content_nbytes_counts_every_value():
    """Strings and bytes in lists, non-ASCII text, keys and record names all count; numbers 8 bytes."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
    small = RecordDict({"c": ConfigRecord({"k": 1})})
    assert P.content_nbytes(small) == (8 + 1) + (8 + 1) + 8
    strings = RecordDict({"c": ConfigRecord({"k": ["ab", "é" * 10], "b": [b"xyz"]})})
    assert P.content_nbytes(strings) == 9 + 9 + 8 + (8 + 2) + (8 + 20) + 9 + 8 + (8 + 3)
    metrics = RecordDict({"m": MetricRecord({"a": [1.0, 2.0, 3.0]})})
    assert P.content_nbytes(metrics) == 9 + 9 + 8 + 3 * 8
