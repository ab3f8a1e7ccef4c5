"""OpenCL C sources of the fused KernelOps that TensorOps has no kernel for.

rms_norm, layer_norm, attention, linear, gelu and argmax reuse the TensorOps kernels
(``opencl_reduction``, ``opencl_attention``, ``opencl_linalg``, ``opencl_elementwise``), and
silu_mul is one generated elementwise kernel (:func:`silu_mul_expr`); the kernels here are the
rest. Arithmetic runs in the dtype's load type (float for F16, double for F64) and is rounded
once when stored. Kernels that can meet bad values (a block id, a context length, a token id)
report them through an error buffer of three longs: a flag set atomically (one report wins), a
kind and the value, read back by the command that enqueued them.
"""

from __future__ import annotations

from accelkit.dtype import DType
from accelkit.quant import QuantFormat
from accelkit.sdk import GUMBEL_UNIFORM_MAX
from accelkit_opencl.opencl_elementwise import unary_expr
from accelkit_opencl.opencl_reduction import _tree
from accelkit_opencl.opencl_types import STORE_TYPES, load_type, pragmas

__all__ = [
    "BAD_BLOCK", "BAD_LENGTH", "BAD_TOKEN", "paged_attention_source", "quantized_linear_source",
    "rms_norm_residual_source", "rotary_source", "sample_token_source", "silu_mul_expr",
]  # fmt: skip

#: Kinds of value errors in the error buffer (``err[1]``).
BAD_LENGTH, BAD_BLOCK, BAD_TOKEN = 0, 1, 2

_REPORT = """
void ak_report(__global long* err, long kind, long v) {
    if (atomic_cmpxchg((volatile __global int*)err, 0, 1) == 0) { err[1] = kind; err[2] = v; }
}
"""


def _head(dtype: DType, *more: str) -> str:
    t, s = load_type(dtype), STORE_TYPES[dtype]
    return pragmas([t, s, *more]) + f"#define T {t}\n#define S {s}\n"


def silu_mul_expr(compute: DType) -> str:
    """The elementwise expression ``silu(a) * b`` (TensorOps' silu, then the product)."""
    return f"({unary_expr('silu', compute)} * b)"


def rms_norm_residual_source(dtype: DType, has_weight: bool, wg: int) -> str:
    """Kernel ``rms_residual(normed, summed, x, residual, [weight], d, eps)``: one work-group of
    ``WG`` per row. ``summed`` is rounded to the dtype and ``normed`` computed from it as stored,
    with the same per-item strides and tree as the rms_norm kernel (so both routes agree)."""
    params = ["__global S* normed", "__global S* summed", "__global const S* x"]
    params += ["__global const S* res"]
    if has_weight:
        params.append("__global const S* weight")
    params += ["long d", "T eps"]
    value = "((T)srow[i] - mean) * inv"
    if has_weight:
        value = f"({value}) * (T)weight[i]"
    return (
        _head(dtype)
        + f"#define WG {wg}\n"
        + "__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))"
        + f" void rms_residual({', '.join(params)}) {{\n"
        + """
    long g = get_group_id(0); int lid = get_local_id(0);
    __global const S* xrow = x + g * d;
    __global const S* rrow = res + g * d;
    __global S* srow = summed + g * d;
    __local T scratch[WG];
    T acc = 0;
    for (long i = lid; i < d; i += WG) {
        S s = (S)((T)xrow[i] + (T)rrow[i]);
        srow[i] = s;
        T c = (T)s; acc += c * c;
    }
"""
        + _tree("acc", "u + w", "sq")
        + f"""
    T mean = 0;
    T inv = rsqrt(sq / (T)d + eps);
    for (long i = lid; i < d; i += WG) normed[g * d + i] = (S)({value});
}}
"""
    )


def rotary_source(dtype: DType, positions: DType | None, per_batch: bool) -> str:
    """Kernel ``rotary(out, x, inv_freq, [positions], heads, seq, hd, offset)``: one work-item
    per (row, pair i); ``inv_freq`` [hd] (half the head dim) in the compute type. Token ``s`` of batch ``b`` is at
    ``positions[b * seq + s]`` (``per_batch``), ``positions[s]``, or ``offset + s``."""
    params = ["__global S* out", "__global const S* x", "__global const T* inv_freq"]
    if positions is not None:
        params.append(f"__global const {STORE_TYPES[positions]}* positions")
    params += ["long heads", "long seq", "long hd", "long offset"]
    if positions is None:
        pos = "(T)(offset + s)"
    elif per_batch:
        pos = "(T)positions[(row / (heads * seq)) * seq + s]"
    else:
        pos = "(T)positions[s]"
    return (
        _head(dtype)
        + f"__kernel void rotary({', '.join(params)}) {{\n"
        + f"""
    long gid = get_global_id(0);
    long i = gid % hd, row = gid / hd, s = row % seq;
    T angle = {pos} * inv_freq[i];
    T c = cos(angle), sn = sin(angle);
    long base = row * 2 * hd;
    T x1 = (T)x[base + i], x2 = (T)x[base + hd + i];
    out[base + i] = (S)(x1 * c - x2 * sn);
    out[base + hd + i] = (S)(x2 * c + x1 * sn);
}}
"""
    )


