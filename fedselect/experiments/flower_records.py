"""A Flower run's records into the comparison tools: the same table, pictures and paired statistics as a comparison.

:class:`fedselect.flower.SelectorStrategy` writes, with ``start(records_path=...)``, one JSON line per
round as it ends (:meth:`fedselect.flower.FlowerRound.to_dict`): the chosen, reporting, failed and
rejected clients, the weights, the costs, the bytes on the wire, the measured seconds and
``evaluation``, the metrics of the centralised evaluation ``start(evaluate_fn=...)`` ran after the
round. A round's test accuracy is ``evaluation["test-accuracy"]`` (else ``"accuracy"``) and its test
loss ``evaluation["test-loss"]`` (else ``"loss"``), the names the strategy reads; a federated
evaluation (the inner strategy's ``evaluate``) is not in the records. A run without a centralised
accuracy cannot be compared, and is refused rather than read as Nones.

Which scheme and seed a file holds: the lines carry neither, so a folder's files are named as a
comparison names its run files, ``<scheme>__seed<k>.jsonl`` (``random__seed0.jsonl``,
``oort__seed3.jsonl``); one file may be given with its ``label`` and ``seed``, and a mapping
``{scheme: {seed: path}}`` names them all.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..round.record import History, RoundRecord
from .result_files import _READ_ERRORS, MAX_CLIENTS, _history_problem, read_text
from .results import Comparison

__all__ = ["FlowerRecordsError", "load_flower_records", "read_flower_records", "write_report"]

RECORDS_NAME = re.compile(r"^(?P<label>.+)__seed(?P<seed>\d+)\.jsonl$")
"""How a folder's records files are named: ``<scheme>__seed<k>.jsonl``."""

_REQUIRED = frozenset(
    {"round", "clients", "reported", "failed", "weights", "costs", "traffic", "seconds", "rejected", "errors"}
)
_OPTIONAL = frozenset({"evaluation", "wall_seconds", "reply_seconds"})


class FlowerRecordsError(ValueError):
    """A records file that is not one Flower run's records, or holds no test accuracy; the message names it."""


def _metric(evaluation: Mapping[str, Any], *names: str) -> float | None:
    for name in names:
        if name in evaluation:
            return evaluation[name]
    return None


def read_flower_records(path: str | os.PathLike[str], *, model_size: int = 0) -> History:
    """One Flower run's ``records_path`` file as a :class:`~fedselect.simulation.History`.

    Parameters
    ----------
    path : path
        A JSON-lines file written by ``SelectorStrategy.start(records_path=...)`` (``.gz`` read too).
    model_size : int, default 0
        D, the floats in one model, for the communication columns (the records count models, not
        floats); 0 leaves floats to the scalars alone.

    Returns
    -------
    History
        One round per line, rounds 0 .. T-1, ``test_accuracy``/``test_loss`` from each round's
        centralised evaluation (None in a round it did not evaluate), no simulated clock.

    Raises
    ------
    FlowerRecordsError
        Naming the file (and the line): not JSON lines, a line that is not a round's record,
        rounds that do not run 0, 1, 2, ... (two runs appended to one file), an accuracy that
        is not a number in [0, 1], or no round with a test accuracy at all.
    """
    path = Path(path)
    try:
        text = read_text(path)
    except (*_READ_ERRORS, UnicodeDecodeError) as exc:
        raise FlowerRecordsError(f"{path}: cannot be read ({type(exc).__name__}: {exc})") from exc
    rounds: list[RoundRecord] = []
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {i}"
        try:
            d = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise FlowerRecordsError(f"{where}: not JSON ({type(exc).__name__}: {exc})") from exc
        if not isinstance(d, dict) or not _REQUIRED <= set(d) or set(d) - _REQUIRED - _OPTIONAL:
            keys = sorted(d) if isinstance(d, dict) else type(d).__name__
            raise FlowerRecordsError(
                f"{where}: not a round of SelectorStrategy's records (keys {keys}; expected {sorted(_REQUIRED)} "
                f"and optionally {sorted(_OPTIONAL)})"
            )
        evaluation = d.get("evaluation", {})
        if not isinstance(evaluation, dict):
            raise FlowerRecordsError(f"{where}: 'evaluation' is not a mapping of metric names to numbers")
        acc = _metric(evaluation, "test-accuracy", "accuracy")
        loss = _metric(evaluation, "test-loss", "loss")
        if acc is not None and not (isinstance(acc, int | float) and not isinstance(acc, bool) and 0 <= acc <= 1):
            raise FlowerRecordsError(f"{where}: the test accuracy {acc!r:.40} is not a number in [0, 1]")
        if loss is not None and not (isinstance(loss, int | float) and not isinstance(loss, bool)):
            raise FlowerRecordsError(f"{where}: the test loss {loss!r:.40} is not a number")
        if d["round"] != len(rounds):
            raise FlowerRecordsError(
                f"{where}: round {d['round']!r} where round {len(rounds)} was due; one run's records start at "
                "round 0 and run on one by one (were two runs appended to one file?)"
            )
        try:
            rec = RoundRecord.from_dict(d)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise FlowerRecordsError(f"{where}: cannot be read as a round ({type(exc).__name__}: {exc})") from exc
        rec.test_accuracy = None if acc is None else float(acc)
        rec.test_loss = None if loss is None or not math.isfinite(loss) else float(loss)
        rounds.append(rec)
    if not rounds:
        raise FlowerRecordsError(f"{path}: holds no round")
    if all(r.test_accuracy is None for r in rounds):
        raise FlowerRecordsError(
            f"{path}: no round holds a test accuracy; the records carry the centralised evaluation of "
            "SelectorStrategy.start(evaluate_fn=...) ('test-accuracy' or 'accuracy' in its metrics), and this run "
            "had none (a federated evaluation is not recorded): rerun with evaluate_fn"
        )
    highest = max((k for r in rounds for k in (*r.clients, *r.failed, *(r.reported or []))), default=-1)
    if highest >= MAX_CLIENTS:
        raise FlowerRecordsError(f"{path}: names client {highest}; fedselect reads back at most {MAX_CLIENTS}")
    h = History(rounds, model_size=int(model_size), config={"n_clients": highest + 1, "records": str(path)})
    problem = _history_problem(h)
    if problem is not None:
        raise FlowerRecordsError(f"{path}: {problem}")
    return h


