"""The fit as one loop (simulation/loop.py): a generator of requests, its state in one object, old checkpoints."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fedselect import FederatedTrainer, make_federation
from fedselect.simulation.loop import DivergenceError, RunState, _Fit, run_fit
from fedselect.simulation.trainer import TestRequest, TrainingRequest

DATA = Path(__file__).parent / "data"

# The settings tests/simulation/data/checkpoint_8b203e3.pkl was written with, by the trainer of commit 8b203e3
# (before the fit became loop.py's generator): 4 rounds, stopped by its callback in round 2 after the checkpoint
# of round 1 (next_round 2). Client failures (dropout) put the failure probabilities in its fingerprint.
OLD = dict(
    selector="power-of-choice",
    model="logistic",
    rounds=4,
    clients_per_round=3,
    client_dropout=0.2,
    checkpoint_every=2,
    random_state=0,
)


def _rounds(trainer):
    return [{k: v for k, v in r.to_dict().items() if k != "seconds"} for r in trainer.history_.rounds]


@pytest.fixture(scope="module")
def fed10():
    return make_federation("digits", partition="shards", n_clients=10, random_state=0)


def test_a_checkpoint_written_before_the_loop_resumes_after_it(fed10, tmp_path):
    shutil.copy(DATA / "checkpoint_8b203e3.pkl", tmp_path / "checkpoint.pkl")
    resumed = FederatedTrainer(**OLD, checkpoint_dir=tmp_path).fit(fed10)
    straight = FederatedTrainer(**OLD).fit(fed10)
    assert resumed.resumed_from_ == 2
    assert _rounds(resumed) == _rounds(straight)
    np.testing.assert_array_equal(resumed.parameters_, straight.parameters_)


def test_the_fit_is_a_generator_of_requests_answered_by_its_driver(digits_fed):
    kw = dict(rounds=3, clients_per_round=3, local_steps=2, eval_every=2, random_state=1)
    trainer = FederatedTrainer(**kw)
    run = run_fit(trainer, digits_fed)
    asked, reply = [], None
    while True:
        try:
            request = run.send(reply) if asked else next(run)
        except StopIteration:
            break
        asked.append(type(request))
        reply = request.run()
    # per round its main training, and its test evaluation in evaluated rounds (1 and the last, 2)
    assert asked == [TrainingRequest, TrainingRequest, TestRequest, TrainingRequest, TestRequest]
    assert _rounds(trainer) == _rounds(FederatedTrainer(**kw).fit(digits_fed))


def test_an_error_answering_a_request_is_raised_where_the_round_asked(digits_fed):
    fit = _Fit(FederatedTrainer(rounds=2, clients_per_round=3, random_state=0), digits_fed)
    assert isinstance(fit.step(), TrainingRequest)
    with pytest.raises(DivergenceError) as info:  # a FloatingPointError in round 0 is the run's divergence
        fit.step(error=FloatingPointError("nan in the batched step"))
    assert info.value.round == 0 and "nan in the batched step" in str(info.value)
    assert fit.step() is None  # the fit has ended


def test_the_run_state_is_one_object_not_attributes_on_the_trainer(digits_fed):
    threads = torch.get_num_threads()
    trainer = FederatedTrainer(rounds=2, clients_per_round=3, random_state=0, n_threads=threads + 1)
    run = run_fit(trainer, digits_fed)
    next(run)
    frame_state = run.gi_frame.f_locals["state"]
    assert isinstance(frame_state, RunState) and frame_state.t == 0 and frame_state.fed is digits_fed
    assert torch.get_num_threads() == threads + 1
    run.close()  # stopped between requests: torch's threads restored
    assert torch.get_num_threads() == threads
    trainer.fit(digits_fed)
    assert sorted(k for k in vars(trainer) if k.startswith("_")) == ["_setup"]
