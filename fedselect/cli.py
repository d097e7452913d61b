"""The ``fedselect`` command: run one scheme, compare schemes, reproduce a paper, list what is installed."""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from pathlib import Path
from typing import Any

__all__ = ["main"]

_EPILOG = """\
examples:
  fedselect compare                                   # 4 schemes on label-skewed digits, 8 seeds, ~2 minutes
  fedselect compare --selectors random fedcor power-of-choice:d=10 --seeds 0 1 2 3 4
  fedselect compare --dataset fmnist --partition shards --n-clients 100 --rounds 200 --target 0.69
  fedselect reproduce fedcor-fmnist-2spc             # FedCor's Table 1 setting (hours; resumable)
  fedselect run --selector afl --rounds 50 --out run.json
  fedselect compare --plugin my_selector.py --selectors random largest-loss   # your scheme, no packaging
  fedselect list
"""


def _value(text: str) -> Any:
    if text.lower() in ("true", "false"):  # replace=true as well as replace=True
        return text.lower() == "true"
    if text.lower() in ("none", "null"):
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _jobs(text: str) -> int:
    if text.strip().lower() == "auto":
        return 0
    try:
        return _non_negative(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0 or 'auto', got {text!r}") from None


def parse_selector_spec(spec: str) -> tuple[str, str, dict[str, Any]]:
    """``"name"`` or ``"name:p=v,q=w"`` (optionally ``"label=name:..."``) -> (label, name, params).

    The name is what follows the last ``=`` before the first ``:``, so a label may contain
    ``=`` (``"HCSFed (weighting=paper)=hcsfed:weighting=paper"``) but not ``:``.
    """
    label = None
    head, colon, rest = spec.partition(":")
    if "=" in head:
        label, head = head.rsplit("=", 1)
    spec = head + colon + rest
    name, _, rest = spec.partition(":")
    params: dict[str, Any] = {}
    if rest:
        for item in rest.split(","):
            if "=" not in item:
                raise argparse.ArgumentTypeError(f"selector parameter {item!r} in {spec!r} must look like name=value")
            k, v = item.split("=", 1)
            if k.strip() in params:  # the last would win silently
                raise argparse.ArgumentTypeError(f"{spec!r} repeats {k.strip()!r}; give each parameter once")
            params[k.strip()] = _value(v.strip())
    return label or (name if not params else f"{name}({rest})"), name, params


def _registered(kind: str) -> str:
    """The names the registry knows for ``kind`` ("models" or "partitions"), for help texts."""
    try:
        if kind == "partitions":
            from .data.partition import PARTITIONS

            names = list(PARTITIONS)
        else:
            from .plugins import registry

            names = sorted({e.name for e in registry(kind).values()})
    except Exception:  # a broken plugin must not break --help; `fedselect list` reports it
        return "see `fedselect list`"
    return ", ".join(names)


def _plugin_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="FILE_OR_MODULE",
        help="load a plugin without packaging it: a Python file (path ending .py) or an importable module whose "
        "@fedselect.hookimpl functions (register_selectors, register_datasets, register_models, "
        "register_partitions, register_presets) register as an installed plugin's would; repeatable (default: "
        "none). Runs that use it record its file name and content hash.",
    )


DEFAULT_PRESET = "digits-quick"  # fedselect run's
COMPARE_PRESET = "digits-skew"  # fedselect compare's: a setting where client selection visibly matters
NO_PRESET = "none"  # --preset none: no preset, every setting at Python's default unless an option sets it

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


def _first_sentence(text: str) -> str:
    """The first sentence of a numpydoc description, as plain text; a long one up to its first colon or semicolon."""
    text = plain_text(text)
    first = re.split(r"(?<=[.!?])\s+(?=[A-Z])", text, maxsplit=1)[0] if text else ""
    if len(first) > 160:
        head = re.split(r"[:;]\s", first, maxsplit=1)[0]
        first = head.rstrip(".") + "." if len(head) < len(first) else first
    return first


