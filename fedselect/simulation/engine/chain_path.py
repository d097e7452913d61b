"""The chain path: local SGD of a Flatten/Linear/ReLU/Dropout chain by batched products, finished clients idle.

Clients are ordered by their number of local steps, longest first, so the clients active at step s are the
first k_s rows and a finished client costs nothing (:class:`ChainSchedule`). Every client's numbers are those
of the padded computation (its rows of each batched product, its own loss and gradient, its update; a
finished client never moves there either), and the dropout masks are drawn for all N clients at every step,
as the padded computation draws them, then restricted to the active rows (bit for bit where each client's block
of every product is 16-byte aligned, batch x width a multiple of 4 floats; elsewhere MKL rounds a block by its
address, so the new order can change a client's last bits: ``docs/devices.rst``). With the built-in cross-entropy
the gradients come from the chain's backward written out (:func:`~.chain.chain_backward`, autograd's bits),
else from autograd.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .base import LocalPath, LocalRound, Workspace
from .chain import LinearChain, Noise, chain_backward, same_bits_contiguous

__all__ = ["ChainPath", "ChainRun", "ChainSchedule", "ChainUpdate"]


@dataclass(frozen=True)
class ChainSchedule:
    """A round's clients ordered by their number of local steps, longest first, and its minibatches in that
    order, on the device once, before the first step (:meth:`ChainPath.schedule`).

    Attributes
    ----------
    identity : bool
        The order is the given one.
    sorted_steps : ndarray, shape (N,)
        Each client's number of steps, in order.
    order_t : Tensor, shape (N,)
        The order, on the device.
    idx_t, mask_t : Tensor, shape (S, N, B)
        The minibatch indices and masks (1 for a real sample, 0 for padding), in order.
    active : Tensor, shape (S, N)
        1 while the client has a step.
    denom : Tensor, shape (S, N)
        Real samples per step, at least 1.
    """

    identity: bool
    sorted_steps: np.ndarray
    order_t: torch.Tensor
    idx_t: torch.Tensor
    mask_t: torch.Tensor
    active: torch.Tensor
    denom: torch.Tensor

    def active_rows(self, step: int) -> int:
        """How many clients (a prefix of the order) still train at ``step``."""
        return int((self.sorted_steps > step).sum())


class ChainUpdate:
    """The local update rule applied in place to a chain's parameters, with its state for one round.

    With g the gradient of a client's mean minibatch loss: ``d = g + weight_decay * w + prox_mu * (w - w^t)``;
    with momentum m > 0, ``v = m v + d`` (``v = d`` at the first step) and ``d = v`` (``d + m v`` with
    Nesterov); then ``w = w - factor * d`` (factor: the client's step size, 0 once it has finished). Each
    operation is the one :class:`~.vmap.VmapPath` writes out of place, so the same numbers; the update runs
    into buffers kept across steps (fresh tensors of this size would cost page faults every step).
    """

    def __init__(self, params: Sequence[torch.Tensor], rnd: LocalRound) -> None:
        self.weight_decay = rnd.weight_decay
        self.prox_mu = rnd.prox_mu
        self.momentum = rnd.momentum
        self.nesterov = rnd.nesterov
        self.anchor = [p.clone() for p in params] if rnd.prox_mu else None
        self.tmp = [torch.empty_like(p) for p in params]
        self.velocity: list[torch.Tensor | None] = [None] * len(params)

    @property
    def plain(self) -> bool:
        """Plain SGD with weight decay (no proximal term, no momentum): a compiled step applies it itself."""
        return not (self.prox_mu or self.momentum)

    @torch.no_grad()
    def apply(
        self, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], k: int, factor: torch.Tensor
    ) -> None:
        """``params[i][:k] -= factor * d`` for the first k rows, ``grads[i]`` their gradients (overwritten)."""
        for i, g in enumerate(grads):
            cur, t = params[i][:k], self.tmp[i][:k]
            if self.weight_decay:
                g = g.add_(torch.mul(cur, self.weight_decay, out=t))
            if self.prox_mu:
                assert self.anchor is not None
                g = g.add_(torch.sub(cur, self.anchor[i][:k], out=t).mul_(self.prox_mu))
            if self.momentum:
                v = self.velocity[i]
                if v is None:
                    self.velocity[i] = v = g.clone()
                else:
                    v[:k].mul_(self.momentum).add_(g)
                if self.nesterov:
                    g = g.add_(torch.mul(v[:k], self.momentum, out=t))
                else:
                    cur.sub_(torch.mul(v[:k], factor, out=t))  # the velocity itself must not be scaled
                    continue
            # the gradient is ours to overwrite: scaling it in place spares a pass through another buffer of its size
            cur.sub_(g.mul_(factor))


@dataclass(frozen=True)
class ChainRun:
    """One :meth:`ChainPath.sgd` call's state: the parameters in the chain's order (``(N, out, in)`` and
    ``(N, 1, out)``, updated in place, in the schedule's order), the schedule, the update rule, the dropout masks'
    source, the buffer a step gathers its minibatch into, and whether per-sample losses are wanted."""

    params: list[torch.Tensor]
    sched: ChainSchedule
    update: ChainUpdate
    masks: Callable[[int, int, float, int], torch.Tensor]
    scratch: torch.Tensor
    want_losses: bool


class ChainPath(LocalPath):
    """Local SGD of a linear chain's clients by batched products (``baddbmm``), finished clients idle.

    Parameters
    ----------
    work : Workspace
        The training pool on the device and the per-sample loss.
    chain : LinearChain
        The model as a chain.
    by_hand : bool
        The gradients from the chain's backward written out (the built-in cross-entropy on class labels), or
        from autograd (any other loss).
    """

    name = "chain"

    def __init__(self, work: Workspace, chain: LinearChain, *, by_hand: bool) -> None:
        self.work = work
        self.chain = chain
        self.by_hand = by_hand
        self._layouts: dict[tuple[int, int], tuple[bool, ...]] = {}

    def layouts(self, k: int, batch: int, params: Sequence[torch.Tensor]) -> tuple[bool, ...]:
        """Per linear layer, whether its weight gradient is computed laid out as the weight: where
        :func:`~.chain.same_bits_contiguous` finds that both layouts give the same bits, probed once per ``(k,
        batch)`` on the CPU (elsewhere autograd's layout)."""
        found = self._layouts.get((k, batch))
        if found is None:
            dev = self.work.device
            weights = [params[arg[0]] for kind, arg in self.chain.positional if kind == "linear"]
            found = tuple(
                dev.type == "cpu" and same_bits_contiguous(k, batch, w.shape[2], w.shape[1], dev, w.dtype)
                for w in weights
            )
            self._layouts[(k, batch)] = found
        return found

    def key(self) -> tuple[Any, ...]:
        """The path and the chain's plan."""
        return (self.name, tuple(self.chain.plan))

    def schedule(self, idx: np.ndarray, mask: np.ndarray) -> ChainSchedule:
        """The clients ordered by their number of steps, longest first (the active clients of each step are then a
        prefix), and the round's minibatch indices and masks in that order, on the device."""
        dev = self.work.device
        n_steps = (mask.sum(axis=2) > 0).sum(axis=0)  # (N,): steps are a prefix of each client's round
        order = np.argsort(-n_steps, kind="stable")
        mask_o = np.ascontiguousarray(mask[:, order])
        mask_t = torch.from_numpy(mask_o).to(dev)
        return ChainSchedule(
            identity=bool((order == np.arange(order.size)).all()),
            sorted_steps=n_steps[order],
            order_t=torch.from_numpy(order).to(dev),
            idx_t=torch.from_numpy(np.ascontiguousarray(idx[:, order])).to(dev),
            mask_t=mask_t,
            active=torch.from_numpy((mask_o.sum(axis=2) > 0).astype(np.float32)).to(dev),
            denom=mask_t.sum(2).clamp_min(1.0),
        )

    def sgd(self, rnd: LocalRound) -> torch.Tensor:
        """Local SGD of the round's N clients of the chain; a chain has no buffers (``rnd.bufs`` is empty)."""
        N, work, sq = rnd.start.shape[0], self.work, rnd.sq
        sched = self.schedule(rnd.idx, rnd.mask)
        split = self.chain.split(rnd.start if sched.identity else rnd.start[sched.order_t])
        # Each parameter as its own (N, out, in) or (N, 1, out) tensor: its gradient then arrives as the batched
        # product computes it, where a flat (N, D) leaf would cost two copies of it per step.
        params = [split[n].clone() for n in self.chain.params]
        lr_o = rnd.lr_rows.to(work.device)[sched.order_t].unsqueeze(2)  # (N, 1, 1)
        sq_o = None if sq is None else torch.zeros(N, dtype=torch.float64, device=work.acc)  # in sorted order
        mask_acc = None if sq is None else sched.mask_t.to(work.acc)
        run = ChainRun(
            params,
            sched,
            ChainUpdate(params, rnd),
            rnd.masks,
            scratch=work.X.new_empty((N * rnd.idx.shape[2], *work.X.shape[1:])),
            want_losses=sq_o is not None,
        )
        for step in range(rnd.idx.shape[0]):
            k = sched.active_rows(step)
            if k == 0:
                continue
            k = self.rows(k, N)
            factor = lr_o[:k] * sched.active[step, :k, None, None]  # float32(lr) for the clients still training
            grads, losses = self.step(run, step, k, factor)
            if sq_o is not None:
                assert mask_acc is not None and losses is not None
                sq_o[:k] += (work.f64(losses).square() * mask_acc[step, :k]).sum(1)
            if grads is not None:
                run.update.apply(params, grads, k, factor)
        by_name = dict(zip(self.chain.params, params))
        final = torch.cat([by_name[n].reshape(N, -1) for n in self.chain.names], dim=1)
        if sq is not None and sq_o is not None:
            sq[sched.order_t.to(sq.device)] = sq_o
        if sched.identity:
            return final
        out = torch.empty_like(final)
        out[sched.order_t] = final
        return out

    def rows(self, k: int, n: int) -> int:
        """How many rows a step computes when k of the n clients still train: the k active ones."""
        return k

    def step(
        self, run: ChainRun, step: int, k: int, factor: torch.Tensor
    ) -> tuple[list[torch.Tensor] | None, torch.Tensor | None]:
        """One step of the first k rows (``factor``: their step sizes, 0 once finished): their gradients (None when
        the step has applied its update itself) and their per-sample losses when wanted."""
        params, sched, masks = run.params, run.sched, run.masks
        N, B = params[0].shape[0], sched.idx_t.shape[2]
        rows = sched.order_t[:k]
        drop = self.chain.dropout

        def noise(layer: int, h: torch.Tensor) -> torch.Tensor | None:
            p = drop[layer][0]
            if p == 0.0:
                return None  # F.dropout draws nothing and returns its input
            if p == 1.0:
                return h.new_zeros(())
            full = masks(step, layer, p, h.shape[2])  # (N, B, width), in the clients' given order
            return full if (sched.identity and k == N) else full[rows]

        X, y = self.work.X, self.work.y
        ix = sched.idx_t[step, :k].reshape(-1)
        x = torch.index_select(X, 0, ix, out=run.scratch[: k * B]).view(k, B, *X.shape[1:])
        active = [p[:k] for p in params]
        gradients = self.gradients_by_hand if self.by_hand else self.gradients_autograd
        return gradients(active, x, noise, y[ix], sched.mask_t[step, :k], sched.denom[step, :k], run.want_losses)

    def gradients_by_hand(
        self,
        params: Sequence[torch.Tensor],
        x: torch.Tensor,
        noise: Noise,
        targets: torch.Tensor,
        mask: torch.Tensor,
        denom: torch.Tensor,
        want_losses: bool,
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """One step's gradients (in the chain's order) and per-sample losses by :func:`~.chain.chain_backward`:
        the built-in cross-entropy on class labels. ``mask`` (k, B) and ``denom`` (k,) make each client's mean."""
        k, B = mask.shape
        # d objective / d loss_(c,b) = mask_(c,b) / denom_c, formed as autograd forms it
        weights = torch.ones(k, device=self.work.device).div_(denom).unsqueeze(1).expand(k, B) * mask
        layout = self.layouts(k, B, params)
        with torch.no_grad():
            return chain_backward(
                self.chain.positional, params, x, noise, targets, weights, want_losses=want_losses, contiguous=layout
            )

    def gradients_autograd(
        self,
        params: Sequence[torch.Tensor],
        x: torch.Tensor,
        noise: Noise,
        targets: torch.Tensor,
        mask: torch.Tensor,
        denom: torch.Tensor,
        want_losses: bool,
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """One step's gradients and per-sample losses through autograd: any other loss."""
        k, B = mask.shape
        leaves = {n: v.detach().requires_grad_(True) for n, v in zip(self.chain.params, params)}
        out = self.chain.forward(leaves, x, noise)
        losses = self.work.losses(out.flatten(0, 1), targets).view(k, B)
        objective = ((losses * mask).sum(1) / denom).sum()
        grads = list(torch.autograd.grad(objective, list(leaves.values())))
        # the update scales a gradient in place: an expanded one (a loss whose gradient is a broadcast) is copied
        grads = [g.contiguous() if any(st == 0 and n > 1 for st, n in zip(g.stride(), g.shape)) else g for g in grads]
        return grads, losses.detach()
