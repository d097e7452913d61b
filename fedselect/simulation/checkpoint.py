"""Checkpoints inside a run: files that carry no code, integrity checks, a selector's learned state.

A checkpoint file (format 2) is ``MAGIC + sha256(body) + body``, where ``body`` is a zip archive
of uncompressed members:

- ``state.json``: the state's plain values (JSON), with references to the two kinds below;
- ``arrays/<name>.npy``: every numpy array and torch tensor of the state, in numpy's ``.npy``
  format without pickle; each header is checked against the member's size before anything is
  allocated;
- ``objects/<name>.pickle``: any other value (a selector's learned state), in the restricted
  pickle of :mod:`fedselect.simulation.safe_pickle`: written by a pickler that moves every array
  and tensor into ``arrays/`` and rebuilds numpy and torch objects through its own constructors,
  and read by :class:`SafeUnpickler`, which resolves only an allow-list of globals. A checkpoint
  therefore never makes fedselect run code chosen by the file; values that do not fit raise
  :class:`UnsafeStateError` when written, unless the caller trusts its checkpoint directory
  (:class:`Pickled` with ``trusted=True``).

The digest makes a truncated, empty or bit-flipped file detectable before anything is decoded;
such a file, or one whose archive or objects cannot be decoded, is moved aside (renamed
``<name>.corrupt-<timestamp>``) with a warning naming it, and the run starts over. A file in the
pickle format of earlier versions (``FEDSELECT-CHECKPOINT-1``) is never unpickled: reading it
raises :class:`LegacyCheckpointError`, so that finished work is not discarded without the
user's say (see its message).

Files are written atomically (:mod:`fedselect.storage`): a ``kill -9`` at any moment
leaves either the previous checkpoint or the new one, never a mix.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import sys
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._npy import read_npy_member
from ..identity import flatten_config
from ..storage import CorruptFileWarning, atomic_write_bytes, move_aside
from .safe_pickle import (
    SafePickler,
    SafeUnpickler,
    TrustedPickler,
    TrustedUnpickler,
    UnsafeStateError,
)

# Pickle streams name the rebuild functions fedselect.simulation.checkpoint._rebuild_* (safe_pickle.RECORDED_MODULE):
# pickle looks them up here, when writing and when reading.
from .safe_pickle import _rebuild_bit_generator as _rebuild_bit_generator
from .safe_pickle import _rebuild_dtype as _rebuild_dtype
from .safe_pickle import _rebuild_generator as _rebuild_generator
from .safe_pickle import _rebuild_module as _rebuild_module
from .safe_pickle import _rebuild_object_array as _rebuild_object_array
from .safe_pickle import _rebuild_random_state as _rebuild_random_state
from .safe_pickle import _rebuild_scalar as _rebuild_scalar
from .safe_pickle import _rebuild_seed_sequence as _rebuild_seed_sequence
from .safe_pickle import _rebuild_seedless as _rebuild_seedless
from .safe_pickle import _rebuild_sparse as _rebuild_sparse
from .safe_pickle import _rebuild_torch_device as _rebuild_torch_device
from .safe_pickle import _rebuild_torch_dtype as _rebuild_torch_dtype
from .safe_pickle import _rebuild_torch_generator as _rebuild_torch_generator
from .safe_pickle import _rebuild_torch_size as _rebuild_torch_size

__all__ = [
    "Checkpoint",
    "CheckpointMismatchError",
    "CorruptFileWarning",
    "LegacyCheckpointError",
    "JSONValue",
    "Pickled",
    "SafeUnpickler",
    "UnsafeStateError",
    "UntrustedCheckpointError",
    "atomic_write_bytes",
    "check_state",
    "describe_differences",
    "flatten_config",
    "move_aside",
    "open_checkpoint",
    "read_checkpoint",
    "restore_selector_state",
    "selector_state",
    "write_checkpoint",
]

MAGIC = b"FEDSELECT-CHECKPOINT-2\n"
LEGACY_MAGIC = b"FEDSELECT-CHECKPOINT-1\n"  # format 1: a pickle, refused
_DIGEST = 32
_VERSION = 2
_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed member dates: one state, one archive
_MEMBER = re.compile(r"(state\.json|arrays/a[0-9]{1,9}\.npy|objects/o[0-9]{1,9}\.pickle)\Z")
_TRUST_HINT = (
    "pass checkpoint_trusted=True (FederatedTrainer) or trusted=True (read_checkpoint) to use pickle, "
    "which runs code from the file: only for a checkpoint directory no one else can write to"
)


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


class LegacyCheckpointError(CheckpointMismatchError):
    """A checkpoint in the pickle format of earlier versions: refused, never unpickled.

    Unpickling runs code chosen by the file, and its SHA-256 is a checksum, not a signature.
    Delete the file (or its directory) to rerun from the start, or finish that run with the
    version that wrote it. A :class:`CheckpointMismatchError`, so ``fedselect compare
    --overwrite`` discards it and reruns the cell.
    """


class UntrustedCheckpointError(CheckpointMismatchError):
    """The checkpoint holds state written with full pickle (``trusted=True``) and is read without trust."""


@dataclass(frozen=True)
class Pickled:
    """A value for :func:`write_checkpoint` to write with the restricted pickler.

    Parameters
    ----------
    value : object
        Anything the allow-list of :class:`SafeUnpickler` rebuilds.
    classes : tuple of type
        Classes admitted besides the registered selector classes (with the other classes of
        their modules): e.g. the class of the run's own selector.
    trusted : bool
        If the restricted pickler refuses ``value``, write it with full pickle instead; such a
        value is read back only with ``trusted=True``.
    """

    value: Any
    classes: tuple[type, ...] = ()
    trusted: bool = False


@dataclass(frozen=True)
class JSONValue:
    """A plain JSON tree for :func:`write_checkpoint` to write as it is, without walking it in Python.

    For large trees such as a run's history: ``json.dumps`` checks and writes it at C speed and
    reading returns what ``json.loads`` gives (lists for tuples; dict keys must be strings).
    A value JSON cannot hold raises :class:`UnsafeStateError` when written.
    """

    value: Any


def _dense_strides(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether ``stride`` lays ``shape`` out densely without overlap (a permutation of C order)."""
    if len(shape) != len(stride) or any(s < 0 for s in stride):
        return False
    expected = 1
    for size, step in sorted(((n, s) for n, s in zip(shape, stride) if n > 1), key=lambda p: p[1]):
        if step != expected:
            return False
        expected *= size
    return True


