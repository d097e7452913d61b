"""The ``fedselect`` command: run one scheme, compare schemes, reproduce a paper, list what is installed."""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import sys
from collections.abc import Sequence
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


def _divergence(text: str) -> float | str:
    if text.strip().lower() == "none":
        return "none"
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 1 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 1 or 'none', got {text!r}")
    return value


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
        "--plugin", action="append", default=[], metavar="FILE_OR_MODULE",
        help="load a plugin without packaging it: a Python file (path ending .py) or an importable module whose "
        "@fedselect.hookimpl functions (register_selectors, register_datasets, register_models) register as an "
        "installed plugin's would; repeatable (default: none). Runs that use it record its file name and content hash.",
    )


DEFAULT_PRESET = "digits-quick"  # fedselect run's
COMPARE_PRESET = "digits-skew"  # fedselect compare's: a setting where client selection visibly matters

# Python's defaults where the command line's come from a preset instead: FederatedTrainer's, make_federation's and
# run_comparison's keyword defaults (kept here so that `--help` needs no torch import; a test checks them against
# the signatures). Keys are the preset's (FederatedTrainer / make_federation keyword names).
PYTHON_DEFAULTS: dict[str, tuple[str, Any]] = {
    "dataset": ("make_federation", "digits"),
    "partition": ("make_federation", "iid"),
    "n_clients": ("make_federation", 10),
    "holdout": ("make_federation", 0.0),
    "model": ("FederatedTrainer", "mlp"),
    "clients_per_round": ("FederatedTrainer", 5),
    "rounds": ("FederatedTrainer", 100),
    "local_epochs": ("FederatedTrainer", 1),  # its signature says None: one epoch unless local_steps is given
    "batch_size": ("FederatedTrainer", 32),
    "lr": ("FederatedTrainer", 0.05),
    "weight_decay": ("FederatedTrainer", 0.0),
    "prox_mu": ("FederatedTrainer", 0.0),
    "aggregation": ("FederatedTrainer", "data-size"),
    "dropout": ("FederatedTrainer", 0.0),
    "momentum": ("FederatedTrainer", 0.0),
    "divergence": ("FederatedTrainer", 10.0),
    "target": ("run_comparison", 0.8),
}


def _show(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}"
    return "none" if value is None else str(value)


def _default(key: str, preset: Any, *, section: str, fallback: str = "") -> str:
    """The '(default: ...)' of an option whose value comes from the preset unless given.

    Says the preset's value, and Python's default where it differs (the same scheme run from Python
    with default arguments trains differently, and a reader comparing the two must know).
    """
    python = PYTHON_DEFAULTS.get(key)
    if preset is None:  # reproduce: the preset is an argument
        text = "the preset's"
        if python is not None:
            text += f"; where the preset sets none, {python[0]}'s default {_show(python[1])}"
        return f"(default: {text})"
    settings = {"federation": preset.federation, "trainer": preset.trainer}[section]
    if key == "target":
        value: Any = settings.get("target_accuracy", preset.target)
    else:
        value = settings.get(key, _MISSING)
    if value is _MISSING:  # the preset leaves it to Python
        if python is not None:
            return f"(default: {_show(python[1])}, {python[0]}'s default)"
        return f"(default: {fallback or 'not set'})"
    text = f"the preset's, {_show(value)} for {preset.name}"
    if python is not None and python[1] != value:
        if key == "target":
            text += (f"; differs from Python: run_comparison's target defaults to {_show(python[1])} and "
                     "FederatedTrainer has no target")
        else:
            text += f"; differs from Python: {python[0]}'s default is {_show(python[1])}"
    return f"(default: {text})"


_MISSING = object()


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _federation_args(p: argparse.ArgumentParser, preset: Any) -> None:
    def d(key: str, fallback: str = "") -> str:
        return _default(key, preset, section="federation", fallback=fallback)

    g = p.add_argument_group("federation (each option overrides one setting of the preset)")
    g.add_argument("--dataset", help=f"registered dataset: {_registered('datasets')} (digits ships with scikit-learn; "
                   "see `fedselect list`) " + d("dataset"))
    g.add_argument("--data-dir", help="directory with the dataset's files (default: $FEDSELECT_DATA, then the user "
                   "cache and the system's data folders)")
    g.add_argument("--partition", help=f"{_registered('partitions')} " + d("partition"))
    g.add_argument("--n-clients", type=int, help="N, the number of clients " + d("n_clients"))
    g.add_argument("--shards-per-client", type=int, help="label shards per client, for --partition shards "
                   "(2 = FedCor's 2SPC) " + d("shards_per_client", "the partition's own, 2"))
    g.add_argument("--alpha", type=float, help="Dirichlet concentration for --partition dirichlet or dirichlet-qp; "
                   "smaller is more skewed " + d("alpha", "the partition's own"))
    g.add_argument("--holdout", type=float, help="fraction of each client's data held out to measure its loss "
                   + d("holdout"))


