"""Seconds per round and a small grid's time on every device and engine path found, beside a bound measured here.

For each device torch sees (the CPU; each CUDA GPU's kind once, as ``cuda``; ``mps``) and each
engine path the trainer offers (its ``path`` parameter's declared options: the eager reference
path and the compiled one, measured the same way), the script measures:

* **seconds per round**: one run of a CIFAR-10 setting (FedCor's CIFAR CNN by default, C
  clients per round, one local epoch), the median of its rounds after the first (the first pays
  for allocation and, on a GPU, kernel selection);
* **a small grid**: schemes x seeds (random and power-of-choice, two seeds), each run alone, then
  the seeds of each scheme trained together (:func:`fedselect.simulation.batched.fit_runs`) where
  the model allows it.

The bound is measured in the same run, on the same device: the FLOP rate of the model's own
forward and backward pass on one batch of ``C x batch`` samples, timed alone (a plain module, no
federated bookkeeping; the FLOPs counted by :class:`torch.utils.flop_counter.FlopCounterMode`,
i.e. the convolutions' and matrix products' multiply-adds). A round's arithmetic (3 x forward
FLOP per sample gradient, 1 x per evaluated sample, from the run's own cost counters and the test
split) divided by that rate is the round's bound; the report gives each measured time as a
multiple of it. A large float32 matrix product's rate is printed beside it as the device's peak.

The data are CIFAR-10's when the python batches are found ($FEDSELECT_DATA, ``--data-dir``, the
user cache), else CIFAR-shaped synthetic data (3 x 32 x 32 normal noise around a per-class
pattern, as many samples as asked), and the report says which: the time of a round does not
depend on the pixel values, the accuracies do.

Usage::

    python -m benchmarks.speed.bench_device [--model cnn] [--clients 5] [--rounds 4] [--samples 5000]
    python -m benchmarks.speed.bench_device --devices cpu cuda --model resnet-gn

Defaults keep a CPU-only machine under about three minutes.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from fedselect import FederatedTrainer
from fedselect.data import Federation, make_federation
from fedselect.data.partition import shard_partition
from fedselect.simulation.batched import fit_runs
from fedselect.simulation.engine import available_devices, resolve_device
from fedselect.simulation.models import build_model

SCHEMES = {"random": ("random", {}), "pow-d": ("power-of-choice", {"d": 10})}


# -- what runs where -------------------------------------------------------------------------------------------


def devices_found() -> list[str]:
    """One device of each kind torch sees: cpu, cuda (the current GPU), mps."""
    have = available_devices()
    return [d for d in ("cpu", "cuda", "mps") if d in have]


def engine_paths() -> list[str]:
    """The engine paths the trainer offers: its ``path`` parameter's declared options."""
    from fedselect._validation import StrOptions

    declared = FederatedTrainer._parameter_constraints.get("path", [])
    return [o for c in declared if isinstance(c, StrOptions) for o in c.options] or ["eager"]


def path_params(path: str) -> dict[str, Any]:
    """The trainer keyword that selects ``path``."""
    return {"path": path}


def device_name(device: str) -> str:
    dev = resolve_device(device)
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        return f"{props.name} ({props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda})"
    if dev.type == "mps":
        return f"Apple GPU (MPS) on {platform.machine()}"
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name}, {torch.get_num_threads()} torch thread(s) of {os.cpu_count()} cores"


def sync(device: str) -> None:
    dev = resolve_device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()


# -- data --------------------------------------------------------------------------------------------------------


def cifar_federation(n_clients: int, samples: int, data_dir: str | None, seed: int = 0) -> tuple[Federation, str]:
    """CIFAR-10 in FedCor's 2-shards-per-client split when its files are found, else CIFAR-shaped synthetic data."""
    try:
        fed = make_federation(
            "cifar10",
            partition="shards",
            shards_per_client=2,
            n_clients=n_clients,
            data_dir=data_dir,
            random_state=seed,
        )
        return fed, "CIFAR-10 (python batches found)"
    except (FileNotFoundError, OSError):
        pass
    rng = np.random.default_rng(seed)
    shape = (3, 32, 32)
    patterns = rng.normal(size=(10, *shape)).astype(np.float32)
    n_test = max(samples // 5, 100)
    y = rng.integers(0, 10, size=samples + n_test)
    X = (0.5 * patterns[y] + rng.normal(size=(y.size, *shape))).astype(np.float32)
    parts = shard_partition(y[:samples], n_clients, shards_per_client=2, random_state=seed)
    fed = Federation(
        X[:samples], y[:samples], parts, X[samples:], y[samples:], n_classes=10, name="cifar-shaped synthetic"
    )
    return fed, (
        f"CIFAR-shaped synthetic data ({samples} training, {n_test} test samples of 3 x 32 x 32): "
        "no CIFAR-10 files found"
    )


# -- the bound ------------------------------------------------------------------------------------------------------


def forward_flop(model: torch.nn.Module, shape: tuple[int, ...]) -> int:
    """FLOP of one sample's forward pass (multiply-adds of the convolutions and matrix products, x 2)."""
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.zeros(1, *shape))
    return int(counter.get_total_flops())


