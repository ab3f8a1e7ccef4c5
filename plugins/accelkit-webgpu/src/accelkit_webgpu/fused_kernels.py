"""The WebGPU backend's fused KernelOps: WGSL kernels on the adapter.

Ops that TensorOps already runs here (rms_norm, layer_norm, attention, linear, gelu, argmax)
launch the same kernels through
:class:`~accelkit_webgpu.tensor_kernels.WebGPUTensorKernels`; silu_mul and rotary_embedding
are map kernels; rms_norm_residual is one workgroup per row; quantized_linear
expands Q8_0/Q4_0 blocks in registers, one output column per invocation with the input row's
block in workgroup memory; paged_attention walks each sequence's block table with an online
softmax, one invocation per (sequence, query head). sample_token is left to the core's
composition. Arithmetic is in f32 and rounded once on store (F16/BF16), as the composition does.
A dtype without a fused kernel (anything but F32/F16/BF16) raises UnsupportedOperationError,
which the dispatcher answers with the composition. Bad values a kernel meets (a block id, a
context length) are recorded in an error word on the adapter, read back by the worker that ran
the kernel, and raised as InvalidArgumentError when the result is awaited.

This module imports no wgpu at module level: the probe reads :data:`FUSED`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError, UnsupportedOperationError
from accelkit.quant import QuantFormat
from accelkit.sdk import FusedKernels, GeluApproximation, rotary_inv_freq
from accelkit.tensor import Tensor
from accelkit_webgpu import elementwise as ew
from accelkit_webgpu.gpu import Block, groups_for
from accelkit_webgpu.kernels_shape import index_reader
from accelkit_webgpu.submit import WebGPUComponent, block, f32_bits, nbytes
from accelkit_webgpu.wgsl import WG, Binding, elements_per_word, header, map_kernel, storer

if TYPE_CHECKING:
    from accelkit_webgpu.tensor_kernels import WebGPUTensorKernels

__all__ = ["FUSED", "WebGPUFusedKernels"]

#: The KernelOps ops this backend fuses (its FusedKernels overrides exactly these; the probe
#: reports them as ``fused_ops``).
FUSED: frozenset[str] = frozenset(
    {"rms_norm", "rms_norm_residual", "layer_norm", "rotary_embedding", "attention",
     "paged_attention", "silu_mul", "gelu", "linear", "quantized_linear", "argmax"}
)  # fmt: skip

_FLOATS = frozenset({DType.F32, DType.F16, DType.BF16})

#: Workgroup size of the row kernel (rms_norm_residual), as kernels_reduce's row kernels.
_RWG = 64

#: Loop iterations one invocation may run on a software adapter (llvmpipe stops at 65,535).
_TRIPS = 60000

#: Error kinds of paged_attention's error words.
_BAD_LENGTH, _BAD_BLOCK = 0, 1


def _round_fn(dtype: DType) -> str:
    """``fn rnd(v: f32) -> f32``: ``v`` rounded to ``dtype`` (as stored and loaded back)."""
    body = {
        DType.F32: "return v;",
        DType.F16: "return ak_f16_to_f32(ak_f32_to_f16(v));",
        DType.BF16: "return bitcast<f32>(ak_f32_to_bf16(v) << 16u);",
    }[dtype]
    return f"fn rnd(v: f32) -> f32 {{ {body} }}\n"


def _named_index(name: str, dtype: DType) -> str:
    """``fn <name>_at(i: u32) -> i32``: kernels_shape's saturating index reader for ``t_<name>``."""
    return index_reader(dtype).replace("idx", name)


def silu_mul_source(dtype: DType) -> str:
    """``silu(a) * b`` per element, in f32 (TensorOps' silu expression, then the product)."""
    value = """
fn value(e: u32) -> f32 {
    let a = f32(ld_a(e));
    return (a * ak_sigmoid(a)) * f32(ld_b(e));
}
"""
    return map_kernel([Binding("a", dtype), Binding("b", dtype)], dtype, ew.HELPERS + value)


