"""Optimal client sampling (Chen, Horvath and Richtarik, TMLR 2022): inclusion probabilities by update norm."""

from __future__ import annotations

from numbers import Integral
from typing import Any, ClassVar

import numpy as np
from sklearn.utils import check_random_state

from .._validation import Interval
from ..hookspecs import hookimpl
from ..selection import BaseSelector, ClientOracle, ClientPool, Selection, is_int

__all__ = ["OptimalClientSamplingSelector", "capped_probabilities", "optimal_probabilities"]


def optimal_probabilities(u: Any, m: int) -> np.ndarray:
    """The variance-optimal independent inclusion probabilities of Chen et al. (their closed form).

    With the norms sorted ascending, u_(1) <= ... <= u_(n), let l be the largest integer
    such that ``0 < m + l - n <= sum_{j<=l} u_(j) / u_(l)``. Then

    ``pi_(k) = (m + l - n) * u_(k) / sum_{j<=l} u_(j)`` for k <= l, and ``pi_(k) = 1`` for k > l.

    This is the minimiser of ``sum_k (1 - pi_k) / pi_k * u_k^2`` (the variance of the
    estimator ``sum_{k in S} U_k / pi_k`` with independent inclusion) subject to
    ``sum_k pi_k = m`` and ``0 < pi_k <= 1``.

    Zero norms, which the paper's closed form leaves undefined (``u_(l) = 0``): a client
    with ``u_k = 0`` adds nothing to the aggregate, so the closed form is applied to the
    z clients with ``u_k > 0`` and budget ``min(m, z)``; any budget left over (``m > z``)
    is spread evenly over the zero-norm clients, which keeps ``sum pi = m`` and changes
    no variance. All norms zero gives ``pi_k = m / n``.

    Parameters
    ----------
    u : array-like of float, shape (n,)
        Non-negative norms of the weighted updates, u_k = p_k ||U_k||.
    m : int
        The expected number of clients, 1 <= m <= n.

    Returns
    -------
    pi : ndarray of float, shape (n,)
        Inclusion probabilities in [0, 1] summing to m.

    Examples
    --------
    >>> optimal_probabilities([1.0, 1.0, 2.0, 10.0], 2).round(3).tolist()
    [0.25, 0.25, 0.5, 1.0]
    """
    u = np.asarray(u, dtype=np.float64).ravel()
    n = u.size
    if not is_int(m) or not 1 <= m <= n:
        raise ValueError(f"optimal_probabilities: m={m!r} must be an integer in 1..{n}")
    if np.any(~np.isfinite(u)) or np.any(u < 0):
        raise ValueError("optimal_probabilities: the norms u must be finite and >= 0")
    pi = np.zeros(n)
    pos = np.flatnonzero(u > 0)
    z = pos.size
    if z == 0:
        return np.full(n, m / n)
    mz = min(m, z)
    up = u[pos]
    order = np.argsort(up, kind="stable")
    us = up[order]
    csum = np.cumsum(us)
    ls = np.arange(1, z + 1)
    lhs = mz + ls - z
    ok = (lhs > 0) & (lhs <= csum / us * (1 + 1e-12))
    # Never empty: l = z - mz + 1 gives lhs = 1 <= csum / u_(l), since the sum includes u_(l) itself.
    l_star = int(ls[ok].max())
    probs = np.ones(z)
    probs[:l_star] = (mz + l_star - z) * us[:l_star] / csum[l_star - 1]
    probs = np.minimum(probs, 1.0)
    pi[pos[order]] = probs
    if m > z:
        pi[u == 0] = (m - z) / (n - z)
    return pi


def capped_probabilities(q: Any, m: float) -> np.ndarray:
    """``pi_k = min(1, c * q_k)`` with c chosen so that ``sum_k pi_k = m`` (iterative capping).

    The same probabilities as :func:`optimal_probabilities` for integer m, reached by
    the textbook route (cap the largest at 1, rescale the rest, repeat); used for the
    probability-proportional-to-size designs, where m may be any real in [0, n].
    Clients with ``q_k = 0`` get probability 0 unless the positive ones are all capped
    and budget is left, which is then spread evenly over them.

    Parameters
    ----------
    q : array-like of float, shape (n,)
        Non-negative sizes.
    m : float
        Target sum, 0 <= m <= n.

    Returns
    -------
    pi : ndarray of float, shape (n,)
    """
    q = np.asarray(q, dtype=np.float64).ravel()
    n = q.size
    if m <= 0 or n == 0:
        return np.zeros(n)
    if m >= n - 1e-12:
        return np.ones(n)
    pi = np.zeros(n)
    capped = np.zeros(n, dtype=bool)
    pos = q > 0
    while True:
        free = pos & ~capped
        budget = m - capped.sum()
        total = q[free].sum()
        if total <= 0 or budget <= 0:
            break
        pi[free] = budget * q[free] / total
        over = free & (pi >= 1.0)
        if not over.any():
            break
        capped |= over
        pi[capped] = 1.0
    left = m - pi.sum()
    zero = ~pos
    if left > 1e-12 and zero.any():
        pi[zero] = left / zero.sum()
    return np.minimum(pi, 1.0)