def paged_attention_source(
    dtype: DType, table: DType, lens: DType, head_dim: int, block_size: int
) -> str:
    """Kernel ``paged_attention(out, q, k_cache, v_cache, block_table, context_lens, err,
    heads, group, kv_heads, num_blocks, max_blocks, scale)``: one work-item per (sequence,
    query head) walks the sequence's tokens through the block table with an online softmax
    (running maximum and sum, the accumulator rescaled as the maximum grows), so no context is
    gathered. A length outside ``0..max_blocks * block_size`` or a block id outside the cache
    is reported (:data:`BAD_LENGTH`, :data:`BAD_BLOCK`) and the row written as zeros."""
    params = [
        "__global S* out", "__global const S* q", "__global const S* kc",
        "__global const S* vc", f"__global const {STORE_TYPES[table]}* table",
        f"__global const {STORE_TYPES[lens]}* lens", "__global long* err", "long heads",
        "long group", "long kv_heads", "long num_blocks", "long max_blocks", "T scale",
    ]  # fmt: skip
    d = max(head_dim, 1)
    return (
        _head(dtype)
        + f"#define D {head_dim}\n#define DA {d}\n#define BS {block_size}\n"
        + _REPORT
        + f"__kernel void paged_attention({', '.join(params)}) {{\n"
        + f"""
    long gid = get_global_id(0);
    long b = gid / heads, kvh = (gid % heads) / group;
    long n = (long)lens[b];
    __global S* orow = out + gid * D;
    T acc[DA], qr[DA];
    for (int c = 0; c < D; ++c) {{ acc[c] = 0; qr[c] = (T)q[gid * D + c]; }}
    T run_max = -INFINITY, run_sum = 0;
    int nan_seen = 0;  /* fmax skips NaN: a NaN score must still make the row NaN */
    if (n < 0 || n > max_blocks * BS) {{
        ak_report(err, {BAD_LENGTH}, n);
        n = 0;
    }}
    __global const {STORE_TYPES[table]}* blocks = table + b * max_blocks;
    for (long t = 0; t < n; ++t) {{
        long blk = (long)blocks[t / BS];
        if (blk < 0 || blk >= num_blocks) {{
            ak_report(err, {BAD_BLOCK}, blk);
            run_sum = 0;
            break;
        }}
        long base = ((blk * BS + t % BS) * kv_heads + kvh) * D;
        T sc = 0;
        for (int c = 0; c < D; ++c) sc += qr[c] * (T)kc[base + c];
        sc *= scale;
        nan_seen |= isnan(sc);
        T new_max = fmax(run_max, sc);
        T corr = exp(run_max - new_max);
        T p = exp(sc - new_max);
        run_sum = run_sum * corr + p;
        for (int c = 0; c < D; ++c) acc[c] = acc[c] * corr + p * (T)vc[base + c];
        run_max = new_max;
    }}
    T inv = nan_seen ? (T)NAN : (run_sum > 0 ? (T)1 / run_sum : (T)0);
    for (int c = 0; c < D; ++c) orow[c] = (S)(acc[c] * inv);
}}
"""
    )


