"""Declared parameter constraints: every parameter of every registered selector and of the trainer.

The invalid values are generated from the declarations (fedselect._validation.invalid_values),
so a new selector or a new parameter is covered without touching this file.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import re
import sys
from numbers import Integral, Real
from pathlib import Path

import numpy as np
import pytest

import fedselect
from fedselect import FederatedTrainer
from fedselect._validation import (
    Interval,
    InvalidParameterError,
    Predicate,
    StrOptions,
    describe,
    invalid_values,
    validate_parameters,
)
from fedselect.plugins import get_selector_class
from fedselect.selection import ClientOracle, ClientPool
from fedselect.testing import SyntheticOracle

SELECTORS = fedselect.list_selectors()
PLUGIN_SRC = Path(__file__).resolve().parents[1] / "plugins" / "fedselect-divfl" / "src" / "fedselect_divfl"


def _example_plugin_class():
    """The example plugin's DivFLSelector, loaded from its source (it is not installed here)."""
    spec = importlib.util.spec_from_file_location(
        "_divfl_for_validation", PLUGIN_SRC / "__init__.py", submodule_search_locations=[str(PLUGIN_SRC)]
    )
    if spec is None or not (PLUGIN_SRC / "__init__.py").is_file():
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a package: its relative imports (``from .setting import ...``) resolve
    spec.loader.exec_module(module)
    return module.DivFLSelector


DIVFL = _example_plugin_class()


def _cases(cls):
    for name, spec in cls.parameter_constraints().items():
        if name not in inspect.signature(cls.__init__).parameters:
            continue
        for value in invalid_values(spec):
            yield name, value


def _ids(value):
    # no memory address in an id (a bare object()'s repr has one): parallel workers must collect the same ids
    text = "object()" if type(value) is object else repr(value)
    return re.sub(r" at 0x[0-9a-fA-F]+", "", f"{type(value).__name__}:{text}")[:40]


SELECTOR_CASES = [
    pytest.param(sel, name, value, id=f"{sel}-{name}-{_ids(value)}")
    for sel in SELECTORS
    for name, value in _cases(get_selector_class(sel))
]
TRAINER_CASES = [
    pytest.param(name, value, id=f"{name}-{_ids(value)}")
    for name, spec in FederatedTrainer._parameter_constraints.items()
    for value in invalid_values(spec)
]


def test_there_are_many_generated_cases():
    # Every registered selector contributes; the count is reported in the closing note.
    assert len({c.values[0] for c in SELECTOR_CASES}) == len(SELECTORS)
    assert len(SELECTOR_CASES) > 200
    assert len(TRAINER_CASES) > 100


@pytest.mark.parametrize("selector", SELECTORS)
def test_every_init_parameter_has_a_declared_constraint(selector):
    cls = get_selector_class(selector)
    params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    missing = [p for p in params if p not in cls.parameter_constraints()]
    assert not missing, f"{cls.__name__} declares no constraint for {missing} (add them to _parameter_constraints)"


@pytest.mark.skipif(DIVFL is None, reason="example plugin source not present")
def test_the_example_plugin_declares_and_enforces_every_parameter():
    params = [p for p in inspect.signature(DIVFL.__init__).parameters if p != "self"]
    assert set(params) <= set(DIVFL.parameter_constraints())
    cases = list(_cases(DIVFL))
    assert len(cases) > 20
    for name, value in cases:
        with pytest.raises(InvalidParameterError) as info:
            DIVFL(**{name: value}).fit(ClientPool([3, 4, 5]))
        _assert_names(info.value, "DivFLSelector", name, value)


# Checked by hand-written code in FederatedTrainer._validate by the engineers who own them; each should
# move into _parameter_constraints (then the generated tests cover it) and leave this set.
CHECKED_IN_CODE: set[str] = set()


