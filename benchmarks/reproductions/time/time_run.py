"""Run every built-in selector on one clocked setting, 10 seeds, and keep each run as one jsonl line.

Issue 22 item 5, redone for issue 33: rounds to a target and simulated seconds to it, side by side,
with one horizon and one over-commitment for every scheme. One setting for every scheme
(:data:`SETTING`, "our setting", not a paper's): Fashion-MNIST over 100 clients (per-class
Dirichlet(0.3) split), an MLP, 10 clients a round, 10 local steps of batch 32; each client a device
drawn by :func:`fedselect.profiles.sample_profiles` with its defaults; the clock on, the profiles not
known to the server, no deadline; the round over-commits by 1.1 for every scheme (ceil(1.1 K) asked,
the first K to finish kept: Oort's own factor, given to all). A run stops at the target or at the
time budget (:data:`TIME_BUDGET_FACTOR` x the longest calibration time to the target), the horizon
every scheme of every table shares: a run that misses is censored there. Seed s fixes the partition,
the profiles, the model's start, the minibatches and the selector's stream, so runs of one seed pair.

Tables, each a jsonl file beside this script (one line per finished run, appended as it finishes; a
rerun skips the (scheme, seed) pairs already there with the same settings, target and budget, so an
interrupted run resumes; ``all`` runs the calibration, then seed by seed every table):

- ``calibration.jsonl.gz``: random alone on seeds 100-109 (not the table's seeds), 100 rounds; the
  target is the highest accuracy on a 0.5-point grid that every calibration run reaches within the
  first 50 rounds (:func:`calibrated_target`), the same target for every scheme, and the time budget
  follows from their times to it (:func:`time_budget_of`);
- ``main.jsonl.gz``: every built-in scheme (from the plugin registry) on seeds 0-9;
- ``no-overcommit.jsonl.gz``: random, deadline-random and Oort with no over-commitment for anyone
  (what over-commitment alone buys);
- ``fedscale.jsonl.gz``: the same three with FedScale's parameter set for Oort (``variant="fedscale"``)
  and over-commitment 1.3 for every scheme;
- ``deadline.jsonl.gz``: the same three with a 10 s deadline per round (stragglers fail);
- ``deadline-known.jsonl.gz``: the same with the profiles declared to the server
  (``server_knows_profiles=True``: Oort registers each client's expected duration, as in its paper).

Each record holds the settings, the scheme and its parameters, the seed, the commit and machine, the
target and the time budget, rounds and simulated seconds to the target, the final accuracy, and per
round the simulated seconds, the seconds of the oracle questions before the training exchange, the
test accuracy and the failed clients; plus the CPU seconds the run took. Usage (one torch thread, low
priority)::

    OMP_NUM_THREADS=1 nice -n 19 python -m benchmarks.reproductions.time.time_run all \\
        > benchmarks/reproductions/time/run.log 2>&1
    python -m benchmarks.reproductions.time.time_report
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gzip
import hashlib
import json
import math
import sys
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
FORMAT = 1
#: The time budget, the horizon every scheme of every table shares: this factor x the longest simulated time a
#: calibration run of random took to the target. A run stops at the target or at the budget; a miss is censored
#: there (never at its own end).
TIME_BUDGET_FACTOR = 2.0

#: The one setting every scheme runs in (the main table).
SETTING: dict[str, Any] = {
    "table": "main",
    "dataset": "fmnist",
    "partition": "dirichlet",
    "partition_params": {"alpha": 0.3},
    "n_clients": 100,
    "holdout": 0.0,
    "model": "mlp",
    "clients_per_round": 10,
    "rounds": 1000,  # a cap only: a run ends at the target or at the time budget, the horizon every scheme shares
    "local_steps": 10,
    "batch_size": 32,
    "lr": 0.05,
    "profiles": "sample_profiles",  # its defaults, seeded by the run's seed
    "profile_params": {},
    "deadline": None,
    "server_knows_profiles": False,
    # Over-commitment is the round's, the same for every scheme: ceil(1.1 K) asked, the first K to finish kept
    # (Oort's own factor; Oort itself then runs with overcommit=1.0). 1.0: nobody over-commits.
    "overcommit": 1.1,
    "oort_variant": "oort",
    "stop_at_target": True,
    "time_budget_factor": TIME_BUDGET_FACTOR,
}

#: The deadline table: the same setting with a deadline per round; stragglers fail.
DEADLINE_SETTING: dict[str, Any] = {**SETTING, "table": "deadline", "deadline": 10.0}
DEADLINE_SCHEMES = ("random", "deadline-random", "oort")
#: The same with the devices' profiles declared to the server (Oort's registration, as in its paper's runs).
KNOWN_SETTING: dict[str, Any] = {**DEADLINE_SETTING, "table": "deadline-known", "server_knows_profiles": True}
#: What over-commitment alone buys: the same three schemes with no over-commitment for anyone.
NO_OVERCOMMIT_SETTING: dict[str, Any] = {**SETTING, "table": "no-overcommit", "overcommit": 1.0}
#: FedScale's parameter set for Oort (config_parser.py), over-commitment 1.3 for every scheme.
FEDSCALE_SETTING: dict[str, Any] = {**SETTING, "table": "fedscale", "overcommit": 1.3, "oort_variant": "fedscale"}
#: The side tables: (file name, setting), each run for DEADLINE_SCHEMES.
SIDE_TABLES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("no-overcommit.jsonl.gz", NO_OVERCOMMIT_SETTING),
    ("fedscale.jsonl.gz", FEDSCALE_SETTING),
    ("deadline.jsonl.gz", DEADLINE_SETTING),
    ("deadline-known.jsonl.gz", KNOWN_SETTING),
)

#: Calibration: random alone, on seeds the tables do not use, 100 rounds, not stopped at a target.
CALIBRATION_SETTING: dict[str, Any] = {
    **SETTING,
    "table": "calibration",
    "rounds": 100,
    "stop_at_target": False,
    "time_budget_factor": None,
}
CALIBRATION_SEEDS = tuple(range(100, 110))
SEEDS = tuple(range(10))
TARGET_GRID = 0.005  # the target is a multiple of this
TARGET_WITHIN = 0.5  # ... reached by every calibration run within this fraction of the round cap


# -------------------------------------------------------------------------- schemes


def builtin_selectors() -> list[str]:
    """Canonical names of every selector registered by fedselect's own plugins (not third parties')."""
    from fedselect import plugins

    builtin = set(plugins.DEFAULT_PLUGINS) | set(plugins.OPTIONAL_DEFAULT_PLUGINS)
    table = plugins.registry("selectors")
    return sorted({e.name for e in table.values() if e.plugin in builtin})


def scheme_params(name: str, setting: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters a scheme runs with: its defaults (the papers'), plus what the setting fixes.

    Oort's utility caps a client's sample count at what one round trains on (S = local steps x
    batch size, the paper's |B_i| reading), its own over-commitment is 1.0 (the round over-commits
    every scheme alike, ``setting["overcommit"]``) and its variant is the setting's; deadline-random
    is told the round's deadline when there is one (the server knows its own deadline), else it uses
    its default (the median of the observed durations).
    """
    if name == "oort":  # over-commitment is the round's (the setting's), for every scheme: not Oort's own
        params: dict[str, Any] = {
            "samples_per_round": int(setting["local_steps"]) * int(setting["batch_size"]),
            "overcommit": 1.0,
        }
        if setting.get("oort_variant", "oort") != "oort":
            params["variant"] = setting["oort_variant"]
        return params
    if name == "deadline-random" and setting.get("deadline") is not None:
        return {"deadline": float(setting["deadline"])}
    return {}


