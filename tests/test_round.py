"""One round, one aggregation: the runtimes play their rounds through fedselect.round and weigh by
fedselect.aggregation's rules."""

import json

import numpy as np
import pytest
import torch

import fedselect._synthetic
import fedselect.round as round_module
import fedselect.round.play
from fedselect import FederatedTrainer, Selection, make_federation
from fedselect.aggregation import aggregation_weights, apply_deltas, average_buffer_deltas
from fedselect.testing import SyntheticOracle

N_SAMPLES = np.array([10, 20, 30, 40, 50, 60])


def test_data_size_rule_weighs_by_n_k_times_counts_over_the_reporters():
    sel = Selection([1, 3, 3, 5]).validated(6, 4, variable_size=True)  # client 3 drawn twice
    np.testing.assert_allclose(aggregation_weights(sel, aggregation="data-size", n_samples=N_SAMPLES),
                               np.array([20, 80, 60]) / 160)
    got = aggregation_weights(sel, [True, False, True], aggregation="data-size", n_samples=N_SAMPLES)
    np.testing.assert_allclose(got, [20 / 80, 0.0, 60 / 80])


def test_mean_rule_counts_duplicates_and_ignores_n_k():
    sel = Selection([1, 3, 3, 5]).validated(6, 4, variable_size=True)
    np.testing.assert_allclose(aggregation_weights(sel, aggregation="mean", n_samples=N_SAMPLES), [0.25, 0.5, 0.25])
    np.testing.assert_allclose(aggregation_weights(sel, [False, True, True], aggregation="mean"), [0.0, 2 / 3, 1 / 3])
    assert not aggregation_weights(sel, [False] * 3, aggregation="mean").any()  # nobody reported: nothing moves


def test_selection_weights_are_applied_as_given_or_rescaled_over_the_reporters():
    sel = Selection([0, 2, 4], weights=[0.3, 0.5, 0.7]).validated(6, 3)
    np.testing.assert_allclose(aggregation_weights(sel, aggregation="data-size", n_samples=N_SAMPLES), [0.3, 0.5, 0.7])
    ok = [True, False, True]
    np.testing.assert_allclose(aggregation_weights(sel, ok, n_samples=N_SAMPLES), [0.3 * 1.5, 0.0, 0.7 * 1.5])
    np.testing.assert_allclose(aggregation_weights(sel, ok, partial_weights="as-given"), [0.3, 0.0, 0.7])
    with pytest.raises(ValueError, match="aggregation="):
        aggregation_weights(Selection([0]).validated(6, 1), rule="median")


def test_apply_deltas_is_float32_and_buffers_average_differences():
    theta = np.array([1.0, 2.0], dtype=np.float32)
    deltas = np.array([[1.0, 0.0], [0.0, 4.0]], dtype=np.float32)
    out = apply_deltas(theta, deltas, [0.5, 0.25])
    assert out.dtype == np.float32 and out.tolist() == [1.5, 3.0]
    assert torch.equal(apply_deltas(torch.from_numpy(theta), torch.from_numpy(deltas), [0.5, 0.25]),
                       torch.from_numpy(out))
    b = {"m": torch.tensor([1.0, 1.0]), "n": torch.tensor(10), "mask": torch.tensor([True])}
    d = {"m": torch.tensor([[2.0, 0.0], [0.0, 4.0]]), "n": torch.tensor([3, 4])}
    got = average_buffer_deltas(b, d, [1.0, 3.0])  # weights normalised: 1/4, 3/4
    assert got["m"].tolist() == [1.5, 4.0] and int(got["n"]) == 14 and got["mask"].tolist() == [True]


@pytest.fixture(scope="module")
def fed():
    return make_federation("digits", partition="shards", n_clients=8, random_state=0)


def _counting(monkeypatch, module=fedselect.round.play):
    """Count the rounds concluded by ``module``'s ``conclude_round`` (fedselect.round.play's, which every round's
    second phase, ``OpenRound.conclude``, calls)."""
    calls = []
    real = round_module.conclude_round

    def counted(*args, **kwargs):
        calls.append(kwargs.get("round"))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "conclude_round", counted)
    return calls