def test_every_trainer_parameter_has_a_declared_constraint():
    params = [p for p in inspect.signature(FederatedTrainer.__init__).parameters if p != "self"]
    missing = [p for p in params if p not in FederatedTrainer._parameter_constraints and p not in CHECKED_IN_CODE]
    assert not missing, f"FederatedTrainer declares no constraint for {missing}"


class _NoQuestions(ClientOracle):
    """An oracle that fails the test if a selector asks it anything (validation must come first)."""

    n_clients = 6
    round = 0

    def losses(self, ids):
        raise AssertionError("oracle queried before the parameters were validated")

    trial = local_updates = losses

    def global_parameters(self):
        raise AssertionError("oracle queried before the parameters were validated")


def _assert_names(exc, cls_name, name, value):
    msg = str(exc)
    assert msg.startswith(f"{cls_name}: parameter {name}="), msg
    if not (isinstance(value, float) and math.isnan(value)) and type(value) is not object:
        assert repr(value)[:30] in msg, msg
    assert "; expected " in msg


@pytest.mark.parametrize("selector, name, value", SELECTOR_CASES)
def test_invalid_selector_parameter_is_refused_at_fit(selector, name, value):
    cls = get_selector_class(selector)
    sel = cls(**{name: value})  # __init__ only stores: never raises
    with pytest.raises((ValueError, TypeError)) as info:
        sel.fit(ClientPool([5, 6, 7, 8, 9, 10]))
    assert isinstance(info.value, InvalidParameterError)
    _assert_names(info.value, cls.__name__, name, value)
    assert not hasattr(sel, "n_clients_"), "fit left state behind after refusing a parameter"
    # and select never got to the oracle
    with pytest.raises(Exception) as info:
        sel.select(1, round=0, oracle=_NoQuestions())
    assert not isinstance(info.value, AssertionError)


@pytest.mark.parametrize("name, value", TRAINER_CASES)
def test_invalid_trainer_parameter_is_refused_before_training(name, value, digits_fed, monkeypatch):
    from fedselect.simulation import setup as trainer_module  # where the fit builds its model

    def no_model(*args, **kwargs):
        raise AssertionError("a model was built before the parameters were validated")

    monkeypatch.setattr(trainer_module, "build_model", no_model)
    tr = FederatedTrainer(**{name: value})
    with pytest.raises((ValueError, TypeError)) as info:
        tr.fit(digits_fed)
    assert isinstance(info.value, InvalidParameterError)
    _assert_names(info.value, "FederatedTrainer", name, value)


@pytest.mark.parametrize("selector", SELECTORS)
def test_trainer_checks_the_selectors_parameters_before_building_the_model(selector, digits_fed, monkeypatch):
    from fedselect.simulation import setup as trainer_module  # where the fit builds its model

    monkeypatch.setattr(trainer_module, "build_model", lambda *a, **k: pytest.fail("model built"))
    cls = get_selector_class(selector)
    name, value = next(_cases(cls))
    with pytest.raises(InvalidParameterError, match=rf"^{cls.__name__}: parameter {name}="):
        FederatedTrainer(selector=cls(**{name: value}), rounds=1).fit(digits_fed)


def test_the_trainer_names_the_federation_it_wants(monkeypatch):
    with pytest.raises(TypeError, match=r"expects a Federation, got str 'digits'.*make_federation"):
        FederatedTrainer(rounds=1).fit("digits")


@pytest.mark.parametrize(
    "params, match",
    [
        ({"n_threads": 0}, r"parameter n_threads=0 is invalid; expected None or an int in \[1, inf\)"),
        ({"n_threads": -1}, r"parameter n_threads=-1 is invalid"),
        ({"random_state": -1}, r"parameter random_state=-1 is invalid; expected None or an int in \[0, inf\)"),
        ({"lr": float("nan")}, r"parameter lr=nan is invalid; expected a finite number in \(0, inf\)"),
        ({"rounds": True}, r"parameter rounds=True is invalid"),
        ({"clients_per_round": 13}, r"clients_per_round=13 is invalid; expected an integer between 1 and .* 12"),
        ({"lr_schedule": {10: -0.5}}, r"parameter lr_schedule=\{10: -0.5\} is invalid"),
        ({"selector": "no-such-scheme"}, r"no-such-scheme"),
    ],
)
def test_trainer_messages(params, match, digits_fed):
    with pytest.raises((ValueError, TypeError, KeyError), match=match):
        FederatedTrainer(**{"rounds": 1, **params}).fit(digits_fed)


