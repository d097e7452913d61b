"""Seconds per round of FedCor's FMNIST 2SPC setting: fedselect vs research-style code vs the compute bound.

The setting (FedCor, Tang et al. 2022): N = 100 clients holding 2 label-sorted shards of
FMNIST each, 5 clients per round, 20 local SGD steps of batch 64 at lr 0.005, FedCor's MLP
784-64-30-10, and every round the loss of *every* client (all 60,000 training samples) plus
the test accuracy (10,000 images). Measured in one run, interleaved round by round so
that machine noise hits every contender alike:

1. fedselect: ``Engine.client_batches`` + ``Engine.train`` (the 5 clients batched with
   vmap), mean of the deltas, ``Engine.client_losses`` (one pass, per-client reduction),
   ``Engine.test``; and the full ``FederatedTrainer.fit`` path (selector "random",
   ``track_global_loss=True`` so every client is evaluated each round).
2. reference: how research code (e.g. the official FedCor code, minus its per-sample image
   transforms) does it: a DataLoader per client (TensorDataset + Subset, shuffle, batch 64),
   clients one after another with ``torch.optim.SGD`` on a deepcopy of the model, state-dict
   averaging, then one evaluation DataLoader per client (batch 1000) and a test DataLoader.
3. the compute lower bound: the round's floating-point operations divided by this machine's
   matrix-multiply throughput, measured in the same run (2048 x 2048 float32 ``torch.mm``,
   and at the MLP's own shapes).

Usage::

    python -m benchmarks.speed.bench_engine [--rounds 15] [--warmup 3] [--threads N] [--dropout 0.5]

The order within one iteration is FederatedTrainer round, Engine round, reference round,
throughput probe (the last three run from the trainer's callback); medians are reported
next to the spread, and the ratios also from each contender's least-disturbed round.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import itertools
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset, TensorDataset

from fedselect.simulation.engine import Engine, LocalSchedule
from fedselect.simulation.models import FedCorMLP

N_CLIENTS = 100
PER_ROUND = 5
STEPS = 20
BATCH = 64
LR = 0.005
EVAL_BATCH_REF = 1000  # the reference's evaluation DataLoaders
HIDDEN = (64, 30)
FEDCOR_OFFICIAL = 3.1  # s/round of the official FedCor code (given, not measured here)
FEDCOR_OFFICIAL_NO_TRANSFORMS = 0.65  # the same without its per-sample transforms (given, not measured here)
FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


# -- data ------------------------------------------------------------------------------
@dataclass
class _FallbackFederation:
    """The few attributes of a Federation that the engine and FederatedTrainer use."""

    X: np.ndarray
    y: np.ndarray
    client_indices: list[np.ndarray]
    loss_indices: list[np.ndarray]
    X_test: np.ndarray
    y_test: np.ndarray
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def n_clients(self) -> int:
        return len(self.client_indices)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.X.shape[1:])

    @property
    def n_classes(self) -> int:
        return int(self.y.max()) + 1

    @property
    def n_samples(self) -> np.ndarray:
        return np.array([len(ix) for ix in self.client_indices], dtype=np.int64)

    @property
    def weights(self) -> np.ndarray:
        n = self.n_samples.astype(np.float64)
        return n / n.sum()

    def client_pool(self) -> Any:
        from fedselect.selection import ClientPool

        return ClientPool(self.n_samples)


def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _fallback_federation() -> _FallbackFederation:
    """FMNIST from the Debian IDX files, normalised, 2 label-sorted shards per client."""
    from fedselect.data.partition import shard_partition

    def images(name: str) -> np.ndarray:
        return _read_idx(FMNIST_DIR / name).astype(np.float32)[:, None] / 255.0

    X, X_test = images("train-images-idx3-ubyte.gz"), images("t10k-images-idx3-ubyte.gz")
    mean, std = float(X.mean()), float(X.std())
    X, X_test = (X - mean) / std, (X_test - mean) / std
    y = _read_idx(FMNIST_DIR / "train-labels-idx1-ubyte.gz").astype(np.int64)
    y_test = _read_idx(FMNIST_DIR / "t10k-labels-idx1-ubyte.gz").astype(np.int64)
    parts = shard_partition(y, N_CLIENTS, shards_per_client=2, random_state=0)
    return _FallbackFederation(X, y, parts, parts, X_test, y_test, {"dataset": "fmnist", "fallback": True})


def load_federation() -> tuple[Any, str]:
    try:
        from fedselect.data import make_federation

        fed = make_federation("fmnist", partition="shards", shards_per_client=2, n_clients=N_CLIENTS, random_state=0)
        return fed, "fedselect.data.make_federation('fmnist', partition='shards', shards_per_client=2, n_clients=100)"
    except Exception as exc:  # the loader is being written concurrently: fall back, say so
        return _fallback_federation(), f"fallback IDX loader in this script (make_federation unavailable: {exc!r})"


# -- contenders ------------------------------------------------------------------------
class FedselectRound:
    """One round with fedselect's Engine, called directly."""

    def __init__(self, fed: Any, model: torch.nn.Module, seed: int = 0) -> None:
        self.fed = fed
        self.engine = Engine(model, fed.X, fed.y, fed.loss_indices, fed.X_test, fed.y_test)
        self.schedule = LocalSchedule(BATCH, steps=STEPS)
        self.theta = self.engine.initial_parameters()
        self.seed = seed

    def __call__(self, t: int, clients: np.ndarray) -> dict[str, float]:
        eng = self.engine
        t0 = time.perf_counter()
        batches = eng.client_batches(self.fed.client_indices, self.schedule, self.seed, t, clients)
        deltas = eng.train(self.theta, batches, lr=LR, dropout_seed=t)
        self.theta = self.theta + deltas.mean(0)
        t1 = time.perf_counter()
        self.losses = eng.client_losses(self.theta)
        t2 = time.perf_counter()
        _, self.accuracy = eng.test(self.theta)
        t3 = time.perf_counter()
        return {"total": t3 - t0, "train": t1 - t0, "client_losses": t2 - t1, "test": t3 - t2}


