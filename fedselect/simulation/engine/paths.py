"""The factory that chooses an engine's computing path once (:func:`choose_path`), as GPyTorch's exact GP chooses
its prediction strategy: the engine then calls :meth:`LocalPath.sgd <.base.LocalPath.sgd>` without knowing which.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .base import LocalPath, Workspace
from .chain import LinearChain
from .chain_path import ChainPath
from .compiled import CompiledChainPath
from .losses import is_cross_entropy, resolve_loss
from .per_client import PerClientPath, prefers_per_client
from .vmap import GroupedPath, PaddedPath

__all__ = ["choose_path"]


def choose_path(
    work: Workspace,
    model: nn.Module,
    chain: LinearChain | None,
    *,
    loss: Any,
    classification: bool,
    stateful: bool,
    forward_all: Callable[..., torch.Tensor],
    forward_state_all: Callable[..., torch.Tensor],
    forward: Callable[..., torch.Tensor] | None = None,
    compiled: bool = False,
    static: bool = False,
) -> LocalPath:
    """The path an engine trains on, chosen once from the model's shape, the loss, the data and ``path=``.

    A chain (``chain``: ``model`` read as a Flatten/Linear/ReLU/Dropout chain, or None) takes the chain path,
    its backward by hand for the built-in cross-entropy on class labels (``classification``; it saves building
    and walking the graph, about 10 % of a single run's training) and through autograd for any other ``loss``;
    with ``compiled`` it takes the compiled chain path (``static``: every step the same shapes, as a CUDA graph
    on a CUDA device), which refuses what it cannot train with a ValueError saying why. Any other model is
    vmapped (``forward_all``), grouped by minibatch length (``forward_state_all``) when it has batch statistics
    (``stateful``), else padded; except a stateless model with a convolution on the CPU, which trains one client
    after another (``forward``: one client's forward pass), faster there than vmap's grouped convolution
    (:mod:`.per_client`).
    """
    by_hand = is_cross_entropy(resolve_loss(loss)) and classification
    if compiled:
        return CompiledChainPath.build(work, chain, model=model, loss=loss, by_hand=by_hand, static=static)
    if chain is not None:
        return ChainPath(work, chain, by_hand=by_hand)
    if stateful:
        return GroupedPath(work, forward_state_all)
    if forward is not None and prefers_per_client(model, work.device, stateful):
        return PerClientPath(work, forward)
    return PaddedPath(work, forward_all)
