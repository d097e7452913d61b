"""The plan of a comparison: its (scheme, seed) cells, their keys, and which are finished, failed or to run.

Every (scheme, seed) result is written to ``<out>/runs/<label>__seed<k>.json`` with a key of its
settings (:func:`run_settings`, :func:`fedselect.experiments.provenance.run_key`). Planning reads
each cell's file: a finished run whose key matches is loaded, a failed one stays failed unless
``retry_failed`` (then it starts from scratch), and a run saved under other settings is an error
naming the settings that differ, unless ``overwrite`` (then it is redone). What is left is the
list of :class:`Cell` to run, in the order a serial comparison runs them (seed by seed).

:func:`check_plan` checks everything that can be checked before any training.
"""

from __future__ import annotations

import inspect
import json
import numbers
import os
import re
import shutil
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..round.record import History
from . import provenance
from .result_files import failure_of, read_result

__all__ = ["Cell", "FederationSource", "Plan", "check_plan", "plan_cells", "run_settings", "selector_table"]


def slug(label: str) -> str:
    """A label as it appears in file names: anything but letters, digits, ``_ . -`` becomes ``-``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", label).strip("-") or "run"


def settings_diff(saved: Any, now: Mapping[str, Any]) -> str:
    """Which settings differ between a saved run and this call, as ``"trainer.lr: saved 0.05, now 0.1"``."""
    if not isinstance(saved, Mapping):
        return "the file predates recorded settings, so which ones differ is unknown"

    def flat(d: Any, prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            if isinstance(v, Mapping):
                out.update(flat(v, f"{prefix}{k}."))
            else:
                out[f"{prefix}{k}"] = v
        return out

    a, b = flat(saved), flat(json.loads(json.dumps(dict(now), default=repr)))
    diffs = [
        f"{k}: saved {a.get(k, '(unset)')!r}, now {b.get(k, '(unset)')!r}"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    ]
    return "; ".join(diffs) if diffs else "the settings' key differs"


SelectorsArg = Mapping[str, Any] | Sequence[Any]
"""Selectors of a comparison: label -> selector, or a sequence of selectors labelled by default."""


def selector_table(selectors: SelectorsArg) -> dict[str, Any]:
    """Label -> :class:`~fedselect.plugins.SelectorSpec` for the ``selectors`` of a comparison.

    Parameters
    ----------
    selectors : mapping or sequence
        Label -> selector, or a sequence of selectors. A selector is any form
        :func:`fedselect.plugins.resolve_selector` takes: a registered name, a
        ``(name, params)`` pair, a :class:`~fedselect.BaseSelector` instance or subclass,
        or a ``(class, params)`` pair. In a sequence each is labelled by
        :func:`~fedselect.plugins.selector_label` (the registered name, else the class name,
        and the parameters given, e.g. ``power-of-choice(d=10)``).

    Raises
    ------
    TypeError
        ``selectors`` is neither, or one of them is not a selector.
    ValueError
        Two selectors of a sequence get the same label (give a mapping instead).
    """
    from ..plugins import as_selector_spec

    if isinstance(selectors, Mapping):
        table = {}
        for label, spec in selectors.items():
            if not isinstance(label, str) or not label:
                raise TypeError(f"selector label {label!r} must be a non-empty string")
            try:
                table[label] = as_selector_spec(spec)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"scheme {label!r}: {exc}") from exc
        return table
    if isinstance(selectors, str | bytes) or not isinstance(selectors, Sequence):
        raise TypeError(
            f"selectors={selectors!r:.80} must be a mapping of label -> selector or a list of selectors, e.g. "
            "['random', ('power-of-choice', {'d': 10}), MySelector()]"
        )
    table = {}
    for spec in selectors:
        sp = as_selector_spec(spec)
        if sp.label in table:
            raise ValueError(
                f"two selectors would both be labelled {sp.label!r}; give a mapping of label -> selector instead"
            )
        table[sp.label] = sp
    return table


class FederationSource:
    """The ``federation`` argument of a comparison: builds each seed's Federation and says what identifies it."""

    def __init__(self, federation: Any) -> None:
        from ..data import Federation

        self.spec = federation
        if isinstance(federation, Mapping):
            self.kind = "mapping"
            self._profiles_fingerprints: dict[int, str] = {}  # seed -> its devices' fingerprint, when set
        elif isinstance(federation, Federation):
            self.kind = "object"
            self._fingerprint: str | None = None  # computed when first needed
        elif callable(federation):
            self.kind = "factory"
            self._fingerprints: dict[int, str] = {}
        else:
            raise TypeError(
                f"federation={federation!r:.80} ({type(federation).__name__}) must be a mapping of "
                "make_federation arguments (e.g. {'dataset': 'digits', 'n_clients': 20}), a "
                "fedselect.data.Federation, or a callable seed -> Federation"
            )

    def n_clients(self) -> int | None:
        if self.kind == "mapping":
            n = self.spec.get("n_clients")
            return n if isinstance(n, numbers.Integral) else None
        if self.kind == "object":
            return self.spec.n_clients
        return None

    def build(self, seed: int) -> Any:
        """Seed ``seed``'s federation (for a factory, checked to be the one fingerprinted)."""
        from ..data import Federation, make_federation

        if self.kind == "mapping":
            return make_federation(random_state=int(seed), **dict(self.spec))
        if self.kind == "object":
            return self.spec
        fed = self.spec(int(seed))
        if not isinstance(fed, Federation):
            raise TypeError(
                f"federation factory {provenance.qualname(self.spec)} returned {type(fed).__name__} {fed!r:.60} for "
                f"seed {seed}; it must return a fedselect.data.Federation"
            )
        fp = provenance.federation_fingerprint(fed)
        if self._fingerprints.setdefault(int(seed), fp) != fp:
            raise ValueError(
                f"federation factory {provenance.qualname(self.spec)} built two different federations for seed {seed}; "
                "it must build the same one for the same seed (seed all its randomness with the seed it is given)"
            )
        return fed

    def profiles_fingerprint(self, seed: int) -> str | None:
        """For a mapping with ``profiles``: the fingerprint of seed ``seed``'s devices (None without profiles).

        Resolved as :func:`~fedselect.data.make_federation` resolves them
        (:func:`~fedselect.data.federation.resolve_profiles`), without loading the data: a
        profiles file is read, ``"mobile"`` drawn, each once per seed (O(N)).
        """
        from .._validation import validate_parameters
        from ..data import make_federation
        from ..data.federation import _MAKE_FEDERATION_CONSTRAINTS, resolve_profiles

        spec = self.spec.get("profiles") if self.kind == "mapping" else None
        if spec is None:
            return None
        if int(seed) not in self._profiles_fingerprints:
            n = self.spec.get("n_clients", inspect.signature(make_federation).parameters["n_clients"].default)
            validate_parameters("make_federation", {"n_clients": n}, _MAKE_FEDERATION_CONSTRAINTS)
            self._profiles_fingerprints[int(seed)] = resolve_profiles(spec, int(n), int(seed)).fingerprint()
        return self._profiles_fingerprints[int(seed)]

    def settings(self, seed: int) -> Any:
        """What identifies seed ``seed``'s federation in the saved settings.

        A mapping: the mapping, as always, except that a ``profiles`` entry appears only when set
        (not None), written as plain JSON (:func:`~fedselect.data.federation.describe_profiles`)
        with ``profiles_fingerprint``, the digest of the devices' content, beside it: a mapping
        without profiles keeps every stored run's key, one with them is keyed by what its devices
        are (a file rewritten with other devices is another run).
        """
        if self.kind == "mapping":
            out = dict(self.spec)
            if "profiles" in out:
                from ..data.federation import describe_profiles

                spec = out.pop("profiles")
                if spec is not None:
                    out["profiles"] = describe_profiles(spec)
                    out["profiles_fingerprint"] = self.profiles_fingerprint(seed)
            return out
        if self.kind == "object":
            if self._fingerprint is None:
                self._fingerprint = provenance.federation_fingerprint(self.spec)
            return {"federation": "Federation", "fingerprint": self._fingerprint}
        if int(seed) not in self._fingerprints:
            self.build(seed)
        return {"factory": provenance.qualname(self.spec), "fingerprint": self._fingerprints[int(seed)]}


