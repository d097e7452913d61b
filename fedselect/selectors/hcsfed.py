"""HCSFed: hybrid clustering-based client selection (Song et al.): clusters of compressed updates,
sample sizes re-allocated by cluster cohesion, importance sampling by update norm inside each cluster."""

from __future__ import annotations

import math
import warnings
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from sklearn.utils import check_random_state

from .._validation import Interval, StrOptions
from ..hookspecs import hookimpl
from ..selection import BaseSelector, ClientOracle, ClientPool, Selection
from ._compress import COMPRESSORS, make_compressor
from .ocs import capped_probabilities

__all__ = [
    "COHESIONS",
    "HCSFedSelector",
    "allocate",
    "cluster_cohesion",
    "kmeans",
    "round_shares",
    "systematic_pps",
]

#: The readings of S_h in Eq. 5, named for what they compute (see :func:`cluster_cohesion`).
COHESIONS = ("std", "mean-pairwise", "pairwise-sum")
# Old names still accepted, with a FutureWarning: "paper" was the all-pairs sum (and the default) until the
# readings were named for what they compute; runs recorded with it ran "pairwise-sum".
_COHESION_ALIASES = {"paper": "pairwise-sum"}
_INITS = ("random", "k-means++")
_ROUNDINGS = ("systematic", "largest-remainder")
_WEIGHTINGS = ("inclusion", "paper")
_TOL = 1e-9


# ---------------------------------------------------------------------------------------
# The pieces, each usable (and tested) on its own
# ---------------------------------------------------------------------------------------
def kmeans(
    X: np.ndarray,
    n_clusters: int,
    rng: np.random.RandomState,
    *,
    init: str = "random",
    n_init: int = 1,
    max_iter: int = 100,
) -> np.ndarray:
    """k-means of the rows of ``X`` (HCSFed's Algorithm 1), best of ``n_init`` runs.

    Algorithm 1 alternates nearest-centre assignment (line 5) and centre = cluster mean
    (line 9) until the centres stop moving (line 12); it starts from H random clients
    (line 1). ``init="random"`` does exactly that (H distinct clients drawn uniformly);
    ``init="k-means++"`` draws each next starting client with probability proportional
    to its squared distance to the chosen ones, which lowers the within-cluster sum of
    squares but favours outlying clients as centres, which can leave them as singleton
    clusters (a singleton has S_h = 0, hence no share under Eq. 5;
    ``benchmarks/reproductions/hcsfed/hcsfed_skipped.py`` counts how often either start gives one). The run with the
    lowest within-cluster sum of squares is kept. A small NumPy implementation: for
    N ~ 100 points it is an order of magnitude faster than
    scikit-learn's KMeans, whose per-call overhead (~7 ms) dominates at this size and
    would dominate the unbiasedness tests' thousands of selections.

    Parameters
    ----------
    X : ndarray, shape (N, d)
    n_clusters : int
        H. Fewer non-empty clusters come back if ``X`` has fewer distinct rows.
    rng : numpy RandomState
    init : {"random", "k-means++"}, default="random"
        How the H starting clients are drawn (see above).
    n_init : int, default=1
        Runs from independent starts, the one with the lowest within-cluster sum of
        squares kept. 1 is Algorithm 1 (one run); a single run with random starts often
        merges two separated groups (about 2 runs in 3 for 4 equal groups of 6), 10 runs
        rarely do.
    max_iter : int, default=100

    Returns
    -------
    labels : ndarray of int64, shape (N,)
        Cluster ids 0..H'-1, all non-empty.
    """
    if init not in _INITS:
        raise ValueError(f"kmeans: init={init!r}; expected one of {list(_INITS)}")
    X = np.asarray(X, dtype=np.float64)
    n = X.shape[0]
    sq_norms = (X**2).sum(1)
    best_labels, best_inertia = np.zeros(n, dtype=np.int64), np.inf
    for _ in range(max(1, n_init)):
        if init == "random":
            C = np.unique(X[rng.choice(n, min(n_clusters, n), replace=False)], axis=0)
        else:
            first = int(rng.randint(n))
            centres = [X[first]]
            d2 = ((X - X[first]) ** 2).sum(1)
            while len(centres) < n_clusters:
                total = d2.sum()
                if total <= 0:  # fewer distinct rows than clusters
                    break
                i = int(min(np.searchsorted(np.cumsum(d2), rng.uniform() * total, side="right"), n - 1))
                centres.append(X[i])
                d2 = np.minimum(d2, ((X - X[i]) ** 2).sum(1))
            C = np.array(centres)
        k = C.shape[0]
        labels = np.full(n, -1, dtype=np.int64)
        for _ in range(max_iter):
            dist = sq_norms[:, None] - 2.0 * (X @ C.T) + (C**2).sum(1)[None, :]
            new = dist.argmin(1)
            if np.array_equal(new, labels):
                break
            labels = new
            onehot = np.zeros((n, k))
            onehot[np.arange(n), labels] = 1.0
            counts = onehot.sum(0)
            filled = counts > 0  # an empty cluster keeps its centre
            C[filled] = (onehot.T @ X)[filled] / counts[filled, None]
        inertia = float(((X - C[labels]) ** 2).sum())
        if inertia < best_inertia:
            best_inertia, best_labels = inertia, labels
    _, relabelled = np.unique(best_labels, return_inverse=True)
    return relabelled.astype(np.int64).ravel()


