"""Matrix products, convolution and attention in WGSL: gemm, matmul, linear, conv2d, attention.

**GEMM.** One tiled kernel serves gemm (2-d and batched), matmul (batched, broadcasting, 1-d
operands promoted), linear and conv2d (as an implicit GEMM). A workgroup of 16x16 invocations
computes a ``TM x TN`` output tile (128x64 with 8x4 outputs per invocation for large products,
64x64 with 4x4, or 16x64 when M is small): it walks K in steps of 16, staging the A and B tiles
in workgroup memory as ``vec4`` (4 rows of A / 4 columns of B per entry; the load order follows
the operand's contiguous axis), and accumulates in ``vec4`` registers, in f32 for the float
dtypes (F16/BF16 load to f32) and in i32/u32, wrapping, for the integer ones. I64/U64 products
run a scalar variant of the same tiling on the emulated 64-bit words (exact, wrapping). The
operands are read through element strides, so transposes, broadcast batch dimensions and ``c``
(which broadcasts to the output) never materialise; batches run along the dispatch's
z axis. Outputs of a 4-byte dtype are written directly; a narrower output dtype goes through an
F32/I32/U32 temporary and the cast kernel (two invocations must not write one word).

**conv2d.** NCHW cross-correlation as an implicit GEMM per (image, group): A is the group's
weights [O/G, C/G*KH*KW], B the im2col matrix of the image, read on the fly from ``x`` (zero
padding is a bounds test), so no column buffer exists. Where a group has fewer than 4 output
channels (depthwise), a direct kernel (one invocation per output element) runs instead.

**attention.** Flash style: one workgroup per (batch*head, block of 64 query rows), one
invocation per query row; K and V are staged in workgroup memory a tile of keys at a time and
folded into a running maximum, sum and output accumulator (online softmax). Causal attention is
aligned bottom-right (query i sees keys ``j <= i + Skv - Sq``), and a group stops at the last
key its last row can see. The mask is read through broadcast strides over [B, H, Sq, Skv]: BOOL
keeps True positions, a float mask is added. As on the CPU backend, a row that sees no key (or
only ``-inf`` scores) is zeros and a row with a NaN or ``+inf`` score is NaN.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import numpy as np

from accelkit import Tensor
from accelkit.dtype import DType
from accelkit.errors import AccelError, UnsupportedOperationError
from accelkit.sdk import broadcast_shapes, prod
from accelkit_webgpu.elementwise import _FTOI as FTOI
from accelkit_webgpu.elementwise import HELPERS, cast_source, convert
from accelkit_webgpu.gpu import MAX_GROUPS
from accelkit_webgpu.kernels_shape import broadcast_strides
from accelkit_webgpu.submit import WebGPUComponent, block, f32_bits, nbytes
from accelkit_webgpu.wgsl import Binding, compute_type, header, map_kernel, storer

log = logging.getLogger("accelkit.webgpu")

__all__ = ["CLAIMS", "LinalgKernels"]

#: The TensorOps names these kernels make work on the adapter (read by the probe).
CLAIMS: frozenset[str] = frozenset(
    {
        "gemm",
        "batched_gemm",
        "matmul",
        "linear",
        "conv2d",
        "attention",
        "conv1d",
        "conv_transpose2d",
    }
)

# -- parameter words of the GEMM kernel --------------------------------------------------------
# 0 M, 1 N, 2 K, 3 a row stride, 4 a k stride, 5 b k stride, 6 b col stride, 7 c row stride,
# 8 c col stride, 9 alpha, 10 beta, 11 first batch of this dispatch, 12 number of batch dims,
# 13..23 conv geometry (H, W, KH, KW, OW, sh, sw, ph, pw, dh, dw), 24 first row tile,
# 25 first column tile; from 32, per batch dim: size, a stride, b stride, c stride.
_BATCH0 = 32

#: The vectorised GEMM's tiles: workgroup (x, y) and outputs per invocation (rows, columns).
#: 128x64 (12 KiB of workgroup memory) where both sides fill it, 64x64 otherwise, 16x64 for a
#: few rows. (8 columns per invocation gave wrong results on llvmpipe for a second column tile:
#: not understood yet, so not used.)
_TILE_LARGE = (16, 16, 8, 4)
_TILE_MEDIUM = (16, 16, 4, 4)
_TILE_ROWS = (16, 4, 4, 4)

_WIDE = {"f32": DType.F32, "i32": DType.I32, "u32": DType.U32, "vec2<u32>": DType.I64}


def _ld(name: str, dtype: DType) -> str:
    """The loader of binding ``name`` giving the full value (``ld64_`` for 64-bit dtypes)."""
    return f"ld64_{name}" if dtype.itemsize == 8 else f"ld_{name}"


def _zero(ct: str) -> str:
    return {"f32": "0.0", "i32": "0i", "u32": "0u", "vec2<u32>": "vec2<u32>(0u, 0u)"}[ct]


@dataclass(frozen=True)
class _GemmSpec:
    a: DType
    b: DType
    c: DType | None
    out: DType  # a 4-byte dtype: F32, I32 or U32
    rm: int  # output rows per invocation (the tile is 16 * rm rows)
    rn: int  # output columns per invocation
    a_kfast: bool  # A's contiguous axis is k (load tiles along k)
    b_nfast: bool  # B's contiguous axis is n
    int_scale: bool  # integer output with integral alpha and beta
    conv: bool  # B is the im2col matrix of P's geometry
    wx: int = 16  # workgroup size (vectorised kernel)
    wy: int = 16


def _vec_main(s: _GemmSpec, ct: str, store: str) -> str:
    """The tiled main of a 32-bit compute type: tiles in workgroup memory as ``vec4`` (4 rows
    of A, 4 columns of B per entry), so each step of k reads ``RM/4 + RN/4`` vectors and does
    ``RM * RN`` multiply-adds as vector operations; invocation (x, y) owns rows
    ``y*RM .. y*RM+RM-1`` and columns ``x*RN .. x*RN+RN-1`` of the tile."""
    wx, wy, rm, rn, tk = s.wx, s.wy, s.rm, s.rn, 16
    tm, tn = wy * rm, wx * rn
    nthreads = wx * wy
    vt = f"vec4<{ct}>"
    z = _zero(ct)
    lines: list[str] = []
    add = lines.append
    add(f"var<workgroup> As: array<{vt}, {tm // 4 * tk}>;")
    add(f"var<workgroup> Bs: array<{vt}, {tn // 4 * tk}>;")
    add(f"@compute @workgroup_size({wx}, {wy})")
    add(
        "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,"
    )
    add("        @builtin(local_invocation_index) li: u32) {")
    add("    let M = P[0];\n    let N = P[1];\n    let K = P[2];")
    add("    let bidx = wid.z + P[11];\n    var rest = bidx;")
    add("    var a0 = 0u;\n    var b0 = 0u;\n    var c0 = 0u;\n    let nbd = P[12];")
    add("    for (var t = 0u; t < nbd; t = t + 1u) {")
    add(f"        let w = {_BATCH0}u + 4u * (nbd - 1u - t);")
    add("        let q = rest % P[w];\n        rest = rest / P[w];")
    add("        a0 = a0 + q * P[w + 1u];\n        b0 = b0 + q * P[w + 2u];")
    add("        c0 = c0 + q * P[w + 3u];\n    }")
    add(f"    let row0 = (wid.y + P[24]) * {tm}u;")
    add(f"    let col0 = (wid.x + P[25]) * {tn}u;")
    for r in range(rm):
        for q in range(rn // 4):
            add(f"    var acc{r}_{q} = {vt}({z});")
    add(f"    for (var k0 = 0u; k0 < K; k0 = k0 + {tk}u) {{")
    # A tile: tm/4 * tk vec4 entries
    na = tm // 4 * tk
    add(f"        for (var e = li; e < {na}u; e = e + {nthreads}u) {{")
    if s.a_kfast:
        add(f"            let kk = e % {tk}u;\n            let iv = e / {tk}u;")
    else:
        add(f"            let iv = e % {tm // 4}u;\n            let kk = e / {tm // 4}u;")
    add("            let gk = k0 + kk;\n            let gi = row0 + 4u * iv;")
    add(f"            var v = {vt}({z});")
    add("            if (gk < K) {")
    for c, comp in enumerate("xyzw"):
        add(f"                if (gi + {c}u < M) {{ v.{comp} = load_a(a0, gi + {c}u, gk); }}")
    add("            }")
    add(f"            As[kk * {tm // 4}u + iv] = v;\n        }}")
    nb = tn // 4 * tk
    add(f"        for (var e = li; e < {nb}u; e = e + {nthreads}u) {{")
    if s.b_nfast:
        add(f"            let jv = e % {tn // 4}u;\n            let kk = e / {tn // 4}u;")
    else:
        add(f"            let kk = e % {tk}u;\n            let jv = e / {tk}u;")
    add("            let gk = k0 + kk;\n            let gj = col0 + 4u * jv;")
    add(f"            var v = {vt}({z});")
    add("            if (gk < K) {")
    for c, comp in enumerate("xyzw"):
        add(f"                if (gj + {c}u < N) {{ v.{comp} = load_b(b0, gk, gj + {c}u); }}")
    add("            }")
    add(f"            Bs[kk * {tn // 4}u + jv] = v;\n        }}")
    add("        workgroupBarrier();")
    add(f"        for (var kk = 0u; kk < {tk}u; kk = kk + 1u) {{")
    for v in range(rm // 4):
        add(f"            let av{v} = As[kk * {tm // 4}u + lid.y * {rm // 4}u + {v}u];")
    for q in range(rn // 4):
        add(f"            let bv{q} = Bs[kk * {tn // 4}u + lid.x * {rn // 4}u + {q}u];")
    for r in range(rm):
        comp = "xyzw"[r % 4]
        for q in range(rn // 4):
            add(f"            acc{r}_{q} = acc{r}_{q} + av{r // 4}.{comp} * bv{q};")
    add("        }")
    add("        workgroupBarrier();\n    }")
    add("    let o0 = bidx * M * N;")
    for r in range(rm):
        add(f"    let gi{r} = row0 + lid.y * {rm}u + {r}u;")
        add(f"    if (gi{r} < M) {{")
        add(f"        let gi = gi{r};")
        for q in range(rn // 4):
            for c, comp in enumerate("xyzw"):
                add(f"        let gj{q}{c} = col0 + lid.x * {rn}u + {4 * q + c}u;")
                add(f"        if (gj{q}{c} < N) {{")
                add(f"            let gj = gj{q}{c};")
                add(f"            let v = acc{r}_{q}.{comp};")
                add(f"            {store}")
                add("        }")
        add("    }")
    add("}")
    return "\n".join(lines) + "\n"


# Cached: a pure function of its arguments, called at every GEMM launch (as elementwise.py's
# builders are).
@functools.lru_cache(maxsize=1024)
def _gemm_source(s: _GemmSpec) -> str:
    ct = compute_type(s.out)
    wide = ct == "vec2<u32>"
    tm, tn, tk = 16 * s.rm, 16 * s.rn, 16
    inputs = [Binding("a", s.a), Binding("b", s.b)]
    if s.c is not None:
        inputs.append(Binding("c", s.c))
    src = header(inputs, s.out) + HELPERS + FTOI + storer(s.out)
    la = convert(f"{_ld('a', s.a)}(base + i * P[3] + k * P[4])", s.a, s.out)
    src += f"fn load_a(base: u32, i: u32, k: u32) -> {ct} {{\n    return {la};\n}}\n"
    if s.conv:
        lb = convert(f"{_ld('b', s.b)}(base + (c * P[13] + u32(ih)) * P[14] + u32(iw))", s.b, s.out)
        src += f"""
