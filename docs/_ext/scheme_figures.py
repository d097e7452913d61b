"""The figure on each scheme's page, drawn at documentation build time.

Every scheme runs for :data:`ROUNDS` rounds on the same tiny federation,
:class:`fedselect.testing.SyntheticOracle` with :data:`N_CLIENTS` quadratic clients in
:data:`N_GROUPS` groups (clients of one group share an optimum, a stand-in for label
skew) and random sizes n_k. No neural network is trained, so a scheme takes a second or
two. The figure shows who is chosen in every round, how often each client is chosen
against its size, and what the oracle was asked, cumulated over rounds, next to random
selection's cost.

Used by the ``.. plot::`` directives of ``docs/selectors/*.rst``::

    from scheme_figures import scheme_figure
    scheme_figure("fedcor")
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import numpy as np

N_CLIENTS = 40
N_GROUPS = 4
PER_ROUND = 5
ROUNDS = 60
SEED = 0

ROOT = Path(__file__).resolve().parents[2]


def make_selector(name: str) -> Any:
    """The selector named ``name`` with its default parameters (DivFL from the plugin's source tree)."""
    if name == "divfl":
        src = ROOT / "plugins" / "fedselect-divfl" / "src"
        if str(src) not in sys.path:
            sys.path.insert(0, str(src))
        from fedselect_divfl import DivFLSelector

        return DivFLSelector(random_state=SEED)
    from fedselect.selectors import (
        afl,
        clustered,
        data_size,
        fedcor,
        hcsfed,
        ldcs,
        ocs,
        power_of_choice,
        random,
        round_robin,
    )

    classes = {
        "random": random.RandomSelector,
        "round-robin": round_robin.RoundRobinSelector,
        "data-size": data_size.DataSizeSelector,
        "power-of-choice": power_of_choice.PowerOfChoiceSelector,
        "afl": afl.ActiveFLSelector,
        "fedcor": fedcor.FedCorSelector,
        "hcsfed": hcsfed.HCSFedSelector,
        "ldcs": ldcs.LargestDistanceSelector,
        "clustered": clustered.ClusteredSamplingSelector,
        "ocs": ocs.OptimalClientSamplingSelector,
    }
    if name not in classes:
        raise KeyError(f"scheme_figure: unknown scheme {name!r}; expected one of {[*sorted(classes), 'divfl']}")
    return classes[name](random_state=SEED)


def run(name: str, **params: Any) -> dict[str, Any]:
    """Run the scheme; return the selections (rounds x clients, 0/1) and the cumulative costs per round."""
    from fedselect.selection import ClientPool
    from fedselect.testing import SyntheticOracle

    selector = make_selector(name)
    if params:
        selector.set_params(**params)
    oracle = SyntheticOracle(N_CLIENTS, n_groups=N_GROUPS, random_state=SEED)
    pool = ClientPool(oracle.n_samples)
    selector.fit(pool)
    chosen = np.zeros((ROUNDS, N_CLIENTS))
    costs = []
    variable = bool(getattr(selector, "variable_size", False))
    for t in range(ROUNDS):
        raw = selector.select(PER_ROUND, round=t, oracle=oracle)
        sel = raw.validated(N_CLIENTS, PER_ROUND, variable_size=variable, source=name)
        chosen[t, sel.clients] = 1
        feedback = oracle.run_round(sel, needs=selector.needs)
        selector.update(feedback)
        costs.append(oracle.costs.to_dict())
    return {"chosen": chosen, "costs": costs, "n_samples": np.asarray(oracle.n_samples), "groups": oracle.groups}


@functools.lru_cache(maxsize=1)
def _random_reference() -> dict[str, Any]:
    return run("random")


def scheme_figure(name: str, **params: Any) -> Any:
    """Draw the three-panel figure of scheme ``name`` (extra ``params`` are set on the selector)."""
    import matplotlib.pyplot as plt

    res = run(name, **params)
    ref = _random_reference()
    n_k, groups = res["n_samples"], res["groups"]
    order = np.lexsort((n_k, groups))  # by group, then by size
    colors = plt.get_cmap("tab10")(np.arange(N_GROUPS))

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4), constrained_layout=True,
                             gridspec_kw={"width_ratios": [1.5, 1, 1.1]})
    ax = axes[0]
    ax.imshow(res["chosen"][:, order].T, aspect="auto", cmap="Greys", interpolation="nearest",
              extent=(0.5, ROUNDS + 0.5, N_CLIENTS - 0.5, -0.5))
    for g in range(1, N_GROUPS):
        ax.axhline(np.searchsorted(groups[order], g) - 0.5, color="tab:red", lw=0.8)
    ax.set_xlabel("round")
    ax.set_ylabel("client (by group, then n_k)")
    ax.set_title("who is chosen (black); red lines: groups", fontsize="medium")

    ax = axes[1]
    times = res["chosen"].sum(0)
    for g in range(N_GROUPS):
        mask = groups == g
        ax.scatter(n_k[mask], times[mask], s=18, color=colors[g], label=f"group {g}")
    ax.axhline(ROUNDS * PER_ROUND / N_CLIENTS, ls=":", color="0.4", lw=1, label="uniform share")
    ax.set_xlabel("client size n_k")
    ax.set_ylabel(f"rounds chosen (of {ROUNDS})")
    ax.set_title("how often, against size", fontsize="medium")
    ax.legend(fontsize="x-small", loc="upper left")

    ax = axes[2]
    x = np.arange(1, ROUNDS + 1)
    for key, style in (("models_down", "-"), ("local_trainings", "--")):
        ax.plot(x, [c[key] for c in res["costs"]], style, color="tab:blue", label=f"{name}: {key.replace('_', ' ')}")
    ax.plot(x, [c["models_down"] for c in ref["costs"]], "-", color="0.6", lw=1,
            label="random: models down = trainings")
    ax.set_xlabel("round")
    ax.set_ylabel("cumulative count")
    ax.set_title("what the round and the oracle cost", fontsize="medium")
    ax.legend(fontsize="x-small", loc="upper left")
    fig.suptitle(f"{name} on SyntheticOracle: N = {N_CLIENTS} clients in {N_GROUPS} groups, "
                 f"n = {PER_ROUND} per round, seed {SEED}", fontsize="medium")
    return fig
