"""SelectorStrategy on an in-process Grid: queries go to exactly the nodes needed, failures are left out."""

import warnings

import numpy as np
import pytest

pytest.importorskip("flwr")

import fedselect
from fedselect._validation import InvalidParameterError, invalid_values
from fedselect.flower import (
    FederationClients,
    FlowerRoundWarning,
    LocalGrid,
    SelectorStrategy,
    make_client_app,
)
from fedselect.selection import BaseSelector, Selection

from .conftest import TRAIN, models_sent, recording, round_messages


def _run(fed, selector, rounds=3, faults=None, remove=(), clients_per_round=3, **kw):
    clients = FederationClients(fed, random_state=0, **TRAIN)
    grid = LocalGrid(clients.client_app(), fed.n_clients, seed=5)
    for partition, fault in (faults or {}).items():
        grid.faults[grid.node_of_partition(partition)] = fault
    for partition in remove:
        grid.remove_node(grid.node_of_partition(partition))
    kw.setdefault("connect_timeout", 5.0)
    kw.setdefault("n_clients", fed.n_clients)
    strategy = SelectorStrategy(selector, clients_per_round=clients_per_round, random_state=0, **kw)
    result = strategy.start(grid, clients.initial_arrays(), num_rounds=rounds)
    return strategy, grid, result


def _types(grid):
    return [(m.metadata.message_type, m.metadata.dst_node_id) for m in grid.sent]


def test_losses_are_asked_of_exactly_the_candidates(fed8):
    strategy, grid, _ = _run(fed8, fedselect.get_selector("power-of-choice", d=5), rounds=2)
    loss_msgs = [m for m in grid.sent if m.metadata.message_type == "query.fedselect_loss"]
    assert len(loss_msgs) == 2 * 5  # d candidates per round, nobody else
    for rec in strategy.rounds_:
        assert rec.traffic["loss"].messages_down == 5 and rec.traffic["loss"].messages_up == 5
        assert rec.costs.scalars_up == 5 and rec.costs.models_down == 5
        # the chosen clients already hold w^t: their train messages carry no model
        assert rec.traffic["train"].bytes_down < rec.traffic["loss"].bytes_down / 5


def test_a_timeout_and_an_error_reply_are_left_out(fed8):
    def drop_train(msg):
        return "timeout" if msg.metadata.message_type == "train" else None

    def error_after_hello(msg):
        return None if msg.metadata.message_type == "query.fedselect_hello" else "error"

    # Everybody is chosen each round, so both faulty clients are always in the selection.
    strategy, _, result = _run(
        fed8,
        "random",
        rounds=2,
        clients_per_round=8,
        faults={2: drop_train, 5: error_after_hello},
        aggregation="data-size",
    )
    for rec in strategy.rounds_:
        assert rec.clients == list(range(8))
        assert rec.failed == [2, 5]
        assert rec.reported == [0, 1, 3, 4, 6, 7]
        assert sum(rec.weights) == pytest.approx(1.0)  # the rule renormalises over who reported
        assert rec.costs.models_down == 8  # the messages were sent
        assert rec.costs.models_up == 6 and rec.costs.local_trainings == 6
    assert result.train_metrics_clientapp[2]["fedselect-failed"] == 2


def test_a_failed_candidate_answers_nan_and_the_round_goes_on(fed8):
    seen = {}

    class Recorder(BaseSelector):
        needs = frozenset({"losses"})  # its feedback carries the reporters' losses

        def __init__(self):
            pass

        def _fit(self, pool):
            pass

        def _select(self, n, *, round, oracle):
            seen["losses"] = oracle.losses(np.arange(self.n_clients_))
            seen["again"] = oracle.losses([3])
            return Selection(np.arange(n))

        def _update(self, feedback):
            seen["feedback"] = feedback

    def fail_loss(msg):
        return "timeout" if msg.metadata.message_type == "query.fedselect_loss" else None

    strategy, grid, _ = _run(fed8, Recorder(), rounds=1, clients_per_round=4, faults={3: fail_loss})
    assert np.isnan(seen["losses"][3]) and np.isfinite(np.delete(seen["losses"], 3)).all()
    assert np.isnan(seen["again"][0])
    node3 = grid.node_of_partition(3)
    assert sum(1 for t, n in _types(grid) if n == node3 and t != "query.fedselect_hello") == 1  # never asked again
    fb = seen["feedback"]
    assert fb.clients.tolist() == [0, 1, 2]  # 3 was chosen but failed: absent from the feedback
    assert np.isfinite(fb.losses).all()
    assert strategy.rounds_[0].failed == [3]


