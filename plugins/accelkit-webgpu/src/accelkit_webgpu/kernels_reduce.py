"""Reductions and row kernels in WGSL: reduce, softmax, layer_norm, rms_norm, cross_entropy.

Two shapes of kernel:

* *row* kernels run one workgroup per output (a reduced element, or a row of softmax or a
  norm): the invocations stride over the row, then combine their partial results in workgroup
  memory, halving the active invocations each step (a tree of ``RWG`` leaves);
* *column* kernels run one invocation per output, each reducing its elements serially. The
  reductions use them when the innermost axis of ``x`` is kept, so that neighbouring
  invocations read neighbouring elements (coalesced loads), and there are enough outputs to
  fill the device, or when the reduced rows are short; softmax likewise when its axis is not
  the innermost one or its rows are short.

A reduction with few outputs and many reduced elements is split: pass 1 runs several
workgroups per output, each reducing a chunk into a partial accumulator; pass 2 combines them.

Reduced and kept axes are read through strides (adjacent axes of the same kind are merged
first), so no transposed copy is made. F16/BF16 inputs compute in f32. Outputs narrower than
a word are written as whole words: a reduction's workgroup (or invocation) computes the 2 or 4
outputs of one word; a row kernel whose rows fill whole words packs them; otherwise the row
kernel writes an F32 temporary that the elementwise cast kernel narrows once.

Integer sums and products give I64/U64 (pairs of words, :mod:`accelkit_webgpu.int64`), exact and
wrapping as NumPy's; the mean of integers sums exactly in 96 bits, then divides once; argmax and
argmin give the first index of the extreme (NaN counts as the extreme, as in NumPy) as I64.
"""

from __future__ import annotations

import functools

import numpy as np

from accelkit import Tensor
from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError, UnsupportedOperationError
from accelkit.sdk import prod
from accelkit_webgpu import elementwise as ew
from accelkit_webgpu.gpu import groups_for
from accelkit_webgpu.submit import WebGPUComponent, block, f32_bits, nbytes
from accelkit_webgpu.wgsl import Binding, category, compute_type, elements_per_word, header, storer

__all__ = [
    "CLAIMS",
    "RWG",
    "ReduceKernels",
    "collapse",
    "cross_entropy_loss_source",
    "cross_entropy_rows_source",
    "norm_source",
    "reduce_final_source",
    "reduce_partial_source",
    "reduce_source",
    "softmax_source",
]

#: The TensorOps names these kernels make work on the adapter (read by the probe).
CLAIMS: frozenset[str] = frozenset(
    {"reduce", "sum", "mean", "max", "min", "prod", "argmax", "argmin", "softmax",
     "log_softmax", "layer_norm", "rms_norm", "cross_entropy"}
)  # fmt: skip

#: Invocations per workgroup of the row kernels (a power of two).
RWG = 64

#: The most loop iterations a reduction gives one invocation. Mesa's llvmpipe stops an
#: invocation's loops after 65535 iterations in all (a guard against endless loops), so long
#: reductions are split over more workgroups (and column kernels keep to short columns).
MAX_TRIPS = 4096

#: The most elements per invocation a row kernel (softmax, norms, cross_entropy) loops over on a
#: software adapter, with three passes over the row (see MAX_TRIPS).
_ROW_TRIPS = 20000

#: Workgroups a split reduction aims for when there are few outputs.
_BUSY = 1024

_NEG_INF = "bitcast<f32>(0xff800000u)"
_POS_INF = "bitcast<f32>(0x7f800000u)"


def collapse(dims: list[int], strides: list[int]) -> tuple[list[int], list[int]]:
    """``dims``/``strides`` without unit axes, adjacent axes merged where they are contiguous
    (the flat index over the result enumerates the same offsets in the same order)."""
    out_d: list[int] = []
    out_s: list[int] = []
    for d, s in zip(dims, strides, strict=True):
        if d == 1:
            continue
        if out_d and out_s[-1] == d * s:
            out_d[-1] *= d
            out_s[-1] = s
        else:
            out_d.append(d)
            out_s.append(s)
    return out_d, out_s


def _offset_fn(name: str, first: int, nd: int) -> str:
    """``fn name(e: u32) -> u32``: the strided offset of flat index ``e`` over ``nd`` dims held
    in ``P[first:first+nd]`` with their strides in ``P[first+nd:first+2nd]``."""
    lines = [f"fn {name}(e: u32) -> u32 {{", "    var r = e;", "    var off = 0u;"]
    for k in range(nd - 1, -1, -1):
        d, s = f"P[{first + k}u]", f"P[{first + nd + k}u]"
        if k:
            lines.append(f"    off = off + (r % {d}) * {s};")
            lines.append(f"    r = r / {d};")
        else:
            lines.append(f"    off = off + r * {s};")
    lines += ["    return off;", "}"]
    return "\n".join(lines) + "\n"


