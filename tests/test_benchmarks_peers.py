"""benchmarks/speed/bench_peers.py: fedselect's side and the bound on a tiny job, missing peers skipped with a reason.

No timing assertions: the numbers are whatever this machine gives; the shape of the report is checked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.speed import bench_peers

STUB = Path(bench_peers.DRIVERS) / "torchvision_stub"


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    peers = tmp_path_factory.mktemp("peers")
    broken = peers / "fedlab" / "bin"
    broken.mkdir(parents=True)
    os.symlink(sys.executable, broken / "python")  # an environment without FedLab in it
    return bench_peers.run_benchmark(
        jobs=("mlp", "cnn"),
        repeats=1,
        rounds=1,
        peers_dir=peers,
        n_clients=4,
        clients_per_round=2,
        cnn_samples=40,
        dataset="digits",
    )


def test_missing_peers_are_skipped_with_the_reason(tiny_report: dict) -> None:
    assert tiny_report["found"] == {}
    assert set(tiny_report["skipped"]) == {"flgo", "fedlab"}
    assert "no environment at" in tiny_report["skipped"]["flgo"]
    assert "setup_peers.sh" in tiny_report["skipped"]["flgo"]
    assert "`import fedlab.contrib.algorithm` fails" in tiny_report["skipped"]["fedlab"]
    assert "ModuleNotFoundError" in tiny_report["skipped"]["fedlab"]
    text = bench_peers.format_report(tiny_report, ["header line"])
    assert text.startswith("header line\n")
    assert "peers found: none" in text
    assert "peer skipped: flgo: no environment at" in text
    assert "peer skipped: fedlab: `import fedlab.contrib.algorithm` fails" in text


def test_fedselect_and_bound_report_medians_and_paired_ratios(tiny_report: dict) -> None:
    assert set(tiny_report["jobs"]) == {"mlp", "cnn"}
    assert tiny_report["jobs"]["mlp"]["input_shape"] == [1, 8, 8]
    assert tiny_report["jobs"]["cnn"]["input_shape"] == [3, 32, 32]
    for res in tiny_report["jobs"].values():
        assert list(res["seconds"]) == ["fedselect", "bound"]  # the alternation order, peers absent
        for fw, seconds in res["seconds"].items():
            assert len(seconds) == 1 and seconds[0] > 0
            assert res["median"][fw] == seconds[0]
        for fw, seconds in res["cpu_seconds"].items():  # the drivers' own CPU time, beside the wall time
            assert len(seconds) == 1 and seconds[0] > 0
            assert res["cpu_median"][fw] == seconds[0]
        assert set(res["ratio"]) == set(res["cpu_ratio"]) == {"bound"}
        assert res["ratio"]["bound"] == pytest.approx(res["median"]["bound"] / res["median"]["fedselect"])
        assert res["cpu_ratio"]["bound"] == pytest.approx(res["cpu_median"]["bound"] / res["cpu_median"]["fedselect"])
    text = bench_peers.format_report(tiny_report, [])
    rows = [line for line in text.splitlines() if line.startswith("| mlp") or line.startswith("| cnn")]
    assert [row.split(" | ")[1] for row in rows] == ["fedselect", "bound", "fedselect", "bound"]


def test_job_file_holds_equal_client_shares(tmp_path: Path) -> None:
    import json

    import numpy as np

    path = bench_peers.write_job("cnn", tmp_path, n_clients=4, cnn_samples=40, dataset=None, seed=0)
    spec = json.loads(path.read_text())
    with np.load(spec["data"]) as arrays:
        assert arrays["X"].shape == (40, 3, 32, 32) and arrays["X"].dtype == np.uint8
        parts = arrays["client_indices"]
    assert parts.shape == (4, 10)
    assert len(np.unique(parts)) == 40  # two label shards per client, disjoint
    assert {k: spec[k] for k in ("clients_per_round", "lr", "batch_size", "epochs")} == {
        "clients_per_round": 10,
        "lr": 0.05,
        "batch_size": 50,
        "epochs": 1,
    }


def test_bad_repeats_are_refused_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="repeats=0"):
        bench_peers.run_benchmark(repeats=0, peers_dir=tmp_path)


def test_torchvision_stub_imports_what_the_peers_import_and_refuses_use() -> None:
    code = (
        "import torchvision, torchvision.datasets.utils\n"
        "from torchvision.transforms import Compose, RandomCrop\n"
        "from torchvision.datasets.vision import VisionDataset\n"
        "from torchvision.datasets.utils import download_and_extract_archive\n"
        "class D(VisionDataset): pass\n"
        "print(torchvision.__version__)\n"
        "torchvision.datasets.MNIST('.', train=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(STUB))
    )
    assert out.stdout.strip() == "0.28.0+fedselectstub"
    assert "torchvision.datasets.MNIST is not available" in out.stderr
