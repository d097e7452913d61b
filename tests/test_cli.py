"""The fedselect command: list, run, compare (resumable), helpful errors."""

from __future__ import annotations

import json

import pytest

from fedselect.cli import main, parse_selector_spec

SMALL = [
    "--n-clients",
    "8",
    "--clients-per-round",
    "2",
    "--rounds",
    "4",
    "--model",
    "logistic",
    "--local-steps",
    "2",
    "--no-progress",
]


def test_parse_selector_spec():
    assert parse_selector_spec("random") == ("random", "random", {})
    # a label may hold "=": the name follows the last "=" before the parameters
    assert parse_selector_spec("HCSFed (weighting=paper)=hcsfed:weighting=paper") == (
        "HCSFed (weighting=paper)",
        "hcsfed",
        {"weighting": "paper"},
    )
    assert parse_selector_spec("a=b=random") == ("a=b", "random", {})
    assert parse_selector_spec("power-of-choice:d=6") == ("power-of-choice(d=6)", "power-of-choice", {"d": 6})
    assert parse_selector_spec("pow=power-of-choice:d=6,random_state=1") == (
        "pow",
        "power-of-choice",
        {"d": 6, "random_state": 1},
    )


def test_help_explains(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    out = capsys.readouterr().out
    assert "resum" in out or "skips finished" in out
    assert "--selectors" in out


def test_list_shows_selectors_datasets_presets(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in (
        "random",
        "power-of-choice",
        "afl",
        "round-robin",
        "data-size",
        "digits",
        "fmnist",
        "fedcor-fmnist-2spc",
    ):
        assert name in out


def test_run_writes_history(tmp_path, capsys):
    out = tmp_path / "h.json"
    assert main(["run", "--selector", "afl", "--out", str(out), *SMALL]) == 0
    data = json.loads(out.read_text())
    assert len(data["rounds"]) == 4
    assert "final accuracy" in capsys.readouterr().out


def test_compare_writes_table_curves_and_resumes(tmp_path, capsys):
    args = [
        "compare",
        "--selectors",
        "random",
        "pow=power-of-choice:d=4",
        "--seeds",
        "0",
        "1",
        "--out",
        str(tmp_path),
        "--target",
        "0.3",
        *SMALL,
    ]
    assert main(args) == 0
    out = capsys.readouterr()
    table = out.out.split("\n\n")[0].splitlines()  # the terminal table: aligned columns, short headers
    assert table[0].split() == [
        "scheme",
        "rounds",
        "to",
        "30%",
        "reached",
        "final",
        "best",
        "Mfloats",
        "down",
        "losses",
        "trainings",
        "s/run",
    ]
    assert sorted(line.split()[0] for line in table[1:]) == ["pow", "random"]
    assert len({len(line) for line in table}) == 1 and max(map(len, table)) <= 100  # aligned, and it fits
    assert "| random |" in (tmp_path / "table.md").read_text()  # the file keeps the Markdown with long headers
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert runs == ["pow__seed0.json", "pow__seed1.json", "random__seed0.json", "random__seed1.json"]
    saved = json.loads((tmp_path / "runs" / "pow__seed1.json").read_text())
    assert saved["command"] and saved["commit"] and saved["seed"] == 1
    assert saved["machine"]["cpu"] and saved["machine"]["torch"]  # where it ran: results can differ across CPUs
    for f in (
        "table.md",
        "summary.json",
        "results.csv",
        "accuracy.png",
        "selection_frequency.png",
        "communication.png",
    ):
        assert (tmp_path / f).stat().st_size > 0
    # a rerun loads every finished run instead of training again
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "runs").iterdir()}
    assert main(args) == 0
    assert "4 finished run(s) loaded, 0 to run" in capsys.readouterr().err
    assert before == {p.name: p.stat().st_mtime_ns for p in (tmp_path / "runs").iterdir()}
    # changed settings with the same output directory are refused, not mixed
    changed = [a if a != "4" else "5" for a in args]
    assert main(changed) == 2
    err = capsys.readouterr().err
    assert "other settings (trainer.rounds: saved 4, now 5)" in err


def test_unknown_selector_is_a_clear_error(tmp_path, capsys):
    assert main(["compare", "--selectors", "nope", "--out", str(tmp_path), *SMALL]) == 2
    err = capsys.readouterr().err
    assert "unknown selector 'nope'" in err and "random" in err


