"""Argument validation shared by every backend: written once, run before anything is allocated.

Messages name what was expected and what was given, so that a wrong call can be fixed from the
error alone.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit.dtype import DType
from accelkit.errors import (
    InvalidArgumentError,
    StaleHandleError,
    UnsupportedOperationError,
)
from accelkit.tensor import Tensor, _shut_down_message

if TYPE_CHECKING:
    from accelkit.abc.backend import ComputeBackend

__all__ = [
    "check_seed",
    "check_launch_dims",
    "check_axis",
    "check_dtype",
    "check_float",
    "check_index",
    "check_int",
    "check_same_dtype",
    "check_shape",
    "check_tensor",
    "check_tensors",
    "check_scalar",
    "FLOAT_DTYPES",
    "is_live_tensor",
]

MAX_ELEMENTS = 1 << 48
#: The floating dtypes: what the ops' common-case checks accept in one set lookup.
FLOAT_DTYPES = frozenset(d for d in DType if d.is_floating)


def is_live_tensor(backend: ComputeBackend, x: object) -> bool:
    """Whether ``x`` is a live tensor of ``backend``: :func:`check_tensor`'s test without its
    errors, for an op's common-case check (the op's full checks raise the reason otherwise)."""
    if type(x) is not Tensor or x._backend is not backend:
        return False
    buf = x._buffer
    pool = buf._pool
    return pool is not None and pool.generation == buf._gen


def check_tensor(backend: ComputeBackend, x: object, name: str = "x") -> Tensor:
    """``x`` must be a live tensor of ``backend`` on its device."""
    if type(x) is not Tensor and not isinstance(x, Tensor):
        raise InvalidArgumentError(f"{name} must be a Tensor; got {type(x).__name__}")
    if x._backend is not backend:
        raise InvalidArgumentError(
            f"{name} lives on backend {x._backend.name!r} ({x._device}); this operation runs on"
            f" {backend.name!r} ({backend.device}); move it with tensor_factory.to_device()"
        )
    buf = x._buffer
    pool = buf._pool
    if pool is None or pool.generation != buf._gen:
        # One rule (docs/execution-model.md): a tensor that outlived its memory, its backend's
        # session or its context is stale, whether or not the backend was opened again since.
        if not backend.is_ready:
            raise StaleHandleError(_shut_down_message(x, name))
        raise StaleHandleError(
            f"{name} was freed, or belongs to a context that was shut down or rebuilt"
        )
    return x


def check_tensors(backend: ComputeBackend, xs: object, name: str) -> list[Tensor]:
    if isinstance(xs, Tensor) or not isinstance(xs, Iterable):
        raise InvalidArgumentError(f"{name} must be a sequence of Tensors; got {type(xs).__name__}")
    out = [check_tensor(backend, x, f"{name}[{i}]") for i, x in enumerate(xs)]
    if not out:
        raise InvalidArgumentError(f"{name} must hold at least one Tensor; got none")
    return out


def check_dtype(backend: ComputeBackend, dtype: object, name: str = "dtype") -> DType:
    d = DType.from_any(dtype)
    if d not in backend.supported_dtypes:
        raise UnsupportedOperationError(
            f"{backend.name} on {backend.device} does not support dtype {d.value} ({name});"
            f" supported: {', '.join(sorted(x.value for x in backend.supported_dtypes))}"
        )
    return d


def check_float(x: Tensor, op: str, name: str = "x") -> None:
    if not x._dtype.is_floating:
        raise InvalidArgumentError(
            f"{op} needs a floating-point {name} (f16, bf16, f32, f64); got {x._dtype.value}"
        )


def check_index(x: Tensor, op: str, name: str) -> None:
    if not x._dtype.is_integer:
        raise InvalidArgumentError(f"{op} needs an integer {name}; got {x._dtype.value}")


def check_same_dtype(op: str, **tensors: Tensor | None) -> DType:
    items = [(k, t) for k, t in tensors.items() if t is not None]
    first_name, first = items[0]
    for k, t in items[1:]:
        if t._dtype is not first._dtype:
            raise InvalidArgumentError(
                f"{op}: {k} has dtype {t._dtype.value} but {first_name} has"
                f" {first._dtype.value}; cast one of them first"
            )
    return first._dtype


def check_int(value: object, name: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be an int; got bool")
    try:
        v = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgumentError(f"{name} must be an int; got {type(value).__name__}") from None
    if minimum is not None and v < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}; got {v}")
    return v


def check_float_param(
    value: object, name: str, *, positive: bool = False, finite: bool = False
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{name} must be a number; got {type(value).__name__}")
    try:
        v = float(value)
    except OverflowError:  # an int beyond float's range
        raise InvalidArgumentError(f"{name} is too large: {value}") from None
    if v != v:
        raise InvalidArgumentError(f"{name} must not be NaN")
    if finite and v in (float("inf"), float("-inf")):
        raise InvalidArgumentError(f"{name} must be finite; got {v}")
    if positive and not v > 0:
        raise InvalidArgumentError(f"{name} must be > 0; got {v}")
    return v


def check_scalar(value: object, name: str) -> int | float | bool:
    if isinstance(value, bool | int | float):
        return value
    raise InvalidArgumentError(
        f"{name} must be a Tensor or a Python int, float or bool; got {type(value).__name__}"
    )


def check_shape(shape: object, name: str = "shape") -> tuple[int, ...]:
    """A shape: an int or a sequence of non-negative ints whose product is not absurd."""
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, Sequence) or isinstance(shape, str):
        raise InvalidArgumentError(
            f"{name} must be an int or a sequence of ints; got {type(shape).__name__}"
        )
    dims = tuple(check_int(d, f"{name}[{i}]") for i, d in enumerate(shape))
    if any(d < 0 for d in dims):
        raise InvalidArgumentError(f"{name} must have non-negative dimensions; got {dims}")
    # The product of the non-zero dimensions is bounded too: NumPy (and devices) refuse a shape
    # such as (2**31, 2**31, 0) even though it holds nothing.
    size = nonzero = 1
    for d in dims:
        size *= d
        nonzero *= d or 1
    if nonzero > MAX_ELEMENTS:
        what = f"has {size} elements" if size else f"has dimensions whose product is {nonzero}"
        raise InvalidArgumentError(f"{name} {dims} {what}, more than any device holds")
    return dims


def check_seed(seed: object, op: str) -> int | None:
    """A random seed: None (fresh entropy) or a non-negative int (bools refused)."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise InvalidArgumentError(
            f"{op}: seed must be a non-negative int or None; got {type(seed).__name__}"
        )
    value = int(seed)
    if value < 0:
        raise InvalidArgumentError(f"{op}: seed must be a non-negative int or None; got {value}")
    return value


