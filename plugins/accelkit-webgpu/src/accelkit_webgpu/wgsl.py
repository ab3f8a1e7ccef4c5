"""WGSL building blocks: how each accelkit dtype is stored, loaded, computed in and stored back.

Every tensor is bound as ``array<u32>``: WGSL storage has no 8- or 16-bit types, so the narrow
dtypes are packed in 32-bit words (little-endian lanes, as on the host) and unpacked by the
loaders below. Each dtype computes in one of WGSL's 32-bit types (its *compute type*):

===========  ===========  ====================================================
dtype        compute      stored as
===========  ===========  ====================================================
F32          f32          the word's bits
F16, BF16    f32          a 16-bit lane; stores round to nearest even, once
I32          i32          the word's bits
I8, I16      i32          a sign-extended lane
U32          u32          the word
U8, U16      u32          a lane
BOOL         u32 (0, 1)   a byte lane
I64, U64     vec2<u32>    two words (low, high): :mod:`accelkit_webgpu.int64`
===========  ===========  ====================================================

For 64-bit tensors ``ld_<name>(i)`` is the *index view*, an ``i32`` (a value outside i32's range
reads as i32's minimum, which every range check refuses), so kernels that take indices read any
integer dtype alike; ``ld64_<name>(i)`` is the full value.

A *map kernel* computes each output element independently (``fn value(e: u32) -> CT``) and
writes whole words: one invocation packs the 4 (8-bit) or 2 (16-bit) elements of its word, so no
two invocations write the same word and no atomics are needed. Outputs always start at the
beginning of their buffer (accelkit tensors are dense and own their memory from offset 0), so the
padding lanes of the last word belong to nobody.
"""

from __future__ import annotations

from dataclasses import dataclass

from accelkit.dtype import DType
from accelkit_webgpu.int64 import INT64

__all__ = [
    "WG",
    "Binding",
    "category",
    "compute_type",
    "elements_per_word",
    "loader",
    "map_kernel",
    "param_value",
    "storer",
]

#: Invocations per workgroup of the generated kernels (the WebGPU default limit is 256).
WG = 64

_COMPUTE = {
    DType.F32: "f32", DType.F16: "f32", DType.BF16: "f32",
    DType.I32: "i32", DType.I16: "i32", DType.I8: "i32",
    DType.U32: "u32", DType.U16: "u32", DType.U8: "u32", DType.BOOL: "u32",
    DType.I64: "vec2<u32>", DType.U64: "vec2<u32>",
}  # fmt: skip


def compute_type(dtype: DType) -> str:
    """The WGSL type ``dtype`` computes in."""
    return _COMPUTE[dtype]


def category(dtype: DType) -> str:
    """'f' float, 'i' signed, 'u' unsigned, 'b' bool."""
    if dtype is DType.BOOL:
        return "b"
    if dtype is DType.I64:
        return "l"
    if dtype is DType.U64:
        return "q"
    return {"f32": "f", "i32": "i", "u32": "u"}[_COMPUTE[dtype]]


