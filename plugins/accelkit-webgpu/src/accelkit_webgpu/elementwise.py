"""Elementwise kernels in WGSL, generated from one operation table.

Each op is a WGSL expression keyed by the category of the type it computes in ('f' f32, 'i'
i32, 'u' u32, 'b' bool as u32 0/1); ``a`` and ``b`` are the operands in the compute type,
``T`` that type. Operands are read through element strides (0 along broadcast dimensions) held
in the parameter words, or at the output's index when every operand has the output's shape.

WGSL lets an implementation assume floats are finite, and leaves integer division by zero,
``log`` of a negative number and ``pow`` of a negative base to it: the helpers below test NaN on
the bits and guard each such case, so results follow the special-values table of
docs/operations.md on every adapter.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from accelkit.dtype import DType
from accelkit_webgpu.wgsl import Binding, category, compute_type, map_kernel, param_value

COMPARE = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})

__all__ = [
    "BINARY",
    "COMPARE",
    "UNARY",
    "binary_source",
    "cast_source",
    "unary_bitwise_not_source",
    "unary_source",
    "where_source",
]

HELPERS = """
fn ak_isnan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn ak_isinf(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u; }
fn ak_nan() -> f32 { return bitcast<f32>(0x7fc00000u); }
fn ak_inf() -> f32 { return bitcast<f32>(0x7f800000u); }
fn ak_log(a: f32) -> f32 {
    let bits = bitcast<u32>(a);
    if (ak_isnan(a) || (bits & 0x80000000u) != 0u && (bits & 0x7fffffffu) != 0u) {
        return ak_nan();
    }
    if ((bits & 0x7fffffffu) == 0u) { return -ak_inf(); }
    if (ak_isinf(a)) { return a; }
    if ((bits & 0x7f800000u) == 0u) {
        // a subnormal (which a device may flush to zero): m * 2^-149, from the bits
        return log(f32(bits & 0x7fffffu)) - 103.27892990343184;
    }
    return log(a);
}
fn ak_log2_pos(m: f32) -> f32 {
    // log2 of a positive finite m, subnormals included (a device may flush them to zero)
    let bits = bitcast<u32>(m);
    if ((bits & 0x7f800000u) == 0u) { return log2(f32(bits & 0x7fffffu)) - 149.0; }
    return log2(m);
}
fn ak_sqrt(a: f32) -> f32 {
    if (ak_isnan(a) || a < 0.0) { return ak_nan(); }
    if (ak_isinf(a)) { return a; }
    return sqrt(a);
}
fn ak_exp(a: f32) -> f32 {
    if (ak_isnan(a)) { return a; }
    if (a > 88.72283905206835) { return ak_inf(); }
    if (a < -103.97207708) { return 0.0; }
    return exp(a);
}
fn ak_tanh(a: f32) -> f32 {
    if (ak_isnan(a)) { return a; }
    let c = clamp(a, -10.0, 10.0);
    if (abs(c) < 0.1) {
        // the series: (e - 1) / (e + 1) cancels for small |x|
        let c2 = c * c;
        return c * (1.0 + c2 * (-0.3333333333 + c2 * (0.1333333333 + c2 * -0.0539682540)));
    }
    let e = exp(2.0 * c);
    return (e - 1.0) / (e + 1.0);
}
fn ak_sigmoid(a: f32) -> f32 {
    if (ak_isnan(a)) { return a; }
    if (a >= 0.0) { return 1.0 / (1.0 + ak_exp(-a)); }
    let e = ak_exp(a);
    return e / (1.0 + e);
}
fn ak_erf(x: f32) -> f32 {
    // Numerical Recipes' erfc (fractional error < 1.2e-7 everywhere), in f32
    if (ak_isnan(x)) { return x; }
    let z = abs(x);
    if (z < 0.5) {
        // Maclaurin series: 1 - erfc loses the relative precision near 0
        let x2 = x * x;
        return 1.1283791670955126 * x * (1.0 + x2 * (-0.3333333333 + x2 * (0.1 + x2 * (
            -0.0238095238 + x2 * (0.0046296296 + x2 * -0.0007575758)))));
    }
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t * ak_exp(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418
        + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587
        + t * (-0.82215223 + t * 0.17087277)))))))));
    let v = 1.0 - r;
    return select(v, -v, x < 0.0);
}
fn ak_trig_ok(a: f32) -> bool { return !(ak_isnan(a) || ak_isinf(a)); }
fn ak_maxf(a: f32, b: f32) -> f32 {
    if (ak_isnan(a) || ak_isnan(b)) { return ak_nan(); }
    return select(b, a, a >= b);
}
fn ak_minf(a: f32, b: f32) -> f32 {
    if (ak_isnan(a) || ak_isnan(b)) { return ak_nan(); }
    return select(b, a, a <= b);
}
fn ak_is_int(b: f32) -> bool { return !ak_isinf(b) && floor(b) == b; }
fn ak_is_odd(b: f32) -> bool {
    return ak_is_int(b) && abs(b) < 16777216.0 && (i32(abs(b)) & 1) == 1;
}
fn ak_powf(a: f32, b: f32) -> f32 {
    if (b == 0.0 || a == 1.0) { return 1.0; }
    if (ak_isnan(a) || ak_isnan(b)) { return ak_nan(); }
    let odd = ak_is_odd(b);
    if (a == 0.0) {
        let neg = odd && (bitcast<u32>(a) & 0x80000000u) != 0u;
        if (b < 0.0) { return select(ak_inf(), -ak_inf(), neg); }
        return select(0.0, -0.0, neg);
    }
    let m = abs(a);
    if (ak_isinf(b)) {
        if (m == 1.0) { return 1.0; }
        if ((m > 1.0) == (b > 0.0)) { return ak_inf(); }
        return 0.0;
    }
    // A finite negative base with a non-integer exponent is NaN, as NumPy's power; -inf is
    // not (C99: +inf for b > 0, +0 for b < 0; the sign below is kept for odd integers only).
    if (a < 0.0 && !ak_isinf(m) && !ak_is_int(b)) { return ak_nan(); }
    var r: f32;
    if (ak_isinf(m)) {
        r = select(0.0, ak_inf(), b > 0.0);
    } else {
        let l = b * ak_log2_pos(m);
        if (l >= 128.0) { r = ak_inf(); } else if (l < -150.0) { r = 0.0; } else { r = exp2(l); }
        // exact small integer powers, as NumPy gets them
        if (ak_is_int(b) && abs(b) <= 64.0) {
            var acc = 1.0;
            var base = m;
            var k = u32(abs(b));
            loop {
                if (k == 0u) { break; }
                if ((k & 1u) == 1u) { acc = acc * base; }
                base = base * base;
                k = k >> 1u;
            }
            r = select(acc, 1.0 / acc, b < 0.0);
        }
    }
    return select(r, -r, a < 0.0 && odd);
}
fn ak_fmodf(a: f32, b: f32) -> f32 {
    // C's fmod, exactly: long division on the bits (after musl's fmodf), since neither fma nor
    // a*b+c is exact on every WebGPU implementation
    var ux = bitcast<u32>(a);
    var uy = bitcast<u32>(b);
    var ex = i32((ux >> 23u) & 0xffu);
    var ey = i32((uy >> 23u) & 0xffu);
    let sx = ux & 0x80000000u;
    if ((uy << 1u) == 0u || ak_isnan(b) || ex == 255) { return ak_nan(); }
    if ((ux << 1u) <= (uy << 1u)) {
        if ((ux << 1u) == (uy << 1u)) { return bitcast<f32>(sx); }
        return a;
    }
    if (ex == 0) {
        var i = ux << 9u;
        loop { if ((i >> 31u) != 0u) { break; } ex = ex - 1; i = i << 1u; }
        ux = ux << u32(1 - ex);
    } else {
        ux = (ux & 0x7fffffu) | 0x800000u;
    }
    if (ey == 0) {
        var i = uy << 9u;
        loop { if ((i >> 31u) != 0u) { break; } ey = ey - 1; i = i << 1u; }
        uy = uy << u32(1 - ey);
    } else {
        uy = (uy & 0x7fffffu) | 0x800000u;
    }
    loop {
        if (ex <= ey) { break; }
        if (ux >= uy) {
            if (ux == uy) { return bitcast<f32>(sx); }
            ux = ux - uy;
        }
        ux = ux << 1u;
        ex = ex - 1;
    }
    if (ux >= uy) {
        if (ux == uy) { return bitcast<f32>(sx); }
        ux = ux - uy;
    }
    loop { if ((ux >> 23u) != 0u) { break; } ux = ux << 1u; ex = ex - 1; }
    if (ex > 0) {
        ux = (ux - 0x800000u) | (u32(ex) << 23u);
    } else {
        ux = ux >> u32(1 - ex);
    }
    return bitcast<f32>(ux | sx);
}
fn ak_modf(a: f32, b: f32) -> f32 {
    // Python's and NumPy's %: the remainder of the floored quotient, with b's sign
    if (ak_isnan(a) || ak_isnan(b) || ak_isinf(a) || b == 0.0) { return ak_nan(); }
    if (ak_isinf(b)) {
        if (a == 0.0) { return select(0.0, -0.0, b < 0.0); }
        if ((a < 0.0) == (b < 0.0)) { return a; }
        return b;
    }
    var r = ak_fmodf(a, b);
    if (r != 0.0 && ((r < 0.0) != (b < 0.0))) { r = r + b; }
    if (r == 0.0) { return select(0.0, -0.0, b < 0.0); }
    return r;
}
fn ak_neg_zero(x: f32) -> bool { return bitcast<u32>(x) == 0x80000000u; }
fn ak_signbit(x: f32) -> bool { return (bitcast<u32>(x) & 0x80000000u) != 0u; }
fn ak_ffloordiv(a: f32, b: f32) -> f32 {
    // NumPy's npy_floor_divide: the floor of the exact quotient
    if (ak_isnan(a) || ak_isnan(b)) { return ak_nan(); }
    if (b == 0.0) {
        if (a == 0.0) { return ak_nan(); }
        let neg = (a < 0.0) != ak_neg_zero(b);
        return select(ak_inf(), -ak_inf(), neg);
    }
    if (ak_isinf(a)) { return ak_nan(); }
    if (ak_isinf(b)) {
        if (a == 0.0 || (a < 0.0) == (b < 0.0)) {
            return select(0.0, -0.0, ak_signbit(a) != ak_signbit(b));
        }
        return -1.0;
    }
    let m = ak_fmodf(a, b);
    var d = (a - m) / b;
    if (m != 0.0 && ((b < 0.0) != (m < 0.0))) { d = d - 1.0; }
    if (d != 0.0) {
        var f = floor(d);
        if (d - f > 0.5) { f = f + 1.0; }
        return f;
    }
    return select(0.0, -0.0, ak_signbit(a) != ak_signbit(b));  // copysign(0, a / b)
}
fn ak_ifloordiv(a: i32, b: i32) -> i32 {
    if (b == 0) { return 0; }
    if (b == -1) { return 0 - a; }                       // INT_MIN // -1 wraps, as in NumPy
    let ua = select(u32(a), 0u - u32(a), a < 0);
    let ub = select(u32(b), 0u - u32(b), b < 0);
    let q = ua / ub;
    let r = ua % ub;
    if ((a < 0) != (b < 0)) { return -i32(q) - select(0, 1, r != 0u); }
    return i32(q);
}
fn ak_ipow_i(a0: i32, b0: i32) -> i32 {
    if (b0 < 0) {
        if (a0 == 1) { return 1; }
        if (a0 == -1) { return select(1, -1, (b0 & 1) == 1); }
        return 0;
    }
    var r = 1; var a = a0; var b = b0;
    loop { if (b == 0) { break; } if ((b & 1) == 1) { r = r * a; } a = a * a; b = b >> 1u; }
    return r;
}
fn ak_ipow_u(a0: u32, b0: u32) -> u32 {
    var r = 1u; var a = a0; var b = b0;
    loop { if (b == 0u) { break; } if ((b & 1u) == 1u) { r = r * a; } a = a * a; b = b >> 1u; }
    return r;
}
fn ak_irem(a: i32, b: i32) -> i32 {
    // the truncated remainder, on magnitudes (GLSL leaves % of negative operands undefined,
    // and WGSL backends may translate to it)
    let ua = select(u32(a), 0u - u32(a), a < 0);
    let ub = select(u32(b), 0u - u32(b), b < 0);
    let r = ua % ub;
    return select(i32(r), -i32(r), a < 0);
}
fn ak_imod(a: i32, b: i32) -> i32 {
    if (b == 0 || b == -1) { return 0; }
    let r = ak_irem(a, b);
    if (r != 0 && ((r < 0) != (b < 0))) { return r + b; }
    return r;
}
"""

#: unary op -> {categories: expression}
UNARY: dict[str, dict[str, str]] = {
    # (the NaN test keeps a compiler from turning this into a max(), which drops NaN)
    "relu": {"f": "select(a, 0.0, a < 0.0 && !ak_isnan(a))", "i": "max(a, 0)", "ub": "a"},
    "abs": {"f": "abs(a)", "i": "select(a, -a, a < 0)", "ub": "a"},
    "neg": {"f": "-a", "i": "-a", "u": "0u - a"},
    "floor": {"f": "floor(a)", "iub": "a"},
    "ceil": {"f": "ceil(a)", "iub": "a"},
    "round": {"f": "round(a)", "iub": "a"},
    "sigmoid": {"f": "ak_sigmoid(a)"},
    "tanh": {"f": "ak_tanh(a)"},
    "exp": {"f": "ak_exp(a)"},
    "log": {"f": "ak_log(a)"},
    "sqrt": {"f": "ak_sqrt(a)"},
    "rsqrt": {"f": "1.0 / ak_sqrt(a)"},
    "sin": {"f": "select(ak_nan(), sin(a), ak_trig_ok(a))"},
    "cos": {"f": "select(ak_nan(), cos(a), ak_trig_ok(a))"},
    "tan": {"f": "select(ak_nan(), tan(a), ak_trig_ok(a))"},
    "erf": {"f": "ak_erf(a)"},
    "gelu": {"f": "0.5 * a * (1.0 + ak_erf(a * 0.7071067811865476))"},
    "gelu_tanh": {
        "f": "0.5 * a * (1.0 + ak_tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))"
    },
    "silu": {"f": "a * ak_sigmoid(a)"},
}

# 64-bit integers (l: I64, q: U64) through accelkit_webgpu.int64
_Z = "vec2<u32>(0u, 0u)"
UNARY["relu"]["l"] = f"select(a, {_Z}, w_is_neg(a))"
UNARY["relu"]["q"] = "a"
UNARY["abs"]["l"] = "w_abs(a)"
UNARY["abs"]["q"] = "a"
UNARY["neg"]["lq"] = "w_neg(a)"
for _op in ("floor", "ceil", "round"):
    UNARY[_op]["lq"] = "a"

#: binary op -> {categories: expression}; comparisons give bool (stored as 0 or 1).
BINARY: dict[str, dict[str, str]] = {
    "add": {"fiu": "a + b", "b": "a | b"},
    "sub": {"fiu": "a - b"},
    "mul": {"fiu": "a * b", "b": "a & b"},
    "div": {"f": "a / b"},
    "maximum": {"f": "ak_maxf(a, b)", "iub": "max(a, b)"},
    "minimum": {"f": "ak_minf(a, b)", "iub": "min(a, b)"},
    "pow": {"f": "ak_powf(a, b)", "i": "ak_ipow_i(a, b)", "u": "ak_ipow_u(a, b)"},
    "mod": {"f": "ak_modf(a, b)", "i": "ak_imod(a, b)", "u": "select(a % b, 0u, b == 0u)"},
    "eq": {"fiub": "a == b"},
    # NaN != anything, tested on the bits: lavapipe (Vulkan) compiled a float `a != b` to an
    # ordered compare, false for NaN; the OpenGL path did not
    "ne": {"f": "(a != b || ak_isnan(a) || ak_isnan(b))", "iub": "a != b"},
    "lt": {"fiub": "a < b"},
    "le": {"fiub": "a <= b"},
    "gt": {"fiub": "a > b"},
    "ge": {"fiub": "a >= b"},
    "floor_divide": {"f": "ak_ffloordiv(a, b)", "i": "ak_ifloordiv(a, b)",
                     "u": "select(a / b, 0u, b == 0u)", "l": "w_floordiv_s(a, b)",
                     "q": "w_floordiv_u(a, b)"},
    "fmod": {"f": "ak_fmodf(a, b)", "i": "select(ak_irem(a, b), 0, b == 0 || b == -1)",
             "u": "select(a % b, 0u, b == 0u)", "l": "w_fmod_s(a, b)", "q": "w_mod_u(a, b)"},
    "bitwise_and": {"iublq": "a & b"},
    "bitwise_or": {"iublq": "a | b"},
    "bitwise_xor": {"iublq": "a ^ b"},
    # counts outside 0..bits-1 shift every bit out (WGSL would take the count modulo 32)
    "left_shift": {"i": "select(0, a << u32(b), b >= 0 && b < {bits})",
                   "u": "select(0u, a << b, b < {bits}u)",
                   "l": f"select({_Z}, w_shl(a, b.x), !w_is_neg(b) && b.y == 0u && b.x < 64u)",
                   "q": f"select({_Z}, w_shl(a, b.x), b.y == 0u && b.x < 64u)"},
    "right_shift": {"i": "select(select(0, -1, a < 0), a >> u32(b), b >= 0 && b < {bits})",
                    "u": "select(0u, a >> b, b < {bits}u)",
                    "l": "w_shr_s(a, select(64u, b.x, !w_is_neg(b) && b.y == 0u && b.x < 64u))",
                    "q": "w_shr_u(a, select(64u, b.x, b.y == 0u && b.x < 64u))"},
}  # fmt: skip
BINARY["add"]["lq"] = "w_add(a, b)"
BINARY["sub"]["lq"] = "w_sub(a, b)"
BINARY["mul"]["lq"] = "w_mul(a, b)"
BINARY["maximum"]["l"] = "select(b, a, w_lt_s(b, a))"
BINARY["maximum"]["q"] = "select(b, a, w_lt_u(b, a))"
BINARY["minimum"]["l"] = "select(b, a, w_lt_s(a, b))"
BINARY["minimum"]["q"] = "select(b, a, w_lt_u(a, b))"
BINARY["pow"]["l"] = "w_pow(a, b, true)"
BINARY["pow"]["q"] = "w_pow(a, b, false)"
BINARY["mod"]["l"] = "w_mod_s(a, b)"
BINARY["mod"]["q"] = "w_mod_u(a, b)"
for _s, _lt in (("l", "w_lt_s"), ("q", "w_lt_u")):
    BINARY["eq"][_s] = "w_eq(a, b)"
    BINARY["ne"][_s] = "!w_eq(a, b)"
    BINARY["lt"][_s] = f"{_lt}(a, b)"
    BINARY["le"][_s] = f"!{_lt}(b, a)"
    BINARY["gt"][_s] = f"{_lt}(b, a)"
    BINARY["ge"][_s] = f"!{_lt}(a, b)"

_INT_RANGE = {
    DType.I8: (-(2**7), 2**7), DType.I16: (-(2**15), 2**15), DType.I32: (-(2**31), 2**31),
    DType.U8: (0, 2**8), DType.U16: (0, 2**16), DType.U32: (0, 2**32),
}  # fmt: skip


def _pick(table: dict[str, str], dtype: DType, op: str) -> str:
    cat = category(dtype)
    for cats, expr in table.items():
        if cat in cats:
            return expr.replace("{bits}", str(8 * dtype.itemsize))
    raise KeyError(f"{op} has no WGSL kernel for {dtype.value}")


def convert(expr: str, src: DType, dst: DType) -> str:
    """``expr`` (in ``src``'s compute type) as a value of ``dst``'s compute type, with accelkit's
    cast rules: floats truncate toward zero; NaN, infinities and values out of ``dst``'s range
    become 0; to BOOL is ``!= 0``; integers wrap."""
    s, d = compute_type(src), compute_type(dst)
    wide = "vec2<u32>"
    if s == wide and d == wide:
        return f"({expr})"
    if dst is DType.BOOL:
        if s == wide:
            return f"select(1u, 0u, w_is_zero({expr}))"
        if s == "f32":  # NaN is true; tested on the bits (see "ne" in BINARY)
            return f"select(0u, 1u, (bitcast<u32>({expr}) & 0x7fffffffu) != 0u)"
        zero = {"i32": "0", "u32": "0u"}[s]
        return f"select(0u, 1u, ({expr}) != {zero})"
    if s == wide:
        if d == "f32":
            return f"w_to_f32_{'s' if src is DType.I64 else 'u'}({expr})"
        return f"bitcast<{d}>(({expr}).x)"
    if d == wide:
        if s == "f32":
            return f"w_from_f32({expr}, {'true' if dst is DType.I64 else 'false'})"
        return f"w_from_{s}({expr})"
    if s == "f32" and d != "f32":
        lo, hi = _INT_RANGE[dst]
        return f"ak_ftoi_{d}({expr}, {float(lo)!r}, {float(hi)!r})"
    if s == d:
        return f"({expr})"
    return f"{d}({expr})"


_FTOI = """
fn ak_ftoi_i32(a: f32, lo: f32, hi: f32) -> i32 {
    let t = trunc(a);
    if (ak_isnan(a) || t < lo || t >= hi) { return 0; }
    return i32(t);
}
fn ak_ftoi_u32(a: f32, lo: f32, hi: f32) -> u32 {
    let t = trunc(a);
    if (ak_isnan(a) || t < lo || t >= hi) { return 0u; }
    return u32(t);
}
"""


def _operand_loads(
    operands: Sequence[tuple[str, DType, bool]], compute: DType, flat: bool
) -> tuple[list[Binding], str]:
    """Bindings and the WGSL statements defining each operand ``a``/``b``/``c`` in ``compute``
    (``c``, where's condition, stays bool). Scalars come from ``P[1 + k]`` (a 64-bit one's high
    word from ``P[4 + k]``); the broadcast layout is ``P[7] = nd``, dims from ``P[8]``, then
    ``nd`` strides per tensor operand."""
    binds: list[Binding] = []
    lines: list[str] = []
    tensors = [(name, dt) for name, dt, is_t in operands if is_t]
    if not flat and tensors:
        lines.append("let nd = P[7];")
        for name, _ in tensors:
            lines.append(f"var i_{name} = 0u;")
        lines.append("var r = e;")
        lines.append("for (var j = 0u; j < nd; j = j + 1u) {")
        lines.append("    let k = nd - 1u - j;")
        lines.append("    let d = P[8u + k];")
        lines.append("    let c0 = r % d;")
        lines.append("    r = r / d;")
        for t, (name, _) in enumerate(tensors):
            lines.append(f"    i_{name} = i_{name} + c0 * P[8u + nd * {t + 1}u + k];")
        lines.append("}")
    for k, (name, dt, is_t) in enumerate(operands):
        target = DType.BOOL if name == "c" else compute
        if is_t:
            binds.append(Binding(name, dt))
            raw = f"ldv_{name}({'e' if flat else f'i_{name}'})"
        else:
            raw = param_value(dt, 1 + k, 4 + k)  # high words at P[4 + k]
        if name == "c":
            lines.append(f"let {name} = {raw};")
        else:
            lines.append(f"let {name} = {convert(raw, dt, target)};")
    return binds, "\n    ".join(lines)


def _source(
    out: DType,
    compute: DType,
    operands: Sequence[tuple[str, DType, bool]],
    expr: str,
    flat: bool,
) -> str:
    binds, loads = _operand_loads(operands, compute, flat)
    result = convert(expr, compute, out) if compute is not out else f"({expr})"
    ct = compute_type(out)
    value = f"fn value(e: u32) -> {ct} {{\n    {loads}\n    return {result};\n}}\n"
    return map_kernel(binds, out, HELPERS + _FTOI + value)


# The WGSL sources are pure functions of their (hashable) arguments, built on the caller's
# thread at every launch: 15-70 us each on a 2-core VM (2026-11-27). Cached, as the pipelines
# built from them are.
@functools.lru_cache(maxsize=1024)
def unary_source(op: str, x: DType, out: DType, flat: bool = True) -> str:
    compute = out if out.is_floating else x
    return _source(out, compute, [("a", x, True)], _pick(UNARY[op], compute, op), flat)


@functools.lru_cache(maxsize=1024)
def binary_source(
    op: str, a: tuple[DType, bool], b: tuple[DType, bool], compute: DType, out: DType, flat: bool
) -> str:
    """``a op b`` computed in ``compute`` (the promoted dtype), stored as ``out``; each operand
    is (dtype, is a tensor)."""
    if op in COMPARE:
        return _compare_source(op, a, b, compute, flat)
    expr = _pick(BINARY[op], compute, op)
    return _source(out, compute, [("a", a[0], a[1]), ("b", b[0], b[1])], expr, flat)


def _compare_source(
    op: str, a: tuple[DType, bool], b: tuple[DType, bool], compute: DType, flat: bool
) -> str:
    """A comparison: the operands in ``compute``, the result bool."""
    binds, loads = _operand_loads([("a", a[0], a[1]), ("b", b[0], b[1])], compute, flat)
    expr = _pick(BINARY[op], compute, op)
    value = f"fn value(e: u32) -> u32 {{\n    {loads}\n    return select(0u, 1u, {expr});\n}}\n"
    return map_kernel(binds, DType.BOOL, HELPERS + _FTOI + value)


@functools.lru_cache(maxsize=1024)
def where_source(
    c: DType, a: tuple[DType, bool], b: tuple[DType, bool], out: DType, flat: bool
) -> str:
    expr = "select(b, a, c != 0u)"
    return _source(out, out, [("c", c, True), ("a", a[0], a[1]), ("b", b[0], b[1])], expr, flat)


@functools.lru_cache(maxsize=1024)
def unary_bitwise_not_source(x: DType) -> str:
    """``~a`` of an integer (``!a`` of a bool; componentwise on 64-bit words)."""
    expr = "1u - a" if x is DType.BOOL else "~a"
    return _source(x, x, [("a", x, True)], expr, True)


@functools.lru_cache(maxsize=1024)
def cast_source(x: DType, out: DType) -> str:
    binds, loads = _operand_loads([("a", x, True)], x, True)
    ct = compute_type(out)
    value = f"fn value(e: u32) -> {ct} {{\n    {loads}\n    return {convert('a', x, out)};\n}}\n"
    return map_kernel(binds, out, HELPERS + _FTOI + value)