def test_the_simulator_plays_every_round_through_the_round_module(fed, monkeypatch):
    calls = _counting(monkeypatch)
    trainer = FederatedTrainer(selector="random", clients_per_round=3, rounds=4, local_steps=2, random_state=0)
    trainer.fit(fed)
    assert calls == [0, 1, 2, 3]
    for rec in trainer.history_.rounds:  # and weighs by the data-size rule
        n_k = fed.n_samples[rec.clients]
        np.testing.assert_allclose(rec.weights, n_k / n_k.sum())


def test_the_synthetic_oracle_plays_its_rounds_through_the_round_module(monkeypatch):
    calls = _counting(monkeypatch, fedselect._synthetic)
    oracle = SyntheticOracle(n_clients=6, random_state=0)
    fb = oracle.run_round(Selection([1, 3, 3]).validated(6, 3, variable_size=True))
    assert calls == [0]
    np.testing.assert_allclose(fb.weights, [1 / 3, 2 / 3])  # the mean rule, duplicates counted


# -- the round's hooks: what a runtime such as Flower's strategy plugs in ------------------------------------------
class _Raising(fedselect.BaseSelector):
    """Chooses the first n clients; raises in ``select`` or ``update`` when told to, and counts its updates."""

    def __init__(self, *, fail_in=None):
        self.fail_in = fail_in

    def _fit(self, pool):
        self.updates_ = 0

    def _select(self, n, *, round, oracle):
        if self.fail_in == "select":
            oracle.losses([0])  # a client answered before the failure, as in a hostile round
            raise ValueError("boom in select")
        return Selection(np.arange(n))

    def _update(self, feedback):
        if self.fail_in == "update":
            raise ValueError("boom in update")
        self.updates_ += 1


def _play(selector, **hooks):
    """One round of ``selector`` on a SyntheticOracle through play_round; (its result, the oracle)."""
    oracle = SyntheticOracle(n_clients=6, random_state=0)
    selector.fit(fedselect.ClientPool(oracle.n_samples))
    agg = round_module.play_round(oracle, oracle, selector, 2, oracle.w, round=0, n_clients=6, aggregation="mean",
                                  accumulate="float64", **hooks)  # this transport trains at once: no answer=
    return agg, oracle


def test_contain_decides_whether_a_selectors_exception_stops_the_round():
    with pytest.raises(ValueError, match="boom in select"):  # without the hook: the user's to see
        _play(_Raising(fail_in="select"))
    with pytest.raises(ValueError, match="boom in select"):  # the hook declines
        _play(_Raising(fail_in="select"), contain=lambda step, exc, agg: False)
    seen = []
    agg, oracle = _play(_Raising(fail_in="select"), contain=lambda step, exc, agg: seen.append((step, agg)) or True)
    assert agg is None and seen == [("select", None)]  # skipped: nobody trained
    assert oracle.ledger.costs.local_trainings == 0
    with pytest.raises(ValueError, match="boom in update"):
        _play(_Raising(fail_in="update"))
    seen.clear()
    agg, _ = _play(_Raising(fail_in="update"), contain=lambda step, exc, agg: seen.append((step, agg)) or True)
    assert agg is not None and [s for s, _ in seen] == ["update"] and seen[0][1] is agg  # the round stands


class _Asking(SyntheticOracle):
    """A transport that asks its runtime to run the training: a request out, its answer back in."""

    def start_training(self, ids):
        super().start_training(ids)
        return ("train", tuple(ids.tolist()))

    def finish_training(self, reply):
        assert reply == ("trained", (0, 1)), reply
        return super().finish_training(None)


