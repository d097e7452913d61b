"""The comparison table a user reads: rounds to target, partial reach, costs."""

from __future__ import annotations

from fedselect.compare import Comparison
from fedselect.simulation.costs import Costs
from fedselect.simulation.history import History, RoundRecord


def _history(accuracies: list[float]) -> History:
    rounds = [
        RoundRecord(round=t, clients=[0], weights=[1.0], lr=0.1, test_accuracy=a, costs=Costs(models_down=1))
        for t, a in enumerate(accuracies)
    ]
    return History(rounds, model_size=10)


def test_partial_reach_is_na_with_the_reached_seeds_mean():
    comp = Comparison(
        histories={
            "all": {0: _history([0.1, 0.9]), 1: _history([0.1, 0.2, 0.9])},
            "some": {0: _history([0.9]), 1: _history([0.1, 0.2]), 2: _history([0.1, 0.1, 0.1, 0.9])},
            "none": {0: _history([0.1, 0.2])},
        },
        target=0.8,
        n_clients=1,
    )
    rows = {r["scheme"]: r for r in comp.rows()}
    assert rows["all"]["rounds_to_target"] == 2.5  # rounds counted from 1: 2 and 3
    assert rows["some"]["rounds_to_target"] is None
    assert rows["some"]["reached"] == 2
    md = {line.split(" | ")[0].strip("| "): line for line in comp.to_markdown().splitlines()[2:]}
    assert "| 2.5 ± 0.5 |" in md["all"]
    assert "N/A (2 reached: 2.5 ± 1.5)" in md["some"]  # seeds 0 and 2 took 1 and 4 rounds
    assert "| N/A |" in md["none"] and "| 0/1 |" in md["none"]
