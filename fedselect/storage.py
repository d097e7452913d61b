"""Files that survive a crash, and files that could not be read.

:func:`atomic_write_bytes` writes a temporary file in the same directory, flushed and
``fsync``-ed, renames it over the target with :func:`os.replace`, then ``fsync``-s the
directory itself so the rename survives a power cut. A ``kill -9`` at any moment therefore
leaves either the previous file or the new one, never a mix (a stray temporary file at most,
which is ignored and cleaned up by the next write).

:func:`move_aside` renames a file that cannot be read (``<name>.corrupt-<timestamp>``) and
warns with a :class:`CorruptFileWarning` naming it, so that a bad file never blocks a resume
and is kept for inspection. Checkpoints (:mod:`fedselect.simulation.checkpoint`) and a
comparison's result files both write and recover this way: a leaf module, below both.
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from pathlib import Path

__all__ = ["CorruptFileWarning", "atomic_write_bytes", "move_aside"]


class CorruptFileWarning(UserWarning):
    """A result or checkpoint file could not be read; it was moved aside and its run is redone."""


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves the old file or the new one, never a mix.

    A temporary file in the same directory is written, flushed and fsync-ed, renamed over
    ``path`` (:func:`os.replace` is atomic on POSIX and Windows) and the directory is
    fsync-ed so the rename itself is durable.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)


def move_aside(path: str | os.PathLike[str], reason: str) -> Path:
    """Rename an unreadable file to ``<name>.corrupt-<timestamp>`` and warn, naming both.

    Returns the new path. Used for checkpoints and for a comparison's result files: a bad
    file never blocks a resume, and it is kept for inspection rather than deleted.
    """
    path = Path(path)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    os.replace(path, target)
    warnings.warn(
        f"{path} is unreadable ({reason}); moved aside to {target.name} and its run will be redone",
        CorruptFileWarning,
        stacklevel=3,
    )
    return target