def check_clients_per_round(cpr: Any, n_clients: Any) -> None:
    from .._validation import InvalidParameterError

    if isinstance(n_clients, numbers.Integral) and isinstance(cpr, numbers.Integral) and 1 <= n_clients < cpr:
        raise InvalidParameterError(
            f"FederatedTrainer: parameter clients_per_round={cpr!r} is invalid; expected an integer between 1 "
            f"and the federation's {n_clients} clients."
        )


OVERCOMMIT_MODES = ("equal", "as-set")


def own_overcommit(selector: Any) -> float:
    """The over-commitment a selector applies by itself: its resolved ``overcommit`` parameter (Oort's), else 1."""
    if "overcommit" not in selector.get_params(deep=False):
        return 1.0
    value = selector.resolved("overcommit") if hasattr(selector, "resolved") else selector.overcommit
    return 1.0 if value is None else float(value)


def equalize_overcommit(
    selectors: SelectorsArg, trainer: Mapping[str, Any], *, mode: str = "equal"
) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """Give every scheme of a comparison the same over-commitment (issue 33: a property of the round).

    Over-commitment (asking ``f K`` clients and keeping the first K to finish) shortens a clocked
    round whichever scheme chooses, so a comparison in which one scheme over-commits by itself
    (Oort's ``overcommit``, 1.1 by default) and the others do not credits that scheme with a
    setting the others were not given. With ``mode="equal"`` the over-commitment moves to the
    round, for every scheme: with ``straggler_policy="overselect"`` the round's ``overselect``
    applies to all and a self-over-committing selector is set to ``overcommit=1.0``; otherwise
    the one factor the schemes over-commit by becomes the round's (``straggler_policy=
    "overselect"``, ``overselect=f``: ``ceil(f K)`` asked, the first K kept) and theirs 1.0.
    ``mode="as-set"`` leaves every scheme as given.

    Returns
    -------
    table : dict
        Label -> :class:`~fedselect.plugins.SelectorSpec`, over-committing ones replaced.
    trainer : dict
        The trainer's settings, with the round's over-commitment where it moved there.
    note : str or None
        What was changed, for the log and the report; None when nothing was.

    Raises
    ------
    ValueError
        ``mode`` is unknown, schemes over-commit by different factors, or over-commitment would
        move to a round that keeps no clock (``clock=False``).
    """
    from sklearn.base import clone

    from ..plugins import SelectorSpec

    if mode not in OVERCOMMIT_MODES:
        raise ValueError(f"overcommit={mode!r} is invalid; expected one of {OVERCOMMIT_MODES}")
    table = selector_table(selectors)
    trainer = dict(trainer)
    if mode == "as-set":
        return table, trainer, None
    own = {label: own_overcommit(spec.build()) for label, spec in table.items()}
    committing = {label: f for label, f in own.items() if f > 1.0}
    if not committing:
        return table, trainer, None
    if trainer.get("straggler_policy", "fail") != "overselect":
        factors = sorted(set(committing.values()))
        if len(factors) > 1:
            raise ValueError(
                f"schemes over-commit by different factors ({committing}); give every scheme the same one, or set "
                "straggler_policy='overselect' with one overselect for all, or overcommit='as-set' (--overcommit "
                "as-set) to compare them as set"
            )
        if trainer.get("clock") is False:
            raise ValueError(
                f"{sorted(committing)} over-commit by themselves ({factors[0]}); giving every scheme that "
                "over-commitment needs a clock (clock=False given); pass overcommit='as-set' to compare them as set"
            )
        trainer["straggler_policy"] = "overselect"
        trainer["overselect"] = factors[0]
    for label in committing:
        spec = table[label]
        if spec.instance is not None:
            inst = clone(spec.instance).set_params(overcommit=1.0)
            table[label] = SelectorSpec(spec.cls, inst.get_params(deep=False), name=spec.name, instance=inst)
        else:
            table[label] = SelectorSpec(spec.cls, {**spec.params, "overcommit": 1.0}, name=spec.name)
    note = (
        f"over-commitment is the round's, the same for every scheme: {', '.join(sorted(committing))} "
        f"(over-committing by {', '.join(f'{f:g}' for f in sorted(set(committing.values())))} by itself) set to "
        f"overcommit=1.0 and every scheme runs with straggler_policy='overselect', overselect={trainer['overselect']:g}"
        " (overcommit='as-set' / --overcommit as-set leaves them as given)"
    )
    return table, trainer, note