class _Writer:
    """Collects a state's JSON tree, its arrays (by identity) and its pickled objects."""

    def __init__(self) -> None:
        self.arrays: dict[str, tuple[np.ndarray, dict[str, Any]]] = {}
        self.objects: dict[str, tuple[bytes, bool]] = {}
        self._ids: dict[int, str] = {}
        self._keep: list[Any] = []  # ids stay unique while they are memoised
        self._live: dict[str, Any] = {}

    def array(self, obj: Any) -> str | None:
        """The name under which ``obj`` (a plain ndarray or a tensor) is stored; None for other values."""
        if type(obj) is np.ndarray:
            if obj.dtype.hasobject:
                return None
            data, meta = obj, {"kind": "ndarray"}
        else:
            torch = sys.modules.get("torch")  # a tensor exists only if torch is loaded
            if torch is None or not isinstance(obj, torch.Tensor):
                return None
            data, meta = self._tensor(obj, torch)
        key = id(obj)
        if key not in self._ids:
            name = f"a{len(self.arrays)}"
            self._ids[key] = name
            self._keep.append(obj)
            self.arrays[name] = (data, meta)
            self._live[name] = obj
        return self._ids[key]

    @staticmethod
    def _tensor(t: Any, torch: Any) -> tuple[np.ndarray, dict[str, Any]]:
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided or t.is_quantized:
            raise UnsafeStateError(
                f"a {type(t).__qualname__} tensor of layout {t.layout} (only dense tensors and "
                "Parameters are checkpointed)"
            )
        meta = {
            "kind": "parameter" if isinstance(t, torch.nn.Parameter) else "tensor",
            "requires_grad": bool(t.requires_grad),
            "device": str(t.device),
            "shape": list(t.shape),
            "stride": list(t.stride()),
        }
        cpu = t.detach().cpu()
        try:
            data = cpu.numpy()
        except TypeError:  # a dtype numpy lacks (bfloat16, float8): its bytes
            data = cpu.contiguous().reshape(-1).view(torch.uint8).numpy()
            meta["torch_dtype"] = str(t.dtype).removeprefix("torch.")
        return data, meta

    def encode(self, value: Any) -> Any:
        """``value`` as JSON, with ``{"$array": name}`` and ``{"$object": name}`` for what JSON cannot hold."""
        if value is None or isinstance(value, (bool, str)) or type(value) in (int, float):
            return value
        if type(value) is dict and all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: self.encode(v) for k, v in value.items()}
        if type(value) is list:
            return [self.encode(v) for v in value]
        if isinstance(value, JSONValue):
            return {"$json": value.value}
        name = self.array(value)
        if name is not None:
            return {"$array": name}
        if not isinstance(value, Pickled):
            value = Pickled(value)
        return {"$object": self.pickle(value)}

    def pickle(self, item: Pickled) -> str:
        name = f"o{len(self.objects)}"
        try:
            data = self._dump(item.value, item.classes)
            trusted = False
        except UnsafeStateError:
            if not item.trusted:
                raise
            buf = io.BytesIO()
            TrustedPickler(buf, self).dump(item.value)
            data, trusted = buf.getvalue(), True
        self.objects[name] = (data, trusted)
        return name

    def _dump(self, value: Any, classes: tuple[type, ...]) -> bytes:
        """Pickle ``value`` restrictedly and load it back with :class:`SafeUnpickler`: what is written is readable."""
        try:
            buf = io.BytesIO()
            SafePickler(buf, self).dump(value)
            data = buf.getvalue()
            SafeUnpickler(io.BytesIO(data), self._live, classes).load()
            return data
        except MemoryError:
            raise
        except Exception as exc:  # refused globals, unpicklable objects, rebuild checks
            if isinstance(value, dict) and len(value) > 1:  # name the first entry at fault
                for k, v in value.items():
                    try:
                        self._dump(v, classes)
                    except UnsafeStateError as inner:
                        raise UnsafeStateError(f"{k!r}: {inner}") from exc
            if isinstance(exc, UnsafeStateError):
                raise
            raise UnsafeStateError(f"{type(exc).__name__}: {exc}") from exc


