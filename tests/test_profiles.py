"""Device and network profiles (issue 22, item 2): validation, availability, the time model, FedScale traces, files."""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
from pathlib import Path

import numpy as np
import pytest

import fedselect
from fedselect._validation import InvalidParameterError
from fedselect.data import Federation, make_federation
from fedselect.profiles import (
    BYTES_PER_KBIT,
    Availability,
    SystemProfiles,
    convert_fedscale_traces,
    fit_sample_parameters,
    from_fedscale,
    homogeneous,
    main,
    sample_profiles,
)


def two_clients(**kw):
    return SystemProfiles([0.01, 0.02], [1e6, 2e6], [5e5, 1e6], **kw)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seconds_per_sample": [0.01, np.nan]}, r"seconds_per_sample .*entry 1 is nan"),
        ({"seconds_per_sample": [0.01, 0.0]}, r"seconds_per_sample must hold finite positive"),
        ({"seconds_per_sample": [0.01, -1.0]}, r"entry 1 is -1.0"),
        ({"seconds_per_sample": [[0.01, 0.02]]}, r"must be 1-D"),
        ({"seconds_per_sample": []}, r"at least one client"),
        ({"seconds_per_sample": ["a", "b"]}, r"must be an array of numbers"),
        ({"download_bandwidth": [1e6, np.inf]}, r"download_bandwidth .*entry 1 is inf"),
        ({"download_bandwidth": [1e6]}, r"download_bandwidth has 1 entries but there are 2 clients"),
        ({"upload_bandwidth": [1e6, 0]}, r"upload_bandwidth .*entry 1 is 0.0"),
        ({"latency": [0.0, -0.1]}, r"latency must hold finite non-negative"),
    ],
)
def test_profiles_refuse_bad_arrays(kwargs, match):
    args = {"seconds_per_sample": [0.01, 0.02], "download_bandwidth": [1e6, 2e6], "upload_bandwidth": [5e5, 1e6]}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        SystemProfiles(**args)


def test_profiles_refuse_mismatched_availability():
    with pytest.raises(ValueError, match="availability covers 1 clients but there are 2"):
        two_clients(availability=Availability.from_intervals([[(0, 1)]]))
    with pytest.raises(TypeError, match="availability must be an Availability"):
        two_clients(availability=[[(0, 1)], [(0, 1)]])


@pytest.mark.parametrize(
    ("intervals", "period", "match"),
    [
        ([[(0, 5), (3, 8)]], None, r"client 0's intervals \[0.0, 5.0\) and \[3.0, 8.0\) overlap or are not sorted"),
        ([[(6, 8), (0, 5)]], None, r"overlap or are not sorted"),
        ([[(5, 5)]], None, r"interval 0 is \[5.0, 5.0\); each interval needs start < end"),
        ([[(5, 4)]], None, r"start < end"),
        ([[(-1, 4)]], None, r"starts must hold finite non-negative"),
        ([[(0, np.inf)]], None, r"ends must hold finite"),
        ([[(0, 50)]], 40, r"client 0's interval \[0.0, 50.0\) ends after its period 40.0"),
        ([[(0, 5)]], 0, r"period must be positive"),
        ([[(0, 5)]], [1, 2], r"period must be a number or one per client"),
    ],
)
def test_availability_refuses_bad_intervals(intervals, period, match):
    with pytest.raises(ValueError, match=match):
        Availability.from_intervals(intervals, period)


def test_availability_checks_its_csr_arrays():
    with pytest.raises(ValueError, match="offsets must start at 0 and never decrease"):
        Availability([0, 2, 1], [0, 2], [1, 3])
    with pytest.raises(ValueError, match="offsets must be a 1-D integer array"):
        Availability([0.0, 1.0], [0], [1])
    with pytest.raises(ValueError, match="offsets\\[-1\\] is 2; all three must agree"):
        Availability([0, 2], [0], [1])
    # intervals of different clients may overlap; touching intervals of one client are fine
    av = Availability.from_intervals([[(0, 5), (5, 9)], [(1, 7)]])
    assert av.n_intervals == 3 and av.n_clients == 2


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: homogeneous(0), r"homogeneous: parameter n_clients=0 is invalid"),
        (lambda: homogeneous(3, bandwidth=0.0), r"parameter bandwidth=0.0 is invalid"),
        (lambda: homogeneous(3, latency=-1.0), r"parameter latency=-1.0"),
        (lambda: sample_profiles(3, compute_sigma=-0.1), r"sample_profiles: parameter compute_sigma=-0.1"),
        (lambda: sample_profiles(3, bandwidth_median=float("nan")), r"parameter bandwidth_median=nan"),
        (lambda: sample_profiles(3, random_state=-1), r"parameter random_state=-1"),
        (lambda: sample_profiles(3, mean_online=0.0), r"parameter mean_online=0.0"),
        (lambda: sample_profiles(2.5), r"parameter n_clients=2.5"),
        (lambda: from_fedscale("x.npz", n_clients=3, mapping="hash"), r"from_fedscale: parameter mapping='hash'"),
        (lambda: from_fedscale("x.npz", n_clients=3, offset=-1), r"parameter offset=-1"),
    ],
)
def test_generators_refuse_bad_parameters(call, match):
    with pytest.raises(InvalidParameterError, match=match):
        call()


