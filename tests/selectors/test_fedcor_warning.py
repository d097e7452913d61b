"""FedCor's "GP fit ended worse than it started" warning does what its text and FedCor's docs page say.

The statements under test (docs/selectors/fedcor.rst, "GP fits that end worse than they started"):
each fit restarts Adam, whose first step moves every coordinate of X by about gp_lr and throws an X
that already fits well out of the optimum; when the fit's steps do not bring it back, the warning
names the fit and the run keeps the X the fit ended with; at the paper's gp_lr it is rare, and more
frequent with a larger gp_lr.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedselect.selection import ClientPool
from fedselect.selectors.fedcor import FedCorSelector
from fedselect.testing import SyntheticOracle

N = 20


def _warmed_up(gp_lr: float = 0.01) -> FedCorSelector:
    sel = FedCorSelector(warmup_rounds=10, rank=5, gp_lr=gp_lr, warmup_iters=300, random_state=0)
    sel.fit(ClientPool([50] * N))
    oracle = SyntheticOracle(N, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for t in range(6):  # warm-up rounds: one loss-change vector each
            oracle.round = t
            sel.select(4, round=t, oracle=oracle)
    return sel


def test_the_warning_names_the_fit_and_the_run_keeps_the_x_it_ended_with():
    sel = _warmed_up()
    depth = sel.warmup_history
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        sel._fit_gp(5, 5, 1, depth, 3000, "warmup")  # converged: no warning
    converged = sel.embeddings_
    with pytest.warns(RuntimeWarning) as caught:
        sel._fit_gp(5, 5, 1, depth, 1, "warmup")  # a fit restarts Adam: one step from the optimum
    (message,) = [str(w.message) for w in caught]
    start, end = sel.fit_log_[-2].nll, sel.fit_log_[-1].nll
    assert message.startswith(
        f"FedCorSelector: the GP fit of round 5 (warmup) ended with a worse negative log-likelihood ({end:.4g}) "
        f"than it started with ({start:.4g}). Each fit restarts Adam"
    )
    for words in (
        "these 1 steps did not bring them back",
        "The run goes on from these embeddings",
        "a gp_lr below the current 0.01 makes it rarer",
        "'GP fits that end worse than they started'",
    ):
        assert words in message
    # the run keeps the X the fit ended with: one Adam step of 0.01 away from the converged X
    np.testing.assert_allclose(np.abs(sel.embeddings_ - converged), 0.01, rtol=1e-3)
    assert end > start


def test_rare_at_the_papers_gp_lr_and_more_frequent_with_a_larger_one():
    def warned(gp_lr: float) -> tuple[int, int]:
        sel = FedCorSelector(warmup_rounds=8, gp_interval=2, rank=5, gp_lr=gp_lr, random_state=0)
        sel.fit(ClientPool([50] * N))
        oracle = SyntheticOracle(N, random_state=0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            for t in range(16):
                oracle.round = t
                sel.select(4, round=t, oracle=oracle)
        worse = [w for w in caught if "ended with a worse negative log-likelihood" in str(w.message)]
        return len(worse), len(sel.fit_log_)

    assert warned(0.01) == (0, 12)  # the numbers docs/selectors/fedcor.rst quotes
    assert warned(1.0) == (2, 12)
