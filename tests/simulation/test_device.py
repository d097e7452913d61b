"""device=: where the engine trains; every device code path run on the CPU, CUDA-only checks marked ``cuda``.

A machine without a GPU still exercises the device paths: the engine is asked for ``device="cpu"`` explicitly
while torch's default device is ``meta``, so a tensor the engine makes without naming its device lands on
``meta`` (where, on a GPU machine, it would land on the host) and the recording mode below sees it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from fedselect import FederatedTrainer
from fedselect import devices as devices_module
from fedselect._validation import InvalidParameterError
from fedselect.cli import main
from fedselect.experiments import provenance
from fedselect.experiments.plan import run_settings
from fedselect.simulation.engine import Engine, LocalSchedule, device_setting, resolve_device
from fedselect.simulation.models import FedCorCNN, FedCorMLP, FLSimCNN, LogisticRegression, ResNetGN

no_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# -- what local training creates, and what comes back to the host ------------------------------------------


class _Record(TorchFunctionMode):
    """Records the device of every tensor a torch function returns, and every call that brings a value back to
    the host (``.item()``, ``float(t)``, ``.tolist()``, ``.numpy()``, ``.cpu()``, ``bool(t)``, ...)."""

    HOST = frozenset(
        {"item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__", "as_tensor", "tensor"}
    )

    def __init__(self) -> None:
        super().__init__()
        self.devices: dict[str, set[str]] = {}
        self.host = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in self.HOST:
            self.host += 1
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.devices.setdefault(str(t.device), set()).add(name)
        return out


def _bn_cnn(shape, n_out):
    return nn.Sequential(
        nn.Conv2d(shape[0], 4, 3),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * (shape[1] - 2) * (shape[2] - 2), n_out),
    )


MODELS = {
    "mlp-dropout (hand-batched chain)": lambda s: FedCorMLP(s, 10, dropout=0.5),
    "logistic (hand-batched chain)": lambda s: LogisticRegression(s, 10),
    "cnn (vmap)": lambda s: FedCorCNN(s, 10),
    "cnn-flsim with dropout (vmap)": lambda s: FLSimCNN(s, 10, dropout=0.3),
    "resnet-gn (vmap)": lambda s: ResNetGN(s, 10),
    "batch norm (grouped, stateful)": lambda s: _bn_cnn(s, 10),
}


def _engine(make, n=160, shape=(1, 20, 20), seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, *shape)).astype(np.float32)
    y = rng.integers(0, 10, size=n)
    parts = np.split(rng.permutation(n), [23, 60, 71, 120])  # unequal clients: padding and finished clients
    torch.manual_seed(0)
    return Engine(make(shape), X, y, parts, X[:30], y[:30], device="cpu"), parts


def _use_the_engine(eng, parts, schedule, *, runs=True):
    theta = eng.initial_parameters()
    batches = eng.client_batches(parts, schedule, 0, 0, range(len(parts)))
    eng.train(
        theta,
        batches,
        lr=0.05,
        momentum=0.5,
        prox_mu=0.1,
        weight_decay=1e-3,
        dropout_seed=3,
        return_buffers=True,
        sample_losses=True,
    )
    eng.train(theta, batches, lr=0.05)
    eng.test(theta)
    eng.client_losses(theta)
    eng.client_losses(theta, np.array([1, 3]))
    if runs and eng.batch_support() is None:
        eng.train_runs([theta, theta], [batches, batches[:3]], lrs=[0.05, 0.1], dropout_seeds=[1, 2], momentum=0.5)
        eng.test_runs([theta, theta])


@pytest.mark.parametrize("make", list(MODELS.values()), ids=list(MODELS))
def test_training_and_evaluation_create_every_tensor_on_the_requested_device(make):
    eng, parts = _engine(make)
    with torch.device("meta"), _Record() as rec:  # a tensor made without naming the engine's device lands on meta
        _use_the_engine(eng, parts, LocalSchedule(16, epochs=2))
    assert set(rec.devices) == {"cpu"}, {d: sorted(names) for d, names in rec.devices.items() if d != "cpu"}


@pytest.mark.parametrize("make", list(MODELS.values()), ids=list(MODELS))
def test_no_value_comes_back_to_the_host_inside_the_local_steps(make):
    """The host round trips of a training call do not grow with its number of local steps."""
    eng, parts = _engine(make)
    counts = []
    for steps in (2, 7):
        with _Record() as rec:
            _use_the_engine(eng, parts, LocalSchedule(8, steps=steps), runs=True)
        counts.append(rec.host)
    assert counts[0] == counts[1], f"{counts[0]} host round trips with 2 local steps, {counts[1]} with 7"


def test_the_recorder_sees_a_stray_tensor_and_a_host_sync():
    """The two checks above can fail: a tensor made without a device, and a float() in a loop."""
    with torch.device("meta"), _Record() as rec:
        torch.ones(3)
    assert "meta" in rec.devices
    with _Record() as rec:
        t = torch.ones(2)
        for _ in range(3):
            float(t.sum())
    assert rec.host == 3


# -- the trainer ------------------------------------------------------------------------------------------------


KW = dict(rounds=4, clients_per_round=3, local_steps=3, random_state=5)


@pytest.mark.parametrize("model", ["mlp", "cnn-flsim"])
def test_an_explicit_cpu_device_gives_the_default_runs_bits(digits_fed, model):
    kw = dict(KW, model=model, model_params={"dropout": 0.5} if model == "mlp" else None)
    default = FederatedTrainer(**kw).fit(digits_fed)
    for device in ("cpu", torch.device("cpu"), "auto" if not torch.cuda.is_available() else "cpu"):
        other = FederatedTrainer(**kw, device=device).fit(digits_fed)
        assert other.history_ == default.history_
        got = [(r.test_loss, r.test_accuracy, r.clients) for r in other.history_.rounds]
        assert got == [(r.test_loss, r.test_accuracy, r.clients) for r in default.history_.rounds]
        assert other.parameters_.tobytes() == default.parameters_.tobytes()


def test_the_run_records_the_device_kind_that_auto_chose(digits_fed):
    config = FederatedTrainer(**KW, device="auto").fit(digits_fed).history_.config
    assert config["trainer"]["device"] == resolve_device("auto").type
    assert FederatedTrainer(**KW).fit(digits_fed).history_.config["trainer"]["device"] == "cpu"


BAD = ["tpu", "meta", "cuda:x", "", 3, None, torch.device("meta")]
if not torch.cuda.is_available():
    BAD += ["cuda", "cuda:0", torch.device("cuda")]


@pytest.mark.parametrize("device", BAD, ids=repr)
def test_a_device_this_machine_lacks_is_refused_before_anything_is_built(digits_fed, device, monkeypatch):
    from fedselect.simulation import loop as trainer  # where the fit builds its engine

    def never(*args, **kwargs):
        raise AssertionError("the engine was built before the device was checked")

    monkeypatch.setattr(trainer, "build_engine", never)
    with pytest.raises(InvalidParameterError) as info:
        FederatedTrainer(**KW, device=device).fit(digits_fed)
    message = str(info.value)
    assert f"FederatedTrainer: parameter device={device!r} is invalid" in message
    assert "this machine has (cpu, auto" in message  # what it has
    if not torch.cuda.is_available():
        assert "no cuda: " in message  # and why there is no GPU


def test_resolve_device_names_what_the_machine_has(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu") == resolve_device(torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert device_setting("auto") == "cuda" and device_setting("cuda:1") == "cuda:1"
    with pytest.raises(ValueError, match=r"torch sees 2 CUDA GPU\(s\), cuda:0 to cuda:1"):
        resolve_device("cuda:2")
    with pytest.raises(ValueError, match="not 'xpu'"):
        resolve_device("xpu")
    with pytest.raises(TypeError, match="not int"):
        resolve_device(0)  # type: ignore[arg-type]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices_module, "_mps_available", lambda: True)
    assert resolve_device("auto") == torch.device("mps", 0) and device_setting("auto") == "mps"
    monkeypatch.setattr(devices_module, "_mps_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") and device_setting("auto") == "cpu"
    with pytest.raises(ValueError, match="no Apple GPU"):
        resolve_device("mps")


def test_run_keys_name_the_kind_of_machine_and_keep_the_cpus(monkeypatch):
    fed = {"dataset": "digits", "n_clients": 8}
    trainer = {"rounds": 3, "model": "logistic"}

    def key(**extra):
        return provenance.run_key(run_settings(fed, {**trainer, **extra}, "random", 0))

    plain = key()
    assert key(device="cpu") == key(device=torch.device("cpu")) == key(device="cpu:0") == plain
    assert key(device="auto") == plain  # no GPU: auto is the CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert key(device="auto") == key(device="cuda") != plain  # auto is keyed as the kind it chose
    assert run_settings(fed, {**trainer, "device": "auto"}, "random", 0)["trainer"]["device"] == "cuda"


def test_a_checkpoint_resumes_on_another_device_and_holds_cpu_arrays(digits_fed, tmp_path):
    class Stop(Exception):
        pass

    def stop(trainer, record):
        if record.round == 2:
            raise Stop

    kw = dict(KW, rounds=5, checkpoint_dir=tmp_path, checkpoint_every=1)
    reference = FederatedTrainer(**KW | {"rounds": 5}).fit(digits_fed)
    with pytest.raises(Stop):
        FederatedTrainer(**kw, device="cpu", callback=stop).fit(digits_fed)
    resumed = FederatedTrainer(**kw, device="auto").fit(digits_fed)
    assert resumed.resumed_from_ == 2  # the callback stopped round 2 before its checkpoint
    if resolve_device("auto").type == "cpu":
        assert resumed.history_ == reference.history_
    assert isinstance(resumed.parameters_, np.ndarray)


def test_the_cli_takes_device(tmp_path, capsys):
    small = "--n-clients 8 --clients-per-round 2 --rounds 2 --model logistic --local-steps 2 --no-progress".split()
    out = tmp_path / "h.json"
    assert main(["run", "--device", "cpu", "--out", str(out), *small]) == 0
    assert json.loads(out.read_text())["config"]["trainer"]["device"] == "cpu"
    capsys.readouterr()
    assert main(["run", "--device", "tpu", *small]) != 0
    assert "parameter device='tpu' is invalid; expected one of the devices this machine has" in capsys.readouterr().err
    help_text = _help(["run", "--help"], capsys)
    assert "--device DEVICE" in help_text and "cuda:N, mps or auto" in help_text


def test_compare_with_an_explicit_cpu_device_finds_the_runs_made_without_it(tmp_path, capsys):
    small = "--n-clients 8 --clients-per-round 2 --rounds 2 --model logistic --local-steps 2 --no-progress".split()
    args = ["compare", "--selectors", "random", "--seeds", "0", "--out", str(tmp_path), *small]
    assert main(args) == 0
    capsys.readouterr()
    assert main([*args, "--device", "cpu"]) == 0
    assert "1 finished run(s) loaded, 0 to run" in capsys.readouterr().err


def _help(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    return " ".join(capsys.readouterr().out.split())


# -- on a CUDA GPU (skipped without one) --------------------------------------------------------------------------


@pytest.mark.cuda
@no_gpu
@pytest.mark.parametrize("make", list(MODELS.values()), ids=list(MODELS))
def test_on_cuda_every_tensor_of_training_is_on_the_gpu_and_nothing_syncs_inside_the_steps(make):
    rng = np.random.default_rng(0)
    shape = (1, 20, 20)
    X = rng.normal(size=(160, *shape)).astype(np.float32)
    y = rng.integers(0, 10, size=160)
    parts = np.split(rng.permutation(160), [23, 60, 71, 120])
    torch.manual_seed(0)
    eng = Engine(make(shape), X, y, parts, X[:30], y[:30], device="cuda")
    theta = eng.initial_parameters()
    syncs = []
    for steps in (2, 7):
        batches = eng.client_batches(parts, LocalSchedule(8, steps=steps), 0, 0, range(len(parts)))
        with _Record() as rec:
            eng.train(theta, batches, lr=0.05, momentum=0.5, dropout_seed=3)
        assert not set(rec.devices) - {"cuda:0", "cpu"}
        # CPU tensors only at the boundary: the indices made on the host, the deltas brought back
        assert rec.devices.get("cpu", set()) <= {"to", "cpu", "from_numpy"}
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with pytest.warns(UserWarning) as caught:
                eng.train(theta, batches, lr=0.05, momentum=0.5, dropout_seed=3)
                torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        syncs.append(sum("synchroniz" in str(w.message) for w in caught))
    assert syncs[0] == syncs[1]


@pytest.mark.cuda
@no_gpu
@pytest.mark.parametrize("model", ["mlp", "cnn-flsim", "resnet-gn"])
def test_on_cuda_one_seed_gives_the_same_bits_twice_and_numbers_close_to_the_cpus(digits_fed, model):
    kw = dict(KW, model=model)
    a = FederatedTrainer(**kw, device="cuda").fit(digits_fed)
    b = FederatedTrainer(**kw, device="cuda").fit(digits_fed)
    cpu = FederatedTrainer(**kw).fit(digits_fed)
    assert a.parameters_.tobytes() == b.parameters_.tobytes() and a.history_ == b.history_
    assert a.history_.config["trainer"]["device"] == "cuda"
    np.testing.assert_allclose(a.parameters_, cpu.parameters_, rtol=1e-3, atol=1e-4)