def _tree(value: str, combine: str, result: str) -> str:
    """WGSL: every invocation's ``value`` combined over the workgroup into ``let result``
    (all invocations call it; ``sh`` is the workgroup array)."""
    return f"""
    sh[lid] = {value};
    workgroupBarrier();
    for (var s = {RWG // 2}u; s > 0u; s = s >> 1u) {{
        if (lid < s) {{ sh[lid] = {combine.format(a="sh[lid]", b="sh[lid + s]")}; }}
        workgroupBarrier();
    }}
    let {result} = sh[0];
    workgroupBarrier();
"""


_MAIN_ROW = f"""
@compute @workgroup_size({RWG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    let g = wid.y * nwg.x + wid.x;
"""

_MAIN_COL = f"""
@compute @workgroup_size({RWG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    let g = (wid.y * nwg.x + wid.x) * {RWG}u + lid;
"""

_WIDE = """
fn add96(a: vec3<u32>, b: vec3<u32>) -> vec3<u32> {
    let lo = a.x + b.x;
    let c0 = select(0u, 1u, lo < a.x);
    let m1 = a.y + b.y;
    let c1 = select(0u, 1u, m1 < a.y);
    let mid = m1 + c0;
    let c2 = select(0u, 1u, mid < m1);
    return vec3<u32>(lo, mid, a.z + b.z + c1 + c2);
}
fn to_f32_96(a: vec3<u32>) -> f32 {
    // a 96-bit two's complement integer as f32 (exactly rounded below 2^64)
    var v = a;
    let neg = (a.z & 0x80000000u) != 0u;
    if (neg) { v = add96(~a, vec3<u32>(1u, 0u, 0u)); }
    var m = w_to_f32_u(v.xy);
    if (v.z != 0u) { m = m + f32(v.z) * 18446744073709551616.0; }
    return select(m, -m, neg);
}
fn round53(a: vec2<u32>, signed: bool) -> vec3<u32> {
    // a 64-bit integer rounded to the nearest float64 (53 significant bits, ties to even), as a
    // 96-bit integer: NumPy's mean of 64-bit integers sums them as float64
    let neg = signed && w_is_neg(a);
    let m = select(a, w_neg(a), neg);
    var r = vec3<u32>(m.x, m.y, 0u);
    if (m.y >= 0x200000u) {
        let shift = 11u - countLeadingZeros(m.y);
        let q = w_shr_u(m, shift);
        let rest = w_sub(m, w_shl(q, shift));
        let half = w_shl(vec2<u32>(1u, 0u), shift - 1u);
        var qq = q;
        if (w_lt_u(half, rest) || (w_eq(rest, half) && (q.x & 1u) == 1u)) {
            qq = w_add(q, vec2<u32>(1u, 0u));
        }
        let lo = w_shl(qq, shift);
        r = vec3<u32>(lo.x, lo.y, select(0u, 1u, shift == 11u && qq.y == 0x200000u));
    }
    if (neg) { r = add96(~r, vec3<u32>(1u, 0u, 0u)); }
    return r;
}
"""


def _xv(x: DType) -> str:
    """``fn xv(i: u32) -> f32``: element ``i`` of ``x`` as f32."""
    cat = category(x)
    if cat in ("l", "q"):
        return (
            f"fn xv(i: u32) -> f32 {{ return w_to_f32_{'s' if cat == 'l' else 'u'}(ld64_x(i)); }}\n"
        )
    return "fn xv(i: u32) -> f32 { return f32(ld_x(i)); }\n"


def _value_type(x: DType) -> tuple[str, str, str, str]:
    """(type, load expression of element ``i``, ``lt(a, b)``, ``eq(a, b)``) of x's values as
    reductions compare them (64-bit integers as ``vec2<u32>``)."""
    cat = category(x)
    if cat in ("l", "q"):
        lt = f"w_lt_{'s' if cat == 'l' else 'u'}(a, b)"
        return "vec2<u32>", "ld64_x(i)", lt, "w_eq(a, b)"
    return compute_type(x), "ld_x(i)", "a < b", "a == b"


def _extreme(op: str, x: DType) -> str:
    """The identity of max/min (argmax/argmin): the least (greatest) value of x's type."""
    cat = category(x)
    low = op in ("max", "argmax")
    if cat == "f":
        return _NEG_INF if low else _POS_INF
    if cat == "i":
        return "i32(-2147483647 - 1)" if low else "2147483647"
    if cat == "l":
        return "vec2<u32>(0u, 0x80000000u)" if low else "vec2<u32>(0xffffffffu, 0x7fffffffu)"
    if cat == "q":
        return "vec2<u32>(0u, 0u)" if low else "vec2<u32>(0xffffffffu, 0xffffffffu)"
    return "0u" if low else "0xffffffffu"


