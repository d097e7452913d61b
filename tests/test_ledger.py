"""The one cost ledger: what a round's oracle knows and charges, shared by every runtime."""

from __future__ import annotations

import numpy as np
import pytest

from fedselect import FederatedTrainer, make_federation
from fedselect.ledger import Costs, RoundLedger
from fedselect.selection import BaseSelector, ClientPool, Selection
from fedselect.testing import SyntheticOracle


def test_model_down_once_per_client_per_round():
    led = RoundLedger(5, 0)
    assert led.send_model([0, 1, 1]).tolist() == [0, 1]
    assert led.send_model([1, 2]).tolist() == [2]
    assert led.costs.models_down == 3


def test_losses_known_once_and_reused():
    led = RoundLedger(5, 0)
    assert led.losses_to_ask([3, 1, 3]).tolist() == [3, 1]
    led.record_losses([3, 1], [0.5, 0.25], samples_evaluated=40)
    assert led.losses_to_ask([1, 2, 3]).tolist() == [2]
    led.record_losses([3], [9.0])  # a second answer is neither charged nor kept
    np.testing.assert_array_equal(led.loss([1, 3, 4]), [0.25, 0.5, np.nan])
    assert (led.costs.scalars_up, led.costs.samples_evaluated) == (2, 40)


def test_nan_answer_marks_the_client_failed_for_the_round():
    led = RoundLedger(4, 2, unavailable=[0])
    assert led.failed == {0}
    led.send_model([0, 1])
    assert led.costs.models_down == 2  # sent: the server cannot know 0 will not answer
    led.record_losses([1, 2], [np.nan, 1.0])
    assert led.failed == {0, 1} and led.costs.scalars_up == 1
    assert led.losses_to_ask([0, 1, 2, 3]).tolist() == [3]
    assert led.to_train([0, 1, 2, 3]).tolist() == [2, 3]
    assert led.alive([3, 0, 2, 1]).tolist() == [3, 2]
    assert np.isnan(led.loss([0, 1])).all()


def test_training_and_upload_charged_once():
    led = RoundLedger(6, 0)
    led.record_training([1, 2], ["u1", "u2"], steps=10, sample_gradients=320)
    assert led.to_train([1, 2, 3]).tolist() == [3]
    led.record_training([2], ["again"])  # not charged twice
    assert led.update(2) == "again" and led.trained(1) and not led.trained(3)
    assert led.upload([1, 2]) == 2 and led.upload([2, 3]) == 1
    led.record_floats_up(7)
    led.record_trial(5, samples_evaluated=100)
    c = led.costs
    assert (c.local_trainings, c.local_steps, c.sample_gradients, c.models_up, c.floats_up) == (2, 10, 320, 3, 7)
    assert (c.models_down, c.scalars_up, c.samples_evaluated) == (6, 5, 100)


def test_repeated_ids_within_one_call():
    """Duplicates inside one question: distinct in first-seen order, charged once, first finite loss kept."""
    led = RoundLedger(8, 0, unavailable=[6])
    assert led.send_model([5, 2, 5, 7, 2]).tolist() == [5, 2, 7] and led.costs.models_down == 3
    assert led.losses_to_ask([4, 3, 4, 6, 3]).tolist() == [4, 3]
    led.record_losses([4, 3, 4, 0, 0], [0.5, np.nan, 0.75, np.nan, 2.0])
    np.testing.assert_array_equal(led.loss([4, 3, 0]), [0.5, np.nan, np.nan])  # 0 failed, then answered
    assert led.has_loss(4) and not led.has_loss(0) and led.failed == {0, 3, 6}
    assert led.costs.scalars_up == 2  # 4 once, and 0's late answer (as before the ledger was vectorised)
    led.record_training([1, 1, 2], ["a", "b", "c"])
    assert led.costs.local_trainings == 2 and led.update(1) == "b"  # a repeated id keeps its last update
    assert led.to_train([2, 1, 7, 7, 3]).tolist() == [7]
    assert led.upload([2, 2, 1]) == 2 and led.upload([1]) == 0 and led.uploaded(2) and not led.uploaded(7)
    assert led.answering().tolist() == [1, 2, 4, 5, 7]
    assert repr(led) == "RoundLedger(round=0, holding=3, losses=2, trained=2, uploaded=2, failed=3)"


def test_costs_add_and_communicate():
    a = Costs(models_down=2, scalars_up=3)
    a += Costs(models_up=1, floats_up=4)
    assert a == Costs(models_down=2, models_up=1, scalars_up=3, floats_up=4)
    assert a.floats_communicated(10) == 30 + 3 + 4


# -- the simulator and the synthetic oracle charge alike -----------------------------------------
UNITS = ("models_down", "models_up", "scalars_up", "floats_up", "local_trainings")
N = 12


