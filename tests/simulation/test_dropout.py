"""Client failures in simulation: dropout, availability, partial rounds, and every selector coping."""

from __future__ import annotations

import numpy as np
import pytest

from fedselect import FederatedTrainer, get_selector, list_selectors, make_federation
from fedselect.selection import BaseSelector, ClientPool, Selection
from fedselect.simulation.history import History

FAST = dict(model="logistic", local_steps=1, batch_size=16, lr=0.1)


@pytest.fixture(scope="module")
def fed():
    return make_federation("digits", partition="shards", n_clients=20, random_state=0)


VARIANTS = [(name, {}) for name in list_selectors()] + [
    ("clustered", {"method": "similarity", "init": "probe"}),
    ("ldcs", {"initial": "probe"}),
    ("fedcor", {"schedule": "readme2023", "update_mean": True}),
    ("random", {"replace": True}),
    ("hcsfed", {"uniform_mix": 0.1}),
]


@pytest.mark.parametrize("name, params", VARIANTS, ids=[f"{n}{p or ''}" for n, p in VARIANTS])
def test_every_selector_runs_50_rounds_at_30_percent_dropout(fed, name, params):
    if name == "fedcor":
        params = {"warmup_rounds": 5, "gp_interval": 5, "rank": 5, "warmup_iters": 20, "gp_iters": 10, **params}
    tr = FederatedTrainer(selector=get_selector(name, **params), clients_per_round=4, rounds=50, client_dropout=0.3,
                          random_state=0, **FAST).fit(fed)
    h = tr.history_
    assert len(h) == 50
    failed = sum(len(r.failed) for r in h.rounds)
    chosen = sum(len(r.clients) for r in h.rounds)
    if name in ("hcsfed", "ocs"):
        assert failed == 0  # they train everyone first and choose among the clients that answered
    elif name in ("random", "round-robin", "data-size"):
        assert 0.15 < failed / chosen < 0.45  # about 30 % of the chosen did not report
    else:
        assert failed / chosen < 0.45
    for r in h.rounds:
        assert set(r.failed) <= set(r.clients)
        assert all(w == 0.0 for k, w in zip(r.clients, r.weights) if k in r.failed)
        assert np.isfinite(r.test_accuracy)
    assert np.isfinite(tr.parameters_).all()


class Recorder(BaseSelector):
    """Chooses every client; keeps the feedback."""

    needs = frozenset({"updates", "global"})
    variable_size = True

    def __init__(self, *, weights=None, random_state=None):
        self.weights = weights
        self.random_state = random_state

    def _fit(self, pool: ClientPool) -> None:
        self.feedback_ = []

    def _select(self, n, *, round, oracle):
        ids = np.arange(self.n_clients_)
        return Selection(ids, None if self.weights is None else np.full(ids.size, self.weights))

    def _update(self, feedback) -> None:
        self.feedback_.append(feedback)


def test_failures_come_from_their_own_stream_the_same_for_every_selector(fed):
    runs = [
        FederatedTrainer(selector=sel, clients_per_round=fed.n_clients, rounds=6, client_dropout=0.3, random_state=3,
                         **FAST).fit(fed)
        for sel in ("round-robin", Recorder(), "random")
    ]
    failed = [[r.failed for r in tr.history_.rounds] for tr in runs]
    assert failed[0] == failed[1] == failed[2]
    assert any(failed[0]) and len({tuple(f) for f in failed[0]}) > 1  # failures change from round to round
    other = FederatedTrainer(selector=Recorder(), clients_per_round=fed.n_clients, rounds=6, client_dropout=0.3,
                             random_state=4, **FAST).fit(fed)
    assert [r.failed for r in other.history_.rounds] != failed[0]


def test_dropout_zero_changes_nothing(fed):
    a = FederatedTrainer(selector="power-of-choice", rounds=5, random_state=0, **FAST).fit(fed)
    b = FederatedTrainer(selector="power-of-choice", rounds=5, random_state=0, client_dropout=0.0,
                         availability=np.ones(fed.n_clients), **FAST).fit(fed)
    assert a.history_ == b.history_ and all(not r.failed for r in a.history_.rounds)


def test_round_aggregates_the_reporters_by_the_rule_renormalised(fed):
    tr = FederatedTrainer(selector=Recorder(), clients_per_round=fed.n_clients, rounds=4, client_dropout=0.4,
                          aggregation="data-size", random_state=0, **FAST).fit(fed)
    for rec, fb in zip(tr.history_.rounds, tr.selector_.feedback_):
        reporters = [k for k in rec.clients if k not in rec.failed]
        assert fb.clients.tolist() == reporters and fb.updates.shape[0] == len(reporters)
        n_k = fed.n_samples[reporters]
        np.testing.assert_allclose(fb.weights, n_k / n_k.sum())
        np.testing.assert_allclose(fb.global_after, fb.global_before + fb.weights @ fb.updates, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["rescale", "as-given"])
def test_selection_weights_of_the_reporters(fed, mode):
    tr = FederatedTrainer(selector=Recorder(weights=0.05), clients_per_round=fed.n_clients, rounds=3,
                          client_dropout=0.5, partial_weights=mode, random_state=0, **FAST).fit(fed)
    for rec, fb in zip(tr.history_.rounds, tr.selector_.feedback_):
        assert 0 < len(rec.failed) < fed.n_clients
        # rescaled: the reporters share the selection's total (20 x 0.05); as given: unnormalised, the rest is lost
        want = 0.05 * fed.n_clients / fb.clients.size if mode == "rescale" else 0.05
        np.testing.assert_allclose(fb.weights, want)
        np.testing.assert_allclose(fb.global_after, fb.global_before + want * fb.updates.sum(0), rtol=1e-5, atol=1e-6)


