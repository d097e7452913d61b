"""FederatedTrainer takes a selector in every form, and grids over its parameters work for each."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.model_selection import ParameterGrid

from fedselect import FederatedTrainer
from fedselect.selection import BaseSelector, Selection
from fedselect.selectors.power_of_choice import PowerOfChoiceSelector

FAST = {"rounds": 3, "clients_per_round": 3, "local_steps": 1}


class Shifted(BaseSelector):
    """Not registered: clients offset, offset + 1, ..., moving by ``step`` each round."""

    def __init__(self, *, offset=0, step=1):
        self.offset = offset
        self.step = step

    def _fit(self, pool):
        self.n_ = pool.n_clients

    def _select(self, n, *, round, oracle):
        return Selection((self.offset + round * self.step + np.arange(n)) % self.n_)


@pytest.mark.parametrize("given", ["power-of-choice", ("power-of-choice", {"d": 4}), PowerOfChoiceSelector(),
                                   PowerOfChoiceSelector, (PowerOfChoiceSelector, {"d": 4})])
def test_a_parameter_grid_works_however_the_selector_was_given(digits_fed, given):
    base = FederatedTrainer(selector=given, random_state=0, **FAST)
    assert base.get_params(deep=True)["selector__d"] in (None, 4)
    seen = []
    for params in ParameterGrid({"selector__d": [6, 8]}):
        tr = clone(base).set_params(**params)
        assert tr.get_params(deep=True)["selector__d"] == params["selector__d"]
        tr.fit(digits_fed)
        seen.append(tr.selector_.d)
        asked = sum(r.costs.scalars_up for r in tr.history_.rounds[:1])
        assert asked == params["selector__d"]  # power of choice asks d candidates for their loss
    assert seen == [6, 8]
    if isinstance(given, str | tuple) or isinstance(given, type):
        # a name or class stays one: it is built at fit, and the history records the class
        assert clone(base).set_params(selector__d=6).selector[0] == (given[0] if isinstance(given, tuple) else given)


def test_a_name_given_grid_equals_the_instance_given_run(digits_fed):
    by_name = FederatedTrainer(selector="power-of-choice", random_state=0, **FAST).set_params(selector__d=6)
    by_instance = FederatedTrainer(selector=PowerOfChoiceSelector(d=6), random_state=0, **FAST)
    assert by_name.fit(digits_fed).history_ == by_instance.fit(digits_fed).history_


def test_unknown_selector_parameters_name_the_selector_and_its_parameters():
    with pytest.raises(ValueError, match=r"selector 'power-of-choice' \(PowerOfChoiceSelector\) has no parameter "
                       r"'q' \(given as selector__<name>\); its parameters: d, random_state"):
        FederatedTrainer(selector="power-of-choice").set_params(selector__q=1)
    with pytest.raises(ValueError, match=r"selector 'Shifted' \(Shifted\) has no parameter 'd'.*: offset, step"):
        FederatedTrainer(selector=Shifted).set_params(selector__d=1)
    with pytest.raises(KeyError, match="unknown selector 'nope'"):
        FederatedTrainer(selector="nope").set_params(selector__d=1)
    tr = FederatedTrainer().set_params(selector__random_state=3)  # None stands for random
    assert tr.selector == ("random", {"random_state": 3})


def test_classes_and_pairs_train_a_new_object(digits_fed):
    a = FederatedTrainer(selector=Shifted, random_state=0, **FAST).fit(digits_fed)
    b = FederatedTrainer(selector=(Shifted, {"step": 2}), random_state=0, **FAST).fit(digits_fed)
    assert [r.clients for r in a.history_.rounds] == [[0, 1, 2], [1, 2, 3], [2, 3, 4]]
    assert [r.clients for r in b.history_.rounds] == [[0, 1, 2], [2, 3, 4], [4, 5, 6]]
    assert type(b.selector_) is Shifted and b.selector_.step == 2


@pytest.mark.parametrize("bad", [3, ("random",), (int, {}), ("random", {"q": 1}), "nope"])
def test_a_bad_selector_is_an_error_before_training(digits_fed, bad):
    with pytest.raises((TypeError, ValueError, KeyError), match=r"selector|nope|q"):
        FederatedTrainer(selector=bad, **FAST).fit(digits_fed)