def rotary_source(dtype: DType, positions: DType | None, per_batch: bool) -> str:
    """Rotary embedding per output element of x [B, H, S, D]: ``P[1]`` = D, ``P[2]`` = H,
    ``P[3]`` = S, ``P[4]`` = offset. Token ``s`` of batch ``b`` sits at ``positions[b, s]``
    (``per_batch``), ``positions[s]`` or ``offset + s``, converted to f32 as the composition's
    cast does; the angle is ``position * inv_freq[i]`` in f32."""
    inputs = [Binding("x", dtype), Binding("f", DType.F32)]
    if positions is not None:
        inputs.append(Binding("p", positions))
        if positions is DType.I64:
            conv = "fn posv(i: u32) -> f32 { return w_to_f32_s(ld64_p(i)); }\n"
        elif positions is DType.U64:
            conv = "fn posv(i: u32) -> f32 { return w_to_f32_u(ld64_p(i)); }\n"
        else:
            conv = "fn posv(i: u32) -> f32 { return f32(ld_p(i)); }\n"
        pos = "posv((row / (P[2] * P[3])) * P[3] + s)" if per_batch else "posv(s)"
    else:
        conv = ""
        pos = "f32(P[4] + s)"
    value = f"""
fn value(e: u32) -> f32 {{
    let d = P[1];
    let half = d / 2u;
    let row = e / d;
    let i = e % d;
    let s = row % P[3];
    let j = i % half;
    let angle = {pos} * ld_f(j);
    let c = cos(angle);
    let sn = sin(angle);
    let base = row * d;
    let x1 = f32(ld_x(base + j));
    let x2 = f32(ld_x(base + half + j));
    if (i < half) {{ return x1 * c - x2 * sn; }}
    return x2 * c + x1 * sn;
}}
"""
    return map_kernel(inputs, dtype, conv + value)


def rms_norm_residual_source(dtype: DType, has_weight: bool) -> str:
    """One workgroup per row (``P[0]`` rows of ``P[1]`` elements, a multiple of the elements per
    word; ``P[2]`` eps bits): ``summed = x + residual`` rounded to the dtype, written as whole
    words, then ``normed = summed * inv_rms (* weight)``. The sum of squares runs in the same
    per-invocation order and tree as the rms_norm kernel, so ``normed`` matches the composition."""
    epw = elements_per_word(dtype)
    bits = 8 * dtype.itemsize
    inputs = [Binding("x", dtype), Binding("r", dtype)]
    if has_weight:
        inputs.append(Binding("w", dtype))
    rw = [Binding("nm", dtype), Binding("sm", dtype)]
    value = "(sv(base + k) * inv)"
    if has_weight:
        value = f"({value} * f32(ld_w(k)))"
    return (
        header(inputs, None, rw)
        + storer(dtype)
        + ew.HELPERS
        + _round_fn(dtype)
        + "fn sv(i: u32) -> f32 { return rnd(f32(ld_x(i)) + f32(ld_r(i))); }\n"
        + f"var<workgroup> sh: array<f32, {_RWG}>;\n"
        + f"""
@compute @workgroup_size({_RWG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    let g = wid.y * nwg.x + wid.x;
    if (g >= P[0]) {{ return; }}
    let rl = P[1];
    let eps = bitcast<f32>(P[2]);
    let base = g * rl;
    let words = rl / {epw}u;
    let wbase = base / {epw}u;
    for (var q = lid; q < words; q = q + {_RWG}u) {{
        var word = 0u;
        for (var j = 0u; j < {epw}u; j = j + 1u) {{
            word = word | (st_bits(sv(base + q * {epw}u + j)) << (j * {bits}u));
        }}
        t_sm[wbase + q] = word;
    }}
    var a = 0.0;
    for (var k = lid; k < rl; k = k + {_RWG}u) {{ let c = sv(base + k); a = a + c * c; }}
    sh[lid] = a;
    workgroupBarrier();
    for (var s = {_RWG // 2}u; s > 0u; s = s >> 1u) {{
        if (lid < s) {{ sh[lid] = sh[lid] + sh[lid + s]; }}
        workgroupBarrier();
    }}
    let s2 = sh[0];
    let inv = 1.0 / ak_sqrt(s2 / f32(rl) + eps);
    for (var q = lid; q < words; q = q + {_RWG}u) {{
        var word = 0u;
        for (var j = 0u; j < {epw}u; j = j + 1u) {{
            let k = q * {epw}u + j;
            word = word | (st_bits({value}) << (j * {bits}u));
        }}
        t_nm[wbase + q] = word;
    }}
}}
"""
    )


