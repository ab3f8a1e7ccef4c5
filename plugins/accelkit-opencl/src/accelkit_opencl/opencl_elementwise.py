"""Elementwise kernels, generated from one operation table.

Every unary and binary op, ``where`` and ``cast`` is a C expression in the table below, keyed
by the category of the type it computes in ('f' float, 'i' signed, 'u' unsigned, 'b' bool). One
generator turns an expression into a kernel for any combination of dtypes and any rank:
operands are read through element strides (0 along broadcast dimensions), so broadcasting,
permutes, narrows and concatenation are all the same strided loop.

In expressions ``T`` is the compute type, ``{f}`` the suffix of its floating literals, and the
operands are ``a``, ``b`` (``c`` is where's condition).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from accelkit.dtype import DType
from accelkit_opencl.opencl_types import STORE_TYPES, category, load_type, pragmas

__all__ = ["BINARY", "UNARY", "Operand", "binary_expr", "cast_expr", "elementwise_source",
           "unary_expr"]  # fmt: skip

_ANY = "fiub"

#: unary op -> {categories: expression}
UNARY: dict[str, dict[str, str]] = {
    "relu": {"fi": "(a < 0 ? (T)0 : a)", "ub": "a"},
    "abs": {"f": "fabs(a)", "i": "(a < 0 ? (T)(-a) : a)", "ub": "a"},
    "neg": {"fiu": "(T)(-a)"},
    "floor": {"f": "floor(a)", "iub": "a"},
    "ceil": {"f": "ceil(a)", "iub": "a"},
    "round": {"f": "rint(a)", "iub": "a"},
    "sigmoid": {"f": "(1.0{f} / (1.0{f} + exp(-a)))"},
    "tanh": {"f": "ak_tanh(a)"},
    "exp": {"f": "exp(a)"},
    "log": {"f": "log(a)"},
    "sqrt": {"f": "sqrt(a)"},
    "rsqrt": {"f": "(1.0{f} / sqrt(a))"},
    "sin": {"f": "sin(a)"},
    "cos": {"f": "cos(a)"},
    "tan": {"f": "tan(a)"},
    "erf": {"f": "erf(a)"},
    "gelu": {"f": "(0.5{f} * a * (1.0{f} + erf(a * 0.7071067811865476{f})))"},
    "gelu_tanh": {
        "f": "(0.5{f} * a * (1.0{f} + ak_tanh(0.7978845608028654{f} * (a + 0.044715{f} * a * a * a))))"
    },
    "silu": {"f": "(a / (1.0{f} + exp(-a)))"},
    "bitwise_not": {"iu": "(T)(~a)", "b": "(!a)"},
}

#: binary op -> {categories: expression}; comparisons produce 0 or 1.
BINARY: dict[str, dict[str, str]] = {
    "add": {"fiu": "(a + b)", "b": "(a | b)"},
    "sub": {"fiu": "(a - b)"},
    "mul": {"fiu": "(a * b)", "b": "(a & b)"},
    "div": {"f": "(a / b)"},
    "maximum": {"f": "((a > b || isnan(a)) ? a : b)", "iub": "((a > b) ? a : b)"},
    "minimum": {"f": "((a < b || isnan(a)) ? a : b)", "iub": "((a < b) ? a : b)"},
    "pow": {"f": "pow(a, b)", "iu": "ak_ipow(a, b)"},
    "mod": {"f": "ak_fmod(a, b)", "i": "ak_imod(a, b)", "u": "(b == 0 ? (T)0 : a % b)"},
    "eq": {_ANY: "(a == b)"},
    "ne": {_ANY: "(a != b)"},
    "lt": {_ANY: "(a < b)"},
    "le": {_ANY: "(a <= b)"},
    "gt": {_ANY: "(a > b)"},
    "ge": {_ANY: "(a >= b)"},
    "floor_divide": {"f": "ak_ffloordiv(a, b)", "i": "ak_ifloordiv(a, b)",
                     "u": "(b == 0 ? (T)0 : a / b)"},
    "fmod": {"f": "fmod(a, b)", "i": "((b == 0 || b == (T)-1) ? (T)0 : a % b)",
             "u": "(b == 0 ? (T)0 : a % b)"},
    "bitwise_and": {"iub": "(a & b)"},
    "bitwise_or": {"iub": "(a | b)"},
    "bitwise_xor": {"iub": "(a ^ b)"},
    # OpenCL C masks the count (E2 mod bits), so counts outside 0..bits-1 are handled first;
    # the left shift runs on the unsigned 64-bit pattern (a signed overflow is undefined).
    "left_shift": {"iu": "((b < 0 || b >= {bits}) ? (T)0 : (T)(((ulong)a) << b))"},
    "right_shift": {"i": "((b < 0 || b >= {bits}) ? (a < 0 ? (T)-1 : (T)0) : (T)(a >> b))",
                    "u": "(b >= {bits} ? (T)0 : (T)(a >> b))"},
}  # fmt: skip

# Helpers an expression may call (each defined for the compute type T of the kernel).
_HELPERS = {
    # tanh reaches +-1 where the float holds no value closer (|a| > 9.02 in float, 19.06 in
    # double): PoCL's tanh stopped at 1 - 2**-24 even at +-inf, so gelu_tanh(-1e9) was -29.8.
    "ak_tanh": """
