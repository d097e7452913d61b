"""Checkpoints inside a run: resuming equals not stopping, even after kill -9; bad files never block."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedselect import FederatedTrainer, get_selector
from fedselect.simulation import CheckpointMismatchError, CorruptFileWarning, DivergenceError, History
from fedselect.simulation.checkpoint import atomic_write_bytes, read_checkpoint, write_checkpoint

SELECTORS = {
    "random": {},
    "power-of-choice": {"d": 6},
    "fedcor": {"warmup_rounds": 2, "warmup_iters": 20, "gp_iters": 20, "gp_interval": 3, "rank": 3},
}


def _kw(name: str, **extra):
    return dict(selector=get_selector(name, **SELECTORS[name]), rounds=14, clients_per_round=3, local_steps=3,
                random_state=3, **extra)


class _Stop(Exception):
    pass


def _stop_at(k: int):
    def cb(trainer, record):
        if record.round == k:
            raise _Stop

    return cb


@pytest.mark.parametrize("name", list(SELECTORS))
def test_resume_after_an_exception_equals_an_uninterrupted_run(name, digits_fed, tmp_path):
    reference = FederatedTrainer(**_kw(name)).fit(digits_fed)
    with pytest.raises(_Stop):
        FederatedTrainer(**_kw(name), checkpoint_dir=tmp_path, checkpoint_every=4,
                         callback=_stop_at(10)).fit(digits_fed)
    seen: list[int] = []
    resumed = FederatedTrainer(
        **_kw(name), checkpoint_dir=tmp_path, checkpoint_every=4, callback=lambda tr, r: seen.append(r.round)
    ).fit(digits_fed)
    assert seen == [8, 9, 10, 11, 12, 13]  # the checkpoint after round 7; at most k = 4 rounds redone
    assert resumed.history_ == reference.history_
    assert (resumed.parameters_ == reference.parameters_).all()
    # The selector continues identically too: asked the same questions, its next choices are the same.
    from fedselect.testing import SyntheticOracle

    n = digits_fed.n_clients
    for t in range(14, 17):
        a = resumed.selector_.select(3, round=t, oracle=SyntheticOracle(n, random_state=t))
        b = reference.selector_.select(3, round=t, oracle=SyntheticOracle(n, random_state=t))
        assert a.clients.tolist() == b.clients.tolist()


def test_a_finished_checkpoint_returns_the_same_result_without_training(digits_fed, tmp_path):
    first = FederatedTrainer(**_kw("random"), checkpoint_dir=tmp_path).fit(digits_fed)
    calls: list[int] = []
    again = FederatedTrainer(**_kw("random"), checkpoint_dir=tmp_path,
                             callback=lambda tr, r: calls.append(r.round)).fit(digits_fed)
    assert calls == []
    assert again.history_ == first.history_
    assert [r.seconds for r in again.history_.rounds] == [r.seconds for r in first.history_.rounds]


def test_stop_at_target_is_resumed_as_finished(digits_fed, tmp_path):
    full = FederatedTrainer(**_kw("random")).fit(digits_fed).history_
    kw = _kw("random", target_accuracy=full.rounds[6].test_accuracy)
    ref = FederatedTrainer(**kw).fit(digits_fed).history_
    assert len(ref) <= 7
    assert FederatedTrainer(**kw, checkpoint_dir=tmp_path, checkpoint_every=2).fit(digits_fed).history_ == ref
    assert FederatedTrainer(**kw, checkpoint_dir=tmp_path, checkpoint_every=2).fit(digits_fed).history_ == ref


def test_a_checkpoint_of_another_configuration_is_refused_naming_the_setting(digits_fed, tmp_path):
    FederatedTrainer(**_kw("power-of-choice"), checkpoint_dir=tmp_path).fit(digits_fed)
    other = _kw("power-of-choice", lr=0.1)
    other["selector"] = get_selector("power-of-choice", d=5)
    with pytest.raises(CheckpointMismatchError, match=r"trainer\.lr: checkpoint 0\.05, now 0\.1") as info:
        FederatedTrainer(**other, checkpoint_dir=tmp_path).fit(digits_fed)
    assert set(info.value.differences) == {"trainer.lr", "selector.params.d"}
    assert str(tmp_path / "checkpoint.pkl") in str(info.value)


def test_schedules_that_differ_only_in_their_code_are_told_apart(digits_fed, tmp_path):
    kw = {k: v for k, v in _kw("random").items() if k != "rounds"}
    FederatedTrainer(**kw, rounds=2, lr_schedule=lambda t: 0.1, checkpoint_dir=tmp_path).fit(digits_fed)
    with pytest.raises(CheckpointMismatchError, match="lr_schedule"):
        FederatedTrainer(**kw, rounds=2, lr_schedule=lambda t: 0.01, checkpoint_dir=tmp_path).fit(digits_fed)


def test_settings_that_do_not_change_the_numbers_may_differ_on_resume(digits_fed, tmp_path):
    with pytest.raises(_Stop):
        FederatedTrainer(**_kw("random"), checkpoint_dir=tmp_path, checkpoint_every=2, n_threads=1,
                         callback=_stop_at(5)).fit(digits_fed)
    resumed = FederatedTrainer(**_kw("random"), checkpoint_dir=tmp_path, checkpoint_every=3, n_threads=2,
                               divergence=50.0).fit(digits_fed)
    assert resumed.history_ == FederatedTrainer(**_kw("random")).fit(digits_fed).history_


@pytest.mark.parametrize("damage", ["empty", "truncated", "flipped", "garbage"])
def test_an_unreadable_checkpoint_is_moved_aside_and_the_run_redone(damage, digits_fed, tmp_path):
    ref = FederatedTrainer(**_kw("random")).fit(digits_fed).history_
    FederatedTrainer(**_kw("random"), checkpoint_dir=tmp_path).fit(digits_fed)
    path = tmp_path / "checkpoint.pkl"
    data = path.read_bytes()
    path.write_bytes({"empty": b"", "truncated": data[: len(data) // 2],
                      "flipped": data[:-50] + bytes([data[-50] ^ 1]) + data[-49:], "garbage": b"not a pickle"}[damage])
    with pytest.warns(CorruptFileWarning, match=str(path)):
        again = FederatedTrainer(**_kw("random"), checkpoint_dir=tmp_path).fit(digits_fed)
    assert again.history_ == ref
    assert len(list(tmp_path.glob("checkpoint.pkl.corrupt-*"))) == 1
    assert read_checkpoint(path)["finished"]


def test_atomic_write_leaves_only_the_file(tmp_path):
    atomic_write_bytes(tmp_path / "a.bin", b"one")
    atomic_write_bytes(tmp_path / "a.bin", b"two")
    assert (tmp_path / "a.bin").read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["a.bin"]
    write_checkpoint(tmp_path / "c.pkl", {"x": 1})
    assert read_checkpoint(tmp_path / "c.pkl") == {"x": 1}
    assert read_checkpoint(tmp_path / "missing.pkl") is None


# -- divergence -----------------------------------------------------------------------


def test_a_huge_learning_rate_is_detected_as_divergence(digits_fed):
    tr = FederatedTrainer(rounds=10, lr=10.0, random_state=0)
    with pytest.raises(DivergenceError, match=r"diverged in round \d+ .*divergence=10") as info:
        tr.fit(digits_fed)
    err = info.value
    assert isinstance(err, FloatingPointError)
    assert err.test_loss > err.threshold
    assert tr.history_.rounds[-1].round == err.round  # the diverged round is recorded


def test_divergence_none_lets_a_finite_run_go_on(digits_fed):
    h = FederatedTrainer(rounds=3, lr=10.0, random_state=0, divergence=None).fit(digits_fed).history_
    assert len(h) == 3


def test_the_divergence_rule_does_not_touch_a_normal_run(digits_fed):
    a = FederatedTrainer(rounds=6, random_state=0).fit(digits_fed)
    b = FederatedTrainer(rounds=6, random_state=0, divergence=None).fit(digits_fed)
    assert a.history_ == b.history_


@pytest.mark.parametrize("bad", [1.0, 0, -3, float("nan"), "x"])
def test_bad_divergence_values_are_refused(bad, digits_fed):
    with pytest.raises(ValueError, match="divergence"):
        FederatedTrainer(rounds=1, divergence=bad).fit(digits_fed)


@pytest.mark.parametrize("bad", [0, -1, 2.5, None])
def test_bad_checkpoint_every_is_refused(bad, digits_fed, tmp_path):
    with pytest.raises(ValueError, match="checkpoint_every"):
        FederatedTrainer(rounds=1, checkpoint_dir=tmp_path, checkpoint_every=bad).fit(digits_fed)


def test_a_checkpoint_dir_that_is_a_file_is_refused(digits_fed, tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=r"checkpoint_dir.*not a directory"):
        FederatedTrainer(rounds=1, checkpoint_dir=tmp_path / "f").fit(digits_fed)


# -- kill -9 at random moments ----------------------------------------------------------

_CHILD = """
import json, sys
from fedselect import FederatedTrainer, get_selector, make_federation
name, params, ckpt, log, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
fed = make_federation("digits", partition="shards", n_clients=12, shards_per_client=2, random_state=0)
fh = open(log, "a")
fh.write("start\\n"); fh.flush()
def cb(trainer, record):
    fh.write(f"{record.round}\\n"); fh.flush()