fn load_b(base: u32, r: u32, p: u32) -> {ct} {{
    let kw = P[16];
    let khw = P[15] * kw;
    let c = r / khw;
    let rr = r % khw;
    let ow = P[17];
    let ih = i32((p / ow) * P[18] + (rr / kw) * P[22]) - i32(P[20]);
    let iw = i32((p % ow) * P[19] + (rr % kw) * P[23]) - i32(P[21]);
    if (ih < 0 || iw < 0 || u32(ih) >= P[13] || u32(iw) >= P[14]) {{ return {_zero(ct)}; }}
    return {lb};
}}
"""
    else:
        lb = convert(f"{_ld('b', s.b)}(base + k * P[5] + j * P[6])", s.b, s.out)
        src += f"fn load_b(base: u32, k: u32, j: u32) -> {ct} {{\n    return {lb};\n}}\n"
    # epilogue: alpha * acc (+ beta * c)
    cload = f"{_ld('c', s.c)}(c0 + gi * P[7] + gj * P[8])" if s.c is not None else ""
    if ct == "f32" or s.int_scale:
        if ct == "f32":
            al, be = "bitcast<f32>(P[9])", "bitcast<f32>(P[10])"
        elif ct == "i32":
            al, be = "bitcast<i32>(P[9])", "bitcast<i32>(P[10])"
        elif ct == "u32":
            al, be = "P[9]", "P[10]"
        else:
            al, be = "w_from_i32(bitcast<i32>(P[9]))", "w_from_i32(bitcast<i32>(P[10]))"
        expr = f"w_mul({al}, v)" if wide else f"{al} * v"
        if s.c is not None:
            cv = convert(cload, s.c, s.out)
            expr = f"w_add({expr}, w_mul({be}, {cv}))" if wide else f"{expr} + {be} * {cv}"
    else:  # fractional alpha/beta with an integer output: in f32, then converted
        expr = f"bitcast<f32>(P[9]) * {convert('v', s.out, DType.F32)}"
        if s.c is not None:
            expr += f" + bitcast<f32>(P[10]) * {convert(cload, s.c, DType.F32)}"
        expr = convert(expr, DType.F32, s.out)
    if wide:
        store = (
            f"let bits = st_bits({expr});\n"
            "            t_out[2u * (o0 + gi * N + gj)] = bits.x;\n"
            "            t_out[2u * (o0 + gi * N + gj) + 1u] = bits.y;"
        )
        fma = "\n".join(
            f"        acc[{r * s.rn + c}] = w_add(acc[{r * s.rn + c}], w_mul(a{r}, b{c}));"
            for r in range(s.rm)
            for c in range(s.rn)
        )
    else:
        store = f"t_out[o0 + gi * N + gj] = st_bits({expr});"
        fma = "\n".join(
            f"        acc[{r * s.rn + c}] = acc[{r * s.rn + c}] + a{r} * b{c};"
            for r in range(s.rm)
            for c in range(s.rn)
        )
    if not wide:
        return src + _vec_main(s, ct, store)
    a_load = "let kk = e % TK; let i = e / TK;" if s.a_kfast else "let i = e % TM; let kk = e / TM;"
    b_load = "let j = e % TN; let kk = e / TN;" if s.b_nfast else "let kk = e % TK; let j = e / TK;"
    av = "\n".join(f"        let a{r} = As[kk * TM + ly + {16 * r}u];" for r in range(s.rm))
    bv = "\n".join(f"        let b{c} = Bs[kk * TN + lx + {16 * c}u];" for c in range(s.rn))
    ep = []
    for r in range(s.rm):
        ep.append(f"    let gi{r} = row0 + ly + {16 * r}u;")
        ep.append(f"    if (gi{r} < M) {{")
        ep.append(f"        let gi = gi{r};")
        for c in range(s.rn):
            ep.append(f"        let gj{c} = col0 + lx + {16 * c}u;")
            ep.append(f"        if (gj{c} < N) {{")
            ep.append(f"            let gj = gj{c};")
            ep.append(f"            let v = acc[{r * s.rn + c}];")
            ep.append(f"            {store}")
            ep.append("        }")
        ep.append("    }")
    epilogue = "\n".join(ep)
    src += f"""
