"""Batched seeds: runs that differ only in their seed, trained in lockstep as one computation.

What a user relies on: each batched run's history equals the run alone up to float rounding, a
model-independent selector chooses identical clients, every run keeps its own dropout masks,
starting model, checkpoints and failures, and what cannot be batched runs alone with a note.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedselect import FederatedTrainer
from fedselect.data import make_federation
from fedselect.simulation import batched
from fedselect.simulation.engine import Engine, _global_dropout_masks
from fedselect.simulation.models import FedCorMLP

# Dropout, unequal clients (Dirichlet: local epochs of different lengths, partial last batches), weight decay.
TRAINER = dict(model="mlp", model_params={"dropout": 0.5}, clients_per_round=4, rounds=8, local_epochs=2,
               batch_size=16, lr=0.05, weight_decay=1e-3)
SEEDS = (0, 1, 2)


def _feds(partition="dirichlet", **kw):
    params = {"alpha": 0.5} if partition == "dirichlet" else {"shards_per_client": 2}
    return [make_federation("digits", partition=partition, n_clients=12, random_state=s, **params, **kw)
            for s in SEEDS]


def _alone_and_batched(selector, feds, **kw):
    opts = {**TRAINER, **kw}
    alone = [FederatedTrainer(selector=selector, random_state=s, **opts).fit(f) for s, f in zip(SEEDS, feds)]
    together = [FederatedTrainer(selector=selector, random_state=s, **opts) for s in SEEDS]
    notes: list[str] = []
    errors = batched.fit_runs(together, feds, log=notes.append)
    assert errors == [None] * len(SEEDS)
    return alone, together, notes


def _assert_close(alone, together, *, same_clients=True):
    for a, b in zip(alone, together):
        ra, rb = a.history_.rounds, b.history_.rounds
        assert len(ra) == len(rb)
        if same_clients:
            assert [r.clients for r in ra] == [r.clients for r in rb]
            assert [r.weights for r in ra] == [r.weights for r in rb]
        np.testing.assert_allclose([r.test_loss for r in ra], [r.test_loss for r in rb], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose([r.test_accuracy for r in ra], [r.test_accuracy for r in rb], atol=1e-9)
        np.testing.assert_allclose(a.parameters_, b.parameters_, rtol=1e-4, atol=1e-5)
        assert [r.costs for r in ra] == [r.costs for r in rb]


@pytest.mark.parametrize("selector", ["random", "round-robin"])
def test_model_independent_selectors_choose_identical_clients_and_histories_match(selector):
    alone, together, notes = _alone_and_batched(selector, _feds())
    assert notes == []  # nothing fell back to running alone
    _assert_close(alone, together)


def test_loss_based_selectors_match_their_runs_alone():
    # power-of-choice ranks clients by their losses on the global model: it sees the batched models' losses
    alone, together, _ = _alone_and_batched(("power-of-choice", {"d": 8}), _feds(), momentum=0.5)
    _assert_close(alone, together)


def test_the_batched_step_and_test_pass_are_used_and_each_client_starts_from_its_runs_model(monkeypatch):
    calls = {"train": 0, "test": 0}
    train_runs, test_runs = Engine.train_runs, Engine.test_runs

    def counting_train(self, thetas, *a, **k):
        calls["train"] += 1
        assert len(thetas) == len(SEEDS)
        return train_runs(self, thetas, *a, **k)

    def counting_test(self, thetas):
        calls["test"] += 1
        return test_runs(self, thetas)

    monkeypatch.setattr(Engine, "train_runs", counting_train)
    monkeypatch.setattr(Engine, "test_runs", counting_test)
    alone, together, _ = _alone_and_batched("random", _feds(partition="shards"))
    assert calls == {"train": TRAINER["rounds"], "test": TRAINER["rounds"]}
    _assert_close(alone, together)


def test_torch_cpu_dropout_is_the_mask_the_batched_runs_draw():
    """The batched step draws each run's masks from its own generator as F.dropout draws them from the global one."""
    h = torch.randn(3, 5, 7)
    for p in (0.2, 0.5):
        torch.manual_seed(11)
        expected = [F.dropout(h, p, training=True), F.dropout(h[:, :2], p, training=True)]
        state = torch.get_rng_state()
        torch.manual_seed(11)
        got = [h * _global_dropout_masks(3, 5, 0, 0, p, 7), h[:, :2] * _global_dropout_masks(3, 2, 0, 1, p, 7)]
        assert all(torch.equal(a, b) for a, b in zip(expected, got))
        assert torch.equal(torch.get_rng_state(), state)
        g = torch.Generator().manual_seed(11)
        own = torch.empty(3, 5, 7).bernoulli_(1 - p, generator=g).div_(1 - p)
        assert torch.equal(h * own, expected[0])


