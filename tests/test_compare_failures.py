"""A comparison survives bad runs and bad files, and resumes the run it was in the middle of."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest

from fedselect import Selection
from fedselect.compare import load_comparison, run_comparison
from fedselect.hookspecs import hookimpl
from fedselect.plugins import pm
from fedselect.selection import BaseSelector
from fedselect.simulation import CorruptFileWarning

FEDERATION = {"dataset": "digits", "partition": "shards", "shards_per_client": 2, "n_clients": 10}
TRAINER = {"rounds": 6, "clients_per_round": 3, "local_steps": 2}


class _Flaky(BaseSelector):
    """First clients in order; ``mode`` decides what goes wrong from round ``at`` on."""

    broken = True  # class-level switch: a "fixed" selector for retry tests, same parameters
    interrupt_once = False
    rounds_selected = 0

    def __init__(self, *, mode="raise", at=2):
        self.mode = mode
        self.at = at

    def _fit(self, pool):
        pass

    def _select(self, n, *, round, oracle):
        type(self).rounds_selected += 1
        if round >= self.at and type(self).interrupt_once and self.mode == "interrupt":
            type(self).interrupt_once = False
            raise KeyboardInterrupt
        if round >= self.at and type(self).broken:
            if self.mode == "raise":
                raise RuntimeError(f"boom in round {round}")
            if self.mode == "diverge":
                return Selection(np.arange(n), weights=np.full(n, 1e4))
        return Selection(np.arange(n) + round % 3)


@pytest.fixture
def flaky():
    module = types.ModuleType("fedselect_flaky")

    @hookimpl
    def register_selectors(register):
        register(_Flaky, name="flaky")

    module.register_selectors = register_selectors
    pm.register(module, name="fedselect-flaky")
    _Flaky.broken, _Flaky.interrupt_once, _Flaky.rounds_selected = True, False, 0
    try:
        yield _Flaky
    finally:
        pm.unregister(name="fedselect-flaky")


SCHEMES = {"ok": ("random", {}), "boom": ("flaky", {"mode": "raise", "at": 2}),
           "div": ("flaky", {"mode": "diverge", "at": 1})}


def _compare(out, **kw):
    kw.setdefault("selectors", SCHEMES)
    return run_comparison(kw.pop("selectors"), federation=FEDERATION, trainer=TRAINER, seeds=(0, 1), target=0.3,
                          out_dir=out, progress=False, log=kw.pop("log", lambda m: None), **kw)


def test_a_failed_run_is_recorded_and_the_comparison_goes_on(flaky, tmp_path):
    comp = _compare(tmp_path)
    assert sorted(comp.histories["ok"]) == [0, 1]
    assert comp.histories["boom"] == {} and comp.histories["div"] == {}
    assert comp.failed["boom"][0]["type"] == "RuntimeError" and comp.failed["boom"][0]["round"] == 2
    assert comp.failed["div"][1]["type"] == "DivergenceError" and comp.failed["div"][1]["round"] == 1
    saved = json.loads((tmp_path / "runs" / "boom__seed0.json").read_text())
    assert saved["status"] == "failed"
    assert saved["error"]["message"] == "boom in round 2" and saved["error"]["rounds_completed"] == 2
    assert len(saved["history"]["rounds"]) == 2
    assert not (tmp_path / "checkpoints").exists()  # removed once every result is written
    md = comp.to_markdown()
    assert md.splitlines()[0].endswith("| failed |")
    boom = next(line for line in md.splitlines() if line.startswith("| boom "))
    assert "| N/A |" in boom and "| 0/2 |" in boom
    assert "seed 0: RuntimeError in round 2; seed 1: RuntimeError in round 2" in boom
    rows = {r["scheme"]: r for r in comp.rows()}
    assert rows["div"]["failed"][0]["type"] == "DivergenceError" and "failed" not in rows["ok"]
    comp.write()
    csv = (tmp_path / "results.csv").read_text().splitlines()
    assert csv[0].endswith(",status") and "boom,0,,,,2,,failed" in csv
    pictures = {"accuracy.png", "reached.png", "selection_frequency.png", "communication.png"}
    assert {p.name for p in comp.plot()} == pictures
    paired = {r["scheme"]: r for r in comp.paired("ok")}
    assert paired["boom"]["seeds"] == [] and paired["boom"]["failed_seeds"] == [0, 1]
    assert "Left out because a run failed" in comp.paired_markdown("ok")
    assert "boom: seed(s) [0, 1]" in comp.paired_markdown("ok")
    loaded, cells = load_comparison(tmp_path, 0.3, labels=list(SCHEMES))
    assert loaded.failed == comp.failed and loaded.histories["ok"] == comp.histories["ok"]
    assert sorted(c["status"] for c in cells) == ["failed"] * 4 + ["finished"] * 2


def test_a_rerun_keeps_failed_runs_unless_asked_to_retry(flaky, tmp_path):
    _compare(tmp_path)
    flaky.broken = False  # "fixed", with the same parameters: the saved failure still stands
    flaky.rounds_selected = 0
    notes: list[str] = []
    again = _compare(tmp_path, log=notes.append)
    assert flaky.rounds_selected == 0 and set(again.failed) == {"boom", "div"}
    assert "4 failed; rerun with retry_failed=True" in notes[0]
    retried = _compare(tmp_path, retry_failed=True)
    assert retried.failed == {} and sorted(retried.histories["boom"]) == [0, 1]
    assert json.loads((tmp_path / "runs" / "div__seed1.json").read_text())["status"] == "finished"


@pytest.mark.parametrize("damage", ["", '{"key": "abc", "label": "ok", "se', "[1, 2]", '{"key": 1}'])
def test_an_unreadable_result_file_is_moved_aside_and_redone(damage, tmp_path):
    schemes = {"ok": ("random", {})}
    first = _compare(tmp_path, selectors=schemes)
    path = tmp_path / "runs" / "ok__seed1.json"
    path.write_text(damage)
    with pytest.warns(CorruptFileWarning, match=r"ok__seed1\.json"):
        again = _compare(tmp_path, selectors=schemes)
    assert again.histories == first.histories
    assert len(list((tmp_path / "runs").glob("ok__seed1.json.corrupt-*"))) == 1
    with pytest.warns(CorruptFileWarning):  # load_comparison skips what it cannot read, naming it
        (tmp_path / "runs" / "ok__seed0.json").write_text("")
        loaded, _ = load_comparison(tmp_path, 0.3)
    assert sorted(loaded.histories["ok"]) == [1]


def test_bad_files_never_block_a_resume_and_overwrite_always_works(tmp_path):
    schemes = {"ok": ("random", {})}
    first = _compare(tmp_path, selectors=schemes)
    (tmp_path / "runs" / "ok__seed0.json").write_text("{")
    (tmp_path / "runs" / "ok__seed1.json").unlink()
    (tmp_path / "checkpoints" / "ok__seed1").mkdir(parents=True)
    (tmp_path / "checkpoints" / "ok__seed1" / "checkpoint.pkl").write_bytes(b"\0" * 10)
    with pytest.warns(CorruptFileWarning) as caught:
        again = _compare(tmp_path, selectors=schemes)
    named = " ".join(str(w.message) for w in caught)
    assert "ok__seed0.json" in named and "checkpoint.pkl" in named
    assert again.histories == first.histories
    other = {**TRAINER, "lr": 0.1}
    (tmp_path / "runs" / "ok__seed1.json").write_text("")
    kw = dict(federation=FEDERATION, seeds=(0, 1), out_dir=tmp_path, progress=False, log=lambda m: None)
    with pytest.raises(ValueError, match=r"ok__seed0\.json holds a run of label 'ok', seed 0 with other settings "
                       r"\(trainer\.lr: saved '\(unset\)', now 0\.1\)"):
        run_comparison(schemes, trainer=other, **kw)
    with pytest.warns(CorruptFileWarning, match=r"ok__seed1\.json"):
        comp = run_comparison(schemes, trainer=other, overwrite=True, **kw)
    assert all(h.rounds[0].lr == 0.1 for h in comp.histories["ok"].values())


def test_an_interrupted_comparison_resumes_the_run_in_progress(flaky, tmp_path):
    schemes = {"f": ("flaky", {"mode": "interrupt", "at": 4})}
    flaky.broken = False
    reference = _compare(tmp_path / "ref", selectors=schemes)
    flaky.interrupt_once, flaky.rounds_selected = True, 0
    with pytest.raises(KeyboardInterrupt):
        _compare(tmp_path / "run", selectors=schemes, checkpoint_every=3)
    assert (tmp_path / "run" / "checkpoints" / "f__seed0" / "checkpoint.pkl").exists()
    flaky.rounds_selected = 0
    resumed = _compare(tmp_path / "run", selectors=schemes, checkpoint_every=3)
    assert flaky.rounds_selected == (6 - 3) + 6  # seed 0 from its round-3 checkpoint, then seed 1
    assert resumed.histories == reference.histories
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_compressed_results_are_loaded_and_resumed(tmp_path):
    from fedselect.compare import compress_runs

    schemes = {"ok": ("random", {})}
    kw = dict(federation=FEDERATION, trainer=TRAINER, seeds=(0, 1), out_dir=tmp_path, progress=False,
              log=lambda m: None)
    first = run_comparison(schemes, **kw)
    assert compress_runs(tmp_path / "runs") == 2
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["ok__seed0.json.gz", "ok__seed1.json.gz"]
    notes = []
    again = run_comparison(schemes, **{**kw, "log": notes.append})
    assert again.histories == first.histories and "2 finished run(s) loaded, 0 to run" in notes[0]
    loaded, cells = load_comparison(tmp_path, 0.3)
    assert loaded.histories["ok"] == first.histories["ok"] and len(cells) == 2
    (tmp_path / "runs" / "ok__seed1.json.gz").write_bytes(b"\x1f\x8b truncated")
    with pytest.warns(CorruptFileWarning, match=r"ok__seed1\.json\.gz"):
        redone = run_comparison(schemes, **kw)
    assert redone.histories == first.histories
    assert sorted(p.name for p in (tmp_path / "runs").glob("ok__*")) [:2] == ["ok__seed0.json.gz", "ok__seed1.json"]


def test_paired_can_count_a_diverged_run_as_not_reached(flaky, tmp_path):
    """``diverged="not-reached"``: a scheme that diverges is judged on every seed, not on those it survived."""
    comp = _compare(tmp_path)
    ok = {s: comp.histories["ok"][s].rounds_to_accuracy(0.3) for s in (0, 1)}
    longest = max(len(h) for h in comp.histories["ok"].values())
    value = {s: (ok[s] if ok[s] is not None else longest + 1) for s in (0, 1)}
    rows = {r["scheme"]: r for r in comp.paired("ok", diverged="not-reached")}
    assert rows["div"]["seeds"] == [0, 1] and rows["div"]["diverged_seeds"] == [0, 1]
    assert rows["div"]["reference_diverged_seeds"] == []
    assert rows["div"]["failed_seeds"] == []
    assert rows["div"]["diffs"] == [longest + 1 - value[0], longest + 1 - value[1]]
    assert rows["boom"]["seeds"] == [] and rows["boom"]["failed_seeds"] == [0, 1]  # other failures stay out
    # the diverging scheme as the reference, with no finished run at all
    rows = {r["scheme"]: r for r in comp.paired("div", diverged="not-reached", not_reached=99)}
    assert rows["ok"]["diffs"] == [(ok[s] if ok[s] is not None else 99) - 99 for s in (0, 1)]
    assert rows["ok"]["diverged_seeds"] == [] and rows["ok"]["reference_diverged_seeds"] == [0, 1]
    assert "div (the reference): seed(s) [0, 1]." in comp.paired_markdown("div", diverged="not-reached")
    md = comp.paired_markdown("ok", diverged="not-reached")
    assert "Counted as not reached because a run diverged (DivergenceError): div: seed(s) [0, 1]." in md
    default = {r["scheme"]: r for r in comp.paired("ok")}
    assert default["div"]["seeds"] == [] and default["div"]["failed_seeds"] == [0, 1]
    with pytest.raises(ValueError, match="diverged='yes'"):
        comp.paired("ok", diverged="yes")
