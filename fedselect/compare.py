"""Compare selection schemes over seeds: resumable runs, a table, curves.

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
side (see :mod:`fedselect._grid`); planning, keys and result files stay here, so a parallel
comparison writes, resumes and fails exactly as a serial one.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import inspect
import json
import numbers
import os
import platform
import re
import shutil
import subprocess
import sys
import textwrap
import time
import traceback
import warnings
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from ._console import bars_wanted
from .simulation.checkpoint import CheckpointMismatchError, CorruptFileWarning, atomic_write_bytes, move_aside
from .simulation.history import History

__all__ = [
    "Comparison",
    "check_plan",
    "compress_runs",
    "holm",
    "load_comparison",
    "ResultFileError",
    "read_text",
    "run_comparison",
    "run_files",
    "run_settings",
    "selector_table",
]


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", label).strip("-") or "run"


def _settings_diff(saved: Any, now: Mapping[str, Any]) -> str:
    """Which settings differ between a saved run and this call, as ``"trainer.lr: saved 0.05, now 0.1"``."""
    if not isinstance(saved, Mapping):
        return "the file predates recorded settings, so which ones differ is unknown"

    def flat(d: Any, prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            if isinstance(v, Mapping):
                out.update(flat(v, f"{prefix}{k}."))
            else:
                out[f"{prefix}{k}"] = v
        return out

    a, b = flat(saved), flat(json.loads(json.dumps(dict(now), default=repr)))
    diffs = [f"{k}: saved {a.get(k, '(unset)')!r}, now {b.get(k, '(unset)')!r}"
             for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return "; ".join(diffs) if diffs else "the settings' key differs"


SelectorsArg = Mapping[str, Any] | Sequence[Any]
"""Selectors of a comparison: label -> selector, or a sequence of selectors labelled by default."""


def selector_table(selectors: SelectorsArg) -> dict[str, Any]:
    """Label -> :class:`~fedselect.plugins.SelectorSpec` for the ``selectors`` of a comparison.

    Parameters
    ----------
    selectors : mapping or sequence
        Label -> selector, or a sequence of selectors. A selector is any form
        :func:`fedselect.plugins.resolve_selector` takes: a registered name, a
        ``(name, params)`` pair, a :class:`~fedselect.BaseSelector` instance or subclass,
        or a ``(class, params)`` pair. In a sequence each is labelled by
        :func:`~fedselect.plugins.selector_label` (the registered name, else the class name,
        and the parameters given, e.g. ``power-of-choice(d=10)``).

    Raises
    ------
    TypeError
        ``selectors`` is neither, or one of them is not a selector.
    ValueError
        Two selectors of a sequence get the same label (give a mapping instead).
    """
    from .plugins import as_selector_spec

    if isinstance(selectors, Mapping):
        table = {}
        for label, spec in selectors.items():
            if not isinstance(label, str) or not label:
                raise TypeError(f"selector label {label!r} must be a non-empty string")
            try:
                table[label] = as_selector_spec(spec)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"scheme {label!r}: {exc}") from exc
        return table
    if isinstance(selectors, str | bytes) or not isinstance(selectors, Sequence):
        raise TypeError(
            f"selectors={selectors!r:.80} must be a mapping of label -> selector or a list of selectors, e.g. "
            "['random', ('power-of-choice', {'d': 10}), MySelector()]"
        )
    table = {}
    for spec in selectors:
        sp = as_selector_spec(spec)
        if sp.label in table:
            raise ValueError(
                f"two selectors would both be labelled {sp.label!r}; give a mapping of label -> selector instead"
            )
        table[sp.label] = sp
    return table


def _federation_fingerprint(fed: Any) -> str:
    """A hash of a Federation's content: its arrays (dtype, shape, bytes), client index lists and classes.

    Cost: one SHA-256 pass over the data, linear in its size (hundreds of MB per second); names
    and metadata are not included, so a renamed but identical federation keeps its fingerprint.
    """
    h = hashlib.sha256()

    def add(arr: Any) -> None:
        a = np.ascontiguousarray(arr)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.view(np.uint8).reshape(-1) if a.size else b"")

    for arr in (fed.X, fed.y, fed.X_test, fed.y_test):
        add(arr)
    for group in (fed.client_indices, fed.eval_indices or []):
        h.update(f"[{len(group)}]".encode())
        for idx in group:
            add(idx)
    h.update(f"eval={fed.eval_indices is not None};classes={int(fed.n_classes)}".encode())
    return h.hexdigest()[:16]


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', type(obj).__qualname__)}"


class _FederationSource:
    """The ``federation`` argument of a comparison: builds each seed's Federation and says what identifies it."""

    def __init__(self, federation: Any) -> None:
        from .data import Federation

        self.spec = federation
        if isinstance(federation, Mapping):
            self.kind = "mapping"
        elif isinstance(federation, Federation):
            self.kind = "object"
            self._fingerprint: str | None = None  # computed when first needed
        elif callable(federation):
            self.kind = "factory"
            self._fingerprints: dict[int, str] = {}
        else:
            raise TypeError(
                f"federation={federation!r:.80} ({type(federation).__name__}) must be a mapping of "
                "make_federation arguments (e.g. {'dataset': 'digits', 'n_clients': 20}), a "
                "fedselect.data.Federation, or a callable seed -> Federation"
            )

    def n_clients(self) -> int | None:
        if self.kind == "mapping":
            n = self.spec.get("n_clients")
            return n if isinstance(n, numbers.Integral) else None
        if self.kind == "object":
            return self.spec.n_clients
        return None

    def build(self, seed: int) -> Any:
        """Seed ``seed``'s federation (for a factory, checked to be the one fingerprinted)."""
        from .data import Federation, make_federation

        if self.kind == "mapping":
            return make_federation(random_state=int(seed), **dict(self.spec))
        if self.kind == "object":
            return self.spec
        fed = self.spec(int(seed))
        if not isinstance(fed, Federation):
            raise TypeError(
                f"federation factory {_qualname(self.spec)} returned {type(fed).__name__} {fed!r:.60} for seed {seed}; "
                "it must return a fedselect.data.Federation"
            )
        fp = _federation_fingerprint(fed)
        if self._fingerprints.setdefault(int(seed), fp) != fp:
            raise ValueError(
                f"federation factory {_qualname(self.spec)} built two different federations for seed {seed}; it must "
                "build the same one for the same seed (seed all its randomness with the seed it is given)"
            )
        return fed

    def settings(self, seed: int) -> Any:
        """What identifies seed ``seed``'s federation in the saved settings (a mapping: the mapping, as always)."""
        if self.kind == "mapping":
            return dict(self.spec)
        if self.kind == "object":
            if self._fingerprint is None:
                self._fingerprint = _federation_fingerprint(self.spec)
            return {"federation": "Federation", "fingerprint": self._fingerprint}
        if int(seed) not in self._fingerprints:
            self.build(seed)
        return {"factory": _qualname(self.spec), "fingerprint": self._fingerprints[int(seed)]}


def _check_clients_per_round(cpr: Any, n_clients: Any) -> None:
    from ._validation import InvalidParameterError

    if isinstance(n_clients, numbers.Integral) and isinstance(cpr, numbers.Integral) and 1 <= n_clients < cpr:
        raise InvalidParameterError(
            f"FederatedTrainer: parameter clients_per_round={cpr!r} is invalid; expected an integer between 1 "
            f"and the federation's {n_clients} clients."
        )


