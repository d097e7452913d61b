"""Checkpoints carry no code: planted files never run anything, and every built-in still resumes bit for bit.

The attacks (issue 21, item 4): a ``checkpoint.pkl`` with the right magic and the right SHA-256 (a checksum, not a
signature) whose pickle runs a command; and a file in the new format whose pickled selector state smuggles a
global. Each payload would create a marker file; the tests assert that it never appears.
"""

from __future__ import annotations

import builtins
import collections
import fractions
import functools
import hashlib
import io
import json
import os
import pickle
import subprocess
import tracemalloc
import zipfile
from dataclasses import dataclass, field
from numbers import Integral
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import scipy.sparse
import torch

from fedselect import FederatedTrainer, get_selector
from fedselect._validation import Interval
from fedselect.selection import BaseSelector, ClientOracle, ClientPool, RoundFeedback, Selection
from fedselect.selectors.fedcor import FedCorSelector
from fedselect.simulation import CheckpointMismatchError, CorruptFileWarning
from fedselect.simulation import checkpoint as ck

from .test_checkpoint import _Stop, _stop_at

KW = dict(rounds=10, clients_per_round=3, local_steps=2, random_state=5)


# -- payloads ---------------------------------------------------------------------------------

class _Call:
    """Pickles as ``func(*args)``: what an attacker's pickle runs when it is loaded."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _payloads(marker: Path) -> dict[str, object]:
    code = f"open({str(marker)!r}, 'w').close()"
    return {
        "os.system": _Call(os.system, f"touch {marker}"),
        "builtins.exec": _Call(builtins.exec, code),
        "builtins.eval": _Call(builtins.eval, code),
        "functools.partial": _Call(functools.partial(os.system, f"touch {marker}")),
        "subprocess.call": _Call(subprocess.call, ["touch", str(marker)]),
    }


PAYLOADS = list(_payloads(Path("m")))


def _legacy_file(path: Path, payload: object) -> None:
    """A checkpoint as format 1 wrote it: magic, the payload's true SHA-256, the pickle."""
    data = pickle.dumps({"format": 1, "state": payload})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"FEDSELECT-CHECKPOINT-1\n" + hashlib.sha256(data).digest() + data)


def _rewrite(path: Path, members: dict[str, bytes]) -> None:
    """Replace members of a format-2 checkpoint and fix its digest: a well-formed file with chosen content."""
    head = len(ck.MAGIC) + 32
    src = zipfile.ZipFile(io.BytesIO(path.read_bytes()[head:]))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for name in src.namelist():
            dst.writestr(name, members.get(name, src.read(name)))
        for name in set(members) - set(src.namelist()):
            dst.writestr(name, members[name])
    body = out.getvalue()
    path.write_bytes(ck.MAGIC + hashlib.sha256(body).digest() + body)


def _members(path: Path) -> tuple[dict, zipfile.ZipFile]:
    zf = zipfile.ZipFile(io.BytesIO(path.read_bytes()[len(ck.MAGIC) + 32:]))
    return json.loads(zf.read("state.json")), zf


def _selector_member(path: Path) -> str:
    doc, _ = _members(path)
    return f"objects/{doc['state']['selector']['$object']}.pickle"


@pytest.fixture(scope="module")
def genuine(tmp_path_factory, digits_fed):
    """A real checkpoint of a FedCor run stopped after round 4 (written after round 3), and the uninterrupted run."""
    sel = dict(warmup_rounds=2, warmup_iters=10, gp_iters=10, gp_interval=3, rank=3)
    kw = dict(KW, selector=get_selector("fedcor", **sel))
    reference = FederatedTrainer(**kw).fit(digits_fed)
    d = tmp_path_factory.mktemp("genuine")
    with pytest.raises(_Stop):
        FederatedTrainer(**kw, checkpoint_dir=d, checkpoint_every=4, callback=_stop_at(5)).fit(digits_fed)
    return d / "checkpoint.pkl", kw, reference


# -- the attack on format 1: never unpickled ---------------------------------------------------

