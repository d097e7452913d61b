"""The compiled local step of the linear chain: ``Engine(..., path="compiled")`` (opt-in, not the default).

One local SGD step of the active clients (gather of their minibatch, forward pass, the cross-entropy's
gradient, the hand-written backward of :meth:`Engine._chain_grads`, weight decay and the SGD update in
place) is one ``torch.compile`` graph (inductor), compiled with dynamic sizes so the shrinking number of
active clients k, the number of clients and the minibatch width do not recompile it (a size of 1 is
specialised by torch, so k = 1 compiles once more).

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

import numpy as np
import torch

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
    :func:`~fedselect.simulation.engine._global_dropout_masks`."""
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

    ``params`` are every client's parameters in the plan's order ((N, out, in) weights, (N, 1, out) biases);
    the first k = ``mask.shape[0]`` rows train. ``keep[i]`` is the i-th dropout layer's (N, B, width) kept
    entries (None: p is 0 or 1), restricted to ``rows``. With ``update`` the step's ``w -= factor * (g + wd w)`` is
    applied to the first k rows in place, or, with ``functional``, returned as new tensors (the static step's
    form: a CUDA graph does not write its inputs).
    """
    k, B = mask.shape
    x = X[ix].reshape(k, B, -1)
    weights = mask / denom.unsqueeze(1)
    active = [p[:k] for p in params]
    tape: list[tuple[str, Any, torch.Tensor]] = []
    h, j, n_dropout = x, 0, 0
    for kind, arg in plan:
        if kind == "linear":
            wi, bi = j, (j + 1 if arg else None)
            j += 2 if arg else 1
            tape.append(("linear", (wi, bi), h))
            w = active[wi].transpose(1, 2)
            h = torch.bmm(h, w) if bi is None else torch.baddbmm(active[bi], h, w)
        elif kind == "relu":
            h = torch.relu(h)
            tape.append(("relu", None, h))
        else:
            m = keep[n_dropout]
            n_dropout += 1
            if arg == 0.0:
                continue  # F.dropout returns its input
            scaled = torch.zeros_like(h) if arg >= 1.0 else m[rows].to(h.dtype) * (1.0 / (1.0 - arg))
            h = h * scaled
            tape.append(("mask", None, scaled))
    logp = torch.log_softmax(h.flatten(0, 1), 1)
    t = y[ix].reshape(-1, 1)
    losses = logp.gather(1, t).neg().view(k, B) if want_losses else None
    seed = torch.zeros_like(logp).scatter_(1, t, weights.reshape(-1, 1).neg())
    g = torch.ops.aten._log_softmax_backward_data(seed, logp, 1, logp.dtype).view(h.shape)
    first = next(i for i, entry in enumerate(tape) if entry[0] == "linear")
    out: list[Any] = [None] * len(active)
    for i in range(len(tape) - 1, first - 1, -1):
        kind, arg, saved = tape[i]
        if kind == "linear":
            wi, bi = arg
            out[wi] = torch.bmm(g.transpose(1, 2), saved)  # laid out as the weight: a contiguous update
            if bi is not None:
                out[bi] = g.sum(1, keepdim=True)
            if i > first:
                g = torch.bmm(g, active[wi])
        elif kind == "relu":
            g = torch.ops.aten.threshold_backward(g, saved, 0)
        else:
            g = g * saved
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
        """The compiled step of a chain (``Engine._plan``), built once per process and kind of step."""
        # a linear layer is recorded by whether it has a bias; dropout by its p
        key = tuple(
            ("linear", arg[1] is not None) if kind == "linear" else (kind, arg)  # type: ignore[index]
            for kind, arg in plan
        )
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


def sgd_chain(
    engine: Any,
    start: torch.Tensor,
    idx: np.ndarray,
    mask: np.ndarray,
    lr_rows: torch.Tensor,
    masks: Callable[[int, int, float, int], torch.Tensor],
    bufs: dict[str, torch.Tensor],
    *,
    weight_decay: float,
    prox_mu: float,
    momentum: float,
    nesterov: bool,
    sq: torch.Tensor | None = None,
) -> torch.Tensor:
    """:meth:`Engine._sgd_chain` with each step one compiled graph (``engine._compiled_step``).

    The same schedule (clients sorted by their number of steps, the active ones a prefix), the same update
    rule; ``masks(step, layer, p, width)`` gives the (N, B, width) kept entries (:func:`dropout_keep`), drawn
    for every client at every step as on the eager path. Plain SGD with weight decay is updated inside the
    graph; FedProx's term and momentum are applied outside it, as the eager path writes them. A static step
    (``engine._compiled_step.static``) trains all N rows at every step and returns the updated parameters,
    which are copied back before the next step.
    """
    N, dev = start.shape[0], engine.device
    sched = engine._chain_schedule(idx, mask)
    sorted_steps, order_t = sched.sorted_steps, sched.order_t
    idx_t, mask_t, active, denom = sched.idx_t, sched.mask_t, sched.active, sched.denom
    ordered = start[order_t]
    chain_shapes = engine._chain_shapes()
    names, shapes = list(chain_shapes), list(chain_shapes.values())
    flat = dict(zip(engine.names, ordered.split(engine.numels, dim=1)))
    params = [flat[n].reshape(N, *s).clone() for n, s in zip(names, shapes)]
    anchor = [p.clone() for p in params] if prox_mu else None
    velocity: list[torch.Tensor | None] = [None] * len(params)
    lr_o = lr_rows.to(dev)[order_t].unsqueeze(2)
    drop, width = [], 0  # each dropout layer's p and the width of the activation it masks
    for kind, arg in engine._plan:
        if kind == "linear":
            width = arg[2]
        elif kind == "dropout":
            drop.append((float(arg), width))
    fused = not (prox_mu or momentum)
    static = engine._compiled_step.static
    sq_o = None if sq is None else torch.zeros(N, dtype=torch.float64, device=engine._acc)
    for step in range(idx.shape[0]):
        k = int((sorted_steps > step).sum())
        if k == 0:
            continue
        if static:
            k = N  # every row: a finished client's has an all-zero mask and a zero step size (a zero update)
        keep = [masks(step, i, p, w) if 0.0 < p < 1.0 else None for i, (p, w) in enumerate(drop)]
        factor = lr_o[:k] * active[step, :k, None, None]
        # the step's slices as tensors of their own (a view's base and offset would be guarded on: recompiles)
        grads, losses = engine._compiled_step(
            params, engine.X, engine.y, idx_t[step, :k].flatten().clone(), mask_t[step, :k].clone(),
            denom[step, :k].clone(), keep, order_t[:k].clone(), factor, float(weight_decay), fused, sq_o is not None,
            static,
        )  # fmt: skip
        if sq_o is not None:
            sq_o[:k] += (engine._f64(losses).square() * mask_t[step, :k].to(engine._acc)).sum(1)
        if fused:
            if static:
                with torch.no_grad():
                    for cur, updated in zip(params, grads):
                        cur.copy_(updated)
            continue
        with torch.no_grad():
            for i, g in enumerate(grads):
                cur = params[i][:k]
                if weight_decay:
                    g = g + cur * weight_decay
                if prox_mu:
                    assert anchor is not None
                    g = g + (cur - anchor[i][:k]) * prox_mu
                if momentum:
                    v = velocity[i]
                    if v is None:
                        velocity[i] = v = g.clone()
                    else:
                        v[:k].mul_(momentum).add_(g)
                    g = g + v[:k] * momentum if nesterov else v[:k]
                cur.sub_(g * factor)
    by_name = dict(zip(names, params))
    final = torch.cat([by_name[n].reshape(N, -1) for n in engine.names], dim=1)
    if sq is not None and sq_o is not None:
        sq[order_t.to(sq.device)] = sq_o
    out = torch.empty_like(final)
    out[order_t] = final
    return out