def check_plan(
    selectors: SelectorsArg,
    *,
    trainer: Mapping[str, Any],
    seeds: Sequence[int],
    out_dir: str | os.PathLike[str] | None = None,
    federation: Any = None,
) -> dict[str, Any]:
    """Check everything a comparison can check before it trains anything.

    Builds every selector and checks its parameters against its declared constraints, checks
    the trainer's parameters (a model name must be registered; ``clients_per_round`` must not
    exceed the federation's ``n_clients`` when ``federation`` gives it), refuses repeated or
    invalid seeds and labels whose file names would collide, and checks that ``out_dir`` can
    be written (a result is written only when
    its run has finished: an unwritable directory must not cost a run).

    Parameters
    ----------
    selectors : mapping or sequence
        As in :func:`run_comparison` (see :func:`selector_table`).
    trainer : mapping
    seeds : sequence of int
    out_dir : path, optional
    federation : mapping, Federation or callable, optional
        As in :func:`run_comparison`; anything else is a TypeError.

    Returns
    -------
    built : dict
        Label -> a new selector instance (a clone for an instance given).

    Raises
    ------
    ValueError, TypeError, KeyError
        The first problem found, naming the label, the parameter, the seed or the path.
    """
    from ._validation import Interval, InvalidParameterError, validate_parameters
    from .simulation.trainer import FederatedTrainer

    source = _FederationSource(federation) if federation is not None else None
    if isinstance(selectors, Mapping | Sequence) and not isinstance(selectors, str | bytes) and not selectors:
        raise ValueError("no schemes to compare; give at least one (e.g. --selectors random fedcor)")
    seed_ok = Interval(numbers.Integral, 0, 2**32 - 1, closed="both")
    seeds = list(seeds)
    if not seeds:
        raise ValueError("no seeds to run; give at least one (e.g. --seeds 0 1 2)")
    for seed in seeds:
        if not seed_ok.is_satisfied_by(seed):
            raise InvalidParameterError(f"seed {seed!r} is invalid; expected {seed_ok}")
    repeated = sorted({int(s) for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(
            f"seeds {seeds} repeat {repeated}: a seed fixes the whole run, so a repeat would train the same run "
            "twice and count it once; give distinct seeds"
        )
    table = selector_table(selectors)
    slugs: dict[str, str] = {}
    for label in table:
        slug = _slug(label)
        if slug in slugs:
            raise ValueError(
                f"labels {slugs[slug]!r} and {label!r} would both be saved as runs/{slug}__seed<k>.json; "
                "give them distinct labels (e.g. --selectors a=NAME:... b=NAME:...)"
            )
        slugs[slug] = label
    built = {}
    for label, spec in table.items():
        sel = spec.build()
        try:
            sel._validate_params()
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"scheme {label!r}: {exc}") from exc
        built[label] = sel
    trainer_kw = {k: v for k, v in trainer.items() if k != "selector"}
    tr = FederatedTrainer(**trainer_kw)  # unknown names: TypeError naming them
    validate_parameters(tr, trainer_kw, FederatedTrainer._parameter_constraints)
    model = trainer_kw.get("model")
    if isinstance(model, str):
        from .plugins import list_models, registry

        if model not in registry("models"):  # names and aliases
            raise KeyError(f"unknown model {model!r}; registered models: {', '.join(list_models())}")
    _check_clients_per_round(trainer_kw.get("clients_per_round"), source.n_clients() if source else None)
    if out_dir is not None:
        _check_writable_dir(Path(out_dir) / "runs")
    return built


def _check_writable_dir(directory: Path) -> None:
    """Create ``directory`` and prove a file can be written there, or raise OSError naming it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise OSError(f"cannot write results into {directory}: {exc.strerror or exc}") from exc


def _commit() -> str:
    """The git commit of the fedselect source tree, or the package version outside a checkout."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
        if out.returncode == 0:
            dirty = subprocess.run(
                ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True, text=True, timeout=5, check=False,
            ).stdout.strip()
            return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    from . import __version__

    return f"fedselect {__version__}"


def _key(payload: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=repr).encode()).hexdigest()[:16]


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


