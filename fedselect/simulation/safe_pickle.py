"""Restricted pickle: values pickled with no global outside an allow-list, and read back the same way.

:class:`SafePickler` moves every plain numpy array and torch tensor out of the stream (to an
:class:`ArrayStore`, which names it) and reduces numpy, torch and scipy objects to this
module's rebuild functions (``_rebuild_*``), so that the stream names only those functions,
plain containers and the classes of selectors. :class:`SafeUnpickler` resolves only that
allow-list, after :func:`fedselect._pickle_scan.scan_pickle` has bounded what loading costs:
reading such a stream never runs code chosen by it. A value that does not fit raises
:class:`UnsafeStateError`; :class:`TrustedPickler` / :class:`TrustedUnpickler` are full pickle
(arrays still stored apart), for a caller that trusts where its files live.

The rebuild functions are named in every stream as ``fedselect.simulation.checkpoint.<name>``
(:data:`RECORDED_MODULE`), where they were defined when checkpoints of format 2 were first
written; that module re-exports them so that pickle finds them there, and checkpoints written
before and after the move are the same bytes.
"""

from __future__ import annotations

import builtins
import collections
import io
import math
import pickle
import sys
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import numpy as np

from .._pickle_scan import scan_pickle

__all__ = [
    "RECORDED_MODULE",
    "ArrayStore",
    "SafePickler",
    "SafeUnpickler",
    "TrustedPickler",
    "TrustedUnpickler",
    "UnsafeStateError",
]

# Where streams say the rebuild functions live (see the module's docstring).
RECORDED_MODULE = "fedselect.simulation.checkpoint"


class UnsafeStateError(TypeError):
    """A value cannot be checkpointed without full pickle: it holds something outside the allow-list.

    The message names the value (for a selector, the attribute) and the type or global.
    """


class ArrayStore(Protocol):
    """Where a pickler moves arrays and tensors (the checkpoint writer)."""

    def array(self, obj: Any) -> str | None:
        """The name under which ``obj`` (a plain ndarray or a tensor) is stored; None for other values.

        Raises :class:`UnsafeStateError` for a tensor it cannot store (sparse, quantized, a subclass).
        """


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
    if not (
        isinstance(shape, tuple)
        and all(isinstance(s, int) and s >= 0 for s in shape)
        and isinstance(items, list)
        and math.prod(shape) == len(items)
    ):
        raise pickle.UnpicklingError("an object array's shape does not match its items")
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out.reshape(shape)


_BIT_GENERATORS = ("MT19937", "PCG64", "PCG64DXSM", "Philox", "SFC64")


def _rebuild_seed_sequence(
    entropy: Any, spawn_key: tuple[int, ...], pool_size: int, n_children_spawned: int
) -> np.random.SeedSequence:
    if not (isinstance(pool_size, int) and 4 <= pool_size <= 1024):
        raise pickle.UnpicklingError(f"a SeedSequence pool of {pool_size!r} words")
    return np.random.SeedSequence(
        entropy, spawn_key=spawn_key, pool_size=pool_size, n_children_spawned=n_children_spawned
    )


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
        _MODULE_BLANKS[cls] = {
            k: (len(v) if isinstance(v, Mapping) else v) for k, v in vars(blank).items() if "hook" in k
        }
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

    if kind not in _SPARSE or not (
        isinstance(arrays, tuple) and len(arrays) == 3 and all(type(a) is np.ndarray for a in arrays)
    ):
        raise pickle.UnpicklingError(f"cannot rebuild a scipy.sparse {kind!r}")
    cls = getattr(scipy.sparse, kind)
    if kind.startswith("coo"):
        matrix = cls((arrays[0], (arrays[1], arrays[2])), shape=shape)
        matrix._check()  # index ranges and dtypes
    else:
        matrix = cls(arrays, shape=shape)
        matrix.check_format(full_check=True)  # indptr monotone, indices in range: native code trusts them
    return matrix


_REBUILDERS = {
    f.__name__: f
    for f in (
        _rebuild_dtype,
        _rebuild_scalar,
        _rebuild_object_array,
        _rebuild_seed_sequence,
        _rebuild_seedless,
        _rebuild_bit_generator,
        _rebuild_random_state,
        _rebuild_generator,
        _rebuild_torch_dtype,
        _rebuild_torch_device,
        _rebuild_torch_size,
        _rebuild_torch_generator,
        _rebuild_module,
        _rebuild_sparse,
    )
}

for _rebuild in _REBUILDERS.values():  # named in streams where they were first defined
    _rebuild.__module__ = RECORDED_MODULE
del _rebuild

_SEALED = frozenset(f"{RECORDED_MODULE}.{name}" for name in _REBUILDERS)

# Globals with no behaviour beyond building a value from what the stream holds (not range or bytearray: from a small
# stream they would build huge values).
_PLAIN_GLOBALS: dict[tuple[str, str], Any] = {
    **{
        ("builtins", n): getattr(builtins, n)
        for n in ("set", "frozenset", "complex", "slice", "list", "dict", "tuple", "int", "float", "str", "bool")
    },
    **{("collections", n): getattr(collections, n) for n in ("OrderedDict", "deque", "defaultdict", "Counter")},
}


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that resolves only an allow-list of globals, and arrays by reference.

    Admitted globals: the rebuild functions of :mod:`fedselect.simulation.safe_pickle` (numpy dtypes, scalars and object
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
        if module == RECORDED_MODULE and name in _REBUILDERS:
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


class SafePickler(pickle.Pickler):
    """Pickles with every plain array and tensor moved out (to ``writer``) and library objects reduced
    to this module's rebuild functions, so the stream names no global outside :class:`SafeUnpickler`'s list."""

    def __init__(self, file: Any, writer: ArrayStore) -> None:
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


class TrustedPickler(pickle.Pickler):
    """Full pickle (``trusted=True``), arrays and tensors still stored as ``.npy``."""

    def __init__(self, file: Any, writer: ArrayStore) -> None:
        super().__init__(file, protocol=5)
        self._writer = writer

    def persistent_id(self, obj: Any) -> str | None:
        try:
            return self._writer.array(obj)
        except UnsafeStateError:
            return None


class TrustedUnpickler(pickle.Unpickler):
    """Full pickle, arrays and tensors by reference: runs code from the stream (``trusted=True`` only)."""

    def __init__(self, file: Any, arrays: Mapping[str, Any]) -> None:
        super().__init__(file)
        self._arrays = arrays

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, str) and pid in self._arrays:
            return self._arrays[pid]
        raise pickle.UnpicklingError(f"unknown array reference {pid!r}")
