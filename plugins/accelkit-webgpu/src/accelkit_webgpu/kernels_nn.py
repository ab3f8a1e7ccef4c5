"""Neural-network kernels in WGSL: ``scatter`` (deterministic: the last write in index order wins)
and ``adam_update`` (in place on param, m and v).

scatter runs in three dispatches on one stream position, with an I32 scratch tensor ``W`` of
``2 + out.size`` words:

1. ``W[0] = i32::MAX``, ``W[1] = i32::MIN``, every other word ``-1`` (a map kernel);
2. one invocation per index entry: it folds its index value into ``W[0]``/``W[1]`` (min and max,
   reduced per workgroup first, so the global atomics are one per workgroup) and, when the value
   is in range, ``atomicMax``-es its position along ``axis`` into the destination's word. Every
   entry landing on one destination differs from the others only along ``axis``, so the largest
   position is the last write in C (index) order, whatever order the invocations ran in;
3. a map kernel over ``out``: the destination's winner (if any) picks its ``src`` value, else
   ``x``'s. Narrow dtypes are packed per word there, so no two invocations share an output word.

The worker then reads ``W[0..2]`` (8 bytes, after the device has run the three dispatches) and
raises InvalidArgumentError with the range of the index values if one was out of range: the error
is reported when a result is awaited, as on the other backends. This read waits for the device,
which costs one round trip per scatter on the stream's worker thread (never the event loop's).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from accelkit import Tensor
from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError
from accelkit_webgpu.gpu import groups_for
from accelkit_webgpu.int64 import INT64
from accelkit_webgpu.kernels_shape import contiguous_strides, index_reader
from accelkit_webgpu.submit import WebGPUComponent, block, f32_bits, nbytes, scalar_words
from accelkit_webgpu.wgsl import (
    WG,
    Binding,
    compute_type,
    elements_per_word,
    header,
    loader,
    map_kernel,
    param_value,
    storer,
)

__all__ = ["CLAIMS", "NNKernels", "adam_source", "scatter_sources"]

#: The TensorOps names these kernels make work on the adapter (read by the probe).
CLAIMS: frozenset[str] = frozenset({"scatter", "adam_update"})

_I32_MAX = 0x7FFFFFFF
_I32_MIN_WORD = 0x80000000

# Pass 1: the scratch words' starting values (P[0] = 2 + out.size).
_INIT = """
fn value(e: u32) -> i32 {
    if (e == 0u) { return 2147483647; }
    if (e == 1u) { return i32(-2147483647 - 1); }
    return -1;
}
"""


def _winner_source(index_dtype: DType) -> str:
    """Pass 2. P[0] = index size, P[1] = nd, P[2] = axis, P[3] = x's length along it,
    P[4:4+nd] = index dims, P[4+nd:4+2nd] = out's strides."""
    return (
        "@group(0) @binding(0) var<storage, read> P: array<u32>;\n"
        "@group(0) @binding(1) var<storage, read> t_idx: array<u32>;\n"
        "@group(0) @binding(2) var<storage, read_write> W: array<atomic<i32>>;\n"
        + (INT64 if index_dtype.itemsize == 8 else "")
        + loader("idx", index_dtype)
        + index_reader(index_dtype)
        + f"""
var<workgroup> wlo: atomic<i32>;
var<workgroup> whi: atomic<i32>;

@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    if (lid == 0u) {{
        atomicStore(&wlo, 2147483647);
        atomicStore(&whi, i32(-2147483647 - 1));
    }}
    workgroupBarrier();
    let p = (wid.y * nwg.x + wid.x) * {WG}u + lid;
    let n = P[0];
    if (p < n) {{
        let nd = P[1];
        let axis = P[2];
        let dim = i32(P[3]);
        var k: i32 = idx_at(p);
        atomicMin(&wlo, k);
        atomicMax(&whi, k);
        if (k < 0) {{ k = k + dim; }}
        if (k >= 0 && k < dim) {{
            var r = p;
            var dest = 0u;
            var along = 0u;
            for (var j = 0u; j < nd; j = j + 1u) {{
                let a = nd - 1u - j;
                let d = P[4u + a];
                var c = r % d;
                r = r / d;
                if (a == axis) {{
                    along = c;
                    c = u32(k);
                }}
                dest = dest + c * P[4u + nd + a];
            }}
            atomicMax(&W[2u + dest], i32(along));
        }}
    }}
    workgroupBarrier();
    if (lid == 0u) {{
        atomicMin(&W[0], atomicLoad(&wlo));
        atomicMax(&W[1], atomicLoad(&whi));
    }}
}}
"""
    )


