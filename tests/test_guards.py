"""Guard rails (issue 33, item 5): bounded spells, finite times, clear errors naming the file and the field,
no silent truncation or overwrite, run files whose simulated times are inconsistent refused as corrupt."""

from __future__ import annotations

import argparse
import json
import re
import warnings

import numpy as np
import pytest

from fedselect.cli import _mapping, parse_selector_spec
from fedselect.data.federation import resolve_profiles
from fedselect.profiles import (
    MAX_SECONDS_PER_SAMPLE,
    MAX_SPELLS,
    MIN_BANDWIDTH,
    SystemProfiles,
    homogeneous,
    sample_profiles,
)

# --------------------------------------------------------------------------- spells


def test_tiny_spells_are_refused_before_drawing():
    """The probe's kind=mobile,mean_online=0.001,mean_offline=0.001 drew 4e7 spells per client and never ended."""
    with pytest.raises(ValueError, match=r"mean_online=0.001.*on/off cycles per client; at most 10000"):
        resolve_profiles({"kind": "mobile", "mean_online": 0.001, "mean_offline": 0.001}, 20, random_state=0)


def test_spell_bound_is_the_mean_number_of_cycles():
    """Exactly MAX_SPELLS cycles on average are drawn; one more is refused."""
    ok = sample_profiles(2, random_state=0, mean_online=1.0, mean_offline=1.0, horizon=2.0 * MAX_SPELLS)
    assert 0 < ok.availability.n_intervals < 3 * MAX_SPELLS
    with pytest.raises(ValueError, match="on/off cycles"):
        sample_profiles(2, random_state=0, mean_online=1.0, mean_offline=1.0, horizon=2.0 * MAX_SPELLS + 4)


# --------------------------------------------------------------------------- finite times


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"kind": "homogeneous", "bandwidth": 1e-310}, "bandwidth"),
        ({"kind": "mobile", "bandwidth_median": 1e-310}, "bandwidth_median"),
        ({"kind": "homogeneous", "seconds_per_sample": 1e308}, "seconds_per_sample"),
        ({"kind": "mobile", "compute_median": 1e300}, "compute_median"),
        ({"kind": "homogeneous", "latency": 1e300}, "latency"),
    ],
)
def test_profiles_that_would_give_infinite_times_are_refused(spec, field):
    with pytest.raises(ValueError, match=rf"profiles=.*{field}=.*is invalid"):
        resolve_profiles(spec, 4, random_state=0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"download_bandwidth": [1e-310, 1.0]}, "download_bandwidth"),
        ({"upload_bandwidth": [1.0, MIN_BANDWIDTH / 2]}, "upload_bandwidth"),
        ({"seconds_per_sample": [MAX_SECONDS_PER_SAMPLE * 2, 1.0]}, "seconds_per_sample"),
        ({"latency": [0.0, 1e300]}, "latency"),
    ],
)
def test_system_profiles_bounds_name_the_field_and_entry(kwargs, field):
    args = {"seconds_per_sample": [0.01, 0.01], "download_bandwidth": [1.0, 1.0], "upload_bandwidth": [1.0, 1.0]}
    args.update(kwargs)
    with pytest.raises(ValueError, match=rf"SystemProfiles: {field} must be at (least|most) .*finite; entry \d"):
        SystemProfiles(**args)


def test_the_bounds_keep_the_slowest_exchange_finite():
    p = SystemProfiles([MAX_SECONDS_PER_SAMPLE], [MIN_BANDWIDTH], [MIN_BANDWIDTH], [1e9])
    t = p.round_time([0], bytes_down=1e13, bytes_up=1e13, n_samples=1e12)
    assert np.isfinite(t).all() and t[0] > 1e18


