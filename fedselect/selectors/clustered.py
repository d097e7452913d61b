"""Clustered sampling: one client drawn from each of m distributions that split the clients' weights."""

from __future__ import annotations

import warnings
from numbers import Integral
from typing import Any, ClassVar

import numpy as np
from sklearn.utils import check_random_state

from .._validation import Interval, StrOptions
from ..hookspecs import hookimpl
from ..selection import BaseSelector, ClientOracle, ClientPool, RoundFeedback, Selection

__all__ = ["ClusteredSamplingSelector", "allocate"]

_METHODS = ("size", "similarity")
_LINKAGES = ("ward", "single", "complete", "average", "weighted", "centroid", "median")
_DISTANCES = ("cosine", "l2", "l1")
_INITS = ("zeros", "probe", "size")
_LINKAGE_INPUTS = ("distances", "rows")
_SIMILARITIES = ("dense", "knn")
_TOL = 1e-9


def _pour(
    stream_c: np.ndarray, stream_m: np.ndarray, room: np.ndarray, segs: list[list[tuple[int, float]]]
) -> None:
    """Pour the stream of (client, mass) into the rows' free room, in row order, splitting a client
    between consecutive rows where it does not fit (Algorithm 1's filling)."""
    row = 0
    for k, left in zip(stream_c.tolist(), stream_m.tolist()):
        while left > _TOL:
            while row < room.size - 1 and room[row] <= _TOL:
                row += 1
            take = left if row == room.size - 1 else min(room[row], left)  # rounding residue ends in the last row
            segs[row].append((k, take))
            room[row] -= take
            left -= take


