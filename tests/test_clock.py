"""The simulated clock: critical paths by hand, deadlines, over-selection, availability by the clock,
durations and per-sample losses in the feedback, and runs without a clock left exactly as they were."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedselect import FederatedTrainer, make_federation
from fedselect.clock import RoundClock, SimulatedClock
from fedselect.experiments.provenance import trainer_identity
from fedselect.profiles import Availability, SystemProfiles, homogeneous, sample_profiles
from fedselect.selection import BaseSelector, Selection
from fedselect.simulation.engine import Engine, LocalSchedule
from fedselect.simulation.history import History, RoundRecord
from fedselect.simulation.models import FedCorCNN, FedCorMLP

K_STEPS, BATCH = 2, 8  # every client trains 2 x 8 = 16 samples per round
TRAIN = K_STEPS * BATCH


@pytest.fixture(scope="module")
def fed():
    return make_federation("digits", partition="iid", n_clients=6, random_state=0)


def _eval_sizes(fed):
    return np.array([len(ix) for ix in fed.loss_indices])


class Scripted(BaseSelector):
    """Asks the given questions, then chooses ``choose[:n]``; keeps what it was asked and told."""

    def __init__(
        self,
        *,
        ask=(),
        trial=(),
        updates=(),
        choose=(0, 1),
        needs_=("durations",),
        overcommit=None,
        updates_first=False,
        random_state=None,
    ):
        self.ask = ask
        self.trial = trial
        self.updates = updates
        self.choose = choose
        self.needs_ = needs_
        self.overcommit = overcommit
        self.updates_first = updates_first
        self.random_state = random_state

    @property
    def needs(self):  # type: ignore[override]
        return frozenset(self.needs_)

    @property
    def variable_size(self):  # type: ignore[override]
        return self.overcommit is not None

    def _fit(self, pool):
        self.asked_n_, self.answers_, self.feedback_ = [], [], []
        if self.overcommit is not None:
            self.overcommit_ = float(self.overcommit)

    def _select(self, n, *, round, oracle):
        self.asked_n_.append(n)
        if self.updates and self.updates_first:
            oracle.local_updates(list(self.updates), transform=lambda u: u[:10])
        if self.ask:
            self.answers_.append(oracle.losses(list(self.ask)))
        if self.trial:
            oracle.trial(list(self.trial))
        if self.updates and not self.updates_first:
            oracle.local_updates(list(self.updates), transform=lambda u: u[:10])
        m = n if self.overcommit is None else math.floor(n * self.overcommit)
        return Selection(np.array(self.choose[:m]))

    def _update(self, feedback):
        self.feedback_.append(feedback)


def _profiles(n=6, *, availability=None):
    spp = np.array([0.001, 0.002, 0.003, 0.004, 0.005, 0.006])[:n]
    bw = np.array([2600.0, 5200.0, 2600.0, 1300.0, 2600.0, 2600.0])[:n]
    lat = np.array([0.0, 0.0, 0.1, 0.0, 0.0, 0.0])[:n]
    return SystemProfiles(spp, bw, bw * 2, lat, availability)


def _trainer(selector, **kw):
    base = dict(model="logistic", rounds=1, clients_per_round=2, local_steps=K_STEPS, batch_size=BATCH, random_state=0)
    return FederatedTrainer(selector=selector, **{**base, **kw})


def _hand(p, k, D, *, down=0, up=0, scalars=0, floats=0, train=0, ev=0):
    """Client k's seconds for one exchange, written out (SPEC "Time")."""
    mb = 4.0 * D
    return (
        down * mb / p.download_bandwidth[k]
        + p.seconds_per_sample[k] * (3 * train + ev)
        + (up * mb + 4 * (scalars + floats)) / p.upload_bandwidth[k]
        + 2 * p.latency[k]
    )


# ----------------------------------------------------------------------------- critical paths by hand


def test_critical_path_of_a_plain_round(fed):
    """No questions: each chosen client downloads, trains, evaluates its loss (the selector needs it) and uploads;
    the slowest ends it."""
    import dataclasses

    p = _profiles()
    ev = _eval_sizes(fed)
    sel = Scripted(choose=(1, 3), needs_=("durations", "losses"))
    tr = _trainer(sel, rounds=2).fit(dataclasses.replace(fed, profiles=p))
    D = tr.history_.model_size
    full = max(_hand(p, k, D, down=1, train=TRAIN, ev=ev[k], scalars=1, up=1) for k in (1, 3))
    assert [r.sim_seconds for r in tr.history_.rounds] == pytest.approx([full, full], rel=1e-12)
    assert tr.history_.rounds[1].sim_time == pytest.approx(2 * full, rel=1e-12)


