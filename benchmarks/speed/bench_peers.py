"""Seconds per FedAvg round: fedselect beside FLGo 0.4.4 and FedLab 1.3.0, and the compute bound.

Issue 34's job, made the same arithmetic in each framework: Fashion-MNIST (the IDX files that
``fedselect.data`` reads), 100 clients holding 2 label shards each (600 samples), 10 clients a round
drawn uniformly without replacement, an MLP 784-200-200-10, plain SGD (lr 0.05, no momentum, no
weight decay), minibatches of 50, one local epoch (12 steps), the mean of the clients' models (every
client holds 600 samples, so the mean is also FedAvg's size-weighted mean; every framework is set
to the uniform mean), one torch thread everywhere (``torch.set_num_threads(1)``, ``OMP/MKL/OPENBLAS
_NUM_THREADS=1``), no evaluation inside the timed rounds. The ``cnn`` job is the same federation
shape with FedCor's CIFAR-10 CNN (conv3x3(32)-pool-conv3x3(64)-pool-conv3x3(64), fc 64, fc 10) on
CIFAR-shaped synthetic data (50,000 uniform 3x32x32 images, 10 balanced classes, 500 per client).
Every framework trains fedselect's own ``FedCorMLP`` / ``FedCorCNN`` (the peers' drivers read them from
``fedselect/simulation/models.py``, which imports only torch).

Each framework runs in a process of its own, one driver script per framework under ``peers/``
(``run_fedselect.py``: ``FederatedTrainer(selector="random", n_threads=1)``; ``run_flgo.py``: FLGo's
``fedavg`` runner; ``run_fedlab.py``: FedLab's ``SyncServerHandler`` + ``SGDSerialClientTrainer``;
``run_bound.py``: the compute bound, the same SGD steps as plain torch autograd on per-client tensors
in a tight loop, the least any framework can do). Every driver reads one job file (the pool, the
index sets, the settings) written once here, builds its federation untimed, plays one warm-up round
and ``--rounds`` timed rounds and reports each round's wall time; a driver's figure is the median of
its rounds. One repeat runs fedselect, FLGo, FedLab and the bound in turn; ``--repeats`` repeats
alternate them, so machine noise hits each alike. The table gives each framework's median over the
repeats, the paired ratio peer / fedselect (the median of the per-repeat ratios; the issue's goal:
at least 1.5 on both jobs) and fedselect / bound (goal: at most 1.3), of wall time (the record, on an
idle machine) and of each driver process's own CPU time (``time.process_time``: on a busy machine,
the part that did not wait for a core; cache and memory contention still count).

The peers live in virtual environments of their own, outside the repository, made by
``benchmarks/speed/peers/setup_peers.sh [DIR]`` (``DIR`` defaults to ``$FEDSELECT_PEERS``, else
``~/.cache/fedselect-peers``; give the same ``--peers DIR`` here). A peer whose environment is
missing or does not import is skipped, with the reason printed.

Usage::

    benchmarks/speed/peers/setup_peers.sh                                   # once
    python -m benchmarks.speed.bench_peers [--repeats 5] [--rounds 5] [--jobs mlp cnn] [--out]

``--out`` writes the report to ``benchmarks/speed/bench_peers.txt``; ``--profile`` prints where
fedselect's round of the first of ``--jobs`` (the MLP's by default, ``--jobs cnn`` the CNN's) spends its
time (cProfile on CPU time, and ``torch.profiler``'s operators with ``--shapes``; one thread). What that profile found,
and what it suggests for the hot path, is in ``bench_peers.md`` beside this script.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
DRIVERS = HERE / "peers"
REPO = HERE.parents[1]
PEERS = ("flgo", "fedlab")
PEER_MODULES = {"flgo": "flgo.algorithm.fedavg", "fedlab": "fedlab.contrib.algorithm"}  # what the drivers import
ORDER = ("fedselect", "flgo", "fedlab", "bound")
RESULT_PREFIX = "BENCH_PEERS_RESULT "
SETTINGS = {"clients_per_round": 10, "lr": 0.05, "batch_size": 50, "epochs": 1, "n_classes": 10}
JOBS: dict[str, dict[str, Any]] = {
    "mlp": {"model": "mlp", "hidden": [200, 200], "dataset": "fmnist"},
    "cnn": {"model": "cnn", "hidden": [], "dataset": "synthetic-cifar"},
}


def default_peers_dir() -> Path:
    """Where ``setup_peers.sh`` puts the peers' environments: ``$FEDSELECT_PEERS`` or ``~/.cache/fedselect-peers``."""
    return Path(os.environ.get("FEDSELECT_PEERS") or Path.home() / ".cache" / "fedselect-peers")


