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
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import pickle
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from numbers import Integral, Real
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.utils import check_random_state

from ._npy import read_npy_member
from ._pickle_scan import scan_pickle
from ._validation import Interval, StrOptions, validate_parameters
from .selection import check_client_ids

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

COMPUTE_FACTOR = 3.0
"""Training a sample costs this many forward passes (FedScale's ``augmentation_factor``: backward ~ 2 x forward)."""

BYTES_PER_KBIT = 128.0
"""Bytes in one kbit as FedScale counts it: its model size is ``len(pickle) / 1024 * 8`` kbit, so 1 kbit = 128 bytes."""

_FORMAT = "fedselect.system-profiles"
_TRACE_FORMAT = "fedselect.fedscale-trace"
_VERSION = 1

# sample_profiles' defaults; where each number comes from is stated in its docstring and docs/profiles.rst.
_FEDSCALE_SECONDS_PER_TRAINED_SAMPLE = 0.005  # get_completion_time_lognormal's mean_seconds_per_sample
_FEDSCALE_LOGNORMAL_MEAN = 1.0  # np.random.lognormal(1, tail_skew) in the same function
_FEDSCALE_TAIL_SKEW = 0.6
COMPUTE_MEDIAN = _FEDSCALE_SECONDS_PER_TRAINED_SAMPLE * math.exp(_FEDSCALE_LOGNORMAL_MEAN) / COMPUTE_FACTOR
BANDWIDTH_MEDIAN_KBPS = 6100.0
BANDWIDTH_SIGMA = 1.1

# Bounds that keep every simulated duration finite: with at most 1e13 bytes per message and 1e12 samples per
# exchange, one exchange lasts at most about 1e19 s (a float64 holds 1.8e308); anything outside them is a typo
# or a unit error (1e-310 bytes/s gives 1 / 1e-310 = inf), refused with the field's name before any training.
MIN_BANDWIDTH = 1e-6
"""Smallest bandwidth a profile may declare, in bytes per second."""
MAX_SECONDS_PER_SAMPLE = 1e6
"""Largest forward-pass time per sample a profile may declare, in seconds."""
MAX_LATENCY = 1e9
"""Largest latency per message a profile may declare, in seconds."""
MAX_SPELLS = 10_000
"""Most on/off cycles :func:`sample_profiles` draws, on average (``horizon / (mean_online + mean_offline)``)."""


# --------------------------------------------------------------------------- checks


