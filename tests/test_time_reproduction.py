"""The time-to-accuracy reproduction (benchmarks/reproductions/time/): its runner's records and its report.

A tiny clocked run (digits, 10 clients, 2 schemes x 2 seeds x 3 rounds) goes through the runner and
the report generator; the report's headline logic (verdicts in rounds and in time, the flips, Oort's
claim) is checked on hand-made records whose answer is known.
"""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from benchmarks.reproductions.time import time_report as rep
from benchmarks.reproductions.time import time_run as run

TINY = {
    **run.SETTING,
    "table": "tiny",
    "dataset": "digits",
    "partition": "iid",
    "partition_params": {},
    "n_clients": 10,
    "clients_per_round": 3,
    "rounds": 3,
    "local_steps": 2,
    "batch_size": 16,
}


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("time")
    logs: list[str] = []
    calib = {**TINY, "table": "calibration"}
    target = run.calibrate(root / "calibration.jsonl.gz", setting=calib, seeds=[5, 6], log=logs.append)
    records = run.run_table(
        TINY, ["random", "power-of-choice"], [0, 1], root / "main.jsonl.gz", target=target, log=logs.append
    )
    return root, target, records, logs


def test_runner_records_every_run_with_its_time(tiny_runs):
    _, target, records, _ = tiny_runs
    assert sorted((r["scheme"], r["seed"]) for r in records) == [
        ("power-of-choice", 0),
        ("power-of-choice", 1),
        ("random", 0),
        ("random", 1),
    ]
    for r in records:
        assert r["error"] is None and r["rounds_run"] == 3 and r["target"] == target
        assert len(r["sim_seconds"]) == len(r["question_seconds"]) == len(r["test_accuracy"]) == 3
        assert r["commit"] and r["machine"]["torch_threads"] == 1 and r["started"] <= r["finished"]
        assert r["sim_total"] == pytest.approx(sum(r["sim_seconds"]), abs=1e-3)
        hit = next((i for i, a in enumerate(r["test_accuracy"]) if a >= target), None)
        if hit is None:
            assert r["rounds_to_target"] is None and r["time_to_target"] is None
        else:
            assert r["rounds_to_target"] == hit + 1
            assert r["time_to_target"] == pytest.approx(sum(r["sim_seconds"][: hit + 1]), abs=1e-3)
        assert all(0 <= q <= s + 1e-9 for q, s in zip(r["question_seconds"], r["sim_seconds"]))
    by = {(r["scheme"], r["seed"]): r for r in records}
    # random asks nothing before training; power-of-choice waits for its d candidates' losses, then trains
    assert all(by["random", s]["question_share"] == 0 for s in (0, 1))
    assert all(0 < by["power-of-choice", s]["question_share"] < 1 for s in (0, 1))


def test_runner_resumes_and_restores_the_clock(tiny_runs):
    from fedselect.clock import RoundClock, SimulatedClock

    root, target, records, _ = tiny_runs
    logs: list[str] = []
    again = run.run_table(
        TINY, ["random", "power-of-choice"], [0, 1], root / "main.jsonl.gz", target=target, log=logs.append
    )
    assert logs == [f"[tiny] 4 finished, 0 to run -> {root / 'main.jsonl.gz'}"]
    assert again == records
    assert RoundClock.settle.__name__ == "settle" and SimulatedClock.end_round.__name__ == "end_round"
    # a torn last line (a kill mid-write) is skipped
    plain = root / "plain.jsonl"
    for rec in records:
        run.append_record(plain, rec)
    with open(plain, "a") as f:
        f.write('{"format": 1, "sch')
    assert run.read_records(plain) == records


