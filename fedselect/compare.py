"""Compare selection schemes over seeds: resumable runs, a table, curves.

The names of :mod:`fedselect.experiments`, where a comparison is built: the plan of its
(scheme, seed) cells (:mod:`~fedselect.experiments.plan`), what identifies a run
(:mod:`~fedselect.experiments.provenance`), how the cells run
(:mod:`~fedselect.experiments.executors`), the results and their files
(:mod:`~fedselect.experiments.results`) and the statistics (:mod:`~fedselect.experiments.stats`).
:func:`run_comparison` (:mod:`fedselect.experiments.run`) puts them together; see it for how
results are written, resumed and failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .experiments.executors import batches, resolve_batch_seeds, share_pools
from .experiments.flower_records import FlowerRecordsError, load_flower_records, read_flower_records
from .experiments.plan import SelectorsArg, check_plan, run_settings, selector_table
from .experiments.plan import slug as _slug  # noqa: F401
from .experiments.provenance import commit as _commit  # noqa: F401
from .experiments.provenance import federation_fingerprint as _federation_fingerprint  # noqa: F401
from .experiments.provenance import machine_info
from .experiments.provenance import run_key as _key  # noqa: F401
from .experiments.results import (
    MAX_CLIENTS,
    MAX_RESULT_BYTES,
    Comparison,
    ResultFileError,
    compress_runs,
    load_comparison,
    read_text,
    run_files,
)
from .experiments.run import run_comparison
from .experiments.stats import holm, paired_summary

# The imports with a leading underscore are names that moved into fedselect.experiments, kept because the CLI,
# tests or benchmarks import them from here (_commit, _federation_fingerprint, _key, _slug; _batches below).
__all__ = [
    "MAX_CLIENTS",
    "MAX_RESULT_BYTES",
    "Comparison",
    "FlowerRecordsError",
    "ResultFileError",
    "SelectorsArg",
    "check_plan",
    "compress_runs",
    "holm",
    "load_comparison",
    "load_flower_records",
    "machine_info",
    "paired_summary",
    "read_flower_records",
    "read_text",
    "resolve_batch_seeds",
    "run_comparison",
    "run_files",
    "run_settings",
    "selector_table",
    "share_pools",
]


def _batches(todo: Sequence[Any], size: int) -> list[list[int]]:
    """:func:`~fedselect.experiments.executors.batches` of cells given as tuples ``(seed, label, ...)``."""
    return batches([item[1] for item in todo], size)
