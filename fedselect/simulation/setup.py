"""Building a run of :class:`~fedselect.simulation.trainer.FederatedTrainer`: its checked settings and streams.

:class:`RunSetup` is what a fit is built from before any model exists: the trainer's parameters checked against
the federation, the run's seeds, its local schedule, who fails when, the clock's devices, the selector it trains,
the round's size and weights, and the settings recorded in the history. The loop (:mod:`.loop`) asks it; it keeps
no model, no data and no round's state. Also here: the initial model and the engine, as the trainer and the
Flower clients build them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._validation import renamed, validate_parameters
from ..aggregation import aggregation_weights
from ..clock import SimulatedClock
from ..identity import stored_names
from ..optim import OPTIMIZER_KEYS, resolve_optimizer
from ..selection import BaseSelector, Selection, check_param, is_int, is_real
from .engine import Engine, LocalSchedule, device_setting
from .models import build_model

__all__ = ["RunSetup", "build_engine", "build_initial_model", "check_single_sample_batches"]

_CEIL_EPS = 1e-9  # absorbs float error in ceil(K * overselect), e.g. 10 * 1.1 = 11.000000000000002
_NOT_SETTINGS = ("selector", "callback", "checkpoint_dir", "checkpoint_every", "checkpoint_trusted")


class RunSetup:
    """One fit's settings, checked, and the streams and rules derived from them.

    Built at the start of :meth:`FederatedTrainer.fit <fedselect.simulation.trainer.FederatedTrainer.fit>`,
    before anything else: every parameter is checked (declared constraints, then the rules that need the
    federation, then the selector's own parameters), so a bad value is an error naming it before a model is built.

    Parameters
    ----------
    trainer : FederatedTrainer
        Read, never changed.
    fed : Federation
        The federation to run on; its sizes are kept, not its data.

    Attributes
    ----------
    seeds : ndarray of uint32, shape (4,)
        The run's streams: training, selector, model initialisation, client failures (from ``random_state``).
    schedule : LocalSchedule
        Each chosen client's local work.
    report_prob : ndarray or None
        Each client's probability of answering in a round (``availability`` times ``1 - client_dropout``); None when
        every client always answers.
    profiles : ClientProfiles or None
        The devices the clock runs on; None without a clock.
    clock_observed : bool
        Whether the round and the selector observe the clock (False: the default clock only records time).
    """

    def __init__(self, trainer: Any, fed: Any) -> None:
        self.trainer = trainer
        _check(trainer, fed)
        #: ``client_dropout`` and ``path``, or their deprecated names (warned about here; both set: an error).
        self.client_dropout = float(
            renamed("FederatedTrainer", "dropout", trainer.dropout, "client_dropout", trainer.client_dropout, 0.0)
        )
        self.path = str(renamed("FederatedTrainer", "engine", trainer.engine, "path", trainer.path, "eager"))
        self.n_clients = int(fed.n_clients)
        self.n_samples = fed.n_samples
        #: The local optimiser (``optimizer`` or the deprecated flat keywords, checked and warned about here).
        self.optimizer = resolve_optimizer(trainer, trainer.optimizer, {k: getattr(trainer, k) for k in OPTIMIZER_KEYS})
        self.report_prob = self._report_probabilities(fed)  # a callable availability runs once, here
        self.profiles, self.clock_observed = self._clock_profiles(fed)
        s = trainer.lr_schedule
        if isinstance(s, Mapping):
            ok = all(is_int(k) and k >= 0 and is_real(v) and v > 0 for k, v in s.items())
            check_param(trainer, "lr_schedule", s, ok, "a mapping of rounds (int >= 0) to factors (finite > 0)")
        # The selector's own parameters, now rather than after the model is built (a name is resolved,
        # which names the registered ones when it is unknown).
        if trainer.selector is not None:
            from ..plugins import resolve_selector

            resolve_selector(trainer.selector)._validate_params()
        seed = trainer.random_state
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        check_param(trainer, "random_state", trainer.random_state, seed is not None and is_int(seed), "None or an int")
        # [training streams, selector, model init, client failures]; adding a word keeps the first three.
        self.seeds = np.random.SeedSequence(int(seed)).generate_state(4)
        if trainer.local_steps is not None:
            self.schedule = LocalSchedule(trainer.batch_size, steps=trainer.local_steps)
        else:
            self.schedule = LocalSchedule(trainer.batch_size, epochs=trainer.local_epochs or 1)

    @property
    def train_seed(self) -> int:
        """The seed of the minibatch streams: client k's batches in round t come from ``(train_seed, t, k)``."""
        return int(self.seeds[0])

    def _report_probabilities(self, fed: Any) -> np.ndarray | None:
        """Each client's probability of answering in a round, or None when every client always answers."""
        tr = self.trainer
        avail = tr.availability
        if avail is None:
            return None if self.client_dropout == 0 else np.full(fed.n_clients, 1.0 - self.client_dropout)
        if callable(avail):
            avail = avail(fed)
        try:
            arr = np.asarray(avail, dtype=np.float64)
        except (TypeError, ValueError):
            arr = None
        ok = arr is not None and arr.shape == (fed.n_clients,) and bool(np.all((arr >= 0) & (arr <= 1)))
        check_param(
            tr,
            "availability",
            tr.availability if not callable(tr.availability) else f"{tr.availability!r} -> {avail!r}",
            ok,
            f"None, or {fed.n_clients} probabilities in [0, 1] (one per client), or a callable returning them",
        )
        assert arr is not None
        return arr * (1.0 - self.client_dropout)

    def _clock_profiles(self, fed: Any) -> tuple[Any, bool]:
        """The profiles the clock runs on (None: no clock), and whether the run observes the clock."""
        from ..profiles import homogeneous

        tr = self.trainer
        profiles = getattr(fed, "profiles", None)
        needing = {
            "deadline": tr.deadline is not None,
            "query_timeout": tr.query_timeout is not None,
            "straggler_policy": tr.straggler_policy != "fail",
            "server_knows_profiles": bool(tr.server_knows_profiles),
        }
        # The default clock on homogeneous devices only records time (see ``clock``): what the round does
        # and what the selector observes stay as without a clock. Anything that asks for time observes it;
        # a time budget only reads the recorded time.
        observed = profiles is not None or tr.clock is True or any(needing.values())
        needing["time_budget"] = tr.time_budget is not None
        if tr.clock is False:
            for name, set_ in needing.items():
                if set_:
                    raise ValueError(
                        f"FederatedTrainer: parameter {name}={getattr(tr, name)!r} needs a clock, but clock=False; "
                        "pass clock=None or clock=True (homogeneous devices when the federation has no profiles)"
                    )
            return None, observed
        return (homogeneous(fed.n_clients) if profiles is None else profiles), observed

    def start_clock(self, model_size: int, resumed_at: float) -> SimulatedClock | None:
        """The run's simulated clock from ``resumed_at`` seconds (None without profiles)."""
        if self.profiles is None:
            return None
        tr = self.trainer
        return SimulatedClock(
            self.profiles, model_size=model_size, deadline=tr.deadline, query_timeout=tr.query_timeout, start=resumed_at
        )

    def make_selector(self) -> BaseSelector:
        """A new, unfitted selector, seeded from the run's selector stream when its own random_state is None."""
        from ..plugins import resolve_selector

        tr = self.trainer
        sel = resolve_selector("random" if tr.selector is None else tr.selector)
        params = sel.get_params(deep=False)
        if "random_state" in params and params["random_state"] is None:
            sel.set_params(random_state=int(self.seeds[1]))
        if tr.server_knows_profiles and "profiles" in params and params["profiles"] is None:
            sel.set_params(profiles=self.profiles)  # the server knows the declared devices
        return sel

    def check_overcommit(self, selector: BaseSelector) -> None:
        """Refuse a fitted selector that over-commits by itself when the round over-selects too."""
        tr = self.trainer
        own = getattr(selector, "overcommit_", None)
        if tr.straggler_policy == "overselect" and is_real(own) and own > 1:  # ceil(f K) asked, then f' more
            raise ValueError(
                f"FederatedTrainer: straggler_policy='overselect' over-commits the round (overselect={tr.overselect}) "
                f"and {type(selector).__name__} over-commits by itself (overcommit {own:g}): the round would "
                f"over-commit twice; set {type(selector).__name__}(overcommit=1.0) to leave it to the round"
            )

    def round_size(self, selector: BaseSelector) -> tuple[int, int | None]:
        """With a clock: the clients to ask the selector for, and how many of the first to finish report.

        ``straggler_policy="overselect"`` asks for ``ceil(K * overselect)`` and keeps K; a selector
        that over-commits by itself (a fitted ``overcommit_`` > 1, Oort's) has its first K kept.
        """
        tr = self.trainer
        K = tr.clients_per_round
        if tr.straggler_policy == "overselect":
            return min(self.n_clients, math.ceil(K * float(tr.overselect) - _CEIL_EPS)), K
        factor = getattr(selector, "overcommit_", None)
        if is_real(factor) and factor > 1:
            return K, K
        return K, None

    def unavailable(self, t: int) -> np.ndarray:
        """The clients that will not answer in round ``t``: their own stream, the same for every selector."""
        if self.report_prob is None:
            return np.zeros(0, dtype=np.int64)
        u = np.random.default_rng([int(self.seeds[3]), int(t)]).random(self.n_clients)
        return np.flatnonzero(u >= self.report_prob)

    def rule_weights(self, selection: Selection, reported: np.ndarray | None = None) -> np.ndarray:
        """Aggregation weights of a validated selection, one per client (0 for those that did not report).

        Weights the selection carries are applied as given (unnormalised, so unbiased
        estimators stay unbiased), those of reporters rescaled or not by
        ``partial_weights`` when some chosen clients failed; otherwise the trainer's rule,
        normalised over the clients that reported.
        """
        return aggregation_weights(
            selection,
            reported,
            aggregation=self.trainer.aggregation,
            n_samples=self.n_samples,
            partial_weights=self.trainer.partial_weights,
        )

    def dropout_seed(self, round: int, purpose: str) -> int:
        """The seed of model dropout in round ``round``'s training for ``purpose`` ("main", "trial", other)."""
        tag = {"main": 0, "trial": 1}.get(purpose, 2)
        return int(np.random.SeedSequence([int(self.seeds[0]), round, tag]).generate_state(1)[0])

    def config(self, fed: Any, selector: BaseSelector) -> dict[str, Any]:
        """The run's settings as plain values (``history_.config``)."""
        tr = self.trainer
        params = {k: v for k, v in tr.get_params(deep=False).items() if k not in _NOT_SETTINGS}
        params = stored_names(params)  # as runs recorded before: the optimiser's flat keys, dropout, engine
        if isinstance(params.get("model"), torch.nn.Module):
            params["model"] = type(params["model"]).__name__
        for key in ("model", "loss"):
            if callable(params.get(key)):
                params[key] = getattr(params[key], "__qualname__", repr(params[key]))
        params["device"] = device_setting(tr.device)  # "auto" as the kind it chose on this machine
        return {
            "trainer": params,
            "selector": {"name": type(selector).__name__, "params": _plain(selector.get_params(deep=False))},
            "federation": _plain(getattr(fed, "metadata", {})),
            "n_clients": fed.n_clients,
            # the default clock only records time (see ``clock``): comparisons keep to rounds for such runs
            **({"clock": "recorded-only"} if not self.clock_observed and self.profiles is not None else {}),
        }


def _check(tr: Any, fed: Any) -> None:
    """The trainer's parameters that need no derived value, checked against the federation."""
    from ..data.federation import Federation

    if not isinstance(fed, Federation):
        raise TypeError(
            f"FederatedTrainer.fit expects a Federation, got {type(fed).__name__} {fed!r:.60}; build one with "
            "fedselect.data.make_federation(...), e.g. make_federation('digits', n_clients=20)"
        )
    validate_parameters(tr, tr.get_params(deep=False), tr._parameter_constraints)
    c = tr.checkpoint_dir
    if c is not None and Path(c).exists() and not Path(c).is_dir():
        raise ValueError(f"FederatedTrainer: checkpoint_dir={str(c)!r} exists and is not a directory")
    n = fed.n_clients
    check_param(
        tr,
        "clients_per_round",
        tr.clients_per_round,
        tr.clients_per_round <= n,
        f"an integer between 1 and the federation's {n} clients",
    )
    if tr.local_steps is not None and tr.local_epochs is not None:
        raise ValueError("FederatedTrainer: set local_steps or local_epochs, not both")
    if tr.nesterov and not tr.momentum:
        raise ValueError("FederatedTrainer: nesterov=True needs momentum > 0 (got momentum=0)")
    if tr.target_accuracy is not None and not np.issubdtype(np.asarray(fed.y).dtype, np.integer):
        raise ValueError(
            f"FederatedTrainer: target_accuracy={tr.target_accuracy!r} but the federation's targets are floats "
            "(regression), which have no accuracy; set target_accuracy=None and read the test loss in history_"
        )
    if tr.overselect != 1.3 and tr.straggler_policy != "overselect":
        allowed = (
            f"left at 1.3 unless straggler_policy='overselect' (it is {tr.straggler_policy!r}, which "
            "ignores overselect); pass straggler_policy='overselect' to over-select"
        )
        check_param(tr, "overselect", tr.overselect, False, allowed)


def _plain(d: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in dict(d).items():
        if isinstance(v, (str, int, float, bool, type(None))):
            out[k] = v
        elif isinstance(v, (list, tuple)):
            out[k] = [x if isinstance(x, (str, int, float, bool, type(None))) else repr(x) for x in v]
        else:
            out[k] = repr(v)
    return out


def build_engine(
    model: Any,
    model_params: Mapping[str, Any] | None,
    fed: Any,
    *,
    batch_size: int,
    local_steps: int | None,
    loss: Any = "cross-entropy",
    owner: str,
    device: str | torch.device = "cpu",
    path: str = "eager",
) -> Engine:
    """The initial model on ``fed``'s data, as :class:`FederatedTrainer` and the Flower clients start.

    :func:`build_initial_model` (on the CPU, under the caller's seed, so the initial weights do not
    depend on the device), then an :class:`Engine` on ``device`` (whose probe runs the model once,
    so a model or loss that cannot run fails here, prefixed with ``owner``; the data is copied to
    the device here; ``path`` is the Engine's, eager or compiled), then :func:`check_single_sample_batches`.
    The caller seeds torch first.
    """
    module = build_initial_model(model, model_params, fed, owner=owner)
    try:
        engine = Engine(
            module, fed.X, fed.y, fed.loss_indices, fed.X_test, fed.y_test, loss=loss, device=device, path=path
        )
    except ValueError as exc:
        raise ValueError(f"{owner}: {exc}") from exc  # the Engine's message names path=, as the trainer's user
    check_single_sample_batches(engine, fed.n_train_samples, batch_size, local_steps, owner=owner)
    return engine


def build_initial_model(model: Any, model_params: Mapping[str, Any] | None, fed: Any, *, owner: str) -> torch.nn.Module:
    """The initial global model, as :class:`FederatedTrainer` and the Flower clients build it.

    A ``torch.nn.Module`` is used as given (``model_params`` must then be empty); a
    registered name or a builder is called as ``model(input_shape, n_outputs, **model_params)``,
    ``n_outputs`` being the federation's ``n_outputs`` (its ``n_classes`` when it has none).
    The caller seeds torch first, so the initial weights are reproducible.
    """
    params = dict(model_params or {})
    n_out = int(getattr(fed, "n_outputs", fed.n_classes))
    if isinstance(model, torch.nn.Module):
        if params:
            raise ValueError(
                f"{owner}: model_params={params!r} cannot apply to a module instance; "
                "pass the module's builder (class or function) to have them used"
            )
        return model
    if isinstance(model, str):
        return build_model(model, fed.input_shape, n_out, **params)
    built = model(tuple(fed.input_shape), n_out, **params)
    if not isinstance(built, torch.nn.Module):
        raise TypeError(
            f"{owner}: model={model!r} returned {type(built).__name__}, not a "
            "torch.nn.Module; a model builder is called as "
            "model(input_shape, n_outputs, **model_params)"
        )
    return built


def check_single_sample_batches(
    engine: Engine, n_train_samples: np.ndarray, batch_size: int, local_steps: int | None, *, owner: str
) -> None:
    """Refuse a schedule that would give some client a one-sample minibatch its batch norm cannot normalise.

    With ``local_steps`` a client trains on batches of ``min(batch_size, n_k)`` samples; with
    whole epochs the last batch of a pass holds ``n_k % batch_size`` samples. Either is a
    problem only when ``engine.min_batch_size`` is 2 (batch norm over flat features).

    Raises
    ------
    ValueError
        Naming the clients, their sizes and the ways out.
    """
    if engine.min_batch_size < 2:
        return
    n = np.asarray(n_train_samples)
    b = int(batch_size)
    if local_steps is not None:
        bad = np.flatnonzero(np.minimum(b, n) == 1)
    else:
        bad = np.flatnonzero((n == 1) | (b == 1) | (n % b == 1))
    if bad.size:
        raise ValueError(
            f"{owner}: the model has a batch norm layer that cannot normalise a single sample in "
            f"training mode, and with batch_size={b} and "
            f"{'local steps' if local_steps is not None else 'whole local epochs'} client(s) "
            f"{bad[:10].tolist()}{' ...' if bad.size > 10 else ''} (training sizes {n[bad[:10]].tolist()}) would "
            "train on a one-sample minibatch; choose a batch_size that leaves no last batch of one sample "
            "(n_k % batch_size != 1), use local_steps (full batches of min(batch_size, n_k)), give every client "
            "at least 2 samples, or use a normalisation that works per sample (nn.GroupNorm, nn.LayerNorm)"
        )
