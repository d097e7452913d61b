"""Compact run records: a stored run without the per-client lists that no report reads.

A comparison stores each (scheme, seed) run as ``runs/<label>__seed<s>.json.gz``: its key,
settings, command, commit and machine, and its history, one record per round. Most of a long
run's bytes are the two per-client lists of each round, the chosen clients and their aggregation
weights (HCSFed's and OCS's unnormalised ``p_k / pi_k`` in full double precision are 83 % of a
500-round HCSFed run). :func:`compact_record` empties those two lists in every round, drops the
selector's saved state, and keeps everything else as it was:

- the key and the provenance, so the command that made the run still finds it and skips it, and
  the stored-run key test still checks it;
- every round's accuracy, losses, costs, failed clients and seconds, so every table, paired test,
  accuracy curve and cost figure computed from the run is what it was.

What the reports read from the dropped lists is kept, per run, in the record's ``"compact"`` entry:
``selection_counts`` (how often each client was chosen, :meth:`History.selection_counts`),
``chosen`` (chosen clients summed over the rounds), and ``weight_total`` (the least and the
largest total aggregation weight of a round, over the rounds that recorded weights; None if none
did). ``raw`` names the full record: the commit and path of the file in git and its blob id, so
``git show <commit>:<path>`` gives it back bit for bit.

A compact history has no clients or weights: ``History.selection_counts`` of it is zero, so a
selection-frequency picture drawn from it would be empty (the comparison folders of compact runs
keep none). Compact the runs of a comparison whose report needs no per-client data::

    python -m benchmarks.reproductions._records benchmarks/reproductions/hcsfed/calibrated \\
        --raw-dir benchmarks/results/hcsfed-calibrated --raw-commit <commit>

``--raw-dir`` is where the runs were in ``--raw-commit`` (default: where they are now); a run file
that differs from git's copy there is refused, so no full record is lost.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedselect.compare import read_text, run_files

__all__ = [
    "ACCURACY_FILE",
    "COMPACT_FORMAT",
    "compact_info",
    "compact_record",
    "compact_runs",
    "is_compact",
    "load_accuracy",
    "pack_accuracy",
    "weight_total_range",
]

COMPACT_FORMAT = 1
DROPPED = ("clients", "weights")  # per round


def is_compact(saved: Mapping[str, Any]) -> bool:
    """Whether a stored run is a compact record."""
    return isinstance(saved.get("compact"), dict)


def compact_record(saved: Mapping[str, Any], raw: Mapping[str, str]) -> dict[str, Any]:
    """A compact copy of the stored run ``saved`` (see the module's docstring).

    Parameters
    ----------
    saved : mapping
        A run file's content, finished or failed, with its ``history``.
    raw : mapping
        Where git holds the full record: ``commit``, ``path`` and ``blob``.

    Returns
    -------
    dict
        The same keys in the same order, ``selector_state`` left out, each round's ``clients`` and
        ``weights`` empty, and a last key ``compact``.

    Raises
    ------
    ValueError
        ``saved`` is compact already, or has no history.
    """
    if is_compact(saved):
        raise ValueError(f"run {saved.get('label')!r} seed {saved.get('seed')} is compact already")
    history = saved.get("history")
    if not isinstance(history, dict) or not isinstance(history.get("rounds"), list):
        raise ValueError(f"run {saved.get('label')!r} seed {saved.get('seed')} has no history to compact")
    rounds = history["rounds"]
    n_clients = int((history.get("config") or {}).get("n_clients") or 0)
    n_clients = max([n_clients, *(k + 1 for r in rounds for k in r["clients"])])
    counts = [0] * n_clients
    for r in rounds:
        for k in r["clients"]:
            counts[k] += 1
    totals = [sum(r["weights"]) for r in rounds if r["weights"]]
    out = {k: v for k, v in saved.items() if k not in ("history", "selector_state")}
    out["history"] = {**history, "rounds": [{**r, **{k: [] for k in DROPPED}} for r in rounds]}
    out["compact"] = {
        "format": COMPACT_FORMAT,
        "dropped": [f"history.rounds[].{k}" for k in DROPPED]
        + (["selector_state"] if "selector_state" in saved else []),
        "selection_counts": counts,
        "chosen": sum(counts),
        "weight_total": [min(totals), max(totals)] if totals else None,
        "raw": dict(raw),
    }
    return out


def compact_info(path: str | Path) -> dict[str, Any] | None:
    """The ``compact`` entry of the run file ``path``, or None for a full record."""
    saved = json.loads(read_text(path))
    return saved["compact"] if is_compact(saved) else None


def weight_total_range(history: Any, info: Mapping[str, Any] | None) -> tuple[float, float] | None:
    """(least, largest) total aggregation weight of a round of one run, or None if no round has weights.

    ``history`` is the run's :class:`~fedselect.simulation.History`; ``info`` its :func:`compact_info`,
    which holds the range once the weights are dropped.
    """
    if info is not None:
        total = info.get("weight_total")
        return None if total is None else (float(total[0]), float(total[1]))
    totals = [sum(r.weights) for r in history.rounds if r.weights]
    return (min(totals), max(totals)) if totals else None


def _git_blobs(commit: str, directory: str, cwd: Path) -> dict[str, str]:
    """path -> blob id of every file under ``directory`` in ``commit``."""
    out = subprocess.run(
        ["git", "ls-tree", "-r", "-z", commit, "--", directory.rstrip("/") + "/"],
        cwd=cwd,
        capture_output=True,
        check=True,
    ).stdout.decode()
    blobs = {}
    for entry in filter(None, out.split("\0")):
        meta, path = entry.split("\t", 1)
        blobs[path] = meta.split()[2]
    return blobs


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _verified(
    folder: str | Path, raw_commit: str, raw_dir: str | None
) -> tuple[Path, list[tuple[Path, dict[str, Any], dict[str, str] | None]]]:
    """Every run record under ``folder`` (``**/runs/*.json[.gz]``) with where ``raw_commit`` holds it as it is
    now (``commit``, ``path``, ``blob``; None for a compact record). Raises ValueError for a full record that is
    not in ``raw_commit`` as it is now."""
    folder = Path(folder).resolve()
    repo = Path(
        subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=folder, capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    rel = folder.relative_to(repo).as_posix()
    raw_dir = (raw_dir or rel).rstrip("/")
    # the full hash, whatever abbreviation was given: a short one can become ambiguous as the history grows
    raw_commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{raw_commit}^{{commit}}"], cwd=repo, capture_output=True, text=True,
        check=True,
    ).stdout.strip()
    blobs = _git_blobs(raw_commit, raw_dir, repo)
    out: list[tuple[Path, dict[str, Any], dict[str, str] | None]] = []
    for runs in sorted(p for p in folder.rglob("runs") if p.is_dir()):
        for path in run_files(runs):
            data = path.read_bytes()
            saved = json.loads(read_text(path))
            if is_compact(saved):
                out.append((path, saved, None))
                continue
            raw_path = f"{raw_dir}/{path.relative_to(folder).as_posix()}"
            blob = _blob_id(data)
            if blobs.get(raw_path) != blob:
                raise ValueError(
                    f"{path}: not in commit {raw_commit[:12]} as it is now (looked for {raw_path}); "
                    "its full record would be lost"
                )
            out.append((path, saved, {"commit": raw_commit, "path": raw_path, "blob": blob}))
    return folder, out


def compact_runs(folder: str | Path, *, raw_commit: str, raw_dir: str | None = None) -> tuple[int, int]:
    """Compact, in place, every full run record under ``folder`` (``**/runs/*.json[.gz]``).

    Parameters
    ----------
    folder : path
        A comparison folder, or a folder of them, inside the repository ``repo``.
    raw_commit : str
        A commit holding every full record as it is now.
    raw_dir : str, optional
        ``folder``'s path in ``raw_commit``, relative to the repository's root (default: its path now).

    Returns
    -------
    compacted, skipped : int
        Records compacted, and records left as they were (compact already).

    Raises
    ------
    ValueError
        A record is not in ``raw_commit`` as it is now (nothing is written then).
    """
    _, records = _verified(folder, raw_commit, raw_dir)
    todo = [(path, compact_record(saved, raw)) for path, saved, raw in records if raw is not None]
    for path, record in todo:
        text = json.dumps(record).encode()
        target = path if path.suffix == ".gz" else path.with_name(path.name + ".gz")
        target.write_bytes(gzip.compress(text, compresslevel=9, mtime=0))
        if target != path:
            path.unlink()
    return len(todo), len(records) - len(todo)


ACCURACY_FILE = "runs.accuracy.json.gz"


def pack_accuracy(folder: str | Path, *, raw_commit: str, raw_dir: str | None = None) -> tuple[Path, int]:
    """One file for a comparison's runs when only their accuracy curves are read (a verdict check's table).

    Writes ``folder/runs.accuracy.json.gz``: per run, the record's key and provenance (every field but the
    history and the selector's state), its history's config and model size, every round's test accuracy as
    recorded (so rounds to a target are what the full record gives), and ``raw``: the commit, path and blob
    of the full record in git. :func:`load_accuracy` reads it back as histories. The caller then removes
    ``runs/`` (``git show <raw.commit>:<raw.path>`` gives each record back).

    Returns the file and the number of runs; raises ValueError when a run is not in ``raw_commit`` as it is
    now, or is a compact record (its raw entry is then elsewhere: pack from the full records).
    """
    folder, records = _verified(folder, raw_commit, raw_dir)
    runs = []
    for path, saved, raw in records:
        if raw is None:
            raise ValueError(f"{path}: a compact record; pack the full records")
        history = saved.get("history") or {"rounds": []}
        entry = {k: v for k, v in saved.items() if k not in ("history", "selector_state")}
        entry["history_config"] = history.get("config", {})
        entry["model_size"] = history.get("model_size", 0)
        entry["accuracy"] = [r.get("test_accuracy") for r in history["rounds"]]
        entry["raw"] = raw
        runs.append(entry)
    out = folder / ACCURACY_FILE
    text = json.dumps({"format": COMPACT_FORMAT, "runs": runs}).encode()
    out.write_bytes(gzip.compress(text, compresslevel=9, mtime=0))
    return out, len(runs)


def load_accuracy(
    path: str | Path, target: float, labels: list[str] | None = None
) -> tuple[Any, list[dict[str, Any]]]:
    """The runs of a :func:`pack_accuracy` file as :func:`fedselect.compare.load_comparison` gives a folder's:
    a :class:`~fedselect.compare.Comparison` (each round with its test accuracy only; failed runs in its
    ``failed``) and every run's entry (provenance, ``status``, ``raw``)."""
    from fedselect.compare import Comparison
    from fedselect.experiments.results import failure_of
    from fedselect.simulation.history import History

    data = json.loads(read_text(path))
    found: dict[str, dict[int, Any]] = {}
    failed: dict[str, dict[int, Any]] = {}
    n_clients = 0
    for run in data["runs"]:
        if run["status"] == "failed":
            failed.setdefault(run["label"], {})[int(run["seed"])] = failure_of(run)
            continue
        rounds = [{"round": i, "clients": [], "test_accuracy": a} for i, a in enumerate(run["accuracy"])]
        h = History.from_dict({"rounds": rounds, "model_size": run["model_size"], "config": run["history_config"]})
        found.setdefault(run["label"], {})[int(run["seed"])] = h
        n_clients = max(n_clients, int(h.config.get("n_clients", 0) or 0))
    order = list(labels) if labels is not None else sorted(set(found) | set(failed))
    histories = {label: found.get(label, {}) for label in order}
    failed = {label: failed[label] for label in order if label in failed}
    return Comparison(histories, float(target), n_clients, failed=failed), data["runs"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="a comparison folder, or a folder of them")
    ap.add_argument("--raw-commit", required=True, help="a commit that holds every full record as it is now")
    ap.add_argument("--raw-dir", default=None, help="the folder's path in that commit (default: its path now)")
    ap.add_argument("--accuracy-only", action="store_true",
                    help=f"write one {ACCURACY_FILE} per comparison folder instead (pack_accuracy); runs/ stays")
    args = ap.parse_args(argv)
    if args.accuracy_only:
        out, n = pack_accuracy(args.folder, raw_commit=args.raw_commit, raw_dir=args.raw_dir)
        print(f"{out}: {n} run(s); remove {args.folder}/runs once it is committed")
        return 0
    done, skipped = compact_runs(args.folder, raw_commit=args.raw_commit, raw_dir=args.raw_dir)
    print(f"{args.folder}: {done} run(s) compacted, {skipped} compact already")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