def test_critical_path_of_a_loss_question_then_training(fed):
    """Asking 3 clients' losses is one exchange (slowest answer), then the 2 chosen train and upload."""
    p = _profiles()
    ev = _eval_sizes(fed)
    import dataclasses

    fed_p = dataclasses.replace(fed, profiles=p)
    tr = _trainer(Scripted(ask=(0, 1, 2), choose=(2, 0))).fit(fed_p)
    D = tr.history_.model_size
    q = {k: _hand(p, k, D, down=1, ev=ev[k], scalars=1) for k in (0, 1, 2)}
    t = {k: _hand(p, k, D, train=TRAIN, up=1) for k in (0, 2)}  # loss known: not sent again
    rec = tr.history_.rounds[0]
    assert rec.sim_seconds == pytest.approx(max(q.values()) + max(t.values()), rel=1e-12)
    assert rec.sim_time == pytest.approx(rec.sim_seconds, rel=1e-12)
    fb = tr.selector_.feedback_[0]
    assert dict(zip(fb.clients.tolist(), fb.durations.tolist())) == pytest.approx({k: q[k] + t[k] for k in (0, 2)})


def test_critical_path_of_a_trial(fed):
    """A trial: everyone's loss, the trial client trains and uploads, the trial model to all and a loss back."""
    import dataclasses

    p = _profiles()
    ev = _eval_sizes(fed)
    tr = _trainer(Scripted(trial=(1,), choose=(1, 3))).fit(dataclasses.replace(fed, profiles=p))
    D = tr.history_.model_size
    a = max(_hand(p, k, D, down=1, ev=ev[k], scalars=1) for k in range(6))
    b = _hand(p, 1, D, train=TRAIN, up=1)
    c = max(_hand(p, k, D, down=1, ev=ev[k], scalars=1) for k in range(6))
    d = max(0.0, _hand(p, 3, D, train=TRAIN, up=1))  # client 1 has trained, uploaded and sent its loss
    assert tr.history_.rounds[0].sim_seconds == pytest.approx(a + b + c + d, rel=1e-12)


def test_critical_path_of_compressed_local_updates(fed):
    """local_updates with a transform: model down, training, 10 floats up; the round then uploads the full update."""
    import dataclasses

    p = _profiles()
    ev = _eval_sizes(fed)
    sel = Scripted(updates=(4, 5), choose=(4, 5), needs_=("durations", "losses"))
    tr = _trainer(sel).fit(dataclasses.replace(fed, profiles=p))
    D = tr.history_.model_size
    u = max(_hand(p, k, D, down=1, train=TRAIN, floats=10) for k in (4, 5))
    r = max(_hand(p, k, D, up=1, ev=ev[k], scalars=1) for k in (4, 5))
    assert tr.history_.rounds[0].sim_seconds == pytest.approx(u + r, rel=1e-12)
    assert tr.history_.rounds[0].costs.floats_up == 20


def test_critical_path_when_questions_overlap(fed):
    """A client already trained by a question is asked its loss (no model down) and then only uploads."""
    import dataclasses

    p = _profiles()
    ev = _eval_sizes(fed)
    tr = _trainer(Scripted(updates=(4,), ask=(4, 5), choose=(4, 5), updates_first=True))
    tr.fit(dataclasses.replace(fed, profiles=p))
    D = tr.history_.model_size
    u = _hand(p, 4, D, down=1, train=TRAIN, floats=10)
    q = max(_hand(p, 4, D, ev=ev[4], scalars=1), _hand(p, 5, D, down=1, ev=ev[5], scalars=1))
    r = max(_hand(p, 4, D, up=1), _hand(p, 5, D, train=TRAIN, up=1))
    assert tr.history_.rounds[0].sim_seconds == pytest.approx(u + q + r, rel=1e-12)
    fb = tr.selector_.feedback_[0]
    want = {
        4: u + _hand(p, 4, D, ev=ev[4], scalars=1) + _hand(p, 4, D, up=1),
        5: _hand(p, 5, D, down=1, ev=ev[5], scalars=1) + _hand(p, 5, D, train=TRAIN, up=1),
    }
    assert dict(zip(fb.clients.tolist(), fb.durations.tolist())) == pytest.approx(want)


