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
