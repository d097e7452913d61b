"""Issue 36, item 3: what a slow or junk node, a large reply, an evaluation count or a records path can cost the
server is bounded. Each test failed on the code before: the mutation it guards is named in its docstring."""

import time
import warnings

import pytest

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

import fedselect
from fedselect.flower import FederationClients, FlowerRoundWarning, LocalGrid, SelectorStrategy
from fedselect.flower import _protocol as P

from .test_attacks import hostile, is_update, run
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


# -- evaluation counts are bounded like training counts ---------------------------------------------------------------
def test_one_evaluation_count_cannot_dominate_the_federated_loss(clients):
    """One client reporting ``num-examples`` 2**53 - 1 and loss 0 made the aggregated federated loss about 1e-13
    (the honest ones: above 0.1). Now an evaluation count above ``max_num_examples`` leaves its reply out
    (mutation: drop the bound in ``ReplyChecks.usable_evaluations``)."""

    def liar(message, reply):
        if message.metadata.message_type != P.EVALUATE:
            return None
        m = dict(reply.content["metrics"])
        m.update({"num-examples": 2**53 - 1, "loss": 0.0})
        return RecordDict({"metrics": MetricRecord(m)})

    inner = FedAvg(fraction_evaluate=1.0, min_available_nodes=1, min_evaluate_nodes=1)
    _, _, honest_result, _ = run(
        clients, clients.client_app(), "random", rounds=2, evaluate=False, inner=inner, max_num_examples=1000
    )
    inner = FedAvg(fraction_evaluate=1.0, min_available_nodes=1, min_evaluate_nodes=1)
    app = hostile(clients.client_app(), {4}, liar)
    _, _, result, _ = run(clients, app, "random", rounds=2, evaluate=False, inner=inner, max_num_examples=1000)
    for t in (1, 2):
        loss, honest_loss = (
            result.evaluate_metrics_clientapp[t]["loss"],
            honest_result.evaluate_metrics_clientapp[t]["loss"],
        )
        assert honest_loss > 0.1 and abs(loss - honest_loss) < 0.25 * honest_loss


# -- records_path is a path, checked before the first round -----------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "error", "words"),
    [
        (1, TypeError, "records_path must be a path"),
        (True, TypeError, "records_path must be a path"),
        (2.5, TypeError, "records_path must be a path"),
        ("missing-dir/records.jsonl", ValueError, "not an existing directory"),
        (".", ValueError, "is a directory"),
    ],
)
def test_records_path_must_be_a_writable_path_before_any_round(clients, tmp_path, monkeypatch, path, error, words):
    """``records_path=1`` was opened as file descriptor 1 (it wrote into stdout and closed it) and a missing
    directory raised only after round 0 trained. Now ``start`` refuses both before any message is sent
    (mutation: drop ``check_records_path``)."""
    monkeypatch.chdir(tmp_path)
    grid = LocalGrid(clients.client_app(), N, seed=5)
    strategy = SelectorStrategy("random", n_clients=N, clients_per_round=3, connect_timeout=1.0)
    with pytest.raises(error, match=words):
        strategy.start(grid, clients.initial_arrays(), num_rounds=1, records_path=path)
    assert grid.sent == [] and strategy.rounds_ == []


def test_records_path_accepts_a_pathlike(clients, tmp_path):
    path = tmp_path / "records.jsonl"
    grid = LocalGrid(clients.client_app(), N, seed=5)
    strategy = SelectorStrategy("random", n_clients=N, clients_per_round=3, connect_timeout=1.0)
    strategy.start(grid, clients.initial_arrays(), num_rounds=2, records_path=path)
    assert len(path.read_text().splitlines()) == 2


# -- LocalGrid honours timeouts as a SuperLink does -------------------------------------------------------------------
def _slow(app, partition, seconds, kinds=(P.TRAIN,)):
    def answer(message, context):
        if int(context.node_config["partition-id"]) == partition and message.metadata.message_type in kinds:
            time.sleep(seconds)
        return app(message, context)

    return answer


def test_local_grid_drops_a_train_reply_that_came_after_train_timeout(clients):
    """A reply three times past ``train_timeout`` was aggregated on LocalGrid. Now its client fails, timed out, as
    on a SuperLink (mutation: ignore ``timeout`` in ``LocalGrid.timed_send_and_receive``)."""
    app = _slow(clients.client_app(), 2, 0.6)
    strategy, _, _, _ = run(
        clients, app, "round-robin", rounds=1, clients_per_round=N, evaluate=False, train_timeout=0.2
    )
    [rec] = strategy.rounds_
    assert rec.failed == [2] and 2 not in rec.reported and len(rec.reported) == N - 1


