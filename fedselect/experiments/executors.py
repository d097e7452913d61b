"""How a comparison's cells run: one after another, seeds batched, worker processes or Ray tasks.

Every executor has one small interface, :class:`Executor`: ``run(cells, finish, status)`` trains
the :class:`~fedselect.experiments.plan.Cell` list and calls ``finish(i, outcome)`` in this
process the moment cell ``i`` ends, with its :class:`Outcome`; ``describe()`` says how the runs
are spread. Each run, wherever it happens, is :meth:`CellRunner.run` (or
:meth:`CellRunner.run_batch` for seeds trained in lockstep), so a parallel grid runs exactly
the code of a serial one. The process pool and Ray machinery is this module's private part,
:mod:`fedselect._grid`; result files are written by the caller from the outcomes, never here.

* :class:`SerialExecutor`: one run after another in this process, one federation held at a
  time (the reference every other executor equals).
* :class:`BatchedExecutor`: the seeds of one scheme in lockstep
  (:func:`fedselect.simulation.batched.fit_runs`), chunk by chunk.
* :class:`ParallelExecutor`: worker processes (``jobs > 1``) or Ray tasks, each cell (or batch
  of seeds) a task.
"""

from __future__ import annotations

import numbers
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .. import _grid
from ..simulation.checkpoint import CheckpointMismatchError
from . import provenance
from .plan import remove_tree

if TYPE_CHECKING:
    from ..round.record import History
    from .plan import Cell, FederationSource

__all__ = [
    "BatchedExecutor",
    "CellRunner",
    "Executor",
    "Outcome",
    "ParallelExecutor",
    "SerialExecutor",
    "batches",
    "make_executor",
    "resolve_batch_seeds",
    "share_pools",
]


@dataclass
class Outcome:
    """What one (scheme, seed) run produced, as the process that writes its result file needs it."""

    history: History | None  # None when the run failed before its first round
    error: dict[str, Any] | None  # None for a finished run
    seconds: float
    machine: dict[str, Any]
    diagnostics: dict[str, Any]
    n_clients: int


Finish = Callable[[int, Outcome], None]


def _diagnostics(selector: Any) -> dict[str, Any]:
    """Learned state worth keeping for figures, as lists (e.g. FedCor's client embeddings for a t-SNE).

    A selector lists the attribute names in a class attribute ``diagnostics``; arrays over
    10 million entries are skipped.
    """
    out: dict[str, Any] = {}
    for name in getattr(selector, "diagnostics", ()):
        value = getattr(selector, name, None)
        if value is None:
            continue
        arr = np.asarray(value)
        if arr.dtype.kind in "fiub" and arr.size <= 10_000_000:
            out[name] = arr.tolist()
    return out


def _error(trainer: Any, exc: BaseException) -> dict[str, Any]:
    """A failed run's record: the error, the round it failed in, the rounds it completed, its traceback."""
    partial = getattr(trainer, "history_", None)
    completed = len(partial) if partial is not None else 0
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "round": int(getattr(exc, "round", completed)),
        "rounds_completed": completed,
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=8)),
    }


