"""The command line answers bad input with one line and exit status 2, before any training.

Each case is one invalid input a user may type; the test asserts the exit status, that
stderr holds exactly one ``fedselect: error:`` line (the last) naming what is wrong and no
traceback, and (for everything checkable up front) that no round was trained.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedselect.cli import main
from fedselect.simulation import loop

from .data.test_datasets import write_idx, write_idx_dataset

SMALL = [
    "--n-clients",
    "8",
    "--clients-per-round",
    "2",
    "--rounds",
    "2",
    "--model",
    "logistic",
    "--local-steps",
    "1",
    "--no-progress",
]


@pytest.fixture
def data(tmp_path, monkeypatch):
    """Tiny MNIST-format directories: good, one corrupted label byte, one truncated .gz."""
    monkeypatch.delenv("FEDSELECT_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    dirs = {}
    arrays = write_idx_dataset(tmp_path / "bad-label", n_train=24)
    labels = arrays["train-labels-idx1-ubyte"].copy()
    labels[3] = 200
    write_idx(tmp_path / "bad-label" / "train-labels-idx1-ubyte", labels)
    dirs["bad-label"] = tmp_path / "bad-label"
    write_idx_dataset(tmp_path / "truncated", n_train=24, gz=True)
    gz = tmp_path / "truncated" / "train-images-idx3-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:-10])
    dirs["truncated"] = tmp_path / "truncated"
    (tmp_path / "a-file").write_text("not a directory")
    dirs["file"] = tmp_path / "a-file"
    (tmp_path / "a-dir").mkdir()
    dirs["dir"] = tmp_path / "a-dir"
    dirs["tmp"] = tmp_path
    return dirs


# (arguments, what the one error line must contain, checked before training?)
# "{x}" in an argument is filled from the `data` fixture.
CASES = [
    # selectors and their parameters
    (["run", "--selector", "no-such-scheme"], "no-such-scheme", True),
    (["run", "--selector", "power-of-choice:d=0"], "PowerOfChoiceSelector: parameter d=0 is invalid", True),
    (["run", "--selector", "power-of-choice:d=1.5"], "parameter d=1.5", True),
    (["run", "--selector", "fedcor:gp_lr=1e6"], "FedCorSelector: parameter gp_lr=1000000.0", True),
    (["run", "--selector", "fedcor:rank=0"], "parameter rank=0", True),
    (["run", "--selector", "fedcor:schedule=nope"], "parameter schedule='nope'", True),
    (["run", "--selector", "fedcor:beta=nan"], "parameter beta='nan'", True),
    (["run", "--selector", "random:replace=1"], "RandomSelector: parameter replace=1", True),
    (["run", "--selector", "random:random_state=-1"], "parameter random_state=-1", True),
    (["run", "--selector", "random:nope=1"], "nope", True),
    (["run", "--selector", "random:replace"], "must look like name=value", True),
    (["run", "--selector", "afl:alpha1=1.0"], "ActiveFLSelector: parameter alpha1=1.0", True),
    (["run", "--selector", "ldcs:initial=first"], "parameter initial='first'", True),
    (["run", "--selector", "clustered:method=nope"], "parameter method='nope'", True),
    (["run", "--selector", "ocs:budget=0"], "parameter budget=0", True),
    (["run", "--selector", "data-size:mode=poisson"], "parameter mode='poisson'", True),
    (["run", "--selector", "round-robin:flsim=2"], "parameter flsim=2", True),
    (["run", "--selector", "hcsfed:compression_rate=0"], "parameter compression_rate=0", True),
    (["run", "--selector", "hcsfed:n_clusters=100"], "n_clusters=100", True),
    # training options
    (["run", "--threads", "0"], "parameter n_threads=0", True),
    (["run", "--threads", "-1"], "parameter n_threads=-1", True),
    (["run", "--seed", "-1"], "seed -1 is invalid", True),
    (["run", "--rounds", "0"], "parameter rounds=0", True),
    (["run", "--lr", "-1"], "parameter lr=-1.0", True),
    (["run", "--lr", "nan"], "parameter lr=nan", True),
    (["run", "--lr", "inf"], "parameter lr=inf", True),
    (["run", "--batch-size", "0"], "parameter batch_size=0", True),
    (["run", "--clients-per-round", "0"], "parameter clients_per_round=0", True),
    (["run", "--clients-per-round", "100"], "parameter clients_per_round=100", True),
    (["run", "--local-epochs", "0"], "parameter local_epochs=0", True),
    (["run", "--local-steps", "0"], "parameter local_steps=0", True),
    (["run", "--weight-decay", "-1"], "parameter weight_decay=-1.0", True),
    (["run", "--prox-mu", "-0.5"], "parameter prox_mu=-0.5", True),
    (["run", "--target", "1.5"], "parameter target_accuracy=1.5", True),
    (["run", "--target", "0"], "parameter target_accuracy=0.0", True),
    (["run", "--divergence", "0.5"], "parameter divergence=0.5", True),
    (["run", "--local-steps", "1", "--local-epochs", "1"], "set local_steps or local_epochs, not both", True),
    (["run", "--lr-schedule", "150=-1"], "lr_schedule", True),
    (["run", "--model-params", "depth=3"], "depth", True),
    (["run", "--model", "no-such-model"], "no-such-model", True),
    (["run", "--preset", "no-such-preset"], "no-such-preset", True),
    # the federation and its data
    (["run", "--n-clients", "0"], "parameter n_clients=0", True),
    (["run", "--n-clients", "100000"], "n_clients=100000", True),
    (["run", "--partition", "pathological"], "parameter partition='pathological'", True),
    (["run", "--partition", "shards", "--shards-per-client", "0"], "shards_per_client=0", True),
    (["run", "--partition", "dirichlet", "--alpha", "-1"], "alpha=-1.0", True),
    (["run", "--holdout", "1.0"], "parameter holdout=1.0", True),
    (["run", "--holdout", "-0.1"], "parameter holdout=-0.1", True),
    (["run", "--dataset", "no-such-data"], "no-such-data", True),
    (["run", "--dataset", "mnist", "--data-dir", "{dir}"], "FileNotFoundError", True),
    (
        ["run", "--dataset", "mnist", "--data-dir", "{bad-label}"],
        "train-labels-idx1-ubyte: 1 label(s) outside 0..9",
        True,
    ),
    (
        ["run", "--dataset", "mnist", "--data-dir", "{truncated}"],
        "train-images-idx3-ubyte.gz: corrupted or truncated",
        True,
    ),
    # output
    (["run", "--out", "{file}/h.json"], "does not exist", True),
    (["run", "--out", "{dir}"], "is a directory", True),
    (["compare", "--selectors", "random", "--seeds", "0", "--out", "{file}"], "cannot write results into", True),
    # comparisons
    (["compare", "--selectors", "random", "--seeds", "0", "0", "--out", "{tmp}/c"], "repeat [0]", True),
    (["compare", "--selectors", "random", "--seeds", "-1", "--out", "{tmp}/c"], "seed -1 is invalid", True),
    (
        ["compare", "--selectors", "p q=random", "p-q=random", "--seeds", "0", "--out", "{tmp}/c"],
        "labels 'p q' and 'p-q' would both be saved as runs/p-q__seed<k>.json",
        True,
    ),
    (
        ["compare", "--selectors", "random", "power-of-choice:d=0", "--seeds", "0", "--out", "{tmp}/c"],
        "scheme 'power-of-choice(d=0)': PowerOfChoiceSelector: parameter d=0",
        True,
    ),
    (
        ["compare", "--selectors", "random", "fedcor:gp_lr=2", "--seeds", "0", "--out", "{tmp}/c"],
        "parameter gp_lr=2",
        True,
    ),
    (
        ["compare", "--selectors", "random", "--seeds", "0", "--threads", "0", "--out", "{tmp}/c"],
        "parameter n_threads=0",
        True,
    ),
    (
        ["compare", "--selectors", "random", "--seeds", "0", "--paired", "nope", "--out", "{tmp}/c"],
        "--paired 'nope' is not one of the schemes compared",
        True,
    ),
    (["compare", "--selectors", "random", "--seeds", "0", "--lr", "0", "--out", "{tmp}/c"], "parameter lr=0.0", True),
    (["reproduce", "no-such-preset"], "no-such-preset", True),
]

ARGPARSE_CASES = [
    ["run", "--rounds", "abc"],
    ["run", "--aggregation", "median"],
    ["run", "--loss", "hinge"],
    ["run", "--model-params", "dropout"],
    ["run", "--no-such-option", "1"],
    ["compare", "--seeds", "x"],
    ["no-such-command"],
]


def _fill(args, data):
    return [a.format(**data) if "{" in a else a for a in args]


def _ids(case):
    return " ".join(case[0])[:60]


@pytest.mark.parametrize("args, expected, before_training", CASES, ids=[_ids(c) for c in CASES])
def test_invalid_input_is_one_line_and_status_2(args, expected, before_training, data, capsys, monkeypatch):
    if before_training:

        def no_training(*a, **k):
            raise AssertionError("a round was trained before the input was checked")

        monkeypatch.setattr(loop, "_open", no_training)
    argv = _fill(args, data)
    if argv[0] != "reproduce":
        argv = _merge(argv)
    status = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("fedselect: error:")]
    assert status == 2, err
    assert len(errors) == 1 and lines[-1] == errors[0], err
    assert "Traceback" not in err
    assert expected in errors[0], errors[0]


def _merge(argv):
    """SMALL's options that the case does not set itself."""
    out = list(argv)
    i = 0
    while i < len(SMALL):
        opt = SMALL[i]
        takes_value = i + 1 < len(SMALL) and not SMALL[i + 1].startswith("--")
        if opt not in out:
            out += SMALL[i : i + 2] if takes_value else [opt]
        i += 2 if takes_value else 1
    return out


