"""Profiles made from parameters: every client the same (:func:`homogeneous`), or drawn (:func:`sample_profiles`).

:func:`sample_profiles` draws each client's device once, from a seed: log-normal compute and
bandwidth, and optional on/off availability; its defaults and their sources are stated in its
docstring and in ``docs/profiles.rst``. :func:`fit_sample_parameters` fits its parameters to
other profiles (for instance a FedScale trace's).
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

import numpy as np
from sklearn.utils import check_random_state

from .._validation import Interval, validate_parameters
from .availability import Availability
from .system import BYTES_PER_KBIT, COMPUTE_FACTOR, MAX_LATENCY, MAX_SECONDS_PER_SAMPLE, MIN_BANDWIDTH, SystemProfiles

__all__ = ["MAX_SPELLS", "fit_sample_parameters", "homogeneous", "sample_profiles"]

# sample_profiles' defaults; where each number comes from is stated in its docstring and docs/profiles.rst.
_FEDSCALE_SECONDS_PER_TRAINED_SAMPLE = 0.005  # get_completion_time_lognormal's mean_seconds_per_sample
_FEDSCALE_LOGNORMAL_MEAN = 1.0  # np.random.lognormal(1, tail_skew) in the same function
_FEDSCALE_TAIL_SKEW = 0.6
COMPUTE_MEDIAN = _FEDSCALE_SECONDS_PER_TRAINED_SAMPLE * math.exp(_FEDSCALE_LOGNORMAL_MEAN) / COMPUTE_FACTOR
BANDWIDTH_MEDIAN_KBPS = 6100.0
BANDWIDTH_SIGMA = 1.1
MAX_SPELLS = 10_000
"""Most on/off cycles :func:`sample_profiles` draws, on average (``horizon / (mean_online + mean_offline)``)."""


_HOMOGENEOUS_CONSTRAINTS: dict[str, list[Any]] = {
    "n_clients": [Interval(Integral, 1, None, closed="left")],
    "seconds_per_sample": [Interval(Real, 0, MAX_SECONDS_PER_SAMPLE, closed="right")],
    "bandwidth": [Interval(Real, MIN_BANDWIDTH, None, closed="left")],
    "latency": [Interval(Real, 0, MAX_LATENCY, closed="both")],
}


def homogeneous(
    n_clients: int,
    *,
    seconds_per_sample: float = COMPUTE_MEDIAN,
    bandwidth: float = BANDWIDTH_MEDIAN_KBPS * BYTES_PER_KBIT,
    latency: float = 0.0,
) -> SystemProfiles:
    """Every client the same device: what a federation without profiles means.

    The defaults are the medians of :func:`sample_profiles` (about 4.5 ms per sample forward
    pass; 6,100 kbit/s = 780,800 bytes/s both ways), so a homogeneous federation runs at the
    speed of the typical sampled device. Always available.

    Parameters
    ----------
    n_clients : int
    seconds_per_sample : float
        Forward-pass seconds per sample.
    bandwidth : float
        Bytes per second, both directions.
    latency : float, default 0
        Seconds per message.

    Returns
    -------
    SystemProfiles

    Examples
    --------
    >>> homogeneous(3, seconds_per_sample=0.01, bandwidth=1e6).round_time([0, 2], 1e6, 1e6, 10).tolist()
    [2.3, 2.3]
    """
    validate_parameters(
        "homogeneous",
        {"n_clients": n_clients, "seconds_per_sample": seconds_per_sample, "bandwidth": bandwidth, "latency": latency},
        _HOMOGENEOUS_CONSTRAINTS,
    )
    n = int(n_clients)
    return SystemProfiles(
        np.full(n, float(seconds_per_sample)),
        np.full(n, float(bandwidth)),
        np.full(n, float(bandwidth)),
        np.full(n, float(latency)),
    )


_SAMPLE_CONSTRAINTS: dict[str, list[Any]] = {
    "n_clients": [Interval(Integral, 1, None, closed="left")],
    "random_state": ["random_state"],
    "compute_median": [Interval(Real, 0, MAX_SECONDS_PER_SAMPLE, closed="right")],
    "compute_sigma": [Interval(Real, 0, None, closed="left")],
    "bandwidth_median": [Interval(Real, MIN_BANDWIDTH, None, closed="left")],
    "bandwidth_sigma": [Interval(Real, 0, None, closed="left")],
    "upload_ratio": [Interval(Real, 0, None, closed="neither")],
    "latency": [Interval(Real, 0, MAX_LATENCY, closed="both")],
    "mean_online": [None, Interval(Real, 0, None, closed="neither")],
    "mean_offline": [Interval(Real, 0, None, closed="neither")],
    "horizon": [Interval(Real, 0, None, closed="neither")],
}


def sample_profiles(
    n_clients: int,
    *,
    random_state: Any = None,
    compute_median: float = COMPUTE_MEDIAN,
    compute_sigma: float = _FEDSCALE_TAIL_SKEW,
    bandwidth_median: float = BANDWIDTH_MEDIAN_KBPS * BYTES_PER_KBIT,
    bandwidth_sigma: float = BANDWIDTH_SIGMA,
    upload_ratio: float = 1.0,
    latency: float = 0.0,
    mean_online: float | None = None,
    mean_offline: float = 3600.0,
    horizon: float = 86400.0,
) -> SystemProfiles:
    """Draw heterogeneous devices: log-normal compute and bandwidth, optional on/off availability.

    Client k's forward pass per sample takes ``compute_median * exp(compute_sigma * z1)``
    seconds and its download bandwidth is ``bandwidth_median * exp(bandwidth_sigma * z2)``
    bytes/s, with independent standard normals z1, z2 (drawn in that order, all z1 first);
    upload = ``upload_ratio`` x download.

    Sources of the defaults (``docs/profiles.rst`` has the details):

    * compute: FedScale's own parametric model, ``ClientMetadata.get_completion_time_lognormal``
      (fedscale/cloud/internal/client_metadata.py, citing PAPAYA): a training sample takes
      0.005 s x LogNormal(1, 0.6); divided by the 3 forward passes of training that is a
      forward pass of median 0.005 e / 3 = 4.53 ms and log-spread 0.6. FedScale redraws it
      at every round; here it is drawn once per client (a device keeps its speed).
    * bandwidth: a log-normal matched to a reading of FedScale's ``client_device_capacity``
      trace (500k devices, MobiPerf measurements): median 6,100 kbit/s and 26 % of devices
      under 3,000 kbit/s, hence sigma = ln(6100 / 3000) / 0.643 = 1.1. The reading is
      third-party and unverified (we could not fetch the trace): convert the trace and refit
      with :func:`fit_sample_parameters` where it matters. Kbit/s become bytes/s with
      FedScale's 128 bytes per kbit. FedScale uses one value for both directions
      (``upload_ratio=1``).
    * latency: none (FedScale has no latency term).
    * availability (off unless ``mean_online`` is given): alternating online / offline spells
      with exponential lengths (means ``mean_online``, ``mean_offline`` seconds) over
      ``[0, horizon)``, repeating with period ``horizon`` (as FedScale repeats its trace
      every ``finish_time``), starting online with the stationary probability
      ``mean_online / (mean_online + mean_offline)``. These parameters are illustrative,
      not fitted to a trace; for real availability use :func:`from_fedscale`.

    Parameters
    ----------
    n_clients : int
    random_state : int, RandomState instance or None
        Seed; the same seed gives the same profiles.
    compute_median, compute_sigma : float
        Median forward-pass seconds per sample and the log-standard deviation.
    bandwidth_median, bandwidth_sigma : float
        Median download bandwidth in bytes/s and the log-standard deviation.
    upload_ratio : float, default 1.0
    latency : float, default 0.0
        Seconds per message, the same for every client.
    mean_online, mean_offline, horizon : float
        Availability model (see above); ``mean_online=None`` keeps every client always online.
        At most :data:`MAX_SPELLS` cycles per client on average (``horizon / (mean_online +
        mean_offline)``); more is refused before drawing.

    Returns
    -------
    SystemProfiles

    Examples
    --------
    >>> p = sample_profiles(10_000, random_state=0)
    >>> round(float(np.median(p.seconds_per_sample)) * 1000, 1)  # ms
    4.5
    >>> sample_profiles(5, random_state=0) == sample_profiles(5, random_state=0)
    True
    """
    params = dict(
        n_clients=n_clients,
        random_state=random_state,
        compute_median=compute_median,
        compute_sigma=compute_sigma,
        bandwidth_median=bandwidth_median,
        bandwidth_sigma=bandwidth_sigma,
        upload_ratio=upload_ratio,
        latency=latency,
        mean_online=mean_online,
        mean_offline=mean_offline,
        horizon=horizon,
    )
    validate_parameters("sample_profiles", params, _SAMPLE_CONSTRAINTS)
    if mean_online is not None and horizon / (mean_online + mean_offline) > MAX_SPELLS:
        raise ValueError(
            f"sample_profiles: mean_online={mean_online!r}, mean_offline={mean_offline!r} and horizon={horizon!r} "
            f"mean about {horizon / (mean_online + mean_offline):.3g} on/off cycles per client; at most {MAX_SPELLS} "
            "are drawn (memory and time grow with them): lengthen the spells or shorten the horizon"
        )
    n = int(n_clients)
    rng = check_random_state(random_state)
    compute = compute_median * np.exp(compute_sigma * rng.standard_normal(n))
    down = bandwidth_median * np.exp(bandwidth_sigma * rng.standard_normal(n))
    av = None
    if mean_online is not None:
        av = _on_off_availability(n, rng, float(mean_online), float(mean_offline), float(horizon))
    return SystemProfiles(compute, down, down * upload_ratio, np.full(n, float(latency)), av)


def _on_off_availability(
    n: int, rng: np.random.RandomState, mean_on: float, mean_off: float, horizon: float
) -> Availability:
    """Alternating exponential on/off spells over [0, horizon), all clients advanced together."""
    online = rng.random_sample(n) < mean_on / (mean_on + mean_off)
    clock = np.zeros(n)
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    owners: list[np.ndarray] = []
    live = np.arange(n)
    for _ in range(4 * MAX_SPELLS + 100):  # about 2 spells per cycle; sample_profiles bounds the mean cycles
        if not live.size:
            break
        on = online[live]
        length = rng.exponential(np.where(on, mean_on, mean_off))
        begin, finish = clock[live], np.minimum(clock[live] + length, horizon)
        keep = on & (finish > begin)
        starts.append(begin[keep])
        ends.append(finish[keep])
        owners.append(live[keep])
        clock[live] = finish
        online[live] = ~on
        live = live[finish < horizon]
    if live.size:
        raise ValueError(f"sample_profiles: more than {4 * MAX_SPELLS + 100} on/off spells for one client; refused")
    owner = np.concatenate(owners)
    order = np.lexsort((np.concatenate(starts), owner))  # by client, then by time
    offsets = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=n))]).astype(np.int64)
    return Availability(offsets, np.concatenate(starts)[order], np.concatenate(ends)[order], horizon)


def fit_sample_parameters(profiles: SystemProfiles) -> dict[str, float]:
    """The :func:`sample_profiles` parameters that match ``profiles``' compute and bandwidth.

    Log-normal fit by the moments of the logarithms (median = exp(mean log), sigma = std
    log); apply it to profiles read from a trace (:func:`from_fedscale`) to calibrate the
    generator. Availability is not fitted.

    Returns
    -------
    dict
        ``compute_median``, ``compute_sigma``, ``bandwidth_median``, ``bandwidth_sigma`` and
        ``upload_ratio`` (the median upload / download ratio).
    """
    if not isinstance(profiles, SystemProfiles):
        raise TypeError(f"fit_sample_parameters: expected SystemProfiles, got {type(profiles).__name__}")
    lc, lb = np.log(profiles.seconds_per_sample), np.log(profiles.download_bandwidth)
    return {
        "compute_median": float(np.exp(lc.mean())),
        "compute_sigma": float(lc.std()),
        "bandwidth_median": float(np.exp(lb.mean())),
        "bandwidth_sigma": float(lb.std()),
        "upload_ratio": float(np.median(profiles.upload_bandwidth / profiles.download_bandwidth)),
    }
