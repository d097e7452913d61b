"""What each subcommand does: list, run, compare and reproduce, flower-report."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .options import _apply_overrides
from .parser import NO_PRESET, command_parsers
from .text import _doc_summary, plain_text
from .values import parse_selector_spec


def get_preset(name: str, *, command: str = "compare") -> Any:
    """The preset ``--preset NAME`` (or ``reproduce NAME``) names; ``none`` is no preset at all.

    ``none`` is an empty :class:`~fedselect.presets.Preset`: every setting at Python's default
    (``make_federation()``, ``FederatedTrainer()``, ``run_comparison``'s seeds and target) unless
    an option sets it, and no schemes (``compare`` then needs ``--selectors``).
    """
    import inspect

    from ..presets import Preset
    from ..presets import get_preset as registered

    if name != NO_PRESET:
        return registered(name)
    if command == "reproduce":
        raise ValueError(
            "reproduce needs a preset (see `fedselect list`); for Python's defaults use "
            "`fedselect compare --preset none --selectors ...`"
        )
    from ..compare import run_comparison

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


def python_equivalent(
    federation: Mapping[str, Any], trainer: Mapping[str, Any], *, selector: str = "<scheme>", seed: str = "seed"
) -> str:
    """The Python call with the same words as a command line's settings: what each of its runs trains.

    Examples
    --------
    >>> print(python_equivalent({"n_clients": 20}, {"rounds": 30}, selector="'afl'", seed="0"))
    FederatedTrainer(selector='afl', rounds=30, random_state=0).fit(make_federation(n_clients=20, random_state=0))
    """

    from ..optim import OPTIMIZER_KEYS

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


def _check_writable_file(out: Path) -> None:
    """Refuse an output file that cannot be written, before hours of training rather than after."""
    if out.is_dir():
        raise IsADirectoryError(f"--out {out} is a directory; expected a .json or .csv file name")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise FileNotFoundError(f"--out {out}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise PermissionError(f"--out {out}: not writable")


def _cmd_list(args: argparse.Namespace) -> int:
    import textwrap

    from ..plugins import list_datasets, list_models, registry

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


def _cmd_run(args: argparse.Namespace) -> int:
    from ..compare import check_plan
    from ..data import make_federation
    from ..optim import as_optimizer
    from ..plugins import get_selector
    from ..simulation.trainer import FederatedTrainer

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
    from ..compare import _key

    base_args = build_parser().parse_args([args.command, *([preset.name] if args.command == "reproduce" else [])])
    base_fed, base_tr = dict(preset.federation), dict(preset.trainer)
    _apply_overrides(base_args, base_fed, base_tr)
    root = Path("fedselect-results")
    if (federation, trainer) == (base_fed, base_tr):
        return root / preset.name
    return root / f"{preset.name}-{_key({'federation': federation, 'trainer': trainer})[:8]}"


def _cmd_compare(args: argparse.Namespace, *, preset_name: str | None = None) -> int:
    from ..compare import run_comparison

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
        from ..plugins import registry

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
        from ..compare import compress_runs

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
    from ..compare import _slug, run_files

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
        from ..compare import _slug

        path.replace(out / f"paired-against-{_slug(before)}.md")


def _cmd_flower_report(args: argparse.Namespace) -> int:
    from ..experiments.flower_records import load_flower_records, write_report

    comp = load_flower_records(args.records, args.target, model_size=args.model_size, title="Flower")
    files = write_report(comp, Path(args.out), paired=args.paired)
    print(comp.to_text())
    print("\nwritten: " + ", ".join(str(f) for f in files), file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``fedselect`` parser, each subcommand with the function that runs it (``args.func``).

    Its arguments are those :func:`~fedselect.cli.parser.command_parsers` declares.
    """
    parser, commands = command_parsers()
    commands["list"].set_defaults(func=_cmd_list)
    commands["flower-report"].set_defaults(func=_cmd_flower_report)
    commands["run"].set_defaults(func=_cmd_run)
    commands["compare"].set_defaults(func=_cmd_compare)
    commands["reproduce"].set_defaults(func=lambda a: _cmd_compare(a, preset_name=a.preset))
    return parser