class CellRunner:
    """What every run of a comparison shares, and :meth:`run`, one (scheme, seed) run.

    The serial executors call :meth:`run` in the comparison's process; with worker processes or
    Ray the object is pickled once to each worker, which calls :meth:`run_cells` there. Result
    files are written by the comparison's process only, from the returned outcome.

    Parameters
    ----------
    source : FederationSource
    built : mapping
        Label -> an unfitted selector (each run trains its own clone).
    trainer_kw : mapping
        The trainer's keyword arguments, without ``selector`` and the checkpoint options.
    checkpoint_every : int
        0: no checkpoints.
    overwrite : bool
        A checkpoint of other settings is deleted and its run redone (else it is an error).
    """

    def __init__(
        self,
        source: FederationSource,
        built: Mapping[str, Any],
        trainer_kw: Mapping[str, Any],
        *,
        checkpoint_every: int,
        overwrite: bool,
    ) -> None:
        self.source = source
        self.built = dict(built)
        self.trainer_kw = dict(trainer_kw)
        self.checkpoint_every = int(checkpoint_every)
        self.overwrite = bool(overwrite)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_fed", "_feds")}  # a worker's federations

    def _trainer(self, label: str, seed: int, ckpt: Path | None, progress: bool) -> Any:
        from sklearn.base import clone

        from ..optim import as_optimizer
        from ..simulation.trainer import FederatedTrainer

        use_ckpt = ckpt is not None and bool(self.checkpoint_every)
        return FederatedTrainer(
            selector=clone(self.built[label]),
            random_state=int(seed),
            progress=progress,
            **as_optimizer(self.trainer_kw),
            **({"checkpoint_dir": ckpt, "checkpoint_every": self.checkpoint_every} if use_ckpt else {}),
        )

    def run(self, label: str, seed: int, ckpt: Path | None, *, fed: Any, progress: bool = False) -> Outcome:
        """Train scheme ``label`` with ``seed`` on ``fed``; a run that raises is a failed outcome.

        Errors of the environment (``OSError``, ``MemoryError``, a checkpoint of other settings
        without ``overwrite``) propagate: they are not the run's result.
        """
        start = time.perf_counter()
        tr = self._trainer(label, seed, ckpt, progress)
        error: dict[str, Any] | None = None
        try:
            try:
                tr.fit(fed)
            except CheckpointMismatchError:
                if not self.overwrite:
                    raise
                remove_tree(ckpt)
                tr.fit(fed)
        except (CheckpointMismatchError, OSError, MemoryError):
            raise  # the environment, not the run: a rerun after fixing it must not find it "failed"
        except Exception as exc:  # a failed run is a result; the comparison goes on
            error = _error(tr, exc)
        return Outcome(
            history=getattr(tr, "history_", None),
            error=error,
            seconds=time.perf_counter() - start,
            machine=provenance.machine_info(),
            diagnostics=_diagnostics(tr.selector_) if error is None else {},
            n_clients=int(fed.n_clients),
        )

    def run_batch(
        self,
        label: str,
        seeds: Sequence[int],
        ckpts: Sequence[Path | None],
        *,
        feds: Sequence[Any],
        finish: Finish,
        log: Callable[[str], None] | None = None,
    ) -> None:
        """Train scheme ``label`` with all of ``seeds`` in lockstep (:func:`fedselect.simulation.batched.fit_runs`).

        Calls ``finish(j, outcome)`` the moment run j ends, with the outcome :meth:`run` would
        give (``seconds`` is the run's wall time from the start of the batch; ``machine`` has
        ``batch_seeds``, the number of runs batched). Errors of the environment propagate as in
        :meth:`run`; a checkpoint of other settings with ``overwrite`` is deleted and its run
        redone on its own.
        """
        from ..simulation.batched import fit_runs

        trainers = [self._trainer(label, seed, ckpt, False) for seed, ckpt in zip(seeds, ckpts)]
        machine = {**provenance.machine_info(), "batch_seeds": len(seeds)}
        start = time.perf_counter()

        def done(j: int, exc: BaseException | None) -> None:
            tr, fed = trainers[j], feds[j]
            if isinstance(exc, CheckpointMismatchError) and self.overwrite:
                remove_tree(ckpts[j])
                finish(j, self.run(label, int(seeds[j]), ckpts[j], fed=fed))
                return
            if isinstance(exc, (CheckpointMismatchError, OSError, MemoryError)):
                raise exc  # the environment, not the run (as in run)
            error = None if exc is None else _error(tr, exc)
            finish(
                j,
                Outcome(
                    history=getattr(tr, "history_", None),
                    error=error,
                    seconds=time.perf_counter() - start,
                    machine=machine,
                    diagnostics=_diagnostics(tr.selector_) if error is None else {},
                    n_clients=int(fed.n_clients),
                ),
            )

        fit_runs(trainers, feds, on_finish=done, log=log)

    def run_cells(
        self, cells: Sequence[tuple[str, int, Path | None]], log: Callable[[str], None] | None = None
    ) -> list[Outcome]:
        """A worker's task: the outcomes of ``(label, seed, checkpoint)`` cells of one label, one cell as
        :meth:`run`, several as one batch of seeds.

        Federations are kept between calls (one for single cells, which come seed by seed; a
        batch's for the next batch, usually another label of the same seeds), as the serial
        executors keep theirs.
        """
        if len(cells) == 1:
            label, seed, ckpt = cells[0]
            fed_seed, fed = self.__dict__.get("_fed", (None, None))
            if fed_seed != seed:
                self._fed = (None, None)
                fed = self.source.build(seed)
                self._fed = (seed, fed)
            return [self.run(label, seed, ckpt, fed=fed, progress=False)]
        seeds = [seed for _label, seed, _ckpt in cells]
        cached = dict(self.__dict__.get("_feds", {}))
        self._feds: dict[int, Any] = {}
        feds = dict(zip(seeds, share_pools([cached[s] if s in cached else self.source.build(s) for s in seeds])))
        self._feds = feds
        outcomes: list[Any] = [None] * len(cells)

        def keep(j: int, outcome: Outcome) -> None:
            outcomes[j] = outcome

        self.run_batch(
            cells[0][0],
            seeds,
            [ckpt for _label, _seed, ckpt in cells],
            feds=[feds[s] for s in seeds],
            finish=keep,
            log=log,
        )
        return outcomes


