"""Vectorised local training and evaluation.

The chosen clients of a round train *together*: their parameters are stacked into
one ``(C, D)`` tensor and every local SGD step is one ``torch.func.vmap`` of a
``functional_call`` forward pass followed by one backward pass over the sum of the
clients' masked mean losses (clients share no parameters, so each gets exactly its own
gradient). Clients whose step counts differ (local
epochs over unequal data, partial last batches) are masked inside the batched step:
a padded sample has weight 0 in its client's mean loss, and a client with no step left
does not move. Evaluating every client is one pass over the concatenated evaluation
data with a per-client reduction (``index_add``), never a loop of DataLoaders.

Minibatches of client k in round t come from ``numpy.random.default_rng([seed, t, k])``,
so trials and probes never shift the main stream, and one seed gives the same run bit
for bit.

One method trains: :meth:`Engine.train_many` trains the chosen clients of S runs (each from its own
global model, with its own learning rate and dropout generator) as one computation; a single run is
S = 1, which :meth:`Engine.train` is, and :meth:`Engine.train_runs` is S runs with one seeded
generator each (for :func:`fedselect.simulation.batched.fit_runs`). How a local step is computed is
chosen once per engine: models that are a chain of Flatten / Linear / ReLU / Dropout layers (the
built-in ``logistic`` and ``mlp``) take a hand-batched path (``baddbmm`` instead of ``vmap``) on
which a client whose local steps are done stops computing (clients are ordered by their number of
steps, so the active ones are a prefix of the batch) while its dropout masks are still drawn, so the
numbers are those of the padded computation bit for bit; every other model is vmapped, padded or
(with batch statistics) grouped by minibatch length. :meth:`Engine.test_runs` tests the models of
several runs at once.

Models with buffers (batch norm's running statistics) train on the *stateful* path: every
client carries its own copy of the buffers, stacked like its parameters, and updates them
in its own forward passes; at each local step the clients are grouped by the length of
their minibatch, so a padded sample never enters a batch statistic (see :meth:`Engine.train`
and :func:`aggregate_buffers`). Models without buffers or normalisation layers keep the
padded path above, unchanged.

Devices: an engine lives on one device (``device=``, :func:`resolve_device`: the CPU, a CUDA GPU,
an Apple GPU). Its data is copied there once; a training call copies its minibatch indices there
once and runs its local steps without bringing a value back to the host; its public methods take
parameters on any device and return CPU tensors, numpy arrays and Python numbers. On the CPU every
number is the one it was before devices existed.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap
from torch.nn.modules.batchnorm import _NormBase

from .._validation import InstanceOf
from ..aggregation import average_buffer_deltas
from ._compiled import PATHS, CompiledChainStep, compile_unusable, dropout_keep
from ._compiled import sgd_chain as compiled_sgd_chain
from ._pool import LossPool, segment_means

__all__ = [
    "DEVICE_CONSTRAINTS",
    "LOSSES",
    "Engine",
    "LocalSchedule",
    "LocalTraining",
    "aggregate_buffers",
    "available_devices",
    "device_setting",
    "resolve_device",
    "resolve_loss",
]

LOSSES = ("cross-entropy", "mse")
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if targets.is_floating_point():
        raise ValueError(
            "loss='cross-entropy' needs integer class labels, but the targets are floats (a regression "
            "federation?); use loss='mse' or a callable loss(outputs, targets) -> per-sample losses"
        )
    return F.cross_entropy(outputs, targets, reduction="none")


def _mse(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if not targets.is_floating_point():
        raise ValueError(
            "loss='mse' needs float targets (regression), but the targets are integer class labels; "
            "cast y to float for a regression, or pass a callable loss (e.g. MSE against one-hot labels)"
        )
    if targets.numel() != outputs.numel():
        raise ValueError(
            f"loss='mse': the model gives {math.prod(outputs.shape[1:])} outputs per sample but there are "
            f"{math.prod(targets.shape[1:])} targets per sample; build the model with as many outputs as targets "
            "(Federation.n_outputs; 1-D float targets need one output)"
        )
    d = (outputs - targets.reshape(outputs.shape)) ** 2
    return d.reshape(d.shape[0], -1).mean(1)


def resolve_loss(loss: str | LossFn) -> LossFn:
    """The per-sample loss function named by ``loss`` (see :class:`Engine`)."""
    if callable(loss):
        return loss
    if loss == "cross-entropy":
        return _cross_entropy
    if loss == "mse":
        return _mse
    raise ValueError(f"loss={loss!r} is not one of {LOSSES} or a callable loss(outputs, targets) -> per-sample losses")


# -- devices ---------------------------------------------------------------------------


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def available_devices() -> list[str]:
    """The device names this machine can train on: ``"cpu"``, ``"auto"``, and ``"cuda"``, ``"cuda:N"`` and
    ``"mps"`` where torch sees such a device."""
    out = ["cpu", "auto"]
    if torch.cuda.is_available():
        out += ["cuda", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]
    if _mps_available():
        out.append("mps")
    return out


def _why_not(kind: str) -> str:
    if kind == "cuda":
        if torch.version.cuda is None:
            return f"this torch ({torch.__version__}) was built without CUDA"
        return "torch sees no CUDA GPU (check CUDA_VISIBLE_DEVICES and the driver)"
    return "torch sees no Apple GPU (MPS needs macOS on Apple silicon)"


def resolve_device(device: str | torch.device = "cpu") -> torch.device:
    """The torch device that ``device`` names on this machine, checked to exist.

    Parameters
    ----------
    device : str or torch.device, default "cpu"
        ``"cpu"``, ``"cuda"`` (the current CUDA GPU), ``"cuda:N"``, ``"mps"`` (Apple GPUs), a
        :class:`torch.device` of one of those kinds, or ``"auto"``: CUDA if torch sees a CUDA GPU,
        else MPS if it sees one, else the CPU.

    Returns
    -------
    torch.device
        With its index for a GPU (``cuda:0``, ``mps:0``), as tensors on it report their device.

    Raises
    ------
    ValueError
        A device this machine does not have (the message says what it has and why not), or a
        kind of device fedselect does not train on.
    TypeError
        ``device`` is neither a string nor a torch.device.
    """
    if isinstance(device, str) and device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("mps", 0) if _mps_available() else torch.device("cpu")
    if isinstance(device, torch.device):
        dev = device
    elif isinstance(device, str):
        try:
            dev = torch.device(device)
        except (RuntimeError, ValueError) as exc:
            raise ValueError(
                f"device={device!r} is not a device name; use 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto' "
                f"(available here: {', '.join(map(repr, available_devices()))})"
            ) from exc
    else:
        raise TypeError(f"device={device!r} must be a device name (str) or a torch.device, not {type(device).__name__}")
    have = ", ".join(map(repr, available_devices()))
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} is not available: {_why_not('cuda')}; available here: {have}")
        n = torch.cuda.device_count()
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if not 0 <= index < n:
            raise ValueError(
                f"device={device!r} is not available: torch sees {n} CUDA GPU(s), "
                f"cuda:0 to cuda:{n - 1}; available here: {have}"
            )
        return torch.device("cuda", index)
    if dev.type == "mps":
        if not _mps_available():
            raise ValueError(f"device={device!r} is not available: {_why_not('mps')}; available here: {have}")
        return torch.device("mps", 0)
    raise ValueError(
        f"device={device!r}: fedselect trains on 'cpu', 'cuda', 'cuda:N' or 'mps' devices, not "
        f"{dev.type!r}; available here: {have}"
    )


def device_setting(device: str | torch.device) -> str:
    """``device`` as a run's settings record it, after checking it (:func:`resolve_device`).

    ``"auto"`` becomes the kind of device it chose here (``"cpu"``, ``"cuda"``, ``"mps"``), so a
    record says which kind of machine ran; every form of the CPU (``"cpu:0"``,
    ``torch.device("cpu")``) is ``"cpu"``; a torch.device is its name; another name is kept as given.
    """
    resolved = resolve_device(device)
    if (isinstance(device, str) and device == "auto") or resolved.type == "cpu":
        return resolved.type
    return str(device)


class _Device(InstanceOf):
    """A device name or torch.device that :func:`resolve_device` accepts on this machine."""

    def is_satisfied_by(self, value: Any) -> bool:
        if not super().is_satisfied_by(value):
            return False
        try:
            resolve_device(value)
        except (TypeError, ValueError):
            return False
        return True

    def __str__(self) -> str:
        if self.type is not str:
            return "a torch.device of those kinds"
        have = [d for d in available_devices() if not d.startswith("cuda:")]
        if torch.cuda.is_available():
            have.append(f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
        lacking = [
            f"no {kind}: {_why_not(kind)}"
            for kind, there in (("cuda", torch.cuda.is_available()), ("mps", _mps_available()))
            if not there
        ]
        return f"one of the devices this machine has ({', '.join(have)}{''.join('; ' + x for x in lacking)})"

    def invalid_examples(self) -> list[Any]:
        out: list[Any] = ["tpu", "meta", "cuda:x", "", 0, None, torch.device("meta")]
        if not torch.cuda.is_available():
            out += ["cuda", "cuda:0", torch.device("cuda")]
        if not _mps_available():
            out.append("mps")
        return out


DEVICE_CONSTRAINTS: list[Any] = [_Device(str), _Device(torch.device)]
"""The declared constraint of a ``device`` parameter (:mod:`fedselect._validation`): a name or a
torch.device of a device this machine has, checked by :func:`resolve_device`."""


def _check_losses(values: Any, n: int, loss: Any) -> torch.Tensor:
    if not isinstance(values, torch.Tensor) or tuple(values.shape) != (n,):
        got = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
        raise ValueError(
            f"loss={loss!r} must return one loss per sample, a tensor of shape ({n},) for {n} samples "
            f"(reduction 'none'), got {got}"
        )
    return values


def aggregate_buffers(
    buffers: Mapping[str, torch.Tensor], client_buffers: Mapping[str, torch.Tensor], weights: Any
) -> dict[str, torch.Tensor]:
    """The global buffers after a round: the weighted mean of the reporting clients' buffers.

    With b the global buffer (e.g. a batch norm running mean or variance), b_k client k's
    after its local training and a_k the weights the round aggregates parameters with,

    .. math:: b^{t+1} = b^t + \\sum_k \\tilde a_k (b_k - b^t), \\qquad \\tilde a_k = a_k / \\sum_j a_j,

    i.e. the a-weighted mean of the b_k (FedAvg of buffers, as most federated code does;
    batch norm statistics are not kept local as in FedBN). The weights are normalised so a
    variance stays a convex combination of variances even when a selection carries
    unnormalised weights; the trainer's own rules already sum to 1, so then the buffers
    follow exactly the parameters' rule. Written as a delta, a buffer that no client changed
    stays bit for bit unchanged. Integer buffers (``num_batches_tracked``) get the rounded
    weighted mean of the clients' counts; boolean buffers (masks) keep the global value.
    All-zero weights leave the buffers unchanged. The arithmetic is
    :func:`fedselect.aggregation.average_buffer_deltas` on the differences ``b_k - b^t``, the
    one the Flower server applies to the differences its clients report.

    Parameters
    ----------
    buffers : dict of str to Tensor
        The global buffers b^t.
    client_buffers : dict of str to Tensor
        Each buffer stacked over the reporting clients, shape ``(C, *b.shape)``.
    weights : array-like of float, shape (C,)
        The clients' aggregation weights (non-negative).

    Returns
    -------
    dict of str to Tensor
    """
    differences = {name: client_buffers[name] - b.unsqueeze(0) for name, b in buffers.items() if b.dtype != torch.bool}
    return average_buffer_deltas(buffers, differences, weights)


@dataclass(frozen=True)
class LocalSchedule:
    """How a client trains locally.

    Exactly one of ``steps`` and ``epochs`` is set. ``steps``: that many SGD steps of
    ``min(batch_size, n_k)`` samples, cycling through freshly shuffled passes over the
    client's data. ``epochs``: that many shuffled passes of ``ceil(n_k / batch_size)``
    steps each, the last batch of a pass partial (as a PyTorch DataLoader with
    ``shuffle=True, drop_last=False`` does).
    """

    batch_size: int
    steps: int | None = None
    epochs: int | None = None

    def __post_init__(self) -> None:
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("LocalSchedule: set exactly one of steps and epochs")
        if self.batch_size < 1:
            raise ValueError(f"LocalSchedule: batch_size={self.batch_size} must be >= 1")
        n = self.steps if self.steps is not None else self.epochs
        if n is None or n < 1:
            raise ValueError(f"LocalSchedule: steps/epochs must be >= 1, got {n}")

    def n_steps(self, n_k: int) -> int:
        if self.steps is not None:
            return self.steps
        assert self.epochs is not None
        return self.epochs * math.ceil(n_k / self.batch_size)

    def batches(self, indices: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        """The minibatches (arrays of sample indices) one client trains on."""
        n_k = indices.shape[0]
        b = self.batch_size
        if self.epochs is not None:
            out: list[np.ndarray] = []
            for _ in range(self.epochs):
                perm = indices[rng.permutation(n_k)]
                out.extend(perm[i : i + b] for i in range(0, n_k, b))
            return out
        assert self.steps is not None
        b = min(b, n_k)
        passes = math.ceil(self.steps * b / n_k)
        stream = np.concatenate([indices[rng.permutation(n_k)] for _ in range(passes)])
        return [stream[i * b : (i + 1) * b] for i in range(self.steps)]


@dataclass(frozen=True)
class _ChainSchedule:
    """A chain's clients ordered by their number of local steps (:meth:`Engine._chain_schedule`)."""

    identity: bool  # the order is the given one
    sorted_steps: np.ndarray  # (N,) steps of each client, in order
    order_t: torch.Tensor  # (N,) the order, on the device
    idx_t: torch.Tensor  # (S, N, B) minibatch indices, in order
    mask_t: torch.Tensor  # (S, N, B) 1 for a real sample, 0 for padding
    active: torch.Tensor  # (S, N) 1 while the client has a step
    denom: torch.Tensor  # (S, N) real samples per step, at least 1