def quantized_linear_source(dtype: DType, fmt: QuantFormat, scales: DType, has_bias: bool) -> str:
    """``out[m, o] = sum_i x[m, i] * (scale[o, i / 32] * q[o, i]) (+ bias[o])`` into an F32
    ``out``: a workgroup per (row ``m``, tile of ``WG`` output columns); each block of 32 inputs
    of the row is staged in workgroup memory and every invocation expands its column's block
    from whole words (4 int8 values, or 4 bytes of two nibbles each) in registers.
    ``P[0]`` = n_out, ``P[1]`` = n_in, ``P[2]`` = column tiles, ``P[3]`` = rows."""
    inputs = [Binding("x", dtype), Binding("qw", DType.I8 if fmt == "q8_0" else DType.U8)]
    inputs.append(Binding("sc", scales))
    if has_bias:
        inputs.append(Binding("b", dtype))
    if fmt == "q8_0":
        lines = ["        let wb = (oc * n_in + blk * 32u) / 4u;"]
        lines.append("        for (var w = 0u; w < 8u; w = w + 1u) {")
        lines.append("            let word = t_qw[wb + w];")
        for j in range(4):
            q = f"f32(bitcast<i32>(word << {24 - 8 * j}u) >> 24u)"
            lines.append(f"            acc = acc + xs[w * 4u + {j}u] * (s * {q});")
        lines.append("        }")
    else:
        lines = ["        let wb = (oc * (n_in / 2u) + blk * 16u) / 4u;"]
        lines.append("        for (var w = 0u; w < 4u; w = w + 1u) {")
        lines.append("            let word = t_qw[wb + w];")
        for j in range(4):
            lo = f"f32(i32((word >> {8 * j}u) & 15u) - 8)"
            hi = f"f32(i32((word >> {8 * j + 4}u) & 15u) - 8)"
            lines.append(f"            acc = acc + xs[w * 4u + {j}u] * (s * {lo});")
            lines.append(f"            acc = acc + xs[w * 4u + {j + 16}u] * (s * {hi});")
        lines.append("        }")
    expand = "\n".join(lines)
    bias = "acc = acc + f32(ld_b(o));" if has_bias else ""
    return (
        header(inputs, DType.F32)
        + "var<workgroup> xs: array<f32, 32>;\n"
        + f"""
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    let g = wid.y * nwg.x + wid.x;
    let tiles = P[2];
    let m = g / tiles;
    if (m >= P[3]) {{ return; }}
    let n_out = P[0];
    let n_in = P[1];
    let nb = n_in / 32u;
    let o = (g % tiles) * {WG}u + lid;
    let oc = min(o, n_out - 1u);
    var acc = 0.0;
    for (var blk = 0u; blk < nb; blk = blk + 1u) {{
        if (lid < 32u) {{ xs[lid] = f32(ld_x(m * n_in + blk * 32u + lid)); }}
        workgroupBarrier();
        let s = f32(ld_sc(oc * nb + blk));
{expand}
        workgroupBarrier();
    }}
    if (o < n_out) {{
        {bias}
        t_out[m * n_out + o] = bitcast<u32>(acc);
    }}
}}
"""
    )