def quantized_linear_source(dtype: DType, fmt: QuantFormat, scales: DType, has_bias: bool) -> str:
    """Kernel ``qlinear(out, x, qweight, scales, [bias], n_out, n_in)``: one work-item per output
    element (global ``(n_out, rows)``), expanding its weight row block by block in registers
    (``scale * q`` in the compute type, q4_0's nibbles as in :mod:`accelkit.quant`). F16 scales
    are read with ``vload_half``, which needs no ``cl_khr_fp16``."""
    q_t = "char" if fmt == "q8_0" else "uchar"
    params = ["__global S* out", "__global const S* x", f"__global const {q_t}* qw"]
    params.append(f"__global const {'half' if scales is DType.F16 else 'float'}* scales")
    if has_bias:
        params.append("__global const S* bias")
    params += ["long n_out", "long n_in"]
    load_scale = (
        "(T)vload_half(o * nb + blk, scales)" if scales is DType.F16 else "(T)scales[o * nb + blk]"
    )
    if fmt == "q8_0":
        block = """
        __global const char* qb = qw + o * n_in + blk * 32;
        for (int j = 0; j < 32; ++j) acc += (T)xb[j] * (sc * (T)qb[j]);"""
    else:
        block = """
        __global const uchar* qb = qw + o * (n_in / 2) + blk * 16;
        for (int j = 0; j < 16; ++j) {
            int byte = qb[j];
            acc += (T)xb[j] * (sc * (T)((byte & 15) - 8));
            acc += (T)xb[j + 16] * (sc * (T)((byte >> 4) - 8));
        }"""
    bias = "acc += (T)bias[o];" if has_bias else ""
    return (
        _head(dtype)
        + f"__kernel void qlinear({', '.join(params)}) {{\n"
        + f"""
    long o = get_global_id(0), m = get_global_id(1);
    long nb = n_in / 32;
    T acc = 0;
    for (long blk = 0; blk < nb; ++blk) {{
        T sc = {load_scale};
        __global const S* xb = x + m * n_in + blk * 32;{block}
    }}
    {bias}
    out[m * n_out + o] = (S)acc;
}}
"""
    )


def _count_tree(value: str, result: str) -> str:
    """Sum a per-item long over the work-group (the tree of ``_tree``, on ``counts``)."""
    return f"""
    counts[lid] = {value};
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {{
        if (lid < s) counts[lid] += counts[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    long {result} = counts[0];
    barrier(CLK_LOCAL_MEM_FENCE);
"""


#: reduce_source's argmax rule: (v, vi) replaces (acc, ai) when strictly larger, or as large with
#: a lower index; NaN counts as the largest.
_ARGMAX = (
    "if ((!(acc != acc) && ((v != v) || v > acc)) || ((v == acc || ((v != v) && acc != acc))"
    " && vi < ai)) { acc = v; ai = vi; }"
)


def _argmax(value: str) -> str:
    """Lines leaving the first index of the largest ``value`` (of ``i``) in ``long best``."""
    return f"""
    {{
        T acc = -INFINITY; long ai = vocab;
        for (long i = lid; i < vocab; i += WG) {{ T v = {value}; long vi = i; {_ARGMAX} }}
        scratch[lid] = acc; counts[lid] = ai;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int s = WG / 2; s > 0; s >>= 1) {{
            if (lid < s) {{
                T v = scratch[lid + s]; long vi = counts[lid + s];
                acc = scratch[lid]; ai = counts[lid];
                {_ARGMAX}
                scratch[lid] = acc; counts[lid] = ai;
            }}
            barrier(CLK_LOCAL_MEM_FENCE);
        }}
        best = counts[0];
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
"""


def _keep_top(enough: str, steps: int) -> str:
    """composite._keep_top on the row ``zr``: bisect for the largest threshold ``lo`` where
    ``enough`` (of ``mid``, the selection being ``zc >= mid``) holds, then drop ``zc < lo``.
    Every step is the composition's arithmetic in the same order, so the routes agree."""
    zc = "((zr[i] > floor_ || zr[i] != zr[i]) ? zr[i] : floor_)"
    return f"""
    {{
        T m = -INFINITY;
        for (long i = lid; i < vocab; i += WG) {{ T v = zr[i]; m = (m > v || m != m) ? m : v; }}
        {_tree("m", "((u > w || u != u) ? u : w)", "zmax")}
        T floor_ = zmax - (T)88.0;
        T lo_ = INFINITY;
        for (long i = lid; i < vocab; i += WG) {{ T v = {zc}; lo_ = (lo_ < v || lo_ != lo_) ? lo_ : v; }}
        {_tree("lo_", "((u < w || u != u) ? u : w)", "lo0")}
        T lo = lo0;
        T hi = zmax + (fabs(zmax) + (T)1.0);
        for (int step = 0; step < {steps}; ++step) {{
            T mid = (lo + hi) * (T)0.5;
            {enough}
            if (ok) lo = mid; else hi = mid;
        }}
        // a NaN or +inf is never masked (the special-values rule: the argmax picks it)
        for (long i = lid; i < vocab; i += WG) if (!({zc} >= lo) && zr[i] < INFINITY) zr[i] = -INFINITY;
        barrier(CLK_GLOBAL_MEM_FENCE);
    }}
"""


