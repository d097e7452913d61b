"""The code behind the reproduction reports: their first lines (benchmarks/reproductions/_holds.py,
ldcs/ldcs_table.py) and the compact records and summaries they read (_records.py,
fedcor/fedcor_diagnostics.py).

The first lines state what reproduces; a sign error or a pairing by list position would publish the
wrong verdict, so they are tested on made-up runs whose answer is known. A compact record or summary
that lost or changed what a report reads would change the report, so each is checked against the
full record it replaces.
"""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from benchmarks.reproductions import _holds as holds
from benchmarks.reproductions import _records as records
from benchmarks.reproductions.ldcs import ldcs_table as lt
from fedselect.compare import Comparison, load_comparison
from fedselect.simulation.costs import Costs
from fedselect.simulation.history import History, RoundRecord

ROOT = Path(__file__).resolve().parents[1]


def _history(reach_at: int | None, rounds: int = 20) -> History:
    acc = [0.1 if reach_at is None or t < reach_at - 1 else 0.9 for t in range(rounds)]
    recs = [
        RoundRecord(round=t, clients=[0], weights=[1.0], lr=0.1, test_accuracy=a, costs=Costs(models_down=1))
        for t, a in enumerate(acc)
    ]
    return History(recs, model_size=10)


# --------------------------------------------------------------------- _holds.what_holds
def _comparison(ref_rounds, base_rounds, failed=None):
    hist = {
        "Ours": {s: _history(r) for s, r in enumerate(ref_rounds) if r != "diverged"},
        "Base": {s: _history(r) for s, r in enumerate(base_rounds)},
    }
    fails = {
        "Ours": {
            s: {"type": "DivergenceError", "message": "", "round": 3, "rounds_completed": 3}
            for s, r in enumerate(ref_rounds)
            if r == "diverged"
        }
    }
    fails = {k: v for k, v in fails.items() if v} | (failed or {})
    return Comparison(hist, 0.8, 1, failed=fails)


def test_what_holds_verdicts_follow_the_runs():
    fast = _comparison([3] * 8, [10] * 8)
    line = holds.what_holds(fast, "Ours", setting="S", claim="Ours is fastest.")
    assert line.startswith("- **S: reproduces.**") and "significantly faster than Base" in line
    slow = _comparison([10] * 8, [3] * 8)
    line = holds.what_holds(slow, "Ours", setting="S", claim="Ours is fastest.")
    assert line.startswith("- **S: does not reproduce.**") and "significantly slower than Base" in line


def test_what_holds_counts_a_diverged_run_as_not_reached():
    """A scheme that diverges on 7 of 8 seeds and wins the eighth is judged on all 8, not on the one."""
    comp = _comparison([2] + ["diverged"] * 7, [10] * 8)
    line = holds.what_holds(comp, "Ours", setting="S", claim="Ours is fastest.")
    assert line.startswith("- **S: does not reproduce; Ours reached 80% on 1 of 8 seeds.**"), line
    assert "(8 seeds" in line and "significantly slower than Base" in line
    assert "Seeds reaching 80%: Ours 1/8, Base 8/8" in line
    assert "Ours failed on 7 of the seeds run (7 seed(s): DivergenceError in rounds 3)" in line
    # every seed diverged: still a verdict, not "not run"
    line = holds.what_holds(_comparison(["diverged"] * 8, [10] * 8), "Ours", setting="S", claim="c")
    assert line.startswith("- **S: does not reproduce; Ours reached 80% on 0 of 8 seeds.**")


def test_what_holds_says_a_ranking_when_the_scheme_missed_on_some_seeds():
    """Faster than every baseline paired by seed, a miss ranked after every hit, yet 2 of 8 seeds missed: the
    ranking reproduces, the paper's figure (a mean over runs that reached the target) does not, and the head says
    on how many seeds it reached the target (issue 33, item 7: FedCor 1SPC)."""
    line = holds.what_holds(_comparison([3] * 6 + [None] * 2, [None] * 8), "Ours", setting="S", claim="c")
    assert line.startswith("- **S: ranking reproduces; Ours reached 80% on 6 of 8 seeds.**"), line
    assert "Seeds reaching 80%: Ours 6/8, Base 0/8" in line
    line = holds.what_holds(_comparison([3] * 8, [10] * 8), "Ours", setting="S", claim="c")
    assert line.startswith("- **S: reproduces.**") and "Seeds reaching 80%: Ours 8/8, Base 8/8" in line


