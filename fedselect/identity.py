"""What identifies a run: one place for keys, fingerprints and their history.

Two identities are computed here, each kept exactly as every stored file has it:

* a comparison's run key, :func:`run_key` of :func:`record_settings` (the federation as given, the
  trainer's keyword arguments as given, the selector as named or by class with its identifying
  parameters, the seed, and the user plugins used); it names a result file's run, so a rerun
  finds it;
* a trainer checkpoint's fingerprint, :func:`checkpoint_fingerprint` (every trainer parameter
  that changes the numbers, the selector's identifying parameters, a hash of the federation's
  data and of the initial model); a checkpoint resumes only under it.

Parameters added after runs were recorded are left out of both at the default that reproduces
those runs; :data:`ADDED_LATER` is the one table of them, for the trainer and for every built-in
selector (a subclass inherits its bases' entries). :data:`NOT_IDENTIFYING` lists the trainer
options that do not change a run's numbers. :func:`canonical` makes any value (a function, a
random state, a torch module) comparable across processes; the plugin registry and the
checkpoints use it too.

This is a leaf: it imports no other fedselect module (the selector contract, the registry, the
trainer, the checkpoints and the experiments use it), so it sits below everything that asks it
who a run is. Where a run was made and the result files' format are in
:mod:`fedselect.experiments.provenance`, which also re-exports every name here.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .optim import flat_settings

__all__ = [
    "ADDED_LATER",
    "NOT_IDENTIFYING",
    "RENAMED",
    "canonical",
    "checkpoint_fingerprint",
    "federation_fingerprint",
    "flatten_config",
    "identifying_params",
    "later_defaults",
    "qualname",
    "record_settings",
    "run_key",
    "stable",
    "stored_names",
    "trainer_identity",
]

_TRAINER = "fedselect.simulation.trainer:FederatedTrainer"

ADDED_LATER: dict[str, dict[str, Any]] = {
    _TRAINER: {
        "loss": "cross-entropy",
        "momentum": 0.0,
        "nesterov": False,
        # the simulated clock (fedselect.clock): at these defaults a federation without profiles runs as before
        "clock": None,
        "deadline": None,
        "query_timeout": None,
        "straggler_policy": "fail",
        "overselect": 1.3,
        "server_knows_profiles": False,
        # with always-online clients online == all: only runs with availability intervals choose otherwise
        "choose_among": "online",
        "time_budget": None,  # every run before time budgets ran to its round cap (or its target)
        "device": "cpu",  # every run before devices trained on the CPU
        "engine": "eager",  # every run before the compiled path trained on the eager one
        # every run before this option computed, charged and timed each reporter's loss on w^t, needed or not; the
        # default ("auto": only for a selector whose needs has "losses") is left in a checkpoint's identity
        "feedback_losses": "always",
        "optimizer": None,  # the local optimiser as one value; runs before it spelled its settings flat
    },
    "fedselect.selectors.clustered:ClusteredSamplingSelector": {"similarity": "dense", "n_neighbors": 10},
    "fedselect.selectors.ocs:OptimalClientSamplingSelector": {"max_trained": None},
    "fedselect.selectors.ldcs:LargestDistanceSelector": {"storage": "float32", "sketch_dim": 1024},
    "fedselect.selectors.fedcor:FedCorSelector": {
        "gp_solver": "gpytorch",
        "warmup_fit_start": 0,
        "anneal_before_fit_start": False,
        "gp_device": "cpu",  # every run before gp_device fitted the GP on the CPU
        "gp_round_offset": 0,  # every run before it, the 2022-code rows too, had its GP rounds at t % Dt == 0
    },
    # kmeans_n_init: every run recorded before it was a parameter ran 10 k-means runs per round.
    "fedselect.selectors.hcsfed:HCSFedSelector": {"max_trained": None, "weighting": "inclusion", "kmeans_n_init": 10},
    # straggler_reward: every Oort run recorded before it gave stragglers FedScale's mean reward.
    "fedselect.selectors.oort:OortSelector": {"straggler_reward": "mean"},
}
"""``module:qualname`` -> {parameter added after runs had been recorded: the default that reproduces those runs}.

