"""The ``fedselect`` command: run one scheme, compare schemes, reproduce a paper, list what is installed.

:mod:`~fedselect.cli.options` turns the parameters of ``FederatedTrainer``, ``make_federation`` and the
partition schemes into options (their help from the numpydoc descriptions, read by
:mod:`~fedselect.cli.text`; their values by :mod:`~fedselect.cli.values`) and the options given back into
settings; :mod:`~fedselect.cli.parser` declares every subcommand's arguments; :mod:`~fedselect.cli.commands`
runs the subcommands and prints what they find; :func:`main` here answers errors and exit statuses.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

# The names fedselect.cli had as one module, importable from here as before.
from .commands import (  # noqa: F401
    _default_out,
    _settings,
    build_parser,
    get_preset,
    python_equivalent,
)
from .options import (  # noqa: F401
    CLI_DEFAULTS,
    NOT_OPTIONS,
    OPTION_NAMES,
    UNSET,
    Option,
    _apply_overrides,
    options,
)
from .parser import COMPARE_PRESET, DEFAULT_PRESET, NO_PRESET  # noqa: F401
from .text import plain_text  # noqa: F401
from .values import _mapping, parse_selector_spec  # noqa: F401

__all__ = ["main"]

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
        from ..plugins import load_plugin

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
            from ..plugins import load_plugin

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
