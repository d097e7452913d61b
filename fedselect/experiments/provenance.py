"""Where a run was made and the layout of its result file; with every name of :mod:`fedselect.identity`.

What identifies a run (its settings and key, a checkpoint's fingerprint, :data:`ADDED_LATER`,
:func:`canonical`) is computed in :mod:`fedselect.identity`, a leaf module the selector contract,
the registry, the trainer and the checkpoints import; its names are importable from here too, as
they were. This module adds what only the experiments need: the commit and the machine a run was
made on (:func:`commit`, :func:`machine_info`) and the result files' format
(:data:`RESULT_FORMAT`, :func:`migrate_result`, which reads a result file's format version once and
brings any older layout to the current one).
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from ..identity import (
    ADDED_LATER,
    NOT_IDENTIFYING,
    RENAMED,
    canonical,
    checkpoint_fingerprint,
    federation_fingerprint,
    flatten_config,
    identifying_params,
    later_defaults,
    qualname,
    record_settings,
    run_key,
    stable,
    stored_names,
    trainer_identity,
)

__all__ = [
    "ADDED_LATER",
    "NOT_IDENTIFYING",
    "RENAMED",
    "RESULT_FORMAT",
    "canonical",
    "checkpoint_fingerprint",
    "commit",
    "federation_fingerprint",
    "flatten_config",
    "identifying_params",
    "later_defaults",
    "machine_info",
    "migrate_result",
    "qualname",
    "record_settings",
    "run_key",
    "stable",
    "stored_names",
    "trainer_identity",
]

RESULT_FORMAT = 1
"""The layout of the result files :func:`fedselect.compare.run_comparison` writes.

Format 1 is written without a ``"format"`` field (so every stored run's file stays byte for
byte what it was); a later layout will write its number, and :func:`migrate_result` refuses a
number it does not know. Files from before format 1 lack ``status`` (they all finished),
``machine`` or ``settings``; :func:`migrate_result` fills them in."""


# -- where a run was made --------------------------------------------------------------------------


def commit() -> str:
    """The git commit of the fedselect source tree (``-dirty`` with local changes), or the package version."""
    here = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
        if out.returncode == 0:
            dirty = subprocess.run(
                ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            ).stdout.strip()
            return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    from .._version import __version__

    return f"fedselect {__version__}"


def machine_info() -> dict[str, Any]:
    """Where a run was made: CPU model, architecture, Python, torch and its thread count.

    Runs are bit-for-bit reproducible on one machine; on another CPU the floating-point
    results of torch's kernels may differ in the last bits, and a selector that feeds
    model state into a discrete choice (k-means, a top-k) can then follow another path.
    """
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "arch": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }


# -- result files' format ----------------------------------------------------------------------------


def migrate_result(d: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """A result file's content in the current layout and None, or None and why it cannot be read.

    The format number is read here once (absent: 1); a file from before format 1 gains
    ``status="finished"`` (only finished runs were written then), ``machine=None`` and
    ``settings=None`` (its settings were not recorded). ``d`` itself is not changed.
    """
    version = d.get("format", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return None, f"its format {version!r} is not a format number"
    if version > RESULT_FORMAT:
        return None, (
            f"it is in result format {version}, written by a newer fedselect; this one reads formats up to "
            f"{RESULT_FORMAT}"
        )
    return {"status": "finished", "machine": None, "settings": None, **d}, None