class ReferenceRound:
    """One round the way research code writes it: DataLoaders, deepcopy, torch.optim.SGD."""

    def __init__(self, fed: Any, model: torch.nn.Module) -> None:
        data = TensorDataset(torch.as_tensor(fed.X), torch.as_tensor(fed.y))
        self.train_loaders = [
            DataLoader(Subset(data, np.asarray(ix).tolist()), batch_size=BATCH, shuffle=True)
            for ix in fed.client_indices
        ]
        self.eval_loaders = [
            DataLoader(Subset(data, np.asarray(ix).tolist()), batch_size=EVAL_BATCH_REF, shuffle=False)
            for ix in fed.loss_indices
        ]
        test = TensorDataset(torch.as_tensor(fed.X_test), torch.as_tensor(fed.y_test))
        self.test_loader = DataLoader(test, batch_size=EVAL_BATCH_REF, shuffle=False)
        self.model = model
        self.criterion = torch.nn.CrossEntropyLoss()

    def _local_update(self, k: int) -> dict[str, torch.Tensor]:
        local = copy.deepcopy(self.model)
        local.train()
        opt = torch.optim.SGD(local.parameters(), lr=LR)
        step = 0
        while step < STEPS:
            for x, y in self.train_loaders[k]:
                opt.zero_grad()
                loss = self.criterion(local(x), y)
                loss.backward()
                opt.step()
                step += 1
                if step == STEPS:
                    break
        return local.state_dict()

    def __call__(self, t: int, clients: np.ndarray) -> dict[str, float]:
        t0 = time.perf_counter()
        states = [self._local_update(int(k)) for k in clients]
        avg = copy.deepcopy(states[0])
        for key in avg:
            for s in states[1:]:
                avg[key] += s[key]
            avg[key] = torch.div(avg[key], len(states))
        self.model.load_state_dict(avg)
        t1 = time.perf_counter()
        self.model.eval()
        losses = []
        with torch.no_grad():
            for loader in self.eval_loaders:
                total, n = 0.0, 0
                for x, y in loader:
                    total += F.cross_entropy(self.model(x), y, reduction="sum").item()
                    n += len(y)
                losses.append(total / n)
        self.losses = np.array(losses)
        t2 = time.perf_counter()
        correct, n = 0, 0
        with torch.no_grad():
            for x, y in self.test_loader:
                correct += int((self.model(x).argmax(1) == y).sum())
                n += len(y)
        self.accuracy = correct / n
        t3 = time.perf_counter()
        return {"total": t3 - t0, "train": t1 - t0, "client_losses": t2 - t1, "test": t3 - t2}


