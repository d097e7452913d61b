"""A Flower round is fedselect.round's, and carries what was measured: wall_seconds per round, reply_seconds per
training reply (the server's own clock, never a client's timestamp), which are the feedback's durations."""

import contextlib
import json
import logging
import math
import time
import warnings

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Error, Message
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.logger import FLOWER_LOGGER

import fedselect.round.play as round_module  # where the round calls conclude_round
from fedselect.flower import FederationClients, FlowerRoundWarning, LocalGrid, SelectorStrategy
from fedselect.simulation import RoundRecord

from .conftest import TRAIN, Everyone, ProbeAll

SLOW = 0.4  # seconds a slow client sleeps before answering


def _app(app, *, kinds=("train",), delay=0.0, created_at=None):
    """``app`` answering messages of ``kinds`` ``delay`` seconds late, its reply stamped ``created_at(message)``."""

    def wrapped(msg, context):
        if msg.metadata.message_type in kinds and delay:
            time.sleep(delay)
        reply = app(msg, context)
        if created_at is not None and msg.metadata.message_type in kinds:
            reply.metadata.created_at = created_at(msg)
        return reply

    return wrapped


def _run(fed, selector, *, apps=None, rounds=2, clients_per_round=8, records_path=None, **kw):
    clients = FederationClients(fed, random_state=0, **TRAIN)
    app = clients.client_app()
    grid = LocalGrid(app, fed.n_clients, seed=5)
    for partition, make in (apps or {}).items():
        grid.apps[grid.node_of_partition(partition)] = make(app)
    kw.setdefault("aggregation", "data-size")
    strategy = SelectorStrategy(
        selector,
        clients_per_round=clients_per_round,
        n_clients=fed.n_clients,
        random_state=0,
        connect_timeout=5.0,
        **kw,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlowerRoundWarning)
        strategy.start(grid, clients.initial_arrays(), num_rounds=rounds, records_path=records_path)
    return strategy


def test_every_flower_round_is_played_by_the_round_module(fed8, monkeypatch):
    """With the inner strategy aggregating (aggregation=None) too: the round module calls it through ``apply``."""
    calls, real = [], round_module.conclude_round

    def counted(*args, **kwargs):
        calls.append((kwargs["round"], kwargs["aggregation"], kwargs["apply"] is not None))
        return real(*args, **kwargs)

    class Inner(FedAvg):
        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            inner_calls.append((server_round, len(replies)))
            return super().aggregate_train(server_round, replies)

    inner_calls = []
    monkeypatch.setattr(round_module, "conclude_round", counted)
    strategy = _run(
        fed8,
        "random",
        rounds=3,
        clients_per_round=3,
        aggregation=None,
        inner=Inner(fraction_evaluate=0.0, min_available_nodes=1),
    )
    assert calls == [(0, "data-size", True), (1, "data-size", True), (2, "data-size", True)]
    assert inner_calls == [(1, 3), (2, 3), (3, 3)]  # the local models of the 3 reporters, Flower's round numbers
    for rec in strategy.rounds_:  # FedAvg's weights, from fedselect.aggregation
        n_k = fed8.n_samples[rec.reported]
        np.testing.assert_allclose(rec.weights, n_k / n_k.sum())


def test_a_slow_client_shows_in_its_reply_seconds_and_in_the_rounds_wall_seconds(fed8):
    strategy = _run(fed8, "random", apps={2: lambda app: _app(app, delay=SLOW)})
    for rec in strategy.rounds_:
        assert sorted(rec.reply_seconds) == rec.reported == list(range(8))
        assert all(math.isfinite(s) and s >= 0 for s in rec.reply_seconds.values())
        # LocalGrid answers in the order of the messages: clients 0 and 1 before the slow one
        assert rec.reply_seconds[2] >= SLOW > rec.reply_seconds[0]
        assert SLOW <= max(rec.reply_seconds.values()) <= rec.wall_seconds + 0.05
        assert rec.wall_seconds <= rec.seconds + 1e-3  # the server's own time includes the wait