At that default a parameter is left out of what identifies a run (trainer checkpoints, a
comparison's saved settings of a class or instance), so checkpoints and comparisons written
before it existed resume; a selector unpickled from before it existed gets that default."""

RENAMED: dict[str, dict[str, str]] = {
    # one name per concept (ARCHITECTURE.md): client failure is not the model's dropout; the Engine's ``path``
    _TRAINER: {"client_dropout": "dropout", "path": "engine"},
}
"""``module:qualname`` -> {parameter: the former name that run keys, checkpoint fingerprints and recorded
settings keep}. The former name stays a deprecated keyword; a run has one identity however it was spelled."""


def stored_names(params: Mapping[str, Any], owner: str = _TRAINER) -> dict[str, Any]:
    """``params`` as runs are stored: the optimiser as its flat keys (:func:`~fedselect.optim.flat_settings`)
    and each parameter of :data:`RENAMED` under its former name, in the new name's place, with the former
    keyword's value when that was given (not None)."""
    out = flat_settings(params)
    for new, old in RENAMED.get(owner, {}).items():
        if new not in out and old not in out:
            continue
        value = out[old] if out.get(old) is not None else out.get(new)
        where = new if new in out else old
        kept = ((k, v) for k, v in out.items() if k != old or k == where)  # the former name once, in the new's place
        out = {(old if k == where else k): (value if k == where else v) for k, v in kept}
    return out


NOT_IDENTIFYING: dict[str, tuple[str, ...]] = {
    _TRAINER: (
        "progress",
        "n_threads",
        "callback",
        "checkpoint_dir",
        "checkpoint_every",
        "checkpoint_trusted",
        "divergence",
        "device",  # a checkpoint resumes on another device (the run then mixes two kinds' rounding)
    ),
}
"""``module:qualname`` -> options that do not change a run's numbers (a checkpoint resumes with other values)."""


def qualname(obj: Any) -> str:
    """``module:qualname`` of a class or function (of the object's class for anything else)."""
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def later_defaults(cls: type) -> dict[str, Any]:
    """:data:`ADDED_LATER` merged over ``cls``'s hierarchy (subclasses win)."""
    merged: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        merged.update(ADDED_LATER.get(f"{klass.__module__}:{klass.__qualname__}", {}))
    return merged


def _at_old_default(params: Mapping[str, Any], later: Mapping[str, Any]) -> set[str]:
    return {k for k, v in params.items() if k in later and isinstance(v, type(later[k])) and v == later[k]}


def identifying_params(estimator: Any) -> dict[str, Any]:
    """``get_params(deep=False)`` without the parameters added later that are at their original default."""
    params = estimator.get_params(deep=False)
    dropped = _at_old_default(params, later_defaults(type(estimator)))
    return {k: v for k, v in params.items() if k not in dropped}


def trainer_identity(trainer: Any) -> dict[str, Any]:
    """The trainer parameters that fix a run's numbers: without the selector, the options of
    :data:`NOT_IDENTIFYING` and the parameters added later at their original default."""
    skip = {"selector"}
    for klass in type(trainer).__mro__:
        skip.update(NOT_IDENTIFYING.get(f"{klass.__module__}:{klass.__qualname__}", ()))
    params = {k: v for k, v in trainer.get_params(deep=False).items() if k not in skip}
    params = stored_names(params)  # LocalSGD(lr=0.1) and lr=0.1, path and engine: one run
    dropped = _at_old_default(params, later_defaults(type(trainer)))
    return {k: v for k, v in params.items() if k not in dropped}


# -- values comparable across processes ---------------------------------------------------------

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _code_digest(fn: Any) -> str:
    """For a Python function: a digest of its bytecode, constants, defaults and closure values.

    Two lambdas with one name (``lambda t: 0.1`` and ``lambda t: 0.01``) then differ; a
    builtin or another callable without code is identified by its name alone.
    """
    code = getattr(fn, "__code__", None)
    if code is None:
        return ""
    closure = [getattr(c, "cell_contents", None) for c in (getattr(fn, "__closure__", None) or ())]
    parts = (
        code.co_code,
        repr(code.co_consts),
        repr(getattr(fn, "__defaults__", None)),
        repr([canonical(c) for c in closure]),
    )
    return " code:" + hashlib.sha256(repr(parts).encode()).hexdigest()[:12]


def canonical(value: Any) -> Any:
    """A value comparable across processes: numbers and strings as they are, functions by name and code."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return "nan" if math.isnan(value) else value
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy scalars
        return canonical(value.item())
    if hasattr(value, "tobytes") and hasattr(value, "dtype") and hasattr(value, "shape"):  # arrays, by content
        digest = hashlib.sha256(value.tobytes()).hexdigest()[:16]
        return f"<array {value.dtype} {tuple(value.shape)} sha256:{digest}>"
    if (
        not isinstance(value, type) and hasattr(value, "state_dict") and hasattr(value, "named_parameters")
    ):  # a torch module instance: class, weights, options
        digest = hashlib.sha256()
        for name, tensor in sorted(value.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        options = {
            k: v
            for k, v in sorted(vars(value).items())
            if not k.startswith("_") and isinstance(v, (bool, int, float, str, type(None)))
        }
        return (
            f"<module {type(value).__module__}.{type(value).__qualname__} {_ADDRESS.sub('', repr(value))} "
            f"{options} weights sha256:{digest.hexdigest()[:16]}>"
        )
    if callable(value) and hasattr(value, "__qualname__"):
        return f"<callable {getattr(value, '__module__', '?')}.{value.__qualname__}{_code_digest(value)}>"
    if hasattr(value, "get_state") and type(value).__name__ == "RandomState":  # numpy legacy random state
        state = value.get_state()
        digest = hashlib.sha256(repr((state[0], state[1].tobytes(), state[2:])).encode()).hexdigest()[:16]
        return f"<RandomState sha256:{digest}>"
    if hasattr(value, "bit_generator"):  # numpy Generator
        return f"<Generator sha256:{hashlib.sha256(repr(value.bit_generator.state).encode()).hexdigest()[:16]}>"
    if hasattr(value, "get_params") and callable(value.get_params):
        params = value.get_params(deep=False)
        return {"<class>": type(value).__qualname__, **{k: canonical(v) for k, v in params.items()}}
    return _ADDRESS.sub("", repr(value))


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"trainer": {"lr": 0.1}}`` -> ``{"trainer.lr": 0.1}``, values made comparable across processes."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_config(value, name + "."))
        elif isinstance(value, (list, tuple)):
            out[name] = [canonical(v) for v in value]
        else:
            value = canonical(value)
            if isinstance(value, dict):
                out.update(flatten_config(value, name + "."))
            else:
                out[name] = value
    return out


def _plain_json(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain_json(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, (str, int, float)) and _plain_json(v) for k, v in value.items())
    return False


def stable(value: Any) -> Any:
    """A trainer value as recorded in a run's key: plain JSON as it is (so existing keys stay), anything
    else by content (a function by name and code, a module by class, options and weights), never by a
    memory address that changes with every process."""
    return value if _plain_json(value) else canonical(value)


# -- a comparison's run --------------------------------------------------------------------------


def federation_fingerprint(fed: Any) -> str:
    """A hash of a Federation's content: its arrays (dtype, shape, bytes), client index lists and classes.

    Cost: one SHA-256 pass over the data, linear in its size (hundreds of MB per second); names
    and metadata are not included, so a renamed but identical federation keeps its fingerprint.
    The clients' device profiles count only when the federation has some (their own
    :meth:`~fedselect.profiles.SystemProfiles.fingerprint`): a federation without profiles keeps
    the fingerprint it always had.
    """
    h = hashlib.sha256()

    def add(arr: Any) -> None:
        a = np.ascontiguousarray(arr)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.view(np.uint8).reshape(-1) if a.size else b"")

    for arr in (fed.X, fed.y, fed.X_test, fed.y_test):
        add(arr)
    for group in (fed.client_indices, fed.eval_indices or []):
        h.update(f"[{len(group)}]".encode())
        for idx in group:
            add(idx)
    h.update(f"eval={fed.eval_indices is not None};classes={int(fed.n_classes)}".encode())
    profiles = getattr(fed, "profiles", None)
    if profiles is not None:
        h.update(f";profiles={profiles.fingerprint()}".encode())
    return h.hexdigest()[:16]


def record_settings(
    federation: Any,
    trainer: Mapping[str, Any],
    selector: Mapping[str, Any],
    seed: int,
    *,
    plugins: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The settings a comparison's run is keyed by and saved with, from its resolved parts.

    Parameters
    ----------
    federation : Any
        What identifies the seed's federation (see :func:`fedselect.compare.run_settings`).
    trainer : mapping
        The trainer's keyword arguments as given; values that are not plain JSON are recorded
        by content (:func:`stable`).
    selector : mapping
        ``{"selector": ..., "params": ...}``, what
        :meth:`fedselect.plugins.SelectorSpec.settings` records.
    seed : int
    plugins : sequence of mapping
        The user plugins the run uses (file or module name and content hash); recorded only
        when there is one, so the keys of runs without one are unchanged.

    Returns
    -------
    dict
        ``federation``, ``trainer``, ``selector``, ``params``, ``seed`` (in that order, as the
        result files have them) and ``plugins`` when given.
    """
    settings = {
        "federation": federation,
        "trainer": {k: stable(v) for k, v in trainer.items()},
        **selector,
        "seed": int(seed),
    }
    if plugins:
        settings["plugins"] = list(plugins)
    return settings


