"""Checkpoints inside a run: atomic files that carry no code, integrity checks, configuration fingerprints.

A checkpoint file (format 2) is ``MAGIC + sha256(body) + body``, where ``body`` is a zip archive
of uncompressed members:

- ``state.json``: the state's plain values (JSON), with references to the two kinds below;
- ``arrays/<name>.npy``: every numpy array and torch tensor of the state, in numpy's ``.npy``
  format without pickle; each header is checked against the member's size before anything is
  allocated;
- ``objects/<name>.pickle``: any other value (a selector's learned state). It is written by a
  pickler that moves every array and tensor into ``arrays/`` and rebuilds numpy and torch
  objects through this module's own constructors, and read by :class:`SafeUnpickler`, which
  resolves only an allow-list of globals. A checkpoint therefore never makes fedselect run
  code chosen by the file; values that do not fit raise :class:`UnsafeStateError` when written,
  unless the caller trusts its checkpoint directory (:class:`Pickled` with ``trusted=True``).

The digest makes a truncated, empty or bit-flipped file detectable before anything is decoded;
such a file, or one whose archive or objects cannot be decoded, is moved aside (renamed
``<name>.corrupt-<timestamp>``) with a warning naming it, and the run starts over. A file in the
pickle format of earlier versions (``FEDSELECT-CHECKPOINT-1``) is never unpickled: reading it
raises :class:`LegacyCheckpointError`, so that finished work is not discarded without the
user's say (see its message).

Files are written atomically: a temporary file in the same directory, flushed and
``fsync``-ed, renamed over the target with :func:`os.replace`, then the directory itself is
``fsync``-ed so the rename survives a power cut. A ``kill -9`` at any moment therefore
leaves either the previous checkpoint or the new one, never a mix (a stray temporary file
at most, which is ignored and cleaned up by the next write).
"""

from __future__ import annotations

import builtins
import collections
import hashlib
import io
import json
import math
import os
import pickle
import re
import sys
import tempfile
import time
import warnings
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._npy import read_npy_member
from .._pickle_scan import scan_pickle
from ..identity import flatten_config

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
_TRUST_HINT = ("pass checkpoint_trusted=True (FederatedTrainer) or trusted=True (read_checkpoint) to use pickle, "
               "which runs code from the file: only for a checkpoint directory no one else can write to")


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


class UnsafeStateError(TypeError):
    """A value cannot be checkpointed without full pickle: it holds something outside the allow-list.

    The message names the value (for a selector, the attribute) and the type or global.
    """


class CorruptFileWarning(UserWarning):
    """A result or checkpoint file could not be read; it was moved aside and its run is redone."""


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


# -- files -------------------------------------------------------------------------------

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


# -- rebuilding numpy, torch and scipy objects without their pickle paths -----------------
# Each reducer below turns an object into (one of these functions, plain arguments); the
# functions validate their arguments through the libraries' public constructors.

def _torch() -> Any:
    return sys.modules.get("torch")


def _rebuild_dtype(descr: Any) -> np.dtype:
    dtype = np.lib.format.descr_to_dtype(descr)
    if dtype.hasobject:
        raise pickle.UnpicklingError("object dtypes are not rebuilt from checkpoints")
    return dtype


def _rebuild_scalar(descr: Any, data: bytes) -> Any:
    dtype = _rebuild_dtype(descr)
    if not isinstance(data, bytes) or len(data) != dtype.itemsize:
        raise pickle.UnpicklingError(f"a numpy {dtype} scalar needs {dtype.itemsize} bytes")
    return np.frombuffer(data, dtype=dtype, count=1)[0]


def _rebuild_object_array(shape: tuple[int, ...], items: list[Any]) -> np.ndarray:
    if not (isinstance(shape, tuple) and all(isinstance(s, int) and s >= 0 for s in shape)
            and isinstance(items, list) and math.prod(shape) == len(items)):
        raise pickle.UnpicklingError("an object array's shape does not match its items")
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out.reshape(shape)


_BIT_GENERATORS = ("MT19937", "PCG64", "PCG64DXSM", "Philox", "SFC64")


