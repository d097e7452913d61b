"""A comparison with batched seeds (``batch_seeds`` / ``--batch-seeds``).

What a user relies on: the same result files, keys and resume as one run at a time (histories
equal up to float rounding, identical for a model-independent selector), a run's file written
when it ends, and batches on worker processes with ``jobs``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedselect.compare import _batches, resolve_batch_seeds, run_comparison

FEDERATION = {"dataset": "digits", "partition": "dirichlet", "alpha": 0.5, "n_clients": 10}
TRAINER = {"rounds": 4, "clients_per_round": 3, "local_epochs": 1, "batch_size": 16, "n_threads": 1,
           "model_params": {"dropout": 0.3}}
SCHEMES = {"random": ("random", {}), "poc": ("power-of-choice", {"d": 6})}
SEEDS = (0, 1, 2)


def _compare(out, *, notes=None, **kw):
    kw.setdefault("progress", False)
    return run_comparison(SCHEMES, federation=FEDERATION, trainer=TRAINER, seeds=SEEDS, target=0.3, out_dir=out,
                          log=notes.append if notes is not None else (lambda m: None), command=["test"], **kw)


def _files(out: Path) -> dict[str, dict]:
    files = {}
    for path in sorted((out / "runs").glob("*.json")):
        d = json.loads(path.read_text())
        files[path.name] = {"key": d["key"], "settings": d["settings"], "status": d["status"],
                            "rounds": [(r["clients"], r["test_accuracy"], r["test_loss"]) for r in
                                       d["history"]["rounds"]],
                            "batch_seeds": d["machine"].get("batch_seeds")}
    return files


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    out = tmp_path_factory.mktemp("serial")
    return _compare(out), out


def _assert_same(a: dict[str, dict], b: dict[str, dict], batch: int | None) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name]["key"] == b[name]["key"] and a[name]["settings"] == b[name]["settings"]  # keys: batch-free
        ra, rb = a[name]["rounds"], b[name]["rounds"]
        assert [r[0] for r in ra] == [r[0] for r in rb]  # the same clients, round by round
        np.testing.assert_allclose([r[1:] for r in ra], [r[1:] for r in rb], rtol=1e-5, atol=1e-6)
        assert (a[name]["batch_seeds"], b[name]["batch_seeds"]) == (None, batch)


def test_batched_seeds_write_the_serial_results(serial, tmp_path):
    _, out1 = serial
    notes: list[str] = []
    comp2 = _compare(tmp_path, batch_seeds=True, notes=notes)
    assert notes == []  # every run was batched: no note of a run training alone
    _assert_same(_files(out1), _files(tmp_path), 3)
    assert list(comp2.histories["poc"]) == list(SEEDS)
    assert not (tmp_path / "checkpoints").exists()


def test_a_batched_grid_resumes_only_the_missing_runs(serial, tmp_path):
    _, out1 = serial
    _compare(tmp_path, batch_seeds=2)
    for name in ("poc__seed1.json", "poc__seed2.json", "random__seed0.json"):
        (tmp_path / "runs" / name).unlink()
    notes: list[str] = []
    _compare(tmp_path, batch_seeds=2, notes=notes, progress=True)
    assert notes[0] == "resuming: 3 finished run(s) loaded, 3 to run"
    assert sorted(n.split(":")[0] for n in notes[1:]) == ["[1/3] random seed 0", "[2/3] poc seed 1",
                                                          "[3/3] poc seed 2"]
    got = _files(tmp_path)
    assert got["poc__seed1.json"]["batch_seeds"] == 2 and got["random__seed0.json"]["batch_seeds"] is None
    want = _files(out1)
    for files in (got, want):
        for d in files.values():
            d["batch_seeds"] = None
    _assert_same(want, got, None)


def test_batches_on_worker_processes(serial, tmp_path):
    _, out1 = serial
    _compare(tmp_path, batch_seeds=True, jobs=2)
    _assert_same(_files(out1), _files(tmp_path), 3)


def test_batches_group_one_label_by_chunks_of_seeds():
    todo = [(seed, label) for seed in (0, 1, 2, 3, 4) for label in ("a", "b")]
    groups = _batches(todo, 2)
    assert [[todo[i] for i in g] for g in groups] == [
        [(0, "a"), (1, "a")], [(0, "b"), (1, "b")], [(2, "a"), (3, "a")], [(2, "b"), (3, "b")], [(4, "a")],
        [(4, "b")]]


@pytest.mark.parametrize("value, size", [(False, 1), (None, 1), (0, 1), (1, 1), (True, 3), (2, 2), (10, 3)])
def test_batch_seeds_values(value, size):
    assert resolve_batch_seeds(value, 3) == size


@pytest.mark.parametrize("value", [-1, 2.5, "all"])
def test_a_bad_batch_seeds_is_an_error_naming_it(value):
    with pytest.raises(ValueError, match=r"batch_seeds=.* must be False \(off\), True"):
        resolve_batch_seeds(value, 3)


def test_ray_ignores_batch_seeds_with_a_note(monkeypatch, tmp_path):
    from fedselect import _grid

    def no_ray(*a, **k):
        raise RuntimeError("stop here")

    monkeypatch.setattr(_grid, "prepare", no_ray)
    notes: list[str] = []
    with pytest.raises(RuntimeError, match="stop here"):
        _compare(tmp_path, batch_seeds=True, ray_address="local", notes=notes)
    assert notes == ["batch_seeds=True is ignored with ray_address: each run is a Ray task of its own"]


def test_cli_batch_seeds(tmp_path, monkeypatch):
    from fedselect import compare
    from fedselect.cli import build_parser, main

    parse = build_parser().parse_args
    assert parse(["compare"]).batch_seeds is False
    assert parse(["compare", "--batch-seeds"]).batch_seeds is True
    assert parse(["reproduce", "digits-quick", "--batch-seeds", "4"]).batch_seeds == 4
    seen = {}
    real = compare.run_comparison

    def spy(*a, **kw):
        seen["batch_seeds"] = kw["batch_seeds"]
        return real(*a, **kw)

    monkeypatch.setattr(compare, "run_comparison", spy)
    out = tmp_path / "out"
    assert main(["compare", "--selectors", "random", "--seeds", "0", "1", "--rounds", "2", "--batch-seeds",
                 "--no-progress", "--out", str(out)]) == 0
    assert seen == {"batch_seeds": True}
    assert {json.loads(p.read_text())["machine"]["batch_seeds"] for p in (out / "runs").glob("*.json")} == {2}


def test_federations_of_one_recipe_share_their_data_arrays():
    import dataclasses

    from fedselect.compare import share_pools
    from fedselect.data import make_federation

    feds = [make_federation(**FEDERATION, random_state=s) for s in SEEDS]
    iid = make_federation("digits", partition="iid", n_clients=10, holdout=0.5, random_state=0)  # same pool
    other = dataclasses.replace(feds[0], X=feds[0].X * 2)  # other data
    assert feds[0].X is not feds[1].X
    shared = share_pools([*feds, iid, other])
    assert shared[1].X is shared[0].X and shared[2].X_test is shared[0].X_test and shared[3].X is shared[0].X
    assert shared[4].X is other.X
    for a, b in zip([*feds, iid], shared):  # the same federations: data and client split
        assert all(np.array_equal(x, y) for x, y in zip(a.client_indices, b.client_indices))
        assert np.array_equal(a.X, b.X) and a.metadata == b.metadata
