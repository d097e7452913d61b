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

    The server keeps ``theta_k``, the local model client k produced the last time it
    trained (Algorithm 1, line 2: ``theta~``). Each round t:

    1. **Round 0** (Algorithm 1, lines 13-14): with ``initial="all"`` every client
       trains and is aggregated, so the server learns every ``theta_k`` (the selection
       has N clients, hence ``variable_size`` is True for this setting). With
       ``initial="probe"`` the server instead asks every client for its local update
       through ``oracle.local_updates(range(N))`` (N trainings, paid and recorded; the
       clients then chosen are not trained again) and goes on as in later rounds, so
       every round has exactly K clients.
    2. **Later rounds** (lines 15-18): the K clients with the largest Frobenius distance
       ``||theta^t - theta_k||_F`` between the current global model
       (``oracle.global_parameters()``, free) and their stored local model are chosen.
       The distance runs over *all* parameters, the whole flattened model, not only its
       first tensor (a public fork of the authors' code measured the first layer only).
       The paper removes the nearest client until K remain, which is the same set.
    3. After the round (the sentence under Algorithm 1), each reporting client's stored
       model is replaced by its new local model ``feedback.global_before +
       feedback.updates`` (that is ``theta^t + (w_k - theta^t)``); the others keep theirs.

    A client with no stored model (it never reported, e.g. it failed in round 0)
    counts as infinitely far, so it is chosen as soon as possible. Ties (equal
    distances, including several unknown clients) are broken uniformly at random with
    the selector's own stream (``random_state``); with a fixed ``random_state`` the
    run is reproducible. No aggregation weights are returned: the runtime's rule
    applies (the paper averages the chosen models uniformly, line 10; FedAvg's
    data-size weighting is the trainer default).

    Memory: the server holds one float32 model per client, an ``N x D`` array of
    ``4 N D`` bytes (the paper's "N x d units of memory"); for example 10 clients of
    FedCor's 784-64-30-10 MLP (D = 52,650) take 2.1 MB, and 100 clients of FedCor's
    CIFAR-10 CNN (D = 122,570) take 49 MB. It is allocated when the first local models
    arrive, and distances are computed in blocks of 256 rows.

    **Scale.** ``4 N D`` bytes reach 24 GB at N = 114,000 for the MLP and N = 49,000 for the
    CNN, and a distance pass reads all of it every round (O(N D) time). In this simulator
    round 0 (``initial="all"`` or ``"probe"``) also trains all N clients in one batch, whose
    parameters, gradients and updates peak at about ``24 N D`` bytes whatever the storage
    (N = 19,000 for the MLP on 24 GB; a deployment trains them on the clients). ``storage``
    bounds the server's state:

    ``"float32"`` (default, the paper)
        the models as they are, ``4 N D`` bytes.
    ``"float16"``
        each model minus a reference (the mean of the first local models stored, kept in
        float32) in half precision: ``2 N D + 4 D`` bytes. Storing the difference rather than
        the model keeps the rounding error relative to how far a model moved from the
        reference, not to the weights' size: each stored coordinate is off by at most
        ``2^-11`` of its difference (half precision's 11 significant bits), so a distance is
        off by about ``2^-11 ||theta_k - ref|| / sqrt(3)`` (rms), rarely enough to swap two
        clients whose distances differ by more than 0.1 %. A difference beyond float16's
        range (65,504) is refused with an error.
    ``"sketch"``
        a sparse random projection ``s_k = P theta_k`` to ``sketch_dim`` = k dimensions
        (scikit-learn's ``SparseRandomProjection``, density ``1 / sqrt(D)``, seeded from the
        selector's stream), and the distance ``||P theta^t - s_k||``: ``4 N k`` bytes plus
        about ``12 k sqrt(D)`` for P. By the Johnson-Lindenstrauss lemma
        ``||P x||^2 / ||x||^2`` has mean 1 and a relative standard deviation of about
        ``sqrt(2 / k)`` (4.4 % at k = 1024), so clients whose distances differ by less than
        that may be ranked in the other order; the farthest clients are still found. At
        N = 100,000 and k = 1024: 410 MB instead of 21 GB for the MLP.

    **Clients that do not answer** the probe of ``initial="probe"`` (NaN rows, see
    :class:`~fedselect.ClientOracle`) get no stored model; in that round they are chosen
    last (they cannot train now) unless fewer than ``n`` answered, and afterwards their
    unknown model counts as infinitely far, as for any client never seen. Not in the
    paper, which assumes every client answers.

    Parameters
    ----------
    initial : {"all", "probe"}, default="all"
        How the server learns every client's local model before choosing by distance:
        ``"all"`` trains everyone in the first round (the paper); ``"probe"`` asks the
        oracle for every client's local update in the first round and then chooses
        exactly K.
    storage : {"float32", "float16", "sketch"}, default="float32"
        How the server stores the clients' last local models (see Scale): as they are (the
        paper), as float16 differences from a reference, or as random-projection sketches.
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
    _params_added_later: ClassVar[dict[str, Any]] = {"storage": "float32", "sketch_dim": 1024}

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
