"""Comparisons of one's own schemes and data: selectors as instances or classes, a Federation or a factory."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from fedselect.compare import Comparison, run_comparison, run_settings, selector_table
from fedselect.data import make_federation
from fedselect.selection import BaseSelector, Selection
from fedselect.selectors.power_of_choice import PowerOfChoiceSelector

FEDERATION = {"dataset": "digits", "partition": "shards", "shards_per_client": 2, "n_clients": 10}
TRAINER = {"rounds": 4, "clients_per_round": 3, "local_steps": 2}
ROOT = Path(__file__).resolve().parents[1]


class LargestIndex(BaseSelector):
    """Not registered: the last n clients, shifted by ``offset`` each round."""

    def __init__(self, *, offset=1):
        self.offset = offset

    def _fit(self, pool):
        self.n_ = pool.n_clients

    def _select(self, n, *, round, oracle):
        return Selection((self.n_ - 1 - np.arange(n) - round * self.offset) % self.n_)


def _run(selectors, out=None, notes=None, **kw):
    kw.setdefault("federation", FEDERATION)
    kw.setdefault("trainer", TRAINER)
    kw.setdefault("seeds", (0, 1))
    return run_comparison(selectors, out_dir=out, progress=False, target=0.3,
                          log=(notes.append if notes is not None else lambda m: None), **kw)


def test_an_instance_or_class_runs_like_its_registered_name_and_is_never_trained_itself(tmp_path):
    given = PowerOfChoiceSelector(d=6)
    comp = _run({"name": ("power-of-choice", {"d": 6}), "instance": given,
                 "class": (PowerOfChoiceSelector, {"d": 6})})
    assert comp.histories["instance"] == comp.histories["name"] == comp.histories["class"]
    assert not [a for a in vars(given) if a.endswith("_")]  # a clone trained, never the object given
    assert given.random_state is None  # not seeded in place either


def test_default_labels_name_the_scheme_and_its_parameters():
    table = selector_table(["random", ("power-of-choice", {"d": 6}), PowerOfChoiceSelector(d=4), LargestIndex,
                            (LargestIndex, {"offset": 2})])
    assert list(table) == ["random", "power-of-choice(d=6)", "power-of-choice(d=4)", "LargestIndex",
                           "LargestIndex(offset=2)"]
    with pytest.raises(ValueError, match=r"both be labelled 'LargestIndex'.*mapping"):
        selector_table([LargestIndex, LargestIndex(offset=1)])  # an instance at its defaults is the class
    with pytest.raises(TypeError, match=r"scheme 'x': selector 3 .*registered name.*BaseSelector instance"):
        selector_table({"x": 3})
    with pytest.raises(ValueError, match=r"no parameter 'q'; its parameters: offset"):
        selector_table([(LargestIndex, {"q": 1})])


def test_an_unregistered_instance_resumes_and_a_changed_parameter_is_a_settings_mismatch(tmp_path):
    first = _run([LargestIndex(offset=2)], tmp_path)
    saved = json.loads((tmp_path / "runs" / "LargestIndex-offset-2__seed0.json").read_text())
    assert saved["settings"]["selector"] == f"{__name__}:LargestIndex"  # module:qualname
    assert saved["settings"]["params"] == {"offset": 2}
    notes = []
    again = _run([LargestIndex(offset=2)], tmp_path, notes)
    assert again.histories == first.histories and "2 finished run(s) loaded, 0 to run" in notes[0]
    with pytest.raises(ValueError, match=r"other settings \(params\.offset: saved 2, now 3\)"):
        _run({"LargestIndex(offset=2)": LargestIndex(offset=3)}, tmp_path)


def test_a_federation_object_is_used_for_every_seed_and_fingerprinted(tmp_path):
    fed = make_federation(random_state=7, **FEDERATION)
    comp = _run({"r": "random"}, tmp_path, federation=fed)
    assert comp.n_clients == 10
    # The same data under the trainer's seeds: the histories equal training on it directly.
    from fedselect import FederatedTrainer

    direct = FederatedTrainer(selector="random", random_state=1, **TRAINER).fit(fed).history_
    assert comp.histories["r"][1] == direct
    settings = json.loads((tmp_path / "runs" / "r__seed0.json").read_text())["settings"]["federation"]
    assert set(settings) == {"federation", "fingerprint"} and len(settings["fingerprint"]) == 16
    notes = []
    _run({"r": "random"}, tmp_path, notes, federation=make_federation(random_state=7, **FEDERATION))
    assert "2 finished run(s) loaded, 0 to run" in notes[0]  # an equal rebuild resumes
    other = make_federation(random_state=8, **FEDERATION)
    with pytest.raises(ValueError, match=r"federation\.fingerprint: saved '[0-9a-f]{16}', now '[0-9a-f]{16}'"):
        _run({"r": "random"}, tmp_path, federation=other)


def _factory(seed):
    return make_federation(random_state=100 + seed, **FEDERATION)


def test_a_factory_builds_each_seed_and_is_keyed_by_name_and_what_it_built(tmp_path):
    comp = _run({"r": "random"}, tmp_path, federation=_factory)
    mapping = _run({"r": "random"}, federation=FEDERATION)
    assert comp.histories["r"][0] != mapping.histories["r"][0]  # seed 100's partition, not seed 0's
    s = json.loads((tmp_path / "runs" / "r__seed1.json").read_text())["settings"]["federation"]
    assert s["factory"].endswith("test_compare_byo:_factory")
    from fedselect.compare import _federation_fingerprint

    assert s["fingerprint"] == _federation_fingerprint(_factory(1))
    notes = []
    again = _run({"r": "random"}, tmp_path, notes, federation=_factory)
    assert again.histories == comp.histories and "0 to run" in notes[0]


def test_bad_federations_are_type_errors_before_any_training(tmp_path):
    calls = []

    class Counting(LargestIndex):
        def _select(self, n, *, round, oracle):
            calls.append(round)
            return super()._select(n, round=round, oracle=oracle)

    with pytest.raises(TypeError, match=r"federation=.*must be a mapping .*Federation, or a callable"):
        _run([Counting], federation="digits")
    with pytest.raises(TypeError, match=r"factory .*<lambda> returned int 3 for seed 0; it must return a "
                       r"fedselect\.data\.Federation"):
        _run([Counting], federation=lambda seed: 3)
    drawn = iter(range(100, 200))
    with pytest.raises(ValueError, match="built two different federations for seed 0"):
        _run([Counting], federation=lambda seed: make_federation(random_state=next(drawn), **FEDERATION))
    small = make_federation(**{**FEDERATION, "n_clients": 2})
    with pytest.raises(ValueError, match=r"clients_per_round=3 is invalid.*2 clients"):
        _run([Counting], federation=lambda seed: small)
    assert calls == []


def test_results_csv_reads_back_with_commas_in_labels(tmp_path):
    comp = _run({"power-of-choice(d=6,random_state=1)": ("power-of-choice", {"d": 6, "random_state": 1}),
                 "r": "random"}, seeds=(0,))
    comp.write(tmp_path)
    with open(tmp_path / "results.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["scheme"] for r in rows] == ["power-of-choice(d=6,random_state=1)", "r"]
    assert all(r["seed"] == "0" and int(r["rounds_run"]) >= 1 and 0 <= float(r["final_accuracy"]) <= 1 for r in rows)
    failed = Comparison({"a,b": {}}, 0.3, 10, failed={"a,b": {0: {"rounds_completed": 2}}})
    failed.write(tmp_path)
    with open(tmp_path / "results.csv", newline="") as fh:
        assert next(csv.DictReader(fh)) == {
            "scheme": "a,b", "seed": "0", "rounds_to_target": "", "final_accuracy": "", "best_accuracy": "",
            "rounds_run": "2", "floats_to_target": "", "status": "failed"}


def _stored_runs():
    return sorted(ROOT.glob("benchmarks/results/*/runs/*.json.gz"))


@pytest.mark.skipif(not _stored_runs(), reason="no stored comparison runs in this checkout")
def test_the_recorded_runs_keep_their_keys():
    """Every run stored under benchmarks/results is found again by the command that made it."""
    from fedselect.cli import _apply_overrides, build_parser, parse_selector_spec
    from fedselect.compare import _key
    from fedselect.presets import get_preset

    checked = 0
    for path in _stored_runs():
        saved = json.loads(gzip.decompress(path.read_bytes()))
        args = build_parser().parse_args(saved["command"][1:])
        preset = get_preset(args.preset)
        federation, trainer = dict(preset.federation), dict(preset.trainer)
        _apply_overrides(args, federation, trainer)
        schemes = dict(preset.selectors)
        if args.selectors:
            schemes = {label: (name, params) for label, name, params in map(parse_selector_spec, args.selectors)}
        settings = run_settings(federation, trainer, schemes[saved["label"]], saved["seed"])
        assert _key(settings) == saved["key"], path
        checked += 1
    assert checked >= 100


def test_a_regression_comparison_says_accuracy_does_not_apply_and_reports_the_test_loss():
    import numpy as np

    from fedselect.compare import run_comparison
    from fedselect.data import Federation

    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 4)).astype(np.float32)
    y = (X @ np.array([1.0, -2.0, 0.5, 0.0], np.float32))[:, None]
    fed = Federation(X[:100], y[:100], np.array_split(np.arange(100), 5), X[100:], y[100:])
    comp = run_comparison(["random"], federation=fed, seeds=[0],
                          trainer={"model": "logistic", "loss": "mse", "rounds": 3, "clients_per_round": 2,
                                   "local_steps": 2, "target_accuracy": None}, progress=False)
    row = comp.rows()[0]
    assert row["final_accuracy"] is None and row["best_accuracy"] is None  # not a fake 0.000
    assert row["final_test_loss"] > 0
    table = comp.to_markdown()
    assert "0.000" not in table.split("\n")[2]
    assert "no accuracy (a regression loss)" in table and "Final test loss" in table


def test_a_table_where_no_run_reached_the_target_says_so():
    from fedselect.compare import run_comparison

    comp = run_comparison(["random", "power-of-choice"], federation={"dataset": "digits", "n_clients": 8},
                          seeds=[0], target=0.99,
                          trainer={"model": "logistic", "rounds": 2, "clients_per_round": 2, "local_steps": 1},
                          progress=False)
    assert "No run reached 99% in 2 rounds" in comp.to_markdown()


def test_keys_of_callable_module_and_random_state_values_are_stable_across_processes_and_follow_content():
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent('''
        import numpy as np, torch
        from fedselect.compare import _key, run_settings
        from fedselect.selectors.random import RandomSelector
        def huber(out, y):
            return torch.nn.functional.huber_loss(out, y, reduction="none").mean(1)
        torch.manual_seed(0)
        lin = torch.nn.Linear(64, 10)
        sel = RandomSelector(random_state=np.random.RandomState(0))
        print(_key(run_settings({"dataset": "digits"}, {"loss": huber, "model": lin}, sel, 0)))
        torch.manual_seed(1)
        print(_key(run_settings({"dataset": "digits"}, {"loss": huber, "model": torch.nn.Linear(64, 10)}, sel, 0)))
        print(_key(run_settings({"dataset": "digits"}, {"model": torch.nn.Linear}, "random", 0)))
        print(_key(run_settings({"dataset": "digits"}, {"loss": torch.nn.HuberLoss(delta=0.1)}, "random", 0)),
              _key(run_settings({"dataset": "digits"}, {"loss": torch.nn.HuberLoss(delta=1.0)}, "random", 0)))
    ''')
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
            for _ in range(2)]
    assert runs[0] == runs[1]  # no memory address in any key: a rerun in a new process resumes
    first, other_weights, _module_class, huber_01, huber_1 = runs[0]
    assert first != other_weights  # a module with other weights is another setting
    assert huber_01 != huber_1  # a loss module's options count