@pytest.mark.parametrize("how", PAYLOADS)
def test_a_planted_pickle_checkpoint_runs_no_code_and_is_refused_with_what_to_do(how, digits_fed, tmp_path):
    marker = tmp_path / "PWNED"
    path = tmp_path / "ckpt" / "checkpoint.pkl"
    _legacy_file(path, _payloads(marker)[how])
    caught = None
    try:
        FederatedTrainer(**KW, checkpoint_dir=path.parent).fit(digits_fed)
    except Exception as exc:
        caught = exc
    assert not marker.exists(), "the checkpoint's pickle ran"
    assert isinstance(caught, CheckpointMismatchError), caught
    assert type(caught).__name__ == "LegacyCheckpointError"
    msg = str(caught)
    assert str(path) in msg and "pickle format" in msg and "delete it" in msg and "rerun" in msg
    assert path.exists()  # left in place: the user decides


def test_read_checkpoint_refuses_a_pickle_checkpoint(tmp_path):
    marker = tmp_path / "PWNED"
    _legacy_file(tmp_path / "c.pkl", _payloads(marker)["os.system"])
    with pytest.raises(CheckpointMismatchError, match="pickle format"):
        ck.read_checkpoint(tmp_path / "c.pkl")
    assert not marker.exists()


# -- the attack on format 2: a smuggled global in the selector's pickled state ------------------

@pytest.mark.parametrize("how", PAYLOADS)
def test_a_smuggled_global_in_a_new_format_checkpoint_runs_no_code(how, genuine, digits_fed, tmp_path):
    source, kw, reference = genuine
    path = tmp_path / "checkpoint.pkl"
    path.write_bytes(source.read_bytes())
    marker = tmp_path / "PWNED"
    _rewrite(path, {_selector_member(path): pickle.dumps(_payloads(marker)[how], protocol=5)})
    with pytest.warns(CorruptFileWarning, match=r"refused global (posix|os|nt|builtins|functools|subprocess)\.") as w:
        again = FederatedTrainer(**kw, checkpoint_dir=tmp_path, checkpoint_every=4).fit(digits_fed)
    assert not marker.exists(), "the checkpoint's pickle ran"
    assert str(path) in str(w[0].message)
    assert again.resumed_from_ == 0 and again.history_ == reference.history_  # moved aside, run redone
    assert len(list(tmp_path.glob("checkpoint.pkl.corrupt-*"))) == 1


