"""Whether the batched engine can train a model with a loss, found out before any training (:class:`Admission`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

__all__ = ["Admission"]


class Admission:
    """The checks an :class:`~fedselect.simulation.engine.Engine` runs on its model and loss when it is built,
    and the messages that say what to change.

    Parameters
    ----------
    model : torch.nn.Module
        The model.
    loss : str or callable
        The loss as the user gave it (for the messages).
    """

    def __init__(self, model: nn.Module, loss: Any) -> None:
        self.model = model
        self.loss = loss

    def refuse_layers(self) -> None:
        """Refuse, with what to do instead, layers the batched engine cannot train: uninitialised lazy modules,
        ``SyncBatchNorm``, batch norm with ``momentum=None``."""
        from torch.nn.modules.lazy import LazyModuleMixin

        for name, m in self.model.named_modules():
            where = f"layer {name!r} ({type(m).__name__})" if name else type(m).__name__
            if isinstance(m, LazyModuleMixin) and m.has_uninitialized_params():
                raise ValueError(
                    f"the model's {where} is a lazy module whose parameters are not initialised yet; run one forward "
                    "pass on a batch of inputs (model(torch.zeros(2, *input_shape))) before passing the model"
                )
            if isinstance(m, nn.SyncBatchNorm):
                raise ValueError(
                    f"the model's {where} needs a distributed process group; use nn.BatchNorm1d/2d/3d instead "
                    "(each simulated client keeps its own running statistics)"
                )
            if isinstance(m, _NormBase) and m.track_running_stats and m.momentum is None:
                raise ValueError(
                    f"the model's {where} has momentum=None (a cumulative moving average, whose factor "
                    "1/num_batches_tracked torch computes in Python from a per-client counter, which vmap cannot "
                    "batch); give it a float momentum, e.g. momentum=0.1 (torch's default), or "
                    "track_running_stats=False"
                )

    def probe(
        self,
        X: torch.Tensor,
        y: torch.Tensor,
        flat: torch.Tensor,
        buffers: dict[str, torch.Tensor],
        *,
        stateful: bool,
        forward: Callable[..., torch.Tensor],
        forward_all: Callable[..., torch.Tensor],
        forward_state_all: Callable[..., torch.Tensor],
        losses: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> int:
        """Run one tiny batched training step and one evaluation now, so a model or loss the engine cannot run
        fails before any training, with a message saying what to do; the smallest minibatch the model trains on.

        ``X``, ``y``: the training pool; ``flat``, ``buffers``: the initial parameters and buffers on the device;
        ``forward(flat, x)`` one model's evaluation forward, ``forward_all`` / ``forward_state_all`` the batched
        training forwards (:class:`~fedselect.simulation.engine.Engine`), ``losses`` the per-sample loss.
        """
        n = min(2, X.shape[0])
        x, y = X[:n], y[:n]
        min_batch_size = 1
        was_training = self.model.training
        gpus = [flat.device.index] if flat.device.type == "cuda" else []
        with torch.random.fork_rng(devices=gpus):  # the probe draws no number the run would see
            try:
                p = flat.repeat(2, 1).requires_grad_(True)
                self.model.train()
                try:
                    if stateful:
                        bufs = {k: v.unsqueeze(0).repeat(2, *([1] * v.dim())) for k, v in buffers.items()}
                        out = forward_state_all(p, bufs, x.expand(2, *x.shape))
                    else:
                        out = forward_all(p, x.expand(2, *x.shape))
                    self.model.eval()
                    out_eval = forward(flat, x)
                except (RuntimeError, TypeError, ValueError, NotImplementedError, IndexError) as exc:
                    raise ValueError(self.unsupported(exc)) from exc
                try:
                    losses(out.flatten(0, 1), y.expand(2, *y.shape).flatten(0, 1)).sum().backward()
                    losses(out_eval, y)
                except ValueError as exc:
                    if "loss=" in str(exc):
                        raise
                    raise ValueError(self.loss_failed(out_eval, y, exc)) from exc
                except (RuntimeError, TypeError, IndexError) as exc:
                    raise ValueError(self.loss_failed(out_eval, y, exc)) from exc
            finally:
                self.model.train(was_training)
            if stateful:
                self.model.train()
                try:
                    bufs = {k: v.unsqueeze(0).clone() for k, v in buffers.items()}
                    forward_state_all(flat.unsqueeze(0), bufs, x[:1].unsqueeze(0))
                except ValueError as exc:
                    if "more than 1 value per channel" not in str(exc):
                        raise ValueError(self.unsupported(exc)) from exc
                    min_batch_size = 2
                finally:
                    self.model.train(was_training)
        return min_batch_size

    def loss_failed(self, outputs: torch.Tensor, targets: torch.Tensor, exc: BaseException) -> str:
        """Why the loss failed on the model's ``outputs`` and the ``targets`` (``exc``) and what to check."""
        return (
            f"loss={self.loss!r} failed on the model's outputs (shape {tuple(outputs.shape)}, {outputs.dtype}) and "
            f"the targets (shape {tuple(targets.shape)}, {targets.dtype}): {type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}. A loss is called as "
            "loss(outputs, targets) and returns one differentiable loss per sample; check that the model has as many "
            "outputs as the loss expects (Federation.n_outputs)"
        )

    def unsupported(self, exc: BaseException) -> str:
        """Why the model cannot train in the batched engine (``exc``: what failed) and what a model must be."""
        return (
            f"the model {type(self.model).__name__} cannot be trained by fedselect's batched engine "
            f"({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}). The engine runs the model's forward "
            "pass for all chosen clients at once under torch.func.vmap with torch.func.functional_call, so the "
            "forward must be a function of its parameters, buffers and input: no .item() or float(tensor) on "
            "activations, no data-dependent Python branches, no in-place changes to module attributes other than "
            "buffers. Batch norm is supported (with a float momentum); other stateful layers are not. Check that "
            "the model maps a batch of the federation's inputs (shape (batch, *input_shape)) to outputs the loss "
            "accepts"
        )