def test_query_timeout_makes_late_answers_failures(fed):
    import dataclasses

    p = _profiles()
    ev = _eval_sizes(fed)
    D = 650
    on_time = max(_hand(p, k, D, down=1, ev=ev[k], scalars=1) for k in (0, 1))
    slow = _hand(p, 3, D, down=1, ev=ev[3], scalars=1)
    timeout = (on_time + slow) / 2
    tr = _trainer(Scripted(ask=(0, 1, 3), choose=(0, 3)), query_timeout=timeout)
    tr.fit(dataclasses.replace(fed, profiles=p))
    assert tr.history_.model_size == D
    answers = tr.selector_.answers_[0]
    assert np.isfinite(answers[:2]).all() and np.isnan(answers[2])  # client 3 answered after the timeout
    rec = tr.history_.rounds[0]
    assert rec.failed == [3]  # failed for the rest of the round
    assert rec.costs.scalars_up == 2 and rec.costs.models_down == 3  # charged as sent, its answer not
    assert rec.sim_seconds == pytest.approx(timeout + _hand(p, 0, D, train=TRAIN, up=1), rel=1e-12)


# ----------------------------------------------------------------------------- deadlines


def test_deadline_fail_drops_stragglers_as_failures(fed):
    import dataclasses

    p = _profiles()
    ev = _eval_sizes(fed)
    D = 650
    full = {k: _hand(p, k, D, down=1, train=TRAIN, ev=ev[k], up=1, scalars=1) for k in range(6)}
    assert full[3] > full[0] and full[3] > full[1]
    deadline = (max(full[0], full[1]) + full[3]) / 2
    tr = _trainer(Scripted(choose=(0, 1, 3)), clients_per_round=3, deadline=deadline)
    tr.fit(dataclasses.replace(fed, profiles=p))
    rec = tr.history_.rounds[0]
    assert rec.clients == [0, 1, 3] and rec.failed == [3]
    assert rec.weights[2] == 0.0 and sum(rec.weights) == pytest.approx(1.0)
    # charged as a dropped client: the model went down, it did not train, upload or answer
    assert (rec.costs.models_down, rec.costs.local_trainings, rec.costs.models_up) == (3, 2, 2)
    assert rec.sim_seconds == pytest.approx(deadline)  # the server waited for the straggler until the deadline
    fb = tr.selector_.feedback_[0]
    assert fb.clients.tolist() == [0, 1]
    # what the server saw of the straggler: no reply by the deadline, a lower bound on its duration
    assert fb.timed_out.tolist() == [3] and fb.timed_out_after.tolist() == [pytest.approx(deadline, rel=1e-12)]
    no_deadline = _trainer(Scripted(choose=(0, 1, 3)), clients_per_round=3)
    no_deadline.fit(dataclasses.replace(fed, profiles=p))
    fb = no_deadline.selector_.feedback_[0]
    assert fb.clients.tolist() == [0, 1, 3] and fb.timed_out.tolist() == [] and fb.timed_out_after.size == 0
    blind = _trainer(Scripted(choose=(0, 1, 3), needs_=()), clients_per_round=3, deadline=deadline)
    blind.fit(dataclasses.replace(fed, profiles=p))
    assert blind.selector_.feedback_[0].timed_out is None  # only for a selector that needs durations


