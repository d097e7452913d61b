"""The experiments package: every module imports, the provenance tables, planning, and one report per folder."""

from __future__ import annotations

import importlib
import json
import warnings
from pathlib import Path

import pytest

from fedselect.cli import main
from fedselect.experiments import provenance
from fedselect.experiments.plan import FederationSource, plan_cells, run_settings, selector_table
from fedselect.experiments.results import Comparison, load_comparison, parse_result
from fedselect.simulation.costs import Costs
from fedselect.simulation.history import History, RoundRecord
from tests.test_cli import SMALL as CLI_SMALL
from tests.test_import_graph import _modules

PACKAGE = Path(__file__).resolve().parents[1] / "fedselect"
SMALL = [*CLI_SMALL, "--target", "0.3", "--seeds", "0", "1"]  # the CLI tests' small run: a reachable target, 2 seeds


# -- every module imports (the import graph's checks are in tests/test_import_graph.py) ------------------------------


def test_every_module_imports():
    import importlib.util

    flower = importlib.util.find_spec("flwr") is not None  # the first CI stage has no Flower
    for name in sorted(_modules()):
        if name.startswith("fedselect.flower") and not flower:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            importlib.import_module(name)


# -- provenance ---------------------------------------------------------------------------------------------------


def test_every_entry_of_the_added_later_tables_names_a_class_and_its_parameters():
    for where, params in {**provenance.ADDED_LATER, **provenance.NOT_IDENTIFYING}.items():
        module, _, name = where.partition(":")
        cls = getattr(importlib.import_module(module), name)
        missing = set(params) - set(cls._get_param_names())
        assert not missing, f"{where} has no parameter(s) {sorted(missing)}"


def test_the_trainer_identity_leaves_out_options_and_parameters_at_their_old_default():
    from fedselect.simulation.trainer import FederatedTrainer

    plain = provenance.trainer_identity(FederatedTrainer(rounds=3))
    assert not {"momentum", "nesterov", "loss", "progress", "n_threads", "selector"} & set(plain)
    same = provenance.trainer_identity(FederatedTrainer(rounds=3, momentum=0.0, progress=False, n_threads=2))
    assert same == plain
    assert provenance.trainer_identity(FederatedTrainer(rounds=3, momentum=0.5))["momentum"] == 0.5


def test_a_subclass_inherits_the_parameters_added_later_and_unpickles_with_them():
    import pickle

    from fedselect.selectors.fedcor import FedCorSelector

    class Mine(FedCorSelector):
        pass

    assert provenance.later_defaults(Mine)["gp_solver"] == "gpytorch"
    assert "gp_solver" not in Mine().identifying_params()
    state = FedCorSelector().__getstate__()
    del state["warmup_fit_start"]  # a selector pickled before the parameter existed
    restored = FedCorSelector.__new__(FedCorSelector)
    restored.__setstate__(state)
    assert restored.warmup_fit_start == 0
    assert pickle.loads(pickle.dumps(FedCorSelector(rank=3))).rank == 3


def _result(**extra):
    history = History([RoundRecord(round=0, clients=[0], weights=[1.0], lr=0.1, test_accuracy=0.5)], model_size=3)
    return {"key": "k", "label": "random", "seed": 0, "history": history.to_dict(), **extra}


def test_result_files_before_format_1_are_migrated_and_newer_formats_refused(tmp_path):
    old, reason = parse_result(json.dumps(_result()))  # no status, machine or settings: the first layout
    assert reason is None and old["status"] == "finished" and old["settings"] is None and old["machine"] is None
    assert parse_result(json.dumps(_result(format=1)))[1] is None
    saved, reason = parse_result(json.dumps(_result(format=2)))
    assert saved is None and "result format 2, written by a newer fedselect" in reason
    assert "not a format number" in parse_result(json.dumps(_result(format="2")))[1]
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "random__seed0.json").write_text(json.dumps(_result()))
    (runs / "random__seed1.json").write_text(json.dumps(_result(seed=1, format=9)))
    with pytest.warns(Warning, match="newer fedselect"):
        comp, cells = load_comparison(tmp_path, 0.4)
    assert list(comp.histories["random"]) == [0] and [c["status"] for c in cells] == ["finished"]


