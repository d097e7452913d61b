"""Cross-device scale: seconds per round and peak memory of every built-in selector at N = 1,000 to 1,000,000.

The federation is FedProx's Synthetic(1, 1) (``make_federation("synthetic", sizes=...)``) with
cross-device client sizes: client k holds ``8 + int(lognormal(1, 1))`` samples (mean 12,
median 10, a long tail), keeps 80 % to train on and gives 20 % to the test pool. Why this data:
Fashion-MNIST has 60,000 training images, fewer than 100,000 clients, so it cannot give every
client its own data; the generator gives each client its own distribution (its own W_k, b_k and
input mean), so 100,000 clients are 100,000 different tasks, and with a dozen samples each
the whole federation is 1.2 million samples of 60 features (280 MB), and 12 million (2.9 GB)
at N = 1,000,000: cheap enough that what the table shows is what N itself costs. Every client's
loss samples are a contiguous range of the pool, so the engine evaluates them in place (it
keeps indices, never a per-client copy: ``fedselect/simulation/_pool.py``); the goal at
N = 1,000,000 (issue 34) is random, power-of-choice, AFL and FedCor under 5 s per round
amortised and 16 GB. The model is multinomial logistic regression (D = 610,
FedProx's model for this data); every round C = 10 clients train one local epoch of batch 10
(lr 0.05); the test set is a fixed 10,000 samples of the test pool at every N (the pool grows
with N; a fixed test set keeps the per-round evaluation from growing with it).

Each (selector, N) point runs in a fresh subprocess (so its peak memory is its own): the
federation is loaded from a pickle built once per N, ``FederatedTrainer.fit`` runs a short
schedule and each round's wall-clock seconds and costs are read from ``history_``.

**Amortisation.** Rounds differ in cost (FedCor's warm-up rounds fit the GP on all N clients'
loss changes, its GP rounds run a trial and a refit, its other rounds only select; FedLDCS
trains everyone in round 0; AFL asks every client's loss in round 0). Each round is given a
phase; a run covers every phase of a 500-round schedule (FedCor: rounds 0..W+1 one by one,
the first GP round and plain rounds, 22 rounds at the defaults), and the seconds per round
of the 500-round schedule are the measured seconds of the rounds that ran plus, for every
later round, the median of the measured rounds of its phase, divided by 500. Costs are
amortised the same way. A point stops early (after its required rounds) when it exceeds
``--budget`` seconds.

**Memory** is the worker's peak resident set size (``getrusage(RUSAGE_SELF).ru_maxrss``): the
interpreter, torch, the federation's arrays and everything the run allocated; ``+run`` is that
peak minus the resident size just before ``fit`` (federation loaded, torch imported).

Points whose predicted memory exceeds ``--max-gb`` (default: 80 % of this machine's RAM) are
skipped with the prediction printed (clustered sampling's Algorithm 2 keeps N x N matrices).

Usage::

    nice python -m benchmarks.speed.bench_scale [--n 1000 10000 100000 1000000] [--selectors random fedcor ...]
        [--budget 300] [--threads 1] [--out benchmarks/speed/bench_scale.txt]

The output (and a JSON file of the raw measurements beside it) records the command, the
commit, torch's threads and the load average before and after every point.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

SCHEDULE = 500
PROGRESS_PREFIX = "BENCH_SCALE_ROUND "
TEST_SIZE = 10_000
CLIENTS_PER_ROUND = 10
D_LOGISTIC = 610  # 60 features x 10 classes + 10 biases

# The built-in selectors at their defaults, then the bounded variants a user at this scale would pick.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "fedcor[gp_solver=closed-form]": ("fedcor", {"gp_solver": "closed-form"}),
    "clustered[method=similarity]": ("clustered", {"method": "similarity"}),
    "clustered[similarity=knn]": ("clustered", {"method": "similarity", "similarity": "knn", "linkage": "single"}),
    "ldcs[storage=float16]": ("ldcs", {"storage": "float16"}),
    "ldcs[storage=sketch,128]": ("ldcs", {"storage": "sketch", "sketch_dim": 128}),
    "hcsfed[max_trained=1000]": ("hcsfed", {"max_trained": 1000}),
    "ocs[max_trained=1000]": ("ocs", {"max_trained": 1000}),
}
COST_KEYS = ("local_trainings", "models_down", "models_up", "scalars_up", "floats_up", "samples_evaluated")


# ----------------------------------------------------------------------------------------- phases
def phase_of(name: str, params: dict[str, Any], t: int) -> str:
    """The phase of round t: rounds of one phase cost alike (within noise)."""
    if name == "fedcor":
        w, dt = int(params.get("warmup_rounds", 15)), int(params.get("gp_interval", 10))
        if t <= w + 1:
            return f"warm-up {t}"  # each warm-up round fits on a growing window: measured one by one
        return "gp" if t % dt == 0 else "plain"
    return "round 0" if t == 0 else "steady"


def required_rounds(name: str, params: dict[str, Any]) -> int:
    """Rounds a run needs so that every phase of the schedule has been measured."""
    if name == "fedcor":
        w, dt = int(params.get("warmup_rounds", 15)), int(params.get("gp_interval", 10))
        first_gp = next(t for t in range(w + 2, w + 2 + 2 * dt) if t % dt == 0)
        return first_gp + 2
    return 3


def wanted_rounds(name: str, params: dict[str, Any]) -> int:
    """Rounds a run takes when the budget allows (more samples of the steady phase)."""
    return max(required_rounds(name, params), 8)


def amortise(name: str, params: dict[str, Any], values: list[float], schedule: int = SCHEDULE) -> float:
    """Mean over a ``schedule``-round run: measured rounds as measured, later ones by their phase's median."""
    by_phase: dict[str, list[float]] = {}
    for t, v in enumerate(values):
        by_phase.setdefault(phase_of(name, params, t), []).append(v)
    med = {k: statistics.median(v) for k, v in by_phase.items()}
    total = 0.0
    for t in range(schedule):
        if t < len(values):
            total += values[t]
        else:
            ph = phase_of(name, params, t)
            if ph not in med:
                raise ValueError(f"{name}: phase {ph!r} of round {t} was never measured")
            total += med[ph]
    return total / schedule


