"""Checkpoints inside a run: atomic files, integrity checks, configuration fingerprints.

A checkpoint file is ``MAGIC + sha256(payload) + payload`` where the payload is a pickle. The
digest makes a truncated, empty or bit-flipped file detectable before anything is unpickled
into the run; such a file is moved aside (renamed ``<name>.corrupt-<timestamp>``) with a
warning naming it, and the run starts over instead of failing.

Files are written atomically: a temporary file in the same directory, flushed and
``fsync``-ed, renamed over the target with :func:`os.replace`, then the directory itself is
``fsync``-ed so the rename survives a power cut. A ``kill -9`` at any moment therefore
leaves either the previous checkpoint or the new one, never a mix (a stray temporary file
at most, which is ignored and cleaned up by the next write).

Checkpoints are pickles: load only files your own runs wrote.
"""

from __future__ import annotations

import hashlib
import math
import os
import pickle
import re
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "CheckpointMismatchError",
    "CorruptFileWarning",
    "atomic_write_bytes",
    "describe_differences",
    "flatten_config",
    "move_aside",
    "read_checkpoint",
    "write_checkpoint",
]

MAGIC = b"FEDSELECT-CHECKPOINT-1\n"
_DIGEST = 32


class CheckpointMismatchError(ValueError):
    """A checkpoint was written by a run with other settings than the one resuming it.

    Attributes
    ----------
    path : Path
        The checkpoint file.
    differences : dict
        Setting -> (value in the checkpoint, value now); a missing setting shows as ``"<absent>"``.
    """

    def __init__(self, message: str, *, path: Path, differences: Mapping[str, tuple[Any, Any]]) -> None:
        super().__init__(message)
        self.path = path
        self.differences = dict(differences)


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


def write_checkpoint(path: str | os.PathLike[str], state: Mapping[str, Any]) -> None:
    """Pickle ``state`` with an integrity digest and write it atomically to ``path``."""
    payload = pickle.dumps(dict(state), protocol=pickle.HIGHEST_PROTOCOL)
    atomic_write_bytes(path, MAGIC + hashlib.sha256(payload).digest() + payload)


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The state in ``path``; None if there is no file or it was unreadable (then moved aside with a warning)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    head = len(MAGIC) + _DIGEST
    if len(data) == 0:
        reason = "empty file"
    elif len(data) < head or not data.startswith(MAGIC):
        reason = "not a fedselect checkpoint, or truncated"
    elif hashlib.sha256(data[head:]).digest() != data[len(MAGIC) : head]:
        reason = "checksum mismatch: truncated or corrupted"
    else:
        try:
            state = pickle.loads(data[head:])
        except Exception as exc:  # a checksum-valid payload that still fails to load (e.g. a missing class)
            reason = f"cannot unpickle: {type(exc).__name__}: {exc}"
        else:
            if isinstance(state, dict):
                return state
            reason = f"holds a {type(state).__name__}, not a checkpoint"
    move_aside(path, reason)
    return None


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _code_digest(fn: Any) -> str:
    """For a Python function: a digest of its bytecode, constants, defaults and closure values.

    Two lambdas with one name (``lambda t: 0.1`` and ``lambda t: 0.01``) then differ; a
    builtin or another callable without code is identified by its name alone.
    """
    code = getattr(fn, "__code__", None)
    if code is None:
        return ""
    closure = [getattr(c, "cell_contents", None) for c in (getattr(fn, "__closure__", None) or ())]
    parts = (code.co_code, repr(code.co_consts), repr(getattr(fn, "__defaults__", None)),
             repr([_canonical(c) for c in closure]))
    return " code:" + hashlib.sha256(repr(parts).encode()).hexdigest()[:12]


def _canonical(value: Any) -> Any:
    """A value comparable across processes: numbers and strings as they are, functions by name and code."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return "nan" if math.isnan(value) else value
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy scalars
        return _canonical(value.item())
    if hasattr(value, "tobytes") and hasattr(value, "dtype") and hasattr(value, "shape"):  # arrays, by content
        digest = hashlib.sha256(value.tobytes()).hexdigest()[:16]
        return f"<array {value.dtype} {tuple(value.shape)} sha256:{digest}>"
    if (not isinstance(value, type) and hasattr(value, "state_dict")
            and hasattr(value, "named_parameters")):  # a torch module instance: class, weights, options
        digest = hashlib.sha256()
        for name, tensor in sorted(value.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        options = {k: v for k, v in sorted(vars(value).items())
                   if not k.startswith("_") and isinstance(v, (bool, int, float, str, type(None)))}
        return (f"<module {type(value).__module__}.{type(value).__qualname__} {_ADDRESS.sub('', repr(value))} "
                f"{options} weights sha256:{digest.hexdigest()[:16]}>")
    if callable(value) and hasattr(value, "__qualname__"):
        return f"<callable {getattr(value, '__module__', '?')}.{value.__qualname__}{_code_digest(value)}>"
    if hasattr(value, "get_state") and type(value).__name__ == "RandomState":  # numpy legacy random state
        state = value.get_state()
        digest = hashlib.sha256(repr((state[0], state[1].tobytes(), state[2:])).encode()).hexdigest()[:16]
        return f"<RandomState sha256:{digest}>"
    if hasattr(value, "bit_generator"):  # numpy Generator
        return f"<Generator sha256:{hashlib.sha256(repr(value.bit_generator.state).encode()).hexdigest()[:16]}>"
    if hasattr(value, "get_params") and callable(value.get_params):
        params = value.get_params(deep=False)
        return {"<class>": type(value).__qualname__, **{k: _canonical(v) for k, v in params.items()}}
    return _ADDRESS.sub("", repr(value))


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"trainer": {"lr": 0.1}}`` -> ``{"trainer.lr": 0.1}``, values made comparable across processes."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_config(value, name + "."))
        elif isinstance(value, (list, tuple)):
            out[name] = [_canonical(v) for v in value]
        else:
            value = _canonical(value)
            if isinstance(value, dict):
                out.update(flatten_config(value, name + "."))
            else:
                out[name] = value
    return out


def describe_differences(saved: Mapping[str, Any], now: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Setting -> (saved, now) for every flattened setting that differs."""
    absent = "<absent>"
    return {
        k: (saved.get(k, absent), now.get(k, absent))
        for k in sorted(set(saved) | set(now))
        if saved.get(k, absent) != now.get(k, absent)
    }