def elements_per_word(dtype: DType) -> int:
    """Elements of ``dtype`` per 32-bit word (1 for 4- and 8-byte types)."""
    return max(1, 4 // dtype.itemsize)


def param_value(dtype: DType, lo: int, hi: int) -> str:
    """A scalar of ``dtype``'s compute type held in the parameter words ``P[lo]`` (and, for a
    64-bit dtype, ``P[hi]``), as :func:`accelkit_webgpu.submit.scalar_words` writes it."""
    ct = _COMPUTE[dtype]
    if ct == "vec2<u32>":
        return f"vec2<u32>(P[{lo}], P[{hi}])"
    return {"f32": f"bitcast<f32>(P[{lo}])", "i32": f"bitcast<i32>(P[{lo}])", "u32": f"P[{lo}]"}[ct]


def loader(name: str, dtype: DType) -> str:
    """``fn ld_<name>(i: u32) -> CT``: element ``i`` of binding ``t_<name>``, and ``ldv_<name>``,
    the same as a value of the compute type (for 64-bit dtypes ``ld_`` is the i32 index view
    and ``ldv_`` = ``ld64_`` the full ``vec2<u32>`` value)."""
    t = f"t_{name}"
    if dtype in (DType.I64, DType.U64):
        return (
            f"fn ld64_{name}(i: u32) -> vec2<u32> {{ return vec2<u32>({t}[2u * i],"
            f" {t}[2u * i + 1u]); }}\n"
            f"fn ld_{name}(i: u32) -> i32 {{ return w_to_index(ld64_{name}(i)); }}\n"
            f"fn ldv_{name}(i: u32) -> vec2<u32> {{ return ld64_{name}(i); }}\n"
        )
    body = {
        DType.F32: f"return bitcast<f32>({t}[i]);",
        DType.I32: f"return bitcast<i32>({t}[i]);",
        DType.U32: f"return {t}[i];",
        DType.U8: f"return ({t}[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;",
        DType.BOOL: f"return select(0u, 1u, (({t}[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu) != 0u);",
        DType.I8: f"return bitcast<i32>({t}[i >> 2u] << (24u - (i & 3u) * 8u)) >> 24u;",
        DType.U16: f"return ({t}[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu;",
        DType.I16: f"return bitcast<i32>({t}[i >> 1u] << (16u - (i & 1u) * 16u)) >> 16u;",
        DType.F16: f"return ak_f16_to_f32(({t}[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu);",
        DType.BF16: f"return bitcast<f32>((({t}[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu) << 16u);",
    }[dtype]
    ct = _COMPUTE[dtype]
    return (
        f"fn ld_{name}(i: u32) -> {ct} {{ {body} }}\n"
        f"fn ldv_{name}(i: u32) -> {ct} {{ return ld_{name}(i); }}\n"
    )


def storer(dtype: DType) -> str:
    """``fn st_bits(v: CT) -> u32``: the bits of one element of ``dtype`` (in the low lane);
    for 64-bit dtypes ``st_bits`` is the identity on ``vec2<u32>``."""
    if dtype in (DType.I64, DType.U64):
        return "fn st_bits(v: vec2<u32>) -> vec2<u32> { return v; }\n"
    body = {
        DType.F32: "return bitcast<u32>(v);",
        DType.I32: "return bitcast<u32>(v);",
        DType.U32: "return v;",
        DType.U8: "return v & 0xffu;",
        DType.BOOL: "return select(0u, 1u, v != 0u);",
        DType.I8: "return bitcast<u32>(v) & 0xffu;",
        DType.U16: "return v & 0xffffu;",
        DType.I16: "return bitcast<u32>(v) & 0xffffu;",
        DType.F16: "return ak_f32_to_f16(v);",
        DType.BF16: "return ak_f32_to_bf16(v);",
    }[dtype]
    return f"fn st_bits(v: {_COMPUTE[dtype]}) -> u32 {{ {body} }}\n"


# Half-precision conversions, exact and rounding to nearest even (WGSL's pack2x16float leaves
# the rounding of out-of-range and tie cases to the implementation).
_HALF = """
fn ak_f16_to_f32(h: u32) -> f32 {
    let s = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        // zero or subnormal: m * 2^-24, exact in f32
        let v = f32(m) * 5.9604644775390625e-8;
        return bitcast<f32>(bitcast<u32>(v) | s);
    }
    if (e == 31u) { return bitcast<f32>(s | 0x7f800000u | (m << 13u)); }
    return bitcast<f32>(s | ((e + 112u) << 23u) | (m << 13u));
}
fn ak_f32_to_f16(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    let s = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if (a > 0x7f800000u) { return s | 0x7e00u; }            // NaN
    if (a >= 0x477ff000u) { return s | 0x7c00u; }           // rounds to inf
    if (a >= 0x38800000u) {                                  // normal f16
        let r = a + 0xfffu + ((a >> 13u) & 1u);
        return s | ((r - 0x38000000u) >> 13u);
    }
    if (a < 0x33000000u) { return s; }                       // below half the least subnormal
    // subnormal f16: shift the mantissa (with its implicit 1) and round to nearest even
    let e = a >> 23u;
    let m = (a & 0x7fffffu) | 0x800000u;
    let shift = 126u - e;                                    // 14..24 (e in 102..112)
    let q = m >> shift;
    let rem = m & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    var r = q;
    if (rem > half || (rem == half && (q & 1u) == 1u)) { r = q + 1u; }
    return s | r;
}
fn ak_f32_to_bf16(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    if ((b & 0x7fffffffu) > 0x7f800000u) { return ((b >> 16u) & 0x8000u) | 0x7fc0u; }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}
"""


@dataclass(frozen=True)
class Binding:
    """A read-only tensor input of a generated kernel, bound as ``t_<name>``."""

    name: str
    dtype: DType


def header(inputs: list[Binding], out: DType | None, rw: list[Binding] | None = None) -> str:
    """Bindings (0: the ``u32`` parameter words ``P``; then the inputs, read-only; then the
    read-write ones: ``t_out`` or ``rw``), the loaders, and the half-precision helpers."""
    lines = ["@group(0) @binding(0) var<storage, read> P: array<u32>;"]
    k = 1
    for b in inputs:
        lines.append(f"@group(0) @binding({k}) var<storage, read> t_{b.name}: array<u32>;")
        k += 1
    writable = list(rw or [])
    if out is not None:
        writable.append(Binding("out", out))
    for b in writable:
        lines.append(f"@group(0) @binding({k}) var<storage, read_write> t_{b.name}: array<u32>;")
        k += 1
    src = "\n".join(lines) + "\n" + _HALF + INT64
    for b in [*inputs, *writable]:
        src += loader(b.name, b.dtype)
    return src


def map_kernel(inputs: list[Binding], out: DType, value_fn: str) -> str:
    """A kernel computing ``value(e)`` for each of the ``P[0]`` output elements.

    ``value_fn`` defines ``fn value(e: u32) -> CT`` (CT: ``out``'s compute type); it may read the
    inputs through ``ld_<name>``, the output through ``ld_out`` (its value before this kernel)
    and parameters from ``P``. Dispatched over ``ceil(P[0] / elements_per_word(out))`` words.
    """
    epw = elements_per_word(out)
    bits = 8 * out.itemsize
    if out.itemsize == 8:
        pack = "let v = st_bits(value(w));\n    t_out[2u * w] = v.x;\n    t_out[2u * w + 1u] = v.y;"
    elif epw == 1:
        pack = "t_out[w] = st_bits(value(w));"
    else:
        pack = (
            "var word = 0u;\n"
            f"    for (var j = 0u; j < {epw}u; j = j + 1u) {{\n"
            f"        let e = w * {epw}u + j;\n"
            f"        if (e < n) {{ word = word | (st_bits(value(e)) << (j * {bits}u)); }}\n"
            "    }\n"
            "    t_out[w] = word;"
        )
    return (
        header(inputs, out)
        + storer(out)
        + value_fn
        + f"""
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    let w = (wid.y * nwg.x + wid.x) * {WG}u + lid;
    let n = P[0];
    if (w * {epw}u >= n) {{ return; }}
    {pack}
}}
"""
    )