def _float_array(
    owner: str,
    name: str,
    values: Any,
    n: int | None,
    *,
    positive: bool = True,
    low: float | None = None,
    high: float | None = None,
) -> np.ndarray:
    """``values`` as a read-only 1-D float64 array of length ``n``, finite and positive (or >= 0), within
    ``[low, high]`` where given."""
    try:
        arr = np.array(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: an integer such as 10**400
        raise ValueError(f"{owner}: {name} must be an array of numbers, got {values!r:.80} ({exc})") from exc
    if isinstance(values, np.ndarray) and values.dtype.kind not in "biuf":
        raise ValueError(f"{owner}: {name} must hold numbers, got dtype {values.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{owner}: {name} must be 1-D (one value per client), got shape {arr.shape}")
    if n is not None and arr.size != n:
        raise ValueError(f"{owner}: {name} has {arr.size} entries but there are {n} clients")
    bad = ~np.isfinite(arr) | ((arr <= 0) if positive else (arr < 0))
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        what = "finite positive" if positive else "finite non-negative"
        raise ValueError(f"{owner}: {name} must hold {what} numbers; entry {k} is {float(arr[k])!r}")
    out = ((arr < low) if low is not None else False) | ((arr > high) if high is not None else False)
    if np.any(out):
        k = int(np.flatnonzero(np.broadcast_to(out, arr.shape))[0])
        raise ValueError(
            f"{owner}: {name} must be {f'at least {low:g}' if low is not None else f'at most {high:g}'} so that every "
            f"simulated time stays finite; entry {k} is {float(arr[k])!r}"
        )
    arr.setflags(write=False)
    return arr


def _times(t: Any, m: int, what: str) -> np.ndarray:
    arr = np.asarray(t, dtype=np.float64)
    if arr.ndim > 1 or (arr.ndim == 1 and arr.size != m):
        raise ValueError(f"{what}: t must be a number or one number per client ({m}), got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{what}: t must be finite, got {t!r:.80}")
    return np.broadcast_to(arr, (m,))


def _per_client(owner: str, name: str, value: Any, m: int) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim > 1 or (arr.ndim == 1 and arr.size != m):
        raise ValueError(f"{owner}: {name} must be a number or one number per client ({m}), got shape {arr.shape}")
    if not (np.isfinite(arr).all() and (arr >= 0).all()):
        raise ValueError(f"{owner}: {name} must be finite and non-negative, got {value!r:.80}")
    return np.broadcast_to(arr, (m,))


# --------------------------------------------------------------------------- availability


def _first_start_after(starts: np.ndarray, lo: np.ndarray, hi: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per query, the first flat index in ``[lo, hi)`` whose start exceeds ``x`` (``hi`` if none).

    A binary search run on all queries at once: about log2(longest segment) vectorised steps.
    """
    lo, hi = lo.copy(), hi.copy()
    if starts.size == 0:
        return hi
    top = starts.size - 1
    while True:
        open_ = lo < hi
        if not open_.any():
            return lo
        mid = (lo + hi) // 2
        right = open_ & (starts[np.minimum(mid, top)] <= x)
        lo = np.where(right, mid + 1, lo)
        hi = np.where(open_ & ~right, mid, hi)


class Availability:
    """When each client is online: half-open intervals ``[start, end)`` of simulated seconds, per client.

    Stored compactly (CSR): client k's intervals are ``starts[offsets[k]:offsets[k + 1]]`` and
    ``ends[...]``, sorted and non-overlapping (touching is allowed). With a finite
    ``period[k]`` (FedScale's ``finish_time``) client k's pattern repeats: it is online at
    time t when ``t mod period[k]`` lies in one of its intervals, which then lie in
    ``[0, period[k]]``; ``inf`` means no repetition. A client without intervals is never online.

    Parameters
    ----------
    offsets : array-like of int, shape (N + 1,)
        ``offsets[0] == 0``, non-decreasing, ``offsets[N]`` = number of intervals.
    starts, ends : array-like of float, shape (offsets[N],)
        Interval bounds in seconds, ``0 <= start < end``.
    period : float, array-like of float, shape (N,), or None
        Per-client repetition period (positive; ``inf`` = none). None: no client repeats.

    Attributes
    ----------
    n_clients : int
    n_intervals : int

    Examples
    --------
    >>> av = Availability.from_intervals([[(0, 10), (20, 30)], []], period=[40, np.inf])
    >>> av.available([0, 0, 0, 1], [5, 10, 45, 0]).tolist()
    [True, False, True, False]
    >>> av.next_available([0, 0, 1], [12, 35, 0]).tolist()
    [20.0, 40.0, inf]
    """

    def __init__(self, offsets: Any, starts: Any, ends: Any, period: Any = None) -> None:
        owner = "Availability"
        off = np.asarray(offsets)
        if off.ndim != 1 or off.size < 2 or off.dtype.kind not in "iu":
            raise ValueError(f"{owner}: offsets must be a 1-D integer array of length N + 1 >= 2, got {off!r:.80}")
        off = off.astype(np.int64)
        if off[0] != 0 or (np.diff(off) < 0).any():
            raise ValueError(f"{owner}: offsets must start at 0 and never decrease")
        n = off.size - 1
        s = _float_array(owner, "starts", starts, None, positive=False)
        e = _float_array(owner, "ends", ends, None, positive=False)
        if s.size != e.size or s.size != off[-1]:
            raise ValueError(
                f"{owner}: starts has {s.size} and ends {e.size} entries but offsets[-1] is {off[-1]}; all three "
                "must agree"
            )
        if (e <= s).any():
            i = int(np.flatnonzero(e <= s)[0])
            raise ValueError(f"{owner}: interval {i} is [{s[i]}, {e[i]}); each interval needs start < end")
        follows = np.ones(s.size, dtype=bool)  # interval i + 1 belongs to the same client as interval i
        follows[off[1:-1][off[1:-1] < s.size]] = False
        clash = np.flatnonzero(follows[1:] & (s[1:] < e[:-1]))
        if clash.size:
            i = int(clash[0])
            k = int(np.searchsorted(off, i, side="right") - 1)
            raise ValueError(
                f"{owner}: client {k}'s intervals [{s[i]}, {e[i]}) and [{s[i + 1]}, {e[i + 1]}) overlap or are not "
                "sorted; give sorted, non-overlapping intervals"
            )
        if period is None:
            per = np.full(n, np.inf)
        else:
            try:
                per = np.array(period, dtype=np.float64)
            except (TypeError, ValueError, OverflowError) as exc:
                raise ValueError(f"{owner}: period must be numbers (inf: no repetition), got {period!r:.80}") from exc
            if per.ndim == 0:
                per = np.full(n, float(per))
            if per.shape != (n,):
                raise ValueError(f"{owner}: period must be a number or one per client ({n}), got shape {per.shape}")
            if np.isnan(per).any() or (per <= 0).any():
                raise ValueError(f"{owner}: period must be positive (inf: no repetition), got {period!r:.80}")
        owner_of = np.repeat(np.arange(n), np.diff(off))
        beyond = e > per[owner_of]
        if beyond.any():
            i = int(np.flatnonzero(beyond)[0])
            raise ValueError(
                f"{owner}: client {int(owner_of[i])}'s interval [{s[i]}, {e[i]}) ends after its period "
                f"{per[owner_of[i]]}"
            )
        for arr in (off, per):
            arr.setflags(write=False)
        self.offsets, self.starts, self.ends, self.period = off, s, e, per

    @classmethod
    def from_intervals(cls, intervals: Sequence[Sequence[tuple[float, float]]], period: Any = None) -> Availability:
        """Build from one list of ``(start, end)`` pairs per client."""
        counts = [len(iv) for iv in intervals]
        flat = [pair for iv in intervals for pair in iv]
        pairs = np.asarray(flat, dtype=np.float64).reshape(-1, 2) if flat else np.zeros((0, 2))
        offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        return cls(offsets, pairs[:, 0], pairs[:, 1], period)

    @property
    def n_clients(self) -> int:
        """N, the number of clients."""
        return self.offsets.size - 1

    @property
    def n_intervals(self) -> int:
        """Total number of intervals over all clients."""
        return int(self.starts.size)

    def intervals(self, client: int) -> np.ndarray:
        """Client ``client``'s intervals, shape (k, 2)."""
        (c,) = check_client_ids(client, self.n_clients, what="Availability.intervals")
        a, b = self.offsets[c], self.offsets[c + 1]
        return np.stack([self.starts[a:b], self.ends[a:b]], axis=1)

    def _locate(self, clients: Any, t: Any, what: str) -> tuple[np.ndarray, ...]:
        c = check_client_ids(clients, self.n_clients, what=what)
        t = _times(t, c.size, what)
        per = self.period[c]
        periodic = np.isfinite(per)
        tau = np.where(periodic, np.mod(t, np.where(periodic, per, 1.0)), t)
        lo, hi = self.offsets[c], self.offsets[c + 1]
        first = _first_start_after(self.starts, lo, hi, tau)
        last = first - 1  # the last interval starting at or before tau, if >= lo
        safe = np.clip(last, 0, max(self.starts.size - 1, 0))
        inside = (last >= lo) & (tau < (self.ends[safe] if self.starts.size else np.zeros_like(tau)))
        return c, t, tau, per, periodic, lo, hi, first, inside

    def available(self, clients: Any, t: Any) -> np.ndarray:
        """Whether each client is online at time ``t`` (a number, or one per client); bool array."""
        return self._locate(clients, t, "Availability.available")[-1]

    def next_available(self, clients: Any, t: Any) -> np.ndarray:
        """The earliest time >= ``t`` each client is online (``t`` itself if online now; ``inf`` if never)."""
        c, t, tau, per, periodic, lo, hi, first, inside = self._locate(clients, t, "Availability.next_available")
        base = t - tau  # the start of the current period (t itself when not periodic)
        out = np.full(c.size, np.inf)
        out[inside] = t[inside]
        later = ~inside & (first < hi)
        out[later] = base[later] + self.starts[first[later]]
        wrap = ~inside & ~later & periodic & (hi > lo)
        out[wrap] = base[wrap] + per[wrap] + self.starts[lo[wrap]]
        return out

    def subset(self, clients: Any) -> Availability:
        """The availability of ``clients`` (in that order; repeats allowed), renumbered 0..len-1."""
        c = check_client_ids(clients, self.n_clients, what="Availability.subset")
        counts = self.offsets[c + 1] - self.offsets[c]
        new_off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        idx = np.repeat(self.offsets[c] - new_off[:-1], counts) + np.arange(new_off[-1])
        return Availability(new_off, self.starts[idx], self.ends[idx], self.period[c])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Availability):
            return NotImplemented
        return all(
            np.array_equal(a, b)
            for a, b in (
                (self.offsets, other.offsets),
                (self.starts, other.starts),
                (self.ends, other.ends),
                (self.period, other.period),
            )
        )

    __hash__ = None  # type: ignore[assignment]  # mutable-looking container of arrays

    def __repr__(self) -> str:
        return f"Availability(n_clients={self.n_clients}, n_intervals={self.n_intervals})"


# --------------------------------------------------------------------------- profiles


class SystemProfiles:
    """Per-client compute speed, bandwidth, latency and availability: what a clock needs to time a round.

    Parameters
    ----------
    seconds_per_sample : array-like of float, shape (N,)
        Seconds one forward pass on one sample takes on client k (FedScale's ``computation``,
        its "inference latency" in ms per sample, divided by 1000). Training costs
        :data:`COMPUTE_FACTOR` (3) times this per sample.
    download_bandwidth, upload_bandwidth : array-like of float, shape (N,)
        Bytes per second to and from client k (FedScale's ``communication`` in kbit/s times
        :data:`BYTES_PER_KBIT`, the same value both ways).
    latency : array-like of float, shape (N,), optional
        Seconds added to every message to or from client k (default 0: FedScale has none).
    availability : Availability, optional
        When each client is online; None: always.

    Attributes
    ----------
    n_clients : int

    Notes
    -----
    Every array is float64, read-only and of length N; availability adds O(number of
    intervals). Positive, finite speeds and bandwidths, finite non-negative latencies, within
    bounds that keep every simulated time finite (bandwidths at least :data:`MIN_BANDWIDTH`
    bytes/s, ``seconds_per_sample`` at most :data:`MAX_SECONDS_PER_SAMPLE`, latencies at most
    :data:`MAX_LATENCY`): anything else raises ValueError naming the field and the entry.

    Examples
    --------
    >>> p = SystemProfiles([0.01, 0.02], [1e6, 2e6], [5e5, 1e6])
    >>> p.round_time([0, 1], bytes_down=1e6, bytes_up=1e6, n_samples=100).tolist()  # 3*100*0.01 + 1 + 2
    [6.0, 7.5]
    """

    def __init__(
        self,
        seconds_per_sample: Any,
        download_bandwidth: Any,
        upload_bandwidth: Any,
        latency: Any = None,
        availability: Availability | None = None,
    ) -> None:
        owner = "SystemProfiles"
        self.seconds_per_sample = _float_array(
            owner, "seconds_per_sample", seconds_per_sample, None, high=MAX_SECONDS_PER_SAMPLE
        )
        n = self.seconds_per_sample.size
        if n == 0:
            raise ValueError(f"{owner}: profiles need at least one client")
        self.download_bandwidth = _float_array(owner, "download_bandwidth", download_bandwidth, n, low=MIN_BANDWIDTH)
        self.upload_bandwidth = _float_array(owner, "upload_bandwidth", upload_bandwidth, n, low=MIN_BANDWIDTH)
        self.latency = _float_array(
            owner, "latency", np.zeros(n) if latency is None else latency, n, positive=False, high=MAX_LATENCY
        )
        if availability is not None:
            if not isinstance(availability, Availability):
                raise TypeError(
                    f"{owner}: availability must be an Availability or None, got {type(availability).__name__}"
                )
            if availability.n_clients != n:
                raise ValueError(f"{owner}: availability covers {availability.n_clients} clients but there are {n}")
        self.availability = availability

    @property
    def n_clients(self) -> int:
        """N, the number of clients."""
        return int(self.seconds_per_sample.size)

    def __len__(self) -> int:
        return self.n_clients

    def available(self, clients: Any, t: Any) -> np.ndarray:
        """Whether each of ``clients`` is online at time ``t`` (a number or one per client)."""
        if self.availability is not None:
            return self.availability.available(clients, t)
        c = check_client_ids(clients, self.n_clients, what="SystemProfiles.available")
        _times(t, c.size, "SystemProfiles.available")
        return np.ones(c.size, dtype=bool)

    def next_available(self, clients: Any, t: Any) -> np.ndarray:
        """The earliest time >= ``t`` each of ``clients`` is online (``inf``: never again)."""
        if self.availability is not None:
            return self.availability.next_available(clients, t)
        c = check_client_ids(clients, self.n_clients, what="SystemProfiles.next_available")
        return np.array(_times(t, c.size, "SystemProfiles.next_available"))

    def round_time(
        self,
        clients: Any,
        bytes_down: Any,
        bytes_up: Any,
        n_samples: Any,
        *,
        compute_factor: float = COMPUTE_FACTOR,
        parts: bool = False,
    ) -> np.ndarray | dict[str, np.ndarray]:
        """Seconds each client needs for one exchange: download, compute, upload (FedScale's model).

        ``compute_factor * n_samples * seconds_per_sample + bytes_down / download_bandwidth
        + bytes_up / upload_bandwidth + 2 * latency``. A pure function of its arguments: no
        clock, no availability (the caller checks that a client is still online at the
        clock plus this duration).

        Parameters
        ----------
        clients : array-like of int
        bytes_down, bytes_up : float or array-like of float
            Bytes sent to / received from each client (one number for all, or one each).
        n_samples : float or array-like of float
            Samples each client processes: batch size x local steps when training
            (FedScale's count), the samples evaluated when answering a loss query.
        compute_factor : float, default 3.0
            Forward-pass equivalents per sample: 3 to train (FedScale), 1 to evaluate.
        parts : bool, default False
            Return a dict of the ``download``, ``compute``, ``upload``, ``latency`` and
            ``total`` arrays instead of the total.

        Returns
        -------
        ndarray of float64, shape (len(clients),), or dict of them
        """
        owner = "SystemProfiles.round_time"
        c = check_client_ids(clients, self.n_clients, what=owner)
        ok = isinstance(compute_factor, Real) and not isinstance(compute_factor, bool)
        if not (ok and math.isfinite(compute_factor) and compute_factor >= 0):
            raise ValueError(f"{owner}: compute_factor must be a finite number >= 0, got {compute_factor!r}")
        with np.errstate(over="ignore"):  # an overflow is refused just below, naming the client
            down = _per_client(owner, "bytes_down", bytes_down, c.size) / self.download_bandwidth[c]
            up = _per_client(owner, "bytes_up", bytes_up, c.size) / self.upload_bandwidth[c]
            compute = compute_factor * _per_client(owner, "n_samples", n_samples, c.size) * self.seconds_per_sample[c]
            lat = 2.0 * self.latency[c]
            total = down + compute + up + lat
        if not np.isfinite(total).all():  # the profiles are bounded: only astronomical bytes or samples get here
            i = int(np.flatnonzero(~np.isfinite(total))[0])
            raise ValueError(
                f"{owner}: client {int(c[i])}'s exchange would last {total[i]} s (bytes_down={bytes_down!r:.40}, "
                f"bytes_up={bytes_up!r:.40}, n_samples={n_samples!r:.40}); every simulated time must be finite"
            )
        if parts:
            return {"download": down, "compute": compute, "upload": up, "latency": lat, "total": total}
        return total

    def subset(self, clients: Any) -> SystemProfiles:
        """The profiles of ``clients`` (in that order), renumbered 0..len-1."""
        c = check_client_ids(clients, self.n_clients, what="SystemProfiles.subset")
        if c.size == 0:
            raise ValueError("SystemProfiles.subset: needs at least one client")
        av = None if self.availability is None else self.availability.subset(c)
        return SystemProfiles(
            self.seconds_per_sample[c], self.download_bandwidth[c], self.upload_bandwidth[c], self.latency[c], av
        )

    def _arrays(self) -> dict[str, np.ndarray]:
        out = {
            "seconds_per_sample": self.seconds_per_sample,
            "download_bandwidth": self.download_bandwidth,
            "upload_bandwidth": self.upload_bandwidth,
            "latency": self.latency,
        }
        if self.availability is not None:
            av = self.availability
            out.update(
                availability_offsets=av.offsets,
                availability_starts=av.starts,
                availability_ends=av.ends,
                availability_period=av.period,
            )
        return out

    def fingerprint(self) -> str:
        """A short SHA-256 of the content (for run keys: equal profiles, equal fingerprint)."""
        h = hashlib.sha256()
        for name, arr in self._arrays().items():
            a = np.ascontiguousarray(arr)
            h.update(f"{name}:{a.dtype.str}{a.shape}".encode())
            h.update(a.view(np.uint8).reshape(-1) if a.size else b"")
        return h.hexdigest()[:16]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SystemProfiles):
            return NotImplemented
        mine, theirs = self._arrays(), other._arrays()
        return mine.keys() == theirs.keys() and all(np.array_equal(mine[k], theirs[k]) for k in mine)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        med = np.median
        return (
            f"SystemProfiles(n_clients={self.n_clients}, median seconds_per_sample={med(self.seconds_per_sample):.3g}, "
            f"median download={med(self.download_bandwidth):.3g} B/s, median upload={med(self.upload_bandwidth):.3g} "
            f"B/s, availability={'always' if self.availability is None else self.availability.n_intervals}"
            f"{'' if self.availability is None else ' intervals'})"
        )

    # ------------------------------------------------------------------ plain formats

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of lists (an infinite period is written as None)."""
        out: dict[str, Any] = {"format": _FORMAT, "version": _VERSION, "n_clients": self.n_clients}
        for name, arr in self._arrays().items():
            if name == "availability_period":
                out[name] = [None if math.isinf(p) else float(p) for p in arr.tolist()]
            else:
                out[name] = arr.tolist()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SystemProfiles:
        """Rebuild from :meth:`to_dict`'s dict (validated like the constructor)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"SystemProfiles.from_dict: expected a mapping, got {type(data).__name__}")
        if data.get("format") != _FORMAT or data.get("version") != _VERSION:
            raise ValueError(
                f"SystemProfiles.from_dict: not a profiles record (format {data.get('format')!r}, version "
                f"{data.get('version')!r}; expected {_FORMAT!r}, {_VERSION})"
            )
        keys = {
            "format",
            "version",
            "n_clients",
            "seconds_per_sample",
            "download_bandwidth",
            "upload_bandwidth",
            "latency",
            "availability_offsets",
            "availability_starts",
            "availability_ends",
            "availability_period",
        }
        unknown = set(data) - keys
        if unknown:
            raise ValueError(f"SystemProfiles.from_dict: unknown entries {sorted(map(str, unknown))}")
        av_keys = [k for k in keys if k.startswith("availability_")]
        present = [k in data for k in av_keys]
        if any(present) and not all(present):
            raise ValueError(f"SystemProfiles.from_dict: availability needs all of {sorted(av_keys)}")
        for k in ("seconds_per_sample", "download_bandwidth", "upload_bandwidth", "latency"):
            if k not in data:
                raise ValueError(f"SystemProfiles.from_dict: missing {k!r}")
        av = None
        if all(present):
            period = data["availability_period"]
            if isinstance(period, list):
                period = [np.inf if p is None else p for p in period]
            av = Availability(
                data["availability_offsets"], data["availability_starts"], data["availability_ends"], period
            )
        profiles = cls(
            data["seconds_per_sample"], data["download_bandwidth"], data["upload_bandwidth"], data["latency"], av
        )
        count = data.get("n_clients")
        if "n_clients" in data and not (
            (isinstance(count, Integral) and not isinstance(count, bool))
            or (isinstance(count, np.ndarray) and count.shape == () and count.dtype.kind in "iu")
        ):
            raise ValueError(f"SystemProfiles.from_dict: n_clients must be a whole number of clients, not {count!r:.9}")
        if "n_clients" in data and int(count) != profiles.n_clients:
            raise ValueError(
                f"SystemProfiles.from_dict: n_clients={data['n_clients']} but the arrays hold "
                f"{profiles.n_clients} clients"
            )
        return profiles

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write to ``path``: ``.npz`` (numpy arrays, no pickles) or ``.json``. Returns the path."""
        path = Path(path)
        if path.suffix == ".json":
            path.write_text(json.dumps(self.to_dict()))
        elif path.suffix == ".npz":
            with open(path, "wb") as fh:
                np.savez(
                    fh,
                    format=np.array(_FORMAT),
                    version=np.array(_VERSION),
                    n_clients=np.array(self.n_clients),
                    **self._arrays(),
                )
        else:
            raise ValueError(f"SystemProfiles.save: {path} must end in .npz or .json")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SystemProfiles:
        """Read a file written by :meth:`save` (never unpickles: ``np.load(allow_pickle=False)`` / JSON)."""
        path = Path(path)
        if path.suffix == ".json":
            try:
                data = json.loads(path.read_text())
            except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # bad JSON, huge integers, deep nesting
                raise ValueError(f"{path}: not a profiles JSON file ({type(exc).__name__}: {exc})") from exc
        elif path.suffix == ".npz":
            data = _read_npz(path, _FORMAT)
        else:
            raise ValueError(f"SystemProfiles.load: {path} must end in .npz or .json")
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError, OverflowError) as exc:  # every message names the field; this adds the file
            raise ValueError(f"{path}: {str(exc).removeprefix('SystemProfiles.from_dict: ')}") from exc


_NPZ_MEMBERS = {
    _FORMAT: frozenset(
        "format version n_clients seconds_per_sample download_bandwidth upload_bandwidth latency availability_offsets "
        "availability_starts availability_ends availability_period".split()
    ),
    _TRACE_FORMAT: frozenset(
        "format version kind keys computation_ms communication_kbps offsets starts ends finish_time model".split()
    ),
}
# A member may unpack to this many times its compressed size (plus 64 KiB): np.savez stores members uncompressed.
_NPZ_RATIO = 16


def _npz_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    """One ``.npy`` member, its header checked against the member's size before anything is allocated."""
    return read_npy_member(zf, info)


def _read_npz(path: Path, fmt: str) -> dict[str, Any]:
    """The expected members of a ``.npz`` written by fedselect, each size checked before it is read.

    Member names outside the format's list, members that unpack to more than 16x their
    compressed size (+ 64 KiB) and ``.npy`` headers that disagree with their member's size are
    refused before anything of the claimed size is allocated; no pickle is ever read.
    """
    expected = _NPZ_MEMBERS[fmt]
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            for info in infos:
                key = info.filename.removesuffix(".npy")
                if key == info.filename or key not in expected:
                    raise ValueError(f"unexpected member {info.filename!r}")
                if info.file_size > _NPZ_RATIO * info.compress_size + 2**16:
                    raise ValueError(
                        f"member {info.filename!r} unpacks to {info.file_size} bytes from {info.compress_size} "
                        f"(more than {_NPZ_RATIO}x)"
                    )
            data = {info.filename.removesuffix(".npy"): _npz_member(zf, info) for info in infos}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:  # object arrays: ValueError
        raise ValueError(f"{path}: not a readable .npz of plain arrays ({exc})") from exc
    found = str(data["format"]) if "format" in data and data["format"].dtype.kind == "U" else None
    version = data.get("version")
    if (
        found != fmt
        or version is None
        or version.shape != ()
        or version.dtype.kind not in "iu"
        or int(version) != _VERSION
    ):
        raise ValueError(f"{path}: format {found!r} version {version!r}; expected {fmt!r} version {_VERSION}")
    for k, arr in data.items():
        if k != "format" and arr.dtype.kind not in "biufU":
            raise ValueError(f"{path}: entry {k!r} has dtype {arr.dtype}; expected numbers or strings")
    data["format"], data["version"] = fmt, _VERSION
    return data


# --------------------------------------------------------------------------- sources


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


# --------------------------------------------------------------------------- FedScale traces


def _np_scalar_function() -> Any:
    return np.float64(0).__reduce__()[0]  # numpy's ``scalar`` rebuilder, wherever this numpy keeps it


def _trace_dtype(spec: Any, align: bool = False, copy: bool = False) -> np.dtype:
    dtype = np.dtype(spec, align, copy)
    if dtype.kind not in "biuf":
        raise pickle.UnpicklingError(f"refused numpy dtype {dtype}: a FedScale trace holds only numbers")
    return dtype


def _trace_scalar(dtype: Any, *args: Any) -> Any:
    if (
        not isinstance(dtype, np.dtype)
        or dtype.kind not in "biuf"
        or len(args) != 1
        or not isinstance(args[0], bytes | str)
    ):
        raise pickle.UnpicklingError("refused a numpy scalar other than a plain number")
    return _np_scalar_function()(dtype, *args)


def _trace_latin1(text: Any, encoding: str = "utf-8") -> bytes:
    if not isinstance(text, str) or encoding != "latin1":
        raise pickle.UnpicklingError("refused _codecs.encode other than latin1 text")
    return text.encode("latin1")


_TRACE_GLOBALS = {
    ("numpy", "dtype"): _trace_dtype,
    ("numpy.core.multiarray", "scalar"): _trace_scalar,
    ("numpy._core.multiarray", "scalar"): _trace_scalar,
    ("_codecs", "encode"): _trace_latin1,
}


class _TraceUnpickler(pickle.Unpickler):
    """Reads a FedScale trace pickle: dicts, lists, tuples, str, numbers, numpy number scalars.

    Every other global (``os.system``, ``builtins.eval``, any class or function, numpy
    arrays, object dtypes) raises :class:`pickle.UnpicklingError` before it is called, so
    a planted file cannot run code through this reader.
    """

    def find_class(self, module: str, name: str) -> Any:
        obj = _TRACE_GLOBALS.get((module, name))
        if obj is None:
            raise pickle.UnpicklingError(
                f"refused global {module}.{name}: a FedScale trace holds only dicts, lists, strings and numbers"
            )
        return obj


def _check_unshared(data: dict[Any, Any], src: Path) -> None:
    """Refuse a trace whose entries, or their lists, are one object referenced by several clients.

    FedScale's files hold one entry per client; a pickle's memo lets a small file name one entry
    for every client, which conversion would copy out to a file many times larger.
    """
    seen: dict[int, Any] = {}
    for k, entry in data.items():
        parts = [entry, *(entry.get(f) for f in ("active", "inactive"))] if isinstance(entry, dict) else [entry]
        for part in parts:
            if isinstance(part, dict | list):
                if id(part) in seen:
                    raise ValueError(
                        f"{src}: clients {seen[id(part)]!r} and {k!r} share one entry object (a pickle memo "
                        "reference): refused, each client has its own entry in a FedScale trace"
                    )
                seen[id(part)] = k


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real | np.number):
        raise ValueError(f"{where} must be a number, got {value!r:.60}")
    return float(value)


