"""Checkpoint overhead per round at checkpoint_every = 10 on FedCor's FMNIST 2SPC preset.

The preset ``fedcor-fmnist-2spc`` (N = 100 clients with 2 label shards of Fashion-MNIST, 5 per
round, 3 local epochs of batch 64, FedCor's MLP with dropout 0.5, client losses on a 20 %
holdout) trains ``--rounds`` rounds per run, once without checkpoints and once with
``checkpoint_dir`` set and ``checkpoint_every=10`` (the run's last round also writes the final
checkpoint, so 20 rounds make exactly one write per 10 rounds). The two are interleaved,
pair after pair, so that machine noise hits both alike. The time of a run is the wall-clock
time from the end of its first round to the end of its last, measured from the trainer's
callback, so federation loading and model building are excluded and every checkpoint write
(each happens right after a callback) falls inside. Reported: per selector, the median over
pairs of the seconds per round of each, the median per-pair overhead ratio, and the median
time of one checkpoint write and its size.

If the Fashion-MNIST IDX files are not installed, the script says so and uses digits with the
preset's other settings.

Usage::

    python -m benchmarks.speed.bench_checkpoint [--rounds 21] [--pairs 5] [--selectors random fedcor]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fedselect import FederatedTrainer, get_selector
from fedselect.data import make_federation
from fedselect.presets import get_preset
from fedselect.simulation import trainer as trainer_module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=21, help="rounds per run (timed: rounds 1..R-1)")
    ap.add_argument("--pairs", type=int, default=5, help="interleaved (without, with) pairs per selector")
    ap.add_argument("--every", type=int, default=10, help="checkpoint_every")
    ap.add_argument("--selectors", nargs="+", default=["random", "fedcor"])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    preset = get_preset("fedcor-fmnist-2spc")
    federation = dict(preset.federation)
    try:
        fed = make_federation(random_state=0, **federation)
        data_note = "Fashion-MNIST (IDX files found)"
    except (FileNotFoundError, OSError) as exc:
        federation["dataset"] = "digits"
        federation["n_clients"] = 30
        fed = make_federation(random_state=0, **federation)
        data_note = f"digits, N = 30 (Fashion-MNIST not installed: {exc})"
    trainer_kw = dict(preset.trainer, rounds=args.rounds, n_threads=args.threads)

    writes: list[float] = []
    original = trainer_module.write_checkpoint

    def timed_write(path, state):
        t0 = time.perf_counter()
        original(path, state)
        writes.append(time.perf_counter() - t0)

    trainer_module.write_checkpoint = timed_write

    def run(name: str, ckpt: Path | None) -> float:
        marks: list[float] = []
        kw = dict(trainer_kw, callback=lambda tr, rec: marks.append(time.perf_counter()))
        if ckpt is not None:
            kw.update(checkpoint_dir=ckpt, checkpoint_every=args.every)
        params = dict(preset.selectors.get({"random": "Random", "fedcor": "FedCor"}.get(name, ""), (name, {}))[1])
        FederatedTrainer(selector=get_selector(name, **params), random_state=0, **kw).fit(fed)
        # the last round's checkpoint is written after its callback: include it
        end = time.perf_counter()
        return (end - marks[0]) / (len(marks) - 1 + 0.0) if len(marks) > 1 else float("nan")

    print(
        f"checkpoint overhead, {preset.name} preset on {data_note}; {args.rounds} rounds per run, "
        f"checkpoint_every={args.every}, {args.pairs} interleaved pairs per selector, {args.threads} thread(s)"
    )
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}")
    for name in args.selectors:
        base, with_ck, ratios = [], [], []
        writes.clear()
        size = 0
        for _ in range(args.pairs):
            tmp = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
            try:
                a = run(name, None)
                b = run(name, tmp)
                size = (tmp / "checkpoint.pkl").stat().st_size
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            base.append(a)
            with_ck.append(b)
            ratios.append(b / a - 1)
        w = statistics.median(writes)
        print(
            f"{name:>8}: s/round without {statistics.median(base):.4f}, with {statistics.median(with_ck):.4f}; "
            f"overhead per round {100 * statistics.median(ratios):+.2f} % (median of pairs; range "
            f"{100 * min(ratios):+.2f} .. {100 * max(ratios):+.2f} %); one write {1000 * w:.1f} ms median "
            f"(max {1000 * max(writes):.1f}, {len(writes)} writes), {size / 1e6:.2f} MB; one write / {args.every} "
            f"rounds: {100 * w / args.every / statistics.median(base):.2f} % of a round"
        )


if __name__ == "__main__":
    main()
