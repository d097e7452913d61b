"""Work follows needs: the chosen clients' losses on w^t before training are computed, charged and timed only for a
selector whose ``needs`` has ``"losses"`` (or with ``FederatedTrainer(feedback_losses="always")``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedselect import FederatedTrainer, make_federation
from fedselect.experiments.provenance import trainer_identity
from fedselect.profiles import SystemProfiles
from fedselect.selection import Selection
from fedselect.selectors.afl import ActiveFLSelector
from fedselect.selectors.random import RandomSelector
from fedselect.simulation.engine import Engine
from fedselect.testing import check_declared_losses

TRAIN = dict(model="logistic", local_steps=2, batch_size=8, random_state=0)


@pytest.fixture(scope="module")
def fed():
    return make_federation("digits", partition="iid", n_clients=6, random_state=0)


class Recording(RandomSelector):
    """Uniform random selection that keeps every feedback it is given."""

    def _fit(self, pool):
        super()._fit(pool)
        self.feedbacks_ = []

    def _update(self, feedback):
        self.feedbacks_.append(feedback)


class RecordingWithLosses(Recording):
    needs = frozenset({"losses", "durations"})


class RecordingDurations(Recording):
    needs = frozenset({"durations"})


def _count_client_losses(monkeypatch):
    calls = []
    original = Engine.client_losses

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "client_losses", counted)
    return calls


def test_a_selector_without_losses_gets_no_loss_computation(fed, monkeypatch):
    calls = _count_client_losses(monkeypatch)
    tr = FederatedTrainer(selector=Recording(), clients_per_round=3, rounds=3, **TRAIN).fit(fed)
    assert calls == []  # no forward pass over the chosen clients' evaluation data
    for rec in tr.history_.rounds:
        assert rec.costs.samples_evaluated == 0 and rec.costs.scalars_up == 0
    assert all(fb.losses is None for fb in tr.selector_.feedbacks_)
    FederatedTrainer(selector=Recording(), clients_per_round=3, rounds=3, feedback_losses="always", **TRAIN).fit(fed)
    assert len(calls) == 3  # the old charging: one evaluation of the chosen clients per round


def test_a_selector_with_losses_gets_the_same_losses_as_before(fed):
    """With "losses" in needs the losses, costs and model are those of feedback_losses="always" (every run's charging
    before the option), bit for bit; without it only the charging changes, never the training."""
    with_losses = FederatedTrainer(selector=RecordingWithLosses(), clients_per_round=3, rounds=3, **TRAIN).fit(fed)
    always = FederatedTrainer(
        selector=RecordingWithLosses(), clients_per_round=3, rounds=3, feedback_losses="always", **TRAIN
    ).fit(fed)
    assert with_losses.history_ == always.history_  # costs included
    for a, b in zip(with_losses.selector_.feedbacks_, always.selector_.feedbacks_):
        assert a.losses.tobytes() == b.losses.tobytes() and np.isfinite(a.losses).all()
        assert a.losses.shape == a.clients.shape
    plain = FederatedTrainer(selector=Recording(), clients_per_round=3, rounds=3, **TRAIN).fit(fed)
    for a, b in zip(plain.history_.rounds, always.history_.rounds):
        assert (a.clients, a.test_accuracy, a.test_loss) == (b.clients, b.test_accuracy, b.test_loss)
        assert a.costs.samples_evaluated == 0 and b.costs.samples_evaluated == sum(
            len(fed.loss_indices[k]) for k in b.clients
        )
        assert b.costs.scalars_up - a.costs.scalars_up == len(b.clients)
    assert plain.parameters_.tobytes() == always.parameters_.tobytes()  # the same training, bit for bit


def test_afl_declares_the_losses_it_reads(fed):
    assert "losses" in ActiveFLSelector.needs
    tr = FederatedTrainer(selector="afl", clients_per_round=3, rounds=3, **TRAIN).fit(fed)
    always = FederatedTrainer(selector="afl", clients_per_round=3, rounds=3, feedback_losses="always", **TRAIN).fit(fed)
    assert tr.history_ == always.history_
    assert np.array_equal(tr.selector_.valuations_, always.selector_.valuations_)


def _profiles():
    spp = np.array([0.001, 0.002, 0.003, 0.004, 0.005, 0.006])
    bw = np.array([2600.0, 5200.0, 2600.0, 1300.0, 2600.0, 2600.0])
    return SystemProfiles(spp, bw, bw * 2, np.zeros(6), None)


def test_a_clocked_round_is_shorter_by_exactly_the_loss_evaluation(fed):
    """Each reporter's observed seconds differ by its evaluation term (seconds per sample x its evaluation
    samples) plus the 4-byte scalar up; nothing else moves."""
    p = _profiles()
    fed_p = dataclasses.replace(fed, profiles=p)
    kw = dict(clients_per_round=3, rounds=2, clock=True, **TRAIN)
    without = FederatedTrainer(selector=RecordingDurations(), **kw).fit(fed_p)
    with_ = FederatedTrainer(selector=RecordingWithLosses(), **kw).fit(fed_p)
    ev = np.array([len(ix) for ix in fed.loss_indices])
    for a, b, ra, rb in zip(
        without.selector_.feedbacks_, with_.selector_.feedbacks_, without.history_.rounds, with_.history_.rounds
    ):
        assert a.clients.tolist() == b.clients.tolist() and ra.clients == rb.clients
        k = a.clients
        term = p.seconds_per_sample[k] * ev[k] + 4.0 / p.upload_bandwidth[k]
        np.testing.assert_allclose(b.durations - a.durations, term, rtol=1e-9)
        assert ra.sim_seconds == pytest.approx(a.durations.max(), rel=1e-12)
        assert rb.sim_seconds == pytest.approx(b.durations.max(), rel=1e-12)
        assert ra.sim_seconds < rb.sim_seconds


def test_feedback_losses_is_validated_and_identifies_the_run(fed):
    with pytest.raises(ValueError, match=r"FederatedTrainer: parameter feedback_losses='sometimes' is invalid"):
        FederatedTrainer(feedback_losses="sometimes").fit(fed)
    plain = trainer_identity(FederatedTrainer(rounds=3))
    assert plain["feedback_losses"] == "auto"  # the new charging is part of a checkpoint's identity
    old = trainer_identity(FederatedTrainer(rounds=3, feedback_losses="always"))
    assert "feedback_losses" not in old  # the old charging keeps every stored identity


class ReadsLossesSilently(RandomSelector):
    """Reads feedback.losses without declaring "losses"."""

    def _fit(self, pool):
        super()._fit(pool)
        self.seen_ = 0.0

    def _update(self, feedback):
        self.seen_ += float(np.nansum(np.asarray(feedback.losses, dtype=float)))


class ReadsLossesDeclared(ReadsLossesSilently):
    needs = frozenset({"losses"})


def test_the_conformance_suite_catches_a_selector_reading_undeclared_losses(monkeypatch):
    with pytest.raises(AssertionError, match=r"read RoundFeedback.losses but its needs \[\] lack 'losses'"):
        check_declared_losses(ReadsLossesSilently(random_state=0))
    check_declared_losses(ReadsLossesDeclared(random_state=0))
    check_declared_losses(RandomSelector(random_state=0))
    monkeypatch.setattr(ActiveFLSelector, "needs", frozenset())  # AFL without its declaration is caught
    with pytest.raises(AssertionError, match=r"ActiveFLSelector read RoundFeedback\.losses"):
        check_declared_losses(ActiveFLSelector(random_state=0))


def test_feedback_without_losses_is_valid_and_checked_when_given():
    from fedselect.selection import RoundFeedback

    fb = RoundFeedback(round=0, clients=np.array([1, 2]), weights=np.ones(2), losses=None, n_samples=np.array([3, 4]))
    assert fb.losses is None
    with pytest.raises(ValueError, match=r"RoundFeedback\.losses has 1 entries for 2 clients"):
        RoundFeedback(
            round=0, clients=np.array([1, 2]), weights=np.ones(2), losses=np.ones(1), n_samples=np.array([3, 4])
        )
    assert Selection([0]).clients.tolist() == [0]
