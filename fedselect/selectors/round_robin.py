"""Random round robin: every client once per pass, in a fresh random order each pass."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from sklearn.utils import check_random_state

from ..hookspecs import hookimpl
from ..selection import BaseSelector, ClientOracle, ClientPool, Selection

__all__ = ["RoundRobinSelector"]


class RoundRobinSelector(BaseSelector):
    """Random round robin: each pass picks uniformly among the clients not yet chosen in it.

    A *pass* is a uniformly random permutation of all N clients, consumed ``n`` at a
    time, so within a pass every client trains exactly once. The two readings differ at
    the end of a pass, when fewer than ``n`` clients remain (FedLDCS [1]_ compares against
    FLSim's [2]_ version):

    ``flsim=False`` (textbook)
        the round takes the remaining clients and fills up with clients drawn uniformly
        from the next pass, never repeating a client within the round; every round has
        exactly ``n`` clients and the concatenated sequence of chosen clients is a
        sequence of whole permutations.
    ``flsim=True`` (FLSim's ``RandomRoundRobinActiveUserSelector``)
        the round takes only the short remainder, so the size varies: for N = 10 and
        n = 7 the rounds have 7, 3, 7, 3, ... clients (``variable_size`` is True).

    No aggregation weights are returned; the oracle is never asked anything.

    Parameters
    ----------
    flsim : bool, default=False
        Return the short remainder at the end of a pass (FLSim) instead of filling up.
    random_state : None, int or numpy RandomState, default=None
        Seeds the pass permutations.

    Attributes
    ----------
    rng_ : numpy RandomState
        The selection stream.
    queue_ : ndarray of int
        The clients of the current pass not chosen yet, in the order they will be.
    n_passes_ : int
        How many passes have been started.
    variable_size : bool
        ``True`` exactly when ``flsim`` is ``True`` (read-only property).

    References
    ----------
    .. [1] Hou, S., Kong, Z. "FedLDCS: Adaptive Divergence-Based Client Selection for
       Federated Learning." FedKDD 2024 (Section 4: the baselines, run on FLSim).
    .. [2] FLSim, Meta's federated learning simulator,
       ``flsim/active_user_selectors/simple_user_selector.py``.

    Examples
    --------
    >>> from fedselect.selection import ClientPool
    >>> from fedselect.testing import SyntheticOracle
    >>> sel = RoundRobinSelector(flsim=True, random_state=0).fit(ClientPool([5] * 10))
    >>> oracle = SyntheticOracle(10)
    >>> [len(sel.select(7, round=t, oracle=oracle)) for t in range(4)]
    [7, 3, 7, 3]
    """

    def __init__(self, *, flsim: bool = False, random_state: Any = None) -> None:
        self.flsim = flsim
        self.random_state = random_state

    @property
    def variable_size(self) -> bool:  # type: ignore[override]
        """FLSim's reading returns the short remainder at the end of a pass."""
        return bool(self.flsim)

    _parameter_constraints: ClassVar[dict[str, Any]] = {"flsim": ["boolean"], "random_state": ["random_state"]}

    def _fit(self, pool: ClientPool) -> None:
        self.rng_ = check_random_state(self.random_state)
        self.queue_ = np.zeros(0, dtype=np.int64)
        self.n_passes_ = 0

    def _new_pass(self) -> np.ndarray:
        self.n_passes_ += 1
        return self.rng_.permutation(self.n_clients_)

    def _select(self, n: int, *, round: int, oracle: ClientOracle) -> Selection:
        if self.queue_.size == 0:
            self.queue_ = self._new_pass()
        if self.queue_.size >= n or self.flsim:
            chosen, self.queue_ = self.queue_[:n], self.queue_[n:]
            return Selection(chosen)
        # Textbook: the remainder, then the first clients of a new pass that are not in this round.
        rest = self.queue_
        need = n - rest.size
        self.n_passes_ += 1
        others = self.rng_.permutation(np.setdiff1d(np.arange(self.n_clients_), rest))
        fill = others[:need]
        # The new pass is `fill` followed by a uniformly random order of everyone else.
        self.queue_ = self.rng_.permutation(np.concatenate([others[need:], rest]))
        return Selection(np.concatenate([rest, fill]))


@hookimpl
def register_selectors(register):
    register(RoundRobinSelector, name="round-robin", aliases=("rr",))
