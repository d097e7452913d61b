"""LocalSGD: the local optimiser's settings as one checked value."""

from __future__ import annotations

import math

import pytest

from fedselect import LocalSGD
from fedselect._validation import InvalidParameterError, invalid_values
from fedselect.optim import OPTIMIZER_KEYS


def test_defaults_are_the_trainers_flat_defaults():
    import inspect

    from fedselect.simulation.trainer import FederatedTrainer

    sig = inspect.signature(FederatedTrainer.__init__).parameters
    assert LocalSGD().to_dict() == {k: sig[k].default for k in OPTIMIZER_KEYS}


@pytest.mark.parametrize("name", OPTIMIZER_KEYS)
def test_every_invalid_value_is_refused_naming_the_parameter(name):
    for bad in invalid_values(LocalSGD._parameter_constraints[name]):
        with pytest.raises(InvalidParameterError, match=rf"LocalSGD: parameter {name}="):
            LocalSGD(**{name: bad})


def test_nesterov_needs_momentum():
    with pytest.raises(InvalidParameterError, match="nesterov=True needs momentum"):
        LocalSGD(nesterov=True)
    assert LocalSGD(momentum=0.9, nesterov=True).nesterov


def test_frozen_and_with_lr():
    opt = LocalSGD(lr=0.1, weight_decay=1e-4)
    with pytest.raises(AttributeError):
        opt.lr = 0.2  # type: ignore[misc]
    other = opt.with_lr(0.025)
    assert other.lr == 0.025 and other.weight_decay == 1e-4 and opt.lr == 0.1
    with pytest.raises(InvalidParameterError):
        opt.with_lr(math.inf)
