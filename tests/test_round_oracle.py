"""The oracle written once (fedselect.round.oracle): every world's questions are the same code, its policies one."""

from __future__ import annotations

import numpy as np

import fedselect
import fedselect._synthetic
import fedselect.round
import fedselect.simulation.trainer
import fedselect.simulation.transport
import fedselect.testing
from fedselect.round.oracle import RoundOracle
from fedselect.selectors.random import RandomSelector
from fedselect.testing import SyntheticOracle, check_valid_selections, make_pools


def test_a_trial_model_that_is_not_finite_is_not_sent_and_answers_nan():
    """Policy: finite updates whose mean overflows float32 give no trial model; NaN answers, no trial charged."""
    oracle = SyntheticOracle(4, noise=0.0, random_state=0)
    oracle.optima[:] = 6e38  # lr 0.5: each update is 3e38 (finite in float32), the mean of two overflows
    out = oracle.trial([0, 1])
    assert out.shape == (4,) and np.isnan(out).all()
    costs = oracle.costs
    assert costs.models_down == 4  # the baseline's w^t only: the trial model went to nobody
    assert costs.scalars_up == 4 and costs.local_trainings == 2 and costs.models_up == 2


def test_a_finite_trial_model_is_sent_to_every_client():
    oracle = SyntheticOracle(4, noise=0.0, random_state=0)
    out = oracle.trial([0, 1])
    assert np.isfinite(out).all()
    assert oracle.costs.models_down == 8 and oracle.costs.scalars_up == 8


def test_the_worlds_share_one_oracle():
    shared = ("trial", "_losses", "_ask_losses", "start_training", "finish_training", "aggregate_buffers", "_settle")
    for cls in (fedselect.simulation.transport.SimulationOracle, SyntheticOracle):
        assert issubclass(cls, RoundOracle)
        for name in shared:
            assert name not in vars(cls), f"{cls.__name__} writes {name} again"


def test_old_import_paths_keep_working():
    trainer, transport = fedselect.simulation.trainer, fedselect.simulation.transport
    for name in ("SimulationOracle", "TrainingRequest", "TestRequest"):
        assert getattr(trainer, name) is getattr(transport, name)
    assert fedselect.testing.SyntheticOracle is fedselect._synthetic.SyntheticOracle
    for name in (
        "Aggregate",
        "Apply",
        "Contain",
        "OpenRound",
        "Reports",
        "Transport",
        "conclude_round",
        "open_round",
        "play_round",
    ):
        assert getattr(fedselect.round, name) is getattr(fedselect.round.play, name)


def test_the_conformance_checks_play_their_rounds_through_play_round(monkeypatch):
    played = []
    real = fedselect._synthetic.play_round

    def counted(*args, **kwargs):
        played.append(kwargs["round"])
        return real(*args, **kwargs)

    monkeypatch.setattr(fedselect._synthetic, "play_round", counted)
    check_valid_selections(RandomSelector(), n_rounds=3, pools=make_pools(0, (7,)))
    assert played == [0, 1, 2] * 3  # n = 1, 2 and 7


def test_a_played_round_keeps_the_selection_as_chosen():
    oracle = SyntheticOracle(6, random_state=0)
    selector = RandomSelector(random_state=0).fit(fedselect.ClientPool(oracle.n_samples))
    agg = oracle.play(selector, 3)
    assert agg.chosen is not None and sorted(agg.chosen.clients.tolist()) == agg.selection.clients.tolist()
    assert oracle.round == 1 and oracle.costs.local_trainings == 3


# -- the transport's policies (fedselect.round.TransportPolicies): one oracle, each world's choices ------------------
def test_the_simulator_and_the_synthetic_world_keep_the_default_policies():
    for cls in (fedselect.simulation.transport.EngineClients, fedselect._synthetic.QuadraticClients):
        assert issubclass(cls, fedselect.round.TransportPolicies)
        assert cls.transforms_on == "client" and cls.reaches_offline is True


def test_a_transform_on_the_client_charges_its_rows_and_on_the_server_the_full_update():
    for where, floats, models in (("client", 2 * 3, 0), ("server", 0, 2)):
        oracle = SyntheticOracle(4, noise=0.0, random_state=0)
        oracle.transport.transforms_on = where
        rows = oracle.local_updates([0, 1], transform=lambda u: u[:3])
        assert rows.shape == (2, 3)
        assert (oracle.costs.floats_up, oracle.costs.models_up) == (floats, models), where


def test_a_server_that_sees_who_is_offline_sends_them_nothing():
    oracle = SyntheticOracle(12, client_dropout=0.5, noise=0.0, random_state=3)
    offline = len(oracle.ledger.failed)
    assert 0 < offline < 12
    oracle.losses(np.arange(12))
    assert oracle.costs.models_down == 12  # the simulator's server pays for messages to offline clients
    oracle = SyntheticOracle(12, client_dropout=0.5, noise=0.0, random_state=3)
    oracle.transport.reaches_offline = False
    out = oracle.losses(np.arange(12))
    assert oracle.costs.models_down == 12 - offline and np.isnan(out).sum() == offline


def test_the_trial_model_is_built_from_the_updates_the_screen_keeps():
    screened = SyntheticOracle(4, noise=0.0, random_state=0)
    screened.transport.screen_updates = lambda ids, updates: (updates, np.asarray(ids) != 0)
    alone = SyntheticOracle(4, noise=0.0, random_state=0)
    assert np.allclose(screened.trial([0, 1]), alone.trial([1]), equal_nan=True)


def test_a_trial_model_that_is_not_finite_is_noted_by_the_transport():
    oracle = SyntheticOracle(4, noise=0.0, random_state=0)
    oracle.optima[:] = 6e38
    notes: list[str] = []
    oracle.transport.note = notes.append
    assert np.isnan(oracle.trial([0, 1])).all()
    assert len(notes) == 1 and "not finite" in notes[0]


def test_an_update_the_transport_lost_fails_its_client():
    oracle = SyntheticOracle(4, noise=0.0, random_state=0)
    received = oracle.transport.received

    def lose_client_0(ids, work, result):
        return [None if k == 0 else r for k, r in zip(ids.tolist(), received(ids, work, result))]

    oracle.transport.received = lose_client_0
    rows = oracle.local_updates([0, 1])
    assert np.isnan(rows[0]).all() and np.isfinite(rows[1]).all()
    assert oracle.ledger.is_failed(0) and oracle.costs.local_trainings == 1 and oracle.costs.models_up == 1