def timed(fn: Callable[[], Any], device: str, reps: int) -> float:
    """Median seconds of ``fn`` over ``reps`` calls after one warm-up, the device synchronised around each."""
    fn()
    sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def model_rate(model_name: str, shape: tuple[int, ...], batch: int, device: str, reps: int = 5) -> tuple[float, int]:
    """(GFLOP/s, FLOP per step) of the model's forward and backward pass on one batch, timed alone on ``device``."""
    torch.manual_seed(0)
    model = build_model(model_name, shape, 10).to(resolve_device(device))
    x = torch.randn(batch, *shape, device=resolve_device(device))
    y = torch.randint(0, 10, (batch,), device=resolve_device(device))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()

    counter = FlopCounterMode(display=False)
    with counter:
        step()
    flop = int(counter.get_total_flops())
    return flop / timed(step, device, reps) / 1e9, flop


def matmul_rate(device: str, n: int = 2048, reps: int = 5) -> float:
    """GFLOP/s of an n x n float32 matrix product on ``device`` (its peak, as far as one product shows it)."""
    dev = resolve_device(device)
    a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    return 2 * n**3 / timed(lambda: a @ b, device, reps) / 1e9


# -- the measurements --------------------------------------------------------------------------------------------


def round_work(trainer: FederatedTrainer, fed: Federation, fwd: int) -> list[float]:
    """Each round's arithmetic in FLOP: 3 x forward per sample gradient, 1 x per evaluated sample and test sample."""
    out = []
    for r in trainer.history_.rounds:
        c = r.costs
        tested = len(fed.y_test) if r.test_loss is not None else 0
        out.append(fwd * (3 * c.sample_gradients + c.samples_evaluated + tested))
    return out


def one_run(fed: Federation, args: argparse.Namespace, device: str, path: str) -> tuple[FederatedTrainer, float]:
    trainer = FederatedTrainer(
        model=args.model,
        clients_per_round=args.clients,
        rounds=args.rounds,
        local_epochs=1,
        batch_size=args.batch,
        lr=0.01,
        random_state=0,
        device=device,
        **path_params(path),
    )
    sync(device)
    t0 = time.perf_counter()
    trainer.fit(fed)
    sync(device)
    return trainer, time.perf_counter() - t0


