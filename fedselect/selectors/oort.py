"""Oort: guided participant selection by statistical utility and system speed (Lai et al., OSDI 2021)."""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from sklearn.utils import check_random_state

from .._validation import InstanceOf, Interval, StrOptions
from ..hookspecs import hookimpl
from ..profiles import SystemProfiles
from ..selection import BaseSelector, ClientOracle, ClientPool, RoundFeedback, Selection, check_client_ids
from ._durations import DurationKnowledge, declared_durations

__all__ = ["OORT_PRESETS", "OortSelector", "declared_durations", "weighted_sample"]

#: The parameters whose default differs between the two official copies: the Oort repository's
#: ``training/argParser.py`` and FedScale's ``fedscale/cloud/config_parser.py``.
OORT_PRESETS: dict[str, dict[str, float]] = {
    "oort": {
        "exploration_decay": 0.95,
        "exploration_min": 0.2,
        "round_threshold": 10.0,
        "cut_off_util": 0.7,
        "clip_bound": 0.98,
        "overcommit": 1.1,
    },
    "fedscale": {
        "exploration_decay": 0.98,
        "exploration_min": 0.3,
        "round_threshold": 30.0,
        "cut_off_util": 0.05,
        "clip_bound": 0.9,
        "overcommit": 1.3,
    },
}
_FLOOR_EPS = 1e-9  # absorbs float error in floor(n * overcommit), e.g. 10 * 1.1 = 11.000000000000002


def weighted_sample(rng: np.random.RandomState, weights: np.ndarray, k: int) -> np.ndarray:
    """Indices of ``k`` draws without replacement, each successive draw in proportion to ``weights``.

    Gumbel-top-k on ``log(weights)``: the distribution of ``choice(replace=False, p=weights)``.
    Entries of weight 0 (or negative or NaN) come after every positive one, in uniform random
    order, so ``k`` may exceed the number of positive weights (the official code raises there).
    """
    w = np.asarray(weights, dtype=np.float64)
    k = min(int(k), w.size)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    positive = np.isfinite(w) & (w > 0)
    with np.errstate(divide="ignore"):
        keys = np.where(positive, np.log(np.where(positive, w, 1.0)), -np.inf) + rng.gumbel(size=w.size)
    tie = rng.random_sample(w.size)  # uniform order among the weightless
    return np.lexsort((-tie, -keys))[:k].astype(np.int64)


def _kth(sorted_index: int, values: np.ndarray) -> float:
    """``np.sort(values)[sorted_index]`` in O(len) time."""
    return float(np.partition(values, sorted_index)[sorted_index])


def _top(values: np.ndarray, k: int) -> np.ndarray:
    """Ascending indices of the ``k`` largest ``values``, ties to the lower index.

    The set ``argsort(-values, kind="stable")[:k]`` of the official code's ``sorted(..., reverse=True)``,
    found in O(len) time.
    """
    n = values.size
    if k >= n:
        return np.arange(n)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    kth = _kth(n - k, values)
    above = values > kth
    equal = np.flatnonzero(values == kth)[: k - int(above.sum())]
    keep = above
    keep[equal] = True
    return np.flatnonzero(keep)


