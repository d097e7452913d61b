"""Resuming a run of :class:`~fedselect.simulation.trainer.FederatedTrainer`: what its checkpoint holds.

:class:`Checkpointer` is one fit's checkpoint in ``checkpoint_dir``: the run's identity (a fingerprint compared
before anything is unpickled), reading a checkpoint back into the run's state, and writing it every k rounds and
at the end. The file format (what :mod:`.checkpoint` writes, a format without code) is unchanged by where this
code lives: format 2, the keys below.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..round.record import History, RoundRecord
from ..selection import BaseSelector
from .checkpoint import (
    CheckpointMismatchError,
    JSONValue,
    Pickled,
    UnsafeStateError,
    check_state,
    describe_differences,
    move_aside,
    open_checkpoint,
    restore_selector_state,
    selector_state,
    write_checkpoint,
)
from .setup import RunSetup

__all__ = ["CHECKPOINT_FILE", "Checkpointer", "Resumed"]

# The name format 1 (a pickle) used, kept so that such a file is found and refused rather than ignored.
CHECKPOINT_FILE = "checkpoint.pkl"
_CHECKPOINT_FORMAT = 2


@dataclass
class Resumed:
    """A checkpoint's run state, decoded and checked against this run."""

    theta: torch.Tensor
    buffers: dict[str, torch.Tensor] | None
    selector: BaseSelector
    rounds: list[RoundRecord]
    next_round: int
    finished: bool
    rng: tuple[Any, Any, Any]

    def restore_rng(self) -> None:
        """Put the global random generators (torch, numpy, Python) back as they were when it was written."""
        torch.set_rng_state(self.rng[0])
        np.random.set_state(self.rng[1])  # noqa: NPY002
        random.setstate(self.rng[2])


