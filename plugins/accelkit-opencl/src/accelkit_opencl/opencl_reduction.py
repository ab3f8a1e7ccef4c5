"""Reductions as work-group trees: reduce, softmax, layer_norm and rms_norm.

One work-group computes one output element (or one row): its work-items stride over the reduced
elements, then combine their partial results in local memory, halving the active items each
step. ``WG`` (the work-group size, a power of two) is a compile-time constant.
"""

from __future__ import annotations

import functools

import numpy as np

from accelkit.dtype import DType
from accelkit_opencl.opencl_types import STORE_TYPES, category, load_type, pragmas

__all__ = ["norm_source", "reduce_source", "softmax_source"]


def _identity(op: str, acc: DType) -> str:
    t = load_type(acc)
    if op in ("sum", "mean"):
        return f"({t})0"
    if op == "prod":
        return f"({t})1"
    if acc.is_floating:
        return f"({t})(-INFINITY)" if op in ("max", "argmax") else f"({t})INFINITY"
    info = np.iinfo(acc.to_numpy()) if acc is not DType.BOOL else None
    lo, hi = (0, 1) if info is None else (int(info.min), int(info.max))
    v = lo if op in ("max", "argmax") else hi
    if v == -(2**63):
        return "LONG_MIN"
    return f"({t}){v}{'UL' if v >= 2**63 else ('L' if abs(v) >= 2**31 else '')}"


def _index_code(prefix: str, nd: int, index: str, base: str) -> list[str]:
    """Lines adding the strided offset of flat ``index`` over dims ``{prefix}d*`` to ``base``."""
    lines = [f"    {{ long r_ = {index};"]
    for j in range(nd - 1, -1, -1):
        c = "r_" if j == 0 else f"r_ % {prefix}d{j}"
        lines.append(f"      {base} += ({c}) * {prefix}s{j};")
        if j:
            lines.append(f"      r_ /= {prefix}d{j};")
    lines.append("    }")
    return lines


# Cached: pure functions of their arguments, called at every launch (as opencl_elementwise's
# builders are).
@functools.lru_cache(maxsize=1024)
def reduce_source(
    op: str, x: DType, out: DType, nd_keep: int, nd_red: int, wg: int, fp64: bool = False
) -> str:
    """Kernel ``reduce(out, x, n_red, kept dims, kept strides, reduced dims, reduced strides)``:
    one work-group per output element. argmax/argmin give the first index of the extreme (NaN
    counts as the extreme, as in NumPy). ``fp64``: the device runs double kernels (the mean of
    64-bit integers then sums in double, as NumPy's does, instead of a 64-bit integer that
    could overflow)."""
    arg = op in ("argmax", "argmin")
    acc = x if arg or op in ("max", "min") else out
    int_mean = op == "mean" and not x.is_floating
    if int_mean:
        # An exact 64-bit integer sum, divided once (an F32 sum loses the low digits); for
        # 64-bit inputs, whose sum may overflow that, a double sum where the device has one.
        wide = x in (DType.I64, DType.U64)
        if wide and fp64:
            acc, int_mean = DType.F64, False
        else:
            acc = DType.I64 if x.is_signed else DType.U64
    t = load_type(acc)
    x_t, out_t = STORE_TYPES[x], STORE_TYPES[out]
    params = [f"__global {out_t}* out", f"__global const {x_t}* x", "long n_red"]
    params += [f"long kd{j}" for j in range(nd_keep)] + [f"long ks{j}" for j in range(nd_keep)]
    params += [f"long rd{j}" for j in range(nd_red)] + [f"long rs{j}" for j in range(nd_red)]
    is_f = category(acc) == "f"
    if op in ("sum", "mean"):
        combine = "acc = acc + v;"
    elif op == "prod":
        combine = "acc = acc * v;"
    elif op == "max":
        combine = "acc = (acc > v || isnan(acc)) ? acc : v;" if is_f else "acc = max(acc, v);"
    elif op == "min":
        combine = "acc = (acc < v || isnan(acc)) ? acc : v;" if is_f else "acc = min(acc, v);"
    else:
        cmp = ">" if op == "argmax" else "<"
        # (v, vi) replaces (acc, ai) if it is strictly better, or equally good with a lower index
        if is_f:  # a NaN wins (NumPy's rule), the first one among NaNs
            combine = (
                f"if ((!isnan(acc) && (isnan(v) || v {cmp} acc)) || ((v == acc || (isnan(v) &&"
                " isnan(acc))) && vi < ai)) { acc = v; ai = vi; }"
            )
        else:
            combine = f"if (v {cmp} acc || (v == acc && vi < ai)) {{ acc = v; ai = vi; }}"
    lines = [
        f"#define WG {wg}",
        f"__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void reduce({', '.join(params)}) {{",
        "    long g = get_group_id(0);",
        "    int lid = get_local_id(0);",
        "    long base = 0;",
        *_index_code("k", nd_keep, "g", "base"),
        f"    {t} acc = {_identity(op, acc)};",
        "    long ai = n_red;",
        "    for (long i = lid; i < n_red; i += WG) {",
        "        long off = base;",
        *["    " + line for line in _index_code("r", nd_red, "i", "off")],
        f"        {t} v = ({t})x[off]; long vi = i;",
        f"        {combine}",
        "    }",
        f"    __local {t} lacc[WG];",
        "    __local long lidx[WG];",
        "    lacc[lid] = acc; lidx[lid] = ai;",
        "    barrier(CLK_LOCAL_MEM_FENCE);",
        "    for (int s = WG / 2; s > 0; s >>= 1) {",
        "        if (lid < s) {",
        f"            {t} v = lacc[lid + s]; long vi = lidx[lid + s];",
        "            acc = lacc[lid]; ai = lidx[lid];",
        f"            {combine}",
        "            lacc[lid] = acc; lidx[lid] = ai;",
        "        }",
        "        barrier(CLK_LOCAL_MEM_FENCE);",
        "    }",
        "    if (lid == 0) {",
    ]
    if arg:
        lines.append("        out[g] = lidx[0];")
    elif int_mean:
        lines.append(f"        out[g] = ({out_t})((float)lacc[0] / (float)n_red);")
    elif op == "mean":
        lines.append(f"        out[g] = ({out_t})(lacc[0] / ({t})n_red);")
    else:
        lines.append(f"        out[g] = ({out_t})lacc[0];")
    lines += ["    }", "}"]
    return pragmas([t, x_t, out_t]) + "\n".join(lines) + "\n"