def paged_attention_source(
    dtype: DType, out: DType, table: DType, lens: DType, head_dim: int, block_size: int
) -> str:
    """One invocation per (sequence, query head) (``P[0]`` of them): an online softmax over the
    sequence's tokens read through its block table (running maximum and sum, the accumulator
    rescaled as the maximum grows), so no context is gathered. ``P[1]`` heads, ``P[2]`` query
    heads per KV head, ``P[3]`` KV heads, ``P[4]`` cache blocks, ``P[5]`` table width, ``P[6]``
    the scale's bits. A length outside ``0..max_blocks * block_size`` or a block id outside the
    cache is recorded in ``t_err`` (flag, kind, value) and the row written as zeros. ``out``'s
    rows are whole words (``head_dim`` a multiple of its elements per word)."""
    d, da = head_dim, max(head_dim, 1)
    epw = elements_per_word(out)
    bits = 8 * out.itemsize
    inputs = [
        Binding("q", dtype), Binding("k", dtype), Binding("v", dtype), Binding("tbl", table),
        Binding("lens", lens),
    ]  # fmt: skip
    src = header(inputs, out) + storer(out) + ew.HELPERS
    src += "@group(0) @binding(7) var<storage, read_write> t_err: array<atomic<u32>>;\n"
    src += _named_index("tbl", table) + _named_index("lens", lens)
    return (
        src
        + f"""
fn report(kind: u32, v: i32) {{
    if (atomicAdd(&t_err[0], 1u) == 0u) {{
        atomicStore(&t_err[1], kind);
        atomicStore(&t_err[2], bitcast<u32>(v));
    }}
}}

@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    let gid = (wid.y * nwg.x + wid.x) * {WG}u + lid;
    if (gid >= P[0]) {{ return; }}
    let heads = P[1];
    let b = gid / heads;
    let kvh = (gid % heads) / P[2];
    let hk = P[3];
    let nblk = i32(P[4]);
    let mb = P[5];
    let scale = bitcast<f32>(P[6]);
    var qr: array<f32, {da}>;
    var acc: array<f32, {da}>;
    for (var c = 0u; c < {d}u; c = c + 1u) {{ acc[c] = 0.0; qr[c] = f32(ld_q(gid * {d}u + c)); }}
    var run_max = bitcast<f32>(0xff800000u);
    var run_sum = 0.0;
    var nan_seen = false;
    var n = lens_at(b);
    if (n < 0 || n > i32(mb * {block_size}u)) {{
        report({_BAD_LENGTH}u, n);
        n = 0;
    }}
    for (var t = 0u; t < u32(n); t = t + 1u) {{
        let blk = tbl_at(b * mb + t / {block_size}u);
        if (blk < 0 || blk >= nblk) {{
            report({_BAD_BLOCK}u, blk);
            run_sum = 0.0;
            break;
        }}
        let base = ((u32(blk) * {block_size}u + t % {block_size}u) * hk + kvh) * {d}u;
        var sc = 0.0;
        for (var c = 0u; c < {d}u; c = c + 1u) {{ sc = sc + qr[c] * f32(ld_k(base + c)); }}
        sc = sc * scale;
        if (ak_isnan(sc)) {{ nan_seen = true; continue; }}
        let new_max = select(run_max, sc, sc > run_max);
        let corr = ak_exp(run_max - new_max);
        let p = ak_exp(sc - new_max);
        run_sum = run_sum * corr + p;
        for (var c = 0u; c < {d}u; c = c + 1u) {{
            acc[c] = acc[c] * corr + p * f32(ld_v(base + c));
        }}
        run_max = new_max;
    }}
    var inv = 0.0;
    if (run_sum > 0.0) {{ inv = 1.0 / run_sum; }}
    if (nan_seen) {{ inv = ak_nan(); }}
    let ob = gid * {d}u / {epw}u;
    for (var w = 0u; w < {d // epw if d else 0}u; w = w + 1u) {{
        var word = 0u;
        for (var j = 0u; j < {epw}u; j = j + 1u) {{
            word = word | (st_bits(acc[w * {epw}u + j] * inv) << (j * {bits}u));
        }}
        t_out[ob + w] = word;
    }}
}}
"""
    )