def _numpydoc_params(doc: str | None) -> dict[str, str]:
    """Parameter name -> the description under it, from a numpydoc ``Parameters`` section."""
    import inspect

    lines = inspect.cleandoc(doc or "").splitlines()
    out: dict[str, str] = {}
    try:
        start = next(
            i
            for i, line in enumerate(lines[:-1])
            if line.strip() == "Parameters" and set(lines[i + 1].strip()) == {"-"}
        )
    except StopIteration:
        return out
    names: list[str] = []
    for i in range(start + 2, len(lines)):
        line = lines[i]
        if i + 1 < len(lines) and line.strip() and set(lines[i + 1].strip()) == {"-"}:
            break  # the next section
        if line and not line[0].isspace():
            names = [n.strip() for n in line.split(":", 1)[0].split(",") if n.strip().isidentifier()]
            for name in names:
                out[name] = ""
        elif line.strip():
            for name in names:
                out[name] = f"{out[name]} {line.strip()}".strip()
    return out


def _parser_for(constraints: Sequence[Any]) -> tuple[Callable[[str], Any] | None, str | None] | None:
    """(text -> value, metavar) for a parameter with these declared constraints; (None, None) for a boolean.

    None when no alternative can be written on a command line (only callables, arrays, modules).
    Values are converted, not judged: a number out of range reaches the parameter's own validation,
    whose message names the class, the parameter and what it allows.
    """
    from ._validation import Boolean, InstanceOf, Interval, NoneConstraint, StrOptions, describe, make_constraint
    from .data.partition import RegisteredPartition

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


def _mapping(text: str) -> dict[Any, Any]:
    """``"a=1,b=x"`` -> ``{"a": 1, "b": "x"}`` (values and keys read as Python literals where they are)."""
    out: dict[Any, Any] = {}
    for item in text.split(","):
        if "=" not in item:
            raise argparse.ArgumentTypeError(f"{item!r} in {text!r} must look like name=value")
        k, v = item.split("=", 1)
        key = _value(k.strip())
        if key in out:  # the last would win silently
            raise argparse.ArgumentTypeError(f"{text!r} repeats {key!r}; give each name once")
        out[key] = _value(v.strip())
    return out


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

    from .data.datasets import make_synthetic
    from .data.federation import _synthetic_pool
    from .plugins import registry

    try:
        partitions = {e.name: e.obj for e in registry("partitions").values()}
    except Exception:  # a broken plugin must not break --help; the command itself reports it
        from .data.partition import _BUILT_IN as partitions
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


def options() -> list[Option]:
    """Every generated option: the trainer's parameters, make_federation's, and the partitions' and datasets'.

    Built from the signatures, declared constraints (``_parameter_constraints``) and numpydoc
    descriptions each time plugins change what is registered; a test checks that an option not
    given leaves the parameter at Python's default.
    """
    from .data.federation import _MAKE_FEDERATION_CONSTRAINTS, make_federation
    from .simulation.trainer import FederatedTrainer

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
                help=help_text.replace("%", "%%"),
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

    from .data.federation import make_federation
    from .plugins import registry

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
    for opt in options():
        if opt.param in given:
            (federation if opt.section == "federation" else trainer)[opt.param] = given[opt.param]
    for param, (value, _) in CLI_DEFAULTS.items():
        if param not in given:
            trainer[param] = value
    # Local work is steps or epochs: the one given replaces the preset's other (both given: the trainer refuses).
    if "local_steps" in given and "local_epochs" not in given:
        trainer.pop("local_epochs", None)
    if "local_epochs" in given and "local_steps" not in given:
        trainer.pop("local_steps", None)


def python_equivalent(
    federation: Mapping[str, Any], trainer: Mapping[str, Any], *, selector: str = "<scheme>", seed: str = "seed"
) -> str:
    """The Python call with the same words as a command line's settings: what each of its runs trains.

    Examples
    --------
    >>> print(python_equivalent({"n_clients": 20}, {"rounds": 30}, selector="'afl'", seed="0"))
    FederatedTrainer(selector='afl', rounds=30, random_state=0).fit(make_federation(n_clients=20, random_state=0))
    """

    from .optim import OPTIMIZER_KEYS

    def words(kwargs: Mapping[str, Any]) -> str:
        out, flat = [], [f"{k}={v!r}" for k, v in kwargs.items() if k in OPTIMIZER_KEYS]
        for k, v in kwargs.items():  # the optimiser's flat settings as one LocalSGD, where the first of them stood
            if k not in OPTIMIZER_KEYS:
                out.append(f"{k}={v!r}")
            elif flat:
                out.append(f"optimizer=LocalSGD({', '.join(flat)})")
                flat = []
        return ", ".join([*out, f"random_state={seed}"])

    return f"FederatedTrainer(selector={selector}, {words(trainer)}).fit(make_federation({words(federation)}))"


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