def share_pools(feds: Sequence[Any]) -> list[Any]:
    """The federations with equal training pools and test sets sharing one array each (same content, less memory).

    A federation recipe built for several seeds (``make_federation(random_state=seed)``) loads
    the same data set each time into arrays of its own; batched seeds hold them all at once.
    """
    import dataclasses

    out: list[Any] = []
    for fed in feds:
        for other in out:
            if (
                other.X is not fed.X
                and other.X.shape == fed.X.shape
                and np.array_equal(other.X, fed.X)
                and np.array_equal(other.y, fed.y)
                and np.array_equal(other.X_test, fed.X_test)
                and np.array_equal(other.y_test, fed.y_test)
            ):
                fed = dataclasses.replace(fed, X=other.X, y=other.y, X_test=other.X_test, y_test=other.y_test)
                break
        out.append(fed)
    return out


def resolve_batch_seeds(batch_seeds: Any, n_seeds: int) -> int:
    """How many seeds of one scheme train together: 1 (off), or the batch size ``batch_seeds`` asks for.

    ``False``, ``None``, 0 and 1 are off; ``True`` batches every seed; an int N >= 2 batches up
    to N seeds at a time.
    """
    if batch_seeds is None or batch_seeds is False:
        return 1
    if batch_seeds is True:
        return max(1, int(n_seeds))
    if isinstance(batch_seeds, numbers.Integral) and batch_seeds >= 0:
        return max(1, min(int(batch_seeds), int(n_seeds)))
    raise ValueError(
        f"run_comparison: batch_seeds={batch_seeds!r} must be False (off), True (all seeds of a scheme "
        "at once) or an integer N >= 2 (up to N seeds at once); 0 and 1 are off"
    )


def batches(labels: Sequence[str], size: int) -> list[list[int]]:
    """Indices of ``labels`` (the cells' labels, ordered seed by seed) grouped into cells of one label, up to
    ``size`` seeds each.

    Each label's cells are cut into chunks of ``size`` in seed order; the groups go chunk by
    chunk (every label's first chunk, then every label's second, ...), so the labels of one
    chunk usually share its federations.
    """
    by_label: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        by_label.setdefault(label, []).append(i)
    chunks = {label: [idx[c : c + size] for c in range(0, len(idx), size)] for label, idx in by_label.items()}
    out: list[list[int]] = []
    for c in range(max((len(v) for v in chunks.values()), default=0)):
        out.extend(v[c] for v in chunks.values() if c < len(v))
    return out


# -- the executors ---------------------------------------------------------------------------------


class Executor(Protocol):
    """Runs a comparison's cells and hands each outcome back the moment it is known."""

    def describe(self) -> str:
        """How the runs are spread, for the progress bar ("" for one after another)."""
        ...

    def run(self, cells: Sequence[Cell], finish: Finish, status: Callable[[str], None] = ...) -> None:
        """Run ``cells``; call ``finish(i, outcome)`` in this process as cell ``i`` ends, ``status(text)`` as
        a run or batch starts (what the progress bar shows)."""
        ...


def _ignore(_text: str) -> None:
    pass


def _note_resume(cell: Cell, checkpoint_every: int, log: Callable[[str], None]) -> None:
    if cell.checkpoint is not None and checkpoint_every and (cell.checkpoint / "checkpoint.pkl").exists():
        log(f"{cell.label} seed {cell.seed}: continuing the interrupted run from its checkpoint")


class SerialExecutor:
    """One run after another in this process, one federation held at a time.

    Parameters
    ----------
    runner : CellRunner
    federations : mapping
        Seed -> a federation already built (planning's last), used instead of building it again.
    progress : bool
        Each run draws its own progress bar.
    log : callable
    """

    def __init__(
        self, runner: CellRunner, *, federations: Mapping[int, Any], progress: bool, log: Callable[[str], None]
    ) -> None:
        self.runner, self.feds, self.progress, self.log = runner, dict(federations), bool(progress), log

    def describe(self) -> str:
        return ""

    def run(self, cells: Sequence[Cell], finish: Finish, status: Callable[[str], None] = _ignore) -> None:
        feds, self.feds = self.feds, {}
        for i, cell in enumerate(cells):
            if cell.seed not in feds:
                feds = {cell.seed: self.runner.source.build(cell.seed)}
            status(f"{cell.label} seed {cell.seed}")
            _note_resume(cell, self.runner.checkpoint_every, self.log)
            finish(
                i, self.runner.run(cell.label, cell.seed, cell.checkpoint, fed=feds[cell.seed], progress=self.progress)
            )