def test_overselect_keeps_the_first_k_to_finish(fed):
    import dataclasses

    p = _profiles()
    ev = _eval_sizes(fed)
    D = 650
    sel = Scripted(choose=(5, 3, 0, 1), needs_=("durations", "losses"))
    tr = _trainer(sel, clients_per_round=2, straggler_policy="overselect", overselect=1.5)
    tr.fit(dataclasses.replace(fed, profiles=p))
    assert tr.selector_.asked_n_ == [3]  # ceil(2 x 1.5)
    full = {k: _hand(p, k, D, down=1, train=TRAIN, ev=ev[k], up=1, scalars=1) for k in (5, 3, 0)}
    first = sorted(full, key=full.get)[:2]
    rec = tr.history_.rounds[0]
    assert sorted(set(rec.clients) - set(rec.failed)) == sorted(first)
    assert rec.sim_seconds == pytest.approx(sorted(full.values())[1], rel=1e-12)  # ends at the 2nd completion
    assert rec.costs.local_trainings == 3 and rec.costs.models_up == 2  # all trained, 2 were waited for
    fb = tr.selector_.feedback_[0]
    (cut,) = set(full) - set(first)
    assert fb.timed_out.tolist() == [cut]  # the server stopped waiting at the 2nd completion
    assert fb.timed_out_after.tolist() == [pytest.approx(sorted(full.values())[1], rel=1e-12)]
    assert fb.timed_out_after[0] < full[cut]  # a lower bound: the client was still busy
    n = fed.n_samples
    w = dict(zip(rec.clients, rec.weights))
    assert [w[k] for k in first] == pytest.approx([n[k] / n[first].sum() for k in first])  # FedAvg over the kept


def test_a_selector_that_overcommits_has_its_first_k_kept(fed):
    """Oort's over-commitment: a fitted overcommit_ > 1 and a larger selection; the clock keeps K."""
    import dataclasses

    p = _profiles()
    ev = _eval_sizes(fed)
    full = {k: _hand(p, k, 650, down=1, train=TRAIN, ev=ev[k], up=1, scalars=1) for k in (5, 3, 0)}
    tr = _trainer(Scripted(choose=(5, 3, 0, 1), overcommit=1.5), clients_per_round=2)
    tr.fit(dataclasses.replace(fed, profiles=p))
    rec = tr.history_.rounds[0]
    assert tr.selector_.asked_n_ == [2]
    assert rec.clients == [0, 3, 5] and rec.failed == [max(full, key=full.get)]  # the slowest is cut
    no_clock = _trainer(Scripted(choose=(5, 3, 0, 1), overcommit=1.5), clients_per_round=2).fit(fed)
    assert no_clock.history_.rounds[0].failed == []  # without a clock all of them report, as before


# ----------------------------------------------------------------------------- availability by the clock


def test_unit_availability_edges_and_waiting():
    av = Availability.from_intervals([[(0.0, 3.0)], [(0.0, 3.0 + 2**-20)], [(5.0, 10.0)], [(0.0, 100.0)]])
    p = SystemProfiles([0.25] * 4, [1.0] * 4, [1.0] * 4, None, av)
    clock = SimulatedClock(p, model_size=10)
    rc = clock.start_round()
    assert rc.start == 0.0 and rc.offline.tolist() == [2]  # [5, 10): offline at 0
    s = rc.settle([0, 1, 3], train_samples=4)  # 3 x 4 x 0.25 = 3.0 s each, exactly
    assert s.drop.tolist() == [0]  # offline at 3.0: intervals are half-open
    assert rc.elapsed == 3.0
    clock.end_round(rc)
    clock.now = 5.0
    assert clock.start_round().offline.tolist() == [0, 1]  # client 2 online at the start of [5, 10)
    clock.now = 10.0
    assert clock.start_round().offline.tolist() == [0, 1, 2]