def find_peers(peers_dir: Path, names: tuple[str, ...] = PEERS) -> tuple[dict[str, str], dict[str, str]]:
    """The peers whose environment imports (name -> python) and the others (name -> why it is skipped)."""
    found, skipped = {}, {}
    for name in names:
        python = peers_dir / name / "bin" / "python"
        if not python.exists():
            skipped[name] = f"no environment at {peers_dir / name} (run benchmarks/speed/peers/setup_peers.sh)"
            continue
        module = PEER_MODULES.get(name, name)
        check = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, text=True, env=_env(None))
        if check.returncode:
            last = (check.stderr.strip().splitlines() or ["no message"])[-1]
            skipped[name] = f"`import {module}` fails in {peers_dir / name}: {last}"
        else:
            found[name] = str(python)
    return found, skipped


def write_job(job: str, work: Path, *, n_clients: int, cnn_samples: int, dataset: str | None, seed: int) -> Path:
    """Write the job's pool, index sets and settings under ``work``; returns the job file."""
    from fedselect.data import make_federation
    from fedselect.data.partition import shard_partition

    spec = dict(JOBS[job], **SETTINGS, seed=seed)
    if dataset is not None and job == "mlp":
        spec["dataset"] = dataset
    if spec["dataset"] == "synthetic-cifar":
        rng = np.random.default_rng(seed)
        X = rng.integers(0, 256, size=(cnn_samples, 3, 32, 32), dtype=np.uint8)
        y = np.arange(cnn_samples) % spec["n_classes"]
        parts = shard_partition(y, n_clients, shards_per_client=2, random_state=seed)
    else:
        fed = make_federation(
            spec["dataset"], partition="shards", shards_per_client=2, n_clients=n_clients, random_state=seed
        )
        X, y, parts, spec["n_classes"] = fed.X, fed.y, fed.client_indices, int(fed.n_classes)
    m = min(len(p) for p in parts)  # equal shares, so the mean is FedAvg's weighted mean in every framework
    spec["input_shape"] = list(X.shape[1:])
    spec["data"] = str(work / f"{job}.npz")
    np.savez(spec["data"], X=X, y=y, client_indices=np.stack([np.asarray(p[:m], dtype=np.int64) for p in parts]))
    path = work / f"{job}.json"
    path.write_text(json.dumps(spec))
    return path