def _mean_or_none(values: Sequence[float | None]) -> float | None:
    """The mean of the values that are not None; None when there are none (e.g. no accuracy in regression)."""
    kept = [float(v) for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def _fmt_mean_std(values: Sequence[float], digits: int = 1) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{np.mean(values):.{digits}f} ± {np.std(values, ddof=0):.{digits}f}"


@dataclass
class Comparison:
    """The results of :func:`run_comparison`.

    Attributes
    ----------
    histories : dict
        Label -> {seed: History}.
    target : float
    n_clients : int
    out_dir : Path or None
    paper : dict
        Label -> the paper's figure, shown beside ours when given.
    title : str
    failed : dict
        Label -> {seed: failure}, the runs that raised (a diverged run raises
        :class:`~fedselect.simulation.DivergenceError`). Each failure is a dict with ``type``,
        ``message``, ``round`` (the round it failed in) and ``rounds_completed``. Failed runs are
        not in ``histories``; they count as not reaching the target.
    """

    histories: dict[str, dict[int, History]]
    target: float
    n_clients: int
    out_dir: Path | None = None
    paper: dict[str, str] = field(default_factory=dict)
    title: str = ""
    failed: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)

    def _n_failed(self) -> dict[str, int]:
        return {label: len(runs) for label, runs in self.failed.items() if runs}

    def rows(self) -> list[dict[str, Any]]:
        """One row per scheme: rounds to target, accuracies and costs to the target.

        ``seeds`` counts finished runs; ``failed`` (present when a run of the scheme failed)
        lists the failed ones as ``{"seed", "type", "message", "round"}``, and a scheme with a
        failed run has no mean rounds to the target (like one whose run missed it).
        """
        out = []
        labels = list(self.histories) + [k for k in self.failed if k not in self.histories and self.failed[k]]
        for label in labels:
            runs = self.histories.get(label, {})
            fails = self.failed.get(label, {})
            hs = [runs[s] for s in sorted(runs)]
            reached = [h.rounds_to_accuracy(self.target) for h in hs]
            ok = [r for r in reached if r is not None]
            costs = [h.costs_to_accuracy(self.target) for h in hs]
            costs_ok = [(c, h) for c, h in zip(costs, hs) if c is not None]
            complete = hs and len(ok) == len(hs) and not fails
            row = {
                "scheme": label,
                "seeds": len(hs),
                "reached": len(ok),
                "rounds_to_target": float(np.mean(ok)) if complete else None,
                "rounds_to_target_std": float(np.std(ok)) if complete else None,
                "rounds_to_target_each": reached,
                "final_accuracy": _mean_or_none([h.final_accuracy() for h in hs]),
                "best_accuracy": _mean_or_none([h.best_accuracy() for h in hs]),
                "final_test_loss": _mean_or_none([h.rounds[-1].test_loss if h.rounds else None for h in hs]),
                "mfloats_to_target": (
                    float(np.mean([c.floats_communicated(h.model_size) for c, h in costs_ok]) / 1e6)
                    if costs_ok else None
                ),
                "models_down_to_target": float(np.mean([c.models_down for c, _ in costs_ok])) if costs_ok else None,
                "scalars_up_to_target": float(np.mean([c.scalars_up for c, _ in costs_ok])) if costs_ok else None,
                "trainings_to_target": float(np.mean([c.local_trainings for c, _ in costs_ok])) if costs_ok else None,
                "seconds": float(np.mean([sum(r.seconds for r in h.rounds) for h in hs])) if hs else None,
            }
            if label in self.paper:
                row["paper"] = self.paper[label]
            if fails:
                row["failed"] = [{"seed": seed, **{k: fails[seed].get(k) for k in ("type", "message", "round")}}
                                 for seed in sorted(fails)]
            out.append(row)
        return out

    def to_markdown(self) -> str:
        """The table as Markdown.

        A rounds cell is N/A when any seed missed the target or failed (followed by the mean
        of the seeds that reached it). Every header says what its cell averages over: rounds,
        accuracies and seconds are means over the finished seeds, the cost columns (what one
        run spent until it reached the target) are means over the seeds that reached it.
        When a run failed, a last column names each failed seed, its error type and round,
        and "seeds reaching" counts it among the seeds.
        """
        head, body, notes = self._table(short=False)
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(vals) + " |" for vals in body]
        return "\n".join(lines + (["", *notes] if notes else []))

    def to_text(self) -> str:
        """The table for a terminal: short headers, aligned columns, and a legend below.

        The same cells as :meth:`to_markdown`, whose long headers say what each cell averages
        over; the legend says it here.
        """
        head, body, notes = self._table(short=True)
        widths = [max([len(h), *(len(vals[i]) for vals in body)]) for i, h in enumerate(head)]
        left = {0, len(head) - 1} if head[-1] == "failed" else {0}  # text columns; numbers align right

        def fmt(vals: list[str]) -> str:
            return "  ".join(v.ljust(w) if i in left else v.rjust(w)
                             for i, (v, w) in enumerate(zip(vals, widths, strict=True))).rstrip()

        target = f"{self.target:.0%}"
        legend = (f"rounds: to {target}, mean ± std over seeds (N/A when a seed missed it or failed: then the mean of "
                  "those that reached it); reached: seeds reaching it; final, best: test accuracy, mean over seeds; "
                  f"Mfloats, down, losses, trainings: floats communicated, models sent down, losses sent up and "
                  f"local trainings of one run until it reached {target}, mean over the seeds that reached it; "
                  "s/run: seconds per run")
        lines = [fmt(head), *(fmt(vals) for vals in body), "", *textwrap.wrap(legend, 100)]
        return "\n".join(lines + (["", *notes] if notes else []))

    def _table(self, *, short: bool) -> tuple[list[str], list[list[str]], list[str]]:
        """The table's header, its rows of cells and the notes below it (long or short headers)."""
        rows = self.rows()
        paper = any("paper" in r for r in rows)
        any_failed = any("failed" in r for r in rows)
        target = f"{self.target:.0%}"
        to_target = f"to {target} per run, mean over seeds reaching it"
        if short:
            head = ["scheme", f"rounds to {target}", "reached", "final", "best", "Mfloats", "down", "losses",
                    "trainings", "s/run"]
        else:
            head = ["scheme", f"rounds to {target}, mean ± std over seeds", f"seeds reaching {target}",
                    "final acc, mean over seeds", "best acc, mean over seeds", f"Mfloats communicated {to_target}",
                    f"models down {to_target}", f"losses up {to_target}", f"local trainings {to_target}",
                    "seconds per run, mean over seeds"]
        if paper:
            head.insert(2, "paper")
        if any_failed:
            head.append("failed")
        body: list[list[str]] = []
        for r in rows:
            fails = r.get("failed", [])
            rounds = [x for x in r["rounds_to_target_each"] if x is not None]
            if r["reached"] == r["seeds"] and not fails:
                cell = _fmt_mean_std(rounds)
            else:  # the paper's N/A, and what the seeds that did reach it took
                cell = "N/A" if not rounds else f"N/A ({len(rounds)} reached: {_fmt_mean_std(rounds)})"
            vals = [
                r["scheme"], cell, f"{r['reached']}/{r['seeds'] + len(fails)}",
                "-" if r["final_accuracy"] is None else f"{r['final_accuracy']:.3f}",
                "-" if r["best_accuracy"] is None else f"{r['best_accuracy']:.3f}",
                "-" if r["mfloats_to_target"] is None else f"{r['mfloats_to_target']:.2f}",
                "-" if r["models_down_to_target"] is None else f"{r['models_down_to_target']:.0f}",
                "-" if r["scalars_up_to_target"] is None else f"{r['scalars_up_to_target']:.0f}",
                "-" if r["trainings_to_target"] is None else f"{r['trainings_to_target']:.0f}",
                "-" if r["seconds"] is None else f"{r['seconds']:.1f}",
            ]
            if paper:
                vals.insert(2, r.get("paper", "-"))
            if any_failed:
                vals.append("; ".join(f"seed {f['seed']}: {f['type']} in round {f['round']}" for f in fails) or "-")
            body.append(vals)
        notes: list[str] = []
        finished = [r for r in rows if r["seeds"]]
        if finished and all(r["final_accuracy"] is None for r in finished):
            losses = ", ".join(f"{r['scheme']} {r['final_test_loss']:.4g}" for r in rows
                               if r.get("final_test_loss") is not None)
            notes = ["These runs record no accuracy (a regression loss): the rounds-to-target and accuracy "
                     f"columns do not apply. Final test loss, mean over seeds: {losses or '-'}."]
        elif rows and not any(r["reached"] for r in rows):
            n_rounds = max((len(h) for runs in self.histories.values() for h in runs.values()), default=0)
            notes = [f"No run reached {target} in {n_rounds} rounds, so the rounds columns and a paired "
                     "comparison say nothing; lower the target (--target) or train longer (--rounds)."]
        return head, body, notes

    def paired(self, reference: str, *, not_reached: int | None = None,
               diverged: str = "leave-out") -> list[dict[str, Any]]:
        """Each other scheme against ``reference``, paired by seed.

        Runs of one seed share the federation (partition, model start, minibatch streams), so
        per-seed differences remove the variation the schemes have in common; with few seeds
        this is a far more sensitive comparison than two means and standard deviations.

        Parameters
        ----------
        reference : str
            The label every other scheme is compared with.
        not_reached : int, optional
            The value a run that never reached the target counts as. Default: its number
            of rounds + 1 (a lower bound on its true rounds to the target).
        diverged : {"leave-out", "not-reached"}, default "leave-out"
            What a run that failed with a :class:`~fedselect.simulation.DivergenceError`
            (the scheme's training diverged) counts as. ``"leave-out"``: like any failed run,
            its seed leaves the pairs (listed in ``failed_seeds``). ``"not-reached"``: it never
            reached the target, so it counts as ``not_reached`` (default: the longest run of the
            comparison + 1); a scheme that diverges on most seeds is then judged on all of them,
            not on the few it survived. Runs that failed otherwise are always left out.

        Returns
        -------
        rows : list of dict
            Per other scheme: ``scheme``, ``seeds`` (the seeds in the pairs), ``diffs``
            (other - reference rounds to the target, per seed: positive means the
            reference was faster), ``failed_seeds`` (seeds left out because a run of
            this scheme or of the reference failed), ``diverged_seeds`` and
            ``reference_diverged_seeds`` (with ``diverged="not-reached"``: the seeds in the pairs
            where this scheme's run, or the reference's, diverged and counts as not reached),
            the statistics of :func:`paired_summary`, and
            ``p_holm``: the p-value adjusted for comparing the reference with every other
            scheme at once (Holm's step-down method, see :func:`holm`).
        """
        if reference not in self.histories:
            raise KeyError(f"no scheme {reference!r} in this comparison; schemes: {list(self.histories)}")
        if diverged not in ("leave-out", "not-reached"):
            raise ValueError(f"Comparison.paired: diverged={diverged!r}; expected 'leave-out' or 'not-reached'")
        longest = max((len(h) for runs in self.histories.values() for h in runs.values()), default=0)

        def rounds(h: History | None) -> float:
            r = None if h is None else h.rounds_to_accuracy(self.target)
            if r is not None:
                return float(r)
            if not_reached is not None:
                return float(not_reached)
            return float((len(h) if h is not None else longest) + 1)

        def usable(label: str) -> dict[int, History | None]:
            """seed -> History, or None for a diverged run counted as not reached."""
            runs: dict[int, History | None] = dict(self.histories.get(label, {}))
            if diverged == "not-reached":
                for seed, f in self.failed.get(label, {}).items():
                    if f.get("type") == "DivergenceError":
                        runs[int(seed)] = None
            return runs

        ref = usable(reference)
        out = []
        for label in self.histories:
            runs = usable(label)
            seeds = sorted(set(ref) & set(runs))
            failed = sorted((set(self.failed.get(label, {})) | set(self.failed.get(reference, {}))) - set(seeds))
            if label == reference or not (seeds or failed):
                continue
            diffs = [rounds(runs[s]) - rounds(ref[s]) for s in seeds]
            out.append({"scheme": label, "seeds": seeds, "failed_seeds": failed,
                        "diverged_seeds": [s for s in seeds if runs[s] is None],
                        "reference_diverged_seeds": [s for s in seeds if ref[s] is None], **paired_summary(diffs)})
        for row, p in zip(out, holm([r["p"] for r in out])):
            row["p_holm"] = p
        return out

    def paired_markdown(self, reference: str, *, not_reached: int | None = None,
                        diverged: str = "leave-out") -> str:
        """:meth:`paired` as a markdown table."""
        lines = [
            f"| scheme | seeds | scheme − {reference} (rounds, mean ± std) | median | "
            f"{reference} faster / tie / slower | p (Wilcoxon) | p (Holm) |",
            "|---|---|---|---|---|---|---|",
        ]
        rows = self.paired(reference, not_reached=not_reached, diverged=diverged)
        for r in rows:
            lines.append(
                f"| {r['scheme']} | {len(r['seeds'])} | {r['mean']:+.1f} ± {r['std']:.1f} | {r['median']:+.1f} | "
                f"{r['faster']} / {r['ties']} / {r['slower']} | {r['p']:.3f} | {r['p_holm']:.3f} |"
            )
        most = max((len(r["seeds"]) for r in rows), default=0)
        if 0 < most and 2.0 / 2**most > 0.05:  # the exact two-sided Wilcoxon test's smallest p with `most` pairs
            lines.append("")
            lines.append(f"With {most} seed(s) the smallest p-value the test can give is {2.0 / 2**most:.3f}: "
                         "no difference can reach p < 0.05; run at least 6 seeds.")
        ref_gone = sorted({s for r in rows for s in r["reference_diverged_seeds"]})
        counted = ([f"{reference} (the reference): seed(s) {ref_gone}"] if ref_gone else []) + [
            f"{r['scheme']}: seed(s) {r['diverged_seeds']}" for r in rows if r["diverged_seeds"]]
        if counted:
            lines.append("")
            lines.append("Counted as not reached because a run diverged (DivergenceError): " + "; ".join(counted) + ".")
        left_out = [f"{r['scheme']}: seed(s) {r['failed_seeds']}" for r in rows if r["failed_seeds"]]
        if left_out:
            lines.append("")
            lines.append("Left out because a run failed (see the table's failed column): " + "; ".join(left_out) + ".")
        return "\n".join(lines)

    def plot(self, out_dir: str | os.PathLike[str] | None = None) -> list[Path]:
        """Write accuracy.png, selection_frequency.png and communication.png; return their paths."""
        import matplotlib

        if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from .plotting import figure_size, plot_accuracy, plot_communication, plot_selection_frequency

        out = Path(out_dir or self.out_dir or ".")
        out.mkdir(parents=True, exist_ok=True)
        res = {k: [v[s] for s in sorted(v)] for k, v in self.histories.items()}
        failed = self._n_failed()
        for label in failed:
            res.setdefault(label, [])
        paths = []
        for name, draw in (
            ("accuracy.png",
             lambda ax: plot_accuracy(res, target=self.target, ax=ax, title=self.title, failed=failed)),
            ("selection_frequency.png",
             lambda ax: plot_selection_frequency(res, self.n_clients, ax=ax, title=self.title)),
            ("communication.png",
             lambda ax: plot_communication(res, self.target, ax=ax, title=self.title, failed=failed)),
        ):
            size = figure_size(name.removesuffix(".png"), list(res), self.n_clients)
            fig, ax = plt.subplots(figsize=size, constrained_layout=True)
            draw(ax)
            fig.savefig(out / name, dpi=120, bbox_inches="tight")  # long labels and titles stay whole
            plt.close(fig)
            paths.append(out / name)
        return paths

    def write(self, out_dir: str | os.PathLike[str] | None = None) -> list[Path]:
        """Write table.md, summary.json and results.csv (one row per scheme and seed).

        When a run failed, results.csv gains a ``status`` column (``finished`` or ``failed``;
        a failed row has empty results and the rounds it completed).
        """
        out = Path(out_dir or self.out_dir or ".")
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text(self.to_markdown() + "\n")
        (out / "summary.json").write_text(json.dumps({"target": self.target, "rows": self.rows()}, indent=2))
        any_failed = bool(self._n_failed())
        head = ["scheme", "seed", "rounds_to_target", "final_accuracy", "best_accuracy", "rounds_run",
                "floats_to_target"]
        rows: list[list[Any]] = [head + (["status"] if any_failed else [])]
        for label in dict.fromkeys([*self.histories, *self.failed]):
            runs = self.histories.get(label, {})
            for seed in sorted(runs):
                h = runs[seed]
                c = h.costs_to_accuracy(self.target)
                rows.append([label, seed, h.rounds_to_accuracy(self.target) or "", h.final_accuracy(),
                             h.best_accuracy(), len(h), "" if c is None else c.floats_communicated(h.model_size)]
                            + (["finished"] if any_failed else []))
            for seed, f in sorted(self.failed.get(label, {}).items()):
                rows.append([label, seed, "", "", "", f.get("rounds_completed", ""), "", "failed"])
        # The csv module quotes a label such as "fedcor(rank=5,beta=0.9)", whose commas would split its row.
        with open(out / "results.csv", "w", newline="") as fh:
            csv.writer(fh, lineterminator="\n").writerows(rows)
        return [out / "table.md", out / "summary.json", out / "results.csv"]


