"""FedLab's side of a ``bench_peers`` job (FedLab 1.3.0, standalone FedAvg), in FedLab's own environment.

Setup, not timed: a ``fedlab.contrib.dataset.basic_dataset.FedDataset`` whose clients are FedLab
``BaseDataset`` s of the job's index sets (held in memory, gathered once), a ``SyncServerHandler``
(``sample_ratio = clients_per_round / n_clients``: uniform sampling without replacement; its
``Aggregators.fedavg_aggregate`` without weights is the mean, which for the job's equal client shares
is also FedAvg's size-weighted mean) and an ``SGDSerialClientTrainer`` (plain ``torch.optim.SGD``:
no momentum, no weight decay; ``setup_optim(epochs, batch_size, lr)``). A timed round is one pass of
``StandalonePipeline.main``'s loop without its evaluation: ``sample_clients``, ``downlink_package``,
``local_process``, ``uplink_package``, ``load`` of every upload (the last one aggregates). Its
loaders shuffle (``DataLoader(shuffle=True)``), as the other frameworks' do; FedLab's own
partitioned datasets do not. Run as ``python run_fedlab.py JOB.json`` with FedLab's environment's python.
"""

from __future__ import annotations

import random
import sys
from importlib.metadata import version

import torch
from _common import build_model, emit, load_job, time_rounds
from fedlab.contrib.algorithm.basic_client import SGDSerialClientTrainer
from fedlab.contrib.algorithm.basic_server import SyncServerHandler
from fedlab.contrib.dataset.basic_dataset import BaseDataset, FedDataset
from torch.utils.data import DataLoader


class _JobDataset(FedDataset):
    """The job's clients as FedLab datasets, one ``BaseDataset`` each."""

    def __init__(self, X: torch.Tensor, y: torch.Tensor, parts) -> None:
        self.num_clients = len(parts)
        self.clients = [BaseDataset(X[torch.from_numpy(p)], y[torch.from_numpy(p)]) for p in parts]

    def get_dataset(self, cid, type="train"):
        return self.clients[cid]

    def get_dataloader(self, cid, batch_size=None, type="train"):
        dataset = self.get_dataset(cid, type)
        return DataLoader(dataset, batch_size=batch_size or len(dataset), shuffle=True)


def main(path: str) -> None:
    job, X, y, parts = load_job(path)
    random.seed(int(job["seed"]))
    torch.manual_seed(int(job["seed"]))
    n_rounds = int(job["warmup"]) + int(job["rounds"])
    handler = SyncServerHandler(build_model(job), n_rounds, int(job["clients_per_round"]) / len(parts))
    trainer = SGDSerialClientTrainer(build_model(job), len(parts))
    trainer.setup_dataset(_JobDataset(X, y, parts))
    trainer.setup_optim(int(job["epochs"]), int(job["batch_size"]), float(job["lr"]))
    handler.num_clients = trainer.num_clients

    def play_round(t: int) -> None:
        sampled = handler.sample_clients()
        trainer.local_process(handler.downlink_package, sampled)
        for pack in trainer.uplink_package:
            handler.load(pack)

    emit("fedlab", time_rounds(play_round, job), version=version("fedlab"))


if __name__ == "__main__":
    main(sys.argv[1])