def cluster_cohesion(X: np.ndarray, labels: np.ndarray, kind: str = "std") -> np.ndarray:
    """Cohesion S_h of each cluster of compressed updates (HCSFed, Eq. 5), in one of three readings.

    The paper prints ``S_h = 1/(N_h - 1) sum_{j=1, i != j}^{N_h} ||X^i - X^j||^2``, a sum over j
    with i left free. With ``W_h = sum_{i in h} ||X^i - mean_h||^2`` (the sum over the
    ``N_h (N_h - 1)`` ordered pairs of h is ``2 N_h W_h``, which is how every reading is computed):

    - ``"std"``: ``sqrt(W_h / (N_h - 1))``, the within-cluster standard deviation of the
      compressed updates; Eq. 5 is then Neyman allocation, the reading under which Eq. 8 and
      Theorem 1 hold.
    - ``"mean-pairwise"``: the mean over the ordered pairs, ``2 W_h / (N_h - 1)`` (the printed
      sum averaged over i).
    - ``"pairwise-sum"``: the sum over the ordered pairs divided by ``N_h - 1``,
      ``2 N_h W_h / (N_h - 1)``, so ``N_h S_h`` in Eq. 5 grows like ``N_h^2``.

    A singleton has S_h = 0.

    Parameters
    ----------
    X : ndarray, shape (N, d)
    labels : ndarray of int, shape (N,)
        Cluster ids 0..H-1.
    kind : {"std", "mean-pairwise", "pairwise-sum"}, default="std"
        ``"paper"``, the name of ``"pairwise-sum"`` before the readings were named for what
        they compute, is accepted with a FutureWarning.

    Returns
    -------
    S : ndarray of float, shape (H,)
    """
    kind = _cohesion_kind(kind, "cluster_cohesion")
    X = np.asarray(X, dtype=np.float64)
    H = int(labels.max()) + 1
    S = np.zeros(H)
    for h in range(H):
        Xh = X[labels == h]
        nh = Xh.shape[0]
        if nh < 2:
            continue
        within = float(((Xh - Xh.mean(0)) ** 2).sum())
        pair_sum = 2.0 * nh * within
        if kind == "pairwise-sum":
            S[h] = pair_sum / (nh - 1)
        elif kind == "mean-pairwise":
            S[h] = pair_sum / (nh * (nh - 1))
        else:
            S[h] = math.sqrt(within / (nh - 1))
    return S


def _cohesion_kind(kind: str, who: str, *, warn: bool = True) -> str:
    """``kind`` with a deprecated alias replaced by its reading (a FutureWarning naming ``who``)."""
    if kind in _COHESION_ALIASES:
        new = _COHESION_ALIASES[kind]
        if warn:
            warnings.warn(f"{who}: cohesion={kind!r} is deprecated and will be removed; it is the reading "
                          f"{new!r} (pass cohesion={new!r}; the default is now 'std')", FutureWarning, stacklevel=3)
        return new
    if kind not in COHESIONS:
        raise ValueError(f"{who}: cohesion={kind!r}; expected one of {list(COHESIONS)}")
    return kind