def test_the_oracles_exchanges_count_in_wall_seconds_but_not_in_reply_seconds(fed8):
    """power-of-choice asks all 8 clients their loss; client 5 is slow to answer that question only."""
    import fedselect

    slow_loss = {5: lambda app: _app(app, kinds=("query.fedselect_loss",), delay=SLOW)}
    strategy = _run(fed8, fedselect.get_selector("power-of-choice", d=8), apps=slow_loss, clients_per_round=3)
    for rec in strategy.rounds_:
        assert rec.traffic["loss"].messages_down == 8
        assert rec.wall_seconds >= SLOW
        assert sorted(rec.reply_seconds) == rec.reported and max(rec.reply_seconds.values()) < SLOW


def test_clients_trained_for_an_oracle_question_have_their_reply_seconds(fed8):
    slow_update = {6: lambda app: _app(app, kinds=("query.fedselect_update",), delay=SLOW)}
    strategy = _run(fed8, ProbeAll(), clients_per_round=2, apps=slow_update)
    for rec in strategy.rounds_:
        assert rec.reported == [0, 1] and rec.traffic["train"].messages_down == 0  # trained already: no message
        assert sorted(rec.reply_seconds) == list(range(8))  # everyone trained this round, for the oracle
        assert rec.reply_seconds[6] >= SLOW and rec.wall_seconds >= SLOW


def test_a_replys_timestamp_is_never_read_its_seconds_are_the_servers_own(fed8):
    """Replies stamped far in the future, at 0, NaN or a string change nothing: each reply's seconds are the
    server's own measure of its node's answer (a client cannot look faster than it was), only the slow
    client shows its delay, and the feedback's durations are exactly those seconds."""
    apps = {
        1: lambda app: _app(app, created_at=lambda msg: msg.metadata.created_at + 1e9),
        3: lambda app: _app(app, created_at=lambda msg: 0.0),
        4: lambda app: _app(app, created_at=lambda msg: float("nan")),
        6: lambda app: _app(app, created_at=lambda msg: "soon"),
        5: lambda app: _app(app, delay=SLOW, created_at=lambda msg: msg.metadata.created_at),  # "instant"
        7: lambda app: _app(app, delay=SLOW),
    }
    strategy = _run(fed8, Everyone(), apps=apps)
    for rec, fb in zip(strategy.rounds_, strategy.selector_.feedbacks_):
        assert rec.reported == list(range(8)) and not rec.rejected  # a timestamp is not a fault either
        assert all(0 <= s < SLOW for k, s in rec.reply_seconds.items() if k not in (5, 7))
        assert SLOW <= rec.reply_seconds[7] <= rec.wall_seconds
        assert SLOW <= rec.reply_seconds[5] <= rec.wall_seconds  # slow, whatever its stamp claims
        assert fb.durations.tolist() == [rec.reply_seconds[k] for k in fb.clients.tolist()]