def test_a_round_is_three_phases_with_the_runtime_answering_in_between():
    oracle, sel = _Asking(n_clients=6, random_state=0), _Raising()
    sel.fit(fedselect.ClientPool(oracle.n_samples))
    opened = round_module.open_round(oracle, oracle, sel, 2, oracle.w, round=0, n_clients=6, aggregation="mean")
    assert opened.request == ("train", (0, 1)) and opened.selection.clients.tolist() == [0, 1]
    agg = opened.conclude(("trained", (0, 1)))
    assert agg.feedback.clients.tolist() == [0, 1] and sel.updates_ == 0  # not taught before phase 3
    opened.learn(agg)
    assert sel.updates_ == 1
    with pytest.raises(TypeError, match="answer="):  # play_round cannot answer a request by itself
        round_module.play_round(oracle, oracle, _Raising().fit(fedselect.ClientPool(oracle.n_samples)), 2,
                                oracle.w, round=0, n_clients=6, aggregation="mean")
    sel = _Raising().fit(fedselect.ClientPool(oracle.n_samples))
    agg = round_module.play_round(oracle, oracle, sel, 2, oracle.w, round=0, n_clients=6, aggregation="mean",
                                  answer=lambda request: ("trained", request[1]))
    assert agg.feedback.clients.tolist() == [0, 1] and sel.updates_ == 1


def test_a_request_left_unanswered_or_an_answer_to_no_request_is_an_error_not_a_silent_round():
    oracle = _Asking(n_clients=6, random_state=0)
    sel = _Raising().fit(fedselect.ClientPool(oracle.n_samples))
    opened = round_module.open_round(oracle, oracle, sel, 2, oracle.w, round=0, n_clients=6, aggregation="mean")
    with pytest.raises(TypeError, match=r"OpenRound.conclude: the round's request is tuple but the reply is NoneType"):
        opened.conclude()  # forgot to answer: not a round whose clients all failed
    opened.request = None
    with pytest.raises(TypeError, match=r"request is NoneType but the reply is tuple"):
        opened.conclude(("trained", (0, 1)))


def test_after_aggregate_returning_false_keeps_the_round_from_the_selector():
    for result, taught in ((False, 0), (None, 1), (True, 1)):
        sel = _Raising()
        agg, _ = _play(sel, after_aggregate=lambda agg, result=result: result)  # a plain function
        assert agg.feedback.clients.size == 2 and sel.updates_ == taught, result


def test_apply_replaces_the_weighted_sum_and_none_means_no_model():
    got = {}

    def apply(theta, selection, reports, weights):
        got.update(theta=theta, clients=reports.clients.tolist(), weights=np.asarray(weights))
        return None

    class Global(_Raising):
        needs = frozenset({"global"})

    agg, _ = _play(Global(), apply=apply)
    assert agg.theta is None and agg.feedback.global_after is None and agg.feedback.global_before is not None
    assert got["clients"] == agg.feedback.clients.tolist() and got["theta"] is not None
    np.testing.assert_allclose(got["weights"], agg.feedback.weights)  # the reporters' weights, by the rule
    np.testing.assert_allclose(got["weights"], [0.5, 0.5])  # "mean" over two reporters


def test_round_records_write_measured_seconds_only_when_set_and_compare_without_them():
    from fedselect.simulation import RoundRecord

    plain = RoundRecord(round=0, clients=[1, 2])
    assert "wall_seconds" not in plain.to_dict() and "reply_seconds" not in plain.to_dict()
    timed = RoundRecord(round=0, clients=[1, 2], wall_seconds=1.5, reply_seconds={1: 0.25, 2: 1.25})
    d = timed.to_dict()
    assert d["wall_seconds"] == 1.5 and d["reply_seconds"] == {"1": 0.25, "2": 1.25}  # JSON keys
    back = RoundRecord.from_dict(json.loads(json.dumps(d)))
    assert back.reply_seconds == {1: 0.25, 2: 1.25} and back.wall_seconds == 1.5
    assert timed == plain and repr(timed) == repr(plain)  # wall-clock fields, like seconds, are not the run


def test_rule_is_the_deprecated_name_of_aggregation():
    sel = Selection([0, 1, 2]).validated(6, 3)
    with pytest.warns(DeprecationWarning, match=r"aggregation_weights: rule= is deprecated.*aggregation='mean'"):
        old = aggregation_weights(sel, rule="mean", n_samples=N_SAMPLES)
    np.testing.assert_array_equal(old, aggregation_weights(sel, aggregation="mean", n_samples=N_SAMPLES))
    assert not np.array_equal(old, aggregation_weights(sel, aggregation="data-size", n_samples=N_SAMPLES))
