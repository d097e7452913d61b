"""A model with buffers (batch norm running statistics) through Flower: averaged like the simulator averages them."""

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("flwr")

import fedselect
from fedselect import FederatedTrainer
from fedselect.flower import FederationClients, LocalGrid, SelectorStrategy
from fedselect.flower import _protocol as P
from fedselect.flower.strategy import _aggregate_buffers
from fedselect.selection import Selection
from fedselect.selectors.random import RandomSelector
from fedselect.simulation.engine import aggregate_buffers

BUFFERS = ["2.running_mean", "2.running_var", "2.num_batches_tracked"]


def bn_mlp(input_shape, n_out):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), 16), nn.BatchNorm1d(16), nn.ReLU(),
                         nn.Linear(16, n_out))


TRAIN_BN = dict(model=bn_mlp, local_steps=3, batch_size=16, lr=0.05)


class Probe(RandomSelector):
    """Random choice with weights that do not sum to 1, asking every question a selector can ask.

    Records what it sees, so a test can check that no buffer reaches a selector: a trial of
    clients 0-2 in rounds 0 and 2, the updates of clients 4 and 5 and the global parameters
    every round, and the feedback.
    """

    needs = frozenset({"updates", "global"})

    def _fit(self, pool):
        super()._fit(pool)
        self.trials_, self.local_, self.global_, self.feedbacks_ = {}, [], [], []

    def _select(self, n, *, round, oracle):
        if round in (0, 2):
            self.trials_[round] = oracle.trial([0, 1, 2])
        self.local_.append(oracle.local_updates([4, 5]))
        self.global_.append(oracle.global_parameters())
        chosen = super()._select(n, round=round, oracle=oracle).clients
        return Selection(chosen, weights=np.full(len(chosen), 0.5))

    def _update(self, feedback):
        self.feedbacks_.append(feedback)


def _alone(clients, arrays, t, ids, purpose="main"):
    """Each of ``ids`` trained alone from ``arrays`` (what the client does): parameter deltas and buffers."""
    eng = clients.engine
    values = [arrays[n].numpy() for n in [*eng.names, *eng.buffers]]
    theta, buffers = clients._flat(values), clients._buffers(values)
    deltas, bufs = [], []
    for k in ids:
        batches = eng.client_batches(clients.federation.client_indices, clients.schedule, int(clients.seeds[0]), t, [k])
        d, b = eng.train(theta, batches, lr=clients.lr, buffers=buffers, return_buffers=True)
        deltas.append(d[0])
        bufs.append({n: v[0] for n, v in b.items()})
    return torch.stack(deltas), {n: torch.stack([b[n] for b in bufs]) for n in buffers}, buffers


def _buffers_of(record):
    return {n: torch.from_numpy(record[n].numpy()) for n in BUFFERS}


def _assert_same_bits(got, want):
    for n in BUFFERS:
        assert got[n].dtype == want[n].dtype, n
        assert torch.equal(got[n], want[n]), f"{n}: {(got[n].double() - want[n].double()).abs().max()}"


