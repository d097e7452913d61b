"""The ``fedselect`` command: run one scheme, compare schemes, reproduce a paper, list what is installed."""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main"]

_EPILOG = """\
examples:
  fedselect compare                                   # a few schemes on digits, ~1 minute
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
    """``"name"`` or ``"name:p=v,q=w"`` (optionally ``"label=name:..."``) -> (label, name, params)."""
    label = None
    if "=" in spec.split(":", 1)[0]:
        label, spec = spec.split("=", 1)
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
        "installed plugin's would; repeatable (default: none). Runs that use it record its path and content hash.",
    )


def _federation_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("federation")
    g.add_argument("--dataset", help=f"registered dataset: {_registered('datasets')} or synthetic (digits ships "
                   "with scikit-learn)")
    g.add_argument("--data-dir", help="directory with the dataset's files (else $FEDSELECT_DATA and the defaults)")
    g.add_argument("--partition", help=f"{_registered('partitions')} (see `fedselect list`)")
    g.add_argument("--n-clients", type=int, help="N, the number of clients")
    g.add_argument("--shards-per-client", type=int, help="for --partition shards (2 = FedCor's 2SPC)")
    g.add_argument("--alpha", type=float, help="Dirichlet concentration for dirichlet / dirichlet-qp")
    g.add_argument("--holdout", type=float, help="fraction of each client's data held out to measure its loss")


def _trainer_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("training")
    g.add_argument("--model", help=f"a registered model: {_registered('models')}")
    g.add_argument("--clients-per-round", type=int, help="C, clients chosen each round")
    g.add_argument("--rounds", type=int, help="number of rounds")
    g.add_argument("--local-epochs", type=int, help="local epochs per round")
    g.add_argument("--local-steps", type=int, help="local SGD steps per round (instead of epochs)")
    g.add_argument("--batch-size", type=int)
    g.add_argument("--lr", type=float, help="local learning rate")
    g.add_argument("--weight-decay", type=float)
    g.add_argument("--prox-mu", type=float, help="FedProx proximal coefficient (0 = FedAvg)")
    g.add_argument("--aggregation", choices=("mean", "data-size"))
    g.add_argument("--target", type=float, help="target test accuracy for the table (e.g. 0.8)")
    g.add_argument("--dropout", type=float,
                   help="client failures: probability that a client does not answer in a round (default 0); "
                   "the same failures for every scheme of one seed")
    g.add_argument("--divergence", type=_divergence, metavar="FACTOR",
                   help="stop a run as diverged once its test loss exceeds FACTOR x the initial model's "
                   "(default 10; 'none' to disable)")
    g.add_argument("--threads", type=int, default=1,
                   help="torch threads per run (default 1: the small models here run fastest single-threaded, "
                   "and a 2-core machine shared with other work slows down badly with more)")


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
                      ("dropout", "dropout")):
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


def _cmd_list(args: argparse.Namespace) -> int:
    from .plugins import list_datasets, list_models, registry
    from .presets import PRESETS

    table = registry("selectors")
    canon: dict[str, Any] = {}
    for entry in table.values():
        canon.setdefault(entry.name, entry)
    print("selectors:")
    for name in sorted(canon):
        e = canon[name]
        doc = (e.obj.__doc__ or "").strip().splitlines()[0] if e.obj.__doc__ else ""
        alias = f" (aliases: {', '.join(e.aliases)})" if e.aliases else ""
        print(f"  {name:<18} {doc}{alias}  [{e.plugin}]")
    print("datasets:  " + ", ".join(list_datasets()))
    print("models:    " + ", ".join(list_models()))
    from .data.partition import PARTITIONS

    print("partitions: " + ", ".join(PARTITIONS))
    print("presets:")
    for name in sorted(PRESETS):
        print(f"  {name:<22} {PRESETS[name].description}")
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
    if args.paired is not None and args.paired not in selectors:
        raise ValueError(f"--paired {args.paired!r} is not one of the schemes compared: {', '.join(selectors)}")
    target = trainer.get("target_accuracy") or preset.target
    out = Path(args.out) if args.out else _default_out(args, preset, federation, trainer)
    print(f"comparing {', '.join(selectors)} over seeds {list(seeds)}; results in {out}/", file=sys.stderr)
    comp = run_comparison(
        selectors, federation=federation, trainer=trainer, seeds=seeds, target=target, out_dir=out,
        overwrite=args.overwrite, progress=not args.no_progress, paper=preset.paper if not args.selectors else None,
        title=preset.description.split(":")[0] if preset_name else "", retry_failed=args.retry_failed,
        checkpoint_every=args.checkpoint_every,
    )
    if getattr(args, "compress", False):
        from .compare import compress_runs

        compress_runs(out / "runs")
    files = comp.write(out)
    files += comp.plot(out)
    print(comp.to_markdown())
    if args.paired is not None:
        paired = comp.paired_markdown(args.paired)
        (out / "paired.md").write_text(
            f"Paired by seed against {args.paired} (rounds to {target:.0%}; a run that never reached it counts as "
            f"its rounds + 1; two-sided Wilcoxon signed-rank test)\n\n{paired}\n"
        )
        files.append(out / "paired.md")
        print(f"\npaired by seed against {args.paired}:\n{paired}")
    print("\nwritten: " + ", ".join(str(f) for f in files), file=sys.stderr)
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
    p.add_argument("--selector", default="random", help="name or name:param=value,... (default random)")
    p.add_argument("--preset", default="digits-quick", help="starting settings (see `fedselect list`)")
    p.add_argument("--seed", type=int, default=0, help="seeds the federation, training and selection")
    p.add_argument("--out", help="write the history to this .json or .csv file (and checkpoint the run beside it "
                   "in OUT.checkpoint/ until then: the same command resumes a killed run)")
    p.add_argument("--checkpoint-every", type=_non_negative, default=10, metavar="K",
                   help="with --out, checkpoint every K rounds (default 10; 0 = never)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _plugin_arg(p)
    _federation_args(p)
    _trainer_args(p)
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
            "summary.json, results.csv, accuracy.png, "
            "selection_frequency.png and communication.png.",
        )
        if cmd == "reproduce":
            p.add_argument("preset", help="preset name, e.g. fedcor-fmnist-2spc")
        else:
            p.add_argument("--preset", default="digits-quick", help="starting settings (default digits-quick)")
        p.add_argument("--selectors", nargs="+", metavar="NAME[:P=V,...]",
                       help="schemes as name or label=name:param=value,... (default: the preset's)")
        p.add_argument("--seeds", nargs="+", type=int, help="seeds (default: the preset's)")
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
                       "resumes the run in progress (default 10; 0 = never)")
        p.add_argument("--paired", metavar="LABEL",
                       help="also compare every scheme with LABEL seed by seed (Wilcoxon test), into OUT/paired.md")
        p.add_argument("--no-progress", action="store_true", help="no progress bars")
        _plugin_arg(p)
        _federation_args(p)
        _trainer_args(p)
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