# -- planning -----------------------------------------------------------------------------------------------------


def test_planning_keys_every_cell_seed_by_seed():
    federation = {"dataset": "digits", "n_clients": 6}
    trainer = {"rounds": 2, "clients_per_round": 2}
    table = selector_table({"r": "random", "p": ("power-of-choice", {"d": 3})})
    plan = plan_cells(table, FederationSource(federation), trainer, [2, 0], None)
    assert [(c.seed, c.label) for c in plan.cells] == [(2, "r"), (2, "p"), (0, "r"), (0, "p")]
    for cell in plan.cells:
        assert cell.settings == run_settings(federation, trainer, table[cell.label], cell.seed)
        assert cell.key == provenance.run_key(cell.settings) and cell.path is None and cell.checkpoint is None
    assert plan.cells[1].selector == "power-of-choice"


# -- one report per folder ----------------------------------------------------------------------------------------


def _history(accuracies):
    rounds = [
        RoundRecord(round=t, clients=[0], weights=[1.0], lr=0.1, test_accuracy=a, costs=Costs(models_down=1))
        for t, a in enumerate(accuracies)
    ]
    return History(rounds, model_size=10)


def _comparison(schemes, seeds=range(6), target=0.8):
    speed = {"random": 3, "fast": 1, "slow": 5, "other": 2}
    return Comparison(
        {s: {k: _history([0.1] * (speed[s] + k % 2) + [0.9]) for k in seeds} for s in schemes},
        target=target,
        n_clients=1,
    )


def _report(comp, out, reference="random"):
    comp.write(out)
    (out / "paired.md").write_text(comp.paired_markdown(reference) + "\n")  # as the command line writes it


def test_a_comparison_of_other_schemes_moves_the_earlier_report_aside(tmp_path):
    first = _comparison(["random", "fast", "slow"])
    _report(first, tmp_path)
    table, paired = (tmp_path / "table.md").read_text(), (tmp_path / "paired.md").read_text()
    assert "This report covers 18 run(s)" in table and f"Report {first.report_id()}" in table
    assert "family of 2 comparison(s) with random" in paired and "fast, slow" in paired

    second = _comparison(["random", "fast", "other"])  # another family: fast's adjusted p-value would move
    _report(second, tmp_path)
    rid = first.report_id()
    assert (tmp_path / f"table-{rid}.md").read_text() == table  # the earlier table, whole
    assert (tmp_path / f"paired-{rid}.md").read_text() == paired
    assert (tmp_path / f"results-{rid}.csv").exists() and (tmp_path / f"summary-{rid}.json").exists()
    assert "other (seeds 0, 1, 2, 3, 4, 5)" in (tmp_path / "table.md").read_text()
    assert f"Earlier reports of other runs in this folder: table-{rid}.md" in (tmp_path / "table.md").read_text()
    assert json.loads((tmp_path / "summary.json").read_text())["report"] == second.report_id()

    _report(second, tmp_path)  # the same runs again: rewritten in place, nothing moved
    assert sorted(p.name for p in tmp_path.glob("table*.md")) == sorted(["table.md", f"table-{rid}.md"])
    _report(_comparison(["random", "fast", "other"], seeds=range(4)), tmp_path)  # fewer seeds: other runs
    _report(_comparison(["random", "fast", "other"], seeds=range(4), target=0.5), tmp_path)  # another target
    assert len(list(tmp_path.glob("table-*.md"))) == 3

    _report(first, tmp_path)  # the first comparison again takes the plain names; its old copy is superseded
    assert not (tmp_path / f"table-{rid}.md").exists() and (tmp_path / f"table-{second.report_id()}.md").exists()
    assert (tmp_path / "table.md").read_text().startswith(table.split("\n\n")[0])