def test_queries_refuse_bad_input():
    p = two_clients(availability=Availability.from_intervals([[(0, 1)], [(0, 1)]]))
    with pytest.raises(ValueError, match=r"out of range"):
        p.available([0, 2], 0.0)
    with pytest.raises(ValueError, match=r"must be integers"):
        p.round_time([0.0], 1, 1, 1)
    with pytest.raises(ValueError, match=r"t must be finite"):
        p.available([0], np.nan)
    with pytest.raises(ValueError, match=r"one number per client \(2\)"):
        p.next_available([0, 1], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"bytes_down must be finite and non-negative"):
        p.round_time([0], -1.0, 1, 1)
    with pytest.raises(ValueError, match=r"n_samples must be a number or one number per client"):
        p.round_time([0, 1], 1, 1, [1, 2, 3])
    with pytest.raises(ValueError, match=r"compute_factor must be a finite number"):
        p.round_time([0], 1, 1, 1, compute_factor=True)


# --------------------------------------------------------------------------- availability


def test_availability_at_interval_boundaries():
    av = Availability.from_intervals([[(10, 20), (20, 30), (40, 50)], [], [(0, 5)]], period=[np.inf, np.inf, 60])
    c0 = [0] * 8
    t0 = [9.999, 10, 19.999, 20, 30, 39.999, 40, 50]
    assert av.available(c0, t0).tolist() == [False, True, True, True, False, False, True, False]
    assert av.next_available(c0, t0).tolist() == [10, 10, 19.999, 20, 40, 40, 40, math.inf]
    assert av.available([1, 1], [0, 1e9]).tolist() == [False, False]  # no intervals: never online
    assert av.next_available([1], [0]).tolist() == [math.inf]
    # periodic: [0, 5) repeats every 60 s
    t2 = [0, 4.999, 5, 59.999, 60, 125, 1e6 + 0.5]
    assert av.available([2] * 7, t2).tolist() == [True, True, False, False, True, False, False]
    assert av.next_available([2] * 7, t2).tolist() == [0, 4.999, 60, 60, 60, 180, 1e6 + 20]
    assert av.intervals(0).tolist() == [[10, 20], [20, 30], [40, 50]]


def _reference(intervals, period, client, t):
    """Availability by brute force over periods, as FedScale's trace is meant to be read (half-open)."""
    ivs, per = intervals[client], period[client]
    tau, base = (t % per, t - t % per) if math.isfinite(per) else (t, 0.0)
    if any(a <= tau < b for a, b in ivs):
        return True, t
    later = [a for a, _ in ivs if a > tau]
    if later:
        return False, base + min(later)
    if ivs and math.isfinite(per):
        return False, base + per + ivs[0][0]
    return False, math.inf


def test_vectorised_queries_match_a_plain_loop():
    rng = np.random.default_rng(0)
    intervals, period = [], []
    for k in range(60):
        cuts = np.sort(rng.choice(np.arange(1, 100), size=2 * rng.integers(0, 6), replace=False)).astype(float)
        intervals.append([(cuts[i], cuts[i + 1]) for i in range(0, cuts.size, 2)])
        period.append(100.0 if k % 2 else math.inf)
    av = Availability.from_intervals(intervals, period)
    clients = rng.integers(0, 60, size=3000)
    times = np.concatenate([rng.uniform(0, 400, 2000), rng.integers(0, 400, 1000).astype(float)])  # boundaries too
    ref = [_reference(intervals, period, int(c), float(t)) for c, t in zip(clients, times)]
    np.testing.assert_array_equal(av.available(clients, times), [r[0] for r in ref])
    np.testing.assert_allclose(av.next_available(clients, times), [r[1] for r in ref])


