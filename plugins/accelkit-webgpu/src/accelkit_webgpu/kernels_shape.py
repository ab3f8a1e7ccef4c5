"""Shape kernels: permute, concat, narrow, gather, scatter and embedding as map kernels.

Each output element finds its source through index arithmetic on the parameter words, so one
shader per dtype (and rank-independent: shapes and strides are parameters) serves every shape.
"""

from __future__ import annotations

import numpy as np

from accelkit import Tensor
from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError
from accelkit_webgpu.gpu import Block, groups_for
from accelkit_webgpu.submit import WebGPUComponent, block, nbytes
from accelkit_webgpu.wgsl import WG, Binding, compute_type, elements_per_word, header, map_kernel

__all__ = ["CLAIMS", "ShapeKernels", "broadcast_strides", "contiguous_strides"]

#: The TensorOps names these kernels make work on the adapter (read by the probe).
CLAIMS: frozenset[str] = frozenset(
    {"reshape", "transpose", "permute", "concat", "split", "stack", "narrow", "gather",
     "embedding", "broadcast_to", "tile", "flip", "pad"}
)  # fmt: skip


def contiguous_strides(shape: tuple[int, ...]) -> list[int]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return strides


def broadcast_strides(shape: tuple[int, ...], out: tuple[int, ...]) -> list[int]:
    """Element strides of a tensor of ``shape`` read as ``out`` (0 along broadcast axes)."""
    own = contiguous_strides(shape)
    pad = len(out) - len(shape)
    result = [0] * pad
    for d, s in zip(shape, own, strict=True):
        result.append(0 if d == 1 else s)
    return result


# Output coordinates -> a source index through per-axis strides: P[1] = nd, P[2:2+nd] = out dims,
# P[2+nd:2+2nd] = source strides per output axis.
_STRIDED = """
fn value(e: u32) -> {ct} {{
    let nd = P[1];
    var r = e;
    var src = 0u;
    for (var j = 0u; j < nd; j = j + 1u) {{
        let k = nd - 1u - j;
        let d = P[2u + k];
        src = src + (r % d) * P[2u + nd + k];
        r = r / d;
    }}
    return ldv_x(src + P[2u + 2u * nd]);
}}
"""

# Concatenation, one input at a time: elements inside this input's slab come from it, the
# rest keep the output's current value. P[1] = outer, P[2] = out axis len * inner,
# P[3] = start * inner, P[4] = this input's axis len * inner.
_CONCAT = """
fn value(e: u32) -> {ct} {{
    let row = P[2];
    let o = e / row;
    let c = e % row;
    if (c >= P[3] && c < P[3] + P[4]) {{ return ldv_x(o * P[4] + (c - P[3])); }}
    return ldv_out(e);
}}
"""

# take_along_axis: the index has the output's shape (smaller than x off the axis is allowed).
# P[1] = nd, P[2] = axis, P[3] = x's length along it, P[4:4+nd] = out dims, then x's strides.
# Negative entries count from the end; out-of-range ones (the core checks what it can) clamp so
# that no read leaves the buffer.
_GATHER = """
fn value(e: u32) -> {ct} {{
    let nd = P[1];
    let axis = P[2];
    let n = i32(P[3]);
    var k = idx_at(e);
    if (k < 0) {{ k = k + n; }}
    k = clamp(k, 0, n - 1);
    var r = e;
    var src = 0u;
    for (var j = 0u; j < nd; j = j + 1u) {{
        let a = nd - 1u - j;
        let d = P[4u + a];
        var c = r % d;
        r = r / d;
        if (a == axis) {{ c = u32(k); }}
        src = src + c * P[4u + nd + a];
    }}
    return ldv_x(src);
}}
"""

# embedding: out[i, :] = weight[indices[i], :]; P[1] = width, P[2] = rows.
_EMBED = """
fn value(e: u32) -> {ct} {{
    let w = P[1];
    var k = idx_at(e / w);
    let n = i32(P[2]);
    if (k < 0) {{ k = k + n; }}
    k = clamp(k, 0, n - 1);
    return ldv_x(u32(k) * w + e % w);
}}
"""


# Index check: P[0] = count, P[1] = the axis length, P[2] = 1 where negative indices count from
# the end. The first bad index found (atomically: one invocation wins) sets t_err[0] and writes
# its raw words (low, high) to t_err[1..2].
_CHECK = """
@group(0) @binding(2) var<storage, read_write> t_err: array<atomic<u32>>;
@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    let i = (wid.y * nwg.x + wid.x) * {wg}u + lid;
    if (i >= P[0]) {{ return; }}
    let k = idx_at(i);
    let n = i32(P[1]);
    let low = select(0, -n, P[2] == 1u);
    if (k < low || k >= n) {{
        if (atomicAdd(&t_err[0], 1u) == 0u) {{
            atomicStore(&t_err[1], {lo});
            atomicStore(&t_err[2], {hi});
        }}
    }}
}}
"""


