"""FederatedTrainer: reproducibility, aggregation semantics, the paid oracle, errors users meet."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.utils import check_random_state

from fedselect import FederatedTrainer, SelectionError
from fedselect.selection import BaseSelector, Selection
from fedselect.simulation.history import History

FAST = {"model": "logistic", "clients_per_round": 3, "rounds": 6, "local_steps": 3, "batch_size": 16, "lr": 0.1}


class Fixed(BaseSelector):
    """Always the same clients, optionally with weights; records what it was told."""

    needs = frozenset({"updates", "global"})

    def __init__(self, *, clients=(0, 1, 2), weights=None, random_state=None):
        self.clients = clients
        self.weights = weights
        self.random_state = random_state

    def _fit(self, pool):
        self.feedback_ = []

    def _select(self, n, *, round, oracle):
        return Selection(list(self.clients), self.weights)

    def _update(self, feedback):
        self.feedback_.append(feedback)


class Asks(BaseSelector):
    """Asks the oracle something, then picks the first n clients."""

    def __init__(self, *, ask="losses", random_state=None):
        self.ask = ask
        self.random_state = random_state

    def _fit(self, pool):
        self.answers_ = []

    def _select(self, n, *, round, oracle):
        ids = np.arange(self.n_clients_)
        if self.ask == "losses":
            self.answers_.append(oracle.losses(ids[: 2 * n]))
        elif self.ask == "trial":
            self.answers_.append(oracle.trial(ids[:n]))
        elif self.ask == "updates":
            self.answers_.append(oracle.local_updates(ids, transform=lambda u: u[:4]))
        elif self.ask == "full-updates":
            self.answers_.append(oracle.local_updates(ids[: 2 * n]))
            self.answers_.append(oracle.local_updates(ids[:n]))  # asked again: already on the server
        return Selection(ids[:n])


class Bad(BaseSelector):
    variable_size = False

    def __init__(self, *, out=(0, 0, 1), random_state=None):
        self.out = out
        self.random_state = random_state

    def _fit(self, pool):
        self.rng_ = check_random_state(self.random_state)

    def _select(self, n, *, round, oracle):
        return Selection(list(self.out))


def test_one_seed_gives_the_same_run_bit_for_bit(digits_fed):
    a = FederatedTrainer(selector="random", random_state=3, **FAST).fit(digits_fed)
    b = FederatedTrainer(selector="random", random_state=3, **FAST).fit(digits_fed)
    assert a.history_ == b.history_
    assert np.array_equal(a.parameters_, b.parameters_)
    c = FederatedTrainer(selector="random", random_state=4, **FAST).fit(digits_fed)
    assert a.history_ != c.history_


def test_selector_without_seed_is_seeded_by_trainer_and_original_untouched(digits_fed):
    from fedselect import get_selector

    sel = get_selector("random")
    tr = FederatedTrainer(selector=sel, random_state=0, **FAST).fit(digits_fed)
    assert sel.random_state is None and not hasattr(sel, "rng_")
    assert tr.selector_ is not sel and tr.selector_.random_state is not None


def test_selection_stream_separate_from_training_stream(digits_fed):
    # A deterministic selector: its random_state must not change the training at all.
    a = FederatedTrainer(selector=Fixed(random_state=1), random_state=0, **FAST).fit(digits_fed)
    b = FederatedTrainer(selector=Fixed(random_state=2), random_state=0, **FAST).fit(digits_fed)
    assert np.array_equal(a.parameters_, b.parameters_)


def test_weights_are_applied_to_deltas_as_given(digits_fed):
    tr = FederatedTrainer(selector=Fixed(clients=(4, 1, 7), weights=[2.0, 0.5, 0.25]), random_state=0, **FAST)
    tr.fit(digits_fed)
    for fb in tr.selector_.feedback_:
        order = np.argsort([4, 1, 7])  # validated selections are sorted
        w = np.array([2.0, 0.5, 0.25])[order]
        np.testing.assert_allclose(fb.weights, w)
        expected = fb.global_before + (w[:, None] * fb.updates).sum(0)
        np.testing.assert_allclose(fb.global_after, expected, rtol=1e-5, atol=1e-6)


def test_default_rules_mean_and_data_size(digits_fed_holdout):
    fed = digits_fed_holdout
    for rule in ("mean", "data-size"):
        tr = FederatedTrainer(selector=Fixed(clients=(0, 3, 5)), aggregation=rule, random_state=0, **FAST).fit(fed)
        fb = tr.selector_.feedback_[0]
        n = fed.n_samples[[0, 3, 5]].astype(float)
        expected = np.full(3, 1 / 3) if rule == "mean" else n / n.sum()
        np.testing.assert_allclose(fb.weights, expected)
        np.testing.assert_allclose(fb.global_after, fb.global_before + (expected[:, None] * fb.updates).sum(0),
                                   rtol=1e-5, atol=1e-6)


def test_feedback_losses_are_losses_before_training(digits_fed_holdout):
    fed = digits_fed_holdout

    class FixedWithLosses(Fixed):  # the feedback carries the losses only for a selector that needs them
        needs = frozenset({"updates", "global", "losses"})

    tr = FederatedTrainer(selector=FixedWithLosses(clients=(0, 1, 2)), random_state=0, **FAST).fit(fed)
    from fedselect.simulation.engine import Engine
    from fedselect.simulation.models import build_model

    torch.manual_seed(0)
    eng = Engine(build_model("logistic", fed.input_shape, fed.n_classes), fed.X, fed.y, fed.loss_indices,
                 fed.X_test, fed.y_test)
    fb = tr.selector_.feedback_[2]
    expected = eng.client_losses(torch.from_numpy(fb.global_before.copy()), np.array([0, 1, 2]))
    np.testing.assert_allclose(fb.losses, expected, rtol=1e-5)


def test_oracle_losses_are_paid_and_reused_by_the_round(digits_fed):
    tr = FederatedTrainer(selector=Asks(ask="losses"), random_state=0, **FAST).fit(digits_fed)
    c = tr.history_.rounds[0].costs
    # 6 clients asked: 6 models down, 6 losses up; the 3 chosen were among them, so nothing more down,
    # their losses are reused; 3 models up.
    assert (c.models_down, c.scalars_up, c.models_up, c.local_trainings) == (6, 6, 3, 3)


def test_oracle_trial_is_paid_and_not_applied(digits_fed):
    tr = FederatedTrainer(selector=Asks(ask="trial"), random_state=0, **FAST).fit(digits_fed)
    base = FederatedTrainer(selector=Fixed(clients=(0, 1, 2)), random_state=0, **FAST).fit(digits_fed)
    # the trial is not applied: the model equals a run that only trains the chosen clients
    np.testing.assert_allclose(tr.parameters_, base.parameters_, rtol=1e-6, atol=1e-7)
    n = digits_fed.n_clients
    c = tr.history_.rounds[0].costs
    # the trial trained 3 clients from w^t; the same 3 are then chosen and reuse those updates (one ledger:
    # a client trains from w^t at most once per round), so nothing is trained or uploaded twice
    assert c.local_trainings == 3 and c.models_up == 3
    assert c.scalars_up == n + n  # baseline losses of everyone, then trial losses of everyone
    assert c.models_down == n + n
    dl = tr.selector_.answers_[0]
    assert dl.shape == (n,) and np.all(np.isfinite(dl))


def test_local_updates_are_not_trained_twice(digits_fed):
    tr = FederatedTrainer(selector=Asks(ask="updates"), random_state=0, **FAST).fit(digits_fed)
    n = digits_fed.n_clients
    c = tr.history_.rounds[0].costs
    assert c.local_trainings == n  # the chosen reuse their update
    assert c.floats_up == 4 * n and c.models_up == 3
    assert tr.selector_.answers_[0].shape == (n, 4)
    base = FederatedTrainer(selector=Fixed(clients=(0, 1, 2)), random_state=0, **FAST).fit(digits_fed)
    np.testing.assert_allclose(tr.parameters_, base.parameters_, rtol=1e-6, atol=1e-7)


def test_full_updates_go_up_once(digits_fed):
    tr = FederatedTrainer(selector=Asks(ask="full-updates"), random_state=0, **FAST).fit(digits_fed)
    c = tr.history_.rounds[0].costs
    # 6 clients train and upload their model; the 3 chosen among them are aggregated from what the
    # server already holds: no second upload, no second training.
    assert (c.local_trainings, c.models_up, c.models_down) == (6, 6, 6)
    np.testing.assert_array_equal(tr.selector_.answers_[0][:3], tr.selector_.answers_[1])


def test_invalid_selections_are_errors_naming_the_selector(digits_fed):
    with pytest.raises(SelectionError, match=r"Bad returned 2 distinct clients.*3 were requested"):
        FederatedTrainer(selector=Bad(), random_state=0, **FAST).fit(digits_fed)
    with pytest.raises(SelectionError, match=r"out of range.*12 clients"):
        FederatedTrainer(selector=Bad(out=(0, 1, 99)), random_state=0, **FAST).fit(digits_fed)
    with pytest.raises(SelectionError, match="empty"):
        FederatedTrainer(selector=Bad(out=()), random_state=0, **FAST).fit(digits_fed)


def test_bad_parameters_are_named(digits_fed):
    with pytest.raises(ValueError, match=r"FederatedTrainer: parameter clients_per_round=50 .*12 clients"):
        FederatedTrainer(**{**FAST, "clients_per_round": 50}).fit(digits_fed)
    with pytest.raises(ValueError, match="parameter lr=-1"):
        FederatedTrainer(**{**FAST, "lr": -1}).fit(digits_fed)
    with pytest.raises(ValueError, match="aggregation"):
        FederatedTrainer(**{**FAST, "aggregation": "median"}).fit(digits_fed)
    with pytest.raises(KeyError, match="unknown selector 'nope'"):
        FederatedTrainer(**{**FAST, "selector": "nope"}).fit(digits_fed)


def test_nan_model_is_an_error(digits_fed):
    with pytest.raises(FloatingPointError, match=r"NaN|non-finite"):
        FederatedTrainer(**{**FAST, "lr": 1e38, "rounds": 3, "selector": "random"}).fit(digits_fed)


def test_target_stops_and_history_helpers(digits_fed, tmp_path):
    tr = FederatedTrainer(**{**FAST, "rounds": 40, "target_accuracy": 0.5, "selector": "random"}, random_state=0)
    h = tr.fit(digits_fed).history_
    r = h.rounds_to_accuracy(0.5)
    assert r == len(h) and h.rounds[-1].test_accuracy >= 0.5
    assert h.rounds_to_accuracy(1.01) is None
    assert h.costs_to_accuracy(0.5).local_trainings == 3 * r
    h.to_csv(tmp_path / "h.csv")
    assert len((tmp_path / "h.csv").read_text().splitlines()) == len(h) + 1
    back = History.from_json(h.to_json(tmp_path / "h.json"))
    assert back == h  # seconds excluded from equality
    assert sum(h.selection_counts(digits_fed.n_clients)) == 3 * len(h)


def test_lr_schedule_and_fedprox(digits_fed):
    tr = FederatedTrainer(**{**FAST, "lr_schedule": {2: 0.5, 4: 0.5}}, random_state=0).fit(digits_fed)
    assert [r.lr for r in tr.history_.rounds] == [0.1, 0.1, 0.05, 0.05, 0.025, 0.025]
    a = FederatedTrainer(**FAST, random_state=0).fit(digits_fed).parameters_
    b = FederatedTrainer(**FAST, prox_mu=1.0, random_state=0).fit(digits_fed).parameters_
    assert not np.allclose(a, b)


def test_trainer_is_a_cloneable_estimator():
    tr = FederatedTrainer(selector="afl", rounds=3)
    c = clone(tr)
    assert c.get_params()["rounds"] == 3 and c is not tr
    assert "FederatedTrainer" in repr(tr)