def test_unit_who_the_server_stops_waiting_for():
    """settle's timed_out: stragglers past the deadline and, with a deadline, silent failures (waited for until
    it), each with its earlier seconds this round plus the exchange's length; a visible drop is not timed out."""
    p = SystemProfiles([1.0, 2.0, 3.0, 0.5], [1e12] * 4, [1e12] * 4)  # 3 s per trained sample: 3, 6, 9, 1.5 s
    clock = SimulatedClock(p, model_size=1, deadline=7.0)
    rc = clock.start_round()
    rc.exchange([2], eval_samples=1)  # a question answered by client 2: 3 s of its time this round
    s = rc.settle([0, 1, 2, 3], failed=[False, False, False, True], train_samples=1)
    assert s.drop.tolist() == [2] and s.timed_out.tolist() == [2, 3]  # 9 s > 7 s; 3 failed silently
    assert s.timed_out_after.tolist() == [3.0 + 7.0, 7.0]
    clock = SimulatedClock(p, model_size=1)  # no deadline: a silent failure is learned of at once
    s = clock.start_round().settle([0, 1, 3], failed=[False, False, True], train_samples=1)
    assert s.timed_out.tolist() == [] and s.timed_out_after.tolist() == []
    s = clock.start_round().settle([0, 1, 2, 3], train_samples=1, keep=2)  # first two to finish: 3 (1.5 s), 0 (3 s)
    assert sorted(s.cut.tolist()) == [1, 2] and sorted(s.timed_out.tolist()) == [1, 2]
    assert s.timed_out_after.tolist() == [3.0, 3.0]
    av = Availability.from_intervals([[(0.0, 100.0)], [(0.0, 2.0)]])
    clock = SimulatedClock(SystemProfiles([1.0, 1.0], [1e12] * 2, [1e12] * 2, None, av), model_size=1, deadline=50.0)
    s = clock.start_round().settle([0, 1], train_samples=1)
    assert s.drop.tolist() == [1] and s.timed_out.tolist() == []  # offline when its update was due: seen to drop
    # offline before its update was due but after the server stopped waiting (the deadline; the keep-th completion)
    av = Availability.from_intervals([[(0.0, 100.0)], [(0.0, 8.0)], [(0.0, 100.0)]])
    p3 = SystemProfiles([1.0, 3.0, 1.0], [1e12] * 3, [1e12] * 3, None, av)  # due at 3, 9, 3 s
    s = SimulatedClock(p3, model_size=1, deadline=7.0).start_round().settle([0, 1], train_samples=1)
    assert s.drop.tolist() == [1] and s.timed_out.tolist() == [1] and s.timed_out_after.tolist() == [7.0]
    s = SimulatedClock(p3, model_size=1).start_round().settle([0, 1, 2], train_samples=1, keep=2)
    assert s.drop.tolist() == [1] and s.timed_out.tolist() == [1] and s.timed_out_after.tolist() == [3.0]


def test_unit_nobody_online_waits_for_the_first():
    av = Availability.from_intervals([[(50.0, 60.0)], [(70.0, 80.0)]])
    clock = SimulatedClock(SystemProfiles([0.1, 0.1], [1.0, 1.0], [1.0, 1.0], None, av), model_size=1)
    rc = clock.start_round()
    assert rc.start == 50.0 and rc.offline.tolist() == [1]


def test_online_tracker_equals_a_direct_lookup():
    p = sample_profiles(300, random_state=3, mean_online=200.0, mean_offline=300.0, horizon=2000.0)
    clock = SimulatedClock(p, model_size=10)
    rng = np.random.default_rng(0)
    for t in np.cumsum(rng.exponential(40.0, size=80)):  # past one period too
        clock.now = float(t)
        expect = np.flatnonzero(~p.available(np.arange(300), t))
        np.testing.assert_array_equal(clock.start_round().offline, expect)


def test_availability_by_the_clock_in_a_run(fed):
    """Blind selection (``choose_among="all"``): offline at the round's start: failed; online at the start but gone
    before the update arrives: failed."""
    import dataclasses

    av = Availability.from_intervals([[(0, 1e6)], [(0, 0.5)], [(10, 1e6)], [(0, 1e6)], [(0, 1e6)], [(0, 1e6)]])
    p = _profiles(availability=av)
    tr = _trainer(Scripted(choose=(0, 1, 2)), clients_per_round=3, choose_among="all")
    tr.fit(dataclasses.replace(fed, profiles=p))
    rec = tr.history_.rounds[0]
    assert rec.failed == [1, 2]
    assert rec.costs.local_trainings == 1
    assert rec.costs.models_down == 3  # each was sent the model, as the server does not know


def test_without_intervals_the_per_round_draw_decides(fed):
    """Profiles without availability: the trainer's dropout draw alone decides who fails, as without a clock."""
    import dataclasses

    kw = dict(rounds=3, clients_per_round=3, client_dropout=0.4)
    a = _trainer("random", **kw).fit(fed).history_
    b = _trainer("random", **kw).fit(dataclasses.replace(fed, profiles=_profiles())).history_
    assert [r.failed for r in a.rounds] == [r.failed for r in b.rounds]
    assert any(r.failed for r in a.rounds)


# ----------------------------------------------------------------------------- history


