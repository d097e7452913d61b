"""Where a reproduction run's time goes, per scheme, beside the arithmetic it must do.

For each scheme of a preset (default: FedCor's FMNIST 2SPC Table 1 setting, and one FedLDCS
setting), one run of a fixed slice of rounds (``--rounds``, default 40: FedCor's 15 warm-up
rounds of all-client losses and its first Gaussian-process refits, a representative slice of
its costs) is timed by phase, each phase's time exclusive of the phases nested in it:

* ``train``: the round's main local training (the chosen clients, one batched step),
* ``test``: the test-set evaluation of the new global model,
* ``oracle``: what the selector asks before choosing (``oracle.losses``, ``trial``,
  ``local_updates``: forward passes over clients' data, trial trainings),
* ``losses``: the chosen clients' losses on w^t that every round's feedback carries,
* ``selector``: the selector's own work (``select`` and ``update`` minus its oracle questions;
  FedCor's Gaussian-process fits are here),
* ``other``: everything else of the round (ledger, records, aggregation, checks).

Beside it, the round's floating-point work counted from the run's own cost ledger (samples
trained, samples evaluated) and the model's layer shapes (a linear layer of ``in x out`` costs
``2 in out`` flops per sample forward, as much again for the weight gradient and, except in
the first layer, once more for the input gradient), and this machine's matrix-multiply
throughput measured in the same run for the shapes the run multiplies (one client's
minibatch through the first layer, batched over the round's clients, and the test set
through it), so ``bound`` is the time the arithmetic alone takes at that throughput and the
ratio ``CPU time / bound`` is the gap. Phases and rates are measured in CPU time (on a shared
machine, wall time also counts waiting for a core; it is printed too). Timings are one thread
(``n_threads=1``, as the command line runs), the median of ``--reps`` repetitions of each run;
the load average is printed before and after.

Usage::

    python -m benchmarks.speed.bench_profile [--rounds 40] [--reps 1] [--presets fedcor-fmnist-2spc ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from fedselect import FederatedTrainer
from fedselect.compare import machine_info
from fedselect.data import make_federation
from fedselect.presets import get_preset
from fedselect.round import RoundOracle
from fedselect.selection import BaseSelector
from fedselect.simulation import trainer as trainer_mod
from fedselect.simulation.engine import Engine

PHASES = ("train", "test", "oracle", "losses", "selector", "other")


class _Timer:
    """Exclusive time per phase: a phase's time excludes the timed phases called inside it."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self._stack: list[list[Any]] = []  # [phase, start, time in children]

    def wrap(self, phase: str | Callable[[], str], fn: Callable[..., Any]) -> Callable[..., Any]:
        timer = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            name = phase() if callable(phase) else phase
            timer._stack.append([name, time.process_time(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                name, start, children = timer._stack.pop()
                spent = time.process_time() - start
                timer.total[name] += spent - children
                if timer._stack:
                    timer._stack[-1][2] += spent

        return timed

    def in_oracle(self) -> bool:
        return any(frame[0] == "oracle" for frame in self._stack)


def _instrument(timer: _Timer) -> Callable[[], None]:
    """Patch the phases' entry points with timers; returns the function that undoes it."""
    Oracle = RoundOracle  # the questions live there, written once (SimulationOracle inherits them)
    patches = [
        (trainer_mod.TrainingRequest, "run", "train"),
        (trainer_mod.TestRequest, "run", "test"),
        (Oracle, "losses", "oracle"),
        (Oracle, "trial", "oracle"),
        (Oracle, "local_updates", "oracle"),
        (Oracle, "_ask_losses", lambda: "oracle" if timer.in_oracle() else "losses"),
        (BaseSelector, "select", "selector"),
        (BaseSelector, "update", "selector"),
    ]
    saved = []
    for cls, name, phase in patches:
        original = cls.__dict__[name]
        saved.append((cls, name, original))
        setattr(cls, name, timer.wrap(phase, original))

    def undo() -> None:
        for cls, name, original in saved:
            setattr(cls, name, original)

    return undo


def _linear_shapes(engine: Engine) -> list[tuple[int, int]]:
    return [(arg[3], arg[2]) for kind, arg in (engine._plan or ()) if kind == "linear"]


def flops_per_sample(shapes: list[tuple[int, int]]) -> tuple[float, float]:
    """(forward, forward + backward) flops of one sample through linear layers ``(in, out)``."""
    fwd = sum(2.0 * i * o for i, o in shapes)
    bwd = fwd + sum(2.0 * i * o for i, o in shapes[1:])  # weight gradients; input gradients after layer 1
    return fwd, fwd + bwd


def _gflops(fn: Callable[[], Any], flops: float, seconds: float = 0.5, repeats: int = 5) -> float:
    """Best of ``repeats`` CPU-time measurements of ``fn``'s rate (CPU time: waiting for a core is not counted)."""
    fn()
    rates = []
    for _ in range(repeats):
        n, start = 0, time.process_time()
        while time.process_time() - start < seconds / repeats:
            fn()
            n += 1
        rates.append(flops * n / (time.process_time() - start) / 1e9)
    return max(rates)


def matmul_throughput(shapes: list[tuple[int, int]], clients: int, batch: int, n_test: int) -> dict[str, float]:
    """GFLOP/s of this machine's matrix products for the run's own shapes (first layer, the largest)."""
    i, o = shapes[0]
    x = torch.randn(clients, batch, i)
    w = torch.randn(clients, o, i)
    b = torch.randn(clients, 1, o)
    g = torch.randn(clients, batch, o)
    xt = torch.randn(n_test, i)
    return {
        "train forward (bmm)": _gflops(lambda: torch.baddbmm(b, x, w.transpose(1, 2)), 2.0 * clients * batch * i * o),
        "train weight gradient (bmm)": _gflops(lambda: torch.bmm(g.transpose(1, 2), x), 2.0 * clients * batch * i * o),
        "test forward (mm)": _gflops(lambda: xt @ w[0].t(), 2.0 * n_test * i * o),
    }


def profile_scheme(preset: Any, label: str, rounds: int, seed: int) -> dict[str, Any]:
    fed = make_federation(random_state=seed, **preset.federation)
    kw = {**preset.trainer, "rounds": rounds, "n_threads": 1, "stop_at_target": False}
    timer = _Timer()
    undo = _instrument(timer)
    engines: list[Engine] = []
    init = Engine.__init__

    def keep(self: Engine, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        engines.append(self)

    Engine.__init__ = keep  # type: ignore[method-assign]
    try:
        start, cpu = time.perf_counter(), time.process_time()
        tr = FederatedTrainer(selector=preset.selectors[label], random_state=seed, **kw).fit(fed)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        undo()
        Engine.__init__ = init  # type: ignore[method-assign]
    n = len(tr.history_)
    costs = tr.history_.total_costs() if hasattr(tr.history_, "total_costs") else None
    if costs is None:
        from fedselect.ledger import Costs

        costs = Costs()
        for r in tr.history_.rounds:
            costs += r.costs
    shapes = _linear_shapes(engines[0])
    fwd, fwd_bwd = flops_per_sample(shapes)
    n_test = len(fed.y_test)
    train_flops = costs.sample_gradients * fwd_bwd / n
    eval_flops = costs.samples_evaluated * fwd / n
    test_flops = n_test * fwd  # eval_every=1 in the presets: one test pass per round
    per_round = {p: timer.total.get(p, 0.0) / n for p in PHASES[:-1]}
    per_round["other"] = cpu / n - sum(per_round.values())
    return {
        "label": label,
        "rounds": n,
        "wall": wall / n,
        "cpu": cpu / n,
        "phases": per_round,
        "shapes": shapes,
        "train_gflop": train_flops / 1e9,
        "eval_gflop": eval_flops / 1e9,
        "test_gflop": test_flops / 1e9,
        "clients": int(kw["clients_per_round"]),
        "batch": int(kw["batch_size"]),
        "n_test": n_test,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", nargs="+", default=["fedcor-fmnist-2spc", "ldcs-fmnist-k8-dir0.6"])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    info = machine_info()
    print(
        f"bench_profile: {args.rounds} rounds per run (a fixed slice from round 0), seed {args.seed}, 1 torch "
        f"thread, median of {args.reps} repetition(s)"
    )
    print(f"machine: {info['cpu']}, {info['cpus']} cpu(s), torch {info['torch']}")
    print(f"load average before: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name in args.presets:
        preset = get_preset(name)
        print(f"\n== {name}: {preset.description}")
        header = (
            f"{'scheme':<10} {'wall':>7} {'cpu':>7} "
            + " ".join(f"{p:>8}" for p in PHASES)
            + f" {'GFLOP':>6} {'bound s':>8} {'ratio':>6}"
        )
        rows = []
        for label in preset.selectors:
            if name.startswith("ldcs") and label not in ("Random", "LDCS"):
                continue
            reps = [profile_scheme(preset, label, args.rounds, args.seed) for _ in range(args.reps)]
            best = sorted(reps, key=lambda r: r["cpu"])[len(reps) // 2]
            rows.append(best)
        ref = rows[0]
        rates = matmul_throughput(ref["shapes"], ref["clients"], ref["batch"], ref["n_test"])
        train_rate = statistics.mean([rates["train forward (bmm)"], rates["train weight gradient (bmm)"]])
        test_rate = rates["test forward (mm)"]
        print(
            "matmul throughput for this preset's shapes: " + ", ".join(f"{k} {v:.1f} GFLOP/s" for k, v in rates.items())
        )
        print(
            "s/round: wall, and CPU time split into phases (exclusive); GFLOP per round from the run's cost "
            "ledger; bound = train GFLOP / train rate + (test + client-loss GFLOP) / test rate; ratio = cpu / bound"
        )
        print(header)
        for r in rows:
            bound = r["train_gflop"] / train_rate + (r["test_gflop"] + r["eval_gflop"]) / test_rate
            gflop = r["train_gflop"] + r["test_gflop"] + r["eval_gflop"]
            print(
                f"{r['label']:<10} {r['wall']:>7.3f} {r['cpu']:>7.3f} "
                + " ".join(f"{r['phases'][p]:>8.3f}" for p in PHASES)
                + f" {gflop:>6.2f} {bound:>8.3f} {r['cpu'] / bound:>6.2f}"
            )
        print("per-phase gap (phase time / its arithmetic at the measured rate):")
        for r in rows:
            tr_bound = r["train_gflop"] / train_rate
            te_bound = r["test_gflop"] / test_rate
            print(
                f"  {r['label']:<10} train {r['phases']['train'] / tr_bound:5.2f}x of {tr_bound * 1e3:.0f} ms, "
                f"test {r['phases']['test'] / te_bound:5.2f}x of {te_bound * 1e3:.0f} ms, "
                f"client losses {r['eval_gflop']:.2f} GFLOP/round"
            )
    print(f"\nload average after: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