def test_profiles_without_availability_are_always_online():
    p = two_clients()
    assert p.available([0, 1], 123.0).tolist() == [True, True]
    assert p.next_available([0, 1], [5.0, 7.0]).tolist() == [5.0, 7.0]


# --------------------------------------------------------------------------- the time model


def test_round_time_matches_a_hand_calculation():
    p = SystemProfiles([0.004, 0.010], [1e6, 4e6], [2e5, 1e6], latency=[0.0, 0.05])
    # client 0: 3 x 32 x 10 x 0.004 = 3.84 s compute; 2e6 / 1e6 = 2 s down; 2e6 / 2e5 = 10 s up
    # client 1: 3 x 32 x 10 x 0.010 = 9.6 s; 0.5 s down; 2 s up; 2 x 0.05 s latency
    t = p.round_time([0, 1], bytes_down=2e6, bytes_up=2e6, n_samples=320)
    np.testing.assert_allclose(t, [3.84 + 2 + 10, 9.6 + 0.5 + 2 + 0.1])
    parts = p.round_time(
        [1, 0], bytes_down=[4e6, 0.0], bytes_up=[100.0, 100.0], n_samples=[50, 0], compute_factor=1.0, parts=True
    )
    np.testing.assert_allclose(parts["download"], [1.0, 0.0])
    np.testing.assert_allclose(parts["upload"], [1e-4, 5e-4])
    np.testing.assert_allclose(parts["compute"], [0.5, 0.0])  # evaluation: one forward pass per sample
    np.testing.assert_allclose(parts["latency"], [0.1, 0.0])
    np.testing.assert_allclose(parts["total"], [1.6001, 0.0005])


def test_round_time_reproduces_fedscale_get_completion_time():
    # FedScale: computation = 3 * batch * steps * ms / 1000; communication = (up + down kbit) / kbps, with
    # kbit = bytes / 1024 * 8. A 20 ms/sample, 5,000 kbit/s device, batch 20, 5 steps, a 1 MiB model:
    ms, kbps, size_bytes = 20.0, 5000.0, 2**20
    fedscale = 3 * 20 * 5 * ms / 1000 + 2 * (size_bytes / 1024 * 8) / kbps
    p = SystemProfiles([ms / 1000], [kbps * BYTES_PER_KBIT], [kbps * BYTES_PER_KBIT])
    np.testing.assert_allclose(p.round_time([0], size_bytes, size_bytes, 20 * 5), [fedscale])


# --------------------------------------------------------------------------- sources


def test_homogeneous_is_one_device_and_the_sampled_median():
    p = homogeneous(4)
    assert np.unique(p.seconds_per_sample).size == 1 and p.availability is None
    np.testing.assert_array_equal(p.download_bandwidth, p.upload_bandwidth)
    big = sample_profiles(20_000, random_state=1)
    assert np.median(big.seconds_per_sample) == pytest.approx(p.seconds_per_sample[0], rel=0.03)
    assert np.median(big.download_bandwidth) == pytest.approx(p.download_bandwidth[0], rel=0.05)
    assert p.seconds_per_sample[0] == pytest.approx(0.005 * math.e / 3)  # FedScale's log-normal model / 3
    assert p.download_bandwidth[0] == 6100 * 128


def test_sampling_is_deterministic_and_fits_back():
    a, b = sample_profiles(50, random_state=3), sample_profiles(50, random_state=3)
    assert a == b and a.fingerprint() == b.fingerprint()
    assert a != sample_profiles(50, random_state=4)
    rs = np.random.RandomState(3)
    assert sample_profiles(50, random_state=rs) == a
    fit = fit_sample_parameters(
        sample_profiles(
            50_000,
            random_state=0,
            compute_sigma=0.4,
            bandwidth_sigma=0.9,
            bandwidth_median=1e6,
            compute_median=0.02,
            upload_ratio=0.25,
        )
    )
    assert fit["compute_median"] == pytest.approx(0.02, rel=0.01)
    assert fit["compute_sigma"] == pytest.approx(0.4, rel=0.02)
    assert fit["bandwidth_median"] == pytest.approx(1e6, rel=0.02)
    assert fit["bandwidth_sigma"] == pytest.approx(0.9, rel=0.02)
    assert fit["upload_ratio"] == pytest.approx(0.25)