_TREE = """
    scratch[lid] = {value};
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {{
        if (lid < s) {{ T u = scratch[lid], w = scratch[lid + s]; scratch[lid] = {combine}; }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    T {result} = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);
"""


def _tree(value: str, combine: str, result: str) -> str:
    return _TREE.format(value=value, combine=combine, result=result)


@functools.lru_cache(maxsize=1024)
def softmax_source(x: DType, out: DType, log: bool, wg: int) -> str:
    """Kernel ``softmax(out, x, length, inner)``: one work-group per row of ``length`` elements
    ``inner`` apart (the softmax axis)."""
    t = load_type(out)
    x_t, out_t = STORE_TYPES[x], STORE_TYPES[out]
    f = "" if t == "double" else "f"
    final = "(v - m) - log(sum)" if log else "exp(v - m) / sum"
    return (
        pragmas([t, x_t, out_t])
        + f"#define WG {wg}\n#define T {t}\n"
        + f"__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void softmax("
        f"__global {out_t}* out, __global const {x_t}* x, long length, long inner) {{\n"
        "    long g = get_group_id(0); int lid = get_local_id(0);\n"
        "    long base = (g / inner) * length * inner + g % inner;\n"
        "    __local T scratch[WG];\n"
        "    T m = -INFINITY;\n"
        "    for (long i = lid; i < length; i += WG) { T v = (T)x[base + i * inner];"
        " m = (v > m || v != v) ? v : m; }\n"
        + _tree("m", "((u > w || u != u) ? u : w)", "mx")
        + "    m = mx;\n    T sum = 0;\n"
        "    for (long i = lid; i < length; i += WG) sum += exp((T)x[base + i * inner] - m);\n"
        + _tree("sum", "u + w", "total")
        + "    sum = total;\n"
        "    for (long i = lid; i < length; i += WG) {\n"
        f"        T v = (T)x[base + i * inner]; out[base + i * inner] = ({out_t})({final});\n"
        "    }\n}\n"
    ).replace("{f}", f)


@functools.lru_cache(maxsize=1024)
def norm_source(kind: str, dtype: DType, has_weight: bool, has_bias: bool, wg: int) -> str:
    """Kernel ``norm(out, x, weight, bias, d, eps)`` over rows of the last axis: ``kind`` is
    "layer" (mean and variance, two passes) or "rms"."""
    t = load_type(dtype)
    s = STORE_TYPES[dtype]
    params = [f"__global {s}* out", f"__global const {s}* x"]
    if has_weight:
        params.append(f"__global const {s}* weight")
    if has_bias:
        params.append(f"__global const {s}* bias")
    params += ["long d", f"{t} eps"]
    body = [
        "    long g = get_group_id(0); int lid = get_local_id(0);",
        "    __global const S* row = x + g * d;",
        "    __local T scratch[WG];",
    ]
    if kind == "layer":
        body += [
            "    T acc = 0;",
            "    for (long i = lid; i < d; i += WG) acc += (T)row[i];",
            _tree("acc", "u + w", "total"),
            "    T mean = total / (T)d;",
            "    acc = 0;",
            "    for (long i = lid; i < d; i += WG) { T c = (T)row[i] - mean; acc += c * c; }",
            _tree("acc", "u + w", "sq"),
            "    T inv = rsqrt(sq / (T)d + eps);",
        ]
    else:
        body += [
            "    T acc = 0;",
            "    for (long i = lid; i < d; i += WG) { T c = (T)row[i]; acc += c * c; }",
            _tree("acc", "u + w", "sq"),
            "    T mean = 0;",
            "    T inv = rsqrt(sq / (T)d + eps);",
        ]
    value = "((T)row[i] - mean) * inv"
    if has_weight:
        value = f"({value}) * (T)weight[i]"
    if has_bias:
        value = f"{value} + (T)bias[i]"
    body.append(f"    for (long i = lid; i < d; i += WG) out[g * d + i] = (S)({value});")
    return (
        pragmas([t, s])
        + f"#define WG {wg}\n#define T {t}\n#define S {s}\n"
        + f"__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void norm({', '.join(params)}) {{\n"
        + "\n".join(body)
        + "\n}\n"
    )