def test_fewer_live_nodes_than_asked_shrinks_the_round(fed8):
    clients = FederationClients(fed8, random_state=0, **TRAIN)
    grid = LocalGrid(clients.client_app(), fed8.n_clients, seed=5)
    strategy = SelectorStrategy(
        "random", clients_per_round=4, n_clients=fed8.n_clients, random_state=0, aggregation="data-size"
    )
    gone = {grid.node_of_partition(p) for p in range(5)}

    def after_round(server_round, arrays):  # everybody connected in round 0; then 5 nodes vanish
        if server_round == 1:
            for node in gone:
                grid.remove_node(node)

    with pytest.warns(FlowerRoundWarning, match="round 1 has 3 live client"):
        strategy.start(grid, clients.initial_arrays(), num_rounds=8, evaluate_fn=after_round)
    assert len(strategy.rounds_[0].clients) == 4 and len(strategy.rounds_[0].reported) == 4
    later = strategy.rounds_[1:]
    for t, rec in enumerate(later, start=1):
        assert len(rec.clients) == 3  # the round shrank to the live count
        # random does not know who is live: it may choose a gone client, which simply fails
        assert rec.reported == [k for k in rec.clients if k >= 5]
        assert set(range(5)) <= set(rec.failed)
        assert not any(m.metadata.dst_node_id in gone for m in round_messages(grid, t))
        # a gone client gets no message and is charged nothing
        assert rec.costs.models_down == rec.costs.local_trainings == rec.costs.models_up == len(rec.reported)
    assert any(rec.reported for rec in later)
    assert any(set(rec.clients) & set(range(5)) for rec in later)  # the case the docs describe did happen


def test_a_gone_client_answers_nan_without_a_message(fed8):
    seen = []

    class AskAll(BaseSelector):
        def __init__(self):
            pass

        def _fit(self, pool):
            pass

        def _select(self, n, *, round, oracle):
            seen.append((oracle.losses(np.arange(8)), oracle.local_updates([0, 6])))
            return Selection([6, 7][:n])

    clients = FederationClients(fed8, random_state=0, **TRAIN)
    grid = LocalGrid(clients.client_app(), fed8.n_clients, seed=5)
    strategy = SelectorStrategy(
        AskAll(), clients_per_round=2, n_clients=fed8.n_clients, random_state=0, aggregation="data-size"
    )

    def after_round(server_round, arrays):
        if server_round == 1:
            for p in range(5):
                grid.remove_node(grid.node_of_partition(p))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlowerRoundWarning)
        strategy.start(grid, clients.initial_arrays(), num_rounds=2, evaluate_fn=after_round)
    losses, updates = seen[1]
    assert np.isnan(losses[:5]).all() and np.isfinite(losses[5:]).all()
    assert np.isnan(updates[0]).all() and np.isfinite(updates[1]).all()
    assert sorted(
        grid.contexts[m.metadata.dst_node_id].node_config["partition-id"] for m in round_messages(grid, 1)
    ) == [5, 6, 6, 7, 7]  # losses of 5..7, the update of 6, 7's train
    rec = strategy.rounds_[1]
    assert rec.costs.models_down == 3 and rec.costs.scalars_up == 3 and rec.costs.local_trainings == 2
    assert rec.reported == [6, 7]


def test_the_trial_model_is_charged_per_message_sent(fed8):
    fedcor = fedselect.get_selector("fedcor", warmup_rounds=1, gp_interval=2, warmup_iters=5, gp_iters=5)
    clients = FederationClients(fed8, random_state=0, **TRAIN)
    grid = LocalGrid(clients.client_app(), fed8.n_clients, seed=5)
    strategy = SelectorStrategy(
        fedcor, clients_per_round=2, n_clients=fed8.n_clients, random_state=0, aggregation="data-size"
    )

    def after_round(server_round, arrays):
        if server_round == 2:  # round 2 is a GP round with a trial; client 4's node is gone by then
            grid.remove_node(grid.node_of_partition(4))

    strategy.start(grid, clients.initial_arrays(), num_rounds=3, evaluate_fn=after_round)
    rec = strategy.rounds_[2]
    trial_models = [
        m for m in round_messages(grid, 2) if m.content.config_records["config"].get("fedselect-model") == "trial"
    ]
    assert len(trial_models) == 7  # the trial model went to the 7 live clients
    assert 4 in rec.failed
    assert rec.costs.models_down == models_sent(grid, 2)  # w^t to the 7 live clients + 7 trial models
    assert rec.costs.models_down == 7 + 7