def _reduce_parts(op: str, x: DType) -> tuple[str, str, str, str, str, str]:
    """(declarations, accumulator type, identity, combine body, load body, final body) of
    ``op`` over ``x``; the bodies see ``a``, ``b`` (combine), ``i`` (load), ``a``, ``n``
    (final: the accumulator and the number of reduced elements)."""
    cat = category(x)
    vt, load, lt, eq = _value_type(x)
    if op in ("argmax", "argmin"):
        decls = f"struct Acc {{ v: {vt}, i: u32 }}\n"
        decls += f"fn vlt(a: {vt}, b: {vt}) -> bool {{ return {lt}; }}\n"
        decls += f"fn veq(a: {vt}, b: {vt}) -> bool {{ return {eq}; }}\n"
        better = "vlt(a.v, b.v)" if op == "argmax" else "vlt(b.v, a.v)"
        if cat == "f":  # NaN wins (NumPy's rule), the first one among NaNs
            take = (
                "let an = ak_isnan(a.v);\n    let bn = ak_isnan(b.v);\n"
                "    var take = false;\n"
                "    if (an || bn) { take = (bn && !an) || (an && bn && b.i < a.i); }\n"
                f"    else {{ take = {better} || (a.v == b.v && b.i < a.i); }}\n"
            )
        else:
            take = f"let take = {better} || (veq(a.v, b.v) && b.i < a.i);\n"
        comb = f"{take}    if (take) {{ return b; }}\n    return a;"
        ident = f"Acc({_extreme(op, x)}, 0xffffffffu)"
        return decls, "Acc", ident, comb, f"return Acc({load}, k);", "return vec2<u32>(a.i, 0u);"
    if op in ("max", "min"):
        if cat == "f":
            comb = f"return ak_{op}f(a, b);"
        else:
            decls = f"fn vlt(a: {vt}, b: {vt}) -> bool {{ return {lt}; }}\n"
            cond = "vlt(a, b)" if op == "max" else "vlt(b, a)"
            comb = f"return select(a, b, {cond});"
            return decls, vt, _extreme(op, x), comb, f"return {load};", "return a;"
        return "", vt, _extreme(op, x), comb, f"return {load};", "return a;"
    if cat == "f":
        ident = "1.0" if op == "prod" else "0.0"
        comb = "return a * b;" if op == "prod" else "return a + b;"
        final = "return a;"
        if op == "mean":
            final = "if (n == 0u) { return ak_nan(); }\n    return a / f32(n);"
        return "", "f32", ident, comb, "return ld_x(i);", final
    # integers and bools: sums and products exact in 64 bits (wrapping, as NumPy's do); means
    # summed exactly in 96 bits, then divided once (64-bit elements rounded to float64 first)
    if cat in ("l", "q"):
        wide = "ld64_x(i)"
    elif cat == "i":
        wide = "w_from_i32(ld_x(i))"
    else:
        wide = "w_from_u32(ld_x(i))"
    if op == "mean":
        if cat in ("l", "q"):
            load = f"return round53({wide}, {'true' if cat == 'l' else 'false'});"
        else:
            sign = "select(0u, 0xffffffffu, (v.y & 0x80000000u) != 0u)" if cat == "i" else "0u"
            load = f"let v = {wide};\n    return vec3<u32>(v.x, v.y, {sign});"
        final = "if (n == 0u) { return ak_nan(); }\n    return to_f32_96(a) / f32(n);"
        return "", "vec3<u32>", "vec3<u32>(0u, 0u, 0u)", "return add96(a, b);", load, final
    ident = "vec2<u32>(1u, 0u)" if op == "prod" else "vec2<u32>(0u, 0u)"
    comb = "return w_mul(a, b);" if op == "prod" else "return w_add(a, b);"
    return "", "vec2<u32>", ident, comb, f"return {wide};", "return a;"


def _store_result(out: DType, value: str, e: str) -> str:
    """WGSL adding output ``e``'s ``value`` to ``word`` (narrow dtypes: lane ``j``) or storing
    it (4- and 8-byte dtypes)."""
    if out.itemsize == 8:
        return f"let r = st_bits({value}); t_out[2u * {e}] = r.x; t_out[2u * {e} + 1u] = r.y;"
    if out.itemsize == 4:
        return f"t_out[{e}] = st_bits({value});"
    return f"word = word | (st_bits({value}) << (j * {8 * out.itemsize}u));"