def sample_token_source(
    dtype: DType,
    previous: DType | None,
    greedy: bool,
    top_k: bool,
    top_p: bool,
    wg: int,
) -> str:
    """Kernel ``sample(out, logits, z, p, [previous, n_prev, err], [noise], vocab, penalty,
    temperature, top_k, top_p)``: one work-group of ``WG`` per row, the steps of
    ``SamplingOps.sample_token`` in order on the row's scratch copy ``z`` (compute type; ``p``
    holds its softmax for top-p): the repetition penalty for the ids in ``previous`` (an id past
    the vocabulary is reported as :data:`BAD_TOKEN`), then the argmax (``greedy``) or division
    by the temperature, top-k and top-p by the composition's bisection, and the Gumbel-max over
    ``noise`` (the backend's ``uniform`` for the seed, F32). Reductions use the TensorOps
    kernels' per-item strides and trees, so the fused and composed routes pick the same token.
    """
    params = ["__global long* out", "__global const S* logits", "__global T* z", "__global T* p"]
    if previous is not None:
        params += [
            f"__global const {STORE_TYPES[previous]}* prev", "long n_prev", "__global long* err"
        ]  # fmt: skip
    if not greedy:
        params.append("__global const float* noise")
    params += ["long vocab", "T penalty", "T temperature", "long top_k", "T top_p"]
    steps = 64 if dtype is DType.F64 else 40
    body = """
    long row = get_group_id(0); int lid = get_local_id(0);
    __global const S* lrow = logits + row * vocab;
    __global T* zr = z + row * vocab;
    __global T* pr = p + row * vocab;
    __local T scratch[WG];
    __local long counts[WG];
    long best;
    for (long i = lid; i < vocab; i += WG) zr[i] = (T)lrow[i];
"""
    if previous is not None:
        body += f"""
    barrier(CLK_GLOBAL_MEM_FENCE);
    for (long j = lid; j < n_prev; j += WG) {{
        long id = (long)prev[row * n_prev + j];
        if (id < 0) continue;
        if (id >= vocab) {{ ak_report(err, {BAD_TOKEN}, id); continue; }}
        T v = (T)lrow[id];
        zr[id] = v > 0 ? v / penalty : v * penalty;
    }}
    barrier(CLK_GLOBAL_MEM_FENCE);
"""
    if greedy:
        body += _argmax("zr[i]")
    else:
        body += "    for (long i = lid; i < vocab; i += WG) zr[i] = zr[i] / temperature;\n"
        body += "    barrier(CLK_GLOBAL_MEM_FENCE);\n"
        if top_k:
            count = _count_tree("c_", "count")
            enough = (
                "long c_ = 0;\n"
                "            for (long i = lid; i < vocab; i += WG) c_ += "
                "((zr[i] > floor_ || zr[i] != zr[i]) ? zr[i] : floor_) >= mid;\n"
                f"            {count}\n"
                "            bool ok = count >= top_k;"
            )
            body += _keep_top(enough, steps)
        if top_p:
            # softmax_source's arithmetic, stored in p
            body += (
                "    {\n        T m = -INFINITY;\n"
                "        for (long i = lid; i < vocab; i += WG) { T v = zr[i];"
                " m = (v > m || v != v) ? v : m; }\n"
                + _tree("m", "((u > w || u != u) ? u : w)", "mx")
                + "        T sum = 0;\n"
                "        for (long i = lid; i < vocab; i += WG) sum += exp(zr[i] - mx);\n"
                + _tree("sum", "u + w", "total")
                + "        for (long i = lid; i < vocab; i += WG) pr[i] = exp(zr[i] - mx) / total;\n"
                "        barrier(CLK_GLOBAL_MEM_FENCE);\n    }\n"
            )
            enough = (
                "T a_ = 0;\n"
                "            for (long i = lid; i < vocab; i += WG) a_ = a_ + "
                "((((zr[i] > floor_ || zr[i] != zr[i]) ? zr[i] : floor_) >= mid) ? pr[i] : (T)0);\n"
                f"            {_tree('a_', 'u + w', 'mass')}\n"
                "            bool ok = mass >= top_p;"
            )
            body += _keep_top(enough, steps)
        gmax = f"{GUMBEL_UNIFORM_MAX!r}f"
        body += "    __global const float* urow = noise + row * vocab;\n"
        # minimum(u, GUMBEL_UNIFORM_MAX) in f32, then the compute type, then -log(-log(u))
        u = f"((urow[i] < {gmax} || urow[i] != urow[i]) ? urow[i] : {gmax})"
        body += _argmax(f"zr[i] + (-log(-log((T){u})))")
    body += "    if (lid == 0) out[row] = best;\n}\n"
    return (
        _head(dtype)
        + f"#define WG {wg}\n"
        + (_REPORT if previous is not None else "")
        + "__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))"
        + f" void sample({', '.join(params)}) {{\n"
        + body
    )
