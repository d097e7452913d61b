"""Files fedselect reads back carry no code and cannot blow up memory (issue 21, items 4 and 5).

Each test is an attack: a planted checkpoint for ``fedselect run --out`` and ``fedselect compare --out``, a gzip
bomb and a tiny file claiming 20 million clients among a comparison's results, a planted CIFAR-10 batch. Payloads
would create a marker file; memory is measured with tracemalloc.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import pickle
import re
import shutil
import tracemalloc
import warnings
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from fedselect.cli import main
from fedselect.compare import Comparison, load_comparison
from fedselect.simulation import CorruptFileWarning, History
from fedselect.simulation import checkpoint as ck

RUN = ["run", "--rounds", "4", "--checkpoint-every", "2", "--no-progress"]
COMPARE = ["compare", "--selectors", "random", "--seeds", "0", "--rounds", "4", "--checkpoint-every", "2",
           "--no-progress", "--no-paired"]


class _Call:
    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _payload(how: str, marker: Path) -> object:
    if how == "os.system":
        return _Call(os.system, f"touch {marker}")
    return _Call(exec, f"open({str(marker)!r}, 'w').close()")


def _plant_legacy(path: Path, payload: object) -> None:
    data = pickle.dumps({"format": 1, "state": payload})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"FEDSELECT-CHECKPOINT-1\n" + hashlib.sha256(data).digest() + data)


def _smuggle(path: Path, payload: object) -> None:
    """Put ``payload`` where a format-2 checkpoint keeps the selector's state; fix the digest."""
    head = len(ck.MAGIC) + 32
    src = zipfile.ZipFile(io.BytesIO(path.read_bytes()[head:]))
    doc = json.loads(src.read("state.json"))
    target = f"objects/{doc['state']['selector']['$object']}.pickle"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for name in src.namelist():
            dst.writestr(name, pickle.dumps(payload) if name == target else src.read(name))
    body = out.getvalue()
    path.write_bytes(ck.MAGIC + hashlib.sha256(body).digest() + body)


# -- fedselect run --out ---------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["os.system", "builtins.exec"])
def test_run_out_refuses_a_planted_pickle_checkpoint_and_runs_no_code(how, tmp_path, capsys):
    out, marker = tmp_path / "h.json", tmp_path / "PWNED"
    _plant_legacy(tmp_path / "h.json.checkpoint" / "checkpoint.pkl", _payload(how, marker))
    status = main([*RUN, "--out", str(out)])
    assert not marker.exists(), "the planted checkpoint ran code"
    err = capsys.readouterr().err
    assert status == 2 and "fedselect: error:" in err and "pickle format" in err and "delete it" in err
    assert not out.exists()


def test_run_out_ignores_a_smuggled_global_in_a_new_format_checkpoint(tmp_path, capsys, monkeypatch):
    out, marker = tmp_path / "h.json", tmp_path / "PWNED"
    with monkeypatch.context() as m:  # keep the finished run's checkpoint instead of removing it
        m.setattr(shutil, "rmtree", lambda *a, **k: None)
        assert main([*RUN, "--out", str(out)]) == 0
    first = json.loads(out.read_text())
    out.unlink()
    _smuggle(tmp_path / "h.json.checkpoint" / "checkpoint.pkl", _payload("os.system", marker))
    with pytest.warns(CorruptFileWarning, match=r"refused global (posix|os)\.system"):
        assert main([*RUN, "--out", str(out)]) == 0
    assert not marker.exists(), "the planted checkpoint ran code"
    again = json.loads(out.read_text())
    assert History.from_dict(again) == History.from_dict(first)  # the run was redone, identically


# -- fedselect compare --out -----------------------------------------------------------------------

def test_compare_out_refuses_a_planted_pickle_checkpoint_and_overwrite_reruns(tmp_path, capsys):
    marker = tmp_path / "PWNED"
    _plant_legacy(tmp_path / "checkpoints" / "random__seed0" / "checkpoint.pkl", _payload("builtins.exec", marker))
    assert main([*COMPARE, "--out", str(tmp_path)]) == 2
    assert not marker.exists(), "the planted checkpoint ran code"
    err = capsys.readouterr().err
    assert "pickle format" in err and "--overwrite" in err
    assert main([*COMPARE, "--out", str(tmp_path), "--overwrite"]) == 0
    assert not marker.exists()
    assert json.loads((tmp_path / "runs" / "random__seed0.json").read_text())["status"] == "finished"


