"""The time-to-accuracy reproduction (benchmarks/reproductions/time/): its runner's records and its report.

A tiny clocked run (digits, 10 clients, 2 schemes x 2 seeds) goes through the runner (one time
budget, stop at the target, the round's over-commitment) and the report generator; the report's
logic (misses censored at one horizon, verdicts in rounds and in time, the equal over-commitment
claims) is checked on hand-made records whose answer is known.
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
    "rounds": 40,
    "local_steps": 2,
    "batch_size": 16,
}
TINY_CALIBRATION = {**TINY, "table": "calibration", "rounds": 4, "stop_at_target": False, "time_budget_factor": None}


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("time")
    logs: list[str] = []
    target = run.calibrate(root / "calibration.jsonl.gz", setting=TINY_CALIBRATION, seeds=[5, 6], log=logs.append)
    calib = run.read_records(root / "calibration.jsonl.gz")
    budget = run.time_budget_of(calib, target)
    records = run.run_table(
        TINY,
        ["random", "power-of-choice"],
        [0, 1],
        root / "main.jsonl.gz",
        target=target,
        time_budget=budget,
        log=logs.append,
    )
    return root, target, budget, records, logs


def test_runner_records_every_run_with_its_time_and_stops_at_the_target_or_the_budget(tiny_runs):
    _, target, budget, records, _ = tiny_runs
    assert sorted((r["scheme"], r["seed"]) for r in records) == [
        ("power-of-choice", 0),
        ("power-of-choice", 1),
        ("random", 0),
        ("random", 1),
    ]
    for r in records:
        n = r["rounds_run"]
        assert r["error"] is None and r["target"] == target and r["time_budget"] == budget
        assert len(r["sim_seconds"]) == len(r["question_seconds"]) == len(r["test_accuracy"]) == n
        assert r["commit"] and r["machine"]["torch_threads"] == 1 and r["started"] <= r["finished"]
        assert r["sim_total"] == pytest.approx(sum(r["sim_seconds"]), abs=1e-3)
        hit = next((i for i, a in enumerate(r["test_accuracy"]) if a >= target), None)
        if hit is None:
            assert r["rounds_to_target"] is None and r["time_to_target"] is None
            # no target: it ran until the first round ending at or past the budget (or the round cap)
            assert n == TINY["rounds"] or sum(r["sim_seconds"][:-1]) < budget <= r["sim_total"] + 1e-6
        else:
            assert r["rounds_to_target"] == hit + 1 == n  # stopped at the target
            assert r["time_to_target"] == pytest.approx(sum(r["sim_seconds"][: hit + 1]), abs=1e-3)
            assert sum(r["sim_seconds"][:-1]) < budget  # ... before the budget
        assert all(0 <= q <= s + 1e-9 for q, s in zip(r["question_seconds"], r["sim_seconds"]))
        # the round over-commits by 1.1 for every scheme: ceil(3.3) = 4 asked, the first 3 kept, 1 cut
        assert r["failed"] == [1] * n
    by = {(r["scheme"], r["seed"]): r for r in records}
    # random asks nothing before training; power-of-choice waits for its d candidates' losses, then trains
    assert all(by["random", s]["question_share"] == 0 for s in (0, 1))
    assert all(0 < by["power-of-choice", s]["question_share"] < 1 for s in (0, 1))


def test_a_run_stops_at_the_first_round_ending_past_the_budget_and_overcommitment_is_the_round_s():
    fed = run.build_federation(TINY, 0)
    free = run.run_cell(TINY, "random", 0, target=None, fed=fed, time_budget=None)
    assert free["rounds_run"] == TINY["rounds"]  # no target, no budget: the round cap
    budget = 0.3 * free["sim_total"]
    r = run.run_cell(TINY, "random", 0, target=None, fed=fed, time_budget=budget)
    assert sum(r["sim_seconds"][:-1]) < budget <= r["sim_total"] and r["rounds_run"] < TINY["rounds"]
    assert r["test_accuracy"] == free["test_accuracy"][: r["rounds_run"]]  # the same run, cut at the budget
    none = run.run_cell({**TINY, "overcommit": 1.0}, "random", 0, target=None, fed=fed, time_budget=budget)
    assert none["failed"] == [0] * none["rounds_run"] and r["failed"] == [1] * r["rounds_run"]
    fedscale = {**TINY, "overcommit": 1.3, "oort_variant": "fedscale"}
    oort = run.run_cell(fedscale, "oort", 0, target=None, fed=fed, time_budget=budget)
    assert oort["error"] is None and oort["params"]["variant"] == "fedscale" and oort["params"]["overcommit"] == 1.0
    assert oort["failed"] == [1] * oort["rounds_run"]  # ceil(1.3 x 3) = 4 asked by the round, not by Oort


def test_overcommit_params_and_scheme_params():
    assert run.overcommit_params(run.SETTING) == {"straggler_policy": "overselect", "overselect": 1.1}
    assert run.overcommit_params(run.NO_OVERCOMMIT_SETTING) == {"straggler_policy": "fail"}
    assert run.overcommit_params(run.FEDSCALE_SETTING) == {"straggler_policy": "overselect", "overselect": 1.3}
    with pytest.raises(ValueError, match="overcommit must be >= 1"):
        run.overcommit_params({"overcommit": 0.9})
    assert run.scheme_params("oort", run.SETTING) == {"samples_per_round": 320, "overcommit": 1.0}
    assert run.scheme_params("oort", run.FEDSCALE_SETTING) == {
        "samples_per_round": 320,
        "overcommit": 1.0,
        "variant": "fedscale",
    }
    assert run.scheme_params("deadline-random", run.DEADLINE_SETTING) == {"deadline": 10.0}
    assert run.scheme_params("deadline-random", run.SETTING) == {}


def test_runner_resumes_and_restores_the_clock(tiny_runs):
    from fedselect.clock import RoundClock, SimulatedClock

    root, target, budget, records, _ = tiny_runs
    logs: list[str] = []
    again = run.run_table(
        TINY,
        ["random", "power-of-choice"],
        [0, 1],
        root / "main.jsonl.gz",
        target=target,
        time_budget=budget,
        log=logs.append,
    )
    assert logs == [f"[tiny] 4 finished, 0 to run -> {root / 'main.jsonl.gz'}"]
    assert again == records
    assert RoundClock.settle.__name__ == "settle" and SimulatedClock.end_round.__name__ == "end_round"
    # another budget is another table: nothing resumed from these
    logs.clear()
    run.run_table(TINY, ["random"], [0], root / "other.jsonl.gz", target=target, time_budget=budget, log=logs.append)
    assert logs[0] == f"[tiny] 0 finished, 1 to run -> {root / 'other.jsonl.gz'}"
    # a torn last line (a kill mid-write) is skipped
    plain = root / "plain.jsonl"
    for rec in records:
        run.append_record(plain, rec)
    with open(plain, "a") as f:
        f.write('{"format": 1, "sch')
    assert run.read_records(plain) == records


def test_report_from_the_tiny_run(tiny_runs):
    root, target, budget, _, _ = tiny_runs
    path = rep.write_report(
        root,
        main_schemes=["random", "power-of-choice"],
        seeds=[0, 1],
        main_setting=TINY,
        side_tables=[("deadline.jsonl.gz", {**TINY, "table": "deadline", "deadline": 10.0})],
        calibration_setting=TINY_CALIBRATION,
    )
    text = path.read_text()
    assert text.startswith("# Time to accuracy")
    assert "4 of 4 runs of the main table finished." in text
    assert f"to the target {target:.3f} or to one time budget, H = {budget:.1f} simulated seconds" in text
    assert f"H = {budget:.1f} s (the time budget every run was given)" in text
    assert "pairs with information" in text and "| power-of-choice | 2 |" in text
    assert "Oort faster than random at equal over-commitment (1.1 for both, the main table): not tested" in text
    assert "## Side table `deadline` (`deadline.jsonl.gz`)\n\nNot run yet." in text
    for name in ("accuracy_time.png", "reached_time.png", "reached_rounds.png"):
        assert (root / name).stat().st_size > 1000


def test_builtin_selectors_are_the_registry_s_own():
    names = run.builtin_selectors()
    assert {"random", "oort", "deadline-random", "fedcor", "hcsfed", "ocs", "power-of-choice"} <= set(names)


# -------------------------------------------------------------------------- hand-made records

ROUNDS = 20
BUDGET = 400.0


def _record(scheme: str, seed: int, reach: int | None, per_round: float, *, rounds: int | None = None) -> dict:
    """A run that sits at 0.4 and reaches 0.6 at round ``reach`` (1-based; None: never), each round ``per_round`` s.

    It stops at the target, else after the first round ending at or past :data:`BUDGET` (or ``rounds``, as
    :mod:`time_run` runs do).
    """
    if reach is not None:
        n = reach
    else:
        n = rounds if rounds is not None else int(np.ceil(BUDGET / per_round))
    acc = [0.6 if reach is not None and t + 1 >= reach else 0.4 for t in range(n)]
    return {
        "scheme": scheme,
        "seed": seed,
        "setting": {"rounds": 1000, "n_clients": 10},
        "time_budget": BUDGET,
        "test_accuracy": acc,
        "sim_seconds": [per_round] * n,
        "rounds_run": n,
        "sim_total": per_round * n,
        "final_accuracy": acc[-1],
        "question_share": 0.0,
        "failed": [0] * n,
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


def _comp(recs, target=0.5):
    by: dict[str, list] = {}
    for r in recs:
        by.setdefault(r["scheme"], []).append(r)
    return rep.comparison_of(by, target)


def test_a_miss_is_censored_at_the_shared_horizon_not_at_its_own_end():
    # the case: a scheme that never reaches the target but whose runs end early must not look faster
    recs = [_record("random", s, 12, 10.0) for s in range(10)]  # hits at 120 s
    quitter = [_record("quitter", s, None, 5.0, rounds=20) for s in range(10)]  # misses, ends at 100 s
    row = rep.paired_rows(_comp(recs + quitter), "time")["quitter"]
    # H is what every run was observed for (100 s): random's hits after it are censored too, no pair informs
    assert row["horizon"] == 100.0 and row["informative"] == 0 and row["mean"] == 0
    assert rep.verdict(row) == "no verdict" and row["p"] != row["p"]
    # the same misses run to the budget: every pair informs, and the miss is slower, never faster
    misses = [_record("quitter", s, None, 7.0) for s in range(10)]  # the last round ends at 406 s, past the budget
    row = rep.paired_rows(_comp(recs + misses), "time")["quitter"]
    assert row["horizon"] == BUDGET and row["informative"] == 10 and rep.verdict(row) == "slower"
    assert all(d == pytest.approx(row["censored_value"] - 120.0) for d in row["diffs"])
    # two misses tie (no information); with fewer than min_pairs informative pairs there is no verdict
    mixed = [_record("quitter", s, None if s < 6 else 5, 5.0) for s in range(10)]
    rmiss = [_record("random", s, None if s < 6 else 12, 10.0) for s in range(10)]
    row = rep.paired_rows(_comp(rmiss + mixed), "time")["quitter"]
    assert row["both_censored"] == 6 and row["informative"] == 4 and rep.verdict(row) == "no verdict"
    line = rep.claim_line(_comp(rmiss + mixed), "quitter", "random", title="Q", family="one test")
    assert "**Q: no verdict (only 4 pair(s) carry information; 6 needed).**" in line
    assert "pairs with information 4 of 10" in line


def test_headline_names_the_verdicts_that_flip_between_rounds_and_time():
    comp = _comp(_handmade())
    rows_r, rows_t = rep.paired_rows(comp, "rounds"), rep.paired_rows(comp, "time")
    assert rows_r["fewrounds"]["mean"] == -5 and rows_t["fewrounds"]["mean"] > 0
    assert [rep.verdict(rows_r[k]) for k in ("fewrounds", "same", "oort")] == ["faster", "not different", "slower"]
    assert [rep.verdict(rows_t[k]) for k in ("fewrounds", "same", "oort")] == ["slower", "not different", "faster"]
    assert rep.ranking(comp, "rounds")[0] == "fewrounds" and rep.ranking(comp, "time")[0] == "oort"
    lines = rep.headline(comp)
    assert "rank the schemes differently" in lines[0]
    assert "fewrounds is faster in rounds (-5.0 rounds" in lines[1] and "but slower in time" in lines[1]
    assert "oort is slower in rounds" in lines[1] and "but faster in time" in lines[1]
    assert "same is" not in lines[1]


def test_headline_when_nothing_flips():
    lines = rep.headline(_comp([r for r in _handmade() if r["scheme"] in ("random", "same")]))
    assert "is the same in rounds and in time" in lines[1]


def test_where_time_goes_names_the_askers_and_the_quick():
    recs = _handmade()
    for r in recs:
        if r["scheme"] == "same":
            r["question_share"] = 0.4
    line = rep.where_time_goes(recs)
    assert "oracle questions takes 40 % (same) of the simulated time" in line
    assert "rounds last 5.0 s (oort) on average against random's 10.0 s" in line
    assert "fewrounds" not in line


def test_claim_reproduced_or_not_with_its_numbers():
    comp = _comp(_handmade())
    line = rep.claim_line(comp, "oort", "random", title="Oort", family="F")
    assert line.startswith("- **Oort: reproduces.**") and "pairs with information 10 of 10" in line
    t_random = np.mean([(10 + s % 3) * 10.0 for s in range(10)])
    t_oort = np.mean([(11 + s % 3) * 5.0 for s in range(10)])
    assert f"a speed-up of {t_random / t_oort:.2f}x" in line and "(F)" in line
    slow = rep.claim_line(_comp(_handmade(oort_per_round=20.0)), "oort", "random", title="Oort", family="F")
    assert "does not reproduce (oort is slower)" in slow
    assert "not tested" in rep.claim_line(_comp(_handmade()[:1]), "oort", "random", title="Oort", family="F")
    three = _comp([r for r in _handmade() if r["seed"] < 3])
    assert "no verdict (only 3 pair(s)" in rep.claim_line(three, "oort", "random", title="Oort", family="F")
    old = rep.claim_line(comp, "oort", "random", title="Old", family="one test", stored=2.63)
    assert "the stored report (commit a6bb7d5) said 2.63x" in old


def test_what_overcommitment_alone_buys_pairs_each_scheme_across_the_two_tables():
    main, none = [], []
    for s in range(10):
        main.append(_record("random", s, 10, 8.0))  # the round over-commits: shorter rounds
        none.append(_record("random", s, 10, 10.0))
        main.append(_record("oort", s, 11, 5.0))
        none.append(_record("oort", s, 11, 5.625))  # over-commitment buys Oort a little here
        main.append(_record("deadline-random", s, 10, 9.0))
    lines = rep.overcommit_alone(main, none, 0.5, ("random", "deadline-random", "oort"))
    assert len(lines) == 2  # deadline-random has no runs without over-commitment: not tested, not named
    assert lines[0].startswith("- **What over-commitment alone buys random (1.1 against 1.0, across two tables): ")
    assert "holds.**" in lines[0] and "a speed-up of 1.25x" in lines[0] and "Holm over random, oort" in lines[0]
    assert "holds.**" in lines[1] and "a speed-up of 1.12x" in lines[1]
    # one Holm family over the two: 2 / 2**10 each, adjusted x 2
    assert all("p = 0.002, p_Holm = 0.004 (Holm over random, oort)" in line for line in lines)
    assert "random @ 1.1 − random @ 1.0 -20 s" in lines[0]


def test_history_of_a_record_answers_like_the_run():
    r = _record("random", 0, 7, 3.0)
    h = rep.history_of(r)
    assert h.rounds_to_accuracy(0.5) == 7 and h.time_to_accuracy(0.5) == pytest.approx(21.0)
    assert h.config["trainer"] == {"rounds": 1000, "time_budget": BUDGET}
    bad = {**_record("random", 1, None, 3.0), "error": "DivergenceError: loss 1e9"}
    comp = rep.comparison_of({"random": [r], "x": [bad]}, 0.5)
    assert comp.failed["x"][1]["type"] == "DivergenceError" and 1 not in comp.histories["x"]


def test_identical_runs():
    recs = _handmade()
    assert not rep.identical_runs(recs, "same", "random")
    twin = [{**r, "scheme": "twin"} for r in recs if r["scheme"] == "random"]
    assert rep.identical_runs(recs + twin, "twin", "random")
    twin[3] = {**twin[3], "failed": [1] * len(twin[3]["failed"])}
    assert not rep.identical_runs(recs + twin, "twin", "random")
    assert not rep.identical_runs(recs, "nobody", "random")


def test_calibrated_target_is_what_every_run_reaches_in_the_first_half():
    recs = [{"test_accuracy": [0.5, 0.71, 0.9, 0.95]}, {"test_accuracy": [0.6, 0.737, 0.99, 0.99]}]
    assert run.calibrated_target(recs, rounds=4) == pytest.approx(0.71)  # the first 2 rounds of each
    assert run.calibrated_target(recs, rounds=4, grid=0.05) == pytest.approx(0.70)


def test_time_budget_is_the_factor_times_the_longest_calibration_time():
    recs = [
        {"seed": 0, "test_accuracy": [0.5, 0.8, 0.9], "sim_seconds": [10.0, 10.0, 10.0]},
        {"seed": 1, "test_accuracy": [0.5, 0.6, 0.85], "sim_seconds": [5.0, 5.0, 5.0]},
    ]
    assert run.time_budget_of(recs, 0.8) == 40.0 and run.time_budget_of(recs, 0.8, factor=3.0) == 60.0
    with pytest.raises(ValueError, match="seed 1 never reached"):
        run.time_budget_of(recs, 0.88)


def test_gzip_records_append_one_member_each_and_a_torn_member_is_skipped(tmp_path):
    path = tmp_path / "main.jsonl.gz"
    records = [{"format": run.FORMAT, "seed": s, "x": [0.5] * 50} for s in range(3)]
    for rec in records:
        run.append_record(path, rec)
    assert run.read_records(path) == records
    with open(path, "ab") as f:  # a kill in the middle of a fourth record's member
        f.write(gzip.compress(b'{"format": 1, "seed": 3}\n', mtime=0)[:15])
    assert run.read_records(path) == records


def test_headline_says_rounds_give_no_verdict_when_every_run_is_censored_at_the_rounds_horizon():
    recs = [_record("random", s, 10, 10.0) for s in range(10)]
    recs += [_record("slow", s, None, 100.0) for s in range(10)]  # misses, stopped by the budget after 4 rounds
    comp = _comp(recs)
    assert comp.horizon("rounds")[0] == 4.0
    lines = rep.headline(comp)
    assert lines[0].startswith("- **Rounds give no ranking and no verdict here**: every run is censored at the")
    assert (
        "round 4: the earliest end of a run that missed" in lines[0] and "set by slow seed 0, slow seed 1" in lines[0]
    )
    assert lines[0].endswith("By simulated time: random, slow.")
    assert rep.verdict(rep.paired_rows(comp, "time")["slow"]) == "slower"