# -- the compute bound -----------------------------------------------------------------
def forward_flops() -> int:
    widths = (784, *HIDDEN, 10)
    return 2 * sum(a * b for a, b in itertools.pairwise(widths))


def backward_flops_exact() -> int:
    """Backward FLOPs per sample: weight gradients everywhere, input gradients except into the image."""
    widths = (784, *HIDDEN, 10)
    pairs = list(itertools.pairwise(widths))
    return 2 * sum(a * b for a, b in pairs) + 2 * sum(a * b for a, b in pairs[1:])


def _gflops(fn: Any, flops: float, repeat: int) -> float:
    fn()  # warm
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return flops / best / 1e9


class Throughput:
    """Matrix-multiply throughput (GFLOP/s), generic and at the MLP's shapes."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.a = torch.randn(2048, 2048, generator=g)
        self.b = torch.randn(2048, 2048, generator=g)
        self.x_eval = torch.randn(60000, 784, generator=g)
        self.w1 = torch.randn(784, 64, generator=g)
        self.x_train = torch.randn(PER_ROUND, BATCH, 784, generator=g)
        self.w_train = torch.randn(PER_ROUND, 784, 64, generator=g)

    def __call__(self) -> dict[str, float]:
        return {
            "mm 2048x2048": _gflops(lambda: torch.mm(self.a, self.b), 2 * 2048**3, 2),
            "eval shape (60000x784)@(784x64)": _gflops(lambda: torch.mm(self.x_eval, self.w1), 2 * 60000 * 784 * 64, 2),
            "train shape 5x(64x784)@(784x64)": _gflops(
                lambda: torch.bmm(self.x_train, self.w_train), 2 * PER_ROUND * BATCH * 784 * 64, 20
            ),
        }


# -- reporting -------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    q = np.percentile(xs, [25, 75])
    return f"IQR {q[0]:.3f}-{q[1]:.3f}, min {min(xs):.3f}, max {max(xs):.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--rounds", type=int, default=15, help="measured rounds per contender (default 15)")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up rounds, not counted (default 3)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's default)")
    ap.add_argument("--dropout", type=float, default=0.0, help="MLP dropout (FedCor's code uses 0.5; default 0)")
    ap.add_argument("--no-trainer", action="store_true", help="skip the FederatedTrainer.fit path")
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=240.0,
        help="stop measuring after this long (default 240; a loaded machine)",
    )
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    print("== bench_engine: FedCor FMNIST 2SPC, seconds per round ==")
    print(f"torch {torch.__version__}, python {platform.python_version()}, numpy {np.__version__}")
    print(f"CPU: {cpu_model()}, os.cpu_count()={os.cpu_count()}, torch.get_num_threads()={torch.get_num_threads()}")
    load_before = os.getloadavg()
    print(f"load average before (1, 5, 15 min): {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")

    t0 = time.perf_counter()
    fed, source = load_federation()
    n_eval = int(sum(len(ix) for ix in fed.loss_indices))
    n_test = len(fed.y_test)
    print(f"data: {source}; {time.perf_counter() - t0:.1f} s")
    print(
        f"  {fed.n_clients} clients, training pool {len(fed.y)}, loss samples {n_eval}, test {n_test}; "
        f"X {fed.X.dtype} {tuple(fed.X.shape)}"
    )
    print(
        f"setting: {PER_ROUND} clients/round x {STEPS} SGD steps of batch {BATCH}, lr {LR}, "
        f"MLP 784-{HIDDEN[0]}-{HIDDEN[1]}-10 dropout {args.dropout}; every client's loss + test set each round"
    )
    print(f"rounds: {args.warmup} warm-up + {args.rounds} measured, interleaved per round")

    torch.manual_seed(0)
    model = FedCorMLP(fed.input_shape, fed.n_classes, hidden=HIDDEN, dropout=args.dropout)
    ours = FedselectRound(fed, copy.deepcopy(model))
    ref = ReferenceRound(fed, copy.deepcopy(model))
    thr = Throughput()
    sel_rng = np.random.default_rng(12345)
    total = args.warmup + args.rounds
    rec: dict[str, list[dict[str, float]]] = {"fedselect": [], "reference": [], "trainer": [], "throughput": []}

    loads: list[float] = []
    t_start = time.perf_counter()

    class _OutOfTime(Exception):
        pass

    def one_iteration(i: int) -> None:
        if i > args.warmup and time.perf_counter() - t_start > args.max_seconds:
            raise _OutOfTime
        clients = sel_rng.choice(fed.n_clients, PER_ROUND, replace=False)
        a = ours(i, clients)
        b = ref(i, clients)
        c = thr()
        loads.append(os.getloadavg()[0])
        if i >= args.warmup:
            rec["fedselect"].append(a)
            rec["reference"].append(b)
            rec["throughput"].append(c)

    done = [0]
    trainer_note = ""
    out_of_time = False
    if not args.no_trainer:
        try:
            from fedselect.simulation import FederatedTrainer

            def callback(trainer: Any, record: Any) -> None:
                # Right after the trainer's round t, one round of each other contender: T E R B T E R B ...
                one_iteration(done[0])
                if done[0] >= args.warmup:
                    rec["trainer"].append({"total": float(record.seconds)})
                done[0] += 1

            trainer = FederatedTrainer(
                selector="random",
                model="mlp",
                model_params={"dropout": args.dropout} if args.dropout else None,
                clients_per_round=PER_ROUND,
                rounds=total,
                local_steps=STEPS,
                batch_size=BATCH,
                lr=LR,
                aggregation="mean",
                track_global_loss=True,
                random_state=0,
                n_threads=args.threads,
                callback=callback,
            )
            trainer.fit(fed)
            acc = trainer.history_.rounds[-1].test_accuracy
            trainer_note = (
                f"FederatedTrainer.fit(selector='random', local_steps={STEPS}, batch_size={BATCH}, lr={LR}, "
                f"aggregation='mean', track_global_loss=True) ran {total} rounds (final test accuracy {acc:.3f})"
            )
        except _OutOfTime:
            out_of_time = True
            trainer_note = "FederatedTrainer.fit ran until the time budget stopped the run"
        except Exception as exc:  # report it, then measure the rest without it
            trainer_note = f"FederatedTrainer could not run: {type(exc).__name__}: {exc}"
    else:
        trainer_note = "FederatedTrainer skipped (--no-trainer)"
    try:
        for i in range(done[0], total) if not out_of_time else ():
            one_iteration(i)
    except _OutOfTime:
        out_of_time = True
    if out_of_time:
        print(f"NOTE: time budget --max-seconds {args.max_seconds:g} reached: {len(rec['fedselect'])} measured rounds")

    load_after = os.getloadavg()
    print(f"load average after  (1, 5, 15 min): {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    print(f"torch.get_num_threads() at the end: {torch.get_num_threads()}")
    print(
        f"1-min load average sampled after every round: min {min(loads):.2f}, median {med(loads):.2f}, "
        f"max {max(loads):.2f} (this process keeps ~{torch.get_num_threads()} threads busy itself)"
    )
    print(trainer_note)
    print(f"final test accuracy: fedselect engine {ours.accuracy:.3f}, reference {ref.accuracy:.3f}")

    # -- the bound
    fwd = forward_flops()
    n_train = PER_ROUND * STEPS * BATCH
    train_flops = n_train * 3 * fwd
    eval_flops = n_eval * fwd
    test_flops = n_test * fwd
    round_flops = train_flops + eval_flops + test_flops
    exact_train = n_train * (fwd + backward_flops_exact())
    tp = {k: med([r[k] for r in rec["throughput"]]) for k in rec["throughput"][0]}
    k_mm, k_eval, k_train = list(tp)
    bound_mm = round_flops / (tp[k_mm] * 1e9)
    bound_shape = train_flops / (tp[k_train] * 1e9) + (eval_flops + test_flops) / (tp[k_eval] * 1e9)
    print()
    print("-- compute lower bound --")
    print(f"forward FLOPs/sample 2*(784*64+64*30+30*10) = {fwd:,}")
    print(
        f"training  {PER_ROUND}x{STEPS}x{BATCH} samples x 3 x fwd = {train_flops / 1e9:.3f} GFLOP "
        f"(exact backward, no input gradient into the image: {exact_train / 1e9:.3f} GFLOP)"
    )
    print(f"client losses {n_eval} samples x fwd = {eval_flops / 1e9:.3f} GFLOP")
    print(f"test          {n_test} samples x fwd = {test_flops / 1e9:.3f} GFLOP")
    print(f"round total   {round_flops / 1e9:.3f} GFLOP")
    for k, v in tp.items():
        xs = [r[k] for r in rec["throughput"]]
        print(f"throughput {k:<34s} median {v:7.1f} GFLOP/s (min {min(xs):.1f}, max {max(xs):.1f})")
    print(f"bound A = round FLOPs / mm-2048 throughput            = {bound_mm:.4f} s/round")
    print(f"bound B = per-phase FLOPs / throughput at MLP shapes  = {bound_shape:.4f} s/round")

    # -- results
    def phase(name: str, key: str) -> float:
        return med([r[key] for r in rec[name]])

    ours_s, ref_s = phase("fedselect", "total"), phase("reference", "total")
    print()
    print(f"-- seconds per round: median of {args.rounds} rounds after {args.warmup} warm-up --")
    print(f"{'contender':<44s} {'total':>8s} {'train':>8s} {'losses':>8s} {'test':>8s}")
    for name, label in (
        ("fedselect", "(1) fedselect Engine (direct)"),
        ("reference", "(2) reference (DataLoaders, per client)"),
    ):
        row = [phase(name, k) for k in ("total", "train", "client_losses", "test")]
        print(f"{label:<44s} " + " ".join(f"{v:8.4f}" for v in row))
    if rec["trainer"]:
        trainer_s = phase("trainer", "total")
        print(f"{'(1b) fedselect FederatedTrainer.fit':<44s} {trainer_s:8.4f}   (per-round record.seconds)")
    print(f"{'(3) lower bound A (mm 2048)':<44s} {bound_mm:8.4f}")
    print(f"{'(3) lower bound B (MLP shapes)':<44s} {bound_shape:8.4f}")
    print(f"{'official FedCor code (GIVEN, not measured)':<44s} {FEDCOR_OFFICIAL:8.4f}")
    print(f"{'  same without per-sample transforms (GIVEN)':<44s} {FEDCOR_OFFICIAL_NO_TRANSFORMS:8.4f}")
    print()
    print("spread of the totals:")
    print(f"  fedselect engine: {spread([r['total'] for r in rec['fedselect']])}")
    print(f"  reference:        {spread([r['total'] for r in rec['reference']])}")
    if rec["trainer"]:
        print(f"  trainer.fit:      {spread([r['total'] for r in rec['trainer']])}")
    print()
    print("-- ratios --")
    print(f"fedselect / lower bound A  = {ours_s / bound_mm:6.2f}x   (goal <= 2x)")
    print(f"fedselect / lower bound B  = {ours_s / bound_shape:6.2f}x")
    print(f"reference / fedselect      = {ref_s / ours_s:6.2f}x   (expected 5-10x)")
    if rec["trainer"]:
        print(f"trainer.fit / engine       = {trainer_s / ours_s:6.2f}x")
    ours_min = min(r["total"] for r in rec["fedselect"])
    ref_min = min(r["total"] for r in rec["reference"])
    bound_min = round_flops / (max(r[k_mm] for r in rec["throughput"]) * 1e9)
    print(
        f"least-disturbed rounds (minimum of each; bound at the best mm throughput {bound_min:.4f} s): "
        f"fedselect {ours_min:.4f} s = {ours_min / bound_min:.2f}x bound A, reference {ref_min:.4f} s = "
        f"{ref_min / ours_min:.2f}x fedselect"
    )
    print(f"official FedCor 3.1 s (given) / fedselect            = {FEDCOR_OFFICIAL / ours_s:6.1f}x")
    print(f"official FedCor 0.65 s w/o transforms (given) / fedselect = {FEDCOR_OFFICIAL_NO_TRANSFORMS / ours_s:6.1f}x")
    print("(the official numbers come from the issue, measured on other hardware; not comparable run-to-run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