def overcommit_params(setting: Mapping[str, Any]) -> dict[str, Any]:
    """The trainer's parameters for the setting's over-commitment (the round's, every scheme's).

    Over 1: ``straggler_policy="overselect"`` with ``overselect`` = the factor (ceil(f K) asked, the
    first K to finish kept). 1.0: ``straggler_policy="fail"`` and ``overselect`` left at its default
    (the trainer refuses an ``overselect`` its policy would ignore).
    """
    factor = float(setting["overcommit"])
    if not factor >= 1.0:
        raise ValueError(f"time_run: overcommit must be >= 1 (nobody over-commits at 1.0), got {factor!r}")
    if factor == 1.0:
        return {"straggler_policy": "fail"}
    return {"straggler_policy": "overselect", "overselect": factor}


# -------------------------------------------------------------------------- settings and records


def setting_id(setting: Mapping[str, Any]) -> str:
    """A short digest of the settings: records of other settings are not resumed from."""
    text = json.dumps(dict(setting), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _read_text(path: Path) -> str:
    """The text of a plain or gzip file; of a ``.gz`` file of one member per record, the members
    before a torn one (a kill mid-write)."""
    data = path.read_bytes()
    if path.suffix != ".gz":
        return data.decode()
    parts = []
    while data:
        member = zlib.decompressobj(wbits=31)
        try:
            text = member.decompress(data)
        except zlib.error:
            break
        if not member.eof:
            break
        parts.append(text)
        data = member.unused_data
    return b"".join(parts).decode()


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of a jsonl file (a torn last line, from a kill mid-write, is skipped)."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for line in _read_text(path).splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and rec.get("format") == FORMAT:
            out.append(rec)
    return out


def append_record(path: str | Path, record: Mapping[str, Any]) -> None:
    """Append one record as one line (flushed and synced, so a finished run survives a kill)."""
    import os

    line = json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
    data = gzip.compress(line.encode(), mtime=0) if Path(path).suffix == ".gz" else line.encode()
    with open(path, "ab") as f:  # a .gz file: one gzip member per record
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def calibrated_target(
    records: Sequence[Mapping[str, Any]], *, rounds: int, within: float = TARGET_WITHIN, grid: float = TARGET_GRID
) -> float:
    """The highest multiple of ``grid`` every run reaches within the first ``within`` x ``rounds`` rounds.

    Parameters
    ----------
    records : sequence of mapping
        Calibration records (their ``test_accuracy`` per round).
    rounds : int
        The round cap of the table.
    within, grid : float

    Returns
    -------
    float
    """
    if not records:
        raise ValueError("calibrated_target: no calibration records")
    horizon = math.floor(within * rounds)
    best = min(max((a for a in r["test_accuracy"][:horizon] if a is not None), default=0.0) for r in records)
    return round(math.floor(best / grid + 1e-9) * grid, 6)


# -------------------------------------------------------------------------- one run


def build_federation(setting: Mapping[str, Any], seed: int) -> Any:
    """The seed's federation, with its clients' device profiles attached."""
    from fedselect import profiles as prof
    from fedselect.data import make_federation

    fed = make_federation(
        setting["dataset"],
        partition=setting["partition"],
        n_clients=int(setting["n_clients"]),
        holdout=float(setting["holdout"]),
        random_state=seed,
        **setting["partition_params"],
    )
    make = getattr(prof, setting["profiles"])
    profiles = make(fed.n_clients, random_state=seed, **setting["profile_params"])
    return dataclasses.replace(fed, profiles=profiles)


@contextlib.contextmanager
def timing_split() -> Iterator[list[tuple[float, float]]]:
    """Record, per clocked round, (seconds of its oracle questions, its simulated seconds).

    The clock times a round as its questions (each an exchange) followed by the training
    exchange (:meth:`fedselect.clock.RoundClock.settle`); the round's elapsed time just before
    ``settle`` is what its questions took. The records carry only the total, so this wraps the
    two clock methods for the duration of the block (and restores them).
    """
    from fedselect.clock import RoundClock, SimulatedClock

    out: list[tuple[float, float]] = []
    settle, end_round = RoundClock.settle, SimulatedClock.end_round

    def settle_timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        self._questions_elapsed = self.elapsed
        return settle(self, *args, **kwargs)

    def end_round_timed(self: Any, rc: Any) -> tuple[float, float]:
        seconds, now = end_round(self, rc)
        out.append((float(getattr(rc, "_questions_elapsed", seconds)), float(seconds)))
        return seconds, now

    RoundClock.settle, SimulatedClock.end_round = settle_timed, end_round_timed  # type: ignore[method-assign]
    try:
        yield out
    finally:
        RoundClock.settle, SimulatedClock.end_round = settle, end_round  # type: ignore[method-assign]


def _plain(value: Any) -> Any:
    """JSON-ready parameters (profiles and other objects by their repr)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return repr(value)


_PROCESS: dict[str, Any] = {}


def process_provenance() -> dict[str, Any]:
    """The commit, machine and start time of this process, taken once, at its first run.

    The commit is read when the process starts, not when a run ends: the code a run uses is
    what the process imported at its start, and the repository may move on while it runs.
    """
    if not _PROCESS:
        from fedselect.experiments.provenance import commit, machine_info

        _PROCESS.update(commit=commit(), machine=machine_info(), started=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    return dict(_PROCESS)


def run_cell(
    setting: Mapping[str, Any],
    scheme: str,
    seed: int,
    *,
    target: float | None,
    fed: Any = None,
    time_budget: float | None = None,
) -> dict[str, Any]:
    """Train ``scheme`` on ``setting`` with ``seed`` and return its record (see the module's docstring).

    A run that raises (e.g. a ``DivergenceError``) gives a record with ``error`` set and what
    finished of its history; it counts as not reaching the target.
    """
    import torch

    from fedselect import FederatedTrainer, get_selector

    torch.set_num_threads(1)
    if fed is None:
        fed = build_federation(setting, seed)
    params = scheme_params(scheme, setting)
    trainer = FederatedTrainer(
        selector=get_selector(scheme, **params),
        model=setting["model"],
        clients_per_round=int(setting["clients_per_round"]),
        rounds=int(setting["rounds"]),
        local_steps=int(setting["local_steps"]),
        batch_size=int(setting["batch_size"]),
        lr=float(setting["lr"]),
        stop_at_target=bool(setting["stop_at_target"]) and target is not None,
        target_accuracy=0.8 if target is None else float(target),
        time_budget=time_budget,
        random_state=int(seed),
        n_threads=1,
        clock=True,
        deadline=setting["deadline"],
        **overcommit_params(setting),
        server_knows_profiles=bool(setting["server_knows_profiles"]),
    )
    cpu0, wall0 = time.process_time(), time.perf_counter()
    error = None
    rounds: list[Any] = []
    with timing_split() as split:
        records: list[Any] = []
        trainer.set_params(callback=lambda _t, rec: records.append(rec))
        try:
            trainer.fit(fed)
        except Exception as exc:  # a failed run is a result: recorded, not retried
            error = f"{type(exc).__name__}: {exc}"
        rounds = records
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    acc = [None if r.test_accuracy is None else round(float(r.test_accuracy), 5) for r in rounds]
    sim = [round(float(r.sim_seconds), 4) for r in rounds]
    questions = [round(q, 4) for q, _ in split[: len(rounds)]]
    sim_time = [float(r.sim_time) for r in rounds]
    reached = None if target is None else next((i for i, a in enumerate(acc) if a is not None and a >= target), None)
    total = float(sum(s for _, s in split[: len(rounds)]))
    selector_params = _plain(get_selector(scheme, **params).get_params(deep=False))
    return {
        "format": FORMAT,
        "table": setting["table"],
        "setting_id": setting_id(setting),
        "setting": dict(setting),
        "scheme": scheme,
        "params": selector_params,
        "seed": int(seed),
        **process_provenance(),
        "target": target,
        "time_budget": time_budget,
        "rounds_to_target": None if reached is None else reached + 1,
        "time_to_target": None if reached is None else round(sim_time[reached], 4),
        "final_accuracy": acc[-1] if acc else None,
        "rounds_run": len(rounds),
        "sim_total": round(sim_time[-1], 4) if sim_time else 0.0,
        "question_share": round(sum(q for q, _ in split[: len(rounds)]) / total, 6) if total > 0 else None,
        "test_accuracy": acc,
        "sim_seconds": sim,
        "question_seconds": questions,
        "failed": [len(r.failed) for r in rounds],
        "cpu_seconds": round(cpu, 2),
        "wall_seconds": round(wall, 2),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "error": error,
    }


# -------------------------------------------------------------------------- a table


def run_table(
    setting: Mapping[str, Any],
    schemes: Sequence[str],
    seeds: Sequence[int],
    path: str | Path,
    *,
    target: float | None,
    time_budget: float | None = None,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Run every (scheme, seed) not yet in ``path`` with these settings, seed by seed; return all its records.

    Seed-major order: an interrupted table has every scheme on its first seeds, which pair up.
    """
    process_provenance()  # before the first run imports anything else
    sid = setting_id(setting)
    done = {
        (r["scheme"], r["seed"])
        for r in read_records(path)
        if r.get("setting_id") == sid and r.get("time_budget") == time_budget and r.get("target") == target
    }
    todo = [(s, k) for s in seeds for k in schemes if (k, s) not in done]
    log(f"[{setting['table']}] {len(done)} finished, {len(todo)} to run -> {path}")
    fed_seed, fed = None, None
    for i, (seed, scheme) in enumerate(todo):
        if fed_seed != seed:
            fed, fed_seed = build_federation(setting, seed), seed
        rec = run_cell(setting, scheme, seed, target=target, fed=fed, time_budget=time_budget)
        append_record(path, rec)
        tt = rec["time_to_target"]
        log(
            f"[{setting['table']}] {i + 1}/{len(todo)} {scheme} seed {seed}: "
            f"rounds to target {rec['rounds_to_target']}, "
            f"time {'-' if tt is None else f'{tt:.0f} s'}, final acc {rec['final_accuracy']}, "
            f"question share {rec['question_share']}, cpu {rec['cpu_seconds']:.1f} s"
            + (f", ERROR {rec['error']}" if rec["error"] else "")
        )
    return [
        r
        for r in read_records(path)
        if r.get("setting_id") == sid and r.get("time_budget") == time_budget and r.get("target") == target
    ]


def time_budget_of(records: Sequence[Mapping[str, Any]], target: float, factor: float = TIME_BUDGET_FACTOR) -> float:
    """``factor`` x the longest simulated time a calibration run took to ``target`` (every one reaches it)."""
    times = []
    for r in records:
        hit = next((i for i, a in enumerate(r["test_accuracy"]) if a is not None and a >= target), None)
        if hit is None:
            raise ValueError(f"calibration run seed {r['seed']} never reached the target {target}")
        times.append(sum(r["sim_seconds"][: hit + 1]))
    return round(factor * max(times), 1)


def calibrate(
    path: str | Path = ROOT / "calibration.jsonl.gz",
    *,
    setting: Mapping[str, Any] = CALIBRATION_SETTING,
    seeds: Sequence[int] = CALIBRATION_SEEDS,
    log: Callable[[str], None] = print,
) -> float:
    """Run (or resume) random's calibration runs and return the target they give."""
    records = run_table(setting, ["random"], seeds, path, target=None, log=log)
    target = calibrated_target(records, rounds=int(setting["rounds"]))
    log(
        f"[calibration] target {target:.3f}: every random run of seeds {list(seeds)} reaches it within "
        f"{int(TARGET_WITHIN * setting['rounds'])} rounds"
    )
    return target


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b) + 1) if b else [int(a)])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "what",
        choices=("calibrate", "main", *(setting["table"] for _, setting in SIDE_TABLES), "side", "all"),
        help="which table to run (side: every side table seed by seed; all: the calibration, then every table "
        "seed by seed)",
    )
    parser.add_argument("--seeds", type=_seeds, default=list(SEEDS), help="e.g. 0-9 or 0,3,5 (default 0-9)")
    parser.add_argument("--schemes", default=None, help="comma-separated (default: every built-in selector)")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)

    def log(text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)

    target = calibrate(log=log)
    calibration = [
        r for r in read_records(ROOT / "calibration.jsonl.gz") if r.get("setting_id") == setting_id(CALIBRATION_SETTING)
    ]
    budget = time_budget_of(calibration, target)
    log(
        f"[calibration] time budget {budget:.1f} s: {TIME_BUDGET_FACTOR:g} x the longest calibration time to the target"
    )
    main_schemes = args.schemes.split(",") if args.schemes else builtin_selectors()
    side_schemes = args.schemes.split(",") if args.schemes else list(DEADLINE_SCHEMES)
    for seed in args.seeds:  # seed by seed, every table: an interrupted run leaves whole seeds of each
        if args.what in ("main", "all"):
            run_table(SETTING, main_schemes, [seed], ROOT / "main.jsonl.gz", target=target, time_budget=budget, log=log)
        for name, setting in SIDE_TABLES:
            if args.what in (setting["table"], "side", "all"):
                run_table(setting, side_schemes, [seed], ROOT / name, target=target, time_budget=budget, log=log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
