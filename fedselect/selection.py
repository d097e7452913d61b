"""The contracts every client-selection scheme and every federation runtime share.

A *selector* decides which clients train in a round. It is a scikit-learn style
estimator (:class:`BaseSelector`) with three methods:

``fit(pool)``
    forget everything and learn the federation's shape (:class:`ClientPool`);
``select(n, round=t, oracle=oracle)``
    choose about ``n`` clients for round ``t`` (:class:`Selection`), optionally
    asking the :class:`ClientOracle` paid questions first (losses, trial rounds,
    compressed local updates);
``update(feedback)``
    learn from what the round that just ran produced anyway (:class:`RoundFeedback`).

The simulator (:class:`fedselect.FederatedTrainer`) and the Flower strategy both
implement the oracle and count what every answer costs, so a selector never
reaches around it and its hidden costs stay visible.
"""

from __future__ import annotations

import abc
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted
from typing_extensions import Self

from ._validation import (
    Interval,
    InvalidParameterError,
    Options,
    Predicate,
    StrOptions,
    parameter_message,
    validate_parameters,
)

__all__ = [
    "BaseSelector",
    "ClientOracle",
    "ClientPool",
    "Interval",
    "InvalidParameterError",
    "Options",
    "Predicate",
    "StrOptions",
    "RoundFeedback",
    "Selection",
    "SelectionError",
    "available_clients",
    "check_client_ids",
    "restrict_to_available",
    "check_param",
    "check_selection_weights",
]


class SelectionError(ValueError):
    """A selector returned a selection the runtime cannot use."""


def check_client_ids(ids: Any, n_clients: int | None = None, *, what: str = "client ids") -> np.ndarray:
    """Client ids as a 1-D int64 array: the one rule every runtime and contract applies.

    Accepts a scalar or a 1-D sequence of Python or NumPy integers (an empty sequence is
    allowed). Rejects bools, floats (even whole ones: cast with ``astype(int)`` first),
    strings, other shapes and, when ``n_clients`` is given, ids outside ``0..n_clients-1``.

    Parameters
    ----------
    ids : int or array-like of int
        The ids.
    n_clients : int, optional
        N; when given, every id must lie in ``0..N-1``.
    what : str
        Names the caller in error messages (e.g. ``"oracle.losses"``).

    Returns
    -------
    ndarray of int64

    Raises
    ------
    ValueError
        Naming ``what``, the problem and the offending values.
    """
    arr = np.asarray(ids)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ValueError(f"{what}: client ids must be a 1-D sequence of integers, got an array of shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(
            f"{what}: client ids must be integers, got dtype {arr.dtype} ({arr[:5].tolist()}"
            f"{'...' if arr.size > 5 else ''}); cast with .astype(int) if they are whole numbers"
        )
    arr = arr.astype(np.int64, copy=False)
    if n_clients is not None:
        bad = arr[(arr < 0) | (arr >= n_clients)]
        if bad.size:
            raise ValueError(
                f"{what}: client id(s) {bad[:5].tolist()} out of range for a federation of {n_clients} clients "
                f"(valid ids are 0..{n_clients - 1})"
            )
    return arr


def available_clients(oracle: Any) -> np.ndarray | None:
    """``oracle.available()`` as int64 ids, or None when every client is a candidate (or the oracle cannot say)."""
    ask = getattr(oracle, "available", None)
    ids = ask() if callable(ask) else None
    return None if ids is None else np.asarray(ids, dtype=np.int64)


def check_param(
    owner: object,
    name: str,
    value: Any,
    ok: bool,
    allowed: str,
    *,
    error: type[Exception] = InvalidParameterError,
) -> None:
    """Raise ``error`` naming the class, the parameter, the value and what is allowed.

    For rules that a declared constraint (``_parameter_constraints``, see
    :mod:`fedselect._validation`) cannot express; the message has the same shape.

    Parameters
    ----------
    owner : object
        The estimator whose parameter is checked (its class name is reported).
    name : str
        The parameter's name.
    value : object
        The value that was given.
    ok : bool
        Whether ``value`` is acceptable.
    allowed : str
        A short description of the allowed values, e.g. ``"an integer >= 1"``.
    error : exception type
        Default :class:`~fedselect._validation.InvalidParameterError`, a ValueError and a TypeError.
    """
    if not ok:
        raise error(parameter_message(owner, name, value, allowed))


