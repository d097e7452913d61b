"""The compute bound of a ``bench_peers`` job: its SGD steps as plain torch in a tight loop.

Each round draws ``clients_per_round`` clients; each trains from the global weights for
``epochs`` passes over its samples in minibatches of ``batch_size`` (the last one partial), with
``torch.autograd.grad`` and an in-place ``p -= lr * g``, on tensors gathered per client before the
first round and never shuffled (the least any framework can do: no data loader, no per-round
gather, no copies beyond one model per client); the round ends with the mean of the clients'
weights. Run as ``python run_bound.py JOB.json``.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from _common import build_model, emit, load_job, time_rounds


def main(path: str) -> None:
    job, X, y, parts = load_job(path)
    torch.manual_seed(int(job["seed"]))
    model = build_model(job)
    params = list(model.parameters())
    global_w = [p.detach().clone() for p in params]
    data = [(X[torch.from_numpy(idx)].contiguous(), y[torch.from_numpy(idx)].contiguous()) for idx in parts]
    lr, batch, epochs = float(job["lr"]), int(job["batch_size"]), int(job["epochs"])
    gen = torch.Generator().manual_seed(int(job["seed"]))

    def play_round(t: int) -> None:
        chosen = torch.randperm(len(data), generator=gen)[: int(job["clients_per_round"])].tolist()
        total = [torch.zeros_like(w) for w in global_w]
        for k in chosen:
            Xk, yk = data[k]
            with torch.no_grad():
                for p, w in zip(params, global_w):
                    p.copy_(w)
            for _ in range(epochs):
                for s in range(0, len(yk), batch):
                    loss = F.cross_entropy(model(Xk[s : s + batch]), yk[s : s + batch])
                    grads = torch.autograd.grad(loss, params)
                    with torch.no_grad():
                        for p, g in zip(params, grads):
                            p.sub_(g, alpha=lr)
            with torch.no_grad():
                for acc, p in zip(total, params):
                    acc.add_(p)
        with torch.no_grad():
            for w, acc in zip(global_w, total):
                w.copy_(acc / len(chosen))

    emit("bound", time_rounds(play_round, job))


if __name__ == "__main__":
    main(sys.argv[1])