def test_measured_seconds_reach_the_records_file_and_the_history(fed8, tmp_path):
    path = tmp_path / "rounds.jsonl"
    strategy = _run(fed8, "random", clients_per_round=3, records_path=path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == len(strategy.rounds_) == 2
    for line, rec, plain in zip(lines, strategy.rounds_, strategy.history_.rounds):
        assert line["wall_seconds"] == rec.wall_seconds > 0
        assert line["reply_seconds"] == {str(k): v for k, v in rec.reply_seconds.items()}
        assert sorted(rec.reply_seconds) == rec.reported
        assert type(plain) is RoundRecord and plain.reply_seconds == rec.reply_seconds
        assert plain.wall_seconds == rec.wall_seconds
        assert RoundRecord.from_dict(json.loads(json.dumps(plain.to_dict()))).reply_seconds == rec.reply_seconds


def silent(message):
    """A fault: no reply to a train message."""
    return "timeout" if message.metadata.message_type == "train" else None


def _everyone_on(fed, grid, clients, *, timeout, rounds=1):
    """``Everyone`` served by ``grid`` for ``rounds`` rounds with ``train_timeout=timeout``; the strategy afterwards."""
    strategy = SelectorStrategy(
        Everyone(),
        clients_per_round=fed.n_clients,
        n_clients=fed.n_clients,
        random_state=0,
        aggregation="data-size",
        train_timeout=timeout,
        connect_timeout=5.0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlowerRoundWarning)
        strategy.result = strategy.start(grid, clients.initial_arrays(), num_rounds=rounds)  # for the tests
    return strategy


@contextlib.contextmanager
def _flower_warnings():
    """The messages logged on Flower's logger inside the block."""
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Keep(level=logging.WARNING)
    FLOWER_LOGGER.addHandler(handler)
    try:
        yield seen
    finally:
        FLOWER_LOGGER.removeHandler(handler)


def _silent_run(fed, grid, clients, *, timeout):
    strategy = _everyone_on(fed, grid, clients, timeout=timeout)
    return strategy.rounds_[0], strategy.selector_.feedbacks_[0]


class PolledGrid(LocalGrid):
    """A grid the server must poll, as a deployment's: the replies of the nodes in ``delays`` become visible to
    ``pull_messages`` only that many seconds after the push (a lost message never)."""

    timed_send_and_receive = None  # not the server's own: SelectorStrategy polls it

    def __init__(self, *args, delays=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.delays, self.ready, self.pulls, self.push_seconds = dict(delays or {}), {}, 0, 0.0

    def push_messages(self, messages):
        messages, start = list(messages), time.monotonic()
        ids = list(super().push_messages(messages))  # the apps answer here, one after the other
        self.push_seconds = max(self.push_seconds, time.monotonic() - start)  # the longest push of the run
        for msg, i in zip(messages, ids):
            self.ready[i] = start + self.delays.get(
                self.contexts[msg.metadata.dst_node_id].node_config["partition-id"], 0.0
            )
        return ids

    def pull_messages(self, message_ids):
        self.pulls += 1
        now = time.monotonic()
        return super().pull_messages([i for i in message_ids if self.ready.get(i, math.inf) <= now])


def test_a_polled_grid_times_each_reply_by_the_servers_first_sight_of_it(fed8):
    """On a grid without ``timed_send_and_receive`` (a deployment's) the server polls: a reply visible after
    0.3 s measures 0.3 s and a pause of 5 % of that (Flower's own send_and_receive pauses 3 s between pulls);
    a lost reply is waited for until the timeout, and its client fails, timed out (an error reply only fails)."""
    delay, timeout = 0.3, 1.0
    clients = FederationClients(fed8, random_state=0, **TRAIN)
    grid = PolledGrid(clients.client_app(), fed8.n_clients, seed=5, delays={2: delay})
    lost = grid.node_of_partition(5)
    grid.faults[lost] = silent
    grid.faults[grid.node_of_partition(6)] = lambda m: "error" if m.metadata.message_type == "train" else None
    strategy = _everyone_on(fed8, grid, clients, timeout=timeout, rounds=2)
    for rec, fb in zip(strategy.rounds_, strategy.selector_.feedbacks_):
        assert rec.failed == [5, 6] and sorted(rec.reply_seconds) == rec.reported == [0, 1, 2, 3, 4, 7]
        assert delay <= rec.reply_seconds[2] <= delay + 0.05
        assert all(s < grid.push_seconds + 0.05 < delay for k, s in rec.reply_seconds.items() if k != 2)
        assert timeout <= rec.wall_seconds < timeout + 0.5
        assert fb.durations.tolist() == [rec.reply_seconds[k] for k in fb.clients.tolist()]
        # the lost reply is a censored observation (waited for until the timeout); the error reply a failure
        assert fb.timed_out.tolist() == [5] and timeout <= fb.timed_out_after[0] < timeout + 0.5
    assert grid.pulls < 200  # about 70 per second-long exchange, then at most one a second


# -- silent clients: what the server waited for them, and replies that are not what they claim ----------------------
def test_on_the_servers_own_grid_a_silent_client_was_waited_for_the_train_timeout(fed8):
    """LocalGrid knows at once that a message is lost ("as if the timeout expired"): the bound is train_timeout,
    not the seconds the other nodes took one after the other."""
    clients = FederationClients(fed8, random_state=0, **TRAIN)
    grid = LocalGrid(clients.client_app(), fed8.n_clients, seed=5)
    grid.faults[grid.node_of_partition(5)] = silent
    rec, fb = _silent_run(fed8, grid, clients, timeout=30.0)
    assert rec.failed == [5] and fb.timed_out.tolist() == [5] and fb.timed_out_after.tolist() == [30.0]


def test_a_reply_from_another_node_is_lost_as_a_superlink_refuses_it(fed8):
    """Client 3 answers claiming to be client 5's node while 5 is silent: the reply is not 5's (5 stays a silent
    straggler) and 3 sent nothing acceptable (it is silent too); nobody's status is swapped."""
    clients = FederationClients(fed8, random_state=0, **TRAIN)
    app = clients.client_app()
    grid = LocalGrid(app, fed8.n_clients, seed=5)
    other = grid.node_of_partition(5)

    def spoofing(msg, context):
        reply = app(msg, context)
        if msg.metadata.message_type == "train":
            reply.metadata.__dict__["_src_node_id"] = other
        return reply

    grid.apps[grid.node_of_partition(3)] = spoofing
    grid.faults[other] = silent
    rec, fb = _silent_run(fed8, grid, clients, timeout=30.0)
    assert rec.failed == [3, 5] and fb.timed_out.tolist() == [3, 5]


class TamperedTrainReply(PolledGrid):
    """A polled grid that hands partition 3's train replies to :meth:`tamper` before the server pulls them."""

    def tamper(self, reply):
        raise NotImplementedError

    def pull_messages(self, message_ids):
        replies = list(super().pull_messages(message_ids))
        for reply in replies:
            if reply.metadata.src_node_id == self.node_of_partition(3) and reply.metadata.message_type == "train":
                self.tamper(reply)
        return replies


class _RaisingMetadata:
    def __getattr__(self, name):
        raise RuntimeError(f"boom: {name}")


def test_a_polled_reply_whose_metadata_raises_only_loses_that_reply(fed8):
    clients = FederationClients(fed8, random_state=0, **TRAIN)

    class Hostile(TamperedTrainReply):
        def tamper(self, reply):
            reply.__dict__["_metadata"] = _RaisingMetadata()

    grid = Hostile(clients.client_app(), fed8.n_clients, seed=5)
    rec, fb = _silent_run(fed8, grid, clients, timeout=0.5)
    assert rec.failed == [3] and rec.reported == [0, 1, 2, 4, 5, 6, 7] and fb.timed_out.tolist() == [3]


def test_on_a_polled_grid_a_reply_from_another_node_is_dropped_by_the_server(fed8):
    """A grid that does not check who answered (a deployment's SuperLink does): the server checks it itself.
    Client 3's train reply arrives labelled as client 5's node while 5 is silent: 5 stays a silent straggler and 3
    sent nothing acceptable, as on LocalGrid (test_a_reply_from_another_node_is_lost_as_a_superlink_refuses_it)."""
    clients = FederationClients(fed8, random_state=0, **TRAIN)

    class Lax(TamperedTrainReply):
        def tamper(self, reply):
            reply.metadata.__dict__["_src_node_id"] = self.node_of_partition(5)

    grid = Lax(clients.client_app(), fed8.n_clients, seed=5)
    grid.faults[grid.node_of_partition(5)] = silent
    rec, fb = _silent_run(fed8, grid, clients, timeout=0.5)
    assert rec.failed == [3, 5] and fb.timed_out.tolist() == [3, 5]


def test_on_a_polled_grid_a_stale_reply_does_not_stand_in_for_a_silent_client(fed8):
    """Client 3 answers round 1, then falls silent; the grid hands its round-1 reply back again in round 2 (it
    answers a message of another exchange). The server drops it: 3 fails round 2, timed out, and round 2's model
    is what it is when the stale reply is never shown."""
    runs = {}
    for replay in (False, True):
        clients = FederationClients(fed8, random_state=0, **TRAIN)

        class Replaying(PolledGrid):
            stale = None
            replays = replay

            def pull_messages(self, message_ids):
                replies = list(super().pull_messages(message_ids))
                for reply in replies:
                    if reply.metadata.src_node_id == self.node_of_partition(3) and (
                        reply.metadata.message_type == "train" and self.stale is None
                    ):
                        self.stale = reply
                if self.replays and self.stale is not None and self.stale not in replies:
                    replies.append(self.stale)
                return replies

        grid = Replaying(clients.client_app(), fed8.n_clients, seed=5)
        answered = []

        def once(message, answered=answered):
            if message.metadata.message_type != "train":
                return None
            answered.append(1)
            return None if len(answered) == 1 else "timeout"

        grid.faults[grid.node_of_partition(3)] = once
        runs[replay] = _everyone_on(fed8, grid, clients, timeout=0.5, rounds=2)
    plain, replayed = runs[False], runs[True]
    assert replayed.rounds_[0].failed == [] and replayed.rounds_[1].failed == [3]
    assert replayed.selector_.feedbacks_[1].timed_out.tolist() == [3]
    assert [r.reported for r in replayed.rounds_] == [r.reported for r in plain.rounds_]
    a, b = (r.result.arrays.to_numpy_ndarrays() for r in (plain, replayed))
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


class TrainToOneNodeNotPushed(PolledGrid):
    """A polled grid that does not deliver the train messages to partition 4's node: each gets the id
    :meth:`not_pushed` returns instead (the others are pushed, the order of the ids kept)."""

    def not_pushed(self, message):
        raise NotImplementedError

    def push_messages(self, messages):
        messages = list(messages)
        held = [m.metadata.dst_node_id == self.node_of_partition(4) and m.metadata.message_type == "train"
                for m in messages]
        ids = iter(super().push_messages([m for m, h in zip(messages, held) if not h]))
        return [self.not_pushed(m) if h else next(ids) for m, h in zip(messages, held)]


@pytest.mark.parametrize("no_id", [None, ""])
def test_on_a_polled_grid_a_message_that_could_not_be_pushed_is_not_waited_for(fed8, no_id):
    """A grid marks a message it could not push with an empty id (the SuperLink's push handler: "") or None
    (Flower's HTTP grid checks for it), order kept: the server does not wait for a reply to it; that client
    fails."""
    clients = FederationClients(fed8, random_state=0, **TRAIN)

    class Refusing(TrainToOneNodeNotPushed):
        def not_pushed(self, message):
            return no_id

    grid = Refusing(clients.client_app(), fed8.n_clients, seed=5)
    rec, _ = _silent_run(fed8, grid, clients, timeout=20.0)
    assert rec.failed == [4] and rec.wall_seconds < 5.0


def test_on_a_polled_grid_the_superlinks_error_reply_for_an_offline_node_ends_the_wait(fed8):
    """For a node that is offline (or a message that expired) the SuperLink answers itself: an error reply from
    ``SUPERLINK_NODE_ID``. It ends the wait for that message, as in Flower's own send_and_receive; that client
    fails at once, without the server waiting the train timeout or dropping the reply."""
    clients = FederationClients(fed8, random_state=0, **TRAIN)

    class Offline(TrainToOneNodeNotPushed):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.unavailable = {}

        def not_pushed(self, message):  # stored as the SuperLink stores a message to an offline node
            message.metadata.__dict__["_message_id"] = f"offline-{len(self.unavailable)}"
            self.unavailable[message.metadata.message_id] = message
            return message.metadata.message_id

        def pull_messages(self, message_ids):
            message_ids = list(message_ids)
            replies = list(super().pull_messages([i for i in message_ids if i not in self.unavailable]))
            for i in message_ids:
                if i in self.unavailable:  # as Flower's link state answers for an offline node
                    reply = Message(Error(code=5, reason="Node Unavailable"), reply_to=self.unavailable[i])
                    reply.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
                    replies.append(reply)
            return replies

    grid = Offline(clients.client_app(), fed8.n_clients, seed=5)
    with _flower_warnings() as seen:
        rec, fb = _silent_run(fed8, grid, clients, timeout=20.0)
    assert rec.failed == [4] and rec.wall_seconds < 5.0 and fb.timed_out.tolist() == []
    assert not [w for w in seen if "dropped a reply" in w]
