"""Partitions of a labelled training set across federated clients.

Every function takes the labels ``y`` of the pool and returns one sorted ``int64``
index array per client. The arrays are disjoint; together they cover every sample
(all four built-in schemes use the whole pool). All randomness goes through
:func:`sklearn.utils.check_random_state`, so an ``int`` seed makes a partition
reproducible.

Schemes
-------
``iid``
    Shuffle and split evenly.
``shards``
    McMahan et al. (2017): sort by label, cut into ``n_clients * shards_per_client``
    shards of equal size, deal ``shards_per_client`` random shards to each client.
    FedCor's 2SPC is ``shards_per_client=2`` and 1SPC ``shards_per_client=1`` (with
    N = 100 and 60,000 FMNIST images: 200 shards of 300, or 100 shards of 600).
``dirichlet``
    Hsu et al. (2019): for each class, draw the shares of the N clients from
    Dir(alpha) and split that class accordingly; redraw until every client holds at
    least ``min_samples`` samples.
``dirichlet-qp``
    FedCor's unbalanced Dirichlet partition (Tang et al. 2022, appendix C.2): every
    client draws its label distribution q_k ~ Dir(alpha * p); client sizes solve a
    quadratic programme. See :func:`dirichlet_qp_partition`.

A plain callable ``f(y, n_clients, random_state=..., **params)`` can be given to
:func:`fedselect.data.make_federation` and :meth:`fedselect.data.Federation.from_datasets`
instead of a name; a Flower Datasets ``Partitioner`` becomes a federation through
:meth:`fedselect.data.Federation.from_partitioner`.

The schemes are a registry: the four above register through the
:func:`~fedselect.hookspecs.register_partitions` hook, as a plugin's do, and a plugin's
scheme is then a name like these (``make_federation(partition="its-name")``,
``fedselect compare --partition its-name``). :data:`PARTITIONS` reads that registry.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
from scipy import optimize
from sklearn.utils import check_random_state

from .._validation import Constraint
from ..hookspecs import hookimpl
from ..plugins import registry

__all__ = [
    "PARTITIONS",
    "dirichlet_partition",
    "dirichlet_qp_partition",
    "iid_partition",
    "partition",
    "shard_partition",
]


def _check_labels(y: Any) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"y must be a 1-D array of labels, got shape {y.shape}")
    if y.size == 0:
        raise ValueError("y is empty: there is nothing to partition")
    return y


def _check_n_clients(n_clients: Any, n_samples: int) -> int:
    if isinstance(n_clients, bool) or not isinstance(n_clients, int | np.integer):
        raise ValueError(f"n_clients must be a positive integer, got {n_clients!r}")
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1, got n_clients={n_clients}")
    if n_clients > n_samples:
        raise ValueError(f"n_clients={n_clients} is more than the {n_samples} samples to partition")
    return int(n_clients)


def _finish(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _encode(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Class values and the label of each sample as a class position 0..K-1."""
    classes, codes = np.unique(y, return_inverse=True)
    return classes, codes.reshape(-1)


def _sample_dirichlet(rng: np.random.RandomState, alpha: np.ndarray, size: int) -> np.ndarray:
    """Draw ``size`` rows from Dir(alpha), exact even for tiny concentrations.

    ``RandomState.dirichlet`` normalises Gamma(alpha_i) draws, which underflow to 0
    when alpha_i is small (FedCor's alpha * p_c = 0.02), and a row of zeros gives
    NaN. The draws are made in log space instead, with
    Gamma(a) = Gamma(a + 1) * U^(1/a).
    """
    alpha = np.asarray(alpha, dtype=float)
    shape = (size, alpha.size)
    log_g = np.log(rng.gamma(alpha + 1.0, size=shape)) + np.log(rng.uniform(size=shape)) / alpha
    log_g -= log_g.max(axis=1, keepdims=True)
    g = np.exp(log_g)
    return g / g.sum(axis=1, keepdims=True)


def iid_partition(y: np.ndarray, n_clients: int, *, random_state: Any = None) -> list[np.ndarray]:
    """Shuffle the samples and split them evenly.

    Parameters
    ----------
    y : ndarray of shape (n_samples,)
        Labels (only their number matters).
    n_clients : int
        Number of clients N.
    random_state : int, RandomState instance or None
        Seed of the shuffle.

    Returns
    -------
    list of ndarray of int64
        Client k's sample indices, sorted; sizes differ by at most one (:func:`numpy.array_split`).

    Examples
    --------
    >>> import numpy as np
    >>> parts = iid_partition(np.zeros(10), 3, random_state=0)
    >>> [len(p) for p in parts]
    [4, 3, 3]
    """
    y = _check_labels(y)
    n_clients = _check_n_clients(n_clients, y.size)
    rng = check_random_state(random_state)
    return _finish(np.array_split(rng.permutation(y.size), n_clients))