def is_int(value: Any) -> bool:
    """True for Python and NumPy integers, False for bools."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """True for finite real numbers (not bools)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool | np.bool_):
        return False
    try:
        return bool(np.isfinite(float(value)))
    except OverflowError:  # an int beyond float range
        return False


def check_selection_weights(clients: np.ndarray, weights: np.ndarray | None, source: str) -> None:
    """Raise :class:`SelectionError` for aggregation weights a round cannot use.

    Weights are applied as given (no normalisation), so a negative weight moves the model
    against a client's update and all-zero weights leave the round without effect; both
    are selector bugs, never a legitimate estimator. Zero weights for some clients are fine.
    """
    if weights is None:
        return
    bad = np.flatnonzero(~np.isfinite(weights))
    if bad.size:
        raise SelectionError(
            f"{source} returned non-finite aggregation weight(s) {weights[bad[:5]].tolist()} for client(s) "
            f"{clients[bad[:5]].tolist()}; weights must be finite and >= 0"
        )
    neg = np.flatnonzero(weights < 0)
    if neg.size:
        raise SelectionError(
            f"{source} returned negative aggregation weight(s) {weights[neg[:5]].tolist()} for client(s) "
            f"{clients[neg[:5]].tolist()}; weights must be >= 0 (they multiply each client's update as given)"
        )
    if weights.size and not np.any(weights > 0):
        raise SelectionError(
            f"{source} returned aggregation weights that are all zero for clients {clients[:5].tolist()}"
            f"{'...' if clients.size > 5 else ''}; at least one must be > 0 or the round changes nothing"
        )


@dataclass(frozen=True, eq=False)
class ClientPool:
    """The shape of a federation as a selector sees it.

    Parameters
    ----------
    n_samples : array-like of int, shape (n_clients,)
        Number of samples n_k each client holds (its full data, training and held-out parts).
    metadata : mapping, optional
        Anything else the runtime wants to share (e.g. client labels for diagnostics).
        Selectors must not rely on keys being present.

    Attributes
    ----------
    n_clients : int
        N, the number of clients.
    weights : ndarray of float, shape (n_clients,)
        p_k = n_k / sum_j n_j.
    """

    n_samples: np.ndarray
    metadata: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        arr = np.asarray(self.n_samples)
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(f"ClientPool: n_samples must be a non-empty 1-D array, got shape {arr.shape}")
        if not (np.issubdtype(arr.dtype, np.integer) or np.all(np.mod(arr, 1) == 0)):
            raise ValueError("ClientPool: n_samples must be whole numbers")
        arr = arr.astype(np.int64)
        empty = np.flatnonzero(arr <= 0)
        if empty.size:
            raise ValueError(
                f"ClientPool: client {int(empty[0])} has no data (n_samples={int(arr[empty[0]])}); "
                f"every client needs at least one sample ({empty.size} client(s) affected)"
            )
        arr.setflags(write=False)
        object.__setattr__(self, "n_samples", arr)

    @property
    def n_clients(self) -> int:
        return int(self.n_samples.shape[0])

    @property
    def weights(self) -> np.ndarray:
        return self.n_samples / self.n_samples.sum()

    def __repr__(self) -> str:
        return f"ClientPool(n_clients={self.n_clients}, n_samples=[{self.n_samples.min()}..{self.n_samples.max()}])"


