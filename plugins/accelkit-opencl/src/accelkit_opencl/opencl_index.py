"""Kernels that read or write through integer indices: gather, scatter and embedding.

An index is only known on the device, so the kernels check it there: a work-item that finds one
out of range reports it through an error buffer (``err``: a flag and the offending value, see
``CLComponent._enqueue_checked``) and leaves its element alone. Elements are copied in their
storage type, so every dtype is the same kernel with another type name.
"""

from __future__ import annotations

from typing import Any

from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError
from accelkit_opencl.opencl_types import STORE_TYPES, load_type, pragmas
from accelkit_opencl.programs import enqueue_kernel

__all__ = [
    "checked_launch", "embedding_source", "gather_source", "index_error", "scatter_source",
    "take_source",
]  # fmt: skip

_REPORT = """
void ak_report(__global long* err, long v) {
    if (atomic_cmpxchg((volatile __global int*)err, 0, 1) == 0) err[1] = v;
}
"""


def _load_index(index: DType, src: str, dim: str, wrap: bool) -> list[str]:
    """Lines that set ``long i`` from ``src`` (negative values count from the end when ``wrap``),
    or report a value outside ``0..dim-1`` and run ``BAD`` (the caller puts return or continue
    there)."""
    if index.is_signed:
        lines = [f"    long raw = (long){src};", "    long i = raw;"]
        if wrap:
            lines.append(f"    if (i < 0) i += {dim};")
        lines.append(f"    if (i < 0 || i >= {dim}) {{ ak_report(err, raw); BAD; }}")
    else:
        lines = [
            f"    ulong raw = (ulong){src};",
            f"    if (raw >= (ulong){dim}) {{ ak_report(err, (long)raw); BAD; }}",
            "    long i = (long)raw;",
        ]
    return lines


def _decompose(
    nd: int, axis: int, over_axis: bool, flat: str, targets: list[tuple[str, str]]
) -> list[str]:
    """Lines adding ``coordinate * stride`` of the flat index ``flat`` over dims ``d{j}`` to each
    ``(offset, stride prefix)`` in ``targets``, leaving out dimension ``axis`` (whose coordinate
    the caller supplies). ``over_axis``: ``flat`` counts the axis too (else it skips it)."""
    lines = [f"    long r = {flat};"]
    for j in range(nd - 1, -1, -1):
        if j == axis:
            if over_axis:
                lines.append(f"    r /= d{j};")
            continue
        lines.append(f"    {{ long c = r % d{j}; r /= d{j};")
        lines += [f"      {off} += c * {pre}{j};" for off, pre in targets]
        lines.append("    }")
    return lines


def take_source(x: DType, nd: int, axis: int) -> str:
    """Kernel ``take(out, x, index, n, out dims, x strides)``: one work-item per output
    element; ``out = np.take(x, index, axis)`` for an I64 ``index`` the core computed from
    shapes (every value in range, so nothing is checked)."""
    t = STORE_TYPES[x]
    params = [f"__global {t}* out", f"__global const {t}* x", "__global const long* index"]
    params += ["long n"] + [f"long d{j}" for j in range(nd)] + [f"long xs{j}" for j in range(nd)]
    body = ["    long gid = get_global_id(0);", "    if (gid >= n) return;", "    long xo = 0;"]
    body.append("    long r = gid;")
    for j in range(nd - 1, -1, -1):
        body.append(f"    {{ long c = r % d{j}; r /= d{j};")
        position = "index[c]" if j == axis else "c"
        body.append(f"      xo += {position} * xs{j}; }}")
    body.append("    out[gid] = x[xo];")
    return (
        pragmas([t]) + f"__kernel void take({', '.join(params)}) {{\n" + "\n".join(body) + "\n}\n"
    )


def gather_source(x: DType, index: DType, nd: int, axis: int) -> str:
    """Kernel ``gather(out, x, index, err, n, dim, index dims, x strides)``: one work-item per
    output element (``out`` and ``index`` share a shape); PyTorch's gather along ``axis``."""
    t, it = STORE_TYPES[x], STORE_TYPES[index]
    params = [f"__global {t}* out", f"__global const {t}* x", f"__global const {it}* index"]
    params += ["__global long* err", "long n", "long dim"]
    params += [f"long d{j}" for j in range(nd)] + [f"long xs{j}" for j in range(nd)]
    body = ["    long gid = get_global_id(0);", "    if (gid >= n) return;", "    long xo = 0;"]
    body += _decompose(nd, axis, True, "gid", [("xo", "xs")])
    body += [ln.replace("BAD", "return") for ln in _load_index(index, "index[gid]", "dim", True)]
    body.append(f"    out[gid] = x[xo + i * xs{axis}];")
    return (
        pragmas([t])
        + _REPORT
        + f"__kernel void gather({', '.join(params)}) {{\n"
        + "\n".join(body)
        + "\n}\n"
    )