@dataclass(frozen=True)
class LocalTraining:
    """One run's part of :meth:`Engine.train_many`: what its chosen clients' local training produced.

    Attributes
    ----------
    deltas : Tensor, shape (C, D)
        Each client's local update w_k - w^t (on the CPU).
    buffers : dict of str to Tensor, each of shape (C, ...)
        Each client's buffers after its local training (the run's starting buffers, stacked, for a
        model without batch statistics; empty for a model without buffers).
    sample_loss_sq : ndarray of float64, shape (C,), or None
        Each client's mean squared per-sample training loss, when asked for (``sample_losses``).
    """

    deltas: torch.Tensor
    buffers: dict[str, torch.Tensor]
    sample_loss_sq: np.ndarray | None = None


class Engine:
    """Batched local training and per-client evaluation of one model on one federation's data.

    Parameters
    ----------
    model : torch.nn.Module
        The architecture; its parameters and buffers are only used as the initial global model.
    X, y : ndarray
        The training pool every client's indices point into. Integer ``y`` are class labels
        (test accuracy is measured); float ``y`` are regression targets, shape ``(n,)`` or
        ``(n, d)`` (no accuracy).
    loss_indices : list of ndarray
        Per client, the samples its loss l_k(w) is measured on: indices into ``X``, which clients
        may share; only the indices are kept (``fedselect/simulation/_pool.py``).
    X_test, y_test : ndarray
        The test split.
    eval_batch : int
        Samples per forward pass when evaluating (bounds memory).
    loss : {"cross-entropy", "mse"} or callable, default "cross-entropy"
        The per-sample loss used everywhere a loss is computed: local training (each client
        minimises its mean over a minibatch), the clients' losses l_k(w) an oracle reports
        and the test loss. ``"mse"`` is the mean over output dimensions of the squared error
        (float targets). A callable is called as ``loss(outputs, targets)`` with outputs of
        shape ``(m, *out)`` and the m matching targets and must return the m per-sample
        losses (shape ``(m,)``, reduction none); it must be differentiable in ``outputs``
        and is also called inside the vmapped forward, so it must not call ``.item()``.
    device : str or torch.device, default "cpu"
        Where the data lives and the model trains (:func:`resolve_device`: ``"cpu"``, ``"cuda"``,
        ``"cuda:N"``, ``"mps"``, a torch.device or ``"auto"``). The training pool and the test split
        are copied to it once, here; each training call moves its minibatch
        indices there once and runs every local step without waiting for the device (no value comes
        back to the host inside the loop). The public methods take parameters and buffers on any
        device and return CPU tensors and Python numbers, so what the trainer aggregates, records
        and checkpoints is on the CPU whatever the device. On the CPU every number is what it was
        before devices existed, bit for bit; another device type gives its own, reproducible, bits.
    path : {"eager", "compiled"}, default "eager"
        How a local step is computed. ``"eager"``: the reference, bit-stable path. ``"compiled"``
        (opt-in, a Flatten/Linear/ReLU/Dropout chain with the built-in cross-entropy, needs a working
        ``torch.compile``): each local step is one inductor graph (:mod:`fedselect.simulation._compiled`);
        its float rounding and dropout stream differ from the eager path's (the same call gives the same
        bits), so a run records the path it trained on.
    static_steps : bool, optional
        Only with ``path="compiled"``. True: every local step trains all the round's clients (a finished
        client with a zero step size and an empty minibatch, so its parameters do not change), so every
        step has the same shapes; the graph is compiled for them and, on CUDA, replayed as a CUDA graph.
        False: each step trains only the clients with steps left (dynamic shapes). Default: True on
        CUDA, False elsewhere (on the CPU skipping finished clients is faster). The two agree to float
        rounding; the choice follows from the device unless given, so a run's recorded device says it.

    Raises
    ------
    ValueError
        Before any training, when the model cannot run in the batched engine: a batch norm
        layer with ``momentum=None`` (a cumulative average whose factor is computed in Python
        from a batched counter), ``SyncBatchNorm``, uninitialised lazy modules, a model whose
        forward fails under ``torch.func.vmap``, or a loss that does not fit the outputs and
        targets. The message says what to change.

    Notes
    -----
    Buffers (batch norm running statistics, ``num_batches_tracked``) are model state: every
    training client starts from the global buffers, updates its own copy in each training
    forward pass (stacked ``(C, ...)`` like the parameters and passed to
    ``torch.func.functional_call`` under ``vmap``, so batch norm's in-place updates of its
    running statistics act on each client's own copy), and the server averages them with
    :func:`aggregate_buffers`. Evaluation runs the model in eval mode with the global
    buffers, so batch norm normalises by its running statistics.

    Attributes
    ----------
    buffers : dict of str to Tensor
        The model's initial buffers (the global buffers before round 0).
    stateful : bool
        True when the model has buffers or normalisation layers that couple the samples of a
        batch; training then groups clients by minibatch length (see :meth:`train`).
    min_batch_size : int
        The smallest minibatch the model can train on: 2 when a batch norm layer cannot
        normalise a single sample in training mode (``BatchNorm1d`` on flat features), else 1.
    classification : bool
        Whether the targets are integer class labels (accuracy is then measured).
    device : torch.device
        Where the data and the training are (resolved: ``cuda:0``, not ``"auto"``).
    """

    def __init__(
        self,
        model: nn.Module,
        X: np.ndarray,
        y: np.ndarray,
        loss_indices: Sequence[np.ndarray],
        X_test: np.ndarray,
        y_test: np.ndarray,
        *,
        eval_batch: int = 16384,
        loss: str | LossFn = "cross-entropy",
        device: str | torch.device = "cpu",
        path: str = "eager",
        static_steps: bool | None = None,
    ) -> None:
        if path not in PATHS:
            raise ValueError(f"The 'path' parameter of Engine must be one of {PATHS!r}; got {path!r} instead.")
        if static_steps is not None and path != "compiled":
            raise ValueError(f"static_steps is an option of path='compiled'; got path={path!r}")
        self.path = path
        self.device = resolve_device(device)
        # float64 sums (losses, accuracies) where the device has float64; MPS has none, so there they are
        # taken on the CPU
        self._acc = self.device if self.device.type != "mps" else torch.device("cpu")
        _check_model(model)
        # the caller's module is never moved: a copy goes to the device (the parameters and buffers the
        # engine trains are passed to functional_call anyway; the module supplies its structure)
        elsewhere = any(t.device != self.device for t in (*model.parameters(), *model.buffers()))
        self.model = copy.deepcopy(model).to(self.device) if elsewhere else model
        self.loss = loss
        self._loss_fn = resolve_loss(loss)
        y_arr = np.asarray(y)
        self.classification = bool(np.issubdtype(y_arr.dtype, np.integer))
        ydtype = np.int64 if self.classification else np.float32
        dev = self.device
        on_cpu = dev.type == "cpu"
        self.X = torch.as_tensor(np.ascontiguousarray(X, dtype=np.float32)).to(dev)
        self.y = torch.as_tensor(np.asarray(y_arr, dtype=ydtype)).to(dev)
        self.X_test = torch.as_tensor(np.ascontiguousarray(X_test, dtype=np.float32)).to(dev)
        self.y_test = torch.as_tensor(np.asarray(y_test, dtype=ydtype)).to(dev)
        self.eval_batch = int(eval_batch)
        params = dict(model.named_parameters())
        self.names = list(params)
        self.shapes = [p.shape for p in params.values()]
        self.numels = [p.numel() for p in params.values()]
        self.n_params = int(sum(self.numels))
        # the initial buffers on the CPU (as the trainer keeps the global ones), and a copy on the device
        self.buffers = {k: v.detach().clone().cpu() for k, v in model.named_buffers()}
        self._device_buffers = self.buffers if on_cpu else {k: v.to(dev) for k, v in self.buffers.items()}
        self.stateful = bool(self.buffers) or any(isinstance(m, _NormBase) for m in model.modules())
        # Evaluation data: indices into the pool (X, y), nothing gathered here (fedselect/simulation/_pool.py)
        self.loss_pool = LossPool(loss_indices)
        self.eval_sizes = self.loss_pool.sizes
        # vmap only the forward pass; one ordinary backward over the sum of the clients' losses
        # gives each client exactly its own gradient (the clients share no parameters). Measured
        # 14-25 % faster per step than vmap(grad(...)) on FedCor's MLP (benchmarks/speed/bench_engine.py).
        self._forward_all = vmap(self._forward, in_dims=(0, 0), randomness="different")
        self._forward_state_all = vmap(self._forward_state, in_dims=(0, 0, 0), randomness="different")
        # Models that are a plain chain of Flatten / Linear / ReLU / Dropout (logistic regression,
        # FedCor's MLP) take a hand-batched path with baddbmm, which avoids functorch's per-op
        # dispatch; every other model uses vmap. Both give the same numbers (tests/simulation).
        self._plan = _linear_chain(model, self.names)
        self._model_repr = repr(model)  # the layers' options (GroupNorm's groups...): part of the batch key
        if self._plan is not None:
            self._forward_all = self._forward_chain
        # How a local step is computed is chosen once, here (see train_many): the hand-batched chain, or vmap with
        # every client padded (stateless) or grouped by minibatch length (batch statistics).
        self._local_sgd = self._sgd_chain if self._plan is not None else self._sgd_vmap
        self._step_objective = self._grouped_steps if self.stateful else self._padded_steps
        # A chain's gradients: its backward written out for the built-in cross-entropy (the same bits as autograd;
        # it saves building and walking the graph, about 10 % of a single run's training), else autograd.
        by_hand = self._loss_fn is _cross_entropy and self.classification
        self._chain_step = self._chain_step_by_hand if by_hand else self._chain_step_autograd
        # The dropout masks of the chain path: scaled float masks drawn as F.dropout draws them (eager), or kept
        # entries (bool) for the compiled step
        self._draw_masks: Callable[..., torch.Tensor] = _global_dropout_masks
        self._mask_dtype = torch.float32
        if path == "compiled":
            self._use_compiled(self.device.type == "cuda" if static_steps is None else bool(static_steps))
        self.min_batch_size = 1
        self._probe()

    def _use_compiled(self, static: bool) -> None:
        """Train through the compiled chain step (:mod:`fedselect.simulation._compiled`), or say why it cannot.
        ``static``: every step the same shapes, run as a CUDA graph on a CUDA device."""
        why = compiled_path_refusal(self.model, self.loss)  # the rule a comparison checks before any run
        if why is None and not self.classification:  # what only the data tells: class labels
            why = _compiled_refusal_message(self.model, self.loss)
        if why is not None:
            raise ValueError(why)
        assert self._plan is not None and self._chain_step == self._chain_step_by_hand
        why = compile_unusable()
        if why is not None:
            raise ValueError(f"path='compiled' needs torch.compile (inductor), which fails here: {why}")
        cuda_graphs = static and self.device.type == "cuda"
        self._compiled_step = CompiledChainStep.for_plan(self._plan, static=static, cuda_graphs=cuda_graphs)
        if cuda_graphs:
            # the training data stays where it is for the engine's life: a CUDA graph reads it in place instead of
            # copying it into the graph's own memory before every replay (another engine's data re-records)
            torch._dynamo.mark_static_address(self.X, guard=False)
            torch._dynamo.mark_static_address(self.y, guard=False)
        self._local_sgd = functools.partial(compiled_sgd_chain, self)
        self._draw_masks = dropout_keep
        self._mask_dtype = torch.bool

    def _probe(self) -> None:
        """Run one tiny batched training step and one evaluation now, so a model or loss the
        engine cannot run fails before any training, with a message saying what to do."""
        n = min(2, self.X.shape[0])
        x, y = self.X[:n], self.y[:n]
        name = type(self.model).__name__
        was_training = self.model.training
        gpus = [self.device.index] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=gpus):  # the probe draws no number the run would see
            try:
                flat = self.initial_parameters().to(self.device)
                p = flat.repeat(2, 1).requires_grad_(True)
                self.model.train()
                try:
                    if self.stateful:
                        bufs = {k: v.unsqueeze(0).repeat(2, *([1] * v.dim())) for k, v in self._device_buffers.items()}
                        out = self._forward_state_all(p, bufs, x.expand(2, *x.shape))
                    else:
                        out = self._forward_all(p, x.expand(2, *x.shape))
                    self.model.eval()
                    out_eval = self._forward(flat, x)
                except (RuntimeError, TypeError, ValueError, NotImplementedError, IndexError) as exc:
                    raise ValueError(self._unsupported(name, exc)) from exc
                try:
                    self._losses(out.flatten(0, 1), y.expand(2, *y.shape).flatten(0, 1)).sum().backward()
                    self._losses(out_eval, y)
                except ValueError as exc:
                    if "loss=" in str(exc):
                        raise
                    raise ValueError(self._loss_failed(out_eval, y, exc)) from exc
                except (RuntimeError, TypeError, IndexError) as exc:
                    raise ValueError(self._loss_failed(out_eval, y, exc)) from exc
            finally:
                self.model.train(was_training)
            if self.stateful:
                self.model.train()
                try:
                    bufs = {k: v.unsqueeze(0).clone() for k, v in self._device_buffers.items()}
                    self._forward_state_all(flat.unsqueeze(0), bufs, x[:1].unsqueeze(0))
                except ValueError as exc:
                    if "more than 1 value per channel" not in str(exc):
                        raise ValueError(self._unsupported(name, exc)) from exc
                    self.min_batch_size = 2
                finally:
                    self.model.train(was_training)

    def _loss_failed(self, outputs: torch.Tensor, targets: torch.Tensor, exc: BaseException) -> str:
        return (
            f"loss={self.loss!r} failed on the model's outputs (shape {tuple(outputs.shape)}, {outputs.dtype}) and "
            f"the targets (shape {tuple(targets.shape)}, {targets.dtype}): {type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}. A loss is called as "
            "loss(outputs, targets) and returns one differentiable loss per sample; check that the model has as many "
            "outputs as the loss expects (Federation.n_outputs)"
        )

    def _unsupported(self, name: str, exc: BaseException) -> str:
        return (
            f"the model {name} cannot be trained by fedselect's batched engine ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}). The engine runs the model's forward "
            "pass for all chosen clients at once under torch.func.vmap with torch.func.functional_call, so the "
            "forward must be a function of its parameters, buffers and input: no .item() or float(tensor) on "
            "activations, no data-dependent Python branches, no in-place changes to module attributes other than "
            "buffers. Batch norm is supported (with a float momentum); other stateful layers are not. Check that "
            "the model maps a batch of the federation's inputs (shape (batch, *input_shape)) to outputs the loss "
            "accepts"
        )

    def _losses(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Per-sample losses; a user's loss is checked to return one value per sample."""
        values = self._loss_fn(outputs, targets)
        if isinstance(self.loss, str):
            return values
        return _check_losses(values, outputs.shape[0], self.loss)

    # -- parameters -----------------------------------------------------------------
    def initial_parameters(self) -> torch.Tensor:
        """The model's current parameters, flattened (float32, detached copy, on the CPU)."""
        return torch.cat([p.detach().reshape(-1) for p in self.model.parameters()]).clone().cpu()

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on the engine's device (``t`` itself when it is there)."""
        return t.to(self.device)

    def _buffers_on_device(self, buffers: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
        """Global buffers on the device: ``buffers`` (moved when elsewhere), or the initial ones."""
        if buffers is None:
            return self._device_buffers
        return {k: torch.as_tensor(v).to(self.device) for k, v in buffers.items()}

    def _f64(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` in float64 for a sum, on the device (on the CPU for MPS, which has no float64)."""
        return t.to(self._acc, torch.float64)

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return {n: t.view(s) for n, t, s in zip(self.names, flat.split(self.numels), self.shapes)}

    def module_at(self, flat: torch.Tensor, buffers: Mapping[str, torch.Tensor] | None = None) -> nn.Module:
        """A copy of the model holding ``flat`` (and ``buffers``), in eval mode, on the CPU: the global model as a
        module."""
        module = copy.deepcopy(self.model).cpu()
        state = {n: t.detach().clone().cpu() for n, t in self.unflatten(torch.as_tensor(flat)).items()}
        state.update({n: torch.as_tensor(b).detach().clone().cpu() for n, b in (buffers or {}).items()})
        missing = set(module.state_dict()) - set(state)
        module.load_state_dict({**{k: v for k, v in module.state_dict().items() if k in missing}, **state})
        return module.eval()

    def _forward_chain(
        self, stacked: torch.Tensor, x: torch.Tensor, noise: Callable[[int, torch.Tensor], torch.Tensor] | None = None
    ) -> torch.Tensor:
        """Forward pass of C clients at once for a Flatten/Linear/ReLU/Dropout chain.

        ``noise(i, h)``, when given, returns the scaled dropout mask of the i-th dropout layer
        for the activations ``h`` (what ``F.dropout`` multiplies ``h`` by); by default dropout
        draws its masks from torch's global generator.
        """
        C = stacked.shape[0]
        parts = dict(zip(self.names, stacked.split(self.numels, dim=1)))
        shaped = {}
        for kind, arg in self._plan or ():
            if kind == "linear":
                w_name, b_name, out_f, in_f = arg  # type: ignore[misc]
                shaped[w_name] = parts[w_name].view(C, out_f, in_f)
                if b_name is not None:
                    shaped[b_name] = parts[b_name].view(C, 1, out_f)
        return self._chain(shaped, x, noise)

    def _chain(
        self,
        parts: Mapping[str, torch.Tensor],
        x: torch.Tensor,
        noise: Callable[[int, torch.Tensor], torch.Tensor | None] | None = None,
    ) -> torch.Tensor:
        """The chain's forward pass with each weight as ``(C, out, in)`` and each bias as ``(C, 1, out)``."""
        C = x.shape[0]
        h = x.reshape(C, x.shape[1], -1)
        n_dropout = 0
        for kind, arg in self._plan or ():
            if kind == "linear":
                w_name, b_name, _out_f, _in_f = arg  # type: ignore[misc]
                w = parts[w_name]
                if b_name is None:
                    h = torch.bmm(h, w.transpose(1, 2))
                else:
                    h = torch.baddbmm(parts[b_name], h, w.transpose(1, 2))
            elif kind == "relu":
                h = torch.relu(h)
            elif kind == "dropout":
                if noise is not None and self.model.training:
                    m = noise(n_dropout, h)
                    h = h if m is None else h * m
                else:
                    h = F.dropout(h, arg, training=self.model.training)  # type: ignore[arg-type]
                n_dropout += 1
        return h

    def _forward(
        self, flat: torch.Tensor, x: torch.Tensor, buffers: Mapping[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        return functional_call(
            self.model, (self.unflatten(flat), self._device_buffers if buffers is None else buffers), (x,)
        )

    def _forward_state(self, flat: torch.Tensor, buffers: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        # one client's forward with its own buffers; batch norm updates them in place (under vmap: its copy)
        return functional_call(self.model, (self.unflatten(flat), buffers), (x,))

    # -- training -------------------------------------------------------------------
    def client_batches(
        self,
        client_indices: Sequence[np.ndarray],
        schedule: LocalSchedule,
        seed: int,
        round: int,
        clients: Sequence[int],
    ) -> list[list[np.ndarray]]:
        """The minibatches of each client, from the stream ``(seed, round, k)``."""
        return [
            schedule.batches(np.asarray(client_indices[k]), np.random.default_rng([seed, round, int(k)]))
            for k in clients
        ]

    def train(
        self,
        theta: torch.Tensor,
        batches: Sequence[Sequence[np.ndarray]],
        *,
        lr: float,
        weight_decay: float = 0.0,
        prox_mu: float = 0.0,
        momentum: float = 0.0,
        nesterov: bool = False,
        dropout_seed: int | None = None,
        buffers: Mapping[str, torch.Tensor] | None = None,
        return_buffers: bool = False,
        sample_losses: bool = False,
    ) -> torch.Tensor | tuple[Any, ...]:
        """Train every client from ``theta`` on its own minibatches, all at once: :meth:`train_many` of one run.

        Each client runs local SGD from w^t. With g the gradient of its mean minibatch loss,
        one step is ``d = g + weight_decay * w + prox_mu * (w - w^t)``; with momentum m > 0,
        ``v = m v + d`` (v = d at the client's first step of the round) and
        ``d = v`` (or ``d + m v`` with Nesterov); then ``w = w - lr d``. This is exactly
        ``torch.optim.SGD(lr, momentum, weight_decay, nesterov)`` with dampening 0 on the
        loss plus FedProx's term. The momentum buffer v is local: it starts empty in every
        call, i.e. every client resets it at the start of each round (the common reading of
        FedAvg with momentum SGD; a server-side momentum across rounds is not built here).

        Parameters
        ----------
        theta : Tensor, shape (D,)
            The global model w^t.
        batches : list (one per client) of lists of index arrays
            Client i's local SGD steps, one index array per step.
        lr, weight_decay, prox_mu : float
            SGD step size, L2 weight decay added to the gradient (as ``torch.optim.SGD``
            does) and FedProx's proximal coefficient mu (gradient ``mu (w - w^t)``).
        momentum : float, default 0.0
            Local heavy-ball momentum m (0: plain SGD, computed exactly as before the option).
        nesterov : bool, default False
            Nesterov momentum (needs ``momentum > 0``).
        dropout_seed : int, optional
            Seeds torch's generator for dropout masks so a run is reproducible (``torch.manual_seed``,
            then the masks are drawn from the default generators, which hold what they drew
            afterwards).
        buffers : dict of str to Tensor, optional
            The global buffers every client starts from (default: the model's initial
            buffers, :attr:`buffers`). Only used by stateful models.
        return_buffers : bool, default False
            Also return each client's buffers after its local training.
        sample_losses : bool, default False
            Also return each client's mean, over every sample of every local step, of its
            squared per-sample training loss (each loss taken in that step's forward pass, at
            the parameters the step starts from): what Oort's clients report. The training
            itself is the same computation, bit for bit; off, nothing extra is computed.

        Returns
        -------
        deltas : Tensor, shape (C, D)
            The local updates w_k - w^t.
        client_buffers : dict of str to Tensor, each of shape (C, ...)
            Only with ``return_buffers``: each client's buffers after training (the
            starting buffers, stacked, for a model without batch statistics).
        sample_loss_sq : ndarray of float64, shape (C,)
            Only with ``sample_losses`` (last): each client's mean squared per-sample loss.

        Notes
        -----
        Stateless models (no buffers, no normalisation layers) pad every client's minibatch
        to the longest one of the step and give padded samples weight 0 in the client's mean
        loss. A stateful model cannot be padded (a padded sample would enter batch norm's
        batch mean and variance), so at each step the clients are grouped by the length of
        their minibatch and each group is one vmapped forward pass; a client with no step
        left runs no forward pass, so its buffers do not move either. With ``local_steps``
        every client's batches have one length and there is one group per step; with local
        epochs over unequal clients, a step costs one forward pass per distinct length.

        A Flatten/Linear/ReLU/Dropout chain skips the padding of finished clients: from the step
        where a client has no minibatch left it is left out of the batched products (its
        parameters cannot move any more), and the dropout masks are still drawn for every
        client at every step, so the result is the padded computation's bit for bit. On
        Dirichlet splits, where clients' local epochs differ in length, the padded computation
        costs ``C * max_k s_k`` sample steps for ``sum_k s_k`` real ones (s_k: client k's
        samples over its local epochs); the skip brings it back to the real ones. With the
        built-in cross-entropy loss, the chain's backward pass is written out by hand
        (:meth:`_chain_grads`, the same operations autograd runs, so the same bits); other
        losses go through autograd.
        """
        if not batches:
            start = self.buffers if buffers is None else buffers
            empty = torch.zeros((0, theta.numel()), dtype=theta.dtype, device="cpu")
            out: tuple[Any, ...] = (
                (empty, {k: v.unsqueeze(0)[:0] for k, v in start.items()}) if return_buffers else (empty,)
            )
            if sample_losses:
                out = (*out, np.zeros(0))
            return out if len(out) > 1 else empty
        if nesterov and not momentum:
            raise ValueError("Engine.train: nesterov=True needs momentum > 0")
        if dropout_seed is not None:
            torch.manual_seed(dropout_seed)  # the masks come from torch's generator(s), seeded as always
        (run,) = self.train_many(
            [theta],
            [batches],
            lrs=[lr],
            weight_decay=weight_decay,
            prox_mu=prox_mu,
            momentum=momentum,
            nesterov=nesterov,
            buffers=[buffers],
            sample_losses=sample_losses,
        )
        out = (run.deltas, run.buffers) if return_buffers else (run.deltas,)
        if run.sample_loss_sq is not None:
            out = (*out, run.sample_loss_sq)
        return out if len(out) > 1 else out[0]

    def train_many(
        self,
        thetas: Sequence[torch.Tensor],
        batches: Sequence[Sequence[Sequence[np.ndarray]]],
        *,
        lrs: Sequence[float],
        generators: Sequence[torch.Generator | None] | None = None,
        weight_decay: float = 0.0,
        prox_mu: float = 0.0,
        momentum: float = 0.0,
        nesterov: bool = False,
        buffers: Sequence[Mapping[str, torch.Tensor] | None] | None = None,
        sample_losses: bool = False,
    ) -> list[LocalTraining]:
        """Local training of S runs x C clients as one computation: the one training path of the engine.

        Run r's ``C_r`` clients all start from its global model ``thetas[r]`` and train on
        ``batches[r]`` with step size ``lrs[r]`` (the update rule of :meth:`train`); the clients
        of all runs are stacked into one ``(sum_r C_r, D)`` tensor and every local step is one
        batched computation for all of them, padded to the longest minibatch of any run (padded
        samples and finished clients are masked). A single run is S = 1: :meth:`train` is this
        call with one run, :meth:`train_runs` with one seeded generator per run.

        How a step is computed is fixed per engine when it is built: a Flatten/Linear/ReLU/Dropout
        chain by the hand-batched products of :meth:`_sgd_chain` (finished clients stop computing),
        any other model by :meth:`_sgd_vmap` (``torch.func.vmap`` of the forward pass; a model with
        batch statistics grouped by minibatch length, every client carrying its own buffers).

        Parameters
        ----------
        thetas : sequence of Tensor, shape (D,)
            Each run's global model (on any device).
        batches : sequence (one per run) of lists (one per client) of lists of index arrays
            Each run's clients' minibatches, as in :meth:`train`.
        lrs : sequence of float
            Each run's learning rate.
        generators : sequence of (torch.Generator or None), optional
            Where each run's dropout masks on the chain path come from: run r draws, at each of
            its local steps, one ``(C_r, B_r, width)`` mask per dropout layer (B_r: its longest
            minibatch) from ``generators[r]`` (on the engine's device), or from the device's
            default generator where None (the default for every run). A model on the vmapped path
            draws from the default generator inside its forward pass; such a model trains more
            than one run at a time only if it draws nothing (:meth:`batch_support`).
        weight_decay, prox_mu, momentum, nesterov
            As in :meth:`train`, shared by all runs.
        buffers : sequence of (dict of str to Tensor or None), optional
            Each run's global buffers (None: the initial ones, :attr:`buffers`).
        sample_losses : bool, default False
            Also compute each client's mean squared per-sample training loss (as in :meth:`train`).

        Returns
        -------
        list of LocalTraining
            One per run, in order, on the CPU.

        Raises
        ------
        ValueError
            More than one run of a model the engine cannot train exactly as several runs
            (:meth:`batch_support`), arguments of unequal lengths, or ``nesterov`` without momentum.
        """
        S = len(batches)
        gens = list(generators) if generators is not None else [None] * S
        starts = list(buffers) if buffers is not None else [None] * S
        if not len(thetas) == len(lrs) == len(gens) == len(starts) == S:
            raise ValueError(
                f"Engine.train_many: {S} runs of batches but {len(thetas)} thetas, {len(lrs)} lrs, {len(gens)} "
                f"generators and {len(starts)} buffers; give one of each per run"
            )
        if S > 1 and (why := self.batch_support()) is not None:
            raise ValueError(f"Engine.train_many: {why}")
        if nesterov and not momentum:
            raise ValueError("Engine.train_many: nesterov=True needs momentum > 0")
        sizes = [len(b) for b in batches]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        N = int(offsets[-1])
        if N == 0:
            return [
                LocalTraining(
                    torch.zeros((0, thetas[r].numel()), dtype=thetas[r].dtype, device="cpu"),
                    {k: v.unsqueeze(0)[:0] for k, v in (self.buffers if starts[r] is None else starts[r]).items()},
                    np.zeros(0) if sample_losses else None,
                )
                for r in range(S)
            ]
        run_steps = [max((len(bs) for bs in b), default=0) for b in batches]
        run_width = [max((len(x) for bs in b for x in bs), default=0) for b in batches]
        B = max(run_width)
        idx = np.zeros((max(run_steps), N, B), dtype=np.int64)
        mask = np.zeros((max(run_steps), N, B), dtype=np.float32)
        for r, b in enumerate(batches):
            for i, bs in enumerate(b):
                for s, x in enumerate(bs):
                    idx[s, offsets[r] + i, : len(x)] = x
                    mask[s, offsets[r] + i, : len(x)] = 1.0
        dev = self.device
        start = _rows([self._to_device(thetas[r].detach()).unsqueeze(0).expand(sizes[r], -1) for r in range(S)])
        run_bufs = [self._buffers_on_device(b) for b in starts]
        bufs = {
            k: _rows([run_bufs[r][k].detach().unsqueeze(0).repeat(sizes[r], *([1] * v.dim())) for r in range(S)])
            for k, v in run_bufs[0].items()
        }

        def masks(step: int, layer: int, p: float, width: int) -> torch.Tensor:
            if S == 1:
                return self._draw_masks(N, B, step, layer, p, width, device=dev, generator=gens[0])
            # run r's mask has its own shape (C_r, B_r, width), drawn only while run r has steps left
            out = torch.ones((N, B, width), device=dev, dtype=self._mask_dtype)
            for r in range(S):
                if step < run_steps[r] and sizes[r]:
                    m = self._draw_masks(
                        sizes[r], run_width[r], step, layer, p, width, device=dev, generator=gens[r]
                    )
                    out[offsets[r] : offsets[r + 1], : run_width[r]] = m
            return out

        # sums of squared per-sample losses, one per client (only when asked: nothing is computed otherwise)
        sq = torch.zeros(N, dtype=torch.float64, device=self._acc) if sample_losses else None
        was_training = self.model.training
        self.model.train()
        try:
            final = self._local_sgd(
                start,
                idx,
                mask,
                _lr_rows([float(x) for x in lrs], sizes),
                masks,
                bufs,
                weight_decay=weight_decay,
                prox_mu=prox_mu,
                momentum=momentum,
                nesterov=nesterov,
                sq=sq,
            )
        finally:
            self.model.train(was_training)
        # what the caller keeps comes back to the host once, after the last local step
        deltas = (final - start).detach().cpu()
        host_bufs = {k: v.cpu() for k, v in bufs.items()}
        sq_host = None
        if sq is not None:
            counts = torch.from_numpy(mask.sum(axis=(0, 2))).to(self._acc).double().clamp_min(1.0)
            sq_host = (sq / counts).cpu().numpy()
        return [
            LocalTraining(
                deltas[lo:hi],
                {k: v[lo:hi] for k, v in host_bufs.items()},
                None if sq_host is None else sq_host[lo:hi],
            )
            for lo, hi in zip(offsets[:-1].tolist(), offsets[1:].tolist())
        ]

    def _sgd_vmap(
        self,
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
        """Local SGD of N clients from ``start`` (N, D) on the vmapped path; their parameters afterwards.

        Each step's objective, the sum over clients of their mean minibatch loss, comes from
        :meth:`_padded_steps` (stateless models: every client padded to the step's longest
        minibatch) or :meth:`_grouped_steps` (models with batch statistics: one forward pass per
        minibatch length, ``bufs`` updated in place), chosen when the engine is built. Dropout
        inside the forward pass draws from the device's default generator (``masks`` is unused).
        """
        dev = self.device
        idx_t = torch.from_numpy(idx).to(dev)
        mask_t = torch.from_numpy(mask).to(dev)
        active = torch.from_numpy((mask.sum(axis=2) > 0).astype(np.float32)).to(dev)  # (S, N)
        lr_rows = lr_rows.to(dev)
        objective = self._step_objective(idx_t, mask, mask_t, bufs, sq)
        params = start.clone()
        velocity: torch.Tensor | None = None
        for step in range(idx.shape[0]):
            p = params.requires_grad_(True)
            (g,) = torch.autograd.grad(objective(step, p), p)
            with torch.no_grad():
                if weight_decay:
                    g = g + weight_decay * params
                if prox_mu:
                    g = g + prox_mu * (params - start)
                if momentum:
                    velocity = g if velocity is None else momentum * velocity + g
                    g = g + momentum * velocity if nesterov else velocity
                params = params.detach() - lr_rows * active[step].unsqueeze(1) * g
        return params.detach()

    def _padded_steps(
        self,
        idx_t: torch.Tensor,
        mask: np.ndarray,
        mask_t: torch.Tensor,
        bufs: dict[str, torch.Tensor],
        sq: torch.Tensor | None,
    ) -> Callable[[int, torch.Tensor], torch.Tensor]:
        """Step ``s``'s objective at parameters ``p`` for a stateless model: one vmapped forward of every client,
        padded samples weighted 0 in their client's mean loss."""
        N, B = mask.shape[1], mask.shape[2]
        denom = mask_t.sum(2).clamp_min(1.0)  # (S, N): each client's mean over its real samples
        mask_acc = None if sq is None else mask_t.to(self._acc)

        def objective(s: int, p: torch.Tensor) -> torch.Tensor:
            ix = idx_t[s]
            out = self._forward_all(p, self.X[ix])  # (N, B, outputs)
            losses = self._losses(out.flatten(0, 1), self.y[ix].flatten(0, 1)).view(N, B)
            if sq is not None:
                assert mask_acc is not None
                sq.add_((self._f64(losses.detach()).square() * mask_acc[s]).sum(1))
            return ((losses * mask_t[s]).sum(1) / denom[s]).sum()

        return objective

    def _grouped_steps(
        self,
        idx_t: torch.Tensor,
        mask: np.ndarray,
        mask_t: torch.Tensor,
        bufs: dict[str, torch.Tensor],
        sq: torch.Tensor | None,
    ) -> Callable[[int, torch.Tensor], torch.Tensor]:
        """Step ``s``'s objective at parameters ``p`` for a model with batch statistics: the clients grouped by
        minibatch length (:meth:`_grouped_objective`), so a padded sample never enters a batch statistic."""
        groups = self._length_groups(mask.sum(axis=2).astype(np.int64))
        return lambda s, p: self._grouped_objective(p, bufs, idx_t[s], groups[s], sq=sq)

    def _chain_schedule(self, idx: np.ndarray, mask: np.ndarray) -> _ChainSchedule:
        """The clients of a chain's local training ordered by their number of steps, longest first (the active
        clients of each step are then a prefix), and the round's minibatch indices and masks in that order, on
        the device once, before the first step (:meth:`_sgd_chain` and the compiled path's)."""
        dev = self.device
        n_steps = (mask.sum(axis=2) > 0).sum(axis=0)  # (N,): steps are a prefix of each client's round
        order = np.argsort(-n_steps, kind="stable")
        mask_o = np.ascontiguousarray(mask[:, order])
        mask_t = torch.from_numpy(mask_o).to(dev)
        return _ChainSchedule(
            identity=bool((order == np.arange(order.size)).all()),
            sorted_steps=n_steps[order],
            order_t=torch.from_numpy(order).to(dev),
            idx_t=torch.from_numpy(np.ascontiguousarray(idx[:, order])).to(dev),
            mask_t=mask_t,
            active=torch.from_numpy((mask_o.sum(axis=2) > 0).astype(np.float32)).to(dev),
            denom=mask_t.sum(2).clamp_min(1.0),
        )

    def _chain_shapes(self) -> dict[str, tuple[int, int]]:
        """Each linear parameter of the chain, in the chain's order, and its per-client shape: ``(out, in)`` for a
        weight, ``(1, out)`` for a bias."""
        shapes: dict[str, tuple[int, int]] = {}
        for kind, arg in self._plan or ():
            if kind == "linear":
                w_name, b_name, out_f, in_f = arg  # type: ignore[misc]
                shapes[w_name] = (out_f, in_f)
                if b_name is not None:
                    shapes[b_name] = (1, out_f)
        return shapes

    def _sgd_chain(
        self,
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
        """Local SGD of N clients of a linear chain from ``start`` (N, D); their parameters afterwards.

        The arithmetic of :meth:`train`'s padded path, restricted at each step to the clients
        that still have a minibatch: clients are ordered by their number of steps (longest
        first), so the clients active at step s are the first k_s rows and a finished client
        costs nothing. Every client's numbers are those of the padded path (its rows of each
        batched product, its own loss and gradient, its update; a finished client never moves
        there either), and the dropout masks are drawn for all N clients at every step, as the
        padded path draws them, by ``masks(step, layer, p, width)`` (shape ``(N, B, width)``,
        scaled by 1 / (1 - p)), then restricted to the active rows. ``sq`` (N,), when given,
        receives each client's sum of squared per-sample losses over its steps. A chain has no buffers
        (``bufs`` is empty).
        """
        N = start.shape[0]
        dev = self.device
        sched = self._chain_schedule(idx, mask)
        identity, sorted_steps, order_t = sched.identity, sched.sorted_steps, sched.order_t
        idx_t, mask_t, active, denom = sched.idx_t, sched.mask_t, sched.active, sched.denom
        lr_rows = lr_rows.to(dev)
        ordered = start[order_t] if not identity else start
        # Each parameter as its own (N, out, in) or (N, 1, out) tensor: its gradient then arrives as the batched
        # product computes it, where a flat (N, D) leaf would cost two copies of it per step (to lay the
        # transposed weight gradient out flat, and to concatenate the parameters' gradients).
        shapes = self._chain_shapes()
        flat = dict(zip(self.names, ordered.split(self.numels, dim=1)))
        params = {n: flat[n].reshape(N, *shapes[n]).clone() for n in self.names}
        anchor = {n: v.clone() for n, v in params.items()} if prox_mu else None
        tmp = {n: torch.empty_like(v) for n, v in params.items()}
        velocity: dict[str, torch.Tensor] = {}
        lr_o = lr_rows[order_t].unsqueeze(2)  # (N, 1, 1)
        active_o = active.unsqueeze(2)  # (S, N, 1)
        drop = [float(arg) for kind, arg in (self._plan or ()) if kind == "dropout"]  # type: ignore[arg-type]
        B = idx.shape[2]
        xbuf = self.X.new_empty((N * B, *self.X.shape[1:]))
        sq_o = None if sq is None else torch.zeros(N, dtype=torch.float64, device=self._acc)  # in sorted order
        mask_acc = None if sq is None else mask_t.to(self._acc)
        self.model.train()
        for step in range(idx.shape[0]):
            k = int((sorted_steps > step).sum())
            if k == 0:
                continue
            rows = order_t[:k]

            def noise(
                layer: int, h: torch.Tensor, step: int = step, k: int = k, rows: torch.Tensor = rows
            ) -> torch.Tensor | None:
                p = drop[layer]
                if p == 0.0:
                    return None  # F.dropout draws nothing and returns its input
                if p == 1.0:
                    return h.new_zeros(())
                full = masks(step, layer, p, h.shape[2])  # (N, B, width), in the clients' given order
                return full if (identity and k == N) else full[rows]

            ix = idx_t[step, :k].reshape(-1)
            x = torch.index_select(self.X, 0, ix, out=xbuf[: k * B]).view(k, B, *self.X.shape[1:])
            grads, losses = self._chain_step(
                {n: v[:k] for n, v in params.items()},
                x,
                noise,
                self.y[ix],
                mask_t[step, :k],
                denom[step, :k],
                sq_o is not None,
            )
            if sq_o is not None:
                assert mask_acc is not None and losses is not None
                sq_o[:k] += (self._f64(losses).square() * mask_acc[step, :k]).sum(1)
            # The update in place, into buffers kept across steps (each operation as the padded path writes it
            # out of place, so the same numbers; fresh tensors of this size would cost page faults every step).
            factor = lr_o[:k] * active_o[step, :k].unsqueeze(2)  # float32(lr) for the clients still training
            with torch.no_grad():
                for n, g in zip(self.names, grads):
                    cur, t = params[n][:k], tmp[n][:k]
                    if weight_decay:
                        g = g.add_(torch.mul(cur, weight_decay, out=t))
                    if prox_mu:
                        assert anchor is not None
                        g = g.add_(torch.sub(cur, anchor[n][:k], out=t).mul_(prox_mu))
                    if momentum:
                        if n not in velocity:
                            velocity[n] = g.clone()
                        else:
                            velocity[n][:k].mul_(momentum).add_(g)
                        if nesterov:
                            g = g.add_(torch.mul(velocity[n][:k], momentum, out=t))
                        else:
                            g = velocity[n][:k]
                    cur.sub_(torch.mul(g, factor, out=t))
        final = torch.cat([params[n].reshape(N, -1) for n in self.names], dim=1)
        if sq is not None and sq_o is not None:
            sq[order_t.to(sq.device)] = sq_o
        if identity:
            return final
        out_params = torch.empty_like(final)
        out_params[order_t] = final
        return out_params

    def _chain_step_by_hand(
        self,
        parts: Mapping[str, torch.Tensor],
        x: torch.Tensor,
        noise: Callable[[int, torch.Tensor], torch.Tensor | None],
        targets: torch.Tensor,
        mask: torch.Tensor,
        denom: torch.Tensor,
        want_losses: bool,
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """One chain step's gradients (and per-sample losses when wanted) by :meth:`_chain_grads`: the built-in
        cross-entropy on class labels. ``mask`` (k, B) and ``denom`` (k,) make each client's mean loss."""
        k, B = mask.shape
        # d objective / d loss_(c,b) = mask_(c,b) / denom_c, formed as autograd forms it
        weights = torch.ones(k, device=self.device).div_(denom).unsqueeze(1).expand(k, B) * mask
        seen: list[torch.Tensor] | None = [] if want_losses else None
        with torch.no_grad():
            grads = self._chain_grads(parts, x, noise, targets, weights, losses_out=seen)
        return grads, (seen[0] if seen else None)

    def _chain_step_autograd(
        self,
        parts: Mapping[str, torch.Tensor],
        x: torch.Tensor,
        noise: Callable[[int, torch.Tensor], torch.Tensor | None],
        targets: torch.Tensor,
        mask: torch.Tensor,
        denom: torch.Tensor,
        want_losses: bool,
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """One chain step's gradients (and per-sample losses) through autograd: any other loss."""
        k, B = mask.shape
        leaves = {n: v.detach().requires_grad_(True) for n, v in parts.items()}
        out = self._chain(leaves, x, noise)
        losses = self._losses(out.flatten(0, 1), targets).view(k, B)
        objective = ((losses * mask).sum(1) / denom).sum()
        grads = list(torch.autograd.grad(objective, list(leaves.values())))
        return grads, losses.detach()

    def _chain_grads(
        self,
        parts: Mapping[str, torch.Tensor],
        x: torch.Tensor,
        noise: Callable[[int, torch.Tensor], torch.Tensor | None],
        targets: torch.Tensor,
        weights: torch.Tensor,
        losses_out: list[torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """The gradient of ``sum_(c,b) weights_(c,b) CE(chain_c(x_(c,b)), targets_(c,b))`` by hand, per parameter.

        The chain's backward pass written out (no autograd graph): with ``p = softmax(z)`` the
        logits' gradient is ``weights * (p - onehot(target))``, a linear layer ``z = h W^T + b``
        passes ``W``'s gradient ``g^T h``, ``b``'s ``sum_b g`` and ``h``'s ``g W`` back, ReLU keeps
        the gradient where its output is positive and dropout multiplies it by its mask. Each
        operation is the one autograd runs for :meth:`_chain` under ``F.cross_entropy``
        (``nll_loss``'s backward, then ``_log_softmax_backward_data`` on the saved log-softmax,
        the same batched products and sums), so the gradients equal autograd's bit for bit
        (``tests/simulation/test_engine.py``); it saves building and walking the graph at every
        step. Parameters are ``(C, out, in)`` weights and ``(C, 1, out)`` biases, as in :meth:`_chain`;
        ``targets`` has ``C * B`` class labels and ``weights`` shape ``(C, B)``. A ``losses_out``
        list receives the ``(C, B)`` per-sample cross-entropies (``-log p[target]``, the values
        ``F.cross_entropy`` gives), which the gradient itself never forms.
        """
        C = x.shape[0]
        h = x.reshape(C, x.shape[1], -1)
        tape: list[tuple[str, Any, torch.Tensor]] = []
        n_dropout = 0
        for kind, arg in self._plan or ():
            if kind == "linear":
                w_name, b_name, _out_f, _in_f = arg  # type: ignore[misc]
                tape.append(("linear", arg, h))
                w = parts[w_name]
                if b_name is None:
                    h = torch.bmm(h, w.transpose(1, 2))
                else:
                    h = torch.baddbmm(parts[b_name], h, w.transpose(1, 2))
            elif kind == "relu":
                h = torch.relu(h)
                tape.append(("relu", None, h))
            elif kind == "dropout":
                m = noise(n_dropout, h)
                n_dropout += 1
                if m is not None:
                    h = h * m
                    tape.append(("mask", None, m))
        logp = torch.log_softmax(h.flatten(0, 1), 1)
        if losses_out is not None:
            losses_out.append(logp.gather(1, targets.reshape(-1, 1)).neg().view(C, -1))
        seed = torch.zeros_like(logp).scatter_(1, targets.reshape(-1, 1), weights.reshape(-1, 1).neg())
        g = torch.ops.aten._log_softmax_backward_data(seed, logp, 1, logp.dtype).view(h.shape)
        first = next(i for i, entry in enumerate(tape) if entry[0] == "linear")
        grads: dict[str, torch.Tensor] = {}
        for i in range(len(tape) - 1, first - 1, -1):
            kind, arg, saved = tape[i]
            if kind == "linear":
                w_name, b_name, _out_f, _in_f = arg
                grads[w_name] = torch.bmm(saved.transpose(1, 2), g).transpose(1, 2)
                if b_name is not None:
                    grads[b_name] = g.sum(1, keepdim=True)
                if i > first:
                    g = torch.bmm(g, parts[w_name])
            elif kind == "relu":
                g = torch.ops.aten.threshold_backward(g, saved, 0)
            else:
                g = g * saved
        return [grads[n] for n in self.names]

    # -- several runs at once ---------------------------------------------------------
    def batch_support(self) -> str | None:
        """Why this engine cannot train several runs as one computation (:meth:`train_runs`), or None if it can.

        Supported: stateless models that the engine runs on its hand-batched path (a
        Flatten/Linear/ReLU/Dropout chain: the built-in ``logistic`` and ``mlp``), whose dropout
        masks can be drawn from each run's own generator exactly as the run alone draws them,
        and the built-in ``cnn``, ``resnet-gn`` and ``cnn-flsim`` (without dropout), which draw no
        random numbers (GroupNorm normalises each sample by itself and keeps no running
        statistics). Other models may draw random numbers inside a vmapped forward (whose
        masks the engine cannot assign to runs) or carry state (batch norm).
        """
        from .models import FedCorCNN, FLSimCNN, ResNetGN

        if self.stateful:
            return f"the model {type(self.model).__name__} has buffers or normalisation layers (batch norm)"
        kind = type(self.model)
        no_randomness = kind in (FedCorCNN, ResNetGN) or (
            kind is FLSimCNN and not any(isinstance(m, nn.Dropout) and m.p > 0 for m in self.model.modules())
        )
        if self._plan is None and not no_randomness:
            return (
                f"the model {type(self.model).__name__} is not one the engine can batch across runs exactly (the "
                "built-in logistic, mlp, cnn, resnet-gn and cnn-flsim without dropout, or a module built by them)"
            )
        return None

    def batch_key(self) -> tuple[Any, ...]:
        """What engines must share to train in one :meth:`train_runs` call (besides equal data)."""
        return (
            type(self.model),
            tuple(self._plan or ()),
            tuple(self.names),
            tuple(map(tuple, self.shapes)),
            self.loss if isinstance(self.loss, str) else id(self.loss),
            self.classification,
            str(self.device),
            self._model_repr,
            self.path,
            getattr(self, "_compiled_step", None) and self._compiled_step.static,
        )

    def train_runs(
        self,
        thetas: Sequence[torch.Tensor],
        batches: Sequence[Sequence[Sequence[np.ndarray]]],
        *,
        lrs: Sequence[float],
        dropout_seeds: Sequence[int],
        weight_decay: float = 0.0,
        prox_mu: float = 0.0,
        momentum: float = 0.0,
        nesterov: bool = False,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Train the chosen clients of R runs (one global model each) in one batched computation.

        Run r's clients all start from its own global model ``thetas[r]`` and train on
        ``batches[r]`` (index arrays into this engine's ``X``) with step size ``lrs[r]``; the
        R x C_r clients are stacked into one ``(sum_r C_r, D)`` tensor and every local step is
        one forward and one backward pass for all of them, padded to the longest minibatch of
        any run (padded samples and finished clients are masked exactly as in :meth:`train`).
        Each client's arithmetic is the one :meth:`train` does for it, so run r's deltas equal
        ``train(thetas[r], batches[r], lr=lrs[r], dropout_seed=dropout_seeds[r], ...)`` up to
        float rounding (the matrix products are shaped differently), and bit for bit for one run.
        This is :meth:`train_many` with a generator per run, seeded with its dropout seed, for a
        model the engine can batch (:meth:`batch_support`).

        Dropout: :meth:`train` seeds torch's global generator with its ``dropout_seed`` and
        draws one mask of shape ``(C_r, B_r, H)`` per dropout layer and local step, ``B_r``
        being run r's longest minibatch. Here run r draws those very masks, in the same order,
        from its own ``torch.Generator`` seeded with ``dropout_seeds[r]`` (on the CPU,
        ``F.dropout(h, p)`` is ``h * bernoulli(1 - p) / (1 - p)`` drawn from the generator,
        which the tests check), and they are placed in its rows of the batch. The global
        generator is not touched.

        Parameters
        ----------
        thetas : sequence of Tensor, shape (D,)
            Each run's global model.
        batches : sequence (one per run) of lists (one per client) of lists of index arrays
            As in :meth:`train`, per run.
        lrs : sequence of float
            Each run's learning rate (runs may be in different rounds of a schedule).
        dropout_seeds : sequence of int
            Each run's dropout seed (as ``dropout_seed`` of :meth:`train`).
        weight_decay, prox_mu, momentum, nesterov
            As in :meth:`train`, shared by all runs.

        Returns
        -------
        deltas : list of Tensor, shape (C_r, D)
            Each run's local updates.
        generator_states : list of Tensor
            Each run's dropout generator state afterwards: what torch's global generator
            holds after :meth:`train` of that run alone.

        Raises
        ------
        ValueError
            The engine cannot batch runs (see :meth:`batch_support`).
        """
        why = self.batch_support()
        if why is not None:
            raise ValueError(f"Engine.train_runs: {why}")
        if nesterov and not momentum:
            raise ValueError("Engine.train_runs: nesterov=True needs momentum > 0")
        dev = self.device
        gens = [torch.Generator(device=dev).manual_seed(int(seed)) for seed in dropout_seeds]
        runs = self.train_many(
            thetas,
            batches,
            lrs=lrs,
            generators=gens,
            weight_decay=weight_decay,
            prox_mu=prox_mu,
            momentum=momentum,
            nesterov=nesterov,
        )
        # what torch's (CPU) global generator holds after train() of each run alone: on the CPU the masks come
        # from it, on another device from that device's generator, the CPU one only seeded
        if dev.type == "cpu":
            states = [g.get_state() for g in gens]
        else:
            states = [torch.Generator().manual_seed(int(seed)).get_state() for seed in dropout_seeds]
        return [run.deltas for run in runs], states

    @torch.no_grad()
    def test_runs(self, thetas: Sequence[torch.Tensor]) -> list[tuple[float, float | None]]:
        """(test loss, test accuracy) of several global models, in one pass over the test data.

        Equals ``[self.test(theta) for theta in thetas]`` up to float rounding: each chunk of
        ``eval_batch`` test samples goes through all R models at once (for a linear chain,
        the first layer is one matrix product with the R models' weights side by side; other
        models are vmapped over the R parameter vectors). Stateless models only (see
        :meth:`batch_support`).
        """
        why = self.batch_support()
        if why is not None:
            raise ValueError(f"Engine.test_runs: {why}")
        R = len(thetas)
        if R == 0:
            return []
        stacked = torch.stack([self._to_device(t.detach()) for t in thetas])
        was_training = self.model.training
        self.model.eval()
        try:
            losses: list[list[torch.Tensor]] = [[] for _ in range(R)]
            correct: list[list[torch.Tensor]] = [[] for _ in range(R)]
            many = vmap(self._forward, in_dims=(0, None)) if self._plan is None else None
            for i in range(0, self.X_test.shape[0], self.eval_batch):
                x = self.X_test[i : i + self.eval_batch]
                yy = self.y_test[i : i + self.eval_batch]
                out = self._chain_many(stacked, x) if many is None else many(stacked, x)  # (R, n, outputs)
                for r in range(R):
                    losses[r].append(self._losses(out[r], yy))
                    if self.classification:
                        correct[r].append(out[r].argmax(1) == yy)
        finally:
            self.model.train(was_training)
        # every run's loss and accuracy come back to the host in one copy
        means = [self._f64(torch.cat(losses[r])).mean() for r in range(R)]
        if self.classification:
            means += [self._f64(torch.cat(correct[r])).mean() for r in range(R)]
        values = torch.stack(means).tolist()
        return [(values[r], values[R + r] if self.classification else None) for r in range(R)]

    def _chain_many(self, stacked: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Evaluation-mode forward of R models of a linear chain on one input chunk: shape (R, n, outputs)."""
        R, n = stacked.shape[0], x.shape[0]
        parts = dict(zip(self.names, stacked.split(self.numels, dim=1)))
        h: torch.Tensor | None = None
        flat = x.reshape(n, -1)
        for kind, arg in self._plan or ():
            if kind == "linear":
                w_name, b_name, out_f, in_f = arg  # type: ignore[misc]
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

    def _length_groups(self, lengths: np.ndarray) -> list[list[tuple[int, torch.Tensor, torch.Tensor]]]:
        """Per local step, the clients grouped by minibatch length: ``(length, rows, rows_acc)`` with the rows
        on the device (and where float64 sums are taken), all moved there in one copy before the first step."""
        plan = [[(int(b), np.flatnonzero(row == b)) for b in np.unique(row[row > 0])] for row in lengths]
        flat = [rows for step in plan for _, rows in step]
        if not flat:
            return [[] for _ in plan]
        allrows = torch.from_numpy(np.concatenate(flat)).to(self.device)
        acc = allrows if self._acc == self.device else allrows.to(self._acc)
        sizes = [rows.size for rows in flat]
        on_dev, on_acc = iter(allrows.split(sizes)), iter(acc.split(sizes))
        return [[(b, next(on_dev), next(on_acc)) for b, _ in step] for step in plan]

    def _grouped_objective(
        self,
        p: torch.Tensor,
        bufs: dict[str, torch.Tensor],
        ix: torch.Tensor,
        groups: Sequence[tuple[int, torch.Tensor, torch.Tensor]],
        sq: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Sum over clients of their mean minibatch loss, one vmapped forward per minibatch length.

        ``groups`` is one step's :meth:`_length_groups`. Updates ``bufs`` (stacked per client) in
        place with each group's new buffers; adds each client's squared per-sample losses to
        ``sq`` when given.
        """
        total = p.new_zeros(())
        for b, g, g_acc in groups:
            sub = {k: v[g] for k, v in bufs.items()}  # copies: the forward updates them in place
            xi = ix[g, :b]
            out = self._forward_state_all(p[g], sub, self.X[xi])
            losses = self._losses(out.flatten(0, 1), self.y[xi].flatten(0, 1)).view(g.shape[0], b)
            total = total + losses.mean(1).sum()
            if sq is not None:
                sq[g_acc] += self._f64(losses.detach()).square().sum(1)
            for k, v in sub.items():
                bufs[k][g] = v
        return total

    # -- evaluation -----------------------------------------------------------------
    @torch.no_grad()
    def _per_sample(
        self,
        flat: torch.Tensor,
        X: torch.Tensor,
        y: torch.Tensor,
        buffers: Mapping[str, torch.Tensor] | None = None,
        rows: torch.Tensor | None = None,
        accuracy: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-sample losses (and correctness, when ``accuracy`` and classifying) of ``X``, ``y`` (or of their
        ``rows``, gathered one chunk at a time)."""
        flat = self._to_device(flat)
        bufs = None if buffers is None else self._buffers_on_device(buffers)
        was_training = self.model.training
        self.model.eval()
        try:
            losses: list[torch.Tensor] = []
            correct: list[torch.Tensor] | None = [] if accuracy and self.classification else None
            n = X.shape[0] if rows is None else rows.shape[0]
            for i in range(0, n, self.eval_batch):
                at = slice(i, i + self.eval_batch) if rows is None else rows[i : i + self.eval_batch]
                out = self._forward(flat, X[at], bufs)
                yy = y[at]
                losses.append(self._losses(out, yy))
                if correct is not None:
                    correct.append(out.argmax(1) == yy)
            return torch.cat(losses), (None if correct is None else torch.cat(correct))
        finally:
            self.model.train(was_training)

    def client_losses(
        self,
        flat: torch.Tensor,
        clients: np.ndarray | None = None,
        buffers: Mapping[str, torch.Tensor] | None = None,
    ) -> np.ndarray:
        """l_k(flat) for every client (or for ``clients``): one pass with a per-client reduction.

        ``buffers`` are the global buffers to evaluate with (default: the initial ones). The losses
        come back to the host in one copy.
        """
        acc, pool = self._acc, self.loss_pool
        if clients is None:  # one forward over the distinct loss samples, then a per-client sum
            losses, _ = self._per_sample(flat, *pool.rows(self.X, self.y), buffers, accuracy=False)
            return pool.reduce(losses, acc).cpu().numpy()
        clients = np.asarray(clients, dtype=np.int64)
        if clients.size == 0:
            return np.zeros(0)
        order, inverse, owner = pool.subset(clients)  # gathered chunk by chunk in _per_sample
        rows = torch.from_numpy(order).to(self.device)
        losses, _ = self._per_sample(flat, self.X, self.y, buffers, rows=rows, accuracy=False)
        return segment_means(losses, inverse, owner, self.eval_sizes[clients], acc).cpu().numpy()

    def test(self, flat: torch.Tensor, buffers: Mapping[str, torch.Tensor] | None = None) -> tuple[float, float | None]:
        """(test loss, test accuracy) of ``flat`` (with ``buffers``); the accuracy is None for float targets.

        Both come back to the host in one copy."""
        losses, correct = self._per_sample(flat, self.X_test, self.y_test, buffers)
        if correct is None:
            return float(self._f64(losses).mean()), None
        loss, accuracy = torch.stack([self._f64(losses).mean(), self._f64(correct).mean()]).tolist()
        return loss, accuracy


def _lr_rows(lrs: Sequence[float], sizes: Sequence[int]) -> torch.Tensor:
    """Each client's step size as a float32 column: float32(lr), what ``lr * tensor`` multiplies by for a
    Python float ``lr`` (an lr beyond float32's range becomes inf, as it does there)."""
    values = np.repeat(np.asarray(lrs, dtype=np.float64), np.asarray(sizes, dtype=np.int64))
    with np.errstate(over="ignore"):
        return torch.from_numpy(values.astype(np.float32).reshape(-1, 1))


def _global_dropout_masks(
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


def _rows(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The runs' rows as one new tensor: ``parts`` concatenated along dim 0."""
    return torch.cat(list(parts))


def _check_model(model: nn.Module) -> None:
    """Layers the batched engine cannot train, refused with what to do instead."""
    from torch.nn.modules.lazy import LazyModuleMixin

    for name, m in model.named_modules():
        where = f"layer {name!r} ({type(m).__name__})" if name else type(m).__name__
        if isinstance(m, LazyModuleMixin) and m.has_uninitialized_params():
            raise ValueError(
                f"the model's {where} is a lazy module whose parameters are not initialised yet; run one forward pass "
                "on a batch of inputs (model(torch.zeros(2, *input_shape))) before passing the model"
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


def _compiled_refusal_message(model: nn.Module, loss: Any) -> str:
    return (f"path='compiled' compiles the local step of a Flatten/Linear/ReLU/Dropout chain (the built-in "
            f"logistic and mlp) trained with loss='cross-entropy' on class labels; the model "
            f"{type(model).__name__} with loss={loss!r} trains on the eager path only (path='eager')")


def compiled_path_refusal(model: nn.Module, loss: Any = "cross-entropy") -> str | None:
    """Why ``Engine(path="compiled")`` would refuse ``model`` trained with ``loss``, or None when it takes them.

    The same rule the Engine applies when it is built (a Flatten/Linear/ReLU/Dropout chain, the built-in
    cross-entropy), checked without data, so that a comparison can refuse a plan before any run trains; the
    Engine also needs class labels (integer targets), which only the data can tell.
    """
    try:
        by_hand = resolve_loss(loss) is _cross_entropy
    except ValueError as exc:
        return str(exc)
    if not by_hand or _linear_chain(model, [n for n, _ in model.named_parameters()]) is None:
        return _compiled_refusal_message(model, loss)
    return None


def _linear_chain(model: nn.Module, names: list[str]) -> list[tuple[str, object]] | None:
    """A plan for :meth:`Engine._forward_chain` if ``model`` is a Flatten/Linear/ReLU/Dropout chain, else None.

    The model must consist of one ``nn.Sequential`` (or a single ``nn.Linear``) whose forward
    flattens its input first; this covers the built-in ``logistic`` and ``mlp`` models.
    """
    from .models import FedCorMLP, LogisticRegression

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
    plan: list[tuple[str, object]] = []
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
    used = {n for kind, arg in plan if kind == "linear" for n in arg[:2] if n is not None}  # type: ignore[index]
    return plan if used == set(names) else None