def _trainer_args(p: argparse.ArgumentParser, preset: Any) -> None:
    def d(key: str, fallback: str = "") -> str:
        return _default(key, preset, section="trainer", fallback=fallback)

    if preset is None:
        note = "Each preset also says whether a run stops once it reaches the target (stop_at_target)."
    elif preset.trainer.get("stop_at_target", True):
        note = f"{preset.name} stops a run once it reaches the target, as FederatedTrainer does by default."
    else:
        note = (f"{preset.name} trains every run for all its rounds, also after it reaches the target "
                "(stop_at_target=False; differs from Python: FederatedTrainer stops at its target by default).")
    g = p.add_argument_group("training (each option overrides one setting of the preset)", description=note)
    g.add_argument("--model", help=f"a registered model: {_registered('models')} " + d("model"))
    g.add_argument("--clients-per-round", type=int, help="C, clients chosen each round " + d("clients_per_round"))
    g.add_argument("--rounds", type=int, help="number of rounds " + d("rounds"))
    g.add_argument("--local-epochs", type=int, help="local epochs per round " + d("local_epochs", "1 epoch"))
    g.add_argument("--local-steps", type=int, help="local SGD steps per round, instead of epochs "
                   + d("local_steps", "epochs, see --local-epochs"))
    g.add_argument("--batch-size", type=int, help="local minibatch size " + d("batch_size"))
    g.add_argument("--lr", type=float, help="local learning rate " + d("lr"))
    g.add_argument("--weight-decay", type=float, help="L2 weight decay of local SGD " + d("weight_decay"))
    g.add_argument("--prox-mu", type=float, help="FedProx proximal coefficient (0 = FedAvg) " + d("prox_mu"))
    g.add_argument("--momentum", type=float, help="local SGD momentum, in [0, 1); each client's momentum buffer "
                   "starts empty every round " + d("momentum"))
    g.add_argument("--aggregation", choices=("mean", "data-size"),
                   help="how the chosen clients' updates are averaged: plain mean, or weighted by their numbers "
                   "of samples " + d("aggregation"))
    g.add_argument("--target", type=float, help="target test accuracy, e.g. 0.8, whose rounds-to-target the table "
                   "reports " + d("target"))
    g.add_argument("--dropout", type=float,
                   help="client failures: probability that a client does not answer in a round; "
                   "the same failures for every scheme of one seed " + d("dropout"))
    g.add_argument("--divergence", type=_divergence, metavar="FACTOR",
                   help="stop a run as diverged once its test loss exceeds FACTOR x the initial model's; "
                   "'none' to disable " + d("divergence"))
    g.add_argument("--threads", type=int, default=1,
                   help="torch threads per run (default: 1, since the small models here run fastest "
                   "single-threaded and a 2-core machine shared with other work slows down badly with more; "
                   "differs from Python: FederatedTrainer's n_threads default none keeps torch's own setting)")


