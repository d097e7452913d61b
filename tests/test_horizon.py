"""One horizon for every scheme (issue 33, item 1): time budgets, censored paired tests, pictures of what happened."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fedselect.compare import Comparison
from fedselect.simulation.costs import Costs
from fedselect.simulation.history import History, RoundRecord


def _run(accuracies, seconds_per_round, *, rounds=None, time_budget=None):
    """A clocked run: round t ends at (t + 1) x seconds_per_round; ``rounds``/``time_budget``: its recorded settings."""
    records = [
        RoundRecord(
            round=t,
            clients=[0],
            weights=[1.0],
            lr=0.1,
            test_accuracy=a,
            costs=Costs(models_down=1),
            sim_seconds=float(seconds_per_round),
            sim_time=float(seconds_per_round * (t + 1)),
        )
        for t, a in enumerate(accuracies)
    ]
    trainer = {"rounds": rounds if rounds is not None else len(accuracies), "time_budget": time_budget}
    return History(records, model_size=10, config={"trainer": trainer})


def _deadline_random_like(seeds=8):
    """random reaches 80 % at round 8 (80 s) on every seed; "fast" picks fast clients, spends its 10 rounds by 30 s
    and reaches 80 % only on seed 0 (round 9, 27 s), as deadline-random did in the issue."""
    hit = [0.1] * 7 + [0.85, 0.86, 0.87]
    return Comparison(
        {
            "random": {s: _run(hit, 10.0) for s in range(seeds)},
            "fast": {s: _run([0.1] * 8 + ([0.85, 0.9] if s == 0 else [0.2, 0.3]), 3.0) for s in range(seeds)},
        },
        target=0.8,
        n_clients=1,
    )


def test_a_scheme_that_ends_early_and_mostly_misses_is_not_called_faster():
    comp = _deadline_random_like()
    (fast,) = comp.paired("random", metric="time")
    # Today's rule counted fast's misses at 30 x 11 / 10 = 33 s, below random's hits at 80 s: "faster on 8 of 8,
    # p = 0.008". No scheme was observed past 30 s, so random's hits there are censored like fast's misses.
    assert fast["horizon"] == 30.0
    assert fast["slower"] < 8 and fast["informative"] == 1 and fast["both_censored"] == 7
    assert not fast["verdict"] and math.isnan(fast["p"]) and math.isnan(fast["p_holm"])
    md = comp.paired_markdown("random", metric="time")
    assert "| - | - | 1 of 8 |" in md and "No verdict" in md and "fast (1 of 8)" in md
    assert "Horizon H = 30.0 simulated s for every scheme" in md


def test_with_a_common_time_budget_the_misses_tie_above_every_hit():
    hit = [0.1] * 7 + [0.85] + [0.86] * 3  # 80 s, then on to the 100 s budget
    comp = Comparison(
        {
            "random": {s: _run(hit[:10], 10.0, rounds=50, time_budget=100.0) for s in range(8)},
            "fast": {
                s: _run([0.1] * 8 + [0.85] + [0.9] * 25 if s == 0 else [0.1] * 34, 3.0, rounds=50, time_budget=100.0)
                for s in range(8)
            },
        },
        target=0.8,
        n_clients=1,
    )
    assert comp.horizon("time") == (100.0, "the time budget every run was given")
    (fast,) = comp.paired("random", metric="time")
    # C = H + the median round (3 s): seed 0 fast hit at 27 s against 80 s; seeds 1-7 fast censored (103) against 80
    assert fast["censored_value"] == 103.0
    assert fast["diffs"] == [27.0 - 80.0] + [23.0] * 7
    assert (fast["faster"], fast["slower"], fast["informative"], fast["verdict"]) == (7, 1, 8, True)
    assert fast["mean"] > 0  # random is the faster scheme, as its hits say


def test_no_hit_anywhere_gives_no_p_value():
    comp = Comparison(
        {
            "random": {s: _run([0.1] * 10, 10.0) for s in range(8)},  # ends at 100 s
            "fast": {s: _run([0.2] * 10, 3.0) for s in range(8)},  # ends at 30 s
        },
        target=0.8,
        n_clients=1,
    )
    (row,) = comp.paired("random", metric="time")
    # today: 33 s against 110 s on every seed, p = 0.008; every pair is two censored runs: no information
    assert row["informative"] == 0 and row["diffs"] == [0.0] * 8
    assert math.isnan(row["p"]) and not row["verdict"]
    (rounds,) = comp.paired("random")
    assert rounds["informative"] == 0 and math.isnan(rounds["p"])
    assert "| - | - | 0 of 8 |" in comp.paired_markdown("random", metric="time")


def test_a_run_that_stopped_early_is_censored_at_the_shared_horizon_not_at_its_own_end():
    # On rounds the horizon is the round budget (20): a miss that ran it counts 21, as always, and a run that
    # stopped at its target (round 3 of 20) is a hit, not a horizon.
    comp = Comparison(
        {
            "random": {s: _run([0.1] * 11 + [0.9], 10.0, rounds=20) for s in range(6)},
            "quick": {s: _run([0.1, 0.1, 0.9], 10.0, rounds=20) for s in range(6)},
            "missing": {s: _run([0.1] * 20, 10.0, rounds=20) for s in range(6)},
        },
        target=0.8,
        n_clients=1,
    )
    assert comp.horizon("rounds") == (20.0, "the round budget")
    rows = {r["scheme"]: r for r in comp.paired("random")}
    assert rows["quick"]["diffs"] == [3.0 - 12.0] * 6 and rows["missing"]["diffs"] == [21.0 - 12.0] * 6
    # "budgeted" stopped after 6 of its 20 rounds (a time budget) without reaching the target, while random reached
    # it in round 12: today "budgeted" counted 7 rounds and was faster on every seed. Nobody was observed to round 12
    # in it, so the round horizon is 6, random's hits lie past it, and no pair carries information.
    comp.histories["budgeted"] = {s: _run([0.1] * 6, 10.0, rounds=20, time_budget=60.0) for s in range(6)}
    assert comp.horizon("rounds")[0] == 6.0
    budgeted = {r["scheme"]: r for r in comp.paired("random")}["budgeted"]
    assert budgeted["diffs"] == [0.0] * 6 and budgeted["informative"] == 0 and not budgeted["verdict"]


def test_a_diverged_run_counts_as_a_miss_at_the_round_budget_not_at_the_longest_run():
    # random stops at its target in round 12 of a 20-round budget; "div" diverged on every seed (no history)
    failure = {"type": "DivergenceError", "message": "the loss is nan", "round": 3, "rounds_completed": 3}
    comp = Comparison(
        {"random": {s: _run([0.1] * 11 + [0.9], 10.0, rounds=20) for s in range(6)}, "div": {}},
        target=0.8,
        n_clients=1,
        failed={"div": {s: dict(failure) for s in range(6)}},
    )
    (row,) = comp.paired("random", diverged="not-reached")
    assert row["diffs"] == [21.0 - 12.0] * 6  # today: the longest run (12) + 1 = 13, one round behind random


def test_a_run_that_stopped_at_its_target_does_not_lower_the_time_horizon():
    comp = Comparison(
        {
            "quick": {s: _run([0.1, 0.9], 10.0, rounds=10) for s in range(6)},  # stops at the target at 20 s
            "slow": {s: _run([0.1] * 10, 10.0) for s in range(6)},  # misses, observed to 100 s
        },
        target=0.8,
        n_clients=1,
    )
    assert comp.horizon("time")[0] == 100.0
    (row,) = comp.paired("quick", metric="time")
    assert row["diffs"] == [110.0 - 20.0] * 6 and row["verdict"] and row["p"] < 0.05


def test_the_horizon_is_one_for_every_scheme_and_every_report(tmp_path):
    comp = _deadline_random_like()
    comp.histories["third"] = {s: _run([0.1] * 20, 5.0) for s in range(8)}  # a miss observed to 100 s
    rows = comp.paired("random", metric="time")
    assert {r["horizon"] for r in rows} == {30.0} and {r["censored_value"] for r in rows} == {rows[0]["censored_value"]}
    assert {r["time_horizon"] for r in comp.rows()} == {30.0}
    assert comp.paired("random", metric="time", horizon=90.0)[0]["horizon"] == 90.0
    assert [r["horizon"] for r in comp.paired("random", metric="time", horizon=90.0)] == [90.0, 90.0]
    comp.write(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["horizon"]["time"] == 30.0 and summary["horizon"]["rounds"] == 10.0
    assert "H = 30.0 simulated s" in (tmp_path / "table.md").read_text()
    assert "(the earliest end of a run that missed the target" in comp.paired_report("random")
    with pytest.raises(ValueError, match="min_pairs=0"):
        comp.paired("random", min_pairs=0)


def test_min_pairs_decides_whether_a_row_is_in_holms_family():
    ref = {s: _run([0.1, 0.9], 1.0) for s in range(5)}
    slow = {s: _run([0.1, 0.2, 0.9], 1.0) for s in range(5)}
    comp = Comparison({"ref": ref, "slow": slow}, target=0.8, n_clients=1)
    (row,) = comp.paired("ref")
    assert row["informative"] == 5 and not row["verdict"] and math.isnan(row["p_holm"])  # 5 < 6: no verdict
    (row,) = comp.paired("ref", min_pairs=5)
    assert row["verdict"] and row["p"] == pytest.approx(2 / 2**5)


def test_reached_fraction_steps_by_hand():
    from fedselect.plotting import reached_fraction

    runs = [_run([0.1, 0.9], 10.0), _run([0.1, 0.2, 0.3, 0.85], 10.0), _run([0.1] * 3, 10.0)]
    xs, frac = reached_fraction(runs, 0.8)
    assert xs.tolist() == [0.0, 2.0, 4.0] and frac == pytest.approx([0, 1 / 3, 2 / 3])
    xs, frac = reached_fraction(runs, 0.8, x="time", n_failed=1)  # a failed run counts, never reaching it
    assert xs.tolist() == [0.0, 20.0, 40.0] and frac == pytest.approx([0, 0.25, 0.5])


def test_the_comparison_draws_the_fraction_at_the_target_against_rounds_and_time(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedselect.plotting import plot_reached

    comp = _deadline_random_like()
    names = [p.name for p in comp.plot(tmp_path)]
    assert "reached.png" in names and "reached_time.png" in names
    assert (tmp_path / "reached_time.png").stat().st_size > 0
    res = {k: [v[s] for s in sorted(v)] for k, v in comp.histories.items()}
    ax = plot_reached(res, 0.8, x="time", horizon=30.0)
    try:
        lines = {ln.get_label(): ln for ln in ax.lines}
        fast = lines["fast (n=8)"]
        assert fast.get_xdata().tolist() == [0.0, 27.0, 30.0] and fast.get_ydata().tolist() == [0, 1 / 8, 1 / 8]
        random = lines["random (n=8)"]
        assert random.get_xdata().tolist() == [0.0, 80.0, 100.0] and random.get_ydata().tolist() == [0, 1, 1]
        assert lines["horizon H = 30 s"].get_xdata()[0] == 30.0
    finally:
        plt.close(ax.figure)


# -- the trainer's time budget ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mobile():
    from fedselect.data import make_federation

    return make_federation(n_clients=10, random_state=0, profiles="mobile")


def _trainer(**kw):
    from fedselect import FederatedTrainer

    return FederatedTrainer(rounds=12, clients_per_round=3, model="logistic", local_steps=2, random_state=0, **kw)


def test_a_time_budget_stops_after_the_first_round_that_reaches_it(mobile):
    full = _trainer().fit(mobile).history_
    ends = [r.sim_time for r in full.rounds]
    budget = (ends[3] + ends[4]) / 2  # inside round 4
    cut = _trainer(time_budget=budget).fit(mobile).history_
    assert len(cut) == 5 and cut.rounds[-1].sim_time >= budget > cut.rounds[-2].sim_time
    assert cut.rounds == full.rounds[:5]  # the same rounds, bit for bit, up to the stop
    assert cut.config["trainer"]["time_budget"] == budget
    assert len(_trainer(time_budget=1e9).fit(mobile).history_) == 12  # the round cap still applies


def test_a_time_budget_needs_a_clock_and_a_positive_number(mobile):
    from fedselect.data import make_federation

    plain = make_federation(n_clients=10, random_state=0)
    with pytest.raises(ValueError, match=r"time_budget=10\.0 needs a clock"):
        _trainer(time_budget=10.0, clock=False).fit(plain)
    # without profiles the default clock (homogeneous devices, recording only) keeps the time a budget reads
    ran = _trainer(time_budget=1e-9).fit(plain).history_
    assert len(ran) == 1 and ran.rounds[-1].sim_time >= 1e-9
    for bad in (0, -1.0, "10"):
        with pytest.raises(ValueError, match="time_budget"):
            _trainer(time_budget=bad).fit(mobile)


def test_a_time_budget_left_unset_keeps_stored_keys():
    from fedselect.experiments import provenance

    assert provenance.ADDED_LATER["fedselect.simulation.trainer:FederatedTrainer"]["time_budget"] is None
    plain = provenance.trainer_identity(_trainer())
    assert "time_budget" not in plain and provenance.trainer_identity(_trainer(time_budget=None)) == plain
    assert provenance.trainer_identity(_trainer(time_budget=50.0))["time_budget"] == 50.0


def test_run_comparison_gives_every_scheme_the_budget():
    from fedselect.compare import run_comparison

    comp = run_comparison(
        ["random", "round-robin"],
        federation={"dataset": "digits", "n_clients": 10, "profiles": "mobile"},
        trainer={"rounds": 30, "clients_per_round": 3, "model": "logistic", "local_steps": 2},
        seeds=[0],
        target=0.99,
        progress=False,
        time_budget=40.0,
    )
    for runs in comp.histories.values():
        h = runs[0]
        assert h.config["trainer"]["time_budget"] == 40.0 and h.rounds[-1].sim_time >= 40.0 > h.rounds[-2].sim_time
    assert comp.horizon("time") == (40.0, "the time budget every run was given")
    with pytest.raises(ValueError, match="disagree"):
        run_comparison(["random"], federation={"n_clients": 4}, trainer={"time_budget": 5.0}, time_budget=6.0)
    assert np.isfinite(comp.horizon("rounds")[0])


def test_the_command_line_gives_every_scheme_the_time_budget_and_states_the_horizon(tmp_path, capsys):
    from fedselect.cli import main

    args = ["compare", "--preset", "none", "--selectors", "random", "round-robin", "--seeds", "0", "1"]
    args += ["--n-clients", "8", "--clients-per-round", "2", "--rounds", "200", "--model", "logistic"]
    args += ["--local-steps", "2", "--profiles", "mobile", "--time-budget", "30", "--target", "0.99"]
    assert main([*args, "--no-progress", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (
        summary["horizon"]["time"] == 30.0 and summary["horizon"]["time_rule"] == "the time budget every run was given"
    )
    ends = [r["sim_time"] for r in summary["rows"]]
    assert all(30.0 <= e for e in ends)
    out = capsys.readouterr().out
    assert "Horizon H = 30.0 simulated s for every scheme (the time budget every run was given)" in out
    assert (tmp_path / "reached_time.png").exists()
