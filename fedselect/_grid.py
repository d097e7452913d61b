"""Running a comparison's (scheme, seed) cells at once: local worker processes, or Ray tasks.

The private part of :mod:`fedselect.experiments.executors`: :func:`fedselect.compare.run_comparison`
plans the grid (which cells are finished, their keys, result and checkpoint paths) and writes
every result file itself; this module only runs the cells elsewhere, each with
:meth:`~fedselect.experiments.executors.CellRunner.run_cells`, and hands each
:class:`~fedselect.experiments.executors.Outcome` back the moment it is known.

Choices, measured on a 2-core machine:

* Worker processes come from the ``forkserver`` start method where the platform has it (else
  ``spawn``): ``fork`` after torch has started its thread pools is unsafe, and a spawned worker
  imports torch and fedselect afresh (14 s for two workers on a loaded machine) where a fork
  of the preloaded server takes 0.1 s after the server's one-off 5 s.
* Everything the workers share (selectors, the federation or its recipe, trainer options) is
  pickled once in the parent, before any training: what cannot be pickled is named at once.
  Plugins loaded with :func:`fedselect.plugins.load_plugin` are loaded again in each worker
  before that, so their classes unpickle.
* Each worker sets torch's intra-op threads to the trainer's ``n_threads`` when given, else
  ``cores // jobs``, so ``jobs x threads`` stays within the cores this process may use.
* Workers ignore SIGINT: the parent alone handles Ctrl-C, cancels what has not started and
  terminates the workers; a worker whose parent died exits within a second.
"""

from __future__ import annotations

import hashlib
import importlib
import numbers
import os
import pickle
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["cores", "prepare", "resolve_jobs", "threads_per_run"]

Cell = tuple[str, int, "Path | None"]  # (label, seed, checkpoint directory)
Finish = Callable[[int, Any], None]

RAY_EXTRA = 'pip install "fedselect[ray]"'