def paired_summary(diffs: Sequence[float]) -> dict[str, Any]:
    """Summary of per-seed differences ``other - reference``: what a paired comparison reports.

    Parameters
    ----------
    diffs : sequence of float
        One difference per shared seed (or per matched pair).

    Returns
    -------
    dict
        ``diffs`` (as a list), ``mean``, ``std`` (population), ``median``, ``faster`` / ``ties`` /
        ``slower`` (differences > 0, == 0, < 0: with rounds to a target, the reference was faster,
        tied, slower) and ``p``, the two-sided Wilcoxon signed-rank test (zero differences dropped;
        NaN when every difference is zero or there are fewer than two). Empty input gives NaN
        statistics and zero counts.
    """
    from scipy.stats import wilcoxon

    d = np.asarray(diffs, dtype=np.float64)
    if d.size == 0:
        nan = float("nan")
        return {"diffs": [], "mean": nan, "std": nan, "median": nan, "faster": 0, "ties": 0, "slower": 0, "p": nan}
    p = float(wilcoxon(d).pvalue) if d.size > 1 and np.any(d != 0) else float("nan")
    return {
        "diffs": d.tolist(), "mean": float(d.mean()), "std": float(d.std()), "median": float(np.median(d)),
        "faster": int((d > 0).sum()), "ties": int((d == 0).sum()), "slower": int((d < 0).sum()), "p": p,
    }


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (NaN entries are left out and stay NaN).

    With m tests sorted by p-value, the i-th smallest (from 0) becomes
    ``max_{j <= i} min(1, (m - j) p_(j))``; rejecting where the adjusted value is below alpha
    controls the family-wise error rate at alpha without assuming independence (Holm, 1979).

    Examples
    --------
    >>> holm([0.01, 0.04, 0.03])
    [0.03, 0.06, 0.06]
    """
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    m = ok.size
    running = 0.0
    for rank, i in enumerate(ok[np.argsort(p[ok], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return [round(float(x), 12) if np.isfinite(x) else float("nan") for x in out]


def machine_info() -> dict[str, Any]:
    """Where a run was made: CPU model, architecture, Python, torch and its thread count.

    Runs are bit-for-bit reproducible on one machine; on another CPU the floating-point
    results of torch's kernels may differ in the last bits, and a selector that feeds
    model state into a discrete choice (k-means, a top-k) can then follow another path.
    """
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "arch": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads()}


@dataclass
class _Outcome:
    """What one (scheme, seed) run produced, as the process that writes its result file needs it."""

    history: History | None  # None when the run failed before its first round
    error: dict[str, Any] | None  # None for a finished run
    seconds: float
    machine: dict[str, Any]
    diagnostics: dict[str, Any]
    n_clients: int


class _Grid:
    """What every run of a comparison shares, and :meth:`run`, one (scheme, seed) run.

    The serial loop calls :meth:`run` in the comparison's process; with ``jobs > 1`` or Ray the
    object is pickled once to each worker, which calls it there (see :mod:`fedselect._grid`).
    Result files are written by the comparison's process only, from the returned outcome.
    """

    def __init__(self, source: _FederationSource, built: Mapping[str, Any], trainer_kw: Mapping[str, Any], *,
                 checkpoint_every: int, overwrite: bool) -> None:
        self.source = source
        self.built = dict(built)
        self.trainer_kw = dict(trainer_kw)
        self.checkpoint_every = int(checkpoint_every)
        self.overwrite = bool(overwrite)

    def run(self, label: str, seed: int, ckpt: Path | None, *, fed: Any, progress: bool = False) -> _Outcome:
        """Train scheme ``label`` with ``seed`` on ``fed``; a run that raises is a failed outcome.

        Errors of the environment (``OSError``, ``MemoryError``, a checkpoint of other settings
        without ``overwrite``) propagate: they are not the run's result.
        """
        from sklearn.base import clone

        from .simulation.trainer import FederatedTrainer

        start = time.perf_counter()
        use_ckpt = ckpt is not None and bool(self.checkpoint_every)
        tr = FederatedTrainer(
            selector=clone(self.built[label]), random_state=int(seed), progress=progress, **self.trainer_kw,
            **({"checkpoint_dir": ckpt, "checkpoint_every": self.checkpoint_every} if use_ckpt else {}),
        )
        error: dict[str, Any] | None = None
        try:
            try:
                tr.fit(fed)
            except CheckpointMismatchError:
                if not self.overwrite:
                    raise
                _remove_tree(ckpt)
                tr.fit(fed)
        except (CheckpointMismatchError, OSError, MemoryError):
            raise  # the environment, not the run: a rerun after fixing it must not find it "failed"
        except Exception as exc:  # a failed run is a result; the comparison goes on
            partial = getattr(tr, "history_", None)
            completed = len(partial) if partial is not None else 0
            error = {
                "type": type(exc).__name__, "message": str(exc),
                "round": int(getattr(exc, "round", completed)), "rounds_completed": completed,
                "traceback": traceback.format_exc(limit=8),
            }
        return _Outcome(
            history=getattr(tr, "history_", None), error=error, seconds=time.perf_counter() - start,
            machine=machine_info(), diagnostics=_diagnostics(tr.selector_) if error is None else {},
            n_clients=int(fed.n_clients),
        )


    def run_batch(self, label: str, seeds: Sequence[int], ckpts: Sequence[Path | None], *, feds: Sequence[Any],
                  finish: Callable[[int, _Outcome], None], log: Callable[[str], None] | None = None) -> None:
        """Train scheme ``label`` with all of ``seeds`` in lockstep (:func:`fedselect.simulation.batched.fit_runs`).

        Calls ``finish(j, outcome)`` the moment run j ends, with the outcome :meth:`run` would
        give (``seconds`` is the run's wall time from the start of the batch; ``machine`` has
        ``batch_seeds``, the number of runs batched). Errors of the environment propagate as in
        :meth:`run`; a checkpoint of other settings with ``overwrite`` is deleted and its run
        redone on its own.
        """
        from sklearn.base import clone

        from .simulation.batched import fit_runs
        from .simulation.trainer import FederatedTrainer

        use = [ckpt is not None and bool(self.checkpoint_every) for ckpt in ckpts]
        trainers = [
            FederatedTrainer(
                selector=clone(self.built[label]), random_state=int(seed), progress=False, **self.trainer_kw,
                **({"checkpoint_dir": ckpt, "checkpoint_every": self.checkpoint_every} if u else {}),
            )
            for seed, ckpt, u in zip(seeds, ckpts, use)
        ]
        machine = {**machine_info(), "batch_seeds": len(seeds)}
        start = time.perf_counter()

        def done(j: int, exc: BaseException | None) -> None:
            tr, fed = trainers[j], feds[j]
            if isinstance(exc, CheckpointMismatchError) and self.overwrite:
                _remove_tree(ckpts[j])
                finish(j, self.run(label, int(seeds[j]), ckpts[j], fed=fed))
                return
            if isinstance(exc, (CheckpointMismatchError, OSError, MemoryError)):
                raise exc  # the environment, not the run (as in run)
            error = None
            if exc is not None:
                partial = getattr(tr, "history_", None)
                completed = len(partial) if partial is not None else 0
                error = {
                    "type": type(exc).__name__, "message": str(exc),
                    "round": int(getattr(exc, "round", completed)), "rounds_completed": completed,
                    "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=8)),
                }
            finish(j, _Outcome(
                history=getattr(tr, "history_", None), error=error, seconds=time.perf_counter() - start,
                machine=machine, diagnostics=_diagnostics(tr.selector_) if error is None else {},
                n_clients=int(fed.n_clients),
            ))

        fit_runs(trainers, feds, on_finish=done, log=log)


def share_pools(feds: Sequence[Any]) -> list[Any]:
    """The federations with equal training pools and test sets sharing one array each (same content, less memory).

    A federation recipe built for several seeds (``make_federation(random_state=seed)``) loads
    the same data set each time into arrays of its own; batched seeds hold them all at once.
    """
    import dataclasses

    out: list[Any] = []
    for fed in feds:
        for other in out:
            if other.X is not fed.X and other.X.shape == fed.X.shape and np.array_equal(other.X, fed.X) \
                    and np.array_equal(other.y, fed.y) and np.array_equal(other.X_test, fed.X_test) \
                    and np.array_equal(other.y_test, fed.y_test):
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
    raise ValueError(f"run_comparison: batch_seeds={batch_seeds!r} must be False (off), True (all seeds of a scheme "
                     "at once) or an integer N >= 2 (up to N seeds at once); 0 and 1 are off")


def _batches(todo: Sequence[tuple[Any, ...]], size: int) -> list[list[int]]:
    """Indices of ``todo`` (ordered seed by seed) grouped into runs of one label, up to ``size`` seeds each.

    Each label's seeds with work left are cut into chunks of ``size`` in seed order; the groups
    go chunk by chunk (every label's first chunk, then every label's second, ...), so the
    labels of one chunk usually share its federations.
    """
    by_label: dict[Any, list[int]] = {}
    for i, item in enumerate(todo):
        by_label.setdefault(item[1], []).append(i)
    chunks = {label: [idx[c : c + size] for c in range(0, len(idx), size)] for label, idx in by_label.items()}
    out: list[list[int]] = []
    for c in range(max((len(v) for v in chunks.values()), default=0)):
        out.extend(v[c] for v in chunks.values() if c < len(v))
    return out


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

    Returns
    -------
    Comparison
        Failed runs are in its ``failed`` attribute, not in ``histories``.

    Notes
    -----
    **Parallel grids** (``jobs > 1`` or ``ray_address``). Planning stays here: which cells
    are finished, their keys, the settings check. What every run shares (the selectors, the
    federation or its recipe, the trainer options) is pickled once before any training and
    sent to each worker; each cell then runs exactly the code of a serial run, and its
    outcome comes back here, where its result file is written the moment it arrives: same
    JSON, same key, same checkpoints under ``<out>/checkpoints/``, so a killed parallel
    comparison resumes like a serial one (and either can resume the other). A run that fails
    in a worker is recorded as failed and the grid goes on; an environment error in a worker
    (``OSError``, ``MemoryError``, a worker process that died) stops the grid, and so does
    Ctrl-C: tasks not started are cancelled and the workers are terminated (a worker also
    exits by itself when this process dies). Progress is one bar, or one line per finished
    run in a log, for the whole grid; workers draw no bars of their own.

    Results equal a serial run's bit for bit when each run uses the same number of torch
    threads (intra-op threads change how float sums are split): set ``n_threads``
    (``--threads``, 1 by default on the command line) to compare a parallel grid with a
    serial one. ``histories`` keeps the serial order whatever order the runs finish in.

    What must travel to the workers: selector classes and instances, federation factories
    and objects in ``trainer`` must pickle, i.e. be defined at the top level of an importable
    module, or of the script being run (guard its code with ``if __name__ == "__main__":``,
    as :mod:`multiprocessing` requires). A lambda or nested function or class, or a class
    defined in a notebook or interactive session, is a TypeError naming it before any
    training (run those with ``jobs=1``; Ray pickles functions and ``__main__`` classes by
    value and takes them). A trainer ``callback`` is called in the worker, on the worker's
    copy of its state: what it appends or prints stays there. Plugins loaded by :func:`fedselect.plugins.load_plugin`
    (``--plugin``) or :func:`~fedselect.plugins.register_plugin` are loaded again in each
    worker; installed entry-point plugins load there as everywhere. On a Ray cluster of
    several machines, fedselect, the data sets, plugin files and ``out_dir`` (for the
    checkpoints) must be at the same paths on every node; without a shared ``out_dir`` a
    killed cell restarts from its first round, results being written here in any case.

    **Batched seeds** (``batch_seeds``). The seeds of one scheme train in lockstep: each round,
    the S runs' chosen clients (S x C of them, each starting from its own run's global model)
    take their local steps as one batched computation, and the S new global models are tested
    in one pass over the test data; each run keeps its own selector, oracle questions, random
    streams, history, checkpoints and result file (written when the run ends; a rerun skips
    the finished runs as always, and run keys do not depend on ``batch_seeds``). Histories
    equal the unbatched runs' up to float rounding, and model-independent selectors (random,
    round-robin, data-size) choose identical clients; see :mod:`fedselect.simulation.batched`
    for what is batched and which runs can be. Runs whose model cannot be batched exactly
    (batch norm, or a model other than the built-in ``logistic``, ``mlp`` and ``cnn``) train
    one after another instead, with a line in ``log`` saying so. The federations of a batch
    are held in memory at once; those built from one recipe share their data set arrays.
    With ``jobs > 1`` each worker trains one batch at a time (a batch is one task); with
    ``ray_address``, ``batch_seeds`` is ignored with a note (each run is a task). A result's
    ``seconds`` is then its wall time from the start of its batch, and its ``machine`` records
    ``batch_seeds``, the number of runs batched.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr))
    out = Path(out_dir) if out_dir is not None else None
    # Everything checkable before hours of work: selectors and their parameters, the trainer's, seeds, labels, out.
    built = check_plan(selectors, trainer=trainer, seeds=seeds, out_dir=out, federation=federation)
    table = selector_table(selectors)
    source = _FederationSource(federation)
    trainer_kw = dict(trainer)
    for managed in ("selector", "checkpoint_dir", "checkpoint_every"):
        trainer_kw.pop(managed, None)
    if checkpoint_every is not None and (isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int)
                                         or checkpoint_every < 0):
        raise ValueError(f"run_comparison: checkpoint_every={checkpoint_every!r} must be None or an integer >= 0")
    from ._grid import resolve_jobs

    n_jobs = resolve_jobs(jobs, trainer_kw.get("n_threads"), ray_address=ray_address)
    batch = resolve_batch_seeds(batch_seeds, len(seeds))
    if batch > 1 and ray_address is not None:
        log(f"batch_seeds={batch_seeds!r} is ignored with ray_address: each run is a Ray task of its own")
        batch = 1
    commit = _commit()
    if command is None:
        command = [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv and sys.argv[0] else []
    command = list(command)
    histories: dict[str, dict[int, History]] = {label: {} for label in table}
    failed: dict[str, dict[int, dict[str, Any]]] = {label: {} for label in table}
    todo = []
    feds: dict[int, Any] = {}
    for seed in seeds:
        if source.kind == "factory":  # its fingerprint needs the federation; keep the last one for the first run
            feds = {seed: source.build(seed)}
            _check_clients_per_round(trainer_kw.get("clients_per_round"), feds[seed].n_clients)
        for label, spec in table.items():
            settings = run_settings(source.settings(seed), trainer_kw, spec, seed)
            key = _key(settings)
            name = settings["selector"]
            path = ckpt = None
            if out is not None:
                path = out / "runs" / f"{_slug(label)}__seed{seed}.json"
                ckpt = out / "checkpoints" / f"{_slug(label)}__seed{seed}"
            saved = _read_result(path) if path is not None else None
            if saved is not None:
                if saved.get("key") == key:
                    if saved.get("status", "finished") == "failed":
                        if not retry_failed:
                            failed[label][int(seed)] = _failure_of(saved)
                            continue
                        _remove_tree(ckpt)  # a retry starts from scratch
                    else:
                        histories[label][int(seed)] = History.from_dict(saved["history"])
                        continue
                elif not overwrite:
                    raise ValueError(
                        f"{path} holds a run of label {label!r}, seed {seed} with other settings "
                        f"({_settings_diff(saved.get('settings'), settings)}); use another output directory, or "
                        "overwrite (--overwrite on the command line, overwrite=True in run_comparison)"
                    )
                else:
                    _remove_tree(ckpt)
            todo.append((seed, label, name, key, path, ckpt, settings))
    done = sum(len(v) for v in histories.values()) + sum(len(v) for v in failed.values())
    if done:
        n_failed = sum(len(v) for v in failed.values())
        note = (f" ({n_failed} failed; rerun with retry_failed=True / --retry-failed to try them again)"
                if n_failed else "")
        log(f"resuming: {done} finished run(s) loaded{note}, {len(todo)} to run")
    grid = _Grid(source, built, trainer_kw, checkpoint_every=int(checkpoint_every or 0), overwrite=overwrite)
    parallel = None
    if todo and (ray_address is not None or n_jobs > 1):
        from . import _grid

        # Everything a worker needs, serialised once, before any training: what cannot be sent is named now.
        parallel = _grid.prepare(grid, jobs=n_jobs, ray_address=ray_address)
        feds = {}  # the workers build their own federations; do not hold the planning one meanwhile
    n_clients = 0
    bar = None
    bars = progress and bars_wanted()  # in a log file: one line per finished run instead of redrawn bars
    if bars and todo:
        from tqdm.auto import tqdm

        desc = "runs" if parallel is None else f"runs ({parallel.describe()})"
        bar = tqdm(total=len(todo), desc=desc, unit="run")
    outcomes: dict[int, _Outcome] = {}

    def finish(i: int, outcome: _Outcome) -> None:
        """Record cell ``i``'s outcome the moment it is known: its result file, its log line, the bar."""
        seed, label, name, key, path, ckpt, settings = todo[i]
        outcomes[i] = outcome
        error = outcome.error
        if error is not None:
            log(f"{label} seed {seed} failed in round {error['round']}: {error['type']}: {error['message']}")
        if path is not None:
            payload = {
                "key": key, "settings": json.loads(json.dumps(settings, default=repr)),
                "label": label, "selector": name, "seed": int(seed),
                "status": "finished" if error is None else "failed", "command": command,
                "commit": commit, "seconds": outcome.seconds,
                "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": outcome.machine,
            }
            if error is not None:
                payload["error"] = error
            payload["history"] = outcome.history.to_dict() if outcome.history is not None else None
            if outcome.diagnostics:
                payload["selector_state"] = outcome.diagnostics
            atomic_write_bytes(path, json.dumps(payload, default=repr).encode())
            Path(str(path) + ".gz").unlink(missing_ok=True)  # a compressed earlier result is superseded
            _remove_tree(ckpt)
        if bar is not None:
            bar.update(1)
        elif progress and error is None:
            h = outcome.history
            acc = h.final_accuracy()
            log(f"[{len(outcomes)}/{len(todo)}] {label} seed {seed}: {len(h)} rounds in "
                f"{outcome.seconds:.1f} s, final accuracy "
                f"{'-' if acc is None else f'{acc:.3f}'}, rounds to {target:.0%}: "
                f"{h.rounds_to_accuracy(target) or 'not reached'}")

    try:
        if parallel is not None:
            for seed, label, _name, _k, _path, ckpt, _settings in todo:
                if ckpt is not None and checkpoint_every and (ckpt / "checkpoint.pkl").exists():
                    log(f"{label} seed {seed}: continuing the interrupted run from its checkpoint")
            cells = [(label, seed, ckpt) for seed, label, _n, _k, _p, ckpt, _s in todo]
            parallel.run(cells, finish, groups=_batches(todo, batch) if batch > 1 else None)
        elif batch > 1:
            for group in _batches(todo, batch):
                seeds_g = [todo[i][0] for i in group]
                label = todo[group[0]][1]
                if len(group) == 1:  # a seed left alone: the usual run
                    seed, ckpt = seeds_g[0], todo[group[0]][5]
                    if seed not in feds:
                        feds = {seed: source.build(seed)}
                    if bar is not None:
                        bar.set_description(f"{label} seed {seed}")
                    if ckpt is not None and checkpoint_every and (ckpt / "checkpoint.pkl").exists():
                        log(f"{label} seed {seed}: continuing the interrupted run from its checkpoint")
                    finish(group[0], grid.run(label, seed, ckpt, fed=feds[seed], progress=bars))
                    continue
                if not set(seeds_g) <= set(feds):  # the next chunk of seeds: its federations, and only those
                    kept = {sd: f for sd, f in feds.items() if sd in seeds_g}
                    feds = {}
                    new = share_pools([kept[sd] if sd in kept else source.build(sd) for sd in seeds_g])
                    feds = dict(zip(seeds_g, new))
                if bar is not None:
                    bar.set_description(f"{label} seeds {', '.join(map(str, seeds_g))} (batched)")
                for i in group:
                    seed, _label, _name, _k, _path, ckpt, _settings = todo[i]
                    if ckpt is not None and checkpoint_every and (ckpt / "checkpoint.pkl").exists():
                        log(f"{label} seed {seed}: continuing the interrupted run from its checkpoint")
                grid.run_batch(label, seeds_g, [todo[i][5] for i in group], feds=[feds[sd] for sd in seeds_g],
                               finish=lambda j, outcome, group=group: finish(group[j], outcome), log=log)
        else:
            for i, (seed, label, _name, _k, _path, ckpt, _settings) in enumerate(todo):
                if seed not in feds:
                    feds = {seed: source.build(seed)}
                if bar is not None:
                    bar.set_description(f"{label} seed {seed}")
                if ckpt is not None and checkpoint_every and (ckpt / "checkpoint.pkl").exists():
                    log(f"{label} seed {seed}: continuing the interrupted run from its checkpoint")
                finish(i, grid.run(label, seed, ckpt, fed=feds[seed], progress=bars))
    finally:
        if bar is not None:
            bar.close()
    for i, (seed, label, *_rest) in enumerate(todo):  # in the order a serial run finishes them
        outcome = outcomes[i]
        n_clients = outcome.n_clients
        if outcome.error is None:
            histories[label][int(seed)] = outcome.history
        else:
            failed[label][int(seed)] = _failure_of({"error": outcome.error})
    if out is not None:
        try:
            (out / "checkpoints").rmdir()  # only when empty
        except OSError:
            pass
    if not n_clients:
        n_clients = int(source.n_clients() or 0) or max(
            (max(max(r.clients) for r in h.rounds) + 1 for runs in histories.values() for h in runs.values()
             if h.rounds),
            default=1,
        )
    return Comparison(histories, float(target), n_clients, out, dict(paper or {}), title,
                      {k: v for k, v in failed.items() if v})