class _Planted:
    """A class outside every selector module whose ``__setstate__`` would run on load."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __setstate__(self, state):
        open(state["marker"], "w").close()


@pytest.mark.parametrize("payload", ["getattr", "unregistered class", "torch's own tensor pickle", "numpy reconstruct",
                                     "module rebuild of a non-module", "a module import"])
def test_the_allow_list_refuses_each_global_by_name(payload, tmp_path):
    marker = tmp_path / "PWNED"
    obj, name = {
        "getattr": (_Call(getattr, str, "join"), "builtins.getattr"),
        "unregistered class": (_Planted(marker), f"{__name__}._Planted"),
        "torch's own tensor pickle": (torch.ones(2), "torch._utils._rebuild_tensor_v2"),
        "numpy reconstruct": (np.ones(2), "numpy._core.multiarray._reconstruct"),
        "module rebuild of a non-module": (_Call(ck._rebuild_module, FedCorSelector, {"rank": 3}), None),
        "a module import": (_Call(__import__, "os"), "builtins.__import__"),
    }[payload]
    data = pickle.dumps(obj, protocol=4)  # protocol 4: arrays and tensors by their own reducers
    with pytest.raises(pickle.UnpicklingError) as info:
        ck.SafeUnpickler(io.BytesIO(data), {}).load()
    assert not marker.exists()
    if name is not None:
        assert f"refused global {name}" in str(info.value)


# -- what a checkpoint may hold, and what it holds -----------------------------------------------

def test_a_fedcor_checkpoint_names_only_its_own_classes_and_the_rebuilders(genuine):
    doc, zf = _members(genuine[0])
    assert doc["state"]["theta"] == {"$array": doc["state"]["theta"]["$array"]}  # the model is an .npy member
    found: set[str] = set()

    class Recording(ck.SafeUnpickler):
        def find_class(self, module, name):
            found.add(f"{module}.{name}")
            return super().find_class(module, name)

    arrays = ck.open_checkpoint(genuine[0])._arrays
    for name in zf.namelist():
        if name.startswith("objects/"):
            Recording(io.BytesIO(zf.read(name)), arrays).load()
    assert "fedselect.selectors._gp.LossChangeGP" in found, found
    allowed = ("fedselect.selectors.", "fedselect.simulation.checkpoint._rebuild_")
    assert all(g.startswith(allowed) for g in found), found
    assert not any("torch._utils" in g or "torch.storage" in g or "getattr" in g for g in found)


def test_resuming_never_calls_torch_load_or_unrestricted_pickle(genuine, digits_fed, tmp_path, monkeypatch):
    source, kw, reference = genuine
    (tmp_path / "checkpoint.pkl").write_bytes(source.read_bytes())

    def forbidden(*a, **k):
        raise AssertionError("torch.load / pickle.loads called")

    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    resumed = FederatedTrainer(**kw, checkpoint_dir=tmp_path, checkpoint_every=4).fit(digits_fed)
    assert resumed.resumed_from_ == 4
    assert resumed.history_ == reference.history_ and (resumed.parameters_ == reference.parameters_).all()


def test_a_header_claiming_a_huge_array_is_refused_before_allocating(genuine, tmp_path):
    path = tmp_path / "checkpoint.pkl"
    path.write_bytes(genuine[0].read_bytes())
    doc, _ = _members(path)
    member = f"arrays/{doc['state']['theta']['$array']}.npy"
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (2**40,)})
    _rewrite(path, {member: buf.getvalue() + b"\0" * 64})
    tracemalloc.start()
    try:
        with pytest.warns(CorruptFileWarning, match="header says"):
            assert ck.open_checkpoint(path) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20


@pytest.mark.parametrize("damage", ["deflated member", "extra member", "object array", "missing array"])
def test_malformed_archives_are_moved_aside(damage, genuine, tmp_path):
    path = tmp_path / "checkpoint.pkl"
    path.write_bytes(genuine[0].read_bytes())
    doc, zf = _members(path)
    theta = f"arrays/{doc['state']['theta']['$array']}.npy"
    if damage == "deflated member":
        head = len(ck.MAGIC) + 32
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as dst:
            for name in zf.namelist():
                dst.writestr(name, zf.read(name))
        body = out.getvalue()
        path.write_bytes(path.read_bytes()[:len(ck.MAGIC)] + hashlib.sha256(body).digest() + body)
        assert len(path.read_bytes()) > head
    elif damage == "extra member":
        _rewrite(path, {"payload.py": b"import os"})
    elif damage == "object array":
        buf = io.BytesIO()
        np.save(buf, np.array([1, "x"], dtype=object), allow_pickle=True)
        _rewrite(path, {theta: buf.getvalue()})
    else:
        doc["state"]["theta"] = {"$array": "a999"}
        _rewrite(path, {"state.json": json.dumps(doc).encode()})
    with pytest.warns(CorruptFileWarning):
        assert ck.open_checkpoint(path) is None
    assert len(list(tmp_path.glob("checkpoint.pkl.corrupt-*"))) == 1


# -- every built-in resumes bit for bit ------------------------------------------------------------

BUILTINS = [
    ("random", {}), ("round-robin", {}), ("data-size", {}), ("power-of-choice", {"d": 6}), ("afl", {}),
    ("fedcor", {"warmup_rounds": 2, "warmup_iters": 10, "gp_iters": 10, "gp_interval": 3, "rank": 3}),
    ("hcsfed", {}), ("ldcs", {}), ("ldcs", {"storage": "sketch", "sketch_dim": 16}), ("ldcs", {"storage": "float16"}),
    ("clustered", {}), ("clustered", {"method": "similarity"}), ("ocs", {}),
]


@pytest.mark.parametrize(("name", "params"), BUILTINS,
                         ids=[f"{n}-{'-'.join(map(str, p.values()))}" for n, p in BUILTINS])
def test_every_builtin_resumes_exactly_from_the_safe_format(name, params, digits_fed, tmp_path):
    from fedselect.testing import SyntheticOracle

    kw = dict(KW, client_dropout=0.2)
    reference = FederatedTrainer(selector=get_selector(name, **params), **kw).fit(digits_fed)
    with pytest.raises(_Stop):
        FederatedTrainer(selector=get_selector(name, **params), **kw, checkpoint_dir=tmp_path, checkpoint_every=3,
                         callback=_stop_at(7)).fit(digits_fed)
    resumed = FederatedTrainer(selector=get_selector(name, **params), **kw, checkpoint_dir=tmp_path,
                               checkpoint_every=3).fit(digits_fed)
    assert resumed.resumed_from_ == 6
    assert resumed.history_ == reference.history_
    assert (resumed.parameters_ == reference.parameters_).all()
    if name == "ldcs":  # it compares stored models with the oracle's, whose size is the synthetic oracle's
        return
    n = digits_fed.n_clients
    for t in range(10, 12):  # the selector goes on identically (the resumed rounds 6-9 already show it in the run)
        a = resumed.selector_.select(3, round=t, oracle=SyntheticOracle(n, random_state=t))
        b = reference.selector_.select(3, round=t, oracle=SyntheticOracle(n, random_state=t))
        assert a.clients.tolist() == b.clients.tolist()


# -- values the safe format rebuilds ---------------------------------------------------------------

@dataclass
class _Record:
    round: int
    values: np.ndarray
    extra: dict = field(default_factory=dict)


def _rich_state() -> dict:
    shared = np.arange(6.0).reshape(2, 3)
    rng = np.random.default_rng(7)
    rng.random(3)
    legacy = np.random.RandomState(np.random.PCG64(3))
    legacy.standard_normal()  # a cached gaussian
    gen = torch.Generator().manual_seed(11)
    torch.rand(3, generator=gen)
    return {
        "shared_a": shared, "shared_b": shared, "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        "f16": np.ones(3, np.float16), "struct": np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8", (2,))]),
        "objects": np.array([None, (1, 2), "x"], dtype=object), "scalar": np.float32(1.5), "int": np.int64(-3),
        "tuple": (1, 2.5, "s", None), "set": {1, 2}, "frozen": frozenset({"a"}), "complex": 1 + 2j,
        "ordered": collections.OrderedDict(b=1, a=2), "deque": collections.deque([1, 2], maxlen=3),
        "default": collections.defaultdict(list, {"k": [1]}), "bytes": b"\x00\xff", "inf": float("inf"),
        "generator": rng, "seq": np.random.SeedSequence(5, spawn_key=(1,)), "legacy": legacy,
        "torch_gen": gen, "tensor": torch.arange(6, dtype=torch.float64).reshape(2, 3).t(),
        "bf16": torch.ones(2, 2, dtype=torch.bfloat16), "param": torch.nn.Parameter(torch.ones(3)),
        "grad": torch.zeros(2, requires_grad=True), "dtype": torch.float16, "device": torch.device("cpu"),
        "size": torch.Size([2, 3]), "dtype_np": np.dtype("<u2"),
        "csr": scipy.sparse.random(5, 7, density=0.3, format="csr", random_state=0),
        "coo": scipy.sparse.coo_array(np.eye(3)),
        "module": torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU()),
        "record": [_Record(1, np.ones(2), {"x": np.zeros(1)})],
    }


def test_the_safe_format_rebuilds_numpy_torch_scipy_and_container_values(tmp_path):
    state = _rich_state()
    ck.write_checkpoint(tmp_path / "c", {"s": ck.Pickled(state, classes=(_Record,)), "plain": {"a": [1, 2.5, None]}})
    got = ck.read_checkpoint(tmp_path / "c", classes=(_Record,))
    assert got["plain"] == {"a": [1, 2.5, None]}
    out = got["s"]
    assert out["shared_a"] is out["shared_b"]  # one array, stored once
    assert out["fortran"].flags.f_contiguous
    for key in ("shared_a", "fortran", "f16", "struct", "objects"):
        np.testing.assert_array_equal(out[key], state[key])
        assert out[key].dtype == state[key].dtype
    for key in ("scalar", "int", "tuple", "set", "frozen", "complex", "ordered", "bytes", "inf", "dtype_np"):
        assert out[key] == state[key] and type(out[key]) is type(state[key]), key
    assert out["deque"] == state["deque"] and out["deque"].maxlen == 3
    assert out["default"]["new"] == [] and out["default"]["k"] == [1]
    assert out["generator"].random(4).tolist() == state["generator"].random(4).tolist()
    assert out["generator"].spawn(1)[0].random() == state["generator"].spawn(1)[0].random()
    assert out["seq"].generate_state(2).tolist() == state["seq"].generate_state(2).tolist()
    assert out["legacy"].standard_normal(3).tolist() == state["legacy"].standard_normal(3).tolist()
    assert torch.equal(torch.rand(3, generator=out["torch_gen"]), torch.rand(3, generator=state["torch_gen"]))
    assert torch.equal(out["tensor"], state["tensor"]) and out["tensor"].stride() == state["tensor"].stride()
    assert out["bf16"].dtype == torch.bfloat16 and torch.equal(out["bf16"], state["bf16"])
    assert isinstance(out["param"], torch.nn.Parameter) and out["param"].requires_grad
    assert out["grad"].requires_grad and out["dtype"] is torch.float16 and out["size"] == torch.Size([2, 3])
    assert (out["csr"] != state["csr"]).nnz == 0 and out["csr"].format == "csr"
    assert type(out["coo"]) is scipy.sparse.coo_array and (out["coo"] != state["coo"]).nnz == 0
    x = torch.ones(4, 3)
    assert torch.equal(out["module"](x), state["module"](x))
    assert out["record"][0].round == 1 and out["record"][0].extra["x"].tolist() == [0.0]


def test_values_outside_the_allow_list_are_refused_when_written_naming_them(tmp_path):
    for value, named in [(fractions.Fraction(1, 3), "fractions.Fraction"), (np.exp, "numpy"), (len, "builtins.len"),
                         (np.ma.masked_array([1.0]), "numpy.ma")]:
        with pytest.raises(ck.UnsafeStateError, match="'bad'") as info:
            ck.write_checkpoint(tmp_path / "c", {"s": ck.Pickled({"ok": 1, "bad": value})})
        assert named in str(info.value)
    assert not (tmp_path / "c").exists()
    m = torch.nn.Linear(2, 2)
    m.register_forward_hook(lambda *a: None)
    with pytest.raises(ck.UnsafeStateError, match="hooks"):
        ck.check_state({"s": m})


def test_sparse_matrices_are_rebuilt_through_scipy_s_checks(tmp_path):
    m = scipy.sparse.csr_matrix(np.eye(3))
    m.indices[0] = 7  # out of range: native code would read past the row
    with pytest.raises(ck.UnsafeStateError, match="indices must be < 3"):
        ck.write_checkpoint(tmp_path / "c", {"s": m})


# -- a plugin selector: its own classes are fine; others need checkpoint_trusted=True -------------

@dataclass
class _Memo:
    """A helper class in the selector's own module: admitted."""

    counts: np.ndarray


