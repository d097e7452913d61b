"""The array checks every profile type and file reader shares: one message per bad entry, naming the field."""

from __future__ import annotations

from typing import Any

import numpy as np


def _float_array(
    owner: str,
    name: str,
    values: Any,
    n: int | None,
    *,
    positive: bool = True,
    low: float | None = None,
    high: float | None = None,
) -> np.ndarray:
    """``values`` as a read-only 1-D float64 array of length ``n``, finite and positive (or >= 0), within
    ``[low, high]`` where given."""
    try:
        arr = np.array(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: an integer such as 10**400
        raise ValueError(f"{owner}: {name} must be an array of numbers, got {values!r:.80} ({exc})") from exc
    if isinstance(values, np.ndarray) and values.dtype.kind not in "biuf":
        raise ValueError(f"{owner}: {name} must hold numbers, got dtype {values.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{owner}: {name} must be 1-D (one value per client), got shape {arr.shape}")
    if n is not None and arr.size != n:
        raise ValueError(f"{owner}: {name} has {arr.size} entries but there are {n} clients")
    bad = ~np.isfinite(arr) | ((arr <= 0) if positive else (arr < 0))
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        what = "finite positive" if positive else "finite non-negative"
        raise ValueError(f"{owner}: {name} must hold {what} numbers; entry {k} is {float(arr[k])!r}")
    out = ((arr < low) if low is not None else False) | ((arr > high) if high is not None else False)
    if np.any(out):
        k = int(np.flatnonzero(np.broadcast_to(out, arr.shape))[0])
        raise ValueError(
            f"{owner}: {name} must be {f'at least {low:g}' if low is not None else f'at most {high:g}'} so that every "
            f"simulated time stays finite; entry {k} is {float(arr[k])!r}"
        )
    arr.setflags(write=False)
    return arr


def _times(t: Any, m: int, what: str) -> np.ndarray:
    arr = np.asarray(t, dtype=np.float64)
    if arr.ndim > 1 or (arr.ndim == 1 and arr.size != m):
        raise ValueError(f"{what}: t must be a number or one number per client ({m}), got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{what}: t must be finite, got {t!r:.80}")
    return np.broadcast_to(arr, (m,))


def _per_client(owner: str, name: str, value: Any, m: int) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim > 1 or (arr.ndim == 1 and arr.size != m):
        raise ValueError(f"{owner}: {name} must be a number or one number per client ({m}), got shape {arr.shape}")
    if not (np.isfinite(arr).all() and (arr >= 0).all()):
        raise ValueError(f"{owner}: {name} must be finite and non-negative, got {value!r:.80}")
    return np.broadcast_to(arr, (m,))
