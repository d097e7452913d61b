"""The engine's façade: :class:`Engine` holds the data on its device and the model's layout, lays each round's
local training out, and hands the computing to the path it chose once (:func:`.paths.choose_path`)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.nn.modules.batchnorm import _NormBase

from ...devices import resolve_device
from .._pool import LossPool, segment_means
from .admission import Admission
from .base import LocalPath, LocalRound, Workspace
from .chain import LinearChain, Noise
from .compiled import PATHS
from .local import LocalSchedule, LocalTraining
from .losses import LossFn, check_losses, resolve_loss
from .paths import choose_path

__all__ = ["Engine"]


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
        ``torch.compile``): each local step is one inductor graph (:mod:`fedselect.simulation.engine.compiled`);
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
    path : str
        ``"eager"`` or ``"compiled"``, as given (what a run's settings record).
    chain : LinearChain or None
        The model read as a Flatten/Linear/ReLU/Dropout chain (:mod:`.chain`), None for any other model.
    local_path : LocalPath
        How local SGD is computed, chosen once here (:func:`.paths.choose_path`): a
        :class:`~.chain_path.ChainPath`, :class:`~.compiled.CompiledChainPath`, :class:`~.vmap.PaddedPath` or
        :class:`~.vmap.GroupedPath`; its ``name`` says which.
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
        Admission(model, loss).refuse_layers()
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
        # vmap only the forward pass; one ordinary backward over the sum of the clients' losses gives each client
        # exactly its own gradient (the clients share no parameters; see .vmap)
        self._forward_all = vmap(self._forward, in_dims=(0, 0), randomness="different")
        self._forward_state_all = vmap(self._forward_state, in_dims=(0, 0, 0), randomness="different")
        # Models that are a plain chain of Flatten / Linear / ReLU / Dropout (logistic regression, FedCor's MLP)
        # are computed by hand with batched products, which avoids functorch's per-op dispatch (.chain)
        self.chain = LinearChain.of(self.model, self.names, self.numels)
        self._model_repr = repr(model)  # the layers' options (GroupNorm's groups...): part of the batch key
        if self.chain is not None:
            self._forward_all = self.chain.forward_flat
        # How a local step is computed is chosen once, here: the chain path (compiled or not), or vmap with every
        # client padded (stateless) or grouped by minibatch length (batch statistics)
        work = Workspace(self.X, self.y, self.device, self._acc, self._losses)
        self.local_path: LocalPath = choose_path(
            work,
            self.model,
            self.chain,
            loss=loss,
            classification=self.classification,
            stateful=self.stateful,
            forward_all=self._forward_all,
            forward_state_all=self._forward_state_all,
            forward=self._forward,
            compiled=path == "compiled",
            static=self.device.type == "cuda" if static_steps is None else bool(static_steps),
        )
        self.min_batch_size = Admission(self.model, loss).probe(
            self.X,
            self.y,
            self.initial_parameters().to(self.device),
            self._device_buffers,
            stateful=self.stateful,
            forward=self._forward,
            forward_all=self._forward_all,
            forward_state_all=self._forward_state_all,
            losses=self._losses,
        )

    def _losses(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Per-sample losses; a user's loss is checked to return one value per sample."""
        values = self._loss_fn(outputs, targets)
        if isinstance(self.loss, str):
            return values
        return check_losses(values, outputs.shape[0], self.loss)

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

    def _forward(
        self, flat: torch.Tensor, x: torch.Tensor, buffers: Mapping[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        return functional_call(
            self.model, (self.unflatten(flat), self._device_buffers if buffers is None else buffers), (x,)
        )

    def _forward_state(self, flat: torch.Tensor, buffers: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        # one client's forward with its own buffers; batch norm updates them in place (under vmap: its copy)
        return functional_call(self.model, (self.unflatten(flat), buffers), (x,))

    # -- the chain's pieces, under the names tests and benchmarks compare them with autograd by ----------------
    @property
    def _plan(self) -> list[tuple[str, Any]] | None:
        """The chain's plan of layers (:attr:`LinearChain.plan <.chain.LinearChain.plan>`), None for another model."""
        return None if self.chain is None else self.chain.plan

    def _forward_chain(self, stacked: torch.Tensor, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        assert self.chain is not None
        return self.chain.forward_flat(stacked, x, noise)

    def _chain(self, parts: Mapping[str, torch.Tensor], x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        assert self.chain is not None
        return self.chain.forward(parts, x, noise)

    def _chain_grads(self, parts: Mapping[str, torch.Tensor], x: torch.Tensor, noise: Noise, *args: Any) -> list:
        assert self.chain is not None
        return self.chain.gradients(parts, x, noise, *args)

    @property
    def _compiled_step(self) -> Any:
        return getattr(self.local_path, "compiled_step", None)

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
        epochs over unequal clients, a step costs one forward pass per distinct length. On the CPU a
        stateless model with a convolution trains one client after another, unpadded (:mod:`.per_client`).

        A Flatten/Linear/ReLU/Dropout chain skips the padding of finished clients: from the step
        where a client has no minibatch left it is left out of the batched products (its
        parameters cannot move any more), and the dropout masks are still drawn for every
        client at every step, so the result is the padded computation's bit for bit. On
        Dirichlet splits, where clients' local epochs differ in length, the padded computation
        costs ``C * max_k s_k`` sample steps for ``sum_k s_k`` real ones (s_k: client k's
        samples over its local epochs); the skip brings it back to the real ones. With the
        built-in cross-entropy loss, the chain's backward pass is written out by hand
        (:func:`~fedselect.simulation.engine.chain.chain_backward`, the same operations autograd runs, so the
        same bits); other
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
        chain by the hand-batched products of its chain path (finished clients stop computing), any
        other model by a vmapped path (``torch.func.vmap`` of the forward pass; a model with
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
                return self.local_path.draw_masks(N, B, step, layer, p, width, device=dev, generator=gens[0])
            # run r's mask has its own shape (C_r, B_r, width), drawn only while run r has steps left
            out = torch.ones((N, B, width), device=dev, dtype=self.local_path.mask_dtype)
            for r in range(S):
                if step < run_steps[r] and sizes[r]:
                    m = self.local_path.draw_masks(
                        sizes[r], run_width[r], step, layer, p, width, device=dev, generator=gens[r]
                    )
                    out[offsets[r] : offsets[r + 1], : run_width[r]] = m
            return out

        # sums of squared per-sample losses, one per client (only when asked: nothing is computed otherwise)
        sq = torch.zeros(N, dtype=torch.float64, device=self._acc) if sample_losses else None
        was_training = self.model.training
        self.model.train()
        try:
            rnd = LocalRound(
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
            final = self.local_path.sgd(rnd)
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
        from ..models import FedCorCNN, FLSimCNN, ResNetGN

        if self.stateful:
            return f"the model {type(self.model).__name__} has buffers or normalisation layers (batch norm)"
        kind = type(self.model)
        no_randomness = kind in (FedCorCNN, ResNetGN) or (
            kind is FLSimCNN and not any(isinstance(m, nn.Dropout) and m.p > 0 for m in self.model.modules())
        )
        if self.chain is None and not no_randomness:
            return (
                f"the model {type(self.model).__name__} is not one the engine can batch across runs exactly (the "
                "built-in logistic, mlp, cnn, resnet-gn and cnn-flsim without dropout, or a module built by them)"
            )
        return None

    def batch_key(self) -> tuple[Any, ...]:
        """What engines must share to train in one :meth:`train_runs` call (besides equal data)."""
        return (
            type(self.model),
            tuple(self.names),
            tuple(map(tuple, self.shapes)),
            self.loss if isinstance(self.loss, str) else id(self.loss),
            self.classification,
            str(self.device),
            self._model_repr,
            self.path,
            self.local_path.key(),
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
            many = vmap(self._forward, in_dims=(0, None)) if self.chain is None else None
            for i in range(0, self.X_test.shape[0], self.eval_batch):
                x = self.X_test[i : i + self.eval_batch]
                yy = self.y_test[i : i + self.eval_batch]
                out = self.chain.forward_many(stacked, x) if many is None else many(stacked, x)  # (R, n, outputs)
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


def _rows(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The runs' rows as one new tensor: ``parts`` concatenated along dim 0."""
    return torch.cat(list(parts))
