"""The engine's computing paths: one class per path, chosen once, the hand-written backward written once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedselect import devices
from fedselect.simulation import engine as engine_package
from fedselect.simulation.engine import Engine
from fedselect.simulation.engine.chain import LinearChain, chain_backward
from fedselect.simulation.engine.chain_path import ChainPath
from fedselect.simulation.engine.compiled import CompiledChainPath, compile_unusable
from fedselect.simulation.engine.local import LocalSchedule
from fedselect.simulation.engine.per_client import PerClientPath
from fedselect.simulation.engine.vmap import GroupedPath, PaddedPath
from fedselect.simulation.models import FedCorCNN, FedCorMLP, LogisticRegression


def _engine(model, **kw):
    rng = np.random.default_rng(0)
    shape = (1, 8, 8) if not isinstance(model, FedCorCNN) else (1, 20, 20)
    X = rng.normal(size=(60, *shape)).astype(np.float32)
    y = rng.integers(0, 10, size=60)
    return Engine(model, X, y, [np.arange(30), np.arange(30, 60)], X[:10], y[:10], **kw)


def _own_loss(outputs, targets):
    return nn.functional.cross_entropy(outputs, targets, reduction="none")


@pytest.mark.parametrize(
    ("make", "kw", "kind", "by_hand"),
    [
        (lambda: LogisticRegression((1, 8, 8), 10), {}, ChainPath, True),
        (lambda: FedCorMLP((1, 8, 8), 10, dropout=0.5), {}, ChainPath, True),
        (lambda: FedCorMLP((1, 8, 8), 10), {"loss": _own_loss}, ChainPath, False),  # a user's loss: autograd
        (lambda: FedCorCNN((1, 20, 20), 10), {}, PerClientPath, None),  # a convolution on the CPU: one by one
        (lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.Tanh(), nn.Linear(8, 10)), {}, PaddedPath, None),
        (lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 10), nn.BatchNorm1d(10)), {}, GroupedPath, None),
    ],
    ids=["logistic", "mlp", "mlp-own-loss", "cnn", "tanh-mlp", "batchnorm"],
)
def test_the_path_is_chosen_once_from_the_model_and_the_loss(make, kw, kind, by_hand):
    torch.manual_seed(0)
    eng = _engine(make(), **kw)
    assert type(eng.local_path) is kind
    names = {ChainPath: "chain", PaddedPath: "padded", GroupedPath: "grouped", PerClientPath: "per-client"}
    assert eng.local_path.name == names[kind] and eng.local_path.recorded is (kind is PerClientPath)
    if by_hand is not None:
        assert eng.local_path.by_hand is by_hand and eng.chain is not None
    else:
        assert eng.chain is None


@pytest.mark.skipif(compile_unusable() is not None, reason="torch.compile (inductor) is unusable here")
def test_the_compiled_path_is_a_chain_path_and_refuses_other_models():
    torch.manual_seed(0)
    eng = _engine(LogisticRegression((1, 8, 8), 10), path="compiled")
    assert isinstance(eng.local_path, CompiledChainPath) and eng.local_path.name == "compiled-chain"
    assert eng.local_path.mask_dtype is torch.bool and not eng.local_path.compiled_step.static
    with pytest.raises(ValueError, match="trains on the eager path only"):
        _engine(FedCorCNN((1, 20, 20), 10), path="compiled")


def test_the_one_backward_lays_weight_gradients_out_either_way_with_the_same_values():
    """Autograd's layout or the contiguous one (the compiled graph's, and the eager path's where it has the same
    bits): one function."""
    torch.manual_seed(0)
    model = FedCorMLP((1, 8, 8), 10, dropout=0.0)
    names = [n for n, _ in model.named_parameters()]
    chain = LinearChain.of(model, names, [p.numel() for p in model.parameters()])
    assert chain is not None
    C, B = 3, 5
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).repeat(C, 1)
    params = [v.clone() for v in chain.split(flat + 0.01 * torch.randn_like(flat)).values()]
    x, targets = torch.randn(C, B, 1, 8, 8), torch.randint(0, 10, (C * B,))
    weights = torch.rand(C, B)
    args = (chain.positional, params, x, lambda i, h: None, targets, weights)
    eager, losses = chain_backward(*args, want_losses=True)
    contiguous, _ = chain_backward(*args, want_losses=False, contiguous=True)
    for a, b, p in zip(eager, contiguous, params):
        assert a.shape == b.shape == p.shape and b.is_contiguous()
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert losses is not None and losses.shape == (C, B)


def test_devices_live_in_a_leaf_module_the_engine_reexports():
    for name in ("resolve_device", "available_devices", "device_setting", "DEVICE_CONSTRAINTS"):
        assert getattr(engine_package, name) is getattr(devices, name)
    assert devices.resolve_device("cpu") == torch.device("cpu")


def test_no_module_of_the_engine_package_is_over_about_800_lines():
    folder = Path(engine_package.__file__).parent
    sizes = {p.name: len(p.read_text().splitlines()) for p in folder.glob("*.py")}
    assert len(sizes) >= 8 and max(sizes.values()) <= 820, sizes


def _cnn_engine():
    torch.manual_seed(0)
    rng = np.random.default_rng(1)
    X = rng.normal(size=(70, 1, 20, 20)).astype(np.float32)
    y = rng.integers(0, 10, size=70)
    parts = [np.arange(0, 23), np.arange(23, 30), np.arange(30, 70)]  # 23, 7 and 40 samples: ragged minibatches
    eng = Engine(FedCorCNN((1, 20, 20), 10), X, y, parts, X[:10], y[:10])
    batches = [LocalSchedule(8, epochs=2).batches(p, np.random.default_rng(k)) for k, p in enumerate(parts)]
    return eng, batches


@pytest.mark.parametrize(
    "rule",
    [{}, {"momentum": 0.9, "nesterov": True, "weight_decay": 1e-3, "prox_mu": 0.1}],
    ids=["sgd", "nesterov-wd-prox"],
)
def test_the_per_client_path_computes_the_padded_paths_sgd(rule):
    """The same local SGD, client by client instead of vmapped (only the float rounding differs)."""
    eng, batches = _cnn_engine()
    assert isinstance(eng.local_path, PerClientPath)
    theta = eng.initial_parameters() + 0.0
    kw = dict(lr=0.05, sample_losses=True, **rule)
    deltas, sq = eng.train(theta, batches, **kw)
    eng.local_path = PaddedPath(eng.local_path.work, eng._forward_all)
    padded, padded_sq = eng.train(theta, batches, **kw)
    assert deltas.shape == (3, eng.n_params) and deltas.abs().amax(1).min() > 0  # every client moved
    torch.testing.assert_close(deltas, padded, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(sq, padded_sq, rtol=1e-5)


def test_the_per_client_path_trains_several_runs_as_each_alone_bit_for_bit():
    eng, batches = _cnn_engine()
    theta = eng.initial_parameters() + 0.0
    runs = [batches, batches[:2]]
    together = eng.train_runs([theta, theta * 0.5], runs, lrs=[0.05, 0.1], dropout_seeds=[0, 1])[0]
    for r, (th, lr) in enumerate([(theta, 0.05), (theta * 0.5, 0.1)]):
        alone = eng.train(th, runs[r], lr=lr, dropout_seed=r)
        assert together[r].numpy().tobytes() == alone.numpy().tobytes()


def _conv(shape, n_out):  # a user's convolutional model: the per-client path on the CPU
    return nn.Sequential(nn.Conv2d(shape[0], 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, n_out))


def test_a_run_records_the_per_client_path_and_resumes_a_checkpoint_made_on_another(tmp_path, monkeypatch):
    """As across devices (whose kinds round differently too), a checkpoint resumes on the other path; the run's
    settings say which path its rounds from then on took."""
    from fedselect import FederatedTrainer, make_federation
    fed = make_federation("digits", n_clients=6, random_state=0)
    kw = dict(model=_conv, clients_per_round=2, local_steps=2, random_state=0)
    run = FederatedTrainer(rounds=2, **kw).fit(fed)
    assert run.history_.config["local_path"] == "per-client"
    assert "local_path" not in FederatedTrainer(rounds=2, clients_per_round=2, local_steps=2).fit(fed).history_.config
    # a checkpoint written before the path existed (the vmapped run) is another run's
    class Stop(Exception):
        pass

    def stop(trainer, record):
        if record.round == 1:
            raise Stop

    kw.update(rounds=4, checkpoint_dir=tmp_path, checkpoint_every=1)
    monkeypatch.setattr(PerClientPath, "recorded", False)
    with pytest.raises(Stop):
        FederatedTrainer(**kw, callback=stop).fit(fed)
    monkeypatch.setattr(PerClientPath, "recorded", True)
    resumed = FederatedTrainer(**kw).fit(fed)
    assert resumed.resumed_from_ == 1 and resumed.history_.config["local_path"] == "per-client"