_ROLE = re.compile(r":[\w:.+-]+:`(~?)([^`<]*?)(?:\s*<([^>]*)>)?`")  # :class:`~a.B`, :ref:`text <target>`
_CITATION = re.compile(r"\s*\[(\w+)\]_")  # numpydoc's "[1]_"
_LINK = re.compile(r"`([^`<]+?)\s*<[^>]+>`__?")  # `text <url>`_
_FOOTNOTE = re.compile(r"^\.\. \[(\w+)\]\s*(.*)$")


def _role(match: re.Match[str]) -> str:
    tilde, text, target = match.groups()
    text = text.strip() or (target or "")
    return text.rsplit(".", 1)[-1] if tilde else text


def plain_text(text: str) -> str:
    """reST/numpydoc inline markup as a terminal shows it: roles, literals, emphasis, links, citations dropped.

    ``:class:`~fedselect.FederatedTrainer``` -> ``FederatedTrainer``, ````code```` -> ``code``,
    ``*Title*`` -> ``Title``, ```text <url>`_`` -> ``text``, ``Goetz et al. [1]_`` -> ``Goetz et al.``.
    """
    text = _CITATION.sub("", text)
    text = _LINK.sub(r"\1", text)
    text = _ROLE.sub(_role, text)
    text = re.sub(r"``(.+?)``", r"\1", text)
    text = re.sub(r"\*\*(.+?)\*\*|\*(.+?)\*", lambda m: m.group(1) or m.group(2), text)
    text = re.sub(r"(?<=\w)\\ ", "", text)  # reST's escaped space, as in "n\ :sub:`k`"
    return " ".join(text.split())


def _doc_summary(doc: str) -> tuple[str, list[str]]:
    """A docstring's summary (its first paragraph) and the references it cites, as plain text."""
    import inspect

    doc = inspect.cleandoc(doc or "")
    summary = doc.split("\n\n", 1)[0]
    cited = _CITATION.findall(summary)
    notes: dict[str, str] = {}
    key = None
    for line in doc.splitlines():
        m = _FOOTNOTE.match(line)
        if m:
            key = m.group(1)
            notes[key] = m.group(2)
        elif key is not None and line.startswith("   ") and line.strip():
            notes[key] += " " + line.strip()
        else:
            key = None
    refs = [f"[{k}] {plain_text(notes[k])}" for k in dict.fromkeys(cited) if k in notes]
    return plain_text(summary), refs


def _cmd_list(args: argparse.Namespace) -> int:
    import textwrap

    from .plugins import list_datasets, list_models, registry

    width = max(60, min(shutil.get_terminal_size((100, 24)).columns, 120))
    table = registry("selectors")
    canon: dict[str, Any] = {}
    for entry in table.values():
        canon.setdefault(entry.name, entry)
    indent = " " * 21

    def wrap(text: str, first: str) -> str:
        return textwrap.fill(
            text,
            width,
            initial_indent=first,
            subsequent_indent=" " * len(first),
            break_on_hyphens=False,
            break_long_words=False,
        )

    print("selectors (name, what it does, aliases, plugin, the papers it cites):")
    for name in sorted(canon):
        e = canon[name]
        summary, refs = _doc_summary(e.obj.__doc__ or "")
        print(wrap(summary or "(no description)", f"  {name:<18} "))
        alias = f"aliases: {', '.join(e.aliases)}; " if e.aliases else ""
        print(wrap(f"{alias}plugin: {e.plugin}", indent))
        for ref in refs:
            print(wrap(ref, indent))
    print("datasets:  " + ", ".join(list_datasets()))
    print("models:    " + ", ".join(list_models()))
    partitions = {e.name: e for e in registry("partitions").values()}
    print("partitions: " + ", ".join(partitions))
    for name, e in partitions.items():
        if not e.plugin.startswith("fedselect."):
            summary, _ = _doc_summary(e.obj.__doc__ or "")
            print(wrap(f"{summary or '(no description)'} (plugin: {e.plugin})", f"  {name:<18} "))
    print("presets:")
    presets = {e.name: e for e in registry("presets").values()}
    for name in sorted(presets):
        e = presets[name]
        text = plain_text(e.obj.description) + ("" if e.plugin.startswith("fedselect.") else f" (plugin: {e.plugin})")
        print(wrap(text, f"  {name:<22} "))
    return 0