class WebGPUFusedKernels(WebGPUComponent, FusedKernels):
    """Every fused op but sample_token (which runs as the composition)."""

    # -- helpers ----------------------------------------------------------------------------------
    @property
    def _ops(self) -> WebGPUTensorKernels:
        return self.backend.tensor_kernels

    def _supported(self, op: str, *tensors: Tensor | None) -> None:
        for t in tensors:
            if t is not None and t.dtype not in _FLOATS:
                raise UnsupportedOperationError(
                    f"webgpu: no fused {op} for {t.dtype.value} (F32, F16 and BF16 only)"
                )

    def _dispatch(
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
        self.launch(lambda: gpu.dispatch(src, params, ins, outs, groups), inputs, outputs)

    def _cast_into(self, tmp: Tensor, out: Tensor) -> None:
        self.run_map(ew.cast_source(tmp.dtype, out.dtype), [out.size], [tmp], out, extra=[tmp])

    # -- norms ------------------------------------------------------------------------------------
    def rms_norm(self, x: Tensor, weight: Tensor | None, eps: float, out: Tensor) -> None:
        self._supported("rms_norm", x, weight)
        self._ops.rms_norm(x, weight, eps, out)

    def rms_norm_residual(
        self,
        x: Tensor,
        residual: Tensor,
        weight: Tensor | None,
        eps: float,
        normed: Tensor,
        summed: Tensor,
    ) -> None:
        self._supported("rms_norm_residual", x, residual, weight)
        if x.size == 0:
            return
        d = x.shape[-1]
        self._ops._rd_check_row("rms_norm_residual", d)
        if d % elements_per_word(x.dtype):
            # rows that do not start on a word boundary: two workgroups would share a word,
            # so the sum and the norm run as the two TensorOps kernels
            self._ops.binary("add", x, residual, summed)
            self._ops.rms_norm(summed, weight, eps, normed)
            return
        rows = x.size // d
        src = rms_norm_residual_source(x.dtype, weight is not None)
        inputs = [x, residual] if weight is None else [x, residual, weight]
        self._dispatch(src, [rows, d, f32_bits(eps)], inputs, [normed, summed], groups_for(rows, 1))

    def layer_norm(
        self, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, out: Tensor
    ) -> None:
        self._supported("layer_norm", x, weight, bias)
        self._ops.layer_norm(x, weight, bias, eps, out)

    # -- positions --------------------------------------------------------------------------------
    def rotary_embedding(
        self, x: Tensor, positions: Tensor | None, base: float, offset: int, out: Tensor
    ) -> None:
        self._supported("rotary_embedding", x)
        if x.size == 0:
            return
        _, h, s, d = x.shape
        if positions is None and offset + s > 0xFFFFFFFF:
            raise UnsupportedOperationError(
                f"webgpu: fused rotary_embedding takes offsets below 2**32; got {offset}"
            )
        inv_freq = self.backend.tensor_factory.from_host(
            rotary_inv_freq(d, base).astype(np.float32), dtype=DType.F32
        )
        per_batch = positions is not None and positions.ndim == 2
        src = rotary_source(x.dtype, None if positions is None else positions.dtype, per_batch)
        inputs = [x, inv_freq] if positions is None else [x, inv_freq, positions]
        self.run_map(src, [out.size, d, h, s, offset], inputs, out)

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
        self._supported("attention", q, k, v)
        self._ops.attention(q, k, v, mask, out, scale, causal)

    def paged_attention(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        block_table: Tensor,
        context_lens: Tensor,
        scale: float,
        out: Tensor,
    ) -> None:
        self._supported("paged_attention", q, k_cache, v_cache)
        if out.size == 0:
            return
        b, h, d = q.shape
        num_blocks, block_size, hk, _ = k_cache.shape
        max_blocks = block_table.shape[1]
        max_len = max_blocks * block_size
        # each invocation loops about 2 * head_dim times per token
        self.check_loop("paged_attention", "max_len * (2 * head_dim + 2) =",
                        max_len * (2 * d + 2) + d, _TRIPS)  # fmt: skip
        packed = d % elements_per_word(out.dtype) == 0
        target = out if packed else self.empty(out.shape, DType.F32)
        src = paged_attention_source(
            q.dtype, target.dtype, block_table.dtype, context_lens.dtype, d, block_size
        )
        params = [b * h, h, h // hk, hk, num_blocks, max_blocks, f32_bits(scale)]
        inputs = [q, k_cache, v_cache, block_table, context_lens]
        gpu = self.gpu
        ins = [(block(t), max(4, nbytes(t))) for t in inputs]
        outs = [(block(target), nbytes(target))]
        groups = groups_for(b * h, WG)
        zero = np.zeros(3, np.uint32)

        def run() -> None:
            err = Block(gpu, 12)
            try:
                gpu.write(err, zero)
                gpu.dispatch(src, params, ins, [*outs, (err, 12)], groups)
                flag, kind, value = (int(w) for w in gpu.read(err, 12).view(np.uint32))
            finally:
                err.release()
            if not flag:
                return
            if value >= 1 << 31:
                value -= 1 << 32
            if kind == _BAD_LENGTH:
                raise InvalidArgumentError(
                    f"paged_attention: context_lens must lie in 0..{max_len} (max_blocks *"
                    f" block_size); got {value}"
                )
            raise InvalidArgumentError(
                f"paged_attention: block_table refers to block {value}; the cache has blocks"
                f" 0..{num_blocks - 1}"
            )

        self.launch(run, inputs, (target,))
        if target is not out:
            self._cast_into(target, out)

    # -- activations ------------------------------------------------------------------------------
    def silu_mul(self, gate: Tensor, up: Tensor, out: Tensor) -> None:
        self._supported("silu_mul", gate, up)
        self.run_map(silu_mul_source(gate.dtype), [out.size], [gate, up], out)

    def gelu(self, x: Tensor, approximate: GeluApproximation, out: Tensor) -> None:
        self._supported("gelu", x)
        self._ops.unary("gelu" if approximate == "none" else "gelu_tanh", x, out)

    # -- linear -----------------------------------------------------------------------------------
    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> None:
        self._supported("linear", x, weight, bias, out)
        self._ops.linear(x, weight, bias, out)

    def quantized_linear(
        self,
        x: Tensor,
        qweight: Tensor,
        scales: Tensor,
        bias: Tensor | None,
        format: QuantFormat,
        out: Tensor,
    ) -> None:
        self._supported("quantized_linear", x, bias)
        if out.size == 0:
            return
        n_out, n_in = qweight.shape[0], x.shape[-1]
        # per invocation: one pass over the row's blocks, 8 (q8_0) or 4 (q4_0) words each
        self.check_loop("quantized_linear", "input features", n_in, _TRIPS * 3)
        rows = x.size // n_in
        tiles = -(-n_out // WG)
        target = out if out.dtype is DType.F32 else self.empty(out.shape, DType.F32)
        src = quantized_linear_source(x.dtype, format, scales.dtype, bias is not None)
        inputs = [x, qweight, scales] if bias is None else [x, qweight, scales, bias]
        self._dispatch(
            src, [n_out, n_in, tiles, rows], inputs, [target], groups_for(tiles * rows, 1)
        )
        if target is not out:
            self._cast_into(target, out)

    # -- sampling ---------------------------------------------------------------------------------
    def argmax(self, logits: Tensor, out: Tensor) -> None:
        self._supported("argmax", logits)
        self._ops.reduce("argmax", logits, (logits.ndim - 1,), False, out)
