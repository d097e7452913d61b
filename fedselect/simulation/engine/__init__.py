"""Vectorised local training and evaluation.

The chosen clients of a round train *together*: their parameters are stacked into one ``(C, D)`` tensor and
every local SGD step is one batched computation for all of them (clients share no parameters, so each gets
exactly its own gradient). Clients whose step counts differ (local epochs over unequal data, partial last
batches) are masked inside the batched step: a padded sample has weight 0 in its client's mean loss, and a
client with no step left does not move. Evaluating every client is one pass over the concatenated evaluation
data with a per-client reduction (``index_add``), never a loop of DataLoaders.

Minibatches of client k in round t come from ``numpy.random.default_rng([seed, t, k])``, so trials and probes
never shift the main stream, and one seed gives the same run bit for bit.

One method trains: :meth:`Engine.train_many` trains the chosen clients of S runs (each from its own global
model, with its own learning rate and dropout generator) as one computation; a single run is S = 1, which
:meth:`Engine.train` is, and :meth:`Engine.train_runs` is S runs with one seeded generator each (for
:func:`fedselect.simulation.batched.fit_runs`). :meth:`Engine.test_runs` tests the models of several runs at
once.

How a local step is computed is chosen once per engine (:func:`.paths.choose_path`), one class per path
sharing one interface (:class:`.base.LocalPath`), as GPyTorch's exact GP chooses its prediction strategy:

- :mod:`.chain_path`: models that are a chain of Flatten / Linear / ReLU / Dropout layers (the built-in
  ``logistic`` and ``mlp``, read by :class:`.chain.LinearChain`) are hand-batched (``baddbmm`` instead of
  ``vmap``); a client whose local steps are done stops computing while its dropout masks are still drawn, so
  the numbers are those of the padded computation bit for bit;
- :mod:`.compiled`: the same chain with each step one ``torch.compile`` graph (``path="compiled"``);
- :mod:`.vmap`: every other model is vmapped, padded, or (with batch statistics, every client carrying its
  own copy of the buffers) grouped by minibatch length, so a padded sample never enters a batch statistic
  (see :meth:`Engine.train` and :func:`aggregate_buffers`).

Devices: an engine lives on one device (``device=``, :func:`~fedselect.devices.resolve_device`: the CPU, a
CUDA GPU, an Apple GPU). Its data is copied there once; a training call copies its minibatch indices there
once and runs its local steps without bringing a value back to the host; its public methods take parameters
on any device and return CPU tensors, numpy arrays and Python numbers. On the CPU every number is the one it
was before devices existed.
"""

from ...devices import DEVICE_CONSTRAINTS, available_devices, device_setting, resolve_device
from .chain import global_dropout_masks as _global_dropout_masks  # noqa: F401 (tests draw masks with it)
from .compiled import compiled_path_refusal
from .core import Engine
from .local import LocalSchedule, LocalTraining, aggregate_buffers
from .losses import LOSSES, resolve_loss

__all__ = [
    "DEVICE_CONSTRAINTS",
    "LOSSES",
    "Engine",
    "LocalSchedule",
    "LocalTraining",
    "aggregate_buffers",
    "available_devices",
    "compiled_path_refusal",
    "device_setting",
    "resolve_device",
    "resolve_loss",
]