def _check_writable_file(out: Path) -> None:
    """Refuse an output file that cannot be written, before hours of training rather than after."""
    if out.is_dir():
        raise IsADirectoryError(f"--out {out} is a directory; expected a .json or .csv file name")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise FileNotFoundError(f"--out {out}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise PermissionError(f"--out {out}: not writable")


def get_preset(name: str, *, command: str = "compare") -> Any:
    """The preset ``--preset NAME`` (or ``reproduce NAME``) names; ``none`` is no preset at all.

    ``none`` is an empty :class:`~fedselect.presets.Preset`: every setting at Python's default
    (``make_federation()``, ``FederatedTrainer()``, ``run_comparison``'s seeds and target) unless
    an option sets it, and no schemes (``compare`` then needs ``--selectors``).
    """
    import inspect

    from .presets import Preset
    from .presets import get_preset as registered

    if name != NO_PRESET:
        return registered(name)
    if command == "reproduce":
        raise ValueError(
            "reproduce needs a preset (see `fedselect list`); for Python's defaults use "
            "`fedselect compare --preset none --selectors ...`"
        )
    from .compare import run_comparison

    signature = inspect.signature(run_comparison).parameters
    return Preset(
        name=NO_PRESET,
        description="No preset: Python's defaults",
        federation={},
        trainer={},
        selectors={},
        seeds=tuple(signature["seeds"].default),
        target=signature["target"].default,
    )


def _settings(args: argparse.Namespace, preset: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The make_federation and FederatedTrainer keyword arguments a command runs: the preset's, then the options."""
    federation = dict(preset.federation)
    trainer = dict(preset.trainer)
    _apply_overrides(args, federation, trainer)
    return federation, trainer


def _cmd_run(args: argparse.Namespace) -> int:
    from .compare import check_plan
    from .data import make_federation
    from .optim import as_optimizer
    from .plugins import get_selector
    from .simulation.trainer import FederatedTrainer

    preset = get_preset(args.preset, command="run")
    federation, trainer = _settings(args, preset)
    label, name, params = parse_selector_spec(args.selector)
    # Everything checkable before the data is loaded and training starts.
    check_plan({label: (name, params)}, trainer=trainer, seeds=[args.seed], federation=federation)
    if args.out:
        _check_writable_file(Path(args.out))
    scheme = repr(name) if not params else repr((name, params))
    print(f"in Python: {python_equivalent(federation, trainer, selector=scheme, seed=str(args.seed))}", file=sys.stderr)
    out = Path(args.out) if args.out else None
    ckpt = None
    if out is not None and args.checkpoint_every:
        ckpt = out.with_name(out.name + ".checkpoint")
        trainer.update(checkpoint_dir=ckpt, checkpoint_every=args.checkpoint_every)
    fed = make_federation(random_state=args.seed, **federation)
    print(fed.summary(), file=sys.stderr)
    tr = FederatedTrainer(
        selector=get_selector(name, **params),
        random_state=args.seed,
        progress=not args.no_progress,
        **as_optimizer(trainer),
    )
    if ckpt is not None and (ckpt / "checkpoint.pkl").exists():
        print(f"resuming from the checkpoint in {ckpt}/", file=sys.stderr)
    tr.fit(fed)
    h = tr.history_
    target = trainer.get("target_accuracy") or preset.target
    c = h.total_costs()
    print(
        f"{label}: {len(h)} rounds, final accuracy {h.final_accuracy():.4f}, best {h.best_accuracy():.4f}, "
        f"rounds to {target:.0%}: {h.rounds_to_accuracy(target) or 'not reached'}"
    )
    print("costs: " + ", ".join(f"{k}={v}" for k, v in c.to_dict().items()))
    if h.rounds and h.rounds[-1].sim_time is not None:  # a simulated clock ran (--profiles or --clock)
        to_target = h.time_to_accuracy(target)
        print(
            f"simulated time: {h.rounds[-1].sim_time:.1f} s, to {target:.0%}: "
            f"{'not reached' if to_target is None else f'{to_target:.1f} s'}"
        )
    if out is not None:
        if out.suffix == ".csv":
            h.to_csv(out)
        else:
            h.to_json(out)
        print(f"history written to {out}", file=sys.stderr)
        if ckpt is not None:
            shutil.rmtree(ckpt, ignore_errors=True)
    nobody = h.rounds_trained_nobody()
    if h.rounds and nobody == len(h.rounds):  # the model never changed: a result, but not one to trust silently
        print(
            f"fedselect run: error: no round trained anybody ({nobody} of {len(h.rounds)}: every chosen client "
            "failed, was offline, or missed the deadline or the query timeout); exit status 3",
            file=sys.stderr,
        )
        return 3
    return 0


def _default_out(args: argparse.Namespace, preset: Any, federation: dict[str, Any], trainer: dict[str, Any]) -> Path:
    """``fedselect-results/<preset>``, or ``<preset>-<hash>`` when the federation or training options differ.

    The hash covers the federation and trainer settings only: --selectors and --seeds add runs to the
    same folder (each run is keyed on its own), while a changed option starts a folder of its own
    instead of colliding with the runs of the preset's settings.
    """
    from .compare import _key

    base_args = build_parser().parse_args([args.command, *([preset.name] if args.command == "reproduce" else [])])
    base_fed, base_tr = dict(preset.federation), dict(preset.trainer)
    _apply_overrides(base_args, base_fed, base_tr)
    root = Path("fedselect-results")
    if (federation, trainer) == (base_fed, base_tr):
        return root / preset.name
    return root / f"{preset.name}-{_key({'federation': federation, 'trainer': trainer})[:8]}"


def _cmd_compare(args: argparse.Namespace, *, preset_name: str | None = None) -> int:
    from .compare import run_comparison

    preset = get_preset(preset_name or args.preset, command=args.command)
    federation, trainer = _settings(args, preset)
    if args.selectors:
        selectors = {}
        for spec in args.selectors:
            label, name, params = parse_selector_spec(spec)
            if label in selectors:
                raise ValueError(
                    f"--selectors names {label!r} twice; give each scheme once (or distinct labels, "
                    f"e.g. a={spec} b={spec})"
                )
            selectors[label] = (name, params)
    else:
        from .plugins import registry

        if not preset.selectors:
            raise ValueError(
                f"--preset {preset.name} names no schemes; give --selectors (e.g. --selectors random power-of-choice)"
            )
        known = set(registry("selectors"))  # canonical names and aliases
        selectors = {k: v for k, v in preset.selectors.items() if v[0] in known}
        missing = [k for k, v in preset.selectors.items() if v[0] not in known]
        if missing:
            print(f"note: skipping {', '.join(missing)} (not installed)", file=sys.stderr)
    seeds = tuple(args.seeds) if args.seeds else preset.seeds
    if args.no_paired:
        if args.paired is not None:
            raise ValueError(f"--paired {args.paired!r} and --no-paired contradict each other; give one")
    elif args.paired is None and "random" in selectors and len(selectors) > 1:
        args.paired = "random"  # the verdict a newcomer needs: does any scheme beat uniform sampling?
    if args.paired is not None and args.paired not in selectors:
        raise ValueError(f"--paired {args.paired!r} is not one of the schemes compared: {', '.join(selectors)}")
    target = trainer.get("target_accuracy") or preset.target
    out = Path(args.out) if args.out else _default_out(args, preset, federation, trainer)
    print(f"comparing {', '.join(selectors)} over seeds {list(seeds)}; results in {out}/", file=sys.stderr)
    print(f"each run, in Python: {python_equivalent(federation, trainer)}", file=sys.stderr)
    comp = run_comparison(
        selectors,
        federation=federation,
        trainer=trainer,
        seeds=seeds,
        target=target,
        out_dir=out,
        overwrite=args.overwrite,
        progress=not args.no_progress,
        paper=preset.paper if not args.selectors else None,
        title=preset.description.split(":")[0] if preset_name else "",
        retry_failed=args.retry_failed,
        checkpoint_every=args.checkpoint_every,
        jobs=args.jobs,
        ray_address=args.ray,
        batch_seeds=args.batch_seeds,
        overcommit=args.overcommit,
    )
    if getattr(args, "compress", False):
        from .compare import compress_runs

        compress_runs(out / "runs")
    files = comp.write(out)
    files += comp.plot(out)
    print(comp.to_text())
    if args.paired is not None:
        paired = comp.paired_markdown(args.paired)
        _keep_paired_of_another_reference(out, args.paired)
        (out / "paired.md").write_text(comp.paired_report(args.paired))  # with a clock: time is a second family
        files.append(out / "paired.md")
        print(f"\npaired by seed against {args.paired}:\n{paired}")
        if comp.has_clock():
            timed = comp.paired_markdown(args.paired, metric="time")
            print(f"\npaired by seed against {args.paired} on simulated seconds to {target:.0%}:\n{timed}")
    print("\nwritten: " + ", ".join(str(f) for f in files), file=sys.stderr)
    from .compare import _slug, run_files

    mine = {_slug(label) for label in comp.histories} | {_slug(label) for label in comp.failed}
    others = sorted({f.name.split("__seed")[0] for f in run_files(out / "runs")} - mine)
    if others:
        print(
            f"(these summaries cover the schemes of this command: {', '.join(comp.histories)}; the runs of "
            f"{', '.join(others)} saved in {out / 'runs'} stay there and return with their --selectors)",
            file=sys.stderr,
        )
    n_failed = sum(len(v) for v in comp.failed.values())
    if n_failed:
        print(
            f"{n_failed} run(s) failed (see the table's last column and {out}/runs/); they stay failed on a rerun "
            "unless --retry-failed",
            file=sys.stderr,
        )
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedselect",
        description="Client selection for federated learning: simulate, compare and reproduce selection schemes, "
        "counting what each one costs.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from . import __version__
    from .presets import PRESETS

    # Built-in presets for the help texts, read without loading plugins: a broken plugin must not break --help.
    default_preset = PRESETS[DEFAULT_PRESET]
    compare_preset = PRESETS[COMPARE_PRESET]
    parser.add_argument("--version", action="version", version=f"fedselect {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show the full traceback of an error (also: FEDSELECT_DEBUG=1)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "list",
        help="list installed selectors, datasets, models, partitions and presets (from every plugin)",
        description="List installed selectors, datasets, models, partitions and presets, from every plugin.",
    )
    _plugin_arg(p)
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser(
        "flower-report",
        help="the table, pictures and paired statistics of Flower runs, from their records files",
        description="Read Flower runs' records (SelectorStrategy.start(records_path=...)): one file, or a folder of "
        "<scheme>__seed<k>.jsonl files, and write what `fedselect compare` writes: table.md, summary.json, "
        "results.csv, the pictures and paired.md. Accuracies come from the centralised evaluation "
        "(start(evaluate_fn=...)); a file without them is an error.",
    )
    p.add_argument("records", help="a records file (.jsonl) or a folder of <scheme>__seed<k>.jsonl files")
    p.add_argument("--target", type=float, default=0.8, help="target test accuracy (default: 0.8)")
    p.add_argument("--out", default="flower-report", help="folder to write into (default: flower-report)")
    p.add_argument(
        "--paired", default="random", metavar="LABEL", help="pair every scheme with LABEL by seed (default: random)"
    )
    p.add_argument("--model-size", type=_non_negative, default=0, metavar="D", help="floats in one model (default: 0)")
    p.set_defaults(func=_cmd_flower_report)

    p = sub.add_parser(
        "run",
        help="run one scheme once and print its accuracy and costs",
        description="Run one scheme on one federation. Settings start from --preset (default digits-quick); "
        "every option below overrides one of them.",
    )
    p.add_argument("--selector", default="random", help="name or name:param=value,... (default: random)")
    p.add_argument(
        "--preset",
        default=DEFAULT_PRESET,
        help=f"starting settings, see `fedselect list`; {NO_PRESET}: no preset, Python's defaults "
        f"(default: {DEFAULT_PRESET})",
    )
    p.add_argument("--seed", type=int, default=0, help="seeds the federation, training and selection (default: 0)")
    p.add_argument(
        "--out",
        help="write the history to this .json or .csv file (and checkpoint the run beside it "
        "in OUT.checkpoint/ until then: the same command resumes a killed run) (default: none, the "
        "summary is printed only)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=_non_negative,
        default=10,
        metavar="K",
        help="with --out, checkpoint every K rounds (default: 10; 0 = never)",
    )
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (there is one only when stderr is a terminal)"
    )
    _plugin_arg(p)
    _add_options(p, default_preset, _stop_note(default_preset))
    p.set_defaults(func=_cmd_run)

    for cmd, helptext in (
        ("compare", "compare schemes over seeds: table, curves, selection frequencies, costs (resumable)"),
        ("reproduce", "run a paper's preset (see `fedselect list`), resumable"),
    ):
        p = sub.add_parser(
            cmd,
            help=helptext,
            description=helptext[0].upper() + helptext[1:] + ". Each (scheme, seed) run is saved the moment it "
            "finishes under OUT/runs/ with the command and commit that produced it; rerunning the same command "
            "skips finished runs and resumes the one in progress from its checkpoint. A run that diverges or raises "
            "is saved as failed and the comparison goes on (exit status 1 at the end). Writes OUT/table.md, "
            "paired.md (unless --no-paired), summary.json, results.csv, accuracy.png, "
            "selection_frequency.png and communication.png.",
        )
        if cmd == "reproduce":
            p.add_argument("preset", help="preset name, e.g. fedcor-fmnist-2spc")
        else:
            p.add_argument(
                "--preset",
                default=COMPARE_PRESET,
                help=f"starting settings, see `fedselect list`; {NO_PRESET}: no preset, every setting at "
                "Python's default unless an option sets it (then give --selectors) (default: "
                f"{COMPARE_PRESET}, strong label skew, where the choice of clients matters)",
            )
        preset = None if cmd == "reproduce" else compare_preset
        p.add_argument(
            "--selectors",
            nargs="+",
            metavar="NAME[:P=V,...]",
            help="schemes as name or label=name:param=value,... (default: the preset's"
            + (f", for {preset.name}: {' '.join(preset.selectors)})" if preset else ")"),
        )
        p.add_argument(
            "--seeds",
            nargs="+",
            type=int,
            help="seeds (default: the preset's"
            + (f", for {preset.name}: {' '.join(map(str, preset.seeds))})" if preset else ")"),
        )
        p.add_argument(
            "--out",
            help="output directory (default fedselect-results/<preset> with the preset's "
            "settings, fedselect-results/<preset>-<hash of the settings> when a federation or training "
            "option differs, so changed settings never collide with earlier runs; other --selectors and "
            "--seeds add runs to the same folder)",
        )
        p.add_argument("--overwrite", action="store_true", help="re-run saved runs whose settings differ")
        p.add_argument(
            "--compress",
            action="store_true",
            help="gzip the finished run files (OUT/runs/*.json -> *.json.gz) at the end; a rerun reads both",
        )
        p.add_argument(
            "--overcommit",
            choices=["equal", "as-set"],
            default="equal",
            help="equal (default): every scheme gets the same over-commitment, a scheme's own (Oort's) moved to "
            "the round for all (straggler_policy overselect); as-set: compare the schemes as given",
        )
        p.add_argument(
            "--retry-failed",
            action="store_true",
            help="run again the runs saved as failed (by default a failed run stays failed)",
        )
        p.add_argument(
            "--checkpoint-every",
            type=_non_negative,
            default=10,
            metavar="K",
            help="checkpoint each run every K rounds under OUT/checkpoints/, so a killed comparison "
            "resumes the run in progress (default: 10; 0 = never)",
        )
        p.add_argument(
            "--jobs",
            type=_jobs,
            default=1,
            metavar="N",
            help="run N (scheme, seed) runs at once, each in a process of its own with --threads torch "
            "threads (keep N x threads within the cores); 0 or auto: one run per core, cores // --threads "
            f"(here {_cores()} core(s)). Results, result files and resuming are those of a serial run; "
            "one progress bar counts the whole grid (default: 1, one run after another)",
        )
        p.add_argument(
            "--batch-seeds",
            type=_non_negative,
            nargs="?",
            const=True,
            default=False,
            metavar="N",
            help="train the seeds of each scheme together as one computation: each round, all seeds' "
            "chosen clients in one batched step and all seeds' models in one pass over the test set; "
            "each run keeps its own selector, random streams, history and result file (results equal "
            "the one-at-a-time runs' up to float rounding). Without N all seeds of a scheme at once, "
            "with N up to N at a time. Models other than the built-in logistic, mlp and cnn, and batch "
            "norm, train one run at a time with a note. With --jobs, each process trains one batch at a "
            "time (default: off)",
        )
        p.add_argument(
            "--ray",
            metavar="ADDRESS",
            help="run each (scheme, seed) as a task on a Ray cluster, --threads CPUs each: auto (the "
            "cluster this machine is part of), ray://HOST:PORT, or local (start Ray on this machine); "
            'results are written here as tasks finish. Needs Ray: pip install "fedselect[ray]" '
            "(default: none, runs stay on this machine)",
        )
        p.add_argument(
            "--paired",
            metavar="LABEL",
            help="also compare every scheme with LABEL seed by seed (Wilcoxon test, Holm-adjusted), into "
            "OUT/paired.md (default: random, when it is compared with another scheme)",
        )
        p.add_argument(
            "--no-paired", action="store_true", help="no paired comparison, not even against random (default: off)"
        )
        p.add_argument(
            "--no-progress",
            action="store_true",
            help="no progress reports (when stderr is a terminal: bars; otherwise, as in a log file, "
            "one line per finished run)",
        )
        _plugin_arg(p)
        _add_options(p, preset, _stop_note(preset))
        if cmd == "reproduce":
            p.set_defaults(func=lambda a: _cmd_compare(a, preset_name=a.preset))
        else:
            p.set_defaults(func=_cmd_compare)
    return parser


# What a user's input or environment usually causes: answered with one line and exit status 2. These types can
# also come from a bug (a TypeError or KeyError inside fedselect or a plugin): --debug or FEDSELECT_DEBUG=1 shows
# the traceback. Anything else (AttributeError, IndexError, AssertionError, ...) always keeps its traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (
    KeyError,
    ValueError,
    TypeError,
    OSError,
    FloatingPointError,
    EOFError,
    RuntimeError,
    ImportError,
    argparse.ArgumentTypeError,
)