def check_axis(axis: object, ndim: int, name: str = "axis") -> int:
    """``axis`` of a ``ndim``-d tensor as a non-negative int. A 0-d tensor takes axis 0 or -1
    (PyTorch's wrapped scalar: a reduction or a softmax over it), returned as 0: the caller
    treats it as the tensor's only element (see :func:`check_dim` for ops that cannot)."""
    a = check_int(axis, name)
    span = max(ndim, 1)
    if not -span <= a < span:
        raise InvalidArgumentError(
            f"{name} {a} is out of range for a {ndim}-d tensor (expected {-span}..{span - 1})"
        )
    return a % ndim if ndim else 0


def check_dim(axis: object, ndim: int, op: str, name: str = "axis") -> int:
    """:func:`check_axis` for an op that indexes the axis's length (concat, narrow, split,
    gather, scatter, flip): a 0-d tensor has none (check_axis takes axis 0 or -1 of a 0-d
    tensor, as PyTorch's reductions and softmax do, and these ops raised a bare IndexError)."""
    if ndim == 0:
        check_int(axis, name)
        raise InvalidArgumentError(f"{op}: a 0-d tensor has no {name} {axis}; reshape it to [1]")
    return check_axis(axis, ndim, name)


def check_axes(axis: object, ndim: int, name: str = "axis") -> tuple[int, ...]:
    """None (all axes), an int, or a sequence of distinct ints -> sorted non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, Sequence) and not isinstance(axis, str):
        axes = tuple(check_axis(a, ndim, name) for a in axis)
    else:
        axes = (check_axis(axis, ndim, name),)
    if len(set(axes)) != len(axes):
        raise InvalidArgumentError(f"{name} repeats an axis: {axis!r}")
    return tuple(sorted(axes))


def check_launch_dims(value: object, name: str) -> tuple[int, ...]:
    """A kernel launch's ``grid`` or ``block``: an int or 1 to 3 positive ints."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    try:
        sizes: tuple[Any, ...] = tuple(value)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgumentError(f"execute_kernel: {name} must be a sequence of ints") from None
    if not 1 <= len(sizes) <= 3 or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes
    ):
        raise InvalidArgumentError(
            f"execute_kernel: {name} must be 1 to 3 positive ints; got {value!r}"
        )
    return sizes


def pair(value: object, name: str, *, minimum: int) -> tuple[int, int]:
    """An int or a pair of ints (for stride, padding, dilation)."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != 2:
            raise InvalidArgumentError(f"{name} must be an int or a pair of ints; got {value!r}")
        return (
            check_int(value[0], f"{name}[0]", minimum=minimum),
            check_int(value[1], f"{name}[1]", minimum=minimum),
        )
    v = check_int(value, name, minimum=minimum)
    return (v, v)


def describe(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"Tensor{value.shape} {value.dtype.value}"
    return repr(value)