@dataclass(frozen=True, eq=False)
class Selection:
    """The clients chosen for one round, with optional aggregation weights.

    Parameters
    ----------
    clients : array-like of int
        The chosen client ids.
    weights : array-like of float, optional
        One weight per entry of ``clients``. When given, the runtime multiplies each
        chosen client's model delta ``w_k - w^t`` by its weight *as given* (no
        normalisation, so unbiased estimators work) and adds the sum to the global
        model. Without weights the runtime aggregates by its own rule.

    Notes
    -----
    Duplicates (sampling with replacement) are allowed; :meth:`validated` merges
    them and sums their weights (a duplicate without weights counts twice).
    """

    clients: np.ndarray
    weights: np.ndarray | None = None
    counts: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        clients = check_client_ids(self.clients, what="Selection.clients")
        object.__setattr__(self, "clients", clients)
        if self.weights is not None:
            w = np.asarray(self.weights, dtype=np.float64)
            if w.shape != clients.shape:
                raise ValueError(
                    f"Selection.weights must have one entry per client: {w.shape} weights for {clients.shape} clients"
                )
            if not np.all(np.isfinite(w)):
                raise SelectionError(f"Selection.weights must be finite, got {w[~np.isfinite(w)][:5].tolist()}")
            object.__setattr__(self, "weights", w)

    def validated(
        self,
        n_clients: int,
        n: int,
        *,
        variable_size: bool = False,
        source: str = "selector",
    ) -> Selection:
        """Check the selection against a federation and merge duplicates.

        Parameters
        ----------
        n_clients : int
            N, the number of clients in the federation.
        n : int
            The number of clients that was requested.
        variable_size : bool
            Whether the selector declared ``variable_size = True``.
        source : str
            The name used in error messages (usually the selector's class name).

        Returns
        -------
        Selection
            Sorted, distinct ids; weights (if any) summed over duplicates; ``counts``
            holds how often each distinct client was drawn (a client drawn twice
            without weights counts twice in the runtime's own aggregation rule).

        Raises
        ------
        SelectionError
            Empty, out of range, (without ``variable_size``) not exactly ``n``
            distinct clients, or weights that are negative or all zero.
        """
        c = self.clients
        if c.size == 0:
            raise SelectionError(f"{source} returned an empty selection (asked for {n} clients)")
        check_selection_weights(c, self.weights, source)
        bad = c[(c < 0) | (c >= n_clients)]
        if bad.size:
            raise SelectionError(
                f"{source} returned client id(s) {bad[:5].tolist()} out of range for a federation of {n_clients} "
                f"clients (valid ids are 0..{n_clients - 1})"
            )
        uniq, inverse, counts = np.unique(c, return_inverse=True, return_counts=True)
        if not variable_size and (uniq.size != n):
            dup = "" if uniq.size == c.size else f" ({c.size - uniq.size} duplicate(s) merged)"
            raise SelectionError(
                f"{source} returned {uniq.size} distinct clients{dup} but {n} were requested; a selector that "
                "may return another number must declare `variable_size = True`"
            )
        w = None
        if self.weights is not None:
            w = np.zeros(uniq.size)
            np.add.at(w, inverse.ravel(), self.weights)
        return Selection(uniq, w, counts=counts.astype(np.float64))

    def __len__(self) -> int:
        return int(self.clients.size)

    def __repr__(self) -> str:
        w = "" if self.weights is None else f", weights={np.round(self.weights, 4).tolist()}"
        return f"Selection(clients={self.clients.tolist()}{w})"


_FEEDBACK_ARRAYS = ("clients", "weights", "losses", "n_samples", "updates", "global_before", "global_after")


