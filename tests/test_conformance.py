"""The conformance checks over every registered selector, one pytest item per (selector, check).

A selector registered through the plugin hook is covered here without anyone editing this
file. Each selector runs with its registered defaults, except FedCor, whose defaults (15
warm-up rounds of 150 GP iterations) make the checks take minutes: it runs with a short
warm-up and few GP iterations, which exercises every branch of its schedule.

The checks judge the documented contract only, not BaseSelector's ``_fit``/``_select``
template: a correct selector that overrides ``fit``, ``select`` and ``update`` themselves (as
a third-party plugin may) passes, here directly and registered as a plugin.
"""

from __future__ import annotations

import types
import warnings

import numpy as np
import pytest
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from fedselect import BaseSelector, FederatedTrainer, Selection, get_selector, hookimpl, list_selectors
from fedselect import make_federation as _make_federation
from fedselect.plugins import pm
from fedselect.testing import check_selector, parametrize_with_checks, yield_checks

FAST = {"fedcor": {"warmup_rounds": 3, "gp_interval": 4, "warmup_iters": 5, "gp_iters": 5, "rank": 3}}


def registered_selectors():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [get_selector(name, **FAST.get(name, {})) for name in list_selectors()]


def test_every_registered_selector_is_checked():
    from fedselect.plugins import registry

    classes = {entry.obj for entry in registry("selectors").values()}
    assert {type(s) for s in registered_selectors()} == classes and len(classes) >= 10


@parametrize_with_checks(registered_selectors())
def test_conformance(selector, check):
    check()


# -- a correct third-party selector that does not use BaseSelector's _fit/_select template ------------
class OwnMethodsSelector(BaseSelector):
    """Power-of-choice written against the public contract: ``fit``, ``select`` and ``update`` themselves.

    Asks ``d`` random candidates for their loss and trains the ``n`` with the largest; a
    candidate that does not answer (NaN) ranks last. It never calls ``super().fit`` and
    has none of the template's attributes (``n_clients_``, ``weights_``, ...).
    """

    def __init__(self, *, d=None, random_state=None):
        self.d = d
        self.random_state = random_state

    def fit(self, pool):
        self.rng_ = check_random_state(self.random_state)
        self.size_ = pool.n_clients
        self.rounds_seen_ = 0
        return self

    def select(self, n, *, round, oracle):
        check_is_fitted(self)
        d = min(self.size_, max(n, self.d or 2 * n))
        candidates = self.rng_.choice(self.size_, d, replace=False)
        losses = np.nan_to_num(oracle.losses(candidates), nan=-np.inf)
        return Selection(candidates[np.argsort(-losses, kind="stable")[:n]])

    def update(self, feedback):
        check_is_fitted(self)
        self.rounds_seen_ += 1
        return self


def test_a_selector_that_overrides_fit_select_and_update_passes_the_suite():
    assert "_fit" not in vars(OwnMethodsSelector) and "fit" in vars(OwnMethodsSelector)
    check_selector(OwnMethodsSelector())
    check_selector(OwnMethodsSelector(d=9, random_state=3), n_rounds=10)


def test_it_runs_in_the_trainer_too():
    fed = _make_federation("digits", partition="shards", n_clients=8, random_state=0)
    tr = FederatedTrainer(
        selector=OwnMethodsSelector(), clients_per_round=3, rounds=3, model="logistic", local_steps=1, random_state=0
    ).fit(fed)
    assert len(tr.history_) == 3 and tr.selector_.rounds_seen_ == 3


def test_registered_as_a_plugin_it_passes_this_files_suite():
    module = types.ModuleType("fedselect_own_methods")

    @hookimpl
    def register_selectors(register):
        register(OwnMethodsSelector, name="own-methods")

    module.register_selectors = register_selectors
    pm.register(module, name="fedselect-own-methods")
    try:
        mine = [s for s in registered_selectors() if isinstance(s, OwnMethodsSelector)]
        assert len(mine) == 1
        for _, check in yield_checks(mine[0], n_rounds=10):
            check()
    finally:
        pm.unregister(name="fedselect-own-methods")


class _FitReturnsNone(OwnMethodsSelector):
    def fit(self, pool):
        super().fit(pool)


class _UpdateReturnsNone(OwnMethodsSelector):
    def update(self, feedback):
        super().update(feedback)


class _NoFittedCheck(OwnMethodsSelector):
    def update(self, feedback):
        return self


@pytest.mark.parametrize(
    "cls, check",
    [
        (_FitReturnsNone, "check_clone_and_params"),
        (_UpdateReturnsNone, "check_no_mutation"),
        (_NoFittedCheck, "check_not_fitted"),
    ],
)
def test_the_contract_is_still_judged_for_such_a_selector(cls, check):
    with pytest.raises(AssertionError, match=rf"{check} failed for {cls.__name__}"):
        check_selector(cls(), n_rounds=6)
