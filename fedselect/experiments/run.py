"""Run a comparison: plan its cells, run them with an executor, write each result as it comes.

Every (scheme, seed) result is written to ``<out>/runs/<label>__seed<k>.json`` the moment it
finishes, together with the command and the commit that produced it and a key of its
settings. A rerun loads finished cells whose key matches and runs only the missing ones, so
a long comparison survives interruption. A cell whose settings changed is an error (use a
new output directory or ``overwrite=True``), never a silent mix.

Inside a run, the trainer checkpoints to ``<out>/checkpoints/<label>__seed<k>/`` every
``checkpoint_every`` rounds, so a killed comparison also resumes the run it was in the middle
of; the checkpoint is deleted once the run's result file is written.

A run that raises (a :class:`~fedselect.simulation.DivergenceError` or any other exception
of the run itself) is written as a result file with ``"status": "failed"``, the error and
the round it failed in, and the comparison goes on; the table shows it as failed, and a
rerun keeps that result unless ``retry_failed=True``. Errors of the environment (``OSError``
such as a full disk, ``MemoryError``) stop the comparison instead: they are not the run's
result, and the rerun after fixing them resumes from the last checkpoint. A result or
checkpoint file that cannot be read is moved aside
as ``<name>.corrupt-<timestamp>`` with a :class:`~fedselect.simulation.CorruptFileWarning`
naming it, and its run is redone.

With ``jobs > 1`` (worker processes) or ``ray_address`` (Ray tasks) the runs train side by
side (see :mod:`fedselect.experiments.executors`); planning, keys and result files stay in
this process, so a parallel comparison writes, resumes and fails exactly as a serial one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import _grid
from .._console import bars_wanted
from . import plan as planning
from . import provenance
from .executors import CellRunner, Outcome, make_executor, resolve_batch_seeds
from .plan import FederationSource, SelectorsArg, check_plan, equalize_overcommit, plan_cells, selector_table
from .result_files import failure_of, result_payload, write_result
from .results import Comparison

__all__ = ["run_comparison"]


def run_comparison(
    selectors: SelectorsArg,
    *,
    federation: Any,
    trainer: Mapping[str, Any],
    seeds: Sequence[int] = (0, 1, 2),
    target: float = 0.8,
    out_dir: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    progress: bool = True,
    command: Sequence[str] | None = None,
    paper: Mapping[str, str] | None = None,
    title: str = "",
    log: Callable[[str], None] | None = None,
    retry_failed: bool = False,
    checkpoint_every: int | None = 10,
    jobs: int | str = 1,
    ray_address: str | None = None,
    batch_seeds: bool | int = False,
    time_budget: float | None = None,
    overcommit: str = "equal",
) -> Comparison:
    """Run every scheme with every seed on the same federations and training streams.

    For each seed the federation is built once (``random_state=seed``) and every scheme
    trains with ``random_state=seed``, so schemes differ only in whom they choose.

    Parameters
    ----------
    selectors : mapping or sequence
        Row label -> selector, or a list of selectors labelled by default (see
        :func:`selector_table`). A selector is a registered name, a ``(name, params)`` pair,
        a :class:`~fedselect.BaseSelector` instance or subclass, or a ``(class, params)``
        pair. Every run trains its own clone, so runs never share a selector's state.
        A run's saved settings record a name as given (so comparisons saved before keep
        their keys) and a class or instance as ``module:qualname`` with its
        ``get_params()``: a rerun resumes it, and a changed parameter is a settings
        mismatch.
    federation : mapping, Federation or callable
        Keyword arguments of :func:`fedselect.data.make_federation` (with ``dataset``),
        built for each seed with ``random_state=seed``; or a
        :class:`fedselect.data.Federation`, used for every seed (the seed then seeds
        training and selection only); or a factory ``f(seed) -> Federation``, which must
        build the same federation for the same seed. The saved settings identify an object
        by a fingerprint of its content (SHA-256 of its arrays and client index lists)
        and a factory by ``module:qualname`` and the fingerprint of what it built for the
        seed: a factory is therefore called for every seed before any training (to key the
        runs and check what it returns), and again when that seed's runs start (one
        federation is held in memory at a time). Anything else is a TypeError before any
        training.
    trainer : mapping
        Keyword arguments of :class:`fedselect.FederatedTrainer` (no ``selector``).
    seeds : sequence of int
    target : float
        Accuracy for the rounds-to-target table.
    out_dir : path, optional
        Where each finished run is written at once (``<out_dir>/runs/``, read back on a rerun).
        The table and pictures are not written here: call :meth:`Comparison.write` and
        :meth:`Comparison.plot` on the result (the command line does both).
    overwrite : bool
        Re-run cells whose saved settings differ (and discard their checkpoints) instead of raising.
    progress : bool
        Progress bars (overall and per run) on a terminal or in a notebook; elsewhere (stderr
        redirected to a file) one line per finished run through ``log`` instead.
    command : sequence of str, optional
        Recorded with each run (defaults to ``sys.argv``).
    paper : mapping, optional
        Label -> the paper's figure for side-by-side tables.
    title : str
    log : callable, optional
        Receives one-line notes (resuming, failed runs, files moved aside); default: stderr.
    retry_failed : bool
        Run again the cells whose saved result is a failure (from scratch). By default a
        failed run stays failed on a rerun, so a comparison with a diverging scheme finishes.
    checkpoint_every : int or None, default 10
        With ``out_dir``, each run checkpoints to ``<out>/checkpoints/<label>__seed<k>/`` every
        this many rounds (see :class:`~fedselect.FederatedTrainer`'s ``checkpoint_dir``), so a
        killed comparison redoes at most that many rounds of the run in progress; the
        checkpoint is deleted once the run's result file is written. None or 0: no checkpoints.
    jobs : int or "auto", default 1
        How many (scheme, seed) runs train at once on this machine. 1: one after another in
        this process, as always. ``N > 1``: a pool of N worker processes (started by the
        ``forkserver`` method, ``spawn`` where there is none; never ``fork``, which is unsafe
        once torch has started its threads), one run per task. 0 or ``"auto"``: one run per
        ``n_threads`` cores, ``cores // n_threads`` with the cores this process may use
        (``os.sched_getaffinity``). Each worker runs torch with the trainer's ``n_threads``
        when set, else ``cores // jobs`` threads; when ``jobs x threads`` exceeds the cores
        a :class:`RuntimeWarning` says so and the grid runs anyway (slower, same results).
        See Notes.
    ray_address : str, optional
        Run each (scheme, seed) as a task on a Ray cluster instead: ``"auto"`` (the cluster
        this machine belongs to), ``"ray://host:port"``, or ``"local"`` (start Ray on this
        machine); if this process is already connected to Ray (``ray.init`` was called) that
        connection is used and left open. Each task asks for ``n_threads`` CPUs (default 1).
        Needs Ray (``pip install "fedselect[ray]"``); an ImportError names it otherwise.
        Not together with ``jobs`` other than 1.
    batch_seeds : bool or int, default False
        Train the runs of one scheme that differ only in their seed as one computation
        (:func:`fedselect.simulation.batched.fit_runs`): ``True`` all its seeds at once, an
        int N >= 2 up to N seeds at once, ``False`` (or 0, 1) one run at a time. See Notes.
    time_budget : float, optional
        Seconds of simulated time every scheme's runs may use (the trainer's ``time_budget``,
        set for every scheme alike; also accepted in ``trainer``, not both). It is then the
        horizon of the comparison's time verdicts (:meth:`Comparison.horizon`).
    overcommit : {"equal", "as-set"}, default "equal"
        Over-commitment is the round's: ``"equal"`` gives every scheme the same one, moving a
        scheme's own (Oort's ``overcommit``) to the round for all (``fedselect.experiments.plan.equalize_overcommit``;
        logged); ``"as-set"`` compares the schemes as given.

    Returns
    -------
    Comparison
        Failed runs are in its ``failed`` attribute, not in ``histories``.

    Notes
    -----
    What travels to the workers of a parallel grid, when its results equal a serial run's bit
    for bit, and what batched seeds batch: :ref:`user_guide_grid_details`.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr))
    out = Path(out_dir) if out_dir is not None else None
    if time_budget is not None:
        if trainer.get("time_budget") is not None and trainer["time_budget"] != time_budget:
            raise ValueError(
                f"run_comparison: time_budget={time_budget!r} and trainer['time_budget']={trainer['time_budget']!r} "
                "disagree; give it once"
            )
        trainer = {**trainer, "time_budget": time_budget}
    selectors, trainer, overcommit_note = equalize_overcommit(selectors, trainer, mode=overcommit)
    if overcommit_note:
        log(overcommit_note)
    # Everything checkable before hours of work: selectors and their parameters, the trainer's, seeds, labels, out.
    built = check_plan(selectors, trainer=trainer, seeds=seeds, out_dir=out, federation=federation)
    table = selector_table(selectors)
    source = FederationSource(federation)
    trainer_kw = dict(trainer)
    for managed in ("selector", "checkpoint_dir", "checkpoint_every"):
        trainer_kw.pop(managed, None)
    if checkpoint_every is not None and (
        isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 0
    ):
        raise ValueError(f"run_comparison: checkpoint_every={checkpoint_every!r} must be None or an integer >= 0")
    n_jobs = _grid.resolve_jobs(jobs, trainer_kw.get("n_threads"), ray_address=ray_address)
    batch = resolve_batch_seeds(batch_seeds, len(seeds))
    if batch > 1 and ray_address is not None:
        log(f"batch_seeds={batch_seeds!r} is ignored with ray_address: each run is a Ray task of its own")
        batch = 1
    commit = provenance.commit()
    if command is None:
        command = [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv and sys.argv[0] else []
    command = list(command)
    plan = plan_cells(table, source, trainer_kw, seeds, out, overwrite=overwrite, retry_failed=retry_failed)
    histories, failed, todo = plan.histories, plan.failed, plan.cells
    done = sum(len(v) for v in histories.values()) + sum(len(v) for v in failed.values())
    if done:
        n_failed = sum(len(v) for v in failed.values())
        note = (
            f" ({n_failed} failed; rerun with retry_failed=True / --retry-failed to try them again)" if n_failed else ""
        )
        log(f"resuming: {done} finished run(s) loaded{note}, {len(todo)} to run")
    runner = CellRunner(source, built, trainer_kw, checkpoint_every=int(checkpoint_every or 0), overwrite=overwrite)
    bars = progress and bars_wanted()  # in a log file: one line per finished run instead of redrawn bars
    executor = make_executor(
        runner,
        jobs=n_jobs,
        ray_address=ray_address,
        batch=batch,
        parallel=bool(todo),
        federations=plan.take_federations(),
        progress=bars,
        log=log,
    )
    bar = None
    if bars and todo:
        from tqdm.auto import tqdm

        spread = executor.describe()
        bar = tqdm(total=len(todo), desc=f"runs ({spread})" if spread else "runs", unit="run")
    outcomes: dict[int, Outcome] = {}

    def finish(i: int, outcome: Outcome) -> None:
        """Record cell ``i``'s outcome the moment it is known: its result file, its log line, the bar."""
        cell = todo[i]
        outcomes[i] = outcome
        error = outcome.error
        if error is not None:
            log(f"{cell.label} seed {cell.seed} failed in round {error['round']}: {error['type']}: {error['message']}")
        if cell.path is not None:
            write_result(
                cell.path,
                result_payload(
                    key=cell.key,
                    settings=cell.settings,
                    label=cell.label,
                    selector=cell.selector,
                    seed=cell.seed,
                    command=command,
                    commit=commit,
                    outcome=outcome,
                ),
            )
            planning.remove_tree(cell.checkpoint)
        if bar is not None:
            bar.update(1)
        elif progress and error is None:
            h = outcome.history
            acc = h.final_accuracy()
            log(
                f"[{len(outcomes)}/{len(todo)}] {cell.label} seed {cell.seed}: {len(h)} rounds in "
                f"{outcome.seconds:.1f} s, final accuracy "
                f"{'-' if acc is None else f'{acc:.3f}'}, rounds to {target:.0%}: "
                f"{h.rounds_to_accuracy(target) or 'not reached'}"
            )

    try:
        executor.run(todo, finish, status=bar.set_description if bar is not None else lambda _text: None)
    finally:
        if bar is not None:
            bar.close()
    n_clients = 0
    for i, cell in enumerate(todo):  # in the order a serial run finishes them
        outcome = outcomes[i]
        n_clients = outcome.n_clients
        if outcome.error is None:
            histories[cell.label][cell.seed] = outcome.history
        else:
            failed[cell.label][cell.seed] = failure_of({"error": outcome.error})
    if out is not None:
        try:
            (out / "checkpoints").rmdir()  # only when empty
        except OSError:
            pass
    if not n_clients:
        n_clients = int(source.n_clients() or 0) or max(
            (
                max(max(r.clients) for r in h.rounds) + 1
                for runs in histories.values()
                for h in runs.values()
                if h.rounds
            ),
            default=1,
        )
    return Comparison(
        histories, float(target), n_clients, out, dict(paper or {}), title, {k: v for k, v in failed.items() if v}
    )
