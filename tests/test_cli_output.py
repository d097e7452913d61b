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
from fedselect.cli import PYTHON_DEFAULTS, build_parser, main, plain_text

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
    cmd = [sys.executable, "-m", "fedselect.cli", "compare", "--selectors", "random", "afl", "--seeds", "0", "1",
           "--rounds", "3", "--n-clients", "10", "--clients-per-round", "2", "--out", str(tmp_path / "out")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)  # stderr is a pipe, no tty
    assert done.returncode == 0, done.stderr
    assert not ESCAPES.search(done.stderr), done.stderr[:500]
    lines = [line for line in done.stderr.splitlines() if re.match(r"\[\d/4\] ", line)]
    assert [line.split(":")[0] for line in lines] == [
        "[1/4] random seed 0", "[2/4] afl seed 0", "[3/4] random seed 1", "[4/4] afl seed 1"]
    assert all(re.search(r": 3 rounds in \d+\.\d s, final accuracy 0\.\d{3}", line) for line in lines), lines
    assert len(done.stderr) < 2000, done.stderr  # a few lines, not a bar's redraws


def test_a_trainer_with_progress_draws_no_bar_into_a_file(digits_fed, capsys):
    fedselect.FederatedTrainer(selector="random", clients_per_round=2, rounds=3, local_steps=1, progress=True,
                               random_state=0).fit(digits_fed)
    assert capsys.readouterr().err == ""  # captured stderr is not a terminal


def _options(parser: argparse.ArgumentParser, path: str = "fedselect"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield path, action


def test_every_option_has_help_and_its_default():
    seen = 0
    for path, action in _options(build_parser()):
        name = "/".join(action.option_strings) or action.dest
        assert action.help and action.help.strip(), f"{path} {name} has no help"
        takes_value = action.option_strings and action.nargs != 0  # not a flag such as --overwrite
        if takes_value:
            assert "default" in action.help, f"{path} {name}: help does not give the default: {action.help!r}"
            seen += 1
    assert seen > 40  # run, compare and reproduce, each with its federation and training options


def test_help_says_where_the_cli_defaults_differ_from_python(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "mean for digits-skew; differs from Python: FederatedTrainer's default is data-size" in out
    assert "0.8 for digits-skew" in out
    assert "stop_at_target=False" in out


def test_the_python_defaults_quoted_by_the_help_are_the_real_ones():
    from fedselect.compare import run_comparison
    from fedselect.data import make_federation

    signatures = {"FederatedTrainer": fedselect.FederatedTrainer, "make_federation": make_federation,
                  "run_comparison": run_comparison}
    for key, (where, value) in PYTHON_DEFAULTS.items():
        real = inspect.signature(signatures[where]).parameters[key].default
        if key == "local_epochs":
            assert real is None and "default 1 epoch" in fedselect.FederatedTrainer.__doc__
        else:
            assert real == value, f"{where}'s {key} defaults to {real!r}, the CLI's help says {value!r}"


def test_plain_text_reads_like_text():
    assert plain_text("Active Federated Learning (Goetz et al. [1]_) as the code runs it [2]_.") == (
        "Active Federated Learning (Goetz et al.) as the code runs it.")
    assert plain_text(":class:`~fedselect.FederatedTrainer` with ``rounds`` and *emphasis*") == (
        "FederatedTrainer with rounds and emphasis")
    assert plain_text("see `the docs <https://example.org>`_ and :ref:`the guide <guide>`") == (
        "see the docs and the guide")


def test_list_shows_clean_text_and_the_papers(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert not re.search(r"\]_|``|:\w+:`|`", out), [line for line in out.splitlines() if "`" in line or "]_" in line]
    assert re.search(r"^  afl +Active Federated Learning \(Goetz et al\.\)", out, re.M)
    assert re.search(r"^ +\[1\] Goetz, J\., Malik", out, re.M)
    assert re.search(r"^ +aliases: pow-d, powd; plugin: fedselect\.selectors\.power_of_choice$", out, re.M)