def test_provenance_lists_a_dirty_commit_as_dirty():
    """A run recorded at ``<commit>-dirty`` is listed with the suffix and named, never as its clean commit."""
    clean = {"label": "A", "commit": "0b7eb1f8498ef7e02e1b273e9077ed2a1d6d1985", "machine": {"cpu": "X"}}
    dirty = clean | {"label": "B", "commit": "0b7eb1f8498ef7e02e1b273e9077ed2a1d6d1985-dirty"}
    text = holds.provenance([clean, dirty])
    assert "0b7eb1f8498e, 0b7eb1f8498e-dirty" in text and "2 commit(s)" in text
    assert "**Uncommitted changes:** 1 run(s) (B) were recorded at a `-dirty` commit (0b7eb1f8498e-dirty)" in text
    one = holds.provenance([dirty, dirty | {"label": "C"}])
    assert one.startswith("All 2 runs come from one commit (0b7eb1f8498e-dirty)") and "(B, C)" in one
    assert "Uncommitted" not in holds.provenance([clean, clean])
    assert holds.short_commit("0b7eb1f8498ef7e02e1b273e9077ed2a1d6d1985-dirty") == "0b7eb1f8498e-dirty"


def test_what_holds_leaves_out_other_failures_and_says_not_run():
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

    def stats(acc, conv, seed_list):
        return {
            "seeds": len(seed_list),
            "seed_list": list(seed_list),
            "accuracy": list(acc),
            "convergent_each": list(conv if conv is not None else [50] * len(seed_list)),
            "convergent_2pp_each": [None] * len(seed_list),
            "to_target_each": [30] * len(seed_list),
            "failed": {},
        }

    out = {}
    for k in lt.KS:
        for split in lt.SPLITS:
            cell = {m: stats(base_acc, base_conv, seeds) for m in lt.PAPER_ROWS}
            cell["LDCS"] = stats(ldcs_acc, ldcs_conv, seeds)
            out[f"k{k}-{split}"] = cell
    return out


def test_ldcs_verdicts_have_the_right_sign():
    better = _summary([0.90, 0.91, 0.92], [0.80, 0.81, 0.79], ldcs_conv=[20, 21, 22], base_conv=[60, 70, 80])
    lines = lt.verdicts(better)
    assert len(lines) == len(lt.KS)
    assert all(line.startswith(f"- **K = {k}: reproduces.**") for line, k in zip(lines, lt.KS)), lines[0]
    worse = _summary([0.80, 0.81, 0.79], [0.90, 0.91, 0.92], ldcs_conv=[60, 70, 80], base_conv=[20, 21, 22])
    lines = lt.verdicts(worse)
    assert all("does not reproduce" in line and "Significantly worse than" in line for line in lines), lines[0]


def test_ldcs_partly_names_the_only_baselines_beaten():
    summary = _summary([0.85, 0.86, 0.87], [0.85, 0.86, 0.87])
    for cell in summary.values():  # LDCS beats FLSim's round robin only, by a clear margin
        cell["Round robin (FLSim)"]["accuracy"] = [0.70, 0.71, 0.69]
    line = lt.verdicts(summary)[0]
    assert "partly reproduces (better than Round robin (FLSim) only)" in line
    assert "Level with Random, Importance sampling (FLSim)." in line


def test_ldcs_pairs_by_seed_not_by_position():
    """LDCS lacks seed 0: its seeds 1 and 2 pair with the baseline's seeds 1 and 2, not 0 and 1."""
    summary = _summary([0.5, 0.6, 0.7], [0.1, 0.2, 0.3])
    for cell in summary.values():
        cell["LDCS"].update(seed_list=[1, 2], accuracy=[0.6, 0.7], convergent_each=[50, 50])
    pairs = lt._pairs(summary, "Random", "accuracy", ks=(7,))
    assert sorted(set(pairs)) == [(0.2, 0.6), (0.3, 0.7)] and len(pairs) == 2 * len(lt.SPLITS)


