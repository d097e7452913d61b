"""A comparison's (scheme, seed) runs at once: local worker processes (``jobs``) and Ray (``ray_address``).

What a user relies on: the same histories and result files as a serial run, bit for bit (one torch
thread per run, as here), the same resume, failed runs recorded, environment errors and Ctrl-C
stopping the grid without leaving worker processes behind.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from fedselect import plugins
from fedselect.compare import run_comparison
from fedselect.data import make_federation
from fedselect.selection import BaseSelector, Selection

FEDERATION = {"dataset": "digits", "partition": "shards", "shards_per_client": 2, "n_clients": 10}
TRAINER = {"rounds": 4, "clients_per_round": 3, "local_steps": 2, "n_threads": 1}
SCHEMES = {"random": ("random", {}), "poc": ("power-of-choice", {"d": 6})}  # poc: chosen by the model's losses
WALL_CLOCK = ("seconds", "finished", "machine")


class Explodes(BaseSelector):
    """The first n clients; raises ``kind`` in round ``at`` (a run's own error, or the environment's)."""

    def __init__(self, *, at=2, kind="run"):
        self.at = at
        self.kind = kind

    def _fit(self, pool):
        pass

    def _select(self, n, *, round, oracle):
        if round == self.at:
            raise (OSError if self.kind == "environment" else ValueError)(f"{self.kind} error in round {round}")
        return Selection(np.arange(n))


def _compare(out=None, *, jobs=1, schemes=SCHEMES, notes=None, **kw):
    kw.setdefault("federation", FEDERATION)
    kw.setdefault("trainer", TRAINER)
    kw.setdefault("progress", False)
    kw.setdefault("log", notes.append if notes is not None else (lambda m: None))
    return run_comparison(schemes, seeds=(0, 1), target=0.3, out_dir=out, jobs=jobs, **kw)


def _files(out: Path) -> dict[str, dict]:
    """Each result file without its wall-clock fields (run time, finish time, machine, per-round seconds)."""
    files = {}
    for path in sorted((out / "runs").glob("*.json")):
        d = json.loads(path.read_text())
        for k in WALL_CLOCK:
            d.pop(k)
        for r in (d["history"] or {}).get("rounds", []):
            r.pop("seconds")
        files[path.name] = d
    return files


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    out = tmp_path_factory.mktemp("serial")
    return _compare(out, jobs=1, command=["test"]), out


def _rounds(comp, label, seed):
    return [(r.clients, r.test_accuracy, r.test_loss) for r in comp.histories[label][seed].rounds]


def test_two_jobs_give_the_serial_histories_and_files_bit_for_bit(serial, tmp_path):
    comp1, out1 = serial
    comp2 = _compare(tmp_path, jobs=2, command=["test"])
    assert comp2.histories == comp1.histories  # clients, weights, accuracies, losses, costs of every round
    assert list(comp2.histories["poc"]) == [0, 1]  # the seeds in the serial order, not the finishing order
    assert _rounds(comp2, "poc", 1) == _rounds(comp1, "poc", 1)  # exact floats, not approximately
    assert _files(tmp_path) == _files(out1)  # same JSON, same keys, same commit and command
    assert not (tmp_path / "checkpoints").exists()  # each run's checkpoint went with its result


def test_a_parallel_grid_resumes_like_a_serial_one(serial, tmp_path):
    comp1, _ = serial
    _compare(tmp_path, jobs=2)
    (tmp_path / "runs" / "poc__seed1.json").unlink()
    notes = []
    comp = _compare(tmp_path, jobs=2, notes=notes, progress=True)  # stderr is no terminal here: lines, no bars
    assert "resuming: 3 finished run(s) loaded, 1 to run" in notes
    assert [n.split(":")[0] for n in notes[1:]] == ["[1/1] poc seed 1"]  # one line per finished run of the grid
    assert comp.histories == comp1.histories


def test_ctrl_c_stops_the_workers_and_the_rerun_resumes(tmp_path):
    trainer = {**TRAINER, "rounds": 40}

    def interrupt(msg):
        if msg.startswith("[1/"):  # the first run finished: its file is written, the others are training
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _compare(tmp_path, jobs=2, trainer=trainer, progress=True, log=interrupt)
    assert multiprocessing.active_children() == []  # no worker left running
    assert len(list((tmp_path / "runs").glob("*.json"))) == 1
    notes = []
    comp = _compare(tmp_path, jobs=2, trainer=trainer, notes=notes)
    assert any(n.startswith("resuming: 1 finished run(s) loaded, 3 to run") for n in notes)
    assert comp.histories == _compare(None, jobs=1, trainer=trainer).histories


def test_a_failed_run_in_a_worker_is_recorded_and_the_grid_goes_on(tmp_path):
    schemes = {"random": "random", "bad": (Explodes, {"at": 2})}
    notes = []
    comp = _compare(tmp_path / "par", jobs=2, schemes=schemes, notes=notes)
    assert set(comp.histories["random"]) == {0, 1}
    assert comp.failed["bad"][0] == {"type": "ValueError", "message": "run error in round 2", "round": 2,
                                     "rounds_completed": 2}
    saved = json.loads((tmp_path / "par" / "runs" / "bad__seed1.json").read_text())
    assert saved["status"] == "failed" and len(saved["history"]["rounds"]) == 2
    assert any("bad seed 1 failed in round 2: ValueError" in n for n in notes)
    _compare(tmp_path / "serial", jobs=1, schemes=schemes)
    files = _files(tmp_path / "par")
    for d in files.values():  # the traceback names the process it ran in; everything else is the serial file
        d.get("error", {}).pop("traceback", None)
    serial = _files(tmp_path / "serial")
    for d in serial.values():
        d.get("error", {}).pop("traceback", None)
    assert files == serial


def test_an_environment_error_in_a_worker_stops_the_grid(tmp_path):
    schemes = {"bad": (Explodes, {"at": 1, "kind": "environment"}), "random": "random"}
    with pytest.raises(OSError, match="environment error in round 1"):
        _compare(tmp_path, jobs=2, schemes=schemes)
    assert multiprocessing.active_children() == []
    assert not list((tmp_path / "runs").glob("bad__*.json"))  # not recorded as the run's result


def test_objects_and_factories_go_to_the_workers(tmp_path):
    fed = make_federation(random_state=3, **FEDERATION)
    given = {"instance": Explodes(at=99), "class": (Explodes, {"at": 99})}
    for federation in (fed, _factory):
        a = _compare(None, jobs=1, schemes=given, federation=federation)
        b = _compare(None, jobs=2, schemes=given, federation=federation)
        assert a.histories == b.histories and a.histories["instance"] == a.histories["class"]


def _factory(seed):
    return make_federation(random_state=seed + 5, **FEDERATION)


def test_what_cannot_reach_a_worker_is_named_before_any_training(tmp_path):
    class Local(Explodes):
        pass

    with pytest.raises(TypeError, match=r"federation factory .*<lambda>.* cannot be sent to worker processes.*jobs=1"):
        _compare(tmp_path, jobs=2, federation=lambda seed: make_federation(random_state=seed, **FEDERATION))
    with pytest.raises(TypeError, match=r"scheme 'mine': selector .*Local.* cannot be sent.*top level of a module"):
        _compare(tmp_path, jobs=2, schemes={"mine": Local()})
    assert not list((tmp_path / "runs").glob("*.json"))
    assert _compare(None, jobs=1, schemes={"mine": Local(at=99)}).histories["mine"]  # serial takes anything


def test_a_plugin_file_is_loaded_again_in_the_workers(tmp_path):
    plugin = tmp_path / "jobs_plugin.py"
    plugin.write_text(
        "import numpy as np\n"
        "import fedselect\n"
        "from fedselect.selection import BaseSelector, Selection\n\n"
        "class LastFirst(BaseSelector):\n"
        "    def _fit(self, pool):\n"
        "        self.n_ = pool.n_clients\n\n"
        "    def _select(self, n, *, round, oracle):\n"
        "        return Selection(self.n_ - 1 - np.arange(n))\n\n"
        "@fedselect.hookimpl\n"
        "def register_selectors(register):\n"
        "    register(LastFirst, name='last-first')\n"
    )
    before = set(plugins._user_plugins)
    try:
        plugins.load_plugin(plugin)
        schemes = {"last": ("last-first", {})}
        serial = _compare(tmp_path / "a", jobs=1, schemes=schemes)
        parallel = _compare(tmp_path / "b", jobs=2, schemes=schemes)
        assert parallel.histories == serial.histories
        assert parallel.histories["last"][0].rounds[0].clients == [7, 8, 9]  # the plugin's choice, sorted
        saved = json.loads((tmp_path / "b" / "runs" / "last__seed0.json").read_text())
        assert saved["settings"]["plugins"][0]["file"] == plugin.name
    finally:
        for label in set(plugins._user_plugins) - before:
            plugins.pm.unregister(plugins.pm.get_plugin(label))
            sys.modules.pop("jobs_plugin", None)
            del plugins._user_plugins[label]


@pytest.mark.parametrize(("jobs", "ray", "message"), [
    (-1, None, r"jobs=-1 must be an integer >= 1"),
    ("many", None, r"jobs='many'"),
    (True, None, r"jobs=True"),
    (2, "local", r"give jobs=2 or ray_address='local', not both"),
    (1, "", r"ray_address=''"),
])
def test_bad_jobs_and_ray_address_are_errors_naming_them(jobs, ray, message):
    with pytest.raises(ValueError, match=message):
        _compare(None, jobs=jobs, ray_address=ray)


def test_auto_jobs_fill_the_cores_and_oversubscription_warns(monkeypatch):
    from fedselect import _grid

    monkeypatch.setattr(_grid, "cores", lambda: 8)
    assert _grid.resolve_jobs("auto", None) == 8 and _grid.resolve_jobs(0, 2) == 4
    assert _grid.threads_per_run(2, None) == 4 and _grid.threads_per_run(2, 3) == 3
    monkeypatch.setattr(_grid, "cores", lambda: 1)
    with pytest.warns(RuntimeWarning, match=r"jobs=2 x 1 torch thread\(s\) per run = 2 threads on 1 core"):
        _compare(None, jobs=2, schemes={"random": "random"})


def test_without_ray_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r'pip install "fedselect\[ray\]"'):
        _compare(None, ray_address="local")


def test_cli_jobs_and_ray_options(tmp_path, capsys, monkeypatch):
    from fedselect import compare
    from fedselect.cli import build_parser, main

    args = build_parser().parse_args(["compare", "--jobs", "auto", "--ray", "ray://head:10001"])
    assert (args.jobs, args.ray) == (0, "ray://head:10001")
    assert build_parser().parse_args(["reproduce", "digits-quick"]).jobs == 1
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compare", "--jobs", "-2"])
    assert "expected an integer >= 0 or 'auto'" in capsys.readouterr().err
    seen = {}
    real = compare.run_comparison

    def spy(*a, **kw):
        seen.update(jobs=kw["jobs"], ray=kw["ray_address"])
        return real(*a, **kw)

    monkeypatch.setattr(compare, "run_comparison", spy)
    out = tmp_path / "out"
    assert main(["compare", "--selectors", "random", "power-of-choice:d=6", "--seeds", "0", "1", "--rounds", "3",
                 "--jobs", "2", "--no-progress", "--out", str(out)]) == 0
    assert seen == {"jobs": 2, "ray": None}
    assert len(list((out / "runs").glob("*.json"))) == 4


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def test_ray_tasks_give_the_serial_histories_and_files(serial, local_ray, tmp_path):
    comp1, out1 = serial
    comp = _compare(tmp_path, ray_address="local", command=["test"])
    assert comp.histories == comp1.histories
    assert _files(tmp_path) == _files(out1)
    assert local_ray.is_initialized()  # an instance the caller started is left running
    bad = _compare(tmp_path / "failed", ray_address="local", schemes={"bad": (Explodes, {"at": 1})})
    assert bad.failed["bad"][1]["message"] == "run error in round 1"  # recorded, the grid went on
    assert json.loads((tmp_path / "failed" / "runs" / "bad__seed0.json").read_text())["status"] == "failed"
    with pytest.raises(OSError, match="environment error in round 1"):
        _compare(tmp_path / "env", ray_address="local", schemes={"env": (Explodes, {"at": 1, "kind": "environment"})})


def test_a_class_of_an_interactive_session_is_refused_by_name(tmp_path):
    import os
    import subprocess

    code = (
        "import numpy as np\n"
        "from fedselect.compare import run_comparison\n"
        "from fedselect.selection import BaseSelector, Selection\n"
        "class Typed(BaseSelector):\n"
        "    def _fit(self, pool): pass\n"
        "    def _select(self, n, *, round, oracle): return Selection(np.arange(n))\n"
        "try:\n"
        "    run_comparison({'typed': Typed()}, federation={'dataset': 'digits'}, trainer={'rounds': 2},\n"
        "                   seeds=(0,), jobs=2, progress=False)\n"
        "except TypeError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         cwd=tmp_path)
    assert "scheme 'typed': selector Typed() is defined in an interactive __main__" in out.stdout, out.stderr
    assert "or run with jobs=1" in out.stdout
