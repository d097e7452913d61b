"""Client ids bound to authenticated node identities (issue 36, item 2): ``SelectorStrategy(node_binding=...)``.

Without a binding, a rogue that says hello first keeps the id it claims (tests/flower/test_attacks.py shows
it). With SuperNode authentication a Flower node id stands for one registered key; the operator binds each
such id to the one client id it may claim, and every other node and claim is refused.
"""

import json
import warnings

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Message

import fedselect
from fedselect._validation import InvalidParameterError
from fedselect.flower import FederationClients, FlowerRoundWarning, LocalGrid, SelectorStrategy, read_node_binding
from fedselect.flower import _protocol as P

N = 6


@pytest.fixture(scope="module")
def fed():
    return fedselect.make_federation("digits", partition="iid", n_clients=N, random_state=2)


@pytest.fixture(scope="module")
def clients(fed):
    return FederationClients(fed, random_state=0, model="logistic", local_steps=2, batch_size=16, lr=0.1)


def claiming(app, partition, n_examples=None):
    """Answers as ``app`` does for the client it is, but its hello claims ``partition`` (and ``n_examples``)."""

    def answer(message, context):
        reply = app(message, context)
        if message.metadata.message_type == P.HELLO and not reply.has_error():
            m = dict(reply.content["metrics"])
            m[P.CLIENT_ID] = partition
            if n_examples is not None:
                m[P.NUM_EXAMPLES] = n_examples
            content = reply.content
            content["metrics"] = type(reply.content["metrics"])(m)
            return Message(content, reply_to=message)
        return reply

    return answer


def run(clients, grid, rounds=3, **kw):
    strategy = SelectorStrategy(
        "random", n_clients=N, clients_per_round=3, connect_timeout=1.0, aggregation="data-size", random_state=0, **kw
    )
    nodes = []

    def evaluate_fn(server_round, arrays):
        nodes.append(strategy.client_nodes_ if hasattr(strategy, "selector_") else {})

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlowerRoundWarning)
        strategy.start(grid, clients.initial_arrays(), num_rounds=rounds, evaluate_fn=evaluate_fn)
    return strategy, nodes


def binding_of(grid):
    return {grid.node_of_partition(k): k for k in range(N)}


def test_a_stranger_claiming_a_held_id_first_is_refused_by_the_binding(fed, clients, flwr_log):
    """Without a binding, a node that claims client 4 before its real node keeps it with its own n_k
    (first claim wins). With the real nodes bound, the stranger gets no message and client 4 stays its own."""
    app = clients.client_app()
    grid = LocalGrid(app, N, seed=5)
    real = grid.node_of_partition(4)
    binding = binding_of(grid)
    stranger = min(grid.node_ids) - 1  # hellos go out in node order: it answers first
    grid.add_node({"partition-id": 4, "num-partitions": N}, claiming(app, 4, 10**6), node_id=stranger)

    strategy, nodes = run(clients, grid, node_binding=binding)
    assert all(round_nodes[4] == real for round_nodes in nodes[1:])
    assert strategy.wire_.n_samples[4] == int(fed.n_samples[4])
    assert not [m for m in grid.sent if m.metadata.dst_node_id == stranger]  # not even a hello
    assert any(f"node {stranger} is not in node_binding" in line for line in flwr_log)

    # the same federation without the binding: the stranger holds client 4 (what the binding prevents)
    grid = LocalGrid(app, N, seed=5)
    grid.add_node({"partition-id": 4, "num-partitions": N}, claiming(app, 4, 10**6), node_id=stranger)
    strategy, nodes = run(clients, grid, rounds=1)
    assert nodes[1][4] == stranger and strategy.wire_.n_samples[4] == 10**6


