"""Compare selection schemes over seeds: resumable runs, a table, curves.

Every (scheme, seed) result is written to ``<out>/runs/<label>__seed<k>.json`` the moment it
finishes, together with the command and the commit that produced it and a key of its
settings. A rerun loads finished cells whose key matches and runs only the missing ones, so
a long comparison survives interruption. A cell whose settings changed is an error (use a
new output directory or ``overwrite=True``), never a silent mix.
"""

from __future__ import annotations

import hashlib
import json
import numbers
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .simulation.history import History

__all__ = ["Comparison", "check_plan", "holm", "load_comparison", "run_comparison"]


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", label).strip("-") or "run"


def check_plan(
    selectors: Mapping[str, tuple[str, Mapping[str, Any]]],
    *,
    trainer: Mapping[str, Any],
    seeds: Sequence[int],
    out_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Check everything a comparison can check before it trains anything.

    Builds every selector and checks its parameters against its declared constraints, checks
    the trainer's parameters, refuses repeated or invalid seeds and labels whose file names
    would collide, and checks that ``out_dir`` can be written (a result is written only when
    its run has finished: an unwritable directory must not cost a run).

    Returns
    -------
    built : dict
        Label -> the selector instance.

    Raises
    ------
    ValueError, TypeError, KeyError
        The first problem found, naming the label, the parameter, the seed or the path.
    """
    from ._validation import Interval, InvalidParameterError, validate_parameters
    from .plugins import get_selector
    from .simulation.trainer import FederatedTrainer

    if not selectors:
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
    slugs: dict[str, str] = {}
    for label in selectors:
        slug = _slug(label)
        if slug in slugs:
            raise ValueError(
                f"labels {slugs[slug]!r} and {label!r} would both be saved as runs/{slug}__seed<k>.json; "
                "give them distinct labels (e.g. --selectors a=NAME:... b=NAME:...)"
            )
        slugs[slug] = label
    built = {}
    for label, (name, params) in selectors.items():
        sel = get_selector(name, **dict(params))
        try:
            sel._validate_params()
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"scheme {label!r}: {exc}") from exc
        built[label] = sel
    trainer_kw = {k: v for k, v in trainer.items() if k != "selector"}
    tr = FederatedTrainer(**trainer_kw)  # unknown names: TypeError naming them
    validate_parameters(tr, trainer_kw, FederatedTrainer._parameter_constraints)
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
    """

    histories: dict[str, dict[int, History]]
    target: float
    n_clients: int
    out_dir: Path | None = None
    paper: dict[str, str] = field(default_factory=dict)
    title: str = ""

    def rows(self) -> list[dict[str, Any]]:
        """One row per scheme: rounds to target, accuracies and costs to the target."""
        out = []
        for label, runs in self.histories.items():
            hs = [runs[s] for s in sorted(runs)]
            reached = [h.rounds_to_accuracy(self.target) for h in hs]
            ok = [r for r in reached if r is not None]
            costs = [h.costs_to_accuracy(self.target) for h in hs]
            costs_ok = [(c, h) for c, h in zip(costs, hs) if c is not None]
            row = {
                "scheme": label,
                "seeds": len(hs),
                "reached": len(ok),
                "rounds_to_target": (None if len(ok) < len(hs) or not hs else float(np.mean(ok))),
                "rounds_to_target_std": (None if len(ok) < len(hs) or not hs else float(np.std(ok))),
                "rounds_to_target_each": reached,
                "final_accuracy": float(np.mean([h.final_accuracy() or 0 for h in hs])) if hs else None,
                "best_accuracy": float(np.mean([h.best_accuracy() or 0 for h in hs])) if hs else None,
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
            out.append(row)
        return out

    def to_markdown(self) -> str:
        """The table as Markdown.

        A rounds cell is N/A when any seed missed the target (followed by the mean of the
        seeds that reached it); the cost columns average the seeds that reached it.
        """
        paper = any("paper" in r for r in self.rows())
        head = ["scheme", f"rounds to {self.target:.0%}", "reached", "final acc", "best acc",
                "Mfloats to target", "models down", "losses up", "trainings", "s / run"]
        if paper:
            head.insert(2, "paper")
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in self.rows():
            hs = list(self.histories[r["scheme"]].values())
            rounds = [x for x in r["rounds_to_target_each"] if x is not None]
            if r["reached"] == r["seeds"]:
                cell = _fmt_mean_std(rounds)
            else:  # the paper's N/A, and what the seeds that did reach it took
                cell = "N/A" if not rounds else f"N/A ({len(rounds)} reached: {_fmt_mean_std(rounds)})"
            vals = [
                r["scheme"], cell, f"{r['reached']}/{r['seeds']}",
                f"{r['final_accuracy']:.3f}" if hs else "-", f"{r['best_accuracy']:.3f}" if hs else "-",
                "-" if r["mfloats_to_target"] is None else f"{r['mfloats_to_target']:.2f}",
                "-" if r["models_down_to_target"] is None else f"{r['models_down_to_target']:.0f}",
                "-" if r["scalars_up_to_target"] is None else f"{r['scalars_up_to_target']:.0f}",
                "-" if r["trainings_to_target"] is None else f"{r['trainings_to_target']:.0f}",
                "-" if r["seconds"] is None else f"{r['seconds']:.1f}",
            ]
            if paper:
                vals.insert(2, r.get("paper", "-"))
            lines.append("| " + " | ".join(vals) + " |")
        return "\n".join(lines)

    def paired(self, reference: str, *, not_reached: int | None = None) -> list[dict[str, Any]]:
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

        Returns
        -------
        rows : list of dict
            Per other scheme: ``scheme``, ``seeds`` (the seeds both have), ``diffs``
            (other - reference rounds to the target, per seed: positive means the
            reference was faster), the statistics of :func:`paired_summary`, and
            ``p_holm``: the p-value adjusted for comparing the reference with every other
            scheme at once (Holm's step-down method, see :func:`holm`).
        """
        if reference not in self.histories:
            raise KeyError(f"no scheme {reference!r} in this comparison; schemes: {list(self.histories)}")

        def rounds(h: History) -> float:
            r = h.rounds_to_accuracy(self.target)
            if r is not None:
                return float(r)
            return float(not_reached if not_reached is not None else len(h) + 1)

        ref = self.histories[reference]
        out = []
        for label, runs in self.histories.items():
            seeds = sorted(set(ref) & set(runs))
            if label == reference or not seeds:
                continue
            diffs = [rounds(runs[s]) - rounds(ref[s]) for s in seeds]
            out.append({"scheme": label, "seeds": seeds, **paired_summary(diffs)})
        for row, p in zip(out, holm([r["p"] for r in out])):
            row["p_holm"] = p
        return out

    def paired_markdown(self, reference: str, *, not_reached: int | None = None) -> str:
        """:meth:`paired` as a markdown table."""
        lines = [
            f"| scheme | seeds | scheme − {reference} (rounds, mean ± std) | median | "
            f"{reference} faster / tie / slower | p (Wilcoxon) | p (Holm) |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in self.paired(reference, not_reached=not_reached):
            lines.append(
                f"| {r['scheme']} | {len(r['seeds'])} | {r['mean']:+.1f} ± {r['std']:.1f} | {r['median']:+.1f} | "
                f"{r['faster']} / {r['ties']} / {r['slower']} | {r['p']:.3f} | {r['p_holm']:.3f} |"
            )
        return "\n".join(lines)

    def plot(self, out_dir: str | os.PathLike[str] | None = None) -> list[Path]:
        """Write accuracy.png, selection_frequency.png and communication.png; return their paths."""
        import matplotlib

        if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from .plotting import plot_accuracy, plot_communication, plot_selection_frequency

        out = Path(out_dir or self.out_dir or ".")
        out.mkdir(parents=True, exist_ok=True)
        res = {k: [v[s] for s in sorted(v)] for k, v in self.histories.items()}
        paths = []
        for name, draw in (
            ("accuracy.png", lambda ax: plot_accuracy(res, target=self.target, ax=ax, title=self.title)),
            ("selection_frequency.png", lambda ax: plot_selection_frequency(res, self.n_clients, ax=ax)),
            ("communication.png", lambda ax: plot_communication(res, self.target, ax=ax)),
        ):
            if name.startswith("selection"):
                size = (max(7.0, self.n_clients * 0.09), 1.2 + 0.45 * len(res))
            else:
                size = (7.0, 4.5)
            fig, ax = plt.subplots(figsize=size, constrained_layout=True)
            draw(ax)
            fig.savefig(out / name, dpi=120)
            plt.close(fig)
            paths.append(out / name)
        return paths

    def write(self, out_dir: str | os.PathLike[str] | None = None) -> list[Path]:
        """Write table.md, summary.json and results.csv (one row per scheme and seed)."""
        out = Path(out_dir or self.out_dir or ".")
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text(self.to_markdown() + "\n")
        (out / "summary.json").write_text(json.dumps({"target": self.target, "rows": self.rows()}, indent=2))
        lines = ["scheme,seed,rounds_to_target,final_accuracy,best_accuracy,rounds_run,floats_to_target"]
        for label, runs in self.histories.items():
            for seed in sorted(runs):
                h = runs[seed]
                c = h.costs_to_accuracy(self.target)
                lines.append(
                    f"{label},{seed},{h.rounds_to_accuracy(self.target) or ''},{h.final_accuracy()},"
                    f"{h.best_accuracy()},{len(h)},{'' if c is None else c.floats_communicated(h.model_size)}"
                )
        (out / "results.csv").write_text("\n".join(lines) + "\n")
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


def run_comparison(
    selectors: Mapping[str, tuple[str, Mapping[str, Any]]],
    *,
    federation: Mapping[str, Any],
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
) -> Comparison:
    """Run every scheme with every seed on the same federations and training streams.

    For each seed the federation is built once (``random_state=seed``) and every scheme
    trains with ``random_state=seed``, so schemes differ only in whom they choose.

    Parameters
    ----------
    selectors : mapping
        Row label -> ``(registered selector name, parameters)``.
    federation : mapping
        Keyword arguments of :func:`fedselect.data.make_federation` (with ``dataset``).
    trainer : mapping
        Keyword arguments of :class:`fedselect.FederatedTrainer` (no ``selector``).
    seeds : sequence of int
    target : float
        Accuracy for the rounds-to-target table.
    out_dir : path, optional
        Where each finished run is written at once (and read back on a rerun).
    overwrite : bool
        Re-run cells whose saved settings differ instead of raising.
    progress : bool
        Progress bars (overall and per run).
    command : sequence of str, optional
        Recorded with each run (defaults to ``sys.argv``).
    paper : mapping, optional
        Label -> the paper's figure for side-by-side tables.

    Returns
    -------
    Comparison
    """
    from .data import make_federation
    from .simulation.trainer import FederatedTrainer

    log = log or (lambda msg: print(msg, file=sys.stderr))
    out = Path(out_dir) if out_dir is not None else None
    # Everything checkable before hours of work: selectors and their parameters, the trainer's, seeds, labels, out.
    built = check_plan(selectors, trainer=trainer, seeds=seeds, out_dir=out)
    trainer_kw = dict(trainer)
    trainer_kw.pop("selector", None)
    commit = _commit()
    if command is None:
        command = [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv and sys.argv[0] else []
    command = list(command)
    histories: dict[str, dict[int, History]] = {label: {} for label in selectors}
    todo = []
    for seed in seeds:
        for label, (name, params) in selectors.items():
            key = _key({"federation": dict(federation), "trainer": trainer_kw, "selector": name,
                        "params": dict(params), "seed": int(seed)})
            path = None if out is None else out / "runs" / f"{_slug(label)}__seed{seed}.json"
            if path is not None and path.exists():
                saved = json.loads(path.read_text())
                if saved.get("key") == key:
                    histories[label][int(seed)] = History.from_dict(saved["history"])
                    continue
                if not overwrite:
                    raise ValueError(
                        f"{path} holds a run with other settings (key {saved.get('key')} != {key}); "
                        "use another output directory or overwrite=True (--overwrite)"
                    )
            todo.append((seed, label, name, key, path))
    if histories and any(histories.values()):
        done = sum(len(v) for v in histories.values())
        log(f"resuming: {done} finished run(s) loaded, {len(todo)} to run")
    n_clients = 0
    feds: dict[int, Any] = {}
    bar = None
    if progress and todo:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="runs", unit="run")
    try:
        for seed, label, name, key, path in todo:
            if seed not in feds:
                feds = {seed: make_federation(random_state=int(seed), **dict(federation))}
            fed = feds[seed]
            n_clients = fed.n_clients
            if bar is not None:
                bar.set_description(f"{label} seed {seed}")
            start = time.perf_counter()
            tr = FederatedTrainer(selector=built[label], random_state=int(seed), progress=progress, **trainer_kw)
            tr.fit(fed)
            h = tr.history_
            histories[label][int(seed)] = h
            if path is not None:
                payload = {
                    "key": key, "label": label, "selector": name, "seed": int(seed), "command": command,
                    "commit": commit, "seconds": time.perf_counter() - start,
                    "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine_info(),
                    "history": h.to_dict(),
                }
                diagnostics = _diagnostics(tr.selector_)
                if diagnostics:
                    payload["selector_state"] = diagnostics
                tmp = path.with_suffix(".json.tmp")
                tmp.write_text(json.dumps(payload, default=repr))
                os.replace(tmp, path)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    if not n_clients:
        n_clients = int(federation.get("n_clients", 0)) or max(
            (max(max(r.clients) for r in h.rounds) + 1 for runs in histories.values() for h in runs.values()),
            default=1,
        )
    return Comparison(histories, float(target), n_clients, out, dict(paper or {}), title)


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
        One per (label, seed) file: label, seed, command, commit, seconds, finished, path,
        and ``selector_state`` when the run saved one.
    """
    runs = Path(out_dir) / "runs"
    found: dict[str, dict[int, History]] = {}
    cells: list[dict[str, Any]] = []
    n_clients = 0
    for path in sorted(runs.glob("*.json")):
        d = json.loads(path.read_text())
        h = History.from_dict(d["history"])
        found.setdefault(d["label"], {})[int(d["seed"])] = h
        n_clients = max(n_clients, int(h.config.get("n_clients", 0) or 0))
        cells.append({k: d.get(k) for k in ("label", "seed", "command", "commit", "seconds", "finished", "machine")}
                     | {"path": str(path), "selector_state": d.get("selector_state")})
    order = list(labels) if labels is not None else sorted(found)
    histories = {label: found.get(label, {}) for label in order}
    return Comparison(histories, float(target), n_clients, Path(out_dir), dict(paper or {}), title), cells
