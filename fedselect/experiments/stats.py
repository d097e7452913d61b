"""Statistics of a comparison: paired differences by seed, the Wilcoxon signed-rank test, Holm's adjustment."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["holm", "min_pairs", "paired_summary"]


def min_pairs(alpha: float = 0.05) -> int:
    """The fewest pairs with a nonzero difference for which the exact two-sided signed-rank test can give p < alpha.

    With n such pairs all one way the exact test's p-value is ``2 / 2**n``, its smallest; below
    this many pairs no outcome can reach ``alpha`` (6 for 0.05), so a comparison gives no verdict.

    Examples
    --------
    >>> min_pairs(0.05), min_pairs(0.01)
    (6, 8)
    """
    n = 1
    while 2.0 / 2**n >= alpha:
        n += 1
    return n


def paired_summary(diffs: Sequence[float]) -> dict[str, Any]:
    """Summary of per-seed differences ``other - reference``: what a paired comparison reports.

    Parameters
    ----------
    diffs : sequence of float
        One difference per shared seed (or per matched pair).

    Returns
    -------
    dict
        ``diffs`` (as a list), ``mean``, ``std`` (population), ``median``, ``faster`` / ``ties`` /
        ``slower`` (differences > 0, == 0, < 0: with rounds to a target, the reference was faster,
        tied, slower) and ``p``, the two-sided Wilcoxon signed-rank test (zero differences dropped;
        NaN when every difference is zero or there are fewer than two). Empty input gives NaN
        statistics and zero counts.
    """
    from scipy.stats import wilcoxon

    d = np.asarray(diffs, dtype=np.float64)
    if d.size == 0:
        nan = float("nan")
        return {"diffs": [], "mean": nan, "std": nan, "median": nan, "faster": 0, "ties": 0, "slower": 0, "p": nan}
    p = float(wilcoxon(d).pvalue) if d.size > 1 and np.any(d != 0) else float("nan")
    return {
        "diffs": d.tolist(),
        "mean": float(d.mean()),
        "std": float(d.std()),
        "median": float(np.median(d)),
        "faster": int((d > 0).sum()),
        "ties": int((d == 0).sum()),
        "slower": int((d < 0).sum()),
        "p": p,
    }


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (NaN entries are left out and stay NaN).

    With m tests sorted by p-value, the i-th smallest (from 0) becomes
    ``max_{j <= i} min(1, (m - j) p_(j))``; rejecting where the adjusted value is below alpha
    controls the family-wise error rate at alpha without assuming independence (Holm, 1979).

    Examples
    --------
    >>> holm([0.01, 0.04, 0.03])
    [0.03, 0.06, 0.06]
    """
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    m = ok.size
    running = 0.0
    for rank, i in enumerate(ok[np.argsort(p[ok], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return [round(float(x), 12) if np.isfinite(x) else float("nan") for x in out]
