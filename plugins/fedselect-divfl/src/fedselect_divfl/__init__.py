"""fedselect-divfl: DivFL, diverse client selection by greedy facility-location maximisation.

A third-party fedselect plugin, and the template for writing one. The distribution
declares the entry point ::

    [project.entry-points.fedselect]
    divfl = "fedselect_divfl"

so once it is installed, ``fedselect.get_selector("divfl")`` builds a
:class:`DivFLSelector` and ``fedselect compare --selectors divfl`` runs it. It also ships
the paper's setting (:mod:`fedselect_divfl.setting`): the partition ``"power-law"``
(``make_federation("mnist", partition="power-law")``) and the presets ``divfl-synthetic``
and ``divfl-mnist`` (``fedselect reproduce divfl-synthetic``).
"""

from __future__ import annotations

from numbers import Integral
from typing import Any, ClassVar

import numpy as np
from sklearn.utils import check_random_state

import fedselect
from fedselect import BaseSelector, ClientOracle, ClientPool, RoundFeedback, Selection
from fedselect.selection import Interval, StrOptions

from .setting import PRESETS, power_law_partition

__all__ = ["PRESETS", "DivFLSelector", "facility_location_greedy", "pairwise_distances", "power_law_partition"]
__version__ = "0.1"

_SOURCES = ("stale", "probe", "probe-once")


