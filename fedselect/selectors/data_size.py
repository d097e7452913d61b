"""Importance sampling by data size: clients with more samples are chosen more often."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from sklearn.utils import check_random_state

from .._validation import StrOptions
from ..hookspecs import hookimpl
from ..selection import BaseSelector, ClientOracle, ClientPool, Selection, available_clients

__all__ = ["DataSizeSelector"]

_MODES = ("textbook", "flsim")


class DataSizeSelector(BaseSelector):
    """Choose clients with probability growing with their number of samples n_k.

    Two readings of "importance sampling by data size" are in use; FedLDCS [1]_ compares
    against FLSim's [2]_, and both are offered:

    ``mode="textbook"``
        ``n`` distinct clients drawn without replacement, each successive draw with
        probability proportional to n_k among the clients not drawn yet
        (``numpy.random.choice(N, n, replace=False, p=p)``). No aggregation weights are
        returned: the trainer aggregates by its own rule (FedAvg weights by n_k). Note
        that this is *not* an unbiased estimator of full participation when combined with
        n_k-weighted averaging, since large clients are counted twice over; that is the
        baseline as papers run it. For an unbiased design use clustered sampling.
    ``mode="flsim"``
        each client is included independently with probability
        ``pi_k = min(1, n * n_k / sum_j n_j)`` (FLSim's ``ImportanceSamplingActiveUserSelector``),
        so the expected size is about ``n`` and the realised size varies
        (``variable_size`` is True). An empty draw is redrawn, so the inclusion
        probabilities are ``pi_k / (1 - prod_j (1 - pi_j))``. Again no weights.

    The oracle is never asked anything.

    Parameters
    ----------
    mode : {"textbook", "flsim"}, default="textbook"
        Which reading (see above).
    random_state : None, int or numpy RandomState, default=None
        Seeds the selection stream.

    Attributes
    ----------
    rng_ : numpy RandomState
        The selection stream.
    weights_ : ndarray of float
        p_k = n_k / sum_j n_j (from :meth:`fit`).
    variable_size : bool
        ``True`` exactly when ``mode == "flsim"`` (read-only property).

    References
    ----------
    .. [1] Hou, S., Kong, Z. "FedLDCS: Adaptive Divergence-Based Client Selection for
       Federated Learning." FedKDD 2024 (Section 4: the baselines, run on FLSim).
    .. [2] FLSim, ``flsim/active_user_selectors/simple_user_selector.py``,
       ``ImportanceSamplingActiveUserSelector``.

    Examples
    --------
    >>> from fedselect.selection import ClientPool
    >>> from fedselect.testing import SyntheticOracle
    >>> sel = DataSizeSelector(random_state=0).fit(ClientPool([1, 1, 1, 1000]))
    >>> 3 in sel.select(2, round=0, oracle=SyntheticOracle(4)).clients
    True
    """

    def __init__(self, *, mode: str = "textbook", random_state: Any = None) -> None:
        self.mode = mode
        self.random_state = random_state

    @property
    def variable_size(self) -> bool:  # type: ignore[override]
        """FLSim's independent inclusion gives a random number of clients."""
        return self.mode == "flsim"

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "mode": [StrOptions(_MODES)],
        "random_state": ["random_state"],
    }

    def _fit(self, pool: ClientPool) -> None:
        self.rng_ = check_random_state(self.random_state)

    def inclusion_probabilities(self, n: int) -> np.ndarray:
        """FLSim's per-client probabilities ``min(1, n * p_k)`` before the empty-draw redraw."""
        return np.minimum(1.0, n * self.weights_)

    chooses_available = True

    def _select(self, n: int, *, round: int, oracle: ClientOracle) -> Selection:
        online = available_clients(oracle)
        if online is not None:  # the same rule over the clients online at the round's start, p_k renormalised
            p = self.weights_[online] / self.weights_[online].sum()
            if self.mode == "textbook":
                return Selection(self.rng_.choice(online, size=n, replace=False, p=p))
            pi = np.minimum(1.0, n * p)
            while True:
                chosen = online[self.rng_.random_sample(online.size) < pi]
                if chosen.size:
                    return Selection(chosen)
        if self.mode == "textbook":
            return Selection(self.rng_.choice(self.n_clients_, size=n, replace=False, p=self.weights_))
        pi = self.inclusion_probabilities(n)
        # sum(pi) >= 1 (or some pi_k == 1), so an empty draw has probability <= 1/e: redraw.
        while True:
            chosen = np.flatnonzero(self.rng_.random_sample(self.n_clients_) < pi)
            if chosen.size:
                return Selection(chosen)


@hookimpl
def register_selectors(register):
    register(DataSizeSelector, name="data-size", aliases=("importance-size",))