#: scatter's ways to combine the value already there (``a``) with the new one (``b``); floats
#: take NaN from either side in max and min.
_COMBINE = {
    None: "b",
    "add": "a + b",
    "multiply": "a * b",
    "max": "((a > b || isnan(a)) ? a : b)",
    "min": "((a < b || isnan(a)) ? a : b)",
}
_COMBINE_INT = {**_COMBINE, "max": "((a > b) ? a : b)", "min": "((a < b) ? a : b)"}


def scatter_source(
    x: DType, index: DType, nd: int, axis: int, scalar: str | None, reduce: str | None = None
) -> str:
    """Kernel ``scatter(out, [src | value], index, err, lines, length, dim, index dims, out
    strides, src strides)``: ``out`` already holds a copy of x. One work-item per line of
    ``index`` along ``axis``, walking it in order, so duplicate indices keep the last write (as
    the CPU backend does), or combine in that order with ``reduce`` (add, multiply, max, min):
    the same result on every run. ``scalar`` is the C type of a scalar ``value``, or None for
    a tensor ``src``."""
    t, it = STORE_TYPES[x], STORE_TYPES[index]
    params = [f"__global {t}* out"]
    params.append(f"{scalar} value" if scalar is not None else f"__global const {t}* src")
    params += [f"__global const {it}* index", "__global long* err", "long lines", "long length"]
    params.append("long dim")
    params += [f"long d{j}" for j in range(nd)] + [f"long os{j}" for j in range(nd)]
    params += [f"long ss{j}" for j in range(nd)]
    targets = [("oo", "os"), ("io", "is"), ("so", "ss")]
    body = [
        "    long gid = get_global_id(0);",
        "    if (gid >= lines) return;",
        "    long oo = 0, io = 0, so = 0;",
    ]
    # index is contiguous: its strides follow from its dims
    body.append(f"    long is{nd - 1} = 1;")
    body += [f"    long is{j} = is{j + 1} * d{j + 1};" for j in range(nd - 2, -1, -1)]
    body += _decompose(nd, axis, False, "gid", targets)
    body.append("    for (long k = 0; k < length; ++k) {")
    load = _load_index(index, f"index[io + k * is{axis}]", "dim", True)
    body += ["    " + ln.replace("BAD", "continue") for ln in load]
    value = f"({t})value" if scalar is not None else f"src[so + k * ss{axis}]"
    if reduce is None:
        body.append(f"        out[oo + i * os{axis}] = {value};")
    else:
        lt = load_type(x)
        combine = (_COMBINE if x.is_floating else _COMBINE_INT)[reduce]
        body.append(f"        {lt} a = ({lt})out[oo + i * os{axis}], b = ({lt}){value};")
        body.append(f"        out[oo + i * os{axis}] = ({t})({combine});")
    body.append("    }")
    return (
        pragmas([t, scalar or t])
        + _REPORT
        + f"__kernel void scatter({', '.join(params)}) {{\n"
        + "\n".join(body)
        + "\n}\n"
    )


def embedding_source(weight: DType, index: DType) -> str:
    """Kernel ``embedding(out, weight, indices, err, n, rows, width)``: one work-item per output
    element; ``out[r, c] = weight[indices[r], c]``, indices in ``0..rows-1`` (no wrapping)."""
    t, it = STORE_TYPES[weight], STORE_TYPES[index]
    params = [f"__global {t}* out", f"__global const {t}* weight", f"__global const {it}* indices"]
    params += ["__global long* err", "long n", "long rows", "long width"]
    body = [
        "    long gid = get_global_id(0);",
        "    if (gid >= n) return;",
        "    long row = gid / width;",
        "    long col = gid - row * width;",
    ]
    body += [
        ln.replace("BAD", "return") for ln in _load_index(index, "indices[row]", "rows", False)
    ]
    body.append("    out[gid] = weight[i * width + col];")
    return (
        pragmas([t])
        + _REPORT
        + f"__kernel void embedding({', '.join(params)}) {{\n"
        + "\n".join(body)
        + "\n}\n"
    )


def checked_launch(kernel: Any, args: list[Any], global_size: tuple[int, ...]) -> Any:
    """A launch whose kernel takes the error buffer as its fourth argument (``args[3]``)."""

    def run(queue: Any, wait_for: list[Any] | None, err: Any) -> Any:
        args[3] = err
        return enqueue_kernel(queue, kernel, args, global_size, None, wait_for)

    return run


def index_error(op: str, what: str, value: int, low: int, high: int) -> InvalidArgumentError:
    return InvalidArgumentError(f"{op}: {what} values must lie in {low}..{high - 1}; got {value}")