def test_sampled_availability_is_an_on_off_process():
    p = sample_profiles(2000, random_state=0, mean_online=600.0, mean_offline=1800.0, horizon=7200.0)
    av = p.availability
    assert av is not None and av.n_clients == 2000 and np.all(av.period == 7200.0)
    assert av.starts.min() >= 0 and av.ends.max() <= 7200.0
    rng = np.random.default_rng(0)
    online = p.available(np.arange(2000), rng.uniform(0, 1e5, 2000)).mean()
    assert online == pytest.approx(600 / 2400, abs=0.04)  # the stationary share online
    assert sample_profiles(30, random_state=5, mean_online=60.0) == sample_profiles(
        30, random_state=5, mean_online=60.0
    )


def test_memory_is_linear_in_clients():
    n = 10_000
    p = sample_profiles(n, random_state=0, mean_online=3600.0, mean_offline=3600.0, horizon=86400.0)
    for arr in (p.seconds_per_sample, p.download_bandwidth, p.upload_bandwidth, p.latency, p.availability.period):
        assert arr.dtype == np.float64 and arr.shape == (n,) and arr.nbytes == 8 * n
        assert not arr.flags.writeable
    av = p.availability
    assert av.offsets.shape == (n + 1,) and av.starts.shape == av.ends.shape == (av.n_intervals,)
    assert av.n_intervals <= 16 * n  # about horizon / (mean on + mean off) = 12 spells per client
    sub = p.subset(np.arange(0, n, 10))
    assert sub.n_clients == n // 10 and sub.seconds_per_sample.nbytes == 8 * (n // 10)
    assert sub.availability.n_intervals == int(np.diff(av.offsets)[::10].sum())


def test_subset_keeps_each_clients_profile():
    av = Availability.from_intervals([[(0, 1)], [(2, 3), (4, 5)], []], period=[10, np.inf, 7])
    p = SystemProfiles([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [0.1, 0.2, 0.3], av)
    s = p.subset([2, 1, 1])
    assert s.seconds_per_sample.tolist() == [3.0, 2.0, 2.0] and s.latency.tolist() == [0.3, 0.2, 0.2]
    assert s.availability.intervals(1).tolist() == [[2, 3], [4, 5]] and s.availability.intervals(0).size == 0
    assert s.availability.period.tolist() == [7, np.inf, np.inf]


# --------------------------------------------------------------------------- files


@pytest.mark.parametrize("suffix", [".npz", ".json"])
@pytest.mark.parametrize("with_availability", [False, True])
def test_save_load_roundtrip(tmp_path, suffix, with_availability):
    p = sample_profiles(40, random_state=2, latency=0.01, mean_online=100.0 if with_availability else None)
    path = p.save(tmp_path / f"profiles{suffix}")
    q = SystemProfiles.load(path)
    assert q == p and q.fingerprint() == p.fingerprint()
    assert SystemProfiles.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_load_refuses_foreign_and_malformed_files(tmp_path):
    p = two_clients()
    with pytest.raises(ValueError, match=r"must end in .npz or .json"):
        p.save(tmp_path / "p.pkl")
    bad = tmp_path / "objects.npz"
    np.savez(
        bad,
        format=np.array("fedselect.system-profiles"),
        version=np.array(1),
        seconds_per_sample=np.array([object()], dtype=object),
    )
    with pytest.raises(ValueError, match=r"not a readable .npz of plain arrays"):
        SystemProfiles.load(bad)
    other = tmp_path / "other.npz"
    np.savez(other, format=np.array("something-else"), version=np.array(1))
    with pytest.raises(ValueError, match=r"format 'something-else'"):
        SystemProfiles.load(other)
    not_zip = tmp_path / "junk.npz"
    not_zip.write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(ValueError, match=r"not a readable"):
        SystemProfiles.load(not_zip)
    data = p.to_dict()
    with pytest.raises(ValueError, match=r"unknown entries \['code'\]"):
        SystemProfiles.from_dict({**data, "code": "__import__('os')"})
    with pytest.raises(ValueError, match=r"n_clients=3 but the arrays hold 2"):
        SystemProfiles.from_dict({**data, "n_clients": 3})
    with pytest.raises(ValueError, match=r"availability needs all of"):
        SystemProfiles.from_dict({**data, "availability_offsets": [0, 0, 0]})
    with pytest.raises(ValueError, match=r"entry 1 is -5.0"):
        SystemProfiles.from_dict({**data, "upload_bandwidth": [1.0, -5.0]})
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match=r"not a profiles JSON file"):
        SystemProfiles.load(broken)