def test_time_to_accuracy():
    h = History(
        [
            RoundRecord(0, [0], test_accuracy=0.5, sim_seconds=2.0, sim_time=2.0),
            RoundRecord(1, [0], test_accuracy=0.8, sim_seconds=3.0, sim_time=5.5),
            RoundRecord(2, [0], test_accuracy=0.9, sim_seconds=1.0, sim_time=6.5),
        ]
    )
    assert h.time_to_accuracy(0.8) == 5.5 and h.rounds_to_accuracy(0.8) == 2
    assert h.time_to_accuracy(0.95) is None
    assert History([RoundRecord(0, [0], test_accuracy=0.9)]).time_to_accuracy(0.5) is None  # no clock
    back = History.from_json(h.to_json())
    assert back == h and back.rounds[1].sim_time == 5.5


def test_default_runs_are_unchanged(fed, tmp_path):
    """No profiles: the default clock (homogeneous devices) adds only the time fields: the same selections and
    bits as clock=False, the same key; clock=True on homogeneous devices keeps the same time."""
    import dataclasses

    kw = dict(rounds=3, clients_per_round=3)
    for sel in ("random", "power-of-choice", "hcsfed"):
        plain = _trainer(sel, **kw).fit(fed).history_
        off = _trainer(sel, clock=False, **kw).fit(dataclasses.replace(fed, profiles=_profiles())).history_
        on = _trainer(sel, clock=True, **kw).fit(fed).history_
        assert all("sim_time" not in r.to_dict() and "sim_seconds" not in r.to_dict() for r in off.rounds)
        stripped = [dataclasses.replace(r, sim_seconds=None, sim_time=None) for r in plain.rounds]
        assert stripped == off.rounds
        assert plain == on
        assert all(r.sim_seconds > 0 for r in plain.rounds)
        times = [r.sim_time for r in plain.rounds]
        assert times == pytest.approx(np.cumsum([r.sim_seconds for r in plain.rounds]).tolist())
    assert set(trainer_identity(_trainer("random"))) == set(
        trainer_identity(
            FederatedTrainer(
                selector="random",
                model="logistic",
                rounds=1,
                clients_per_round=2,
                local_steps=K_STEPS,
                batch_size=BATCH,
                random_state=0,
                clock=None,
                deadline=None,
                query_timeout=None,
                straggler_policy="fail",
                overselect=1.3,
                server_knows_profiles=False,
            )
        )
    )
    assert not {"clock", "deadline", "overselect"} & set(trainer_identity(_trainer("random")))
    off_csv, plain_csv = tmp_path / "a.csv", tmp_path / "b.csv"
    off.to_csv(off_csv)
    plain.to_csv(plain_csv)
    assert "sim_time" not in off_csv.read_text() and "sim_time" in plain_csv.read_text()


def test_determinism_with_heterogeneous_devices_and_availability(fed):
    import dataclasses

    p = sample_profiles(6, random_state=1, mean_online=30.0, mean_offline=20.0, horizon=500.0)
    f = dataclasses.replace(fed, profiles=p)
    kw = dict(rounds=6, clients_per_round=2, deadline=20.0)
    a = _trainer("power-of-choice", **kw).fit(f).history_
    b = _trainer("power-of-choice", **kw).fit(f).history_
    assert a == b and [r.sim_time for r in a.rounds] == [r.sim_time for r in b.rounds]
    assert all(r.sim_time is not None for r in a.rounds)
    assert sorted(r.sim_time for r in a.rounds) == [r.sim_time for r in a.rounds]


def test_resumed_run_continues_the_clock(fed, tmp_path):
    import dataclasses

    f = dataclasses.replace(
        fed, profiles=sample_profiles(6, random_state=2, mean_online=40.0, mean_offline=10.0, horizon=400.0)
    )
    kw = dict(rounds=5, clients_per_round=2, deadline=30.0)
    whole = _trainer("random", **kw).fit(f).history_

    def stop(trainer, record):
        if record.round == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _trainer("random", checkpoint_dir=tmp_path, checkpoint_every=1, callback=stop, **kw).fit(f)
    resumed = _trainer("random", checkpoint_dir=tmp_path, checkpoint_every=1, **kw).fit(f)
    assert resumed.resumed_from_ > 0
    assert resumed.history_ == whole


# ----------------------------------------------------------------------------- what the server knows


def test_profiles_reach_a_selector_only_when_the_server_knows_them(fed):
    import dataclasses

    p = _profiles()
    f = dataclasses.replace(fed, profiles=p)
    assert _trainer("oort").fit(f).selector_.profiles is None
    knows = _trainer("oort", server_knows_profiles=True).fit(f)
    assert knows.selector_.profiles is p
    assert _trainer("random", server_knows_profiles=True).fit(f).selector_ is not None  # takes no profiles


