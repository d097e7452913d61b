"""What the command line prints and writes: logs without progress-bar escapes, help for every option
with its default, a readable ``fedselect list``."""

from __future__ import annotations

import argparse
import inspect
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fedselect
from fedselect._console import bars_wanted
from fedselect.cli import (
    CLI_DEFAULTS,
    NOT_OPTIONS,
    UNSET,
    _settings,
    build_parser,
    get_preset,
    main,
    options,
    plain_text,
)

ROOT = Path(fedselect.__file__).resolve().parents[1]
ESCAPES = re.compile(r"\r|\x1b")  # carriage returns and terminal escape sequences: a redrawn bar's traces


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_only_on_a_terminal():
    assert bars_wanted(_Terminal())
    assert not bars_wanted(io.StringIO())


def test_a_compare_logged_to_a_file_has_one_plain_line_per_run(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    cmd = [
        sys.executable,
        "-m",
        "fedselect.cli",
        "compare",
        "--selectors",
        "random",
        "afl",
        "--seeds",
        "0",
        "1",
        "--rounds",
        "3",
        "--n-clients",
        "10",
        "--clients-per-round",
        "2",
        "--out",
        str(tmp_path / "out"),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)  # stderr is a pipe, no tty
    assert done.returncode == 0, done.stderr
    assert not ESCAPES.search(done.stderr), done.stderr[:500]
    lines = [line for line in done.stderr.splitlines() if re.match(r"\[\d/4\] ", line)]
    assert [line.split(":")[0] for line in lines] == [
        "[1/4] random seed 0",
        "[2/4] afl seed 0",
        "[3/4] random seed 1",
        "[4/4] afl seed 1",
    ]
    assert all(re.search(r": 3 rounds in \d+\.\d s, final accuracy 0\.\d{3}", line) for line in lines), lines
    assert len(done.stderr) < 2000, done.stderr  # a few lines, not a bar's redraws


def test_a_trainer_with_progress_draws_no_bar_into_a_file(digits_fed, capsys):
    fedselect.FederatedTrainer(
        selector="random", clients_per_round=2, rounds=3, local_steps=1, progress=True, random_state=0
    ).fit(digits_fed)
    assert capsys.readouterr().err == ""  # captured stderr is not a terminal


def _options(parser: argparse.ArgumentParser, path: str = "fedselect"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield path, action


def test_every_option_has_help_and_its_default():
    from fedselect.cli.options import former_names

    seen = 0
    for path, action in _options(build_parser()):
        name = "/".join(action.option_strings) or action.dest
        if action.help == argparse.SUPPRESS:  # hidden: only the former names of renamed options
            assert action.dest in former_names(), f"{path} {name} is hidden without being a former name"
            continue
        assert action.help and action.help.strip(), f"{path} {name} has no help"
        takes_value = action.option_strings and action.nargs != 0  # not a flag such as --overwrite
        if takes_value:
            assert "default" in action.help, f"{path} {name}: help does not give the default: {action.help!r}"
            seen += 1
    assert seen > 40  # run, compare and reproduce, each with its federation and training options


def test_help_says_where_the_preset_differs_from_python(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # no line breaks inside "digits-skew"
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: mean from preset digits-skew; FederatedTrainer's default data-size)" in out
    assert "(default: 60 from preset digits-skew; FederatedTrainer's default 100)" in out
    assert "(default: 0.8 from preset digits-skew; FederatedTrainer's default none)" in out
    assert "(default: make_federation's default 0)" in out  # --holdout: digits-skew leaves it to Python
    assert "stop_at_target=False" in out


def _python_defaults(func) -> dict:
    return {n: p.default for n, p in inspect.signature(func).parameters.items() if p.default is not p.empty}


@pytest.mark.parametrize("command", ["run", "compare"])
def test_an_option_not_given_is_left_at_pythons_default(command):
    # With no preset, the command line adds nothing of its own but the documented CLI_DEFAULTS (n_threads=1, which
    # is Python's default too, written into the settings so that stored runs keep their keys): the trainer and the
    # federation it builds are FederatedTrainer()'s and make_federation()'s.
    from fedselect.data import make_federation

    assert set(CLI_DEFAULTS) == {"n_threads"}  # each one listed, with its reason, in docs/cli.rst
    args = build_parser().parse_args([command, "--preset", "none"])
    federation, trainer = _settings(args, get_preset("none"))
    assert federation == {}
    assert trainer == {k: v for k, (v, _) in CLI_DEFAULTS.items()}
    built = fedselect.FederatedTrainer(**trainer).get_params(deep=False)
    python = fedselect.FederatedTrainer().get_params(deep=False)
    assert {k for k in python if built[k] != python[k]} == set()  # n_threads=1 is Python's default now
    # every option's default is the signature's, and its help says so
    defaults = {
        "trainer": _python_defaults(fedselect.FederatedTrainer.__init__),
        "federation": _python_defaults(make_federation),
    }
    for opt in options():
        if opt.owner in ("FederatedTrainer", "make_federation"):
            assert opt.default == defaults[opt.section][opt.param], opt
    parser = {a.dest: a for a in build_parser()._subparsers._group_actions[0].choices[command]._actions}
    for opt in options():
        if opt.param in CLI_DEFAULTS or opt.default is UNSET or parser[opt.param].help == argparse.SUPPRESS:
            continue  # a former name (--dropout) is hidden; its help is the new name's
        shown = (
            "none"
            if opt.default is None
            else f"{opt.default:g}"
            if isinstance(opt.default, float)
            else str(opt.default)
        )
        assert f"default {shown}" in parser[opt.param].help.replace("default: ", "default "), (opt.param, shown)


def test_every_option_reads_back_its_default_with_its_type():
    # e.g. --alpha 1 must be the float 1.0 a preset writes, not the int 1: run keys hash the settings' JSON
    for opt in options():
        if opt.parse is None or opt.default in (UNSET, None):
            continue
        text = f"{opt.default:g}" if isinstance(opt.default, float) else str(opt.default)
        value = opt.parse(text)
        assert value == opt.default and type(value) is type(opt.default), (opt.param, value)


def test_every_parameter_of_the_trainer_and_the_federation_is_an_option_or_says_why_not():
    from fedselect.data import make_federation

    params = set(inspect.signature(fedselect.FederatedTrainer.__init__).parameters) | set(
        inspect.signature(make_federation).parameters
    )
    params -= {"self", "partition_params"}
    generated = {opt.param for opt in options() if opt.owner in ("FederatedTrainer", "make_federation")}
    assert params - generated <= set(NOT_OPTIONS), sorted(params - generated - set(NOT_OPTIONS))
    assert not generated & set(NOT_OPTIONS)
    # the partition schemes' parameters too, with the names the command line always had
    flags = {flag for opt in options() for flag in opt.flags}
    assert {"--shards-per-client", "--alpha", "--min-samples", "--beta", "--target", "--threads"} <= flags


@pytest.mark.parametrize(
    "name",
    ["digits-skew", "digits-quick", "fedcor-fmnist-2spc", "hcsfed-fmnist-q0.1-calibrated", "ldcs-fmnist-k7-dir0.6"],
)
def test_a_preset_runs_exactly_its_settings(name):
    # stored runs are keyed on these mappings: a preset alone must give them unchanged (plus --threads' 1)
    preset = get_preset(name)
    for argv in (["reproduce", name], ["compare", "--preset", name], ["run", "--preset", name]):
        federation, trainer = _settings(build_parser().parse_args(argv), preset)
        assert federation == preset.federation
        assert trainer == {**preset.trainer, "n_threads": 1}


def test_options_override_the_preset_and_none_is_a_value():
    preset = get_preset("digits-skew")
    args = build_parser().parse_args(
        [
            "compare",
            "--divergence",
            "none",
            "--alpha",
            "1",
            "--partition",
            "dirichlet",
            "--no-stop-at-target",
            "--model-params",
            "dropout=0.5",
            "--lr-schedule",
            "150=0.5,300=0.5",
        ]
    )
    federation, trainer = _settings(args, preset)
    assert federation == {"dataset": "digits", "partition": "dirichlet", "alpha": 1.0, "n_clients": 20}
    assert type(federation["alpha"]) is float
    assert trainer["divergence"] is None and trainer["stop_at_target"] is False
    assert trainer["model_params"] == {"dropout": 0.5} and trainer["lr_schedule"] == {150: 0.5, 300: 0.5}


def test_plain_text_reads_like_text():
    assert plain_text("Active Federated Learning (Goetz et al. [1]_) as the code runs it [2]_.") == (
        "Active Federated Learning (Goetz et al.) as the code runs it."
    )
    assert plain_text(":class:`~fedselect.FederatedTrainer` with ``rounds`` and *emphasis*") == (
        "FederatedTrainer with rounds and emphasis"
    )
    assert plain_text("see `the docs <https://example.org>`_ and :ref:`the guide <guide>`") == (
        "see the docs and the guide"
    )


def test_list_shows_clean_text_and_the_papers(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert not re.search(r"\]_|``|:\w+:`|`", out), [line for line in out.splitlines() if "`" in line or "]_" in line]
    assert re.search(r"^  afl +Active Federated Learning \(Goetz et al\.\)", out, re.M)
    assert re.search(r"^ +\[1\] Goetz, J\., Malik", out, re.M)
    assert re.search(r"^ +aliases: pow-d, powd; plugin: fedselect\.selectors\.power_of_choice$", out, re.M)