# --------------------------------------------------------------------------- FedScale traces

MARKER: list[str] = []


def _plant(path):  # what a planted pickle would call if it were ever unpickled freely
    Path(path).write_text("ran")
    MARKER.append(path)


class _Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (_plant, (self.path,))


def _write_pickle(path, obj, protocol=pickle.HIGHEST_PROTOCOL):
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=protocol)
    return path


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_convert_fedscale_device_trace(tmp_path, protocol):
    trace = {
        1: {"computation": 20.0, "communication": 5000.0},
        2: {"computation": np.float32(40.0), "communication": np.float64(1000.0)},  # numpy scalars are read too
        0: {"computation": 10, "communication": 250.5},
    }
    src = _write_pickle(tmp_path / "client_device_capacity", trace, protocol)
    assert convert_fedscale_traces(src, tmp_path / "dev.npz") == {"kind": "device", "entries": 3}
    p = from_fedscale(tmp_path / "dev.npz", n_clients=5)  # modulo over the file's order: 1, 2, 0, 1, 2
    np.testing.assert_allclose(p.seconds_per_sample, [0.020, 0.040, 0.010, 0.020, 0.040])
    np.testing.assert_allclose(p.download_bandwidth, np.array([5000.0, 1000.0, 250.5, 5000.0, 1000.0]) * 128)
    np.testing.assert_array_equal(p.upload_bandwidth, p.download_bandwidth)
    assert p.availability is None and not p.latency.any()
    shifted = from_fedscale(tmp_path / "dev.npz", n_clients=2, offset=1)  # FedScale's own rule: ids from 1
    np.testing.assert_allclose(shifted.seconds_per_sample, [0.040, 0.010])
    r1 = from_fedscale(tmp_path / "dev.npz", n_clients=3, mapping="random", random_state=7)
    assert r1 == from_fedscale(tmp_path / "dev.npz", n_clients=3, mapping="random", random_state=7)
    assert sorted(r1.seconds_per_sample.tolist()) == [0.010, 0.020, 0.040]  # distinct entries while N <= M
    assert from_fedscale(tmp_path / "dev.npz", n_clients=7, mapping="random", random_state=0).n_clients == 7


def test_convert_fedscale_availability_trace(tmp_path):
    trace = {
        "a": {"active": [100, 10], "inactive": [200, 50], "finish_time": 1000, "duration": 900, "model": "Pixel"},
        "b": {
            "active": [0, 30, 500, 700],
            "inactive": [40, 60, 400, 2000],
            "finish_time": 800,
            "duration": 1,
            "model": "x",
        },  # overlap merged, reversed interval dropped, overflow clipped to the period
    }
    src = _write_pickle(tmp_path / "client_behave_trace", trace, protocol=2)
    summary = convert_fedscale_traces(src, tmp_path / "av.npz")
    assert summary == {"kind": "availability", "entries": 2, "intervals": 4, "dropped": 1, "merged": 1}
    dev = _write_pickle(tmp_path / "dev.pkl", {0: {"computation": 1.0, "communication": 1.0}})
    convert_fedscale_traces(dev, tmp_path / "dev.npz")
    p = from_fedscale(tmp_path / "dev.npz", tmp_path / "av.npz", n_clients=3, latency=0.2)
    av = p.availability
    assert av.intervals(0).tolist() == [[10, 50], [100, 200]] and av.period.tolist() == [1000, 800, 1000]
    assert av.intervals(1).tolist() == [[0, 60], [700, 800]]
    assert p.available([0, 0, 1, 1, 2], [10, 50, 1560, 799.5, 1100]).tolist() == [True, False, True, True, True]
    assert p.latency.tolist() == [0.2] * 3
    with pytest.raises(ValueError, match=r"a FedScale availability trace, expected the device trace"):
        from_fedscale(tmp_path / "av.npz", n_clients=2)


def test_fedscale_pickles_are_never_read_implicitly(tmp_path):
    src = _write_pickle(tmp_path / "client_device_capacity", {0: {"computation": 1.0, "communication": 1.0}})
    with pytest.raises(ValueError, match=r"never FedScale's pickles; run `python -m fedselect.profiles convert"):
        from_fedscale(src, n_clients=2)