def test_sample_loss_sq_in_feedback_without_changing_the_run(fed):
    plain = _trainer(Scripted(needs_=()), rounds=2).fit(fed)
    sq = _trainer(Scripted(needs_=("sample_losses",)), rounds=2).fit(fed)
    strip = [(r.clients, r.weights, r.test_accuracy, r.test_loss) for r in plain.history_.rounds]
    assert strip == [(r.clients, r.weights, r.test_accuracy, r.test_loss) for r in sq.history_.rounds]
    for a, b in zip(plain.history_.rounds, sq.history_.rounds):  # one scalar up per reporter, nothing else
        assert b.costs.scalars_up == a.costs.scalars_up + 2
        assert dataclasses_replace_costs(b.costs) == dataclasses_replace_costs(a.costs)
    fb = sq.selector_.feedback_[0]
    assert fb.sample_loss_sq.shape == (2,) and (fb.sample_loss_sq > 0).all()
    assert plain.selector_.feedback_[0].sample_loss_sq is None
    assert fb.durations is None  # no clock: nothing observed


def dataclasses_replace_costs(c):
    d = c.to_dict()
    d.pop("scalars_up")
    return d


def _reference_sample_loss_sq(model, theta, batches, X, y, lr):
    """Plain per-client SGD, accumulating each step's per-sample losses squared."""
    out = []
    for bs in batches:
        torch.nn.utils.vector_to_parameters(theta.clone(), model.parameters())
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        total, count = 0.0, 0
        for ix in bs:
            opt.zero_grad()
            losses = F.cross_entropy(model(torch.from_numpy(X[ix])), torch.from_numpy(y[ix]), reduction="none")
            total += float((losses.detach().double() ** 2).sum())
            count += len(ix)
            losses.mean().backward()
            opt.step()
        out.append(total / count)
    return np.array(out)