@pytest.mark.parametrize("name", ["random", "power-of-choice"])
def test_a_batch_norm_model_chooses_what_the_simulator_chooses(fed20, name):
    rounds, seed = 6, 3
    selector = fedselect.get_selector(name, **({"d": 8} if name == "power-of-choice" else {}))
    trainer = FederatedTrainer(selector=selector, clients_per_round=4, rounds=rounds, aggregation="data-size",
                               random_state=seed, **TRAIN_BN).fit(fed20)
    clients = FederationClients(fed20, random_state=seed, pooled_losses=True, **TRAIN_BN)
    assert clients.buffer_names == BUFFERS
    grid = LocalGrid(clients.client_app(), fed20.n_clients, seed=11)
    strategy = SelectorStrategy(selector, clients_per_round=4, n_clients=fed20.n_clients, aggregation="data-size",
                                random_state=seed,
                                buffers=clients.buffer_names)
    result = strategy.start(grid, clients.initial_arrays(), num_rounds=rounds, evaluate_fn=clients.evaluate_fn())

    for sim, fl in zip(trainer.history_.rounds, strategy.rounds_):
        assert fl.clients == sim.clients, f"round {sim.round}"
        assert fl.reported == sim.clients and fl.failed == []
        assert fl.costs.to_dict() == sim.costs.to_dict(), f"round {sim.round}"
        assert fl.weights == pytest.approx(sim.weights, rel=1e-12)
    # Not to the last bit: the simulator trains a batch-norm model's chosen clients in one vmapped pass, whose
    # batched products round differently (about 1e-8) from one client's alone (Engine.train, not Flower: see
    # test_buffers_are_averaged_as_the_simulator_averages_them for the exact part). The buffers are averaged,
    # not summed: summed, running_var would be about 4 times the simulator's.
    final = _buffers_of(result.arrays)
    assert final["2.num_batches_tracked"].dtype == torch.int64
    assert int(final["2.num_batches_tracked"]) == int(trainer.buffers_["2.num_batches_tracked"]) == 3 * rounds
    for n in BUFFERS[:2]:
        np.testing.assert_allclose(final[n].numpy(), trainer.buffers_[n], rtol=1e-5, atol=1e-6)
    theta = np.concatenate([result.arrays[n].numpy().reshape(-1) for n in clients.engine.names])
    np.testing.assert_allclose(theta, trainer.parameters_, rtol=1e-5, atol=1e-6)
    assert result.evaluate_metrics_serverapp[rounds]["test-accuracy"] == trainer.history_.rounds[-1].test_accuracy
    assert result.evaluate_metrics_serverapp[rounds]["test-loss"] == pytest.approx(
        trainer.history_.rounds[-1].test_loss, rel=1e-6
    )


def test_buffers_are_averaged_as_the_simulator_averages_them(fed8):
    """Round by round, trial models included: the simulator's aggregate_buffers of each client's own buffers, bit for
    bit, with weights that do not sum to 1; selectors see the D parameters only."""
    rounds, seed, N = 3, 4, fed8.n_clients
    clients = FederationClients(fed8, random_state=seed, **TRAIN_BN)
    D = clients.engine.n_params
    grid = LocalGrid(clients.client_app(), N, seed=2)
    strategy = SelectorStrategy(Probe(), clients_per_round=3, n_clients=fed8.n_clients, random_state=seed,
                                buffers=clients.buffer_names)
    models = {}
    strategy.start(grid, clients.initial_arrays(), num_rounds=rounds,
                   evaluate_fn=lambda r, arrays: models.__setitem__(r, arrays))
    probe = strategy.selector_
    for t, record in enumerate(strategy.rounds_):
        before = models[t]
        assert record.reported == record.clients and sum(record.weights) == pytest.approx(1.5)
        _, client_bufs, b_t = _alone(clients, before, t, record.reported)
        _assert_same_bits(_buffers_of(models[t + 1]), aggregate_buffers(b_t, client_bufs, record.weights))
        # What the selector saw: parameters only, of length D, the clients' own parameter deltas.
        deltas, _, _ = _alone(clients, before, t, [4, 5])
        assert probe.local_[t].shape == (2, D)
        assert np.array_equal(probe.local_[t], deltas.numpy())
        assert probe.global_[t].shape == (D,)
        fb = probe.feedbacks_[t]
        assert fb.updates.shape == (len(record.reported), D)
        assert fb.global_before.shape == fb.global_after.shape == (D,)
        if t in probe.trials_:
            # The trial model every client evaluates: the trial clients' buffers averaged by n_k (FedAvg's rule).
            sent = [m for m in grid.sent if m.metadata.group_id == str(t + 1)
                    and m.content.config_records["config"].get(P.PURPOSE) == "trial" and "arrays" in m.content]
            assert len(sent) == N
            n_k = fed8.n_samples[[0, 1, 2]].astype(float)
            _, trial_bufs, _ = _alone(clients, before, t, [0, 1, 2], purpose="trial")
            want = aggregate_buffers(b_t, trial_bufs, n_k / n_k.sum())
            _assert_same_bits(_buffers_of(sent[0].content["arrays"]), want)
            assert not torch.equal(want["2.running_mean"], b_t["2.running_mean"])
            assert np.isfinite(probe.trials_[t]).all()