def test_pictures_move_with_their_report(tmp_path):
    first = _comparison(["random", "fast"], seeds=range(2))
    first.write(tmp_path)
    first.plot(tmp_path)
    before = (tmp_path / "accuracy.png").read_bytes()
    second = _comparison(["random", "slow"], seeds=range(2))
    second.plot(tmp_path)  # pictures first: the earlier report still moves aside whole
    assert (tmp_path / f"accuracy-{first.report_id()}.png").read_bytes() == before
    assert (tmp_path / f"table-{first.report_id()}.md").exists() and not (tmp_path / "table.md").exists()


def test_a_report_written_before_report_ids_is_kept_too(tmp_path):
    (tmp_path / "table.md").write_text("| scheme |\n|---|\n| old |\n")  # no results.csv: an id from its bytes
    _comparison(["random", "fast"], seeds=range(2)).write(tmp_path)
    kept = [p for p in tmp_path.glob("table-*.md")]
    assert len(kept) == 1 and kept[0].read_text() == "| scheme |\n|---|\n| old |\n"


def test_a_cli_rerun_with_other_schemes_keeps_the_earlier_table_and_paired_verdict(tmp_path, capsys):
    assert main(["compare", "--selectors", "random", "round-robin", "--out", str(tmp_path), *SMALL]) == 0
    table, paired = (tmp_path / "table.md").read_text(), (tmp_path / "paired.md").read_text()
    assert main(["compare", "--selectors", "random", "data-size", "--out", str(tmp_path), *SMALL]) == 0
    capsys.readouterr()
    kept = list(tmp_path.glob("table-*.md"))
    assert len(kept) == 1 and kept[0].read_text() == table
    assert (tmp_path / kept[0].name.replace("table-", "paired-")).read_text() == paired
    covers = next(line for line in (tmp_path / "table.md").read_text().splitlines() if line.startswith("This report"))
    assert "data-size (seeds 0, 1)" in covers and "round-robin" not in covers
    assert "with random, and no other: data-size (seeds 0, 1)" in (tmp_path / "paired.md").read_text()


def test_no_selection_picture_is_drawn_from_histories_that_keep_no_chosen_clients(tmp_path):
    full = _comparison(["random", "fast"], seeds=range(2))
    assert "selection_frequency.png" in [p.name for p in full.plot(tmp_path / "full")]
    compact = _comparison(["random", "fast"], seeds=range(2))
    for runs in compact.histories.values():  # as benchmarks' compact records keep them: no clients per round
        for h in runs.values():
            for r in h.rounds:
                r.clients, r.weights = [], []
    names = [p.name for p in compact.plot(tmp_path / "compact")]
    assert names == ["accuracy.png", "reached.png", "communication.png"]
    assert not (tmp_path / "compact" / "selection_frequency.png").exists()


def test_the_same_runs_paired_against_another_reference_keep_the_earlier_verdict(tmp_path, capsys):
    args = ["compare", "--selectors", "random", "round-robin", "data-size", "--out", str(tmp_path), *SMALL]
    assert main([*args, "--paired", "random"]) == 0
    against_random = (tmp_path / "paired.md").read_text()
    assert main([*args, "--paired", "round-robin"]) == 0  # the same runs (resumed), another family of tests
    capsys.readouterr()
    assert (tmp_path / "paired-against-random.md").read_text() == against_random
    assert (tmp_path / "paired.md").read_text().startswith("Paired by seed against round-robin")
    assert main([*args, "--paired", "round-robin"]) == 0  # the same reference again: rewritten in place
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.glob("paired*.md")) == ["paired-against-random.md", "paired.md"]


# -- simulated time in the reports (issue 22, item 3) -------------------------------------------------------------


def _timed(accuracies, times, seconds=None):
    """A run whose rounds end at the simulated ``times`` (None: no clock, as a Flower run's records)."""
    rounds = [
        RoundRecord(
            round=t,
            clients=[0],
            weights=[1.0],
            lr=0.1,
            test_accuracy=a,
            costs=Costs(models_down=1),
            sim_seconds=None if times is None else times[t] - (times[t - 1] if t else 0.0),
            sim_time=None if times is None else float(times[t]),
            wall_seconds=seconds,
        )
        for t, a in enumerate(accuracies)
    ]
    return History(rounds, model_size=10)


