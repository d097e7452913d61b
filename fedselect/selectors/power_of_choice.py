"""Power-of-choice: among d candidates drawn by data size, train the n with the largest loss."""

from __future__ import annotations

from numbers import Integral
from typing import Any, ClassVar

import numpy as np
from sklearn.utils import check_random_state

from .._validation import Interval
from ..hookspecs import hookimpl
from ..selection import BaseSelector, ClientOracle, ClientPool, Selection, available_clients

__all__ = ["PowerOfChoiceSelector"]


class PowerOfChoiceSelector(BaseSelector):
    """Power-of-choice selection (Cho, Wang and Joshi [1]_, the pow-d strategy).

    Each round:

    1. draw a candidate set A of ``d`` distinct clients without replacement, each
       successive draw with probability proportional to p_k = n_k / sum_j n_j;
    2. ask every candidate for its current loss l_k(w^t) through the oracle
       (``oracle.losses(A)``: d models down and d scalars up, paid and recorded);
    3. keep the ``n`` candidates with the largest loss (ties broken by draw order).

    FedCor's experiments [2]_ use d = 2n (d = 10 for n = 5), which is the default. The
    official FedCor code reads the candidates' losses from a full evaluation it runs
    anyway; here the query is explicit so its cost is counted. No aggregation weights
    are returned (the trainer's rule applies). The reported losses are trusted: a client
    that inflates its loss is chosen whenever it is a candidate (see the Flower
    strategy's ``loss_clip_quantile`` and the docs' security model).

    **Clients that do not answer** the loss query (NaN, see :class:`~fedselect.ClientOracle`)
    rank last among the candidates: the n clients with the largest losses are taken among
    those that answered, and only if fewer than n answered are unanswered candidates
    added (in draw order).

    Parameters
    ----------
    d : int or None, default=None
        Size of the candidate set. ``None`` means ``2 * n``. It is clipped to N; a ``d``
        smaller than ``n`` is an error at :meth:`select` time.
    random_state : None, int or numpy RandomState, default=None
        Seeds the candidate draws.

    Attributes
    ----------
    rng_ : numpy RandomState
        The selection stream.
    weights_ : ndarray of float
        p_k, the candidate-draw probabilities.
    last_candidates_ : ndarray of int or None
        The candidate set of the latest round.
    last_losses_ : ndarray of float or None
        The losses the candidates reported in the latest round.

    References
    ----------
    .. [1] Cho, Y. J., Wang, J., Joshi, G. "Client Selection in Federated Learning:
       Convergence Analysis and Power-of-Choice Selection Strategies." arXiv:2010.01243, 2020
       (Algorithm 1; AISTATS 2022 as "Towards Understanding Biased Client Selection in
       Federated Learning").
    .. [2] Tang, M. et al. "FedCor: Correlation-Based Active Client Selection Strategy for
       Heterogeneous Federated Learning." CVPR 2022.

    Examples
    --------
    >>> from fedselect.selection import ClientPool
    >>> from fedselect.testing import SyntheticOracle
    >>> sel = PowerOfChoiceSelector(d=6, random_state=0).fit(ClientPool([50] * 10))
    >>> oracle = SyntheticOracle(10, random_state=0)
    >>> chosen = sel.select(3, round=0, oracle=oracle)
    >>> oracle.calls[0][0], len(oracle.calls[0][1])
    ('losses', 6)
    """

    def __init__(self, *, d: int | None = None, random_state: Any = None) -> None:
        self.d = d
        self.random_state = random_state

    # d >= n is a rule across d and select's n, checked in _select.
    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "d": [None, Interval(Integral, 1, None, closed="left")],
        "random_state": ["random_state"],
    }

    def _fit(self, pool: ClientPool) -> None:
        self.rng_ = check_random_state(self.random_state)
        self.last_candidates_ = None
        self.last_losses_ = None

    chooses_available = True

    def _select(self, n: int, *, round: int, oracle: ClientOracle) -> Selection:
        d = min(2 * n if self.d is None else int(self.d), self.n_clients_)
        if d < n:
            raise ValueError(
                f"{type(self).__name__}: parameter d={self.d!r} is smaller than the n={n} clients requested; "
                "expected d >= n (or d=None for 2n)"
            )
        online = available_clients(oracle)
        if online is None:
            candidates = self.rng_.choice(self.n_clients_, size=d, replace=False, p=self.weights_)
        else:  # the d candidates among the clients online at the round's start, p_k renormalised
            p = self.weights_[online] / self.weights_[online].sum()
            candidates = self.rng_.choice(online, size=min(d, online.size), replace=False, p=p)
        losses = np.asarray(oracle.losses(candidates), dtype=np.float64)
        # Largest loss first; NaN (no answer) last; stable keeps draw order on ties.
        order = np.argsort(-np.nan_to_num(losses, nan=-np.inf, posinf=np.inf), kind="stable")
        self.last_candidates_ = candidates
        self.last_losses_ = losses
        return Selection(candidates[order[:n]])


@hookimpl
def register_selectors(register):
    register(PowerOfChoiceSelector, name="power-of-choice", aliases=("pow-d", "powd"))