def test_a_trial_round_with_buffers_matches_the_simulator(fed8):
    rounds, seed = 3, 4
    trainer = FederatedTrainer(selector=Probe(), clients_per_round=3, rounds=rounds, random_state=seed,
                               **TRAIN_BN).fit(fed8)
    clients = FederationClients(fed8, random_state=seed, pooled_losses=True, **TRAIN_BN)
    grid = LocalGrid(clients.client_app(), fed8.n_clients, seed=2)
    strategy = SelectorStrategy(Probe(), clients_per_round=3, n_clients=fed8.n_clients, random_state=seed,
                                buffers=clients.buffer_names)
    strategy.start(grid, clients.initial_arrays(), num_rounds=rounds)
    sim, fl = trainer.selector_, strategy.selector_
    assert sorted(fl.trials_) == sorted(sim.trials_) == [0, 2]
    for t in fl.trials_:
        # Loss changes of the order of 0.1, equal up to the last-bit differences of batched training (see above).
        np.testing.assert_allclose(fl.trials_[t], sim.trials_[t], rtol=0, atol=1e-5)
    for a, b in zip(trainer.history_.rounds, strategy.rounds_):
        assert b.clients == a.clients and b.costs.to_dict() == a.costs.to_dict()
    for a, b in zip(sim.feedbacks_, fl.feedbacks_):
        assert b.updates.shape == a.updates.shape == (3, clients.engine.n_params)


def test_an_unknown_buffer_name_is_refused_before_any_message(fed8):
    clients = FederationClients(fed8, random_state=0, **TRAIN_BN)
    grid = LocalGrid(clients.client_app(), fed8.n_clients, seed=5)
    strategy = SelectorStrategy("random", clients_per_round=2, n_clients=fed8.n_clients,
                                buffers=["2.running_mean", "bn.running_var"])
    evaluated = []
    with pytest.raises(ValueError, match=r"\['bn.running_var'\] that the model's ArrayRecord does not hold"):
        strategy.start(grid, clients.initial_arrays(), num_rounds=1, evaluate_fn=lambda r, a: evaluated.append(r))
    assert grid.sent == [] and evaluated == []  # not even the evaluation before round 0 ran
    # Not naming them: num_batches_tracked (int64) cannot be a parameter; the error says what to do.
    strategy = SelectorStrategy("random", clients_per_round=2, n_clients=fed8.n_clients)
    with pytest.raises(TypeError, match=r"'2.num_batches_tracked' has dtype int64.*SelectorStrategy\(buffers="):
        strategy.start(grid, clients.initial_arrays(), num_rounds=1)
    assert grid.sent == []


def test_a_model_without_buffers_sends_what_it_sent(fed8):
    clients = FederationClients(fed8, random_state=0, model="mlp", local_steps=3, batch_size=16, lr=0.05)
    assert clients.buffer_names == []
    assert list(clients.initial_arrays().keys()) == clients.engine.names


def test_the_server_arithmetic_is_aggregate_buffers_on_differences():
    rng = np.random.default_rng(0)
    b = {"mean": torch.from_numpy(rng.normal(size=(5,)).astype(np.float32)),
         "count": torch.tensor(7, dtype=torch.int64), "mask": torch.tensor([True, False, True])}
    clients = {"mean": torch.from_numpy(rng.normal(size=(3, 5)).astype(np.float32)),
               "count": torch.tensor([9, 10, 12]), "mask": torch.tensor([[False] * 3] * 3)}
    weights = np.array([0.7, 1.9, 0.4])  # unnormalised: the buffers use them normalised
    deltas = [{n: P.buffer_delta(clients[n][i].numpy(), b[n].numpy()) for n in b} for i in range(3)]
    got = _aggregate_buffers({n: v.numpy() for n, v in b.items()}, deltas, weights)
    want = aggregate_buffers(b, clients, weights)
    for n in b:
        assert got[n].dtype == want[n].numpy().dtype and got[n].shape == tuple(want[n].shape)
        assert np.array_equal(got[n], want[n].numpy()), n
    assert int(got["count"]) == round(7 + (0.7 * 2 + 1.9 * 3 + 0.4 * 5) / 3.0)


