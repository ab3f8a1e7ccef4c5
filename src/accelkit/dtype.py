"""Element types and the promotion rules every backend shares."""

from __future__ import annotations

import enum
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

# NumPy and ml_dtypes are imported on first use, not here: listing backends and selecting one
# need DType but not NumPy, and `import accelkit` stays cheap.

__all__ = ["DType", "result_type", "scalar_result_type"]


class DType(enum.Enum):
    """An element type. ``value`` is the canonical lower-case name (``"f32"``)."""

    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"
    F64 = "f64"
    I8 = "i8"
    I16 = "i16"
    I32 = "i32"
    I64 = "i64"
    U8 = "u8"
    U16 = "u16"
    U32 = "u32"
    U64 = "u64"
    BOOL = "bool"

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _ITEMSIZE[self]

    @property
    def is_floating(self) -> bool:
        return self in _FLOATS

    @property
    def is_integer(self) -> bool:
        return self in _INTS

    @property
    def is_signed(self) -> bool:
        return self in _FLOATS or self in _SIGNED_INTS

    def to_numpy(self) -> np.dtype[Any]:
        """The NumPy dtype (``ml_dtypes.bfloat16`` for BF16)."""
        return _numpy_maps()[0][self]

    @classmethod
    def from_any(cls, value: object) -> DType:
        """Accept a DType, its name (``"f32"``, ``"float32"``), or a NumPy dtype or type."""
        if isinstance(value, DType):
            return value
        if isinstance(value, str):
            key = value.lower()
            if key in _BY_NAME:
                return _BY_NAME[key]
        if value is None:  # np.dtype(None) would be float64
            raise _invalid(
                f"unknown dtype None; expected one of: {', '.join(d.value for d in cls)}"
            )
        import numpy as np

        try:
            npd = np.dtype(value)  # type: ignore[call-overload]
        except TypeError:
            npd = None
        from_numpy = _numpy_maps()[1]
        if npd is not None and npd.byteorder in "<>":
            npd = npd.newbyteorder("=")  # '>f4' is F32 too: the data's values are what count
        if npd is not None and npd in from_numpy:
            return from_numpy[npd]
        accepted = ", ".join(d.value for d in cls)
        raise _invalid(f"unknown dtype {value!r}; expected one of: {accepted}")

    def __str__(self) -> str:
        return self.value

    # Members are singletons compared by identity, so identity hashing is consistent with
    # equality, and it is a C-level hash: DType keys every hot dict and set lookup.
    __hash__ = object.__hash__


def _invalid(msg: str) -> Exception:
    from accelkit.errors import InvalidArgumentError

    return InvalidArgumentError(msg)


_ITEMSIZE = {
    DType.F16: 2, DType.BF16: 2, DType.F32: 4, DType.F64: 8,
    DType.I8: 1, DType.I16: 2, DType.I32: 4, DType.I64: 8,
    DType.U8: 1, DType.U16: 2, DType.U32: 4, DType.U64: 8, DType.BOOL: 1,
}  # fmt: skip
_FLOATS = frozenset({DType.F16, DType.BF16, DType.F32, DType.F64})
_SIGNED_INTS = frozenset({DType.I8, DType.I16, DType.I32, DType.I64})
_INTS = _SIGNED_INTS | {DType.U8, DType.U16, DType.U32, DType.U64}


@cache
def _numpy_maps() -> tuple[dict[DType, np.dtype[Any]], dict[np.dtype[Any], DType]]:
    import ml_dtypes
    import numpy as np

    to_numpy: dict[DType, np.dtype[Any]] = {
        DType.F16: np.dtype(np.float16), DType.BF16: np.dtype(ml_dtypes.bfloat16),
        DType.F32: np.dtype(np.float32), DType.F64: np.dtype(np.float64),
        DType.I8: np.dtype(np.int8), DType.I16: np.dtype(np.int16),
        DType.I32: np.dtype(np.int32), DType.I64: np.dtype(np.int64),
        DType.U8: np.dtype(np.uint8), DType.U16: np.dtype(np.uint16),
        DType.U32: np.dtype(np.uint32), DType.U64: np.dtype(np.uint64),
        DType.BOOL: np.dtype(np.bool_),
    }  # fmt: skip
    return to_numpy, {v: k for k, v in to_numpy.items()}


_BY_NAME = {d.value: d for d in DType} | {
    "float16": DType.F16, "half": DType.F16, "bfloat16": DType.BF16,
    "float32": DType.F32, "float": DType.F32, "float64": DType.F64, "double": DType.F64,
    "int8": DType.I8, "int16": DType.I16, "int32": DType.I32, "int64": DType.I64,
    "uint8": DType.U8, "uint16": DType.U16, "uint32": DType.U32, "uint64": DType.U64,
}  # fmt: skip


@cache
def result_type(a: DType, b: DType) -> DType:
    """The dtype of a binary operation on tensors of dtypes ``a`` and ``b``.

    NumPy's rules between two floats or two integers; a float with an integer keeps the float's
    dtype; BF16 with F16 gives F32; U64 with a signed integer gives I64 (not NumPy's F64).
    """
    if a is b:
        return a
    if DType.BF16 in (a, b):
        other = b if a is DType.BF16 else a
        if other in (DType.F32, DType.F64):
            return other
        if other is DType.F16:
            return DType.F32
        return DType.BF16
    # A float with an integer or bool takes the float's dtype (as PyTorch does), so that mixing an
    # index tensor into f32 math does not silently widen it to f64.
    if a in _FLOATS and b not in _FLOATS:
        return a
    if b in _FLOATS and a not in _FLOATS:
        return b
    if {a, b} == {DType.U64, DType.I64} or (
        DType.U64 in (a, b) and (a in _SIGNED_INTS or b in _SIGNED_INTS)
    ):
        return DType.I64
    import numpy as np

    return _numpy_maps()[1][np.promote_types(a.to_numpy(), b.to_numpy())]


def scalar_result_type(t: DType, scalar: object) -> DType:
    """The dtype of an operation between a tensor of dtype ``t`` and a Python scalar.

    Python scalars are weakly typed (NEP 50): they take the tensor's dtype unless their kind is
    wider (a float with an integer tensor gives F32, a bool tensor with an int gives I64).
    """
    if isinstance(scalar, bool):
        return t
    if isinstance(scalar, int):
        return DType.I64 if t is DType.BOOL else t
    if isinstance(scalar, float):
        return t if t in _FLOATS else DType.F32
    raise _invalid(f"expected a Tensor or a Python int, float or bool; got {type(scalar).__name__}")
