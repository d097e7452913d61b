"""The options generated from parameters, and the settings the options given make.

Each keyword of ``FederatedTrainer``, ``make_federation``, the registered partition schemes and the
synthetic dataset that a command line can write becomes an :class:`Option` (its flags, its parser from the
declared constraints, its help from the numpydoc description, its default); :func:`_add_options` puts them on
a command's parser and :func:`_apply_overrides` writes the ones given onto a preset's settings.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

from .text import _first_sentence, _numpydoc_params
from .values import _mapping

# Parameters of FederatedTrainer and make_federation that get no option of their own, and why. Every other
# parameter whose declared constraints the command line can write (numbers, names, choices, booleans, None,
# name=value mappings) becomes an option named after it.
NOT_OPTIONS: dict[str, str] = {
    "selector": "--selector (run) or --selectors (compare)",
    "random_state": "--seed (run) or --seeds (compare): the federation's and the trainer's",
    "progress": "--no-progress; on the command line a bar is drawn when stderr is a terminal",
    "callback": "a Python function",
    "availability": "an array or a function",
    "checkpoint_dir": "set from --out (run) or the output folder (compare)",
    "checkpoint_every": "--checkpoint-every",
    "checkpoint_trusted": "never from the command line: it reads state back with pickle",
    "sizes": "an array of client sizes (dataset synthetic)",
    "optimizer": "--lr, --momentum, --nesterov, --weight-decay and --prox-mu (one LocalSGD)",
}

# The commands' own arguments (argparse destinations): a scheme parameter of one of these names gets no option.
_COMMAND_DESTS = (
    "command",
    "func",
    "debug",
    "preset",
    "selector",
    "selectors",
    "seed",
    "seeds",
    "out",
    "overwrite",
    "compress",
    "retry_failed",
    "checkpoint_every",
    "jobs",
    "batch_seeds",
    "ray",
    "paired",
    "no_paired",
    "no_progress",
    "plugin",
)

# Where the command line keeps an option name of its own (older than the generated ones; both spellings work).
OPTION_NAMES: dict[str, tuple[str, ...]] = {
    "target_accuracy": ("--target", "--target-accuracy"),
    "n_threads": ("--threads", "--n-threads"),
}

# The command line's own defaults where they differ from Python's, and why. Nothing else differs: an option
# not given takes the preset's value, else the Python default its help states.
CLI_DEFAULTS: dict[str, tuple[Any, str]] = {
    "n_threads": (
        1,
        "Python's default too; the command line writes it into every run's settings, as it did when it was the "
        "command line's own default, so runs stored then keep their keys",
    ),
}

# Help where the docstring has no description of its own, or one that speaks of what a command line cannot give
# (a module, a function); every other option's help is the first sentence of its parameter's numpydoc description.
_CLI_HELP: dict[str, str] = {
    "batch_size": "Local minibatch size.",
    "stop_at_target": "Stop a run once its test accuracy reaches target_accuracy.",
    "target_accuracy": "Target test accuracy, e.g. 0.8: compare and reproduce report the rounds to reach it, and a "
    "run stops there when stop_at_target.",
    "data_dir": "Directory with the dataset's files (else $FEDSELECT_DATA, then the user cache and the system's "
    "data folders).",
    "dataset": "A registered dataset, or synthetic: FedProx's Synthetic(alpha, beta) (see --alpha, --beta).",
    "partition": "How the training set is split across clients: a registered partition scheme (see "
    "fedselect.data.partition); its parameters are the options below.",
    "model": "A registered model.",
    "model_params": "Keyword arguments of the model builder, e.g. dropout=0.5.",
    "loss": "The per-sample loss of local training, of the losses selectors see and of the test loss.",
    "lr_schedule": "Learning-rate factors: fedcor (halve at rounds 150 and 300, FedCor's appendix C) or "
    "ROUND=FACTOR,... (each factor multiplies lr from its round on).",
    "profiles": "The clients' devices, which give every run a simulated clock and the tables a time-to-target "
    "column: homogeneous (every client the median phone), mobile (phones drawn per seed: log-normal compute and "
    "bandwidth after FedScale, see docs/profiles.rst), a .npz or .json profiles file (SystemProfiles.save), or "
    "kind=mobile,NAME=VALUE,... with parameters of sample_profiles or homogeneous (e.g. "
    "kind=mobile,mean_online=3600). The time model is FedScale's completion time plus two things FedScale's round "
    "lacks: each chosen client's loss evaluation before training, timed only for a selector that needs those "
    "losses (afl), and a client lost mid-round waited for until its update was due (docs/profiles.rst).",
}

# Metavars where the one the declared constraints give would not say what the option takes.
_METAVARS: dict[str, str] = {"profiles": "KIND|FILE|kind=KIND,NAME=VALUE,...|none"}

# Python's default in words where the signature's value alone would mislead.
_DEFAULT_WORDS: dict[str, str] = {
    "local_epochs": "none (1 epoch unless local_steps is set)",
    "local_steps": "none (epochs: see --local-epochs)",
}

# Options whose value is a registered name: their help lists the names.
_REGISTRY_OF = {"model": "models", "dataset": "datasets", "partition": "partitions"}


@dataclass(frozen=True)
class Option:
    """A command-line option generated from one parameter of FederatedTrainer or make_federation.

    Attributes
    ----------
    param : str
        The keyword it sets (also the ``argparse`` destination).
    section : {"trainer", "federation"}
        Which mapping of a preset it overrides.
    flags : tuple of str
        Its option strings, ``--param-name`` first unless :data:`OPTION_NAMES` keeps an older one.
    parse : callable or None
        Text -> value; None for a boolean, given as ``--flag`` / ``--no-flag``.
    metavar : str or None
    default : Any
        Python's default (the signature's); :data:`UNSET` where the schemes that take it
        disagree (``alpha``: dirichlet's 0.5, dirichlet-qp's 0.2).
    owner : str
        Whose parameter it is: ``FederatedTrainer``, ``make_federation``, ``partition shards``, ...
    python : str
        Python's default in words, as the help shows it.
    help : str
        The first sentence of the parameter's numpydoc description.
    """

    param: str
    section: str
    flags: tuple[str, ...]
    parse: Callable[[str], Any] | None
    metavar: str | None
    default: Any
    owner: str
    python: str
    help: str


UNSET = object()


def _parser_for(constraints: Sequence[Any]) -> tuple[Callable[[str], Any] | None, str | None] | None:
    """(text -> value, metavar) for a parameter with these declared constraints; (None, None) for a boolean.

    None when no alternative can be written on a command line (only callables, arrays, modules).
    Values are converted, not judged: a number out of range reaches the parameter's own validation,
    whose message names the class, the parameter and what it allows.
    """
    from .._validation import Boolean, InstanceOf, Interval, NoneConstraint, StrOptions, describe, make_constraint
    from ..data.partition import RegisteredPartition

    kinds = [make_constraint(c) for c in constraints]
    if any(isinstance(k, Boolean) for k in kinds):
        return None, None
    allow_none = any(isinstance(k, NoneConstraint) for k in kinds)
    words = tuple(w for k in kinds if isinstance(k, StrOptions) for w in k.options)
    integer = any(isinstance(k, Interval) and k.kind is Integral for k in kinds)
    real = any(isinstance(k, Interval) and k.kind is Real for k in kinds)
    mapping = any(isinstance(k, InstanceOf) and k.type is Mapping for k in kinds)
    text = any(isinstance(k, RegisteredPartition) or (isinstance(k, InstanceOf) and k.type is str) for k in kinds)
    if not (words or integer or real or mapping or text):
        return None
    writable = [
        c
        for c, k in zip(constraints, kinds, strict=True)
        if isinstance(k, NoneConstraint | StrOptions | Interval | RegisteredPartition)
        or (isinstance(k, InstanceOf) and k.type in (str, Mapping))
    ]

    def parse(value: str) -> Any:
        if allow_none and value.strip().lower() == "none":
            return None
        if value in words:
            return value
        if integer:
            try:
                return int(value)
            except ValueError:
                pass
        if real:
            try:
                return float(value)
            except ValueError:
                pass
        if mapping and "=" in value:
            return _mapping(value)
        if text and value:
            return value
        raise argparse.ArgumentTypeError(
            f"expected {describe(writable)}"
            + (" (none for None)" if allow_none else "")
            + (", or name=value,..." if mapping else "")
            + f"; got {value!r}"
        )

    if words and not (integer or real or text or mapping):
        metavar: str | None = "{" + ",".join((*words, *(["none"] if allow_none else []))) + "}"
    elif integer or real:
        metavar = ("INT" if integer else "X") + ("|none" if allow_none else "")
    elif mapping:
        metavar = "|".join((*words, "NAME=VALUE,...", *(["none"] if allow_none else [])))
    else:
        metavar = None
    return parse, metavar


def _plain_parser(default: Any, annotation: Any) -> Any:
    """text -> value for an undeclared keyword parameter, typed like its default (else its annotation).

    None for a boolean (a ``--flag`` / ``--no-flag`` pair); :data:`UNSET` when neither says a
    plain type (arrays, objects).
    """
    import inspect

    kind: Any = None
    if default is not inspect.Parameter.empty and default is not None:
        kind = type(default)
    elif isinstance(annotation, str):
        kind = {"int": int, "float": float, "bool": bool, "str": str}.get(annotation.split("|")[0].strip())
    elif annotation in (int, float, bool, str):
        kind = annotation
    if kind is bool:
        return None
    return kind if kind in (int, float, str) else UNSET


def _flags(param: str) -> tuple[str, ...]:
    return OPTION_NAMES.get(param, ("--" + param.replace("_", "-"),))


def _declared(
    func: Any, constraints: Mapping[str, Sequence[Any]], section: str, owner: str, doc: str | None
) -> list[Option]:
    import inspect

    described = _numpydoc_params(doc)
    out = []
    for name, p in inspect.signature(func).parameters.items():
        if name in ("self", *NOT_OPTIONS) or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        if name in constraints:
            found = _parser_for(constraints[name])
            if found is None:
                continue
            parse, metavar = found
        else:
            parse = _plain_parser(p.default, p.annotation)
            if name == "data_dir":
                parse = str
            if parse is UNSET:
                continue
            metavar = None
        metavar = _METAVARS.get(name, metavar)
        help_text = _CLI_HELP.get(name) or _first_sentence(described.get(name, ""))
        default = UNSET if p.default is p.empty else p.default
        python = f"{owner}'s default {_DEFAULT_WORDS.get(name, _show(default))}"
        out.append(Option(name, section, _flags(name), parse, metavar, default, owner, python, help_text))
    return out


def _scheme_options(taken: set[str]) -> list[Option]:
    """Options for the parameters of every registered partition scheme and of the synthetic dataset.

    A parameter several schemes share (``alpha``, ``min_samples``) is one option; its type is the
    widest of theirs (float over int). A name that a trainer or federation option already has is
    left out (a preset can still set it).
    """
    import inspect

    from ..data.datasets import make_synthetic
    from ..data.federation import _synthetic_pool
    from ..plugins import registry

    try:
        partitions = {e.name: e.obj for e in registry("partitions").values()}
    except Exception:  # a broken plugin must not break --help; the command itself reports it
        from ..data.partition import _BUILT_IN as partitions
    schemes: list[tuple[str, Any, dict[str, inspect.Parameter]]] = []
    for pname, func in partitions.items():
        try:
            params = dict(inspect.signature(func).parameters)
        except (TypeError, ValueError):
            continue
        schemes.append((f"partition {pname}", func, params))
    synthetic = {
        **dict(inspect.signature(make_synthetic).parameters),
        **{k: v for k, v in inspect.signature(_synthetic_pool).parameters.items() if k in ("alpha", "beta")},
    }
    schemes.append(("dataset synthetic", make_synthetic, synthetic))
    found: dict[str, dict[str, Any]] = {}
    for owner, func, params in schemes:
        described = _numpydoc_params(func.__doc__)
        for i, (name, p) in enumerate(params.items()):
            if (
                (i < 2 and owner.startswith("partition"))
                or name in ("random_state", "n_clients", *NOT_OPTIONS)
                or name in taken
                or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
            ):
                continue
            parse = _plain_parser(p.default, p.annotation)
            if parse is UNSET:
                continue
            slot = found.setdefault(name, {"parse": parse, "owners": [], "defaults": [], "help": ""})
            if {slot["parse"], parse} == {int, float}:
                slot["parse"] = float
            slot["owners"].append(owner)
            slot["defaults"].append((owner, p.default))
            slot["help"] = slot["help"] or _first_sentence(described.get(name, ""))
    out = []
    for name, slot in found.items():
        defaults = [d for _, d in slot["defaults"]]
        default = defaults[0] if all(d == defaults[0] and type(d) is type(defaults[0]) for d in defaults) else UNSET
        partitions = [o.split(" ", 1)[1] for o in slot["owners"] if o.startswith("partition ")]
        where = " and ".join(
            ([f"partition {', '.join(partitions)}"] if partitions else [])
            + [o for o in slot["owners"] if not o.startswith("partition ")]
        )
        if default is not UNSET:
            python = f"{where}: default {_show(default)}"
        else:
            python = "the scheme's own: " + ", ".join(f"{o.split(' ', 1)[1]} {_show(d)}" for o, d in slot["defaults"])
        help_text = f"For {where}: {slot['help']}" if slot["help"] else f"For {where}."
        metavar = {int: "INT", float: "X"}.get(slot["parse"])
        out.append(Option(name, "federation", _flags(name), slot["parse"], metavar, default, where, python, help_text))
    return out


_OPTIONS: list[Option] | None = None


def former_names() -> dict[str, str]:
    """The trainer's former parameter names and the names that replaced them (``--dropout``: ``client_dropout``).

    Their options still parse, hidden from the help; :func:`_apply_overrides` moves the value to the new name
    and says so on stderr (:data:`fedselect.identity.RENAMED`).
    """
    from ..identity import RENAMED

    return {old: new for new, old in RENAMED["fedselect.simulation.trainer:FederatedTrainer"].items()}


def options() -> list[Option]:
    """Every generated option: the trainer's parameters, make_federation's, and the partitions' and datasets'.

    Built from the signatures, declared constraints (``_parameter_constraints``) and numpydoc
    descriptions each time plugins change what is registered; a test checks that an option not
    given leaves the parameter at Python's default.
    """
    from ..data.federation import _MAKE_FEDERATION_CONSTRAINTS, make_federation
    from ..simulation.trainer import FederatedTrainer

    trainer = _declared(
        FederatedTrainer.__init__,
        FederatedTrainer._parameter_constraints,
        "trainer",
        "FederatedTrainer",
        FederatedTrainer.__doc__,
    )
    federation = _declared(
        make_federation, _MAKE_FEDERATION_CONSTRAINTS, "federation", "make_federation", make_federation.__doc__
    )
    taken = {o.param for o in (*trainer, *federation)} | set(_COMMAND_DESTS)
    return [*federation, *_scheme_options(taken), *trainer]


def _show(value: Any) -> str:
    if value is UNSET:
        return "not set"
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}"
    if isinstance(value, bool):
        return str(value)
    return "none" if value is None else str(value)


def _registered(kind: str) -> str:
    """The names the registry knows for ``kind`` ("models" or "partitions"), for help texts."""
    try:
        if kind == "partitions":
            from ..data.partition import PARTITIONS

            names = list(PARTITIONS)
        else:
            from ..plugins import registry

            names = sorted({e.name for e in registry(kind).values()})
    except Exception:  # a broken plugin must not break --help; `fedselect list` reports it
        return "see `fedselect list`"
    return ", ".join(names)


def _default_text(opt: Option, preset: Any) -> str:
    """The '(default: ...)' of a generated option: the preset's value where it sets one, else Python's default."""
    cli = CLI_DEFAULTS.get(opt.param)
    if cli is not None:
        return f"(default: {_show(cli[0])} on the command line, where {opt.python}: {cli[1]})"
    if preset is None:  # reproduce: the preset is an argument
        return f"(default: the preset's, else {opt.python})"
    settings = preset.federation if opt.section == "federation" else preset.trainer
    if opt.param in settings:
        return f"(default: {_show(settings[opt.param])} from preset {preset.name}; {opt.python})"
    return f"(default: {opt.python})"


def _add_options(p: argparse.ArgumentParser, preset: Any, stop_note: str) -> None:
    groups = {
        "federation": p.add_argument_group(
            "federation (make_federation's parameters, and those of the partition schemes)",
            description="Each option overrides one setting of the preset; a setting neither sets is "
            "make_federation's default (or the partition's).",
        ),
        "trainer": p.add_argument_group(
            "training (FederatedTrainer's parameters)",
            description="Each option overrides one setting of the preset; a setting neither sets is "
            "FederatedTrainer's default. " + stop_note,
        ),
    }
    former = former_names()
    for opt in options():
        help_text = opt.help
        kind = _REGISTRY_OF.get(opt.param)
        if kind is not None:
            help_text += f" Registered: {_registered(kind)}."
        help_text = f"{help_text} {_default_text(opt, preset)}".strip()
        group = groups[opt.section]
        if any(flag in p._option_string_actions for flag in opt.flags):
            continue  # a partition parameter named like an option of the command (a preset can still set it)
        # Not given: no attribute at all (None is a value some parameters take: --divergence none).
        if opt.parse is None:
            group.add_argument(
                *opt.flags,
                dest=opt.param,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text.replace("%", "%%"),
            )
        else:
            group.add_argument(
                *opt.flags,
                dest=opt.param,
                type=opt.parse,
                metavar=opt.metavar,
                default=argparse.SUPPRESS,
                help=argparse.SUPPRESS if opt.param in former else help_text.replace("%", "%%"),
            )


def _stop_note(preset: Any) -> str:
    if preset is None:
        return "Each preset also says whether a run stops once it reaches the target (stop_at_target)."
    if preset.trainer.get("stop_at_target", True):
        return f"{preset.name} stops a run once it reaches the target, as FederatedTrainer does by default."
    return (
        f"{preset.name} trains every run for all its rounds, also after it reaches the target "
        "(stop_at_target=False; FederatedTrainer's default is True)."
    )


def _drop_partition_params(federation: dict[str, Any], new_partition: str) -> None:
    """Leave out the preset's partition parameters that do not belong to ``new_partition``.

    The skew parameters ``alpha`` and ``shards_per_client`` describe the preset's partition and go
    whatever the new one takes; any other parameter of the preset's federation that is not
    make_federation's own and that the new partition does not take goes too (it would be an error).
    """
    import inspect

    from ..data.federation import make_federation
    from ..plugins import registry

    own = set(inspect.signature(make_federation).parameters)
    entry = registry("partitions").get(new_partition)
    accepted: set[str] | None = None
    if entry is not None:
        try:
            params = inspect.signature(entry.obj).parameters
            if not any(q.kind is q.VAR_KEYWORD for q in params.values()):
                accepted = set(params)
        except (TypeError, ValueError):
            pass
    for key in list(federation):
        if key in own:
            continue
        if key in ("alpha", "shards_per_client") or (accepted is not None and key not in accepted):
            federation.pop(key)


def _apply_overrides(args: argparse.Namespace, federation: dict[str, Any], trainer: dict[str, Any]) -> None:
    """Apply the options given on the command line to a preset's ``federation`` and ``trainer`` mappings.

    An option not given leaves the preset's value (or, where the preset sets none, Python's default:
    nothing is written), except :data:`CLI_DEFAULTS`.
    """
    given = vars(args)
    new_partition = given.get("partition")
    if new_partition is not None and new_partition != federation.get("partition"):
        _drop_partition_params(federation, new_partition)
    former = former_names()
    for opt in options():
        if opt.param in given and opt.param not in former:
            (federation if opt.section == "federation" else trainer)[opt.param] = given[opt.param]
    for old, new in former.items():  # a former name: its value under the new name (an option given wins)
        preset_value = trainer.pop(old, None)  # a preset written with the former name
        if old in given:
            if new in given:
                raise ValueError(f"{_flags(old)[0]} is the former name of {_flags(new)[0]}; give one of them")
            print(
                f"fedselect: {_flags(old)[0]} is deprecated and will be removed in fedselect 1.0; use {_flags(new)[0]}",
                file=sys.stderr,
            )
            trainer[new] = given[old]
        elif preset_value is not None and new not in given:
            trainer.setdefault(new, preset_value)
    for param, (value, _) in CLI_DEFAULTS.items():
        if param not in given:
            trainer[param] = value
    # Local work is steps or epochs: the one given replaces the preset's other (both given: the trainer refuses).
    if "local_steps" in given and "local_epochs" not in given:
        trainer.pop("local_epochs", None)
    if "local_epochs" in given and "local_steps" not in given:
        trainer.pop("local_steps", None)