def test_int_and_bool_buffers_survive_the_round_trip():
    from flwr.app import Array, ArrayRecord

    record = ArrayRecord(array_dict={"w": Array(np.ones((2, 3), np.float32)), "n": Array(np.array(4, np.int64)),
                                     "m": Array(np.array([True, False]))})
    layout = P.ModelLayout(record, ["n", "m"])
    assert layout.size == 6 and layout.buffer_keys == ["n", "m"]
    back = layout.record(np.zeros(6, np.float32), layout.buffers(record))
    assert list(back.keys()) == ["w", "n", "m"]
    assert back["n"].numpy().dtype == np.int64 and back["n"].numpy().shape == () and int(back["n"].numpy()) == 4
    assert back["m"].numpy().tolist() == [True, False]


def test_integer_buffers_take_the_rounded_mean_half_to_even():
    """num_batches_tracked: b^t + round(mean difference), rounding halves to even as the simulator does (1.5 -> 2,
    2.5 -> 2), never truncating or rounding halves up."""
    b = {"count": np.array(10, np.int64)}
    for diffs, want in [((1, 2), 12), ((2, 3), 12), ((3, 4), 14), ((0, 1), 10)]:
        deltas = [{"count": np.array(d, np.int64)} for d in diffs]
        got = _aggregate_buffers(b, deltas, [1.0, 1.0])
        sim = aggregate_buffers({"count": torch.tensor(10)}, {"count": torch.tensor([10 + d for d in diffs])},
                                [1.0, 1.0])
        assert int(got["count"]) == int(sim["count"]) == want, diffs


def test_buffers_with_the_inner_strategys_aggregation(fed8):
    """aggregation=None (the inner FedAvg aggregates the parameters): the buffers are the n_k-weighted mean of the
    reporters' own, as the simulator's data-size rule gives them."""
    rounds, seed = 2, 3
    clients = FederationClients(fed8, random_state=seed, **TRAIN_BN)
    grid = LocalGrid(clients.client_app(), fed8.n_clients, seed=2)
    strategy = SelectorStrategy("random", clients_per_round=3, n_clients=fed8.n_clients, random_state=seed,
                                buffers=clients.buffer_names)
    assert strategy.aggregation is None
    models = {}
    strategy.start(grid, clients.initial_arrays(), num_rounds=rounds,
                   evaluate_fn=lambda r, arrays: models.__setitem__(r, arrays))
    for t, record in enumerate(strategy.rounds_):
        assert record.reported == record.clients
        _, client_bufs, b_t = _alone(clients, models[t], t, record.reported)
        n_k = fed8.n_samples[record.reported].astype(float)
        np.testing.assert_allclose(record.weights, n_k / n_k.sum())
        _assert_same_bits(_buffers_of(models[t + 1]), aggregate_buffers(b_t, client_bufs, n_k / n_k.sum()))
        assert int(models[t + 1]["2.num_batches_tracked"].numpy()) == 3 * (t + 1)


