"""The messages a :class:`~fedselect.flower.SelectorStrategy` and a fedselect ClientApp exchange.

Every fedselect message carries a ``ConfigRecord`` under ``"config"``; a message that
carries a model carries it as an ``ArrayRecord`` under ``"arrays"``. Replies carry a
``MetricRecord`` under ``"metrics"`` and, for training, the update ``w_k - w^t`` as an
``ArrayRecord`` under ``"update"`` (same keys, shapes and dtypes as the model).

Buffers (batch norm's running mean and variance, ``num_batches_tracked``) are arrays of the
model's ``ArrayRecord`` like the parameters: ``w^t`` goes down with the global buffers b^t,
and the ``"update"`` holds, for a buffer too, the difference ``b_k - b^t`` between the
client's buffer after its local training and the one it received, in the buffer's own
dtype (int64 stays int64; a boolean buffer reports ``b_k != b^t``). So a client needs no
list of which arrays are buffers: every array's update is "after minus before". Only the
server tells them apart (``SelectorStrategy(buffers=...)``): it adds the weighted
parameter deltas to the parameters, and sets each buffer to ``b^t + sum_k a_k (b_k - b^t)``
with the weights normalised to sum 1 (:func:`fedselect.simulation.engine.aggregate_buffers`
written on the differences). The difference ``b_k - b^t`` is the one subtraction that
function does first, and an IEEE subtraction gives the same bits on the client as on the
server, so the Flower run repeats the simulator's buffer arithmetic exactly; reporting the
values instead would need the server to rebuild them, or the clients to be told the names.

======================  ===========================================================
message type            what the client does
======================  ===========================================================
``query.fedselect_hello``  report its stable client id, n_k and (if known) N
``query.fedselect_loss``   l_k(w) of the model it is sent (or of its cached w^t)
``query.fedselect_update`` train from w^t and upload the update (oracle probes, trials)
``train``                  the round's training: optional l_k(w^t) first, then the update
``evaluate``               the inner strategy's federated evaluation
======================  ===========================================================

A client keeps the last global model ``w^t`` it received (in its ``Context.state``); the
server omits the model from later messages of the same round to a client it already
sent it to (``config["fedselect-cached-model"] = True``), so ``w^t`` goes down once per
client per round, as the cost ledger charges it.

When the selector needs ``"sample_losses"`` (Oort), every training message (``train`` and
``query.fedselect_update``) carries ``config["fedselect-need-sample-loss"] = True`` and its
reply must carry ``"fedselect-sample-loss-sq"``: the mean, over every sample of every local
step, of the squared per-sample training loss (:meth:`fedselect.simulation.engine.Engine.train`
with ``sample_losses=True``). :func:`sample_loss_sq` is its check.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Message, RecordDict

HELLO = "query.fedselect_hello"
LOSS = "query.fedselect_loss"
UPDATE = "query.fedselect_update"
TRAIN = "train"
EVALUATE = "evaluate"

#: config keys the strategy sets (user config keys are passed on untouched)
ROUND = "fedselect-round"  # t, 0-based
PURPOSE = "fedselect-purpose"  # "main" (the round's w^t) or "trial"
CACHED = "fedselect-cached-model"  # True: no "arrays"; use the w^t kept from earlier this round
NEED_LOSS = "fedselect-need-loss"  # train: report l_k(w^t) before training
NEED_SAMPLE_LOSS = "fedselect-need-sample-loss"  # train, update: report SAMPLE_LOSS_SQ with the update
MODEL_KIND = "fedselect-model"  # "global" (w^t: keep it) or "trial" (do not keep)

#: reply metric keys
CLIENT_ID = "fedselect-client-id"
NUM_EXAMPLES = "num-examples"
NUM_PARTITIONS = "fedselect-num-clients"
LOSS_KEY = "loss"
EVALUATED = "fedselect-samples-evaluated"
STEPS = "fedselect-local-steps"
SAMPLE_GRADIENTS = "fedselect-sample-gradients"
SAMPLE_LOSS_SQ = "fedselect-sample-loss-sq"  # mean squared per-sample training loss (Oort's utility)

STATE_MODEL = "fedselect.model"
STATE_INFO = "fedselect.model-info"

#: the npy header's largest accepted size (numpy's own default bound for np.load)
_MAX_HEADER = 10_000


class BadReply(ValueError):
    """A client's reply that cannot be used: a wrong layout, a wrong dtype, a non-finite value, too large."""