def _timed_comparison():
    return Comparison(
        {
            "random": {
                0: _timed([0.1, 0.5, 0.9], [10, 20, 30]),  # to 80 %: 30 s; ends at 30 s
                1: _timed([0.1, 0.2, 0.9, 0.95], [10, 25, 40, 55]),  # 40 s; ends at 55 s
            },
            "fast": {
                0: _timed([0.5, 0.85], [5, 12]),  # 12 s
                1: _timed([0.1, 0.2, 0.3], [6, 13, 21]),  # never: N/A, ends at 21 s
            },
            "flower": {0: _timed([0.1, 0.9], None, seconds=3.0), 1: _timed([0.9], None, seconds=2.0)},
        },
        target=0.8,
        n_clients=1,
    )


def test_the_time_columns_hold_the_simulated_seconds_computed_by_hand(tmp_path):
    import dataclasses

    # at a horizon past every run's end (60 s) nothing is censored: the seconds as measured
    comp = dataclasses.replace(_timed_comparison(), time_horizon=60.0)
    assert comp.has_clock() and comp.horizon("time") == (60.0, "given")
    assert comp.time_to_target() == {
        "random": {0: 30.0, 1: 40.0},
        "fast": {0: 12.0, 1: None},
        "flower": {0: None, 1: None},
    }
    rows = {r["scheme"]: r for r in comp.rows()}
    assert rows["random"]["time_to_target"] == 35.0 and rows["random"]["time_to_target_std"] == 5.0
    assert rows["random"]["sim_time"] == 42.5 and rows["random"]["sim_time_std"] == 12.5
    assert rows["fast"]["time_to_target"] is None and rows["fast"]["time_to_target_each"] == [12.0, None]
    assert rows["fast"]["sim_time"] == 16.5
    assert rows["flower"]["time_to_target"] is None and rows["flower"]["sim_time"] is None  # no clock: no time
    table = comp.to_markdown().splitlines()
    assert table[0].startswith(
        "| scheme | rounds to 80%, mean ± std over seeds | simulated s to 80% by the horizon H, mean ± std over "
        "seeds | simulated s at the last round, mean ± std over seeds | seeds reaching 80% |"
    )
    cells = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:4] for line in table[2:]}
    assert cells["random"] == ["3.0 ± 0.0", "35.0 ± 5.0", "42.5 ± 12.5"]
    assert cells["fast"] == ["N/A (1 reached: 2.0)", "N/A (1 reached: 12.0)", "16.5 ± 4.5"]  # a miss, as for rounds
    assert cells["flower"] == ["1.5 ± 0.5", "-", "-"]
    text = comp.to_text()
    assert "time to 80%" in text.splitlines()[0] and "time at end" in text.splitlines()[0]
    assert "simulated seconds to it" in " ".join(text.split())
    comp.write(tmp_path)
    csv_rows = (tmp_path / "results.csv").read_text().splitlines()
    assert csv_rows[0].endswith("floats_to_target,reached_by_horizon,time_to_target,sim_time")
    assert csv_rows[1].endswith(",1,30.0,30.0") and csv_rows[4].endswith(",0,,21.0")  # random seed 0; fast seed 1
    assert csv_rows[5].endswith(",,,")  # flower: neither
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rows"][0]["time_to_target"] == 35.0 and summary["horizon"]["time"] == 60.0
    assert "H = 60.0 simulated s (given)" in comp.to_markdown()