def test_a_broken_buffer_difference_is_refused():
    from flwr.app import Array, ArrayRecord

    record = ArrayRecord(array_dict={"w": Array(np.ones(2, np.float32)), "n": Array(np.array(4, np.int64)),
                                     "m": Array(np.array([True, False]))})
    layout = P.ModelLayout(record, ["n", "m"])

    def update(n, m):
        return ArrayRecord(array_dict={"w": Array(np.zeros(2, np.float32)), "n": Array(np.asarray(n)),
                                       "m": Array(np.asarray(m))})

    ok = layout.buffer_deltas(update(np.float64(3.0), np.array([1, 0], np.int8)))
    assert ok["n"].dtype == np.int64 and int(ok["n"]) == 3 and ok["m"].tolist() == [True, False]
    with pytest.raises(ValueError, match=r"integer buffer 'n' \(int64\).*not a whole number"):
        layout.buffer_deltas(update(np.float64(2.5), np.array([True, False])))
    with pytest.raises(ValueError, match=r"integer buffer 'n'"):
        layout.buffer_deltas(update(np.float64(np.nan), np.array([True, False])))
    with pytest.raises(ValueError, match=r"boolean buffer 'm'.*not boolean"):
        layout.buffer_deltas(update(np.int64(1), np.array([0.5, 0.0], np.float32)))


def test_a_client_with_a_broken_buffer_difference_fails_its_round(fed8):
    """A reply whose count moved by a fraction is rejected: the client counts as failed, the others aggregate."""
    clients = FederationClients(fed8, random_state=1, **TRAIN_BN)

    def train(parameters, config, context):
        arrays, metrics = clients.train(parameters, config, context)
        if int(context.node_config["partition-id"]) % 2 == 0:
            arrays[-1] = np.asarray(arrays[-1], dtype=np.float64) + 0.5
        return arrays, metrics

    from fedselect.flower import make_client_app

    app = make_client_app(train, clients.evaluate, train_returns="update",
                          num_examples=lambda ctx: clients.n_samples(int(ctx.node_config["partition-id"])))
    strategy = SelectorStrategy("random", clients_per_round=4, n_clients=fed8.n_clients, random_state=1,
                                buffers=clients.buffer_names)
    strategy.start(LocalGrid(app, fed8.n_clients, seed=1), clients.initial_arrays(), num_rounds=2)
    assert any(k % 2 == 0 for r in strategy.rounds_ for k in r.clients)
    for record in strategy.rounds_:
        assert set(record.failed) >= {k for k in record.clients if k % 2 == 0}
        assert record.reported == [k for k in record.clients if k % 2 == 1]


def test_a_single_sample_minibatch_is_refused_on_the_server_before_training(fed8):
    """The trainer's batch-norm check, made where the server builds the initial model: batch_size=1, or whole epochs
    leaving a last batch of one sample, would make every client fail inside Flower."""
    with pytest.raises(ValueError, match=r"FederationClients: the model has a batch norm layer.*batch_size=1"):
        FederationClients(fed8, model=bn_mlp, local_steps=3, batch_size=1).initial_arrays()
    n = int(fed8.n_train_samples[0])
    with pytest.raises(ValueError, match=r"FederationClients: .*whole local epochs client\(s\) \[0"):
        FederationClients(fed8, model=bn_mlp, local_epochs=1, batch_size=n - 1).initial_arrays()
    with pytest.raises(ValueError, match=r"FederatedTrainer: .*whole local epochs client\(s\) \[0"):
        FederatedTrainer(selector="random", model=bn_mlp, local_epochs=1, batch_size=n - 1, rounds=1,
                         clients_per_round=2).fit(fed8)
    # Without batch norm, the same schedule is fine.
    FederationClients(fed8, model="mlp", local_steps=3, batch_size=1).initial_arrays()


def test_the_model_is_built_as_the_trainer_builds_it(fed8):
    module = bn_mlp(fed8.input_shape, fed8.n_classes)
    with pytest.raises(ValueError, match=r"FederationClients: model_params=\{'hidden': 8\} cannot apply to a module"):
        FederationClients(fed8, model=module, model_params={"hidden": 8}).initial_arrays()
    with pytest.raises(TypeError, match=r"FederationClients: model=.* returned int, not a torch.nn.Module"):
        FederationClients(fed8, model=lambda shape, n: 3).initial_arrays()
