"""The code behind the reproduction reports' first lines (benchmarks/_holds.py, benchmarks/ldcs_table.py).

These lines state what reproduces; a sign error or a pairing by list position would publish the
wrong verdict, so they are tested on made-up runs whose answer is known.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from fedselect.compare import Comparison
from fedselect.simulation.costs import Costs
from fedselect.simulation.history import History, RoundRecord

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _module(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _history(reach_at: int | None, rounds: int = 20) -> History:
    acc = [0.1 if reach_at is None or t < reach_at - 1 else 0.9 for t in range(rounds)]
    recs = [RoundRecord(round=t, clients=[0], weights=[1.0], lr=0.1, test_accuracy=a, costs=Costs(models_down=1))
            for t, a in enumerate(acc)]
    return History(recs, model_size=10)


# --------------------------------------------------------------------- _holds.what_holds
def _comparison(ref_rounds, base_rounds, failed=None):
    hist = {"Ours": {s: _history(r) for s, r in enumerate(ref_rounds) if r != "diverged"},
            "Base": {s: _history(r) for s, r in enumerate(base_rounds)}}
    fails = {"Ours": {s: {"type": "DivergenceError", "message": "", "round": 3, "rounds_completed": 3}
                      for s, r in enumerate(ref_rounds) if r == "diverged"}}
    fails = {k: v for k, v in fails.items() if v} | (failed or {})
    return Comparison(hist, 0.8, 1, failed=fails)


def test_what_holds_verdicts_follow_the_runs():
    holds = _module("_holds")
    fast = _comparison([3] * 8, [10] * 8)
    line = holds.what_holds(fast, "Ours", setting="S", claim="Ours is fastest.")
    assert line.startswith("- **S: reproduces.**") and "significantly faster than Base" in line
    slow = _comparison([10] * 8, [3] * 8)
    line = holds.what_holds(slow, "Ours", setting="S", claim="Ours is fastest.")
    assert line.startswith("- **S: does not reproduce.**") and "significantly slower than Base" in line


def test_what_holds_counts_a_diverged_run_as_not_reached():
    """A scheme that diverges on 7 of 8 seeds and wins the eighth is judged on all 8, not on the one."""
    holds = _module("_holds")
    comp = _comparison([2] + ["diverged"] * 7, [10] * 8)
    line = holds.what_holds(comp, "Ours", setting="S", claim="Ours is fastest.")
    assert line.startswith("- **S: does not reproduce.**"), line
    assert "(8 seeds" in line and "significantly slower than Base" in line
    assert "Ours failed on 7 of the seeds run (7 seed(s): DivergenceError in rounds 3)" in line
    # every seed diverged: still a verdict, not "not run"
    line = holds.what_holds(_comparison(["diverged"] * 8, [10] * 8), "Ours", setting="S", claim="c")
    assert line.startswith("- **S: does not reproduce.**")


def test_what_holds_leaves_out_other_failures_and_says_not_run():
    holds = _module("_holds")
    crash = {"Base": {0: {"type": "RuntimeError", "message": "", "round": 1, "rounds_completed": 1}}}
    comp = _comparison([3] * 8, [10] * 8, failed=crash)
    comp.histories["Base"].pop(0)
    line = holds.what_holds(comp, "Ours", setting="S", claim="c")
    assert "(7 seeds" in line
    empty = Comparison({"Ours": {}, "Base": {0: _history(3)}}, 0.8, 1)
    assert holds.what_holds(empty, "Ours", setting="S", claim="c") == "- **S: not run** (Ours has no finished run)."


# --------------------------------------------------------------------- ldcs_table
def _summary(ldcs_acc, base_acc, ldcs_conv=None, base_conv=None, seeds=(0, 1, 2)):
    """A summary with every cell holding the same made-up values; rows: LDCS and the paper's baselines."""
    lt = _module("ldcs_table")

    def stats(acc, conv, seed_list):
        return {"seeds": len(seed_list), "seed_list": list(seed_list), "accuracy": list(acc),
                "convergent_each": list(conv if conv is not None else [50] * len(seed_list)),
                "convergent_2pp_each": [None] * len(seed_list), "to_target_each": [30] * len(seed_list),
                "failed": {}}

    out = {}
    for k in lt.KS:
        for split in lt.SPLITS:
            cell = {m: stats(base_acc, base_conv, seeds) for m in lt.PAPER_ROWS}
            cell["LDCS"] = stats(ldcs_acc, ldcs_conv, seeds)
            out[f"k{k}-{split}"] = cell
    return lt, out


def test_ldcs_verdicts_have_the_right_sign():
    lt, better = _summary([0.90, 0.91, 0.92], [0.80, 0.81, 0.79], ldcs_conv=[20, 21, 22], base_conv=[60, 70, 80])
    lines = lt.verdicts(better)
    assert len(lines) == len(lt.KS)
    assert all(line.startswith(f"- **K = {k}: reproduces.**") for line, k in zip(lines, lt.KS)), lines[0]
    lt, worse = _summary([0.80, 0.81, 0.79], [0.90, 0.91, 0.92], ldcs_conv=[60, 70, 80], base_conv=[20, 21, 22])
    lines = lt.verdicts(worse)
    assert all("does not reproduce" in line and "Significantly worse than" in line for line in lines), lines[0]


def test_ldcs_partly_names_the_only_baselines_beaten():
    lt, summary = _summary([0.85, 0.86, 0.87], [0.85, 0.86, 0.87])
    for cell in summary.values():  # LDCS beats FLSim's round robin only, by a clear margin
        cell["Round robin (FLSim)"]["accuracy"] = [0.70, 0.71, 0.69]
    line = lt.verdicts(summary)[0]
    assert "partly reproduces (better than Round robin (FLSim) only)" in line
    assert "Level with Random, Importance sampling (FLSim)." in line


def test_ldcs_pairs_by_seed_not_by_position():
    """LDCS lacks seed 0: its seeds 1 and 2 pair with the baseline's seeds 1 and 2, not 0 and 1."""
    lt, summary = _summary([0.5, 0.6, 0.7], [0.1, 0.2, 0.3])
    for cell in summary.values():
        cell["LDCS"].update(seed_list=[1, 2], accuracy=[0.6, 0.7], convergent_each=[50, 50])
    pairs = lt._pairs(summary, "Random", "accuracy", ks=(7,))
    assert sorted(set(pairs)) == [(0.2, 0.6), (0.3, 0.7)] and len(pairs) == 2 * len(lt.SPLITS)


def test_ldcs_load_cell_reports_failed_runs_apart(tmp_path):
    lt = _module("ldcs_table")
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "LDCS__seed0.json").write_text(json.dumps({
        "label": "LDCS", "seed": 0, "status": "failed", "history": _history(None, 5).to_dict(),
        "error": {"type": "DivergenceError", "round": 4}}))
    (runs / "LDCS__seed1.json").write_text(json.dumps({
        "label": "LDCS", "seed": 1, "status": "finished", "history": _history(3, 5).to_dict()}))
    finished, failed = lt.load_cell(tmp_path)
    assert sorted(finished["LDCS"]) == [1] and failed == {"LDCS": {0: "DivergenceError in round 4"}}
    st = lt.cell_stats(finished["LDCS"], at_round=5, target=0.8)
    assert st["seed_list"] == [1] and st["to_target_each"] == [3] and st["accuracy"] == [pytest.approx(0.9)]
    assert lt.cell_stats({}, at_round=5)["seed_list"] == []
