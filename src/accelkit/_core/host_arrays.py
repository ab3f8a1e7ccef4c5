"""Host-array conversions with accelkit's casting rules, shared by every backend's host side
(the CPU backend's kernels, and the staging copies of device backends)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["assign", "cast_into", "up"]

Array = np.ndarray[Any, Any]
_LOW = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def up(x: Any) -> Any:
    """Low-precision float arrays as F32; everything else unchanged."""
    if isinstance(x, np.ndarray) and x.dtype in _LOW:
        return x.astype(np.float32)
    return x


def cast_into(x: Array, out: Array) -> None:
    """Cast with C semantics: floats to ints truncate toward zero; NaN and out-of-range values
    become 0 rather than a platform-dependent value."""
    if out.dtype.kind in "iu" and (x.dtype.kind == "f" or x.dtype in _LOW):  # bf16's kind is "V"
        info = np.iinfo(out.dtype)
        with np.errstate(invalid="ignore"):
            # The truncated value is range-checked against bounds that are exact in the working
            # dtype (min and max + 1 are powers of two), so 255.9 -> 255 fits a u8 and 2**31
            # misses an i32. NaN fails both comparisons. Up to 16-bit targets, F32 (and F16, BF16
            # through it) holds every bound and every truncated value exactly: no F64 copy.
            narrow = info.bits <= 16 and x.dtype.itemsize <= 4
            t = np.trunc(x.astype(np.float32 if narrow else np.float64, copy=not narrow))
            ok = t >= float(info.min)
            ok &= t < float(info.max) + 1.0
            # Out-of-range values become 0 by a multiply (a masked copy is several times slower);
            # NaN and +-inf (NaN after the multiply) are then zeroed, usually none.
            t *= ok
            nan = np.isnan(t)
            if nan.any():
                t[nan] = 0
            out[...] = t
        return
    if out.dtype == np.bool_:
        np.not_equal(up(x), 0, out=out)
        return
    with np.errstate(all="ignore"):
        out[...] = x if x.dtype not in _LOW or out.dtype in _LOW else x.astype(np.float32)


def assign(dst: Array, array: Array) -> None:
    """Store ``array`` into ``dst`` with accelkit's conversion rules (floats to integers as C
    casts do, see :func:`cast_into`; other conversions as NumPy's, silently)."""
    if array.dtype == dst.dtype:
        np.copyto(dst, array)
    elif array.dtype.kind == "f" and dst.dtype.kind in "iub":
        cast_into(array, dst)
    else:
        with np.errstate(all="ignore"):
            dst[...] = array
