"""A run's result file: what it holds, how it is written, and the checks it passes when read back.

A comparison writes one result file per (scheme, seed) run, ``<out>/runs/<label>__seed<k>.json``
(gzipped ``.json.gz`` once :func:`compress_runs` has run), read back by a resumed comparison and by
:func:`~fedselect.experiments.results.load_comparison`. Files read back never make fedselect run
code: they are JSON, bounded in size (:data:`MAX_RESULT_BYTES`, also after decompression) and
checked before use (:func:`parse_result`); one that fails is reported (and, when a comparison
resumes, moved aside and its run redone). The format's version and the migration of older files
are :mod:`~fedselect.experiments.provenance`'s.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..round.record import History
from ..storage import atomic_write_bytes, move_aside
from . import provenance

__all__ = [
    "MAX_CLIENTS",
    "MAX_RESULT_BYTES",
    "ResultFileError",
    "compress_runs",
    "failure_of",
    "parse_result",
    "read_result",
    "read_text",
    "result_payload",
    "run_files",
    "write_result",
]

# What a result file read back may make fedselect hold: its text, decompressed, and the number of clients it claims
# (figures are sized by it). A genuine result is far smaller (500 rounds of 5 clients: under 1 MB) and a simulation
# on one machine far fewer clients; a file beyond either is reported unusable before anything of that size exists.
MAX_RESULT_BYTES = 64 * 2**20
MAX_CLIENTS = 10_000_000
_GZIP_CHUNK = 2**20
# A .gz result may unpack to this many times its own size (genuine ones: at most 11x, 1141 stored runs measured),
# or to _GZIP_FLOOR bytes, whichever is more.
_GZIP_RATIO = 64
_GZIP_FLOOR = 4 * 2**20
# JSON containers (``{`` and ``[``) per byte of text: genuine results hold one per 72 bytes or more; a dict costs 64
# bytes in memory, so text of ``{}`` objects would cost 20-30x its size. With at most one per 16 bytes (and 1024
# more), parsed JSON holds about 12x its text at worst.
_BYTES_PER_CONTAINER = 16


class ResultFileError(ValueError):
    """A result file fedselect will not use: larger than :data:`MAX_RESULT_BYTES`, or not a valid result."""


def read_text(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> str:
    """A result file's text, gunzipped when its name ends in ``.gz``.

    Parameters
    ----------
    path : path
    max_bytes : int, optional
        Refuse a file whose (decompressed) text is longer; default :data:`MAX_RESULT_BYTES`
        (genuine results are under 1 MB). A ``.gz`` file may also unpack to at most 64 times
        its compressed size (or 4 MiB if that is more; genuine ones unpack to about 10x). It
        is first decompressed in 1 MiB chunks that are counted and dropped, so a gzip bomb
        costs that much memory and at most the limit of decompression.

    Raises
    ------
    ResultFileError
        The file is larger than the limit, naming it and the limit.
    """
    path = Path(path)
    limit = MAX_RESULT_BYTES if max_bytes is None else int(max_bytes)
    if path.suffix == ".gz":
        limit = min(limit, max(_GZIP_FLOOR, _GZIP_RATIO * path.stat().st_size))
        with gzip.open(path, "rb") as f:
            size = 0
            while chunk := f.read(_GZIP_CHUNK):
                size += len(chunk)
                if size > limit:
                    raise ResultFileError(
                        f"{path.name}: more than {limit} bytes once decompressed (a gzip bomb? at most "
                        f"{_GZIP_RATIO}x the compressed size, {MAX_RESULT_BYTES} in all)"
                    )
        with gzip.open(path, "rb") as f:
            data = f.read(limit + 1)
    else:
        if path.stat().st_size > limit:
            raise ResultFileError(f"{path.name}: more than {limit} bytes")
        data = path.read_bytes()
    if len(data) > limit:  # the file grew between the checks
        raise ResultFileError(f"{path.name}: more than {limit} bytes")
    return data.decode("utf-8")


def run_files(runs_dir: str | os.PathLike[str]) -> list[Path]:
    """The result files in ``runs_dir``, plain (``*.json``) or compressed (``*.json.gz``), sorted by name."""
    runs = Path(runs_dir)
    return sorted([*runs.glob("*.json"), *runs.glob("*.json.gz")], key=lambda p: p.name)


def compress_runs(runs_dir: str | os.PathLike[str]) -> int:
    """Gzip every plain result file of ``runs_dir`` in place (``x.json`` -> ``x.json.gz``); return how many.

    Stored comparisons stay small this way; :func:`load_comparison` and a resumed
    :func:`run_comparison` read either form.
    """
    n = 0
    for path in sorted(Path(runs_dir).glob("*.json")):
        data = path.read_bytes()
        target = path.with_name(path.name + ".gz")
        atomic_write_bytes(target, gzip.compress(data, mtime=0))
        path.unlink()
        n += 1
    return n


# What reading a result file may raise besides ResultFileError: I/O, a bad gzip stream, bad UTF-8.
_READ_ERRORS = (OSError, UnicodeDecodeError, EOFError, zlib.error, ResultFileError)


def read_result(path: Path) -> dict[str, Any] | None:
    """A run's result file (``path``, or ``path`` + ``.gz``), or None if absent; an unreadable one is moved aside."""
    if not path.exists() and Path(str(path) + ".gz").exists():
        path = Path(str(path) + ".gz")
    try:
        text = read_text(path)
    except FileNotFoundError:
        return None
    except _READ_ERRORS as exc:
        move_aside(path, f"{type(exc).__name__}: {exc}")
        return None
    saved, reason = parse_result(text)
    if reason is None:
        return saved
    move_aside(path, reason)
    return None