def predicted_gb(name: str, params: dict[str, Any], n: int, d: int = D_LOGISTIC) -> float:
    """The selector's dominant memory at N = n (the formulas of the class docstrings), in GB."""
    if name == "clustered" and params.get("method") == "similarity" and params.get("similarity", "dense") == "dense":
        return 40.0 * n * n / 1e9  # Gram, distances, cosines and their temporaries, scipy's condensed copy
    if name == "ldcs":
        return 24.0 * n * d / 1e9  # round 0 trains everyone in one batch; 4 N D stored
    if name in ("hcsfed", "ocs") and not params.get("max_trained"):
        return 24.0 * n * d / 1e9
    return 0.0


# ----------------------------------------------------------------------------------------- data
def federation_path(cache: Path, n: int) -> Path:
    return cache / f"synthetic-xdevice-{n}.pkl"


def build_federation(n: int, path: Path) -> None:
    from fedselect.data import Federation, make_federation

    sizes = np.random.default_rng(0).lognormal(1.0, 1.0, n).astype(np.int64) + 8
    fed = make_federation("synthetic", n_clients=n, random_state=0, sizes=sizes)
    fed = Federation(
        X=fed.X,
        y=fed.y,
        client_indices=fed.client_indices,
        X_test=fed.X_test[:TEST_SIZE],
        y_test=fed.y_test[:TEST_SIZE],
        n_classes=fed.n_classes,
        name=fed.name,
        metadata={**fed.metadata, "test": f"first {TEST_SIZE} of the test pool"},
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        pickle.dump(fed, fh, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def rss_kb() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


# ----------------------------------------------------------------------------------------- worker
class _Budget(Exception):
    pass


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from fedselect import FederatedTrainer

    torch.set_num_threads(int(spec["threads"]))
    with open(spec["federation"], "rb") as fh:
        fed = pickle.load(fh)
    name, params = spec["name"], dict(spec["params"])
    need, want, budget = required_rounds(name, params), wanted_rounds(name, params), float(spec["budget"])
    start = time.perf_counter()

    def stop_when_spent(trainer: Any, record: Any) -> None:
        # one line per round on stderr, so that a point killed at the time limit still says how far it got
        print(f"{PROGRESS_PREFIX}{record.round} {time.perf_counter() - start:.1f}", file=sys.stderr, flush=True)
        if record.round + 1 >= need and time.perf_counter() - start > budget:
            raise _Budget

    base = rss_kb()
    trainer = FederatedTrainer(
        selector=(name, params),
        model="logistic",
        clients_per_round=CLIENTS_PER_ROUND,
        rounds=want,
        local_epochs=1,
        batch_size=10,
        lr=0.05,
        random_state=0,
        n_threads=int(spec["threads"]),
        callback=stop_when_spent,
    )
    stopped = False
    try:
        trainer.fit(fed)
    except _Budget:
        stopped = True
    rounds = trainer.history_.rounds
    out = {
        "name": name,
        "params": params,
        "n": fed.n_clients,
        "rounds": len(rounds),
        "stopped_by_budget": stopped,
        "seconds": [r.seconds for r in rounds],
        "costs": [r.costs.to_dict() for r in rounds],
        "phases": [phase_of(name, params, r.round) for r in rounds],
        "rss_before_fit_kb": base,
        "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "model_size": trainer.history_.model_size,
        "wall": time.perf_counter() - start,
    }
    fit_log = getattr(trainer.selector_, "fit_log_", None)
    if fit_log:
        out["gp_fits"] = [
            {"round": f.round, "kind": f.kind, "seconds": f.seconds, "vectors": f.n_vectors} for f in fit_log
        ]
    return out


# ----------------------------------------------------------------------------------------- parent
def run_point(label: str, name: str, params: dict[str, Any], n: int, args: argparse.Namespace) -> dict[str, Any]:
    spec = {
        "name": name,
        "params": params,
        "threads": args.threads,
        "budget": args.budget,
        "federation": str(federation_path(args.cache, n)),
    }
    load0 = os.getloadavg()[0]
    cmd = [sys.executable, __file__, "--worker", json.dumps(spec)]
    try:
        # BLAS threads follow --threads too: with two OpenBLAS threads on a loaded 2-core host, numpy's small
        # matrix-vector products (FedCor's selection at N = 100,000) ran 25x slower than with one.
        threads = str(args.threads)
        env = {
            **os.environ,
            "PYTHONWARNINGS": "ignore",
            "OMP_NUM_THREADS": threads,
            "OPENBLAS_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
        }
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.budget * 3 + 600, env=env)
    except subprocess.TimeoutExpired as exc:
        limit = args.budget * 3 + 600
        return {
            "label": label,
            "name": name,
            "params": params,
            "n": n,
            "error": timed_out_message(exc.stderr, limit),
            "load": [load0],
        }
    load1 = os.getloadavg()[0]
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {
            "label": label,
            "name": name,
            "params": params,
            "n": n,
            "load": [load0, load1],
            "error": f"exit {proc.returncode}: {' | '.join(tail)}",
        }
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res.update(label=label, load=[load0, load1])
    return res


def timed_out_message(stderr: bytes | str | None, limit: float, schedule: int = SCHEDULE) -> str:
    """What a point killed at ``limit`` seconds says: the rounds it finished, and the amortised time it exceeds.

    Every round of the ``schedule`` costs at least nothing, so ``limit / schedule`` is a lower bound on the
    amortised seconds per round of a run that had not finished its required rounds by then.
    """
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else (stderr or "")
    done = [ln[len(PROGRESS_PREFIX) :].split() for ln in text.splitlines() if ln.startswith(PROGRESS_PREFIX)]
    last = f"; rounds 0-{done[-1][0]} finished by {float(done[-1][1]):.0f} s" if done else "; no round finished"
    return f"timed out at {limit:.0f} s{last}; so more than {limit / schedule:.2f} s/round amortised"


def summarise(res: dict[str, Any]) -> dict[str, Any]:
    name, params = res["name"], res["params"]
    out = {"s_per_round": amortise(name, params, res["seconds"])}
    for key in COST_KEYS:
        out[key] = amortise(name, params, [float(c[key]) for c in res["costs"]])
    by: dict[str, list[float]] = {}
    for ph, s in zip(res["phases"], res["seconds"]):
        by.setdefault("warm-up" if ph.startswith("warm-up") else ph, []).append(s)
    parts = []
    for ph, vals in by.items():
        if ph == "warm-up":
            parts.append(f"warm-up {sum(vals):.1f} s total ({len(vals)} rds)")
        else:
            parts.append(f"{ph} {statistics.median(vals):.3g} s ({len(vals)})")
    out["phases"] = "; ".join(parts)
    out["peak_gb"] = res["maxrss_kb"] / 1e6
    out["run_gb"] = (res["maxrss_kb"] - res["rss_before_fit_kb"]) / 1e6
    return out


def fmt_row(label: str, n: int, res: dict[str, Any]) -> str:
    if "error" in res or "skipped" in res:
        why = res.get("skipped") or res.get("error")
        return f"{label:<30} {n:>7}  {why}"
    s = summarise(res)
    return (
        f"{label:<30} {n:>7} {s['s_per_round']:>9.3f} {s['peak_gb']:>6.2f} {s['run_gb']:>+6.2f} "
        f"{s['local_trainings']:>9.1f} {s['models_down']:>9.1f} {s['models_up']:>6.1f} {s['scalars_up']:>9.1f} "
        f"{s['floats_up']:>9.0f}  {s['phases']}"
    )


HEADER = (
    f"{'selector':<30} {'N':>7} {'s/round':>9} {'peak':>6} {'+run':>6} {'trainings':>9} {'mdl down':>9} "
    f"{'mdl up':>6} {'scalars':>9} {'floats up':>9}  phases (median s per round, rounds measured)"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[1000, 10_000, 100_000, 1_000_000])
    ap.add_argument(
        "--selectors",
        nargs="+",
        default=None,
        help="registered names and/or variant labels (default: every registered selector and "
        f"the variants {', '.join(VARIANTS)})",
    )
    ap.add_argument("--budget", type=float, default=300.0, help="seconds per point before it stops early")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each worker")
    ap.add_argument("--max-gb", type=float, default=None, help="skip points predicted above this (default 80%% RAM)")
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "fedselect-bench-scale")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".txt"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--build", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if args.build:
        build_federation(args.build, federation_path(args.cache, args.build))
        return

    from fedselect import list_selectors

    registered = sorted(list_selectors())
    labels = args.selectors or [*registered, *VARIANTS]
    points = []
    for label in labels:
        if label in VARIANTS:
            points.append((label, *VARIANTS[label]))
        elif label in registered:
            points.append((label, label, {}))
        else:
            raise SystemExit(
                f"bench_scale: unknown selector {label!r}; registered: {registered}; variants: {list(VARIANTS)}"
            )
    ram_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    max_gb = args.max_gb if args.max_gb is not None else 0.8 * ram_gb
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout.strip()
    uptime0 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    import torch

    lines = [
        "bench_scale: seconds per round (amortised over a 500-round schedule) and peak memory per (selector, N)",
        f"command: python -m benchmarks.speed.bench_scale {' '.join(sys.argv[1:])}",
        f"commit {commit}{' (with uncommitted changes)' if dirty else ''}; {platform.machine()}, {os.cpu_count()} "
        f"cpus, {ram_gb:.0f} GB RAM; python {platform.python_version()}, torch {torch.__version__}, "
        f"{args.threads} torch and BLAS thread(s) per worker",
        f"uptime at start: {uptime0}",
        "data: Synthetic(1, 1), client sizes 8 + int(lognormal(1, 1)), 80 % train; logistic regression D = 610; "
        f"C = {CLIENTS_PER_ROUND}, 1 local epoch, batch 10; test set {TEST_SIZE} samples",
        "s/round: amortised over 500 rounds (see the docstring); peak: ru_maxrss of the worker, GB; +run: peak minus "
        "the RSS before fit; costs per round (amortised the same way): local trainings, models down / up, scalars "
        "up (losses), floats up (compressed updates)",
        "",
        HEADER,
    ]
    print("\n".join(lines), flush=True)
    raw: list[dict[str, Any]] = []
    for n in args.n:
        path = federation_path(args.cache, n)
        if not path.exists():
            t = time.perf_counter()
            subprocess.run([sys.executable, __file__, "--build", str(n), "--cache", str(args.cache)], check=True)
            print(f"# built the N={n} federation in {time.perf_counter() - t:.0f} s", flush=True)
        for label, name, params in points:
            pred = predicted_gb(name, params, n)
            if pred > max_gb:
                res = {
                    "label": label,
                    "name": name,
                    "params": params,
                    "n": n,
                    "skipped": f"skipped: predicted {pred:,.0f} GB > {max_gb:.0f} GB (see the class docstring)",
                }
            else:
                res = run_point(label, name, params, n, args)
            raw.append(res)
            line = fmt_row(label, n, res)
            if "load" in res:
                line += f"  [load {', '.join(f'{x:.1f}' for x in res['load'])}]"
            print(line, flush=True)
            lines.append(line)
    uptime1 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    lines += ["", f"uptime at end: {uptime1}"]
    print(lines[-1])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(raw, indent=1) + "\n")
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
