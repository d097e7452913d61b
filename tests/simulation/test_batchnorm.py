"""Batch norm in the batched engine: every client trains its own buffers, the server averages them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parameters_to_vector

from fedselect import FederatedTrainer
from fedselect.data import Federation, make_federation
from fedselect.simulation.engine import Engine, LocalSchedule, aggregate_buffers


def bn_mlp(input_shape, n_out):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), 16), nn.BatchNorm1d(16), nn.ReLU(),
                         nn.Linear(16, n_out))


def bn_cnn(input_shape, n_out):
    return nn.Sequential(nn.Conv2d(input_shape[0], 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * input_shape[1] * input_shape[2], n_out))


def _data(n=400, shape=(1, 8, 8), seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, *shape)).astype(np.float32)
    y = rng.integers(0, 10, size=n)
    # unequal clients: step counts and last batches differ (none of one sample at batch size 32)
    parts = np.split(rng.permutation(n), np.cumsum([37, 90, 13, 150]))
    return X, y, parts


def _reference(make, state, batches, X, y, *, lr, momentum=0.0):
    """Research-code style: one client after another, its own module copy, torch.optim.SGD, train mode."""
    deltas, buffers = [], []
    for bs in batches:
        m = make()
        m.load_state_dict(state)
        m.train()
        w0 = parameters_to_vector(m.parameters()).detach().clone()
        opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum)
        for ix in bs:
            opt.zero_grad()
            F.cross_entropy(m(torch.from_numpy(X[ix])), torch.from_numpy(y[ix])).backward()
            opt.step()
        deltas.append(parameters_to_vector(m.parameters()).detach() - w0)
        buffers.append({k: v.detach().clone() for k, v in m.named_buffers()})
    return torch.stack(deltas), buffers


@pytest.mark.parametrize("make", [bn_mlp, bn_cnn], ids=["BatchNorm1d", "BatchNorm2d"])
@pytest.mark.parametrize("schedule", [LocalSchedule(32, epochs=2), LocalSchedule(16, steps=5)], ids=["epochs", "steps"])
def test_batched_batchnorm_training_equals_per_client_loop(make, schedule):
    X, y, parts = _data()
    torch.manual_seed(0)
    model = make((1, 8, 8), 10)
    with torch.no_grad():  # start from non-trivial statistics, as in a later round
        model[1 if make is bn_cnn else 2].running_mean.uniform_(-1, 1)
        model[1 if make is bn_cnn else 2].running_var.uniform_(0.5, 2)
    eng = Engine(model, X, y, parts, X[:50], y[:50])
    assert eng.stateful and eng._plan is None
    batches = eng.client_batches(parts, schedule, seed=3, round=5, clients=[0, 1, 2, 3, 4])
    deltas, bufs = eng.train(eng.initial_parameters(), batches, lr=0.1, momentum=0.5, return_buffers=True)
    ref_d, ref_b = _reference(lambda: make((1, 8, 8), 10), model.state_dict(), batches, X, y, lr=0.1, momentum=0.5)
    torch.testing.assert_close(deltas, ref_d, atol=1e-5, rtol=1e-5)
    for i in range(5):
        for name, value in ref_b[i].items():
            torch.testing.assert_close(bufs[name][i], value, atol=1e-5, rtol=1e-5)
    # each client's statistics are its own: they moved, and differ between clients
    mean = next(k for k in bufs if k.endswith("running_mean"))
    assert not torch.allclose(bufs[mean][0], bufs[mean][1])
    assert not torch.allclose(bufs[mean][0], eng.buffers[mean])


def test_evaluation_uses_eval_mode_with_the_given_buffers():
    X, y, parts = _data()
    torch.manual_seed(0)
    model = bn_mlp((1, 8, 8), 10)
    eng = Engine(model, X, y, parts, X[:60], y[:60])
    theta = eng.initial_parameters()
    bufs = {k: v.clone() for k, v in eng.buffers.items()}
    bufs["2.running_mean"].uniform_(-2, 2)
    bufs["2.running_var"].uniform_(0.2, 3)
    ref = bn_mlp((1, 8, 8), 10)
    ref.load_state_dict({**model.state_dict(), **bufs})
    ref.eval()
    with torch.no_grad():
        out = ref(torch.from_numpy(X[:60]))
    loss, acc = eng.test(theta, bufs)
    assert loss == pytest.approx(float(F.cross_entropy(out, torch.from_numpy(y[:60]))), rel=1e-5)
    assert acc == pytest.approx(float((out.argmax(1).numpy() == y[:60]).mean()))
    assert eng.test(theta)[0] != pytest.approx(loss)  # the buffers matter: eval mode, not batch statistics


def test_aggregate_buffers_is_the_weighted_mean_and_keeps_unchanged_buffers_exact():
    b = {"m": torch.tensor([0.3, -1.7]), "c": torch.tensor([0.1, 0.7]), "n": torch.tensor(10)}
    clients = {"m": torch.tensor([[1.0, 2.0], [3.0, -4.0], [0.0, 0.0]]),
               "c": b["c"].repeat(3, 1), "n": torch.tensor([14, 15, 20])}
    w = np.array([0.2, 0.3, 0.5])
    out = aggregate_buffers(b, clients, w)
    torch.testing.assert_close(out["m"], (torch.from_numpy(w).float().unsqueeze(1) * clients["m"]).sum(0))
    assert torch.equal(out["c"], b["c"])  # a constant buffer stays bit for bit
    assert out["n"].dtype == torch.int64 and int(out["n"]) == round(0.2 * 14 + 0.3 * 15 + 0.5 * 20)
    # unnormalised selection weights give the same convex combination; zero weights change nothing
    torch.testing.assert_close(aggregate_buffers(b, clients, 4 * w)["m"], out["m"])
    assert torch.equal(aggregate_buffers(b, clients, np.zeros(3))["m"], b["m"])
    mask = {"mask": torch.tensor([True, False])}
    assert torch.equal(aggregate_buffers(mask, {"mask": mask["mask"].repeat(3, 1)}, w)["mask"], mask["mask"])


def test_trainer_global_buffers_are_the_weighted_mean_of_the_clients():
    fed = make_federation("digits", partition="shards", n_clients=8, random_state=0)
    torch.manual_seed(1)
    module = bn_mlp(fed.input_shape, 10)
    state0 = {k: v.clone() for k, v in module.state_dict().items()}
    tr = FederatedTrainer(model=module, rounds=1, clients_per_round=3, local_epochs=1, batch_size=40, lr=0.1,
                          random_state=0).fit(fed)
    rec = tr.history_.rounds[0]
    sched = LocalSchedule(40, epochs=1)
    batches = [sched.batches(fed.client_indices[k], np.random.default_rng([tr._train_seed, 0, k])) for k in rec.clients]
    ref_d, ref_b = _reference(lambda: bn_mlp(fed.input_shape, 10), state0, batches, fed.X, fed.y, lr=0.1)
    w = np.asarray(rec.weights)
    assert w.sum() == pytest.approx(1.0)
    for name in ("2.running_mean", "2.running_var"):
        expected = sum(wk * b[name].numpy() for wk, b in zip(w, ref_b))
        np.testing.assert_allclose(tr.buffers_[name], expected, atol=1e-5, rtol=1e-5)
        assert not np.allclose(tr.buffers_[name], state0[name].numpy())
    np.testing.assert_allclose(tr.parameters_, parameters_to_vector(module.parameters()).detach().numpy()
                               + (torch.from_numpy(w).float().unsqueeze(1) * ref_d).sum(0).numpy(), atol=1e-5)
    assert int(tr.buffers_["2.num_batches_tracked"]) == round(float(np.dot(w, [len(b) for b in batches])))
    # the passed module is used as given and left untouched
    for k, v in module.state_dict().items():
        assert torch.equal(v, state0[k])


def test_batchnorm_model_learns_in_the_trainer():
    fed = make_federation("digits", partition="shards", n_clients=10, random_state=0)
    tr = FederatedTrainer(model=bn_cnn, rounds=8, clients_per_round=4, local_epochs=1, batch_size=30, lr=0.1,
                          random_state=0).fit(fed)
    acc = [r.test_accuracy for r in tr.history_.rounds]
    assert acc[-1] > 0.6 and acc[-1] > acc[0] + 0.3
    again = FederatedTrainer(model=bn_cnn, rounds=8, clients_per_round=4, local_epochs=1, batch_size=30, lr=0.1,
                             random_state=0).fit(fed)
    assert again.history_ == tr.history_  # reproducible


def test_trial_aggregates_buffers_like_the_round(monkeypatch):
    """oracle.trial evaluates w_trial with the buffers the round would produce, not the old ones."""
    from fedselect.selection import BaseSelector, Selection

    seen = {}

    class TrialThenChoose(BaseSelector):
        def fit(self, pool):
            self.n_ = pool.n_clients
            return self

        def select(self, n, *, round, oracle):
            if round == 0:
                seen["trial"] = oracle.trial([0, 1])
                seen["base"] = oracle.losses(np.arange(self.n_))
            return Selection(np.array([0, 1]))

        def update(self, feedback):
            return self

    fed = make_federation("digits", partition="iid", n_clients=4, random_state=0)
    tr = FederatedTrainer(selector=TrialThenChoose(), model=bn_mlp, rounds=1, clients_per_round=2, batch_size=40,
                          track_global_loss=True, random_state=0).fit(fed)
    # the trial of {0, 1} is the round that ran: its losses after equal the tracked losses of w^{1}
    after = seen["trial"] + seen["base"]
    assert float(np.dot(fed.weights, after)) == pytest.approx(tr.history_.rounds[0].global_loss, rel=1e-6)


def test_momentum_none_is_refused_before_training_with_what_to_do():
    fed = make_federation("digits", n_clients=4, random_state=0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.BatchNorm1d(8, momentum=None), nn.Linear(8, 10))
    with pytest.raises(ValueError, match=r"layer '2' \(BatchNorm1d\) has momentum=None.*momentum=0.1"):
        FederatedTrainer(model=model, rounds=1, clients_per_round=2).fit(fed)


def test_one_sample_minibatch_is_refused_before_training():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(70, 6)).astype(np.float32)
    y = rng.integers(0, 3, size=70)
    parts = [np.arange(0, 33), np.arange(33, 70)]  # 33 = 32 + 1: a one-sample last batch
    fed = Federation(X, y, parts, X[:10], y[:10], n_classes=3)

    def model(shape, n):
        return nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.Linear(5, n))

    with pytest.raises(ValueError, match=r"client\(s\) \[0\].*one-sample minibatch"):
        FederatedTrainer(model=model, rounds=1, clients_per_round=2, batch_size=32).fit(fed)
    # a schedule without one-sample batches runs
    FederatedTrainer(model=model, rounds=1, clients_per_round=2, batch_size=32, local_steps=2).fit(fed)


def test_a_model_vmap_cannot_run_is_refused_before_training():
    class ItemModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(64, 10)

        def forward(self, x):
            h = self.lin(x.flatten(1))
            return h * float(h.max().item() > 0)  # data-dependent Python value: vmap cannot batch it

    fed = make_federation("digits", n_clients=4, random_state=0)
    with pytest.raises(ValueError, match=r"ItemModel cannot be trained by fedselect's batched engine.*\.item\(\)"):
        FederatedTrainer(model=ItemModel(), rounds=1, clients_per_round=2).fit(fed)


def test_resuming_a_batchnorm_run_equals_not_stopping(tmp_path):
    """The checkpoint carries the global buffers: a resumed run does not restart from the initial statistics."""
    fed = make_federation("digits", partition="shards", n_clients=8, random_state=0)
    kw = dict(model=bn_mlp, rounds=6, clients_per_round=3, local_steps=3, batch_size=20, random_state=0)
    reference = FederatedTrainer(**kw).fit(fed)

    def stop(trainer, record):
        if record.round == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        FederatedTrainer(**kw, checkpoint_dir=tmp_path, checkpoint_every=2, callback=stop).fit(fed)
    resumed = FederatedTrainer(**kw, checkpoint_dir=tmp_path, checkpoint_every=2).fit(fed)
    assert resumed.resumed_from_ == 4
    assert resumed.history_ == reference.history_
    for name, value in reference.buffers_.items():
        np.testing.assert_array_equal(resumed.buffers_[name], value)