class Checkpointer:
    """One fit's checkpoint: its identity, reading it back, writing it.

    Parameters
    ----------
    setup : RunSetup
        The run's checked settings (the trainer's ``checkpoint_dir``, ``checkpoint_every``,
        ``checkpoint_trusted``; the clock's devices).
    fed : Federation
    selector : BaseSelector
        The run's fitted selector (its class and parameters are part of the run's identity).
    theta0 : torch.Tensor
        The initial flat parameters.

    Notes
    -----
    The fingerprint is computed once (:func:`fedselect.identity.checkpoint_fingerprint`, plus the
    devices of an observed clock); the rounds already converted to JSON are kept between writes, so a write costs
    O(new rounds) Python work plus serialising the selector and the model and one fsync.
    """

    def __init__(self, setup: RunSetup, fed: Any, selector: BaseSelector, theta0: torch.Tensor) -> None:
        from ..identity import checkpoint_fingerprint

        tr = setup.trainer
        self.path = Path(tr.checkpoint_dir) / CHECKPOINT_FILE
        self.every = int(tr.checkpoint_every)
        self.trusted = bool(tr.checkpoint_trusted)
        fingerprint = checkpoint_fingerprint(tr, fed, selector, theta0)
        if setup.profiles is not None and setup.clock_observed:  # the devices fix which clients fail and when
            fingerprint["clock.profiles"] = setup.profiles.fingerprint()
        self.fingerprint = fingerprint
        self._rounds: list[dict[str, Any]] = []  # the history's rounds as JSON, kept between writes

    def check_checkpointable(self, selector: BaseSelector) -> None:
        """Refuse, before training, a selector whose fitted state the safe format cannot hold."""
        if self.trusted:
            return
        try:
            check_state({"selector": Pickled(selector_state(selector), classes=(type(selector),))})
        except UnsafeStateError as exc:
            raise UnsafeStateError(_unsafe_message(selector, exc)) from exc

    def read(
        self, selector: BaseSelector, theta: torch.Tensor, buffers: dict[str, torch.Tensor] | None
    ) -> Resumed | None:
        """The checkpoint's run state, decoded and checked against this run; None to start afresh.

        The fingerprint is compared before any object is unpickled; the selector's state is
        unpickled by the allow-listed unpickler (full pickle only for state written with
        ``checkpoint_trusted=True`` and read with it) and applied to a copy of ``selector``;
        ``theta`` and ``buffers`` are the run's initial ones, which the checkpoint's must match in shape.
        A file of another format, or whose state does not fit, is moved aside.

        Raises
        ------
        CheckpointMismatchError
            When the checkpoint is of another configuration.
        """
        path = self.path
        ckpt = open_checkpoint(path)  # LegacyCheckpointError for format 1, propagated
        if ckpt is None:
            return None
        plain = ckpt.plain
        if plain.get("format") != _CHECKPOINT_FORMAT or not isinstance(plain.get("fingerprint"), dict):
            move_aside(path, f"checkpoint format {plain.get('format')!r}, expected {_CHECKPOINT_FORMAT}")
            return None
        diff = describe_differences(plain["fingerprint"], self.fingerprint)
        if diff:
            shown = "; ".join(f"{k}: checkpoint {a!r}, now {b!r}" for k, (a, b) in list(diff.items())[:8])
            more = f" (and {len(diff) - 8} more)" if len(diff) > 8 else ""
            raise CheckpointMismatchError(
                f"FederatedTrainer: the checkpoint {path} was written by a run with other settings: {shown}{more}. "
                "Use another checkpoint_dir, or delete this one to start the run over",
                path=path,
                differences=diff,
            )
        state = ckpt.load(classes=(type(selector),), trusted=self.trusted)
        if state is None:
            return None
        try:
            out = Resumed(
                theta=_checked_tensor(state["theta"], theta, "theta"),
                buffers=None
                if state["buffers"] is None
                else {k: _checked_tensor(state["buffers"][k], v, f"buffer {k}") for k, v in (buffers or {}).items()},
                selector=restore_selector_state(selector, state["selector"]),
                rounds=[RoundRecord.from_dict(r) for r in state["rounds"]],
                next_round=_checked_int(state["next_round"], "next_round"),
                finished=_checked_bool(state["finished"], "finished"),
                rng=_rng_from_checkpoint(state["rng"]),
            )
            if (out.buffers is None) != (buffers is None) or (
                out.buffers is not None and set(state["buffers"]) != set(out.buffers)
            ):
                raise ValueError("its buffers are not the model's")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            move_aside(path, f"its state does not fit this run: {type(exc).__name__}: {exc}")
            return None
        return out

    def due(self, t: int, rounds: int) -> bool:
        """Whether a checkpoint is written after round ``t`` of ``rounds`` (every k-th; the end writes its own)."""
        return (t + 1) % self.every == 0 and t + 1 < rounds

    def write(
        self,
        theta: torch.Tensor,
        buffers: dict[str, torch.Tensor] | None,
        selector: BaseSelector,
        history: History,
        next_round: int,
        finished: bool,
    ) -> None:
        """Write the run's state atomically (the model, the selector, the history, every global generator).

        Raises
        ------
        UnsafeStateError
            When the selector's state holds objects the safe format cannot (the last checkpoint is kept).
        """
        try:
            write_checkpoint(
                self.path,
                {
                    "format": _CHECKPOINT_FORMAT,
                    "fingerprint": self.fingerprint,
                    "next_round": int(next_round),
                    "finished": bool(finished),
                    "theta": theta.numpy(),
                    "buffers": None if buffers is None else {k: v.numpy() for k, v in buffers.items()},
                    "selector_class": f"{type(selector).__module__}.{type(selector).__qualname__}",
                    "selector": Pickled(selector_state(selector), classes=(type(selector),), trusted=self.trusted),
                    "rounds": JSONValue(self._rounds_as_json(history)),
                    "rng": _get_rng_state(),
                    "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                },
            )
        except UnsafeStateError as exc:
            raise UnsafeStateError(_unsafe_message(selector, exc, self.path)) from exc

    def _rounds_as_json(self, history: History) -> list[dict[str, Any]]:
        """The history's rounds as plain dicts, converting only those added since the last write (a
        round's record is final once appended)."""
        done = self._rounds
        n = len(done)
        if n > len(history.rounds) or (n and done[-1]["round"] != history.rounds[n - 1].round):
            done.clear()
        done.extend(_json_ready(r.to_dict()) for r in history.rounds[len(done) :])
        return done


def _get_rng_state() -> dict[str, Any]:
    """The global random generators, as JSON values and arrays. The run itself draws from keyed
    streams (minibatches from (seed, round, client), dropout reseeded per round) and from the
    selector's own generators, which are saved with its state; the global ones are saved too so
    that a selector or model that draws from them still resumes identically."""
    name, key, pos, has_gauss, gauss = np.random.get_state()  # noqa: NPY002 (the legacy global generator)
    version, internal, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state().numpy(),
        "numpy": {
            "bit_generator": str(name),
            "key": np.asarray(key, dtype=np.uint32),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(gauss),
        },
        "python": {
            "version": int(version),
            "internal": np.asarray(internal, dtype=np.int64),
            "gauss_next": None if gauss_next is None else float(gauss_next),
        },
    }