@dataclass(frozen=True, eq=False)
class RoundFeedback:
    """What training the chosen clients produced, as a real server would receive it.

    Clients that failed to report are simply absent from ``clients`` (so ``clients``
    may hold fewer ids than were chosen, or none at all).

    Attributes
    ----------
    round : int
        t, the round that just ran (rounds start at 0).
    clients : ndarray of int
        The clients that reported.
    weights : ndarray of float
        The aggregation weight each reporting client's delta received.
    losses : ndarray of float, or None
        l_k(w^t): each client's loss on the global model *before* its local training,
        on its evaluation data (one scalar up per reporter, and a forward pass over its
        evaluation data, charged and timed). None when the runtime did not compute them:
        the simulator computes them only when the selector's ``needs`` has ``"losses"``
        (or ``FederatedTrainer(feedback_losses="always")``), and so does the Flower
        strategy. A selector that reads them declares ``"losses"``.
    n_samples : ndarray of int
        n_k of each reporting client.
    updates : ndarray of float32, shape (len(clients), D), or None
        w_k - w^t flattened; present only when the selector's ``needs`` has ``"updates"``.
    global_before, global_after : ndarray of float32, shape (D,), or None
        The flattened global model before and after aggregation; present only when the
        selector's ``needs`` has ``"global"``.
    durations : ndarray of float, or None
        Seconds each reporter took in this round as the server observed it (model sent to
        update received); present only when ``needs`` has ``"durations"`` and the runtime
        keeps a clock. Free: the server measures it.
    sample_loss_sq : ndarray of float, or None
        Each reporter's mean, over every sample of its local training in this round, of the
        squared per-sample training loss (Oort's statistical utility is
        ``|B_i| * sqrt(sample_loss_sq)``); present only when ``needs`` has ``"sample_losses"``.
        One scalar up per reporter, sent with its update.
    timed_out : ndarray of int, or None
        Chosen clients the server stopped waiting for without any reply: stragglers past the
        round's deadline, clients over-selected beyond the first to finish, and, with a
        deadline, clients that failed silently (the server cannot tell them from stragglers).
        Present, like ``durations`` and with it, only when ``needs`` has ``"durations"`` and
        the runtime keeps a clock. Disjoint from ``clients``. Free: the server knows it.
    timed_out_after : ndarray of float, or None
        For each ``timed_out`` client, the seconds the server had waited for it this round: a
        censored observation, a lower bound on that client's duration (its true duration may
        be longer, or infinite).

    Notes
    -----
    ``durations`` and ``sample_loss_sq`` hold one finite value >= 0 per reporter,
    ``timed_out_after`` one per ``timed_out`` client.
    """

    round: int
    clients: np.ndarray
    weights: np.ndarray
    losses: np.ndarray | None
    n_samples: np.ndarray
    updates: np.ndarray | None = None
    global_before: np.ndarray | None = None
    global_after: np.ndarray | None = None
    durations: np.ndarray | None = None
    sample_loss_sq: np.ndarray | None = None
    timed_out: np.ndarray | None = None
    timed_out_after: np.ndarray | None = None

    def __post_init__(self) -> None:
        if (self.timed_out is None) != (self.timed_out_after is None):
            raise ValueError("RoundFeedback.timed_out and timed_out_after come together: give both or neither")
        if self.timed_out is not None:
            ids = np.asarray(self.timed_out)
            if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
                raise ValueError(
                    f"RoundFeedback.timed_out must be a 1-D array of client ids (integers); got shape {ids.shape}, "
                    f"dtype {ids.dtype}"
                )
            if ids.size and (ids.min() < 0 or ids.max() > np.iinfo(np.int64).max):
                raise ValueError(f"RoundFeedback.timed_out holds client ids outside [0, 2**63): {ids.tolist()[:5]}")
            ids = ids.astype(np.int64)
            if np.unique(ids).size != ids.size:
                raise ValueError(f"RoundFeedback.timed_out repeats a client: {ids.tolist()[:10]}")
            if np.intersect1d(ids, np.asarray(self.clients, dtype=np.int64)).size:
                raise ValueError("RoundFeedback.timed_out must not contain clients that reported")
            object.__setattr__(self, "timed_out", ids)
        for name in ("durations", "sample_loss_sq", "timed_out_after"):
            value = getattr(self, name)
            if value is not None:
                try:
                    arr = np.asarray(value, dtype=np.float64)
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"RoundFeedback.{name} must be numbers: {exc}") from exc
                if arr.ndim != 1 or not np.all(np.isfinite(arr)) or np.any(arr < 0):
                    raise ValueError(
                        f"RoundFeedback.{name} must be a 1-D array of finite numbers >= 0, one per reporter; "
                        f"got shape {arr.shape}, values {arr.ravel()[:5].tolist()}"
                    )
                object.__setattr__(self, name, arr)
        for name in (*_FEEDBACK_ARRAYS, "durations", "sample_loss_sq", "timed_out", "timed_out_after"):
            value = getattr(self, name)
            if value is not None:
                arr = np.array(value, copy=True)
                arr.setflags(write=False)  # update() must never mutate the feedback
                object.__setattr__(self, name, arr)
        k = self.clients.shape[0]
        for name in ("weights", "losses", "n_samples"):
            if getattr(self, name) is not None and getattr(self, name).shape[0] != k:
                raise ValueError(f"RoundFeedback.{name} has {getattr(self, name).shape[0]} entries for {k} clients")
        if self.updates is not None and self.updates.shape[0] != k:
            raise ValueError(f"RoundFeedback.updates has {self.updates.shape[0]} rows for {k} clients")
        for name in ("durations", "sample_loss_sq"):
            value = getattr(self, name)
            if value is not None and value.shape[0] != k:
                raise ValueError(f"RoundFeedback.{name} has {value.shape[0]} entries for {k} clients")
        if self.timed_out is not None and self.timed_out_after is not None:
            if self.timed_out_after.shape[0] != self.timed_out.shape[0]:
                raise ValueError(
                    f"RoundFeedback.timed_out_after has {self.timed_out_after.shape[0]} entries for "
                    f"{self.timed_out.shape[0]} timed-out clients"
                )


