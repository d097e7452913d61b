"""The vmapped paths: any model's local SGD by ``torch.func.vmap`` of its forward pass.

Only the forward pass is vmapped; one ordinary backward over the sum of the clients' losses gives each client
exactly its own gradient (the clients share no parameters). Measured 14-25 % faster per step than
``vmap(grad(...))`` on FedCor's MLP (benchmarks/speed/bench_engine.py). Dropout inside the forward pass draws
from the device's default generator. A stateless model pads every client to the step's longest minibatch
(:class:`PaddedPath`); a model with batch statistics cannot be padded (a padded sample would enter batch
norm's batch mean and variance), so its clients are grouped by minibatch length (:class:`GroupedPath`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from .base import LocalPath, LocalRound, Workspace

__all__ = ["GroupedPath", "PaddedPath", "VmapPath"]

Objective = Callable[[int, torch.Tensor], torch.Tensor]


class VmapPath(LocalPath):
    """Local SGD whose step objective (the sum over clients of their mean minibatch loss) a subclass writes.

    Parameters
    ----------
    work : Workspace
        The training pool on the device and the per-sample loss.
    forward : callable
        The vmapped forward pass of every client at once (:class:`PaddedPath`: ``forward(params, x)``;
        :class:`GroupedPath`: ``forward(params, buffers, x)``, updating the stacked buffers).
    """

    def __init__(self, work: Workspace, forward: Callable[..., torch.Tensor]) -> None:
        self.work = work
        self.forward = forward

    def objective(self, rnd: LocalRound, idx_t: torch.Tensor, mask_t: torch.Tensor) -> Objective:
        """Step ``s``'s objective at parameters ``p``: ``objective(s, p)`` (``idx_t``, ``mask_t``: the round's
        indices and masks on the device)."""
        raise NotImplementedError

    def sgd(self, rnd: LocalRound) -> torch.Tensor:
        """Local SGD of the round's N clients, each step one autograd gradient of :meth:`objective` (``rnd.masks``
        is unused: dropout draws inside the forward pass)."""
        dev = self.work.device
        idx_t = torch.from_numpy(rnd.idx).to(dev)
        mask_t = torch.from_numpy(rnd.mask).to(dev)
        active = torch.from_numpy((rnd.mask.sum(axis=2) > 0).astype(np.float32)).to(dev)  # (S, N)
        lr_rows = rnd.lr_rows.to(dev)
        objective = self.objective(rnd, idx_t, mask_t)
        start, weight_decay, prox_mu, momentum = rnd.start, rnd.weight_decay, rnd.prox_mu, rnd.momentum
        params = start.clone()
        velocity: torch.Tensor | None = None
        for step in range(rnd.idx.shape[0]):
            p = params.requires_grad_(True)
            (g,) = torch.autograd.grad(objective(step, p), p)
            with torch.no_grad():
                if weight_decay:
                    g = g + weight_decay * params
                if prox_mu:
                    g = g + prox_mu * (params - start)
                if momentum:
                    velocity = g if velocity is None else momentum * velocity + g
                    g = g + momentum * velocity if rnd.nesterov else velocity
                params = params.detach() - lr_rows * active[step].unsqueeze(1) * g
        return params.detach()


class PaddedPath(VmapPath):
    """A stateless model: one vmapped forward of every client per step, padded samples weighted 0 in their
    client's mean loss."""

    name = "padded"

    def objective(self, rnd: LocalRound, idx_t: torch.Tensor, mask_t: torch.Tensor) -> Objective:
        """Step ``s``'s objective at ``p``; adds each client's squared per-sample losses to ``rnd.sq`` when given."""
        work, sq = self.work, rnd.sq
        N, B = rnd.mask.shape[1], rnd.mask.shape[2]
        denom = mask_t.sum(2).clamp_min(1.0)  # (S, N): each client's mean over its real samples
        mask_acc = None if sq is None else mask_t.to(work.acc)

        def objective(s: int, p: torch.Tensor) -> torch.Tensor:
            ix = idx_t[s]
            out = self.forward(p, work.X[ix])  # (N, B, outputs)
            losses = work.losses(out.flatten(0, 1), work.y[ix].flatten(0, 1)).view(N, B)
            if sq is not None:
                assert mask_acc is not None
                sq.add_((work.f64(losses.detach()).square() * mask_acc[s]).sum(1))
            return ((losses * mask_t[s]).sum(1) / denom[s]).sum()

        return objective


class GroupedPath(VmapPath):
    """A model with batch statistics: per step, one vmapped forward per minibatch length, so a padded sample never
    enters a batch statistic; every client carries its own buffers (``bufs``, updated in place), and a client
    with no step left runs no forward pass, so its buffers do not move either."""

    name = "grouped"

    def objective(self, rnd: LocalRound, idx_t: torch.Tensor, mask_t: torch.Tensor) -> Objective:
        """Step ``s``'s objective at ``p`` (:meth:`grouped_objective` of the step's :meth:`length_groups`)."""
        groups = self.length_groups(rnd.mask.sum(axis=2).astype(np.int64))
        return lambda s, p: self.grouped_objective(p, rnd.bufs, idx_t[s], groups[s], sq=rnd.sq)

    def length_groups(self, lengths: np.ndarray) -> list[list[tuple[int, torch.Tensor, torch.Tensor]]]:
        """Per local step, the clients grouped by minibatch length: ``(length, rows, rows_acc)`` with the rows
        on the device (and where float64 sums are taken), all moved there in one copy before the first step."""
        plan = [[(int(b), np.flatnonzero(row == b)) for b in np.unique(row[row > 0])] for row in lengths]
        flat = [rows for step in plan for _, rows in step]
        if not flat:
            return [[] for _ in plan]
        allrows = torch.from_numpy(np.concatenate(flat)).to(self.work.device)
        acc = allrows if self.work.acc == self.work.device else allrows.to(self.work.acc)
        sizes = [rows.size for rows in flat]
        on_dev, on_acc = iter(allrows.split(sizes)), iter(acc.split(sizes))
        return [[(b, next(on_dev), next(on_acc)) for b, _ in step] for step in plan]

    def grouped_objective(
        self,
        p: torch.Tensor,
        bufs: dict[str, torch.Tensor],
        ix: torch.Tensor,
        groups: Sequence[tuple[int, torch.Tensor, torch.Tensor]],
        sq: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Sum over clients of their mean minibatch loss, one vmapped forward per minibatch length.

        ``groups`` is one step's :meth:`length_groups`. Updates ``bufs`` (stacked per client) in place with each
        group's new buffers; adds each client's squared per-sample losses to ``sq`` when given.
        """
        work = self.work
        total = p.new_zeros(())
        for b, g, g_acc in groups:
            sub = {k: v[g] for k, v in bufs.items()}  # copies: the forward updates them in place
            xi = ix[g, :b]
            out = self.forward(p[g], sub, work.X[xi])
            losses = work.losses(out.flatten(0, 1), work.y[xi].flatten(0, 1)).view(g.shape[0], b)
            total = total + losses.mean(1).sum()
            if sq is not None:
                sq[g_acc] += work.f64(losses.detach()).square().sum(1)
            for k, v in sub.items():
                bufs[k][g] = v
        return total
