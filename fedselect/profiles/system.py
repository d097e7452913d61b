"""The clients' devices: :class:`SystemProfiles`, its bounds and units, its time model and its plain files.

A :class:`SystemProfiles` holds, per client, the seconds one forward pass on one sample takes,
the download and upload bandwidth in bytes per second, a latency per message, and (optionally)
an :class:`~fedselect.profiles.Availability`. Its one piece of arithmetic is
:meth:`SystemProfiles.round_time`, FedScale's completion-time model (Lai et al., ICML 2022).
It writes itself as JSON or as a plain ``.npz`` and reads both back through the checks of its
constructor (:mod:`fedselect.profiles.files` reads the ``.npz``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from numbers import Integral, Real
from pathlib import Path
from typing import Any

import numpy as np

from ..selection import check_client_ids
from ._checks import _float_array, _per_client, _times
from .availability import Availability
from .files import FORMAT_VERSION, PROFILES_FORMAT, read_npz

__all__ = [
    "BYTES_PER_KBIT",
    "COMPUTE_FACTOR",
    "MAX_LATENCY",
    "MAX_SECONDS_PER_SAMPLE",
    "MIN_BANDWIDTH",
    "SystemProfiles",
]

COMPUTE_FACTOR = 3.0
"""Training a sample costs this many forward passes (FedScale's ``augmentation_factor``: backward ~ 2 x forward)."""

BYTES_PER_KBIT = 128.0
"""Bytes in one kbit as FedScale counts it: its model size is ``len(pickle) / 1024 * 8`` kbit, so 1 kbit = 128 bytes."""

# Bounds that keep every simulated duration finite: with at most 1e13 bytes per message and 1e12 samples per
# exchange, one exchange lasts at most about 1e19 s (a float64 holds 1.8e308); anything outside them is a typo
# or a unit error (1e-310 bytes/s gives 1 / 1e-310 = inf), refused with the field's name before any training.
MIN_BANDWIDTH = 1e-6
"""Smallest bandwidth a profile may declare, in bytes per second."""
MAX_SECONDS_PER_SAMPLE = 1e6
"""Largest forward-pass time per sample a profile may declare, in seconds."""
MAX_LATENCY = 1e9
"""Largest latency per message a profile may declare, in seconds."""


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
        out: dict[str, Any] = {"format": PROFILES_FORMAT, "version": FORMAT_VERSION, "n_clients": self.n_clients}
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
        if data.get("format") != PROFILES_FORMAT or data.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"SystemProfiles.from_dict: not a profiles record (format {data.get('format')!r}, version "
                f"{data.get('version')!r}; expected {PROFILES_FORMAT!r}, {FORMAT_VERSION})"
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
                    format=np.array(PROFILES_FORMAT),
                    version=np.array(FORMAT_VERSION),
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
            data = read_npz(path, PROFILES_FORMAT)
        else:
            raise ValueError(f"SystemProfiles.load: {path} must end in .npz or .json")
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError, OverflowError) as exc:  # every message names the field; this adds the file
            raise ValueError(f"{path}: {str(exc).removeprefix('SystemProfiles.from_dict: ')}") from exc