def restrict_to_available(
    selector: Any, selection: Selection, available: np.ndarray, n: int, *, round: int
) -> Selection:
    """``selection`` restricted to the ``available`` clients: what every runtime applies to every selector.

    A selector that declares ``chooses_available = True`` must already lie within them
    (:class:`SelectionError` otherwise). For any other, offline picks are dropped and the
    shortfall (to ``min(n, len(available))`` distinct clients, or the selection's own size for
    a variable-size selector) is filled with available clients in a random order drawn from
    ``(round, len(available))``, which leaves the selector's own stream alone; filled clients
    get the mean kept weight when the selection carries weights. A selection already within
    ``available`` is returned as is.
    """
    clients = np.asarray(selection.clients)
    inside = np.isin(clients, available)
    if inside.all():
        return selection
    if getattr(selector, "chooses_available", False):
        raise SelectionError(
            f"{type(selector).__name__} declares chooses_available but chose client(s) "
            f"{clients[~inside][:5].tolist()} outside oracle.available()"
        )
    kept = clients[inside]
    w = None if selection.weights is None else selection.weights[inside]
    if getattr(selector, "variable_size", False):
        want = min(int(np.unique(clients).size), int(available.size))
    else:
        want = min(int(n), int(available.size))
    short = want - int(np.unique(kept).size)
    if short > 0:
        rest = np.setdiff1d(available, kept)
        fill = np.random.default_rng([int(round), int(available.size)]).permutation(rest)[:short]
        kept = np.concatenate([kept, fill])
        if w is not None:
            pad = float(w.mean()) if w.size and w.sum() > 0 else 1.0 / max(want, 1)
            w = np.concatenate([w, np.full(fill.size, pad)])
    return Selection(kept, w)