def cores() -> int:
    """The CPU cores this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def resolve_jobs(jobs: Any, n_threads: Any, *, ray_address: Any = None) -> int:
    """The number of runs at once that ``jobs`` asks for: an int >= 1, or 0 / ``"auto"`` for ``cores // threads``.

    Raises
    ------
    ValueError
        ``jobs`` is not one of those, ``ray_address`` is not a non-empty string, or both a
        ``jobs`` other than 1 and ``ray_address`` are given (with Ray the cluster's CPUs set
        how many runs go at once).
    """
    if isinstance(jobs, str) and jobs.strip().lower() == "auto":
        jobs = 0
    if isinstance(jobs, bool) or not isinstance(jobs, numbers.Integral) or jobs < 0:
        raise ValueError(f"run_comparison: jobs={jobs!r} must be an integer >= 1 (runs at once), or 0 or 'auto' "
                         "for one run per core (per n_threads cores)")
    if ray_address is not None:
        if not isinstance(ray_address, str) or not ray_address.strip():
            raise ValueError(f"run_comparison: ray_address={ray_address!r} must be 'local', 'auto' or a cluster "
                             "address such as 'ray://head:10001'")
        if jobs != 1:
            raise ValueError(f"run_comparison: give jobs={jobs!r} or ray_address={ray_address!r}, not both; with "
                             "Ray the cluster's CPUs decide how many runs go at once")
        return 1
    if jobs == 0:
        return max(1, cores() // (int(n_threads) if n_threads else 1))
    return int(jobs)


def threads_per_run(jobs: int, n_threads: Any) -> int:
    """Torch threads of each parallel run: the trainer's ``n_threads`` if set, else ``max(1, cores // jobs)``."""
    return int(n_threads) if n_threads else max(1, cores() // max(1, int(jobs)))


# -- what the workers share ------------------------------------------------------------------------


def _plugin_sources() -> list[tuple[Any, ...]]:
    """How to load, in a worker, each plugin this process loaded by load_plugin / register_plugin."""
    from . import plugins

    out: list[tuple[Any, ...]] = []
    for label in plugins._user_plugins:
        obj = plugins.pm.get_plugin(label)
        if obj is None:
            continue
        if label.startswith("file "):
            out.append(("file", label[len("file "):], plugins._user_plugins[label].get("sha256", "")))
        elif isinstance(obj, ModuleType):
            out.append(("module", obj.__name__, label))
        else:
            out.append(("object", obj, label))
    return out


def _load_plugin_sources(sources: Sequence[tuple[Any, ...]]) -> None:
    from .plugins import load_plugin, register_plugin

    for kind, *rest in sources:
        if kind == "file":
            # The hash is checked on the bytes that are then run, before any of them runs: a file edited since the
            # comparison started is never imported (its runs would be mislabelled, its code unreviewed).
            load_plugin(rest[0], sha256=rest[1] or None)
        elif kind == "module":
            register_plugin(importlib.import_module(rest[0]), name=rest[1])
        else:
            register_plugin(rest[0], name=rest[1])


def _main_file_missing() -> str | None:
    """The ``__file__`` of a ``__main__`` that names no file (a script read from stdin), which workers cannot import."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or getattr(getattr(main, "__spec__", None), "name", None) is not None:
        return None
    return None if os.path.isfile(path) else str(path)


def _in_interactive_main(obj: Any) -> bool:
    """Whether ``obj`` (or its class) lives in a ``__main__`` without a file (a REPL, a notebook, ``-c``, stdin)."""
    main = sys.modules.get("__main__")
    if main is None or (getattr(main, "__file__", None) and _main_file_missing() is None):
        return False
    mod = getattr(obj, "__module__", None) if isinstance(obj, type) or callable(obj) else None
    return (mod or type(obj).__module__) == "__main__"


def _serialise(grid: Any, sources: list[tuple[Any, ...]], *, dumps: Callable[[Any], bytes], where: str,
               by_value: bool) -> tuple[bytes, bytes]:
    """``(plugins, grid)`` pickled with ``dumps``, or a TypeError naming the part that cannot be sent."""
    from .identity import qualname as _qualname

    parts: list[tuple[str, Any]] = [(f"scheme {label!r}: selector {sel!r:.80}", sel)
                                    for label, sel in grid.built.items()]
    if grid.source.kind == "factory":
        parts.append((f"federation factory {_qualname(grid.source.spec)}", grid.source.spec))
    elif grid.source.kind == "object":
        parts.append(("the federation object", grid.source.spec))
    parts += [(f"trainer option {k}={v!r:.60}", v) for k, v in grid.trainer_kw.items()]
    parts += [(f"plugin {src[2]!r}", src[1]) for src in sources if src[0] == "object"]
    fix = ("define it at the top level of a module file the workers can import (not a lambda, a nested function "
           "or class, nor in an interactive session or notebook), or run with jobs=1")
    if not by_value:
        for what, obj in parts:
            if _in_interactive_main(obj):
                raise TypeError(f"{what} is defined in an interactive __main__, which {where} cannot import; {fix}")
    try:
        return dumps(sources), dumps(grid)
    except Exception:  # find the culprit (pickling each part again costs time only when something fails)
        for what, obj in parts:
            try:
                dumps(obj)
            except Exception as exc:
                raise TypeError(f"{what} cannot be sent to {where}: {type(exc).__name__}: {exc}; {fix}") from exc
        raise


def prepare(grid: Any, *, jobs: int, ray_address: str | None) -> Any:
    """A runner for ``grid``'s cells: worker processes (``jobs > 1``) or Ray tasks (``ray_address``).

    The runner's ``run(cells, finish)`` calls ``finish(i, outcome)`` in this process as each
    cell ``i`` finishes, in completion order; ``describe()`` says how the runs are spread.
    """
    n_threads = grid.trainer_kw.get("n_threads")
    if ray_address is not None:
        threads = int(n_threads) if n_threads else 1
        ray = _import_ray(ray_address)
        sources, payload = _serialise(grid, _plugin_sources(), dumps=ray.cloudpickle.dumps,
                                      where="Ray workers", by_value=True)
        return _RayRunner(payload, sources, threads, ray_address)
    missing = _main_file_missing()
    if missing is not None:  # multiprocessing would fail to start every worker, with a FileNotFoundError each
        raise RuntimeError(f"jobs={jobs}: worker processes cannot be started from a script that is not a file "
                           f"(__main__ is {missing!r}, read from standard input?); save it to a file and run that, "
                           "or use jobs=1")
    threads = threads_per_run(jobs, n_threads)
    n = cores()
    if jobs * threads > n:
        warnings.warn(
            f"run_comparison: jobs={jobs} x {threads} torch thread(s) per run = {jobs * threads} threads on {n} "
            f"core(s): the runs will slow each other down (results are unchanged); use jobs={max(1, n // threads)}"
            + (" or fewer n_threads" if n_threads else ""),
            RuntimeWarning, stacklevel=3,
        )
    sources, payload = _serialise(grid, _plugin_sources(), dumps=pickle.dumps, where="worker processes",
                                  by_value=False)
    return _ProcessRunner(payload, sources, jobs, threads)


def _absolute(cells: Sequence[Cell]) -> list[Cell]:
    """Cells with absolute checkpoint paths: a worker's working directory need not be this one's."""
    return [(label, seed, None if ckpt is None else Path(ckpt).absolute()) for label, seed, ckpt in cells]


# -- worker side ------------------------------------------------------------------------------------

_STATE: dict[str, Any] = {}


def _install(token: str, sources: bytes, payload: bytes) -> Any:
    """Load the plugins, then the grid (its classes may come from them); once per worker and grid."""
    if _STATE.get("token") != token:
        _load_plugin_sources(pickle.loads(sources))
        _STATE.clear()
        _STATE.update(token=token, grid=pickle.loads(payload))
    return _STATE["grid"]


def _run_group(cells: Sequence[Cell]) -> list[Any]:
    """The outcomes of cells of one label: one cell alone, several as one batch of seeds (the runner keeps the
    worker's federations between groups)."""
    return _STATE["grid"].run_cells(cells, log=lambda msg: print(msg, file=sys.stderr))


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(1.0)
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            os._exit(1)  # the comparison is gone: no one would write this worker's result
        except OSError:
            pass


def _init_worker(token: str, sources: bytes, payload: bytes, threads: int, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    import torch

    torch.set_num_threads(int(threads))
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    try:
        _install(token, sources, payload)
    except Exception as exc:  # reported by the first task, in the parent, instead of a bare broken pool
        _STATE["start_error"] = f"{type(exc).__name__}: {exc}"


def _run_in_worker(cells: Sequence[Cell]) -> list[Any]:
    if "start_error" in _STATE:
        raise RuntimeError(f"a worker process of the comparison could not load its plugins or the comparison's "
                           f"schemes, federation and trainer options: {_STATE['start_error']}")
    return _run_group(cells)


def _run_on_ray(token: str, sources: bytes, payload: bytes, threads: int, label: str, seed: int,
                ckpt: Path | None) -> Any:
    import torch

    torch.set_num_threads(int(threads))
    _install(token, sources, payload)
    return _run_group([(label, seed, ckpt)])[0]


# -- the runners ------------------------------------------------------------------------------------


def _mp_context() -> Any:
    import multiprocessing as mp

    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        # The server imports these once; each worker is a fork of it. "__main__" keeps the default's behaviour
        # (classes of the user's script unpickle in the workers).
        from .plugins import DEFAULT_PLUGINS

        ctx.set_forkserver_preload(["__main__", "fedselect.experiments.executors", "fedselect.simulation.trainer",
                                    "fedselect.data", *DEFAULT_PLUGINS])
        return ctx
    return mp.get_context("spawn")


class _ProcessRunner:
    def __init__(self, payload: bytes, sources: bytes, jobs: int, threads: int) -> None:
        self.payload, self.sources, self.jobs, self.threads = payload, sources, int(jobs), int(threads)
        self.token = hashlib.sha256(sources + payload).hexdigest()[:16]

    def describe(self) -> str:
        return f"{self.jobs} at once, {self.threads} thread{'s' if self.threads > 1 else ''} each"

    def run(self, cells: Sequence[Cell], finish: Finish, groups: Sequence[Sequence[int]] | None = None) -> None:
        """Run ``cells``, one task per cell, or one task per group of cell indices (batched seeds)."""
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from concurrent.futures.process import BrokenProcessPool

        tasks = [list(g) for g in groups] if groups is not None else [[i] for i in range(len(cells))]
        ex = ProcessPoolExecutor(
            max_workers=min(self.jobs, len(tasks)), mp_context=_mp_context(), initializer=_init_worker,
            initargs=(self.token, self.sources, self.payload, self.threads, os.getpid()),
        )
        futures: dict[Any, list[int]] = {}
        cells = _absolute(cells)
        try:
            for task in tasks:
                futures[ex.submit(_run_in_worker, [cells[i] for i in task])] = task
            for fut in as_completed(futures):
                for i, outcome in zip(futures[fut], fut.result()):
                    finish(i, outcome)
        except BrokenProcessPool as exc:
            _stop(ex, futures)
            raise RuntimeError(
                "a worker process of the comparison died (killed, out of memory, or it failed to start: see the "
                "messages above); finished runs are saved, rerun the same command to resume"
            ) from exc
        except BaseException:
            _stop(ex, futures)
            raise
        ex.shutdown(wait=True)


def _stop(ex: Any, futures: dict[Any, Any]) -> None:
    """Cancel what has not started and end the workers now (no orphans, no waiting for running cells)."""
    for fut in futures:
        fut.cancel()
    terminate = getattr(ex, "terminate_workers", None)  # Python >= 3.14
    if terminate is not None:
        terminate()
    else:
        for proc in list((getattr(ex, "_processes", None) or {}).values()):
            proc.terminate()
    ex.shutdown(wait=True, cancel_futures=True)


def _import_ray(address: str) -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"ray_address={address!r} (--ray) needs Ray, which is not installed: {RAY_EXTRA}") from exc
    return ray


class _RayRunner:
    def __init__(self, payload: bytes, sources: bytes, threads: int, address: str) -> None:
        self.payload, self.sources, self.threads, self.address = payload, sources, int(threads), address
        self.token = hashlib.sha256(sources + payload).hexdigest()[:16]

    def describe(self) -> str:
        return f"Ray, {self.threads} CPU{'s' if self.threads > 1 else ''} per run"

    def run(self, cells: Sequence[Cell], finish: Finish, groups: Sequence[Sequence[int]] | None = None) -> None:
        """Run each cell as a Ray task (``groups`` is not used: run_comparison does not batch seeds on Ray)."""
        ray = _import_ray(self.address)
        started = False
        if not ray.is_initialized():
            if self.address == "local":
                ray.init(include_dashboard=False)
            else:
                ray.init(address=self.address)
            started = True
        pending: list[Any] = []
        try:
            task = ray.remote(_run_on_ray).options(num_cpus=self.threads)
            sources, payload = ray.put(self.sources), ray.put(self.payload)
            index = {task.remote(self.token, sources, payload, self.threads, label, seed, ckpt): i
                     for i, (label, seed, ckpt) in enumerate(_absolute(cells))}
            pending = list(index)
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    finish(index[ref], ray.get(ref))
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        finally:
            if started:
                ray.shutdown()