def allocate(
    groups: list[np.ndarray], mass: np.ndarray, m: int, *, heads: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lay the client masses ``m p_k`` into ``m`` distributions of total 1 each.

    Returns the distributions as segments ``(client, length, row)``: distribution j
    gives client k the total length of k's segments with row j. Every client's
    segments add up to ``m p_k`` and every row to 1 (the paper's Section 3), so one draw
    from each distribution, each weighted 1/m, is unbiased (Proposition 1).

    ``heads=False`` (Algorithm 1): the clients of ``groups``, in the order given, are
    poured into distributions 0, 1, ..., m-1, each filled up to 1 before the next; a
    client that does not fit is split between consecutive distributions. With singleton
    groups sorted by decreasing ``p_k`` this is the paper's Algorithm 1.

    ``heads=True`` (Algorithm 2): a group heavier than one distribution (possible only
    for a single client with ``m p_k > 1``) first takes whole distributions, its
    remainder becoming an ordinary piece; the heaviest remaining pieces, one per free
    distribution, each start a distribution ("the m largest clusters"); the clients of
    the other pieces, in the order given, are poured into the room left, as above.

    Parameters
    ----------
    groups : list of ndarray of int
        The client groups, in filling order (clients inside a group in filling order).
    mass : ndarray of float, shape (n_clients,)
        ``m p_k``, summing to m.
    m : int
        Number of distributions.
    heads : bool, default=False
        Algorithm 2's layout instead of Algorithm 1's.

    Returns
    -------
    clients, lengths, rows : ndarray
        One entry per segment, sorted by row.
    """
    segs: list[list[tuple[int, float]]] = [[] for _ in range(m)]
    room = np.ones(m)
    groups = [np.asarray(g, dtype=np.int64) for g in groups]
    if not heads:
        stream = np.concatenate(groups) if groups else np.zeros(0, dtype=np.int64)
        _pour(stream, mass[stream].astype(np.float64), room, segs)
    else:
        row = 0
        pieces: list[tuple[np.ndarray, np.ndarray]] = []
        for g in groups:
            total = float(mass[g].sum())
            if total > 1.0 + _TOL and g.size == 1:
                whole = int(np.floor(total + _TOL))
                for _ in range(whole):
                    segs[row].append((int(g[0]), 1.0))
                    room[row] = 0.0
                    row += 1
                if total - whole > _TOL:
                    pieces.append((g, np.array([total - whole])))
            elif total > 1.0 + _TOL:
                raise ValueError("allocate: a group of several clients is heavier than one distribution")
            elif total > 0:
                pieces.append((g, mass[g].astype(np.float64)))
        totals = np.array([p[1].sum() for p in pieces])
        head_ids = set(np.argsort(-totals, kind="stable")[: m - row].tolist())
        for i in sorted(head_ids):
            for k, length in zip(pieces[i][0].tolist(), pieces[i][1].tolist()):
                segs[row].append((k, length))
            room[row] -= float(pieces[i][1].sum())
            row += 1
        rest = [pieces[i] for i in range(len(pieces)) if i not in head_ids]
        if rest:
            _pour(np.concatenate([r[0] for r in rest]), np.concatenate([r[1] for r in rest]), room, segs)
    clients = np.array([k for s in segs for k, _ in s], dtype=np.int64)
    lengths = np.array([x for s in segs for _, x in s], dtype=np.float64)
    rows = np.array([j for j, s in enumerate(segs) for _ in s], dtype=np.int64)
    return clients, lengths, rows


class ClusteredSamplingSelector(BaseSelector):
    """Clustered sampling (Fraboni, Vidal, Kameni and Lorenzi [1]_, ICML 2021).

    The ``n = m`` places of a round are m independent draws, draw j from its own distribution ``r_j`` over the
    clients, with (Section 3, Proposition 1)

    * ``sum_k r_{j,k} = 1`` for every j, and
    * ``sum_j r_{j,k} = m p_k`` for every client k,

    so with the weight ``1/m`` for every draw (duplicates merged, their weights summed) the aggregate is unbiased,
    ``E[sum_j (1/m) delta_{k_j}] = sum_k p_k delta_k`` (Proposition 1), and its weights have a smaller variance
    than multinomial sampling's (Theorem 1). A selection may hold fewer than m distinct clients.
    ``method="size"`` (Algorithm 1) pours the masses ``m p_k``, largest first, into distributions 1, ..., m in
    turn. ``method="similarity"`` (Algorithm 2) takes each client's latest update as its representative
    gradient, builds a hierarchical clustering of the representatives (``linkage`` on their ``distance``), cuts
    it where a cluster's weight would exceed 1/m and fills the distributions from the clusters. The algorithms
    in detail, the readings of the official code, clients that do not answer and the scale:
    :ref:`selector_clustered`.

    **Costs.** Algorithm 1: nothing. Algorithm 2: nothing beyond the updates chosen clients send anyway
    (``init="probe"``: N local trainings in the first round); on the server ``4 N D`` bytes of representatives and,
    with the dense similarity, about ``40 N^2`` bytes and O(N^2) time or more at each rebuild of the tree
    (``similarity="knn"``: ``16 N k`` bytes).

    Parameters
    ----------
    method : {"size", "similarity"}, default="size"
        Algorithm 1 or Algorithm 2.
    linkage : str, default="ward"
        The ``scipy.cluster.hierarchy.linkage`` method of Algorithm 2 (the paper's is Ward's): "ward", "single",
        "complete", "average", "weighted", "centroid" or "median" (see :ref:`clustered-readings`).
    distance : {"cosine", "l2", "l1"}, default="cosine"
        Distance between representative gradients: the angle ``arccos`` of their cosine similarity (the paper's
        and the official code's), the Euclidean distance, or the L1 distance.
    init : {"zeros", "probe", "size"}, default="zeros"
        Representatives of clients not seen yet: zero vectors (the official code), every client's update probed
        in the first round, or Algorithm 1 until every client has reported (see :ref:`clustered-readings`).
    linkage_input : {"distances", "rows"}, default="distances"
        How the distance matrix is handed to scipy: condensed distances, or its rows as Euclidean feature vectors
        (the official code; see :ref:`clustered-readings`). The dense similarity only.
    similarity : {"dense", "knn"}, default="dense"
        Algorithm 2's similarity: all N x N distances (the paper) or a k-nearest-neighbour graph with single
        linkage (needs ``linkage="single"``; see :ref:`clustered-scale`).
    n_neighbors : int, default=10
        k of ``similarity="knn"`` (clipped to N - 1); ignored by the dense similarity.
    random_state : None, int or numpy RandomState, default=None
        Seeds the draws (and the order of clients inside the filler clusters).

    Attributes
    ----------
    rng_ : numpy RandomState
        The selection stream.
    segments_ : tuple of ndarray
        The distributions as (clients, lengths, rows) segments of ``[0, m)`` (:func:`allocate`, :meth:`distributions`).
    m_ : int or None
        The m the current distributions were built for.
    clusters_ : ndarray of int or None
        Algorithm 2's cluster label of each client at the latest clustering.
    representatives_ : ndarray of float32, shape (n_clients, D), or None
        Algorithm 2's latest update of every client (zeros for unseen ones).
    seen_ : ndarray of bool
        Which clients have a representative gradient.
    n_clusterings_ : int
        How many times Algorithm 2 rebuilt its tree.

    References
    ----------
    .. [1] Fraboni, Y., Vidal, R., Kameni, L., Lorenzi, M. "Clustered Sampling: Low-Variance and Improved
       Representativity for Clients Selection in Federated Learning." ICML 2021 (Algorithms 1-2, Proposition 1,
       Theorem 1); official code: github.com/Accenture/Labs-Federated-Learning, ``py_func/clustering.py``.

    Examples
    --------
    >>> from fedselect.selection import ClientPool
    >>> from fedselect.testing import SyntheticOracle
    >>> sel = ClusteredSamplingSelector(random_state=0).fit(ClientPool([10, 20, 30, 40]))
    >>> sel.distributions(2).round(2)
    array([[0. , 0. , 0.2, 0.8],
           [0.2, 0.4, 0.4, 0. ]])
    >>> s = sel.select(2, round=0, oracle=SyntheticOracle(4))
    >>> s.weights.tolist()
    [0.5, 0.5]
    """

    variable_size = True
    diagnostics = ("clusters_",)  # kept by fedselect.compare with each run

    def __init__(
        self,
        *,
        method: str = "size",
        linkage: str = "ward",
        distance: str = "cosine",
        init: str = "zeros",
        linkage_input: str = "distances",
        similarity: str = "dense",
        n_neighbors: int = 10,
        random_state: Any = None,
    ) -> None:
        self.method = method
        self.linkage = linkage
        self.distance = distance
        self.init = init
        self.linkage_input = linkage_input
        self.similarity = similarity
        self.n_neighbors = n_neighbors
        self.random_state = random_state

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        """Algorithm 2 needs each reporting client's update; Algorithm 1 nothing."""
        return frozenset({"updates"}) if self.method == "similarity" else frozenset()

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "method": [StrOptions(_METHODS)],
        "linkage": [StrOptions(_LINKAGES)],
        "distance": [StrOptions(_DISTANCES)],
        "init": [StrOptions(_INITS)],
        "linkage_input": [StrOptions(_LINKAGE_INPUTS)],
        "similarity": [StrOptions(_SIMILARITIES)],
        "n_neighbors": [Interval(Integral, 1, None, closed="left")],
        "random_state": ["random_state"],
    }

    def _validate_params(self) -> None:
        super()._validate_params()
        if self.method == "similarity" and self.similarity == "knn" and self.linkage != "single":
            raise ValueError(
                f"{type(self).__name__}: parameter linkage={self.linkage!r} cannot be used with similarity='knn': "
                "a nearest-neighbour graph gives the single-linkage tree only (its minimum spanning tree); "
                "set linkage='single', or similarity='dense'"
            )

    def _fit(self, pool: ClientPool) -> None:
        self.rng_ = check_random_state(self.random_state)
        self.segments_: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.m_: int | None = None
        self.clusters_: np.ndarray | None = None
        self.representatives_: np.ndarray | None = None
        self.seen_ = np.zeros(self.n_clients_, dtype=bool)
        self.n_clusterings_ = 0
        self._gram: np.ndarray | None = None
        self._stale = True
        self._knn: tuple[np.ndarray, np.ndarray] | None = None  # neighbour ids and distances, N x k each
        self._pending = np.zeros(self.n_clients_, dtype=bool)  # representatives changed since the graph

    # -- Algorithm 1 ------------------------------------------------------------------
    def _size_segments(self, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        order = np.argsort(-self.weights_, kind="stable")
        return allocate([np.array([k]) for k in order], m * self.weights_, m)

    # -- Algorithm 2 ------------------------------------------------------------------
    def _distance_matrix(self) -> np.ndarray:
        gram = self._gram if self._gram is not None else np.zeros((self.n_clients_, self.n_clients_))
        sq = np.diag(gram).copy()
        if self.distance == "cosine":
            norms = np.sqrt(np.maximum(sq, 0.0))
            denom = np.outer(norms, norms)
            with np.errstate(invalid="ignore", divide="ignore"):
                cos = np.where(denom > 0, gram / np.where(denom > 0, denom, 1.0), 1.0)
            # The official code gives a zero vector distance 0 to everything (cos := 1).
            d = np.arccos(np.clip(cos, -1.0, 1.0))
        elif self.distance == "l2":
            d = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * gram, 0.0))
        else:
            d = self._l1_matrix()
        np.fill_diagonal(d, 0.0)
        return 0.5 * (d + d.T)

    def _l1_matrix(self) -> np.ndarray:
        n = self.n_clients_
        d = np.zeros((n, n))
        if self.representatives_ is None:
            return d
        r = self.representatives_
        for i in range(n):
            d[i] = np.abs(r - r[i]).sum(axis=1, dtype=np.float64)
        return d

    # -- Algorithm 2 on a nearest-neighbour graph ---------------------------------------------
    def _distance_rows(self, ids: np.ndarray) -> np.ndarray:
        """Distances (``distance``) from the representatives of ``ids`` to every client, float64 (len(ids) x N)."""
        n = self.n_clients_
        r = self.representatives_
        if r is None:
            return np.zeros((ids.size, n))
        if self.distance == "l1":
            return np.stack([np.abs(r - r[i]).sum(axis=1, dtype=np.float64) for i in ids.tolist()])
        gram = (r[ids] @ r.T).astype(np.float64)
        sq = self._sq_norms
        if self.distance == "l2":
            return np.sqrt(np.maximum(sq[ids, None] + sq[None, :] - 2.0 * gram, 0.0))
        norms = np.sqrt(np.maximum(sq, 0.0))
        denom = norms[ids, None] * norms[None, :]
        with np.errstate(invalid="ignore", divide="ignore"):
            cos = np.where(denom > 0, gram / np.where(denom > 0, denom, 1.0), 1.0)  # a zero vector: distance 0
        return np.arccos(np.clip(cos, -1.0, 1.0))

    def _update_graph(self) -> None:
        """Bring the k-nearest-neighbour lists up to date with the representatives that changed."""
        n = self.n_clients_
        k = min(int(self.n_neighbors), n - 1)
        if self._knn is None:  # every representative zero: every distance is 0, any k others are neighbours
            nbr = (np.arange(n)[:, None] + np.arange(1, k + 1)[None, :]) % n
            self._knn = (nbr.astype(np.int64), np.zeros((n, k)))
        nbr, dist = self._knn
        changed = np.flatnonzero(self._pending)
        self._pending[:] = False
        for start in range(0, changed.size, 128):
            ids = changed[start : start + 128]
            rows = self._distance_rows(ids)  # (c, N)
            rows[np.arange(ids.size), ids] = np.inf
            # Other clients: entries that are changed clients get their new distance; the changed clients are
            # candidates everywhere (unless already listed); each list keeps its k nearest.
            pos = np.full(n, -1, dtype=np.int64)
            pos[ids] = np.arange(ids.size)
            listed = pos[nbr]  # (N, k): which changed client an entry is, or -1
            hit = listed >= 0
            dist[hit] = rows[listed[hit], np.nonzero(hit)[0]]
            cand = rows.T.copy()  # (N, c)
            already = np.zeros((n, ids.size), dtype=bool)
            already[np.nonzero(hit)[0], listed[hit]] = True
            cand[already] = np.inf
            all_ids = np.concatenate([nbr, np.broadcast_to(ids, (n, ids.size))], axis=1)
            all_d = np.concatenate([dist, cand], axis=1)
            keep = np.argsort(all_d, axis=1, kind="stable")[:, :k]
            nbr = np.take_along_axis(all_ids, keep, axis=1)
            dist = np.take_along_axis(all_d, keep, axis=1)
            # The changed clients' own lists: exact, from their full rows.
            own = np.argsort(rows, axis=1, kind="stable")[:, :k]
            nbr[ids] = own
            dist[ids] = np.take_along_axis(rows, own, axis=1)
        self._knn = (np.ascontiguousarray(nbr), np.ascontiguousarray(dist))

    def _knn_labels(self, m: int) -> np.ndarray:
        """Clusters of weight <= 1/m cut from the single-linkage tree of the neighbour graph (Kruskal on its MST)."""
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import minimum_spanning_tree

        n = self.n_clients_
        self._update_graph()
        nbr, dist = self._knn  # type: ignore[misc]
        k = nbr.shape[1]
        tiny = np.finfo(np.float64).tiny  # a sparse graph drops zero weights: a distance of 0 is kept as tiny
        rows = np.repeat(np.arange(n), k)
        graph = coo_matrix((np.maximum(dist.ravel(), tiny), (rows, nbr.ravel())), shape=(n, n)).tocsr()
        graph = graph.maximum(graph.T)
        tree = minimum_spanning_tree(graph).tocoo()
        order = np.lexsort((tree.col, tree.row, tree.data))  # by distance, ties by client ids
        parent = np.arange(n)
        weight = self.weights_.copy()
        frozen = np.zeros(n, dtype=bool)
        limit = (1.0 / m) * (1.0 + 1e-9)

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for a, b in zip(tree.row[order].tolist(), tree.col[order].tolist()):
            ra, rb = root(a), root(b)
            if ra == rb:
                continue
            if frozen[ra] or frozen[rb] or weight[ra] + weight[rb] > limit:
                frozen[ra] = frozen[rb] = True  # the merged cluster would outweigh 1/m: both stay as they are
                continue
            parent[rb] = ra
            weight[ra] += weight[rb]
        roots = np.array([root(i) for i in range(n)])
        _, labels = np.unique(roots, return_inverse=True)
        return labels.astype(np.int64) + 1

    def _cluster(self, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        from scipy.cluster.hierarchy import ClusterWarning, fcluster
        from scipy.cluster.hierarchy import linkage as scipy_linkage
        from scipy.spatial.distance import squareform

        n = self.n_clients_
        if n == 1:
            self.clusters_ = np.ones(1, dtype=np.int64)
            return self._size_segments(m)
        if self.similarity == "knn":
            return self._groups_to_segments(self._knn_labels(m), m)
        d = self._distance_matrix()
        if self.linkage_input == "rows":
            with warnings.catch_warnings():  # scipy rightly suspects a distance matrix: here that is the point
                warnings.simplefilter("ignore", ClusterWarning)
                z = scipy_linkage(d, method=self.linkage)
        else:
            z = scipy_linkage(squareform(d, checks=False), method=self.linkage)
        # Relabel every merge with the weight of the merged cluster (monotone, since weights are positive)
        # and cut where a cluster would outweigh one distribution: clusters of weight <= 1/m.
        z = z.copy()
        w = np.concatenate([self.weights_, np.zeros(n - 1)])
        for i in range(n - 1):
            w[n + i] = w[int(z[i, 0])] + w[int(z[i, 1])]
            z[i, 2] = w[n + i]
        labels = fcluster(z, t=(1.0 / m) * (1.0 + 1e-9), criterion="distance")
        return self._groups_to_segments(labels, m)

    def _groups_to_segments(self, labels: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Algorithm 2's distributions from cluster labels: the m heaviest clusters head one each."""
        self.clusters_ = labels.astype(np.int64)
        self.n_clusterings_ += 1
        # the clients of each cluster, ascending, clusters by label (a stable sort, not one pass per cluster)
        order = np.argsort(labels, kind="stable")
        groups = np.split(order, np.flatnonzero(np.diff(labels[order])) + 1)
        # Filler order of the official code: clusters by increasing weight, clients shuffled inside each.
        weight = np.array([self.weights_[g].sum() for g in groups])
        groups = [self.rng_.permutation(groups[i]) for i in np.argsort(weight, kind="stable")]
        return allocate(groups, m * self.weights_, m, heads=True)

    # -- the scheme -------------------------------------------------------------------------
    def distributions(self, m: int | None = None) -> np.ndarray:
        """The m x N matrix ``r_{j,k}`` of the current distributions (O(m N) memory).

        Parameters
        ----------
        m : int, optional
            Build Algorithm 1's distributions for this m (``method="size"`` only);
            by default the distributions of the latest round.

        Returns
        -------
        ndarray of float, shape (m, n_clients)
            Each row sums to 1 and column k to ``m p_k``.
        """
        if m is not None:
            clients, lengths, rows = self._size_segments(int(m))
        else:
            if self.segments_ is None:
                raise ValueError(f"{type(self).__name__}.distributions: no round has been chosen yet; pass m")
            clients, lengths, rows = self.segments_
            m = int(self.m_)  # type: ignore[arg-type]
        r = np.zeros((m, self.n_clients_))
        np.add.at(r, (rows, clients), lengths)
        return r

    def _segments(self, n: int, oracle: ClientOracle) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.method == "size":
            if self.m_ != n or self.segments_ is None:
                self.segments_, self.m_ = self._size_segments(n), n
            return self.segments_
        if self.init == "probe" and not self.seen_.all():
            todo = np.flatnonzero(~self.seen_)
            updates = np.asarray(oracle.local_updates(todo), dtype=np.float32)
            answered = ~np.isnan(updates).any(axis=1)  # the others did not answer: probed again next round
            if answered.any():
                self._set_representatives(todo[answered], updates[answered], round=oracle.round)
        if self.init == "size" and not self.seen_.all():
            self.segments_, self.m_ = self._size_segments(n), n
            return self.segments_
        if self._stale or self.m_ != n or self.segments_ is None:
            self.segments_, self.m_ = self._cluster(n), n
            self._stale = False
        return self.segments_

    def _select(self, n: int, *, round: int, oracle: ClientOracle) -> Selection:
        clients, lengths, rows = self._segments(n, oracle)
        # Row j covers [j, j + 1) of the line [0, m): draw u_j uniformly there and take the segment holding it.
        # Lengths are renormalised per row so that rounding never moves a draw into another row.
        totals = np.bincount(rows, weights=lengths, minlength=n)
        cs = np.cumsum(lengths)
        first = np.searchsorted(rows, np.arange(n), side="left")
        last = np.searchsorted(rows, np.arange(n), side="right") - 1
        offset = np.concatenate([[0.0], cs])[first]
        ends = rows + (cs - offset[rows]) / totals[rows]
        ends[last] = np.arange(n) + 1.0
        u = np.arange(n) + self.rng_.random_sample(n)
        pos = np.minimum(np.searchsorted(ends, u, side="right"), clients.size - 1)
        return Selection(clients[pos], np.full(n, 1.0 / n))

    def _set_representatives(self, ids: np.ndarray, updates: Any, *, round: int) -> None:
        upd = np.asarray(updates, dtype=np.float32)
        if upd.ndim != 2 or upd.shape[0] != ids.size:
            raise ValueError(
                f"{type(self).__name__}: round {round}: expected one flattened update per client ({ids.size}), "
                f"got shape {upd.shape}"
            )
        bad = ~np.isfinite(upd).all(axis=1)
        if bad.any():
            raise ValueError(
                f"{type(self).__name__}: round {round}: the update of client(s) {ids[bad][:10].tolist()} holds "
                "NaN or inf; the run diverged (lower the learning rate)"
            )
        if self.representatives_ is None:
            self.representatives_ = np.zeros((self.n_clients_, upd.shape[1]), dtype=np.float32)
            if self.similarity == "knn":
                self._sq_norms = np.zeros(self.n_clients_)
            else:
                self._gram = np.zeros((self.n_clients_, self.n_clients_))
        elif upd.shape[1] != self.representatives_.shape[1]:
            raise ValueError(
                f"{type(self).__name__}: round {round}: updates have {upd.shape[1]} entries, the stored ones "
                f"{self.representatives_.shape[1]}"
            )
        ids, last = np.unique(ids[::-1], return_index=True)  # a repeated id keeps its last row
        upd = upd[::-1][last]
        if self.seen_[ids].all() and np.array_equal(self.representatives_[ids], upd):
            return  # nothing new: the tree stands
        self.representatives_[ids] = upd
        if self.similarity == "knn":  # the graph is brought up to date at the next clustering
            self._sq_norms[ids] = np.einsum("ij,ij->i", upd, upd, dtype=np.float64)
            self._pending[ids] = True
            self.seen_[ids] = True
            self._stale = True
            return
        # float32 products (no N x D float64 copy); the N x N Gram matrix itself is kept in float64.
        rows = (self.representatives_[ids] @ self.representatives_.T).astype(np.float64)
        self._gram[ids, :] = rows  # type: ignore[index]
        self._gram[:, ids] = rows.T  # type: ignore[index]
        self.seen_[ids] = True
        self._stale = True

    def _update(self, feedback: RoundFeedback) -> None:
        if self.method != "similarity":
            return
        ids = np.asarray(feedback.clients, dtype=np.int64)
        if ids.size == 0:
            return
        if feedback.updates is None:
            raise ValueError(
                f"{type(self).__name__}: round {feedback.round}: the feedback lacks the updates; the runtime must "
                "honour needs={'updates'}"
            )
        self._set_representatives(ids, feedback.updates, round=int(feedback.round))


@hookimpl
def register_selectors(register):
    register(ClusteredSamplingSelector, name="clustered", aliases=("clustered-sampling", "fraboni"))
