"""The comparison table a user reads: rounds to target, partial reach, costs."""

from __future__ import annotations

import numpy as np
import pytest

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


def test_paired_by_seed_counts_wins_and_uses_the_not_reached_floor():
    # ref reaches 0.8 in 2 rounds on every seed; "slow" in 4 (seeds 0-5) or never (seed 6, 5 rounds run).
    ref = {s: _history([0.1, 0.9]) for s in range(7)}
    slow = {s: _history([0.1, 0.2, 0.3, 0.9]) for s in range(6)} | {6: _history([0.1] * 5)}
    same = {s: _history([0.1, 0.9]) for s in range(3)}
    comp = Comparison(histories={"ref": ref, "slow": slow, "same": same}, target=0.8, n_clients=1)
    rows = {r["scheme"]: r for r in comp.paired("ref")}
    assert rows["slow"]["diffs"] == [2.0] * 6 + [4.0]  # never reached: 5 rounds + 1 = 6
    assert (rows["slow"]["faster"], rows["slow"]["ties"], rows["slow"]["slower"]) == (7, 0, 0)
    assert rows["slow"]["p"] < 0.05
    assert rows["same"]["seeds"] == [0, 1, 2] and rows["same"]["ties"] == 3
    assert rows["same"]["p"] != rows["same"]["p"]  # NaN: nothing to test
    assert rows["slow"]["p_holm"] == rows["slow"]["p"]  # a family of one test (the NaN one is not a test)
    assert comp.paired("ref", not_reached=100)[0]["diffs"][-1] == 98.0
    assert "| slow | 7 | +2.3 ± 0.7 |" in comp.paired_markdown("ref")
    with pytest.raises(KeyError, match="no scheme 'nope'"):
        comp.paired("nope")


def test_paired_summary_counts_and_handles_no_pairs():
    from fedselect.compare import paired_summary

    r = paired_summary([3.0, 1.0, 0.0, -2.0])
    assert (r["faster"], r["ties"], r["slower"]) == (2, 1, 1) and r["median"] == 0.5 and 0 < r["p"] <= 1
    empty = paired_summary([])
    assert empty["diffs"] == [] and empty["faster"] == 0 and empty["p"] != empty["p"]


def test_holm_adjusts_a_family_of_p_values():
    from fedselect.compare import holm

    # sorted 0.01, 0.03, 0.04 -> 3 * 0.01, 2 * 0.03, max(0.06, 1 * 0.04)
    assert holm([0.01, 0.04, 0.03]) == [0.03, 0.06, 0.06]
    assert holm([0.5, 0.6]) == [1.0, 1.0]
    out = holm([float("nan"), 0.02])
    assert np.isnan(out[0]) and out[1] == 0.02  # NaN is not a test: a family of one
    assert holm([]) == []


def test_paired_table_says_when_too_few_seeds_can_never_be_significant():
    ref = {s: _history([0.1, 0.9]) for s in range(3)}
    slow = {s: _history([0.1, 0.2, 0.9]) for s in range(3)}
    md = Comparison(histories={"ref": ref, "slow": slow}, target=0.8, n_clients=1).paired_markdown("ref")
    assert "With 3 seed(s) the smallest p-value the test can give is 0.250" in md
    ref6 = {s: _history([0.1, 0.9]) for s in range(6)}
    slow6 = {s: _history([0.1, 0.2, 0.9]) for s in range(6)}
    md6 = Comparison(histories={"ref": ref6, "slow": slow6}, target=0.8, n_clients=1).paired_markdown("ref")
    assert "smallest p-value" not in md6 and "| 0.031 |" in md6  # 2 / 2**6: six seeds all one way


def test_the_terminal_table_has_the_markdown_cells_aligned_with_a_legend():
    comp = Comparison(
        histories={"random": {0: _history([0.1, 0.5, 0.9]), 1: _history([0.1, 0.2, 0.3])},
                   "a-long-scheme-name": {0: _history([0.9, 0.9, 0.9]), 1: _history([0.5, 0.9, 0.9])}},
        target=0.8,
        n_clients=1,
    )
    text = comp.to_text()
    table, legend = text.split("\n\n")[:2]
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["scheme", "rounds", "to", "80%"]
    assert len({len(line) for line in lines}) == 1  # every column aligned
    md_cells = [[c.strip() for c in line.strip("|").split("|")] for line in comp.to_markdown().splitlines()[2:]]
    for cells, line in zip(md_cells, lines[1:], strict=True):
        assert line.startswith(cells[0]) and all(c in line for c in cells)  # the same cells
    assert "mean ± std over seeds" in legend and "mean over the seeds that reached it" in legend