def test_ldcs_load_cell_reports_failed_runs_apart(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "LDCS__seed0.json").write_text(
        json.dumps(
            {
                "label": "LDCS",
                "seed": 0,
                "status": "failed",
                "history": _history(None, 5).to_dict(),
                "error": {"type": "DivergenceError", "round": 4},
            }
        )
    )
    (runs / "LDCS__seed1.json").write_text(
        json.dumps({"label": "LDCS", "seed": 1, "status": "finished", "history": _history(3, 5).to_dict()})
    )
    finished, failed = lt.load_cell(tmp_path)
    assert sorted(finished["LDCS"]) == [1] and failed == {"LDCS": {0: "DivergenceError in round 4"}}
    st = lt.cell_stats(finished["LDCS"], at_round=5, target=0.8)
    assert st["seed_list"] == [1] and st["to_target_each"] == [3] and st["accuracy"] == [pytest.approx(0.9)]
    assert lt.cell_stats({}, at_round=5)["seed_list"] == []


# --------------------------------------------------------------------- _records: compact run records
def _stored(label: str, seed: int, rounds: list[tuple[list[int], list[float], float]]) -> dict:
    """A run file's content as run_comparison writes it; rounds: (clients, weights, accuracy)."""
    recs = [
        RoundRecord(
            round=t,
            clients=c,
            weights=w,
            lr=0.1,
            test_accuracy=a,
            test_loss=1.0 - a,
            costs=Costs(models_down=len(c), models_up=len(c), local_trainings=len(c)),
            failed=c[:1],
            seconds=0.25 + t / 7,
        )
        for t, (c, w, a) in enumerate(rounds)
    ]
    history = History(recs, model_size=10, config={"n_clients": 6, "trainer": {}, "federation": {}})
    return {
        "key": f"k-{label}-{seed}",
        "settings": {"seed": seed},
        "label": label,
        "selector": "x",
        "seed": seed,
        "status": "finished",
        "command": ["fedselect", "compare"],
        "commit": "abc",
        "seconds": 1.5,
        "finished": "2026-11-26T00:00:00+0000",
        "machine": {"cpu": "test"},
        "history": history.to_dict(),
        "selector_state": {"embeddings_": [[0.5, 0.25]]},
    }


def _write(folder: Path, saved: dict) -> Path:
    path = folder / "runs" / f"{saved['label']}__seed{saved['seed']}.json.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(saved).encode(), mtime=0))
    return path


def _made_up_runs() -> list[dict]:
    return [
        _stored("A", 0, [([0, 1], [0.5, 0.5], 0.3), ([2, 3], [1.25, 0.5], 0.9), ([4, 1], [], 0.95)]),
        _stored("A", 1, [([5, 0], [0.2, 0.3], 0.2), ([1, 2], [2.0, 1.5], 0.5), ([3, 4], [0.1, 0.1], 0.85)]),
        _stored("B", 0, [([0, 5], [0.5, 0.5], 0.85), ([2, 3], [0.5, 0.5], 0.9)]),
        _stored("B", 1, [([1, 2], [0.5, 0.5], 0.4), ([3, 4], [0.5, 0.5], 0.5), ([0, 1], [0.5, 0.5], 0.6)]),
    ]


def test_a_compact_record_keeps_everything_but_the_per_client_lists():
    saved = _made_up_runs()[0]
    raw = {"commit": "c" * 40, "path": "benchmarks/results/x/runs/A__seed0.json.gz", "blob": "b" * 40}
    compact = records.compact_record(saved, raw)
    assert list(compact) == [k for k in saved if k != "selector_state"] + ["compact"]
    assert all(compact[k] == saved[k] for k in saved if k not in ("history", "selector_state"))
    full, slim = History.from_dict(saved["history"]), History.from_dict(compact["history"])
    assert slim == History(
        [RoundRecord(**{**vars(r), "clients": [], "weights": []}) for r in full.rounds], full.model_size
    )
    assert [r.seconds for r in slim.rounds] == [r.seconds for r in full.rounds]  # seconds are not compared by ==
    info = compact["compact"]
    assert info["selection_counts"] == full.selection_counts(6) == [1, 2, 1, 1, 1, 0]
    assert info["chosen"] == 6 and info["raw"] == raw and info["format"] == records.COMPACT_FORMAT
    assert info["dropped"] == ["history.rounds[].clients", "history.rounds[].weights", "selector_state"]
    assert info["weight_total"] == [1.0, 1.75]  # the round without weights has no total
    assert records.weight_total_range(slim, info) == records.weight_total_range(full, None) == (1.0, 1.75)
    assert records.is_compact(compact) and not records.is_compact(saved)
    with pytest.raises(ValueError, match="compact already"):
        records.compact_record(compact, raw)
    with pytest.raises(ValueError, match="no history"):
        records.compact_record({k: v for k, v in saved.items() if k != "history"}, raw)