def test_report_from_the_tiny_run(tiny_runs):
    root, target, _, _ = tiny_runs
    path = rep.write_report(
        root,
        main_schemes=["random", "power-of-choice"],
        seeds=[0, 1],
        main_setting=TINY,
        side_tables=[("deadline.jsonl.gz", {**TINY, "table": "deadline", "deadline": 10.0})],
    )
    text = path.read_text()
    assert text.startswith("# Time to accuracy")
    assert "4 of 4 runs of the main table finished." in text
    assert f"Target {target:.3f}" in text
    assert "| random | 2/10 |" not in text and "| random | 2/2 |" in text
    assert "### Paired against random: simulated seconds" in text and "| power-of-choice | 2 |" in text
    assert "## Side table: with a 10 s deadline, profiles not known (`deadline.jsonl.gz`)\n\nNot run yet." in text
    assert (root / "accuracy_time.png").stat().st_size > 1000
    assert (root / "accuracy_rounds.png").stat().st_size > 1000


def test_builtin_selectors_are_the_registry_s_own():
    names = run.builtin_selectors()
    assert {"random", "oort", "deadline-random", "fedcor", "hcsfed", "ocs", "power-of-choice"} <= set(names)
    assert run.scheme_params("oort", run.SETTING) == {"samples_per_round": 320}
    assert run.scheme_params("deadline-random", run.DEADLINE_SETTING) == {"deadline": 10.0}
    assert run.scheme_params("deadline-random", run.SETTING) == {}


# -------------------------------------------------------------------------- hand-made records

ROUNDS = 20


def _record(scheme: str, seed: int, reach: int | None, per_round: float) -> dict:
    """A run that sits at 0.4 and reaches 0.6 at round ``reach`` (1-based; None: never), each round ``per_round`` s."""
    acc = [0.6 if reach is not None and t + 1 >= reach else 0.4 for t in range(ROUNDS)]
    return {
        "scheme": scheme,
        "seed": seed,
        "test_accuracy": acc,
        "sim_seconds": [per_round] * ROUNDS,
        "rounds_run": ROUNDS,
        "sim_total": per_round * ROUNDS,
        "final_accuracy": acc[-1],
        "question_share": 0.0,
        "failed": [0] * ROUNDS,
        "cpu_seconds": 1.0,
        "error": None,
    }


def _handmade(oort_per_round: float = 5.0) -> list[dict]:
    recs = []
    for s in range(10):
        base = 10 + s % 3
        recs.append(_record("random", s, base, 10.0))
        recs.append(_record("fewrounds", s, base - 5, 40.0))  # fewer rounds, each much longer
        recs.append(_record("same", s, base + (1 if s % 2 else -1), 10.0))  # no difference either way
        recs.append(_record("oort", s, base + 1, oort_per_round))  # one round more, each half as long
    return recs


def test_cell_values_count_a_miss_as_a_lower_bound():
    v = rep.cell_values([_record("a", 0, 7, 3.0), _record("b", 0, None, 2.0)], 0.5)
    assert v["a"][0]["reached"] and v["a"][0]["rounds"] == 7 and v["a"][0]["time"] == pytest.approx(21.0)
    assert not v["b"][0]["reached"] and v["b"][0]["rounds"] == ROUNDS + 1 and v["b"][0]["time"] == 40.0


def test_headline_names_the_verdicts_that_flip_between_rounds_and_time():
    values = rep.cell_values(_handmade(), 0.5)
    rows_r = {r["scheme"]: r for r in rep.paired_vs(values, "rounds")}
    rows_t = {r["scheme"]: r for r in rep.paired_vs(values, "time")}
    assert rows_r["fewrounds"]["mean"] == -5 and rows_t["fewrounds"]["mean"] > 0
    assert [rep.verdict(rows_r[k]) for k in ("fewrounds", "same", "oort")] == ["faster", "not different", "slower"]
    assert [rep.verdict(rows_t[k]) for k in ("fewrounds", "same", "oort")] == ["slower", "not different", "faster"]
    assert rep.ranking(values, "rounds")[0] == "fewrounds" and rep.ranking(values, "time")[0] == "oort"
    lines = rep.headline(values)
    assert "rank the schemes differently" in lines[0]
    assert "fewrounds is faster in rounds (-5.0 rounds" in lines[1] and "but slower in time" in lines[1]
    assert "oort is slower in rounds" in lines[1] and "but faster in time" in lines[1]
    assert "same is" not in lines[1]


