"""The compiled chain step (``Engine(path="compiled")``): opt-in, close to eager, reproducible, refused where unusable.

Each distinct chain compiles once per process (about 10 s on two cores), so the tests share three engines.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from fedselect.simulation._compiled import compile_unusable
from fedselect.simulation.engine import Engine, LocalSchedule
from fedselect.simulation.models import FedCorCNN, FedCorMLP, LogisticRegression

SHAPE = (1, 12, 12)
N_CLIENTS, PER = 6, 40

pytestmark = pytest.mark.skipif(
    compile_unusable() is not None, reason=f"torch.compile (inductor) is unusable here: {compile_unusable()}"
)


def _data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N_CLIENTS * PER, *SHAPE)).astype(np.float32)
    y = (X.reshape(len(X), -1)[:, :10].argmax(1)).astype(np.int64)  # learnable labels: the loss can fall
    parts = [np.arange(i * PER, (i + 1) * PER) for i in range(N_CLIENTS)]
    return X, y, parts


def _engines(model):
    X, y, parts = _data()
    eager = Engine(model, X, y, parts, X[:50], y[:50])
    return eager, Engine(model, X, y, parts, X[:50], y[:50], path="compiled"), parts


def _static(model, device="cpu"):
    X, y, parts = _data()
    return Engine(model, X, y, parts, X[:50], y[:50], path="compiled", static_steps=True, device=device)


def _batches(engine, parts, rnd):
    """Unequal local work: clients finish at different steps, so the active clients shrink within a round."""
    out = engine.client_batches(parts, LocalSchedule(16, epochs=2), 0, rnd, [0, 1, 2, 3, 4])
    out[1], out[3] = out[1][:-2], out[3][:2]
    out[2][-1] = out[2][-1][:5]  # a partial minibatch
    return out


@pytest.fixture(scope="module")
def logistic():
    torch.manual_seed(0)
    return _engines(LogisticRegression(SHAPE, 10))


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    return _engines(FedCorMLP(SHAPE, 10, hidden=(16, 8), dropout=0.0))


@pytest.fixture(scope="module")
def mlp_dropout():
    torch.manual_seed(0)
    return _engines(FedCorMLP(SHAPE, 10, hidden=(16, 8), dropout=0.5))


@pytest.mark.parametrize("name", ["logistic", "mlp"])
@pytest.mark.parametrize(
    "options",
    [{"weight_decay": 1e-3}, {"momentum": 0.9, "nesterov": True, "prox_mu": 0.1}],
    ids=["sgd", "momentum-prox"],
)
def test_compiled_agrees_with_eager_without_dropout(name, options, request):
    if name == "logistic" and "momentum" in options:
        pytest.skip("the update outside the graph is the same for every chain; mlp covers it (one compile less)")
    """Without dropout the compiled step is the eager step up to float rounding (deltas and sample losses)."""
    eager, compiled, parts = request.getfixturevalue(name)
    theta = eager.initial_parameters()
    for rnd in range(2):
        batches = _batches(eager, parts, rnd)
        a, la = eager.train(theta, batches, lr=0.1, sample_losses=True, **options)
        b, lb = compiled.train(theta, batches, lr=0.1, sample_losses=True, **options)
        assert a.abs().max() > 1e-3  # the clients moved
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(lb, la, rtol=1e-5)
        theta = theta + a.mean(0)


def test_compiled_step_does_not_recompile_as_clients_finish(mlp):
    """One graph for every number of active clients, client count and minibatch width (dynamic sizes)."""
    _, compiled, parts = mlp
    theta = compiled.initial_parameters()
    # sample losses on, as in the agreement test: the same graph (each flag combination is a graph of its own)
    compiled.train(theta, _batches(compiled, parts, 0), lr=0.1, weight_decay=1e-3, sample_losses=True)
    before = counters["stats"]["unique_graphs"]
    for rnd, (width, clients) in enumerate([(8, [0, 1, 2, 3, 4, 5]), (12, [0, 1, 2]), (16, [1, 2, 3, 4])]):
        batches = compiled.client_batches(parts, LocalSchedule(width, epochs=2), 0, rnd, clients)
        batches[1] = batches[1][:-3]  # the active clients shrink within the round
        compiled.train(theta, batches, lr=0.1, weight_decay=1e-3, sample_losses=True)
    assert counters["stats"]["unique_graphs"] == before


def test_compiled_dropout_is_reproducible_and_trains(mlp_dropout):
    """With dropout: the same call gives the same bits, another seed other masks, and FedAvg's loss falls about
    as much as on the eager path (other masks, the same distribution)."""
    eager, compiled, parts = mlp_dropout
    theta0 = compiled.initial_parameters()
    batches = _batches(compiled, parts, 0)
    first = compiled.train(theta0, batches, lr=0.1, dropout_seed=3)
    assert torch.equal(compiled.train(theta0, batches, lr=0.1, dropout_seed=3), first)
    assert not torch.equal(compiled.train(theta0, batches, lr=0.1, dropout_seed=4), first)
    before = compiled.client_losses(theta0).mean()
    fall = {}
    for engine in (eager, compiled):
        theta = theta0
        for rnd in range(6):
            theta = theta + engine.train(theta, _batches(engine, parts, rnd), lr=0.3, dropout_seed=rnd).mean(0)
        fall[engine.path] = before - engine.client_losses(theta).mean()
    assert fall["eager"] > 0.1
    assert fall["compiled"] > 0.7 * fall["eager"], fall


def test_compiled_runs_batched_equal_runs_alone(mlp_dropout):
    """Batched seeds: each run draws its masks from its own generator, so it gets what it gets alone."""
    _, compiled, parts = mlp_dropout
    theta = compiled.initial_parameters()
    runs = [_batches(compiled, parts, r) for r in range(3)]
    batched, _ = compiled.train_runs([theta] * 3, runs, lrs=[0.1] * 3, dropout_seeds=[5, 6, 7])
    for r in range(3):
        alone, _ = compiled.train_runs([theta], [runs[r]], lrs=[0.1], dropout_seeds=[5 + r])
        torch.testing.assert_close(batched[r], alone[0], rtol=1e-4, atol=1e-6)


@pytest.fixture(scope="module")
def mlp_dropout_static(mlp_dropout):
    return _static(mlp_dropout[1].model)


@pytest.mark.parametrize(
    "options",
    [{"weight_decay": 1e-3, "sample_losses": True}, {"momentum": 0.9, "nesterov": True, "prox_mu": 0.1}],
    ids=["sgd", "momentum-prox"],
)
def test_static_steps_agree_with_dynamic_steps(mlp_dropout, mlp_dropout_static, options):
    """Static steps (CUDA's, run here on the CPU) train every row at every step, a finished client's with a zero
    step size: each client ends where the dynamic step leaves it, with the same dropout masks, to float rounding;
    clients that stop early are not moved by the steps after their last."""
    _, dynamic, parts = mlp_dropout
    static = mlp_dropout_static
    assert static._compiled_step.static and not dynamic._compiled_step.static
    assert not static._compiled_step.cuda_graphs  # CUDA graphs only on a CUDA device
    theta = dynamic.initial_parameters()
    for rnd in range(2):
        batches = _batches(dynamic, parts, rnd)
        a = dynamic.train(theta, batches, lr=0.1, dropout_seed=rnd, **options)
        b = static.train(theta, batches, lr=0.1, dropout_seed=rnd, **options)
        if options.get("sample_losses"):
            (a, la), (b, lb) = a, b
            np.testing.assert_allclose(lb, la, rtol=1e-5)
        assert a.abs().max() > 1e-3
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
        theta = theta + a.mean(0)


def test_static_steps_compile_once_for_a_rounds_shapes(mlp_dropout_static, mlp_dropout):
    """A static step is compiled for the round's sizes: rounds with the same clients and minibatch width reuse it
    however the clients' numbers of steps differ (the shrinking active set is padded, not a new shape)."""
    static, parts = mlp_dropout_static, mlp_dropout[2]
    theta = static.initial_parameters()
    static.train(theta, _batches(static, parts, 0), lr=0.1, dropout_seed=0)
    before = counters["stats"]["unique_graphs"]
    for rnd in range(1, 4):
        batches = _batches(static, parts, rnd)
        batches[rnd] = batches[rnd][:1]  # another client stops after one step
        static.train(theta, batches, lr=0.1, dropout_seed=rnd)
    assert counters["stats"]["unique_graphs"] == before


def test_static_steps_compile_each_size_apart(mlp_dropout_static, mlp_dropout):
    """A process trains static steps of many sizes (clients per round, runs batched together, minibatch width):
    each size has a code object of its own, so dynamo's limit of graphs per code object (8; with fullgraph=True
    the next one raises FailOnRecompileLimitHit) is never reached. A limit of 1 here stands for the 8."""
    static, parts = mlp_dropout_static, mlp_dropout[2]
    theta = static.initial_parameters()
    with torch._dynamo.config.patch(recompile_limit=1):
        for clients in ([0, 1, 2, 3, 4], [0, 1, 2], [0, 1, 2, 3]):
            batches = static.client_batches(parts, LocalSchedule(16, steps=2), 0, 0, clients)
            assert static.train(theta, batches, lr=0.1).shape[0] == len(clients)


def test_static_steps_are_an_option_of_the_compiled_path(logistic):
    X, y, parts = _data()
    with pytest.raises(ValueError, match="static_steps is an option of path='compiled'"):
        Engine(logistic[0].model, X, y, parts, X[:50], y[:50], static_steps=True)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_compiled_path_replays_cuda_graphs_and_agrees_with_the_cpu(mlp):
    """On CUDA the compiled path takes static steps run as CUDA graphs; without dropout it lands where the CPU's
    eager path does, to float rounding (TF32 is off by default for float32 matrix products)."""
    eager, _, parts = mlp
    X, y, _ = _data()
    gpu = Engine(eager.model, X, y, parts, X[:50], y[:50], path="compiled", device="cuda")
    assert gpu._compiled_step.static and gpu._compiled_step.cuda_graphs
    skips = counters["inductor"]["cudagraph_skips"]
    theta = eager.initial_parameters()
    for rnd in range(3):
        batches = _batches(eager, parts, rnd)
        a = eager.train(theta, batches, lr=0.1, weight_decay=1e-3)
        b = gpu.train(theta, batches, lr=0.1, weight_decay=1e-3)
        assert b.device.type == "cpu"
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
        theta = theta + a.mean(0)
    assert counters["inductor"]["cudagraph_skips"] == skips  # inductor replayed the steps as CUDA graphs


def test_eager_is_the_default_and_paths_do_not_batch_together(logistic):
    eager, compiled, _ = logistic
    assert eager.path == "eager" and compiled.path == "compiled"
    assert eager.batch_key() != compiled.batch_key()


@pytest.mark.parametrize("path", ["Compiled", "inductor", "", None, 1])
def test_bad_path_is_refused_before_training(path):
    X, y, parts = _data()
    with pytest.raises(ValueError, match="'path' parameter of Engine"):
        Engine(LogisticRegression(SHAPE, 10), X, y, parts, X[:5], y[:5], path=path)


def test_compiled_path_refuses_models_it_cannot_compile():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, size=20)
    with pytest.raises(ValueError, match="path='compiled' compiles the local step of a"):
        Engine(FedCorCNN((1, 28, 28), 10), X, y, [np.arange(20)], X[:5], y[:5], path="compiled")
    with pytest.raises(ValueError, match="path='compiled' compiles the local step of a"):
        Engine(
            LogisticRegression((1, 28, 28), 10),
            X,
            y,
            [np.arange(20)],
            X[:5],
            y[:5],
            loss=lambda o, t: (o**2).mean(1),
            path="compiled",
        )