def _labelled(source: Any, label: str | None, seed: int | None) -> dict[str, dict[int, Path]]:
    """{label: {seed: path}} for a file, a folder or a mapping."""
    if isinstance(source, Mapping):
        return {str(lab): {int(s): Path(p) for s, p in seeds.items()} for lab, seeds in source.items()}
    path = Path(source)
    if path.is_dir():
        if label is not None or seed is not None:
            raise ValueError(f"load_flower_records: {path} is a folder; its files' names give label and seed")
        files = sorted(p for p in path.iterdir() if p.name.endswith((".jsonl", ".jsonl.gz")))
        if not files:
            raise FlowerRecordsError(f"{path}: no records files (*.jsonl) in this folder")
        out: dict[str, dict[int, Path]] = {}
        for p in files:
            m = RECORDS_NAME.match(p.name.removesuffix(".gz"))
            if m is None:
                raise FlowerRecordsError(
                    f"{p}: a records file in a folder is named <scheme>__seed<k>.jsonl (e.g. random__seed0.jsonl)"
                )
            out.setdefault(m["label"], {})[int(m["seed"])] = p
        return out
    if not path.is_file():
        raise FlowerRecordsError(f"{path}: no such file or folder")
    m = RECORDS_NAME.match(path.name.removesuffix(".gz"))
    name = label if label is not None else (m["label"] if m else path.name.split(".")[0])
    return {name: {int(seed) if seed is not None else (int(m["seed"]) if m else 0): path}}


def load_flower_records(
    source: str | os.PathLike[str] | Mapping[str, Mapping[int, str | os.PathLike[str]]],
    target: float,
    *,
    label: str | None = None,
    seed: int | None = None,
    model_size: int = 0,
    n_clients: int | None = None,
    title: str = "",
) -> Comparison:
    """A :class:`~fedselect.experiments.results.Comparison` of Flower runs from their records files.

    Parameters
    ----------
    source : path or mapping
        One records file; a folder of ``<scheme>__seed<k>.jsonl`` files; or ``{scheme: {seed: path}}``.
    target : float
        The test accuracy the table's rounds-to-target count to.
    label, seed : optional
        For one file: its scheme and seed (default: from its name if it follows the convention,
        else the name before its first dot, and seed 0).
    model_size : int, default 0
        D, for the communication columns (see :func:`read_flower_records`).
    n_clients : int, optional
        N, for the selection-frequency picture; default: the highest client id named plus one.
    title : str

    Returns
    -------
    Comparison
        Its :meth:`~fedselect.experiments.results.Comparison.to_markdown`, ``paired_report`` and
        :func:`write_report` give what ``fedselect compare`` gives. The runs keep no simulated
        clock, so there are no time columns.

    Raises
    ------
    FlowerRecordsError
        A file it cannot read (see :func:`read_flower_records`), or a folder without records.
    """
    labelled = _labelled(source, label, seed)
    histories = {
        lab: {s: read_flower_records(p, model_size=model_size) for s, p in sorted(seeds.items())}
        for lab, seeds in sorted(labelled.items())
    }
    seen = max(int(h.config["n_clients"]) for runs in histories.values() for h in runs.values())
    n = seen if n_clients is None else int(n_clients)
    if n < seen:
        raise ValueError(f"load_flower_records: n_clients={n_clients} but the records name client {seen - 1}")
    return Comparison(histories, float(target), n, None, {}, title)


def write_report(
    comparison: Comparison, out_dir: str | os.PathLike[str], *, paired: str | None = "random"
) -> list[Path]:
    """Write what ``fedselect compare`` writes: table.md, summary.json, results.csv, the pictures and paired.md.

    ``paired``: the scheme the others are paired against by seed (paired.md is written when it is
    one of the comparison's schemes and there is another); None: no paired.md. Returns the paths.
    """
    out = Path(out_dir)
    files = comparison.write(out) + comparison.plot(out)
    if paired is not None and paired in comparison.histories and len(comparison.histories) > 1:
        (out / "paired.md").write_text(comparison.paired_report(paired))
        files.append(out / "paired.md")
    return files