def allocate(sizes: np.ndarray, cohesion: np.ndarray, m: int) -> np.ndarray:
    """Real-valued sample sizes of Eq. 5, ``m N_h S_h / sum_h N_h S_h``, capped at N_h.

    A cluster whose share exceeds its size N_h gets N_h and the excess is re-shared
    among the others in the same proportions (repeated until no share exceeds its
    cap). Budget left for clusters of zero cohesion (all S_h = 0, or every positive
    cluster already full) is shared in proportion to N_h (the plain cluster sampling
    of Eq. 4).

    Parameters
    ----------
    sizes : ndarray of int, shape (H,)
        N_h.
    cohesion : ndarray of float, shape (H,)
        S_h.
    m : int
        Clients to choose, 1 <= m <= sum N_h.

    Returns
    -------
    shares : ndarray of float, shape (H,)
        0 <= shares <= N_h, summing to m.
    """
    sizes = np.asarray(sizes, dtype=np.float64)
    a = sizes * np.asarray(cohesion, dtype=np.float64)
    shares = np.zeros(sizes.size)
    full = np.zeros(sizes.size, dtype=bool)
    for weights in (a, sizes):
        while True:
            free = ~full & (weights > 0)
            budget = m - shares[full].sum()
            total = weights[free].sum()
            if budget <= _TOL or total <= 0:
                break
            shares[free] = budget * weights[free] / total
            over = free & (shares >= sizes - _TOL)
            if not over.any():
                break
            full |= over
            shares[full] = sizes[full]
        if abs(shares.sum() - m) <= 1e-7:
            break
        full |= shares > 0  # positive-cohesion clusters keep their shares; the rest of m goes by N_h
    return shares


def round_shares(shares: np.ndarray, rng: np.random.RandomState, how: str = "systematic") -> np.ndarray:
    """Integer sample sizes m_h from real shares with ``sum_h m_h = m`` exactly.

    ``"systematic"`` (the default, our choice: the paper does not say how shares are
    rounded; Madow's systematic rounding): with one uniform
    U on [0, 1) and cumulative shares C_h, ``m_h = floor(C_h + U) - floor(C_{h-1} + U)``.
    Then each m_h is floor(share_h) or ceil(share_h), ``E[m_h] = share_h`` exactly and the
    total is always m. ``"largest-remainder"``: floor every share and give the missing
    units to the largest fractional parts (deterministic; a cluster whose share is
    below one half can get nothing, round after round).

    Parameters
    ----------
    shares : ndarray of float, shape (H,)
        Real shares summing to an integer m.
    rng : numpy RandomState
        Used only by ``"systematic"``.
    how : {"systematic", "largest-remainder"}

    Returns
    -------
    m_h : ndarray of int64, shape (H,)
    """
    s = _snap(shares)
    m = int(np.rint(s.sum()))
    lo = np.floor(s)
    if how == "largest-remainder":
        extra = m - int(lo.sum())
        out = lo.copy()
        out[np.argsort(-(s - lo), kind="stable")[:extra]] += 1
        return out.astype(np.int64)
    u = rng.uniform()
    c = np.concatenate([[0.0], np.cumsum(s)])
    c[-1] = m
    out = np.diff(np.floor(c + u)).astype(np.int64)
    # Floating-point safety: each m_h is floor or ceil of its share.
    return np.clip(out, lo.astype(np.int64), np.ceil(s).astype(np.int64))


def systematic_pps(pi: np.ndarray, rng: np.random.RandomState) -> np.ndarray:
    """Systematic sampling with inclusion probabilities ``pi`` (summing to an integer).

    The units are put in random order, laid end to end as intervals of length pi_k,
    and the points U, U + 1, ..., U + m - 1 (U uniform on [0, 1)) pick the units whose
    intervals contain them. Unit k is chosen with probability exactly pi_k; a unit with
    pi_k = 1 always is; each unit at most once (pi_k <= 1).

    Parameters
    ----------
    pi : ndarray of float, shape (n,)
        Inclusion probabilities in [0, 1], sum an integer m.
    rng : numpy RandomState

    Returns
    -------
    chosen : ndarray of int64, shape (m,)
        Positions into ``pi``.
    """
    pi = np.asarray(pi, dtype=np.float64)
    m = int(np.rint(pi.sum()))
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    order = rng.permutation(pi.size)
    c = np.cumsum(pi[order])
    c[-1] = m
    points = rng.uniform() + np.arange(m)
    chosen = order[np.minimum(np.searchsorted(c, points, side="right"), pi.size - 1)]
    if np.unique(chosen).size < m:
        chosen = np.unique(chosen)  # only if rounding error let an interval of length 1 catch two points
        rest = np.setdiff1d(np.argsort(-pi, kind="stable"), chosen, assume_unique=True)
        chosen = np.concatenate([chosen, rest[: m - chosen.size]])
    return chosen.astype(np.int64)