# Pass 3 (tensor src). P[3] = nd, P[4] = axis, P[5:5+nd] = out dims, P[5+nd:5+2nd] = src strides.
_PICK_TENSOR = """
fn value(e: u32) -> {ct} {{
    let wv = ld_win(e + 2u);
    if (wv < 0) {{ return ldv_x(e); }}
    let nd = P[3];
    let axis = P[4];
    var r = e;
    var src = 0u;
    for (var j = 0u; j < nd; j = j + 1u) {{
        let a = nd - 1u - j;
        let d = P[5u + a];
        var c = r % d;
        r = r / d;
        if (a == axis) {{ c = u32(wv); }}
        src = src + c * P[5u + nd + a];
    }}
    return ldv_src(src);
}}
"""

# Pass 3 (scalar src): P[1] (and P[2] for 64-bit dtypes) = the value's words.
_PICK_SCALAR = """
fn value(e: u32) -> {ct} {{
    if (ld_win(e + 2u) < 0) {{ return ldv_x(e); }}
    return {scalar};
}}
"""


def scatter_sources(x: DType, index: DType, src_is_tensor: bool) -> tuple[str, str, str]:
    """The three shaders of a scatter of ``x``'s dtype with an ``index`` of that dtype."""
    ct = compute_type(x)
    init = map_kernel([], DType.I32, _INIT)
    winner = _winner_source(index)
    binds = [Binding("x", x), Binding("win", DType.I32)]
    if src_is_tensor:
        binds.append(Binding("src", x))
        pick = map_kernel(binds, x, _PICK_TENSOR.format(ct=ct))
    else:
        pick = map_kernel(binds, x, _PICK_SCALAR.format(ct=ct, scalar=param_value(x, 1, 2)))
    return init, winner, pick


def adam_source(dtype: DType) -> str:
    """One invocation per output word of ``dtype`` (1 element for F32, 2 for F16/BF16): it
    updates its elements of param, m and v and writes whole words of each.

    P[0] = n, then f32 bits of lr, beta1, 1 - beta1, beta2, 1 - beta2, eps,
    1 - beta1**step, 1 - beta2**step, weight_decay."""
    epw = elements_per_word(dtype)
    bits = 8 * dtype.itemsize
    rw = [Binding("p", dtype), Binding("m", dtype), Binding("v", dtype)]
    if epw == 1:
        body = """
    let r = upd(w);
    t_p[w] = st_bits(r.x);
    t_m[w] = st_bits(r.y);
    t_v[w] = st_bits(r.z);"""
    else:
        body = f"""
    var wp = 0u;
    var wm = 0u;
    var wv = 0u;
    for (var j = 0u; j < {epw}u; j = j + 1u) {{
        let e = w * {epw}u + j;
        if (e < n) {{
            let r = upd(e);
            let s = j * {bits}u;
            wp = wp | (st_bits(r.x) << s);
            wm = wm | (st_bits(r.y) << s);
            wv = wv | (st_bits(r.z) << s);
        }}
    }}
    t_p[w] = wp;
    t_m[w] = wm;
    t_v[w] = wv;"""
    return (
        header([Binding("g", dtype)], None, rw)
        + storer(dtype)
        + f"""
fn pf(k: u32) -> f32 {{ return bitcast<f32>(P[k]); }}

// (new param, new m, new v) of element i, as the CPU backend computes them in f32.
fn upd(i: u32) -> vec3<f32> {{
    let p = ld_p(i);
    let g = ld_g(i);
    let m = pf(2u) * ld_m(i) + pf(3u) * g;
    let v = pf(4u) * ld_v(i) + pf(5u) * g * g;
    let m_hat = m / pf(7u);
    let v_hat = v / pf(8u);
    var u = m_hat / (sqrt(v_hat) + pf(6u));
    let wd = pf(9u);
    if (wd != 0.0) {{ u = u + wd * p; }}
    return vec3<f32>(p - pf(1u) * u, m, v);
}}

@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    let w = (wid.y * nwg.x + wid.x) * {WG}u + lid;
    let n = P[0];
    if (w * {epw}u >= n) {{ return; }}
{body}
}}
"""
    )


