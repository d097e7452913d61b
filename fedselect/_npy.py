"""Reading one ``.npy`` member of a zip file with its size checked before anything is allocated.

Shared by the checkpoint reader and the profiles reader: the header's shape and dtype must
account for exactly the member's bytes, object arrays are refused, and no pickle is read.
"""

from __future__ import annotations

import math
import zipfile

import numpy as np


def read_npy_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, *, error: type[Exception] = ValueError) -> np.ndarray:
    """The array of member ``info``; ``error(message)`` for a bad version, an object dtype, a size mismatch."""
    fmt = np.lib.format
    with zf.open(info) as fh:
        version = fmt.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(fh)
        else:
            raise error(f"{info.filename}: .npy version {version}")
        if dtype.hasobject:
            raise error(f"{info.filename}: an object array")
        header = fh.tell()
        count = math.prod(shape)
        if header + count * dtype.itemsize != info.file_size:  # before anything of that size is allocated
            raise error(
                f"{info.filename}: its header says {shape} {dtype}, the member holds {info.file_size - header} bytes"
            )
        flat = np.empty(count, dtype=dtype)
        if flat.nbytes and fh.readinto(memoryview(flat.view(np.uint8))) != flat.nbytes:
            raise error(f"{info.filename}: truncated")
    return flat.reshape(shape, order="F" if fortran else "C")