T ak_tanh(T a) {
    return fabs(a) > (sizeof(T) == 8 ? (T)19.1 : (T)9.1) ? copysign((T)1, a) : tanh(a);
}
""",
    "ak_ipow": """
T ak_ipow(T a, T b) {
    if (b < 0) return a == 1 ? (T)1 : (a == (T)-1 ? ((b & 1) ? (T)-1 : (T)1) : (T)0);
    T r = 1;
    while (b) { if (b & 1) r *= a; a *= a; b >>= 1; }
    return r;
}
""",
    "ak_fmod": """
T ak_fmod(T a, T b) {
    T r = fmod(a, b);
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    if (r == 0) r = copysign((T)0, b);  /* a zero takes the divisor's sign too, as in NumPy */
    return r;
}
""",
    "ak_ffloordiv": """
T ak_ffloordiv(T a, T b) {  /* NumPy's npy_floor_divide: floor of the exact quotient */
    if (b == 0) return a / b;
    T m = fmod(a, b);
    T d = (a - m) / b;
    if (m != 0) { if ((b < 0) != (m < 0)) d -= 1; }
    if (d != 0) { T f = floor(d); if (d - f > (T)0.5) f += 1; return f; }
    return copysign((T)0, a / b);
}
""",
    "ak_ifloordiv": """
T ak_ifloordiv(T a, T b) {
    if (b == 0) return 0;
    if (b == (T)-1) return (T)(0UL - (ulong)a);  /* INT_MIN // -1 wraps, as in NumPy */
    T q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
    return q;
}
""",
    "ak_imod": """