def _rebuild_seed_sequence(entropy: Any, spawn_key: tuple[int, ...], pool_size: int,
                           n_children_spawned: int) -> np.random.SeedSequence:
    if not (isinstance(pool_size, int) and 4 <= pool_size <= 1024):
        raise pickle.UnpicklingError(f"a SeedSequence pool of {pool_size!r} words")
    return np.random.SeedSequence(entropy, spawn_key=spawn_key, pool_size=pool_size,
                                  n_children_spawned=n_children_spawned)


def _rebuild_seedless() -> Any:
    from numpy.random.bit_generator import SeedlessSeedSequence

    return SeedlessSeedSequence()


def _rebuild_bit_generator(name: str, state: dict[str, Any], seed_seq: Any) -> Any:
    from numpy.random.bit_generator import SeedlessSeedSequence

    if name not in _BIT_GENERATORS or not isinstance(state, dict):
        raise pickle.UnpicklingError(f"unknown bit generator {name!r}")
    if seed_seq is not None and not isinstance(seed_seq, (np.random.SeedSequence, SeedlessSeedSequence)):
        raise pickle.UnpicklingError("a bit generator's seed sequence must be a SeedSequence")
    bit_generator = getattr(np.random, name)()
    bit_generator.__setstate__((state, seed_seq))
    return bit_generator


def _rebuild_random_state(bit_generator: Any, state: dict[str, Any]) -> np.random.RandomState:
    if not isinstance(bit_generator, np.random.BitGenerator):
        raise pickle.UnpicklingError("a RandomState needs a bit generator")
    rs = np.random.RandomState(bit_generator)
    rs.set_state(state)
    return rs


def _rebuild_generator(bit_generator: Any) -> np.random.Generator:
    if not isinstance(bit_generator, np.random.BitGenerator):
        raise pickle.UnpicklingError("a Generator needs a bit generator")
    return np.random.Generator(bit_generator)


def _rebuild_torch_dtype(name: str) -> Any:
    torch = _torch()
    value = getattr(torch, name, None) if torch is not None and isinstance(name, str) else None
    if torch is None or not isinstance(value, torch.dtype):
        raise pickle.UnpicklingError(f"{name!r} is not a torch dtype")
    return value


def _rebuild_torch_device(name: str) -> Any:
    import torch

    return torch.device(str(name))


def _rebuild_torch_size(dims: tuple[int, ...]) -> Any:
    import torch

    if not (isinstance(dims, tuple) and all(isinstance(d, int) and d >= 0 for d in dims)):
        raise pickle.UnpicklingError("a torch.Size holds non-negative ints")
    return torch.Size(dims)


def _rebuild_torch_generator(device: str, state: Any) -> Any:
    import torch

    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
        raise pickle.UnpicklingError("a torch generator's state is a uint8 tensor")
    generator = torch.Generator(device=str(device))
    generator.set_state(state)
    return generator


_MODULE_BLANKS: dict[type, dict[str, Any]] = {}


def _blank_module(cls: type) -> Any:
    """An instance of the module class ``cls`` set up by its framework base alone (no arguments, no file data)."""
    import torch

    obj = cls.__new__(cls)
    gpytorch = sys.modules.get("gpytorch")
    if gpytorch is not None and issubclass(cls, gpytorch.Module):
        gpytorch.Module.__init__(obj)
    else:
        torch.nn.Module.__init__(obj)
    return obj


def _hook_counts(cls: type) -> dict[str, Any]:
    if cls not in _MODULE_BLANKS:
        blank = _blank_module(cls)
        _MODULE_BLANKS[cls] = {k: (len(v) if isinstance(v, Mapping) else v)
                               for k, v in vars(blank).items() if "hook" in k}
    return _MODULE_BLANKS[cls]


def _rebuild_module(cls: Any, state: dict[str, Any]) -> Any:
    torch = _torch()
    if torch is None or not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise pickle.UnpicklingError("_rebuild_module needs a torch.nn.Module subclass")
    if not isinstance(state, dict) or not all(isinstance(k, str) and "hook" not in k for k in state):
        raise pickle.UnpicklingError(f"a {cls.__qualname__} module's state must be attributes without hooks")
    shadowed = sorted(k for k in state if callable(getattr(cls, k, None)))
    if shadowed:  # an instance attribute named like a method (``forward``) would replace it
        raise pickle.UnpicklingError(f"a {cls.__qualname__} module's state sets {shadowed}, which shadow its methods")
    obj = _blank_module(cls)
    obj.__dict__.update(state)
    return obj


