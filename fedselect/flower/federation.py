"""FederationClients: a fedselect Federation's clients as a Flower ClientApp, training with the simulator's Engine."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, MetricRecord
from flwr.clientapp import ClientApp

from .._validation import renamed
from ..simulation._compiled import PATHS
from ..simulation.engine import Engine, LocalSchedule, resolve_device
from ..simulation.trainer import build_engine
from . import _protocol as P
from .client import make_client_app

__all__ = ["FederationClients"]


class FederationClients:
    """Every client of a :class:`~fedselect.data.Federation`, served through Flower.

    Client k (a node whose ``partition-id`` is k) trains on ``federation.client_indices[k]``
    with the simulator's :class:`~fedselect.simulation.engine.Engine`: the same model
    initialisation, minibatch stream ``(seed, t, k)``, learning rate and arithmetic as
    :class:`fedselect.FederatedTrainer` with the same ``random_state``, one client at a time.
    Its loss is measured on its evaluation part (``federation.loss_indices[k]``). This is
    how the same experiment runs in simulation and on Flower; each process (a Ray worker, a
    SuperNode) builds its own Engine once.

    Parameters
    ----------
    federation : Federation or callable
        The federation, or a function returning it (called once per process: a SuperNode
        loads its data itself).
    model, model_params, local_steps, local_epochs, batch_size, lr, weight_decay, prox_mu, random_state
        As in :class:`fedselect.FederatedTrainer` (a constant learning rate; ``lr`` may be
        overridden per round by the train config key ``"lr"``). ``model`` is a registered
        name or a builder, called as ``model(input_shape, n_outputs, **model_params)`` under
        ``random_state``, or a ``torch.nn.Module`` used as given (``model_params`` is then
        refused, as by the trainer).
    device : str or torch.device, default "cpu"
        Where this process trains and evaluates, as ``FederatedTrainer(device=...)``: checked here,
        before any message (a device the machine lacks is a ``ValueError`` naming those it has);
        replies leave as CPU arrays. Each SuperNode resolves ``"auto"`` on its own machine.
    path : {"eager", "compiled"}, default "eager"
        How this process computes a local step, as ``FederatedTrainer(path=...)``: the bit-stable
        eager reference, or each step one ``torch.compile`` graph (the built-in ``logistic`` and ``mlp``
        with cross-entropy; compiled once per process, rounded differently from eager, so its clients'
        updates are not the eager simulator's bits). A value not in the list is a ``ValueError`` here;
        a model the compiled path does not take is refused where the server builds the initial model,
        before any message. See :ref:`devices_compiled`. ``engine=`` is its former name (warns).
    pooled_losses : bool, default True
        Measure l_k as the simulator does when it asks every client at once: one forward pass
        over the whole federation's evaluation data, row k (cached per model within a
        process). This is what makes the Flower path choose the simulator's clients: with
        ``pooled_losses=False`` the client measures its loss in a forward pass over its own
        evaluation data only, which is what a real client would do, but matrix products of
        other shapes round differently in the last bits (about 1e-8), and that is enough to
        flip FedCor's GP argmax: on digits with 10 clients (the example's settings otherwise),
        the two worlds part at the first GP round on every seed tried (seeds 0-5), while with
        the default they agree on every round. Exactly: a loss the simulator computes for
        every client in one pass (FedCor's GP and trial rounds, ``track_global_loss``) is the
        pooled value to the last bit; a loss it computes for a subset (power-of-choice's
        candidates, the chosen clients' losses in the feedback) comes from a pass over those
        clients' rows only and can differ in the last bits from both, so a choice between two
        clients whose losses are that close can still differ. The price: each loss query
        evaluates the whole federation's evaluation data instead of the client's share (a
        forward pass over 60,000 Fashion-MNIST rows takes about 0.15 s with the MLP on one
        CPU thread, against 0.02 s for a tenth of them), once per model per process.

    Attributes
    ----------
    buffer_names : list of str
        The model's buffers, e.g. batch norm's ``running_mean``, ``running_var`` and
        ``num_batches_tracked`` (empty without): pass them as ``SelectorStrategy(buffers=...)``.

    Notes
    -----
    Batch norm: :meth:`initial_arrays` holds the parameters, then the buffers in their own
    dtypes. A client trains from the parameters and buffers it receives, in train mode,
    and reports its parameter update and ``b_k - b^t`` for each buffer (see
    :mod:`fedselect.flower._protocol`); the strategy averages the buffers as the simulator
    does. Losses and :meth:`evaluate_fn` run in eval mode with the buffers received (the
    global ones). The simulator trains a round's clients together in one vmapped pass,
    whose batched products round differently in the last bits from one client's, so with
    a batch-norm model the two worlds agree on clients and costs but their models only to
    float rounding (without buffers or normalisation layers they agree to the last bit).

    A model with dropout trains with other masks than the simulator's (which draws masks
    for all chosen clients at once), so only dropout-free models reproduce it exactly.
    """

    def __init__(
        self,
        federation: Any,
        *,
        model: str | torch.nn.Module | Callable[..., torch.nn.Module] = "mlp",
        model_params: Mapping[str, Any] | None = None,
        local_steps: int | None = None,
        local_epochs: int | None = None,
        batch_size: int = 32,
        lr: float = 0.05,
        weight_decay: float = 0.0,
        prox_mu: float = 0.0,
        random_state: int = 0,
        pooled_losses: bool = True,
        device: str | torch.device = "cpu",
        path: str = "eager",
        engine: str | None = None,
    ) -> None:
        path = renamed("FederationClients", "engine", engine, "path", path, "eager")  # engine=: the former name
        if local_steps is not None and local_epochs is not None:
            raise ValueError("FederationClients: set local_steps or local_epochs, not both")
        if not isinstance(path, str) or path not in PATHS:
            raise ValueError(f"FederationClients: path={path!r} is not one of {list(PATHS)}")
        self.device = resolve_device(device)
        self.engine_path = path
        self._federation = federation
        self.model = model
        self.model_params = dict(model_params or {})
        self.schedule = (
            LocalSchedule(batch_size, steps=local_steps)
            if local_steps is not None
            else LocalSchedule(batch_size, epochs=local_epochs or 1)
        )
        self.lr = float(lr)
        self.weight_decay = float(weight_decay)
        self.prox_mu = float(prox_mu)
        self.seeds = np.random.SeedSequence(int(random_state)).generate_state(3)
        self.pooled_losses = bool(pooled_losses)
        self._pooled: tuple[bytes, np.ndarray] | None = None
        self._engine: Engine | None = None
        self._fed: Any = None

    # -- lazily built, once per process -----------------------------------------------
    @property
    def federation(self) -> Any:
        if self._fed is None:
            fed = self._federation
            self._fed = fed() if callable(fed) else fed
        return self._fed

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            fed = self.federation
            torch.manual_seed(int(self.seeds[2]))
            # The trainer's start, its checks included: a batch norm that cannot normalise one sample
            # would make every client with a one-sample minibatch fail inside Flower; this says so
            # where the server builds the initial model, before any message is sent.
            self._engine = build_engine(
                self.model,
                self.model_params,
                fed,
                batch_size=self.schedule.batch_size,
                local_steps=self.schedule.steps,
                owner="FederationClients",
                device=self.device,
                path=self.engine_path,
            )
        return self._engine

    @property
    def buffer_names(self) -> list[str]:
        """The model's buffers (batch norm statistics) as named in :meth:`initial_arrays`: pass them to
        ``SelectorStrategy(buffers=...)``. Empty for a model without buffers."""
        return list(self.engine.buffers)

    def _flat(self, arrays: list[np.ndarray]) -> torch.Tensor:
        """The parameters of a model's arrays (in :meth:`initial_arrays`' order: parameters, then buffers)."""
        arrays = arrays[: len(self.engine.names)]
        return torch.from_numpy(np.concatenate([np.asarray(a, dtype=np.float32).reshape(-1) for a in arrays]))

    def _buffers(self, arrays: list[np.ndarray]) -> dict[str, torch.Tensor] | None:
        """The buffers of a model's arrays by name, in their own dtypes (None for a model without)."""
        eng = self.engine
        if not eng.buffers:
            return None
        values = arrays[len(eng.names) :]
        if len(values) != len(eng.buffers):
            raise ValueError(
                f"FederationClients: a model of {len(arrays)} arrays; expected {len(eng.names)} "
                f"parameters and {len(eng.buffers)} buffers ({', '.join(eng.buffers)})"
            )
        return {
            n: torch.as_tensor(np.array(v, dtype=b.numpy().dtype)) for (n, b), v in zip(eng.buffers.items(), values)
        }

    def _split(self, flat: torch.Tensor) -> list[np.ndarray]:
        return [t.numpy().copy() for t in self.engine.unflatten(flat.detach()).values()]

    # -- what a ServerApp needs -------------------------------------------------------
    def initial_arrays(self) -> ArrayRecord:
        """The initial global model: one array per parameter (the simulator's order), then one per buffer.

        Buffers keep their dtype (batch norm's ``num_batches_tracked`` is int64); name them to
        the strategy with ``SelectorStrategy(buffers=clients.buffer_names)``.

        Raises
        ------
        ValueError
            When the model cannot run on the federation's data, or has a batch norm layer that
            cannot normalise one sample while the schedule would give some client a
            one-sample minibatch (the check :class:`fedselect.FederatedTrainer` makes); this
            is raised here, on the server, before any client trains.
        """
        eng = self.engine
        flat = eng.initial_parameters()
        arrays = {n: Array(a) for n, a in zip(eng.names, self._split(flat))}
        arrays.update({n: Array(P.contiguous(b.numpy().copy())) for n, b in eng.buffers.items()})
        return ArrayRecord(array_dict=arrays)

    def n_samples(self, k: int) -> int:
        return int(self.federation.n_samples[k])

    def train(self, parameters: list[np.ndarray], config: dict[str, Any], context: Context):
        """Train client ``partition-id`` from ``parameters``; returns its update and its cost counts.

        When the server asks (``config["fedselect-need-sample-loss"]``), the metrics also hold
        ``"fedselect-sample-loss-sq"``, computed by :meth:`Engine.train
        <fedselect.simulation.engine.Engine.train>` with ``sample_losses=True`` during the same
        training, exactly as the simulator computes it for Oort.
        """
        k = int(context.node_config["partition-id"])
        t = int(config.get("fedselect-round", int(config.get("server-round", 1)) - 1))
        purpose = str(config.get("fedselect-purpose", "main"))
        eng = self.engine
        batches = eng.client_batches(self.federation.client_indices, self.schedule, int(self.seeds[0]), t, [k])
        tag = {"main": 0, "trial": 1}.get(purpose, 2)
        dropout_seed = int(np.random.SeedSequence([int(self.seeds[0]), t, tag]).generate_state(1)[0])
        buffers = self._buffers(parameters)
        sample_losses = bool(config.get(P.NEED_SAMPLE_LOSS, False))
        out = eng.train(
            self._flat(parameters),
            batches,
            lr=float(config.get("lr", self.lr)),
            weight_decay=self.weight_decay,
            prox_mu=self.prox_mu,
            dropout_seed=dropout_seed,
            buffers=buffers,
            return_buffers=True,
            sample_losses=sample_losses,
        )
        deltas, client_buffers = out[0], out[1]
        metrics: dict[str, Any] = {
            P.STEPS: len(batches[0]),
            P.SAMPLE_GRADIENTS: int(sum(len(b) for b in batches[0])),
        }
        if sample_losses:  # the simulator's own value: the same Engine.train, bit for bit
            metrics[P.SAMPLE_LOSS_SQ] = float(out[2][0])
        # Buffers report b_k - b^t too (see fedselect.flower._protocol): the subtraction the server's average
        # starts with, done here in the buffer's dtype.
        buffer_deltas = [P.buffer_delta(client_buffers[n][0].numpy(), b.numpy()) for n, b in (buffers or {}).items()]
        return self._split(deltas[0]) + buffer_deltas, metrics

    def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any], context: Context):
        """l_k on client ``partition-id``'s evaluation data."""
        k = int(context.node_config["partition-id"])
        eng = self.engine
        flat = self._flat(parameters)
        buffers = self._buffers(parameters)
        if not self.pooled_losses:
            return float(eng.client_losses(flat, np.array([k]), buffers)[0]), int(eng.eval_sizes[k])
        digest = hashlib.sha1(flat.numpy().tobytes())
        for b in (buffers or {}).values():
            digest.update(b.numpy().tobytes())
        key = digest.digest()
        if self._pooled is None or self._pooled[0] != key:
            self._pooled = (key, eng.client_losses(flat, None, buffers))
        return float(self._pooled[1][k]), int(eng.eval_sizes[k])

    def client_app(self) -> ClientApp:
        """The ClientApp (see :func:`~fedselect.flower.make_client_app`)."""
        return make_client_app(
            self.train,
            self.evaluate,
            num_examples=lambda ctx: self.n_samples(int(ctx.node_config["partition-id"])),
            train_returns="update",
        )

    def evaluate_fn(self) -> Callable[[int, ArrayRecord], MetricRecord]:
        """A centralised evaluation for ``Strategy.start``: test loss and accuracy of the global model."""

        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
            eng = self.engine
            values = [arrays[n].numpy() for n in [*eng.names, *eng.buffers]]
            loss, acc = eng.test(self._flat(values), self._buffers(values))
            return MetricRecord({"test-loss": loss, "test-accuracy": acc})

        return evaluate