def test_round_time_refuses_an_infinite_exchange():
    p = homogeneous(2, seconds_per_sample=1.0, bandwidth=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning either: the error says it
        with pytest.raises(ValueError, match=r"client 1's exchange would last inf s"):
            p.round_time([1], bytes_down=1e308, bytes_up=1e308, n_samples=1)


# --------------------------------------------------------------------------- profiles files


def _profiles_file(tmp_path, **changes):
    d = homogeneous(2, bandwidth=1e6).to_dict()
    d.update(changes)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    return path


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"latency": [10**400, 0]}, r"latency must be an array of numbers"),
        ({"n_clients": None}, r"n_clients must be a whole number of clients, not None"),
        ({"n_clients": 2.5}, r"n_clients must be a whole number of clients, not 2.5"),
        ({"n_clients": 2.0}, r"n_clients must be a whole number of clients, not 2.0"),
        ({"n_clients": True}, r"n_clients must be a whole number"),
        ({"download_bandwidth": [1e-310, 1e6]}, r"download_bandwidth must be at least"),
        ({"seconds_per_sample": [1e308, 0.1]}, r"seconds_per_sample must be at most"),
    ],
)
def test_profiles_file_errors_name_the_file_and_the_field(tmp_path, changes, match):
    path = _profiles_file(tmp_path, **changes)
    with pytest.raises(ValueError, match=match) as info:
        SystemProfiles.load(path)
    assert str(path) in str(info.value)
    with pytest.raises(ValueError, match=match):  # and through make_federation's profiles=
        resolve_profiles(str(path), 2)


def test_profiles_file_with_an_overflowing_period_names_the_file(tmp_path):
    d = sample_profiles(2, random_state=0, mean_online=10.0, mean_offline=10.0, horizon=100.0).to_dict()
    d["availability_period"] = [10**400, None]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=rf"{path}: .*period must be numbers"):
        SystemProfiles.load(path)


def test_deeply_nested_profiles_json_is_an_error_naming_the_file(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ValueError, match=rf"{path}: not a profiles JSON file \(RecursionError"):
        SystemProfiles.load(path)


def test_a_whole_n_clients_still_loads(tmp_path):
    path = _profiles_file(tmp_path)
    assert SystemProfiles.load(path) == homogeneous(2, bandwidth=1e6)
    npz = tmp_path / "p.npz"
    homogeneous(2, bandwidth=1e6).save(npz)
    assert SystemProfiles.load(npz) == homogeneous(2, bandwidth=1e6)


# --------------------------------------------------------------------------- key=value options


@pytest.mark.parametrize("text", ["kind=mobile,mean_online=60,mean_online=6000", "a=1, a =2"])
def test_repeated_keys_in_a_mapping_option_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match=r"repeats 'mean_online'|repeats 'a'"):
        _mapping(text)


def test_repeated_selector_parameters_are_refused():
    with pytest.raises(argparse.ArgumentTypeError, match=r"repeats 'd'"):
        parse_selector_spec("power-of-choice:d=10,d=20")
    assert parse_selector_spec("power-of-choice:d=10")[2] == {"d": 10}


def test_repeated_keys_on_the_command_line_fail_before_training(tmp_path, capsys):
    from fedselect.cli import main

    for option in ("--profiles", "--model-params"):
        value = "kind=mobile,mean_online=60,mean_online=600" if option == "--profiles" else "dropout=0.1,dropout=0.5"
        with pytest.raises(SystemExit) as info:
            main(["compare", "--selectors", "random", "--rounds", "1", "--seeds", "1", option, value, "--out",
                  str(tmp_path / "out"), "--no-progress"])  # fmt: skip
        assert info.value.code != 0
        assert "repeats" in capsys.readouterr().err
        assert not (tmp_path / "out" / "runs").exists()


# --------------------------------------------------------------------------- run files


def _clocked_history(times):
    from fedselect.simulation import Costs, History, RoundRecord

    rounds = [
        RoundRecord(
            round=t,
            clients=[0],
            weights=[1.0],
            lr=0.1,
            test_accuracy=0.5,
            costs=Costs(models_down=1),
            sim_seconds=None if s is None else 1.0,
            sim_time=s,
        )
        for t, s in enumerate(times)
    ]
    return History(rounds, model_size=10)