def test_nobody_reports_leaves_the_model_unchanged(fed):
    tr = FederatedTrainer(selector="random", rounds=3, availability=np.zeros(fed.n_clients), random_state=0,
                          **FAST).fit(fed)
    accs = [r.test_accuracy for r in tr.history_.rounds]
    assert accs[0] == accs[1] == accs[2]
    assert all(sorted(r.failed) == sorted(r.clients) for r in tr.history_.rounds)
    c = tr.history_.rounds[0].costs
    assert c.models_down == 5 and c.models_up == 0 and c.scalars_up == 0 and c.local_trainings == 0


def test_availability_per_client_and_as_a_callable(fed):
    small = fed.n_samples < np.median(fed.n_samples)

    def avail(federation):
        return np.where(federation.n_samples < np.median(federation.n_samples), 0.2, 1.0)

    tr = FederatedTrainer(selector=Recorder(), clients_per_round=fed.n_clients, rounds=20, availability=avail,
                          random_state=0, **FAST).fit(fed)
    failed = np.zeros(fed.n_clients)
    for r in tr.history_.rounds:
        failed[r.failed] += 1
    assert failed[~small].sum() == 0
    assert 0.6 < failed[small].mean() / 20 < 1.0


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"client_dropout": 1.0}, r"client_dropout=1.0 is invalid; expected a finite number in \[0, 1\)"),
        ({"client_dropout": -0.1}, r"client_dropout=-0.1"),
        ({"client_dropout": float("nan")}, r"client_dropout=nan"),
        ({"client_dropout": "high"}, r"client_dropout='high' is invalid"),
        ({"client_dropout": None}, r"client_dropout=None is invalid"),
        ({"dropout": "high"}, r"dropout='high' is invalid"),  # the former name is checked as well
        ({"availability": [0.5] * 3}, r"availability=.*expected None, or 20 probabilities"),
        ({"availability": np.full(20, 1.5)}, "availability"),
        ({"availability": lambda f: np.ones(3)}, r"availability=.*-> .*expected None, or 20"),
        ({"availability": "high"}, "availability='high'"),
        ({"availability": 3}, "availability=3"),
    ],
)
def test_bad_failure_parameters_are_named_before_training(fed, kw, match):
    calls = []
    with pytest.raises(ValueError, match=match):
        FederatedTrainer(selector="random", rounds=2, callback=lambda *a: calls.append(a), **FAST, **kw).fit(fed)
    assert not calls


def test_history_keeps_who_failed(fed, tmp_path):
    tr = FederatedTrainer(selector="random", rounds=8, client_dropout=0.5, random_state=0, **FAST).fit(fed)
    assert any(r.failed for r in tr.history_.rounds)
    tr.history_.to_json(tmp_path / "h.json")
    assert History.from_json(tmp_path / "h.json") == tr.history_
    tr.history_.to_csv(tmp_path / "h.csv")
    assert "failed" in (tmp_path / "h.csv").read_text().splitlines()[0]


def test_a_diverged_local_update_is_an_error_not_a_missing_answer(fed):
    """NaN is how a client that did not answer is reported; a diverged local training must not pass for one."""
    from fedselect.simulation import DivergenceError

    with pytest.raises(DivergenceError, match=r"round 0: the local training of client\(s\) .* diverged"):
        FederatedTrainer(selector="ocs", rounds=2, model="logistic", local_steps=5, lr=1e300, divergence=None,
                         random_state=0).fit(fed)


def test_the_former_name_dropout_warns_at_the_callers_line_and_is_the_same_run(fed):
    """``dropout=`` was the name of client failures; it is the model's word, so the trainer's is ``client_dropout``."""
    from fedselect.experiments.plan import run_settings
    from fedselect.identity import trainer_identity

    new = FederatedTrainer(selector="random", rounds=6, client_dropout=0.4, random_state=0, **FAST).fit(fed)
    old = FederatedTrainer(selector="random", rounds=6, dropout=0.4, random_state=0, **FAST)
    with pytest.warns(DeprecationWarning, match=r"FederatedTrainer: dropout= is deprecated .* use client_dropout=0.4"):
        old.fit(fed)
    assert any(r.failed for r in new.history_.rounds)
    assert old.history_ == new.history_  # the same failures and bits, and the same recorded settings:
    assert new.history_.config["trainer"]["dropout"] == 0.4 and "client_dropout" not in new.history_.config["trainer"]
    assert trainer_identity(old) == trainer_identity(new)  # one checkpoint identity, under the stored name
    # one run key in a comparison, however spelled (stored runs were keyed with "dropout")
    spec = {"dataset": "digits", "n_clients": 20}
    key = {w: run_settings(spec, {**FAST, w: 0.4}, "random", 0) for w in ("dropout", "client_dropout")}
    assert key["dropout"] == key["client_dropout"] and key["dropout"]["trainer"]["dropout"] == 0.4


def test_dropout_and_client_dropout_both_set_are_refused_before_training(fed):
    calls = []
    tr = FederatedTrainer(client_dropout=0.3, dropout=0.2, rounds=2, callback=lambda *a: calls.append(a), **FAST)
    with pytest.raises(ValueError, match=r"client_dropout=0.3 and its deprecated name dropout=0.2 are both set"):
        tr.fit(fed)
    assert not calls