def test_by_default_time_is_read_at_the_earliest_end_of_a_miss_for_every_scheme(tmp_path):
    comp = _timed_comparison()  # fast's seed 1 missed and ended at 21 s: no scheme is observed longer than that
    assert comp.horizon("time") == (
        21.0,
        "the earliest end of a run that missed the target: the longest time every run was observed for",
    )
    rows = {r["scheme"]: r for r in comp.rows()}
    assert rows["random"]["time_to_target_each"] == [None, None]  # its hits at 30 s and 40 s lie past H: censored
    assert rows["random"]["time_to_target"] is None and rows["fast"]["time_to_target_each"] == [12.0, None]
    assert rows["random"]["time_horizon"] == rows["fast"]["time_horizon"] == 21.0
    assert "H = 21.0 simulated s (the earliest end of a run that missed" in comp.to_markdown()
    comp.write(tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text())["horizon"]["time"] == 21.0
    assert (tmp_path / "results.csv").read_text().splitlines()[1].endswith(",0,30.0,30.0")  # a hit, but after H


def test_without_a_clock_the_reports_have_no_time(tmp_path):
    comp = _comparison(["random", "fast"], seeds=range(2))
    assert not comp.has_clock()
    assert not any(k.startswith(("time", "sim")) for r in comp.rows() for k in r)
    assert "simulated" not in comp.to_markdown() and "time to" not in comp.to_text()
    comp.write(tmp_path)
    assert (tmp_path / "results.csv").read_text().splitlines()[0] == (
        "scheme,seed,rounds_to_target,final_accuracy,best_accuracy,rounds_run,floats_to_target"
    )
    # paired.md: one family, no word of time
    assert comp.paired_report("random") == (
        "Paired by seed against random (rounds to 80%; a run that has not reached it by the round budget is "
        "censored there and counts as the budget + 1; two-sided Wilcoxon signed-rank test)\n\n"
        f"{comp.paired_markdown('random')}\n"
    )
    assert "family 1" not in comp.paired_report("random")
    assert "accuracy_time.png" not in [p.name for p in comp.plot(tmp_path)]


def test_paired_time_to_target_is_a_second_family_with_its_own_holm_adjustment():
    # rounds: "slow" always 2 rounds behind random, "other" 1 behind; time: the ranking flips (cheap rounds)
    seeds = range(6)

    def run(n_rounds, seconds_per_round, seed):
        accs = [0.1] * (n_rounds + seed % 2) + [0.9]
        return _timed(accs, [seconds_per_round * (t + 1) + seed for t in range(len(accs))])

    comp = Comparison(
        {
            "random": {k: run(3, 10.0, k) for k in seeds},
            "slow": {k: run(5, 2.0, k) for k in seeds},  # more rounds, far less time
            "other": {k: run(4, 10.0 + k, k) for k in seeds},
        },
        target=0.8,
        n_clients=1,
    )
    rounds, times = comp.paired("random"), comp.paired("random", metric="time")
    by = {r["scheme"]: r for r in times}
    # by hand: random seed k reaches at round 4 + k % 2, time 10 (4 + k % 2) + k; slow at 2 (6 + k % 2) + k
    for k in seeds:
        i = list(seeds).index(k)
        assert by["slow"]["diffs"][i] == (2 * (6 + k % 2) + k) - (10 * (4 + k % 2) + k)
        assert rounds[0]["diffs"][i] == 2.0
    assert all(d < 0 for d in by["slow"]["diffs"]) and all(d > 0 for d in by["other"]["diffs"])
    from fedselect.experiments.stats import holm

    assert [r["p_holm"] for r in times] == holm([r["p"] for r in times])  # within the time family only
    assert [r["p_holm"] for r in rounds] == holm([r["p"] for r in rounds])
    pooled = holm([r["p"] for r in rounds] + [r["p"] for r in times])
    assert [r["p_holm"] for r in times] != pooled[2:]  # not one family of four
    report = comp.paired_report("random")
    assert report.startswith(
        "Paired by seed against random (rounds to 80%; a run that has not reached it by the round budget is "
        "censored there and counts as the budget + 1; family 1 of 2;"
    )
    assert "on simulated seconds to 80% (family 2 of 2;" in report
    assert "scheme − random (simulated s, mean ± std)" in report
    assert "with random on simulated time to the target, and no other" in report
    assert report.count("| slow | 6 |") == 2


