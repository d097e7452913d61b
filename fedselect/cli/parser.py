"""The arguments of the ``fedselect`` command and of each of its subcommands."""

from __future__ import annotations

import argparse
import os

from .options import _add_options, _stop_note
from .values import _jobs, _non_negative

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


DEFAULT_PRESET = "digits-quick"  # fedselect run's
COMPARE_PRESET = "digits-skew"  # fedselect compare's: a setting where client selection visibly matters
NO_PRESET = "none"  # --preset none: no preset, every setting at Python's default unless an option sets it


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


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def command_parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``fedselect`` parser and each subcommand's parser by name, every argument declared.

    What a subcommand does is attached by :func:`fedselect.cli.commands.build_parser`.
    """
    parser = argparse.ArgumentParser(
        prog="fedselect",
        description="Client selection for federated learning: simulate, compare and reproduce selection schemes, "
        "counting what each one costs.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from .. import __version__
    from ..presets import PRESETS

    # Built-in presets for the help texts, read without loading plugins: a broken plugin must not break --help.
    default_preset = PRESETS[DEFAULT_PRESET]
    compare_preset = PRESETS[COMPARE_PRESET]
    parser.add_argument("--version", action="version", version=f"fedselect {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show the full traceback of an error (also: FEDSELECT_DEBUG=1)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands: dict[str, argparse.ArgumentParser] = {}

    p = sub.add_parser(
        "list",
        help="list installed selectors, datasets, models, partitions and presets (from every plugin)",
        description="List installed selectors, datasets, models, partitions and presets, from every plugin.",
    )
    _plugin_arg(p)
    commands["list"] = p

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
    commands["flower-report"] = p

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
    commands["run"] = p

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
        commands[cmd] = p
    return parser, commands
