"""Device and network profiles of a federation's clients: how fast each computes and talks, and when it is online.

A :class:`SystemProfiles` holds, per client, the seconds one forward pass on one sample takes,
the download and upload bandwidth in bytes per second, a latency per message, and (optionally)
an :class:`Availability`: on/off intervals over simulated time. Its one piece of arithmetic is
:meth:`SystemProfiles.round_time`, FedScale's completion-time model (Lai et al., ICML 2022)::

    seconds = compute_factor * n_samples * seconds_per_sample     (compute; 3 for training, 1 to evaluate)
            + bytes_down / download_bandwidth + bytes_up / upload_bandwidth
            + 2 * latency                                          (one message each way)

Sources of profiles:

* :func:`homogeneous`: every client the same (the default of a federation without profiles);
* :func:`sample_profiles`: a seeded parametric draw whose distributions and their sources are
  stated in its docstring and in ``docs/profiles.rst``;
* :func:`from_fedscale`: FedScale's device-capacity and availability traces, after a one-time,
  explicit conversion of FedScale's pickles by :func:`convert_fedscale_traces` (which refuses
  every pickle global but plain containers, numbers, strings and numpy number scalars). The
  library itself only reads plain ``.npz`` / ``.json`` files, with ``allow_pickle=False``.

Memory is O(N + number of availability intervals): a few float64 arrays of length N and the
intervals in CSR form (per-client offsets into flat start / end arrays).

Run ``python -m fedselect.profiles convert-fedscale SRC DST`` to convert one FedScale file.

Where each part lives: :mod:`~fedselect.profiles.system` (:class:`SystemProfiles`, its units,
bounds, time model and files), :mod:`~fedselect.profiles.availability` (:class:`Availability`),
:mod:`~fedselect.profiles.sampling` (:func:`homogeneous`, :func:`sample_profiles`,
:func:`fit_sample_parameters`), :mod:`~fedselect.profiles.fedscale` (FedScale's traces and the
conversion command) and :mod:`~fedselect.profiles.files` (the ``.npz`` formats and their reader).
"""

from .availability import Availability
from .fedscale import convert_fedscale_traces, from_fedscale, main  # noqa: F401  (main: re-exported as before)
from .sampling import MAX_SPELLS, fit_sample_parameters, homogeneous, sample_profiles
from .system import (
    BYTES_PER_KBIT,
    COMPUTE_FACTOR,
    MAX_LATENCY,
    MAX_SECONDS_PER_SAMPLE,
    MIN_BANDWIDTH,
    SystemProfiles,
)

__all__ = [
    "BYTES_PER_KBIT",
    "COMPUTE_FACTOR",
    "MAX_LATENCY",
    "MAX_SECONDS_PER_SAMPLE",
    "MAX_SPELLS",
    "MIN_BANDWIDTH",
    "Availability",
    "SystemProfiles",
    "convert_fedscale_traces",
    "fit_sample_parameters",
    "from_fedscale",
    "homogeneous",
    "sample_profiles",
]