def _normalise_intervals(
    active: Any, inactive: Any, finish: float, where: str
) -> tuple[list[tuple[float, float]], int, int]:
    """FedScale's intervals ``[active[i], inactive[i]]`` within ``[0, finish]``, sorted and merged.

    Intervals that are empty (inactive <= active after clipping to the period: FedScale's
    check never or only at one instant admits them) are dropped; overlapping or touching
    ones are merged (FedScale admits a time in any of them). Returns the intervals and the
    counts dropped and merged.
    """
    if not isinstance(active, list | tuple) or not isinstance(inactive, list | tuple):
        raise ValueError(f"{where}: 'active' and 'inactive' must be lists of times")
    if len(active) != len(inactive):
        raise ValueError(f"{where}: {len(active)} 'active' times but {len(inactive)} 'inactive' times")
    pairs = []
    dropped = 0
    for i, (a, b) in enumerate(zip(active, inactive)):
        a = max(_number(a, f"{where} active[{i}]"), 0.0)
        b = min(_number(b, f"{where} inactive[{i}]"), finish)
        if not (math.isfinite(a) and math.isfinite(b)):
            raise ValueError(f"{where}: interval {i} is not finite")
        if b <= a:
            dropped += 1
        else:
            pairs.append((a, b))
    pairs.sort()
    merged: list[tuple[float, float]] = []
    n_merged = 0
    for a, b in pairs:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            n_merged += 1
        else:
            merged.append((a, b))
    return merged, dropped, n_merged