def test_a_comparison_of_compact_records_gives_the_same_tables(tmp_path):
    """Rows (rounds, accuracies, costs, seconds), the Markdown table and the paired tests: as from the full runs."""
    runs = _made_up_runs()
    for saved in runs:
        _write(tmp_path / "full", saved)
        _write(tmp_path / "compact", records.compact_record(saved, {"commit": "c", "path": "p", "blob": "b"}))
    full, full_cells = load_comparison(tmp_path / "full", 0.8)
    slim, slim_cells = load_comparison(tmp_path / "compact", 0.8)
    assert slim.rows() == full.rows() and slim.to_markdown() == full.to_markdown()
    assert slim.paired_markdown("A") == full.paired_markdown("A")
    assert [c["seed"] for c in slim_cells] == [c["seed"] for c in full_cells]
    for cell in slim_cells:
        info = records.compact_info(cell["path"])
        h = full.histories[cell["label"]][cell["seed"]]
        assert records.weight_total_range(
            slim.histories[cell["label"]][cell["seed"]], info
        ) == records.weight_total_range(h, None)
    assert all(records.compact_info(c["path"]) is None for c in full_cells)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def test_compact_runs_needs_git_to_hold_each_full_record(tmp_path):
    repo = tmp_path / "repo"
    folder = repo / "old" / "cmp"
    paths = [_write(folder, saved) for saved in _made_up_runs()]
    _git(repo.parent, "init", "-q", str(repo))
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "runs")
    commit = _git(repo, "rev-parse", "HEAD")
    before = {p: p.read_bytes() for p in paths}
    paths[1].write_bytes(gzip.compress(b'{"key": "k", "label": "A", "seed": 1, "history": {"rounds": []}}'))
    with pytest.raises(ValueError, match="not in commit"):
        records.compact_runs(folder, raw_commit=commit)
    assert all(p.read_bytes() == before[p] for p in paths if p != paths[1])  # nothing written
    paths[1].write_bytes(before[paths[1]])
    new = repo / "new" / "cmp"
    new.parent.mkdir()
    folder.rename(new)  # moved since the commit: --raw-dir says where it was
    assert records.compact_runs(new, raw_commit=commit[:7], raw_dir="old/cmp") == (4, 0)  # stored as the full hash
    assert records.compact_runs(new, raw_commit=commit, raw_dir="old/cmp") == (0, 4)
    info = records.compact_info(new / "runs" / "A__seed0.json.gz")
    assert info["raw"]["path"] == "old/cmp/runs/A__seed0.json.gz" and info["raw"]["commit"] == commit
    assert info["raw"]["blob"] == _git(repo, "rev-parse", f"{commit}:old/cmp/runs/A__seed0.json.gz")