def _apply_overrides(args: argparse.Namespace, federation: dict[str, Any], trainer: dict[str, Any]) -> None:
    new_partition = getattr(args, "partition", None)
    if new_partition is not None and new_partition != federation.get("partition"):
        # The preset's partition parameters belong to its partition, not to the one asked for.
        for key in ("shards_per_client", "alpha"):
            federation.pop(key, None)
    for attr, key in (("dataset", "dataset"), ("data_dir", "data_dir"), ("partition", "partition"),
                      ("n_clients", "n_clients"), ("shards_per_client", "shards_per_client"), ("alpha", "alpha"),
                      ("holdout", "holdout")):
        v = getattr(args, attr, None)
        if v is not None:
            federation[key] = v
    for attr, key in (("model", "model"), ("clients_per_round", "clients_per_round"), ("rounds", "rounds"),
                      ("batch_size", "batch_size"), ("lr", "lr"), ("weight_decay", "weight_decay"),
                      ("prox_mu", "prox_mu"), ("aggregation", "aggregation"), ("threads", "n_threads"),
                      ("dropout", "dropout"), ("momentum", "momentum")):
        v = getattr(args, attr, None)
        if v is not None:
            trainer[key] = v
    divergence = getattr(args, "divergence", None)
    if divergence is not None:
        trainer["divergence"] = None if divergence == "none" else divergence
    if getattr(args, "local_steps", None) is not None:
        trainer["local_steps"] = args.local_steps
        trainer.pop("local_epochs", None)
    if getattr(args, "local_epochs", None) is not None:
        trainer["local_epochs"] = args.local_epochs
        trainer.pop("local_steps", None)
    if getattr(args, "target", None) is not None:
        trainer["target_accuracy"] = args.target


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
    from .presets import PRESETS

    width = max(60, min(shutil.get_terminal_size((100, 24)).columns, 120))
    table = registry("selectors")
    canon: dict[str, Any] = {}
    for entry in table.values():
        canon.setdefault(entry.name, entry)
    indent = " " * 21

    def wrap(text: str, first: str) -> str:
        return textwrap.fill(text, width, initial_indent=first, subsequent_indent=" " * len(first),
                             break_on_hyphens=False, break_long_words=False)

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
    from .data.partition import PARTITIONS

    print("partitions: " + ", ".join(PARTITIONS))
    print("presets:")
    for name in sorted(PRESETS):
        print(wrap(plain_text(PRESETS[name].description), f"  {name:<22} "))
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