@pytest.mark.parametrize(
    "payload",
    [
        lambda marker: {0: {"computation": _Evil(marker), "communication": 1.0}},
        lambda marker: {0: {"computation": 1.0, "communication": 1.0}, 1: _Evil(marker)},
        lambda marker: {0: {"computation": np.arange(3.0), "communication": 1.0}},  # arrays are not numbers
        lambda marker: {0: {"computation": np.array(1.0, dtype=object), "communication": 1.0}},
    ],
)
def test_converter_refuses_code_and_objects(tmp_path, payload):
    marker = str(tmp_path / "marker")
    src = _write_pickle(tmp_path / "planted", payload(marker))
    with pytest.raises(ValueError, match=r"refused"):
        convert_fedscale_traces(src, tmp_path / "out.npz")
    assert not Path(marker).exists() and marker not in MARKER
    assert not (tmp_path / "out.npz").exists()


@pytest.mark.parametrize(
    ("trace", "match"),
    [
        ([1, 2], r"non-empty dict"),
        ({}, r"non-empty dict"),
        ({0: {"speed": 1}}, r"expected a FedScale device trace"),
        ({0: {"computation": 1.0, "communication": 1.0}, 1: {"computation": 1.0}}, r"client 1: needs"),
        ({0: {"computation": "fast", "communication": 1.0}}, r"client 0 computation must be a number"),
        ({0: {"computation": True, "communication": 1.0}}, r"must be a number"),
        ({0: {"computation": 0.0, "communication": 1.0}}, r"computation must hold finite positive"),
        ({0: {"active": [0], "inactive": [1, 2], "finish_time": 5}}, r"1 'active' times but 2 'inactive'"),
        ({0: {"active": [0], "inactive": [1], "finish_time": 0}}, r"finish_time must be positive"),
        ({0: {"active": [0], "inactive": [1]}}, r"needs 'active', 'inactive' and 'finish_time'"),
    ],
)
def test_converter_names_malformed_entries(tmp_path, trace, match):
    src = _write_pickle(tmp_path / "trace", trace)
    with pytest.raises(ValueError, match=match):
        convert_fedscale_traces(src, tmp_path / "out.npz")


def test_converter_command(tmp_path, capsys):
    src = _write_pickle(tmp_path / "dev", {0: {"computation": 5.0, "communication": 100.0}})
    assert main(["convert-fedscale", str(src), str(tmp_path / "dev.npz")]) == 0
    assert json.loads(capsys.readouterr().out) == {"kind": "device", "entries": 1}
    with pytest.raises(SystemExit) as exc:
        main(["convert-fedscale", str(tmp_path / "missing"), str(tmp_path / "x.npz")])
    assert exc.value.code == 2
    with pytest.raises(ValueError, match=r"must end in .npz"):
        convert_fedscale_traces(src, tmp_path / "dev.json")


# --------------------------------------------------------------------------- the federation


def test_federation_holds_profiles_of_its_clients():
    fed = make_federation("digits", n_clients=4, random_state=0)
    assert fed.profiles is None  # the default: homogeneous, every earlier result unchanged
    with_p = dataclasses.replace(fed, profiles=homogeneous(4))
    assert with_p.profiles == homogeneous(4) and with_p.n_clients == 4
    with pytest.raises(ValueError, match=r"profiles describe 3 clients but there are 4"):
        dataclasses.replace(fed, profiles=homogeneous(3))
    with pytest.raises(TypeError, match=r"profiles must be a fedselect.profiles.SystemProfiles or None"):
        dataclasses.replace(fed, profiles={"speed": 1})
    assert fedselect.SystemProfiles is SystemProfiles


FINGERPRINT_BEFORE_PROFILES = "c4c6707b472d5082"


def test_profiles_none_leaves_the_federation_fingerprint():
    from fedselect.compare import _federation_fingerprint

    X = np.arange(12, dtype=np.float32).reshape(6, 2)
    fed = Federation(X, np.array([0, 1, 0, 1, 0, 1]), [np.arange(3), np.arange(3, 6)], X[:2], np.array([0, 1]))
    # the value this federation had before profiles existed (computed on the parent commit)
    assert _federation_fingerprint(fed) == FINGERPRINT_BEFORE_PROFILES
    assert _federation_fingerprint(dataclasses.replace(fed, profiles=None)) == FINGERPRINT_BEFORE_PROFILES