def grid(fed: Federation, args: argparse.Namespace, device: str, path: str, batched: bool) -> float:
    """Seconds for schemes x seeds, each run alone or, with ``batched``, the seeds of a scheme together."""
    sync(device)
    t0 = time.perf_counter()
    for name, params in SCHEMES.values():
        trainers = [
            FederatedTrainer(
                selector=(name, params),
                model=args.model,
                clients_per_round=args.clients,
                rounds=args.grid_rounds,
                local_epochs=1,
                batch_size=args.batch,
                lr=0.01,
                random_state=seed,
                device=device,
                **path_params(path),
            )
            for seed in range(args.seeds)
        ]
        if batched:
            failures = fit_runs(trainers, [fed] * len(trainers))
            if any(failures):
                raise RuntimeError(f"grid: a batched run failed: {failures}")
        else:
            for t in trainers:
                t.fit(fed)
    sync(device)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="cnn", help="a registered model: cnn, cnn-flsim, resnet-gn, or mlp / "
                    "logistic (the models the compiled path takes; default cnn)")
    ap.add_argument("--clients", type=int, default=5, help="clients per round C (default 5)")
    ap.add_argument("--n-clients", type=int, default=25, help="clients in the federation (default 25)")
    ap.add_argument("--samples", type=int, default=2500, help="training samples of the synthetic data (default 2500)")
    ap.add_argument("--batch", type=int, default=50, help="local batch size (default 50, FedCor's)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of the timed run (default 4)")
    ap.add_argument("--grid-rounds", type=int, default=2, help="rounds of each grid run (default 2)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds of the grid (default 2)")
    ap.add_argument("--devices", nargs="*", default=None, help="devices to measure (default: one of each kind found)")
    ap.add_argument("--data-dir", default=None, help="where the CIFAR-10 python batches are")
    args = ap.parse_args(argv)

    devices = args.devices or devices_found()
    for d in devices:
        resolve_device(d)  # an unavailable device: the error names those there are, before anything runs
    fed, data = cifar_federation(args.n_clients, args.samples, args.data_dir)
    shape = tuple(fed.input_shape)
    torch.manual_seed(0)
    fwd = forward_flop(build_model(args.model, shape, 10), shape)
    print(f"command: python -m benchmarks.speed.bench_device {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(
        f"torch {torch.__version__}; fedselect engine paths: {', '.join(engine_paths())}; "
        f"load average {' / '.join(f'{x:.2f}' for x in os.getloadavg())} (1 / 5 / 15 min)"
    )
    print(f"data: {data}; {fed.n_clients} clients, C = {args.clients}, 1 local epoch of batch {args.batch}")
    print(f"model: {args.model}, {fwd / 1e6:.2f} MFLOP per sample forward")
    for device in devices:
        print(f"\n[{device}] {device_name(device)}")
        peak = matmul_rate(device)
        rate, step_flop = model_rate(args.model, shape, args.clients * args.batch, device)
        print(
            f"  bound: the model's forward+backward on {args.clients * args.batch} samples alone: {rate:.1f} GFLOP/s "
            f"({step_flop / 1e9:.2f} GFLOP per step); float32 2048^3 matrix product: {peak:.1f} GFLOP/s"
        )
        for path in engine_paths():
            refused = _path_refuses(path, args.model, shape)
            if refused:
                print(f"  {path}: not run: {refused}")
                continue
            trainer, total = one_run(fed, args, device, path)
            seconds = [r.seconds for r in trainer.history_.rounds]
            work = round_work(trainer, fed, fwd)
            later = seconds[1:] or seconds
            per_round = statistics.median(later)
            bound = statistics.median(work[1:] or work) / (rate * 1e9)
            how = ""
            if path == "compiled":  # the compiled step's kind (the Engine's static_steps default follows the device)
                how = " [static steps, CUDA graphs]" if device.startswith("cuda") else " [dynamic sizes]"
            print(
                f"  {path}{how}: {per_round:.3f} s per round (median of rounds 2..{len(seconds)}; first "
                f"{seconds[0]:.3f} s; run {total:.2f} s) = {per_round / bound:.2f}x the bound ({bound:.3f} s); "
                f"final accuracy {trainer.history_.rounds[-1].test_accuracy:.3f}"
            )
            runs = len(SCHEMES) * args.seeds
            serial = grid(fed, args, device, path, batched=False)
            line = (
                f"  {path} grid ({len(SCHEMES)} schemes x {args.seeds} seeds x {args.grid_rounds} rounds): "
                f"{serial:.2f} s run by run ({serial / runs:.2f} s per run)"
            )
            if _batchable(args.model, fed):
                together = grid(fed, args, device, path, batched=True)
                line += f"; {together:.2f} s with each scheme's seeds trained together ({serial / together:.2f}x)"
            print(line)
    return 0


def _path_refuses(path: str, model: str, shape: tuple[int, ...]) -> str | None:
    """Why the trainer's engine path ``path`` does not take ``model`` (the compiled path takes the built-in chains,
    ``logistic`` and ``mlp``), or None."""
    if path != "compiled":
        return None
    from fedselect.simulation._compiled import compile_unusable
    from fedselect.simulation.engine import compiled_path_refusal

    torch.manual_seed(0)
    why = compiled_path_refusal(build_model(model, shape, 10)) or compile_unusable()
    return None if why is None else f"{why} (try --model mlp)"


def _batchable(model: str, fed: Federation) -> bool:
    """Whether the engine trains several runs of ``model`` as one computation (Engine.batch_support)."""
    from fedselect.simulation.engine import Engine

    torch.manual_seed(0)
    module = build_model(model, fed.input_shape, 10)
    return Engine(module, fed.X[:4], fed.y[:4], [np.arange(4)], fed.X_test[:2], fed.y_test[:2]).batch_support() is None


if __name__ == "__main__":
    raise SystemExit(main())