class OortSelector(DurationKnowledge, BaseSelector):
    """Oort's training selector (Lai et al. [1]_, Algorithm 1 and Section 4), after its official code [2]_ [3]_.

    Client i keeps a reward U_i, a duration t_i, the round L_i it last reported and a count. It
    registers with U_i = min(n_i, S) (S = ``samples_per_round``); reporting in round r sets
    U_i = min(n_i, S) * sqrt(``feedback.sample_loss_sq``) (else ``|feedback.losses|``), L_i = r + 1.
    Round 0 is uniform; every later :meth:`select` call R = 1, 2, ... chooses m = floor(n overcommit):

    1. pacer: at R >= 2W, R % W = 0 (W = ``pacer_step``), if the exploited reporters' mean reward
       summed over the last W calls is within 10 % of the W before, the threshold rises by
       ``pacer_delta`` (<= 100); 5x apart, it falls (>= ``pacer_delta``). T = that percentile of t_i;
    2. exploitation among explored, non-blacklisted clients; rewards clipped at their ``clip_bound``
       quantile, u_i = (U_i - 0.999 U_min) / max(U_max - 0.999 U_min, 1e-4), and score_i =
       (u_i + sqrt(0.1 ln R / L_i)) * (T / t_i)^alpha if t_i > T, else without the factor;
    3. epsilon = max(epsilon * ``exploration_decay``, ``exploration_min``); E = floor(m (1 - epsilon))
       clients drawn without replacement in proportion to score among those scoring at least
       ``cut_off_util`` times the (E+1)-th best;
    4. the other m - E among unexplored clients: the top ``sample_window`` x (m - E) by
       U_i * (T / t_i)^alpha, drawn in proportion; a shortfall is filled uniformly.

    Durations come from ``feedback.durations`` (observed), else ``profiles`` (declared); unknown ones get no
    penalty: without a clock Oort is its statistical part. Over-commitment returns m > n clients. A
    straggler (``feedback.timed_out``) is explored with the round's mean reward, as FedScale's aggregator
    does [3]_, and a duration of at least the time waited (FedScale reads its traces; a server cannot).

    **Costs.** Nothing asked of the oracle (``profiles``: the model size, free); one scalar up per
    reporter with its update; O(N) state and time per round.

    Parameters
    ----------
    variant : {"oort", "fedscale"}, default="oort"
        Whose defaults (:data:`OORT_PRESETS`) and code paths: the Oort repository (the paper's) or FedScale's.
    exploration_factor : float, default=0.9
        Initial epsilon.
    exploration_decay, exploration_min : float or None, default=None
        Epsilon's decay per call and floor (None: the variant's 0.95 / 0.98 and 0.2 / 0.3).
    round_penalty : float, default=2.0
        alpha, the exponent of the system penalty (0: no penalty).
    round_threshold : float or None, default=None
        Initial percentile of durations that sets T, in [0, 100] (None: 10 / 30).
    pacer_step, pacer_delta : int, float, default=20, 5.0
        W, calls between pacer decisions, and the threshold's step.
    cut_off_util : float or None, default=None
        Fraction of the (E+1)-th best score kept for the draw (None: 0.7 / 0.05).
    clip_bound : float or None, default=None
        Quantile at which rewards are clipped (None: 0.98 / 0.9).
    blacklist_rounds, blacklist_max_len : int or None, float, default=None, 0.3
        Exclude clients chosen more than this many times (None: never), at most this fraction of N.
    sample_window : float, default=5.0
        Exploration keeps the top ``sample_window`` x (places left) unexplored clients.
    overcommit : float or None, default=None
        Clients chosen per client requested, >= 1 (None: 1.1 / 1.3).
    straggler_reward : {"capped", "mean"}, default="capped"
        A straggler's reward: the round's mean (FedScale's; a silent client gains it), or (``"capped"``) that
        mean capped at its own earlier reward, 0 if it never delivered before; "capped" treats failures alike.
    samples_per_round : int or None, default=None
        S = local steps x batch size, the utility's cap on n_i (None: n_i, one local epoch).
    profiles : SystemProfiles or None, default=None
        Declared device profiles: expected durations of clients not yet observed.
    random_state : None, int or numpy RandomState, default=None
        Seeds the selection stream.

    Attributes
    ----------
    reward_, duration_, last_round_, count_, explored_, censored_, utility_known_, scores_ : ndarray
        Per client: state (duration NaN while unknown, ``censored_``: a lower bound) and latest scores.
    epsilon_, threshold_, preferred_duration_, overcommit_ : float
        Epsilon, pacer threshold and T after the latest call; the resolved over-commitment.

    References
    ----------
    .. [1] Lai, F. et al. "Oort: Efficient Federated Learning via Guided Participant Selection." OSDI 2021.
    .. [2] github.com/SymbioticLab/Oort, ``oort/oort.py`` and ``training/``.
    .. [3] github.com/SymbioticLab/FedScale, ``thirdparty/oort/oort.py`` and ``fedscale/cloud/``.

    Examples
    --------
    >>> from fedselect.selection import ClientPool
    >>> from fedselect.testing import SyntheticOracle
    >>> sel = OortSelector(overcommit=1.0, random_state=0).fit(ClientPool([50] * 10))
    >>> len(sel.select(3, round=0, oracle=SyntheticOracle(10, random_state=0)))
    3
    """

    needs: ClassVar[frozenset[str]] = frozenset({"durations", "sample_losses"})

    def __init__(
        self,
        *,
        variant: str = "oort",
        exploration_factor: float = 0.9,
        exploration_decay: float | None = None,
        exploration_min: float | None = None,
        round_penalty: float = 2.0,
        round_threshold: float | None = None,
        pacer_step: int = 20,
        pacer_delta: float = 5.0,
        cut_off_util: float | None = None,
        clip_bound: float | None = None,
        blacklist_rounds: int | None = None,
        blacklist_max_len: float = 0.3,
        sample_window: float = 5.0,
        overcommit: float | None = None,
        straggler_reward: str = "capped",
        samples_per_round: int | None = None,
        profiles: SystemProfiles | None = None,
        random_state: Any = None,
    ) -> None:
        self.variant = variant
        self.exploration_factor = exploration_factor
        self.exploration_decay = exploration_decay
        self.exploration_min = exploration_min
        self.round_penalty = round_penalty
        self.round_threshold = round_threshold
        self.pacer_step = pacer_step
        self.pacer_delta = pacer_delta
        self.cut_off_util = cut_off_util
        self.clip_bound = clip_bound
        self.blacklist_rounds = blacklist_rounds
        self.blacklist_max_len = blacklist_max_len
        self.sample_window = sample_window
        self.overcommit = overcommit
        self.straggler_reward = straggler_reward
        self.samples_per_round = samples_per_round
        self.profiles = profiles
        self.random_state = random_state

    _unit = Interval(Real, 0, 1, closed="both")
    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "variant": [StrOptions(tuple(OORT_PRESETS))],
        "exploration_factor": [_unit],
        "exploration_decay": [None, _unit],
        "exploration_min": [None, _unit],
        "round_penalty": [Interval(Real, 0, None, closed="left")],
        "round_threshold": [None, Interval(Real, 0, 100, closed="both")],
        "pacer_step": [Interval(Integral, 1, None, closed="left")],
        "pacer_delta": [Interval(Real, 0, 100, closed="right")],
        "cut_off_util": [None, _unit],
        "clip_bound": [None, _unit],
        "blacklist_rounds": [None, Interval(Integral, 0, None, closed="left")],
        "blacklist_max_len": [_unit],
        "sample_window": [Interval(Real, 1, None, closed="left")],
        "overcommit": [None, Interval(Real, 1, None, closed="left")],
        "straggler_reward": [StrOptions(("capped", "mean"))],
        "samples_per_round": [None, Interval(Integral, 1, None, closed="left")],
        "profiles": [None, InstanceOf(SystemProfiles, "a fedselect.profiles.SystemProfiles")],
        "random_state": ["random_state"],
    }
    del _unit

    @property
    def variable_size(self) -> bool:  # type: ignore[override]
        """Over-commitment (``overcommit`` > 1) returns more clients than requested."""
        factor = self.resolved("overcommit")
        return isinstance(factor, Real) and not isinstance(factor, bool) and factor > 1

    def resolved(self, name: str) -> Any:
        """Parameter ``name`` with None replaced by the variant's default (:data:`OORT_PRESETS`)."""
        value = getattr(self, name)
        if value is None and name in OORT_PRESETS["oort"]:
            return OORT_PRESETS.get(self.variant, OORT_PRESETS["oort"])[name]
        return value

    # -- fit --------------------------------------------------------------------------------
    def _fit(self, pool: ClientPool) -> None:
        self._start_durations(pool)
        N = pool.n_clients
        self.rng_ = check_random_state(self.random_state)
        cap = self.n_samples_ if self.samples_per_round is None else np.minimum(self.n_samples_, self.samples_per_round)
        self.bin_ = cap.astype(np.float64)
        self.reward_ = self.bin_.copy()
        self.last_round_ = np.zeros(N, dtype=np.int64)
        self.count_ = np.zeros(N, dtype=np.int64)
        self.explored_ = np.zeros(N, dtype=bool)
        self.utility_known_ = np.zeros(N, dtype=bool)
        self.successful_ = np.zeros(N, dtype=bool)  # reported since the pacer last looked
        self.epsilon_ = float(self.exploration_factor)
        self.exploration_min_ = float(self.resolved("exploration_min"))
        self.threshold_ = float(self.resolved("round_threshold"))
        self.preferred_duration_ = math.inf
        self.calls_ = 0  # select calls (the first is uniform)
        self.oort_calls_ = 0  # R: calls that ran Oort's rule
        self.exploit_history_: list[float] = []
        self.last_exploited_ = np.zeros(0, dtype=np.int64)
        self.last_explored_ = np.zeros(0, dtype=np.int64)
        self.pending_: tuple[int, int, np.ndarray] | None = None  # (round, n requested, chosen) awaiting feedback
        self.scores_ = np.full(N, np.nan)
        self.overcommit_ = float(self.resolved("overcommit"))  # what a clock-aware round reads

    # -- select -----------------------------------------------------------------------------
    def _select(self, n: int, *, round: int, oracle: ClientOracle) -> Selection:
        N = self.n_clients_
        self._declare_durations(oracle)
        m = min(N, max(n, math.floor(n * self.overcommit_ + _FLOOR_EPS)))
        self.calls_ += 1
        if m >= N:  # everyone: the official sampler returns all clients without consulting Oort
            chosen = np.arange(N, dtype=np.int64)
        elif self.calls_ == 1:
            chosen = self.rng_.choice(N, size=m, replace=False).astype(np.int64)
        else:
            chosen = self._oort(m)
        self.pending_ = (round, n, chosen)
        return Selection(chosen)

    def _penalty(self, durations: np.ndarray) -> np.ndarray:
        """(T / t_i)^alpha for clients known to be slower than T, else 1."""
        T = self.preferred_duration_
        slow = ~np.isnan(durations) & (durations > T)
        out = np.ones(durations.size)
        out[slow] = (T / np.maximum(1e-4, durations[slow])) ** float(self.round_penalty)
        return out

    def _pacer(self, R: int) -> None:
        ex = self.last_exploited_[self.successful_[self.last_exploited_]]
        self.exploit_history_.append(float(self.reward_[ex].sum() / (1e-4 + ex.size)))
        self.successful_[:] = False
        W, delta = int(self.pacer_step), float(self.pacer_delta)
        del self.exploit_history_[: -2 * W]  # only the last 2W values are ever read
        if R >= 2 * W and R % W == 0:
            before, now = sum(self.exploit_history_[:W]), sum(self.exploit_history_[W:])
            if abs(now - before) <= before * 0.1:
                self.threshold_ = min(100.0, self.threshold_ + delta)
            elif abs(now - before) >= before * 5:
                self.threshold_ = max(delta, self.threshold_ - delta)
        known = self.duration_[~np.isnan(self.duration_)]
        if self.threshold_ < 100 and known.size:
            self.preferred_duration_ = _kth(min(int(known.size * self.threshold_ / 100.0), known.size - 1), known)
        else:
            self.preferred_duration_ = math.inf

    def _blacklist(self) -> np.ndarray:
        out = np.zeros(self.n_clients_, dtype=bool)
        if self.blacklist_rounds is not None:
            order = np.argsort(-self.count_, kind="stable")
            over = order[self.count_[order] > self.blacklist_rounds]
            out[over[: int(self.blacklist_max_len * self.n_clients_)]] = True
        return out

    def _oort(self, m: int) -> np.ndarray:
        fedscale = self.variant == "fedscale"
        self.oort_calls_ += 1
        R = self.oort_calls_
        feasible = ~self._blacklist()
        self._pacer(R)
        ids = np.flatnonzero(feasible)
        rewards = self.reward_[ids][self.reward_[ids] > 0]
        if rewards.size:
            clip = _kth(min(int(rewards.size * float(self.resolved("clip_bound"))), rewards.size - 1), rewards)
            lo = float(rewards.min()) * 0.999
            span = max(float(rewards.max()) - lo, 1e-4)
        else:  # no positive reward among the candidates (the official code fails here)
            clip, lo, span = 0.0, 0.0, 1e-4
        lakes = ids[self.count_[ids] > 0]
        scores = (np.minimum(self.reward_[lakes], clip) - lo) / span
        scores = scores + np.sqrt(0.1 * math.log(R) / np.maximum(self.last_round_[lakes], 1))
        scores = scores * self._penalty(self.duration_[lakes])
        if fedscale:
            scores = np.abs(scores)
        self.scores_ = np.full(self.n_clients_, np.nan)
        self.scores_[lakes] = scores
        self.epsilon_ = max(self.epsilon_ * float(self.resolved("exploration_decay")), self.exploration_min_)
        E = m - int(m * self.epsilon_) if fedscale else int(m * (1.0 - self.epsilon_))
        E = min(E, lakes.size)
        keep = lakes.size
        if E < lakes.size:  # the (E+1)-th best score sets the cut-off
            cut = _kth(lakes.size - 1 - E, scores) * float(self.resolved("cut_off_util"))
            keep = int(np.sum(scores >= cut))
            if fedscale:  # FedScale keeps at least 10 E + 1 candidates
                keep = max(keep, min(lakes.size, 10 * E + 1))
        top = _top(scores, keep)
        exploited = lakes[top[weighted_sample(self.rng_, scores[top], E)]]
        unexplored = np.flatnonzero(~self.explored_)
        explored = np.zeros(0, dtype=np.int64)
        if unexplored.size:
            init = self.reward_[unexplored] * self._penalty(self.duration_[unexplored])
            L = min(unexplored.size, m - exploited.size)
            window = _top(init, int(float(self.sample_window) * L))
            explored = unexplored[window[weighted_sample(self.rng_, init[window], L)]]
        elif not fedscale:  # nothing left to explore: the Oort copy stops exploring for good
            self.epsilon_ = self.exploration_min_ = 0.0
        self.last_exploited_, self.last_explored_ = exploited, explored
        chosen = np.concatenate([exploited, explored])
        short = m - chosen.size
        if short > 0:  # fill uniformly: feasible clients first, then anyone not chosen
            free = np.ones(self.n_clients_, dtype=bool)
            free[chosen] = False
            first, rest = np.flatnonzero(free & feasible), np.flatnonzero(free & ~feasible)
            take = min(short, first.size)
            fill = [
                self.rng_.choice(first, size=take, replace=False),
                self.rng_.choice(rest, size=short - take, replace=False),
            ]
            chosen = np.concatenate([chosen, *fill])
        return chosen.astype(np.int64)

    # -- update -----------------------------------------------------------------------------
    def _update(self, feedback: RoundFeedback) -> None:
        ids = check_client_ids(feedback.clients, self.n_clients_, what=f"{type(self).__name__}.update")
        late = self._timed_out_ids(feedback)  # checked before anything is written
        t = int(feedback.round)
        if feedback.sample_loss_sq is not None:
            util = np.sqrt(np.asarray(feedback.sample_loss_sq, dtype=np.float64))
        elif feedback.losses is not None:  # a runtime without sample losses that sends the losses anyway
            util = np.abs(np.asarray(feedback.losses, dtype=np.float64))
        else:
            raise ValueError(
                f"{type(self).__name__}: round {t}: the feedback has neither sample_loss_sq nor losses; the runtime "
                f"must honour needs={sorted(self.needs)}"
            )
        ok = np.isfinite(util)
        new = self.bin_[ids] * util
        self.reward_[ids[ok]] = new[ok]
        self._utility_known()[ids[ok]] = True
        self._observe_durations(feedback, ids, late)
        self._reported(ids, t)
        pending, self.pending_ = self.pending_, None
        this_round = pending is not None and pending[0] == t
        mean = float(new[ok].mean()) if ok.any() else 0.0
        if feedback.timed_out is not None:
            # FedScale's round_completion_handler: every straggler (a client the server stopped waiting for) counts
            # as explored, with the round's mean reward (0 when nobody reported); its duration is the bound just set
            stragglers = late
        elif this_round and feedback.durations is not None and ok.any():
            # A runtime that gives durations but no timed_out: over-commitment cut the slowest chosen clients
            assert pending is not None
            _, n, chosen = pending
            absent = np.setdiff1d(chosen, ids)
            slow = np.nan_to_num(self.duration_[absent], nan=np.inf)
            stragglers = absent[np.argsort(-slow, kind="stable")[: max(min(absent.size, chosen.size - n), 0)]]
        else:
            stragglers = np.zeros(0, dtype=np.int64)
        if stragglers.size:
            self._straggled(stragglers, mean, t)
        if self.straggler_reward == "capped" and this_round:
            # a chosen client that failed (an error, a bad reply) delivered nothing either: left unexplored, as the
            # official code leaves it, a client that always fails would be explored again and again
            assert pending is not None
            failed = np.setdiff1d(pending[2], np.concatenate([ids, stragglers]))
            if failed.size:
                self._straggled(failed, mean, t)

    def _utility_known(self) -> np.ndarray:
        """Which clients have reported a utility (made all False for a state saved before it existed)."""
        if not hasattr(self, "utility_known_"):
            self.utility_known_ = np.zeros(self.n_clients_, dtype=bool)
        return self.utility_known_

    def _straggled(self, ids: np.ndarray, mean: float, t: int) -> None:
        """Stragglers ``ids`` of round ``t``: explored, with the round's ``mean`` reward (``straggler_reward``)."""
        reward = np.full(ids.size, mean)
        if self.straggler_reward == "capped":  # silence never raises a reward the client measured itself
            known = self._utility_known()[ids]
            reward[known] = np.minimum(self.reward_[ids[known]], mean)
            reward[self.explored_[ids] & ~known] = 0.0  # timed out before, never delivered: no second mean
        self.reward_[ids] = reward
        self._reported(ids, t)

    def _reported(self, ids: np.ndarray, t: int) -> None:
        self.last_round_[ids] = t + 1
        self.count_[ids] += 1
        self.explored_[ids] = True
        self.successful_[ids] = True


@hookimpl
def register_selectors(register):
    register(OortSelector, name="oort")
