"""Profile and trace files cost what their size allows (issue 36, item 4).

The attacks: a FedScale availability trace whose entries are one object referenced by every client (a pickle
memo reference), so a 20 KiB file converts to 600,000 intervals; and a profiles ``.npz`` whose member is a
deflated run of zeros, allocated in full before its format was checked.
"""

from __future__ import annotations

import io
import pickle
import tracemalloc
import zipfile

import numpy as np
import pytest

from fedselect.profiles import SystemProfiles, convert_fedscale_traces, from_fedscale, homogeneous


def _peak(fn):
    tracemalloc.start()
    try:
        try:
            fn()
        except Exception as exc:
            return exc, tracemalloc.get_traced_memory()[1]
        return None, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _shared_trace(n_clients: int, n_intervals: int) -> dict:
    entry = {
        "active": [float(2 * i) for i in range(n_intervals)],
        "inactive": [float(2 * i + 1) for i in range(n_intervals)],
        "finish_time": float(2 * n_intervals),
    }
    return {k: entry for k in range(n_clients)}


def test_a_small_trace_whose_clients_share_one_entry_is_refused_before_converting(tmp_path):
    src = tmp_path / "client_behave_trace"
    src.write_bytes(pickle.dumps(_shared_trace(4000, 150), protocol=4))
    assert src.stat().st_size < 24 * 2**10
    with pytest.raises(ValueError, match=r"walk more than 1048576 nodes|share one entry"):
        convert_fedscale_traces(src, tmp_path / "av.npz")
    assert not (tmp_path / "av.npz").exists()


def test_two_clients_sharing_an_entry_are_named(tmp_path):
    src = tmp_path / "client_behave_trace"
    src.write_bytes(pickle.dumps(_shared_trace(2, 3), protocol=4))
    with pytest.raises(ValueError, match=r"clients 0 and 1 share one entry object"):
        convert_fedscale_traces(src, tmp_path / "av.npz")


def test_a_trace_with_its_own_entries_still_converts(tmp_path):
    trace = {
        k: dict(e) | {"active": list(e["active"]), "inactive": list(e["inactive"])}
        for k, e in _shared_trace(3, 4).items()
    }
    src = tmp_path / "client_behave_trace"
    src.write_bytes(pickle.dumps(trace, protocol=4))
    assert convert_fedscale_traces(src, tmp_path / "av.npz")["intervals"] == 12


def _profiles_npz(path, members: dict[str, bytes], *, deflate: bool = False) -> None:
    homogeneous(4).save(path)
    with zipfile.ZipFile(path) as src:
        kept = {n: src.read(n) for n in src.namelist() if n not in members}
    compression = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", compression=compression) as dst:
        for n, data in {**kept, **members}.items():
            dst.writestr(n, data)


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, allow_pickle=False)
    return buf.getvalue()


def test_a_deflated_member_of_zeros_is_refused_before_it_is_allocated(tmp_path):
    path = tmp_path / "p.npz"
    _profiles_npz(path, {"latency.npy": _npy(np.zeros(8 * 2**20))}, deflate=True)  # 64 MiB of zeros
    assert path.stat().st_size < 256 * 2**10
    exc, peak = _peak(lambda: SystemProfiles.load(path))
    assert isinstance(exc, ValueError) and "unpacks to" in str(exc) and str(path) in str(exc)
    assert peak < 8 * 2**20, f"{peak / 2**20:.0f} MiB"


def test_unexpected_members_and_lying_headers_are_refused(tmp_path):
    path = tmp_path / "p.npz"
    _profiles_npz(path, {"extra.npy": _npy(np.zeros(3))})
    with pytest.raises(ValueError, match=r"unexpected member 'extra\.npy'"):
        SystemProfiles.load(path)
    header = _npy(np.zeros(4))
    lying = header.replace(b"(4,)", b"(10000000000,)".ljust(4))
    _profiles_npz(path, {"latency.npy": lying})
    exc, peak = _peak(lambda: SystemProfiles.load(path))
    assert isinstance(exc, ValueError) and "header says" in str(exc)
    assert peak < 2**20


def test_saved_profiles_and_converted_traces_still_load(tmp_path):
    p = homogeneous(5, seconds_per_sample=0.01)
    p.save(tmp_path / "p.npz")
    assert SystemProfiles.load(tmp_path / "p.npz") == p
    src = tmp_path / "dev.pkl"
    src.write_bytes(pickle.dumps({0: {"computation": 10.0, "communication": 100.0}}))
    convert_fedscale_traces(src, tmp_path / "dev.npz")
    assert from_fedscale(tmp_path / "dev.npz", n_clients=2).seconds_per_sample.tolist() == [0.01, 0.01]


def test_a_cifar10_batch_with_a_dag_of_labels_is_refused(tmp_path):
    from fedselect.data import datasets as ds

    labels: list = []
    for _ in range(40):
        labels = [labels, labels]
    tmp_path.mkdir(exist_ok=True)
    for name in ds.CIFAR10_FILES:
        batch = {b"data": np.zeros((1, 3072), dtype=np.uint8), b"labels": labels}
        (tmp_path / name).write_bytes(pickle.dumps(batch, protocol=4))
    ds._read_cifar10.cache_clear()
    with pytest.raises(ValueError, match=r"data_batch_1.*walk more than"):
        ds.load_cifar10(tmp_path)
