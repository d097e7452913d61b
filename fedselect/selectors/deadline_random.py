"""Deadline-aware random selection: uniform among the clients expected to finish within a deadline."""

from __future__ import annotations

from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from sklearn.utils import check_random_state

from .._validation import InstanceOf, Interval, StrOptions
from ..hookspecs import hookimpl
from ..profiles import SystemProfiles
from ..selection import BaseSelector, ClientOracle, ClientPool, RoundFeedback, Selection, check_client_ids
from ._durations import DurationKnowledge

__all__ = ["DeadlineRandomSelector"]


class DeadlineRandomSelector(DurationKnowledge, BaseSelector):
    """Random selection restricted to clients expected to meet a deadline (a system-aware baseline).

    Client k's expected duration e_k is the latest duration the server observed for it
    (``feedback.durations``), else its declared one (``profiles``: download + 3 x S x seconds per
    sample + upload, as Oort registers clients [1]_), else unknown. Each round, with deadline D
    (``deadline`` seconds, or the ``quantile`` of the known e_k when None):

    1. the candidates are the clients with e_k <= D or e_k unknown (so every client is tried once),
       except those whose e_k is a lower bound (the server stopped waiting for them: ``feedback.timed_out``)
       that is at least D;
    2. if there are at least n, choose n of them uniformly without replacement;
    3. otherwise take them all and fill the rest from the others, uniformly (``shortfall="uniform"``)
       or in increasing e_k (``"fastest"``, FedCS-like [2]_).

    Without a clock and without profiles every duration stays unknown and this is uniform random
    selection. Clients that miss the deadline in a round are a matter for the round (stragglers).

    **Costs.** Nothing beyond the round (``profiles``: the model's size, free); O(N).

    Parameters
    ----------
    deadline : float or None, default=None
        D in seconds, > 0 (None: the ``quantile`` of the known expected durations, each round).
    quantile : float, default=0.5
        Which quantile of the known durations is the deadline when ``deadline`` is None, in (0, 1].
    shortfall : {"uniform", "fastest"}, default="uniform"
        How places left after the candidates are filled.
    samples_per_round : int or None, default=None
        Samples a client trains on per round, for declared durations (None: n_k).
    profiles : SystemProfiles or None, default=None
        Declared device profiles: expected durations of clients not yet observed.
    random_state : None, int or numpy RandomState, default=None
        Seeds the selection stream.

    Attributes
    ----------
    duration_ : ndarray of float, shape (n_clients,)
        e_k (NaN while unknown).
    censored_ : ndarray of bool, shape (n_clients,)
        Whether e_k is a lower bound (the client's latest round ended without its reply).
    deadline_ : float
        D of the latest round (inf while no duration is known).

    References
    ----------
    .. [1] Lai, F. et al. "Oort: Efficient Federated Learning via Guided Participant Selection." OSDI 2021.
    .. [2] Nishio, T., Yonetani, R. "Client Selection for Federated Learning with Heterogeneous
       Resources in Mobile Edge." IEEE ICC 2019.

    Examples
    --------
    >>> from fedselect.selection import ClientPool
    >>> from fedselect.testing import SyntheticOracle
    >>> sel = DeadlineRandomSelector(deadline=30.0, random_state=0).fit(ClientPool([50] * 10))
    >>> len(sel.select(3, round=0, oracle=SyntheticOracle(10, random_state=0)))
    3
    """

    needs: ClassVar[frozenset[str]] = frozenset({"durations"})

    def __init__(
        self,
        *,
        deadline: float | None = None,
        quantile: float = 0.5,
        shortfall: str = "uniform",
        samples_per_round: int | None = None,
        profiles: SystemProfiles | None = None,
        random_state: Any = None,
    ) -> None:
        self.deadline = deadline
        self.quantile = quantile
        self.shortfall = shortfall
        self.samples_per_round = samples_per_round
        self.profiles = profiles
        self.random_state = random_state

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "deadline": [None, Interval(Real, 0, None, closed="neither")],
        "quantile": [Interval(Real, 0, 1, closed="right")],
        "shortfall": [StrOptions(("uniform", "fastest"))],
        "samples_per_round": [None, Interval(Integral, 1, None, closed="left")],
        "profiles": [None, InstanceOf(SystemProfiles, "a fedselect.profiles.SystemProfiles")],
        "random_state": ["random_state"],
    }

    def _fit(self, pool: ClientPool) -> None:
        self._start_durations(pool)
        self.rng_ = check_random_state(self.random_state)
        self.deadline_ = np.inf

    def _select(self, n: int, *, round: int, oracle: ClientOracle) -> Selection:
        self._declare_durations(oracle)
        e = self.duration_
        known = np.sort(e[~np.isnan(e)])
        if self.deadline is not None:
            self.deadline_ = float(self.deadline)
        elif known.size:
            self.deadline_ = float(known[min(int(known.size * float(self.quantile)), known.size - 1)])
        else:
            self.deadline_ = np.inf
        fits = np.isnan(e) | ((e <= self.deadline_) & ~(self._ensure_censored() & (e >= self.deadline_)))
        candidates = np.flatnonzero(fits)
        if candidates.size >= n:
            return Selection(self.rng_.choice(candidates, size=n, replace=False).astype(np.int64))
        others = np.flatnonzero(~fits)
        if self.shortfall == "fastest":
            fill = others[np.argsort(e[others], kind="stable")[: n - candidates.size]]
        else:
            fill = self.rng_.choice(others, size=n - candidates.size, replace=False)
        return Selection(np.concatenate([candidates, fill]).astype(np.int64))

    def _update(self, feedback: RoundFeedback) -> None:
        if feedback.durations is not None or feedback.timed_out is not None:
            ids = check_client_ids(feedback.clients, self.n_clients_, what=f"{type(self).__name__}.update")
            self._observe_durations(feedback, ids, self._timed_out_ids(feedback))


@hookimpl
def register_selectors(register):
    register(DeadlineRandomSelector, name="deadline-random")