def decode_array(array: Any, shape: tuple[int, ...], kinds: str, what: str) -> np.ndarray:
    """The array a client sent, decoded only after its npy header matched ``shape`` and ``kinds``.

    Flower's ``Array.numpy()`` hands the bytes to ``np.load``, which allocates what the header
    claims before reading a byte of data: a 100-byte reply whose header claims a terabyte
    raises MemoryError on the server. Here the header is parsed on its own
    (:func:`numpy.lib.format.read_array_header_1_0`, a literal parser), checked against the
    model's layout (shape, dtype kind, C or Fortran order, no object or structured dtype) and
    against the number of bytes that follow, and only then viewed with :func:`numpy.frombuffer`
    (no copy; read-only). ``kinds`` lists the accepted :attr:`numpy.dtype.kind` letters
    (``"f"``: floating point only). Raises :class:`BadReply` naming ``what`` otherwise.
    """
    if not isinstance(array, Array):
        raise BadReply(f"{what} is a {type(array).__name__}, not an Array")
    if array.stype != "numpy.ndarray":
        raise BadReply(f"{what} has serialisation type {array.stype!r}, not 'numpy.ndarray'")
    data = array.data
    if not isinstance(data, bytes | bytearray | memoryview):
        raise BadReply(f"{what} carries no bytes")
    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            header_shape, fortran, dtype = np.lib.format.read_array_header_1_0(f, max_header_size=_MAX_HEADER)
        elif version in ((2, 0), (3, 0)):
            header_shape, fortran, dtype = np.lib.format.read_array_header_2_0(f, max_header_size=_MAX_HEADER)
        else:
            raise BadReply(f"{what}: npy format version {version} is not supported")
    except BadReply:
        raise
    except Exception as exc:  # ValueError, SyntaxError, ... from a malformed header
        raise BadReply(f"{what}: unreadable npy header ({type(exc).__name__}: {exc})") from None
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None or dtype.kind not in kinds:
        allowed = {"f": "floating", "i": "signed integer", "u": "unsigned integer", "b": "boolean"}
        raise BadReply(f"{what} has dtype {dtype}; expected {' or '.join(allowed.get(k, k) for k in kinds)}")
    if tuple(header_shape) != tuple(shape):
        raise BadReply(f"{what} has shape {tuple(header_shape)}; expected {tuple(shape)}")
    count = math.prod(shape)
    offset = f.tell()
    if len(data) - offset != count * dtype.itemsize:
        raise BadReply(
            f"{what}: {len(data) - offset} data bytes for a {dtype} array of shape {tuple(shape)} "
            f"({count * dtype.itemsize} expected)"
        )
    flat = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    return flat.reshape(shape, order="F" if fortran else "C")


