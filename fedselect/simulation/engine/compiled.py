"""The compiled chain path (``Engine(..., path="compiled")``, opt-in, not the default): the chain path with each
local step one graph.

The schedule, the update rule outside the graph and the order of dropout draws are the chain path's
(:class:`~.chain_path.ChainPath`). One local SGD step of the active clients (gather of their minibatch,
forward pass, the cross-entropy's gradient, the hand-written backward of :func:`~.chain.chain_backward`, weight
decay and the SGD update in place) is one ``torch.compile`` graph (inductor), compiled with dynamic sizes so
the shrinking number of active clients k, the number of clients and the minibatch width do not recompile it (a
size of 1 is specialised by torch, so k = 1 compiles once more).

Dropout masks are drawn outside the graph from each run's own generator (``torch.rand(...) < 1 - p``: a
quarter of the cost of ``bernoulli_`` on the CPU) and are applied and scaled inside it. Float rounding
(inductor's fused kernels) and the dropout stream differ from the eager path's, which stays the bit-stable
reference and the default; the same call on the same machine gives the same bits.

Static steps (the default on CUDA): every step trains all N rows, a finished client's row with a zero step
size and an all-zero minibatch mask (a zero gradient, so its parameters stay bit for bit), so every step
has the same shapes. The graph is then compiled for fixed sizes, returns the updated parameters instead of
writing its inputs, and on CUDA runs as a CUDA graph (``mode="reduce-overhead"``): one replay per step
instead of one launch per kernel. On the CPU the dynamic step is faster (it skips finished rows); the
static one can be asked for there (``Engine(..., static_steps=True)``) and is tested against it.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from .base import Workspace
from .chain import LinearChain, chain_backward
from .chain_path import ChainPath, ChainRun
from .losses import is_cross_entropy, resolve_loss

__all__ = [
    "PATHS",
    "CompiledChainPath",
    "CompiledChainStep",
    "compile_unusable",
    "compiled_path_refusal",
    "dropout_keep",
]

PATHS = ("eager", "compiled")


@functools.cache
def compile_unusable() -> str | None:
    """Why ``torch.compile`` (inductor) cannot run on this machine, or None when a tiny function compiles."""
    try:
        fn = torch.compile(lambda t: torch.relu(t) * 2 + 1, dynamic=True, fullgraph=True)
        out = fn(torch.arange(-2.0, 3.0))
    except Exception as exc:  # any failure of the toolchain (no C++ compiler, missing headers, ...)
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    if not torch.equal(out, torch.tensor([1.0, 1.0, 1.0, 3.0, 5.0])):
        return "torch.compile gave wrong numbers on a probe"
    return None


def dropout_keep(
    n: int, b: int, step: int, layer: int, p: float, width: int, *, device: Any = None, generator: Any = None
) -> torch.Tensor:
    """Which of an ``(n, b, width)`` activation's entries dropout keeps (bool): ``uniform < 1 - p``, drawn from
    ``generator`` (default: the device's default generator); the compiled path's
    :func:`~.chain.global_dropout_masks`."""
    return torch.rand((n, b, width), device=device, generator=generator) < (1 - p)


def _chain_step(
    plan: tuple[tuple[str, Any], ...],
    params: Sequence[torch.Tensor],
    X: torch.Tensor,
    y: torch.Tensor,
    ix: torch.Tensor,
    mask: torch.Tensor,
    denom: torch.Tensor,
    keep: Sequence[torch.Tensor | None],
    rows: torch.Tensor,
    factor: torch.Tensor,
    weight_decay: float,
    update: bool,
    want_losses: bool,
    functional: bool = False,
) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """One step of the first k clients: their gradients (when ``update`` is False) and per-sample losses.

    ``plan`` is :attr:`LinearChain.positional <.chain.LinearChain.positional>`, the backward
    :func:`~.chain.chain_backward`; ``params`` are every client's parameters in the plan's order ((N, out, in)
    weights, (N, 1, out) biases); the first k = ``mask.shape[0]`` rows train. ``keep[i]`` is the i-th dropout
    layer's (N, B, width) kept entries (None: p is 0 or 1), restricted to ``rows``. With ``update`` the step's
    ``w -= factor * (g + wd w)`` is applied to the first k rows in place, or, with ``functional``, returned as
    new tensors (the static step's form: a CUDA graph does not write its inputs).
    """
    k, B = mask.shape
    x = X[ix].reshape(k, B, -1)
    weights = mask / denom.unsqueeze(1)
    active = [p[:k] for p in params]
    drops = [arg for kind, arg in plan if kind == "dropout"]

    def dropout(i: int, h: torch.Tensor) -> torch.Tensor | None:
        p = drops[i]
        if p == 0.0:
            return None  # F.dropout returns its input
        if p >= 1.0:
            return torch.zeros_like(h)
        return keep[i][rows].to(h.dtype) * (1.0 / (1.0 - p))

    # each weight's gradient laid out as the weight: a contiguous update
    out, losses = chain_backward(plan, active, x, dropout, y[ix], weights, want_losses=want_losses, contiguous=True)
    if not update:
        return out, losses
    new: list[torch.Tensor] = []
    for cur, grad in zip(active, out):
        if weight_decay:
            grad = grad + cur * weight_decay
        if functional:
            new.append(cur - grad * factor)
        else:
            cur.sub_(grad * factor)
    return new, losses


class CompiledChainStep:
    """The chain step of one chain: :func:`_chain_step` compiled, its plan fixed.

    ``static=False``: compiled with dynamic sizes (the number of active clients k shrinks within a round).
    ``static=True``: compiled for the sizes it is called with (every step of a round has the same), and with
    ``cuda_graphs`` run as a CUDA graph (``mode="reduce-overhead"``).

    Dynamo keeps at most ``recompile_limit`` (8) graphs per code object (with ``fullgraph=True`` the ninth
    raises ``FailOnRecompileLimitHit``), and a process may build engines of many chains; each chain therefore
    compiles its own copy of the function's code (:meth:`for_plan` shares it between the engines of one chain
    and kind of step), so only its own flag combinations (fused update, sample losses: four) and size-1
    specialisations count against the limit. A static step is compiled for fixed sizes, and a process meets
    many (clients per round, runs batched together, minibatch width, data size): each set of sizes and flags
    gets a code object of its own, so none of them reaches the limit.
    """

    def __init__(self, plan: tuple[tuple[str, Any], ...], *, static: bool = False, cuda_graphs: bool = False) -> None:
        if cuda_graphs and not static:
            raise ValueError("CUDA graphs need static steps (every step of a round the same shapes)")
        self.plan = plan
        self.static = static
        self.cuda_graphs = cuda_graphs
        self._static_fns: dict[tuple[Any, ...], Callable[..., Any]] = {}
        if not static:
            self.fn = torch.compile(_own_copy(), dynamic=True, fullgraph=True)

    @classmethod
    def for_plan(
        cls, plan: Sequence[tuple[str, Any]], *, static: bool = False, cuda_graphs: bool = False
    ) -> CompiledChainStep:
        """The compiled step of a chain (:attr:`LinearChain.positional <.chain.LinearChain.positional>`: a linear
        layer as the positions of its parameters, dropout by its p), built once per process and kind of step."""
        key = tuple(plan)
        if (key, static, cuda_graphs) not in _STEPS:
            _STEPS[key, static, cuda_graphs] = cls(key, static=static, cuda_graphs=cuda_graphs)
        return _STEPS[key, static, cuda_graphs]

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        if self.static:
            if self.cuda_graphs:
                # a CUDA graph's outputs live in its memory pool and the next replay overwrites them: the caller
                # has used the last step's (copied the parameters, added the losses) before it asks for a step
                torch.compiler.cudagraph_mark_step_begin()
            # the sizes and flags its graph is specialised on (the rest follows from them and the plan): the data,
            # the (N, B) minibatch mask, the weight decay and the flags
            X, mask = args[1], args[4]
            key = (X.shape, X.device, mask.shape, args[9:], tuple(kwargs.items()))
            fn = self._static_fns.get(key)
            if fn is None:
                mode = "reduce-overhead" if self.cuda_graphs else None
                fn = torch.compile(_own_copy(), dynamic=False, fullgraph=True, mode=mode)
                self._static_fns[key] = fn
            return fn(self.plan, *args, **kwargs)
        # no duck sizing: two sizes equal at the first call (k = N clients) would be traced as one and the
        # first step with k < N would compile again
        with torch.fx.experimental._config.patch(use_duck_shape=False):
            return self.fn(self.plan, *args, **kwargs)


_STEPS: dict[tuple[tuple[tuple[str, Any], ...], bool, bool], CompiledChainStep] = {}


def _own_copy() -> Callable[..., Any]:
    """:func:`_chain_step` with a code object of its own: its own cache of compiled graphs."""
    code = _chain_step.__code__.replace()
    return types.FunctionType(code, _chain_step.__globals__, _chain_step.__name__, _chain_step.__defaults__)


def _refusal_message(model: nn.Module, loss: Any) -> str:
    return (
        f"path='compiled' compiles the local step of a Flatten/Linear/ReLU/Dropout chain (the built-in "
        f"logistic and mlp) trained with loss='cross-entropy' on class labels; the model "
        f"{type(model).__name__} with loss={loss!r} trains on the eager path only (path='eager')"
    )


def compiled_path_refusal(model: nn.Module, loss: Any = "cross-entropy") -> str | None:
    """Why ``Engine(path="compiled")`` would refuse ``model`` trained with ``loss``, or None when it takes them.

    The same rule the Engine applies when it is built (a Flatten/Linear/ReLU/Dropout chain, the built-in
    cross-entropy), checked without data, so that a comparison can refuse a plan before any run trains; the
    Engine also needs class labels (integer targets), which only the data can tell.
    """
    try:
        by_hand = is_cross_entropy(resolve_loss(loss))
    except ValueError as exc:
        return str(exc)
    names = [n for n, _ in model.named_parameters()]
    if not by_hand or LinearChain.of(model, names, [0] * len(names)) is None:
        return _refusal_message(model, loss)
    return None


class CompiledChainPath(ChainPath):
    """The chain path with each local step one compiled graph (built by :meth:`build`, which checks it can).

    Parameters
    ----------
    work : Workspace
        The training pool on the device and the per-sample loss.
    chain : LinearChain
        The model as a chain.
    static : bool
        Every step trains all N rows (a finished client with a zero step size and an empty minibatch), so
        every step has the same shapes: compiled for them and, with ``cuda_graphs``, replayed as a CUDA graph.
        False: each step trains only the clients with steps left (dynamic shapes).
    cuda_graphs : bool
        Run a static step as a CUDA graph.

    Attributes
    ----------
    compiled_step : CompiledChainStep
        The compiled step, shared by the engines of one chain and kind of step.
    """

    name = "compiled-chain"
    mask_dtype = torch.bool

    def __init__(self, work: Workspace, chain: LinearChain, *, static: bool, cuda_graphs: bool) -> None:
        super().__init__(work, chain, by_hand=True)
        self.compiled_step = CompiledChainStep.for_plan(chain.positional, static=static, cuda_graphs=cuda_graphs)
        if cuda_graphs:
            # the training data stays where it is for the engine's life: a CUDA graph reads it in place instead of
            # copying it into the graph's own memory before every replay (another engine's data re-records)
            torch._dynamo.mark_static_address(work.X, guard=False)
            torch._dynamo.mark_static_address(work.y, guard=False)

    @classmethod
    def build(
        cls, work: Workspace, chain: LinearChain | None, *, model: nn.Module, loss: Any, by_hand: bool, static: bool
    ) -> CompiledChainPath:
        """The compiled path of ``model`` (``chain``, None when it is not one) trained with ``loss``, or a ValueError
        saying why not: not a chain, not the built-in cross-entropy on class labels (``by_hand``), or no working
        ``torch.compile`` here."""
        why = compiled_path_refusal(model, loss)  # the rule a comparison checks before any run
        if why is None and not by_hand:  # what only the data tells: class labels
            why = _refusal_message(model, loss)
        if why is not None:
            raise ValueError(why)
        assert chain is not None
        why = compile_unusable()
        if why is not None:
            raise ValueError(f"path='compiled' needs torch.compile (inductor), which fails here: {why}")
        return cls(work, chain, static=static, cuda_graphs=static and work.device.type == "cuda")

    def key(self) -> tuple[Any, ...]:
        """The path, the chain's plan and whether its steps are static."""
        return (*super().key(), self.compiled_step.static)

    def draw_masks(
        self, n: int, b: int, step: int, layer: int, p: float, width: int, *, device: Any, generator: Any
    ) -> torch.Tensor:
        """The kept entries of one layer's mask (:func:`dropout_keep`)."""
        return dropout_keep(n, b, step, layer, p, width, device=device, generator=generator)

    def rows(self, k: int, n: int) -> int:
        """A static step computes every row (a finished client's with an all-zero mask and a zero step size)."""
        return n if self.compiled_step.static else k

    def step(
        self, run: ChainRun, step: int, k: int, factor: torch.Tensor
    ) -> tuple[list[torch.Tensor] | None, torch.Tensor | None]:
        """One compiled step of the first k rows. Plain SGD with weight decay is updated inside the graph (None
        for the gradients); FedProx's term and momentum are applied by ``run.update`` outside it."""
        params, sched, masks, update = run.params, run.sched, run.masks, run.update
        keep = [masks(step, i, p, w) if 0.0 < p < 1.0 else None for i, (p, w) in enumerate(self.chain.dropout)]
        fused, static = update.plain, self.compiled_step.static
        # the step's slices as tensors of their own (a view's base and offset would be guarded on: recompiles)
        grads, losses = self.compiled_step(
            params, self.work.X, self.work.y, sched.idx_t[step, :k].flatten().clone(), sched.mask_t[step, :k].clone(),
            sched.denom[step, :k].clone(), keep, sched.order_t[:k].clone(), factor, float(update.weight_decay), fused,
            run.want_losses, static,
        )  # fmt: skip
        if not fused:
            return grads, losses
        if static:  # the graph returned the updated parameters (a CUDA graph does not write its inputs)
            with torch.no_grad():
                for cur, updated in zip(params, grads):
                    cur.copy_(updated)
        return None, losses
