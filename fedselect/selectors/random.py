"""Uniform random client selection, the baseline of every client-selection paper."""

from __future__ import annotations

from typing import Any, ClassVar

from sklearn.utils import check_random_state

from ..hookspecs import hookimpl
from ..selection import BaseSelector, ClientOracle, ClientPool, Selection, available_clients

__all__ = ["RandomSelector"]


class RandomSelector(BaseSelector):
    """Choose clients uniformly at random.

    Without replacement (the default) every round picks ``n`` distinct clients, each
    subset equally likely: the "Random" baseline of FedCor [1]_ and of most papers. With
    ``replace=True`` the ``n`` draws are independent and uniform over all clients, as in
    the sampling-with-replacement analysis of Cho et al. [2]_; a client drawn twice is
    merged and counts twice in the trainer's aggregation, so fewer than ``n`` distinct
    clients may train (see ``variable_size``). Sampling *proportional to n_k* is
    :class:`~fedselect.selectors.data_size.DataSizeSelector`.

    No aggregation weights are returned: the trainer aggregates by its own rule. The
    oracle is never asked anything, so random selection costs nothing beyond the round.

    Parameters
    ----------
    replace : bool, default=False
        Draw with replacement (duplicates possible) instead of ``n`` distinct clients.
    random_state : None, int or numpy RandomState, default=None
        Seeds the selection stream (the trainer seeds ``None`` from its own seed).

    Attributes
    ----------
    rng_ : numpy RandomState
        The selection stream, created by :meth:`fit`.
    n_clients_ : int
        N, learned by :meth:`fit`.
    variable_size : bool
        ``True`` exactly when ``replace`` is ``True`` (a read-only property that overrides
        the class-level declaration of :class:`~fedselect.selection.BaseSelector`).

    References
    ----------
    .. [1] Tang, M., Ning, X., Wang, Y., Sun, J., Wang, Y., Li, H., Chen, Y. "FedCor:
       Correlation-Based Active Client Selection Strategy for Heterogeneous Federated
       Learning." CVPR 2022.
    .. [2] Cho, Y. J., Wang, J., Joshi, G. "Client Selection in Federated Learning:
       Convergence Analysis and Power-of-Choice Selection Strategies." arXiv:2010.01243, 2020.

    Examples
    --------
    >>> from fedselect.selection import ClientPool
    >>> from fedselect.testing import SyntheticOracle
    >>> selector = RandomSelector(random_state=0).fit(ClientPool([10, 20, 30, 40]))
    >>> len(selector.select(2, round=0, oracle=SyntheticOracle(4)))
    2
    """

    def __init__(self, *, replace: bool = False, random_state: Any = None) -> None:
        self.replace = replace
        self.random_state = random_state

    @property
    def variable_size(self) -> bool:  # type: ignore[override]
        """With replacement a draw may repeat a client, so fewer than ``n`` distinct clients may train."""
        return bool(self.replace)

    _parameter_constraints: ClassVar[dict[str, Any]] = {"replace": ["boolean"], "random_state": ["random_state"]}

    def _fit(self, pool: ClientPool) -> None:
        self.rng_ = check_random_state(self.random_state)

    chooses_available = True

    def _select(self, n: int, *, round: int, oracle: ClientOracle) -> Selection:
        online = available_clients(oracle)
        if online is not None:  # uniform among the clients online at the round's start
            if self.replace:
                return Selection(online[self.rng_.randint(0, online.size, size=n)])
            return Selection(self.rng_.choice(online, size=n, replace=False))
        if self.replace:
            return Selection(self.rng_.randint(0, self.n_clients_, size=n))
        return Selection(self.rng_.choice(self.n_clients_, size=n, replace=False))


@hookimpl
def register_selectors(register):
    register(RandomSelector, name="random", aliases=("uniform",))
