"""Training options of the trainer: the loss, local SGD momentum, and what random_state seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedselect import FederatedTrainer
from fedselect.data import Federation, make_federation
from fedselect.selection import BaseSelector, Selection
from fedselect.simulation.engine import Engine, LocalSchedule
from fedselect.simulation.models import FedCorMLP


@pytest.fixture(scope="module")
def fed():
    return make_federation("digits", partition="shards", n_clients=10, random_state=0)


def _regression(n_clients=6, n=600, d=5, seed=0, noise=0.05):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=d)
    X = rng.normal(size=(n + 200, d)).astype(np.float32)
    y = (X @ w + noise * rng.normal(size=n + 200)).astype(np.float32)
    parts = np.array_split(np.arange(n), n_clients)
    return Federation(X[:n], y[:n], parts, X[n:], y[n:])


# -- the loss ---------------------------------------------------------------------------------------------------------
def test_explicit_and_callable_cross_entropy_equal_the_default_bit_for_bit(fed):
    kw = dict(rounds=3, clients_per_round=3, random_state=0, track_global_loss=True)
    default = FederatedTrainer(**kw).fit(fed)
    named = FederatedTrainer(loss="cross-entropy", **kw).fit(fed)
    func = FederatedTrainer(loss=lambda out, y: F.cross_entropy(out, y, reduction="none"), **kw).fit(fed)
    assert np.array_equal(default.parameters_, named.parameters_)
    assert np.array_equal(default.parameters_, func.parameters_)
    assert default.history_ == named.history_


def test_a_callable_loss_is_used_for_training_and_evaluation(fed):
    """2 x cross-entropy at half the learning rate takes the same steps; every recorded loss doubles."""
    kw = dict(rounds=3, clients_per_round=3, random_state=0, track_global_loss=True, model="logistic")
    base = FederatedTrainer(lr=0.1, **kw).fit(fed)
    twice = FederatedTrainer(lr=0.05, loss=lambda out, y: 2 * F.cross_entropy(out, y, reduction="none"), **kw).fit(fed)
    np.testing.assert_allclose(twice.parameters_, base.parameters_, atol=1e-5)
    for a, b in zip(base.history_.rounds, twice.history_.rounds):
        assert b.test_loss == pytest.approx(2 * a.test_loss, rel=1e-4)
        assert b.global_loss == pytest.approx(2 * a.global_loss, rel=1e-4)
        assert b.test_accuracy == pytest.approx(a.test_accuracy)


def test_the_oracle_reports_the_chosen_loss():
    fedr = _regression()
    seen = {}

    class Asker(BaseSelector):
        def fit(self, pool):
            self.n_ = pool.n_clients
            return self

        def select(self, n, *, round, oracle):
            if round == 0:
                seen["losses"] = oracle.losses(np.arange(self.n_))
                seen["theta"] = oracle.global_parameters()
            return Selection(np.arange(n))

        def update(self, feedback):
            return self

    def linear(shape, n_out):
        return nn.Linear(shape[0], n_out)

    FederatedTrainer(selector=Asker(), model=linear, loss="mse", rounds=1, clients_per_round=2,
                     random_state=0).fit(fedr)
    d = fedr.input_shape[0]
    w, b = seen["theta"][:d], seen["theta"][d]
    expected = [np.mean((fedr.X[ix] @ w + b - fedr.y[ix]) ** 2) for ix in fedr.client_indices]
    np.testing.assert_allclose(seen["losses"], expected, rtol=1e-5)


def test_mse_regression_trains_and_records_no_accuracy():
    fedr = _regression()
    assert fedr.regression and fedr.n_outputs == 1 and "regression" in repr(fedr)
    tr = FederatedTrainer(model="logistic", loss="mse", rounds=15, clients_per_round=3, lr=0.05,
                          random_state=0).fit(fedr)
    losses = [r.test_loss for r in tr.history_.rounds]
    assert losses[-1] < 0.1 * losses[0]
    assert all(r.test_accuracy is None for r in tr.history_.rounds)
    assert tr.history_.rounds_to_accuracy(0.5) is None


def test_regression_errors_come_before_training():
    fedr = _regression()
    with pytest.raises(ValueError, match=r"target_accuracy=0.9 but the federation's targets are floats"):
        FederatedTrainer(model="logistic", loss="mse", target_accuracy=0.9, clients_per_round=2).fit(fedr)
    with pytest.raises(ValueError, match=r"loss='cross-entropy' needs integer class labels.*loss='mse'"):
        FederatedTrainer(model="logistic", clients_per_round=2).fit(fedr)
    fed = make_federation("digits", n_clients=4, random_state=0)
    with pytest.raises(ValueError, match="loss='mse' needs float targets"):
        FederatedTrainer(loss="mse", clients_per_round=2).fit(fed)
    with pytest.raises(ValueError, match="gives 10 outputs per sample but there are 1 targets per sample"):
        FederatedTrainer(model=FedCorMLP(fed.input_shape, 10), loss="mse", clients_per_round=2).fit(Federation(
            fed.X, fed.y.astype(np.float32), fed.client_indices, fed.X_test, fed.y_test.astype(np.float32)))
    with pytest.raises(ValueError, match=r"must return one loss per sample.*got \(\)"):
        FederatedTrainer(loss=lambda out, y: F.cross_entropy(out, y), clients_per_round=2).fit(fed)
    with pytest.raises(ValueError, match="loss"):
        FederatedTrainer(loss="hinge", clients_per_round=2).fit(fed)


def test_multi_output_regression():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 4)).astype(np.float32)
    y = (X @ rng.normal(size=(4, 2))).astype(np.float32)
    fedr = Federation(X[:240], y[:240], np.array_split(np.arange(240), 4), X[240:], y[240:])
    assert fedr.n_outputs == 2
    tr = FederatedTrainer(model="mlp", loss="mse", rounds=10, clients_per_round=2, random_state=0).fit(fedr)
    assert tr.history_.rounds[-1].test_loss < tr.history_.rounds[0].test_loss


# -- momentum ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("momentum", "nesterov", "wd"), [(0.9, False, 0.0), (0.5, True, 1e-3), (0.0, False, 1e-3)])
def test_engine_momentum_equals_torch_sgd(momentum, nesterov, wd):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, size=120)
    parts = [np.arange(0, 70), np.arange(70, 120)]
    torch.manual_seed(0)
    model = FedCorMLP((1, 8, 8), 10)
    eng = Engine(model, X, y, parts, X[:10], y[:10])
    theta = eng.initial_parameters()
    batches = eng.client_batches(parts, LocalSchedule(16, epochs=2), seed=0, round=0, clients=[0, 1])
    got = eng.train(theta, batches, lr=0.1, momentum=momentum, nesterov=nesterov, weight_decay=wd)
    for i, bs in enumerate(batches):  # one client at a time, a fresh optimiser (momentum buffer) per round
        ref = FedCorMLP((1, 8, 8), 10)
        torch.nn.utils.vector_to_parameters(theta.clone(), ref.parameters())
        opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=momentum, nesterov=nesterov, weight_decay=wd)
        for ix in bs:
            opt.zero_grad()
            F.cross_entropy(ref(torch.from_numpy(X[ix])), torch.from_numpy(y[ix])).backward()
            opt.step()
        expected = torch.nn.utils.parameters_to_vector(ref.parameters()).detach() - theta
        torch.testing.assert_close(got[i], expected, atol=1e-5, rtol=1e-5)
    # the buffer starts empty in every call: training twice from theta gives the same update
    again = eng.train(theta, batches, lr=0.1, momentum=momentum, nesterov=nesterov, weight_decay=wd)
    assert torch.equal(again, got)


def test_trainer_momentum(fed):
    kw = dict(rounds=3, clients_per_round=3, random_state=0, model="logistic")
    plain = FederatedTrainer(**kw).fit(fed)
    assert np.array_equal(FederatedTrainer(momentum=0.0, **kw).fit(fed).parameters_, plain.parameters_)
    heavy = FederatedTrainer(momentum=0.9, **kw).fit(fed)
    assert not np.allclose(heavy.parameters_, plain.parameters_)
    with pytest.raises(ValueError, match="nesterov=True needs momentum > 0"):
        FederatedTrainer(nesterov=True, **kw).fit(fed)
    with pytest.raises(ValueError, match="momentum"):
        FederatedTrainer(momentum=1.0, **kw).fit(fed)


# -- what random_state seeds ------------------------------------------------------------------------------------------
def _initial(fed, model, seed):
    """The initial global model: a learning rate so small that one round cannot change a float32 weight."""
    tr = FederatedTrainer(model=model, rounds=1, clients_per_round=2, lr=1e-30, random_state=seed)
    return tr.fit(fed).parameters_


def test_a_passed_module_is_used_as_given(fed):
    torch.manual_seed(123)
    module = FedCorMLP(fed.input_shape, 10)
    w0 = torch.nn.utils.parameters_to_vector(module.parameters()).detach().numpy().copy()
    a, b = _initial(fed, module, 0), _initial(fed, module, 1)
    assert np.array_equal(a, w0) and np.array_equal(b, w0)  # not re-initialised by random_state
    FederatedTrainer(model=module, rounds=2, clients_per_round=2, random_state=0).fit(fed)
    assert np.array_equal(torch.nn.utils.parameters_to_vector(module.parameters()).detach().numpy(), w0)  # untouched
    with pytest.raises(ValueError, match=r"model_params.*cannot apply to a module instance"):
        FederatedTrainer(model=module, model_params={"dropout": 0.5}, clients_per_round=2).fit(fed)


def test_names_and_builders_are_seeded_by_random_state(fed):
    for model in ("mlp", FedCorMLP, lambda shape, n: nn.Sequential(nn.Flatten(), nn.Linear(64, n))):
        a, b, c = _initial(fed, model, 0), _initial(fed, model, 0), _initial(fed, model, 1)
        assert np.array_equal(a, b) and not np.allclose(a, c)
    assert np.array_equal(_initial(fed, "mlp", 4), _initial(fed, FedCorMLP, 4))  # a builder as the name's
    with pytest.raises(TypeError, match=r"returned int, not a torch.nn.Module"):
        FederatedTrainer(model=lambda shape, n: 3, clients_per_round=2).fit(fed)


def test_a_loss_that_fails_is_reported_as_the_loss_before_training(fed):
    def bad(out, y):
        return (out - y).abs()  # (m, 10) - (m,): broadcasting fails

    with pytest.raises(ValueError, match=r"loss=<function .*bad.* failed on the model's outputs \(shape \(2, 10\)"):
        FederatedTrainer(loss=bad, clients_per_round=2).fit(fed)