def check_plan(
    selectors: SelectorsArg,
    *,
    trainer: Mapping[str, Any],
    seeds: Sequence[int],
    out_dir: str | os.PathLike[str] | None = None,
    federation: Any = None,
) -> dict[str, Any]:
    """Check everything a comparison can check before it trains anything.

    Builds every selector and checks its parameters against its declared constraints, checks
    the trainer's parameters (a model name must be registered; ``clients_per_round`` must not
    exceed the federation's ``n_clients`` when ``federation`` gives it), refuses repeated or
    invalid seeds and labels whose file names would collide, and checks that ``out_dir`` can
    be written (a result is written only when
    its run has finished: an unwritable directory must not cost a run).

    Parameters
    ----------
    selectors : mapping or sequence
        As in :func:`run_comparison` (see :func:`selector_table`).
    trainer : mapping
    seeds : sequence of int
    out_dir : path, optional
    federation : mapping, Federation or callable, optional
        As in :func:`run_comparison`; anything else is a TypeError.

    Returns
    -------
    built : dict
        Label -> a new selector instance (a clone for an instance given).

    Raises
    ------
    ValueError, TypeError, KeyError
        The first problem found, naming the label, the parameter, the seed or the path.
    """
    from .._validation import Interval, InvalidParameterError, renamed, validate_parameters
    from ..optim import as_optimizer
    from ..simulation.trainer import FederatedTrainer

    source = FederationSource(federation) if federation is not None else None
    if isinstance(selectors, Mapping | Sequence) and not isinstance(selectors, str | bytes) and not selectors:
        raise ValueError("no schemes to compare; give at least one (e.g. --selectors random fedcor)")
    seed_ok = Interval(numbers.Integral, 0, 2**32 - 1, closed="both")
    seeds = list(seeds)
    if not seeds:
        raise ValueError("no seeds to run; give at least one (e.g. --seeds 0 1 2)")
    for seed in seeds:
        if not seed_ok.is_satisfied_by(seed):
            raise InvalidParameterError(f"seed {seed!r} is invalid; expected {seed_ok}")
    repeated = sorted({int(s) for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(
            f"seeds {seeds} repeat {repeated}: a seed fixes the whole run, so a repeat would train the same run "
            "twice and count it once; give distinct seeds"
        )
    table = selector_table(selectors)
    slugs: dict[str, str] = {}
    for label in table:
        name = slug(label)
        if name in slugs:
            raise ValueError(
                f"labels {slugs[name]!r} and {label!r} would both be saved as runs/{name}__seed<k>.json; "
                "give them distinct labels (e.g. --selectors a=NAME:... b=NAME:...)"
            )
        slugs[name] = label
    built = {}
    for label, spec in table.items():
        sel = spec.build()
        try:
            sel._validate_params()
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"scheme {label!r}: {exc}") from exc
        built[label] = sel
    trainer_kw = {k: v for k, v in trainer.items() if k != "selector"}
    tr = FederatedTrainer(**as_optimizer(trainer_kw))  # unknown names: TypeError naming them
    validate_parameters(tr, trainer_kw, FederatedTrainer._parameter_constraints)
    model = trainer_kw.get("model")
    if isinstance(model, str):
        from ..plugins import list_models, registry

        if model not in registry("models"):  # names and aliases
            raise KeyError(f"unknown model {model!r}; registered models: {', '.join(list_models())}")
    check_clients_per_round(trainer_kw.get("clients_per_round"), source.n_clients() if source else None)
    for new, old in provenance.RENAMED[provenance.qualname(FederatedTrainer)].items():  # warns; both set: an error
        default = inspect.signature(FederatedTrainer).parameters[new].default
        renamed("FederatedTrainer", old, trainer_kw.get(old), new, getattr(tr, new), default)
    if provenance.stored_names(trainer_kw).get("engine") == "compiled":
        _check_compiled_path(trainer_kw, source)
    if source is not None and source.kind == "mapping" and source.spec.get("profiles") is not None:
        for seed in seeds:  # a bad kind, parameter or file, or devices for another number of clients
            source.profiles_fingerprint(seed)
    if out_dir is not None:
        _check_writable_dir(Path(out_dir) / "runs")
    return built


def _check_compiled_path(trainer_kw: Mapping[str, Any], source: FederationSource | None) -> None:
    """Refuse ``path="compiled"`` for a model or loss the compiled path does not take, before any run trains.

    The model is built on the federation's input shape when a Federation object is given, else on a probe shape
    (the rule looks at the layers' kinds, not their sizes); a builder that cannot build on the probe shape is left
    to the Engine, which applies the same rule when the first run starts.
    """
    import torch

    from ..simulation._compiled import compile_unusable
    from ..simulation.engine import compiled_path_refusal
    from ..simulation.trainer import FederatedTrainer, build_initial_model

    model = trainer_kw.get("model", inspect.signature(FederatedTrainer).parameters["model"].default)
    fed = source.spec if source is not None and source.kind == "object" else None
    shape, n_out = (tuple(fed.input_shape), int(getattr(fed, "n_outputs", fed.n_classes))) if fed else ((1, 28, 28), 10)
    probe = types.SimpleNamespace(input_shape=shape, n_classes=n_out, n_outputs=n_out)
    state = torch.get_rng_state()
    try:
        module = build_initial_model(model, trainer_kw.get("model_params"), probe, owner="path='compiled'")
    except Exception:  # a builder that needs the real data: the Engine checks when the first run starts
        return
    finally:
        torch.set_rng_state(state)  # building draws initial weights; the runs seed torch themselves anyway
    why = compiled_path_refusal(module, trainer_kw.get("loss", "cross-entropy")) or compile_unusable()
    if why is not None:
        raise ValueError(f"path='compiled' is refused before any run trains: {why}")


def _check_writable_dir(directory: Path) -> None:
    """Create ``directory`` and prove a file can be written there, or raise OSError naming it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise OSError(f"cannot write results into {directory}: {exc.strerror or exc}") from exc


def run_settings(federation: Any, trainer: Mapping[str, Any], selector: Any, seed: int) -> dict[str, Any]:
    """The settings one (scheme, seed) run of a comparison is keyed by and saved with.

    Parameters
    ----------
    federation : Any
        What identifies the seed's federation: the ``make_federation`` mapping, or for a
        Federation object ``{"federation": "Federation", "fingerprint": ...}``, or for a
        factory ``{"factory": "module:qualname", "fingerprint": ...}`` (the fingerprint of
        what it built for this seed).
    trainer : mapping
        The trainer's keyword arguments (without ``selector`` and the checkpoint options).
    selector : selector spec
        Anything :func:`selector_table` takes; a name is recorded as given with its
        parameters, a class or instance as ``module:qualname`` with its ``get_params()``.
    seed : int

    Returns
    -------
    dict
        ``federation``, ``trainer``, ``selector``, ``params``, ``seed``, and ``plugins``
        only when the run uses a plugin loaded by :func:`fedselect.plugins.load_plugin`
        (its file name, or module name, and content hash), so the keys of runs without one are unchanged.
    """
    from ..plugins import as_selector_spec, user_plugins_used

    spec = as_selector_spec(selector)
    # What a run uses when the mapping leaves it out: the defaults of make_federation and the trainer.
    from ..data import make_federation
    from ..simulation.trainer import FederatedTrainer

    dataset = (
        federation.get("dataset", inspect.signature(make_federation).parameters["dataset"].default)
        if isinstance(federation, Mapping)
        else None
    )
    model = trainer.get("model", FederatedTrainer().model)
    objects = tuple(o for o in (spec.cls, model) if not isinstance(o, str))
    plugins = user_plugins_used(
        selector=spec.name,
        dataset=dataset,
        model=model,
        objects=objects,
        federation=federation if isinstance(federation, Mapping) else None,
    )
    if "device" in trainer:  # keyed by the kind of machine: "auto" as the kind it chose; the CPU (the default) not
        from ..simulation.engine import device_setting  # at all, so every stored run keeps its key

        device = device_setting(trainer["device"])
        trainer = {k: v for k, v in trainer.items() if k != "device"} | ({} if device == "cpu" else {"device": device})
    trainer = provenance.stored_names(trainer)  # keyed by the names runs were stored under (client_dropout: dropout)
    if trainer.get("engine") == "eager":  # the reference path: keyed as every run before engine existed
        trainer = {k: v for k, v in trainer.items() if k != "engine"}
    return provenance.record_settings(federation, trainer, spec.settings(), seed, plugins=plugins)


def remove_tree(path: Path | None) -> None:
    """Delete a run's checkpoint directory (if any), ignoring errors."""
    if path is not None and path.exists():
        shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class Cell:
    """One (scheme, seed) run of a comparison still to run.

    Attributes
    ----------
    seed : int
    label : str
        The scheme's row label.
    selector : Any
        The selector as its settings record it (a registered name, or ``module:qualname``).
    key : str
        :func:`~fedselect.experiments.provenance.run_key` of ``settings``.
    path : Path or None
        Its result file (None without an output directory).
    checkpoint : Path or None
        Its checkpoint directory (None without an output directory).
    settings : dict
        :func:`run_settings` of the run.
    """

    seed: int
    label: str
    selector: Any
    key: str
    path: Path | None
    checkpoint: Path | None
    settings: dict[str, Any]


@dataclass
class Plan:
    """What planning found: the cells to run, and the runs loaded from earlier result files.

    Attributes
    ----------
    cells : list of Cell
        The runs to do, seed by seed (each seed's schemes in the order given).
    histories : dict
        Label -> {seed: History}, the finished runs loaded.
    failed : dict
        Label -> {seed: failure}, the failed runs kept (see :func:`~fedselect.experiments.results.failure_of`).
    federations : dict
        Seed -> the Federation planning last built (a factory's, to fingerprint it), kept for the first run.
    """

    cells: list[Cell]
    histories: dict[str, dict[int, History]]
    failed: dict[str, dict[int, dict[str, Any]]]
    federations: dict[int, Any] = field(default_factory=dict)

    def take_federations(self) -> dict[int, Any]:
        """:attr:`federations`, which the plan then no longer holds."""
        feds, self.federations = self.federations, {}
        return feds


def plan_cells(
    table: Mapping[str, Any],
    source: FederationSource,
    trainer: Mapping[str, Any],
    seeds: Sequence[int],
    out: Path | None,
    *,
    overwrite: bool = False,
    retry_failed: bool = False,
) -> Plan:
    """Key every (scheme, seed) cell and sort it into finished, failed and to run.

    Parameters
    ----------
    table : mapping
        Label -> selector spec (:func:`selector_table`).
    source : FederationSource
    trainer : mapping
        The trainer's keyword arguments, without the ones a comparison manages (``selector``,
        ``checkpoint_dir``, ``checkpoint_every``).
    seeds : sequence of int
    out : Path or None
        The comparison's folder; None: nothing is read or written, every cell runs.
    overwrite : bool
        Redo a cell saved under other settings (its checkpoint deleted) instead of raising.
    retry_failed : bool
        Redo a cell whose saved result is a failure, from scratch (its checkpoint deleted).

    Raises
    ------
    ValueError
        A cell's file holds a run of other settings and ``overwrite`` is False; the message names
        the settings that differ.
    """
    histories: dict[str, dict[int, History]] = {label: {} for label in table}
    failed: dict[str, dict[int, dict[str, Any]]] = {label: {} for label in table}
    cells: list[Cell] = []
    feds: dict[int, Any] = {}
    for seed in seeds:
        if source.kind == "factory":  # its fingerprint needs the federation; keep the last one for the first run
            feds = {seed: source.build(seed)}
            check_clients_per_round(trainer.get("clients_per_round"), feds[seed].n_clients)
        for label, spec in table.items():
            settings = run_settings(source.settings(seed), trainer, spec, seed)
            key = provenance.run_key(settings)
            path = ckpt = None
            if out is not None:
                path = out / "runs" / f"{slug(label)}__seed{seed}.json"
                ckpt = out / "checkpoints" / f"{slug(label)}__seed{seed}"
            saved = read_result(path) if path is not None else None
            if saved is not None:
                if saved["key"] == key:
                    if saved["status"] == "failed":
                        if not retry_failed:
                            failed[label][int(seed)] = failure_of(saved)
                            continue
                        remove_tree(ckpt)  # a retry starts from scratch
                    else:
                        histories[label][int(seed)] = History.from_dict(saved["history"])
                        continue
                elif not overwrite:
                    raise ValueError(
                        f"{path} holds a run of label {label!r}, seed {seed} with other settings "
                        f"({settings_diff(saved['settings'], settings)}); use another output directory, or "
                        "overwrite (--overwrite on the command line, overwrite=True in run_comparison)"
                    )
                else:
                    remove_tree(ckpt)
            cells.append(Cell(int(seed), label, settings["selector"], key, path, ckpt, settings))
    return Plan(cells, histories, failed, feds)