def _plain_json(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain_json(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, (str, int, float)) and _plain_json(v) for k, v in value.items())
    return False


def _stable(value: Any) -> Any:
    """A trainer value as recorded in a run's key: plain JSON as it is (so existing keys stay), anything
    else by content (a function by name and code, a module by class, options and weights), never by a
    memory address that changes with every process."""
    if _plain_json(value):
        return value
    from .simulation.checkpoint import _canonical

    return _canonical(value)


def run_settings(federation: Any, trainer: Mapping[str, Any], selector: Any, seed: int) -> dict[str, Any]:
    """The settings one (scheme, seed) run of a comparison is keyed by and saved with.

    Parameters
    ----------
    federation : Any
        What identifies the seed's federation: the ``make_federation`` mapping, or for a
        Federation object ``{"federation": "Federation", "fingerprint": ...}``, or for a
        factory ``{"factory": "module:qualname", "fingerprint": ...}`` (the fingerprint of
        what it built for this seed).
    trainer : mapping
        The trainer's keyword arguments (without ``selector`` and the checkpoint options).
    selector : selector spec
        Anything :func:`selector_table` takes; a name is recorded as given with its
        parameters, a class or instance as ``module:qualname`` with its ``get_params()``.
    seed : int

    Returns
    -------
    dict
        ``federation``, ``trainer``, ``selector``, ``params``, ``seed``, and ``plugins``
        only when the run uses a plugin loaded by :func:`fedselect.plugins.load_plugin`
        (its file name, or module name, and content hash), so the keys of runs without one are unchanged.
    """
    from .plugins import as_selector_spec, user_plugins_used

    spec = as_selector_spec(selector)
    settings = {"federation": federation, "trainer": {k: _stable(v) for k, v in trainer.items()},
                **spec.settings(), "seed": int(seed)}
    # What a run uses when the mapping leaves it out: the defaults of make_federation and the trainer.
    from .data import make_federation
    from .simulation.trainer import FederatedTrainer

    dataset = (federation.get("dataset", inspect.signature(make_federation).parameters["dataset"].default)
               if isinstance(federation, Mapping) else None)
    model = trainer.get("model", FederatedTrainer().model)
    objects = tuple(o for o in (spec.cls, model) if not isinstance(o, str))
    plugins = user_plugins_used(selector=spec.name, dataset=dataset, model=model, objects=objects)
    if plugins:
        settings["plugins"] = plugins
    return settings


