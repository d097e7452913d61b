"""A malformed reply fails its client for the round; it never crashes the server."""

import warnings

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from fedselect.flower import FederationClients, FlowerRoundWarning, LocalGrid, SelectorStrategy
from fedselect.selection import BaseSelector, Selection
from fedselect.selectors.random import RandomSelector

from .conftest import TRAIN


class Tampering:
    """A ClientApp (any callable the LocalGrid calls) that answers as ``app`` does, except that
    ``tamper(message, reply, partition)`` may replace the reply of the given partitions."""

    def __init__(self, app, tamper, partitions):
        self.app, self.tamper, self.partitions = app, tamper, set(partitions)

    def __call__(self, message, context):
        reply = self.app(message, context)
        partition = int(context.node_config["partition-id"])
        if partition in self.partitions and not reply.has_error():
            new = self.tamper(message, reply)
            if new is not None:
                return Message(new, reply_to=message)
        return reply


def _metrics(reply, **changes):
    m = dict(reply.content["metrics"])
    for k, v in changes.items():
        key = k.replace("_", "-")
        if v is None:
            m.pop(key, None)
        else:
            m[key] = v
    content = RecordDict({"metrics": MetricRecord(m)})
    if "update" in reply.content.array_records:
        content["update"] = reply.content["update"]
    return content


def _loss_only(change):
    def tamper(message, reply):
        if message.metadata.message_type == "query.fedselect_loss":
            return change(reply)
        return None

    return tamper


BAD_LOSS_REPLIES = {
    "missing loss": _loss_only(lambda r: _metrics(r, loss=None)),
    "NaN loss": _loss_only(lambda r: _metrics(r, loss=float("nan"))),
    "infinite loss": _loss_only(lambda r: _metrics(r, loss=float("inf"))),
    "loss of the wrong type": _loss_only(lambda r: _metrics(r, loss=[1.0, 2.0])),
    "no metrics record": _loss_only(lambda r: RecordDict({"config": ConfigRecord({"loss": 1.0})})),
    "bad sample count": _loss_only(lambda r: _metrics(r, fedselect_samples_evaluated=-3)),
}


def _run(fed, app, selector, rounds=2, n_nodes=None, **kw):
    grid = LocalGrid(app, n_nodes or fed.n_clients, seed=5)
    kw.setdefault("connect_timeout", 2.0)
    kw.setdefault("aggregation", "data-size")
    kw.setdefault("n_clients", n_nodes or fed.n_clients)
    strategy = SelectorStrategy(selector, random_state=0, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlowerRoundWarning)
        result = strategy.start(grid, FederationClients(fed, random_state=0, **TRAIN).initial_arrays(),
                                num_rounds=rounds)
    return strategy, grid, result


class AskAll(BaseSelector):
    """Asks every client's loss, chooses the n clients with the lowest known loss; records what it saw."""

    needs = frozenset({"losses"})  # its feedback carries the reporters' losses

    def __init__(self):
        pass

    def _fit(self, pool):
        self.seen_ = []

    def _select(self, n, *, round, oracle):
        losses = oracle.losses(np.arange(self.n_clients_))
        self.seen_.append(losses)
        order = np.argsort(np.where(np.isnan(losses), np.inf, losses), kind="stable")
        return Selection(np.sort(order[:n]))

    def _update(self, feedback):
        self.seen_.append(feedback)


@pytest.mark.parametrize("case", sorted(BAD_LOSS_REPLIES))
def test_a_malformed_loss_reply_fails_that_client(fed8, case):
    clients = FederationClients(fed8, random_state=0, **TRAIN)
    app = Tampering(clients.client_app(), BAD_LOSS_REPLIES[case], partitions=[2])
    strategy, _, result = _run(fed8, app, AskAll(), clients_per_round=7)
    sel = strategy.selector_
    for t, rec in enumerate(strategy.rounds_):
        losses, feedback = sel.seen_[2 * t], sel.seen_[2 * t + 1]
        assert np.isnan(losses[2]) and np.isfinite(np.delete(losses, 2)).all()
        assert 2 in rec.failed and 2 not in rec.clients  # it answered nothing usable: never chosen
        assert rec.reported == rec.clients and len(rec.clients) == 7
        assert rec.costs.scalars_up == 7  # the rejected answer is not charged as received
        assert rec.costs.models_down == 8  # the query (with w^t) did go to client 2
        assert np.isfinite(feedback.losses).all()
    flat = np.concatenate([a.numpy().reshape(-1) for a in result.arrays.values()])
    assert np.isfinite(flat).all()


class RandomNeedingLosses(RandomSelector):
    """Uniform random selection that declares ``"losses"``: every chosen client is asked its loss on w^t."""

    needs = frozenset({"losses"})