def test_trial_and_update_queries_cost_what_the_simulator_charges(fed8):
    fedcor = fedselect.get_selector("fedcor", warmup_rounds=1, gp_interval=2, warmup_iters=5, gp_iters=5)
    strategy, _, _ = _run(fed8, fedcor, rounds=4, clients_per_round=2, aggregation="data-size")
    sim = fedselect.FederatedTrainer(
        selector=fedcor, clients_per_round=2, rounds=4, aggregation="data-size", random_state=0, **TRAIN
    ).fit(fed8)
    assert "trial" in strategy.rounds_[2].traffic  # round 2 is a GP round with a trial
    trial = strategy.rounds_[2].traffic["trial"]
    assert trial.messages_down == 2 + 8  # 2 trial trainings, then the trial model to all 8 clients
    for a, b in zip(strategy.rounds_, sim.history_.rounds):
        assert a.costs.to_dict() == b.costs.to_dict()


def test_a_transform_runs_on_the_server_and_the_full_update_is_charged(fed8):
    seen = {}

    class Compressing(BaseSelector):
        def __init__(self):
            pass

        def _fit(self, pool):
            pass

        def _select(self, n, *, round, oracle):
            full = oracle.local_updates([0, 1])
            seen["norms"] = oracle.local_updates([0, 1], transform=lambda u: np.array([np.linalg.norm(u)]))
            seen["full"] = full
            return Selection([0, 1])

    strategy, grid, _ = _run(fed8, Compressing(), rounds=1, clients_per_round=2)
    np.testing.assert_allclose(seen["norms"][:, 0], np.linalg.norm(seen["full"], axis=1), rtol=1e-6)
    rec = strategy.rounds_[0]
    assert rec.costs.local_trainings == 2 and rec.costs.models_up == 2 and rec.costs.floats_up == 0
    assert rec.traffic["train"].messages_down == 0  # both chosen clients' updates were already on the server
    assert sum(1 for t, _ in _types(grid) if t == "query.fedselect_update") == 2


def test_weights_are_applied_unnormalised_to_deltas(fed8):
    class Weighted(BaseSelector):
        def __init__(self):
            pass

        def _fit(self, pool):
            pass

        def _select(self, n, *, round, oracle):
            seen["theta"] = oracle.global_parameters()
            seen["deltas"] = oracle.local_updates([1, 4])
            return Selection([1, 4], weights=[2.0, 0.5])

    seen = {}
    strategy, _, result = _run(fed8, Weighted(), rounds=1, clients_per_round=2)
    flat = np.concatenate([result.arrays[k].numpy().reshape(-1) for k in result.arrays.keys()])
    expected = seen["theta"] + 2.0 * seen["deltas"][0] + 0.5 * seen["deltas"][1]
    np.testing.assert_allclose(flat, expected, rtol=1e-5, atol=1e-6)
    assert strategy.rounds_[0].weights == [2.0, 0.5]


def test_inner_fedavg_rule_when_the_selection_has_no_weights(fed8):
    strategy, _, result = _run(fed8, "random", rounds=1, clients_per_round=3)
    ref, _, ref_result = _run(fed8, "random", rounds=1, clients_per_round=3, aggregation="data-size")
    a = np.concatenate([x.numpy().reshape(-1) for x in result.arrays.values()])
    b = np.concatenate([x.numpy().reshape(-1) for x in ref_result.arrays.values()])
    assert strategy.rounds_[0].clients == ref.rounds_[0].clients
    assert strategy.rounds_[0].weights == pytest.approx(ref.rounds_[0].weights)
    # FedAvg averages the local models w^t + delta_k by n_k: the same model up to float32 rounding.
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# Short warm-ups and intervals so that each selector's paid questions run while clients fail.
UNDER_FAILURES = {
    "hcsfed": {"n_clusters": 2},
    "fedcor": {"warmup_rounds": 1, "gp_interval": 2, "warmup_iters": 5, "gp_iters": 5},
}


