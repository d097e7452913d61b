"""The simulated clock: how long each round lasts, from the clients' profiles and what the round sent.

A round lasts as long as its critical path (FedScale's completion-time model, Lai et al. 2022, with two
additions marked below: the loss evaluation of the training exchange and the mid-round wait):

1. each oracle question is one exchange with the clients it reaches (a model or a request down,
   some work, an answer up); the server waits for the slowest answer, or for ``query_timeout``
   seconds, after which the late clients count as failed (they answer NaN, as failures do);
2. then the training exchange: every chosen client that still has something to do downloads
   ``w^t`` (unless it already holds it), trains (unless a question already trained it), and sends
   its update (unless already uploaded). Not in FedScale: for a selector whose ``needs`` has
   ``"losses"`` (or ``FederatedTrainer(feedback_losses="always")``) it also evaluates its loss on
   ``w^t`` over its evaluation data and sends it (unless already known), the ``samples evaluated``
   term below; for any other selector that work is not done, charged or timed. The round waits
   for the slowest reporter, or stops at the ``keep``-th completion when the round
   over-selected (FedCS, Oort's over-commitment), or at the ``deadline`` for clients that
   miss it (stragglers).

Client k's time in one exchange is :meth:`SystemProfiles.round_time
<fedselect.profiles.SystemProfiles.round_time>` of what the exchange carries::

    bytes_down = 4 D * models down
    bytes_up   = 4 D * models up + 4 * (scalars up + floats up)
    compute    = seconds_per_sample * (3 * samples trained + samples evaluated)
    time       = bytes_down / download + compute + bytes_up / upload + 2 * latency

(D parameters of 4 bytes, float32, as the cost ledger counts models; a client that receives
and sends nothing in an exchange takes no time in it). A client that fails without the server
knowing (dropout, offline at the round's start) never answers: the server waits for it until
the timeout or the deadline when one is set, and otherwise learns of the failure at once.

A round in which nobody reports lasts the deadline when one is set, else until the last chosen
client's update was due: never 0 s.

Availability (profiles with on/off intervals): a client is available in a round iff it is
online at the round's start (the trainer lets the selector choose only among those by
default, ``choose_among="online"``); a chosen client counts only if it is still online when its
training exchange ends (``start + questions + its time``), else it fails. Not in FedScale:
the server cannot tell such a client from a slow one, so the round waits for it until its
update was due (FedScale's round ignores it). If no client is online at the clock, the round starts when
the first one comes online. Without intervals, availability is the trainer's per-round draw.

The clock is used by the round's oracle (:class:`fedselect.round.RoundOracle`, the simulator's
:class:`fedselect.simulation.transport.SimulationOracle`), which tells it what each exchange
carries; :class:`SimulatedClock` holds the run's time, :class:`RoundClock` one round's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .profiles import COMPUTE_FACTOR, Availability, SystemProfiles

__all__ = ["BYTES_PER_FLOAT", "TRAIN_FACTOR", "RoundClock", "Settlement", "SimulatedClock"]

BYTES_PER_FLOAT = 4
"""Bytes per parameter of a model and per scalar or compressed float on the wire (float32)."""

TRAIN_FACTOR = COMPUTE_FACTOR
"""Forward-pass equivalents per trained sample, 3 (FedScale: backward ~ 2 x forward); evaluating costs 1."""


class _OnlineTracker:
    """Who is online at a non-decreasing sequence of times, in O(changes) per query after the first.

    Each client's state holds until ``until[k]`` (the end of its current interval when online,
    the start of its next one when offline); only clients whose state may have changed are
    looked up again, so a round at N = 100,000 costs one vectorised comparison, not N
    interval searches.
    """

    def __init__(self, availability: Availability) -> None:
        self.av = availability
        n = availability.n_clients
        self.online = np.zeros(n, dtype=bool)
        self.until = np.full(n, -np.inf)

    def _refresh(self, clients: np.ndarray, t: float) -> None:
        av = self.av
        on = av.available(clients, t)
        self.online[clients] = on
        until = np.empty(clients.size)
        off = clients[~on]
        until[~on] = av.next_available(off, t) if off.size else 0.0
        if on.any():
            until[on] = self._interval_end(clients[on], t)
        self.until[clients] = until

    def _interval_end(self, clients: np.ndarray, t: float) -> np.ndarray:
        """The end of the interval holding ``t`` for each (online) client, in absolute seconds."""
        av = self.av
        per = av.period[clients]
        periodic = np.isfinite(per)
        tau = np.where(periodic, np.mod(t, np.where(periodic, per, 1.0)), t)
        lo, hi = av.offsets[clients].copy(), av.offsets[clients + 1].copy()
        # the last interval starting at or before tau: binary search of all clients at once
        while True:
            open_ = hi - lo > 1
            if not open_.any():
                break
            mid = (lo + hi) // 2
            right = open_ & (av.starts[np.minimum(mid, av.starts.size - 1)] <= tau)
            lo = np.where(right, mid, lo)
            hi = np.where(open_ & ~right, mid, hi)
        return (t - tau) + av.ends[lo]

    def online_at(self, t: float) -> np.ndarray:
        stale = np.flatnonzero(self.until <= t)
        if stale.size:
            self._refresh(stale, t)
        return self.online

    def next_online(self) -> float:
        """The earliest time a client that is offline now comes online (inf: never)."""
        waiting = self.until[~self.online]
        return float(waiting.min()) if waiting.size else math.inf


class SimulatedClock:
    """A run's simulated time: where the next round starts, and how each round is timed.

    Parameters
    ----------
    profiles : SystemProfiles
        Every client's speed, bandwidth, latency and availability.
    model_size : int
        D, the model's parameters (4 bytes each on the wire).
    deadline : float or None
        Seconds a chosen client has for its training exchange; later ones are stragglers.
    query_timeout : float or None
        Seconds the server waits for the answers to one oracle question.
    start : float, default 0.0
        The time of the first round's start (a resumed run continues from its last ``sim_time``).

    Attributes
    ----------
    now : float
        The end of the last round (the earliest start of the next).
    """

    def __init__(
        self,
        profiles: SystemProfiles,
        *,
        model_size: int,
        deadline: float | None = None,
        query_timeout: float | None = None,
        start: float = 0.0,
    ) -> None:
        if not isinstance(profiles, SystemProfiles):
            raise TypeError(f"SimulatedClock: profiles must be a SystemProfiles, got {type(profiles).__name__}")
        for name, value in (("deadline", deadline), ("query_timeout", query_timeout)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"SimulatedClock: {name}={value!r} must be None or a finite number of seconds > 0")
        if not (math.isfinite(start) and start >= 0):
            raise ValueError(f"SimulatedClock: start={start!r} must be a finite time >= 0")
        self.profiles = profiles
        self.model_bytes = float(BYTES_PER_FLOAT * int(model_size))
        self.deadline = None if deadline is None else float(deadline)
        self.query_timeout = None if query_timeout is None else float(query_timeout)
        self.now = float(start)
        self.has_latency = bool(profiles.latency.any())
        av = profiles.availability
        self._tracker = None if av is None else _OnlineTracker(av)

    @property
    def n_clients(self) -> int:
        return self.profiles.n_clients

    def start_round(self) -> RoundClock:
        """A :class:`RoundClock` for the next round, with the clients offline at its start."""
        t0 = self.now
        offline = np.zeros(0, dtype=np.int64)
        if self._tracker is not None:
            online = self._tracker.online_at(t0)
            if not online.any():  # nobody to talk to: the round starts when the first client comes online
                t1 = self._tracker.next_online()
                if math.isfinite(t1):
                    t0 = t1
                    online = self._tracker.online_at(t0)
            offline = np.flatnonzero(~online)
        return RoundClock(self, t0, offline)

    def end_round(self, rc: RoundClock) -> tuple[float, float]:
        """Close ``rc``: the round's simulated seconds and the time it ended (the clock moves there)."""
        self.now = rc.start + rc.elapsed
        return rc.elapsed, self.now