def test_random_state_minus_one_names_the_selector_parameter():
    with pytest.raises(
        ValueError,
        match=r"RandomSelector: parameter random_state=-1 is invalid; expected None, an int in \[0, 2\*\*32 - 1\]",
    ):
        fedselect.get_selector("random", random_state=-1).fit(ClientPool([1, 2]))


def test_gp_lr_is_bounded():
    with pytest.raises(ValueError, match=r"FedCorSelector: parameter gp_lr=1000000.0 is invalid; .*\(0, 1\]"):
        fedselect.get_selector("fedcor", gp_lr=1e6).fit(ClientPool([1] * 20))


# -- the constraint module itself ------------------------------------------------------


def test_interval_bounds_and_kinds():
    c = Interval(Integral, 1, 10, closed="left")
    assert [c.is_satisfied_by(v) for v in (1, 9, 10, 0, True, 2.0, np.int64(3))] == [
        True, True, False, False, False, False, True,
    ]
    r = Interval(Real, 0, 1, closed="neither")
    assert [r.is_satisfied_by(v) for v in (0.5, 0, 1, float("nan"), float("inf"), np.float32(0.3), False)] == [
        True, False, False, False, False, True, False,
    ]
    assert str(c) == "an int in [1, 10)"
    assert str(r) == "a finite number in (0, 1)"


def test_messages_list_alternatives_in_declared_order():
    spec = [None, StrOptions(("a", "b")), callable]
    assert describe(spec) == "None, one of ('a', 'b') or a callable"
    with pytest.raises(InvalidParameterError) as info:
        validate_parameters("Thing", {"p": "c"}, {"p": spec})
    assert str(info.value) == "Thing: parameter p='c' is invalid; expected None, one of ('a', 'b') or a callable."
    assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)


def test_predicate_and_generated_values_violate_every_alternative():
    even = Predicate(lambda v: v % 2 == 0, "an even int", examples=[3, "x"])
    assert not even.is_satisfied_by("x")  # a test that raises rejects
    spec = [None, Interval(Integral, 0, 5, closed="both"), even]
    bad = invalid_values(spec)
    assert {-1, 1005, 0.5, "none", "x"} <= {v for v in bad if isinstance(v, int | float | str)}
    assert 3 not in bad and 6 not in bad  # in the interval; even
    from fedselect._validation import make_constraint

    for v in bad:
        assert not any(make_constraint(c).is_satisfied_by(v) for c in spec), v


def test_unknown_constraint_spec_is_a_clear_error():
    with pytest.raises(TypeError, match="unknown parameter constraint 'integer'"):
        validate_parameters("Thing", {"p": 1}, {"p": ["integer"]})


def test_a_plugin_without_declarations_still_gets_random_state_checked():
    from fedselect.selection import BaseSelector, Selection

    class Plain(BaseSelector):
        def __init__(self, *, k=1, random_state=None):
            self.k = k
            self.random_state = random_state

        def _fit(self, pool):
            pass

        def _select(self, n, *, round, oracle):
            return Selection(np.arange(n))

    Plain(k="anything").fit(ClientPool([1, 2]))  # undeclared: not checked
    with pytest.raises(ValueError, match=r"Plain: parameter random_state=-1"):
        Plain(random_state=-1).fit(ClientPool([1, 2]))
    sel = Plain().fit(ClientPool([1, 2]))
    assert isinstance(sel.select(1, round=0, oracle=SyntheticOracle(2)), Selection)