def run_key(settings: Mapping[str, Any]) -> str:
    """The 16-hex-digit key of a run's settings (SHA-256 of their sorted JSON; other values by ``repr``)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def checkpoint_fingerprint(trainer: Any, fed: Any, selector: Any, theta0: Any) -> dict[str, Any]:
    """Everything that fixes a trainer's run numbers, flattened to comparable values (a checkpoint's identity).

    Parameters
    ----------
    trainer : FederatedTrainer
    fed : Federation
    selector : BaseSelector
        The run's fitted selector.
    theta0 : torch.Tensor
        The initial flat parameters of the model.
    """
    h = hashlib.sha256()
    for arr in (
        fed.y,
        fed.y_test,
        np.asarray(fed.X[:: max(1, len(fed.X) // 4096)]),
        np.asarray(fed.X_test[:: max(1, len(fed.X_test) // 1024)]),
    ):
        a = np.ascontiguousarray(arr)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    for ix in (*fed.client_indices, *fed.loss_indices):
        h.update(np.ascontiguousarray(ix, dtype=np.int64).tobytes())
        h.update(b"|")
    report = getattr(trainer, "_report_prob", None)
    report_sha = (
        None if report is None else hashlib.sha256(np.ascontiguousarray(report, dtype=np.float64).tobytes()).hexdigest()
    )
    return flatten_config(
        {
            "trainer": trainer_identity(trainer),
            "selector": {
                "class": f"{type(selector).__module__}.{type(selector).__qualname__}",
                "params": selector.identifying_params(),
            },
            "federation": {
                "metadata": dict(getattr(fed, "metadata", {}) or {}),
                "n_clients": fed.n_clients,
                "data_sha256": h.hexdigest(),
            },
            "model": {
                "n_params": int(theta0.numel()),
                "initial_sha256": hashlib.sha256(theta0.numpy().tobytes()).hexdigest(),
            },
            # client failures are drawn per round from their own keyed stream: the probabilities fix them
            "failures": {"report_probability_sha256": report_sha},
        }
    )