const TM: u32 = {tm}u;
const TN: u32 = {tn}u;
const TK: u32 = {tk}u;
var<workgroup> As: array<{ct}, {tm * tk}>;
var<workgroup> Bs: array<{ct}, {tn * tk}>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let M = P[0];
    let N = P[1];
    let K = P[2];
    let bidx = wid.z + P[11];
    var rest = bidx;
    var a0 = 0u;
    var b0 = 0u;
    var c0 = 0u;
    let nbd = P[12];
    for (var t = 0u; t < nbd; t = t + 1u) {{
        let w = {_BATCH0}u + 4u * (nbd - 1u - t);
        let q = rest % P[w];
        rest = rest / P[w];
        a0 = a0 + q * P[w + 1u];
        b0 = b0 + q * P[w + 2u];
        c0 = c0 + q * P[w + 3u];
    }}
    let row0 = (wid.y + P[24]) * TM;
    let col0 = (wid.x + P[25]) * TN;
    let lx = lid.x;
    let ly = lid.y;
    var acc: array<{ct}, {s.rm * s.rn}>;
    for (var k0 = 0u; k0 < K; k0 = k0 + TK) {{
        for (var t = 0u; t < {tm * tk // 256}u; t = t + 1u) {{
            let e = li + t * 256u;
            {a_load}
            let gi = row0 + i;
            let gk = k0 + kk;
            var v = {_zero(ct)};
            if (gi < M && gk < K) {{ v = load_a(a0, gi, gk); }}
            As[kk * TM + i] = v;
        }}
        for (var t = 0u; t < {tn * tk // 256}u; t = t + 1u) {{
            let e = li + t * 256u;
            {b_load}
            let gj = col0 + j;
            let gk = k0 + kk;
            var v = {_zero(ct)};
            if (gj < N && gk < K) {{ v = load_b(b0, gk, gj); }}
            Bs[kk * TN + j] = v;
        }}
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk = kk + 1u) {{
{av}
{bv}
{fma}
        }}
        workgroupBarrier();
    }}
    let o0 = bidx * M * N;
{epilogue}
}}
"""
    return src


# -- direct convolution (few output channels per group: depthwise) ------------------------------
# P: 0 size, 1 C, 2 H, 3 W, 4 O, 5 CG, 6 KH, 7 KW, 8 OH, 9 OW, 10 sh, 11 sw, 12 ph, 13 pw,
# 14 dh, 15 dw, 16 OG
_CONV_DIRECT = """
fn value(e: u32) -> f32 {{
    let OW = P[9];
    let OH = P[8];
    let O = P[4];
    let ow = e % OW;
    var t = e / OW;
    let oh = t % OH;
    t = t / OH;
    let o = t % O;
    let n = t / O;
    let CG = P[5];
    let KH = P[6];
    let KW = P[7];
    let H = P[2];
    let W = P[3];
    let g = o / P[16];
    let ih0 = i32(oh * P[10]) - i32(P[12]);
    let iw0 = i32(ow * P[11]) - i32(P[13]);
    let xb = (n * P[1] + g * CG) * H * W;
    let wb = o * CG * KH * KW;
    var sum = 0.0;
    for (var c = 0u; c < CG; c = c + 1u) {{
        for (var kh = 0u; kh < KH; kh = kh + 1u) {{
            let ih = ih0 + i32(kh * P[14]);
            if (ih < 0 || u32(ih) >= H) {{ continue; }}
            let xr = xb + (c * H + u32(ih)) * W;
            let wr = wb + (c * KH + kh) * KW;
            for (var kw = 0u; kw < KW; kw = kw + 1u) {{
                let iw = iw0 + i32(kw * P[15]);
                if (iw >= 0 && u32(iw) < W) {{ sum = sum + ld_x(xr + u32(iw)) * ld_w(wr + kw); }}
            }}
        }}
    }}
    {bias}
    return sum;
}}
"""


# -- attention ------------------------------------------------------------------------------------
# P: 0 heads, 1 group (H / Hkv), 2 Sq, 3 Skv, 4 scale, 5 first batch*head of this dispatch,
# 6..9 mask strides over [B, H, Sq, Skv]; split kernels: 10 first key of this dispatch, 11 the
# key it stops before, 12 flags (1: the first range, the state starts empty; 2: the last range,
# the output is written)
_BQ = 64
#: The longest inner dimension a GEMM (or an implicit-GEMM convolution) runs on a software
#: adapter: longer ones are refused (see _gemm_run).
GEMM_MAX_K_SOFTWARE = 32768
#: Keys times (D + DV) one invocation may walk on a software adapter in one dispatch (measured:
#: D = DV = 64 ran right up to 384 keys on llvmpipe, not 512; each key costs an invocation about
#: 2 * (D + DV) loop iterations and llvmpipe stops at 65,535). Longer key ranges are split over
#: dispatches that carry the online softmax's state in a scratch buffer.
ATTENTION_KEY_TRIPS = 49152


def _attention_source(
    q: DType,
    k: DType,
    v: DType,
    mask: DType | None,
    d: int,
    dv: int,
    bk: int,
    causal: bool,
    split: bool = False,
) -> str:
    """Flash-style attention: one invocation per query row, keys in tiles of ``bk`` through
    workgroup memory, an online softmax. ``split``: the kernel covers the keys P[10]..P[11] and
    carries (running max, running sum, NaN flag, accumulator) per query row in ``t_st`` between
    dispatches (DV + 3 words a row)."""
    inputs = [Binding("q", q), Binding("k", k), Binding("v", v)]
    if mask is not None:
        inputs.append(Binding("mask", mask))
    da, dva = max(d, 1), max(dv, 1)
    if mask is None:
        mask_code = ""
    elif mask is DType.BOOL:
        mask_code = "if (ld_mask(mrow + j * P[9]) == 0u) { s = ak_ninf(); }"
    else:
        mask_code = f"s = s + {convert('ld_mask(mrow + j * P[9])', mask, DType.F32)};"
    if causal:
        kend = "u32(clamp(i32(min(wid.x * BQ + BQ, sq)) + i32(skv) - i32(sq), 0, i32(skv)))"
        nrow = "let n = u32(clamp(i32(i + skv) - i32(sq) + 1 - i32(j0), 0, i32(tn)));"
    else:
        kend = "skv"
        nrow = "let n = tn;"
    if split:
        kend = f"let kend = min({kend}, P[11]);\n    let jb = P[10];"
        load = """let srow = (bh * sq + iq) * (DV + 3u);
    if ((P[12] & 1u) == 0u) {
        run_max = bitcast<f32>(t_st[srow]);
        run_sum = bitcast<f32>(t_st[srow + 1u]);
        bad = t_st[srow + 2u] != 0u;
        for (var c = 0u; c < DV; c = c + 1u) { acc[c] = bitcast<f32>(t_st[srow + 3u + c]); }
    }"""
        keep = """if ((P[12] & 2u) == 0u) {
        t_st[srow] = bitcast<u32>(run_max);
        t_st[srow + 1u] = bitcast<u32>(run_sum);
        t_st[srow + 2u] = select(0u, 1u, bad);
        for (var c = 0u; c < DV; c = c + 1u) { t_st[srow + 3u + c] = bitcast<u32>(acc[c]); }
        return;
    }"""
        rw = [Binding("st", DType.F32)]
    else:
        kend = f"let kend = {kend};\n    let jb = 0u;"
        load = keep = ""
        rw = None
    return (
        header(inputs, DType.F32, rw)
        + HELPERS
        + f"""