def _remove_tree(path: Path | None) -> None:
    if path is not None and path.exists():
        shutil.rmtree(path, ignore_errors=True)


# What a result file read back may make fedselect hold: its text, decompressed, and the number of clients it claims
# (figures are sized by it). A genuine result is far smaller (500 rounds of 5 clients: under 1 MB) and a simulation
# on one machine far fewer clients; a file beyond either is reported unusable before anything of that size exists.
MAX_RESULT_BYTES = 256 * 2**20
MAX_CLIENTS = 10_000_000
_GZIP_CHUNK = 2**20


class ResultFileError(ValueError):
    """A result file fedselect will not use: larger than :data:`MAX_RESULT_BYTES`, or not a valid result."""


def read_text(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> str:
    """A result file's text, gunzipped when its name ends in ``.gz``.

    Parameters
    ----------
    path : path
    max_bytes : int, optional
        Refuse a file whose (decompressed) text is longer; default :data:`MAX_RESULT_BYTES`.
        A ``.gz`` file is first decompressed in 1 MiB chunks that are counted and dropped, so
        a gzip bomb costs that much memory and at most ``max_bytes`` of decompression.

    Raises
    ------
    ResultFileError
        The file is larger than ``max_bytes``.
    """
    path = Path(path)
    limit = MAX_RESULT_BYTES if max_bytes is None else int(max_bytes)
    if path.suffix == ".gz":
        with gzip.open(path, "rb") as f:
            size = 0
            while chunk := f.read(_GZIP_CHUNK):
                size += len(chunk)
                if size > limit:
                    raise ResultFileError(f"more than {limit} bytes once decompressed (a gzip bomb?)")
        with gzip.open(path, "rb") as f:
            data = f.read(limit + 1)
    else:
        if path.stat().st_size > limit:
            raise ResultFileError(f"more than {limit} bytes")
        data = path.read_bytes()
    if len(data) > limit:  # the file grew between the checks
        raise ResultFileError(f"more than {limit} bytes")
    return data.decode("utf-8")


def run_files(runs_dir: str | os.PathLike[str]) -> list[Path]:
    """The result files in ``runs_dir``, plain (``*.json``) or compressed (``*.json.gz``), sorted by name."""
    runs = Path(runs_dir)
    return sorted([*runs.glob("*.json"), *runs.glob("*.json.gz")], key=lambda p: p.name)


def compress_runs(runs_dir: str | os.PathLike[str]) -> int:
    """Gzip every plain result file of ``runs_dir`` in place (``x.json`` -> ``x.json.gz``); return how many.

    Stored comparisons stay small this way; :func:`load_comparison` and a resumed
    :func:`run_comparison` read either form.
    """
    n = 0
    for path in sorted(Path(runs_dir).glob("*.json")):
        data = path.read_bytes()
        target = path.with_name(path.name + ".gz")
        atomic_write_bytes(target, gzip.compress(data, mtime=0))
        path.unlink()
        n += 1
    return n


# What reading a result file may raise besides ResultFileError: I/O, a bad gzip stream, bad UTF-8.
_READ_ERRORS = (OSError, UnicodeDecodeError, EOFError, zlib.error, ResultFileError)


def _read_result(path: Path) -> dict[str, Any] | None:
    """A run's result file (``path``, or ``path`` + ``.gz``), or None if absent; an unreadable one is moved aside."""
    if not path.exists() and Path(str(path) + ".gz").exists():
        path = Path(str(path) + ".gz")
    try:
        text = read_text(path)
    except FileNotFoundError:
        return None
    except _READ_ERRORS as exc:
        move_aside(path, f"{type(exc).__name__}: {exc}")
        return None
    saved, reason = _parse_result(text)
    if reason is None:
        return saved
    move_aside(path, reason)
    return None


def _parse_result(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """The result in ``text`` and None, or None and why it is not a usable result file."""
    if not text.strip():
        return None, "empty file"
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, over-long integers, deep nesting
        return None, f"not valid JSON, probably truncated: {type(exc).__name__}: {exc}"
    if not isinstance(d, dict) or "key" not in d or "label" not in d or "seed" not in d:
        return None, "not a fedselect result (no key, label or seed)"
    if not isinstance(d["label"], str) or not isinstance(d["seed"], int) or isinstance(d["seed"], bool):
        return None, "its label is not a string or its seed not an integer"
    if d.get("status", "finished") == "failed":
        return (d, None) if isinstance(d.get("error"), dict) else (None, "a failed run without its error")
    try:
        h = History.from_dict(d["history"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return None, f"its history cannot be read: {type(exc).__name__}: {exc}"
    problem = _history_problem(h)
    return (None, problem) if problem is not None else (d, None)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _history_problem(h: History) -> str | None:
    """Why a history read from a file cannot be used (tables and figures would fail or blow up on it), or None."""
    sections = (h.config.get(k) or {} for k in ("federation", "trainer")) if isinstance(h.config, dict) else [None]
    if not all(isinstance(v, dict) for v in sections):
        return "its config is not a mapping of the run's settings"
    n = h.config.get("n_clients")
    if n is not None and not (_is_int(n) and 1 <= n <= MAX_CLIENTS):
        return f"it claims n_clients = {n!r}; fedselect reads back at most {MAX_CLIENTS} clients"
    bound = MAX_CLIENTS if n is None else n
    if not _is_number(h.model_size) or h.model_size < 0:
        return f"its model_size {h.model_size!r} is not a non-negative number"
    for r in h.rounds:
        if not (_is_int(r.round) and isinstance(r.clients, list) and isinstance(r.failed, list)
                and all(_is_int(k) and 0 <= k < bound for k in (*r.clients, *r.failed))):
            return f"round {r.round!r} names clients outside 0 .. {bound - 1}"
        if not (isinstance(r.weights, list) and all(_is_number(w) for w in r.weights) and _is_number(r.lr)
                and all(v is None or _is_number(v) for v in (r.test_accuracy, r.test_loss, r.global_loss))
                and _is_number(r.seconds) and all(_is_number(getattr(r.costs, f.name)) for f in fields(r.costs))):
            return f"round {r.round!r} holds values that are not numbers"
    return None


def _failure_of(saved: Mapping[str, Any]) -> dict[str, Any]:
    err = dict(saved.get("error") or {})
    return {k: err.get(k) for k in ("type", "message", "round", "rounds_completed")}


def load_comparison(
    out_dir: str | os.PathLike[str],
    target: float,
    *,
    labels: Sequence[str] | None = None,
    paper: Mapping[str, str] | None = None,
    title: str = "",
) -> tuple[Comparison, list[dict[str, Any]]]:
    """Read the finished runs a comparison wrote into ``out_dir/runs``.

    Parameters
    ----------
    out_dir : path
    target : float
    labels : sequence of str, optional
        Row order (and filter); default: the labels found, sorted.
    paper : mapping, optional
    title : str

    Returns
    -------
    comparison : Comparison
    cells : list of dict
        One per (label, seed) file: label, seed, status, command, commit, seconds, finished,
        path, and ``selector_state`` when the run saved one. Failed runs are in the
        comparison's ``failed``; unreadable files are skipped with a
        :class:`~fedselect.simulation.CorruptFileWarning` naming them (left in place).
    """
    runs = Path(out_dir) / "runs"
    found: dict[str, dict[int, History]] = {}
    failed: dict[str, dict[int, dict[str, Any]]] = {}
    cells: list[dict[str, Any]] = []
    n_clients = 0
    for path in run_files(runs):
        try:
            d, problem = _parse_result(read_text(path))
        except _READ_ERRORS as exc:
            d, problem = None, f"{type(exc).__name__}: {exc}"
        if d is None:
            warnings.warn(f"{path} is unreadable ({problem}); skipped", CorruptFileWarning, stacklevel=2)
            continue
        info = {k: d.get(k) for k in ("label", "seed", "command", "commit", "seconds", "finished", "machine")}
        info["status"] = d.get("status", "finished")
        if info["status"] == "failed":
            failed.setdefault(d["label"], {})[int(d["seed"])] = _failure_of(d)
            cells.append(info | {"path": str(path), "selector_state": None})
            continue
        h = History.from_dict(d["history"])
        found.setdefault(d["label"], {})[int(d["seed"])] = h
        n_clients = max(n_clients, int(h.config.get("n_clients", 0) or 0))
        cells.append(info | {"path": str(path), "selector_state": d.get("selector_state")})
    order = list(labels) if labels is not None else sorted(set(found) | set(failed))
    histories = {label: found.get(label, {}) for label in order}
    failed = {label: failed[label] for label in order if label in failed}
    return Comparison(histories, float(target), n_clients, Path(out_dir), dict(paper or {}), title, failed), cells