def _cmd_run(args: argparse.Namespace) -> int:
    from .compare import check_plan
    from .data import make_federation
    from .plugins import get_selector
    from .presets import get_preset
    from .simulation.trainer import FederatedTrainer

    preset = get_preset(args.preset)
    federation = dict(preset.federation)
    trainer = dict(preset.trainer)
    _apply_overrides(args, federation, trainer)
    label, name, params = parse_selector_spec(args.selector)
    # Everything checkable before the data is loaded and training starts.
    check_plan({label: (name, params)}, trainer=trainer, seeds=[args.seed], federation=federation)
    if args.out:
        _check_writable_file(Path(args.out))
    out = Path(args.out) if args.out else None
    ckpt = None
    if out is not None and args.checkpoint_every:
        ckpt = out.with_name(out.name + ".checkpoint")
        trainer.update(checkpoint_dir=ckpt, checkpoint_every=args.checkpoint_every)
    fed = make_federation(random_state=args.seed, **federation)
    print(fed.summary(), file=sys.stderr)
    tr = FederatedTrainer(selector=get_selector(name, **params), random_state=args.seed,
                          progress=not args.no_progress, **trainer)
    if ckpt is not None and (ckpt / "checkpoint.pkl").exists():
        print(f"resuming from the checkpoint in {ckpt}/", file=sys.stderr)
    tr.fit(fed)
    h = tr.history_
    target = trainer.get("target_accuracy") or preset.target
    c = h.total_costs()
    print(f"{label}: {len(h)} rounds, final accuracy {h.final_accuracy():.4f}, best {h.best_accuracy():.4f}, "
          f"rounds to {target:.0%}: {h.rounds_to_accuracy(target) or 'not reached'}")
    print("costs: " + ", ".join(f"{k}={v}" for k, v in c.to_dict().items()))
    if out is not None:
        if out.suffix == ".csv":
            h.to_csv(out)
        else:
            h.to_json(out)
        print(f"history written to {out}", file=sys.stderr)
        if ckpt is not None:
            shutil.rmtree(ckpt, ignore_errors=True)
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
    from .presets import get_preset

    preset = get_preset(preset_name or args.preset)
    federation = dict(preset.federation)
    trainer = dict(preset.trainer)
    _apply_overrides(args, federation, trainer)
    if args.selectors:
        selectors = {}
        for spec in args.selectors:
            label, name, params = parse_selector_spec(spec)
            if label in selectors:
                raise ValueError(f"--selectors names {label!r} twice; give each scheme once (or distinct labels, "
                                 f"e.g. a={spec} b={spec})")
            selectors[label] = (name, params)
    else:
        from .plugins import registry

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
    comp = run_comparison(
        selectors, federation=federation, trainer=trainer, seeds=seeds, target=target, out_dir=out,
        overwrite=args.overwrite, progress=not args.no_progress, paper=preset.paper if not args.selectors else None,
        title=preset.description.split(":")[0] if preset_name else "", retry_failed=args.retry_failed,
        checkpoint_every=args.checkpoint_every, jobs=args.jobs, ray_address=args.ray,
        batch_seeds=args.batch_seeds,
    )
    if getattr(args, "compress", False):
        from .compare import compress_runs

        compress_runs(out / "runs")
    files = comp.write(out)
    files += comp.plot(out)
    print(comp.to_text())
    if args.paired is not None:
        paired = comp.paired_markdown(args.paired)
        (out / "paired.md").write_text(
            f"Paired by seed against {args.paired} (rounds to {target:.0%}; a run that never reached it counts as "
            f"its rounds + 1; two-sided Wilcoxon signed-rank test)\n\n{paired}\n"
        )
        files.append(out / "paired.md")
        print(f"\npaired by seed against {args.paired}:\n{paired}")
    print("\nwritten: " + ", ".join(str(f) for f in files), file=sys.stderr)
    from .compare import _slug, run_files

    mine = {_slug(label) for label in comp.histories} | {_slug(label) for label in comp.failed}
    others = sorted({f.name.split("__seed")[0] for f in run_files(out / "runs")} - mine)
    if others:
        print(f"(these summaries cover the schemes of this command: {', '.join(comp.histories)}; the runs of "
              f"{', '.join(others)} saved in {out / 'runs'} stay there and return with their --selectors)",
              file=sys.stderr)
    n_failed = sum(len(v) for v in comp.failed.values())
    if n_failed:
        print(f"{n_failed} run(s) failed (see the table's last column and {out}/runs/); they stay failed on a rerun "
              "unless --retry-failed", file=sys.stderr)
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
    from .presets import get_preset

    default_preset = get_preset(DEFAULT_PRESET)
    compare_preset = get_preset(COMPARE_PRESET)
    parser.add_argument("--version", action="version", version=f"fedselect {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error (also: FEDSELECT_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("list", help="list installed selectors (from every plugin), datasets, models and presets",
                       description="List installed selectors (from every plugin), datasets, models and presets.")
    _plugin_arg(p)
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser(
        "run", help="run one scheme once and print its accuracy and costs",
        description="Run one scheme on one federation. Settings start from --preset (default digits-quick); "
        "every option below overrides one of them.",
    )
    p.add_argument("--selector", default="random", help="name or name:param=value,... (default: random)")
    p.add_argument("--preset", default=DEFAULT_PRESET,
                   help=f"starting settings, see `fedselect list` (default: {DEFAULT_PRESET})")
    p.add_argument("--seed", type=int, default=0, help="seeds the federation, training and selection (default: 0)")
    p.add_argument("--out", help="write the history to this .json or .csv file (and checkpoint the run beside it "
                   "in OUT.checkpoint/ until then: the same command resumes a killed run) (default: none, the "
                   "summary is printed only)")
    p.add_argument("--checkpoint-every", type=_non_negative, default=10, metavar="K",
                   help="with --out, checkpoint every K rounds (default: 10; 0 = never)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (there is one only when stderr is a terminal)")
    _plugin_arg(p)
    _federation_args(p, default_preset)
    _trainer_args(p, default_preset)
    p.set_defaults(func=_cmd_run)

    for cmd, helptext in (
        ("compare", "compare schemes over seeds: table, curves, selection frequencies, costs (resumable)"),
        ("reproduce", "run a paper's preset (see `fedselect list`), resumable"),
    ):
        p = sub.add_parser(
            cmd, help=helptext,
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
            p.add_argument("--preset", default=COMPARE_PRESET,
                           help=f"starting settings, see `fedselect list` (default: {COMPARE_PRESET}, strong label "
                           "skew, where the choice of clients matters)")
        preset = None if cmd == "reproduce" else compare_preset
        p.add_argument("--selectors", nargs="+", metavar="NAME[:P=V,...]",
                       help="schemes as name or label=name:param=value,... (default: the preset's"
                       + (f", for {preset.name}: {' '.join(preset.selectors)})" if preset else ")"))
        p.add_argument("--seeds", nargs="+", type=int, help="seeds (default: the preset's"
                       + (f", for {preset.name}: {' '.join(map(str, preset.seeds))})" if preset else ")"))
        p.add_argument("--out", help="output directory (default fedselect-results/<preset> with the preset's "
                       "settings, fedselect-results/<preset>-<hash of the settings> when a federation or training "
                       "option differs, so changed settings never collide with earlier runs; other --selectors and "
                       "--seeds add runs to the same folder)")
        p.add_argument("--overwrite", action="store_true", help="re-run saved runs whose settings differ")
        p.add_argument("--compress", action="store_true",
                       help="gzip the finished run files (OUT/runs/*.json -> *.json.gz) at the end; a rerun reads both")
        p.add_argument("--retry-failed", action="store_true",
                       help="run again the runs saved as failed (by default a failed run stays failed)")
        p.add_argument("--checkpoint-every", type=_non_negative, default=10, metavar="K",
                       help="checkpoint each run every K rounds under OUT/checkpoints/, so a killed comparison "
                       "resumes the run in progress (default: 10; 0 = never)")
        p.add_argument("--jobs", type=_jobs, default=1, metavar="N",
                       help="run N (scheme, seed) runs at once, each in a process of its own with --threads torch "
                       "threads (keep N x threads within the cores); 0 or auto: one run per core, cores // --threads "
                       f"(here {_cores()} core(s)). Results, result files and resuming are those of a serial run; "
                       "one progress bar counts the whole grid (default: 1, one run after another)")
        p.add_argument("--batch-seeds", type=_non_negative, nargs="?", const=True, default=False, metavar="N",
                       help="train the seeds of each scheme together as one computation: each round, all seeds' "
                       "chosen clients in one batched step and all seeds' models in one pass over the test set; "
                       "each run keeps its own selector, random streams, history and result file (results equal "
                       "the one-at-a-time runs' up to float rounding). Without N all seeds of a scheme at once, "
                       "with N up to N at a time. Models other than the built-in logistic, mlp and cnn, and batch "
                       "norm, train one run at a time with a note. With --jobs, each process trains one batch at a "
                       "time (default: off)")
        p.add_argument("--ray", metavar="ADDRESS",
                       help="run each (scheme, seed) as a task on a Ray cluster, --threads CPUs each: auto (the "
                       "cluster this machine is part of), ray://HOST:PORT, or local (start Ray on this machine); "
                       "results are written here as tasks finish. Needs Ray: pip install \"fedselect[ray]\" "
                       "(default: none, runs stay on this machine)")
        p.add_argument("--paired", metavar="LABEL",
                       help="also compare every scheme with LABEL seed by seed (Wilcoxon test, Holm-adjusted), into "
                       "OUT/paired.md (default: random, when it is compared with another scheme)")
        p.add_argument("--no-paired", action="store_true", help="no paired comparison, not even against random "
                       "(default: off)")
        p.add_argument("--no-progress", action="store_true",
                       help="no progress reports (when stderr is a terminal: bars; otherwise, as in a log file, "
                       "one line per finished run)")
        _plugin_arg(p)
        _federation_args(p, preset)
        _trainer_args(p, preset)
        if cmd == "reproduce":
            p.set_defaults(func=lambda a: _cmd_compare(a, preset_name=a.preset))
        else:
            p.set_defaults(func=_cmd_compare)
    return parser


# What a user's input or environment usually causes: answered with one line and exit status 2. These types can
# also come from a bug (a TypeError or KeyError inside fedselect or a plugin): --debug or FEDSELECT_DEBUG=1 shows
# the traceback. Anything else (AttributeError, IndexError, AssertionError, ...) always keeps its traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (
    KeyError, ValueError, TypeError, OSError, FloatingPointError, EOFError, RuntimeError, ImportError,
    argparse.ArgumentTypeError,
)


def _one_line(exc: BaseException) -> str:
    msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    msg = " ".join(str(msg).split()) or type(exc).__name__
    if isinstance(exc, OSError | FloatingPointError | EOFError | RuntimeError | ImportError):
        msg = f"{type(exc).__name__}: {msg}"
    return msg


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fedselect`` command.

    Returns 0 on success, 1 when ``compare``/``reproduce`` finished but a run failed (it is
    recorded and shown in the table), 2 for a user error (bad option values, unreadable or
    unwritable files, a diverging run; printed as one line ``fedselect: error: ...``), 130
    when interrupted. ``--debug`` (or ``FEDSELECT_DEBUG=1``) shows the traceback instead.
    """
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
        print("\ninterrupted: finished runs and checkpoints are saved; rerun the same command to resume",
              file=sys.stderr)
        return 130
    except USER_ERRORS as exc:
        if args.debug or os.environ.get("FEDSELECT_DEBUG"):
            raise
        print(f"fedselect: error: {_one_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
