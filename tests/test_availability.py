"""Availability as a server knows it, the default clock, and runs that train nobody (issue 33, items 2, 4, 5)."""

from __future__ import annotations

import dataclasses
import pickle
import warnings

import numpy as np
import pytest

from fedselect import FederatedTrainer, Selection, make_federation
from fedselect.profiles import Availability, SystemProfiles, convert_fedscale_traces, from_fedscale, homogeneous
from fedselect.selection import BaseSelector, SelectionError
from fedselect.simulation.trainer import TrainedNobodyWarning

N = 20


@pytest.fixture(scope="module")
def fed():
    return make_federation("digits", partition="shards", n_clients=N, random_state=0)


def _staggered(n=N, on=300.0, period=2000.0):
    """Client k online ``on`` seconds in every ``period``, from k * period / n: about 3 of 20 online at a time."""
    intervals = []
    for k in range(n):
        a = k * period / n
        b = a + on
        intervals.append(sorted([(a, min(b, period))] + ([(0.0, b - period)] if b > period else [])))
    return Availability.from_intervals(intervals, period=np.full(n, period))


def _with(fed, availability):
    h = homogeneous(fed.n_clients)
    p = SystemProfiles(h.seconds_per_sample, h.download_bandwidth, h.upload_bandwidth, availability=availability)
    return dataclasses.replace(fed, profiles=p)


def _trainer(selector="random", **kw):
    base = dict(model="logistic", rounds=6, clients_per_round=5, local_steps=2, batch_size=16, random_state=0)
    return FederatedTrainer(selector=selector, **{**base, **kw})


def _online_at_start(history, av):
    """Per round: whether each chosen client was online at the round's start (sim_time - sim_seconds)."""
    out = []
    for r in history.rounds:
        start = r.sim_time - r.sim_seconds
        out.append(av.available(np.asarray(r.clients), np.full(len(r.clients), start)))
    return out


@pytest.mark.parametrize("selector", ["random", "data-size", "power-of-choice", "round-robin", "afl", "clustered"])
def test_no_chosen_client_is_offline_at_the_round_start(fed, selector):
    """The issue's probe: staggered availability; by default every pick is online, so none fails."""
    av = _staggered()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        h = _trainer(selector).fit(_with(fed, av)).history_
    for r, online in zip(h.rounds, _online_at_start(h, av)):
        assert online.all(), (r.round, r.clients)
        assert r.failed == []
        assert 1 <= len(r.clients) <= 5
    assert h.rounds_trained_nobody() == 0


def test_fewer_online_than_asked_chooses_all_online(fed):
    av = Availability.from_intervals([[(0.0, 1e9)] if k < 3 else [] for k in range(N)])
    h = _trainer("random", rounds=2).fit(_with(fed, av)).history_
    assert [r.clients for r in h.rounds] == [[0, 1, 2], [0, 1, 2]]


def test_blind_selection_is_kept_for_studies(fed):
    """choose_among="all": offline picks fail at once, as before; the rounds that train nobody are counted and
    last until the chosen clients' updates were due, never 0 s; one warning with the count."""
    av = _staggered()
    with pytest.warns(TrainedNobodyWarning, match=r"(\d+) of 24 rounds trained nobody") as rec:
        h = _trainer("random", rounds=24, choose_among="all").fit(_with(fed, av)).history_
    assert len([w for w in rec if issubclass(w.category, TrainedNobodyWarning)]) == 1
    nobody = [r for r in h.rounds if len(r.failed) == len(r.clients)]
    assert len(nobody) == h.rounds_trained_nobody() > 0
    assert f"{len(nobody)} of 24" in str(rec[0].message)
    assert all(r.sim_seconds > 0 for r in h.rounds)
    assert sum(len(r.failed) for r in h.rounds) > 60  # most blind picks are offline


def test_a_round_that_trains_nobody_lasts_the_deadline(fed):
    av = _staggered()
    with pytest.warns(TrainedNobodyWarning):
        h = _trainer("random", rounds=24, choose_among="all", deadline=7.5).fit(_with(fed, av)).history_
    nobody = [r for r in h.rounds if len(r.failed) == len(r.clients)]
    assert nobody and all(r.sim_seconds == 7.5 for r in nobody)


def test_a_run_that_trains_nobody_at_all_warns_loudly(fed):
    with pytest.warns(TrainedNobodyWarning, match="trained nobody at all") as rec:
        h = _trainer("random", rounds=3, deadline=1e-6).fit(fed).history_
    assert "deadline=1e-06" in str(rec[0].message)
    assert h.rounds_trained_nobody() == 3 and all(r.sim_seconds == 1e-6 for r in h.rounds)


def test_runs_that_train_every_round_do_not_warn(fed):
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainedNobodyWarning)
        _trainer("random", rounds=2).fit(fed)


def test_a_default_run_keeps_a_clock(fed):
    """Item 4: time_to_accuracy answers on a default run (homogeneous devices)."""
    h = FederatedTrainer(rounds=5, random_state=0).fit(fed).history_
    assert all(r.sim_seconds > 0 for r in h.rounds)
    best = h.best_accuracy()
    assert h.time_to_accuracy(best) == pytest.approx(h.rounds[h.rounds_to_accuracy(best) - 1].sim_time)