def test_a_bound_node_claiming_another_nodes_id_is_refused(fed, clients, flwr_log):
    """A registered (bound) node whose hello claims another client's id is refused and logged, whether it
    answers before or after the id's own node; the id stays with its bound node, and the liar's own id is
    unavailable rather than given to it."""
    app = clients.client_app()
    orders = []
    for seed in (5, 11):  # seeds that put the liar's hello once before and once after the real node's
        grid = LocalGrid(app, N, seed=seed)
        liar, real = grid.node_of_partition(2), grid.node_of_partition(4)
        orders.append(liar < real)
        grid.apps[liar] = claiming(app, 4, 10**6)
        strategy, nodes = run(clients, grid, node_binding=binding_of(grid))
        assert all(round_nodes.get(4) == real and 2 not in round_nodes for round_nodes in nodes[1:])
        assert strategy.wire_.n_samples[4] == int(fed.n_samples[4])
        assert any(
            f"node {liar} claims client id 4, but node_binding binds it to client id 2" in line for line in flwr_log
        )
        hellos = [m for m in grid.sent if m.metadata.dst_node_id == liar]
        assert len(hellos) == 1  # refused once, not asked again while connected
    assert sorted(orders) == [False, True]


def test_an_honest_bound_federation_runs_as_an_unbound_one(clients):
    """The binding changes nothing for the nodes it names: same clients, same nodes, same model."""
    a, nodes_a = run(clients, LocalGrid(clients.client_app(), N, seed=5))
    grid = LocalGrid(clients.client_app(), N, seed=5)
    b, nodes_b = run(clients, grid, node_binding=binding_of(grid))
    assert nodes_a == nodes_b
    assert [r.clients for r in a.rounds_] == [r.clients for r in b.rounds_]


@pytest.mark.parametrize("binding", [{1: 6}, {1: 0, 2: 9}])
def test_a_binding_to_an_id_outside_the_federation_is_refused_at_construction(binding):
    with pytest.raises(InvalidParameterError, match=r"SelectorStrategy: parameter node_binding=.*below n_clients=6"):
        SelectorStrategy("random", n_clients=N, node_binding=binding)


@pytest.mark.parametrize("binding", [{}, {1: 0, 2: 0}, {-1: 0}, {1: 1.0}, {"1": 0}, {1: True}])
def test_a_malformed_binding_is_refused_at_construction(binding):
    with pytest.raises(InvalidParameterError, match="SelectorStrategy: parameter node_binding="):
        SelectorStrategy("random", n_clients=N, node_binding=binding)


def test_a_binding_changed_after_construction_is_checked_again_before_any_message(clients):
    strategy = SelectorStrategy("random", n_clients=N, node_binding={1: 0})
    strategy.node_binding = {1: 0, 2: 7}
    grid = LocalGrid(clients.client_app(), N, seed=5)
    with pytest.raises(InvalidParameterError, match="node_binding"):
        strategy.start(grid, clients.initial_arrays(), num_rounds=1)
    assert not grid.sent


def test_read_node_binding(tmp_path):
    path = tmp_path / "binding.json"
    path.write_text(json.dumps({"8812": 0, "17": 1}))
    assert read_node_binding(path) == {8812: 0, 17: 1}
    assert read_node_binding(str(path)) == {8812: 0, 17: 1}
    for bad, match in [
        ('{"1": 0, "2": 0}', "distinct"),
        ('{"1": 0, "1": 1}', "listed twice"),
        ('{"x": 0}', "not a node id"),
        ('{"1": -3}', "not a node id"),
        ('{"1": 1.5}', "not a node id"),
        ("[[1, 0]]", "one JSON object"),
        ("{}", "distinct"),
        ("{", "not a JSON binding"),
    ]:
        path.write_text(bad)
        with pytest.raises(ValueError, match=match):
            read_node_binding(path)
    with pytest.raises(TypeError, match="str or path"):
        read_node_binding(1)  # a file descriptor is not a path


def test_a_strategy_reads_its_binding_from_a_file(tmp_path, clients):
    grid = LocalGrid(clients.client_app(), N, seed=5)
    path = tmp_path / "binding.json"
    path.write_text(json.dumps({str(n): k for n, k in binding_of(grid).items()}))
    strategy, nodes = run(clients, grid, rounds=1, node_binding=read_node_binding(path))
    assert nodes[1] == {k: grid.node_of_partition(k) for k in range(N)}
    assert np.array_equal(strategy.wire_.n_samples_array() > 0, np.ones(N, dtype=bool))