def _shown(value: Any) -> str:
    """A short description of a value a client sent, safe to build whatever it is (a 5,000-digit int's repr raises)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = repr(value)
    except Exception:  # a hostile object's repr
        return f"a {type(value).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."


def sample_loss_sq(metrics: Mapping[str, Any], max_abs_loss: float) -> float:
    """The ``"fedselect-sample-loss-sq"`` of a training reply's metrics, checked; :class:`BadReply` otherwise.

    It must be present (the server asked for it), a real number (not a bool, a list, a
    string), finite, >= 0 (a mean of squares) and at most ``max_abs_loss ** 2`` (the square of
    the largest loss the server accepts). An integer is compared exactly before any
    conversion, so an integer too large for a float is refused, not an OverflowError.
    """
    if SAMPLE_LOSS_SQ not in metrics:
        raise BadReply(
            f"the reply has no {SAMPLE_LOSS_SQ!r}, which the server asked for (the selector needs 'sample_losses')"
        )
    value = metrics[SAMPLE_LOSS_SQ]
    bound = float(max_abs_loss) * float(max_abs_loss)  # inf rather than OverflowError for a huge max_abs_loss
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise BadReply(f"{SAMPLE_LOSS_SQ!r} is {_shown(value)}, not a number")
    if isinstance(value, (int, np.integer)):
        if not 0 <= int(value) <= bound:
            raise BadReply(f"{SAMPLE_LOSS_SQ!r}={_shown(int(value))} is outside [0, max_abs_loss**2={bound:g}]")
        return float(value)
    x = float(value)
    if not math.isfinite(x):
        raise BadReply(f"{SAMPLE_LOSS_SQ!r}={_shown(value)} is not finite")
    if not 0.0 <= x <= bound:
        raise BadReply(f"{SAMPLE_LOSS_SQ!r}={_shown(value)} is outside [0, max_abs_loss**2={bound:g}]")
    return x


def record_nbytes(record: Any) -> int:
    """The bytes an ``ArrayRecord`` carries (its arrays' serialised data), without decoding any."""
    return sum(
        len(a.data) if isinstance(a, Array) and isinstance(a.data, bytes | bytearray) else 0 for a in record.values()
    )


#: bytes counted for a number, a bool, a list's or a string's framing, and each array's metadata
_SCALAR_BYTES = 8
#: the deepest a value is walked (Flower's records are flat; anything deeper is counted as over any limit)
_MAX_DEPTH = 8


def _value_nbytes(value: Any, depth: int = 0) -> int:
    """Bytes of one record value: 8 for a number or bool, a string's UTF-8 bytes (counted without a copy when
    it is ASCII) or a bytes value's length, plus 8, and a list's (or other container's) elements, each counted
    the same way."""
    if depth > _MAX_DEPTH:
        raise BadReply(f"a record value nested more than {_MAX_DEPTH} levels deep")
    if isinstance(value, str):
        return _SCALAR_BYTES + (len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass")))
    if isinstance(value, bytes | bytearray | memoryview):
        return _SCALAR_BYTES + memoryview(value).nbytes
    if isinstance(value, Mapping):
        return _SCALAR_BYTES + sum(_value_nbytes(k, depth + 1) + _value_nbytes(v, depth + 1) for k, v in value.items())
    if isinstance(value, list | tuple):
        return _SCALAR_BYTES + sum(_value_nbytes(v, depth + 1) for v in value)
    return _SCALAR_BYTES


def _array_nbytes(array: Any) -> int:
    """Bytes of one ``Array``: its data, its dtype and stype strings, 8 per dimension of its shape."""
    if not isinstance(array, Array):
        return _value_nbytes(array, 1)
    data = array.data
    n = memoryview(data).nbytes if isinstance(data, bytes | bytearray | memoryview) else _value_nbytes(data, 1)
    return n + _value_nbytes(array.dtype, 1) + _value_nbytes(array.stype, 1) + _value_nbytes(list(array.shape), 1)


def content_nbytes(content: Any) -> int:
    """The bytes a message's content carries, every one counted, nothing decoded.

    Every record of the ``RecordDict`` (array, metric and config records, whatever their
    names) counts its name, each key, and each value: an array's data plus its dtype, stype
    and shape; a string's UTF-8 bytes and a bytes value's length, plus 8; 8 for a number or a
    bool; a list 8 plus each element counted the same way (a list of strings counts every
    string). A value nested deeper than Flower's records allow is a :class:`BadReply`.
    """
    n = 0
    for name, record in content.items():
        n += _value_nbytes(name)
        for key, value in record.items():
            n += _value_nbytes(key)
            n += _array_nbytes(value) if isinstance(value, Array) else _value_nbytes(value)
    return n


class ModelLayout:
    """Keys, shapes and dtypes of a model held as an ``ArrayRecord``; flattens its parameters to float32 and back.

    ``buffers`` names the arrays that are buffers (batch norm statistics): they are left out
    of the flat parameter vector (whose length D is what selectors see) and kept by name in
    their own dtype (:meth:`buffers`). :meth:`record` writes both back in the record's key order.
    """

    def __init__(self, record: ArrayRecord, buffers: Sequence[str] = ()) -> None:
        self.all_keys = list(record.keys())
        unknown = [b for b in buffers if b not in record]
        if unknown:
            raise ValueError(
                f"fedselect.flower: buffers={list(buffers)!r} names array(s) {unknown} that the model's "
                f"ArrayRecord does not hold; its arrays are {self.all_keys[:20]}"
            )
        names = set(buffers)
        self.buffer_keys = [k for k in self.all_keys if k in names]
        self.keys = [k for k in self.all_keys if k not in names]
        arrays = [record[k].numpy() for k in self.keys]
        for key, arr in zip(self.keys, arrays):
            if not np.issubdtype(arr.dtype, np.floating):
                raise TypeError(
                    f"fedselect.flower: model array {key!r} has dtype {arr.dtype}; the strategy aggregates "
                    "parameter updates and needs floating-point arrays (a buffer such as batch norm's "
                    "num_batches_tracked must be named in SelectorStrategy(buffers=...))"
                )
        self.shapes = [a.shape for a in arrays]
        self.dtypes = [a.dtype for a in arrays]
        self.sizes = [int(a.size) for a in arrays]
        self.size = int(sum(self.sizes))
        self.buffer_shapes = {k: record[k].numpy().shape for k in self.buffer_keys}
        self.buffer_dtypes = {k: record[k].numpy().dtype for k in self.buffer_keys}
        self._all = set(self.all_keys)
        self._nbytes = int(sum(a.nbytes for a in arrays)) + int(
            sum(math.prod(self.buffer_shapes[k]) * self.buffer_dtypes[k].itemsize for k in self.buffer_keys)
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the model's arrays (parameters and buffers) in their own dtypes."""
        return self._nbytes

    def check_names(self, record: ArrayRecord, what: str) -> None:
        """BadReply if ``record`` holds an array the model does not have (names are checked before decoding)."""
        unknown = [k for k in record.keys() if k not in self._all]
        if unknown:
            raise BadReply(f"fedselect.flower: the {what} holds array(s) {unknown[:3]} the model does not have")

    def flatten(self, record: ArrayRecord, what: str = "model") -> np.ndarray:
        """The parameter arrays of ``record`` concatenated in the layout's key order, as float32.

        Every array is decoded by :func:`decode_array`: its header must give the layout's shape
        and a floating-point dtype (an update of booleans, integers or complex numbers is refused,
        not cast) before a byte of it is read.
        """
        missing = [k for k in self.keys if k not in record]
        if missing:
            raise BadReply(f"fedselect.flower: the {what} lacks array(s) {missing[:3]} of the global model")
        parts = []
        for key, shape in zip(self.keys, self.shapes):
            arr = decode_array(record[key], shape, "f", f"fedselect.flower: array {key!r} of the {what}")
            parts.append(arr.astype(np.float32).reshape(-1))
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def buffers(self, record: ArrayRecord, what: str = "model") -> dict[str, np.ndarray]:
        """The buffer arrays of ``record`` by name, in the global model's dtypes."""
        missing = [k for k in self.buffer_keys if k not in record]
        if missing:
            raise BadReply(f"fedselect.flower: the {what} lacks buffer(s) {missing[:3]} of the global model")
        out = {}
        for key in self.buffer_keys:
            arr = decode_array(
                record[key],
                self.buffer_shapes[key],
                _kinds(self.buffer_dtypes[key]),
                f"fedselect.flower: buffer {key!r} of the {what}",
            )
            out[key] = arr.astype(self.buffer_dtypes[key])
        return out

    def buffer_deltas(self, update: ArrayRecord) -> dict[str, np.ndarray]:
        """A client's ``b_k - b^t`` by buffer from its ``"update"``.

        Floating-point buffers' differences come back in the buffer's dtype, integer ones as
        int64 and boolean ones as booleans. ValueError (the client's reply is then rejected) for
        a missing buffer, a wrong shape, a fractional or non-finite difference of an integer
        buffer, or a non-0/1 difference of a boolean one.
        """
        missing = [k for k in self.buffer_keys if k not in update]
        if missing:
            raise BadReply(f"fedselect.flower: the update lacks buffer(s) {missing[:3]} of the global model")
        out = {}
        for key in self.buffer_keys:
            dtype = self.buffer_dtypes[key]
            arr = decode_array(
                update[key], self.buffer_shapes[key], _kinds(dtype), f"fedselect.flower: buffer {key!r} of the update"
            )
            if np.issubdtype(dtype, np.floating):
                arr = arr.astype(dtype)
            elif dtype == np.bool_:
                # A boolean buffer's "difference" is new != old: booleans (or 0/1) only.
                if arr.dtype != np.bool_ and not (
                    np.issubdtype(arr.dtype, np.number) and np.all((arr == 0) | (arr == 1))
                ):
                    raise BadReply(
                        f"fedselect.flower: boolean buffer {key!r} got a difference of dtype "
                        f"{arr.dtype} that is not boolean (0/1)"
                    )
                arr = arr.astype(np.bool_)
            else:
                # An integer buffer (a count) changes by whole numbers; a fractional or non-finite
                # difference is a broken client, not something to round away.
                if not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_):
                    if (
                        not np.issubdtype(arr.dtype, np.number)
                        or not np.all(np.isfinite(arr))
                        or not np.all(arr == np.round(arr))
                    ):
                        raise BadReply(
                            f"fedselect.flower: integer buffer {key!r} ({dtype}) got a difference "
                            f"of dtype {arr.dtype} that is not a whole number"
                        )
                if arr.size and (np.any(arr > 2**62) or np.any(arr < -(2**62))):  # compared before any cast
                    raise BadReply(f"fedselect.flower: integer buffer {key!r} got a difference beyond 2**62")
                arr = arr.astype(np.int64)
            out[key] = arr
        return out

    def record(
        self, flat: np.ndarray, buffers: Mapping[str, np.ndarray] | None = None, *, parameters_only: bool = False
    ) -> ArrayRecord:
        """An ``ArrayRecord`` with the model's keys (in order), shapes and dtypes: ``flat`` and ``buffers``.

        ``parameters_only``: the parameter arrays alone (what an inner Flower strategy aggregates).
        """
        flat = np.asarray(flat).reshape(-1)
        if flat.size != self.size:
            raise ValueError(f"fedselect.flower: a flat model of {flat.size} floats for a layout of {self.size}")
        if parameters_only:
            buffers = None
        elif self.buffer_keys and buffers is None:
            raise ValueError("fedselect.flower: a model with buffers needs them to build its ArrayRecord")
        arrays: dict[str, np.ndarray] = {}
        start = 0
        for key, shape, dtype, n in zip(self.keys, self.shapes, self.dtypes, self.sizes):
            arrays[key] = flat[start : start + n].reshape(shape).astype(dtype, copy=False)
            start += n
        for key in self.buffer_keys if buffers is not None else ():
            arrays[key] = np.asarray(buffers[key]).astype(self.buffer_dtypes[key], copy=False)
        return ArrayRecord(array_dict={k: Array(contiguous(arrays[k])) for k in self.all_keys if k in arrays})


def _kinds(dtype: np.dtype) -> str:
    """The dtype kinds a buffer's value or difference may come in (today's rules, see ``buffer_deltas``)."""
    if np.issubdtype(dtype, np.floating):
        return "f"
    return "biuf"  # a mask (booleans or 0/1 numbers) or a count (integers or whole-valued floats)


def contiguous(a: Any) -> np.ndarray:
    """``a`` as a C-contiguous array of its own shape (a 0-d buffer such as ``num_batches_tracked`` stays 0-d)."""
    a = np.asarray(a)
    return a if a.flags.c_contiguous else np.array(a, order="C")


def buffer_delta(new: np.ndarray, old: np.ndarray) -> np.ndarray:
    """``new - old`` in the arrays' dtype; for boolean arrays (which have no difference) ``new != old``."""
    new, old = np.asarray(new), np.asarray(old)
    if new.dtype == np.bool_ or old.dtype == np.bool_:
        return np.not_equal(new, old)
    return new - old


def as_arrays(values: Sequence[np.ndarray] | dict[str, np.ndarray], keys: list[str], what: str) -> ArrayRecord:
    """Wrap what a user's train function returned (a list in key order, or a dict by key)."""
    if isinstance(values, ArrayRecord):
        return values
    if isinstance(values, dict):
        items = [(k, values[k]) for k in keys if k in values]
        if len(items) != len(keys):
            raise ValueError(f"{what}: returned arrays for keys {sorted(values)[:5]}; expected {keys[:5]}")
    else:
        values = list(values)
        if len(values) != len(keys):
            raise ValueError(f"{what}: returned {len(values)} arrays for a model of {len(keys)}")
        items = list(zip(keys, values))
    return ArrayRecord(array_dict={k: Array(contiguous(v)) for k, v in items})


def message_bytes(obj: object) -> int:
    """Bytes of a Flower message (or record) as serialised for the wire, its descendants included."""
    deflate = getattr(obj, "deflate", None)
    if deflate is None:
        return 0
    n = len(deflate())
    for child in (getattr(obj, "children", None) or {}).values():
        n += message_bytes(child)
    return n


# -- reading a reply: what every reply check of the server shares -------------------------------

#: counts a client reports (steps, sample gradients, samples evaluated) above this are not counts
MAX_COUNT = 2**53


def reply_metrics(content: RecordDict) -> Any:
    """The reply's ``"metrics"`` record; :class:`BadReply` when it has none."""
    metrics = content.metric_records.get("metrics")
    if metrics is None:
        raise BadReply("the reply has no 'metrics' record")
    return metrics


def metric_int(
    metrics: Any, key: str, *, default: int | None = None, minimum: int = 0, maximum: int = MAX_COUNT
) -> int:
    """``metrics[key]`` as an int in [minimum, maximum] (``default`` when absent; :class:`BadReply` when absent
    without one, or not a whole number in range)."""
    if key not in metrics:
        if default is None:
            raise BadReply(f"the reply has no {key!r}")
        return default
    value = metrics[key]
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not np.isfinite(value)
        or not minimum <= value <= maximum
        or float(value) != int(value)
    ):
        raise BadReply(f"{key!r}={value!r} is not an integer in [{minimum}, {maximum}]")
    return int(value)


def parse_loss(content: RecordDict, max_abs: float = 1e6) -> tuple[float, int]:
    """(l_k, samples evaluated) of a loss reply; :class:`BadReply` unless the loss is a finite number with
    |l_k| <= max_abs."""
    metrics = reply_metrics(content)
    if LOSS_KEY not in metrics:
        raise BadReply(f"the reply has no {LOSS_KEY!r}")
    value = metrics[LOSS_KEY]
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise BadReply(f"{LOSS_KEY!r}={value!r} is not a number")
    if not np.isfinite(value):
        raise BadReply(f"{LOSS_KEY!r}={value!r} is not finite")
    if abs(float(value)) > max_abs:
        raise BadReply(f"{LOSS_KEY!r}={value!r} is beyond max_abs_loss={max_abs:g}")
    return float(value), metric_int(metrics, EVALUATED, default=0)


def safe_text(value: Any, limit: int = 300) -> str:
    """Text a client sent, safe for a log line: no control characters (a newline cannot forge a log line), cut."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def why(exc: BaseException) -> str:
    """A one-line reason for a log: the message of a :class:`BadReply`, else the exception's type and message."""
    return safe_text(str(exc) if isinstance(exc, BadReply) else f"{type(exc).__name__}: {exc}")


def destinations(messages: Iterable[Message]) -> dict[str, int]:
    """The node each sent message went to, by its message id (set by the grid's ``push_messages``)."""
    out: dict[str, int] = {}
    for m in messages:
        with contextlib.suppress(Exception):
            out[str(m.metadata.message_id)] = int(m.metadata.dst_node_id)
    return out