class Script(BaseSelector):
    """Asks the same questions every runtime must charge alike, then chooses a fixed set."""

    needs = frozenset({"losses"})  # the reporters send their losses (the synthetic world always charges them)

    def __init__(self, *, random_state=None):
        self.random_state = random_state

    def _fit(self, pool: ClientPool) -> None:
        self.answers_ = []

    def _select(self, n, *, round, oracle):
        a = [oracle.losses([0, 1, 2, 3])]
        a.append(oracle.local_updates([3, 4, 5], transform=lambda u: np.array([np.linalg.norm(u)], np.float32)))
        a.append(oracle.local_updates([5, 6]))
        a.append(oracle.losses([1, 6, 7]))
        if round % 2 == 1:
            a.append(oracle.trial([0, 8, 9]))
        self.answers_.append(a)
        return Selection([0, 2, 5, 6, 10])


def _sim_costs(unavailable):
    fed = make_federation("digits", partition="shards", n_clients=N, random_state=0)
    avail = np.ones(N)
    avail[list(unavailable)] = 0.0
    tr = FederatedTrainer(selector=Script(), model="logistic", clients_per_round=5, rounds=4, local_steps=2,
                          random_state=0, availability=avail).fit(fed)
    return [r.costs for r in tr.history_.rounds], tr


def _synthetic_costs(unavailable):
    oracle = SyntheticOracle(N, random_state=0)
    sel = Script().fit(ClientPool(oracle.n_samples))
    out = []
    for t in range(4):
        oracle.ledger.mark_failed(list(unavailable))
        before = Costs(**oracle.costs.to_dict())
        chosen = sel.select(5, round=t, oracle=oracle).validated(N, 5)
        oracle.run_round(chosen)
        out.append(Costs(**{k: v - getattr(before, k) for k, v in oracle.costs.to_dict().items()}))
    return out


@pytest.mark.parametrize("unavailable", [(), (2, 5, 9)])
def test_simulator_and_synthetic_oracle_charge_alike(unavailable):
    sim, tr = _sim_costs(unavailable)
    syn = _synthetic_costs(unavailable)
    for t, (a, b) in enumerate(zip(sim, syn)):
        assert {k: getattr(a, k) for k in UNITS} == {k: getattr(b, k) for k in UNITS}, f"round {t}"
    c = sim[1]
    # round 1, charged by hand: losses(0-3): 4 down, 4 up. Norms of 3,4,5: 2 down, 3 trainings, 3 floats.
    # Updates of 5,6: 1 down, 1 training (5 reused), 2 up. Losses of 1,6,7: 1 down, 2 up (1 known). Trial of
    # 0,8,9: everyone's baseline (4 down, 6 up), 3 trainings, 3 models up, the trial model N down and N up.
    # The round (0,2,5,6,10): 2 trainings (0,5,6 reused), 2 models up (0,5,6 already uploaded).
    if not unavailable:
        assert (c.models_down, c.scalars_up, c.local_trainings, c.models_up, c.floats_up) == (
            8 + 4 + N, 12 + N, 3 + 1 + 3 + 2, 2 + 3 + 2, 3)
    else:
        rec = tr.history_.rounds[1]
        assert rec.failed == [2, 5]
        assert [w == 0 for w in rec.weights] == [k in (2, 5) for k in rec.clients]
        answers = tr.selector_.answers_[1]
        assert np.isnan(answers[0][2]) and np.isnan(answers[1][2]).all() and np.isnan(answers[2][0]).all()
        assert np.isnan(answers[4][[2, 5, 9]]).all() and np.isfinite(np.delete(answers[4], [2, 5, 9])).all()


def test_reporter_weights_rescale_or_as_given():
    from fedselect.ledger import reporter_weights

    w, ok = [0.2, 0.3, 0.5], [True, False, True]
    np.testing.assert_allclose(reporter_weights(w, ok), [0.2 / 0.7, 0.5 / 0.7])  # total 1.0 kept
    np.testing.assert_allclose(reporter_weights(w, ok, mode="as-given"), [0.2, 0.5])
    np.testing.assert_allclose(reporter_weights([2.0, 6.0], [True, True]), [2.0, 6.0])  # nobody failed: untouched
    assert reporter_weights(w, [False] * 3).size == 0
    with pytest.raises(ValueError, match="mode='mean' must be one of"):
        reporter_weights(w, ok, mode="mean")


def test_an_unavailable_client_is_known_to_fail_once_contacted():
    led = RoundLedger(6, 0, unavailable=[1, 4])
    assert led.failed == {1, 4} and led.known_failed == set()
    led.send_model([1, 2])
    assert led.known_failed == {1}  # 4 was never sent anything: a trial model would still go to it
    led.record_trial(0, n_sent=6 - len(led.known_failed))
    assert led.costs.models_down == 2 + 5
    led.contacted([4])
    assert led.known_failed == {1, 4}
