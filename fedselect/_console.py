"""Whether to draw progress bars: only where they redraw in place (a terminal or a notebook)."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["bars_wanted"]


def bars_wanted(stream: Any = None) -> bool:
    """True when ``stream`` (default: ``sys.stderr``) is a terminal, or when running in a Jupyter kernel.

    A tqdm bar redraws itself with carriage returns and cursor escapes; written to a file (``fedselect
    compare > log 2>&1``, a batch job's log) every redraw stays there, so progress is then reported as
    plain lines instead. Notebooks draw tqdm's widget, which needs no terminal.
    """
    stream = sys.stderr if stream is None else stream
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        pass
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython is not None else None
    return shell is not None and hasattr(shell, "kernel")
