"""OpenCL C types of accelkit dtypes, literals, and the strided indexing every kernel shares."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from accelkit.dtype import DType

__all__ = [
    "LOAD_TYPES", "STORE_TYPES", "broadcast_strides", "category", "collapse", "contiguous_strides",
    "load_type", "numpy_scalar", "pragmas",
]  # fmt: skip

#: How each dtype is stored in a buffer (BOOL is one byte, 0 or 1, as in NumPy).
STORE_TYPES: dict[DType, str] = {
    DType.F16: "half", DType.F32: "float", DType.F64: "double", DType.I8: "char",
    DType.I16: "short", DType.I32: "int", DType.I64: "long", DType.U8: "uchar",
    DType.U16: "ushort", DType.U32: "uint", DType.U64: "ulong", DType.BOOL: "uchar",
}  # fmt: skip
#: The type arithmetic runs in: F16 computes in float (as NumPy's f16 ops round per op).
LOAD_TYPES: dict[DType, str] = {**STORE_TYPES, DType.F16: "float"}

_NUMPY = {
    "float": np.float32, "double": np.float64, "char": np.int8, "short": np.int16,
    "int": np.int32, "long": np.int64, "uchar": np.uint8, "ushort": np.uint16,
    "uint": np.uint32, "ulong": np.uint64,
}  # fmt: skip


def load_type(dtype: DType) -> str:
    return LOAD_TYPES[dtype]


def category(dtype: DType) -> str:
    """'f' floating, 'i' signed integer, 'u' unsigned integer, 'b' bool."""
    if dtype is DType.BOOL:
        return "b"
    if dtype.is_floating:
        return "f"
    return "i" if dtype.is_signed else "u"


def numpy_scalar(ctype: str, value: int | float | bool) -> np.generic:
    """A kernel argument of C type ``ctype`` holding ``value`` (C conversion rules)."""
    kind = _NUMPY[ctype]
    if kind in (np.float32, np.float64):
        return cast(np.generic, np.array(value, kind)[()])
    v = int(value)
    bits = 8 * np.dtype(kind).itemsize
    v &= (1 << bits) - 1  # wrap as a C conversion to an unsigned, then reinterpret
    return cast(np.generic, np.array(v, np.uint64).astype(kind)[()])


def pragmas(ctypes: Sequence[str]) -> str:
    text = ""
    if "double" in ctypes:
        text += "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
    if "half" in ctypes:
        text += "#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n"
    return text


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides = [0] * len(shape)
    step = 1
    for i in range(len(shape) - 1, -1, -1):
        strides[i] = step
        step *= shape[i]
    return tuple(strides)


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a C-contiguous ``shape`` read as ``out_shape`` (0 where broadcast)."""
    own = contiguous_strides(shape)
    pad = len(out_shape) - len(shape)
    return tuple(
        0 if i < pad or shape[i - pad] == 1 else own[i - pad] for i in range(len(out_shape))
    )


def collapse(
    shape: Sequence[int], strides: Sequence[Sequence[int]]
) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Drop size-1 dimensions and merge neighbours every operand walks contiguously, so that a
    same-shape operation becomes one flat loop. Returns at least one dimension."""
    dims = [i for i, d in enumerate(shape) if d != 1]
    new_shape: list[int] = []
    new_strides: list[list[int]] = [[] for _ in strides]
    for i in dims:
        if new_shape and all(
            s[i] * shape[i] == ns[-1] for s, ns in zip(strides, new_strides, strict=True)
        ):
            new_shape[-1] *= shape[i]
            for s, ns in zip(strides, new_strides, strict=True):
                ns[-1] = s[i]
            continue
        new_shape.append(shape[i])
        for s, ns in zip(strides, new_strides, strict=True):
            ns.append(s[i])
    if not new_shape:
        return (1,), [(0,) for _ in strides]
    return tuple(new_shape), [tuple(ns) for ns in new_strides]
