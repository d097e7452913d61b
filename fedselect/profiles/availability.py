"""When each client is online: :class:`Availability`, on/off intervals per client in CSR form, and its queries.

Memory is O(N + number of intervals): per-client offsets into flat start / end arrays, and a
per-client repetition period. :func:`~fedselect.profiles.sample_profiles` draws one,
:func:`~fedselect.profiles.from_fedscale` reads one from a converted FedScale trace, and
:class:`~fedselect.profiles.SystemProfiles` holds one beside the clients' devices.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..selection import check_client_ids
from ._checks import _float_array, _times

__all__ = ["Availability"]


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
