"""Why HCSFed diverges in the calibrated setting: its aggregation weights, round by round.

Reruns one seed of one HCSFed row of ``hcsfed-fmnist-q<q>-calibrated`` (the same federation,
model start and selector stream as ``fedselect reproduce``, so the same path on the same
machine) with the divergence check off, and prints per round: the test loss, the sum and the
largest of the aggregation weights ``p_k / pi_k``, and for the client with the largest weight
its data-size weight p_k (times N), its marginal inclusion probability pi_k, its cluster's real
share s_h of Eq. 5 and integer m_h, and the sorted shares of every cluster. A large weight on
a client whose cluster has a share s_h << 1 is systematic rounding's unbiasedness at work
(see ``HCSFedSelector``'s ``rounding`` parameter).

Usage::

    python -m benchmarks.reproductions.hcsfed.hcsfed_weights --row HCSFed --seed 2 --rounds 16
    python -m benchmarks.reproductions.hcsfed.hcsfed_weights --row "HCSFed (cohesion=std)" --seed 2 --rounds 16
"""

from __future__ import annotations

import argparse
import subprocess

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--q", default="0.1", choices=("0.1", "0.3", "0.5"))
    ap.add_argument("--row", default="HCSFed", help="a row label of the preset (default: HCSFed)")
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)

    import torch

    from fedselect.compare import run_comparison
    from fedselect.presets import PRESETS

    torch.set_num_threads(args.threads)
    preset = PRESETS[f"hcsfed-fmnist-q{args.q}-calibrated"]
    if args.row not in preset.selectors:
        ap.error(f"--row {args.row!r} is not a row of {preset.name}: {', '.join(preset.selectors)}")
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(
        f"{preset.name}, row {args.row!r}, seed {args.seed}, {args.rounds} rounds, divergence check off; "
        f"commit {commit or 'unknown'}"
    )
    print("round  test loss  sum w  max w | client  p_k*N  pi_k     | cluster share  m_h  N_h | all shares")

    def show(trainer, record) -> None:
        sel = trainer.selector_
        w, c = np.asarray(record.weights), np.asarray(record.clients)
        i = int(np.argmax(w))
        h = int(sel.labels_[c[i]])
        print(
            f"{record.round:5d}  {record.test_loss:9.2f}  {w.sum():5.2f}  {w.max():5.2f} | {c[i]:6d}  "
            f"{sel.weights_[c[i]] * len(sel.weights_):5.2f}  {sel.inclusion_[c[i]]:.4f}   | {h:7d} "
            f"{sel.shares_[h]:5.3f}  {sel.allocation_[h]:3d}  {(sel.labels_ == h).sum():3d} | "
            f"{np.array2string(np.sort(sel.shares_), precision=2, suppress_small=True)}",
            flush=True,
        )

    run_comparison(
        {args.row: preset.selectors[args.row]},
        federation=preset.federation,
        trainer={**preset.trainer, "rounds": args.rounds, "callback": show, "divergence": None},
        seeds=[args.seed],
        target=preset.target,
        progress=False,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