@pytest.mark.parametrize("name", fedselect.list_selectors())
def test_every_selector_survives_failures(fed8, name):
    """Timeouts on every query of one client, error replies to training of another, one node gone."""

    def slow(msg):
        return "timeout" if msg.metadata.message_type != "query.fedselect_hello" else None

    def bad_train(msg):
        return "error" if msg.metadata.message_type in ("train", "query.fedselect_update") else None

    cls = type(fedselect.get_selector(name))
    selector = recording(cls)(**UNDER_FAILURES.get(name, {}))
    clients = FederationClients(fed8, random_state=0, **TRAIN)
    grid = LocalGrid(clients.client_app(), fed8.n_clients, seed=5)
    slow_node, bad_node = grid.node_of_partition(1), grid.node_of_partition(6)
    grid.faults[slow_node] = slow
    grid.faults[bad_node] = bad_train
    strategy = SelectorStrategy(
        selector, clients_per_round=3, n_clients=fed8.n_clients, random_state=0, aggregation="data-size"
    )

    def after_round(server_round, arrays):
        if server_round == 2:
            grid.remove_node(grid.node_of_partition(4))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlowerRoundWarning)
        result = strategy.start(grid, clients.initial_arrays(), num_rounds=4, evaluate_fn=after_round)
    assert len(strategy.rounds_) == 4
    feedbacks = strategy.selector_.feedbacks_
    for t, rec in enumerate(strategy.rounds_):
        assert not {1, 6} & set(rec.reported)
        assert set(rec.reported) <= set(rec.clients)
        # the feedback is the reporters', with their (finite) losses on w^t
        fb = next(f for f in feedbacks if f.round == t) if rec.reported else None
        if fb is not None:
            assert fb.clients.tolist() == rec.reported
            if "losses" in selector.needs:  # asked only for a selector that needs them
                assert np.isfinite(fb.losses).all() and len(fb.losses) == len(rec.reported)
            else:
                assert fb.losses is None
        # the costs follow the ledger's rules, message by message
        msgs = round_messages(grid, t)
        training = ("train", "query.fedselect_update")
        trains = [m.metadata.dst_node_id for m in msgs if m.metadata.message_type in training]
        assert len(trains) == len(set(trains))  # nobody trains twice in a round
        assert rec.costs.models_down == models_sent(grid, t)
        assert rec.costs.local_trainings == len(set(trains) - {slow_node, bad_node})
        assert rec.costs.models_up == rec.costs.local_trainings  # Flower uploads every update in full
        answered_losses = [
            m
            for m in msgs
            if m.metadata.dst_node_id != slow_node
            and (
                m.metadata.message_type == "query.fedselect_loss"
                or (
                    m.metadata.message_type == "train"
                    and m.metadata.dst_node_id != bad_node
                    and m.content.config_records["config"]["fedselect-need-loss"]
                )
            )
        ]
        # plus, for a selector that needs them (Oort), each reporter's sample loss, sent with its update
        sample_losses = len(rec.reported) if "sample_losses" in selector.needs else 0
        assert rec.costs.scalars_up == len(answered_losses) + sample_losses
    assert not {4} & set(strategy.rounds_[-1].reported)
    if name == "fedcor":  # its trial ran while clients failed
        assert "trial" in strategy.rounds_[2].traffic
    flat = np.concatenate([a.numpy().reshape(-1) for a in result.arrays.values()])
    assert np.isfinite(flat).all()


def test_make_client_app_with_parameters_and_a_lost_cached_model(fed8):
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

    calls = []

    def train(parameters, config, context):
        calls.append(config["fedselect-round"])
        return [p + 1.0 for p in parameters], {"fedselect-local-steps": 7}

    def evaluate(parameters, config, context):
        return float(sum(p.sum() for p in parameters)), 3

    app = make_client_app(train, evaluate, num_examples=12)
    grid = LocalGrid(app, 1, seed=0)
    node = grid.node_ids[0]
    model = ArrayRecord([np.zeros(3, np.float32), np.ones((2, 2), np.float32)])
    cfg = {"fedselect-round": 0, "fedselect-model": "global", "fedselect-need-loss": True}
    content = RecordDict({"arrays": model, "config": ConfigRecord(cfg)})
    (reply,) = grid.send_and_receive([Message(content, node, "train")])
    assert not reply.has_error()
    m = reply.content["metrics"]
    assert m["num-examples"] == 12 and m["loss"] == 4.0 and m["fedselect-local-steps"] == 7
    update = reply.content["update"].to_numpy_ndarrays()
    np.testing.assert_allclose(update[1], np.ones((2, 2)))  # parameters in, update out
    # A later message of the same round may omit the model: the client uses the one it kept.
    cached = ConfigRecord({"fedselect-round": 0, "fedselect-cached-model": True})
    (reply,) = grid.send_and_receive([Message(RecordDict({"config": cached}), node, "query.fedselect_loss")])
    assert reply.content["metrics"]["loss"] == 4.0
    # ... but not one of another round: an error reply, which the strategy treats as a failure.
    stale = ConfigRecord({"fedselect-round": 1, "fedselect-cached-model": True})
    (reply,) = grid.send_and_receive([Message(RecordDict({"config": stale}), node, "query.fedselect_loss")])
    assert reply.has_error() and "holds none for that round" in reply.error.reason
    assert isinstance(grid.contexts[node], Context)