class _PluginSelector(BaseSelector):
    """Round robin over a shuffled order, keeping a _Memo and, if asked, a Fraction (a class of another module)."""

    _parameter_constraints: ClassVar[dict] = {"unsafe": ["boolean"],
                                              "unsafe_from": [Interval(Integral, 0, None, closed="left")]}

    def __init__(self, *, unsafe: bool = False, unsafe_from: int = 0, random_state=None):
        self.unsafe = unsafe
        self.unsafe_from = unsafe_from
        self.random_state = random_state

    def fit(self, pool: ClientPool):
        self.rng_ = np.random.default_rng(0 if self.random_state is None else self.random_state)
        self.memo_ = _Memo(np.zeros(pool.n_clients, dtype=np.int64))
        self.ratio_ = fractions.Fraction(1, 3) if self.unsafe and self.unsafe_from == 0 else None
        return self

    def select(self, n: int, *, round: int, oracle: ClientOracle) -> Selection:
        order = np.lexsort((self.rng_.random(len(self.memo_.counts)), self.memo_.counts))
        return Selection(order[:n])

    def update(self, feedback: RoundFeedback):
        self.memo_.counts[np.asarray(feedback.clients)] += 1
        if self.unsafe and feedback.round + 1 >= self.unsafe_from:
            self.ratio_ = fractions.Fraction(1, 3)
        return self