kw = dict(selector=get_selector(name, **params), rounds=40, clients_per_round=3, local_steps=3, random_state=3,
          n_threads=1)
tr = FederatedTrainer(**kw, checkpoint_dir=None if ckpt == "-" else ckpt, checkpoint_every=4, callback=cb).fit(fed)
tr.history_.to_json(out)
"""


def _run_child(tmp: Path, name: str, ckpt: str, log: Path, out: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return subprocess.Popen([sys.executable, "-c", _CHILD, name, json.dumps(SELECTORS[name]), ckpt, str(log), str(out)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _rounds_logged(log: Path) -> list[list[int]]:
    """Per process start, the rounds it completed."""
    runs: list[list[int]] = []
    for line in log.read_text().split():
        if line == "start":
            runs.append([])
        else:
            runs[-1].append(int(line))
    return runs


@pytest.mark.parametrize("name", list(SELECTORS))
def test_kill_9_at_random_moments_then_the_same_call_equals_an_uninterrupted_run(name, digits_fed, tmp_path):
    rng = random.Random(f"kill-{name}")
    reference = FederatedTrainer(**{**_kw(name), "rounds": 40}).fit(digits_fed).history_
    ckpt, log, out = tmp_path / "ckpt", tmp_path / "run.log", tmp_path / "out.json"
    kills = 0
    for _ in range(4):
        started = len(_rounds_logged(log)) if log.exists() else 0
        p = _run_child(tmp_path, name, str(ckpt), log, out)
        # kill -9 at a random moment: a little after a randomly chosen round of this process completed
        goal = rng.randint(1, 9)
        deadline = time.monotonic() + 120
        while p.poll() is None and time.monotonic() < deadline:
            runs = _rounds_logged(log) if log.exists() else []
            if len(runs) > started and len(runs[-1]) >= goal:
                break
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.05))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            kills += 1
        p.wait(timeout=60)
        if out.exists():
            break
    assert kills >= 2, "the runs finished before they could be killed; make them longer"
    if not out.exists():
        p = _run_child(tmp_path, name, str(ckpt), log, out)
        assert p.wait(timeout=300) == 0, p.stderr.read().decode()
    assert History.from_json(out) == History.from_json(reference.to_json())
    runs = _rounds_logged(log)
    assert sum(1 for r in runs[:-1] if r) >= 2  # at least two kills landed during training
    for before, after in itertools.pairwise(runs):
        if before and after:  # rounds completed before the kill and run again after it
            redone = before[-1] + 1 - after[0]
            assert 0 <= redone <= 4, (before, after)


def test_resume_with_client_failures_equals_an_uninterrupted_run(digits_fed, tmp_path):
    kw = {**_kw("fedcor"), "client_dropout": 0.3}
    reference = FederatedTrainer(**kw).fit(digits_fed).history_
    assert any(r.failed for r in reference.rounds)
    with pytest.raises(_Stop):
        FederatedTrainer(**kw, checkpoint_dir=tmp_path, checkpoint_every=3, callback=_stop_at(8)).fit(digits_fed)
    assert FederatedTrainer(**kw, checkpoint_dir=tmp_path, checkpoint_every=3).fit(digits_fed).history_ == reference
    with pytest.raises(CheckpointMismatchError, match=r"trainer\.dropout: checkpoint 0\.3, now 0\.1"):
        FederatedTrainer(**{**kw, "client_dropout": 0.1}, checkpoint_dir=tmp_path).fit(digits_fed)
