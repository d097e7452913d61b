"""The interface of the engine's computing paths (:class:`LocalPath`) and what they compute on (:class:`Workspace`).

One :class:`LocalPath` per way of computing local SGD, chosen once by :func:`~.paths.choose_path`.

The engine (:class:`~fedselect.simulation.engine.Engine`) lays the round out (every client's minibatch
indices and masks, its step size, its starting parameters and buffers) and hands it to its path's
:meth:`LocalPath.sgd`, without knowing which path it holds:

- :class:`~.chain_path.ChainPath`: a Flatten/Linear/ReLU/Dropout chain by batched products, its backward
  by hand for the built-in cross-entropy (else autograd); finished clients stop computing;
- :class:`~.compiled.CompiledChainPath`: the same chain, each local step one ``torch.compile`` graph
  (``path="compiled"``, opt-in);
- :class:`~.vmap.PaddedPath`: any stateless model, ``torch.func.vmap`` of its forward, every client padded to
  the step's longest minibatch;
- :class:`~.vmap.GroupedPath`: a model with batch statistics, vmapped per minibatch length, every client
  carrying its own buffers;
- :class:`~.per_client.PerClientPath`: a stateless model with a convolution on the CPU, one client after
  another (faster there than vmap's grouped convolution).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .chain import global_dropout_masks

__all__ = ["LocalPath", "LocalRound", "Workspace"]


@dataclass(frozen=True)
class Workspace:
    """What every path computes on: the training pool on the engine's device and the per-sample loss.

    Attributes
    ----------
    X, y : Tensor
        The training pool (on ``device``) that minibatch indices point into.
    device : torch.device
        Where the training runs.
    acc : torch.device
        Where float64 sums are taken (the device, or the CPU for MPS, which has no float64).
    losses : callable
        ``losses(outputs, targets)``: the per-sample losses (a user's loss checked).
    """

    X: torch.Tensor
    y: torch.Tensor
    device: torch.device
    acc: torch.device
    losses: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

    def f64(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` in float64 for a sum, where sums are taken."""
        return t.to(self.acc, torch.float64)


@dataclass(frozen=True)
class LocalRound:
    """One training call's local SGD of N clients, laid out for a path (:meth:`LocalPath.sgd`).

    Attributes
    ----------
    start : Tensor, shape (N, D)
        Each client's starting parameters (its run's global model), on the device.
    idx, mask : ndarray, shape (S, N, B)
        Each client's minibatch indices at each step and 1 for a real sample, 0 for padding.
    lr_rows : Tensor, shape (N, 1)
        Each client's float32 step size.
    masks : callable
        ``masks(step, layer, p, width)``: the ``(N, B, width)`` dropout mask of a chain's layer, drawn from each
        run's generator (:meth:`LocalPath.draw_masks`); a vmapped model draws inside its forward instead.
    bufs : dict of str to Tensor
        Each client's buffers, stacked ``(N, ...)``, updated in place (empty for a stateless model).
    weight_decay, prox_mu, momentum, nesterov : float, float, float, bool
        The update rule of :meth:`Engine.train <fedselect.simulation.engine.Engine.train>`.
    sq : Tensor, shape (N,), optional
        Receives each client's sum of squared per-sample losses over its steps.
    """

    start: torch.Tensor
    idx: np.ndarray
    mask: np.ndarray
    lr_rows: torch.Tensor
    masks: Callable[[int, int, float, int], torch.Tensor]
    bufs: dict[str, torch.Tensor]
    weight_decay: float = 0.0
    prox_mu: float = 0.0
    momentum: float = 0.0
    nesterov: bool = False
    sq: torch.Tensor | None = None


class LocalPath:
    """One way to compute N clients' local SGD: the interface the engine calls.

    Attributes
    ----------
    name : str
        ``"chain"``, ``"compiled-chain"``, ``"padded"``, ``"grouped"`` or ``"per-client"``.
    mask_dtype : torch.dtype
        What :meth:`draw_masks` returns: scaled float masks, or kept entries (bool) on the compiled path.
    """

    name = "?"
    mask_dtype = torch.float32
    #: Whether a run records this path in its settings and checkpoint: a path added after runs of the same models
    #: were recorded on another one, whose bits it does not give (``history_.config["local_path"]``).
    recorded = False

    def draw_masks(
        self, n: int, b: int, step: int, layer: int, p: float, width: int, *, device: Any, generator: Any
    ) -> torch.Tensor:
        """The ``(n, b, width)`` dropout mask of one layer at one step (:func:`~.chain.global_dropout_masks`)."""
        return global_dropout_masks(n, b, step, layer, p, width, device=device, generator=generator)

    def key(self) -> tuple[Any, ...]:
        """What two engines' paths must share to train in one batched call."""
        return (self.name,)

    def sgd(self, rnd: LocalRound) -> torch.Tensor:
        """Local SGD of the round's N clients from ``rnd.start`` (N, D); their parameters afterwards (N, D)."""
        raise NotImplementedError
