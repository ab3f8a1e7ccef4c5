"""Elementwise operations: one table of unary and binary ops, validated once.

Dtype rules (every backend follows them):
- arithmetic (add sub mul maximum minimum pow mod) takes the promoted dtype
  (:func:`accelkit.dtype.result_type`; Python scalars are weak);
- ``div`` is true division: integer operands give F32;
- comparisons give BOOL;
- ``floor_divide`` and ``fmod`` take the promoted dtype (integers stay integers, exactly; bool
  is refused); ``bitwise_and/or/xor/not`` take integers or bools, shifts integers only;
- transcendental unary ops on integer or bool input give F32; ``relu abs neg floor ceil round``
  keep the dtype (``neg`` of BOOL is refused).
"""

from __future__ import annotations

from accelkit._core.op_names import BINARY_OPS, UNARY_OPS
from accelkit._core.shapes import broadcast_shapes
from accelkit._core.validation import FLOAT_DTYPES, check_dtype, check_scalar, check_tensor
from accelkit.dtype import DType, result_type, scalar_result_type
from accelkit.errors import InvalidArgumentError, UnsupportedOperationError
from accelkit.ops._mixins.base import OpsBase
from accelkit.sdk.kernels import TensorKernels
from accelkit.tensor import Tensor

__all__ = ["BINARY_OPS", "UNARY_OPS", "ElementwiseOps", "Operand", "check_int_scalar"]

Operand = Tensor | int | float | bool


def _bounds(dtype: DType) -> tuple[int, int]:
    """The smallest and largest values of integer ``dtype``."""
    bits = 8 * dtype.itemsize
    if dtype.is_signed:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def check_int_scalar(op: str, name: str, value: object, dtype: DType) -> None:
    """A Python int operand must fit an integer result dtype (as NumPy 2 requires, NEP 50):
    ``u8_tensor + 300`` is refused here rather than wrapping or failing inside a kernel."""
    if not dtype.is_integer or not isinstance(value, int) or isinstance(value, bool):
        return
    lo, hi = _bounds(dtype)
    if not lo <= value <= hi:
        raise InvalidArgumentError(
            f"{op}: {name}={value} does not fit the result dtype {dtype.value} ({lo}..{hi});"
            " cast the tensor to a wider dtype first"
        )


#: Binary ops whose result keeps a float input's dtype (and shape, for equal shapes).
_FAST_OPS = frozenset(op for op, kind in BINARY_OPS.items() if kind in ("arith", "div"))
_FLIPPED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}
#: A comparison with a number above (below) every value of the dtype, as one with its maximum
#: (minimum) that gives the same answer for every element.
_ABOVE = {"lt": "le", "le": "le", "ne": "le", "gt": "gt", "ge": "gt", "eq": "gt"}
_BELOW = {"gt": "ge", "ge": "ge", "ne": "ge", "lt": "lt", "le": "lt", "eq": "lt"}


def _in_range(op: str, a: Operand, b: Operand) -> tuple[str, Operand, Operand]:
    """A comparison of an integer tensor with a Python int its compute dtype cannot hold
    (``i64 < 2**63``, ``u8 == 1000``), as one with that dtype's nearest bound that gives the
    same answer for every element (``i64 <= 2**63 - 1``: true), the tensor first; else
    unchanged. Every backend then compares numbers its dtype holds (OpenCL compared such a
    scalar in F64, where 2**63 - 1 equals 2**63)."""
    if type(a) is Tensor and type(b) is int:
        x, v, tensor_op = a, b, op
    elif type(b) is Tensor and type(a) is int:
        x, v, tensor_op = b, a, _FLIPPED[op]  # v < x is x > v
    else:
        return op, a, b
    t = scalar_result_type(x._dtype, v)
    if not t.is_integer:
        return op, a, b
    lo, hi = _bounds(t)
    if v > hi:
        return _ABOVE[tensor_op], x, hi
    if v < lo:
        return _BELOW[tensor_op], x, lo
    return op, a, b


