"""FedCor's ``gp_device``: where the GP's embeddings and fits live; every device code path run on the CPU.

As in tests/simulation/test_device.py, the GP is asked for ``device="cpu"`` while torch's default device is
``meta``: a tensor the GP makes without naming its device lands on ``meta`` (on a GPU machine it would land on
the host), and the recorder sees it. CUDA-only checks are marked ``cuda`` and skip without a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedselect import devices as devices_module
from fedselect._validation import InvalidParameterError
from fedselect.selection import ClientPool
from fedselect.selectors import _gp
from fedselect.selectors.fedcor import FedCorSelector

from ..simulation.test_device import _Record
from .test_fedcor import GroupOracle, run

no_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _vectors(n_clients: int = 12, m: int = 4, *, missing: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    values = rng.normal(size=(m, n_clients)) * 0.1
    if missing:
        values[1, [2, 5]] = np.nan  # one vector with clients that did not answer: the partial likelihood
    return values, 0.9 ** np.arange(m)[::-1]


def _use_the_gp(device: torch.device, solver: str) -> _gp.LossChangeGP:
    gp = _gp.LossChangeGP(12, 3, 0.05, generator=torch.Generator().manual_seed(0), device=device)
    for missing in (False, True):
        values, weights = _vectors(missing=missing)
        gp.set_mean(values, weights)
        gp.fit(values, weights, iterations=3, lr=0.01, solver=solver)
    gp.set_mean(None)
    _gp.greedy_select(gp.embeddings, gp.noise, np.full(12, 1 / 12), np.ones(12), 4)
    gp.dense_covariance()
    return gp


@pytest.mark.parametrize("solver", _gp.SOLVERS)
def test_every_tensor_of_a_fit_is_made_on_the_gps_device(solver):
    with torch.device("meta"), _Record() as rec:  # a tensor made without naming the GP's device lands on meta
        gp = _use_the_gp(torch.device("cpu"), solver)
    assert gp.device == torch.device("cpu")
    stray = {d: sorted(names) for d, names in rec.devices.items() if d != "cpu"}
    assert not stray, stray


def test_a_whole_fedcor_run_with_gp_device_cpu_makes_no_tensor_elsewhere():
    selector = FedCorSelector(rank=3, warmup_rounds=2, gp_interval=3, warmup_iters=3, gp_iters=3, gp_device="cpu",
                              random_state=0)
    with torch.device("meta"), _Record() as rec:
        run(selector, GroupOracle(seed=1), 3, 7)
    stray = {d: sorted(names) for d, names in rec.devices.items() if d != "cpu"}
    assert not stray, stray


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), "cpu:0", "auto"])
def test_every_name_of_the_cpu_gives_the_defaults_bits_and_identity(device):
    """On a machine without a GPU, "auto" is the CPU: the same run, and the same run key, as the default."""
    a = FedCorSelector(rank=3, warmup_rounds=2, gp_interval=3, warmup_iters=20, gp_iters=20, random_state=4)
    b = FedCorSelector(rank=3, warmup_rounds=2, gp_interval=3, warmup_iters=20, gp_iters=20, random_state=4,
                       gp_device=device)
    if device == "auto" and torch.cuda.is_available():
        pytest.skip("'auto' is CUDA on this machine")
    picks_a, picks_b = run(a, GroupOracle(seed=3), 4, 9), run(b, GroupOracle(seed=3), 4, 9)
    for x, y in zip(picks_a, picks_b):
        np.testing.assert_array_equal(x, y)
    assert a.embeddings_.tobytes() == b.embeddings_.tobytes()
    assert [f.nll for f in a.fit_log_] == [f.nll for f in b.fit_log_]
    assert b.identifying_params() == a.identifying_params()
    assert "gp_device" not in b.identifying_params()


def test_another_device_is_part_of_the_run_identity(monkeypatch):
    import fedselect.selectors.fedcor as fedcor_module

    monkeypatch.setattr(fedcor_module, "device_setting", lambda d: "cuda")  # as on a machine with a GPU
    assert FedCorSelector(gp_device="cuda").identifying_params()["gp_device"] == "cuda"


def test_a_device_this_machine_lacks_names_a_stored_runs_setting_as_given():
    """Reading a record made on a GPU machine, on a CPU one, keeps its gp_device in the identity."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert FedCorSelector(gp_device="cuda:1").identifying_params()["gp_device"] == "cuda:1"


@pytest.mark.parametrize("device", ["tpu", "meta", "cuda:x", "", 3, None, torch.device("meta")])
def test_a_device_fedselect_cannot_use_is_refused_before_the_gp_is_built(device):
    with pytest.raises(InvalidParameterError, match="gp_device"):
        FedCorSelector(gp_device=device).fit(ClientPool([10] * 20))


def test_mps_is_refused_because_the_gp_computes_in_float64(monkeypatch):
    monkeypatch.setattr(devices_module, "_mps_available", lambda: True)
    with pytest.raises(InvalidParameterError, match="float64"):
        FedCorSelector(gp_device="mps").fit(ClientPool([10] * 20))


def test_a_missing_gpu_is_refused_with_what_the_machine_has():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(InvalidParameterError, match="no cuda"):
        FedCorSelector(gp_device="cuda").fit(ClientPool([10] * 20))


# -- on a GPU ------------------------------------------------------------------------------------------------


@pytest.mark.cuda
@no_gpu
@pytest.mark.parametrize("solver", _gp.SOLVERS)
def test_on_cuda_the_gp_lives_on_the_gpu_and_fits_the_cpus_gp_to_rounding(solver):
    cpu = _use_the_gp(torch.device("cpu"), solver)
    gpu = _use_the_gp(torch.device("cuda"), solver)
    assert gpu.root.device.type == "cuda" and gpu.mean.device.type == "cuda"
    np.testing.assert_allclose(gpu.embeddings, cpu.embeddings, rtol=1e-9, atol=1e-12)


@pytest.mark.cuda
@no_gpu
def test_on_cuda_a_fedcor_run_picks_as_on_the_cpu():
    kw = dict(rank=3, noise=0.05, warmup_rounds=4, gp_interval=3, warmup_iters=40, gp_iters=40, random_state=0)
    a, b = FedCorSelector(**kw), FedCorSelector(**kw, gp_device="cuda")
    picks_a = run(a, GroupOracle(sizes=(8, 8, 8), noise=0.05, seed=1), 3, 10)
    picks_b = run(b, GroupOracle(sizes=(8, 8, 8), noise=0.05, seed=1), 3, 10)
    for x, y in zip(picks_a, picks_b):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_allclose(b.embeddings_, a.embeddings_, rtol=1e-7, atol=1e-9)
    assert b.identifying_params()["gp_device"] == "cuda"


def test_auto_on_a_mac_is_the_cpu_not_mps(monkeypatch):
    """"auto" never picks MPS for the GP (no float64 there): on a machine with MPS and no CUDA it is the CPU."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.setattr(devices_module, "_mps_available", lambda: True)
    selector = FedCorSelector(rank=3, gp_device="auto", random_state=0).fit(ClientPool([10] * 20))
    assert selector._gp.device == torch.device("cpu")
    assert "gp_device" not in selector.identifying_params()
