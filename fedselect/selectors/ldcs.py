"""FedLDCS: train the clients whose last local model is farthest from the global model."""

from __future__ import annotations

from numbers import Integral
from typing import Any, ClassVar

import numpy as np
from sklearn.utils import check_random_state

from .._validation import Interval, StrOptions
from ..hookspecs import hookimpl
from ..selection import BaseSelector, ClientOracle, ClientPool, RoundFeedback, Selection

__all__ = ["LargestDistanceSelector"]

_INITIAL = ("all", "probe")
_STORAGES = ("float32", "float16", "sketch")
_CHUNK = 256  # rows per distance block: bounds the float64 temporary to _CHUNK x D


class LargestDistanceSelector(BaseSelector):
    """Largest Distance Client Selection (Hou and Kong [1]_, FedLDCS, Algorithm 1).

    The server keeps ``theta_k``, the local model client k produced the last time it trained (Algorithm 1, line 2).
    Round 0 (lines 13-14): with ``initial="all"`` every client trains and is aggregated (the selection has N
    clients, so ``variable_size`` is True); with ``initial="probe"`` every client's local update is asked through
    the oracle instead and the round goes on as the later ones. Later rounds (lines 15-18) choose the K = n clients
    farthest from the global model over all its parameters,

        ``S_t = arg top-K_k ||theta^t - theta_k||_F``,

    and after each round every reporting client's ``theta_k`` becomes its new local model. A client with no stored
    model counts as infinitely far; ties are broken at random with the selector's stream. No aggregation weights
    are returned (the paper averages uniformly, line 10; the trainer's rule applies). The round in detail, the
    storage options, clients that do not answer and the scale: :ref:`selector_ldcs`.

    **Costs.** Round 0: N local trainings (``"probe"``: and N updates up). Later rounds: nothing beyond the round
    (the global model is free, the chosen clients' models come anyway). Server: ``4 N D`` bytes of stored models
    (``storage="float16"``: ``2 N D``; ``"sketch"``: ``4 N k``), all read every round.

    Parameters
    ----------
    initial : {"all", "probe"}, default="all"
        How the server learns every client's local model before choosing by distance: everyone trains in the first
        round (the paper), or the oracle is asked for every update in the first round, which then chooses K.
    storage : {"float32", "float16", "sketch"}, default="float32"
        How the server stores the clients' last local models: as they are (the paper), as float16 differences from
        a reference, or as random-projection sketches (see :ref:`ldcs-scale`).
    sketch_dim : int, default=1024
        k, the dimension of the sketches of ``storage="sketch"`` (below D); ignored otherwise.
    random_state : None, int or numpy RandomState, default=None
        Seeds the tie-breaking (and the projection of ``storage="sketch"``).

    Attributes
    ----------
    rng_ : numpy RandomState
        The tie-breaking stream.
    models_ : ndarray, shape (n_clients, D) or (n_clients, sketch_dim), or None
        What the server keeps of each client's last local model (rows of unknown clients
        are zero); None until the first local models arrive. ``"float32"``: the models;
        ``"float16"``: the models minus ``reference_``; ``"sketch"``: ``P theta_k``.
    reference_ : ndarray of float32, shape (D,), or None
        ``storage="float16"``: what the stored differences are taken from.
    projection_ : scipy sparse matrix, shape (sketch_dim, D), or None
        ``storage="sketch"``: P.
    known_ : ndarray of bool, shape (n_clients,)
        Which clients have a stored model.
    last_trained_ : ndarray of int, shape (n_clients,)
        The round in which each stored model was produced (-1 if none).
    last_distances_ : ndarray of float or None
        ``||theta^t - theta_k||_F`` of every client in the latest distance-based round
        (``inf`` for unknown clients).
    n_selects_ : int
        How many rounds have been chosen since :meth:`fit`.
    variable_size : bool
        True exactly when ``initial == "all"`` (read-only property).

    Raises
    ------
    ValueError
        In :meth:`update`, when the feedback lacks the updates or the global model, or
        an update holds NaN or inf (the message names the round and the clients).

    References
    ----------
    .. [1] Hou, S., Kong, Z. "FedLDCS: Adaptive Divergence-Based Client Selection for
       Federated Learning." FedKDD 2024 (Algorithm 1, Section 4).

    Examples
    --------
    >>> from fedselect.selection import ClientPool
    >>> from fedselect.testing import SyntheticOracle
    >>> sel = LargestDistanceSelector(random_state=0).fit(ClientPool([50] * 6))
    >>> oracle = SyntheticOracle(6, random_state=0)
    >>> first = sel.select(3, round=0, oracle=oracle)
    >>> len(first)
    6
    >>> sel = sel.update(oracle.run_round(first.validated(6, 3, variable_size=True), needs=sel.needs))
    >>> len(sel.select(3, round=1, oracle=oracle))
    3
    """

    needs = frozenset({"updates", "global"})
    diagnostics = ("last_distances_", "last_trained_")  # kept by fedselect.compare with each run

    def __init__(
        self, *, initial: str = "all", storage: str = "float32", sketch_dim: int = 1024, random_state: Any = None
    ) -> None:
        self.initial = initial
        self.storage = storage
        self.sketch_dim = sketch_dim
        self.random_state = random_state

    @property
    def variable_size(self) -> bool:  # type: ignore[override]
        """The paper's first round trains all N clients, whatever K is."""
        return self.initial == "all"

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "initial": [StrOptions(_INITIAL)],
        "storage": [StrOptions(_STORAGES)],
        "sketch_dim": [Interval(Integral, 1, None, closed="left")],
        "random_state": ["random_state"],
    }

    def _fit(self, pool: ClientPool) -> None:
        self.rng_ = check_random_state(self.random_state)
        # the projection's seed is drawn only when it is used, so the default's tie-breaking stream is unchanged
        self._sketch_seed = int(self.rng_.randint(2**31 - 1)) if self.storage == "sketch" else None
        self.models_: np.ndarray | None = None
        self.reference_: np.ndarray | None = None
        self.projection_: Any = None
        self.known_ = np.zeros(self.n_clients_, dtype=bool)
        self.last_trained_ = np.full(self.n_clients_, -1, dtype=np.int64)
        self.last_distances_: np.ndarray | None = None
        self.n_selects_ = 0

    # -- storage ----------------------------------------------------------------------
    def _store(self, ids: np.ndarray, local_models: np.ndarray, round: int) -> None:
        local_models = np.asarray(local_models, dtype=np.float32)
        if local_models.ndim != 2 or local_models.shape[0] != ids.size:
            raise ValueError(
                f"{type(self).__name__}: round {round}: expected one flattened local model per client "
                f"({ids.size}), got an array of shape {local_models.shape}"
            )
        bad = ~np.isfinite(local_models).all(axis=1)
        if bad.any():
            raise ValueError(
                f"{type(self).__name__}: round {round}: the local model of client(s) {ids[bad][:10].tolist()} "
                "holds NaN or inf; the run diverged (lower the learning rate)"
            )
        if self.models_ is None:
            self._start_storage(local_models, round)
        elif local_models.shape[1] != self._model_size:
            raise ValueError(
                f"{type(self).__name__}: round {round}: local models have {local_models.shape[1]} parameters, "
                f"the stored ones {self._model_size}"
            )
        self.models_[ids] = self._encode(local_models, ids, round)  # type: ignore[index]
        self.known_[ids] = True
        self.last_trained_[ids] = round

    @property
    def _model_size(self) -> int:
        """D, the length of a flattened model (once models are stored)."""
        return int(self.projection_.shape[1] if self.storage == "sketch" else self.models_.shape[1])  # type: ignore[union-attr]

    def _start_storage(self, first: np.ndarray, round: int) -> None:
        n, d = self.n_clients_, first.shape[1]
        if self.storage == "float16":
            self.reference_ = first.mean(axis=0, dtype=np.float64).astype(np.float32)
            self.models_ = np.zeros((n, d), dtype=np.float16)
        elif self.storage == "sketch":
            if int(self.sketch_dim) >= d:
                raise ValueError(
                    f"{type(self).__name__}: parameter sketch_dim={self.sketch_dim!r} is not below the model size "
                    f"D={d}; a sketch only saves memory with sketch_dim < D (or use storage='float32')"
                )
            from sklearn.random_projection import SparseRandomProjection

            proj = SparseRandomProjection(n_components=int(self.sketch_dim), density="auto",
                                          random_state=self._sketch_seed)
            self.projection_ = proj.fit(np.zeros((1, d))).components_.tocsr()
            self.models_ = np.zeros((n, int(self.sketch_dim)), dtype=np.float32)
        else:
            self.models_ = np.zeros((n, d), dtype=np.float32)

    def _encode(self, local_models: np.ndarray, ids: np.ndarray, round: int) -> np.ndarray:
        """What is stored of these (float32) local models."""
        if self.storage == "float16":
            diff = (local_models - self.reference_).astype(np.float16)
            bad = ~np.isfinite(diff).all(axis=1)
            if bad.any():
                raise ValueError(
                    f"{type(self).__name__}: round {round}: the local model of client(s) {ids[bad][:10].tolist()} "
                    "is farther from the stored reference than float16 can hold (65,504); use storage='float32'"
                )
            return diff
        if self.storage == "sketch":
            return np.asarray(self.projection_ @ local_models.astype(np.float64).T).T.astype(np.float32)
        return local_models

    def _encode_global(self, g: np.ndarray) -> np.ndarray:
        """The global model as the stored rows are compared with it (float64)."""
        if self.storage == "float16":
            return g - self.reference_
        if self.storage == "sketch":
            return np.asarray(self.projection_ @ g).reshape(-1)
        return g

    def distances(self, global_model: np.ndarray) -> np.ndarray:
        """``||theta - theta_k||_F`` over all parameters for every client (``inf`` if unknown).

        Parameters
        ----------
        global_model : ndarray, shape (D,)
            The flattened global model theta^t.

        Returns
        -------
        ndarray of float64, shape (n_clients,)
        """
        out = np.full(self.n_clients_, np.inf)
        if self.models_ is None:
            return out
        g = np.asarray(global_model, dtype=np.float64).reshape(-1)
        if g.size != self._model_size:
            raise ValueError(
                f"{type(self).__name__}: the global model has {g.size} parameters, the stored local models "
                f"{self._model_size}"
            )
        g = self._encode_global(g)
        known = np.flatnonzero(self.known_)
        for start in range(0, known.size, _CHUNK):
            rows = known[start : start + _CHUNK]
            diff = self.models_[rows].astype(np.float64) - g
            out[rows] = np.sqrt(np.einsum("ij,ij->i", diff, diff))
        return out

    # -- the scheme -----------------------------------------------------------------------
    def _select(self, n: int, *, round: int, oracle: ClientOracle) -> Selection:
        first = self.n_selects_ == 0
        self.n_selects_ += 1
        if first and self.initial == "all":
            return Selection(np.arange(self.n_clients_))
        g = np.asarray(oracle.global_parameters(), dtype=np.float32).reshape(-1)
        if first and self.initial == "probe":
            everyone = np.arange(self.n_clients_)
            updates = np.asarray(oracle.local_updates(everyone), dtype=np.float32)
            answered = ~np.isnan(updates).any(axis=1)  # the others did not answer: no model stored yet
            self._store(everyone[answered], g[None, :] + updates[answered], round)
        dist = self.distances(g)
        self.last_distances_ = dist
        rank = dist
        if first and self.initial == "probe" and answered.sum() >= n:
            rank = np.where(answered, dist, -np.inf)  # unreachable this round: chosen last
        # Farthest first; a random permutation before a stable sort breaks ties at random.
        perm = self.rng_.permutation(self.n_clients_)
        order = perm[np.argsort(-rank[perm], kind="stable")]
        return Selection(np.sort(order[:n]))

    def _update(self, feedback: RoundFeedback) -> None:
        ids = np.asarray(feedback.clients, dtype=np.int64)
        if ids.size == 0:
            return
        if feedback.updates is None or feedback.global_before is None:
            raise ValueError(
                f"{type(self).__name__}: round {feedback.round}: the feedback lacks the updates or the global model; "
                f"the runtime must honour needs={sorted(self.needs)}"
            )
        local = np.asarray(feedback.global_before, dtype=np.float32)[None, :] + np.asarray(
            feedback.updates, dtype=np.float32
        )
        self._store(ids, local, int(feedback.round))


@hookimpl
def register_selectors(register):
    register(LargestDistanceSelector, name="ldcs", aliases=("fedldcs", "largest-distance"))