# Cached: pure functions of their arguments, called at every launch (as elementwise.py's
# builders are).
@functools.lru_cache(maxsize=1024)
def reduce_source(op: str, x: DType, out: DType, nk: int, nr: int, column: bool) -> str:
    """One output word per workgroup (row) or per invocation (column). ``P[0]`` outputs,
    ``P[1]`` reduced elements, then kept dims, kept strides, reduced dims, reduced strides."""
    decls, acc, ident, comb, load, final = _reduce_parts(op, x)
    epw = elements_per_word(out)
    narrow = out.itemsize < 4
    src = header([Binding("x", x)], out) + storer(out) + ew.HELPERS + _WIDE + decls
    src += _offset_fn("kbase", 2, nk) + _offset_fn("roff", 2 + 2 * nk, nr)
    src += f"fn lv(i: u32, k: u32) -> {acc} {{\n    {load}\n}}\n"
    src += f"fn comb(a: {acc}, b: {acc}) -> {acc} {{\n    {comb}\n}}\n"
    src += f"fn fin(a: {acc}, n: u32) -> {compute_type(out)} {{\n    {final}\n}}\n"
    flush = "t_out[g] = word;" if narrow else ""
    if column:
        return (
            src
            + _MAIN_COL
            + f"""    let n = P[0];
    let nred = P[1];
    if (g * {epw}u >= n) {{ return; }}
    var word = 0u;
    for (var j = 0u; j < {epw}u; j = j + 1u) {{
        let e = g * {epw}u + j;
        if (e < n) {{
            let base = kbase(e);
            var acc: {acc} = {ident};
            for (var k = 0u; k < nred; k = k + 1u) {{ acc = comb(acc, lv(base + roff(k), k)); }}
            {_store_result(out, "fin(acc, nred)", "e")}
        }}
    }}
    {flush}
}}
"""
        )
    return (
        src
        + f"var<workgroup> sh: array<{acc}, {RWG}>;\n"
        + _MAIN_ROW
        + f"""    let n = P[0];
    let nred = P[1];
    if (g * {epw}u >= n) {{ return; }}
    var word = 0u;
    for (var j = 0u; j < {epw}u; j = j + 1u) {{
        let e = g * {epw}u + j;
        if (e < n) {{
            let base = kbase(e);
            var acc: {acc} = {ident};
            for (var k = lid; k < nred; k = k + {RWG}u) {{ acc = comb(acc, lv(base + roff(k), k)); }}
            {_tree("acc", "comb({a}, {b})", "total")}
            if (lid == 0u) {{ {_store_result(out, "fin(total, nred)", "e")} }}
        }}
    }}
    if (lid == 0u) {{ {flush} }}
}}
"""
    )


def _acc_words(acc: str, x: DType) -> tuple[int, str, str]:
    """(words, ``fn put_acc(a, w)``, ``fn get_acc(w) -> acc``): accumulator ``w`` of the
    partial-results buffer ``t_tmp`` (an ``array<u32>``)."""
    if acc == "Acc":
        vt = _value_type(x)[0]
        if vt == "vec2<u32>":
            n, st, ld = (
                3,
                "t_tmp[b] = a.v.x; t_tmp[b + 1u] = a.v.y;",
                "vec2<u32>(t_tmp[b], t_tmp[b + 1u])",
            )
            idx = "2u"
        else:
            n, st, ld, idx = 2, f"t_tmp[b] = {_bits(vt, 'a.v')};", _from_bits(vt, "t_tmp[b]"), "1u"
        put = f"{st} t_tmp[b + {idx}] = a.i;"
        get = f"return Acc({ld}, t_tmp[b + {idx}]);"
    elif acc.startswith("vec"):
        n = int(acc[3])
        comps = "xyz"[:n]
        put = " ".join(f"t_tmp[b + {j}u] = a.{c};" for j, c in enumerate(comps))
        get = f"return {acc}({', '.join(f't_tmp[b + {j}u]' for j in range(n))});"
    else:
        n, put, get = 1, f"t_tmp[b] = {_bits(acc, 'a')};", f"return {_from_bits(acc, 't_tmp[b]')};"
    return (
        n,
        f"fn put_acc(a: {acc}, w: u32) {{\n    let b = w * {n}u;\n    {put}\n}}\n",
        f"fn get_acc(w: u32) -> {acc} {{\n    let b = w * {n}u;\n    {get}\n}}\n",
    )


def _bits(t: str, v: str) -> str:
    return v if t == "u32" else f"bitcast<u32>({v})"


def _from_bits(t: str, v: str) -> str:
    return v if t == "u32" else f"bitcast<{t}>({v})"


@functools.lru_cache(maxsize=1024)
def reduce_partial_source(op: str, x: DType, nk: int, nr: int) -> str:
    """Pass 1 of a split reduction: workgroup ``g`` reduces chunk ``g % S`` (``P[3]`` elements
    from ``(g % S) * P[3]``) of output ``g / S`` (``S = P[2]``) into accumulator ``g`` of
    ``tmp``. ``P[0]`` outputs, ``P[1]`` reduced elements; dims and strides from ``P[4]``."""
    decls, acc, ident, comb, load, _ = _reduce_parts(op, x)
    _, put, _ = _acc_words(acc, x)
    src = header([Binding("x", x)], None, [Binding("tmp", DType.U32)]) + ew.HELPERS + _WIDE
    src += decls + _offset_fn("kbase", 4, nk) + _offset_fn("roff", 4 + 2 * nk, nr)
    src += f"fn lv(i: u32, k: u32) -> {acc} {{\n    {load}\n}}\n"
    src += f"fn comb(a: {acc}, b: {acc}) -> {acc} {{\n    {comb}\n}}\n" + put
    return (
        src
        + f"var<workgroup> sh: array<{acc}, {RWG}>;\n"
        + _MAIN_ROW
        + f"""    let splits = P[2];
    if (g >= P[0] * splits) {{ return; }}
    let e = g / splits;
    let k0 = (g % splits) * P[3];
    let k1 = min(P[1], k0 + P[3]);
    let base = kbase(e);
    var acc: {acc} = {ident};
    for (var k = k0 + lid; k < k1; k = k + {RWG}u) {{ acc = comb(acc, lv(base + roff(k), k)); }}
    {_tree("acc", "comb({a}, {b})", "total")}
    if (lid == 0u) {{ put_acc(total, g); }}
}}
"""
    )


