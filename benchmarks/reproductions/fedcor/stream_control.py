"""A control for the compiled path's verdict check: the eager path with another dropout stream.

The compiled runs differ from the stored eager table's in three ways: float rounding (inductor's kernels), the
dropout masks (drawn as ``torch.rand < 1 - p`` instead of ``bernoulli_``) and, run with ``--batch-seeds``, the
summation order of batched evaluation (the stored eager runs ran one at a time). Loaded as a plugin (``--plugin``),
this file makes the *eager* path draw its dropout masks from other seeds (the trainer's per-round dropout seed with
another tag; the data, the partition, the initial model, the minibatches and the selectors' streams are
untouched); run with ``--batch-seeds`` too, its runs then differ from the stored eager ones in the dropout stream
and the batched rounding, not in compilation. If the eager table's verdicts also change under this control, a
verdict that changes on the compiled path says nothing about compilation: the table's verdicts are not stable
under another dropout stream and rounding at 10 seeds.

Usage (the runs go to a folder of their own; their settings keys are the eager runs', so never into the
eager table's folder)::

    fedselect reproduce fedcor-fmnist-dir --plugin benchmarks/reproductions/fedcor/stream_control.py \\
        --batch-seeds --threads 1 --selectors ... --out benchmarks/reproductions/fedcor/compiled/control-dir
"""

from __future__ import annotations

from typing import Any

import numpy as np

import fedselect
from fedselect.simulation.setup import RunSetup

STREAM_TAG = 1000  # added to the trainer's tag (0 main, 1 trial, 2 other): seeds no eager run draws


def _other_dropout_seed(self: RunSetup, round: int, purpose: str) -> int:
    tag = {"main": 0, "trial": 1}.get(purpose, 2) + STREAM_TAG
    return int(np.random.SeedSequence([int(self.seeds[0]), round, tag]).generate_state(1)[0])


RunSetup.dropout_seed = _other_dropout_seed  # type: ignore[method-assign]


@fedselect.hookimpl
def register_selectors(register: Any) -> None:
    """Registers nothing: the plugin mechanism loads files that implement a hook, and this one changes a stream."""