def shard_partition(
    y: np.ndarray, n_clients: int, *, shards_per_client: int = 2, random_state: Any = None
) -> list[np.ndarray]:
    """McMahan et al.'s pathological non-IID split: a few label-sorted shards per client.

    The samples are sorted by label (stable sort, so ties keep their order), cut into
    ``n_clients * shards_per_client`` contiguous shards of equal size (sizes differ by
    at most one when the division is not exact) and each client receives
    ``shards_per_client`` shards drawn at random without replacement. With label
    counts divisible by the shard size every shard holds one label, so a client holds
    at most ``shards_per_client`` labels. FedCor (Tang et al. 2022, Sec. 5.1): 2SPC is
    ``shards_per_client=2`` (200 shards of 300 for N = 100 on FMNIST), 1SPC is
    ``shards_per_client=1``.

    Parameters
    ----------
    y : ndarray of shape (n_samples,)
        Labels.
    n_clients : int
        Number of clients N.
    shards_per_client : int, default=2
        Shards dealt to each client.
    random_state : int, RandomState instance or None
        Seed of the deal.

    Returns
    -------
    list of ndarray of int64
        Client k's sample indices, sorted.
    """
    y = _check_labels(y)
    n_clients = _check_n_clients(n_clients, y.size)
    if (
        isinstance(shards_per_client, bool)
        or not isinstance(shards_per_client, int | np.integer)
        or (shards_per_client < 1)
    ):
        raise ValueError(f"shards_per_client must be a positive integer, got shards_per_client={shards_per_client!r}")
    n_shards = n_clients * int(shards_per_client)
    if n_shards > y.size:
        raise ValueError(
            f"n_clients * shards_per_client = {n_clients} * {shards_per_client} = {n_shards} shards "
            f"is more than the {y.size} samples"
        )
    rng = check_random_state(random_state)
    order = np.argsort(y, kind="stable")
    shards = np.array_split(order, n_shards)
    deal = rng.permutation(n_shards).reshape(n_clients, shards_per_client)
    return _finish([np.concatenate([shards[s] for s in row]) for row in deal])