@functools.lru_cache(maxsize=1024)
def reduce_final_source(op: str, x: DType, out: DType) -> str:
    """Pass 2 of a split reduction: one output word per workgroup, combining the ``P[2]``
    accumulators of each of its outputs from ``tmp``. ``P[0]`` outputs, ``P[1]`` reduced
    elements (for the mean)."""
    decls, acc, ident, comb, _, final = _reduce_parts(op, x)
    _, _, get = _acc_words(acc, x)
    epw = elements_per_word(out)
    src = header([Binding("tmp", DType.U32)], out) + storer(out) + ew.HELPERS + _WIDE + decls
    src += f"fn comb(a: {acc}, b: {acc}) -> {acc} {{\n    {comb}\n}}\n" + get
    src += f"fn fin(a: {acc}, n: u32) -> {compute_type(out)} {{\n    {final}\n}}\n"
    flush = "t_out[g] = word;" if out.itemsize < 4 else ""
    return (
        src
        + f"var<workgroup> sh: array<{acc}, {RWG}>;\n"
        + _MAIN_ROW
        + f"""    let n = P[0];
    let splits = P[2];
    if (g * {epw}u >= n) {{ return; }}
    var word = 0u;
    for (var j = 0u; j < {epw}u; j = j + 1u) {{
        let e = g * {epw}u + j;
        if (e < n) {{
            var acc: {acc} = {ident};
            for (var k = lid; k < splits; k = k + {RWG}u) {{ acc = comb(acc, get_acc(e * splits + k)); }}
            {_tree("acc", "comb({a}, {b})", "total")}
            if (lid == 0u) {{ {_store_result(out, "fin(total, P[1])", "e")} }}
        }}
    }}
    if (lid == 0u) {{ {flush} }}
}}
"""
    )


def _store_row(value: str, epw: int, bits: int, packed: bool) -> str:
    """WGSL storing ``value`` (an f32 expression of ``at``, the element's index, and ``k``, its
    position in the row) for the ``rl`` elements of the row at ``base``, ``st`` apart.
    ``packed``: the row is contiguous and fills whole words of ``epw`` elements."""
    if packed and epw > 1:
        return f"""
    for (var q = lid; q < rl / {epw}u; q = q + {RWG}u) {{
        var word = 0u;
        for (var j = 0u; j < {epw}u; j = j + 1u) {{
            let k = q * {epw}u + j;
            let at = base + k;
            word = word | (st_bits({value}) << (j * {bits}u));
        }}
        t_out[base / {epw}u + q] = word;
    }}
"""
    return f"""
    for (var k = lid; k < rl; k = k + {RWG}u) {{
        let at = base + k * st;
        t_out[at] = st_bits({value});
    }}
"""


def _row_max_sum() -> str:
    """WGSL: ``mx`` (NaN-propagating maximum), ``bad`` (the row is NaN throughout: its maximum
    is NaN or infinite) and ``total`` (the sum of exp(x - mx)) of the row ``base``/``rl``/``st``."""
    return (
        f"""
    var m = {_NEG_INF};
    for (var k = lid; k < rl; k = k + {RWG}u) {{ m = ak_maxf(m, xv(base + k * st)); }}
"""
        + _tree("m", "ak_maxf({a}, {b})", "mx")
        + f"""
    let bad = ak_isnan(mx) || ak_isinf(mx);
    var sm = 0.0;
    if (!bad) {{
        for (var k = lid; k < rl; k = k + {RWG}u) {{ sm = sm + ak_exp(xv(base + k * st) - mx); }}
    }}
"""
        + _tree("sm", "({a} + {b})", "total")
    )


@functools.lru_cache(maxsize=1024)
def softmax_source(x: DType, out: DType, log: bool, column: bool, packed: bool) -> str:
    """Rows of ``P[1]`` elements ``P[2]`` apart (``P[0]`` rows); row ``g`` starts at
    ``(g / inner) * length * inner + g % inner``. A row whose maximum is NaN or infinite
    (a NaN, a +inf, or only -inf) is NaN throughout, as on the CPU backend."""
    epw = elements_per_word(out)
    bits = 8 * out.itemsize
    src = header([Binding("x", x)], out) + storer(out) + ew.HELPERS + _xv(x)
    value = (
        "select((xv(at) - mx) - lt, ak_nan(), bad)"
        if log
        else "select(ak_exp(xv(at) - mx) / total, ak_nan(), bad)"
    )
    if column:
        return (
            src
            + _MAIN_COL
            + f"""    if (g >= P[0]) {{ return; }}
    let rl = P[1];
    let st = P[2];
    let base = (g / st) * rl * st + g % st;
    var mx = {_NEG_INF};
    for (var k = 0u; k < rl; k = k + 1u) {{ mx = ak_maxf(mx, xv(base + k * st)); }}
    let bad = ak_isnan(mx) || ak_isinf(mx);
    var total = 0.0;
    if (!bad) {{
        for (var k = 0u; k < rl; k = k + 1u) {{ total = total + ak_exp(xv(base + k * st) - mx); }}
    }}
    let lt = ak_log(total);
    for (var k = 0u; k < rl; k = k + 1u) {{
        let at = base + k * st;
        t_out[at] = st_bits({value});
    }}
}}
"""
        )
    return (
        src
        + f"var<workgroup> sh: array<f32, {RWG}>;\n"
        + _MAIN_ROW
        + """    if (g >= P[0]) { return; }
    let rl = P[1];
    let st = P[2];
    let base = (g / st) * rl * st + g % st;
"""
        + _row_max_sum()
        + "    let lt = ak_log(total);\n"
        + _store_row(value, epw, bits, packed)
        + "}\n"
    )