def test_compare_out_ignores_a_smuggled_global_in_a_new_format_checkpoint(tmp_path, monkeypatch):
    marker = tmp_path / "PWNED"
    with monkeypatch.context() as m:  # keep the run's checkpoint, as a comparison killed before its result has
        m.setattr("fedselect.experiments.plan.remove_tree", lambda path: None)
        assert main([*COMPARE, "--out", str(tmp_path)]) == 0
    first = json.loads((tmp_path / "runs" / "random__seed0.json").read_text())["history"]
    (tmp_path / "runs" / "random__seed0.json").unlink()
    _smuggle(tmp_path / "checkpoints" / "random__seed0" / "checkpoint.pkl", _payload("os.system", marker))
    with pytest.warns(CorruptFileWarning, match=r"refused global (posix|os)\.system"):
        assert main([*COMPARE, "--out", str(tmp_path)]) == 0
    assert not marker.exists(), "the planted checkpoint ran code"
    again = json.loads((tmp_path / "runs" / "random__seed0.json").read_text())["history"]
    assert History.from_dict(again) == History.from_dict(first)


# -- result files: a gzip bomb, absurd sizes --------------------------------------------------------

_HEAD = b'{"key": "k", "label": "random", "seed": 0, "status": "finished", "history": '
_TAIL = b'{"rounds": [], "model_size": 10, "config": {"n_clients": 4}}}'


@pytest.fixture(scope="module")
def bomb(tmp_path_factory) -> Path:
    """A valid result file of 300 MiB (whitespace) gzipped to about 300 KB."""
    c = zlib.compressobj(1, zlib.DEFLATED, 31)
    parts = [c.compress(_HEAD)]
    space = b" " * 2**20
    parts += [c.compress(space) for _ in range(300)]
    parts += [c.compress(_TAIL), c.flush()]
    path = tmp_path_factory.mktemp("bomb") / "random__seed0.json.gz"
    path.write_bytes(b"".join(parts))
    assert path.stat().st_size < 2 * 2**20
    return path