def test_the_default_clock_leaves_observing_selectors_unchanged(fed):
    """Oort observes durations only under a clock it was given: a default run chooses as clock=False does."""
    kw = dict(rounds=4, clients_per_round=3)
    a = _trainer("oort", **kw).fit(fed).history_
    b = _trainer("oort", clock=False, **kw).fit(fed).history_
    assert [r.clients for r in a.rounds] == [r.clients for r in b.rounds]
    assert [r.failed for r in a.rounds] == [r.failed for r in b.rounds]


class _Durations(BaseSelector):
    needs = frozenset({"durations"})

    def __init__(self, *, random_state=None):
        self.random_state = random_state

    def _fit(self, pool):
        self.seen_ = []

    def _select(self, n, *, round, oracle):
        return Selection(np.arange(n))

    def _update(self, feedback):
        self.seen_.append(feedback.durations)


def test_the_default_clock_is_not_observed(fed):
    """The default clock records time only: a selector that needs durations sees none, as before; clock=True or
    profiles give them."""
    default = _trainer(_Durations(), rounds=2).fit(fed).selector_
    assert default.seen_ == [None, None]
    given = _trainer(_Durations(), rounds=2, clock=True).fit(fed).selector_
    assert all(d is not None and d.size == 5 for d in given.seen_)


def test_overselect_without_its_policy_is_an_error(fed):
    with pytest.raises(ValueError, match=r"FederatedTrainer.*overselect=1\.5.*straggler_policy='overselect'"):
        _trainer("random", overselect=1.5).fit(fed)
    _trainer("random", overselect=1.5, straggler_policy="overselect", rounds=1).fit(fed)  # with it: fine


def test_choose_among_is_validated(fed):
    with pytest.raises(ValueError, match="choose_among"):
        _trainer("random", choose_among="blind").fit(fed)


class _ChoosesOffline(BaseSelector):
    chooses_available = True

    def __init__(self, *, random_state=None):
        self.random_state = random_state

    def _fit(self, pool):
        pass

    def _select(self, n, *, round, oracle):
        return Selection(np.arange(n))


def test_a_selector_that_claims_availability_and_chooses_offline_is_refused(fed):
    av = Availability.from_intervals([[] if k < 2 else [(0.0, 1e9)] for k in range(N)])
    with pytest.raises(SelectionError, match=r"_ChoosesOffline.*outside oracle\.available"):
        _trainer(_ChoosesOffline(), rounds=1).fit(_with(fed, av))


def test_a_fedscale_trace_whose_clients_start_offline(fed, tmp_path):
    """As in FedScale: clients check in when online and the server samples among them; a trace where everyone
    starts offline starts its first round when the first client comes online."""
    period = 2000.0
    trace = {
        str(k): {
            "active": [100.0 + 90.0 * k],
            "inactive": [100.0 + 90.0 * k + 400.0],
            "finish_time": period,
            "duration": 400.0,
            "model": "x",
        }
        for k in range(N)
    }
    with open(tmp_path / "client_behave_trace", "wb") as fh:
        pickle.dump(trace, fh, protocol=2)
    with open(tmp_path / "client_device_capacity", "wb") as fh:
        pickle.dump({0: {"computation": 5.0, "communication": 6000.0}}, fh, protocol=2)
    convert_fedscale_traces(tmp_path / "client_behave_trace", tmp_path / "av.npz")
    convert_fedscale_traces(tmp_path / "client_device_capacity", tmp_path / "dev.npz")
    p = from_fedscale(tmp_path / "dev.npz", tmp_path / "av.npz", n_clients=N)
    assert not p.available(np.arange(N), np.zeros(N)).any()  # everyone offline at 0
    f = dataclasses.replace(fed, profiles=p)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainedNobodyWarning)
        h = _trainer("random", rounds=12).fit(f).history_
    assert h.rounds[0].sim_time - h.rounds[0].sim_seconds == pytest.approx(100.0)  # the first check-in
    picks = sum(len(r.clients) for r in h.rounds)
    failed = sum(len(r.failed) for r in h.rounds)
    assert failed <= 0.05 * picks
    assert all(ok.all() for ok in _online_at_start(h, p.availability))


class _OwnSelect(BaseSelector):
    """Overrides ``select`` itself (no template): always clients 0..n-1; the round restricts it."""

    def __init__(self, *, random_state=None):
        self.random_state = random_state

    def fit(self, pool):
        self.size_ = pool.n_clients
        return self

    def select(self, n, *, round, oracle):
        return Selection(np.arange(n))

    def update(self, feedback):
        return self


def test_a_selector_with_its_own_select_is_restricted_by_the_round(fed):
    av = _staggered()
    h = _trainer(_OwnSelect(), rounds=12).fit(_with(fed, av)).history_
    assert all(ok.all() for ok in _online_at_start(h, av))
    assert sum(len(r.failed) for r in h.rounds) == 0