def test_compare_paired_against_a_reference(tmp_path, capsys):
    args = [
        "compare",
        "--selectors",
        "random",
        "pow=power-of-choice:d=4",
        "--seeds",
        "0",
        "1",
        "2",
        "--out",
        str(tmp_path),
        "--target",
        "0.3",
        "--paired",
        "pow",
        *SMALL,
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "paired by seed against pow" in out and "| random | 3 |" in out
    assert "| random | 3 |" in (tmp_path / "paired.md").read_text()


def test_compare_paired_label_must_be_compared(tmp_path, capsys):
    assert (
        main(["compare", "--selectors", "random", "--seeds", "0", "--out", str(tmp_path), "--paired", "fedcor", *SMALL])
        == 2
    )
    assert "fedselect: error: --paired 'fedcor' is not one of the schemes compared: random" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # refused before any training


def test_compare_with_client_dropout(tmp_path, capsys):
    out = tmp_path / "drop"
    args = [
        "compare",
        "--selectors",
        "random",
        "round-robin",
        "--seeds",
        "0",
        "--out",
        str(out),
        "--client-dropout",
        "0.4",
        "--n-clients",
        "10",
        "--clients-per-round",
        "10",
        "--rounds",
        "5",
        "--model",
        "logistic",
        "--local-steps",
        "1",
        "--no-progress",
    ]
    assert main(args) == 0
    runs = {p.name: json.loads(p.read_text()) for p in (out / "runs").glob("*.json")}
    failed = {name: [r["failed"] for r in d["history"]["rounds"]] for name, d in runs.items()}
    assert len(failed) == 2
    a, b = failed.values()
    assert a == b and any(a)  # every scheme of one seed faces the same failures
    assert all(d["history"]["config"]["trainer"]["dropout"] == 0.4 for d in runs.values())


def test_typos_in_the_model_or_the_round_size_stop_a_comparison_before_any_run(tmp_path, capsys):
    base = ["compare", "--selectors", "random", "--seeds", "0", "--out", str(tmp_path), *SMALL]
    assert main([*base, "--model", "cnnn"]) == 2
    assert "unknown model 'cnnn'; registered models: " in capsys.readouterr().err
    assert main([*base, "--clients-per-round", "50"]) == 2
    assert "clients_per_round=50 is invalid" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    assert main(["compare", "--selectors", "random", "random", "--seeds", "0", "--out", str(tmp_path), *SMALL]) == 2
    assert "names 'random' twice" in capsys.readouterr().err


def test_selector_parameter_values_read_like_python_or_lowercase():
    assert parse_selector_spec("random:replace=true")[2] == {"replace": True}
    assert parse_selector_spec("power-of-choice:d=none")[2] == {"d": None}


def test_compare_compress_gzips_the_runs_and_a_rerun_reads_them(tmp_path, capsys):
    args = ["compare", "--selectors", "random", "--seeds", "0", "1", "--out", str(tmp_path), "--compress", *SMALL]
    assert main(args) == 0
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["random__seed0.json.gz", "random__seed1.json.gz"]
    capsys.readouterr()
    assert main(args) == 0
    assert "2 finished run(s) loaded, 0 to run" in capsys.readouterr().err


def test_the_default_comparison_is_label_skewed_with_every_scheme_at_its_defaults():
    from fedselect import make_federation
    from fedselect.cli import build_parser
    from fedselect.presets import get_preset

    args = build_parser().parse_args(["compare"])
    preset = get_preset(args.preset)
    assert preset.selectors["random"] == ("random", {})
    # the setting is chosen, not the schemes: no scheme runs with tuned parameters
    assert all(params == {} for _, params in preset.selectors.values())
    # enough seeds that Holm-adjusted exact Wilcoxon tests against random can reach p < 0.05
    n_tests = len(preset.selectors) - 1
    assert n_tests * 2.0 / 2 ** len(preset.seeds) < 0.05
    fed = make_federation(random_state=0, **preset.federation)
    assert (fed.label_histogram() > 0).sum(axis=1).max() <= 2  # strong label skew: one or two digits per client


def test_compare_prints_the_paired_verdict_against_random_by_default(tmp_path, capsys):
    args = ["compare", "--selectors", "random", "round-robin", "--seeds", "0", "1", "--target", "0.3", *SMALL]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "paired by seed against random:" in out and "| round-robin | 2 |" in out
    assert (tmp_path / "a" / "paired.md").exists()
    assert main([*args, "--out", str(tmp_path / "b"), "--no-paired"]) == 0
    assert "paired by seed" not in capsys.readouterr().out
    assert not (tmp_path / "b" / "paired.md").exists()
    # only random: nothing to pair with, no empty table
    assert main(["compare", "--selectors", "random", "--seeds", "0", "--out", str(tmp_path / "c"), *SMALL]) == 0
    assert "paired by seed" not in capsys.readouterr().out


def test_paired_and_no_paired_together_are_refused(tmp_path, capsys):
    assert (
        main(
            [
                "compare",
                "--selectors",
                "random",
                "afl",
                "--seeds",
                "0",
                "--paired",
                "afl",
                "--no-paired",
                "--out",
                str(tmp_path),
                *SMALL,
            ]
        )
        == 2
    )
    assert "--paired 'afl' and --no-paired contradict each other" in capsys.readouterr().err


def test_momentum_option_reaches_the_trainer(tmp_path, capsys):
    with_m, without = tmp_path / "m.json", tmp_path / "plain.json"
    assert main(["run", "--selector", "random", "--out", str(with_m), "--momentum", "0.9", *SMALL]) == 0
    assert main(["run", "--selector", "random", "--out", str(without), *SMALL]) == 0
    a, b = json.loads(with_m.read_text()), json.loads(without.read_text())
    # The same clients (random selection does not depend on the model), other models: momentum was used.
    assert [r["clients"] for r in a["rounds"]] == [r["clients"] for r in b["rounds"]]
    assert [r["test_loss"] for r in a["rounds"]] != [r["test_loss"] for r in b["rounds"]]


def test_momentum_out_of_range_is_refused_before_training(tmp_path, capsys):
    assert main(["run", "--selector", "random", "--momentum", "1.5", *SMALL]) != 0
    err = capsys.readouterr().err
    assert "momentum" in err


_PARTITION_PLUGIN = '''
import numpy as np
from fedselect import hookimpl


def stripes(y, n_clients, *, stripe=1, random_state=None):
    """Client k gets every n-th run of `stripe` samples."""
    idx = np.arange(len(y))
    return [idx[(idx // stripe) % n_clients == k] for k in range(n_clients)]


@hookimpl
def register_partitions(register):
    register(stripes, name="test-stripes")
'''


def test_a_partition_from_a_plugin_file_brings_its_parameters_as_options(tmp_path, capsys):
    import sys

    from fedselect import plugins

    path = tmp_path / "stripes_plugin.py"
    path.write_text(_PARTITION_PLUGIN)
    out = tmp_path / "h.json"
    try:
        assert (
            main(
                [
                    "run",
                    "--plugin",
                    str(path),
                    "--partition",
                    "test-stripes",
                    "--stripe",
                    "3",
                    "--out",
                    str(out),
                    *SMALL,
                ]
            )
            == 0
        ), capsys.readouterr().err
        assert "test-stripes(stripe=3)" in capsys.readouterr().err  # the federation's summary
        assert "--stripe" in build_flags("run")
    finally:
        label = f"file {path.resolve()}"
        if plugins.pm.get_plugin(label) is not None:
            plugins.pm.unregister(name=label)
        plugins._user_plugins.pop(label, None)
        sys.modules.pop("stripes_plugin", None)
    assert "--stripe" not in build_flags("run")  # the option exists while the plugin does


def build_flags(command):
    from fedselect.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices[command]
    return [flag for action in sub._actions for flag in action.option_strings]


def test_preset_none_is_pythons_defaults_and_needs_selectors(tmp_path, capsys):
    assert main(["compare", "--preset", "none", "--out", str(tmp_path), *SMALL]) == 2
    assert "--preset none names no schemes; give --selectors" in capsys.readouterr().err
    assert main(["reproduce", "none"]) == 2
    assert "reproduce needs a preset" in capsys.readouterr().err
    assert (
        main(
            [
                "compare",
                "--preset",
                "none",
                "--selectors",
                "random",
                "--seeds",
                "0",
                "--target",
                "0.3",
                "--out",
                str(tmp_path / "c"),
                *SMALL,
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    saved = json.loads((tmp_path / "c" / "runs" / "random__seed0.json").read_text())
    # nothing but what the command line said (and its one default of its own, n_threads=1)
    assert saved["settings"]["federation"] == {"n_clients": 8}
    assert "each run, in Python: FederatedTrainer(selector=<scheme>, " in err and "make_federation(n_clients=8, " in err


def test_compare_with_profiles_reports_time_beside_rounds(tmp_path, capsys):
    from fedselect.profiles import sample_profiles

    devices = tmp_path / "devices.npz"
    sample_profiles(8, random_state=3).save(devices)
    out = tmp_path / "cmp"
    args = [
        "compare",
        "--selectors",
        "random",
        "round-robin",
        "--seeds",
        "0",
        "1",
        "--target",
        "0.3",
        "--profiles",
        str(devices),
        "--out",
        str(out),
        *SMALL,
    ]
    assert main(args) == 0
    terminal = capsys.readouterr().out
    assert "time to 30%" in terminal.splitlines()[0]
    assert "on simulated seconds to 30%" in terminal
    assert "simulated s to 30% by the horizon H, mean ± std over seeds" in (out / "table.md").read_text()
    paired = (out / "paired.md").read_text()
    assert "family 1 of 2" in paired and "family 2 of 2" in paired
    assert (out / "accuracy_time.png").exists()
    saved = json.loads(next((out / "runs").iterdir()).read_text())
    assert saved["settings"]["federation"]["profiles"] == str(devices)
    assert saved["settings"]["federation"]["profiles_fingerprint"] == sample_profiles(8, random_state=3).fingerprint()
    assert saved["history"]["rounds"][-1]["sim_time"] > 0


def test_run_with_profiles_prints_simulated_time(capsys):
    assert main(["run", "--profiles", "kind=homogeneous,latency=0.5", "--target", "0.3", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "simulated time: " in out and " s, to 30%: " in out


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("laptops", "neither a kind nor a file name"),
        ("kind=mobile,compute_sigma=-1", "compute_sigma=-1"),
        ("kind=mobile,speed=2", "not ['speed']"),
        ("nowhere.json", "there is no file nowhere.json"),
    ],
)
def test_a_bad_profiles_option_is_an_error_before_any_training(tmp_path, capsys, value, says):
    out = tmp_path / "cmp"
    assert main(["compare", "--selectors", "random", "--profiles", value, "--out", str(out), *SMALL]) == 2
    err = capsys.readouterr().err
    assert "profiles=" in err and says in err
    assert not (out / "runs").exists()  # refused while planning: no run started, not even its folder


def test_a_run_that_trained_nobody_exits_non_zero(capsys):
    # a deadline no client can meet: every round fails everyone; the run finishes, warns, and exits 3
    argv = ["run", "--preset", "none", "--rounds", "2", "--n-clients", "6", "--clients-per-round", "2"]
    from fedselect.simulation.trainer import TrainedNobodyWarning

    with pytest.warns(TrainedNobodyWarning, match="trained nobody"):
        assert main([*argv, "--deadline", "1e-9", "--no-progress"]) == 3
    assert "no round trained anybody (2 of 2" in capsys.readouterr().err
    assert main([*argv, "--no-progress"]) == 0


def test_the_former_option_names_still_parse_hidden_and_say_so(capsys):
    """--dropout and --engine were renamed --client-dropout and --path (one name per concept); they still work."""
    from fedselect.cli import _apply_overrides, build_parser

    parser = build_parser()
    help_text = parser._subparsers._group_actions[0].choices["run"].format_help()
    assert "--client-dropout" in help_text and "--path" in help_text
    assert "--dropout" not in help_text.replace("--client-dropout", "") and "--engine" not in help_text
    federation, trainer = {}, {"dropout": 0.1}  # a preset written with the former name
    _apply_overrides(parser.parse_args(["run", "--dropout", "0.3", "--engine", "compiled"]), federation, trainer)
    assert {k: trainer[k] for k in ("client_dropout", "path")} == {"client_dropout": 0.3, "path": "compiled"}
    assert "dropout" not in trainer and "engine" not in trainer
    err = capsys.readouterr().err
    assert "--dropout is deprecated and will be removed in fedselect 1.0; use --client-dropout" in err
    assert "--engine is deprecated" in err and "use --path" in err
    # a preset written with the former names: its values under the new ones, an option given winning
    federation, trainer = {}, {"engine": "compiled", "dropout": 0.1}
    _apply_overrides(parser.parse_args(["run", "--path", "eager"]), federation, trainer)
    assert trainer["path"] == "eager" and trainer["client_dropout"] == 0.1
    assert "engine" not in trainer and "dropout" not in trainer
    with pytest.raises(ValueError, match="--dropout is the former name of --client-dropout; give one of them"):
        _apply_overrides(parser.parse_args(["run", "--dropout", "0.3", "--client-dropout", "0.2"]), {}, {})
    assert main(["run", "--dropout", "0.3", "--client-dropout", "0.2"]) == 2
    assert "give one of them" in capsys.readouterr().err