def _peak(fn) -> tuple[object, int, list[str]]:
    """What ``fn()`` returns (or raises), the peak of traced memory, and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracemalloc.start()
        try:
            result = fn()
        except Exception as exc:  # asserted by the caller, after the memory
            result = exc
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    return result, peak, [str(w.message) for w in caught if issubclass(w.category, CorruptFileWarning)]


def test_a_gzip_bomb_among_the_results_is_skipped_in_bounded_memory(bomb, tmp_path):
    (tmp_path / "runs").mkdir()
    shutil.copy(bomb, tmp_path / "runs" / bomb.name)
    loaded, peak, warned = _peak(lambda: load_comparison(tmp_path, 0.5))
    assert peak < 16 * 2**20, f"{peak / 2**20:.0f} MiB held to read a {bomb.stat().st_size} byte file"
    assert len(warned) == 1 and re.search(r"random__seed0\.json\.gz is unreadable .*decompressed", warned[0])
    comp, cells = loaded
    assert comp.histories == {} and cells == []


def test_a_gzip_bomb_in_a_comparison_being_resumed_is_moved_aside_and_the_run_redone(bomb, tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    shutil.copy(bomb, tmp_path / "runs" / bomb.name)
    with pytest.warns(CorruptFileWarning, match="decompressed"):
        assert main([*COMPARE, "--out", str(tmp_path)]) == 0
    assert len(list((tmp_path / "runs").glob("random__seed0.json.gz.corrupt-*"))) == 1
    assert json.loads((tmp_path / "runs" / "random__seed0.json").read_text())["status"] == "finished"


def _result(history: dict, **extra) -> dict:
    return {"key": "k", "label": "random", "seed": 0, "status": "finished", "history": history, **extra}


def _round(t: int, clients: list[int]) -> dict:
    return {"round": t, "clients": clients, "weights": [1.0] * len(clients), "lr": 0.05, "test_accuracy": 0.5,
            "test_loss": 1.0, "global_loss": None, "costs": {"models_down": 2}, "failed": [], "seconds": 0.0}


def test_a_tiny_result_claiming_20_million_clients_is_skipped_before_anything_is_allocated(tmp_path):
    (tmp_path / "runs").mkdir()
    claim = _result({"rounds": [_round(0, [0, 1])], "model_size": 10, "config": {"n_clients": 20_000_000}})
    path = tmp_path / "runs" / "random__seed0.json"
    path.write_text(json.dumps(claim))
    assert path.stat().st_size < 600
    import matplotlib

    matplotlib.use("Agg")

    def load_and_plot():
        comp, _ = load_comparison(tmp_path, 0.5)
        comp.plot(tmp_path / "figures")
        return comp

    comp, peak, warned = _peak(load_and_plot)
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB, then {comp!r}"
    assert len(warned) == 1 and "n_clients = 20000000" in warned[0]
    assert comp.histories == {}


def test_figures_of_millions_of_clients_stay_small(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from PIL import Image

    n = 5_000_000
    rng = np.random.default_rng(0)
    histories = {label: {s: History.from_dict({"rounds": [_round(t, sorted(rng.choice(n, 50, replace=False).tolist()))
                                                          for t in range(20)], "model_size": 10,
                                               "config": {"n_clients": n}}) for s in range(2)}
                 for label in ("a", "b")}
    Comparison(histories, 0.4, n).plot(tmp_path / "warm")  # matplotlib's caches and fonts, once
    result, peak, _ = _peak(lambda: Comparison(histories, 0.4, n).plot(tmp_path))
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB, then {result!r}"
    assert not isinstance(result, Exception), result
    with Image.open(tmp_path / "selection_frequency.png") as im:
        assert im.size[0] < 8000


@pytest.mark.parametrize("damage", ["deep nesting", "huge integer", "seed not an int", "client beyond n_clients",
                                    "negative client", "config not a mapping", "costs not numbers",
                                    "accuracy a string"])
def test_hostile_result_files_are_skipped_never_crash_loading(damage, tmp_path):
    (tmp_path / "runs").mkdir()
    good = {"rounds": [_round(0, [0, 1])], "model_size": 10, "config": {"n_clients": 4}}
    text = {
        "deep nesting": "[" * 100_000 + "]" * 100_000,
        "huge integer": json.dumps(_result(good))[:-1] + ', "x": ' + "9" * 5000 + "}",
        "seed not an int": json.dumps({**_result(good), "seed": "zero"}),
        "client beyond n_clients": json.dumps(_result({**good, "rounds": [_round(0, [0, 4])]})),
        "negative client": json.dumps(_result({**good, "rounds": [_round(0, [-1])]})),
        "config not a mapping": json.dumps(_result({**good, "config": [["federation", 1]]})),
        "costs not numbers": json.dumps(_result({**good, "rounds": [{**_round(0, [0]), "costs": {"models_up": "x"}}]})),
        "accuracy a string": json.dumps(_result({**good, "rounds": [{**_round(0, [0]), "test_accuracy": "high"}]})),
    }[damage]
    (tmp_path / "runs" / "random__seed0.json").write_text(text)
    (tmp_path / "runs" / "ok__seed0.json").write_text(json.dumps({**_result(good), "label": "ok"}))
    with pytest.warns(CorruptFileWarning, match=r"random__seed0\.json is unreadable"):
        comp, _ = load_comparison(tmp_path, 0.4)
    assert list(comp.histories) == ["ok"]
    comp.to_markdown()


# -- CIFAR-10 python batches ------------------------------------------------------------------------

def _cifar_dir(directory: Path, *, protocol: int = 4) -> None:
    from fedselect.data import datasets as ds

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(0)
    for i, name in enumerate(ds.CIFAR10_FILES):
        batch = {b"batch_label": b"batch", b"data": rng.randint(0, 256, (3, 3072)).astype(np.uint8),
                 b"labels": [(i + j) % 10 for j in range(3)], b"filenames": [b"x.png"] * 3}
        (directory / name).write_bytes(pickle.dumps(batch, protocol=protocol))


@pytest.mark.parametrize("how", ["os.system", "builtins.exec"])
def test_a_planted_cifar10_batch_runs_no_code(how, tmp_path):
    from fedselect.data.datasets import _read_cifar10, load_cifar10

    _cifar_dir(tmp_path)
    marker = tmp_path / "PWNED"
    (tmp_path / "test_batch").write_bytes(pickle.dumps({b"data": _payload(how, marker), b"labels": [0]}))
    _read_cifar10.cache_clear()
    try:
        load_cifar10(tmp_path)
        error = None
    except ValueError as exc:
        error = str(exc)
    assert not marker.exists(), "the planted batch ran code"
    assert error is not None and re.search(r"test_batch.*refused global", error) and "replace the file" in error


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_cifar10_batches_of_every_pickle_protocol_still_load(protocol, tmp_path):
    from fedselect.data.datasets import _read_cifar10, load_cifar10

    _cifar_dir(tmp_path, protocol=protocol)
    _read_cifar10.cache_clear()
    X, _, _, y_test = load_cifar10(tmp_path, normalize=None)
    assert X.shape == (15, 3, 32, 32) and y_test.tolist() == [5, 6, 7]


def test_gzip_result_files_still_read(tmp_path):
    from fedselect.compare import read_text

    (tmp_path / "a.json.gz").write_bytes(gzip.compress(b'{"x": 1}'))
    assert read_text(tmp_path / "a.json.gz") == '{"x": 1}'
    with pytest.raises(ValueError, match="more than 4 bytes"):
        read_text(tmp_path / "a.json.gz", max_bytes=4)