_SPARSE = ("csr_matrix", "csc_matrix", "csr_array", "csc_array", "coo_matrix", "coo_array")


def _rebuild_sparse(kind: str, arrays: tuple[Any, ...], shape: tuple[int, int]) -> Any:
    import scipy.sparse

    if kind not in _SPARSE or not (isinstance(arrays, tuple) and len(arrays) == 3
                                   and all(type(a) is np.ndarray for a in arrays)):
        raise pickle.UnpicklingError(f"cannot rebuild a scipy.sparse {kind!r}")
    cls = getattr(scipy.sparse, kind)
    if kind.startswith("coo"):
        matrix = cls((arrays[0], (arrays[1], arrays[2])), shape=shape)
        matrix._check()  # index ranges and dtypes
    else:
        matrix = cls(arrays, shape=shape)
        matrix.check_format(full_check=True)  # indptr monotone, indices in range: native code trusts them
    return matrix


_REBUILDERS = {f.__name__: f for f in (
    _rebuild_dtype, _rebuild_scalar, _rebuild_object_array, _rebuild_seed_sequence, _rebuild_seedless,
    _rebuild_bit_generator, _rebuild_random_state, _rebuild_generator, _rebuild_torch_dtype, _rebuild_torch_device,
    _rebuild_torch_size, _rebuild_torch_generator, _rebuild_module, _rebuild_sparse,
)}

_SEALED = frozenset(f"{__name__}.{name}" for name in _REBUILDERS)

# Globals with no behaviour beyond building a value from what the stream holds (not range or bytearray: from a small
# stream they would build huge values).
_PLAIN_GLOBALS: dict[tuple[str, str], Any] = {
    **{("builtins", n): getattr(builtins, n) for n in (
        "set", "frozenset", "complex", "slice", "list", "dict", "tuple", "int", "float", "str", "bool")},
    **{("collections", n): getattr(collections, n) for n in ("OrderedDict", "deque", "defaultdict", "Counter")},
}


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that resolves only an allow-list of globals, and arrays by reference.

    Admitted globals: the rebuild functions of this module (numpy dtypes, scalars and object
    arrays, numpy SeedSequence / bit generators / RandomState / Generator, torch dtypes,
    devices, sizes, generators and ``torch.nn.Module`` instances, scipy CSR / CSC / COO
    matrices; each validates its arguments through the library's public constructors); the
    builtin and ``collections`` containers; classes defined in the module of a registered
    selector class, of a class in ``classes``, or in ``fedselect.selectors``; and torch's own
    layers (``torch.nn.modules``, rebuilt by ``_rebuild_module`` without hooks). Anything else
    (``os.system``, ``builtins.eval``, ``getattr``, ``functools.partial``, a function, an
    unregistered class) raises :class:`pickle.UnpicklingError` naming it. Modules are never
    imported: a class is found only in a module already loaded. Persistent ids name arrays
    and tensors, which ``arrays`` maps to the objects. Before anything is built, ``load``
    bounds the stream's cost with :func:`fedselect._pickle_scan.scan_pickle` (shared
    references expanded: at most 16 nodes walked per byte; ``str`` only on atoms; nothing set
    on a rebuilt value afterwards) and refuses calling a torch layer class directly.

    Parameters
    ----------
    file : binary file
    arrays : mapping of str to object
        The arrays and tensors the stream may refer to.
    classes : iterable of type
        Classes admitted besides the registered selector classes.
    """

    def __init__(self, file: Any, arrays: Mapping[str, Any], classes: Iterable[type] = ()) -> None:
        self._data = file.read()
        super().__init__(io.BytesIO(self._data))
        self._arrays = arrays
        self._modules = _admitted_modules(classes)

    def load(self) -> Any:
        """The stream's value, once :func:`~fedselect._pickle_scan.scan_pickle` has bounded its cost."""
        called = scan_pickle(self._data, what="a checkpoint object", sealed=_SEALED)
        torch = _torch()
        for module, qualname in sorted(called):
            cls = _find_class(module, qualname) if torch is not None else None
            if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
                raise pickle.UnpicklingError(
                    f"calls {module}.{qualname}: a torch module is rebuilt only by _rebuild_module"
                )
        return super().load()

    def find_class(self, module: str, name: str) -> Any:
        obj = _PLAIN_GLOBALS.get((module, name))
        if obj is not None:
            return obj
        if module == __name__ and name in _REBUILDERS:
            return _REBUILDERS[name]
        if module in self._modules or module.startswith("fedselect.selectors."):
            cls = _find_class(module, name)
            if cls is not None:
                return cls
        torch = _torch()
        if torch is not None and module.startswith("torch.nn.modules."):  # torch's layers, for _rebuild_module
            cls = _find_class(module, name)
            if cls is not None and issubclass(cls, torch.nn.Module):
                return cls
        raise pickle.UnpicklingError(
            f"refused global {module}.{name}: a checkpoint may name only numpy, torch and scipy values, plain "
            "containers and the classes of registered selectors' modules"
        )

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, str) and pid in self._arrays:
            return self._arrays[pid]
        raise pickle.UnpicklingError(f"unknown array reference {pid!r}")