def _one_line(exc: BaseException) -> str:
    msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    msg = " ".join(str(msg).split()) or type(exc).__name__
    if isinstance(exc, OSError | FloatingPointError | EOFError | RuntimeError | ImportError):
        msg = f"{type(exc).__name__}: {msg}"
    return msg


def _load_plugins_named(argv: Sequence[str]) -> None:
    """Load the plugins ``--plugin X`` (or ``--plugin=X``) names in ``argv``, before the parser is built."""
    named = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--plugin"]
    named += [a.split("=", 1)[1] for a in argv if a.startswith("--plugin=")]
    if named:
        from .plugins import load_plugin

        for plugin in named:
            load_plugin(plugin)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fedselect`` command.

    Returns 0 on success, 1 when ``compare``/``reproduce`` finished but a run failed (it is
    recorded and shown in the table), 2 for a user error (bad option values, unreadable or
    unwritable files, a diverging run; printed as one line ``fedselect: error: ...``), 130
    when interrupted. ``--debug`` (or ``FEDSELECT_DEBUG=1``) shows the traceback instead.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        # Plugins named by --plugin load first, so the partitions they register bring their options.
        _load_plugins_named(argv)
    except USER_ERRORS as exc:
        if "--debug" in argv or os.environ.get("FEDSELECT_DEBUG"):
            raise
        print(f"fedselect: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    try:
        if getattr(args, "plugin", None):
            from .plugins import load_plugin

            for plugin in args.plugin:
                load_plugin(plugin)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(
            "\ninterrupted: finished runs and checkpoints are saved; rerun the same command to resume", file=sys.stderr
        )
        return 130
    except USER_ERRORS as exc:
        if args.debug or os.environ.get("FEDSELECT_DEBUG"):
            raise
        print(f"fedselect: error: {_one_line(exc)}", file=sys.stderr)
        return 2


def _keep_paired_of_another_reference(out: Path, reference: str) -> None:
    """Move ``out/paired.md`` aside as ``paired-against-<its reference>.md`` when it pairs against another scheme.

    The same runs paired against another reference are another family of tests (other Holm-adjusted
    p-values): the earlier verdict is kept beside the new one, never overwritten.
    """
    path = out / "paired.md"
    try:
        first = path.read_text(errors="replace").split("\n", 1)[0]
    except OSError:
        return
    prefix = "Paired by seed against "
    if not first.startswith(prefix):
        return
    before = first[len(prefix) :].split(" (rounds to", 1)[0]
    if before != reference:
        from .compare import _slug

        path.replace(out / f"paired-against-{_slug(before)}.md")


def _cmd_flower_report(args: argparse.Namespace) -> int:
    from .experiments.flower_records import load_flower_records, write_report

    comp = load_flower_records(args.records, args.target, model_size=args.model_size, title="Flower")
    files = write_report(comp, Path(args.out), paired=args.paired)
    print(comp.to_text())
    print("\nwritten: " + ", ".join(str(f) for f in files), file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
