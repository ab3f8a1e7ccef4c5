"""Matrix products: gemm, batched_gemm, matmul, linear."""

from __future__ import annotations

from accelkit._core.shapes import broadcast_shapes, matmul_shape
from accelkit._core.validation import (
    FLOAT_DTYPES,
    check_float_param,
    check_tensor,
    is_live_tensor,
)
from accelkit.dtype import DType, result_type
from accelkit.errors import InvalidArgumentError
from accelkit.ops._mixins.base import OpsBase
from accelkit.ops._mixins.elementwise import check_int_scalar
from accelkit.sdk.kernels import TensorKernels
from accelkit.tensor import Tensor

__all__ = ["LinalgOps"]

#: (a's dtype, b's dtype, a's shape, b's shape) -> (result shape, result dtype) of matmuls that
#: passed validation: a loop's products validate once. Bounded: cleared when full.
_SEEN_MATMUL: dict[tuple[object, ...], tuple[tuple[int, ...], DType]] = {}
_SEEN_MAX = 4096


def _numeric(x: Tensor, op: str, name: str) -> None:
    if x._dtype is DType.BOOL:
        raise InvalidArgumentError(f"{op}: {name} is bool; cast it to a numeric dtype first")


class LinalgOps(OpsBase[TensorKernels]):
    """Matrix products. Low-precision floats (F16, BF16) accumulate in F32."""

    def gemm(
        self,
        a: Tensor,
        b: Tensor,
        c: Tensor | None = None,
        *,
        trans_a: bool = False,
        trans_b: bool = False,
        alpha: float = 1.0,
        beta: float = 0.0,
    ) -> Tensor:
        """``alpha * op(a) @ op(b) + beta * c`` for 2-d ``a`` [m, k] and ``b`` [k, n].

        ``op`` transposes when ``trans_*`` is set. ``c`` (optional) broadcasts to [m, n].
        Returns a new tensor; ``c`` is not modified.
        """
        return self._gemm("gemm", a, b, c, trans_a, trans_b, alpha, beta, batched=False)

    def batched_gemm(
        self,
        a: Tensor,
        b: Tensor,
        c: Tensor | None = None,
        *,
        trans_a: bool = False,
        trans_b: bool = False,
        alpha: float = 1.0,
        beta: float = 0.0,
    ) -> Tensor:
        """:meth:`gemm` over a batch: ``a`` [batch, m, k], ``b`` [batch, k, n] (same batch)."""
        return self._gemm("batched_gemm", a, b, c, trans_a, trans_b, alpha, beta, batched=True)

    def _gemm(
        self,
        op: str,
        a: Tensor,
        b: Tensor,
        c: Tensor | None,
        trans_a: bool,
        trans_b: bool,
        alpha: float,
        beta: float,
        *,
        batched: bool,
    ) -> Tensor:
        backend = self.backend
        check_tensor(backend, a, "a")
        check_tensor(backend, b, "b")
        _numeric(a, op, "a")
        _numeric(b, op, "b")
        nd = 3 if batched else 2
        for name, t in (("a", a), ("b", b)):
            if t.ndim != nd:
                raise InvalidArgumentError(
                    f"{op}: {name} must be {nd}-d{' [batch, rows, cols]' if batched else ''};"
                    f" got shape {t._shape}"
                )
        alpha = check_float_param(alpha, "alpha")
        beta = check_float_param(beta, "beta")
        m, ka = (a._shape[-1], a._shape[-2]) if trans_a else (a._shape[-2], a._shape[-1])
        kb, n = (b._shape[-1], b._shape[-2]) if trans_b else (b._shape[-2], b._shape[-1])
        if ka != kb:
            raise InvalidArgumentError(
                f"{op}: op(a) is {m}x{ka} and op(b) is {kb}x{n}; the inner dimensions differ"
                f" (trans_a={trans_a}, trans_b={trans_b}, a {a._shape}, b {b._shape})"
            )
        if batched and a._shape[0] != b._shape[0]:
            raise InvalidArgumentError(
                f"{op}: a has batch {a._shape[0]} but b has batch {b._shape[0]}"
            )
        shape = (a._shape[0], m, n) if batched else (m, n)
        dt = result_type(a._dtype, b._dtype)
        if c is not None:
            check_tensor(backend, c, "c")
            _numeric(c, op, "c")
            if broadcast_shapes(shape, c._shape, f"{op}: c and the product") != shape:
                raise InvalidArgumentError(
                    f"{op}: c of shape {c._shape} does not broadcast to the product's {shape}"
                )
            dt = result_type(dt, c._dtype)
        if not dt.is_floating:
            # An integer GEMM computes in its dtype (wrapping, as its products and sums do):
            # alpha and beta are whole numbers that fit it (0.5 gave zeros on OpenCL and
            # rounded halves on the CPU).
            for name, v in (("alpha", alpha), ("beta", beta)):
                if not v.is_integer():
                    raise InvalidArgumentError(
                        f"{op}: an integer ({dt.value}) gemm takes whole alpha and beta; got"
                        f" {name}={v} (cast the operands to a float dtype)"
                    )
                check_int_scalar(op, name, int(v), dt)
        out = self._empty(shape, dt)
        self.kernels.gemm(a, b, c if beta != 0.0 else None, out, trans_a, trans_b, alpha, beta)
        return out

    def matmul(self, a: Tensor, b: Tensor) -> Tensor:
        """NumPy's ``matmul``: 1-d operands are promoted, batch dimensions broadcast."""
        check_tensor(self.backend, a, "a")
        check_tensor(self.backend, b, "b")
        # The rest depends only on the dtypes and shapes: a pair seen before reuses its result.
        key = (a._dtype, b._dtype, a._shape, b._shape)
        seen = _SEEN_MATMUL.get(key)
        if seen is None:
            _numeric(a, "matmul", "a")
            _numeric(b, "matmul", "b")
            seen = (matmul_shape(a._shape, b._shape), result_type(a._dtype, b._dtype))
            if len(_SEEN_MATMUL) >= _SEEN_MAX:
                _SEEN_MATMUL.clear()
            _SEEN_MATMUL[key] = seen
        out = self._empty(*seen)
        self.kernels.matmul(a, b, out)
        return out

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """``x @ weight.T + bias``: ``x`` [..., in], ``weight`` [out, in], ``bias`` [out]."""
        backend = self.backend
        if is_live_tensor(backend, x) and is_live_tensor(backend, weight):
            # The common case, checked in one frame: live tensors of this backend of one float
            # dtype, weight [out, in] matching x's last dim, bias [out]; the result has that
            # dtype (the general path below agrees, only slower).
            dt, xs, ws = x._dtype, x._shape, weight._shape
            if (
                dt in FLOAT_DTYPES
                and weight._dtype is dt
                and len(ws) == 2
                and xs
                and xs[-1] == ws[1]
                and (
                    bias is None
                    or (
                        is_live_tensor(backend, bias)
                        and bias._dtype is dt
                        and bias._shape == (ws[0],)
                    )
                )
            ):
                out = self._empty((*xs[:-1], ws[0]), dt)
                self.kernels.linear(x, weight, bias, out)
                return out
        check_tensor(backend, x, "x")
        check_tensor(backend, weight, "weight")
        _numeric(x, "linear", "x")
        if weight.ndim != 2:
            raise InvalidArgumentError(f"linear: weight must be [out, in]; got {weight._shape}")
        if x.ndim < 1 or x._shape[-1] != weight._shape[1]:
            raise InvalidArgumentError(
                f"linear: x {x._shape} has {x._shape[-1] if x._shape else 0} input features but"
                f" weight {weight._shape} expects {weight._shape[1]}"
            )
        dt = result_type(x._dtype, weight._dtype)
        if bias is not None:
            check_tensor(backend, bias, "bias")
            if bias._shape != (weight._shape[0],):
                raise InvalidArgumentError(
                    f"linear: bias must be [{weight._shape[0]}]; got {bias._shape}"
                )
            dt = result_type(dt, bias._dtype)
        out = self._empty((*x._shape[:-1], weight._shape[0]), dt)
        self.kernels.linear(x, weight, bias, out)
        return out
