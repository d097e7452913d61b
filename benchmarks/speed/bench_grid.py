"""The FedCor FMNIST Table 1 grid: wall time serial, with ``--jobs 2`` and with every optimisation, vs. its bound.

The grid is ``fedselect reproduce fedcor-fmnist-{2spc,1spc,dir}``: 3 settings x 4 schemes
(Random, AFL, Pow-d, FedCor) x 10 seeds x 500 rounds = 120 runs. Timing all of it three times
takes hours on two cores, so this script times a fixed slice of it, the same in every mode:
every setting, scheme and seed of ``--seeds``, but only the first ``--rounds`` rounds of each
run. The modes, each into fresh folders (nothing resumed, no checkpoints), in one process on
one machine:

``serial``
    one run after another in this process, one torch thread (``reproduce`` as today);
``jobs2``
    ``--jobs 2``: two worker processes, one torch thread each;
``all``
    ``--jobs 2 --batch-seeds``: each worker trains all seeds of one (setting, scheme) in
    lockstep as one batched computation (:func:`fedselect.simulation.batched.fit_runs`);
``all+gp``
    ``all`` with FedCor's GP fitted by ``gp_solver="closed-form"`` (the same likelihood and
    gradient written out; float rounding differs from GPyTorch's, so FedCor's runs are equal to
    the others' only statistically, which a slice cannot show: its agreement line is printed).

**The compute bound.** Every run records, per round, the samples that went through a local
SGD step (``Costs.sample_gradients``) and the samples whose loss was only evaluated
(``Costs.samples_evaluated``: the clients' losses the selector asked for, and the test set).
With ``f`` the FLOP of one sample's forward pass through the preset's model (matrix products,
counted by :class:`torch.utils.flop_counter.FlopCounterMode`), a run's arithmetic is::

    FLOP = 3 f * sample_gradients + f * samples_evaluated

(a backward pass costs two forwards). Not counted: element-wise work (activations, dropout,
the loss, the SGD update, aggregation) and the selectors' own computation (FedCor's GP fits):
the bound is the grid's matrix arithmetic alone at the throughput of a large float32 matrix
product measured on this machine in this run (``--cores`` x one thread's GFLOP/s), a floor no
implementation can beat here. The whole grid's arithmetic is counted from the recorded full
runs (``--grid``, default ``benchmarks/reproductions/fedcor/fedcor-fmnist-*``); the slice's from its own runs.

**Scaling the slice up.** A mode's whole-grid estimate is its slice wall time times the ratio of
the grid's arithmetic to the slice's (time proportional to arithmetic; the slice over-weights
FedCor's 15 warm-up rounds, whose all-client losses are arithmetic-heavy). Printed: the
machine, the load average around each mode, the slice's wall time per mode, the estimates, the
bound, each ratio to the bound, and whether the modes' results agree (``jobs2`` bit for bit;
``all``: identical selections for Random, the largest test-accuracy difference for every scheme).

Usage::

    python -m benchmarks.speed.bench_grid [--seeds 0 1 2 3 4] [--rounds 50] [--modes serial jobs2 all all+gp]
    python -m benchmarks.speed.bench_grid --bound-only
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import torch

from fedselect.compare import read_text, run_files


def forward_flop(preset_name: str) -> int:
    """FLOP of one sample's forward pass through the preset's model (matrix products only)."""
    from torch.utils.flop_counter import FlopCounterMode

    from fedselect.presets import get_preset
    from fedselect.simulation.models import build_model

    preset = get_preset(preset_name)
    dataset = preset.federation.get("dataset")
    shapes = {
        "fmnist": ((1, 28, 28), 10),
        "mnist": ((1, 28, 28), 10),
        "cifar10": ((3, 32, 32), 10),
        "digits": ((64,), 10),
    }
    if dataset not in shapes:
        raise ValueError(f"forward_flop: no input shape known for dataset {dataset!r}")
    shape, n_classes = shapes[dataset]
    model = build_model(preset.trainer["model"], shape, n_classes, **preset.trainer.get("model_params", {}))
    model.eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.zeros((1, *shape)))
    return int(counter.get_total_flops())


def grid_arithmetic(run_dirs: Iterable[Path]) -> dict[str, float]:
    """Sums of ``sample_gradients`` and ``samples_evaluated`` (and run and round counts) over the runs."""
    grads = evals = rounds = runs = 0
    for directory in run_dirs:
        for path in run_files(Path(directory) / "runs"):
            saved = json.loads(read_text(path))
            if saved.get("failed"):
                continue
            runs += 1
            for record in saved["history"]["rounds"]:
                costs = record.get("costs", {})
                grads += int(costs.get("sample_gradients", 0))
                evals += int(costs.get("samples_evaluated", 0))
                rounds += 1
    return {"runs": runs, "rounds": rounds, "sample_gradients": grads, "samples_evaluated": evals}


def matmul_gflops(threads: int = 1, n: int = 2048, reps: int = 5) -> float:
    """Median GFLOP/s of an ``n x n`` float32 matrix product on ``threads`` torch threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b  # warm up
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        times.sort()
        return 2 * n**3 / times[len(times) // 2] / 1e9
    finally:
        torch.set_num_threads(before)


def bound_seconds(flop: float, gflops_per_core: float, cores: int) -> float:
    """The grid's arithmetic at the measured throughput on ``cores`` cores."""
    return flop / (gflops_per_core * 1e9 * cores)


SETTINGS = ("2spc", "1spc", "dir")
MODES = {
    "serial": {"jobs": 1},
    "jobs2": {"jobs": 2},
    "all": {"jobs": 2, "batch_seeds": True},
    "all+gp": {"jobs": 2, "batch_seeds": True},
}
# selector parameters a mode changes, per row label of the presets
OVERRIDES = {"all+gp": {"FedCor": {"gp_solver": "closed-form"}}}


def _load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def run_slice(mode: str, seeds: list[int], rounds: int, out: Path) -> float:
    """Wall seconds of the slice (every setting, scheme and seed; ``rounds`` rounds) in ``mode``."""
    from fedselect.compare import run_comparison
    from fedselect.presets import get_preset

    start = time.perf_counter()
    for setting in SETTINGS:
        preset = get_preset(f"fedcor-fmnist-{setting}")
        changed = OVERRIDES.get(mode, {})
        selectors = {
            label: (name, {**params, **changed.get(label, {})}) for label, (name, params) in preset.selectors.items()
        }
        run_comparison(
            selectors,
            federation=dict(preset.federation),
            trainer={**preset.trainer, "rounds": rounds, "n_threads": 1},
            seeds=seeds,
            target=preset.target,
            out_dir=out / setting,
            progress=False,
            checkpoint_every=None,
            log=lambda _: None,
            **MODES[mode],
        )
    return time.perf_counter() - start


def _histories(out: Path) -> dict[tuple[str, str, int], dict]:
    found = {}
    for setting in SETTINGS:
        for path in run_files(out / setting / "runs"):
            saved = json.loads(read_text(path))
            found[(setting, saved["label"], int(saved["seed"]))] = saved["history"]
    return found


def agreement(base: Path, other: Path) -> str:
    """How the runs of ``other`` compare with ``base``'s: bit-equal, or selections and accuracies."""
    a, b = _histories(base), _histories(other)
    if set(a) != set(b):
        return f"different runs ({len(a)} against {len(b)})"
    rounds = lambda h: [(r["clients"], r["weights"], r["test_accuracy"], r["test_loss"]) for r in h["rounds"]]  # noqa: E731
    if all(rounds(a[k]) == rounds(b[k]) for k in a):
        return "identical histories"
    same_sel = {}
    worst = {}
    for (setting, label, seed), h in a.items():
        g = b[(setting, label, seed)]
        same = all(x["clients"] == y["clients"] for x, y in zip(h["rounds"], g["rounds"], strict=True))
        same_sel[label] = same_sel.get(label, True) and same
        diff = max(
            abs((x["test_accuracy"] or 0) - (y["test_accuracy"] or 0))
            for x, y in zip(h["rounds"], g["rounds"], strict=True)
        )
        worst[label] = max(worst.get(label, 0.0), diff)
    return "; ".join(
        f"{label}: selections {'identical' if same_sel[label] else 'differ'}, "
        f"largest accuracy difference {worst[label]:.4f}"
        for label in same_sel
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    ap.add_argument("--rounds", type=int, default=50, help="rounds of each run in the slice (default 50)")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument(
        "--grid",
        type=Path,
        nargs="+",
        default=None,
        help="folders of the recorded full grid (default benchmarks/reproductions/fedcor/fedcor-fmnist-*)",
    )
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--bound-only", action="store_true", help="print the bound of the recorded grid, time nothing")
    args = ap.parse_args()
    from fedselect.compare import _commit, machine_info

    info = machine_info()
    print(
        f"commit {_commit()}; machine: {info['cpu']}, {len(os.sched_getaffinity(0))} cores usable, "
        f"torch {info['torch']}; load average {_load()} (1 / 5 / 15 min)"
    )
    f = forward_flop("fedcor-fmnist-2spc")
    root = Path(__file__).resolve().parents[1] / "reproductions" / "fedcor"
    grid_dirs = args.grid or [root / f"fedcor-fmnist-{s}" for s in SETTINGS]
    work = grid_arithmetic(grid_dirs)
    grid_flop = 3 * f * work["sample_gradients"] + f * work["samples_evaluated"]
    g1 = matmul_gflops(1)
    bound = bound_seconds(grid_flop, g1, args.cores)
    print(f"model: {f / 1e3:.1f} kFLOP per sample forward (FedCor's MLP)")
    print(
        f"recorded grid: {work['runs']} runs, {work['rounds']} rounds, {work['sample_gradients']:,} sample "
        f"gradients, {work['samples_evaluated']:,} samples evaluated: {grid_flop / 1e12:.1f} TFLOP"
    )
    print(
        f"float32 2048^3 matmul: {g1:.1f} GFLOP/s on one thread -> compute bound on {args.cores} cores: "
        f"{bound / 60:.1f} min"
    )
    if args.bound_only:
        return
    print(f"slice: 3 settings x 4 schemes x {len(args.seeds)} seeds x {args.rounds} rounds")
    walls: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes:
            before = _load()
            walls[mode] = run_slice(mode, args.seeds, args.rounds, Path(tmp) / mode)
            sw = grid_arithmetic(Path(tmp) / mode / s for s in SETTINGS)
            slice_flop = 3 * f * sw["sample_gradients"] + f * sw["samples_evaluated"]
            est = walls[mode] * grid_flop / slice_flop
            note = (
                ""
                if mode == args.modes[0]
                else f"; against {args.modes[0]}: " + agreement(Path(tmp) / args.modes[0], Path(tmp) / mode)
            )
            print(
                f"{mode}: slice {walls[mode]:.0f} s ({slice_flop / 1e12:.2f} TFLOP, load {before} -> {_load()}); "
                f"whole grid scaled by arithmetic: {est / 60:.1f} min = {est / bound:.2f}x the bound{note}",
                flush=True,
            )
    if "serial" in walls:
        for mode in walls:
            if mode != "serial":
                print(f"speed-up of {mode} over serial: {walls['serial'] / walls[mode]:.2f}x")


if __name__ == "__main__":
    main()