fn ak_ninf() -> f32 {{ return bitcast<f32>(0xff800000u); }}
fn ak_isninf(x: f32) -> bool {{ return bitcast<u32>(x) == 0xff800000u; }}
const BQ: u32 = {_BQ}u;
const BK: u32 = {bk}u;
const D: u32 = {d}u;
const DV: u32 = {dv}u;
var<workgroup> kt: array<f32, {bk * da}>;
var<workgroup> vt: array<f32, {bk * dva}>;

@compute @workgroup_size({_BQ})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let heads = P[0];
    let grp = P[1];
    let sq = P[2];
    let skv = P[3];
    let scale = bitcast<f32>(P[4]);
    let bh = wid.y + P[5];
    let bi = bh / heads;
    let hi = bh % heads;
    let kvh = bi * (heads / grp) + hi / grp;
    let i = wid.x * BQ + li;
    let live = i < sq;
    let iq = select(0u, i, live);
    {kend}
    var qr: array<f32, {da}>;
    for (var c = 0u; c < D; c = c + 1u) {{ qr[c] = ld_q((bh * sq + iq) * D + c) * scale; }}
    var acc: array<f32, {dva}>;
    var sc: array<f32, {bk}>;
    var run_max = ak_ninf();
    var run_sum = 0.0;
    var bad = false;
    {load}
    let mrow = {"bi * P[6] + hi * P[7] + iq * P[8]" if mask is not None else "0u"};
    let kb = kvh * skv * D;
    let vb = kvh * skv * DV;
    for (var j0 = jb; j0 < kend; j0 = j0 + BK) {{
        let tn = min(BK, kend - j0);
        workgroupBarrier();
        for (var e = li; e < tn * D; e = e + BQ) {{ kt[e] = ld_k(kb + j0 * D + e); }}
        for (var e = li; e < tn * DV; e = e + BQ) {{ vt[e] = ld_v(vb + j0 * DV + e); }}
        workgroupBarrier();
        if (live) {{
            {nrow}
            var tmax = ak_ninf();
            for (var jj = 0u; jj < n; jj = jj + 1u) {{
                let j = j0 + jj;
                var s = 0.0;
                for (var c = 0u; c < D; c = c + 1u) {{ s = s + qr[c] * kt[jj * D + c]; }}
                {mask_code}
                if (ak_isnan(s) || bitcast<u32>(s) == 0x7f800000u) {{ bad = true; }}
                sc[jj] = s;
                if (!ak_isninf(s) && (ak_isninf(tmax) || s > tmax)) {{ tmax = s; }}
            }}
            if (n > 0u && !ak_isninf(tmax) && !bad) {{
                var new_max = tmax;
                var corr = 0.0;
                if (!ak_isninf(run_max)) {{
                    new_max = max(run_max, tmax);
                    corr = ak_exp(run_max - new_max);
                }}
                run_sum = run_sum * corr;
                for (var c = 0u; c < DV; c = c + 1u) {{ acc[c] = acc[c] * corr; }}
                for (var jj = 0u; jj < n; jj = jj + 1u) {{
                    let s = sc[jj];
                    if (ak_isninf(s)) {{ continue; }}
                    let p = ak_exp(s - new_max);
                    run_sum = run_sum + p;
                    for (var c = 0u; c < DV; c = c + 1u) {{ acc[c] = acc[c] + p * vt[jj * DV + c]; }}
                }}
                run_max = new_max;
            }}
        }}
    }}
    if (!live) {{ return; }}
    {keep}
    var inv = 0.0;
    if (run_sum > 0.0) {{ inv = 1.0 / run_sum; }}
    let o = (bh * sq + i) * DV;
    for (var c = 0u; c < DV; c = c + 1u) {{
        t_out[o + c] = select(bitcast<u32>(acc[c] * inv), 0x7fc00000u, bad);
    }}
}}
"""
    )


def _integral(x: float) -> bool:
    return float(x).is_integer() and -(2**31) <= x < 2**31


class LinalgKernels(WebGPUComponent):
    #: Whether the large GEMM tile runs: None until verified on this device (the medium tile
    #: runs meanwhile), then the verdict of :meth:`verify_large_tiles`.
    large_tiles: bool | None = None
    #: Why the large tile is not used, once verified (None: it is).
    large_tiles_reason: str | None = None

    # -- the tiled GEMM ---------------------------------------------------------------------------
    def _large_tiles_fit(self) -> bool:
        """What the device reports: enough workgroup memory and invocations for the tile."""
        limits = self.gpu.limits
        return (
            int(limits.get("max-compute-workgroup-storage-size", 16384)) >= 16384
            and int(limits.get("max-compute-invocations-per-workgroup", 256)) >= 256
        )

    async def verify_large_tiles(self) -> None:
        """Decide the large tile from a run, not from the report: a 128x64x40 product through
        it, compared with NumPy. A build error or a wrong result keeps the medium tile (a
        report is a claim: a wider tile of this kernel has given wrong results on llvmpipe)."""
        if not self._large_tiles_fit():
            self.large_tiles, self.large_tiles_reason = False, "the reported limits are too low"
            return
        rng = np.random.default_rng(0)
        a_h = rng.standard_normal((128, 40)).astype(np.float32)
        b_h = rng.standard_normal((40, 64)).astype(np.float32)
        f = self.backend.tensor_factory
        self.large_tiles = True
        try:
            got = await self.backend.tensor_ops.matmul(f.from_host(a_h), f.from_host(b_h)).to_host()
        except AccelError as exc:
            reason: str | None = f"{type(exc).__name__}: {exc}"
        else:
            want = a_h.astype(np.float64) @ b_h.astype(np.float64)
            err = float(np.max(np.abs(got - want)))
            reason = None if err <= 1e-3 else f"wrong results (max error {err:.3g})"
        self.large_tiles, self.large_tiles_reason = reason is None, reason
        if reason is not None:
            log.warning("accelkit-webgpu: the large GEMM tile is not used: %s", reason)

    def _gemm_run(
        self,
        a: Tensor,
        b: Tensor,
        c: Tensor | None,
        out: Tensor,
        mnk: tuple[int, int, int],
        strides: tuple[int, int, int, int, int, int],
        batch: list[tuple[int, int, int, int]],
        alpha: float,
        beta: float,
        conv: list[int] | None = None,
    ) -> None:
        """``out[batch, i, j] = alpha * sum_k A(i, k) B(k, j) + beta * C(i, j)`` with ``out``
        contiguous; ``strides`` = (a row, a k, b k, b col, c row, c col) in elements; ``batch``:
        per batch dim (size, a stride, b stride, c stride)."""
        # Checked on the real K. Measured with every tile: through OpenGL, llvmpipe ran K =
        # 70,000 right and 200,000 not; through Vulkan (lavapipe: SPIR-V rather than GLSL, so
        # other loops) the row tile stopped at K = 41,938 and the medium one at 47,662, silently.
        # 32,768 leaves a margin under both.
        self.check_loop("a matrix product", "an inner dimension of", mnk[2], GEMM_MAX_K_SOFTWARE)
        if out.size == 0:
            return
        m, n, k = mnk
        ct = compute_type(out.dtype)
        wide = out.dtype if out.dtype.itemsize >= 4 else _WIDE[ct]
        target = out if out.dtype.itemsize >= 4 else self.empty(out.shape, wide)
        int_scale = ct != "f32" and _integral(alpha) and _integral(beta)
        if int_scale:
            aw, bw = int(alpha) & 0xFFFFFFFF, int(beta) & 0xFFFFFFFF
        else:
            aw, bw = f32_bits(alpha), f32_bits(beta)
        if out.dtype.itemsize == 8:
            wx, wy, rm, rn = 16, 16, (4 if m > 16 else 1), 4
            tm, tn = 16 * rm, 16 * rn
        else:
            if m <= 16:
                wx, wy, rm, rn = _TILE_ROWS
            elif m >= 128 and n >= 64 and self.large_tiles:
                wx, wy, rm, rn = _TILE_LARGE
            else:
                wx, wy, rm, rn = _TILE_MEDIUM
            tm, tn = wy * rm, wx * rn
        spec = _GemmSpec(
            a=a.dtype,
            b=b.dtype,
            c=None if c is None else c.dtype,
            out=wide,
            rm=rm,
            rn=4,
            a_kfast=strides[1] == 1,
            b_nfast=strides[3] == 1 or conv is not None,
            int_scale=int_scale,
            conv=conv is not None,
            wx=wx,
            wy=wy,
        )
        src = _gemm_source(spec)
        geo = list(conv or [])
        geo += [0] * (11 - len(geo))
        nb = prod(tuple(d for d, *_ in batch))
        params = [m, n, k, *strides, aw, bw, 0, len(batch), *geo, 0, 0]
        params += [0] * (_BATCH0 - len(params))
        for entry in batch:
            params.extend(entry)
        tiles_m, tiles_n = -(-m // tm), -(-n // tn)
        gpu = self.gpu
        inputs = [a, b] if c is None else [a, b, c]
        ins = [(block(t), nbytes(t)) for t in inputs]
        outs = [(block(target), nbytes(target))]
        launches: list[tuple[list[int], tuple[int, int, int]]] = []
        for z0 in range(0, nb, MAX_GROUPS):
            for y0 in range(0, tiles_m, MAX_GROUPS):
                for x0 in range(0, tiles_n, MAX_GROUPS):
                    p = list(params)
                    p[11], p[24], p[25] = z0, y0, x0
                    g = (
                        min(MAX_GROUPS, tiles_n - x0),
                        min(MAX_GROUPS, tiles_m - y0),
                        min(MAX_GROUPS, nb - z0),
                    )
                    launches.append((p, g))

        def run() -> None:
            for p, g in launches:
                gpu.dispatch(src, p, ins, outs, g)

        self.launch(run, inputs, (target,))
        if target is not out:
            self.run_map(cast_source(wide, out.dtype), [out.size], [target], out)

    def gemm(
        self,
        a: Tensor,
        b: Tensor,
        c: Tensor | None,
        out: Tensor,
        trans_a: bool,
        trans_b: bool,
        alpha: float,
        beta: float,
    ) -> None:
        m, n = out.shape[-2], out.shape[-1]
        k = a.shape[-2] if trans_a else a.shape[-1]
        ra, rb = a.shape[-1], b.shape[-1]
        a_mk = (1, ra) if trans_a else (ra, 1)
        b_kn = (1, rb) if trans_b else (rb, 1)
        cs = broadcast_strides(c.shape, out.shape) if c is not None else [0] * out.ndim
        batch: list[tuple[int, int, int, int]] = []
        if out.ndim == 3:
            batch.append((out.shape[0], a.shape[-2] * ra, b.shape[-2] * rb, cs[0]))
        strides = (*a_mk, *b_kn, cs[-2], cs[-1])
        self._gemm_run(a, b, c, out, (m, n, k), strides, batch, alpha, beta)

    def matmul(self, a: Tensor, b: Tensor, out: Tensor) -> None:
        a2 = a.shape if a.ndim > 1 else (1, a.shape[0])
        b2 = b.shape if b.ndim > 1 else (b.shape[0], 1)
        m, k, n = a2[-2], a2[-1], b2[-1]
        batch: list[tuple[int, int, int, int]] = []
        if len(b2) == 2 and len(a2) > 2:
            m = prod(a2[:-1])  # [..., m, k] @ [k, n] is one [M, k] @ [k, n] product
        else:
            shape = broadcast_shapes(a2[:-2], b2[:-2])
            sa = broadcast_strides(a2[:-2], shape)
            sb = broadcast_strides(b2[:-2], shape)
            for dim, x, y in zip(shape, sa, sb, strict=True):
                if dim != 1:
                    batch.append((dim, x * m * k, y * k * n, 0))
        self._gemm_run(a, b, None, out, (m, n, k), (k, 1, n, 1, 0, 0), batch, 1.0, 0.0)

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> None:
        n, k = weight.shape
        m = prod(x.shape[:-1])
        beta = 1.0 if bias is not None else 0.0
        self._gemm_run(x, weight, bias, out, (m, n, k), (k, 1, 1, k, 0, 1), [], 1.0, beta)

    # -- convolution ------------------------------------------------------------------------------
    def conv2d(
        self,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        out: Tensor,
        stride: tuple[int, int],
        padding: tuple[int, int],
        dilation: tuple[int, int],
        groups: int,
    ) -> None:
        if out.size == 0:
            return
        nimg, c, h, w = x.shape
        o, cg, kh, kw = weight.shape
        oh, ow = out.shape[2], out.shape[3]
        og = o // groups
        if og < 4:
            # measured: C*KH*KW = 18,432 ran right on llvmpipe, 73,728 did not
            self.check_loop("conv2d", "C/groups*KH*KW =", cg * kh * kw, 32768)
            binds = [Binding("x", x.dtype), Binding("w", weight.dtype)]
            inputs = [x, weight]
            bias_code = ""
            if bias is not None:
                binds.append(Binding("bias", bias.dtype))
                inputs.append(bias)
                bias_code = "sum = sum + ld_bias(o);"
            src = map_kernel(binds, out.dtype, _CONV_DIRECT.format(bias=bias_code))
            params = [out.size, c, h, w, o, cg, kh, kw, oh, ow, *stride, *padding, *dilation, og]
            self.run_map(src, params, inputs, out)
            return
        kk = cg * kh * kw
        geo = [h, w, kh, kw, ow, *stride, *padding, *dilation]
        batch = [(nimg, 0, c * h * w, 0), (groups, og * kk, cg * h * w, og)]
        strides = (kk, 1, 0, 0, 1, 0)
        beta = 1.0 if bias is not None else 0.0
        self._gemm_run(weight, x, bias, out, (og, oh * ow, kk), strides, batch, 1.0, beta, conv=geo)

    # -- attention --------------------------------------------------------------------------------
    def attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        out: Tensor,
        scale: float,
        causal: bool,
    ) -> None:
        if out.size == 0:
            return
        b, h, sq, d = q.shape
        hk, skv, dv = k.shape[1], k.shape[2], v.shape[3]
        # A software adapter's invocations may walk ATTENTION_KEY_TRIPS // (D + DV) keys per
        # dispatch; more keys are split over dispatches (a real GPU takes them in one).
        per = skv
        if self.loops_capped:
            per = max(1, ATTENTION_KEY_TRIPS // max(1, d + dv))
        split = per < skv
        gpu = self.gpu
        local = int(gpu.limits.get("max-compute-workgroup-storage-size", 16384))
        bk = min(32, (local // 2) // ((max(d, 1) + max(dv, 1)) * 4))
        if bk < 1:
            raise UnsupportedOperationError(
                f"webgpu: attention with head dims {d} and {dv} does not fit one key tile in the"
                f" device's {local} bytes of workgroup memory"
            )
        src = _attention_source(
            q.dtype, k.dtype, v.dtype, None if mask is None else mask.dtype, d, dv, bk, causal,
            split,
        )  # fmt: skip
        target = out if out.dtype is DType.F32 else self.empty(out.shape, DType.F32)
        ms = broadcast_strides(mask.shape, (b, h, sq, skv)) if mask is not None else [0, 0, 0, 0]
        params = [h, h // hk, sq, skv, f32_bits(scale), 0, *ms]
        inputs = [q, k, v] if mask is None else [q, k, v, mask]
        ins = [(block(t), nbytes(t)) for t in inputs]
        outs = [(block(target), nbytes(target))]
        keep: list[Tensor] = []
        ranges = [(0, skv)]
        if split:  # the online softmax's state between dispatches: DV + 3 words a query row
            state = self.empty((b * h * sq, dv + 3), DType.F32)
            keep.append(state)
            outs.insert(0, (block(state), nbytes(state)))
            ranges = [(j, min(skv, j + per)) for j in range(0, skv, per)]
        qblocks = -(-sq // _BQ)
        launches: list[tuple[list[int], tuple[int, int]]] = []
        for y0 in range(0, b * h, MAX_GROUPS):
            for j0, j1 in ranges:
                p = list(params)
                p[5] = y0
                if split:
                    p += [j0, j1, int(j0 == 0) | int(j1 == skv) << 1]
                launches.append((p, (qblocks, min(MAX_GROUPS, b * h - y0))))

        def run() -> None:
            _ = keep  # the scratch state stays alive (out of the pool) until this has run
            for p, g in launches:
                gpu.dispatch(src, p, ins, outs, g)

        self.launch(run, inputs, (target,))
        if target is not out:
            self.run_map(cast_source(DType.F32, out.dtype), [out.size], [target], out)