def _snap(shares: np.ndarray) -> np.ndarray:
    s = np.asarray(shares, dtype=np.float64).copy()
    near = np.abs(s - np.round(s)) < _TOL
    s[near] = np.round(s[near])
    return s


# ---------------------------------------------------------------------------------------
# The selector
# ---------------------------------------------------------------------------------------
class HCSFedSelector(BaseSelector):
    """HCSFed, hybrid clustering-based client selection (Song et al. [1]_, Algorithm 2).

    Each round t, with m = n places:

    1. Every client trains its update G_t^k from w^t and uploads ``X_t^k = GC(G_t^k)``, ``d' = ceil(R D)`` floats
       (``compressor``); a chosen client's training is that same update, never repeated.
    2. k-means of the X_t^k into H = ``n_clusters`` clusters, one run from H random clients (Algorithm 1).
    3. Cluster h of N_h clients gets the share ``s_h = m N_h S_h / sum_h' N_h' S_h'`` (Eq. 5), S_h its cohesion
       (``cohesion``), capped at N_h with the excess re-shared (``m N_h / N`` if every S_h is 0), rounded to
       integers m_h with ``sum_h m_h = m`` (``rounding``).
    4. Inside cluster h, m_h clients are drawn by systematic PPS with ``pi_k(m_h) = min(1, c ||X_t^k||)``, c such
       that they sum to m_h (Eq. 6).
    5. Each chosen client gets ``p_k / pi_k``, pi_k its marginal inclusion probability (``weighting="inclusion"``,
       our reading), so ``E[sum_{k in S} (p_k / pi_k) G_k] = sum_k p_k G_k`` over the clients with pi_k > 0; or
       ``(N/m) p_k`` as Algorithm 2, line 15 prints it (``"paper"``). The weights are not normalised.

    A cluster with S_h = 0 (a singleton) gets no place under Eq. 5; ``uniform_mix`` gives every client a chance.
    The round in detail, the readings, clients that do not answer and the scale: :ref:`selector_hcsfed`.

    **Costs.** Every round, every client trains and uploads: N local trainings, N models down, N d' floats up
    (``max_trained=M``: M of each, the weights scaled by N / M). This simulator peaks at about ``24 N D`` bytes.

    Parameters
    ----------
    n_clusters : int, default=5
        H, at most N (the paper studies 5..10).
    compression_rate : float, default=0.01
        R = d'/d in (0, 1].
    compressor : {"grouping", "projection"} or callable, default="grouping"
        How clients compress their updates: per-group means of the parameters grouped by value (our reading), a
        Gaussian random projection, or ``compressor(global_params, rng) -> transform`` (see :ref:`hcsfed-round`).
    cohesion : {"std", "mean-pairwise", "pairwise-sum"}, default="std"
        S_h of Eq. 5 (:func:`cluster_cohesion`): the within-cluster standard deviation (Neyman allocation), the
        mean pairwise squared distance, or the all-pairs sum; ``"paper"`` is a deprecated alias of the last.
    kmeans_n_init : int, default=1
        k-means runs per round from independent starts, the best kept (:func:`kmeans`); 1 is Algorithm 1.
    kmeans_init : {"random", "k-means++"}, default="random"
        The starting centres of k-means: H random clients (Algorithm 1, line 1) or k-means++.
    rounding : {"systematic", "largest-remainder"}, default="systematic"
        How the shares of Eq. 5 become integers (:func:`round_shares`): ``E[m_h] = s_h``, so a share s_h << 1 is
        drawn in a fraction s_h of the rounds, or never (bounded weights, biased); see :ref:`hcsfed-readings`.
    weighting : {"inclusion", "paper"}, default="inclusion"
        The aggregation weights of step 5: ``p_k / pi_k`` (unbiased, our reading) or ``(N/m) p_k`` as Algorithm 2,
        line 15 prints them (biased, bounded); see :ref:`hcsfed-readings`.
    uniform_mix : float, default=0.0
        eps in [0, 1): the fraction of the m places shared by cluster size (Eq. 4) instead of Eq. 5. 0 is the paper.
    max_trained : int or None, default=None
        M, the most clients that train and upload in a round (a uniform subset; see :ref:`hcsfed-scale`).
        ``None`` trains every client (the paper). At least the ``n`` asked for and ``n_clusters``.
    random_state : None, int or numpy RandomState, default=None
        Seeds k-means, the rounding, the PPS draws, the projection and the subsets of ``max_trained``.

    Attributes
    ----------
    rng_ : numpy RandomState
        The selection stream.
    labels_, cohesion_, shares_, allocation_ : ndarray or None
        The latest round's cluster of each client, S_h, the real (capped) shares of Eq. 5 and m_h.
    inclusion_ : ndarray of float or None
        Every client's marginal inclusion probability pi_k in the latest round (0 for the clients
        Eq. 5 or Eq. 6 skipped that round: a singleton or zero-cohesion cluster, a zero update).
    compressed_dim_ : int or None
        d', the length of the compressed updates in the latest round.
    probed_ : ndarray of int or None
        With ``max_trained``, the subset A that trained in the latest round (None without).

    References
    ----------
    .. [1] Song, D., Shen, G., Gao, D., Yang, L., Zhou, X., Pan, S., Lou, W., Zhou, F. "Fast Heterogeneous
       Federated Learning with Hybrid Client Selection" (HCSFed), 2023 (Algorithms 1-2, Eqs. 4-6, Theorem 1).

    Examples
    --------
    >>> from fedselect.selection import ClientPool
    >>> from fedselect.testing import SyntheticOracle
    >>> sel = HCSFedSelector(n_clusters=3, compression_rate=0.5, random_state=0).fit(ClientPool([50] * 12))
    >>> oracle = SyntheticOracle(12, random_state=0)
    >>> len(sel.select(4, round=0, oracle=oracle)), int(sel.allocation_.sum())
    (4, 4)
    """

    def __init__(
        self,
        *,
        n_clusters: int = 5,
        compression_rate: float = 0.01,
        compressor: Any = "grouping",
        cohesion: str = "std",
        kmeans_n_init: int = 1,
        kmeans_init: str = "random",
        rounding: str = "systematic",
        weighting: str = "inclusion",
        uniform_mix: float = 0.0,
        max_trained: int | None = None,
        random_state: Any = None,
    ) -> None:
        self.n_clusters = n_clusters
        self.compression_rate = compression_rate
        self.compressor = compressor
        self.cohesion = cohesion
        self.kmeans_n_init = kmeans_n_init
        self.kmeans_init = kmeans_init
        self.rounding = rounding
        self.weighting = weighting
        self.uniform_mix = uniform_mix
        self.max_trained = max_trained
        self.random_state = random_state

    # n_clusters <= N needs the federation: checked in _fit.
    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "n_clusters": [Interval(Integral, 1, None, closed="left")],
        "compression_rate": [Interval(Real, 0, 1, closed="right")],
        "compressor": [StrOptions(sorted(COMPRESSORS)), callable],
        "cohesion": [StrOptions((*COHESIONS, *_COHESION_ALIASES))],
        "kmeans_n_init": [Interval(Integral, 1, None, closed="left")],
        "kmeans_init": [StrOptions(_INITS)],
        "rounding": [StrOptions(_ROUNDINGS)],
        "weighting": [StrOptions(_WEIGHTINGS)],
        "uniform_mix": [Interval(Real, 0, 1, closed="left")],
        "max_trained": [None, Interval(Integral, 1, None, closed="left")],
        "random_state": ["random_state"],
    }
    # Defaults that changed after runs had been recorded by name (("hcsfed", {...}) keys its parameters as given):
    # the values those runs ran when they left the parameter out. See fedselect.plugins.SelectorSpec.settings.
    _recorded_defaults: ClassVar[dict[str, tuple[Any, ...]]] = {"cohesion": ("pairwise-sum", "paper"),
                                                                "kmeans_n_init": (10,)}

    def identifying_params(self) -> dict[str, Any]:
        """As :meth:`BaseSelector.identifying_params`, with ``cohesion="pairwise-sum"`` recorded as ``"paper"``.

        The two names are one reading; runs recorded before the readings were named carry ``"paper"``, so a
        run that pins ``"pairwise-sum"`` (and ``kmeans_n_init=10``) is identified as those runs were.
        """
        params = super().identifying_params()
        if params.get("cohesion") == "pairwise-sum":
            params["cohesion"] = "paper"
        return params

    def _fit(self, pool: ClientPool) -> None:
        if self.n_clusters > pool.n_clients:
            raise ValueError(
                f"{type(self).__name__}: parameter n_clusters={self.n_clusters!r} exceeds the number of clients "
                f"N={pool.n_clients}; expected n_clusters <= N"
            )
        _cohesion_kind(self.cohesion, type(self).__name__)  # a deprecated name warns once per fit
        self.rng_ = check_random_state(self.random_state)
        self.labels_ = None
        self.cohesion_ = None
        self.shares_ = None
        self.allocation_ = None
        self.inclusion_ = None
        self.compressed_dim_ = None
        self.probed_ = None

    def _select(self, n: int, *, round: int, oracle: ClientOracle) -> Selection:
        N = self.n_clients_
        if self.max_trained is not None and int(self.max_trained) < N:
            return self._select_subset(n, int(self.max_trained), round=round, oracle=oracle)
        rng = self.rng_
        transform = make_compressor(self.compressor, oracle.global_parameters(), rng, float(self.compression_rate))
        X = np.asarray(oracle.local_updates(np.arange(N), transform=transform), dtype=np.float64)
        if X.ndim != 2 or X.shape[0] != N:
            raise ValueError(
                f"{type(self).__name__}: round {round}: the compressor gave an array of shape {X.shape}; expected "
                f"one row per client ({N})"
            )
        bad = np.flatnonzero(np.isinf(X).any(1))
        if bad.size:
            raise ValueError(
                f"{type(self).__name__}: round {round}: the compressed local updates of client(s) "
                f"{bad[:5].tolist()} are infinite (a diverged local training; lower the learning rate)"
            )
        # Clients that did not answer (NaN rows) cannot train this round: HCSFed runs on those that did.
        answered = np.flatnonzero(~np.isnan(X).any(1))
        if answered.size < max(n, int(self.n_clusters)):
            return self._fallback(n, answered)
        if answered.size < N:
            local, weights = self._sample(X[answered], self.weights_[answered] / self.weights_[answered].sum(), n)
            self.labels_ = _spread(self.labels_, answered, N, -1)
            self.inclusion_ = _spread(self.inclusion_, answered, N, 0.0)
            return Selection(answered[local], weights)
        local, weights = self._sample(X, self.weights_, n)
        return Selection(local, weights)

    def _select_subset(self, n: int, M: int, *, round: int, oracle: ClientOracle) -> Selection:
        """``max_trained``: Algorithm 2 on a uniformly random subset A of M clients, weights scaled by N / M."""
        N = self.n_clients_
        H = int(self.n_clusters)
        if M < max(n, H):
            raise ValueError(
                f"{type(self).__name__}: parameter max_trained={self.max_trained!r} is smaller than the n={n} clients "
                f"asked for or n_clusters={H}; expected max_trained >= {max(n, H)} (or None to train every client)"
            )
        probed = np.sort(self.rng_.choice(N, M, replace=False))
        self.probed_ = probed
        transform = make_compressor(self.compressor, oracle.global_parameters(), self.rng_,
                                    float(self.compression_rate))
        X = np.asarray(oracle.local_updates(probed, transform=transform), dtype=np.float64)
        if X.ndim != 2 or X.shape[0] != M:
            raise ValueError(
                f"{type(self).__name__}: round {round}: the compressor gave an array of shape {X.shape}; expected "
                f"one row per trained client ({M})"
            )
        bad = np.flatnonzero(np.isinf(X).any(1))
        if bad.size:
            raise ValueError(
                f"{type(self).__name__}: round {round}: the compressed local updates of client(s) "
                f"{probed[bad][:5].tolist()} are infinite (a diverged local training; lower the learning rate)"
            )
        rows = np.flatnonzero(~np.isnan(X).any(1))  # the clients of A that answered
        if rows.size < max(n, H):
            return self._fallback(n, probed[rows])
        # A is uniform, so (N / M) p_k makes sum_{k in A} an unbiased total; clients of A that did not answer
        # hand their share to those that did (as the uncapped scheme renormalises over the answers).
        p = self.weights_[probed[rows]] * (N / M)
        p = p * (self.weights_[probed].sum() * (N / M) / p.sum())
        local, weights = self._sample(X[rows], p, n)
        self.labels_ = _spread(self.labels_, probed[rows], N, -1)
        self.inclusion_ = _spread(self.inclusion_, probed[rows], N, 0.0)
        return Selection(probed[rows][local], weights)

    def _fallback(self, n: int, answered: np.ndarray) -> Selection:
        """Too few clients answered to cluster: n uniformly random clients, weighted p'_k M / n (Eq. 4's estimator).

        Drawn among the M clients that answered when at least n did (p'_k: p_k renormalised
        over them), else among all N (p'_k = p_k, M = N).
        """
        N = self.n_clients_
        pool = answered if answered.size >= n else np.arange(N)
        clients = np.sort(self.rng_.choice(pool, n, replace=False))
        self.labels_ = None
        self.inclusion_ = None
        p = self.weights_[pool] / self.weights_[pool].sum()
        return Selection(clients, p[np.searchsorted(pool, clients)] * pool.size / n)

    def _sample(self, X: np.ndarray, p: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Algorithm 1 on the rows of ``X`` with client weights ``p``: (chosen rows, their aggregation weights).

        The weights are ``p_k / pi_k`` (``weighting="inclusion"``) or ``(N/m) p_k`` with N the rows of ``X``
        (``weighting="paper"``, Algorithm 2, line 15).
        """
        N = X.shape[0]
        rng = self.rng_
        labels = kmeans(X, int(self.n_clusters), rng, init=self.kmeans_init, n_init=int(self.kmeans_n_init))
        H = int(labels.max()) + 1
        sizes = np.bincount(labels, minlength=H)
        S = cluster_cohesion(X, labels, _cohesion_kind(self.cohesion, type(self).__name__, warn=False))
        shares = allocate(sizes, S, n)
        eps = float(self.uniform_mix)
        if eps > 0:
            shares = (1.0 - eps) * shares + eps * n * sizes / N
        shares = _snap(shares)
        m_h = round_shares(shares, rng, self.rounding)
        norms = np.linalg.norm(X, axis=1)

        chosen: list[np.ndarray] = []
        pi = np.zeros(N)
        for h in range(H):
            members = np.flatnonzero(labels == h)
            q = norms[members]
            pi_of = {int(m_h[h]): capped_probabilities(q, int(m_h[h]))}
            if self.rounding == "systematic":
                lo, frac = math.floor(shares[h]), shares[h] - math.floor(shares[h])
                for size in (lo, lo + 1):
                    if size not in pi_of:
                        pi_of[size] = capped_probabilities(q, size)
                pi[members] = (1.0 - frac) * pi_of[lo] + frac * pi_of[lo + 1] if frac > 0 else pi_of[lo]
            else:
                pi[members] = pi_of[int(m_h[h])]
            if m_h[h] > 0:
                chosen.append(members[systematic_pps(pi_of[int(m_h[h])], rng)])
        clients = np.sort(np.concatenate(chosen))
        self.labels_ = labels
        self.cohesion_ = S
        self.shares_ = shares
        self.allocation_ = m_h
        self.inclusion_ = pi
        self.compressed_dim_ = int(X.shape[1])
        if self.weighting == "paper":
            return clients, p[clients] * (N / n)
        return clients, p[clients] / pi[clients]


def _spread(values: np.ndarray | None, rows: np.ndarray, n: int, fill: float) -> np.ndarray | None:
    """Per-row values of the answering clients spread over all n clients (``fill`` for the others)."""
    if values is None:
        return None
    out = np.full(n, fill, dtype=np.asarray(values).dtype)
    out[rows] = values
    return out


@hookimpl
def register_selectors(register):
    register(HCSFedSelector, name="hcsfed", aliases=("hcs-fed",))