@pytest.mark.parametrize("args", ARGPARSE_CASES, ids=[" ".join(a) for a in ARGPARSE_CASES])
def test_malformed_options_are_argparse_errors(args, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


def test_debug_shows_the_traceback(capsys):
    with pytest.raises(ValueError, match="n_threads=0"):
        main(["--debug", "run", "--threads", "0", *SMALL])


def test_an_internal_bug_keeps_its_traceback(monkeypatch):
    def bug(*a, **k):
        raise AttributeError("internal")

    monkeypatch.setattr(loop, "_open", bug)
    with pytest.raises(AttributeError, match="internal"):
        main(["run", *SMALL])


def test_a_diverged_run_is_one_line(monkeypatch, capsys):
    def diverge(*a, **k):
        raise FloatingPointError("round 0: the global model is not finite")

    monkeypatch.setattr(loop, "_open", diverge)
    assert main(["run", *SMALL]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "fedselect: error: DivergenceError: round 0: the global model is not finite"
    )


def test_a_preset_partition_parameter_does_not_leak_into_another_partition(capsys):
    # digits-quick uses shards (shards_per_client); asking for dirichlet must not pass that on
    assert main(["run", "--partition", "dirichlet", "--alpha", "0.5", *SMALL]) == 0


def test_no_runs_written_when_a_scheme_is_refused(tmp_path):
    out = tmp_path / "c"
    main(["compare", "--selectors", "random", "ocs:budget=0", "--seeds", "0", "1", "--out", str(out), *SMALL])
    assert not list((out / "runs").glob("*.json")) if (out / "runs").exists() else True


def test_count_of_invalid_inputs():
    # reported in the closing note: invalid CLI inputs exercised here
    assert len(CASES) + len(ARGPARSE_CASES) >= 60
    assert np.all([isinstance(c[1], str) and c[1] for c in CASES])


def test_a_broken_installed_plugin_leaves_help_working_and_commands_name_it(monkeypatch, capsys):
    import types

    from fedselect import _registry

    class _Broken:
        name = "broken"
        value = "fedselect_broken"
        dist = types.SimpleNamespace(name="fedselect-broken")

        def load(self):
            raise ImportError("No module named 'fedselect_broken'")

    monkeypatch.setattr(_registry, "_entry_points", lambda: [_Broken()])
    monkeypatch.setattr(_registry, "_loaded", False)
    monkeypatch.delenv("FEDSELECT_PLUGINS", raising=False)
    with pytest.raises(SystemExit) as info:
        main(["compare", "--help"])
    assert info.value.code == 0 and "--shards-per-client" in capsys.readouterr().out
    assert main(["reproduce", "digits-skew", "--seeds", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'broken' from distribution 'fedselect-broken' failed to load" in err[0]