class ElementwiseOps(OpsBase[TensorKernels]):
    """``unary``, ``binary``, ``where``, ``cast`` and the named shortcuts."""

    # -- generic entry points ---------------------------------------------------------------------
    def unary(self, op: str, x: Tensor) -> Tensor:
        """Apply the unary ``op`` (one of ``UNARY_OPS``) to every element of ``x``."""
        kind = UNARY_OPS.get(op) if type(op) is str else None
        if kind is None:
            raise InvalidArgumentError(
                f"unknown unary op {op!r}; expected one of: {', '.join(UNARY_OPS)}"
            )
        backend = self.backend
        if type(x) is Tensor and x._backend is backend:
            # check_tensor, inlined for the common case (a live tensor of this backend); the
            # call below raises its errors otherwise.
            buf = x._buffer
            pool = buf._pool
            if pool is None or pool.generation != buf._gen:
                check_tensor(backend, x)
        else:
            check_tensor(backend, x)
        dt = x._dtype
        if kind == "float" and not dt.is_floating:
            dt = DType.F32
        elif dt is DType.BOOL and op in ("neg", "floor", "ceil", "round"):
            raise InvalidArgumentError(f"{op} is not defined for bool tensors; cast first")
        elif kind == "int":
            self._check_claimed(op)
            if dt.is_floating:
                raise InvalidArgumentError(f"{op} takes integer or bool tensors; got {dt.value}")
        out = self._empty(x._shape, dt)
        self.kernels.unary(op, x, out)
        return out

    def binary(self, op: str, a: Operand, b: Operand) -> Tensor:
        """Apply ``op`` (one of ``BINARY_OPS``) with NumPy broadcasting; either side may be a
        Python scalar, not both."""
        if type(a) is Tensor and type(b) is Tensor and type(op) is str and op in _FAST_OPS:
            # The common case, checked in one frame: two live tensors of this backend with the
            # same shape and float dtype. The result has that shape and dtype; nothing else can
            # be wrong (the general path below agrees, only slower).
            backend = self.backend
            dt = a._dtype
            if (
                dt is b._dtype
                and dt in FLOAT_DTYPES
                and a._backend is backend
                and b._backend is backend
                and a._shape == b._shape
            ):
                ba, bb = a._buffer, b._buffer
                pool = ba._pool
                if pool is not None and pool is bb._pool and pool.generation == ba._gen == bb._gen:
                    out = self._empty(a._shape, dt)
                    self.kernels.binary(op, a, b, out)
                    return out
        elif (
            type(a) is Tensor
            and (type(b) is float or type(b) is int)
            and type(op) is str
            and op in _FAST_OPS
        ):
            # A live float tensor of this backend and a Python number: the number is weak
            # (NEP 50), so the result has the tensor's shape and dtype (as below, only faster).
            dt = a._dtype
            if dt in FLOAT_DTYPES and a._backend is self.backend:
                ba = a._buffer
                pool = ba._pool
                if pool is not None and pool.generation == ba._gen:
                    out = self._empty(a._shape, dt)
                    self.kernels.binary(op, a, b, out)
                    return out
        kind = BINARY_OPS.get(op) if type(op) is str else None
        if kind is None:
            raise InvalidArgumentError(
                f"unknown binary op {op!r}; expected one of: {', '.join(BINARY_OPS)}"
            )
        backend = self.backend
        if isinstance(a, Tensor):
            check_tensor(backend, a, "a")
            if isinstance(b, Tensor):
                check_tensor(backend, b, "b")
                shape = (
                    a._shape
                    if a._shape == b._shape
                    else broadcast_shapes(a._shape, b._shape, f"{op}: a and b")
                )
                dt = a._dtype if a._dtype is b._dtype else result_type(a._dtype, b._dtype)
            else:
                shape = a._shape
                dt = scalar_result_type(a._dtype, check_scalar(b, "b"))
        elif isinstance(b, Tensor):
            check_tensor(backend, b, "b")
            shape = b._shape
            dt = scalar_result_type(b._dtype, check_scalar(a, "a"))
        else:
            raise InvalidArgumentError(
                f"{op} needs at least one Tensor operand; got {type(a).__name__} and"
                f" {type(b).__name__}"
            )
        if kind == "compare":
            dt = DType.BOOL
            if type(a) is int or type(b) is int:
                op, a, b = _in_range(op, a, b)
        elif kind == "div" and not dt.is_floating:
            dt = DType.F32
        elif dt is DType.BOOL and (op in ("sub", "pow", "mod") or kind in ("intdiv", "shift")):
            raise InvalidArgumentError(f"{op} is not defined for bool tensors; cast first")
        elif kind in ("bitwise", "shift") and dt.is_floating:
            self._check_claimed(op)
            what = "integer" if kind == "shift" else "integer or bool"
            raise InvalidArgumentError(
                f"{op} takes {what} operands; the result would be {dt.value}"
            )
        if kind in ("intdiv", "bitwise", "shift"):
            self._check_claimed(op)
        if dt.is_integer:
            check_int_scalar(op, "a", a, dt)
            check_int_scalar(op, "b", b, dt)
        if dt not in backend.supported_dtypes:  # only a promotion can leave the supported set
            check_dtype(backend, dt, f"result of {op}")
        out = self._empty(shape, dt)
        self.kernels.binary(op, a, b, out)
        return out

    def where(self, cond: Tensor, a: Operand, b: Operand) -> Tensor:
        """``a`` where ``cond`` is true, else ``b`` (broadcast together; ``cond`` is BOOL)."""
        backend = self.backend
        check_tensor(backend, cond, "cond")
        if cond._dtype is not DType.BOOL:
            raise InvalidArgumentError(f"where: cond must be bool; got {cond._dtype.value}")
        shape = cond._shape
        dts: list[DType] = []
        for name, v in (("a", a), ("b", b)):
            if isinstance(v, Tensor):
                check_tensor(backend, v, name)
                shape = broadcast_shapes(shape, v._shape, f"where: cond and {name}")
                dts.append(v._dtype)
            else:
                check_scalar(v, name)
        if not dts:
            raise InvalidArgumentError("where needs a Tensor for a or b; got two scalars")
        dt = dts[0] if len(dts) == 1 else result_type(dts[0], dts[1])
        for v in (a, b):
            if not isinstance(v, Tensor):
                dt = scalar_result_type(dt, v)
        check_int_scalar("where", "a", a, dt)
        check_int_scalar("where", "b", b, dt)
        out = self._empty(shape, dt)
        self.kernels.where(cond, a, b, out)
        return out

    def cast(self, x: Tensor, dtype: DType | str) -> Tensor:
        """Convert to ``dtype`` (float to int truncates toward zero; to BOOL is ``x != 0``)."""
        check_tensor(self.backend, x)
        dt = check_dtype(self.backend, dtype)
        out = self._empty(x._shape, dt)
        self.kernels.cast(x, out)
        return out

    def _check_claimed(self, op: str) -> None:
        """Ops added to the elementwise table after the SDK's first release reach a backend's
        kernels only where its capabilities claim them (an older plugin's kernel would not
        know the name)."""
        if op not in self.backend.capabilities.ops:
            raise UnsupportedOperationError(
                f"{op}: the {self.backend.name} backend does not claim this op"
            )

    # -- named shortcuts --------------------------------------------------------------------------
    def add(self, a: Operand, b: Operand) -> Tensor:
        return self.binary("add", a, b)

    def sub(self, a: Operand, b: Operand) -> Tensor:
        return self.binary("sub", a, b)

    def mul(self, a: Operand, b: Operand) -> Tensor:
        return self.binary("mul", a, b)

    def div(self, a: Operand, b: Operand) -> Tensor:
        return self.binary("div", a, b)

    def maximum(self, a: Operand, b: Operand) -> Tensor:
        return self.binary("maximum", a, b)

    def minimum(self, a: Operand, b: Operand) -> Tensor:
        return self.binary("minimum", a, b)

    def pow(self, a: Operand, b: Operand) -> Tensor:
        return self.binary("pow", a, b)

    def mod(self, a: Operand, b: Operand) -> Tensor:
        """Remainder with the sign of the divisor (Python's and NumPy's ``%``)."""
        return self.binary("mod", a, b)

    def floor_divide(self, a: Operand, b: Operand) -> Tensor:
        """``floor(a / b)`` in the promoted dtype (Python's and NumPy's ``//``): integers stay
        integers, exactly; ``x // 0`` is 0 for integers."""
        return self.binary("floor_divide", a, b)

    def fmod(self, a: Operand, b: Operand) -> Tensor:
        """C's remainder, with the sign of the dividend (``math.fmod``); ``x fmod 0`` is 0 for
        integers and NaN for floats."""
        return self.binary("fmod", a, b)

    def bitwise_and(self, a: Operand, b: Operand) -> Tensor:
        return self.binary("bitwise_and", a, b)

    def bitwise_or(self, a: Operand, b: Operand) -> Tensor:
        return self.binary("bitwise_or", a, b)

    def bitwise_xor(self, a: Operand, b: Operand) -> Tensor:
        return self.binary("bitwise_xor", a, b)

    def bitwise_not(self, x: Tensor) -> Tensor:
        """``~x`` on integers (two's complement); logical not on bool."""
        return self.unary("bitwise_not", x)

    def left_shift(self, a: Operand, b: Operand) -> Tensor:
        """``a << b`` in the promoted integer dtype, wrapping; a count outside
        ``0 .. bits-1`` gives 0."""
        return self.binary("left_shift", a, b)

    def right_shift(self, a: Operand, b: Operand) -> Tensor:
        """``a >> b`` (arithmetic for signed dtypes); a count outside ``0 .. bits-1`` gives 0,
        or -1 for a negative ``a``."""
        return self.binary("right_shift", a, b)

    def eq(self, a: Operand, b: Operand) -> Tensor:
        return self.binary("eq", a, b)

    def ne(self, a: Operand, b: Operand) -> Tensor:
        return self.binary("ne", a, b)

    def lt(self, a: Operand, b: Operand) -> Tensor:
        return self.binary("lt", a, b)

    def le(self, a: Operand, b: Operand) -> Tensor:
        return self.binary("le", a, b)

    def gt(self, a: Operand, b: Operand) -> Tensor:
        return self.binary("gt", a, b)

    def ge(self, a: Operand, b: Operand) -> Tensor:
        return self.binary("ge", a, b)

    def relu(self, x: Tensor) -> Tensor:
        return self.unary("relu", x)

    def sigmoid(self, x: Tensor) -> Tensor:
        return self.unary("sigmoid", x)

    def tanh(self, x: Tensor) -> Tensor:
        return self.unary("tanh", x)

    def exp(self, x: Tensor) -> Tensor:
        return self.unary("exp", x)

    def log(self, x: Tensor) -> Tensor:
        return self.unary("log", x)

    def sqrt(self, x: Tensor) -> Tensor:
        return self.unary("sqrt", x)

    def rsqrt(self, x: Tensor) -> Tensor:
        return self.unary("rsqrt", x)

    def abs(self, x: Tensor) -> Tensor:
        return self.unary("abs", x)

    def neg(self, x: Tensor) -> Tensor:
        return self.unary("neg", x)

    def sin(self, x: Tensor) -> Tensor:
        return self.unary("sin", x)

    def cos(self, x: Tensor) -> Tensor:
        return self.unary("cos", x)

    def tan(self, x: Tensor) -> Tensor:
        return self.unary("tan", x)

    def floor(self, x: Tensor) -> Tensor:
        return self.unary("floor", x)

    def ceil(self, x: Tensor) -> Tensor:
        return self.unary("ceil", x)

    def round(self, x: Tensor) -> Tensor:
        """Round half to even (NumPy's and IEEE's default)."""
        return self.unary("round", x)

    def erf(self, x: Tensor) -> Tensor:
        return self.unary("erf", x)

    def gelu(self, x: Tensor, approximate: str = "none") -> Tensor:
        """GELU: exact (``x * Phi(x)``) or, with ``approximate="tanh"``, the tanh form."""
        if approximate not in ("none", "tanh"):
            raise InvalidArgumentError(
                f"gelu: approximate must be 'none' or 'tanh'; got {approximate!r}"
            )
        return self.unary("gelu" if approximate == "none" else "gelu_tanh", x)

    def silu(self, x: Tensor) -> Tensor:
        return self.unary("silu", x)