class NNKernels(WebGPUComponent):
    def scatter(
        self, x: Tensor, axis: int, index: Tensor, src: Tensor | int | float, out: Tensor
    ) -> None:
        n = out.size
        if n == 0:
            return
        if isinstance(src, Tensor) and src.dtype is not x.dtype:
            # values of another dtype are converted first (as the CPU backend's assignment does)
            converted = self.empty(src.shape, x.dtype)
            self.backend.tensor_kernels.cast(src, converted)
            src = converted
        gpu = self.gpu
        dim = x.shape[axis]
        is_tensor = isinstance(src, Tensor)
        init_src, winner_src, pick_src = scatter_sources(x.dtype, index.dtype, is_tensor)
        win = self.empty((n + 2,), DType.I32)
        nd = out.ndim
        init_params = [n + 2]
        winner_params = [index.size, nd, axis, dim, *index.shape, *contiguous_strides(out.shape)]
        pick_params: list[int] = [n, 0, 0, nd, axis, *out.shape]
        ins: list[tuple[Any, int]] = [(block(x), nbytes(x)), (block(win), nbytes(win))]
        if isinstance(src, Tensor):
            pick_params += contiguous_strides(src.shape)
            ins.append((block(src), nbytes(src)))
        else:
            pick_params[1], pick_params[2] = scalar_words(src, out.dtype)
        win_io = (block(win), nbytes(win))
        idx_io = (block(index), nbytes(index))
        out_io = (block(out), nbytes(out))
        init_groups = groups_for(n + 2, WG)
        winner_groups = groups_for(index.size, WG)
        pick_groups = groups_for(-(-n // elements_per_word(out.dtype)), WG)
        check = index.size > 0

        def run(_keep: Tensor = win) -> None:
            # (_keep: the scratch tensor lives until the dispatches are recorded)
            gpu.dispatch(init_src, init_params, [], [win_io], init_groups)
            if check:
                gpu.dispatch(winner_src, winner_params, [idx_io], [win_io], winner_groups)
            gpu.dispatch(pick_src, pick_params, ins, [out_io], pick_groups)
            if check:
                lo, hi = (int(v) for v in np.frombuffer(gpu.read(win_io[0], 8), np.int32))
                if lo < -dim or hi >= dim:
                    raise InvalidArgumentError(
                        f"scatter: index values must lie in {-dim}..{dim - 1}; got {lo} to {hi}"
                    )

        inputs: list[Tensor] = [x, index] + ([src] if isinstance(src, Tensor) else [])
        self.launch(run, inputs, (out,))

    def adam_update(
        self,
        param: Tensor,
        grad: Tensor,
        m: Tensor,
        v: Tensor,
        lr: float,
        beta1: float,
        beta2: float,
        eps: float,
        step: int,
        weight_decay: float,
    ) -> None:
        n = param.size
        if n == 0:
            return
        gpu = self.gpu
        src = adam_source(param.dtype)
        floats = (
            lr, beta1, 1.0 - beta1, beta2, 1.0 - beta2, eps,
            1.0 - beta1**step, 1.0 - beta2**step, weight_decay,
        )  # fmt: skip
        params = [n, *(f32_bits(f) for f in floats)]
        ins = [(block(grad), nbytes(grad))]
        outs = [(block(t), nbytes(t)) for t in (param, m, v)]
        groups = groups_for(-(-n // elements_per_word(param.dtype)), WG)
        self.launch(
            lambda: gpu.dispatch(src, params, ins, outs, groups), [param, grad, m, v], (param, m, v)
        )