T ak_imod(T a, T b) {
    if (b == 0 || b == (T)-1) return 0;  /* C leaves INT_MIN % -1 undefined; x mod -1 is 0 */
    T r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
}
""",
}

_INT_BOUNDS = {
    DType.I8: (-(2**7), 2**7), DType.I16: (-(2**15), 2**15), DType.I32: (-(2**31), 2**31),
    DType.I64: (-(2**63), 2**63), DType.U8: (0, 2**8), DType.U16: (0, 2**16),
    DType.U32: (0, 2**32), DType.U64: (0, 2**64),
}  # fmt: skip


def _pick(table: dict[str, str], dtype: DType, op: str) -> str:
    cat = category(dtype)
    for cats, expr in table.items():
        if cat in cats:
            return expr
    raise KeyError(f"{op} has no kernel for {dtype.value}")


def _fmt(expr: str, dtype: DType) -> str:
    suffix = "" if load_type(dtype) == "double" else "f"
    return expr.replace("{f}", suffix).replace("{bits}", str(8 * dtype.itemsize))


def unary_expr(op: str, compute: DType) -> str:
    return _fmt(_pick(UNARY[op], compute, op), compute)


def binary_expr(op: str, compute: DType) -> str:
    return _fmt(_pick(BINARY[op], compute, op), compute)


def cast_expr(src: DType, dst: DType) -> str:
    """``a`` (in ``src``'s compute type) converted to ``dst``: floats truncate toward zero and
    out-of-range or NaN values become 0 (as the CPU backend does); to BOOL is ``a != 0``."""
    if dst is DType.BOOL:
        return "(a != 0)"
    if src.is_floating and dst.is_integer:
        lo, hi = _INT_BOUNDS[dst]
        f = "" if load_type(src) == "double" else "f"
        return (
            f"(isfinite(trunc(a)) && trunc(a) >= {float(lo)!r}{f} && trunc(a) < {float(hi)!r}{f}"
            " ? trunc(a) : 0)"
        )
    return "a"


@dataclass(frozen=True)
class Operand:
    """One input of a generated kernel: a tensor read through strides, or a scalar argument."""

    name: str
    dtype: DType
    is_tensor: bool


# The OpenCL C sources are pure functions of their (hashable) arguments, built on the caller's
# thread at every launch (16 us an elementwise source on a 2-core VM, 2026-11-27); cached,
# as the programs built from them are.
@functools.lru_cache(maxsize=1024)
def elementwise_source(
    out: DType, compute: DType, operands: tuple[Operand, ...], expr: str, nd: int
) -> str:
    """Kernel ``ew``: ``out[i] = expr`` over ``n`` elements of a rank-``nd`` index space.

    Arguments: ``out, out_offset``; per operand ``ptr, offset`` (tensor) or ``value``
    (scalar, in its compute type); ``n``; ``nd`` dimensions; ``nd`` strides of ``out``; ``nd``
    strides per tensor operand.
    """
    t = load_type(compute)
    out_t = STORE_TYPES[out]
    types = [out_t, t, *(STORE_TYPES[o.dtype] for o in operands)]
    params = [f"__global {out_t}* out", "long out_off"]
    for o in operands:
        if o.is_tensor:
            params += [f"__global const {STORE_TYPES[o.dtype]}* p_{o.name}", f"long off_{o.name}"]
        else:
            params.append(f"{load_type(o.dtype)} s_{o.name}")
    params.append("long n")
    params += [f"long d{j}" for j in range(nd)]
    params += [f"long so{j}" for j in range(nd)]
    tensors = [o for o in operands if o.is_tensor]
    for o in tensors:
        params += [f"long s{o.name}{j}" for j in range(nd)]
    body = ["    long gid = get_global_id(0);", "    if (gid >= n) return;", "    long r = gid;"]
    body.append("    long io = out_off;")
    body += [f"    long i_{o.name} = off_{o.name};" for o in tensors]
    for j in range(nd - 1, -1, -1):
        body.append(f"    {{ long c = {'r' if j == 0 else f'r % d{j}'};")
        if j:
            body.append(f"      r /= d{j};")
        body.append(f"      io += c * so{j};")
        body += [f"      i_{o.name} += c * s{o.name}{j};" for o in tensors]
        body.append("    }")
    for o in operands:
        lt = load_type(o.dtype)
        src = f"p_{o.name}[i_{o.name}]" if o.is_tensor else f"s_{o.name}"
        # where's condition is read as is; value operands in the compute type
        vt = lt if o.name == "c" else t
        body.append(f"    {vt} {o.name} = ({vt}){src};")
    body.append(f"    out[io] = ({out_t})({expr});")
    helpers = "".join(
        h.replace("T ", f"{t} ").replace("(T)", f"({t})")
        for name, h in _HELPERS.items()
        if name in expr
    )
    return (
        pragmas(types)
        + f"#define T {t}\n"
        + helpers
        + f"__kernel void ew({', '.join(params)}) {{\n"
        + "\n".join(body)
        + "\n}\n"
    )