def dirichlet_partition(
    y: np.ndarray,
    n_clients: int,
    *,
    alpha: float = 0.5,
    min_samples: int = 10,
    random_state: Any = None,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """Hsu et al.'s label-skewed split: each class is divided across clients by Dir(alpha) shares.

    For every class c, shares (s_1c, ..., s_Nc) ~ Dir(alpha, ..., alpha) are drawn and
    the (shuffled) samples of class c are cut at the rounded cumulative shares. The
    whole draw is repeated until every client holds at least ``min_samples`` samples.
    Smaller ``alpha`` means stronger label skew and more unequal client sizes; this is
    the plain scheme of Hsu, Qi & Brown (2019), without the capacity trick some code
    bases add.

    Parameters
    ----------
    y : ndarray of shape (n_samples,)
        Labels.
    n_clients : int
        Number of clients N.
    alpha : float, default=0.5
        Concentration of the Dirichlet distribution, > 0.
    min_samples : int, default=10
        Smallest acceptable client size.
    random_state : int, RandomState instance or None
        Seed.
    max_tries : int, default=1000
        Draws to attempt before giving up.

    Returns
    -------
    list of ndarray of int64
        Client k's sample indices, sorted.

    Raises
    ------
    ValueError
        No draw within ``max_tries`` gives every client ``min_samples`` samples.
    """
    y = _check_labels(y)
    n_clients = _check_n_clients(n_clients, y.size)
    if not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha must be a positive number, got alpha={alpha!r}")
    if min_samples < 0:
        raise ValueError(f"min_samples must be >= 0, got min_samples={min_samples}")
    if n_clients * min_samples > y.size:
        raise ValueError(
            f"cannot give n_clients={n_clients} clients min_samples={min_samples} samples each from {y.size} samples"
        )
    if max_tries < 1:
        raise ValueError(f"max_tries must be >= 1, got max_tries={max_tries}")
    rng = check_random_state(random_state)
    _, codes = _encode(y)
    by_class = [np.flatnonzero(codes == c) for c in range(codes.max() + 1)]
    smallest = 0
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        shares = _sample_dirichlet(rng, np.full(n_clients, float(alpha)), len(by_class))
        for idx, share in zip(by_class, shares):
            idx = rng.permutation(idx)
            cuts = np.round(np.cumsum(share)[:-1] * idx.size).astype(np.int64)
            for k, piece in enumerate(np.split(idx, cuts)):
                parts[k].append(piece)
        sizes = np.array([sum(p.size for p in ps) for ps in parts])
        smallest = int(sizes.min())
        if smallest >= min_samples:
            return _finish([np.concatenate(ps) for ps in parts])
    raise ValueError(
        f"dirichlet partition failed: after max_tries={max_tries} draws with alpha={alpha}, some of the "
        f"n_clients={n_clients} clients still had fewer than min_samples={min_samples} samples (last draw's "
        f"smallest client: {smallest}); increase alpha, lower min_samples or use fewer clients"
    )


def _min_norm_sizes(Q: np.ndarray, d: np.ndarray) -> np.ndarray | None:
    """Solve ``min x^T x s.t. Q x = d, x >= 0``; ``None`` when infeasible.

    Solved through its dual, an unconstrained concave maximisation over one
    multiplier per class: x(lam) = max(0, Q^T lam), and lam maximises
    ``d^T lam - ||max(0, Q^T lam)||^2 / 2`` (K = 10 variables instead of N). The dual
    is piecewise quadratic; scipy's ``trust-exact`` with the generalised Hessian
    Q_A Q_A^T (A = clients with x_k > 0) converges in a few dozen iterations.
    Feasibility is settled first by a HiGHS linear programme (a few milliseconds).
    If the dual's x does not satisfy Q x = d to 1e-6 relative, the primal is solved
    with SLSQP as a fallback.
    """
    K, _ = Q.shape
    scale = d.sum()
    b = d / scale

    def negdual(lam: np.ndarray) -> tuple[float, np.ndarray]:
        x = np.maximum(Q.T @ lam, 0.0)
        return 0.5 * x @ x - b @ lam, Q @ x - b

    def hess(lam: np.ndarray) -> np.ndarray:
        active = (Q.T @ lam) > 0
        Qa = Q[:, active]
        return Qa @ Qa.T + 1e-12 * np.eye(K)

    feasible = optimize.linprog(np.zeros(Q.shape[1]), A_eq=Q, b_eq=b, bounds=(0, None), method="highs")
    if feasible.status == 2:  # infeasible: the dual is unbounded, no point iterating on it
        return None
    lam0 = np.linalg.lstsq(Q @ Q.T, b, rcond=None)[0]
    res = optimize.minimize(
        negdual, lam0, jac=True, hess=hess, method="trust-exact", options={"gtol": 1e-12, "maxiter": 500}
    )
    x = np.maximum(Q.T @ res.x, 0.0)
    if np.linalg.norm(Q @ x - b) <= 1e-6 * np.linalg.norm(b):
        return x * scale
    x0 = np.maximum(np.linalg.lstsq(Q, b, rcond=None)[0], 0.0)
    res = optimize.minimize(
        lambda x: (x @ x, 2 * x),
        x0,
        jac=True,
        method="SLSQP",
        bounds=[(0.0, None)] * Q.shape[1],
        constraints=[{"type": "eq", "fun": lambda x: Q @ x - b, "jac": lambda x: Q}],
        options={"maxiter": 500, "ftol": 1e-14},
    )
    x = np.maximum(res.x, 0.0)
    if np.linalg.norm(Q @ x - b) <= 1e-6 * np.linalg.norm(b):
        return x * scale
    return None


def _round_counts(expected: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Integer (N, K) counts with column sums ``totals``, by largest remainders per column."""
    col = expected.sum(axis=0)
    col[col == 0] = 1.0
    expected = expected * (totals / col)
    counts = np.floor(expected).astype(np.int64)
    short = totals - counts.sum(axis=0)
    rema = expected - counts
    for c in range(expected.shape[1]):
        if short[c] > 0:
            counts[np.argsort(-rema[:, c], kind="stable")[: short[c]], c] += 1
    return counts


def _repair_small(counts: np.ndarray, weights: np.ndarray, min_samples: int) -> np.ndarray:
    """Move samples to clients below ``min_samples`` from the largest holder of their favourite class.

    ``weights`` (N, K) ranks the classes for each client (its q_k). Class totals stay
    exact; a donor never drops below ``min_samples``.
    """
    counts = counts.copy()
    order = np.argsort(-weights, axis=1, kind="stable")
    for k in np.flatnonzero(counts.sum(axis=1) < min_samples):
        for c in order[k]:
            while counts[k].sum() < min_samples:
                totals = counts.sum(axis=1)
                donors = np.flatnonzero((counts[:, c] > 0) & (totals > min_samples))
                donors = donors[donors != k]
                if donors.size == 0:
                    break
                donor = donors[np.argmax(counts[donors, c])]
                counts[donor, c] -= 1
                counts[k, c] += 1
            if counts[k].sum() >= min_samples:
                break
    return counts


def dirichlet_qp_partition(
    y: np.ndarray,
    n_clients: int,
    *,
    alpha: float = 0.2,
    random_state: Any = None,
    min_samples: int = 1,
    max_tries: int = 100,
) -> list[np.ndarray]:
    """FedCor's unbalanced Dirichlet partition (Tang et al. 2022, appendix C.2, Eq. 146-149).

    Reading of the appendix:

    1. Every client k draws its label distribution q_k ~ Dir(alpha * p) (Eq. 146),
       where p is the prior label distribution, taken as the class proportions of
       ``y``. With FedCor's alpha = 0.2 and ten balanced classes the concentrations
       are 0.02, so most clients are dominated by one or two labels.
    2. With Q = [q_1, ..., q_N] (K x N) and d the label counts, the client sizes solve
       ``min x^T x s.t. Q x = d, x >= 0`` (Eq. 147-149; the paper writes x > 0, which
       has no minimiser in general, so the closed constraint is used and empty
       clients are repaired in step 4). Minimising the norm spreads the data over as
       many clients as the q_k allow. The programme is solved with scipy through its
       K-dimensional dual (``trust-exact``, SLSQP on the primal as fallback; a few
       milliseconds for N = 100, K = 10); the official code uses cvxopt. When the
       programme is infeasible (d outside the cone of the q_k), Q is redrawn, up to
       ``max_tries`` times. That is rare for N = 100 and K = 10 but common for small
       federations (with K = 10 about a quarter of the draws are feasible for N = 30,
       almost none for N = 10, where Q x = d pins x down): the scheme is meant for
       N well above K.
    3. The expected counts x_k q_kc are rounded per class by largest remainders so that
       every class is used exactly (sum_k n_kc = d_c).
    4. A client left with fewer than ``min_samples`` samples receives them, one at a
       time, from the largest holder of its most likely class (class totals unchanged).
    5. The samples of each class are shuffled and dealt out in those counts.

    Client sizes come out unequal (that is the point of the scheme: clients with
    concentrated q_k carry more data).

    Parameters
    ----------
    y : ndarray of shape (n_samples,)
        Labels.
    n_clients : int
        Number of clients N.
    alpha : float, default=0.2
        Dirichlet concentration multiplying the prior (FedCor uses 0.2).
    random_state : int, RandomState instance or None
        Seed.
    min_samples : int, default=1
        Smallest client size after repair.
    max_tries : int, default=100
        Redraws of Q when the programme is infeasible.

    Returns
    -------
    list of ndarray of int64
        Client k's sample indices, sorted.
    """
    y = _check_labels(y)
    n_clients = _check_n_clients(n_clients, y.size)
    if not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha must be a positive number, got alpha={alpha!r}")
    if min_samples < 0 or n_clients * min_samples > y.size:
        raise ValueError(
            f"min_samples={min_samples} is impossible for n_clients={n_clients} clients and {y.size} samples"
        )
    if max_tries < 1:
        raise ValueError(f"max_tries must be >= 1, got max_tries={max_tries}")
    rng = check_random_state(random_state)
    _, codes = _encode(y)
    d = np.bincount(codes).astype(float)
    prior = d / d.sum()
    for _ in range(max_tries):
        q = _sample_dirichlet(rng, alpha * prior, n_clients)  # (N, K)
        x = _min_norm_sizes(q.T, d)
        if x is not None:
            break
    else:
        raise ValueError(
            f"dirichlet-qp partition failed: the size programme was infeasible for all max_tries={max_tries} "
            f"draws with alpha={alpha} and n_clients={n_clients}: the label counts must lie in the cone of the "
            f"clients' label distributions, which needs clearly more clients than the {d.size} classes "
            "(FedCor uses 100 clients for 10 classes); use more clients or another scheme"
        )
    counts = _round_counts(x[:, None] * q, d.astype(np.int64))
    counts = _repair_small(counts, q, min_samples)
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for c in range(d.size):
        idx = rng.permutation(np.flatnonzero(codes == c))
        for k, piece in enumerate(np.split(idx, np.cumsum(counts[:, c])[:-1])):
            parts[k].append(piece)
    out = _finish([np.concatenate(ps) for ps in parts])
    small = [k for k, p in enumerate(out) if p.size < min_samples]
    if small:
        raise ValueError(
            f"dirichlet-qp partition could not give every client min_samples={min_samples} samples "
            f"(clients {small[:5]}); lower min_samples or n_clients"
        )
    return out


_BUILT_IN: dict[str, Callable[..., list[np.ndarray]]] = {
    "iid": iid_partition,
    "shards": shard_partition,
    "dirichlet": dirichlet_partition,
    "dirichlet-qp": dirichlet_qp_partition,
}


@hookimpl
def register_partitions(register: Callable[..., Any]) -> None:
    """The built-in schemes, registered through the hook plugins use."""
    for name, func in _BUILT_IN.items():
        register(func, name=name)


class _Registry(Mapping[str, Callable[..., list[np.ndarray]]]):
    """Every registered partition scheme: name (or alias) -> function, read from the plugin registry on each use.

    Iterates over the canonical names in registration order (the built-ins first); an alias
    is ``in`` it and looks up its scheme. Nothing is loaded until it is first read.
    """

    def _table(self) -> dict[str, Any]:
        return registry("partitions")

    def __getitem__(self, name: str) -> Callable[..., list[np.ndarray]]:
        return self._table()[name].obj

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._table()

    def __iter__(self) -> Iterator[str]:
        return iter(list(dict.fromkeys(e.name for e in self._table().values())))

    def __len__(self) -> int:
        return len({e.name for e in self._table().values()})

    def __repr__(self) -> str:
        return f"PARTITIONS({', '.join(self)})"


#: The registered partition schemes, built-in and from plugins: name -> function (a live view of the registry).
PARTITIONS: Mapping[str, Callable[..., list[np.ndarray]]] = _Registry()


class RegisteredPartition(Constraint):
    """A parameter constraint: the name of a registered partition scheme, or one of ``extra``.

    The names are read when a value is checked, so a scheme a plugin registers later is allowed
    (a ``StrOptions`` built at import time would not see it).
    """

    def __init__(self, extra: tuple[str, ...] = ()) -> None:
        self.extra = tuple(extra)

    @property
    def options(self) -> tuple[str, ...]:
        return (*PARTITIONS, *self.extra)

    def is_satisfied_by(self, value: Any) -> bool:
        return isinstance(value, str) and (value in self.extra or value in PARTITIONS)

    def __str__(self) -> str:
        return f"one of {self.options!r}"

    def invalid_examples(self) -> list[Any]:
        return ["no-such-partition", 1, None]


def partition(
    y: np.ndarray, scheme: str, n_clients: int, *, random_state: Any = None, **params: Any
) -> list[np.ndarray]:
    """Partition ``y`` with the scheme named ``scheme``.

    Parameters
    ----------
    y : ndarray of shape (n_samples,)
        Labels.
    scheme : str
        Name of a registered scheme: ``"iid"``, ``"shards"``, ``"dirichlet"``,
        ``"dirichlet-qp"`` or a plugin's (see :data:`PARTITIONS`).
    n_clients : int
        Number of clients N.
    random_state : int, RandomState instance or None
        Seed.
    **params
        Parameters of the scheme's function (e.g. ``shards_per_client``, ``alpha``).

    Returns
    -------
    list of ndarray of int64
        Client k's sample indices, sorted.

    Raises
    ------
    ValueError
        Unknown scheme, a parameter the scheme does not take, or a partition that
        cannot be made.

    Examples
    --------
    >>> import numpy as np
    >>> parts = partition(np.repeat(np.arange(4), 5), "shards", 4, shards_per_client=1, random_state=0)
    >>> sorted(len(set(np.repeat(np.arange(4), 5)[p])) for p in parts)
    [1, 1, 1, 1]
    """
    if scheme not in PARTITIONS:
        import difflib

        close = difflib.get_close_matches(str(scheme), list(PARTITIONS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown partition scheme {scheme!r}{hint}; known schemes: {', '.join(PARTITIONS)}")
    func = PARTITIONS[scheme]
    accepted = [p for p in inspect.signature(func).parameters if p not in ("y", "n_clients", "random_state")]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(f"partition scheme {scheme!r} does not take parameter(s) {unknown}; it accepts {accepted}")
    return func(y, n_clients, random_state=random_state, **params)