def _find_class(module: str, qualname: str) -> type | None:
    """The class ``module.qualname`` if ``module`` is loaded and defines it (no import, no re-export)."""
    obj: Any = sys.modules.get(module)
    if obj is None:
        return None
    for part in qualname.split("."):
        if not part.isidentifier() or part.startswith("__"):
            return None
        obj = getattr(obj, part, None)
        if not isinstance(obj, type) or obj.__module__ != module:
            return None
    return obj


def _admitted_modules(classes: Iterable[type]) -> frozenset[str]:
    modules = {c.__module__ for c in classes}
    try:
        from ..plugins import registry

        modules |= {e.obj.__module__ for e in registry("selectors").values() if isinstance(e.obj, type)}
    except Exception:
        pass
    return frozenset(modules)


class _SafePickler(pickle.Pickler):
    """Pickles with every plain array and tensor moved out (to ``writer``) and library objects reduced
    to this module's rebuild functions, so the stream names no global outside :class:`SafeUnpickler`'s list."""

    def __init__(self, file: Any, writer: _Writer) -> None:
        super().__init__(file, protocol=5)
        self._writer = writer

    def persistent_id(self, obj: Any) -> str | None:
        return self._writer.array(obj)

    def reducer_override(self, obj: Any) -> Any:
        return _reduce(obj)


