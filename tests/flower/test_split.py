"""SelectorStrategy's collaborators (issue 35, item 2): the wire (node map, hellos, exchanges, bytes and seconds) and
the reply checks (screening, the norm bound's and the loss rules' references), each with its own state, used through
public methods only."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

import fedselect.flower as flower_pkg
from fedselect.flower import LocalGrid
from fedselect.flower import _protocol as P
from fedselect.flower.checks import NORM_HISTORY, ReplyChecks
from fedselect.flower.wire import Wire
from fedselect.ledger import RoundLedger

FLOWER = Path(flower_pkg.__file__).resolve().parent
#: private names of other objects the flower modules may call: the selector contract's own hook
ALLOWED = {"_validate_params"}


@pytest.mark.parametrize("name", ["strategy.py", "transport.py", "records.py", "wire.py", "checks.py"])
def test_no_private_reaches_between_the_strategy_its_oracle_the_wire_and_the_checks(name):
    """Only ``self._x`` and ``cls._x``: a class touches no other object's private members (mutation: point one of
    FlowerOracle's call sites back at ``self._st._node_of``)."""
    tree = ast.parse((FLOWER / name).read_text())
    reaches = [
        f"line {node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and node.attr not in ALLOWED
        and not (isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"})
    ]
    assert reaches == []


@pytest.mark.parametrize("name", ["wire.py", "checks.py", "transport.py", "records.py"])
def test_the_collaborators_are_modules_of_a_readable_size(name):
    assert len((FLOWER / name).read_text().splitlines()) <= 800


def _hello_app(k: int, n_k: int):
    def app(message: Message, context) -> Message:
        return Message(RecordDict({"metrics": MetricRecord({P.CLIENT_ID: k, P.NUM_EXAMPLES: n_k})}), reply_to=message)

    return app


def _failing_app(message: Message, context) -> Message:
    raise RuntimeError("not started")


def test_the_wire_binds_ids_to_the_first_node_and_backs_off_failed_hellos():
    grid = LocalGrid(_failing_app, 0, seed=0)
    first = grid.add_node({}, _hello_app(0, 5))
    rival = grid.add_node({}, _hello_app(0, 7))  # claims the id the first node holds: refused
    failing = grid.add_node({})  # answers with an error: asked again after a back-off
    second = grid.add_node({}, _hello_app(1, 9))
    wire = Wire(n_clients=2, query_timeout=60.0, max_num_examples=100)
    wire.refresh_nodes(grid, connecting=True)
    assert wire.client_nodes() == {0: first, 1: second} and wire.n_samples == {0: 5, 1: 9}
    assert wire.client_of(rival) is None and wire.node_of(0) == first
    assert [node for node, _ in wire.refusals()] == [rival]
    assert wire.traffic["hello"].messages_down == 4 and wire.traffic["hello"].messages_up == 4
    asked = []
    for _ in range(8):  # failed again each time: asked again 1, 2, 4, 8 refreshes later
        grid.sent.clear()
        wire.refresh_nodes(grid)
        asked.append(any(m.metadata.dst_node_id == failing for m in grid.sent))
    assert asked == [True, False, True, False, False, False, True, False]
    assert np.array_equal(wire.n_samples_array(), [5, 9])
    wire.begin_round()
    assert wire.traffic == {} and wire.wall == 0.0 and wire.reply_seconds == {}


def _update(delta: np.ndarray) -> RecordDict:
    return RecordDict(
        {
            "update": ArrayRecord(numpy_ndarrays=[delta.astype(np.float32)], keep_input=True),
            "metrics": MetricRecord({P.STEPS: 2}),
        }
    )


def test_the_checks_keep_the_norm_reference_of_earlier_rounds_only():
    layout = P.ModelLayout(ArrayRecord(numpy_ndarrays=[np.zeros(3, np.float32)], keep_input=True))
    checks = ReplyChecks(layout, lambda node: None, update_norm_bound=2.0)
    checks.begin_round({})
    delta, steps, grads, buffers = checks.parse_update(_update(np.array([3.0, 4.0, 0.0])))
    assert np.allclose(delta, [3, 4, 0]) and (steps, grads, buffers) == (2, 0, {})
    with pytest.raises(P.BadReply, match="NaN"):
        checks.parse_update(_update(np.array([np.nan, 0.0, 0.0])))
    checks.remember_norms([1.0] * (NORM_HISTORY + 5))
    assert checks.norm_history == [1.0] * NORM_HISTORY
    led = RoundLedger(3, 0)
    stacked = np.array([[1.0, 0, 0], [0, 1.5, 0], [0, 0, 30.0]], np.float32)
    _, keep, within = checks.bound_norms(np.arange(3), stacked, led, np.zeros(3))
    assert keep.tolist() == [True, True, False] and within.tolist() == [True, True, False]
    assert set(checks.rejected) == {2} and led.is_failed(2)
    checks.begin_round({})
    assert checks.rejected == {}


def test_the_checks_loss_history_is_each_clients_own_and_lies_do_not_enter_it():
    layout = P.ModelLayout(ArrayRecord(numpy_ndarrays=[np.zeros(2, np.float32)], keep_input=True))
    checks = ReplyChecks(layout, lambda node: None, loss_clip_history=2.0)
    assert checks.clip_losses([0, 1], [1.0, 4.0], on_global=True) == [1.0, 4.0]
    assert checks.clip_losses([0, 1], [100.0, 3.0], on_global=True) == [2.0, 3.0]
    assert checks.clip_losses([0], [100.0], on_global=True) == [2.0]  # the lie did not move client 0's bounds
    assert checks.clip_losses([0], [100.0], on_global=False) == [100.0]  # a trial model's loss has no history


def test_the_checks_refuse_a_reply_that_names_another_client():
    layout = P.ModelLayout(ArrayRecord(numpy_ndarrays=[np.zeros(2, np.float32)], keep_input=True))
    checks = ReplyChecks(layout, {7: 0, 8: 1}.get)
    out = Message(RecordDict({"config": ConfigRecord()}), 7, P.LOSS, group_id="1")
    good = Message(RecordDict({"metrics": MetricRecord({P.CLIENT_ID: 0, P.LOSS_KEY: 1.0})}), reply_to=out)
    good.metadata.__dict__["_src_node_id"] = 7
    out2 = Message(RecordDict({"config": ConfigRecord()}), 8, P.LOSS, group_id="1")
    liar = Message(RecordDict({"metrics": MetricRecord({P.CLIENT_ID: 0, P.LOSS_KEY: 1.0})}), reply_to=out2)
    liar.metadata.__dict__["_src_node_id"] = 8
    got = checks.valid_replies([good, liar])
    assert list(got) == [0] and "names client 0" in checks.rejected[1]


def test_flower_asks_through_the_one_oracle():
    """FlowerOracle is a RoundOracle over FlowerClients: the questions are not written again (mutation: restore an
    override of ``local_updates`` in flower/transport.py); only the trial-model exchange and the round's training,
    handed to Flower as messages, are its own. The old import path keeps working."""
    import fedselect.flower.strategy as strategy
    import fedselect.flower.transport as transport
    from fedselect.round import RoundOracle, TransportPolicies

    assert issubclass(transport.FlowerOracle, RoundOracle) and issubclass(transport.FlowerClients, TransportPolicies)
    shared = ("losses", "_losses", "_ask_losses", "trial", "local_updates", "global_parameters", "aggregate_buffers")
    assert [name for name in shared if name in vars(transport.FlowerOracle)] == []
    assert (transport.FlowerClients.transforms_on, transport.FlowerClients.reaches_offline) == ("server", False)
    for name in ("FlowerOracle", "FlowerRound", "TrainMessages"):
        assert getattr(strategy, name) is getattr(flower_pkg, name, getattr(transport, name, None)) is not None


def test_train_timeout_is_the_deprecated_name_of_the_deadline():
    from fedselect.flower.strategy import SelectorStrategy

    with pytest.warns(DeprecationWarning, match=r"SelectorStrategy: train_timeout= is deprecated.*deadline=5"):
        old = SelectorStrategy("random", n_clients=4, train_timeout=5)
    assert old.wait_for_training() == 5
    assert SelectorStrategy("random", n_clients=4, deadline=7).wait_for_training() == 7