@pytest.mark.parametrize(
    ("times", "match"),
    [
        ([1.0, 3.0, 2.0], r"sim_time goes backwards at round 2 \(3.0 s, then 2.0 s\)"),
        ([1.0, None, 3.0], r"rounds \[1\] have no sim_time while others have one"),
        ([None, None, 3.0], r"rounds \[0, 1\] have no sim_time"),
    ],
)
def test_a_run_file_with_inconsistent_simulated_times_is_corrupt(times, match):
    from fedselect.experiments.results import parse_result

    text = json.dumps({"key": "k", "label": "x", "seed": 0, "history": _clocked_history(times).to_dict()})
    saved, reason = parse_result(text)
    assert saved is None
    assert reason is not None and re.search(match, reason), reason


@pytest.mark.parametrize("times", [[1.0, 2.0, 2.0], [None, None, None]])
def test_consistent_simulated_times_still_load(times):
    from fedselect.experiments.results import parse_result

    text = json.dumps({"key": "k", "label": "x", "seed": 0, "history": _clocked_history(times).to_dict()})
    assert parse_result(text)[1] is None


def _compare(out, *extra):
    from fedselect.cli import main

    return main(["compare", "--selectors", "random", "--rounds", "3", "--seeds", "1", "--n-clients", "6",
                 "--clients-per-round", "2", "--out", str(out), "--no-progress", "--no-paired", *extra])  # fmt: skip


@pytest.mark.parametrize("damage", ["backwards", "removed"])
def test_a_comparison_reruns_a_run_whose_times_were_damaged_and_keeps_its_table(tmp_path, damage, capsys):
    """A damaged run file loaded as finished and changed the table; it is now moved aside and the run redone."""
    out = tmp_path / "cmp"
    assert _compare(out, "--profiles", "homogeneous") == 0
    (path,) = sorted((out / "runs").glob("*.json"))
    table = (out / "results.csv").read_text()  # no wall-clock column
    d = json.loads(path.read_text())
    rounds = d["history"]["rounds"]
    if damage == "backwards":
        rounds[1]["sim_time"] = rounds[0]["sim_time"] / 2
    else:
        for r in rounds[1:]:
            r["sim_time"] = r["sim_seconds"] = None
    path.write_text(json.dumps(d))
    with pytest.warns(UserWarning, match=r"sim_time"):
        assert _compare(out, "--profiles", "homogeneous") == 0
    assert list((out / "runs").glob("*.corrupt-*"))  # kept for inspection
    assert (out / "results.csv").read_text() == table  # redone: the same run, the same table


def test_profiles_with_infinite_times_fail_before_any_run_file(tmp_path, capsys):
    """A 1e-310 bandwidth gave inf seconds, a run file refused as corrupt, and the run redone at every rerun."""
    out = tmp_path / "cmp"
    for _ in range(2):
        assert _compare(out, "--profiles", "kind=homogeneous,bandwidth=1e-310") != 0
        assert "bandwidth=1e-310 is invalid" in capsys.readouterr().err
        assert not list(out.glob("runs/*"))


def test_a_fedscale_trace_that_would_give_infinite_times_names_the_trace(tmp_path):
    import pickle

    from fedselect.profiles import convert_fedscale_traces, from_fedscale

    for entry, field in (
        ({"computation": 10.0, "communication": 1e-310}, "communication_kbps must be at least"),
        ({"computation": 1e308, "communication": 100.0}, "computation_ms must be at most"),
    ):
        src = tmp_path / "client_device_capacity"
        src.write_bytes(pickle.dumps({0: {"computation": 10.0, "communication": 100.0}, 1: entry}))
        convert_fedscale_traces(src, tmp_path / "dev.npz")
        with pytest.raises(ValueError, match=rf"{tmp_path / 'dev.npz'}: {field}.*entry 1"):
            from_fedscale(tmp_path / "dev.npz", n_clients=2)