def _env(pythonpath: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def run_driver(framework: str, python: str, job_file: Path, timeout: float = 1800) -> dict[str, list[float]]:
    """Run one framework's driver on a job in its own process; the wall and CPU seconds of its timed rounds."""
    script = DRIVERS / f"run_{framework}.py"
    pythonpath = str(REPO) if framework in ("fedselect", "bound") else None
    out = subprocess.run(
        [python, str(script), str(job_file)], capture_output=True, text=True, env=_env(pythonpath), timeout=timeout
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if out.returncode or not lines:
        tail = "\n".join((out.stderr or out.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"bench_peers: the {framework} driver failed (exit {out.returncode}):\n{tail}")
    result = json.loads(lines[-1][len(RESULT_PREFIX) :])
    return {key: [float(s) for s in result[key]] for key in ("seconds", "cpu_seconds")}


def compare(job_file: Path, pythons: dict[str, str], repeats: int) -> dict[str, Any]:
    """Alternate the frameworks ``repeats`` times on one job; medians and paired ratios, of wall and of CPU time."""
    frameworks = [fw for fw in ORDER if fw in pythons]
    per_repeat: dict[str, dict[str, list[float]]] = {key: {fw: [] for fw in frameworks} for key in ("wall", "cpu")}
    for _ in range(repeats):
        for fw in frameworks:
            timing = run_driver(fw, pythons[fw], job_file)
            per_repeat["wall"][fw].append(statistics.median(timing["seconds"]))
            per_repeat["cpu"][fw].append(statistics.median(timing["cpu_seconds"]))
    out: dict[str, Any] = {"seconds": per_repeat["wall"], "cpu_seconds": per_repeat["cpu"]}
    for key, name in (("wall", ""), ("cpu", "cpu_")):
        base = per_repeat[key]["fedselect"]
        out[f"{name}median"] = {fw: statistics.median(v) for fw, v in per_repeat[key].items()}
        out[f"{name}ratio"] = {
            fw: statistics.median(a / b for a, b in zip(v, base))
            for fw, v in per_repeat[key].items()
            if fw != "fedselect"
        }
    return out


def run_benchmark(
    *,
    jobs: tuple[str, ...] = ("mlp", "cnn"),
    repeats: int = 5,
    rounds: int = 5,
    peers_dir: Path | None = None,
    peers: tuple[str, ...] = PEERS,
    n_clients: int = 100,
    clients_per_round: int = 10,
    cnn_samples: int = 50_000,
    dataset: str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Measure every job; returns the found and skipped peers and, per job, seconds, medians and ratios."""
    if repeats < 1 or rounds < 1:
        raise ValueError(f"bench_peers: repeats={repeats} and rounds={rounds} must be at least 1")
    found, skipped = find_peers(peers_dir or default_peers_dir(), peers)
    pythons = dict(found, fedselect=sys.executable, bound=sys.executable)
    report: dict[str, Any] = {"found": found, "skipped": skipped, "jobs": {}, "rounds": rounds, "repeats": repeats}
    with tempfile.TemporaryDirectory(prefix="bench_peers_") as tmp:
        for job in jobs:
            path = write_job(job, Path(tmp), n_clients=n_clients, cnn_samples=cnn_samples, dataset=dataset, seed=seed)
            spec = json.loads(path.read_text())
            spec.update(warmup=1, rounds=rounds, clients_per_round=clients_per_round)
            path.write_text(json.dumps(spec))
            report["jobs"][job] = dict(compare(path, pythons, repeats), input_shape=spec["input_shape"])
    return report


def format_report(report: dict[str, Any], header: list[str]) -> str:
    """The text table of ``run_benchmark``'s report."""
    lines = list(header)
    lines.append("peers found: " + (", ".join(f"{k} ({v})" for k, v in report["found"].items()) or "none"))
    for name, why in report["skipped"].items():
        lines.append(f"peer skipped: {name}: {why}")
    lines.append(
        f"per driver: 1 warm-up + {report['rounds']} timed rounds, median; {report['repeats']} alternating repeats "
        "(fedselect, flgo, fedlab, bound); ratios: median of per-repeat ratios; CPU: the driver process's own "
        "CPU time (time.process_time), which leaves out waiting for a core on a busy machine"
    )
    lines += [
        "",
        "| job | framework | s/round median | per repeat | x fedselect | fedselect / it "
        "| CPU s/round | x fedselect (CPU) | fedselect / it (CPU) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for job, res in report["jobs"].items():
        for fw, med in res["median"].items():
            cells = [f"{med:.4f}", " ".join(f"{s:.4f}" for s in res["seconds"][fw])]
            for name in ("", "cpu_"):
                r = res[f"{name}ratio"].get(fw, 1.0)
                cells += [f"{r:.2f}", "" if fw == "fedselect" else f"{1 / r:.2f}"]
            cells.insert(4, f"{res['cpu_median'][fw]:.4f}")
            lines.append(f"| {job} | {fw} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _header(argv: list[str]) -> list[str]:
    import torch

    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return [
        "$ python -m benchmarks.speed.bench_peers " + " ".join(shlex.quote(a) for a in argv),
        f"commit {commit.stdout.strip() or 'unknown'}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, python {platform.python_version()}, torch {torch.__version__}",
    ]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per driver run, after one warm-up round")
    ap.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    ap.add_argument(
        "--peers", type=Path, default=None, help=f"the peers' environments (default: {default_peers_dir()})"
    )
    ap.add_argument("--out", nargs="?", const=HERE / "bench_peers.txt", default=None, type=Path)
    ap.add_argument("--profile", action="store_true", help="profile fedselect's round of --jobs' first job instead")
    ap.add_argument("--shapes", action="store_true", help="with --profile: one row per operator and input shapes")
    args = ap.parse_args(argv)
    if args.profile:
        from benchmarks.speed.peers.profile_fedselect import main as profile

        profile(rounds=args.rounds, shapes=args.shapes, job=args.jobs[0])
        return
    start, started = os.getloadavg(), time.perf_counter()
    report = run_benchmark(jobs=tuple(args.jobs), repeats=args.repeats, rounds=args.rounds, peers_dir=args.peers)
    header = _header(argv)
    header.append("load average (1, 5, 15 min) at start " + " ".join(f"{x:.2f}" for x in start))
    header.append("load average (1, 5, 15 min) at end   " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    header.append(f"wall time {time.perf_counter() - started:.0f} s")
    text = format_report(report, header)
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
