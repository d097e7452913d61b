"""The per-client path: a stateless model's local SGD one client after another, each step its own forward and backward.

Where it is chosen (:func:`~.paths.choose_path`): a stateless model with a convolution, on the CPU. Under
``torch.func.vmap`` a convolution whose weights differ per client becomes one grouped convolution, which the
CPU's kernels compute more slowly than the clients' own convolutions one after another (FedCor's CIFAR CNN,
10 clients x 12 steps of 50: about 1.6x; ``benchmarks/speed/bench_peers.md``). Matrix products keep the batched
paths: there one product over every client is faster than a loop (the chain path, and vmap for other models).
The two compute the same SGD with other float rounding, so the run records the path it took (``local_path``
in its settings); like the device, which it follows, it is not part of a checkpoint's identity.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .base import LocalPath, LocalRound, Workspace

__all__ = ["PerClientPath", "prefers_per_client"]


def prefers_per_client(model: torch.nn.Module, device: torch.device, stateful: bool) -> bool:
    """Whether the per-client loop is the faster path: a stateless model with a convolution, on the CPU."""
    has_conv = any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())
    return device.type == "cpu" and has_conv and not stateful


class PerClientPath(LocalPath):
    """Local SGD of each client in turn: per step, the mean loss of its real samples (no padding), one backward.

    Parameters
    ----------
    work : Workspace
        The training pool on the device and the per-sample loss.
    forward : callable
        One client's forward pass, ``forward(flat_params, x)``.
    """

    name = "per-client"
    recorded = True  # FedCor's CNN and other convolutional models trained vmapped (padded) before it

    def __init__(self, work: Workspace, forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        self.work = work
        self.forward = forward

    def sgd(self, rnd: LocalRound) -> torch.Tensor:
        """Each client's steps (those with samples: a client's steps are the first of the round's), with the update
        rule of :meth:`Engine.train <fedselect.simulation.engine.Engine.train>`; dropout draws in the forward."""
        work = self.work
        idx_t = torch.from_numpy(rnd.idx).to(work.device)
        lengths = rnd.mask.sum(axis=2).astype("int64")  # (S, N): real samples come first in each row
        lr_rows = rnd.lr_rows.to(work.device)
        out = torch.empty_like(rnd.start)
        for n in range(rnd.start.shape[0]):
            start = rnd.start[n]
            params = start.clone()
            velocity: torch.Tensor | None = None
            for step in range(rnd.idx.shape[0]):
                b = int(lengths[step, n])
                if b == 0:
                    continue
                ix = idx_t[step, n, :b]
                p = params.requires_grad_(True)
                losses = work.losses(self.forward(p, work.X[ix]), work.y[ix])
                if rnd.sq is not None:
                    rnd.sq[n] += work.f64(losses.detach()).square().sum()
                (g,) = torch.autograd.grad(losses.mean(), p)
                with torch.no_grad():
                    if rnd.weight_decay:
                        g = g + rnd.weight_decay * params
                    if rnd.prox_mu:
                        g = g + rnd.prox_mu * (params - start)
                    if rnd.momentum:
                        velocity = g if velocity is None else rnd.momentum * velocity + g
                        g = g + rnd.momentum * velocity if rnd.nesterov else velocity
                    params = params.detach() - lr_rows[n] * g
            out[n] = params.detach()
        return out