def test_local_grid_drops_a_reply_past_its_messages_ttl(clients):
    """``push_messages`` (what a polled server uses) drops a reply that took longer than the message's ttl, as a
    SuperLink drops a reply to an expired message (mutation: store every reply)."""
    grid = LocalGrid(_slow(clients.client_app(), 1, 0.3, kinds=(P.HELLO,)), N, seed=5)
    messages = [
        Message(RecordDict({"config": ConfigRecord()}), node, P.HELLO, ttl=0.1, group_id="hello")
        for node in grid.node_ids
    ]
    replies = list(grid.pull_messages(grid.push_messages(messages)))
    assert sorted(int(r.metadata.src_node_id) for r in replies) == sorted(
        n for n in grid.node_ids if n != grid.node_of_partition(1)
    )


# -- hellos: backed off per node, never in a round's critical path ----------------------------------------------------
def test_nodes_whose_hellos_fail_are_backed_off(clients):
    """20 nodes answering hello with an error got one hello each round (80 in 4 rounds). Now a node whose hello
    fails is asked again after 1, 2, 4, ... rounds: 4 hellos each in 8 rounds, not 8 (mutation: no back-off in
    ``_hello_failed``)."""
    grid = LocalGrid(clients.client_app(), N, seed=5)
    junk = [grid.add_node({"partition-id": 100 + i}) for i in range(20)]
    for node in junk:
        grid.faults[node] = lambda message: "error"
    strategy, _, _, _ = run(clients, None, "random", rounds=8, grid=grid, evaluate=False)
    hellos = [int(m.metadata.dst_node_id) for m in grid.sent if m.metadata.message_type == P.HELLO]
    assert all(hellos.count(node) == 4 for node in junk)  # rounds 0, 1, 3 and 7
    assert all(hellos.count(node) == 1 for node in grid.node_ids if node not in junk)
    assert sorted(strategy.client_nodes_) == list(range(N))


def test_a_silent_node_does_not_make_a_round_wait_for_its_hello(clients):
    """A node that never answers its hello made every round wait ``query_timeout`` on a polled grid (a
    deployment's). Now hellos are sent and collected without waiting: 4 rounds take far less than one
    ``query_timeout``, and the silent node is asked again only after the timeout and a back-off (mutation: wait
    for the hello replies as before)."""
    grid = PolledGrid(clients.client_app(), N, seed=5)
    silent = grid.add_node({"partition-id": 100})
    grid.faults[silent] = lambda message: "timeout"
    start = time.monotonic()
    strategy, _, _, _ = run(clients, None, "random", rounds=4, grid=grid, evaluate=False, query_timeout=5.0)
    assert time.monotonic() - start < 5.0
    assert [int(m.metadata.dst_node_id) for m in grid.sent].count(silent) == 1
    assert len(strategy.rounds_) == 4 and sorted(strategy.client_nodes_) == list(range(N))


def test_a_node_whose_hello_answers_late_joins_when_its_answer_arrives(clients):
    """On a polled grid a node that connects after the start and answers its hello late is not waited for:
    the round that sent the hello goes on without it, and a later round collects the answer and maps it.

    Timed by the wall clock only through margins: the answer is 2 s late (a round takes 0.05-0.5 s), and the
    rounds after it wait until it has surely arrived."""
    delay = 2.0
    grid = PolledGrid(clients.client_app(), N, seed=5, delays={9: delay})
    late = grid.node_of_partition(9)
    grid.remove_node(late)
    strategy = SelectorStrategy("random", n_clients=N, clients_per_round=3, random_state=0, connect_timeout=0.3)
    seen, added = {}, []

    def evaluate_fn(server_round, arrays):
        seen[server_round] = set(strategy.client_nodes_) if hasattr(strategy, "selector_") else set()
        if server_round == 1:
            grid.add_node({}, node_id=late)
            added.append(time.monotonic())
        elif server_round == 2:
            added.append(time.monotonic())  # when round 2 (which sent the hello) ended
        elif server_round >= 3:  # from here on, the answer has surely arrived before the next round's refresh
            time.sleep(max(0.0, added[0] + delay + 0.2 - time.monotonic()))
        return None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlowerRoundWarning)
        strategy.start(grid, clients.initial_arrays(), num_rounds=5, evaluate_fn=evaluate_fn)
    assert added[1] - added[0] < delay  # round 2 did not wait for the hello (its rounds take 0.05-0.5 s)
    assert 9 not in seen[1] and 9 not in seen[2] and 9 in seen[5]