def _reduce(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if type(obj) is np.ndarray and obj.dtype == object:
            return _rebuild_object_array, (tuple(obj.shape), obj.ravel().tolist())
        return NotImplemented  # a subclass: refused by its global
    if isinstance(obj, np.dtype):
        return _rebuild_dtype, (np.lib.format.dtype_to_descr(obj),)
    if isinstance(obj, np.generic):
        if obj.dtype.hasobject:
            return NotImplemented
        return _rebuild_scalar, (np.lib.format.dtype_to_descr(obj.dtype), obj.tobytes())
    if isinstance(obj, np.random.SeedSequence):
        return _rebuild_seed_sequence, (obj.entropy, tuple(obj.spawn_key), obj.pool_size, obj.n_children_spawned)
    if type(obj).__name__ == "SeedlessSeedSequence" and type(obj).__module__.startswith("numpy.random"):
        return _rebuild_seedless, ()
    if isinstance(obj, np.random.BitGenerator):
        if type(obj).__name__ not in _BIT_GENERATORS:
            return NotImplemented
        state, seed_seq = obj.__reduce__()[2]
        return _rebuild_bit_generator, (type(obj).__name__, state, seed_seq)
    if isinstance(obj, np.random.RandomState):
        return _rebuild_random_state, (obj._bit_generator, obj.get_state(legacy=False))
    if isinstance(obj, np.random.Generator):
        return _rebuild_generator, (obj.bit_generator,)
    torch = _torch()
    if torch is not None:
        if isinstance(obj, torch.dtype):
            return _rebuild_torch_dtype, (str(obj).removeprefix("torch."),)
        if isinstance(obj, torch.device):
            return _rebuild_torch_device, (str(obj),)
        if isinstance(obj, torch.Size):
            return _rebuild_torch_size, (tuple(int(d) for d in obj),)
        if isinstance(obj, torch.Generator):
            return _rebuild_torch_generator, (str(obj.device), obj.get_state())
        if isinstance(obj, torch.nn.Module):
            return _rebuild_module, (type(obj), _module_state(obj))
    sparse = sys.modules.get("scipy.sparse")
    if sparse is not None and sparse.issparse(obj):
        kind = type(obj).__name__
        if kind not in _SPARSE or type(obj) is not getattr(sparse, kind):
            raise UnsafeStateError(f"a scipy.sparse {kind} (only CSR, CSC and COO are checkpointed)")
        arrays = (obj.data, obj.row, obj.col) if kind.startswith("coo") else (obj.data, obj.indices, obj.indptr)
        return _rebuild_sparse, (kind, tuple(np.asarray(a) for a in arrays), tuple(int(s) for s in obj.shape))
    return NotImplemented


def _module_state(module: Any) -> dict[str, Any]:
    counts = _hook_counts(type(module))
    state = {}
    for k, v in vars(module).items():
        if "hook" in k:
            if (len(v) if isinstance(v, Mapping) else v) != counts.get(k):
                raise UnsafeStateError(f"a {type(module).__qualname__} module with hooks registered ({k})")
            continue
        state[k] = v
    return state


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
            torch = _torch()
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
            raise UnsafeStateError(f"a {type(t).__qualname__} tensor of layout {t.layout} (only dense tensors and "
                                   "Parameters are checkpointed)")
        meta = {"kind": "parameter" if isinstance(t, torch.nn.Parameter) else "tensor",
                "requires_grad": bool(t.requires_grad), "device": str(t.device), "shape": list(t.shape),
                "stride": list(t.stride())}
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
            _TrustedPickler(buf, self).dump(item.value)
            data, trusted = buf.getvalue(), True
        self.objects[name] = (data, trusted)
        return name

    def _dump(self, value: Any, classes: tuple[type, ...]) -> bytes:
        """Pickle ``value`` restrictedly and load it back with :class:`SafeUnpickler`: what is written is readable."""
        try:
            buf = io.BytesIO()
            _SafePickler(buf, self).dump(value)
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


class _TrustedPickler(pickle.Pickler):
    """Full pickle (``trusted=True``), arrays and tensors still stored as ``.npy``."""

    def __init__(self, file: Any, writer: _Writer) -> None:
        super().__init__(file, protocol=5)
        self._writer = writer

    def persistent_id(self, obj: Any) -> str | None:
        try:
            return self._writer.array(obj)
        except UnsafeStateError:
            return None


class _TrustedUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, arrays: Mapping[str, Any]) -> None:
        super().__init__(file)
        self._arrays = arrays

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, str) and pid in self._arrays:
            return self._arrays[pid]
        raise pickle.UnpicklingError(f"unknown array reference {pid!r}")


def _member(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=_EPOCH)
    info.compress_type = zipfile.ZIP_STORED
    info.external_attr = 0o600 << 16
    return info


def _encode(state: Mapping[str, Any]) -> bytes:
    writer = _Writer()
    tree = writer.encode(dict(state))
    doc = {"format": "fedselect-checkpoint", "version": _VERSION, "state": tree,
           "arrays": {name: meta for name, (_, meta) in writer.arrays.items()},
           "objects": {name: {"trusted": trusted} for name, (_, trusted) in writer.objects.items()}}
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
                path=self.path, differences={"checkpoint_trusted": (True, False)},
            )
        objects: dict[str, Any] = {}
        try:
            for name, spec in specs.items():
                data = self._zf.read(f"objects/{name}.pickle")
                if spec.get("trusted"):
                    objects[name] = _TrustedUnpickler(io.BytesIO(data), self._arrays).load()
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
            path=path, differences={"checkpoint format": (1, _VERSION)},
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
    if not (isinstance(doc, dict) and doc.get("format") == "fedselect-checkpoint" and doc.get("version") == _VERSION
            and isinstance(doc.get("arrays"), dict) and isinstance(doc.get("objects"), dict) and "state" in doc):
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


def read_checkpoint(path: str | os.PathLike[str], *, classes: Iterable[type] = (),
                    trusted: bool = False) -> dict[str, Any] | None:
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
        raise UnsafeStateError(f"{type(selector).__qualname__}.__getstate__ returns a {type(state).__name__}, "
                               "not a dict of attributes")
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
