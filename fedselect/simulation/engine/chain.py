"""A Flatten / Linear / ReLU / Dropout chain (the built-in ``logistic`` and ``mlp``) computed by hand for C clients.

:class:`LinearChain` is the model read as a plan of layers: its forward pass for C clients at once with
batched products (``baddbmm`` instead of ``vmap``), the evaluation forward of R models on one input, and
its backward pass for the built-in cross-entropy written out (:func:`chain_backward`), which the eager
chain path (:mod:`.chain_path`) and the compiled step (:mod:`.compiled`) both run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "CONTIGUOUS_MIN_ENTRIES",
    "PROBE_DRAWS",
    "LinearChain",
    "chain_backward",
    "global_dropout_masks",
    "same_bits_contiguous",
]

Noise = Callable[[int, torch.Tensor], "torch.Tensor | None"]


def chain_backward(
    plan: Sequence[tuple[str, Any]],
    params: Sequence[torch.Tensor],
    x: torch.Tensor,
    dropout: Noise,
    targets: torch.Tensor,
    weights: torch.Tensor,
    *,
    want_losses: bool,
    contiguous: bool | Sequence[bool] = False,
) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """The gradient of ``sum_(c,b) weights_(c,b) CE(chain_c(x_(c,b)), targets_(c,b))`` by hand, per parameter.

    The chain's backward pass written out (no autograd graph): with ``p = softmax(z)`` the logits'
    gradient is ``weights * (p - onehot(target))``, a linear layer ``z = h W^T + b`` passes ``W``'s
    gradient ``g^T h``, ``b``'s ``sum_b g`` and ``h``'s ``g W`` back, ReLU keeps the gradient where its
    output is positive and dropout multiplies it by its mask. Each operation is the one autograd runs
    for the chain under ``F.cross_entropy`` (``nll_loss``'s backward, then ``_log_softmax_backward_data``
    on the saved log-softmax, the same batched products and sums), so the gradients equal autograd's
    bit for bit (``tests/simulation/test_engine.py``); it saves building and walking the graph at
    every step. A pure function of its arguments, so ``torch.compile`` traces it as it is.

    Parameters
    ----------
    plan : sequence of (kind, arg)
        ``("linear", (wi, bi))`` (the positions of the layer's weight and bias in ``params``; ``bi``
        None without a bias), ``("relu", None)`` or ``("dropout", p)``.
    params : sequence of Tensor
        ``(C, out, in)`` weights and ``(C, 1, out)`` biases.
    x : Tensor, shape (C, B, ...)
        Each client's minibatch.
    dropout : callable
        ``dropout(i, h)``: the scaled mask of the i-th dropout layer for the activations ``h`` (None: the
        identity, p = 0).
    targets : Tensor
        ``C * B`` class labels.
    weights : Tensor, shape (C, B)
        Each sample's weight in the objective (a client's mean loss: ``mask / denom``).
    want_losses : bool
        Also return the ``(C, B)`` per-sample cross-entropies (``-log p[target]``, the values
        ``F.cross_entropy`` gives), which the gradient itself never forms.
    contiguous : bool or sequence of bool, default False
        Lay a weight's gradient out as the weight (``g^T h``, one contiguous product: the compiled step's
        form) instead of as autograd lays it out (``(h^T g)^T``, the eager path's bits); one flag for every
        linear layer, or one per linear layer in the plan's order (:func:`same_bits_contiguous`).

    Returns
    -------
    grads : list of Tensor
        One per parameter, in the order of ``params``.
    losses : Tensor or None
    """
    C = x.shape[0]
    h = x.reshape(C, x.shape[1], -1)
    tape: list[tuple[str, Any, torch.Tensor]] = []
    n_dropout = 0
    for kind, arg in plan:
        if kind == "linear":
            wi, bi = arg
            tape.append(("linear", arg, h))
            w = params[wi].transpose(1, 2)
            h = torch.bmm(h, w) if bi is None else torch.baddbmm(params[bi], h, w)
        elif kind == "relu":
            h = torch.relu(h)
            tape.append(("relu", None, h))
        else:
            m = dropout(n_dropout, h)
            n_dropout += 1
            if m is not None:
                h = h * m
                tape.append(("mask", None, m))
    logp = torch.log_softmax(h.flatten(0, 1), 1)
    t = targets.reshape(-1, 1)
    losses = logp.gather(1, t).neg().view(C, -1) if want_losses else None
    seed = torch.zeros_like(logp).scatter_(1, t, weights.reshape(-1, 1).neg())
    g = torch.ops.aten._log_softmax_backward_data(seed, logp, 1, logp.dtype).view(h.shape)
    first = next(i for i, entry in enumerate(tape) if entry[0] == "linear")
    n_linear = sum(entry[0] == "linear" for entry in tape)
    layout = [contiguous] * n_linear if isinstance(contiguous, bool) else list(contiguous)
    grads: list[Any] = [None] * len(params)
    for i in range(len(tape) - 1, first - 1, -1):
        kind, arg, saved = tape[i]
        if kind == "linear":
            wi, bi = arg
            n_linear -= 1
            if layout[n_linear]:
                grads[wi] = torch.bmm(g.transpose(1, 2), saved)
            else:
                grads[wi] = torch.bmm(saved.transpose(1, 2), g).transpose(1, 2)
            if bi is not None:
                grads[bi] = g.sum(1, keepdim=True)
            if i > first:
                g = torch.bmm(g, params[wi])
        elif kind == "relu":
            g = torch.ops.aten.threshold_backward(g, saved, 0)
        else:
            g = g * saved
    return grads, losses


#: Below this many weight entries a layer keeps autograd's layout unprobed: its transposed update costs little,
#: and a small product's two summation orders can agree on a probe's data by chance.
CONTIGUOUS_MIN_ENTRIES = 4096
PROBE_DRAWS = 4


def same_bits_contiguous(
    clients: int, batch: int, fan_in: int, fan_out: int, device: torch.device, dtype: torch.dtype = torch.float32
) -> bool:
    """Whether the contiguous weight gradient ``g^T h`` has autograd's bits ``(h^T g)^T`` at these shapes here.

    Both products sum the same ``batch`` terms for each of the ``fan_out x fan_in`` entries; whether the matrix
    library sums them in the same order depends on the shapes and its kernels (with MKL on this project's CPUs:
    the same order for the MLPs' 784x200 and 200x200 layers, another for a 200x10 output layer). The probe
    compares the two on :data:`PROBE_DRAWS` Gaussian draws from a fixed seed (terms of one magnitude, so a
    different order rounds differently in a large share of the entries, and at least
    :data:`CONTIGUOUS_MIN_ENTRIES` entries must all agree); a smaller layer, or a batch of one, is not probed
    (False): a few entries can agree by chance, and its transposed update is cheap. Where the orders agree the
    eager chain path takes the contiguous form, which spares the update a pass over a transposed view (several
    times slower on the CPU than a contiguous one: ``benchmarks/speed/bench_update_layout.txt``). The answer is
    cached for the process per shape, device, dtype and torch's thread count (engines of one comparison share it).
    """
    return _probe_layout(clients, batch, fan_in, fan_out, torch.device(device), dtype, torch.get_num_threads())


@functools.lru_cache(maxsize=4096)
def _probe_layout(
    clients: int, batch: int, fan_in: int, fan_out: int, device: torch.device, dtype: torch.dtype, threads: int
) -> bool:
    """:func:`same_bits_contiguous`'s probe, cached for the process per shape, device, dtype and thread count."""
    if fan_in * fan_out < CONTIGUOUS_MIN_ENTRIES or batch < 2:
        return False
    gen = torch.Generator().manual_seed(0)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device="cpu").to(device=device, dtype=dtype)

    for _ in range(PROBE_DRAWS):
        h, g = draw(clients, batch, fan_in), draw(clients, batch, fan_out)
        if not torch.equal(torch.bmm(h.transpose(1, 2), g).transpose(1, 2), torch.bmm(g.transpose(1, 2), h)):
            return False
    return True


def global_dropout_masks(
    n: int,
    b: int,
    step: int,
    layer: int,
    p: float,
    width: int,
    *,
    device: torch.device | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The scaled mask ``F.dropout`` multiplies an ``(n, b, width)`` activation by, drawn from torch's global
    generator exactly as ``F.dropout`` draws it on the CPU (``bernoulli_(1 - p)``, then ``div_(1 - p)``), on
    ``device`` (default: the CPU) from that device's default generator, or from ``generator`` when given."""
    return torch.empty((n, b, width), device=device).bernoulli_(1 - p, generator=generator).div_(1 - p)


class LinearChain:
    """A model that is a Flatten / Linear / ReLU / Dropout chain, as a plan its paths compute by hand.

    Build it with :meth:`of`, which reads the built-in ``logistic`` and ``mlp`` (one ``nn.Sequential``, or a
    single ``nn.Linear``, whose forward flattens its input first) and returns None for any other model.

    Parameters
    ----------
    model : torch.nn.Module
        The model; only its training flag is read (dropout is the identity in evaluation mode).
    plan : list of (kind, arg)
        ``("linear", (weight name, bias name or None, out, in))``, ``("relu", None)``, ``("dropout", p)``.
    names : list of str
        The model's parameter names, in the flat layout's order.
    numels : list of int
        Their sizes.

    Attributes
    ----------
    params : list of str
        The chain's parameters in the plan's order (a weight, then its bias).
    shapes : dict of str to (int, int)
        Each parameter's per-client shape: ``(out, in)`` for a weight, ``(1, out)`` for a bias.
    dropout : list of (float, int)
        Each dropout layer's p and the width of the activation it masks.
    """

    def __init__(self, model: nn.Module, plan: list[tuple[str, Any]], names: list[str], numels: list[int]) -> None:
        self.model = model
        self.plan = plan
        self.names = names
        self.numels = numels
        self.shapes: dict[str, tuple[int, int]] = {}
        self.dropout: list[tuple[float, int]] = []
        width = 0
        for kind, arg in plan:
            if kind == "linear":
                w_name, b_name, out_f, in_f = arg
                self.shapes[w_name] = (out_f, in_f)
                if b_name is not None:
                    self.shapes[b_name] = (1, out_f)
                width = out_f
            elif kind == "dropout":
                self.dropout.append((float(arg), width))
        self.params = list(self.shapes)
        at = {n: i for i, n in enumerate(self.params)}
        # the plan with each linear layer's parameters as positions in self.params (chain_backward's form)
        self.positional: tuple[tuple[str, Any], ...] = tuple(
            (kind, (at[arg[0]], None if arg[1] is None else at[arg[1]])) if kind == "linear" else (kind, arg)
            for kind, arg in plan
        )

    @classmethod
    def of(cls, model: nn.Module, names: list[str], numels: list[int]) -> LinearChain | None:
        """The chain ``model`` is, or None when it is not one."""
        from ..models import FedCorMLP, LogisticRegression

        if isinstance(model, LogisticRegression):
            layers: list[nn.Module] = [nn.Flatten(), model.linear]
            prefix = {id(model.linear): "linear."}
        elif isinstance(model, FedCorMLP):
            layers = list(model.net)
            prefix = {id(m): f"net.{i}." for i, m in enumerate(model.net)}
        else:
            return None
        if not layers or not isinstance(layers[0], nn.Flatten) or layers[0].start_dim != 1:
            return None
        plan: list[tuple[str, Any]] = []
        for layer in layers[1:]:
            if isinstance(layer, nn.Linear):
                pre = prefix[id(layer)]
                bias = pre + "bias" if layer.bias is not None else None
                plan.append(("linear", (pre + "weight", bias, layer.out_features, layer.in_features)))
            elif isinstance(layer, nn.ReLU):
                plan.append(("relu", None))
            elif isinstance(layer, nn.Dropout):
                plan.append(("dropout", float(layer.p)))
            else:
                return None
        used = {n for kind, arg in plan if kind == "linear" for n in arg[:2] if n is not None}
        return cls(model, plan, names, numels) if used == set(names) else None

    def split(self, stacked: torch.Tensor) -> dict[str, torch.Tensor]:
        """``(C, D)`` flat parameters as the chain's ``(C, out, in)`` weights and ``(C, 1, out)`` biases (views)."""
        C = stacked.shape[0]
        parts = dict(zip(self.names, stacked.split(self.numels, dim=1)))
        return {n: parts[n].view(C, *self.shapes[n]) for n in self.params}

    def forward_flat(self, stacked: torch.Tensor, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        """Forward pass of C clients at once from their ``(C, D)`` flat parameters (see :meth:`forward`)."""
        return self.forward(self.split(stacked), x, noise)

    def forward(self, parts: Mapping[str, torch.Tensor], x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        """The chain's forward pass with each weight as ``(C, out, in)`` and each bias as ``(C, 1, out)``.

        ``noise(i, h)``, when given, returns the scaled dropout mask of the i-th dropout layer for the
        activations ``h`` (what ``F.dropout`` multiplies ``h`` by); by default dropout draws its masks from
        torch's global generator.
        """
        C = x.shape[0]
        h = x.reshape(C, x.shape[1], -1)
        n_dropout = 0
        training = self.model.training
        for kind, arg in self.plan:
            if kind == "linear":
                w_name, b_name, _out_f, _in_f = arg
                w = parts[w_name]
                if b_name is None:
                    h = torch.bmm(h, w.transpose(1, 2))
                else:
                    h = torch.baddbmm(parts[b_name], h, w.transpose(1, 2))
            elif kind == "relu":
                h = torch.relu(h)
            elif kind == "dropout":
                if noise is not None and training:
                    m = noise(n_dropout, h)
                    h = h if m is None else h * m
                else:
                    h = F.dropout(h, arg, training=training)
                n_dropout += 1
        return h

    def gradients(
        self,
        parts: Mapping[str, torch.Tensor],
        x: torch.Tensor,
        noise: Noise,
        targets: torch.Tensor,
        weights: torch.Tensor,
        losses_out: list[torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """:func:`chain_backward` of the parameters ``parts`` (by name), in the model's order (:attr:`names`);
        a ``losses_out`` list receives the ``(C, B)`` per-sample cross-entropies."""
        grads, losses = chain_backward(
            self.positional,
            [parts[n] for n in self.params],
            x,
            noise,
            targets,
            weights,
            want_losses=losses_out is not None,
        )
        if losses_out is not None and losses is not None:
            losses_out.append(losses)
        by_name = dict(zip(self.params, grads))
        return [by_name[n] for n in self.names]

    def forward_many(self, stacked: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Evaluation-mode forward of R models on one input chunk: shape (R, n, outputs). The first layer is
        one product of the shared input with all R weight matrices side by side."""
        R, n = stacked.shape[0], x.shape[0]
        parts = dict(zip(self.names, stacked.split(self.numels, dim=1)))
        h: torch.Tensor | None = None
        flat = x.reshape(n, -1)
        for kind, arg in self.plan:
            if kind == "linear":
                w_name, b_name, out_f, in_f = arg
                w = parts[w_name].view(R, out_f, in_f)
                if h is None:  # the first layer: one product of the shared input with all R weight matrices
                    wide = flat @ w.reshape(R * out_f, in_f).t()  # (n, R * out_f)
                    h = wide.view(n, R, out_f).transpose(0, 1)
                    if b_name is not None:
                        h = h + parts[b_name].view(R, 1, out_f)
                    h = h.contiguous()
                elif b_name is None:
                    h = torch.bmm(h, w.transpose(1, 2))
                else:
                    h = torch.baddbmm(parts[b_name].view(R, 1, out_f), h, w.transpose(1, 2))
            elif kind == "relu":
                if h is None:
                    flat = torch.relu(flat)
                else:
                    h = torch.relu(h)
            # dropout is the identity in evaluation mode
        if h is None:  # a chain without a linear layer does not exist (the plan needs the model's parameters)
            raise ValueError("Engine: a linear chain without a linear layer")
        return h
