"""The landing page's picture: why client selection matters, from recorded runs.

Reads the 40 runs stored (gzipped) in ``benchmarks/reproductions/fedcor/fedcor-fmnist-1spc/runs``, made
by ``fedselect reproduce fedcor-fmnist-1spc`` (FedCor's Table 1 setting, Fashion-MNIST with
one label shard per client), and draws test accuracy against rounds for random,
power-of-choice and FedCor: the mean over the 10 seeds with a +-1 standard deviation band.
Nothing is trained; reading the runs takes a few seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "benchmarks" / "reproductions" / "fedcor" / "fedcor-fmnist-1spc"
TARGET = 0.62  # the preset's target (FedCor's Table 1, FMNIST 1SPC)
SHOWN = {"Random": "random", "Pow-d": "power-of-choice (d = 2n)", "FedCor": "FedCor"}


def landing_figure() -> Any:
    import matplotlib.pyplot as plt

    from fedselect.compare import load_comparison
    from fedselect.plotting import plot_accuracy

    comp, _ = load_comparison(RUNS, TARGET, labels=list(SHOWN))
    missing = [label for label, runs in comp.histories.items() if not runs]
    if missing:
        raise FileNotFoundError(f"landing_figure: no recorded runs of {missing} in {RUNS / 'runs'}")
    results = {SHOWN[label]: list(runs.values()) for label, runs in comp.histories.items()}
    fig, ax = plt.subplots(figsize=(9.5, 4), constrained_layout=True)
    plot_accuracy(results, target=TARGET, ax=ax)
    ax.set_ylim(0.2, 0.75)
    ax.set_title("Fashion-MNIST, 100 clients holding one label each, 10 chosen per round "
                 "(MLP, FedAvg with equal weights)", fontsize="medium")
    return fig
