"""Comparisons of one's own schemes and data: selectors as instances or classes, a Federation or a factory."""

from __future__ import annotations

import csv
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
    """Every run stored under benchmarks/ (reproductions/<paper>/ and studies/), however deep, full or compact:
    ``<folder>/runs/<label>__seed<s>.json[.gz]``."""
    return sorted(p for p in ROOT.glob("benchmarks/**/runs/*.json*") if p.name.endswith((".json", ".json.gz")))


# Stored runs whose command's preset row has changed since they ran, with the row they ran (by folder, relative to
# benchmarks/reproductions): the k-means++ runs kept as an extra row after the preset pinned kmeans_init="random"
# (2026-11-22; k-means++ was the default then, which their key cannot say); the 2022-code FedCor rows, run before
# CODE_2022 set gp_round_offset=1 (2026-11-29, issue 33 item 7), with the paper's GP rounds (offset 0, the default).
_FEDCOR_2022_AS_RUN = ("fedcor", {"warmup_rounds": 15, "gp_interval": 10, "beta": 0.95, "theta": 0.8,
                                  "gp_history": "latest", "posterior_noise": True, "warmup_fit_start": 10,
                                  "anneal_before_fit_start": True})
_RAN_ANOTHER_ROW = {
    "hcsfed/kmeanspp": {"HCSFed": ("hcsfed", {"n_clusters": 5, "compression_rate": 0.05})},
    "fedcor/fedcor-fmnist-2spc": {"FedCor (2022 code)": _FEDCOR_2022_AS_RUN},
    "fedcor/fedcor-fmnist-dir": {"FedCor (2022 code)": _FEDCOR_2022_AS_RUN},
}


def _how_it_was_made(saved, folder):
    """(federation, trainer, selector spec) of a stored run, from the command that made it."""
    from fedselect.cli import _apply_overrides, build_parser, parse_selector_spec
    from fedselect.presets import get_preset

    command = saved["command"]
    script = next((Path(a).name for a in command if a.endswith(".py") or Path(a).name == "fedselect"), "")
    if script == "ldcs_table.py":  # run_comparison with the ldcs-fmnist-<cell> preset as it is
        preset = get_preset(f"ldcs-fmnist-{folder.name}")
        return dict(preset.federation), dict(preset.trainer), preset.selectors[saved["label"]]
    if script == "dropout_table.py":  # fedselect compare over SCHEMES, in <out>/dropout-<d>
        from benchmarks.studies.dropout import dropout_table

        argv = ["compare", "--preset", "digits-quick", "--selectors", *dropout_table.SCHEMES,
                "--client-dropout", folder.name.removeprefix("dropout-")]
    elif script in ("fedselect", "cli.py", "__main__.py"):  # python -m fedselect.cli: cli.py, now __main__.py
        argv = command[command.index(next(a for a in command if Path(a).name == script)) + 1:]
    else:
        raise AssertionError(f"{folder}: made by {script!r}; say here how its runs are keyed")
    args = build_parser().parse_args(argv)
    preset = get_preset(args.preset)
    federation, trainer = dict(preset.federation), dict(preset.trainer)
    _apply_overrides(args, federation, trainer)
    schemes = dict(preset.selectors)
    if args.selectors:
        schemes = {label: (name, params) for label, name, params in map(parse_selector_spec, args.selectors)}
    for where, rows in _RAN_ANOTHER_ROW.items():
        if folder.is_relative_to(ROOT / "benchmarks" / "reproductions" / where):
            schemes.update(rows)
    return federation, trainer, schemes[saved["label"]]


@pytest.mark.skipif(not _stored_runs(), reason="no stored comparison runs in this checkout")
def test_the_recorded_runs_keep_their_keys():
    """Every run stored under benchmarks/ is found again by the command that made it.

    Where that command names a selector without a parameter whose default changed after the run
    (a ``_recorded_defaults`` entry, e.g. HCSFed's cohesion and kmeans_n_init), the command now
    means the new default: it must not find the run (a rerun into its folder is refused, never
    mixed with it), and the command with the old value pinned must.
    """
    from fedselect.compare import _key, read_text
    from fedselect.plugins import _recorded_defaults, as_selector_spec

    paths = _stored_runs()
    checked, relied_on_old_defaults = 0, 0
    for path in paths:
        saved = json.loads(read_text(path))
        federation, trainer, spec = _how_it_was_made(saved, path.parent.parent)
        spec = as_selector_spec(spec)
        old = _recorded_defaults(spec.cls) if spec.name is not None else {}
        left_out = [p for p in old if p not in spec.params]
        recorded_with = (saved.get("settings") or {}).get("params", {})
        if left_out and not any(p in recorded_with for p in left_out):  # recorded before those defaults changed
            now = run_settings(federation, trainer, (spec.name, spec.params), saved["seed"])
            assert _key(now) != saved["key"], f"{path}: its command now means other defaults but finds the run"
            spec = (spec.name, {**spec.params, **{p: old[p][0] for p in left_out}})
            relied_on_old_defaults += 1
        settings = run_settings(federation, trainer, spec, saved["seed"])
        assert _key(settings) == saved["key"], path
        checked += 1
    assert checked == len(paths) >= 891  # the 891 runs stored when benchmarks/ was reorganised (full or compact)
    # HCSFed by name before its defaults changed: dropout-table (10), uniform-mix (30), k-means++ (9), line-15 (10)
    assert relied_on_old_defaults == 59


def test_a_named_spec_records_a_changed_default_so_old_runs_keep_their_keys_and_new_defaults_get_new_ones():
    """HCSFed's cohesion ("paper" = "pairwise-sum" until it became "std") and kmeans_n_init (10 before it existed)."""
    from fedselect.plugins import as_selector_spec

    def recorded(params):
        return as_selector_spec(("hcsfed", params)).settings()["params"]

    old = {"n_clusters": 5}  # what runs recorded before the change say they ran: pairwise-sum, 10 k-means runs
    assert recorded({"n_clusters": 5, "cohesion": "pairwise-sum", "kmeans_n_init": 10}) == old
    assert recorded({"n_clusters": 5, "cohesion": "paper", "kmeans_n_init": 10}) == old  # the deprecated alias
    assert recorded({"n_clusters": 5, "cohesion": "std", "kmeans_n_init": 10}) == {"n_clusters": 5, "cohesion": "std"}
    assert recorded({"n_clusters": 5}) == {"n_clusters": 5, "cohesion": "std", "kmeans_n_init": 1}  # a new key
    assert recorded({"cohesion": "std", "kmeans_n_init": 1}) == recorded({})  # the defaults, given or not
    assert recorded({"cohesion": "pairwise-sum"}) == {"kmeans_n_init": 1}
    assert as_selector_spec(("fedcor", {"theta": 0.8})).settings()["params"] == {"theta": 0.8}  # others as given


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