def test_an_accuracy_pack_gives_the_same_rounds_and_paired_tests(tmp_path):
    """pack_accuracy: one file per comparison; its histories give each run's rounds to a target and the paired
    tests of the full runs; a failed run is kept as an entry, not as a history; a record git lacks is refused."""
    repo = tmp_path / "repo"
    folder = repo / "cmp"
    runs = _made_up_runs()
    failed = {**_stored("B", 2, [([0, 1], [0.5, 0.5], 0.1)]), "status": "failed",
              "error": {"type": "DivergenceError", "message": "the loss is nan", "round": 1, "rounds_completed": 1}}
    for saved in (*runs, failed):
        _write(folder, saved)
    _git(repo.parent, "init", "-q", str(repo))
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "runs")
    commit = _git(repo, "rev-parse", "HEAD")
    out, n = records.pack_accuracy(folder, raw_commit=commit)
    assert out == folder / records.ACCURACY_FILE and n == 5
    slim, entries = records.load_accuracy(out, 0.8)
    full, _ = load_comparison(folder, 0.8)
    assert {k: set(v) for k, v in slim.histories.items()} == {k: set(v) for k, v in full.histories.items()}
    assert slim.failed == full.failed and slim.n_clients == full.n_clients == 6
    for label, by_seed in full.histories.items():
        for seed, h in by_seed.items():
            packed = slim.histories[label][seed]
            assert [r.test_accuracy for r in packed.rounds] == [r.test_accuracy for r in h.rounds]
            assert packed.rounds_to_accuracy(0.8) == h.rounds_to_accuracy(0.8)
            assert packed.config == h.config
    assert json.dumps(slim.paired("A")) == json.dumps(full.paired("A"))  # NaN (no verdict) equals NaN there
    assert json.dumps(slim.paired("A", diverged="not-reached")) == json.dumps(full.paired("A", diverged="not-reached"))
    assert [e["status"] for e in entries].count("failed") == 1
    b1 = next(e for e in entries if e["label"] == "B" and e["seed"] == 1)
    assert b1["raw"]["path"] == "cmp/runs/B__seed1.json.gz" and b1["raw"]["commit"] == commit
    assert b1["raw"]["blob"] == _git(repo, "rev-parse", f"{commit}:cmp/runs/B__seed1.json.gz")
    assert b1["command"] == ["fedselect", "compare"] and "selector_state" not in b1
    _write(folder, {**runs[0], "seconds": 9.0})  # changed since the commit
    with pytest.raises(ValueError, match="not in commit"):
        records.pack_accuracy(folder, raw_commit=commit)


# Comparison folders whose report draws from the chosen clients (selection pictures, the share of chosen clients
# that failed): their runs stay full records.
_FULL = (
    "reproductions/fedcor/fedcor-fmnist-2spc/",
    "reproductions/fedcor/fedcor-fmnist-1spc/",
    "reproductions/fedcor/fedcor-fmnist-dir/",
    "studies/dropout/",
)


def test_the_stored_compact_records_say_what_they_dropped_and_where_the_full_ones_are():
    stored = sorted((ROOT / "benchmarks").glob("**/runs/*.json*"))
    if not stored:
        pytest.skip("no stored runs in this checkout")
    n_compact = n_full = 0
    for path in stored:
        saved = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())
        where = path.relative_to(ROOT / "benchmarks").as_posix()
        if not records.is_compact(saved):
            n_full += 1
            continue
        assert not where.startswith(_FULL), f"{where}: its report needs the full record"
        info = saved["compact"]
        rounds = saved["history"]["rounds"]
        assert all(r["clients"] == [] and r["weights"] == [] for r in rounds), where
        assert sum(info["selection_counts"]) == info["chosen"] > 0, where
        raw = info["raw"]
        # the full record: where it was when it was committed (benchmarks/results/ for the older tables, the table's
        # own folder for the recalibrated HCSFed table), under the same file name
        assert raw["path"].startswith("benchmarks/") and raw["path"].endswith("/runs/" + path.name), where
        assert len(raw["commit"]) == 40, where
        n_compact += 1
    assert n_compact > 0 and n_full > 0