def test_a_miss_on_time_is_censored_at_the_shared_horizon_and_runs_without_a_clock_leave_the_pairs():
    comp = _timed_comparison()
    (fast,) = [r for r in comp.paired("random", metric="time") if r["scheme"] == "fast"]
    # H = 21 s (fast's seed 1 missed and ended there); a censored run counts as H + the median round (10 s) = 31:
    # seed 0: fast's 12 against random's hit at 30 s, past H; seed 1: both censored, a tie that says nothing
    assert fast["horizon"] == 21.0 and fast["censored_value"] == 31.0
    assert fast["diffs"] == [12.0 - 31.0, 0.0]
    assert (fast["informative"], fast["both_censored"], fast["verdict"]) == (1, 1, False)
    assert fast["p"] != fast["p"] and fast["p_holm"] != fast["p_holm"]  # no verdict: NaN, out of Holm's family
    assert "No verdict (p shown as -, left out of Holm's family) where fewer than 6 pairs carry information: " in (
        comp.paired_markdown("random", metric="time")
    )
    (flower,) = [r for r in comp.paired("random", metric="time") if r["scheme"] == "flower"]
    assert flower["seeds"] == [] and flower["unclocked_seeds"] == [0, 1]
    assert "kept no simulated clock: flower: seed(s) [0, 1]" in comp.paired_markdown("random", metric="time")
    with pytest.raises(ValueError, match="metric='hours'"):
        comp.paired("random", metric="hours")


def test_a_result_file_with_a_simulated_time_that_is_not_a_number_is_refused():
    h = _timed([0.5], [3.0]).to_dict()
    for bad in ("3", float("nan"), -1.0, float("inf")):
        h["rounds"][0]["sim_time"] = bad
        saved, reason = parse_result(json.dumps({"key": "k", "label": "x", "seed": 0, "history": h}))
        assert saved is None and "simulated times" in reason, bad


def test_the_time_picture_is_drawn_beside_the_rounds_picture_only_with_a_clock(tmp_path):
    names = [p.name for p in _timed_comparison().plot(tmp_path)]
    assert names[:2] == ["accuracy.png", "accuracy_time.png"]
    assert (tmp_path / "accuracy_time.png").stat().st_size > 0


# -- device profiles in a comparison's keys -----------------------------------------------------------------------


def test_a_federation_without_profiles_keeps_its_key_and_profiles_change_it(tmp_path):
    from fedselect.data import make_federation
    from fedselect.profiles import homogeneous

    trainer = {"rounds": 2, "clients_per_round": 2}
    plain = {"dataset": "digits", "n_clients": 6}
    key = provenance.run_key(run_settings(plain, trainer, "random", 3))
    assert key == "34405d8fd179be7d"  # what every version before profiles computed
    none = FederationSource({**plain, "profiles": None})
    assert none.settings(3) == plain  # "not set" is not recorded: the same key
    mobile = FederationSource({**plain, "profiles": "mobile"})
    s3, s4 = mobile.settings(3), mobile.settings(4)
    assert s3["profiles"] == "mobile" and s3["profiles_fingerprint"] != s4["profiles_fingerprint"]  # per seed
    built = make_federation(random_state=3, **plain, profiles="mobile")  # what the run trains on
    assert s3["profiles_fingerprint"] == built.profiles.fingerprint()
    assert provenance.run_key(run_settings(s3, trainer, "random", 3)) != key
    # a file is keyed by its content, not its name: rewritten with other devices, it is another run
    path = tmp_path / "devices.npz"
    homogeneous(6).save(path)
    first = FederationSource({**plain, "profiles": str(path)}).settings(0)
    homogeneous(6, latency=0.5).save(path)
    second = FederationSource({**plain, "profiles": str(path)}).settings(0)
    assert first["profiles"] == second["profiles"] == str(path)
    assert first["profiles_fingerprint"] != second["profiles_fingerprint"]
    # a Federation object: its fingerprint moves only when it has profiles
    import dataclasses

    fed = make_federation(n_clients=6, random_state=0)
    assert provenance.federation_fingerprint(fed) == "766bb02b5f8d5e06"
    timed = dataclasses.replace(fed, profiles=homogeneous(6))
    assert provenance.federation_fingerprint(timed) != provenance.federation_fingerprint(fed)