def convert_fedscale_traces(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> dict[str, Any]:
    """Convert one of FedScale's trace pickles to fedselect's plain ``.npz`` trace format, once.

    FedScale ships ``client_device_capacity`` (``{client_id: {"computation": ms per sample,
    "communication": kbit/s}}``) and ``client_behave_trace`` (``{client_id: {"active":
    [s, ...], "inactive": [s, ...], "finish_time": s, "duration": s, "model": str}}``) as
    pickles. Unpickling runs code chosen by whoever wrote the file, so fedselect never does it
    implicitly: this function is the one place it happens, when you call it on a file you
    chose, and even then through a restricted unpickler that admits only dicts, lists,
    tuples, strings, numbers and numpy number scalars, and refuses every other global
    (classes, functions, ``os.system``, numpy arrays) before it could be called. The kind of
    file is recognised from its entries. Entries keep the file's order (FedScale maps client
    ids by that order for availability).

    Availability is normalised: intervals are clipped to ``[0, finish_time]``, empty ones
    (inactive <= active) dropped and overlapping ones merged; the returned summary counts them.

    Parameters
    ----------
    src : path
        A FedScale trace pickle.
    dst : path
        Where to write; must end in ``.npz``.

    Returns
    -------
    dict
        ``kind`` ("device" or "availability"), ``entries``, and for availability
        ``intervals``, ``dropped`` and ``merged``.

    Raises
    ------
    ValueError
        The file is not a pickle of either trace kind, refers to a refused global, or an
        entry is malformed (the message names the entry).
    """
    src, dst = Path(src), Path(dst)
    if dst.suffix != ".npz":
        raise ValueError(f"convert_fedscale_traces: dst={dst} must end in .npz")
    try:
        raw = src.read_bytes()
        scan_pickle(raw, what=str(src))  # shared references that expand past 16x the file: refused unbuilt
        data = _TraceUnpickler(io.BytesIO(raw), encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:
        raise ValueError(f"{src}: not a FedScale trace pickle, or one holding refused objects ({exc})") from exc
    if not isinstance(data, dict) or not data:
        raise ValueError(
            f"{src}: a FedScale trace is a non-empty dict of client id -> entry, got {type(data).__name__}"
        )
    _check_unshared(data, src)
    first = next(iter(data.values()))
    if not isinstance(first, dict):
        raise ValueError(f"{src}: entries must be dicts, got {type(first).__name__}")
    keys = np.array([str(k) for k in data])
    if "computation" in first:
        comp = np.empty(len(data))
        comm = np.empty(len(data))
        for i, (k, entry) in enumerate(data.items()):
            where = f"{src}: client {k!r}"
            if not isinstance(entry, dict) or "computation" not in entry or "communication" not in entry:
                raise ValueError(f"{where}: needs 'computation' and 'communication'")
            comp[i] = _number(entry["computation"], f"{where} computation")
            comm[i] = _number(entry["communication"], f"{where} communication")
        _float_array(str(src), "computation", comp, None)
        _float_array(str(src), "communication", comm, None)
        with open(dst, "wb") as fh:
            np.savez(
                fh,
                format=np.array(_TRACE_FORMAT),
                version=np.array(_VERSION),
                kind=np.array("device"),
                keys=keys,
                computation_ms=comp,
                communication_kbps=comm,
            )
        return {"kind": "device", "entries": len(data)}
    if "active" in first:
        offsets = np.zeros(len(data) + 1, dtype=np.int64)
        period = np.empty(len(data))
        starts: list[float] = []
        ends: list[float] = []
        models: list[str] = []
        dropped = merged = n_pairs = 0
        max_pairs = len(raw) // 4
        for i, (k, entry) in enumerate(data.items()):
            where = f"{src}: client {k!r}"
            if not isinstance(entry, dict) or not {"active", "inactive", "finish_time"} <= set(entry):
                raise ValueError(f"{where}: needs 'active', 'inactive' and 'finish_time'")
            finish = _number(entry["finish_time"], f"{where} finish_time")
            if not (math.isfinite(finish) and finish > 0):
                raise ValueError(f"{where}: finish_time must be positive, got {finish}")
            n_pairs += len(entry["active"]) if isinstance(entry["active"], list | tuple) else 0
            if n_pairs > max_pairs:  # each interval takes at least two numbers of the file
                raise ValueError(
                    f"{where}: more than {max_pairs} intervals in a {len(raw)}-byte file (at most one per 4 bytes)"
                )
            pairs, d, m = _normalise_intervals(entry["active"], entry["inactive"], finish, where)
            dropped += d
            merged += m
            starts.extend(a for a, _ in pairs)
            ends.extend(b for _, b in pairs)
            offsets[i + 1] = offsets[i] + len(pairs)
            period[i] = finish
            model = entry.get("model", "")
            models.append(model if isinstance(model, str) else str(model))
        av = Availability(offsets, starts, ends, period)  # the same checks the reader applies
        with open(dst, "wb") as fh:
            np.savez(
                fh,
                format=np.array(_TRACE_FORMAT),
                version=np.array(_VERSION),
                kind=np.array("availability"),
                keys=keys,
                offsets=av.offsets,
                starts=av.starts,
                ends=av.ends,
                finish_time=av.period,
                model=np.array(models),
            )
        return {
            "kind": "availability",
            "entries": len(data),
            "intervals": av.n_intervals,
            "dropped": dropped,
            "merged": merged,
        }
    raise ValueError(
        f"{src}: entries have keys {sorted(map(str, first))[:6]}; expected a FedScale device trace "
        "('computation', 'communication') or availability trace ('active', 'inactive', 'finish_time')"
    )


def _read_trace(path: str | os.PathLike[str], kind: str) -> dict[str, Any]:
    path = Path(path)
    if path.suffix != ".npz":
        raise ValueError(
            f"{path}: from_fedscale reads the .npz files convert_fedscale_traces writes, never FedScale's pickles; "
            f"run `python -m fedselect.profiles convert-fedscale {path} OUT.npz` first"
        )
    data = _read_npz(path, _TRACE_FORMAT)
    found = str(data.get("kind", ""))
    if found != kind:
        raise ValueError(f"{path}: a FedScale {found or 'unknown'} trace, expected the {kind} trace")
    return data


_FROM_FEDSCALE_CONSTRAINTS: dict[str, list[Any]] = {
    "n_clients": [Interval(Integral, 1, None, closed="left")],
    "mapping": [StrOptions(("modulo", "random"))],
    "offset": [Interval(Integral, 0, None, closed="left")],
    "random_state": ["random_state"],
    "latency": [Interval(Real, 0, None, closed="left")],
}


def from_fedscale(
    device_file: str | os.PathLike[str],
    availability_file: str | os.PathLike[str] | None = None,
    *,
    n_clients: int,
    mapping: str = "modulo",
    offset: int = 0,
    random_state: Any = None,
    latency: float = 0.0,
) -> SystemProfiles:
    """Profiles of ``n_clients`` clients from FedScale traces converted by :func:`convert_fedscale_traces`.

    Client k's forward pass per sample takes ``computation / 1000`` seconds and both its
    bandwidths are ``communication x 128`` bytes/s (FedScale's ms per sample and kbit/s);
    with an availability file, client k is online during its trace's intervals, repeating
    every ``finish_time`` seconds (FedScale's ``is_active`` tests ``active <= t mod
    finish_time <= inactive``; here intervals are half-open, which differs only at the
    instant an interval ends).

    Parameters
    ----------
    device_file : path
        Converted ``client_device_capacity`` (``.npz``).
    availability_file : path, optional
        Converted ``client_behave_trace`` (``.npz``); None: always available.
    n_clients : int
        N; FedScale's traces hold many more devices (about 500k) than a simulation has clients.
    mapping : {"modulo", "random"}, default "modulo"
        Which trace entry client k gets, in each file separately: ``"modulo"``: entry
        ``(k + offset) mod M`` in the file's order (FedScale's own rule is ``offset=1``: it
        registers client ids from 1 and takes ``ids % M``; for the device file it looks the
        id up as a key, which is the same entry when the keys run 0..M-1 in order);
        ``"random"``: a seeded draw of distinct entries (with replacement only when
        N > M), device entries first.
    offset : int, default 0
        Shift of the ``"modulo"`` mapping.
    random_state : int, RandomState instance or None
        Seed of the ``"random"`` mapping.
    latency : float, default 0.0
        Seconds per message (FedScale has none).

    Returns
    -------
    SystemProfiles
    """
    validate_parameters(
        "from_fedscale",
        {
            "n_clients": n_clients,
            "mapping": mapping,
            "offset": offset,
            "random_state": random_state,
            "latency": latency,
        },
        _FROM_FEDSCALE_CONSTRAINTS,
    )
    n = int(n_clients)
    rng = check_random_state(random_state)

    def pick(m: int) -> np.ndarray:
        if mapping == "modulo":
            return (np.arange(n, dtype=np.int64) + int(offset)) % m
        return rng.choice(m, size=n, replace=n > m).astype(np.int64)

    dev = _read_trace(device_file, "device")
    # the bounds of SystemProfiles in the trace's units, so that an error names the trace file
    comp = _float_array(
        str(device_file), "computation_ms", dev.get("computation_ms"), None, high=MAX_SECONDS_PER_SAMPLE * 1000.0
    )
    comm = _float_array(
        str(device_file),
        "communication_kbps",
        dev.get("communication_kbps"),
        comp.size,
        low=MIN_BANDWIDTH / BYTES_PER_KBIT,
    )
    rows = pick(comp.size)
    bandwidth = comm[rows] * BYTES_PER_KBIT
    av = None
    if availability_file is not None:
        beh = _read_trace(availability_file, "availability")
        try:
            full = Availability(beh["offsets"], beh["starts"], beh["ends"], beh["finish_time"])
        except KeyError as exc:
            raise ValueError(f"{availability_file}: missing entry {exc}") from exc
        av = full.subset(pick(full.n_clients))
    return SystemProfiles(comp[rows] / 1000.0, bandwidth, bandwidth, np.full(n, float(latency)), av)


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fedselect.profiles convert-fedscale SRC DST``: the explicit conversion command."""
    parser = argparse.ArgumentParser(
        prog="python -m fedselect.profiles",
        description="Convert a FedScale trace pickle (client_device_capacity or client_behave_trace) to fedselect's "
        "plain .npz format, reading it with a restricted unpickler that refuses every object but "
        "containers, strings and numbers.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    conv = sub.add_parser("convert-fedscale", help="convert one FedScale trace pickle to .npz")
    conv.add_argument("src", help="FedScale pickle (client_device_capacity or client_behave_trace)")
    conv.add_argument("dst", help="output .npz")
    args = parser.parse_args(argv)
    try:
        summary = convert_fedscale_traces(args.src, args.dst)
    except (ValueError, OSError) as exc:
        parser.exit(2, f"error: {exc}\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