def pairwise_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Euclidean distances ``||a_i - b_j||`` between the rows of ``a`` and ``b``, in float64.

    Computed from Gram products (one BLAS call, no ``len(a) x len(b) x D`` temporary);
    rounding can leave tiny negative squares, which are clipped to zero.
    """
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    sq = np.einsum("ij,ij->i", a64, a64)[:, None] + np.einsum("ij,ij->i", b64, b64)[None, :] - 2.0 * (a64 @ b64.T)
    return np.sqrt(np.maximum(sq, 0.0))


def facility_location_greedy(
    distances: np.ndarray,
    n: int,
    *,
    order: np.ndarray | None = None,
) -> np.ndarray:
    """Greedily choose ``n`` columns of ``distances`` minimising ``G(S) = sum_k min_{j in S} d(k, j)``.

    Minimising G is maximising the facility-location function ``F(S) = sum_k (C - min_{j in S} d(k, j))``
    for a constant C >= max d, which is monotone submodular, so the greedy choice is within a factor
    ``1 - 1/e`` of the best ``F`` (Nemhauser, Wolsey and Fisher, 1978). Each step adds the candidate
    with the smallest ``G(S + {j})``.

    Parameters
    ----------
    distances : ndarray, shape (M, M)
        ``d(k, j)`` between the M clients (rows are the clients to cover, columns the candidates).
    n : int
        How many columns to choose, at most M.
    order : ndarray of int, optional
        The order in which candidates are scanned; ties go to the earliest (default: by index).

    Returns
    -------
    ndarray of int
        S in the order chosen.

    Examples
    --------
    >>> d = np.array([[0.0, 1, 5, 5], [1, 0, 5, 5], [5, 5, 0, 1], [5, 5, 1, 0]])
    >>> facility_location_greedy(d, 2).tolist()
    [0, 2]
    """
    m = distances.shape[0]
    picked: list[int] = []
    cover = np.full(m, np.inf)  # min_{j in S} d(k, j); +inf for the empty S
    free = np.ones(m, dtype=bool)
    order = np.arange(m) if order is None else np.asarray(order, dtype=np.int64)
    while len(picked) < n:
        cand = order[free[order]]
        # G(S + {j}) for every candidate j at once: an (M, |cand|) minimum, summed over the rows.
        totals = np.minimum(cover[:, None], distances[:, cand]).sum(axis=0)
        best = int(cand[int(np.argmin(totals))])
        picked.append(best)
        free[best] = False
        cover = np.minimum(cover, distances[:, best])
    return np.asarray(picked, dtype=np.int64)


class DivFLSelector(BaseSelector):
    """DivFL: diverse client selection (Balakrishnan, Li, Zhou, Himayat, Smith and Bilmes [1]_).

    Aggregating only the updates of a subset S approximates the full aggregate the better, the
    closer every client's gradient is to that of some member of S. The paper bounds the
    approximation error by ``G(S) = sum_{k in [N]} min_{j in S} ||g_k - g_j||`` (Section 3) and
    chooses ``S`` with ``|S| = n`` to minimise it, i.e. to maximise the submodular
    facility-location function ``F(S) = sum_k (C - min_{j in S} ||g_k - g_j||)``, by the
    greedy algorithm (Algorithm 1, DivFL): starting from the empty set, each step adds the client
    that lowers G the most (:func:`facility_location_greedy`). Clients whose updates look alike
    thus compete for one place, and each chosen client stands for a cluster of similar ones. No
    aggregation weights are returned: the runtime's own rule applies (the official code
    aggregates the chosen updates by data size).

    Where the gradients ``g_k`` come from (parameter ``source``):

    ``"stale"`` (default; the paper's practical version)
        ``g_k`` is client k's latest local update ``w_k - w^t``, received the last time it
        trained (``needs = {"updates"}``: it costs nothing extra). Clients that have never
        trained have no representation; they are treated as maximally dissimilar to everyone
        (no other client can cover them, so the facility-location gain of adding one is the
        largest possible) and are therefore chosen first, uniformly at random among them. Once
        fewer than ``n`` remain unseen, all of them are taken and the rest of S is chosen
        greedily among the seen clients, given them. After ``ceil(N / n)`` rounds every client has
        reported once.
    ``"probe-once"`` (the official code)
        at the first :meth:`select` after :meth:`fit`, every client's current local update is
        requested through ``oracle.local_updates`` (N local trainings and N uploads, once; the
        chosen clients are then not trained again), so the first selection is already the greedy
        over all N clients; from then on the representations are stale as with ``"stale"``: a
        client's is replaced only when it trains again (``needs = {"updates"}``). This is what
        the official code does (``flearn/trainers/fedavg.py``: the gradients of all clients are
        collected at iteration 0 and afterwards only the selected clients' are overwritten). The
        official code also collects all gradients again every round when one client is chosen
        per round (``clients_per_round == 1``); use ``"probe"`` for that. A client that did not
        answer the probe is treated as never seen (chosen first, as under ``"stale"``).
    ``"probe"`` (the paper's idealised version)
        every round, every client's current local update is requested through
        ``oracle.local_updates`` (N local trainings and N uploads per round, paid and recorded;
        the chosen clients are then not trained again). Exact, and expensive.

    With ``projection_dim=p`` each update is multiplied by a fixed Gaussian matrix
    ``R / sqrt(p)`` of shape (D, p), drawn once per :meth:`fit` from ``random_state``, before the
    distances are computed; by the Johnson-Lindenstrauss lemma distances are kept up to a factor
    ``1 +- eps`` for ``p ~ log(N) / eps^2``. With a probing source the projection is applied
    client-side, so each client uploads p floats rather than its model (the paper's
    communication-efficient variant of DivFL compresses what is uploaded in the same spirit).
    The (D, p) matrix is held in memory (``4 D p`` bytes).

    Cost per round: the ``N x N`` distances are refreshed for the clients that reported,
    O(|S| N p) (``p = D`` without projection); the greedy is O(n N^2).

    **Clients that do not answer** the probe (NaN rows, see :class:`fedselect.ClientOracle`)
    keep their last representation and still count among the clients to cover, but are
    not chosen while at least ``n`` clients answered (they cannot train this round).

    Parameters
    ----------
    source : {"stale", "probe", "probe-once"}, default="stale"
        Where the client representations come from (see above).
    projection_dim : int or None, default=None
        Compress every update to this many dimensions by a seeded random projection before
        measuring distances; ``None`` uses the full updates.
    random_state : None, int or numpy RandomState, default=None
        Seeds the random first picks, the tie-breaking order and the projection.

    Attributes
    ----------
    rng_ : numpy RandomState
        The selection stream.
    representations_ : ndarray of float32, shape (n_clients, p), or None
        Each client's representation (its projected update); None until the first update.
    seen_ : ndarray of bool, shape (n_clients,)
        Whether a client's representation is known.
    distances_ : ndarray of float64, shape (n_clients, n_clients), or None
        ``||g_k - g_j||`` between the representations (meaningful between seen clients only).
    last_objective_ : float or None
        ``G(S)`` over the seen clients for the latest selection (None when no client was seen).

    References
    ----------
    .. [1] Balakrishnan, R., Li, T., Zhou, T., Himayat, N., Smith, V., Bilmes, J. "Diverse Client
       Selection for Federated Learning via Submodular Maximization." ICLR 2022
       (https://openreview.net/forum?id=nwKXyFvaUm; Section 3 and Algorithm 1).

    Examples
    --------
    >>> from fedselect import ClientPool
    >>> from fedselect.testing import SyntheticOracle
    >>> sel = DivFLSelector(source="probe", random_state=0).fit(ClientPool([50] * 8))
    >>> oracle = SyntheticOracle(8, n_groups=4, random_state=0)
    >>> chosen = sel.select(4, round=0, oracle=oracle)
    >>> sorted(oracle.groups[chosen.clients].tolist())  # one client from each of the 4 groups
    [0, 1, 2, 3]
    """

    def __init__(self, *, source: str = "stale", projection_dim: int | None = None, random_state: Any = None) -> None:
        self.source = source
        self.projection_dim = projection_dim
        self.random_state = random_state

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        """The stale sources learn from the updates of the round; the probe asks for its own."""
        return frozenset() if self.source == "probe" else frozenset({"updates"})

    # Declared as data: fedselect checks them at fit, names the parameter in every message, and its
    # tests generate invalid values for each of them.
    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "source": [StrOptions(_SOURCES)],
        "projection_dim": [None, Interval(Integral, 1, None, closed="left")],
        "random_state": ["random_state"],
    }

    def _fit(self, pool: ClientPool) -> None:
        self.rng_ = check_random_state(self.random_state)
        self._projection_seed = int(self.rng_.randint(2**31 - 1))
        self._projection: np.ndarray | None = None
        self.representations_: np.ndarray | None = None
        self.seen_ = np.zeros(self.n_clients_, dtype=bool)
        self.distances_: np.ndarray | None = None
        self.last_objective_: float | None = None
        self._probed = False

    # -- representations -------------------------------------------------------------
    def _project(self, update: np.ndarray) -> np.ndarray:
        """One flattened update (or a stack of them) to its representation; applied client-side by the probe."""
        update = np.asarray(update, dtype=np.float32)
        if self.projection_dim is None:
            return update
        d = update.shape[-1]
        if self._projection is None or self._projection.shape[0] != d:
            # One seed per fit, so every client and every round share the projection.
            rng = np.random.default_rng(self._projection_seed)
            p = int(self.projection_dim)
            self._projection = rng.standard_normal((d, p), dtype=np.float32) / np.float32(np.sqrt(p))
        return update @ self._projection

    def _set_representations(self, ids: np.ndarray, rows: Any, *, round: int, full: bool = False) -> None:
        rows = np.asarray(rows, dtype=np.float32)
        if rows.ndim != 2 or rows.shape[0] != ids.size:
            raise ValueError(
                f"{type(self).__name__}: round {round}: expected one flattened update per client ({ids.size}), "
                f"got shape {rows.shape}"
            )
        bad = ~np.isfinite(rows).all(axis=1)
        if bad.any():
            raise ValueError(
                f"{type(self).__name__}: round {round}: the update of client(s) {ids[bad][:10].tolist()} holds "
                "NaN or inf; the run diverged (lower the learning rate)"
            )
        if self.representations_ is not None and self.representations_.shape[1] != rows.shape[1] and not full:
            raise ValueError(
                f"{type(self).__name__}: round {round}: updates have {rows.shape[1]} entries, the stored ones "
                f"{self.representations_.shape[1]}"
            )
        if self.representations_ is None or self.representations_.shape[1] != rows.shape[1]:
            self.representations_ = np.zeros((self.n_clients_, rows.shape[1]), dtype=np.float32)
            self.distances_ = np.zeros((self.n_clients_, self.n_clients_))
        ids, last = np.unique(ids[::-1], return_index=True)  # a repeated id keeps its last row
        self.representations_[ids] = rows[::-1][last]
        if full:
            self.distances_ = pairwise_distances(self.representations_, self.representations_)
        else:  # only the rows and columns of the clients that reported change
            d = pairwise_distances(self.representations_[ids], self.representations_)
            self.distances_[ids, :] = d  # type: ignore[index]
            self.distances_[:, ids] = d.T  # type: ignore[index]
        self.seen_[ids] = True

    # -- selection -------------------------------------------------------------------
    def _select(self, n: int, *, round: int, oracle: ClientOracle) -> Selection:
        reachable = np.ones(self.n_clients_, dtype=bool)
        if self.source == "probe" or (self.source == "probe-once" and not self._probed):
            self._probed = True
            everyone = np.arange(self.n_clients_)
            transform = None if self.projection_dim is None else self._project
            rows = np.asarray(oracle.local_updates(everyone, transform=transform), dtype=np.float32)
            if transform is None:
                rows = self._project(rows)
            # A client that did not answer (NaN row) keeps its last representation and cannot train this round.
            answered = ~np.isnan(rows).any(axis=1)
            if answered.any():
                self._set_representations(everyone[answered], rows[answered], round=round, full=bool(answered.all()))
            if answered.sum() >= n:
                reachable = answered
        unseen = np.flatnonzero(~self.seen_ & reachable)
        if unseen.size >= n:
            self.last_objective_ = None
            return Selection(np.sort(self.rng_.choice(unseen, size=n, replace=False)))
        seen = np.flatnonzero(self.seen_)
        dist = self.distances_[np.ix_(seen, seen)]  # type: ignore[index]
        candidates = np.flatnonzero(reachable[seen])
        # A random scan order breaks ties (e.g. identical updates) without favouring low ids; scanning only
        # the reachable clients keeps the others out while they still count among the clients to cover.
        picks = facility_location_greedy(
            dist, n - unseen.size, order=candidates[self.rng_.permutation(candidates.size)]
        )
        self.last_objective_ = float(dist[:, picks].min(axis=1).sum())
        return Selection(np.sort(np.concatenate([unseen, seen[picks]])))

    def _update(self, feedback: RoundFeedback) -> None:
        if self.source == "probe":
            return
        ids = np.asarray(feedback.clients, dtype=np.int64)
        if ids.size == 0:
            return
        if feedback.updates is None:
            raise ValueError(
                f"{type(self).__name__}: round {feedback.round}: the feedback lacks the updates; the runtime must "
                "honour needs={'updates'}"
            )
        self._set_representations(ids, self._project(feedback.updates), round=int(feedback.round))


@fedselect.hookimpl
def register_selectors(register):
    register(DivFLSelector, name="divfl")


@fedselect.hookimpl
def register_partitions(register):
    register(power_law_partition, name="power-law")


@fedselect.hookimpl
def register_presets(register):
    for preset in PRESETS:
        register(preset)