def test_a_plugin_selector_with_its_own_classes_resumes_exactly(digits_fed, tmp_path):
    reference = FederatedTrainer(selector=_PluginSelector(), **KW).fit(digits_fed)
    with pytest.raises(_Stop):
        FederatedTrainer(selector=_PluginSelector(), **KW, checkpoint_dir=tmp_path, checkpoint_every=2,
                         callback=_stop_at(5)).fit(digits_fed)
    resumed = FederatedTrainer(selector=_PluginSelector(), **KW, checkpoint_dir=tmp_path).fit(digits_fed)
    assert resumed.resumed_from_ == 4 and resumed.history_ == reference.history_


def test_unsafe_plugin_state_is_refused_before_training_with_the_trusted_escape(digits_fed, tmp_path):
    seen: list[int] = []
    with pytest.raises(ck.UnsafeStateError) as info:
        FederatedTrainer(selector=_PluginSelector(unsafe=True), **KW, checkpoint_dir=tmp_path,
                         callback=lambda tr, r: seen.append(r.round)).fit(digits_fed)
    msg = str(info.value)
    assert seen == [] and not (tmp_path / "checkpoint.pkl").exists()
    assert "_PluginSelector" in msg and "'ratio_'" in msg and "fractions.Fraction" in msg
    assert "checkpoint_trusted=True" in msg and "runs code from the file" in msg
    # without checkpoints nothing is refused
    reference = FederatedTrainer(selector=_PluginSelector(unsafe=True), **KW).fit(digits_fed)
    # the escape: written and read with pickle, and then it resumes exactly
    with pytest.raises(_Stop):
        FederatedTrainer(selector=_PluginSelector(unsafe=True), **KW, checkpoint_dir=tmp_path, checkpoint_every=2,
                         checkpoint_trusted=True, callback=_stop_at(5)).fit(digits_fed)
    resumed = FederatedTrainer(selector=_PluginSelector(unsafe=True), **KW, checkpoint_dir=tmp_path,
                               checkpoint_trusted=True).fit(digits_fed)
    assert resumed.resumed_from_ == 4 and resumed.history_ == reference.history_


