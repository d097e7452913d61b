"""FederatedTrainer(path=...): the engine path as a user option, from the trainer to keys, checkpoints and the CLI.

Eager is the default and keeps every stored key; a compiled run is another run (its settings, key and checkpoint
fingerprint name the path). Every compiled fit here trains one chain (an MLP with dropout on digits), so the
process compiles it once (about 10 s on two cores); the parts that need torch.compile skip without it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from fedselect import FederatedTrainer, get_selector
from fedselect._validation import InvalidParameterError
from fedselect.cli import main
from fedselect.experiments import provenance
from fedselect.experiments.plan import run_settings
from fedselect.simulation import CheckpointMismatchError, batched
from fedselect.simulation._compiled import compile_unusable
from fedselect.simulation.engine import Engine
from fedselect.simulation.engine import compiled as compiled_module

needs_compile = pytest.mark.skipif(
    compile_unusable() is not None, reason=f"torch.compile (inductor) is unusable here: {compile_unusable()}"
)

# one chain for every compiled fit of this file (the compiled step is built once per chain and process)
KW = dict(model="mlp", model_params={"dropout": 0.5}, rounds=4, clients_per_round=3, local_steps=3, lr=0.2)
SMALL = "--n-clients 8 --clients-per-round 2 --rounds 2 --model mlp --model-params dropout=0.5 --local-steps 2"
SMALL_ARGS = [*SMALL.split(), "--no-progress"]


def _bits(trainer):
    return trainer.parameters_.tobytes(), [(r.test_loss, r.test_accuracy, r.clients) for r in trainer.history_.rounds]


# -- the option and its validation (no compiling) ---------------------------------------------------------------


@pytest.mark.parametrize("engine", ["Compiled", "inductor", "", None, 1], ids=repr)
def test_a_bad_engine_is_refused_before_anything_is_built(digits_fed, engine, monkeypatch):
    from fedselect.simulation import loop as trainer  # where the fit builds its engine

    def never(*args, **kwargs):
        raise AssertionError("the engine was built before its path was checked")

    monkeypatch.setattr(trainer, "build_engine", never)
    with pytest.raises(InvalidParameterError) as info:
        FederatedTrainer(**KW, path=engine).fit(digits_fed)
    assert f"FederatedTrainer: parameter path={engine!r} is invalid" in str(info.value)
    assert "'eager'" in str(info.value) and "'compiled'" in str(info.value)  # what it allows


def test_eager_is_the_default_and_keeps_every_key_compiled_is_keyed_apart(digits_fed, monkeypatch):
    fed = {"dataset": "digits", "n_clients": 8}

    def key(**extra):
        return provenance.run_key(run_settings(fed, {**KW, **extra}, "random", 0))

    assert FederatedTrainer().path == "eager"
    assert key(path="eager") == key()  # a comparison keyed without the parameter finds the explicit default
    settings = run_settings(fed, {**KW, "path": "compiled"}, "random", 0)
    assert settings["trainer"]["engine"] == "compiled" and "engine" not in run_settings(fed, KW, "random", 0)["trainer"]
    assert provenance.run_key(settings) != key()
    # a checkpoint's fingerprint: the same as one computed by a trainer without the parameter, unless compiled
    theta0 = torch.zeros(7)
    selector = get_selector("random")

    def fingerprint(trainer):
        return provenance.checkpoint_fingerprint(trainer, digits_fed, selector, theta0)

    eager, compiled = fingerprint(FederatedTrainer(**KW)), fingerprint(FederatedTrainer(**KW, path="compiled"))
    assert compiled["trainer.engine"] == "compiled"
    assert {k: v for k, v in compiled.items() if k != "trainer.engine"} == eager
    params = FederatedTrainer.get_params
    monkeypatch.setattr(
        FederatedTrainer,
        "get_params",
        lambda self, deep=True: {k: v for k, v in params(self, deep).items() if k not in ("path", "engine")},
    )
    assert fingerprint(FederatedTrainer(**KW)) == eager


def test_compiled_on_a_model_it_cannot_compile_fails_before_training_with_the_engines_message(digits_fed):
    def tanh_mlp(shape, n_out):  # not a Flatten/Linear/ReLU/Dropout chain
        return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(shape)), 16), nn.Tanh(), nn.Linear(16, n_out))

    rounds = []
    kw = {**KW, "model": tanh_mlp, "model_params": None}
    trainer = FederatedTrainer(**kw, path="compiled", callback=lambda t, r: rounds.append(r))
    with pytest.raises(ValueError, match=r"FederatedTrainer: path='compiled' compiles the local"):
        trainer.fit(digits_fed)
    assert rounds == []
    # the same model trains on the eager path
    assert len(FederatedTrainer(**kw).fit(digits_fed).history_) == KW["rounds"]


def test_compiled_where_torch_compile_fails_is_refused_before_training(digits_fed, monkeypatch):
    monkeypatch.setattr(compiled_module, "compile_unusable", lambda: "CalledProcessError: no C++ compiler")
    with pytest.raises(ValueError, match=r"FederatedTrainer: path='compiled' needs torch\.compile .*: CalledProcess"):
        FederatedTrainer(**KW, path="compiled").fit(digits_fed)


@pytest.mark.parametrize("model, loss", [("cnn", "cross-entropy"), ("resnet-gn", "cross-entropy"), ("mlp", "mse")])
def test_a_comparison_refuses_compiled_for_a_model_it_cannot_compile_before_any_run(model, loss, tmp_path, monkeypatch):
    from fedselect.experiments.plan import check_plan
    from fedselect.simulation import loop as trainer  # where the fit builds its engine

    def never(*args, **kwargs):
        raise AssertionError("an engine was built before the plan was refused")

    monkeypatch.setattr(trainer, "build_engine", never)
    kw = dict(model=model, loss=loss, path="compiled", rounds=1, clients_per_round=2)
    fed = {"dataset": "digits", "n_clients": 8}
    with pytest.raises(ValueError, match=r"path='compiled' is refused before any run trains: path='compiled' compi"):
        check_plan(["random"], trainer=kw, seeds=[0], federation=fed, out_dir=tmp_path)
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())
    check_plan(["random"], trainer={**kw, "path": "eager"}, seeds=[0], federation=fed)  # eager takes it


def test_a_comparison_takes_compiled_for_the_chains_and_checks_torch_compile_first(digits_fed, monkeypatch):
    from fedselect.experiments import plan
    from fedselect.simulation import _compiled

    kw = dict(model="mlp", path="compiled", rounds=1, clients_per_round=2)
    monkeypatch.setattr(_compiled, "compile_unusable", lambda: None)
    plan.check_plan(["random"], trainer=kw, seeds=[0], federation=digits_fed)  # a Federation object: its shape
    plan.check_plan(["random"], trainer={**kw, "model": "logistic"}, seeds=[0])
    monkeypatch.setattr(_compiled, "compile_unusable", lambda: "CalledProcessError: no C++ compiler")
    with pytest.raises(ValueError, match=r"refused before any run trains: CalledProcessError: no C\+\+ compiler"):
        plan.check_plan(["random"], trainer=kw, seeds=[0], federation=digits_fed)


def test_the_cli_compare_refuses_compiled_for_a_cnn_before_training(tmp_path, capsys):
    args = ["compare", "--selectors", "random", "--seeds", "0", "--model", "cnn", "--path", "compiled",
            "--n-clients", "8", "--clients-per-round", "2", "--rounds", "1", "--out", str(tmp_path / "out")]
    assert main(args) != 0
    err = capsys.readouterr().err
    assert "path='compiled' is refused before any run trains" in err and "FedCorCNN" in err, err
    assert not list((tmp_path / "out").glob("runs/*.json"))


def test_the_cli_offers_engine_and_refuses_other_values(capsys):
    help_text = " ".join(_help(["run", "--help"], capsys).split())
    assert "--path {eager,compiled}" in help_text and "FederatedTrainer's default eager" in help_text
    assert "--path {eager,compiled}" in " ".join(_help(["compare", "--help"], capsys).split())
    with pytest.raises(SystemExit):
        main(["run", "--path", "fast", *SMALL_ARGS])
    assert "argument --path: expected one of ('eager', 'compiled'); got 'fast'" in capsys.readouterr().err


def _help(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    return capsys.readouterr().out


# -- compiled runs ----------------------------------------------------------------------------------------------


@needs_compile
def test_a_compiled_run_trains_is_reproducible_and_records_its_path(digits_fed):
    a = FederatedTrainer(**KW, random_state=5, path="compiled").fit(digits_fed)
    b = FederatedTrainer(**KW, random_state=5, path="compiled").fit(digits_fed)
    eager = FederatedTrainer(**KW, random_state=5).fit(digits_fed)
    assert _bits(a) == _bits(b) and a.history_ == b.history_  # the same call, the same bits
    assert a.parameters_.tobytes() != eager.parameters_.tobytes()  # the option reached the engine: other rounding
    # it trains as eager does (other masks, the same distribution): 2.31 -> 2.17 here, eager 2.32 -> 2.20
    losses, eager_losses = ([r.test_loss for r in t.history_.rounds] for t in (a, eager))
    assert losses[-1] < losses[0] - 0.1 and abs(losses[-1] - eager_losses[-1]) < 0.1, (losses, eager_losses)
    assert a.history_.config["trainer"]["engine"] == "compiled"
    assert eager.history_.config["trainer"]["engine"] == "eager"


@needs_compile
@pytest.mark.parametrize(("first", "then"), [("eager", "compiled"), ("compiled", "eager")])
def test_a_checkpoint_resumes_only_on_the_path_that_wrote_it(digits_fed, tmp_path, first, then):
    class Stop(Exception):
        pass

    def stop(trainer, record):
        if record.round == 2:
            raise Stop

    kw = dict(KW, random_state=5, checkpoint_dir=tmp_path, checkpoint_every=1)
    with pytest.raises(Stop):
        FederatedTrainer(**kw, path=first, callback=stop).fit(digits_fed)
    with pytest.raises(CheckpointMismatchError) as info:
        FederatedTrainer(**kw, path=then).fit(digits_fed)
    saved = "<absent>" if first == "eager" else first  # eager is left out, as in checkpoints from before the option
    assert info.value.differences == {"trainer.engine": (saved, "<absent>" if then == "eager" else then)}
    resumed = FederatedTrainer(**kw, path=first).fit(digits_fed)  # its own path resumes it, bit for bit
    assert resumed.resumed_from_ == 2
    assert _bits(resumed) == _bits(FederatedTrainer(**KW, random_state=5, path=first).fit(digits_fed))


@needs_compile
def test_batched_seeds_batch_only_runs_of_one_path_and_compiled_ones_equal_their_runs_alone_exactly(
    digits_fed, monkeypatch
):
    """Compiled runs batched: the same bits as each alone (each run draws its masks from its own generator and
    the step's kernels give a client's rows the same numbers at any batch size; measured, and asserted exactly);
    eager runs batched equal theirs alone up to float rounding (tests/simulation/test_batched.py)."""
    seeds, paths = (0, 1), ("eager", "compiled")
    calls: list[list[str]] = []
    train_runs = Engine.train_runs

    def spy(self, thetas, *args, **kwargs):
        calls.append([self.path] * len(thetas))
        return train_runs(self, thetas, *args, **kwargs)

    together = [FederatedTrainer(**KW, random_state=s, path=p) for s in seeds for p in paths]
    monkeypatch.setattr(Engine, "train_runs", spy)
    notes: list[str] = []
    assert batched.fit_runs(together, [digits_fed] * len(together), log=notes.append) == [None] * len(together)
    monkeypatch.undo()
    assert notes == []
    # each round: one batched call per path, each holding that path's two runs
    assert sorted(map(tuple, calls)) == sorted([("eager", "eager"), ("compiled", "compiled")] * KW["rounds"])
    for t in together:
        alone = FederatedTrainer(**KW, random_state=t.random_state, path=t.path).fit(digits_fed)
        assert t.history_.config["trainer"]["engine"] == t.path
        if t.path == "compiled":
            assert _bits(t) == _bits(alone)
        else:
            assert [r.clients for r in t.history_.rounds] == [r.clients for r in alone.history_.rounds]
            np.testing.assert_allclose(t.parameters_, alone.parameters_, rtol=1e-4, atol=1e-5)


@needs_compile
def test_the_cli_runs_and_compares_on_the_compiled_path(tmp_path, capsys):
    out = tmp_path / "h.json"
    assert main(["run", "--path", "compiled", "--out", str(out), *SMALL_ARGS]) == 0
    assert json.loads(out.read_text())["config"]["trainer"]["engine"] == "compiled"
    args = ["compare", "--selectors", "random", "--seeds", "0", "1", "--batch-seeds", *SMALL_ARGS]
    assert main([*args, "--out", str(tmp_path / "c"), "--path", "compiled"]) == 0
    saved = [json.loads(p.read_text()) for p in sorted((tmp_path / "c" / "runs").glob("*.json"))]
    assert [s["settings"]["trainer"]["engine"] for s in saved] == ["compiled", "compiled"]
    capsys.readouterr()
    # eager given or not is one run: a comparison made without --engine is found with --engine eager
    assert main([*args, "--out", str(tmp_path / "e")]) == 0
    capsys.readouterr()
    assert main([*args, "--out", str(tmp_path / "e"), "--path", "eager"]) == 0
    assert "2 finished run(s) loaded, 0 to run" in capsys.readouterr().err
    # and the compiled runs are other runs: not silently taken for eager ones
    assert main([*args, "--out", str(tmp_path / "c")]) != 0
    assert "trainer.engine: saved 'compiled', now '(unset)'" in capsys.readouterr().err


def test_the_former_name_engine_warns_and_is_the_same_run(digits_fed):
    """``engine=`` named the Engine's ``path`` in the trainer; it keeps working, with a warning, as one run."""
    with pytest.warns(DeprecationWarning, match=r"FederatedTrainer: engine= is deprecated .* use path='eager'"):
        old = FederatedTrainer(**KW, random_state=1, engine="eager").fit(digits_fed)
    new = FederatedTrainer(**KW, random_state=1, path="eager").fit(digits_fed)
    assert old.history_ == new.history_ and old.parameters_.tobytes() == new.parameters_.tobytes()
    assert provenance.trainer_identity(old) == provenance.trainer_identity(new)
    fed = {"dataset": "digits", "n_clients": 8}
    keys = [provenance.run_key(run_settings(fed, {**KW, w: "compiled"}, "random", 0)) for w in ("engine", "path")]
    assert keys[0] == keys[1]
    with pytest.raises(ValueError, match=r"path='compiled' and its deprecated name engine='eager' are both set"):
        FederatedTrainer(**KW, path="compiled", engine="eager").fit(digits_fed)