class OptimalClientSamplingSelector(BaseSelector):
    """Optimal client sampling (Chen, Horvath and Richtarik [1]_).

    Each round every client computes its local update U_k from w^t and uploads only its
    norm (``oracle.local_updates(all, transform=norm)``: N local trainings, N floats up;
    the chosen clients then upload the update they already computed). With
    u_k = p_k ||U_k|| (the norm of the client's term of the full-participation
    aggregate ``sum_k p_k U_k``), the inclusion probabilities are the closed form of
    [1]_ (see :func:`optimal_probabilities`): they minimise the variance
    of the unbiased estimator ``sum_{k in S} p_k U_k / pi_k`` among independent
    inclusions of expected size m. Each client is then included independently with
    probability pi_k, so the realised size varies (``variable_size = True``) with
    mean m, and each chosen client gets the weight ``p_k / pi_k``.

    Empty draws: an empty selection cannot run a round, so the draw is repeated until
    it is non-empty. That conditions on ``S != {}``, which multiplies every inclusion
    probability by ``1 / (1 - P0)`` with ``P0 = prod_k (1 - pi_k) <= e^{-m}``; the
    weights are ``p_k (1 - P0) / pi_k`` so the estimator stays exactly unbiased.

    Clients that do not answer, and ``max_trained`` (a uniform subset trains, the weights scaled by N / M, still
    unbiased): :ref:`selector_ocs`.

    **Costs.** Every round, every client trains and uploads the norm of its update: N local trainings, N models
    down, N floats up (``max_trained=M``: M of each); in this simulator about ``24 N D`` bytes at the peak.

    Parameters
    ----------
    random_state : None, int or numpy RandomState, default=None
        Seeds the inclusion draws (and the subsets of ``max_trained``).
    budget : int or None, default=None
        The expected number of clients m (the paper's communication budget). ``None``
        uses the ``n`` passed to :meth:`select`; an int overrides it (clipped to N).
    max_trained : int or None, default=None
        M, the most clients that train and report their norm in a round (see :ref:`ocs-scale`).
        ``None`` trains every client (the paper). Must be at least the budget m.

    Attributes
    ----------
    rng_ : numpy RandomState
        The selection stream.
    last_probabilities_ : ndarray of float or None
        pi of the latest round (unconditional).
    last_norms_ : ndarray of float or None
        ||U_k|| reported in the latest round (NaN for the clients that did not report).
    last_probed_ : ndarray of int or None
        With ``max_trained``, the subset A that trained in the latest round (None without).

    References
    ----------
    .. [1] Chen, W., Horvath, S., Richtarik, P. "Optimal Client Sampling for Federated
       Learning." Transactions on Machine Learning Research, 2022 (arXiv:2010.13723).

    Examples
    --------
    >>> from fedselect.selection import ClientPool
    >>> from fedselect.testing import SyntheticOracle
    >>> sel = OptimalClientSamplingSelector(random_state=0).fit(ClientPool([50] * 10))
    >>> oracle = SyntheticOracle(10, random_state=0)
    >>> chosen = sel.select(3, round=0, oracle=oracle)
    >>> round(float(sel.last_probabilities_.sum()), 6)
    3.0
    """

    variable_size = True

    def __init__(self, *, random_state: Any = None, budget: int | None = None, max_trained: int | None = None) -> None:
        self.random_state = random_state
        self.budget = budget
        self.max_trained = max_trained

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "budget": [None, Interval(Integral, 1, None, closed="left")],
        "max_trained": [None, Interval(Integral, 1, None, closed="left")],
        "random_state": ["random_state"],
    }

    def _fit(self, pool: ClientPool) -> None:
        self.rng_ = check_random_state(self.random_state)
        self.last_probabilities_ = None
        self.last_norms_ = None
        self.last_probed_ = None

    def _select(self, n: int, *, round: int, oracle: ClientOracle) -> Selection:
        N = self.n_clients_
        m = n if self.budget is None else min(int(self.budget), N)
        if self.max_trained is not None and int(self.max_trained) < N:
            return self._select_subset(m, int(self.max_trained), round=round, oracle=oracle)
        ids = np.arange(N)
        norms = np.asarray(
            oracle.local_updates(ids, transform=lambda u: np.array([np.linalg.norm(u)], dtype=np.float32)),
            dtype=np.float64,
        ).reshape(-1)
        bad = np.flatnonzero(np.isinf(norms))
        if bad.size:
            raise ValueError(
                f"{type(self).__name__}: round {round}: local update norms of client(s) {bad[:5].tolist()} are "
                "infinite (a diverged local training)"
            )
        answered = ~np.isnan(norms)  # the others did not answer and cannot train this round
        if not answered.any():
            self.last_probabilities_ = np.zeros(N)
            self.last_norms_ = norms
            return Selection(np.sort(self.rng_.choice(N, min(m, N), replace=False)))
        p = self.weights_
        if not answered.all():
            p = np.where(answered, p, 0.0) / p[answered].sum()
        pi = np.zeros(N)
        pi[answered] = optimal_probabilities(p[answered] * norms[answered], min(m, int(answered.sum())))
        p0 = float(np.prod(1.0 - pi))
        while True:
            chosen = np.flatnonzero(self.rng_.random_sample(N) < pi)
            if chosen.size:
                break
        self.last_probabilities_ = pi
        self.last_norms_ = norms
        return Selection(chosen, p[chosen] * (1.0 - p0) / pi[chosen])

    def _norms(self, oracle: ClientOracle, ids: np.ndarray, round: int) -> np.ndarray:
        norms = np.asarray(
            oracle.local_updates(ids, transform=lambda u: np.array([np.linalg.norm(u)], dtype=np.float32)),
            dtype=np.float64,
        ).reshape(-1)
        bad = np.flatnonzero(np.isinf(norms))
        if bad.size:
            raise ValueError(
                f"{type(self).__name__}: round {round}: local update norms of client(s) {ids[bad][:5].tolist()} "
                "are infinite (a diverged local training)"
            )
        return norms

    def _select_subset(self, m: int, M: int, *, round: int, oracle: ClientOracle) -> Selection:
        """``max_trained``: the scheme on a uniformly random subset A of M clients, weights scaled by N / M."""
        N = self.n_clients_
        if M < m:
            raise ValueError(
                f"{type(self).__name__}: parameter max_trained={self.max_trained!r} is smaller than the budget "
                f"m={m} of this round; expected max_trained >= m (or None to train every client)"
            )
        probed = np.sort(self.rng_.choice(N, M, replace=False))
        norms_a = self._norms(oracle, probed, round)
        self.last_probed_ = probed
        norms = np.full(N, np.nan)
        norms[probed] = norms_a
        self.last_norms_ = norms
        pi = np.zeros(N)
        answered = probed[~np.isnan(norms_a)]
        if not answered.size:
            self.last_probabilities_ = pi
            return Selection(np.sort(self.rng_.choice(N, min(m, N), replace=False)))
        # First stage: A is uniform, so (N / M) p_k weights sum_{k in A} into an unbiased total; clients of A
        # that did not answer hand their share to those that did (as the uncapped scheme renormalises).
        p = self.weights_[probed] * (N / M)
        total = p.sum()
        p_ans = self.weights_[answered] * (N / M)
        p_ans = p_ans * (total / p_ans.sum())
        pi[answered] = optimal_probabilities(p_ans * norms[answered], min(m, answered.size))
        p0 = float(np.prod(1.0 - pi[answered]))
        while True:
            hit = answered[self.rng_.random_sample(answered.size) < pi[answered]]
            if hit.size:
                break
        self.last_probabilities_ = pi
        p_all = np.zeros(N)
        p_all[answered] = p_ans
        return Selection(hit, p_all[hit] * (1.0 - p0) / pi[hit])


@hookimpl
def register_selectors(register):
    register(OptimalClientSamplingSelector, name="ocs", aliases=("optimal-client-sampling",))