def test_train_runs_equals_train_of_each_run_with_its_dropout_stream():
    fed = _feds()[0]
    torch.manual_seed(0)
    eng = Engine(FedCorMLP(fed.input_shape, fed.n_classes, dropout=0.5), fed.X, fed.y, fed.loss_indices,
                 fed.X_test, fed.y_test)
    from fedselect.simulation.engine import LocalSchedule

    sched = LocalSchedule(16, epochs=2)
    theta0 = eng.initial_parameters()
    thetas = [theta0, theta0 + 0.01, theta0 - 0.02]
    chosen = [[0, 3, 5], [1, 2], [4, 7, 8, 11]]  # runs of different sizes, clients of different lengths
    batches = [eng.client_batches(fed.client_indices, sched, 5, r, c) for r, c in enumerate(chosen)]
    seeds = [101, 202, 303]
    deltas, states = eng.train_runs(thetas, batches, lrs=[0.05, 0.1, 0.05], dropout_seeds=seeds,
                                    weight_decay=1e-3, momentum=0.9)
    for r in range(3):
        alone = eng.train(thetas[r], batches[r], lr=[0.05, 0.1, 0.05][r], dropout_seed=seeds[r],
                          weight_decay=1e-3, momentum=0.9)
        torch.testing.assert_close(deltas[r], alone, rtol=1e-5, atol=1e-7)
        assert torch.equal(states[r], torch.get_rng_state())  # the global generator after that run alone
    tests = eng.test_runs(thetas)
    for theta, (loss, acc) in zip(thetas, tests):
        ref_loss, ref_acc = eng.test(theta)
        assert loss == pytest.approx(ref_loss, rel=1e-6) and acc == pytest.approx(ref_acc, abs=1e-9)


def test_a_resumed_run_batches_with_a_fresh_one_and_both_match_their_runs_alone(tmp_path):
    feds = _feds()[:2]
    opts = {**TRAINER, "rounds": 7, "lr_schedule": {3: 0.5}}  # runs in different rounds use different lrs
    alone = [FederatedTrainer(selector="afl", random_state=s, **opts).fit(f) for s, f in zip(SEEDS, feds)]

    def stop(trainer, record):
        if record.round == 3:
            raise KeyboardInterrupt

    ckpt = [tmp_path / "a", tmp_path / "b"]
    with pytest.raises(KeyboardInterrupt):
        FederatedTrainer(selector="afl", random_state=0, checkpoint_dir=ckpt[0], checkpoint_every=2, callback=stop,
                         **opts).fit(feds[0])
    together = [FederatedTrainer(selector="afl", random_state=s, checkpoint_dir=c, checkpoint_every=2, **opts)
                for s, c in zip(SEEDS, ckpt)]
    finished = []
    assert batched.fit_runs(together, feds, on_finish=lambda i, e: finished.append((i, e))) == [None, None]
    assert sorted(finished) == [(0, None), (1, None)]
    assert [t.resumed_from_ for t in together] == [2, 0]
    _assert_close(alone, together)
    # both checkpoints are final: fitting again returns the same histories without training
    again = [FederatedTrainer(selector="afl", random_state=s, checkpoint_dir=c, checkpoint_every=2, **opts)
             for s, c in zip(SEEDS, ckpt)]
    batched.fit_runs(again, feds)
    assert [t.history_ for t in again] == [t.history_ for t in together]


