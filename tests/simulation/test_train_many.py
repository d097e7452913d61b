"""One training path: ``Engine.train_many`` trains S runs x C clients; ``train`` and ``train_runs`` are its cases.

What a user relies on: one run through ``train_many`` (with its own seeded generator), ``train`` with that
``dropout_seed`` and ``train_runs`` of that one run give the same bits for every kind of model and option, and
several runs give each run what it gets alone up to float rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedselect.simulation.engine import Engine, LocalSchedule, LocalTraining
from fedselect.simulation.models import FedCorCNN, FedCorMLP, LogisticRegression

SHAPE = (1, 20, 20)


class _TanhDropout(nn.Module):
    """Not a chain: the vmapped padded path, with dropout drawn inside the vmapped forward."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(400, 16)
        self.b = nn.Linear(16, 10)

    def forward(self, x):
        return self.b(F.dropout(torch.tanh(self.a(x.flatten(1))), 0.3, training=self.training))


def _bn():
    """Batch statistics: the grouped path, every client with its own buffers."""
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 18 * 18, 10))


MODELS = {
    "logistic": lambda: LogisticRegression(SHAPE, 10),
    "mlp": lambda: FedCorMLP(SHAPE, 10),
    "mlp-dropout": lambda: FedCorMLP(SHAPE, 10, dropout=0.5),
    "cnn": lambda: FedCorCNN(SHAPE, 10),
    "padded-with-dropout": _TanhDropout,
    "batch-norm": _bn,
}
OPTIONS = {
    "sgd": dict(lr=0.05),
    "momentum-prox-wd": dict(lr=0.05, weight_decay=1e-3, prox_mu=0.1, momentum=0.9),
    "nesterov": dict(lr=0.1, momentum=0.5, nesterov=True),
}


def _engine(make):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, *SHAPE)).astype(np.float32)
    y = rng.integers(0, 10, size=120)
    parts = np.split(rng.permutation(120), [17, 45, 53, 90])  # unequal clients: local epochs of unequal length
    torch.manual_seed(0)
    return Engine(make(), X, y, parts, X[:20], y[:20]), parts


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("options", list(OPTIONS.values()), ids=list(OPTIONS))
@pytest.mark.parametrize("make", list(MODELS.values()), ids=list(MODELS))
def test_one_run_of_train_many_is_train_and_train_runs_bit_for_bit(make, options):
    eng, parts = _engine(make)
    theta = eng.initial_parameters()
    batches = eng.client_batches(parts, LocalSchedule(8, epochs=2), seed=1, round=3, clients=[4, 0, 2, 1, 3])
    assert len({len(b) for b in batches}) > 1  # clients finish at different steps
    kw = {k: v for k, v in options.items() if k != "lr"}
    torch.manual_seed(5)
    deltas, bufs, sq = eng.train(
        theta, batches, lr=options["lr"], dropout_seed=7, return_buffers=True, sample_losses=True, **kw
    )
    after_train = torch.get_rng_state()

    torch.manual_seed(99)  # another global state: a chain's masks must come from the run's own generator
    if eng._plan is None:
        torch.manual_seed(7)  # the vmapped forward draws from the global generator, seeded as train seeds it
    gen = torch.Generator().manual_seed(7)
    (run,) = eng.train_many([theta], [batches], lrs=[options["lr"]], generators=[gen], sample_losses=True, **kw)
    assert isinstance(run, LocalTraining)
    assert torch.equal(run.deltas, deltas)
    assert _equal(run.buffers, bufs)
    assert np.array_equal(run.sample_loss_sq, sq)
    if eng._plan is not None:
        assert torch.equal(gen.get_state(), after_train)  # the run's generator drew what train's global one drew
    else:
        assert torch.equal(torch.get_rng_state(), after_train)

    if eng.batch_support() is None:
        (got,), (state,) = eng.train_runs([theta], [batches], lrs=[options["lr"]], dropout_seeds=[7], **kw)
        assert torch.equal(got, deltas)
        assert torch.equal(state, after_train)


@pytest.mark.parametrize("make", [MODELS["mlp-dropout"], MODELS["cnn"]], ids=["mlp-dropout", "cnn"])
def test_several_runs_each_get_what_they_get_alone(make):
    eng, parts = _engine(make)
    theta = eng.initial_parameters()
    sched = LocalSchedule(8, epochs=2)
    thetas = [theta, theta + 0.01, theta - 0.02]
    batches = [eng.client_batches(parts, sched, r, 0, c) for r, c in enumerate([[0, 3], [1, 2, 4], [3]])]
    lrs = [0.05, 0.1, 0.05]
    runs = eng.train_many(
        thetas,
        batches,
        lrs=lrs,
        generators=[torch.Generator().manual_seed(s) for s in (1, 2, 3)],
        momentum=0.9,
        weight_decay=1e-3,
        sample_losses=True,
    )
    assert [r.deltas.shape[0] for r in runs] == [2, 3, 1]
    for r in range(3):
        deltas, sq = eng.train(
            thetas[r], batches[r], lr=lrs[r], dropout_seed=r + 1, momentum=0.9, weight_decay=1e-3, sample_losses=True
        )
        torch.testing.assert_close(runs[r].deltas, deltas, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(runs[r].sample_loss_sq, sq, rtol=1e-6)


def test_train_many_checks_its_arguments():
    eng, _ = _engine(MODELS["batch-norm"])
    theta = eng.initial_parameters()
    b = [[np.arange(4)]]
    with pytest.raises(ValueError, match=r"Engine\.train_many: the model Sequential has buffers"):
        eng.train_many([theta, theta], [b, b], lrs=[0.1, 0.1])
    with pytest.raises(ValueError, match="2 runs of batches but 1 thetas"):
        eng.train_many([theta], [b, b], lrs=[0.1, 0.1])
    with pytest.raises(ValueError, match="nesterov=True needs momentum > 0"):
        eng.train_many([theta], [b], lrs=[0.1], nesterov=True)
    (empty,) = eng.train_many([theta], [[]], lrs=[0.1], sample_losses=True)
    assert empty.deltas.shape == (0, eng.n_params) and empty.sample_loss_sq.shape == (0,)
    assert set(empty.buffers) == set(eng.buffers) and all(v.shape[0] == 0 for v in empty.buffers.values())