class ClientOracle(abc.ABC):
    """The questions a selector may ask before choosing, each paid for and recorded.

    Implemented by the simulator (:class:`fedselect.simulation.transport.SimulationOracle`),
    by :class:`fedselect.testing.SyntheticOracle`, and in a real federation by the Flower
    strategy's oracle (``fedselect.flower.strategy.FlowerOracle``, with the ``flower``
    extra: each question is a message to exactly the clients whose answer is not known yet
    this round); every implementation keeps its bookkeeping in a
    :class:`fedselect.ledger.RoundLedger`, so they charge alike.

    **Clients that do not answer.** In a real federation (and in the simulator with
    ``dropout`` or ``availability`` set) a client may not answer: it is unavailable this
    round, times out, or replies with an error. Such a client is charged for what was
    sent to it, its answer is NaN (a NaN entry of :meth:`losses`, of the N-vector of
    :meth:`trial`, or a NaN row of :meth:`local_updates`), it is not contacted again in
    that round, and if it is chosen it does not report: it is absent from the round's
    :class:`RoundFeedback` and the round aggregates those who reported. A selector must
    therefore expect NaN in every answer (and partial feedback) and still return a valid
    selection; the conformance checks of :mod:`fedselect.testing` try it.

    Attributes
    ----------
    n_clients : int
        N.
    round : int
        The round being chosen for.
    """

    n_clients: int
    round: int

    @abc.abstractmethod
    def losses(self, ids: Any) -> np.ndarray:
        """l_k(w^t) for each id, on each client's evaluation data.

        Costs one model down per client not yet holding w^t this round, one scalar up
        per client, and the samples it evaluates.
        """

    @abc.abstractmethod
    def trial(self, ids: Any) -> np.ndarray:
        """The length-N vector l(w_trial) - l(w^t) of a trial round.

        ``w_trial`` is what round t would produce if ``ids`` trained, with the same
        learning rate, weight decay, prox term, dropout and aggregation rule as the
        round (over the ids that answered: a trial client that fails is left out, as it
        would be from the round). It is not applied and does not advance the round. Costs
        ``len(ids)`` local trainings (not repeated if those clients are then chosen), the
        trial model sent to every client (N models down) and a scalar up from each client
        that answers, plus the baseline losses if they were not already paid this round.
        """

    @abc.abstractmethod
    def local_updates(self, ids: Any, transform: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
        """Each id's local update ``w_k - w^t`` trained from w^t, transformed before upload.

        ``transform`` maps one flattened float32 update to what the client uploads
        (e.g. a compressed vector); the upload is counted in floats. A client that is
        then chosen in the same round is not trained again. (In the simulator the
        transform runs on the client's side of the ledger; a deployment that cannot ship
        code to clients, such as the Flower strategy, uploads the full update, charged as
        a model up, and applies ``transform`` on the server.)
        """

    @abc.abstractmethod
    def global_parameters(self) -> np.ndarray:
        """w^t flattened (float32). Free: the server holds it."""

    def available(self) -> np.ndarray | None:
        """The clients a selection may hold this round: those online at the round's start, as sorted ids.

        Free: clients check in with the server when they come online (FedScale's
        ``select_participants`` samples among them). None (this default, and every round of
        a federation without availability intervals): every client. The runtime never asks
        for more clients than are available.
        """
        return None


class BaseSelector(BaseEstimator):
    """Base class of every client-selection scheme.

    Subclasses store their parameters in a keyword-only ``__init__`` (nothing else),
    implement :meth:`_fit`, :meth:`_select` and optionally :meth:`_update`, and keep
    learned state in attributes ending in ``_`` that are born in :meth:`fit`.

    Attributes
    ----------
    needs : frozenset of str
        What :class:`RoundFeedback` must carry: ``"losses"`` (each reporter's loss on
        w^t before its local training: a forward pass over its evaluation data and one
        scalar up each, computed, charged and timed only for a selector that declares it),
        ``"updates"`` (per-client deltas),
        ``"global"`` (the global model before and after aggregation), ``"durations"``
        (each reporter's observed seconds, free; only a runtime with a clock has them) and
        ``"sample_losses"`` (each reporter's mean squared per-sample training loss, one
        scalar up per reporter). A runtime that cannot supply a field leaves it None, so a
        selector that asks for one must still work without it.
    chooses_available : bool
        True if :meth:`_select` chooses only among :meth:`ClientOracle.available` itself. Otherwise
        :meth:`select` restricts the selection for it: offline picks are dropped and the
        shortfall is filled with available clients in a random order drawn from the round (the
        generic route; filled clients get the mean kept weight).
    variable_size : bool
        True if :meth:`select` may return other than exactly ``n`` distinct clients.
        A subclass whose size depends on a parameter may override it with a read-only
        instance property (e.g. ``RandomSelector(replace=True)``); runtimes therefore
        read it from the instance, never from the class.
    diagnostics : tuple of str
        Names of fitted attributes worth saving with a run for later figures
        (``fedselect compare`` stores them, e.g. FedCor's ``embeddings_``).
    """

    needs: ClassVar[frozenset[str]] = frozenset()
    variable_size: ClassVar[bool] = False
    chooses_available: ClassVar[bool] = False
    diagnostics: ClassVar[tuple[str, ...]] = ()
    _parameter_constraints: ClassVar[dict[str, Any]] = {"random_state": ["random_state"]}

    def identifying_params(self) -> dict[str, Any]:
        """``get_params(deep=False)`` without the parameters added after runs were recorded that are at their
        original default (the table is :data:`fedselect.identity.ADDED_LATER`)."""
        from .identity import identifying_params

        return identifying_params(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A selector pickled (e.g. in a checkpoint) before a parameter existed gets that parameter's original
        # default, which is what it ran with.
        from .identity import later_defaults

        for k, v in later_defaults(type(self)).items():
            state.setdefault(k, v)
        super().__setstate__(state)

    @classmethod
    def parameter_constraints(cls) -> dict[str, list[Any]]:
        """Each parameter's declared alternatives, merged over the class hierarchy (subclasses win).

        See :mod:`fedselect._validation` for what an alternative may be. A selector inherits
        ``random_state``'s constraint (None, a seed in [0, 2**32 - 1] or a RandomState).
        """
        merged: dict[str, list[Any]] = {}
        for klass in reversed(cls.__mro__):
            merged.update(klass.__dict__.get("_parameter_constraints", {}))
        return merged

    # -- public API -----------------------------------------------------------------
    def fit(self, pool: ClientPool) -> Self:
        """Forget everything and learn the federation's shape.

        Parameters
        ----------
        pool : ClientPool
            The federation's clients (sample counts, weights).

        Returns
        -------
        self
        """
        if not isinstance(pool, ClientPool):
            raise TypeError(f"{type(self).__name__}.fit expects a ClientPool, got {type(pool).__name__}")
        self._validate_params()
        self.n_clients_ = pool.n_clients
        self.weights_ = pool.weights.copy()
        self.n_samples_ = pool.n_samples.copy()
        self._fit(pool)
        return self

    def select(self, n: int, *, round: int, oracle: ClientOracle) -> Selection:
        """Choose the clients for round ``round``.

        Parameters
        ----------
        n : int
            How many clients to choose (the expected number for variable-size schemes).
        round : int
            t, the round being chosen for (rounds start at 0).
        oracle : ClientOracle
            Paid questions about the clients (losses, trials, local updates).

        Returns
        -------
        Selection
        """
        check_is_fitted(self, "n_clients_")
        if not is_int(n) or not 1 <= n <= self.n_clients_:
            raise ValueError(
                f"{type(self).__name__}.select: n={n!r} clients requested from a federation of "
                f"{self.n_clients_} clients; expected an integer in 1..{self.n_clients_}"
            )
        if not is_int(round) or round < 0:
            raise ValueError(f"{type(self).__name__}.select: round={round!r} must be an integer >= 0")
        selection = self._select(int(n), round=int(round), oracle=oracle)
        name = type(self).__name__
        if selection is None:
            raise TypeError(f"{name}._select returned None; it must return a Selection (or an array of client ids)")
        if not isinstance(selection, Selection):
            try:
                selection = Selection(selection)
            except (TypeError, ValueError) as exc:
                raise SelectionError(
                    f"{name}._select returned {type(selection).__name__} {selection!r:.80}, which is not a "
                    f"Selection or an array of client ids: {exc}"
                ) from exc
        check_selection_weights(selection.clients, selection.weights, name)
        available = available_clients(oracle)
        if available is not None:
            selection = self._within(selection, available, int(n), int(round))
        return selection

    def _within(self, selection: Selection, available: np.ndarray, n: int, round: int) -> Selection:
        """``selection`` restricted to the ``available`` clients (:func:`restrict_to_available`)."""
        return restrict_to_available(self, selection, available, n, round=round)

    def update(self, feedback: RoundFeedback) -> Self:
        """Learn from the round that just ran.

        Parameters
        ----------
        feedback : RoundFeedback

        Returns
        -------
        self
        """
        check_is_fitted(self, "n_clients_")
        self._update(feedback)
        return self

    # -- for subclasses -------------------------------------------------------------
    def _validate_params(self) -> None:
        """Check every parameter against :meth:`parameter_constraints`. Called first by :meth:`fit`.

        A subclass with rules across parameters overrides this, calls ``super()._validate_params()``
        first and raises with :func:`check_param`. Runtimes may call it before any fit (the CLI
        checks every scheme of a comparison before training starts).

        Raises
        ------
        InvalidParameterError
            A ValueError and a TypeError naming the class, the parameter, the value and
            what is allowed.
        """
        validate_parameters(self, self.get_params(deep=False), self.parameter_constraints())

    def _fit(self, pool: ClientPool) -> None:
        """Initialise learned state from ``pool``."""
        raise NotImplementedError(f"{type(self).__name__} must implement _fit(pool)")

    def _select(self, n: int, *, round: int, oracle: ClientOracle) -> Selection:
        """Return the selection; ``n`` and ``round`` are already validated."""
        raise NotImplementedError(f"{type(self).__name__} must implement _select(n, round=, oracle=)")

    def _update(self, feedback: RoundFeedback) -> None:
        """Learn from feedback (default: nothing)."""