# --------------------------------------------------------------------- fedcor_diagnostics: compact summaries
def _raw_diagnostics(path: Path, seed: int = 0) -> None:
    """A made-up raw record as fedcor_diagnostics.run writes it: N = 6 clients, 12 rounds, Sigma^t every 4."""
    rng = np.random.default_rng(seed)
    n, t, d, every, samples = 6, 12, 3, 4, 10
    root = rng.normal(size=(t + 1, d, n)).astype(np.float32)
    root[:2] = np.nan  # the GP's warm-up rounds
    chosen = np.stack([rng.choice(n, 2, replace=False) for _ in range(t + 1)])
    np.savez_compressed(
        path,
        losses=np.cumsum(rng.normal(size=(t + 1, n)), axis=0),
        gp_root=root,
        noise=np.asarray(0.1),
        gp_mean=rng.normal(size=(t + 1, n)).astype(np.float32),
        chosen=chosen,
        sigma_round=np.arange(0, t, every),
        sigma_samples=rng.normal(size=(t // every, samples, n)).astype(np.float32),
        accuracy=np.linspace(0.1, 0.8, t + 1),
        labels=np.array([2, 0, 1, 0, 2, 1]),
        fit_rounds=np.array([2, 5]),
        fit_nll=np.array([1.5, 0.5]),
        meta=np.asarray(["dir", str(seed), str(t), str(every), str(samples), "abc", "12", "made up"]),
    )


def test_a_diagnostics_summary_holds_what_the_report_reads(tmp_path):
    from benchmarks.reproductions.fedcor import fedcor_diagnostics as fd

    raw = tmp_path / "dir-seed0.npz"
    _raw_diagnostics(raw)
    full = fd.analyse(raw)
    summary = tmp_path / "dir-seed0.summary.npz"
    np.savez_compressed(summary, **fd.summarise(full))
    back = fd.load_summary(summary)
    for key in (
        "setting",
        "seed",
        "rounds",
        "every",
        "samples",
        "commit",
        "seconds",
        "command",
        "per_round",
        "ceiling",
        "stationarity",
        "noise",
    ):
        assert back[key] == full[key], key
    assert back["gp_vs_emp"] == full["gp_vs_emp"] and len(full["gp_vs_emp"]) == 2  # round 0: GP not fitted yet
    for key in ("sigma_rounds", "labels", "accuracy", "fit_rounds", "fit_nll", "heat_rounds", "heat_emp"):
        assert np.array_equal(back[key], full[key]), key
    assert np.array_equal(back["heat_root"], full["heat_root"], equal_nan=True)
    sig = np.load(raw)["sigma_samples"].astype(float)
    assert np.array_equal(back["heat_emp"][1], np.cov(sig[1], rowvar=False))  # the full symmetric matrix


def test_the_diagnostics_report_is_the_same_from_the_summaries_alone(tmp_path):
    """The report rebuilt after the raw records are gone: the same text and the same figures, byte for byte."""
    import matplotlib

    matplotlib.use("Agg")
    from benchmarks.reproductions.fedcor import fedcor_diagnostics as fd

    for seed in (0, 1):
        _raw_diagnostics(tmp_path / f"dir-seed{seed}.npz", seed)
    fd.report(tmp_path)
    made = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.suffix in (".md", ".png")}
    assert sorted(made) == [
        "DIAGNOSTICS.md",
        "dir-seed0-covariance.png",
        "dir-seed0.png",
        "dir-seed1-covariance.png",
        "dir-seed1.png",
    ]
    for raw in tmp_path.glob("*-seed[0-9].npz"):
        raw.unlink()
    fd.report(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.suffix in (".md", ".png")} == made


# --------------------------------------------------------------------- the per-setting files of the FedCor report
@pytest.mark.parametrize("setting", ["2spc", "1spc", "dir"])
def test_each_fedcor_setting_folder_holds_the_rows_its_report_shows(setting):
    """table.md, results.csv and summary.json of benchmarks/reproductions/fedcor/fedcor-fmnist-<setting> hold every
    row of that setting's table in REPORT.md, the same cells (issue 33, item 7: the 2022-code row was missing)."""
    import csv

    folder = ROOT / "benchmarks" / "reproductions" / "fedcor"
    report = (folder / "REPORT.md").read_text().split("\n## ")
    section = next(s for s in report if s.startswith(f"{setting.upper()}, target"))
    shown = [line for line in section.splitlines() if line.startswith("| ")]
    table = [line for line in section.split("\n\n")[2].splitlines() if line.startswith("| ")]  # the first table
    assert table[0].startswith("| scheme |") and table[1:]
    rows = {line.split(" | ")[0][2:]: line for line in table[1:]}
    out = folder / f"fedcor-fmnist-{setting}"
    have = [line for line in (out / "table.md").read_text().splitlines() if line.startswith("| ")]
    assert have == table, f"{out}/table.md differs from the report's table"
    with open(out / "results.csv") as fh:
        labels = {r["scheme"] for r in csv.DictReader(fh)}
    summary = json.loads((out / "summary.json").read_text())
    assert labels == set(rows) == {r["scheme"] for r in summary["rows"]}
    assert shown  # the section's own tables were read
    if setting != "1spc":  # 2SPC and DIR show the 2022 code's row, with the GP timing its runs were recorded with
        assert "FedCor (2022 code)" in rows and "gp_round_offset" in (out / "table.md").read_text()