def index_reader(dtype: DType) -> str:
    """``fn idx_at(i: u32) -> i32``: index ``i`` of binding ``t_idx`` as an i32; values past
    i32's range saturate (to its minimum or maximum), which every range check refuses."""
    if dtype is DType.U64:
        body = (
            "let v = ld64_idx(i);\n"
            "    return select(2147483647, i32(v.x), v.y == 0u && v.x < 0x80000000u);"
        )
    elif dtype.is_integer and not dtype.is_signed and dtype.itemsize <= 4:
        body = "return i32(min(ld_idx(i), 0x7fffffffu));"
    elif dtype is DType.BOOL:
        body = "return i32(ld_idx(i));"
    else:  # signed: i32 already (I64 through its index view)
        body = "return ld_idx(i);"
    return f"fn idx_at(i: u32) -> i32 {{\n    {body}\n}}\n"


def _raw_words(dtype: DType) -> tuple[str, str]:
    """WGSL expressions of the raw (low, high) words of index ``i`` (for the error message)."""
    if dtype.itemsize == 8:
        return "ld64_idx(i).x", "ld64_idx(i).y"
    if dtype.is_signed:
        return "bitcast<u32>(ld_idx(i))", "select(0u, 0xffffffffu, ld_idx(i) < 0)"
    return "u32(ld_idx(i))", "0u"


def _src(template: str, inputs: list[Binding], out: DType) -> str:
    extra = "".join(index_reader(b.dtype) for b in inputs if b.name == "idx")
    return map_kernel(inputs, out, extra + template.format(ct=compute_type(out)))


class ShapeKernels(WebGPUComponent):
    def permute(self, x: Tensor, axes: tuple[int, ...], out: Tensor) -> None:
        own = contiguous_strides(x.shape)
        strides = [own[a] for a in axes]
        params = [out.size, out.ndim, *out.shape, *strides, 0]
        self.run_map(_src(_STRIDED, [Binding("x", x.dtype)], out.dtype), params, [x], out)

    def narrow(self, x: Tensor, axis: int, start: int, out: Tensor) -> None:
        strides = contiguous_strides(x.shape)
        params = [out.size, out.ndim, *out.shape, *strides, start * strides[axis]]
        self.run_map(_src(_STRIDED, [Binding("x", x.dtype)], out.dtype), params, [x], out)

    def concat(self, tensors: list[Tensor], axis: int, out: Tensor) -> None:
        inner = 1
        for d in out.shape[axis + 1 :]:
            inner *= d
        outer = out.size // max(1, out.shape[axis] * inner) if out.size else 0
        src = _src(_CONCAT, [Binding("x", out.dtype)], out.dtype)
        start = 0
        for t in tensors:
            n = t.shape[axis]
            if t.size:
                params = [out.size, outer, out.shape[axis] * inner, start * inner, n * inner]
                self.run_map(src, params, [t], out, extra=[out])
            start += n

    def gather(self, x: Tensor, axis: int, index: Tensor, out: Tensor) -> None:
        params = [out.size, out.ndim, axis, x.shape[axis], *out.shape]
        params += contiguous_strides(x.shape)
        binds = [Binding("x", x.dtype), Binding("idx", index.dtype)]
        src = _src(_GATHER, binds, out.dtype)
        self.run_checked(src, params, [x, index], out, index, x.shape[axis], "gather")

    def embedding(self, indices: Tensor, weight: Tensor, out: Tensor) -> None:
        params = [out.size, weight.shape[1] if weight.ndim > 1 else 1, weight.shape[0]]
        binds = [Binding("x", weight.dtype), Binding("idx", indices.dtype)]
        self.run_checked(
            _src(_EMBED, binds, out.dtype), params, [weight, indices], out, indices,
            weight.shape[0], "embedding", negative_ok=False,
        )  # fmt: skip

    def run_checked(
        self,
        source: str,
        params: list[int],
        inputs: list[Tensor],
        out: Tensor,
        index: Tensor,
        n: int,
        op: str,
        negative_ok: bool = True,
    ) -> None:
        """Launch a map kernel that reads ``index`` (entries in [-n, n) are valid, or [0, n)
        without ``negative_ok``; the kernel clamps the others to stay inside its buffers) and check the indices on the adapter in the
        same step: a bad one raises InvalidArgumentError, naming it, when the result is awaited."""
        if out.size == 0:
            return
        gpu = self.gpu
        check = header([Binding("idx", index.dtype)], None) + index_reader(index.dtype)
        lo_word, hi_word = _raw_words(index.dtype)
        check += _CHECK.format(wg=WG, lo=lo_word, hi=hi_word)
        signed = index.dtype.is_signed
        err = Block(gpu, 12)
        zero = np.zeros(3, np.uint32)
        negative = int(negative_ok)
        groups = groups_for(-(-out.size // elements_per_word(out.dtype)), WG)
        ins = [(block(t), nbytes(t)) for t in inputs]
        count = index.size

        def run() -> None:
            try:
                gpu.write(err, zero)
                gpu.dispatch(
                    check, [count, n, negative], [(block(index), nbytes(index))], [(err, 12)],
                    groups_for(count, WG),
                )  # fmt: skip
                gpu.dispatch(source, params, ins, [(block(out), nbytes(out))], groups)
                flag, lo, hi = (int(w) for w in gpu.read(err, 12).view(np.uint32))
            finally:
                err.release()
            if flag:
                value = lo | (hi << 32)
                if signed and value >= 1 << 63:
                    value -= 1 << 64
                valid = f"{-n}..{n - 1}" if negative_ok else f"0..{n - 1}"
                raise InvalidArgumentError(f"{op}: index {value} is out of range (valid: {valid})")

        self.launch(run, inputs, (out,))