def result_payload(
    *,
    key: str,
    settings: Mapping[str, Any],
    label: str,
    selector: Any,
    seed: int,
    command: Sequence[str],
    commit: str,
    outcome: Any,
) -> dict[str, Any]:
    """The content of one run's result file (format :data:`~fedselect.experiments.provenance.RESULT_FORMAT`).

    ``outcome`` is the run's :class:`~fedselect.experiments.executors.Outcome`; ``selector`` the
    selector as its settings record it.
    """
    error = outcome.error
    payload = {
        "key": key,
        "settings": json.loads(json.dumps(settings, default=repr)),
        "label": label,
        "selector": selector,
        "seed": int(seed),
        "status": "finished" if error is None else "failed",
        "command": list(command),
        "commit": commit,
        "seconds": outcome.seconds,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": outcome.machine,
    }
    if error is not None:
        payload["error"] = error
    payload["history"] = outcome.history.to_dict() if outcome.history is not None else None
    if outcome.diagnostics:
        payload["selector_state"] = outcome.diagnostics
    return payload


def write_result(path: Path, payload: Mapping[str, Any]) -> None:
    """Write a result file atomically; a compressed earlier result of the same run is superseded (deleted)."""
    atomic_write_bytes(path, json.dumps(payload, default=repr).encode())
    Path(str(path) + ".gz").unlink(missing_ok=True)


def parse_result(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """The result in ``text`` and None, or None and why it is not a usable result file."""
    if not text.strip():
        return None, "empty file"
    containers = text.count("{") + text.count("[")
    if containers > len(text) // _BYTES_PER_CONTAINER + 1024:  # before json.loads builds them
        return None, (
            f"{containers} JSON objects and arrays in {len(text)} bytes (at most one per {_BYTES_PER_CONTAINER} "
            "bytes: parsed, they would hold many times the file's size)"
        )
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, over-long integers, deep nesting
        return None, f"not valid JSON, probably truncated: {type(exc).__name__}: {exc}"
    except MemoryError:  # under a memory limit: the file is unusable here, never a crash of the caller
        return None, f"{len(text)} bytes of JSON do not fit in memory"
    if not isinstance(d, dict) or "key" not in d or "label" not in d or "seed" not in d:
        return None, "not a fedselect result (no key, label or seed)"
    d, reason = provenance.migrate_result(d)
    if d is None:
        return None, reason
    if not isinstance(d["label"], str) or not isinstance(d["seed"], int) or isinstance(d["seed"], bool):
        return None, "its label is not a string or its seed not an integer"
    if d["status"] == "failed":
        return (d, None) if isinstance(d.get("error"), dict) else (None, "a failed run without its error")
    try:
        h = History.from_dict(d["history"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return None, f"its history cannot be read: {type(exc).__name__}: {exc}"
    problem = _history_problem(h)
    return (None, problem) if problem is not None else (d, None)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _history_problem(h: History) -> str | None:
    """Why a history read from a file cannot be used (tables and figures would fail or blow up on it), or None."""
    sections = (h.config.get(k) or {} for k in ("federation", "trainer")) if isinstance(h.config, dict) else [None]
    if not all(isinstance(v, dict) for v in sections):
        return "its config is not a mapping of the run's settings"
    n = h.config.get("n_clients")
    if n is not None and not (_is_int(n) and 1 <= n <= MAX_CLIENTS):
        return f"it claims n_clients = {n!r}; fedselect reads back at most {MAX_CLIENTS} clients"
    bound = MAX_CLIENTS if n is None else n
    if not _is_number(h.model_size) or h.model_size < 0:
        return f"its model_size {h.model_size!r} is not a non-negative number"
    for r in h.rounds:
        if not (
            _is_int(r.round)
            and isinstance(r.clients, list)
            and isinstance(r.failed, list)
            and all(_is_int(k) and 0 <= k < bound for k in (*r.clients, *r.failed))
        ):
            return f"round {r.round!r} names clients outside 0 .. {bound - 1}"
        if not (
            isinstance(r.weights, list)
            and all(_is_number(w) for w in r.weights)
            and (r.lr is None or _is_number(r.lr))  # None: the server does not set it (Flower)
            and all(v is None or _is_number(v) for v in (r.test_accuracy, r.test_loss, r.global_loss))
            and _is_number(r.seconds)
            and all(_is_number(getattr(r.costs, f.name)) for f in fields(r.costs))
        ):
            return f"round {r.round!r} holds values that are not numbers"
        if not all(v is None or (_is_number(v) and math.isfinite(v) and v >= 0) for v in (r.sim_seconds, r.sim_time)):
            return f"round {r.round!r} holds simulated times that are not finite non-negative numbers"
    return _sim_time_problem(h)


def _sim_time_problem(h: History) -> str | None:
    """Why a history's simulated clock is inconsistent (times in some rounds only, or going backwards), or None.

    A clock runs from the first round to the last; a file in which it does not was edited or damaged,
    and its time to the target (or its end time) would change the table.
    """
    times = [r.sim_time for r in h.rounds]
    if all(t is None for t in times):
        return None
    if any(t is None for t in times):
        missing = [r.round for r in h.rounds if r.sim_time is None]
        return f"rounds {missing[:5]}{'...' if len(missing) > 5 else ''} have no sim_time while others have one"
    for prev, r in zip(h.rounds, h.rounds[1:]):
        if r.sim_time < prev.sim_time:
            return f"its sim_time goes backwards at round {r.round!r} ({prev.sim_time} s, then {r.sim_time} s)"
    return None


def failure_of(saved: Mapping[str, Any]) -> dict[str, Any]:
    err = dict(saved.get("error") or {})
    return {k: err.get(k) for k in ("type", "message", "round", "rounds_completed")}
