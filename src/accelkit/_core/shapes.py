"""Shape inference shared by every backend."""

from __future__ import annotations

import math

from accelkit.errors import InvalidArgumentError

__all__ = ["broadcast_shapes", "matmul_shape", "conv2d_output_hw", "reduced_shape", "prod"]


def prod(shape: tuple[int, ...]) -> int:
    """The number of elements of ``shape`` (1 for ``()``)."""
    return math.prod(shape)


def broadcast_shapes(
    a: tuple[int, ...], b: tuple[int, ...], what: str = "operands"
) -> tuple[int, ...]:
    """NumPy broadcasting of two shapes; the error names both."""
    if a == b:
        return a
    n = max(len(a), len(b))
    pa = (1,) * (n - len(a)) + a
    pb = (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(pa, pb, strict=True):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise InvalidArgumentError(
                f"{what} with shapes {a} and {b} cannot be broadcast together"
            )
    return tuple(out)


def matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Result shape of ``a @ b`` under NumPy's matmul rules (1-d promotion, batch broadcasting)."""
    if not a or not b:
        raise InvalidArgumentError(f"matmul needs tensors of at least 1 dimension; got {a} and {b}")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise InvalidArgumentError(
            f"matmul: the inner dimensions differ: a {a} has {a2[-1]} columns, b {b} has"
            f" {b2[-2]} rows"
        )
    batch = broadcast_shapes(a2[:-2], b2[:-2], "matmul batch dimensions")
    out = (*batch, a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def conv2d_output_hw(
    h: int,
    w: int,
    kh: int,
    kw: int,
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
) -> tuple[int, int]:
    oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    if oh <= 0 or ow <= 0:
        raise InvalidArgumentError(
            f"conv2d: a {kh}x{kw} kernel (dilation {dilation}) does not fit a {h}x{w} input with"
            f" padding {padding}; the output would be {oh}x{ow}"
        )
    return oh, ow


def reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)