def test_make_federation_profiles_leave_the_data_alone_and_are_recorded_only_when_set():
    import numpy as np

    from fedselect.data import make_federation
    from fedselect.data.federation import resolve_profiles
    from fedselect.profiles import homogeneous, sample_profiles

    plain = make_federation(n_clients=6, partition="shards", shards_per_client=2, holdout=0.2, random_state=1)
    mobile = make_federation(
        n_clients=6, partition="shards", shards_per_client=2, holdout=0.2, random_state=1, profiles="mobile"
    )
    assert plain.profiles is None and "profiles" not in plain.metadata
    for a, b in zip(plain.client_indices + plain.eval_indices, mobile.client_indices + mobile.eval_indices):
        assert np.array_equal(a, b)
    assert mobile.profiles == resolve_profiles("mobile", 6, 1)
    assert mobile.profiles == sample_profiles(
        6, random_state=int(np.random.SeedSequence((1, 0x70726F66)).generate_state(1)[0])
    )
    assert mobile.metadata["profiles"] == "mobile"
    assert mobile.metadata["profiles_fingerprint"] == mobile.profiles.fingerprint()
    assert make_federation(n_clients=6, random_state=0, profiles="homogeneous").profiles == homogeneous(6)
    fixed = {"kind": "mobile", "random_state": 7, "mean_online": 600.0}
    a = make_federation(n_clients=6, random_state=0, profiles=fixed).profiles
    b = make_federation(n_clients=6, random_state=1, profiles=fixed).profiles
    assert a == b == sample_profiles(6, random_state=7, mean_online=600.0) and a.availability is not None


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("fast", "neither a kind nor a file name"),
        ({"kind": "laptop"}, "its 'kind' is 'laptop'"),
        ({"kind": "mobile", "speed": 2}, r"takes the parameters .* not \['speed'\]"),
        ({"kind": "mobile", "compute_sigma": -1}, "compute_sigma=-1"),
        ({"kind": "homogeneous", "n_clients": 3}, r"not \['n_clients'\]"),
        ("missing.npz", "there is no file missing.npz"),
        (3, "profiles=3 is invalid"),
    ],
)
def test_a_bad_profiles_spec_is_an_error_before_any_data_or_training(spec, match, monkeypatch):
    import fedselect.data.federation as federation
    from fedselect.compare import check_plan

    def no_data(*args, **kwargs):
        raise AssertionError("the data was loaded before the profiles were checked")

    monkeypatch.setattr(federation, "load_dataset", no_data)
    with pytest.raises(ValueError, match=match):
        federation.make_federation(n_clients=6, profiles=spec)
    with pytest.raises(ValueError, match=match):  # a comparison refuses it while planning
        check_plan(
            ["random"],
            trainer={"rounds": 1},
            seeds=[0],
            federation={"dataset": "digits", "n_clients": 6, "profiles": spec},
        )


def test_profiles_of_another_size_or_a_file_that_is_no_profiles_file_are_refused(tmp_path):
    from fedselect.compare import check_plan
    from fedselect.profiles import homogeneous

    path = tmp_path / "five.json"
    homogeneous(5).save(path)
    with pytest.raises(ValueError, match="describes 5 clients but the federation has 6"):
        check_plan(
            ["random"],
            trainer={"rounds": 1},
            seeds=[0],
            federation={"dataset": "digits", "n_clients": 6, "profiles": str(path)},
        )
    (tmp_path / "evil.npz").write_bytes(b"\x80\x04K\x01.")  # a pickle, not an npz of plain arrays
    with pytest.raises(ValueError, match=r"not a readable \.npz of plain arrays"):
        check_plan(
            ["random"],
            trainer={"rounds": 1},
            seeds=[0],
            federation={"dataset": "digits", "n_clients": 6, "profiles": str(tmp_path / "evil.npz")},
        )