class BatchedExecutor(SerialExecutor):
    """The seeds of one scheme in lockstep, up to ``size`` at a time, in this process.

    A seed left alone in its chunk runs as :class:`SerialExecutor` runs it. The federations of a
    chunk are held at once, those built from one recipe sharing their data arrays
    (:func:`share_pools`).
    """

    def __init__(
        self,
        runner: CellRunner,
        size: int,
        *,
        federations: Mapping[int, Any],
        progress: bool,
        log: Callable[[str], None],
    ) -> None:
        super().__init__(runner, federations=federations, progress=progress, log=log)
        self.size = int(size)

    def run(self, cells: Sequence[Cell], finish: Finish, status: Callable[[str], None] = _ignore) -> None:
        feds, self.feds = self.feds, {}
        source, every = self.runner.source, self.runner.checkpoint_every
        for group in batches([c.label for c in cells], self.size):
            seeds = [cells[i].seed for i in group]
            label = cells[group[0]].label
            if len(group) == 1:  # a seed left alone: the usual run
                cell = cells[group[0]]
                if cell.seed not in feds:
                    feds = {cell.seed: source.build(cell.seed)}
                status(f"{label} seed {cell.seed}")
                _note_resume(cell, every, self.log)
                finish(
                    group[0],
                    self.runner.run(label, cell.seed, cell.checkpoint, fed=feds[cell.seed], progress=self.progress),
                )
                continue
            if not set(seeds) <= set(feds):  # the next chunk of seeds: its federations, and only those
                kept = {sd: f for sd, f in feds.items() if sd in seeds}
                feds = {}
                feds = dict(zip(seeds, share_pools([kept[sd] if sd in kept else source.build(sd) for sd in seeds])))
            status(f"{label} seeds {', '.join(map(str, seeds))} (batched)")
            for i in group:
                _note_resume(cells[i], every, self.log)
            self.runner.run_batch(
                label,
                seeds,
                [cells[i].checkpoint for i in group],
                feds=[feds[sd] for sd in seeds],
                finish=lambda j, outcome, group=group: finish(group[j], outcome),
                log=self.log,
            )


class ParallelExecutor:
    """Worker processes or Ray tasks (:mod:`fedselect._grid`): each cell, or batch of seeds, is one task.

    Parameters
    ----------
    runner : object
        What :func:`fedselect._grid.prepare` returned: the serialised :class:`CellRunner` and
        the pool or cluster to send it to.
    size : int
        Seeds batched per task (1: one cell per task).
    checkpoint_every : int
    log : callable
    """

    def __init__(self, runner: Any, size: int, *, checkpoint_every: int, log: Callable[[str], None]) -> None:
        self.runner, self.size, self.checkpoint_every, self.log = runner, int(size), int(checkpoint_every), log

    def describe(self) -> str:
        return self.runner.describe()

    def run(self, cells: Sequence[Cell], finish: Finish, status: Callable[[str], None] = _ignore) -> None:
        for cell in cells:
            _note_resume(cell, self.checkpoint_every, self.log)
        groups = batches([c.label for c in cells], self.size) if self.size > 1 else None
        self.runner.run([(c.label, c.seed, c.checkpoint) for c in cells], finish, groups=groups)


def make_executor(
    runner: CellRunner,
    *,
    jobs: int,
    ray_address: str | None,
    batch: int,
    parallel: bool,
    federations: Mapping[int, Any],
    progress: bool,
    log: Callable[[str], None],
) -> Executor:
    """The executor for a comparison's options.

    Parameters
    ----------
    runner : CellRunner
    jobs : int
        Runs at once on this machine (see :func:`fedselect._grid.resolve_jobs`).
    ray_address : str or None
        Run on Ray instead (``batch`` must then be 1).
    batch : int
        Seeds of one scheme trained together (:func:`resolve_batch_seeds`).
    parallel : bool
        False: one process even with ``jobs > 1`` or Ray (nothing to run, so no pool is started).
    federations : mapping
        Seed -> a federation planning built, for the first run in this process.
    progress : bool
        Per-run progress bars (serial only; workers draw none).
    log : callable

    Raises
    ------
    TypeError
        With worker processes or Ray: a selector, federation, trainer option or plugin that
        cannot be sent to them, named before any training.
    """
    if parallel and (ray_address is not None or jobs > 1):
        # Everything a worker needs, serialised once, before any training: what cannot be sent is named now.
        prepared = _grid.prepare(runner, jobs=jobs, ray_address=ray_address)
        return ParallelExecutor(prepared, batch, checkpoint_every=runner.checkpoint_every, log=log)
    if batch > 1:
        return BatchedExecutor(runner, batch, federations=federations, progress=progress, log=log)
    return SerialExecutor(runner, federations=federations, progress=progress, log=log)