def test_a_failing_run_fails_alone_and_the_others_finish():
    feds = _feds()

    def explode(trainer, record):
        if record.round == 2:
            raise ValueError("boom")

    trainers = [FederatedTrainer(selector="random", random_state=s, callback=explode if s == 1 else None, **TRAINER)
                for s in SEEDS]
    errors = batched.fit_runs(trainers, feds)
    assert errors[0] is None and errors[2] is None and isinstance(errors[1], ValueError)
    assert len(trainers[1].history_) == 3 and len(trainers[0].history_) == TRAINER["rounds"]


class _BN(nn.Module):
    def __init__(self, input_shape, n_outputs):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), 16), nn.BatchNorm1d(16),
                                 nn.ReLU(), nn.Linear(16, n_outputs))

    def forward(self, x):
        return self.net(x)


def test_a_model_that_cannot_be_batched_runs_alone_with_a_note_and_equals_fit_bit_for_bit():
    feds = _feds(partition="shards")
    opts = {**TRAINER, "model": _BN, "model_params": None, "batch_size": 20, "rounds": 3}
    alone, together, notes = _alone_and_batched("random", feds, **opts)
    assert len(notes) == len(SEEDS) and all("trains on its own" in n and "batch norm" in n for n in notes)
    assert [a.history_ for a in alone] == [b.history_ for b in together]
    assert all(np.array_equal(a.parameters_, b.parameters_) for a, b in zip(alone, together))


def test_fit_runs_checks_its_arguments():
    with pytest.raises(ValueError, match="2 trainers but 1 federations"):
        batched.fit_runs([FederatedTrainer(), FederatedTrainer()], _feds()[:1])


def test_the_cnn_and_logistic_models_batch_too():
    from fedselect.simulation.engine import LocalSchedule
    from fedselect.simulation.models import FedCorCNN, LogisticRegression

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 3, size=60)
    clients = [np.arange(i, 60, 6) for i in range(6)]
    for make in (lambda: FedCorCNN((1, 28, 28), 3), lambda: LogisticRegression((1, 28, 28), 3)):
        torch.manual_seed(0)
        eng = Engine(make(), X, y, clients, X[:20], y[:20])
        assert eng.batch_support() is None
        theta = eng.initial_parameters()
        thetas = [theta, theta * 0.9]
        batches = [eng.client_batches(clients, LocalSchedule(4, steps=2), s, 0, [s, s + 2]) for s in range(2)]
        deltas, _ = eng.train_runs(thetas, batches, lrs=[0.1, 0.05], dropout_seeds=[1, 2])
        for r in range(2):
            alone = eng.train(thetas[r], batches[r], lr=[0.1, 0.05][r], dropout_seed=[1, 2][r])
            torch.testing.assert_close(deltas[r], alone, rtol=1e-5, atol=1e-6)
        for (loss, acc), theta_r in zip(eng.test_runs(thetas), thetas):
            ref = eng.test(theta_r)
            assert loss == pytest.approx(ref[0], rel=1e-5) and acc == pytest.approx(ref[1])


def test_a_cnn_subclass_is_not_assumed_to_draw_no_random_numbers():
    from fedselect.simulation.models import FedCorCNN

    class Noisy(FedCorCNN):
        def forward(self, x):
            return F.dropout(super().forward(x), 0.5, training=self.training)

    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 1, 28, 28)).astype(np.float32)
    eng = Engine(Noisy((1, 28, 28), 3), X, rng.integers(0, 3, size=12), [np.arange(12)], X, np.zeros(12, int))
    assert "is not one the engine can batch" in eng.batch_support()
    with pytest.raises(ValueError, match=r"Engine\.train_runs: the model Noisy is not one the engine can batch"):
        eng.train_runs([eng.initial_parameters()], [[[np.arange(4)]]], lrs=[0.1], dropout_seeds=[0])