def _rng_from_checkpoint(state: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """:func:`_get_rng_state`'s values read back and checked (ValueError, TypeError, KeyError if malformed)."""
    t, n, p = state["torch"], state["numpy"], state["python"]
    if not (isinstance(t, np.ndarray) and t.dtype == np.uint8 and t.ndim == 1):
        raise TypeError("the torch generator state is not a uint8 vector")
    key = n["key"]
    if not (
        isinstance(key, np.ndarray)
        and key.dtype == np.uint32
        and key.shape == (624,)
        and n["bit_generator"] == "MT19937"
        and 0 <= _checked_int(n["pos"], "pos") <= 624
        and n["has_gauss"] in (0, 1)
        and isinstance(n["cached_gaussian"], float)
    ):
        raise ValueError("the numpy generator state is malformed")
    internal = p["internal"]
    if not (
        isinstance(internal, np.ndarray)
        and internal.dtype == np.int64
        and internal.shape == (625,)
        and bool(np.all((internal >= 0) & (internal < 2**32)))
        and p["version"] == 3
        and (p["gauss_next"] is None or isinstance(p["gauss_next"], float))
    ):
        raise ValueError("the Python generator state is malformed")
    return (
        torch.from_numpy(t.copy()),
        ("MT19937", key, int(n["pos"]), int(n["has_gauss"]), float(n["cached_gaussian"])),
        (3, tuple(int(x) for x in internal), p["gauss_next"]),
    )


def _checked_tensor(value: Any, like: torch.Tensor, what: str) -> torch.Tensor:
    if not (isinstance(value, np.ndarray) and value.dtype == like.numpy().dtype and value.shape == tuple(like.shape)):
        raise ValueError(f"its {what} is not a {like.numpy().dtype} array of shape {tuple(like.shape)}")
    return torch.from_numpy(np.ascontiguousarray(value))


def _checked_int(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"its {what} is not a non-negative int")
    return value


def _checked_bool(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise ValueError(f"its {what} is not a bool")
    return value


def _json_ready(value: Any) -> Any:
    """A round's dict with numpy scalars as Python numbers (JSON, not pickled objects)."""
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    return value.item() if isinstance(value, np.generic) else value


def _unsafe_message(selector: BaseSelector, exc: Exception, path: Path | None = None) -> str:
    kept = f"; the last checkpoint in {path.parent} is kept" if path is not None and path.exists() else ""
    return (
        f"FederatedTrainer: the state of selector {type(selector).__name__} cannot be checkpointed without "
        f"pickle: {exc}{kept}. A checkpoint holds plain values, numpy arrays and torch tensors, numpy and torch "
        "random generators, torch modules, scipy CSR/CSC/COO matrices and objects of classes defined in the "
        "selector's own module. Keep other objects out of its fitted attributes, or pass "
        "checkpoint_trusted=True to write and read them with pickle, which runs code from the file: only for a "
        "checkpoint_dir no one else can write to (fedselect run/compare: --checkpoint-every 0 runs without "
        "checkpoints)"
    )