def test_a_fully_pickled_checkpoint_is_not_read_without_trust(digits_fed, tmp_path):
    late = dict(unsafe=True, unsafe_from=2)  # safe when fitted, unsafe from round 2 on
    with pytest.raises(_Stop):
        FederatedTrainer(selector=_PluginSelector(**late), **KW, checkpoint_dir=tmp_path, checkpoint_every=4,
                         checkpoint_trusted=True, callback=_stop_at(5)).fit(digits_fed)
    doc, _ = _members(tmp_path / "checkpoint.pkl")
    assert list(doc["objects"].values()) == [{"trusted": True}]
    marker = tmp_path / "PWNED"
    _rewrite(tmp_path / "checkpoint.pkl",
             {_selector_member(tmp_path / "checkpoint.pkl"): pickle.dumps(_payloads(marker)["os.system"])})
    with pytest.raises(CheckpointMismatchError, match="checkpoint_trusted=True") as refused:
        FederatedTrainer(selector=_PluginSelector(**late), **KW, checkpoint_dir=tmp_path).fit(digits_fed)
    assert not marker.exists()  # refused before anything is unpickled
    assert type(refused.value).__name__ == "UntrustedCheckpointError"


def test_state_that_turns_unsafe_mid_run_stops_at_the_write_keeping_the_last_checkpoint(digits_fed, tmp_path):
    with pytest.raises(ck.UnsafeStateError, match="kept") as info:
        FederatedTrainer(selector=_PluginSelector(unsafe=True, unsafe_from=3), **KW, checkpoint_dir=tmp_path,
                         checkpoint_every=2).fit(digits_fed)
    assert "'ratio_'" in str(info.value)
    assert ck.read_checkpoint(tmp_path / "checkpoint.pkl", classes=(_PluginSelector,))["next_round"] == 2


def test_checkpoint_trusted_is_not_part_of_the_fingerprint(digits_fed, tmp_path):
    with pytest.raises(_Stop):
        FederatedTrainer(selector="random", **KW, checkpoint_dir=tmp_path, checkpoint_every=2,
                         callback=_stop_at(5)).fit(digits_fed)
    resumed = FederatedTrainer(selector="random", **KW, checkpoint_dir=tmp_path,
                               checkpoint_trusted=True).fit(digits_fed)
    assert resumed.resumed_from_ == 4
    assert resumed.history_ == FederatedTrainer(selector="random", **KW).fit(digits_fed).history_
    assert "checkpoint_trusted" not in resumed.history_.config["trainer"]
