"""FLGo's side of a ``bench_peers`` job (FLGo 0.4.4, ``flgo.algorithm.fedavg``), in FLGo's own environment.

Setup, not timed: the job's pool becomes a benchmark made by ``flgo.gen_benchmark_from_file`` (a
config whose ``train_data`` is a ``TensorDataset`` of the pool), the job's client index sets its task
(``flgo.gen_task_by_`` with a partitioner that returns them), and ``flgo.init`` builds the runner
with FedAvg, uniform sampling of ``clients_per_round / n_clients`` of the clients without
replacement, uniform aggregation (the mean: the job's clients hold equal shares, so it is also
FedAvg's size-weighted mean), plain SGD, no train/validation holdout, one torch thread, the model
through ``flgo.convert_model``. A timed round is what ``BasicServer.run`` does for one round minus
its logging, evaluation and checkpoints: ``gv.clock.step()``, ``iterate()`` (sample, communicate,
train, aggregate), ``current_round += 1``.

FLGo's ``TaskDataset`` (a ``torch.utils.data.Subset`` with its own ``__getitem__``) gets a
``__getitems__`` at run time, the per-sample path FLGo was written for: under torch >= 2.11 the
``Subset.__getitems__`` it inherits bypasses its ``__getitem__``. Run as
``python run_flgo.py JOB.json`` with FLGo's environment's python.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from importlib.metadata import version

import flgo
import flgo.algorithm.fedavg as fedavg
import flgo.benchmark.partition
from _common import build_model, emit, load_job, time_rounds
from flgo.benchmark.toolkits.cv.classification import FromDatasetPipe

_CONFIG = """
import os
import torch
from _common import build_model, load_job

job, X, y, parts = load_job(os.environ["BENCH_PEERS_JOB"])
train_data = torch.utils.data.TensorDataset(X, y)
test_data = torch.utils.data.TensorDataset(X[:500], y[:500])


def get_model():
    return build_model(job)
"""


class _GivenParts(flgo.benchmark.partition.BasicPartitioner):
    """The job's client index sets, as FLGo's partitioner interface returns them."""

    def __init__(self, parts) -> None:
        self.parts = parts
        self.num_clients = len(parts)

    def __call__(self, data):
        return [[int(i) for i in p] for p in self.parts]


def _getitems(self, indices):
    return [self[i] for i in indices]


def main(path: str) -> None:
    job, _, _, parts = load_job(path)
    FromDatasetPipe.TaskDataset.__getitems__ = _getitems
    os.environ["BENCH_PEERS_JOB"] = os.path.abspath(path)
    work = tempfile.mkdtemp(prefix="bench_peers_flgo_")
    os.chdir(work)
    sys.path.insert(0, work)
    config = os.path.join(work, "bench_config.py")
    with open(config, "w") as f:
        f.write(_CONFIG)
    bmk = flgo.gen_benchmark_from_file("bench_peers_bmk", config, target_path=work, overwrite=True)
    task = os.path.join(work, "bench_peers_task")
    benchmark = __import__(bmk)
    del benchmark.visualize  # its per-sample plot of 100 clients took minutes; gen_task_by_ skips a missing one
    flgo.gen_task_by_(benchmark, _GivenParts(parts), task_path=task, seed=int(job["seed"]))
    option = {
        "num_rounds": int(job["warmup"]) + int(job["rounds"]),
        "proportion": int(job["clients_per_round"]) / len(parts),
        "sample": "uniform",
        "aggregate": "uniform",
        "learning_rate": float(job["lr"]),
        "learning_rate_decay": 1.0,
        "momentum": 0.0,
        "weight_decay": 0.0,
        "batch_size": int(job["batch_size"]),
        "num_epochs": int(job["epochs"]),
        "num_steps": -1,
        "train_holdout": 0.0,
        "test_holdout": 0.0,
        "seed": int(job["seed"]),
        "gpu": [],
        "torch_num_threads": 1,
        "num_workers": 0,
        "eval_interval": -1,
        "no_tqdm": True,
        "log_level": "WARNING",
        "no_log_console": True,
    }
    runner = flgo.init(task, fedavg, option=option, model=flgo.convert_model(lambda: build_model(job), "bench_model"))

    def play_round(t: int) -> None:
        runner.gv.clock.step()
        runner.iterate()
        runner.current_round += 1

    timing = time_rounds(play_round, job)
    os.chdir(os.path.dirname(work))
    shutil.rmtree(work, ignore_errors=True)
    emit("flgo", timing, version=version("flgo"))


if __name__ == "__main__":
    main(sys.argv[1])
