"""The command line with checkpoints, diverging runs and failed runs."""

from __future__ import annotations

import json

from fedselect.cli import main


def test_run_answers_divergence_with_one_line_and_status_2(capsys):
    assert main(["run", "--lr", "3", "--rounds", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fedselect: error: DivergenceError: FederatedTrainer: training diverged in round 0")
    assert "Traceback" not in "\n".join(err)


def test_run_out_checkpoints_beside_the_file_and_cleans_up(tmp_path, capsys):
    out = tmp_path / "h.json"
    assert main(["run", "--rounds", "4", "--checkpoint-every", "2", "--out", str(out), "--no-progress"]) == 0
    assert len(json.loads(out.read_text())["rounds"]) == 4
    assert not (tmp_path / "h.json.checkpoint").exists()


def test_compare_records_a_diverged_run_as_failed_and_exits_1(tmp_path, capsys):
    args = ["compare", "--selectors", "random", "--seeds", "0", "--rounds", "3", "--lr", "3", "--out", str(tmp_path),
            "--no-progress"]
    assert main(args) == 1
    table = (tmp_path / "table.md").read_text()
    assert "seed 0: DivergenceError in round 0" in table
    assert json.loads((tmp_path / "runs" / "random__seed0.json").read_text())["status"] == "failed"
    assert "stay failed on a rerun unless --retry-failed" in capsys.readouterr().err
    assert main(args) == 1  # not retried
    assert main([*args, "--retry-failed", "--divergence", "none"]) == 2  # other settings: refused...
    assert main([*args, "--divergence", "none", "--overwrite"]) == 0  # ...unless --overwrite