def test_a_train_reply_without_the_requested_loss_fails_that_client(fed8):
    def tamper(message, reply):
        if message.metadata.message_type == "train":
            return _metrics(reply, loss=None)
        return None

    clients = FederationClients(fed8, random_state=0, **TRAIN)
    app = Tampering(clients.client_app(), tamper, partitions=[3])
    strategy, _, _ = _run(fed8, app, RandomNeedingLosses(), clients_per_round=8)  # the loss is asked
    for rec in strategy.rounds_:
        assert rec.clients == list(range(8))
        assert rec.failed == [3] and 3 not in rec.reported and len(rec.reported) == 7
        assert rec.costs.local_trainings == 7 and rec.costs.scalars_up == 7


@pytest.mark.parametrize("bad", ["nan steps", "no update", "float steps"])
def test_a_malformed_update_reply_fails_that_client(fed8, bad):
    def tamper(message, reply):
        if message.metadata.message_type != "train":
            return None
        if bad == "no update":
            return RecordDict({"metrics": reply.content["metrics"]})
        return _metrics(reply, fedselect_local_steps=float("nan") if bad == "nan steps" else 2.5)

    clients = FederationClients(fed8, random_state=0, **TRAIN)
    app = Tampering(clients.client_app(), tamper, partitions=[3])
    strategy, _, _ = _run(fed8, app, "random", clients_per_round=8)
    for rec in strategy.rounds_:
        assert rec.failed == [3] and len(rec.reported) == 7


def test_a_malformed_trial_reply_answers_nan(fed8):
    seen = {}

    class Trialling(BaseSelector):
        def __init__(self):
            pass

        def _fit(self, pool):
            pass

        def _select(self, n, *, round, oracle):
            seen[round] = oracle.trial([0, 1])
            return Selection(np.arange(n))

    def tamper(message, reply):  # the trial model's loss only
        cfg = message.content.config_records["config"]
        if message.metadata.message_type == "query.fedselect_loss" and cfg.get("fedselect-model") == "trial":
            return _metrics(reply, loss=float("nan"))
        return None

    clients = FederationClients(fed8, random_state=0, **TRAIN)
    app = Tampering(clients.client_app(), tamper, partitions=[5])
    strategy, _, _ = _run(fed8, app, Trialling(), rounds=1, clients_per_round=3)
    assert np.isnan(seen[0][5]) and np.isfinite(np.delete(seen[0], 5)).all()
    rec = strategy.rounds_[0]
    assert rec.failed == [5]
    # N losses on w^t + 7 usable trial losses; the trial model went to all 8.
    assert rec.costs.scalars_up == 8 + 7 and rec.costs.models_down == 8 + 8


GARBAGE_HELLOS = {
    "no metrics": lambda r: RecordDict({"config": ConfigRecord({"x": 1})}),
    "no client id": lambda r: _metrics(r, fedselect_client_id=None),
    "negative client id": lambda r: _metrics(r, fedselect_client_id=-1),
    "client id out of range": lambda r: _metrics(r, fedselect_client_id=99),
    "float client id": lambda r: _metrics(r, fedselect_client_id=1.5),
    "zero n_k": lambda r: _metrics(r, num_examples=0),
    "list n_k": lambda r: _metrics(r, num_examples=[3, 4]),
}


@pytest.mark.parametrize("case", sorted(GARBAGE_HELLOS))
def test_a_garbage_hello_is_ignored(fed8, case):
    """A ninth node (an impostor) answers hello with garbage: it is never mapped to a client."""
    clients = FederationClients(fed8, random_state=0, **TRAIN)
    good = clients.client_app()

    def app(message, context):
        if int(context.node_config["partition-id"]) == 8:  # no such client in the federation
            context.node_config["partition-id"] = 0
            try:
                reply = good(message, context)
            finally:
                context.node_config["partition-id"] = 8
            if message.metadata.message_type == "query.fedselect_hello":
                return Message(GARBAGE_HELLOS[case](reply), reply_to=message)
            return reply
        return good(message, context)

    strategy, grid, _ = _run(fed8, app, "random", n_nodes=9, n_clients=8, clients_per_round=8)
    impostor = grid.node_of_partition(8)
    assert impostor not in strategy.client_nodes_.values()
    assert sorted(strategy.client_nodes_) == list(range(8))
    assert all(rec.reported == list(range(8)) for rec in strategy.rounds_)
    # only hellos ever went to the impostor (once per round: it may be fixed later)
    to_impostor = [m.metadata.message_type for m in grid.sent if m.metadata.dst_node_id == impostor]
    assert set(to_impostor) == {"query.fedselect_hello"}