def _member(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=_EPOCH)
    info.compress_type = zipfile.ZIP_STORED
    info.external_attr = 0o600 << 16
    return info


def _encode(state: Mapping[str, Any]) -> bytes:
    writer = _Writer()
    tree = writer.encode(dict(state))
    doc = {
        "format": "fedselect-checkpoint",
        "version": _VERSION,
        "state": tree,
        "arrays": {name: meta for name, (_, meta) in writer.arrays.items()},
        "objects": {name: {"trusted": trusted} for name, (_, trusted) in writer.objects.items()},
    }
    try:
        text = json.dumps(doc, allow_nan=True)
    except (TypeError, ValueError) as exc:  # in a JSONValue
        raise UnsafeStateError(f"a JSONValue holds what JSON cannot: {exc}") from exc
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(_member("state.json"), text.encode())
        for name, (data, _) in writer.arrays.items():
            with zf.open(_member(f"arrays/{name}.npy"), "w", force_zip64=data.nbytes > 2**31 - 2**20) as fh:
                np.lib.format.write_array(fh, data, allow_pickle=False)
        for name, (data, _) in writer.objects.items():
            zf.writestr(_member(f"objects/{name}.pickle"), data)
    return buf.getvalue()


def check_state(state: Mapping[str, Any]) -> None:
    """Raise :class:`UnsafeStateError` if ``state`` could not be written by :func:`write_checkpoint`.

    Pickles its objects (not its arrays) in memory: cheap enough to call before a long run.
    """
    writer = _Writer()
    writer.encode(dict(state))


