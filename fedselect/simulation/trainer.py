"""FederatedTrainer: a fast FedAvg / FedProx simulator that consumes any selector and counts its costs."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
import torch
from sklearn.base import BaseEstimator
from typing_extensions import Self

from .._validation import Constraint, InstanceOf, Interval, StrOptions
from ..ledger import PARTIAL_WEIGHTS
from ..optim import LocalSGD
from ..selection import BaseSelector
from ._compiled import PATHS
from .engine import DEVICE_CONSTRAINTS, LOSSES
from .loop import DivergenceError, TrainedNobodyWarning, _Fit, lr_at

# Names that moved out of this module and stay importable from it (and patchable in tests): the fit's loop
# (loop.py), building the run (setup.py), resuming it (resume.py).
from .models import build_model as build_model
from .resume import CHECKPOINT_FILE as CHECKPOINT_FILE
from .setup import build_engine as build_engine
from .setup import build_initial_model as build_initial_model
from .setup import check_single_sample_batches as check_single_sample_batches
from .transport import SimulationOracle, TestRequest, TrainingRequest

__all__ = [
    "DivergenceError",
    "FederatedTrainer",
    "SimulationOracle",
    "TestRequest",
    "TrainedNobodyWarning",
    "TrainingRequest",
    "lr_at",
]

_AGGREGATIONS = ("mean", "data-size")
STRAGGLER_POLICIES = ("fail", "overselect")
CHOOSE_AMONG = ("online", "all")
FEEDBACK_LOSSES = ("auto", "always")  # FederatedTrainer(feedback_losses=...)


class _SelectorSpecs(Constraint):
    """A selector in any form :func:`fedselect.plugins.resolve_selector` takes (names are looked up at fit)."""

    def is_satisfied_by(self, value: Any) -> bool:
        from ..plugins import is_selector_spec_shape

        return is_selector_spec_shape(value)

    def __str__(self) -> str:
        return ("a registered selector name, a (name, params) pair, a BaseSelector instance or subclass, "
                "or a (class, params) pair")

    def invalid_examples(self) -> list[Any]:
        return [object(), 1.5, ("random",), (int, {})]


class FederatedTrainer(BaseEstimator):
    """Simulate federated training with a client-selection scheme and count what it costs.

    Each round t the selector chooses clients (asking the paid :class:`~fedselect.ClientOracle` if it wants), they
    train from w^t in one batched computation, their deltas make w^{t+1} (tested), and the selector learns.

    Parameters
    ----------
    selector : str, tuple, BaseSelector or BaseSelector subclass, default None
        The scheme: a registered name (``"power-of-choice"``), a ``(name, params)`` pair, an instance, a class, or
        a ``(class, params)`` pair (:func:`fedselect.plugins.resolve_selector`); None means uniform random. ``fit``
        trains a clone, never the given object; ``set_params(selector__d=10)`` works for every form.
    model : str, torch.nn.Module or callable, default "mlp"
        A registered model name (``"logistic"``, ``"mlp"``, ``"cnn"``) or a builder
        ``model(input_shape, n_outputs, **model_params) -> nn.Module``, built under ``random_state``; or a module,
        used as given (its parameters are w^0; ``fit`` never changes it). See :ref:`user_guide_training_options`.
    model_params : dict, optional
        Passed to the model builder (e.g. ``{"dropout": 0.5}``).
    loss : {"cross-entropy", "mse"} or callable, default "cross-entropy"
        The per-sample loss of local training, of the losses selectors see and of the test loss: cross-entropy
        (integer labels), the squared error (a regression federation, no accuracy), or ``loss(outputs, targets)``
        returning the m per-sample losses (see :ref:`user_guide_training_options`).
    clients_per_round : int, default 5
        C, the number of clients asked for each round.
    rounds : int, default 100
        Maximum number of rounds.
    local_steps, local_epochs : int, optional
        Local work per client per round: a fixed number of SGD steps, or epochs over the
        client's data (partial last batch). Exactly one may be set; default 1 epoch.
    batch_size : int, default 32
    lr : float, default 0.05
        Local SGD learning rate.
    momentum : float, default 0.0
        Local SGD momentum m in [0, 1) (heavy ball, dampening 0, as ``torch.optim.SGD``); the buffer starts empty
        each round, so it acts within one client's local steps only (no server momentum). 0 is plain SGD.
    nesterov : bool, default False
        Nesterov momentum (needs ``momentum > 0``).
    lr_schedule : None, "fedcor", mapping or callable
        See :func:`lr_at`.
    weight_decay : float, default 0.0
        L2 penalty added to each local gradient.
    aggregation : {"data-size", "mean"}, default "data-size"
        How deltas are weighted when the selection carries no weights: by n_k over the
        chosen clients (FedAvg) or uniformly (FedCor's Eq. 4). Duplicated draws count
        with their multiplicity. Weights a selection carries are applied as given.
    prox_mu : float, default 0.0
        FedProx's proximal term coefficient (0 = FedAvg).
    optimizer : LocalSGD, optional
        The local optimiser's settings as one value (:class:`fedselect.LocalSGD`); the five flat keywords
        above (``lr``, ``momentum``, ``nesterov``, ``weight_decay``, ``prox_mu``) are deprecated spellings of
        it (they warn when set, and setting both is an error). A run's key and settings hold the flat values.
    target_accuracy : float, optional
        Stop once the test accuracy reaches it (when ``stop_at_target``).
    stop_at_target : bool, default True
    time_budget : float or None, default None
        Seconds of simulated time a run may use: it stops after the first round whose end
        (``sim_time``) reaches the budget, or at ``rounds``, whichever comes first, so every scheme
        of a comparison is observed for the same simulated time (see :ref:`user_guide_time`).
        A round that is not evaluated (``eval_every``) records no accuracy even when it is the
        last. None: the round cap alone. Needs a clock.
    eval_every : int, default 1
        Evaluate the test set every this many rounds (and at the last round).
    track_global_loss : bool, default False
        Record sum_k p_k l_k(w^{t+1}) each evaluated round (bookkeeping, not charged).
    feedback_losses : {"auto", "always"}, default "auto"
        When the chosen clients evaluate l_k(w^t) before training (computed, charged, timed;
        ``RoundFeedback.losses``): ``"auto"`` only for a selector whose ``needs`` has ``"losses"``,
        ``"always"`` every round (how every run before this option was charged). See :ref:`user_guide_time`.
    random_state : int or None
        Seeds the model initialisation (not of a module instance), the minibatch streams, dropout, and any selector
        whose own random_state is None: one seed gives the same run bit for bit on one machine.
    progress : bool, default False
        Show a progress bar of the rounds, on a terminal or in a notebook only: when stderr is
        redirected to a file there is no bar (its redraws would fill the log).
    n_threads : int or None, default 1
        torch intra-op threads during ``fit`` (restored afterwards). One thread by default: the
        batched small models fedselect trains gain nothing from more on an idle machine, and
        torch's own count (every core) was reported 10-80x slower when another process uses the
        cores (``benchmarks/speed/bench_threads.py`` times both). None keeps torch's setting; raise it for one
        large model (a CNN on 32x32 images) on cores nothing else uses, and run grids with
        ``--jobs`` rather than more threads. Not part of a run's key; it changes only how
        torch splits float sums.
    callback : callable, optional
        Called as ``callback(trainer, record)`` after every round.
    client_dropout : float, default 0.0
        Client failures (not the model's dropout layers, set in ``model_params``): the probability that a
        client fails to answer in a round (it is unavailable: a chosen client does not report, an oracle
        question to it is charged as sent and answered NaN; see :class:`fedselect.ClientOracle`).
    availability : None, array-like of float or callable, default None
        Per-client probabilities of being available in a round, or ``f(federation) -> array``: client k answers
        with probability ``availability[k] * (1 - client_dropout)``, drawn from a stream keyed by (seed, round),
        so every selector of one seed faces the same failures (see :ref:`user_guide_failures`).
    partial_weights : {"rescale", "as-given"}, default "rescale"
        When some chosen clients fail, the reporters' weights are rescaled to keep the selection's total, or kept
        as given (the failed share is lost); see :func:`fedselect.ledger.reporter_weights`.
    divergence : float or None, default 10.0
        :meth:`fit` raises :class:`DivergenceError` at the first evaluated round whose test loss exceeds
        ``divergence`` times the initial model's, or is non-finite; None keeps only the non-finite check (see
        :ref:`user_guide_checkpoints`).
    checkpoint_dir : path or None, default None
        Where :meth:`fit` keeps a checkpoint of the run in progress (a format that carries no code); a ``fit``
        that finds one of the same configuration resumes from it and returns exactly an uninterrupted run's
        history, one of another configuration raises (see :ref:`user_guide_checkpoints`).
    checkpoint_every : int, default 10
        Write the checkpoint after every k-th round (and when the run ends): a kill redoes at
        most k rounds. Each write serialises the selector's state and the model and fsyncs one file.
    checkpoint_trusted : bool, default False
        True checkpoints selector state outside the allow-list (else :meth:`fit` raises
        :class:`~fedselect.simulation.checkpoint.UnsafeStateError` before training) with full pickle, which runs
        code from the file: only for a ``checkpoint_dir`` no one else can write to.
    clock : bool or None, default None
        Keep simulated time (:mod:`fedselect.clock`): each round lasts its critical path on the
        clients' device profiles and every record gets ``sim_seconds`` and ``sim_time``. None: always, on
        the federation's ``profiles`` or else on homogeneous devices (:func:`fedselect.profiles.homogeneous`)
        that only record time: selectors observe no durations and Oort's over-commitment is not cut, so
        every selection is what it was before runs had a default clock; True: always, the homogeneous
        default observed like declared profiles; False: never. See :ref:`user_guide_time`.
    deadline : float or None, default None
        Seconds a chosen client has for its training exchange (download, local training, upload,
        after the round's oracle questions); a client past it is a straggler, handled by
        ``straggler_policy``. Needs a clock.
    query_timeout : float or None, default None
        Seconds the server waits for the answers to one oracle question; later answers count as
        failures (NaN). Needs a clock.
    straggler_policy : {"fail", "overselect"}, default "fail"
        What a round does about slow clients. With ``"fail"``, stragglers fail as dropped
        clients do (charged as asked, absent from the feedback). With ``"overselect"`` (FedCS),
        the selector is asked for ``ceil(clients_per_round * overselect)`` clients and the first
        ``clients_per_round`` to finish are aggregated, with the weights the aggregation gives a
        round whose other clients failed (``partial_weights``). Needs a clock.
    overselect : float, default 1.3
        The over-selection factor of ``straggler_policy="overselect"`` (1.3: FedScale's default
        over-commitment).
    choose_among : {"online", "all"}, default "online"
        With availability intervals (profiles): ``"online"`` lets the selector choose only among the
        clients online at the round's start (:meth:`ClientOracle.available`), all of them when fewer than
        ``clients_per_round`` are; ``"all"`` reproduces blind selection (offline picks fail at once), for
        studies. See :ref:`availability <user_guide_availability>`.
    server_knows_profiles : bool, default False
        Give the clock's profiles to a selector that takes a ``profiles`` parameter (left None)
        before it is fitted: the server knows the declared devices. False: the selector learns
        speed only from the durations it observes. Needs a clock.
    device : str or torch.device, default "cpu"
        Where local training and evaluation run: cpu, cuda, cuda:N, mps or auto (the first of cuda, mps,
        cpu that torch sees). Also a torch.device; "cuda" is the current CUDA GPU, "mps" an Apple GPU. Checked
        before anything is built: a device this machine lacks is an error naming those it has. The
        federation's data is copied to the device once; the global model, the aggregation, the selector's
        view and the checkpoints stay on the CPU. One seed gives the same bits on every machine of one kind
        (the CPU's are those of every earlier version); other kinds round differently. The run's settings
        (``history_.config``) record the kind ``"auto"`` chose. See :ref:`devices`.
    path : {"eager", "compiled"}, default "eager"
        The computing path of local steps (the Engine's ``path``): ``"eager"``, the bit-stable reference, or
        ``"compiled"``, each step one ``torch.compile`` graph (faster, rounded differently). The compiled path
        takes the built-in Flatten/Linear/ReLU/Dropout chains (``logistic``, ``mlp``) with
        ``loss="cross-entropy"``; another model, or a machine where torch.compile fails, is refused before
        training. Its float rounding and dropout masks differ from eager's (the same call still gives the same
        bits), so a compiled run is another run: its settings, key and checkpoints record the path (under the
        former name ``engine``). See :ref:`devices_compiled`.
    dropout, engine : deprecated
        The former names of ``client_dropout`` and ``path`` (one name per concept: ``dropout`` is the model's,
        ``path`` the Engine's). They work with a ``DeprecationWarning`` until fedselect 1.0; with the new name
        also set, the fit refuses both. Run keys and recorded settings keep the former names.

    Attributes
    ----------
    history_ : History
    selector_ : BaseSelector
        The fitted clone of ``selector``.
    model_ : torch.nn.Module
        The final global model as a module (a copy of the model, parameters and buffers
        loaded, in eval mode): ``trainer.model_(X)`` predicts; ``torch.save(trainer.model_.state_dict(),
        path)`` keeps it and ``build_model`` plus ``load_state_dict`` gets it back.
    parameters_ : ndarray
        The final global model, flattened.
    buffers_ : dict of str to ndarray
        The final global buffers (batch norm running statistics), by name; empty for a model
        without buffers. Each round they are the reporters' weighted mean (FedAvg of buffers, not FedBN).
    resumed_from_ : int
        The round this call started from: 0, or the round after the checkpoint it resumed.

    Examples
    --------
    >>> from fedselect import FederatedTrainer, make_federation
    >>> fed = make_federation("digits", partition="shards", n_clients=20, random_state=0)
    >>> trainer = FederatedTrainer(selector="random", rounds=5, random_state=0).fit(fed)
    >>> len(trainer.history_)
    5
    """

    def __init__(
        self,
        *,
        selector: BaseSelector | str | None = None,
        model: str | torch.nn.Module | Callable[..., torch.nn.Module] = "mlp",
        model_params: Mapping[str, Any] | None = None,
        loss: str | Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = "cross-entropy",
        clients_per_round: int = 5,
        rounds: int = 100,
        local_steps: int | None = None,
        local_epochs: int | None = None,
        batch_size: int = 32,
        lr: float = 0.05,
        momentum: float = 0.0,
        nesterov: bool = False,
        lr_schedule: Any = None,
        weight_decay: float = 0.0,
        aggregation: str = "data-size",
        prox_mu: float = 0.0,
        optimizer: LocalSGD | None = None,
        target_accuracy: float | None = None,
        stop_at_target: bool = True,
        time_budget: float | None = None,
        eval_every: int = 1,
        track_global_loss: bool = False,
        feedback_losses: str = "auto",
        random_state: int | None = None,
        progress: bool = False,
        n_threads: int | None = 1,
        callback: Callable[..., Any] | None = None,
        client_dropout: float = 0.0,
        availability: Any = None,
        partial_weights: str = "rescale",
        divergence: float | None = 10.0,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_every: int = 10,
        checkpoint_trusted: bool = False,
        clock: bool | None = None,
        deadline: float | None = None,
        query_timeout: float | None = None,
        straggler_policy: str = "fail",
        overselect: float = 1.3,
        choose_among: str = "online",
        server_knows_profiles: bool = False,
        device: str | torch.device = "cpu",
        path: str = "eager",
        dropout: float | None = None,
        engine: str | None = None,
    ) -> None:
        self.selector = selector
        self.model = model
        self.model_params = model_params
        self.loss = loss
        self.clients_per_round = clients_per_round
        self.rounds = rounds
        self.local_steps = local_steps
        self.local_epochs = local_epochs
        self.batch_size = batch_size
        self.lr = lr
        self.momentum = momentum
        self.nesterov = nesterov
        self.lr_schedule = lr_schedule
        self.weight_decay = weight_decay
        self.aggregation = aggregation
        self.prox_mu = prox_mu
        self.optimizer = optimizer
        self.target_accuracy = target_accuracy
        self.stop_at_target = stop_at_target
        self.time_budget = time_budget
        self.eval_every = eval_every
        self.track_global_loss = track_global_loss
        self.feedback_losses = feedback_losses
        self.random_state = random_state
        self.progress = progress
        self.n_threads = n_threads
        self.callback = callback
        self.client_dropout = client_dropout
        self.availability = availability
        self.partial_weights = partial_weights
        self.divergence = divergence
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.checkpoint_trusted = checkpoint_trusted
        self.clock = clock
        self.deadline = deadline
        self.query_timeout = query_timeout
        self.straggler_policy = straggler_policy
        self.overselect = overselect
        self.choose_among = choose_among
        self.server_knows_profiles = server_knows_profiles
        self.device = device
        self.path = path
        self.dropout = dropout  # deprecated name of client_dropout (resolved, with a warning, when the fit starts)
        self.engine = engine  # deprecated name of path

    # -- validation -----------------------------------------------------------------
    # Each parameter's allowed values, as data (see fedselect._validation): _validate checks them
    # all before anything is built, and the tests generate invalid values for each one.
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "selector": [None, _SelectorSpecs()],
        "model": [InstanceOf(str, "a registered model name"), InstanceOf(torch.nn.Module, "a torch.nn.Module"),
                  callable],
        "model_params": [None, InstanceOf(Mapping, "a mapping of keyword arguments")],
        "loss": [StrOptions(LOSSES), callable],
        "clients_per_round": [Interval(Integral, 1, None, closed="left")],
        "rounds": [Interval(Integral, 1, None, closed="left")],
        "local_steps": [None, Interval(Integral, 1, None, closed="left")],
        "local_epochs": [None, Interval(Integral, 1, None, closed="left")],
        "batch_size": [Interval(Integral, 1, None, closed="left")],
        "lr": [Interval(Real, 0, None, closed="neither")],
        "momentum": [Interval(Real, 0, 1, closed="left")],
        "nesterov": ["boolean"],
        "lr_schedule": [None, StrOptions(("fedcor",)), InstanceOf(Mapping, "a {round: factor} mapping"), callable],
        "weight_decay": [Interval(Real, 0, None, closed="left")],
        "aggregation": [StrOptions(_AGGREGATIONS)],
        "prox_mu": [Interval(Real, 0, None, closed="left")],
        "optimizer": [None, InstanceOf(LocalSGD, "a fedselect.LocalSGD")],
        "target_accuracy": [None, Interval(Real, 0, 1, closed="right")],
        "stop_at_target": ["boolean"],
        "time_budget": [None, Interval(Real, 0, None, closed="neither")],
        "eval_every": [Interval(Integral, 1, None, closed="left")],
        "track_global_loss": ["boolean"],
        "feedback_losses": [StrOptions(FEEDBACK_LOSSES)],
        "random_state": [None, Interval(Integral, 0, None, closed="left")],
        "progress": ["boolean"],
        "n_threads": [None, Interval(Integral, 1, None, closed="left")],
        "callback": [None, callable],
        "client_dropout": [Interval(Real, 0, 1, closed="left")],
        "availability": [None, "array-like", callable],  # its length and range are checked against the federation
        "partial_weights": [StrOptions(PARTIAL_WEIGHTS)],
        "divergence": [None, Interval(Real, 1, None, closed="neither")],
        "checkpoint_dir": [None, InstanceOf(str, "a directory path"), InstanceOf(os.PathLike, "a directory path")],
        "checkpoint_every": [Interval(Integral, 1, None, closed="left")],
        "checkpoint_trusted": ["boolean"],
        "clock": [None, "boolean"],
        "deadline": [None, Interval(Real, 0, None, closed="neither")],
        "query_timeout": [None, Interval(Real, 0, None, closed="neither")],
        "straggler_policy": [StrOptions(STRAGGLER_POLICIES)],
        "overselect": [Interval(Real, 1, None, closed="left")],
        "choose_among": [StrOptions(CHOOSE_AMONG)],
        "server_knows_profiles": ["boolean"],
        "device": DEVICE_CONSTRAINTS,  # a name or torch.device this machine has (resolve_device)
        "path": [StrOptions(PATHS)],  # the Engine's path: eager (the reference) or compiled
        "dropout": [None, Interval(Real, 0, 1, closed="left")],  # deprecated name of client_dropout
        "engine": [None, StrOptions(PATHS)],  # deprecated name of path
    }

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The trainer's parameters; with ``deep``, also the selector's as ``selector__<name>``.

        The selector's parameters are listed however it was given: for a name, a class or
        a ``(name or class, params)`` pair they are those of the selector it builds (its
        defaults, overridden by the pair's params).
        """
        out = super().get_params(deep=False)
        if not deep:
            return out
        sel = "random" if self.selector is None else self.selector
        if isinstance(sel, BaseSelector):
            return super().get_params(deep=True)
        from ..plugins import resolve_selector

        try:
            built = resolve_selector(sel)
        except (KeyError, ValueError, TypeError):  # an invalid selector: fit names what is wrong
            return out
        out.update({f"selector__{k}": v for k, v in built.get_params(deep=False).items()})
        return out

    def set_params(self, **params: Any) -> Self:
        """Set parameters, including the selector's as ``selector__<name>=value`` however it was given.

        A selector given as an instance is updated in place (scikit-learn's rule for nested
        estimators). A selector given by name or class is not resolved to an object: it
        becomes a ``(name or class, params)`` pair, the given parameters merged into the
        pair's, and is built at :meth:`fit` (so ``set_params(selector__d=10)`` on
        ``selector="power-of-choice"`` gives ``selector=("power-of-choice", {"d": 10})`` and
        the trainer still records the registered name). None stands for ``"random"``.
        This makes ``ParameterGrid({"selector__d": [5, 10]})`` loops work for any selector.

        Raises
        ------
        ValueError
            A ``selector__`` parameter the selector does not have; the message lists those
            it has.
        """
        nested = {k[len("selector__"):]: v for k, v in params.items() if k.startswith("selector__")}
        rest = {k: v for k, v in params.items() if not k.startswith("selector__")}
        if rest:
            super().set_params(**rest)
        if not nested:
            return self
        from ..plugins import as_selector_spec

        sel = "random" if self.selector is None else self.selector
        spec = as_selector_spec(sel)  # unknown names and bad shapes are errors here, naming the selector
        allowed = spec.cls._get_param_names()
        unknown = sorted(set(nested) - set(allowed))
        if unknown:
            raise ValueError(
                f"FederatedTrainer: selector {spec.display!r} ({spec.cls.__name__}) has no parameter "
                f"{', '.join(map(repr, unknown))} (given as selector__<name>); its parameters: "
                f"{', '.join(allowed) or '(none)'}"
            )
        if isinstance(sel, BaseSelector):
            sel.set_params(**nested)
        else:
            what = spec.name if spec.name is not None else spec.cls
            self.selector = (what, {**spec.params, **nested})
        return self

    # -- fit ------------------------------------------------------------------------
    def fit(self, federation: Any) -> Self:
        """Run the federation for up to ``rounds`` rounds.

        Parameters
        ----------
        federation : Federation
            From :func:`fedselect.data.make_federation`.

        Returns
        -------
        self
            With ``history_``, ``selector_`` and ``parameters_`` set.

        Raises
        ------
        DivergenceError
            When the divergence rule fires (see ``divergence``); ``history_`` then holds the
            rounds run so far, the diverged round included when it was evaluated.
        CheckpointMismatchError
            When ``checkpoint_dir`` holds a checkpoint of another configuration.
        """
        run = _Fit(self, federation)  # the fit itself: simulation/loop.py's run_fit, read top to bottom
        try:
            request = run.step()
            while request is not None:  # each round's main training, then its test evaluation, run here
                try:
                    reply = request.run()
                except Exception as exc:
                    request = run.step(error=exc)
                else:
                    request = run.step(reply)
        finally:
            run.close()
        return self

    # The run's settings and streams are its RunSetup's (simulation/setup.py), kept after the fit; readers
    # from before (the checkpoint fingerprint, tests of the minibatch stream) find these two here.
    @property
    def _report_prob(self) -> np.ndarray | None:
        setup = self.__dict__.get("_setup")
        return None if setup is None else setup.report_prob

    @property
    def _train_seed(self) -> int:
        return self.__dict__["_setup"].train_seed
