"""The two ``.npz`` formats fedselect writes for devices, and their one reader, which never unpickles.

``fedselect.system-profiles`` is what :meth:`~fedselect.profiles.SystemProfiles.save` writes;
``fedselect.fedscale-trace`` is what :func:`~fedselect.profiles.convert_fedscale_traces` writes.
:func:`read_npz` reads either: it admits only the format's own member names and checks every
member's size before reading it (``allow_pickle`` never set).
"""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from .._npy import read_npy_member

__all__ = ["FORMAT_VERSION", "PROFILES_FORMAT", "TRACE_FORMAT", "read_npz"]

PROFILES_FORMAT = "fedselect.system-profiles"
"""The ``format`` entry of a profiles file (:meth:`~fedselect.profiles.SystemProfiles.save`)."""
TRACE_FORMAT = "fedselect.fedscale-trace"
"""The ``format`` entry of a converted FedScale trace (:func:`~fedselect.profiles.convert_fedscale_traces`)."""
FORMAT_VERSION = 1
"""The ``version`` entry of both formats."""

_NPZ_MEMBERS = {
    PROFILES_FORMAT: frozenset(
        "format version n_clients seconds_per_sample download_bandwidth upload_bandwidth latency availability_offsets "
        "availability_starts availability_ends availability_period".split()
    ),
    TRACE_FORMAT: frozenset(
        "format version kind keys computation_ms communication_kbps offsets starts ends finish_time model".split()
    ),
}
# A member may unpack to this many times its compressed size (plus 64 KiB): np.savez stores members uncompressed.
_NPZ_RATIO = 16


def _npz_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    """One ``.npy`` member, its header checked against the member's size before anything is allocated."""
    return read_npy_member(zf, info)


def read_npz(path: Path, fmt: str) -> dict[str, Any]:
    """The expected members of a ``.npz`` written by fedselect, each size checked before it is read.

    Member names outside the format's list, members that unpack to more than 16x their
    compressed size (+ 64 KiB) and ``.npy`` headers that disagree with their member's size are
    refused before anything of the claimed size is allocated; no pickle is ever read.
    """
    expected = _NPZ_MEMBERS[fmt]
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            for info in infos:
                key = info.filename.removesuffix(".npy")
                if key == info.filename or key not in expected:
                    raise ValueError(f"unexpected member {info.filename!r}")
                if info.file_size > _NPZ_RATIO * info.compress_size + 2**16:
                    raise ValueError(
                        f"member {info.filename!r} unpacks to {info.file_size} bytes from {info.compress_size} "
                        f"(more than {_NPZ_RATIO}x)"
                    )
            data = {info.filename.removesuffix(".npy"): _npz_member(zf, info) for info in infos}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:  # object arrays: ValueError
        raise ValueError(f"{path}: not a readable .npz of plain arrays ({exc})") from exc
    found = str(data["format"]) if "format" in data and data["format"].dtype.kind == "U" else None
    version = data.get("version")
    if (
        found != fmt
        or version is None
        or version.shape != ()
        or version.dtype.kind not in "iu"
        or int(version) != FORMAT_VERSION
    ):
        raise ValueError(f"{path}: format {found!r} version {version!r}; expected {fmt!r} version {FORMAT_VERSION}")
    for k, arr in data.items():
        if k != "format" and arr.dtype.kind not in "biufU":
            raise ValueError(f"{path}: entry {k!r} has dtype {arr.dtype}; expected numbers or strings")
    data["format"], data["version"] = fmt, FORMAT_VERSION
    return data
