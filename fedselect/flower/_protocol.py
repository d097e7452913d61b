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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord

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
MODEL_KIND = "fedselect-model"  # "global" (w^t: keep it) or "trial" (do not keep)

#: reply metric keys
CLIENT_ID = "fedselect-client-id"
NUM_EXAMPLES = "num-examples"
NUM_PARTITIONS = "fedselect-num-clients"
LOSS_KEY = "loss"
EVALUATED = "fedselect-samples-evaluated"
STEPS = "fedselect-local-steps"
SAMPLE_GRADIENTS = "fedselect-sample-gradients"

STATE_MODEL = "fedselect.model"
STATE_INFO = "fedselect.model-info"


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

    def flatten(self, record: ArrayRecord, what: str = "model") -> np.ndarray:
        """The parameter arrays of ``record`` concatenated in the layout's key order, as float32."""
        missing = [k for k in self.keys if k not in record]
        if missing:
            raise ValueError(f"fedselect.flower: the {what} lacks array(s) {missing[:3]} of the global model")
        parts = []
        for key, shape in zip(self.keys, self.shapes):
            arr = record[key].numpy()
            if arr.shape != shape:
                raise ValueError(
                    f"fedselect.flower: array {key!r} of the {what} has shape {arr.shape}; expected {shape}"
                )
            parts.append(arr.astype(np.float32, copy=False).reshape(-1))
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def buffers(self, record: ArrayRecord, what: str = "model") -> dict[str, np.ndarray]:
        """The buffer arrays of ``record`` by name, in the global model's dtypes."""
        missing = [k for k in self.buffer_keys if k not in record]
        if missing:
            raise ValueError(f"fedselect.flower: the {what} lacks buffer(s) {missing[:3]} of the global model")
        out = {}
        for key in self.buffer_keys:
            arr = record[key].numpy()
            if arr.shape != self.buffer_shapes[key]:
                raise ValueError(
                    f"fedselect.flower: buffer {key!r} of the {what} has shape {arr.shape}; "
                    f"expected {self.buffer_shapes[key]}"
                )
            out[key] = arr.astype(self.buffer_dtypes[key], copy=False)
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
            raise ValueError(f"fedselect.flower: the update lacks buffer(s) {missing[:3]} of the global model")
        out = {}
        for key in self.buffer_keys:
            arr = update[key].numpy()
            if arr.shape != self.buffer_shapes[key]:
                raise ValueError(
                    f"fedselect.flower: buffer {key!r} of the update has shape {arr.shape}; "
                    f"expected {self.buffer_shapes[key]}"
                )
            dtype = self.buffer_dtypes[key]
            if np.issubdtype(dtype, np.floating):
                arr = arr.astype(dtype, copy=False)
            elif dtype == np.bool_:
                # A boolean buffer's "difference" is new != old: booleans (or 0/1) only.
                if arr.dtype != np.bool_ and not (np.issubdtype(arr.dtype, np.number)
                                                  and np.all((arr == 0) | (arr == 1))):
                    raise ValueError(f"fedselect.flower: boolean buffer {key!r} got a difference of dtype "
                                     f"{arr.dtype} that is not boolean (0/1)")
                arr = arr.astype(np.bool_, copy=False)
            else:
                # An integer buffer (a count) changes by whole numbers; a fractional or non-finite
                # difference is a broken client, not something to round away.
                if not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_):
                    if not np.issubdtype(arr.dtype, np.number) or not np.all(np.isfinite(arr)) \
                            or not np.all(arr == np.round(arr)):
                        raise ValueError(f"fedselect.flower: integer buffer {key!r} ({dtype}) got a difference "
                                         f"of dtype {arr.dtype} that is not a whole number")
                arr = arr.astype(np.int64, copy=False)
            out[key] = arr
        return out

    def record(self, flat: np.ndarray, buffers: Mapping[str, np.ndarray] | None = None, *,
               parameters_only: bool = False) -> ArrayRecord:
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