def write_checkpoint(path: str | os.PathLike[str], state: Mapping[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically, as ``MAGIC + sha256(body) + body`` (see the module's docstring).

    Parameters
    ----------
    path : path
    state : mapping of str
        Plain JSON values (dicts with str keys, lists, str, int, float, bool, None) go to
        ``state.json``; numpy arrays and torch tensors anywhere in it to ``.npy`` members
        (one per object: shared arrays stay shared); any other value is pickled
        restrictedly, as a :class:`Pickled` says (tuples and numpy scalars included).

    Raises
    ------
    UnsafeStateError
        A value the restricted pickler refuses, not marked ``Pickled(trusted=True)``.
    """
    body = _encode(state)
    atomic_write_bytes(path, MAGIC + hashlib.sha256(body).digest() + body)


# -- reading --------------------------------------------------------------------------------


class _Corrupt(ValueError):
    """The file cannot be decoded (the reason is moved-aside's reason)."""


def _read_npy(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    return read_npy_member(zf, info, error=_Corrupt)


def _as_tensor(data: np.ndarray, meta: Mapping[str, Any]) -> Any:
    import torch

    shape = tuple(int(s) for s in meta["shape"])
    if "torch_dtype" in meta:
        dtype = _rebuild_torch_dtype(meta["torch_dtype"])
        if data.dtype != np.uint8 or data.ndim != 1 or data.size != math.prod(shape) * dtype.itemsize:
            raise _Corrupt(f"a {dtype} tensor of shape {shape} stored as {data.dtype} {data.shape}")
        t = torch.from_numpy(data).view(dtype).reshape(shape)
    else:
        t = torch.from_numpy(data)
        if tuple(t.shape) != shape:
            raise _Corrupt(f"a tensor of shape {shape} stored with shape {tuple(t.shape)}")
    stride = tuple(int(s) for s in meta.get("stride", t.stride()))
    if tuple(t.stride()) != stride and _dense_strides(shape, stride):
        t = torch.empty_strided(shape, stride, dtype=t.dtype).copy_(t)
    device = str(meta.get("device", "cpu"))
    if device != "cpu":
        t = t.to(torch.device(device))
    if meta.get("kind") == "parameter":
        return torch.nn.Parameter(t, requires_grad=bool(meta.get("requires_grad")))
    if meta.get("requires_grad"):
        t.requires_grad_(True)
    return t


class Checkpoint:
    """A checkpoint file opened by :func:`open_checkpoint`: its JSON and arrays decoded, no object unpickled yet.

    Attributes
    ----------
    path : Path
    plain : dict
        The state with each pickled object replaced by :attr:`UNLOADED` (for checks made before
        anything is unpickled, e.g. comparing a configuration fingerprint).
    """

    UNLOADED = "<not loaded>"

    def __init__(self, path: Path, zf: zipfile.ZipFile, doc: dict[str, Any], arrays: dict[str, Any]) -> None:
        self.path = path
        self._zf = zf
        self._doc = doc
        self._arrays = arrays
        self.plain = self._decode(doc["state"], None)

    def _decode(self, node: Any, objects: Mapping[str, Any] | None) -> Any:
        if isinstance(node, list):
            return [self._decode(v, objects) for v in node]
        if not isinstance(node, dict):
            return node
        if len(node) == 1 and "$json" in node:
            return node["$json"]
        if len(node) == 1 and "$array" in node:
            if node["$array"] not in self._arrays:
                raise _Corrupt(f"reference to a missing array {node['$array']!r}")
            return self._arrays[node["$array"]]
        if len(node) == 1 and "$object" in node:
            if objects is None:
                return self.UNLOADED
            if node["$object"] not in objects:
                raise _Corrupt(f"reference to a missing object {node['$object']!r}")
            return objects[node["$object"]]
        return {k: self._decode(v, objects) for k, v in node.items()}

    def load(self, *, classes: Iterable[type] = (), trusted: bool = False) -> dict[str, Any] | None:
        """The whole state with its objects unpickled; None if they cannot be (then moved aside, with a warning).

        Objects are read by :class:`SafeUnpickler`; those the writer had to pickle in full
        (``Pickled(trusted=True)``) only with ``trusted``, by full pickle.

        Raises
        ------
        UntrustedCheckpointError
            An object was written with full pickle and ``trusted`` is False (nothing is unpickled).
        """
        classes = tuple(classes)
        specs = self._doc["objects"]
        needs_trust = sorted(name for name, spec in specs.items() if spec.get("trusted"))
        if needs_trust and not trusted:
            raise UntrustedCheckpointError(
                f"the checkpoint {self.path} holds state written with full pickle (checkpoint_trusted=True); it is "
                f"not read without trust. If you wrote it and no one else can write to its directory, {_TRUST_HINT}; "
                "otherwise delete it to rerun from the start",
                path=self.path,
                differences={"checkpoint_trusted": (True, False)},
            )
        objects: dict[str, Any] = {}
        try:
            for name, spec in specs.items():
                data = self._zf.read(f"objects/{name}.pickle")
                if spec.get("trusted"):
                    objects[name] = TrustedUnpickler(io.BytesIO(data), self._arrays).load()
                else:
                    objects[name] = SafeUnpickler(io.BytesIO(data), self._arrays, classes).load()
            state = self._decode(self._doc["state"], objects)
        except MemoryError:
            raise
        except Exception as exc:
            move_aside(self.path, f"cannot decode its objects: {type(exc).__name__}: {exc}")
            return None
        if not isinstance(state, dict):
            move_aside(self.path, "holds no state mapping")
            return None
        return state


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint | None:
    """Open ``path`` and decode its JSON and arrays; None if there is no file or it is unreadable (moved aside).

    Raises
    ------
    LegacyCheckpointError
        ``path`` is a checkpoint in the pickle format of earlier versions; it is left in place, not read.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    head = len(MAGIC) + _DIGEST
    if data.startswith(LEGACY_MAGIC):
        raise LegacyCheckpointError(
            f"{path} is a checkpoint in the pickle format of fedselect before format {_VERSION}; unpickling can run "
            "code from the file, so it is not read. To continue: delete it (or its directory) and rerun, which "
            "starts the run over (fedselect compare --overwrite does this for a comparison's runs); or finish the "
            "interrupted run with the fedselect version that wrote it",
            path=path,
            differences={"checkpoint format": (1, _VERSION)},
        )
    if len(data) == 0:
        reason = "empty file"
    elif len(data) < head or not data.startswith(MAGIC):
        reason = "not a fedselect checkpoint, or truncated"
    elif hashlib.sha256(memoryview(data)[head:]).digest() != data[len(MAGIC) : head]:
        reason = "checksum mismatch: truncated or corrupted"
    else:
        try:
            return _open(path, data[head:])
        except MemoryError:
            raise
        except Exception as exc:  # a bad archive, header, JSON or tensor: whatever fails, the file is unusable
            reason = f"not a valid checkpoint archive: {type(exc).__name__}: {exc}"
    move_aside(path, reason)
    return None


def _open(path: Path, body: bytes) -> Checkpoint:
    zf = zipfile.ZipFile(io.BytesIO(body))
    infos = zf.infolist()
    total = 0
    for info in infos:
        if not _MEMBER.match(info.filename) or info.compress_type != zipfile.ZIP_STORED:
            raise _Corrupt(f"unexpected member {info.filename!r}")
        total += info.file_size
        if info.file_size != info.compress_size or total > len(body):
            raise _Corrupt(f"member {info.filename!r} claims more bytes than the file holds")
    doc = json.loads(zf.read("state.json"))
    if not (
        isinstance(doc, dict)
        and doc.get("format") == "fedselect-checkpoint"
        and doc.get("version") == _VERSION
        and isinstance(doc.get("arrays"), dict)
        and isinstance(doc.get("objects"), dict)
        and "state" in doc
    ):
        raise _Corrupt("state.json is not a format-2 checkpoint description")
    names = {info.filename for info in infos}
    arrays: dict[str, Any] = {}
    for name, meta in doc["arrays"].items():
        member = f"arrays/{name}.npy"
        if member not in names or not isinstance(meta, dict):
            raise _Corrupt(f"missing array {name!r}")
        data = _read_npy(zf, zf.getinfo(member))
        arrays[name] = data if meta.get("kind") == "ndarray" else _as_tensor(data, meta)
    for name, spec in doc["objects"].items():
        if f"objects/{name}.pickle" not in names or not isinstance(spec, dict):
            raise _Corrupt(f"missing object {name!r}")
    return Checkpoint(path, zf, doc, arrays)


def read_checkpoint(
    path: str | os.PathLike[str], *, classes: Iterable[type] = (), trusted: bool = False
) -> dict[str, Any] | None:
    """The state in ``path``; None if there is no file or it was unreadable (then moved aside with a warning).

    Parameters
    ----------
    path : path
    classes : iterable of type
        Classes admitted in pickled objects besides the registered selector classes (see
        :class:`SafeUnpickler`).
    trusted : bool
        Read objects the writer had to pickle in full (``Pickled(trusted=True)``) with full pickle.

    Raises
    ------
    LegacyCheckpointError
        A checkpoint in the pickle format of earlier versions.
    UntrustedCheckpointError
        It holds fully pickled objects and ``trusted`` is False.
    """
    checkpoint = open_checkpoint(path)
    return None if checkpoint is None else checkpoint.load(classes=classes, trusted=trusted)


# -- a selector's learned state ------------------------------------------------------------


def selector_state(selector: Any) -> dict[str, Any]:
    """What a fitted selector learned: its ``__getstate__`` without its constructor parameters.

    The parameters come back from the resuming run's own selector (its fingerprint proves them
    equal), so callables or other objects given as parameters never pass through a file.
    """
    state = selector.__getstate__()
    if not isinstance(state, dict):
        raise UnsafeStateError(
            f"{type(selector).__qualname__}.__getstate__ returns a {type(state).__name__}, not a dict of attributes"
        )
    params = selector.get_params(deep=False)
    return {k: v for k, v in state.items() if k not in params and k != "_sklearn_version"}


def restore_selector_state(selector: Any, state: Mapping[str, Any]) -> Any:
    """A new selector with ``selector``'s parameters and the learned ``state`` (from :func:`selector_state`).

    ``selector`` itself is left unchanged; ``__setstate__`` of its class applies the state.
    """
    params = selector.get_params(deep=False)
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise TypeError("a selector's saved state is a dict of attributes")
    clash = sorted(set(state) & set(params))
    if clash:
        raise ValueError(f"a selector's saved state holds its parameters {clash}")
    cls = type(selector)
    restored = cls.__new__(cls)
    restored.__setstate__({**{k: v for k, v in vars(selector).items() if k in params}, **state})
    return restored


# -- fingerprints ----------------------------------------------------------------------------


def describe_differences(saved: Mapping[str, Any], now: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Setting -> (saved, now) for every flattened setting that differs."""
    absent = "<absent>"
    return {
        k: (saved.get(k, absent), now.get(k, absent))
        for k in sorted(set(saved) | set(now))
        if saved.get(k, absent) != now.get(k, absent)
    }