def test_strategy_parameter_errors_name_the_parameter():
    with pytest.raises(ValueError, match="clients_per_round"):
        SelectorStrategy("random", clients_per_round=0, n_clients=5)
    with pytest.raises(ValueError, match="aggregation"):
        SelectorStrategy("random", n_clients=5, aggregation="median")
    with pytest.raises(ValueError, match="query_timeout"):
        SelectorStrategy("random", n_clients=5, query_timeout=-1)
    with pytest.raises(ValueError, match=r"random_state=-1 is invalid; expected None or an int in \[0, 2\*\*32 - 1\]"):
        SelectorStrategy("random", n_clients=5, random_state=-1)


@pytest.mark.parametrize("name", sorted(SelectorStrategy._parameter_constraints))
def test_every_invalid_parameter_is_refused_at_construction(name):
    bad = invalid_values(SelectorStrategy._parameter_constraints[name])
    assert bad
    args = {"selector": "random", "n_clients": 5}
    for value in bad:
        kw = {**args, name: value}
        selector = kw.pop("selector")
        with pytest.raises(InvalidParameterError, match=rf"SelectorStrategy: parameter {name}="):
            SelectorStrategy(selector, **kw)


def test_valid_edge_values_are_accepted():
    SelectorStrategy(
        fedselect.get_selector("random"),
        clients_per_round=1,
        n_clients=1,
        aggregation=None,
        query_timeout=1e-3,
        train_timeout=0.5,
        connect_timeout=1,
        random_state=2**32 - 1,
        partial_weights="as-given",
    )
    SelectorStrategy("fedcor", n_clients=5, random_state=0, aggregation="mean", inner=None)


@pytest.mark.parametrize("change", ["unknown selector", "bad selector parameter", "bad strategy attribute"])
def test_a_bad_setup_fails_at_start_before_any_message(fed8, change):
    clients = FederationClients(fed8, random_state=0, **TRAIN)
    grid = LocalGrid(clients.client_app(), fed8.n_clients, seed=5)
    strategy = SelectorStrategy("random", clients_per_round=2, n_clients=fed8.n_clients)
    if change == "unknown selector":
        strategy.selector, match = "no-such-scheme", "no-such-scheme"
    elif change == "bad selector parameter":
        strategy.selector, match = fedselect.get_selector("power-of-choice").set_params(d=0), "d=0"
    else:
        strategy.random_state, match = -1, "random_state=-1"
    with pytest.raises((ValueError, KeyError, LookupError), match=match):
        strategy.start(grid, clients.initial_arrays(), num_rounds=1)
    assert grid.sent == []


def test_a_configure_train_that_raises_leaves_no_earlier_round_to_aggregate(fed8):
    from flwr.app import ConfigRecord

    class FailsSecond(BaseSelector):
        def _fit(self, pool):
            self.calls = 0

        def _select(self, n, *, round, oracle):
            self.calls += 1
            if self.calls == 2:
                raise KeyError("the second selection fails")
            return Selection(np.arange(n))

        def _update(self, feedback):
            pass

    clients = FederationClients(fed8, random_state=0, **TRAIN)
    grid = LocalGrid(clients.client_app(), fed8.n_clients, seed=5)
    strategy = SelectorStrategy(FailsSecond(), clients_per_round=3, random_state=0, connect_timeout=5.0,
                                n_clients=fed8.n_clients)
    arrays = clients.initial_arrays()
    assert list(strategy.configure_train(1, arrays, ConfigRecord(), grid))  # round 0 opened, never aggregated
    with pytest.raises(KeyError, match="the second selection fails"):
        strategy.configure_train(2, arrays, ConfigRecord(), grid)
    # round 0 would now be concluded with round 1's counters and global model: it is gone instead
    for server_round in (1, 2):
        with pytest.raises(RuntimeError, match="call configure_train for this round first"):
            strategy.aggregate_train(server_round, [])
