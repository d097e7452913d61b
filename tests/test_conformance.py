"""The conformance checks over every registered selector, one pytest item per (selector, check).

A selector registered through the plugin hook is covered here without anyone editing this
file. Each selector runs with its registered defaults, except FedCor, whose defaults (15
warm-up rounds of 150 GP iterations) make the checks take minutes: it runs with a short
warm-up and few GP iterations, which exercises every branch of its schedule.
"""

from __future__ import annotations

import warnings

from fedselect import get_selector, list_selectors
from fedselect.testing import parametrize_with_checks

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