@dataclass
class Settlement:
    """How a round's training exchange ends (:meth:`RoundClock.settle`).

    Attributes
    ----------
    drop : ndarray of int
        Chosen clients that fail before training: stragglers past the deadline and clients
        offline when their update would arrive (they do not train, as a failed client).
    cut : ndarray of int
        Clients that train but are not waited for: over-selected beyond the first ``keep`` to finish.
    times : ndarray of float
        Each given client's time in the exchange (inf: a failure the server did not know of).
    timed_out : ndarray of int
        The chosen clients the server stopped waiting for without a reply (what it sees): the
        stragglers past the deadline, the cut clients, and, with a deadline, the clients that
        failed silently (it cannot tell them from stragglers). Clients seen to drop (offline when
        their update was due, before the exchange ended) are not in it.
    timed_out_after : ndarray of float
        For each ``timed_out`` client, its seconds in this round's earlier exchanges plus the
        exchange's length: how long the server had waited for it, a lower bound on its duration.
    """

    drop: np.ndarray
    cut: np.ndarray
    times: np.ndarray
    timed_out: np.ndarray
    timed_out_after: np.ndarray


class RoundClock:
    """One round's critical path: the exchanges so far and each client's time in them.

    Made by :meth:`SimulatedClock.start_round`. The transport calls :meth:`exchange` for every
    oracle question and :meth:`settle` once for the training.

    Attributes
    ----------
    start : float
        The round's start time.
    elapsed : float
        Seconds of the critical path so far.
    offline : ndarray of int
        Clients offline at ``start`` (they fail this round).
    spent : ndarray of float, shape (N,)
        Each client's seconds in the exchanges it answered this round (what the server observes).
    """

    def __init__(self, clock: SimulatedClock, start: float, offline: np.ndarray) -> None:
        self.clock = clock
        self.start = float(start)
        self.offline = offline
        self.elapsed = 0.0
        self.spent = np.zeros(clock.n_clients)  # zero pages: O(1) until touched

    def times(
        self,
        clients: Any,
        *,
        models_down: Any = 0,
        models_up: Any = 0,
        scalars_up: Any = 0,
        floats_up: Any = 0,
        train_samples: Any = 0,
        eval_samples: Any = 0,
    ) -> np.ndarray:
        """Each client's seconds for one exchange carrying the given counts (0 for a client sent nothing).

        The counts are per client (or one number for all); the result is
        :meth:`SystemProfiles.round_time <fedselect.profiles.SystemProfiles.round_time>` of
        their bytes and samples (``compute_factor=1`` on 3 x trained + evaluated samples),
        computed here without its argument checks: the ids come validated from the round.
        """
        c = np.asarray(clients, dtype=np.int64)
        if c.size == 0:
            return np.zeros(0)
        p = self.clock.profiles
        D = self.clock.model_bytes
        down = np.multiply(models_down, D, dtype=np.float64)
        up = np.multiply(models_up, D, dtype=np.float64) + BYTES_PER_FLOAT * np.add(scalars_up, floats_up)
        work = np.add(np.multiply(train_samples, TRAIN_FACTOR, dtype=np.float64), eval_samples)
        t = down / p.download_bandwidth[c] + work * p.seconds_per_sample[c] + up / p.upload_bandwidth[c]
        if not self.clock.has_latency:  # every term is 0 for a client sent nothing
            return t
        t += 2.0 * p.latency[c]
        return np.where((down + up + work) > 0, t, 0.0)

    def exchange(self, clients: Any, *, failed: Any = None, **counts: Any) -> np.ndarray:
        """One oracle question to ``clients``: advance the critical path; which answers came too late.

        Parameters
        ----------
        clients : array-like of int
            The clients the question reaches (distinct).
        failed : array-like of bool, optional
            Clients that will not answer (failed before; the server does not know yet).
        **counts
            ``models_down``, ``models_up``, ``scalars_up``, ``floats_up``, ``train_samples``,
            ``eval_samples``: per client (or one number for all), as :meth:`times`.

        Returns
        -------
        ndarray of bool
            Per client: it answered after ``query_timeout`` (the caller marks it failed).
        """
        c = np.asarray(clients, dtype=np.int64)
        t = self.times(c, **counts)
        answered = np.ones(c.size, dtype=bool) if failed is None else ~np.asarray(failed, dtype=bool)
        if failed is not None:
            t[~answered & (t > 0)] = np.inf  # sent something, never answers
        timeout = self.clock.query_timeout
        late = np.zeros(c.size, dtype=bool)
        if timeout is None:
            finite = t[np.isfinite(t)]
            wait = float(finite.max()) if finite.size else 0.0
        else:
            late = answered & (t > timeout)
            answered &= ~late
            wait = min(float(t.max()), timeout) if t.size else 0.0
        self.spent[c[answered]] += t[answered]
        self.elapsed += wait
        return late

    def settle(self, clients: Any, *, failed: Any = None, keep: int | None = None, **counts: Any) -> Settlement:
        """The training exchange of the chosen ``clients``: who fails, who is cut, how long it lasts.

        A chosen client is dropped (fails before training) if its time exceeds the deadline or
        it is offline when its update would arrive. Of the others, with ``keep`` the first
        ``keep`` to finish report and the rest are cut (ties: in the given order); the exchange
        lasts until the ``keep``-th completion when ``keep`` finished, else until the last
        reporter's completion, or the deadline when a client the server waited for did not
        report (a straggler or failure), or a dropped client's completion time without a
        deadline. Reporters' times are added to :attr:`spent`.

        Parameters
        ----------
        clients : array-like of int
            The chosen clients (distinct), in the selection's order.
        failed : array-like of bool, optional
            Clients that already failed (they do not answer).
        keep : int, optional
            Report only the first ``keep`` to finish (over-selection).
        **counts
            As :meth:`exchange`.
        """
        c = np.asarray(clients, dtype=np.int64)
        t = self.times(c, **counts)
        ok = np.ones(c.size, dtype=bool) if failed is None else ~np.asarray(failed, dtype=bool)
        due = t.copy()  # when each chosen client's update was due, had it answered
        waited = False  # for a client that will not report: until the deadline, if there is one
        silent = np.zeros(c.size, dtype=bool)  # no reply by the exchange's end, seen from the server
        if not ok.all():
            dead = ~ok & (t > 0)  # sent something, never answers
            t[dead] = np.inf
            waited = bool(dead.any())
            silent |= dead
        drop = np.zeros(c.size, dtype=bool)
        gone = np.zeros(c.size, dtype=bool)
        tracker = self.clock._tracker
        gone_at = 0.0
        if tracker is not None:
            # online at the start until tracker.until: only a client whose update arrives later is looked up
            end = self.start + self.elapsed + t
            check = ok & (end >= tracker.until[c])
            if check.any():
                gone[check] = ~tracker.av.available(c[check], end[check])
                if gone.any():
                    drop |= gone
                    ok &= ~gone
                    waited = True
                    gone_at = float(t[gone].max())  # the server sees it drop when its update was due
        deadline = self.clock.deadline
        if deadline is not None:
            late = ok & (t > deadline)
            if late.any():
                drop |= late
                ok &= ~late
                waited = True
                silent |= late
        else:  # without a deadline a silent failure is learned of at once (the model of the module's docstring)
            silent[:] = False
        cut = np.zeros(c.size, dtype=bool)
        n_ok = int(ok.sum())
        if keep is not None and n_ok > keep:
            idx = np.flatnonzero(ok)
            cut[idx[np.argsort(t[idx], kind="stable")[keep:]]] = True
            ok &= ~cut
            n_ok = keep
        wait = float(t[ok].max()) if n_ok else 0.0
        if waited and not (keep is not None and n_ok == keep):
            wait = deadline if deadline is not None else max(wait, gone_at)
        if not n_ok and deadline is None and c.size:
            # nobody reported: the server, without a reply, waited until the last update was due (not 0 s)
            wait = max(wait, float(due.max()))
        silent |= cut | (gone & (t > wait))  # due after the server stopped waiting: it never saw the drop
        self.spent[c[ok]] += t[ok]
        self.elapsed += wait
        timed_out = c[silent]
        return Settlement(
            drop=c[drop], cut=c[cut], times=t, timed_out=timed_out, timed_out_after=self.spent[timed_out] + wait
        )
