"""A Flower run's records beside simulated runs with a clock: tables and pictures (issue 22, item 3)."""

import pytest

pytest.importorskip("flwr")

from fedselect.flower import FlowerRound
from fedselect.simulation.history import History
from tests.test_experiments import _timed_comparison


def test_a_flower_run_beside_simulated_ones_has_no_time_cells_and_breaks_nothing(tmp_path):
    flower = History(
        [
            FlowerRound(round=t, clients=[0], weights=[1.0], lr=0.1, test_accuracy=a, wall_seconds=2.5, reported=[0])
            for t, a in enumerate([0.2, 0.9])
        ],
        model_size=10,
    )
    comp = _timed_comparison()
    comp.histories["flower"] = {0: flower, 1: flower}
    row = next(r for r in comp.rows() if r["scheme"] == "flower")
    assert row["rounds_to_target"] == 2.0 and row["time_to_target"] is None and row["sim_time"] is None
    assert "| flower | 2.0 ± 0.0 | - | - |" in comp.to_markdown()
    assert "kept no simulated clock: flower" in comp.paired_report("random")
    assert "accuracy_time.png" in [p.name for p in comp.plot(tmp_path)]
