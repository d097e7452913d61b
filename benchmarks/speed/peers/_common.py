"""What every driver of ``bench_peers`` shares: the job file, the models, the round timer, the result line.

The drivers run under other frameworks' virtual environments, so this module needs numpy and torch
only (it reads fedselect's model classes from their file, never imports fedselect). A driver is
``python run_<framework>.py JOB.json``: it reads the job (written by ``bench_peers``), builds its
framework's federation from the job's arrays (not timed), runs ``warmup + rounds`` FedAvg rounds,
times each with ``time.perf_counter`` (wall) and ``time.process_time`` (the process's CPU time: on
a busy machine, the part that does not wait for a core) and prints one line
``BENCH_PEERS_RESULT {json}`` with the timed rounds' seconds.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"  # before torch starts its pools

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

RESULT_PREFIX = "BENCH_PEERS_RESULT "
MODELS = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "fedselect", "simulation", "models.py"
)


def load_job(path: str) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor, np.ndarray]:
    """The job's settings, the sample pool as float32 / int64 tensors, and the (clients, m) index matrix.

    A pool stored as uint8 (the synthetic CIFAR-shaped job) becomes float32 in [0, 1].
    """
    torch.set_num_threads(1)
    with open(path) as f:
        job = json.load(f)
    with np.load(job["data"]) as arrays:
        X, y, parts = arrays["X"], arrays["y"], arrays["client_indices"]
    X = X.astype(np.float32) / 255.0 if X.dtype == np.uint8 else X.astype(np.float32, copy=False)
    return job, torch.from_numpy(X), torch.from_numpy(y.astype(np.int64)), parts.astype(np.int64)


def build_model(job: dict[str, Any]) -> nn.Module:
    """The job's model: fedselect's own ``FedCorMLP`` (with the job's ``hidden``) or FedCor's ``FedCorCNN``.

    Read from ``fedselect/simulation/models.py`` by its path (it imports only torch), so that a peer's
    environment, which has no fedselect, trains the very same layers.
    """
    spec = importlib.util.spec_from_file_location("_bench_peers_models", MODELS)
    assert spec is not None and spec.loader is not None
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    shape, n_classes = tuple(job["input_shape"]), int(job["n_classes"])
    if job["model"] == "mlp":
        return models.FedCorMLP(shape, n_classes, hidden=tuple(job["hidden"]))
    return models.FedCorCNN(shape, n_classes)


def time_rounds(play_round: Callable[[int], Any], job: dict[str, Any]) -> dict[str, list[float]]:
    """Wall and process CPU seconds of each of ``job["rounds"]`` rounds after ``job["warmup"]`` untimed ones."""
    stamps = []
    for t in range(int(job["warmup"]) + int(job["rounds"])):
        if t >= int(job["warmup"]):
            stamps.append((time.perf_counter(), time.process_time()))
        play_round(t)
    stamps.append((time.perf_counter(), time.process_time()))
    return timings(stamps)


def timings(stamps: list[tuple[float, float]]) -> dict[str, list[float]]:
    """The wall and CPU seconds between consecutive ``(perf_counter, process_time)`` stamps."""
    pairs = list(itertools.pairwise(stamps))
    return {"seconds": [b[0] - a[0] for a, b in pairs], "cpu_seconds": [b[1] - a[1] for a, b in pairs]}


def emit(framework: str, timing: dict[str, list[float]], **extra: Any) -> None:
    """Print the driver's result line (the last line ``bench_peers`` reads from its stdout)."""
    extra.setdefault("torch", torch.__version__)
    extra.setdefault("threads", torch.get_num_threads())
    print(RESULT_PREFIX + json.dumps({"framework": framework, **timing, **extra}), flush=True)
    sys.stdout.flush()
