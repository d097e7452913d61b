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


# -- the trainer takes it -------------------------------------------------------------------------------------------


def _fit(fed, **kw):
    from fedselect import FederatedTrainer

    return FederatedTrainer(selector="random", rounds=2, clients_per_round=3, random_state=0, **kw).fit(fed)


def test_the_trainer_trains_the_same_bits_with_optimizer_as_with_flat_keywords(digits_fed):
    import warnings

    import numpy as np

    from fedselect.identity import trainer_identity

    settings = dict(lr=0.1, momentum=0.5, nesterov=True, weight_decay=1e-3, prox_mu=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        flat = _fit(digits_fed, **settings)
    one = _fit(digits_fed, optimizer=LocalSGD(**settings))
    assert np.array_equal(flat.parameters_, one.parameters_)
    assert flat.history_.config["trainer"] == one.history_.config["trainer"]  # recorded settings: flat keys
    assert "optimizer" not in one.history_.config["trainer"]
    assert trainer_identity(flat) == trainer_identity(one)  # one run, one key


def test_a_comparison_keys_localsgd_as_the_flat_keys_it_sets():
    """A comparison's run key holds the settings given: LocalSGD's fields away from their defaults, as flat keys."""
    from fedselect.experiments.plan import run_settings
    from fedselect.identity import run_key

    spec = {"dataset": "digits", "n_clients": 8}

    def key(trainer):
        return run_key(run_settings(spec, {"rounds": 2, **trainer}, "random", 0))

    assert key({"optimizer": LocalSGD(lr=0.1)}) == key({"lr": 0.1})
    assert key({"optimizer": LocalSGD(lr=0.1, momentum=0.9)}) == key({"lr": 0.1, "momentum": 0.9})
    assert key({"optimizer": LocalSGD()}) == key({})
    assert key({"optimizer": LocalSGD(lr=0.1)}) != key({"lr": 0.2})


def test_flat_keywords_warn_and_setting_both_is_an_error(digits_fed):
    with pytest.warns(DeprecationWarning, match=r"flat optimiser keywords \(lr=0.1\).*optimizer=LocalSGD\(lr=0.1\)"):
        _fit(digits_fed, lr=0.1)
    with pytest.raises(InvalidParameterError, match=r"optimizer=LocalSGD.*lr=0.1 are both set"):
        _fit(digits_fed, lr=0.1, optimizer=LocalSGD(lr=0.2))


def test_a_schedule_that_gives_a_bad_step_size_is_an_error_naming_it(digits_fed):
    with pytest.raises(InvalidParameterError, match=r"lr_schedule gave lr=0.0 for round 1"):
        _fit(digits_fed, lr_schedule=lambda t: 0.1 if t == 0 else 0.0)


def test_settings_mappings_build_the_trainer_with_one_optimizer_and_no_warning(digits_fed, recwarn):
    from fedselect.optim import as_optimizer

    kw = as_optimizer({"lr": 0.1, "momentum": 0.5, "rounds": 2})
    assert kw == {"rounds": 2, "optimizer": LocalSGD(lr=0.1, momentum=0.5)}
    assert as_optimizer({"rounds": 2}) == {"rounds": 2}
    _fit(digits_fed, **as_optimizer({"lr": 0.1}))
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning) and "optimiser" in str(w.message)]