@functools.lru_cache(maxsize=1024)
def norm_source(kind: str, x: DType, out: DType, has_w: bool, has_b: bool, packed: bool) -> str:
    """``P[0]`` rows of ``P[1]`` contiguous elements, ``P[2]`` eps (f32 bits): ``kind`` is
    "layer" (mean, then the centred sum of squares) or "rms"."""
    epw = elements_per_word(out)
    bits = 8 * out.itemsize
    inputs = [Binding("x", x)]
    if has_w:
        inputs.append(Binding("w", x))
    if has_b:
        inputs.append(Binding("b", x))
    src = header(inputs, out) + storer(out) + ew.HELPERS
    src += "fn xv(i: u32) -> f32 { return f32(ld_x(i)); }\n"
    src += f"var<workgroup> sh: array<f32, {RWG}>;\n"
    body = """    if (g >= P[0]) { return; }
    let rl = P[1];
    let st = 1u;
    let eps = bitcast<f32>(P[2]);
    let base = g * rl;
    let d = f32(rl);
"""
    if kind == "layer":
        body += (
            f"    var a = 0.0;\n    for (var k = lid; k < rl; k = k + {RWG}u) {{ a = a + xv(base + k); }}\n"
            + _tree("a", "({a} + {b})", "s1")
            + "    let mean = s1 / d;\n"
            + f"    var q = 0.0;\n    for (var k = lid; k < rl; k = k + {RWG}u) {{"
            " let c = xv(base + k) - mean; q = q + c * c; }\n" + _tree("q", "({a} + {b})", "s2")
        )
    else:
        body += (
            "    let mean = 0.0;\n"
            + f"    var q = 0.0;\n    for (var k = lid; k < rl; k = k + {RWG}u) {{"
            " let c = xv(base + k); q = q + c * c; }\n" + _tree("q", "({a} + {b})", "s2")
        )
    body += "    let inv = 1.0 / ak_sqrt(s2 / d + eps);\n"
    value = "((xv(at) - mean) * inv)"
    if has_w:
        value = f"({value} * ld_w(k))"
    if has_b:
        value = f"({value} + ld_b(k))"
    return src + _MAIN_ROW + body + _store_row(value, epw, bits, packed) + "}\n"


@functools.lru_cache(maxsize=1024)
def cross_entropy_rows_source(x: DType, probs: DType, target: DType, packed: bool) -> str:
    """One workgroup per row of ``P[1]`` logits (``P[0]`` rows): the row's probabilities into
    ``probs`` and its loss (f32) into ``rows``. A target outside ``0..C-1`` gives a NaN loss
    and is recorded in ``err`` (``[1, the target's low word, its high word]``)."""
    epw = elements_per_word(probs)
    bits = 8 * probs.itemsize
    src = header([Binding("x", x), Binding("tg", target)], None, [Binding("out", probs)])
    src += "@group(0) @binding(4) var<storage, read_write> t_rows: array<u32>;\n"
    src += "@group(0) @binding(5) var<storage, read_write> t_err: array<atomic<u32>>;\n"
    src += storer(probs) + ew.HELPERS
    src += "fn xv(i: u32) -> f32 { return f32(ld_x(i)); }\n"
    src += f"var<workgroup> sh: array<f32, {RWG}>;\n"
    # 64-bit targets load as an i32 index view (a value outside i32's range reads as its minimum)
    signed_view = category(target) == "i" or target.itemsize == 8
    outside = "t < 0 || u32(t) >= rl" if signed_view else "t >= rl"
    if target.itemsize == 8:
        bits64 = "ld64_tg(g)"
    elif category(target) == "i":
        bits64 = "w_from_i32(t)"
    else:
        bits64 = "w_from_u32(t)"
    value = "select(ak_exp(xv(at) - mx) / total, ak_nan(), bad)"
    return (
        src
        + _MAIN_ROW
        + """    if (g >= P[0]) { return; }
    let rl = P[1];
    let st = 1u;
    let base = g * rl;
"""
        + _row_max_sum()
        + _store_row(value, epw, bits, packed)
        + f"""
    if (lid == 0u) {{
        let t = ld_tg(g);
        if ({outside}) {{
            t_rows[g] = 0x7fc00000u;
            // the first row to get here reports its target (a weak exchange may fail spuriously)
            loop {{
                let r = atomicCompareExchangeWeak(&t_err[0], 0u, 1u);
                if (r.exchanged) {{
                    let v = {bits64};
                    atomicStore(&t_err[1], v.x);
                    atomicStore(&t_err[2], v.y);
                    break;
                }}
                if (r.old_value != 0u) {{ break; }}
            }}
        }} else {{
            let loss = ak_log(total) - (xv(base + u32(t)) - mx);
            t_rows[g] = bitcast<u32>(select(loss, ak_nan(), bad));
        }}
    }}
}}
"""
    )