class _NotAChain(torch.nn.Module):
    """A model the engine trains on its generic vmapped path (not a Linear/ReLU chain)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 16)
        self.b = torch.nn.Linear(16, 10)

    def forward(self, x):
        h = x.flatten(1)
        return self.b(torch.tanh(self.a(h)))


def _own_cross_entropy(outputs, targets):
    return F.cross_entropy(outputs, targets, reduction="none")


@pytest.mark.parametrize(
    ("make", "path", "loss"),
    [
        (lambda: FedCorMLP((1, 8, 8), 10), "chain", "cross-entropy"),  # the chain's backward by hand
        (lambda: FedCorMLP((1, 8, 8), 10), "chain", _own_cross_entropy),  # the chain through autograd
        (_NotAChain, "padded", "cross-entropy"),
        (
            lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10), torch.nn.BatchNorm1d(10)),
            "grouped",
            "cross-entropy",
        ),
    ],
)
def test_engine_sample_loss_sq_equals_a_hand_computation(make, path, loss):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, size=300)
    parts = np.split(rng.permutation(300), [40, 130, 170])
    torch.manual_seed(0)
    model = make()
    eng = Engine(model, X, y, parts, X[:30], y[:30], loss=loss)
    assert path == ("grouped" if eng.stateful else "chain" if eng._plan is not None else "padded")
    theta = eng.initial_parameters()
    sched = LocalSchedule(16, epochs=2)
    batches = eng.client_batches(parts, sched, seed=1, round=0, clients=[0, 1, 2, 3])
    deltas, sq = eng.train(theta, batches, lr=0.1, sample_losses=True, dropout_seed=0)
    plain = eng.train(theta, batches, lr=0.1, dropout_seed=0)
    assert torch.equal(deltas, plain)  # the training itself is unchanged, bit for bit
    ref_model = make()
    ref_model.load_state_dict(model.state_dict())
    ref = _reference_sample_loss_sq(ref_model, theta, batches, X, y, 0.1)
    np.testing.assert_allclose(sq, ref, rtol=1e-5)


def test_engine_sample_loss_sq_of_a_cnn_by_hand():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(120, 1, 20, 20)).astype(np.float32)
    y = rng.integers(0, 10, size=120)
    parts = np.split(rng.permutation(120), [50, 70])
    torch.manual_seed(0)
    eng = Engine(FedCorCNN((1, 20, 20), 10), X, y, parts, X[:10], y[:10])
    theta = eng.initial_parameters()
    batches = eng.client_batches(parts, LocalSchedule(20, epochs=1), seed=0, round=0, clients=[0, 1, 2])
    _, sq = eng.train(theta, batches, lr=0.05, sample_losses=True)
    ref = _reference_sample_loss_sq(FedCorCNN((1, 20, 20), 10), theta, batches, X, y, 0.05)
    np.testing.assert_allclose(sq, ref, rtol=1e-4)


def test_sample_losses_with_batched_seeds(fed):
    """A run whose selector needs per-sample losses still runs under fit_runs (its training is done alone)."""
    from fedselect.simulation.batched import fit_runs

    trainers = [_trainer(Scripted(needs_=("sample_losses",)), rounds=2, random_state=s) for s in (0, 1)]
    assert fit_runs(trainers, [fed, fed]) == [None, None]
    alone = _trainer(Scripted(needs_=("sample_losses",)), rounds=2, random_state=1).fit(fed)
    np.testing.assert_allclose(
        trainers[1].selector_.feedback_[1].sample_loss_sq, alone.selector_.feedback_[1].sample_loss_sq, rtol=1e-5
    )


# ----------------------------------------------------------------------------- parameters


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"deadline": 5.0, "clock": False}, "deadline=5.0 needs a clock"),
        ({"query_timeout": 1.0, "clock": False}, "query_timeout=1.0 needs a clock"),
        ({"straggler_policy": "overselect", "clock": False}, "straggler_policy='overselect' needs a clock"),
        ({"server_knows_profiles": True, "clock": False}, "server_knows_profiles=True needs a clock"),
        ({"deadline": 5.0, "clock": False}, "clock=False"),
    ],
)
def test_clock_options_need_a_clock(fed, params, match):
    with pytest.raises(ValueError, match=match):
        _trainer("random", **params).fit(fed)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("deadline", 0.0),
        ("deadline", float("inf")),
        ("query_timeout", -1),
        ("straggler_policy", "wait"),
        ("overselect", 0.9),
        ("clock", "yes"),
    ],
)
def test_bad_clock_parameters_are_refused_before_training(fed, name, value):
    with pytest.raises((ValueError, TypeError), match=f"parameter {name}="):
        _trainer("random", **{"clock": True, name: value}).fit(fed)


def test_round_clock_unit_exchange():
    p = homogeneous(3, seconds_per_sample=0.5, bandwidth=100.0, latency=0.25)
    clock = SimulatedClock(p, model_size=25, query_timeout=4.0)  # a model is 100 bytes: 1 s each way
    rc = clock.start_round()
    assert isinstance(rc, RoundClock)
    late = rc.exchange([0, 1, 2], models_down=[1, 1, 0], eval_samples=[2, 8, 0], scalars_up=[0, 0, 0])
    # 1 + 1 + 0.5 = 2.5 s; 1 + 4 + 0.5 = 5.5 s (late); client 2 was sent nothing
    assert late.tolist() == [False, True, False] and rc.elapsed == 4.0
    assert rc.spent.tolist() == [2.5, 0.0, 0.0]
    rc.exchange([0, 2], failed=[False, True], models_down=1)  # client 2 never answers: waited for until timeout
    assert rc.elapsed == 8.0


def test_exchange_times_are_the_profiles_round_time():
    """The clock's inlined formula is SystemProfiles.round_time (FedScale's), latency or not."""
    for latency in (0.0, 0.05):
        p = sample_profiles(50, random_state=4, latency=latency)
        rc = SimulatedClock(p, model_size=1000).start_round()
        ids = np.arange(0, 50, 3)
        rng = np.random.default_rng(0)
        down, up, sc, fl = (rng.integers(0, 2, ids.size) for _ in range(4))
        tr, ev = rng.integers(0, 100, ids.size), rng.integers(0, 50, ids.size)
        got = rc.times(
            ids, models_down=down, models_up=up, scalars_up=sc, floats_up=fl, train_samples=tr, eval_samples=ev
        )
        want = p.round_time(ids, 4000.0 * down, 4000.0 * up + 4 * (sc + fl), 3 * tr + ev, compute_factor=1.0)
        sent = (down + up + sc + fl + tr + ev) > 0
        np.testing.assert_allclose(got, np.where(sent, want, 0.0), rtol=1e-14)
