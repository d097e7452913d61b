"""Active federated learning (AFL): sample clients by a softmax of loss-based valuations."""

from __future__ import annotations

import math
from numbers import Real
from typing import Any, ClassVar

import numpy as np
from sklearn.utils import check_random_state

from .._validation import Interval
from ..hookspecs import hookimpl
from ..selection import BaseSelector, ClientOracle, ClientPool, RoundFeedback, Selection

__all__ = ["ActiveFLSelector"]

_EPS = 1e-9  # absorbs floating-point error in floor(alpha * count), e.g. (1 - 0.9) * 10 = 0.9999999999999998


def _floor(x: float) -> int:
    return math.floor(x + _EPS)


class ActiveFLSelector(BaseSelector):
    """Active Federated Learning (Goetz et al. [1]_) as the FedCor official code runs it [2]_.

    Each client has a valuation ``v_k = l_k * sqrt(n_k)``, its loss on the global model
    times the square root of its data size. The valuations of all clients are
    initialised from one loss query to every client at the first :meth:`select`
    (``oracle.losses(range(N))``: paid once). Each round then:

    1. drops the ``floor(alpha1 * N)`` clients of lowest valuation;
    2. draws ``floor((1 - alpha3) * n)`` of the remaining clients without replacement,
       each successive draw with probability proportional to ``exp(alpha2 * v_k)``
       (drawn with the Gumbel-top-k trick on ``alpha2 * v_k``, which is the same
       distribution and cannot overflow);
    3. fills the other places uniformly at random from *all* clients not yet chosen,
       dropped ones included, as the official code does
       (``set(range(N)) - set(sel1)``).

    After the round, :meth:`update` refreshes the valuation of each reporting client
    with its loss before local training (``feedback.losses``) times ``sqrt(n_k)``.
    Clients that are never chosen keep their initial valuation, as in the official code.

    The counts are rounded down (the official code's ``int(...)``). If fewer clients
    than the softmax share survive the drop, all survivors are taken and the uniform
    fill covers the rest, so exactly ``n`` distinct clients are always returned. No
    aggregation weights are returned. The reported losses are trusted: a client that
    inflates its loss gets a valuation no honest client reaches (see the Flower strategy's
    ``loss_clip_quantile`` and the docs' security model).

    **Costs.** One loss from every client at the first :meth:`select` (N models down, N scalars up, once);
    afterwards each reporter's loss before training (``needs = {"losses"}``: one scalar up and a forward
    pass over its evaluation data, which a runtime computes only for selectors that declare it).
    Clients that do not answer a loss query: :ref:`selector_afl`.

    Parameters
    ----------
    alpha1 : float, default=0.75
        Fraction of clients (of lowest valuation) excluded from the softmax draw, in [0, 1).
    alpha2 : float, default=0.01
        Inverse temperature of the softmax over valuations, >= 0 (0 is uniform).
    alpha3 : float, default=0.1
        Fraction of the ``n`` places filled uniformly at random, in [0, 1].
    random_state : None, int or numpy RandomState, default=None
        Seeds the selection stream.

    Attributes
    ----------
    rng_ : numpy RandomState
        The selection stream.
    valuations_ : ndarray of float, shape (n_clients,)
        v_k (NaN until known).
    known_ : ndarray of bool, shape (n_clients,)
        Which valuations have been measured.
    sqrt_n_ : ndarray of float
        sqrt(n_k).

    References
    ----------
    .. [1] Goetz, J., Malik, K., Bui, D., Moon, S., Liu, H., Kumar, A. "Active Federated
       Learning." arXiv:1909.12641, 2019.
    .. [2] Tang, M. et al. "FedCor: Correlation-Based Active Client Selection Strategy for
       Heterogeneous Federated Learning." CVPR 2022; code: github.com/Yoruko-Tang/FedCor,
       ``src/federated_main.py``.

    Examples
    --------
    >>> from fedselect.selection import ClientPool
    >>> from fedselect.testing import SyntheticOracle
    >>> sel = ActiveFLSelector(random_state=0).fit(ClientPool([50] * 20))
    >>> oracle = SyntheticOracle(20, random_state=0)
    >>> len(sel.select(5, round=0, oracle=oracle))
    5
    >>> oracle.calls[0][0], len(oracle.calls[0][1])
    ('losses', 20)
    """

    def __init__(
        self,
        *,
        alpha1: float = 0.75,
        alpha2: float = 0.01,
        alpha3: float = 0.1,
        random_state: Any = None,
    ) -> None:
        self.alpha1 = alpha1
        self.alpha2 = alpha2
        self.alpha3 = alpha3
        self.random_state = random_state

    needs: ClassVar[frozenset[str]] = frozenset({"losses"})
    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "alpha1": [Interval(Real, 0, 1, closed="left")],
        "alpha2": [Interval(Real, 0, None, closed="left")],
        "alpha3": [Interval(Real, 0, 1, closed="both")],
        "random_state": ["random_state"],
    }

    def _fit(self, pool: ClientPool) -> None:
        self.rng_ = check_random_state(self.random_state)
        self.sqrt_n_ = np.sqrt(self.n_samples_.astype(np.float64))
        self.valuations_ = np.full(self.n_clients_, np.nan)
        self.known_ = np.zeros(self.n_clients_, dtype=bool)

    def _select(self, n: int, *, round: int, oracle: ClientOracle) -> Selection:
        N = self.n_clients_
        unknown = np.flatnonzero(~self.known_)
        if unknown.size:
            losses = np.asarray(oracle.losses(unknown), dtype=np.float64)
            self.valuations_[unknown] = losses * self.sqrt_n_[unknown]
            self.known_[unknown] = ~np.isnan(losses)  # no answer: ask again next round
        # A client without a valuation (it did not answer) ranks lowest; an infinite loss highest.
        v = np.nan_to_num(self.valuations_, nan=-np.inf)
        n_drop = min(_floor(self.alpha1 * N), N - 1)
        kept = np.argsort(v, kind="stable")[n_drop:]
        n_soft = min(_floor((1.0 - self.alpha3) * n), kept.size)
        # Gumbel-top-k: the top n_soft of alpha2 * v + Gumbel noise is a draw without replacement with
        # probabilities proportional to exp(alpha2 * v), without ever exponentiating.
        scores = self.alpha2 * v[kept] if self.alpha2 > 0 else np.zeros(kept.size)
        keys = scores + self.rng_.gumbel(size=kept.size)
        soft = kept[np.argsort(-keys, kind="stable")[:n_soft]]
        rest = np.setdiff1d(np.arange(N), soft)
        fill = self.rng_.choice(rest, size=n - soft.size, replace=False)
        return Selection(np.concatenate([soft, fill]).astype(np.int64))

    def _update(self, feedback: RoundFeedback) -> None:
        ids = np.asarray(feedback.clients, dtype=np.int64)
        self.valuations_[ids] = np.asarray(feedback.losses, dtype=np.float64) * self.sqrt_n_[ids]
        self.known_[ids] = True


@hookimpl
def register_selectors(register):
    register(ActiveFLSelector, name="afl", aliases=("active-fl",))