def test_headline_when_nothing_flips():
    recs = [r for r in _handmade() if r["scheme"] in ("random", "same")]
    lines = rep.headline(rep.cell_values(recs, 0.5))
    assert "is the same in rounds and in time" in lines[1]


def test_where_time_goes_names_the_askers_and_the_quick():
    recs = _handmade()
    for r in recs:
        if r["scheme"] == "same":
            r["question_share"] = 0.4
    line = rep.where_time_goes(rep.cell_values(recs, 0.5))
    assert "oracle questions takes 40 % (same) of the simulated time" in line
    assert "rounds last 5.0 s (oort) on average against random's 10.0 s" in line
    assert "fewrounds" not in line


def test_oort_claim_reproduced_or_not_with_its_numbers():
    line = rep.oort_claim(rep.cell_values(_handmade(), 0.5))
    assert "reproduced.**" in line and "not reproduced" not in line
    t_random = np.mean([(10 + s % 3) * 10.0 for s in range(10)])
    t_oort = np.mean([(11 + s % 3) * 5.0 for s in range(10)])
    assert f"a speed-up of {t_random / t_oort:.2f}x" in line
    slow = rep.oort_claim(rep.cell_values(_handmade(oort_per_round=20.0), 0.5))
    assert "not reproduced (Oort is slower)" in slow
    assert "not tested" in rep.oort_claim(rep.cell_values(_handmade()[:1], 0.5))
    assert "can reach" not in line
    three = rep.oort_claim(rep.cell_values([r for r in _handmade() if r["seed"] < 3], 0.5))
    assert "not reproduced (no significant difference)" in three and "With 3 seed(s) no paired difference" in three


def test_versus_pairs_two_schemes_in_time():
    line = rep.versus(rep.cell_values(_handmade(), 0.5), "oort", "fewrounds")
    assert "oort − fewrounds -" in line and "oort faster on 10, slower on 0" in line and line.endswith(": faster.")
    assert "not tested" in rep.versus(rep.cell_values(_handmade(), 0.5), "oort", "deadline-random")


def test_identical_runs():
    recs = _handmade()
    assert not rep.identical_runs(recs, "same", "random")
    twin = [{**r, "scheme": "twin"} for r in recs if r["scheme"] == "random"]
    assert rep.identical_runs(recs + twin, "twin", "random")
    twin[3] = {**twin[3], "failed": [1] * ROUNDS}
    assert not rep.identical_runs(recs + twin, "twin", "random")
    assert not rep.identical_runs(recs, "nobody", "random")


def test_calibrated_target_is_what_every_run_reaches_in_the_first_half():
    recs = [{"test_accuracy": [0.5, 0.71, 0.9, 0.95]}, {"test_accuracy": [0.6, 0.737, 0.99, 0.99]}]
    assert run.calibrated_target(recs, rounds=4) == pytest.approx(0.71)  # the first 2 rounds of each
    assert run.calibrated_target(recs, rounds=4, grid=0.05) == pytest.approx(0.70)


def test_gzip_records_append_one_member_each_and_a_torn_member_is_skipped(tmp_path):
    path = tmp_path / "main.jsonl.gz"
    records = [{"format": run.FORMAT, "seed": s, "x": [0.5] * 50} for s in range(3)]
    for rec in records:
        run.append_record(path, rec)
    assert run.read_records(path) == records
    with open(path, "ab") as f:  # a kill in the middle of a fourth record's member
        f.write(gzip.compress(b'{"format": 1, "seed": 3}\n', mtime=0)[:15])
    assert run.read_records(path) == records
