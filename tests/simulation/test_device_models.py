"""The CIFAR models beside FedCor's CNN: FLSim's CNN (cnn-flsim) and a ResNet with GroupNorm (resnet-gn).

Their layer lists, that the batched engine trains them as a per-client loop would, that several runs batch,
and the CIFAR-10 presets end to end on CIFAR-shaped synthetic data (no CIFAR-10 files are needed).
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parameters_to_vector

from fedselect import hookimpl
from fedselect.cli import main
from fedselect.plugins import list_models, pm
from fedselect.simulation.engine import Engine, LocalSchedule
from fedselect.simulation.models import FLSimCNN, ResNetGN, build_model

CIFAR = (3, 32, 32)


def test_the_models_are_registered_and_built_by_name():
    assert {"cnn", "cnn-flsim", "resnet-gn"} <= set(list_models())
    assert isinstance(build_model("cnn-flsim", CIFAR, 10, dropout=0.2), FLSimCNN)
    deep = build_model("resnet-gn", CIFAR, 10, depth=14, groups=4)
    assert isinstance(deep, ResNetGN) and len(deep.blocks) == 6


def test_flsim_cnn_is_flsims_simple_conv_net_layer_for_layer():
    m = FLSimCNN(CIFAR, 10)
    convs = list(m.layers)
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride, c.padding) for c in convs] == [
        (3, 32, (3, 3), (1, 1), (2, 2)),
        *[(32, 32, (3, 3), (1, 1), (2, 2))] * 3,
    ]
    gn, relu, pool = m.gn_relu
    assert isinstance(gn, nn.GroupNorm) and (gn.num_groups, gn.num_channels, gn.affine) == (32, 32, True)
    assert isinstance(relu, nn.ReLU) and isinstance(pool, nn.MaxPool2d) and pool.kernel_size == 2
    assert m.fc.in_features == 288 == 32 * 3 * 3  # FLSim: out_channels * (stride + padding) ** 2
    assert sum(p.numel() for p in m.parameters()) == 31594  # one GroupNorm shared by the four blocks
    assert m(torch.zeros(2, *CIFAR)).shape == (2, 10)
    assert FLSimCNN((1, 28, 28), 10).fc.in_features == 288


def test_resnet_gn_is_a_cifar_resnet_with_group_norm():
    m = ResNetGN(CIFAR, 10)
    norms = [x for x in m.modules() if isinstance(x, nn.GroupNorm)]
    assert norms and all(n.num_groups == 2 for n in norms)
    assert not any(isinstance(x, nn.modules.batchnorm._NormBase) for x in m.modules()) and not list(m.buffers())
    widths = [b.conv2.out_channels for b in m.blocks]
    strides = [b.conv1.stride[0] for b in m.blocks]
    assert (widths, strides) == ([16, 32, 64], [1, 2, 2])
    assert sum(p.numel() for p in m.parameters()) == 78042  # ResNet-8
    r20 = ResNetGN(CIFAR, 10, depth=20)
    assert [b.conv2.out_channels for b in r20.blocks] == [16] * 3 + [32] * 3 + [64] * 3
    assert sum(p.numel() for p in r20.parameters()) == 272474  # ResNet-20 (He et al.: 0.27 M)
    assert m(torch.zeros(2, *CIFAR)).shape == (2, 10)
    block = m.blocks[0]  # a residual block passes its input through its shortcut when its branch adds nothing
    with torch.no_grad():
        block.conv2.weight.zero_()
    x = torch.rand(2, 16, 8, 8)
    torch.testing.assert_close(block(x), x)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: ResNetGN(CIFAR, 10, depth=9), "depth=9 must be 6 n \\+ 2"),
        (lambda: ResNetGN(CIFAR, 10, groups=3), "groups=3 must divide width=16"),
        (lambda: ResNetGN(CIFAR, 10, width=0), "width=0 must be a positive int"),
        (lambda: ResNetGN((3, 32), 10), "must be \\(channels, height, width\\)"),
        (lambda: FLSimCNN((784,), 10), "must be \\(channels, height, width\\)"),
        (lambda: FLSimCNN(CIFAR, 10, dropout=1.0), "dropout=1.0 must be in \\[0, 1\\)"),
    ],
)
def test_bad_model_parameters_name_what_is_wrong(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def _data(n=150, shape=(3, 12, 12), seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, *shape)).astype(np.float32)
    y = rng.integers(0, 10, size=n)
    parts = np.split(rng.permutation(n), [17, 60, 71, 110])  # unequal clients: padded, partial last batches
    return X, y, parts


def _per_client_loop(module, batches, X, y, lr):
    """Research-code style: one client after another, its own module copy, torch.optim.SGD."""
    deltas = []
    state = {k: v.clone() for k, v in module.state_dict().items()}
    for bs in batches:
        module.load_state_dict(state)
        w0 = parameters_to_vector(module.parameters()).detach().clone()
        opt = torch.optim.SGD(module.parameters(), lr=lr)
        for ix in bs:
            opt.zero_grad()
            F.cross_entropy(module(torch.from_numpy(X[ix])), torch.from_numpy(y[ix])).backward()
            opt.step()
        deltas.append(parameters_to_vector(module.parameters()).detach() - w0)
    return torch.stack(deltas)


@pytest.mark.parametrize(
    "make", [lambda s: FLSimCNN(s, 10), lambda s: ResNetGN(s, 10, width=8)], ids=["cnn-flsim", "resnet-gn"]
)
def test_batched_training_equals_a_per_client_loop(make):
    X, y, parts = _data()
    torch.manual_seed(0)
    model = make(X.shape[1:])
    eng = Engine(model, X, y, parts, X[:20], y[:20], device="cpu")
    assert not eng.stateful  # GroupNorm: no running statistics, every sample normalised by itself
    theta = eng.initial_parameters()
    batches = eng.client_batches(parts, LocalSchedule(16, epochs=2), 0, 0, range(len(parts)))
    got = eng.train(theta, batches, lr=0.1)
    torch.manual_seed(0)
    want = _per_client_loop(make(X.shape[1:]), batches, X, y, 0.1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "make", [lambda s: FLSimCNN(s, 10), lambda s: ResNetGN(s, 10, width=8)], ids=["cnn-flsim", "resnet-gn"]
)
def test_several_runs_batch_as_they_train_alone(make):
    X, y, parts = _data()
    torch.manual_seed(0)
    eng = Engine(make(X.shape[1:]), X, y, parts, X[:20], y[:20], device="cpu")
    assert eng.batch_support() is None
    theta = eng.initial_parameters()
    other = theta + 0.01
    b0 = eng.client_batches(parts, LocalSchedule(16, epochs=1), 0, 0, range(5))
    b1 = eng.client_batches(parts, LocalSchedule(16, epochs=1), 1, 0, [4, 2])
    deltas, _ = eng.train_runs([theta, other], [b0, b1], lrs=[0.1, 0.05], dropout_seeds=[1, 2])
    torch.testing.assert_close(deltas[0], eng.train(theta, b0, lr=0.1), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(deltas[1], eng.train(other, b1, lr=0.05), rtol=1e-4, atol=1e-5)
    results = eng.test_runs([theta, other])
    for got, flat in zip(results, (theta, other)):
        assert got == pytest.approx(eng.test(flat), rel=1e-5)


def test_runs_of_the_flsim_cnn_with_dropout_or_of_another_resnet_do_not_batch():
    X, y, parts = _data()
    noisy = Engine(FLSimCNN(X.shape[1:], 10, dropout=0.5), X, y, parts, X[:20], y[:20])
    assert "not one the engine can batch" in noisy.batch_support()
    a = Engine(ResNetGN(X.shape[1:], 10, groups=2), X, y, parts, X[:20], y[:20])
    b = Engine(ResNetGN(X.shape[1:], 10, groups=4), X, y, parts, X[:20], y[:20])
    assert a.batch_key() != b.batch_key()  # the same parameter shapes, another computation


# -- the CIFAR-10 presets end to end, on CIFAR-shaped synthetic data --------------------------------------------


def _cifar_shaped(data_dir=None, download=False):
    """32 x 32 x 3 images whose class is a faint pattern under noise, 300 to train and 100 to test."""
    rng = np.random.default_rng(0)
    patterns = rng.normal(size=(10, *CIFAR)).astype(np.float32)
    y = rng.integers(0, 10, size=400)
    X = (0.5 * patterns[y] + rng.normal(size=(400, *CIFAR))).astype(np.float32)
    return X[:300], y[:300].astype(np.int64), X[300:], y[300:].astype(np.int64)


@pytest.fixture
def cifar_shaped():
    module = types.ModuleType("fedselect_cifar_shaped")

    @hookimpl
    def register_datasets(register):
        register(_cifar_shaped, name="cifar10-shaped")

    module.register_datasets = register_datasets
    pm.register(module, name="fedselect-cifar-shaped")
    try:
        yield "cifar10-shaped"
    finally:
        pm.unregister(name="fedselect-cifar-shaped")


@pytest.mark.parametrize(
    ("preset", "selectors"),
    [("fedcor-cifar10-2spc", ["random", "power-of-choice:d=10"]), ("ldcs-cifar10-k9-dir0.6", ["random", "ldcs"])],
)
@pytest.mark.parametrize("model", ["cnn", "cnn-flsim", "resnet-gn"])
def test_the_cifar10_presets_run_end_to_end_with_each_cifar_model(
    preset, selectors, model, cifar_shaped, tmp_path, capsys
):
    args = [
        "reproduce",
        preset,
        "--dataset",
        cifar_shaped,
        "--model",
        model,
        "--rounds",
        "2",
        "--seeds",
        "0",
        "--device",
        "cpu",
        "--local-epochs",
        "1",
        "--out",
        str(tmp_path),
        "--no-progress",
        "--no-paired",
        "--selectors",
        *selectors,
    ]
    assert main(args) == 0, capsys.readouterr().err
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(runs) == len(selectors)
