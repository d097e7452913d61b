"""The messages a :class:`~fedselect.flower.SelectorStrategy` and a fedselect ClientApp exchange.

Every fedselect message carries a ``ConfigRecord`` under ``"config"``; a message that
carries a model carries it as an ``ArrayRecord`` under ``"arrays"``. Replies carry a
``MetricRecord`` under ``"metrics"`` and, for training, the update ``w_k - w^t`` as an
``ArrayRecord`` under ``"update"`` (same keys, shapes and dtypes as the model).

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

from collections.abc import Sequence

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
    """Keys, shapes and dtypes of a model held as an ``ArrayRecord``; flattens to float32 and back."""

    def __init__(self, record: ArrayRecord) -> None:
        self.keys = list(record.keys())
        arrays = [record[k].numpy() for k in self.keys]
        for key, arr in zip(self.keys, arrays):
            if not np.issubdtype(arr.dtype, np.floating):
                raise TypeError(
                    f"fedselect.flower: model array {key!r} has dtype {arr.dtype}; the strategy aggregates "
                    "updates and needs floating-point arrays"
                )
        self.shapes = [a.shape for a in arrays]
        self.dtypes = [a.dtype for a in arrays]
        self.sizes = [int(a.size) for a in arrays]
        self.size = int(sum(self.sizes))

    def flatten(self, record: ArrayRecord, what: str = "model") -> np.ndarray:
        """The arrays of ``record`` concatenated in the layout's key order, as float32."""
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

    def record(self, flat: np.ndarray) -> ArrayRecord:
        """An ``ArrayRecord`` with the layout's keys, shapes and dtypes holding ``flat``."""
        flat = np.asarray(flat).reshape(-1)
        if flat.size != self.size:
            raise ValueError(f"fedselect.flower: a flat model of {flat.size} floats for a layout of {self.size}")
        out: dict[str, Array] = {}
        start = 0
        for key, shape, dtype, n in zip(self.keys, self.shapes, self.dtypes, self.sizes):
            out[key] = Array(np.ascontiguousarray(flat[start : start + n].reshape(shape).astype(dtype, copy=False)))
            start += n
        return ArrayRecord(array_dict=out)


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
    return ArrayRecord(array_dict={k: Array(np.ascontiguousarray(np.asarray(v))) for k, v in items})


def message_bytes(obj: object) -> int:
    """Bytes of a Flower message (or record) as serialised for the wire, its descendants included."""
    deflate = getattr(obj, "deflate", None)
    if deflate is None:
        return 0
    n = len(deflate())
    for child in (getattr(obj, "children", None) or {}).values():
        n += message_bytes(child)
    return n
