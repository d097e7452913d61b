"""FedScale's device-capacity and availability traces: converted once, explicitly, then read as plain ``.npz``.

:func:`convert_fedscale_traces` is the one place a FedScale pickle is read, through a
restricted unpickler that refuses every global but plain containers, numbers, strings and
numpy number scalars; :func:`from_fedscale` reads only the converted files
(``allow_pickle=False``). ``python -m fedselect.profiles convert-fedscale SRC DST`` runs the
conversion (:func:`main`).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import pickle
from collections.abc import Sequence
from numbers import Integral, Real
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.utils import check_random_state

from .._pickle_scan import scan_pickle
from .._validation import Interval, StrOptions, validate_parameters
from ._checks import _float_array
from .availability import Availability
from .files import FORMAT_VERSION, TRACE_FORMAT, read_npz
from .system import BYTES_PER_KBIT, MAX_SECONDS_PER_SAMPLE, MIN_BANDWIDTH, SystemProfiles

__all__ = ["convert_fedscale_traces", "from_fedscale", "main"]


def _np_scalar_function() -> Any:
    return np.float64(0).__reduce__()[0]  # numpy's ``scalar`` rebuilder, wherever this numpy keeps it


def _trace_dtype(spec: Any, align: bool = False, copy: bool = False) -> np.dtype:
    dtype = np.dtype(spec, align, copy)
    if dtype.kind not in "biuf":
        raise pickle.UnpicklingError(f"refused numpy dtype {dtype}: a FedScale trace holds only numbers")
    return dtype


def _trace_scalar(dtype: Any, *args: Any) -> Any:
    if (
        not isinstance(dtype, np.dtype)
        or dtype.kind not in "biuf"
        or len(args) != 1
        or not isinstance(args[0], bytes | str)
    ):
        raise pickle.UnpicklingError("refused a numpy scalar other than a plain number")
    return _np_scalar_function()(dtype, *args)


def _trace_latin1(text: Any, encoding: str = "utf-8") -> bytes:
    if not isinstance(text, str) or encoding != "latin1":
        raise pickle.UnpicklingError("refused _codecs.encode other than latin1 text")
    return text.encode("latin1")


_TRACE_GLOBALS = {
    ("numpy", "dtype"): _trace_dtype,
    ("numpy.core.multiarray", "scalar"): _trace_scalar,
    ("numpy._core.multiarray", "scalar"): _trace_scalar,
    ("_codecs", "encode"): _trace_latin1,
}


class _TraceUnpickler(pickle.Unpickler):
    """Reads a FedScale trace pickle: dicts, lists, tuples, str, numbers, numpy number scalars.

    Every other global (``os.system``, ``builtins.eval``, any class or function, numpy
    arrays, object dtypes) raises :class:`pickle.UnpicklingError` before it is called, so
    a planted file cannot run code through this reader.
    """

    def find_class(self, module: str, name: str) -> Any:
        obj = _TRACE_GLOBALS.get((module, name))
        if obj is None:
            raise pickle.UnpicklingError(
                f"refused global {module}.{name}: a FedScale trace holds only dicts, lists, strings and numbers"
            )
        return obj


def _check_unshared(data: dict[Any, Any], src: Path) -> None:
    """Refuse a trace whose entries, or their lists, are one object referenced by several clients.

    FedScale's files hold one entry per client; a pickle's memo lets a small file name one entry
    for every client, which conversion would copy out to a file many times larger.
    """
    seen: dict[int, Any] = {}
    for k, entry in data.items():
        parts = [entry, *(entry.get(f) for f in ("active", "inactive"))] if isinstance(entry, dict) else [entry]
        for part in parts:
            if isinstance(part, dict | list):
                if id(part) in seen:
                    raise ValueError(
                        f"{src}: clients {seen[id(part)]!r} and {k!r} share one entry object (a pickle memo "
                        "reference): refused, each client has its own entry in a FedScale trace"
                    )
                seen[id(part)] = k


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real | np.number):
        raise ValueError(f"{where} must be a number, got {value!r:.60}")
    return float(value)


def _normalise_intervals(
    active: Any, inactive: Any, finish: float, where: str
) -> tuple[list[tuple[float, float]], int, int]:
    """FedScale's intervals ``[active[i], inactive[i]]`` within ``[0, finish]``, sorted and merged.

    Intervals that are empty (inactive <= active after clipping to the period: FedScale's
    check never or only at one instant admits them) are dropped; overlapping or touching
    ones are merged (FedScale admits a time in any of them). Returns the intervals and the
    counts dropped and merged.
    """
    if not isinstance(active, list | tuple) or not isinstance(inactive, list | tuple):
        raise ValueError(f"{where}: 'active' and 'inactive' must be lists of times")
    if len(active) != len(inactive):
        raise ValueError(f"{where}: {len(active)} 'active' times but {len(inactive)} 'inactive' times")
    pairs = []
    dropped = 0
    for i, (a, b) in enumerate(zip(active, inactive)):
        a = max(_number(a, f"{where} active[{i}]"), 0.0)
        b = min(_number(b, f"{where} inactive[{i}]"), finish)
        if not (math.isfinite(a) and math.isfinite(b)):
            raise ValueError(f"{where}: interval {i} is not finite")
        if b <= a:
            dropped += 1
        else:
            pairs.append((a, b))
    pairs.sort()
    merged: list[tuple[float, float]] = []
    n_merged = 0
    for a, b in pairs:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            n_merged += 1
        else:
            merged.append((a, b))
    return merged, dropped, n_merged


def convert_fedscale_traces(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> dict[str, Any]:
    """Convert one of FedScale's trace pickles to fedselect's plain ``.npz`` trace format, once.

    FedScale ships ``client_device_capacity`` (``{client_id: {"computation": ms per sample,
    "communication": kbit/s}}``) and ``client_behave_trace`` (``{client_id: {"active":
    [s, ...], "inactive": [s, ...], "finish_time": s, "duration": s, "model": str}}``) as
    pickles. Unpickling runs code chosen by whoever wrote the file, so fedselect never does it
    implicitly: this function is the one place it happens, when you call it on a file you
    chose, and even then through a restricted unpickler that admits only dicts, lists,
    tuples, strings, numbers and numpy number scalars, and refuses every other global
    (classes, functions, ``os.system``, numpy arrays) before it could be called. The kind of
    file is recognised from its entries. Entries keep the file's order (FedScale maps client
    ids by that order for availability).

    Availability is normalised: intervals are clipped to ``[0, finish_time]``, empty ones
    (inactive <= active) dropped and overlapping ones merged; the returned summary counts them.

    Parameters
    ----------
    src : path
        A FedScale trace pickle.
    dst : path
        Where to write; must end in ``.npz``.

    Returns
    -------
    dict
        ``kind`` ("device" or "availability"), ``entries``, and for availability
        ``intervals``, ``dropped`` and ``merged``.

    Raises
    ------
    ValueError
        The file is not a pickle of either trace kind, refers to a refused global, or an
        entry is malformed (the message names the entry).
    """
    src, dst = Path(src), Path(dst)
    if dst.suffix != ".npz":
        raise ValueError(f"convert_fedscale_traces: dst={dst} must end in .npz")
    try:
        raw = src.read_bytes()
        scan_pickle(raw, what=str(src))  # shared references that expand past 16x the file: refused unbuilt
        data = _TraceUnpickler(io.BytesIO(raw), encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:
        raise ValueError(f"{src}: not a FedScale trace pickle, or one holding refused objects ({exc})") from exc
    if not isinstance(data, dict) or not data:
        raise ValueError(
            f"{src}: a FedScale trace is a non-empty dict of client id -> entry, got {type(data).__name__}"
        )
    _check_unshared(data, src)
    first = next(iter(data.values()))
    if not isinstance(first, dict):
        raise ValueError(f"{src}: entries must be dicts, got {type(first).__name__}")
    keys = np.array([str(k) for k in data])
    if "computation" in first:
        comp = np.empty(len(data))
        comm = np.empty(len(data))
        for i, (k, entry) in enumerate(data.items()):
            where = f"{src}: client {k!r}"
            if not isinstance(entry, dict) or "computation" not in entry or "communication" not in entry:
                raise ValueError(f"{where}: needs 'computation' and 'communication'")
            comp[i] = _number(entry["computation"], f"{where} computation")
            comm[i] = _number(entry["communication"], f"{where} communication")
        _float_array(str(src), "computation", comp, None)
        _float_array(str(src), "communication", comm, None)
        with open(dst, "wb") as fh:
            np.savez(
                fh,
                format=np.array(TRACE_FORMAT),
                version=np.array(FORMAT_VERSION),
                kind=np.array("device"),
                keys=keys,
                computation_ms=comp,
                communication_kbps=comm,
            )
        return {"kind": "device", "entries": len(data)}
    if "active" in first:
        offsets = np.zeros(len(data) + 1, dtype=np.int64)
        period = np.empty(len(data))
        starts: list[float] = []
        ends: list[float] = []
        models: list[str] = []
        dropped = merged = n_pairs = 0
        max_pairs = len(raw) // 4
        for i, (k, entry) in enumerate(data.items()):
            where = f"{src}: client {k!r}"
            if not isinstance(entry, dict) or not {"active", "inactive", "finish_time"} <= set(entry):
                raise ValueError(f"{where}: needs 'active', 'inactive' and 'finish_time'")
            finish = _number(entry["finish_time"], f"{where} finish_time")
            if not (math.isfinite(finish) and finish > 0):
                raise ValueError(f"{where}: finish_time must be positive, got {finish}")
            n_pairs += len(entry["active"]) if isinstance(entry["active"], list | tuple) else 0
            if n_pairs > max_pairs:  # each interval takes at least two numbers of the file
                raise ValueError(
                    f"{where}: more than {max_pairs} intervals in a {len(raw)}-byte file (at most one per 4 bytes)"
                )
            pairs, d, m = _normalise_intervals(entry["active"], entry["inactive"], finish, where)
            dropped += d
            merged += m
            starts.extend(a for a, _ in pairs)
            ends.extend(b for _, b in pairs)
            offsets[i + 1] = offsets[i] + len(pairs)
            period[i] = finish
            model = entry.get("model", "")
            models.append(model if isinstance(model, str) else str(model))
        av = Availability(offsets, starts, ends, period)  # the same checks the reader applies
        with open(dst, "wb") as fh:
            np.savez(
                fh,
                format=np.array(TRACE_FORMAT),
                version=np.array(FORMAT_VERSION),
                kind=np.array("availability"),
                keys=keys,
                offsets=av.offsets,
                starts=av.starts,
                ends=av.ends,
                finish_time=av.period,
                model=np.array(models),
            )
        return {
            "kind": "availability",
            "entries": len(data),
            "intervals": av.n_intervals,
            "dropped": dropped,
            "merged": merged,
        }
    raise ValueError(
        f"{src}: entries have keys {sorted(map(str, first))[:6]}; expected a FedScale device trace "
        "('computation', 'communication') or availability trace ('active', 'inactive', 'finish_time')"
    )


def _read_trace(path: str | os.PathLike[str], kind: str) -> dict[str, Any]:
    path = Path(path)
    if path.suffix != ".npz":
        raise ValueError(
            f"{path}: from_fedscale reads the .npz files convert_fedscale_traces writes, never FedScale's pickles; "
            f"run `python -m fedselect.profiles convert-fedscale {path} OUT.npz` first"
        )
    data = read_npz(path, TRACE_FORMAT)
    found = str(data.get("kind", ""))
    if found != kind:
        raise ValueError(f"{path}: a FedScale {found or 'unknown'} trace, expected the {kind} trace")
    return data


_FROM_FEDSCALE_CONSTRAINTS: dict[str, list[Any]] = {
    "n_clients": [Interval(Integral, 1, None, closed="left")],
    "mapping": [StrOptions(("modulo", "random"))],
    "offset": [Interval(Integral, 0, None, closed="left")],
    "random_state": ["random_state"],
    "latency": [Interval(Real, 0, None, closed="left")],
}


def from_fedscale(
    device_file: str | os.PathLike[str],
    availability_file: str | os.PathLike[str] | None = None,
    *,
    n_clients: int,
    mapping: str = "modulo",
    offset: int = 0,
    random_state: Any = None,
    latency: float = 0.0,
) -> SystemProfiles:
    """Profiles of ``n_clients`` clients from FedScale traces converted by :func:`convert_fedscale_traces`.

    Client k's forward pass per sample takes ``computation / 1000`` seconds and both its
    bandwidths are ``communication x 128`` bytes/s (FedScale's ms per sample and kbit/s);
    with an availability file, client k is online during its trace's intervals, repeating
    every ``finish_time`` seconds (FedScale's ``is_active`` tests ``active <= t mod
    finish_time <= inactive``; here intervals are half-open, which differs only at the
    instant an interval ends).

    Parameters
    ----------
    device_file : path
        Converted ``client_device_capacity`` (``.npz``).
    availability_file : path, optional
        Converted ``client_behave_trace`` (``.npz``); None: always available.
    n_clients : int
        N; FedScale's traces hold many more devices (about 500k) than a simulation has clients.
    mapping : {"modulo", "random"}, default "modulo"
        Which trace entry client k gets, in each file separately: ``"modulo"``: entry
        ``(k + offset) mod M`` in the file's order (FedScale's own rule is ``offset=1``: it
        registers client ids from 1 and takes ``ids % M``; for the device file it looks the
        id up as a key, which is the same entry when the keys run 0..M-1 in order);
        ``"random"``: a seeded draw of distinct entries (with replacement only when
        N > M), device entries first.
    offset : int, default 0
        Shift of the ``"modulo"`` mapping.
    random_state : int, RandomState instance or None
        Seed of the ``"random"`` mapping.
    latency : float, default 0.0
        Seconds per message (FedScale has none).

    Returns
    -------
    SystemProfiles
    """
    validate_parameters(
        "from_fedscale",
        {
            "n_clients": n_clients,
            "mapping": mapping,
            "offset": offset,
            "random_state": random_state,
            "latency": latency,
        },
        _FROM_FEDSCALE_CONSTRAINTS,
    )
    n = int(n_clients)
    rng = check_random_state(random_state)

    def pick(m: int) -> np.ndarray:
        if mapping == "modulo":
            return (np.arange(n, dtype=np.int64) + int(offset)) % m
        return rng.choice(m, size=n, replace=n > m).astype(np.int64)

    dev = _read_trace(device_file, "device")
    # the bounds of SystemProfiles in the trace's units, so that an error names the trace file
    comp = _float_array(
        str(device_file), "computation_ms", dev.get("computation_ms"), None, high=MAX_SECONDS_PER_SAMPLE * 1000.0
    )
    comm = _float_array(
        str(device_file),
        "communication_kbps",
        dev.get("communication_kbps"),
        comp.size,
        low=MIN_BANDWIDTH / BYTES_PER_KBIT,
    )
    rows = pick(comp.size)
    bandwidth = comm[rows] * BYTES_PER_KBIT
    av = None
    if availability_file is not None:
        beh = _read_trace(availability_file, "availability")
        try:
            full = Availability(beh["offsets"], beh["starts"], beh["ends"], beh["finish_time"])
        except KeyError as exc:
            raise ValueError(f"{availability_file}: missing entry {exc}") from exc
        av = full.subset(pick(full.n_clients))
    return SystemProfiles(comp[rows] / 1000.0, bandwidth, bandwidth, np.full(n, float(latency)), av)


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fedselect.profiles convert-fedscale SRC DST``: the explicit conversion command."""
    parser = argparse.ArgumentParser(
        prog="python -m fedselect.profiles",
        description="Convert a FedScale trace pickle (client_device_capacity or client_behave_trace) to fedselect's "
        "plain .npz format, reading it with a restricted unpickler that refuses every object but "
        "containers, strings and numbers.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    conv = sub.add_parser("convert-fedscale", help="convert one FedScale trace pickle to .npz")
    conv.add_argument("src", help="FedScale pickle (client_device_capacity or client_behave_trace)")
    conv.add_argument("dst", help="output .npz")
    args = parser.parse_args(argv)
    try:
        summary = convert_fedscale_traces(args.src, args.dst)
    except (ValueError, OSError) as exc:
        parser.exit(2, f"error: {exc}\n")
    print(json.dumps(summary))
    return 0