@functools.lru_cache(maxsize=1024)
def cross_entropy_loss_source(out: DType, mean: bool) -> str:
    """One workgroup sums the ``P[0]`` row losses (f32) into the 0-d ``out`` (their mean with
    ``mean``: NaN for no rows)."""
    src = header([Binding("rows", DType.F32)], out) + storer(out) + ew.HELPERS
    src += f"var<workgroup> sh: array<f32, {RWG}>;\n"
    final = "select(total / f32(n), ak_nan(), n == 0u)" if mean else "total"
    return (
        src
        + _MAIN_ROW
        + f"""    let n = P[0];
    var a = 0.0;
    for (var k = lid; k < n; k = k + {RWG}u) {{ a = a + ld_rows(k); }}
"""
        + _tree("a", "({a} + {b})", "total")
        + f"""    if (lid == 0u) {{ t_out[0] = st_bits({final}); }}
}}
"""
    )


def _row_groups(rows: int) -> tuple[int, int]:
    return groups_for(rows, 1)


def _splits(n: int, n_red: int) -> int:
    """Workgroups per output of a row reduction: enough that no invocation loops more than
    ``MAX_TRIPS`` times, and, for few outputs, enough to occupy about ``_BUSY`` workgroups
    with at least 64 loads per invocation."""
    need = -(-n_red // (RWG * MAX_TRIPS))
    want = min(-(-n_red // (RWG * 64)), max(1, _BUSY // n))
    return max(1, need, want)


class ReduceKernels(WebGPUComponent):
    # -- helpers ----------------------------------------------------------------------------------
    def _rd_dispatch(
        self,
        src: str,
        params: list[int],
        inputs: list[Tensor],
        outputs: list[Tensor],
        groups: tuple[int, int],
    ) -> None:
        gpu = self.gpu
        ins = [(block(t), nbytes(t)) for t in inputs]
        outs = [(block(t), nbytes(t)) for t in outputs]
        keep = (inputs, outputs)

        def run() -> None:
            _ = keep  # the tensors stay alive (their blocks out of the pool) until this has run
            gpu.dispatch(src, params, ins, outs, groups)

        self.launch(run, inputs, outputs)

    def _rd_check_row(self, op: str, length: int) -> None:
        """Refuse rows longer than one workgroup's invocations can loop over on a software
        adapter (llvmpipe ends an invocation's loops after 65535 iterations in all; the row
        kernels loop about 3 * length / RWG times)."""
        if length > RWG * _ROW_TRIPS and self.loops_capped:
            raise UnsupportedOperationError(
                f"webgpu: {op} over rows of {length} elements is more than the software adapter"
                f" {self.backend.device} runs in one workgroup (at most {RWG * _ROW_TRIPS})"
            )

    def _rd_cast(self, tmp: Tensor, out: Tensor) -> None:
        """Narrow the F32 temporary ``tmp`` into ``out`` (the elementwise cast kernel)."""
        self.run_map(ew.cast_source(tmp.dtype, out.dtype), [out.size], [tmp], out, extra=[tmp])

    # -- reduce -----------------------------------------------------------------------------------
    def reduce(
        self, op: str, x: Tensor, axes: tuple[int, ...], keepdims: bool, out: Tensor
    ) -> None:
        n = out.size
        if n == 0:
            return
        strides = [1] * x.ndim
        for i in range(x.ndim - 2, -1, -1):
            strides[i] = strides[i + 1] * x.shape[i + 1]
        keep = [i for i in range(x.ndim) if i not in axes]
        kd, ks = collapse([x.shape[i] for i in keep], [strides[i] for i in keep])
        rd, rs = collapse([x.shape[i] for i in axes], [strides[i] for i in axes])
        n_red = prod(tuple(x.shape[i] for i in axes))
        # Columns when the reduced rows are short (a workgroup each would idle), or when the
        # innermost axis is kept (coalesced loads) and there are outputs enough to fill the device.
        inner_kept = bool(ks) and ks[-1] == 1
        column = n_red <= 16 or (inner_kept and (n >= 16 * RWG or n_red <= 64))
        column = column and n_red <= MAX_TRIPS
        dims = [*kd, *ks, *rd, *rs]
        words = -(-n // elements_per_word(out.dtype))
        splits = _splits(n, n_red)
        if column or splits == 1:
            src = reduce_source(op, x.dtype, out.dtype, len(kd), len(rd), column)
            groups = groups_for(words, RWG) if column else _row_groups(words)
            self._rd_dispatch(src, [n, n_red, *dims], [x], [out], groups)
            return
        # Split: n * splits workgroups reduce chunks into partial accumulators, then one
        # workgroup per output word combines them.
        chunk = -(-n_red // splits)
        acc = _reduce_parts(op, x.dtype)[1]
        per = _acc_words(acc, x.dtype)[0]
        tmp = self.empty((n * splits * per,), DType.U32)
        src1 = reduce_partial_source(op, x.dtype, len(kd), len(rd))
        self._rd_dispatch(
            src1, [n, n_red, splits, chunk, *dims], [x], [tmp], _row_groups(n * splits)
        )
        src2 = reduce_final_source(op, x.dtype, out.dtype)
        self._rd_dispatch(src2, [n, n_red, splits], [tmp], [out], _row_groups(words))

    # -- softmax ----------------------------------------------------------------------------------
    def softmax(self, x: Tensor, axis: int, out: Tensor, log: bool) -> None:
        if out.size == 0:
            return
        length = x.shape[axis]
        inner = prod(x.shape[axis + 1 :])
        rows = out.size // length
        # Columns (an invocation per row) for strided rows (coalesced across rows) or short
        # ones, when there are rows enough to fill the device.
        column = (inner > 1 or length <= 16) and rows >= 4 * RWG and length <= MAX_TRIPS
        if not column:
            self._rd_check_row("softmax", length)
        epw = elements_per_word(out.dtype)
        packed = not column and (epw == 1 or (inner == 1 and length % epw == 0))
        target = out if packed else self.empty(out.shape, DType.F32)
        src = softmax_source(x.dtype, target.dtype, log, column, packed)
        groups = groups_for(rows, RWG) if column else _row_groups(rows)
        self._rd_dispatch(src, [rows, length, inner], [x], [target], groups)
        if target is not out:
            self._rd_cast(target, out)

    # -- norms ------------------------------------------------------------------------------------
    def _rd_norm(
        self,
        kind: str,
        x: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        eps: float,
        out: Tensor,
    ) -> None:
        if out.size == 0:
            return
        d = x.shape[-1]
        rows = out.size // d
        self._rd_check_row(f"{kind}_norm", d)
        epw = elements_per_word(out.dtype)
        packed = d % epw == 0
        target = out if packed else self.empty(out.shape, DType.F32)
        src = norm_source(kind, x.dtype, target.dtype, weight is not None, bias is not None, packed)
        inputs = [x, *(t for t in (weight, bias) if t is not None)]
        self._rd_dispatch(src, [rows, d, f32_bits(eps)], inputs, [target], _row_groups(rows))
        if target is not out:
            self._rd_cast(target, out)

    def layer_norm(
        self, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, out: Tensor
    ) -> None:
        self._rd_norm("layer", x, weight, bias, eps, out)

    def rms_norm(self, x: Tensor, weight: Tensor | None, eps: float, out: Tensor) -> None:
        self._rd_norm("rms", x, weight, None, eps, out)

    # -- cross entropy ----------------------------------------------------------------------------
    def cross_entropy(
        self, logits: Tensor, targets: Tensor, reduction: str, loss: Tensor, probs: Tensor
    ) -> None:
        n, c = logits.shape
        self._rd_check_row("cross_entropy", c)
        # one workgroup sums the row losses, n / RWG trips per invocation
        self.check_loop("cross_entropy", "rows", n, RWG * 60000)
        epw = elements_per_word(probs.dtype)
        packed = c % epw == 0
        p_target = probs if packed else self.empty(probs.shape, DType.F32)
        direct = reduction == "none" and loss.dtype is DType.F32
        rows = loss if direct else self.empty((n,), DType.F32)
        if n and c:
            err = self.empty((3,), DType.U32)
            rows_src = cross_entropy_rows_source(
                logits.dtype, p_target.dtype, targets.dtype, packed
            )
            gpu = self.gpu
            ins = [(block(t), nbytes(t)) for t in (logits, targets)]
            outs = [(block(t), nbytes(t)) for t in (p_target, rows, err)]
            groups = _row_groups(n)
            signed = category(targets.dtype) in ("i", "l")
            keep = (logits, targets, p_target, rows, err)

            def run() -> None:
                _ = keep
                gpu.write(block(err), np.zeros(3, np.uint32))
                gpu.dispatch(rows_src, [n, c], ins, outs, groups)
                flag, lo, hi = (int(v) for v in gpu.read(block(err), 12).view(np.uint32))
                if flag:
                    value = lo | hi << 32
                    if signed and value >= 2**63:
                        value -= 2**64
                    raise InvalidArgumentError(
                        f"cross_entropy: targets must lie in 0..{c - 1}; got {value}"
                    )

            self.launch(run, [logits, targets], [p_target, rows, err])
        elif n:

            def no_classes() -> None:  # every target is out of range, reported when awaited
                raise InvalidArgumentError("cross_entropy: targets must lie in 0..-1 (C = 0)")

            self.launch(no_classes, [logits, targets], [rows])
        if p_target is not probs:
            self._rd_cast(p_target, probs)
        if reduction == "none":
            if rows is not loss:
                self._rd_cast(rows, loss)
            return
        loss_src = cross_entropy_loss_source(loss.dtype, reduction == "mean")
        self._rd_dispatch(loss_src, [n], [rows], [loss], (1, 1))
