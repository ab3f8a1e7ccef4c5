"""A register-tiled float32 attention kernel (NVRTC, no tensor cores): what f32 attention runs
where cuDNN (f16/bf16 only) and the tensor-core kernel (:mod:`accelkit_cuda.flash_attention`,
f16/bf16) do not serve.

The kernel it replaces there, the warp-per-row kernel of :mod:`accelkit_cuda.cuda_fused`, gives
each query row a warp and each key of a tile a lane: every multiply-add of ``Q K^T`` reads two
operands from shared memory, and every one of ``P V`` one. On the H100 run of 2026-11-27 the
transformer block's causal f32 attention ([4, 8, 256, 64]) took 198 us there against 31 us for
PyTorch's memory-efficient kernel (CUTLASS, SIMT too). This one tiles the work in registers as a
SIMT GEMM does, FlashAttention-style (the scores never leave the chip):

- a block of 256 threads owns 64 query rows; K and V stream through shared memory in tiles of
  64 keys; the threads form a 16 x 16 grid, thread ``(ty, tx)`` owning rows ``4 ty .. 4 ty + 3``
  and, of a tile's scores, keys ``tx + 16 j`` (j < 4), of the output, dims ``tx + 16 j``
  (j < D / 16);
- ``S = Q K^T``: each step over the head dim loads 4 values of Q and 4 of K (rows padded by
  one float: no bank conflict) for 16 multiply-adds;
- the online softmax of each row runs on the 16 threads that hold it (a half warp: maxima and
  sums by ``__shfl_xor_sync``), in registers; the probabilities go to shared memory once;
- ``O += P V``: each key loads 4 probabilities and D / 16 values of V for 4 D / 16
  multiply-adds.

Semantics are the warp-per-row kernel's: ``q`` scaled before the products, causal aligned to
the last key (row ``i`` sees keys ``j <= i + Sk - Sq``), grouped KV heads (query head ``h``
reads KV head ``h // (H / Hkv)``), a row that sees no key is zero, a NaN score makes its row
NaN. It covers float32 with ``head_dim == head_dim_v`` of 16, 32, 64 or 128 (:data:`HEAD_DIMS`);
a block's shared memory (:func:`shared_bytes`) is 29-115 kB (28.75-112.75 KiB), above the
default 48 KiB from head dim 64 on, so a variant runs only where the device allows its size (the limit is raised
when it is loaded). With ``seq_major`` it reads q, k, v stored [B, S, H, D] and writes out so
(``attention(..., layout="bshd")``: a projection's output, no permute).

Like the tensor-core kernel it is never trusted before it passed an on-device check (a child
process runs every variant on odd lengths, several tiles, grouped heads and a causal mask with
rows that see no key, against a float64 reference; the verdict is stored, keyed by the binary
and the device: :func:`accelkit_cuda.flash_attention.verdict`). ``ACCELKIT_CUDA_FLASH_SIMT=0``
switches it off (``recheck`` runs the check again). **Unverified on a GPU** as written: its
text is compiled by NVRTC and run on the host (one OS thread per CUDA thread, a barrier for
``__syncthreads``, shuffles through a per-warp exchange) against the same reference in the
GPU-free tests (``tests/test_flash_simt.py``); its speed is the next GPU run's to measure.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit.dtype import DType
from accelkit.sdk import env_str
from accelkit_cuda.driver import Attr
from accelkit_cuda.flash_attention import (
    GatedKernel,
    check_cases,
    check_child,
    reference,
    stored,
    stored_shape,
)

if TYPE_CHECKING:
    from accelkit.tensor import Tensor

__all__ = [
    "BLOCK_M",
    "BLOCK_N",
    "CHECK_SHAPES",
    "HEAD_DIMS",
    "SOURCE",
    "THREADS",
    "SimtAttention",
    "geometry",
    "kernel_name",
    "kernel_names",
    "launch_args",
    "shared_bytes",
    "tolerance",
]

BLOCK_M = 64  # query rows a block (must match SM in SOURCE)
BLOCK_N = 64  # keys a tile (SN)
THREADS = 256
HEAD_DIMS = (16, 32, 64, 128)
_GRID_Y_MAX = 65535
#: (batch, heads, kv_heads, seq_q, seq_k, causal) of the on-device check: lengths that are no
#: multiple of a tile, several tiles, grouped heads, more queries than keys under the causal
#: mask (rows that see no key), a single row.
CHECK_SHAPES: tuple[tuple[int, int, int, int, int, bool], ...] = (
    (1, 4, 2, 70, 133, False),
    (2, 2, 1, 131, 131, True),
    (1, 2, 2, 97, 45, True),
    (1, 1, 1, 1, 9, False),
)


def kernel_name(head_dim: int) -> str:
    """The entry point of one variant, e.g. ``simt_attention_f32_d64``."""
    return f"simt_attention_f32_d{head_dim}"


def kernel_names() -> list[str]:
    return [kernel_name(d) for d in HEAD_DIMS]


def shared_bytes(head_dim: int) -> int:
    """Dynamic shared memory of one block: Q's and K's tiles (rows padded by one float), V's
    tile, and the tile's probabilities (rows padded by one float)."""
    return (2 * BLOCK_M * (head_dim + 1) + BLOCK_N * head_dim + BLOCK_M * (BLOCK_N + 1)) * 4


def geometry(
    batch: int, heads: int, seq_q: int, head_dim: int
) -> tuple[tuple[int, int], tuple[int], int]:
    """``(grid, block, shared_bytes)`` of one launch: a block per 64 query rows of each (batch,
    head) pair."""
    return ((seq_q + BLOCK_M - 1) // BLOCK_M, batch * heads), (THREADS,), shared_bytes(head_dim)


def launch_args(
    q: Any, k: Any, v: Any, out: Any, heads: int, kv_heads: int, seq_q: int, seq_k: int,
    scale: float, causal: bool, seq_major: bool = False,
) -> tuple[Any, ...]:  # fmt: skip
    """The kernel's arguments in its parameter order (pointers or tensors as given);
    ``seq_major``: q, k, v and out are stored [B, S, H, D] (``attention_bshd``)."""
    return (
        q, k, v, out, np.int32(heads), np.int32(kv_heads), np.int64(seq_q), np.int64(seq_k),
        np.float32(scale), np.int32(bool(causal)), np.int32(bool(seq_major)),
    )  # fmt: skip


def tolerance(seq_k: int, head_dim: int, score_bound: float) -> float:
    """The largest error of one output element relative to ``max |v|``, for scores whose terms
    sum in magnitude to at most ``score_bound`` (``max over rows and keys of scale * sum_d
    |q_d k_d|``).

    With u = 2^-24 (f32's unit roundoff): q times the scale is rounded once and each score is a
    sum of ``head_dim`` products, so a score is off by at most ``(head_dim + 2) u
    score_bound``; each probability, ``exp`` of a score less the row's maximum, then moves by a
    relative ``2 (head_dim + 2) u score_bound`` plus ``exp``'s 2 ulp, so the weighted mean ``P V
    / sum P`` moves by twice that times ``max |v|``; the sums over ``seq_k`` keys (of P and of P
    V, and the rescaling of each tile's) add ``(seq_k + 8) u`` each. Twice the total, for
    safety; a wrong index, mask or reduction is off by O(1)."""
    u = 2.0**-24
    per_score = (head_dim + 2) * u * score_bound
    return 2.0 * (2.0 * (2.0 * per_score + 2.0 * u) + 2.0 * (seq_k + 8) * u)


class SimtAttention(GatedKernel):
    """The register-tiled f32 kernel of one backend: compiled, checked on the device (a child,
    the verdict stored) and loaded by :meth:`load`; :meth:`refusal` says whether a call can
    take it. ``enabled = False`` routes f32 attention to the warp-per-row kernel."""

    async def load(self) -> None:
        """Compile (a worker thread; cached on disk), check in a child, load on the submission
        thread (raising each variant's shared-memory limit). Never raises: a failure leaves the
        warp-per-row kernel in use and says why."""
        switch = env_str("ACCELKIT_CUDA_FLASH_SIMT")
        if switch in ("0", "off", "false", "no"):
            self.state, self.reason = "unavailable", "switched off (ACCELKIT_CUDA_FLASH_SIMT=0)"
            return
        if self.lacks_shared_memory(shared_bytes(min(HEAD_DIMS))):
            return
        optin = self._props.attr(Attr.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        await self.compile_check_load(
            SOURCE, "accelkit_flash_simt.cu", "accelkit_cuda.flash_simt", "flash-simt",
            switch == "recheck", lambda binary: _load(binary, optin),
        )  # fmt: skip

    def refusal(self, q: Tensor, k: Tensor, v: Tensor, seq_major: bool = False) -> str | None:
        """None when the kernel takes ``attention(q, k, v)`` without a mask (stored
        [B, S, H, D] with ``seq_major``), else why not."""
        gate = self.gate_refusal("f32 tiled kernel")
        if gate is not None:
            return gate
        qs, ks, vs = (stored_shape(t.shape, seq_major) for t in (q, k, v))
        return refusal(q.dtype, qs, ks, vs, set(self._functions))

    def function(self, head_dim: int) -> Any:
        """The loaded variant (a dict lookup)."""
        return self._functions[kernel_name(head_dim)]


def refusal(
    dtype: DType, q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...], loaded: set[str]
) -> str | None:
    """Why the kernel cannot take attention of these shapes (None when it can); ``loaded``:
    the variants the device holds (those whose shared memory it allows)."""
    if dtype is not DType.F32:
        return f"the f32 tiled kernel takes f32, not {dtype.value}"
    d, dv = q[3], v[3]
    if d != dv or d not in HEAD_DIMS:
        return f"the f32 tiled kernel takes head_dim == head_dim_v in {HEAD_DIMS}; got {d}/{dv}"
    if kernel_name(d) not in loaded:
        return f"the device's shared memory is too small for head_dim {d} ({shared_bytes(d)} B)"
    if q[2] == 0 or k[2] == 0 or q[0] * q[1] == 0:
        return "empty attention"
    if q[0] * q[1] > _GRID_Y_MAX:
        return f"batch * heads > {_GRID_Y_MAX}"
    return None


def main(argv: list[str]) -> int:
    """The child of the on-device check: ``python -m accelkit_cuda.flash_simt DEVICE CUBIN``."""
    from accelkit_cuda.driver import driver

    optin = driver().props(int(argv[1])).attr(Attr.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
    return check_child(argv, lambda binary: _load(binary, optin), _check)


def _load(binary: bytes, optin: int) -> dict[str, Any]:
    """On the submission thread (or the check's child): load the module, look up each variant
    whose shared memory the device allows and raise its limit above the default 48 KiB."""
    import cupy as cp

    module = cp.cuda.function.Module()
    module.load(binary)
    functions: dict[str, Any] = {"": module}
    driver = cp.cuda.driver
    attr = getattr(driver, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8)
    for d in HEAD_DIMS:
        need = shared_bytes(d)
        if need > optin:
            continue
        fn = module.get_function(kernel_name(d))
        if need > 48 * 1024:
            driver.funcSetAttribute(fn.ptr, attr, need)
        functions[kernel_name(d)] = fn
    return functions


def score_bound(q: np.ndarray[Any, Any], k: np.ndarray[Any, Any], scale: float) -> float:
    """``max scale * sum_d |q_d k_d|`` over rows and keys (grouped heads as the kernel reads
    them): the magnitude :func:`tolerance` takes."""
    h, hk = q.shape[1], k.shape[1]
    kk = np.repeat(np.abs(k.astype(np.float64)), h // hk, axis=1)
    return float(np.max(np.abs(q.astype(np.float64)) @ np.swapaxes(kk, -1, -2))) * abs(scale)


def _check(functions: dict[str, Any]) -> str | None:
    """Every loaded variant on :data:`CHECK_SHAPES` against the float64 reference (a private
    stream, synchronized). Returns None, or the first failure."""
    import cupy as cp

    if not any(kernel_name(d) in functions for d in HEAD_DIMS):  # nothing checked: no pass
        return "no variant fits the device's shared memory"
    rng = np.random.default_rng(29)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for d in HEAD_DIMS:
            if kernel_name(d) not in functions:
                continue
            for (b, h, hk, sq, sk, causal), major in check_cases(CHECK_SHAPES):
                q, k, v = (
                    rng.standard_normal((b, n, s, d)).astype(np.float32)
                    for n, s in ((h, sq), (hk, sk), (hk, sk))
                )
                # all must be written
                out = cp.full(stored_shape((b, h, sq, d), major), np.nan, cp.float32)
                scale = 1.0 / math.sqrt(d)
                grid, block, smem = geometry(b, h, sq, d)
                dq, dk, dv = (cp.asarray(stored(x, major)) for x in (q, k, v))
                args = launch_args(dq, dk, dv, out, h, hk, sq, sk, scale, causal, major)
                functions[kernel_name(d)](grid, block, args, shared_mem=smem)
                failure = compare(stored(out.get(), major), q, k, v, scale, causal)
                if failure is not None:
                    layout = " seq-major" if major else ""
                    return (
                        f"{kernel_name(d)} on B{b} H{h}/{hk} Sq{sq} Sk{sk} causal={causal}"
                        f"{layout}: {failure}"
                    )
    stream.synchronize()
    return None


def compare(
    got: np.ndarray[Any, Any], q: np.ndarray[Any, Any], k: np.ndarray[Any, Any],
    v: np.ndarray[Any, Any], scale: float, causal: bool,
) -> str | None:  # fmt: skip
    """None when ``got`` is the float64 reference within :func:`tolerance`, else how far off."""
    ref = reference(q, k, v, scale, causal)
    bound = tolerance(k.shape[2], q.shape[3], score_bound(q, k, scale)) * float(np.max(np.abs(v)))
    err = np.abs(got.astype(np.float64) - ref)
    if np.all(err <= bound):  # NaN fails too
        return None
    worst = float(np.nanmax(err)) if np.isfinite(err).any() else math.nan
    return f"max error {worst:.3g} > {bound:.3g}"


SOURCE = r"""
// Register-tiled f32 attention (see accelkit_cuda/flash_simt.py). q [B, H, Sq, D],
// k and v [B, Hkv, Sk, D], out [B, H, Sq, D], contiguous f32 (head-major); with seq_major
// the same tensors are stored [B, Sq, H, D] and [B, Sk, Hkv, D] (a projection's output
// reshaped to heads), read and written in place. Grid (ceil(Sq / SM), B * H), block 256,
// dynamic shared memory (2 SM (D + 1) + SN D + SM (SN + 1)) 4 bytes.
#ifndef DYNAMIC_SHARED
#define DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#endif
#define NEG_INF __int_as_float((int)0xff800000)
#define SM 64
#define SN 64
#define SP (SN + 1)

template <int D> __device__ __forceinline__ void simt_attention(
        const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
        float* __restrict__ out, int H, int Hkv, long long Sq, long long Sk, float scale,
        int causal, int seq_major) {
    const int NJ = D / 16;  // output dims a thread
    const int QP = D + 1;   // padded row of Q's and K's tiles
    DYNAMIC_SHARED(float, smem);
    float* Qs = smem;          // [SM][QP]
    float* Ks = Qs + SM * QP;  // [SN][QP]
    float* Vs = Ks + SN * QP;  // [SN][D]
    float* Ps = Vs + SN * D;   // [SM][SP]
    const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
    const long long bh = blockIdx.y;
    const long long b = bh / H, h = bh % H, hk = h / (H / Hkv);
    // The last rows first: under a causal mask they see the most keys (the longest blocks
    // start first, the short ones fill in behind them).
    const long long m0 = (long long)(gridDim.x - 1 - blockIdx.x) * SM;
    // A row's start and the stride between rows: D apart head-major, a whole token's heads
    // apart sequence-major.
    const long long qrs = seq_major ? (long long)H * D : D;
    const long long krs = seq_major ? (long long)Hkv * D : D;
    const long long qoff = seq_major ? (b * Sq * H + h) * D : bh * Sq * D;
    const long long koff = seq_major ? (b * Sk * Hkv + hk) * D : (b * Hkv + hk) * Sk * D;
    const float* qb = q + qoff;
    const float* kb = k + koff;
    const float* vb = v + koff;
    for (int i = tid; i < SM * D; i += 256) {
        int r = i / D, c = i % D;
        long long row = m0 + r;
        Qs[r * QP + c] = row < Sq ? qb[row * qrs + c] * scale : 0.0f;
    }
    const long long offset = Sk - Sq;
    const long long last = (Sq - 1 < m0 + SM - 1) ? Sq - 1 : m0 + SM - 1;
    long long kend = Sk;
    if (causal && last + offset + 1 < kend) kend = last + offset + 1;
    float m[4], l[4], acc[4][NJ];
    int nan_row[4];
    for (int i = 0; i < 4; ++i) {
        m[i] = NEG_INF;
        l[i] = 0.0f;
        nan_row[i] = 0;
        for (int j = 0; j < NJ; ++j) acc[i][j] = 0.0f;
    }
    for (long long t0 = 0; t0 < kend; t0 += SN) {
        __syncthreads();  // the last tile's K, V and P are read; Q is written
        for (int i = tid; i < SN * D; i += 256) {
            int n = i / D, c = i % D;
            long long key = t0 + n;
            bool in = key < Sk;
            Ks[n * QP + c] = in ? kb[key * krs + c] : 0.0f;
            Vs[n * D + c] = in ? vb[key * krs + c] : 0.0f;
        }
        __syncthreads();
        float s[4][4];
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) s[i][j] = 0.0f;
#pragma unroll 8
        for (int d = 0; d < D; ++d) {
            float a[4], w[4];
            for (int i = 0; i < 4; ++i) a[i] = Qs[(ty * 4 + i) * QP + d];
            for (int j = 0; j < 4; ++j) w[j] = Ks[(tx + 16 * j) * QP + d];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) s[i][j] = fmaf(a[i], w[j], s[i][j]);
        }
        for (int i = 0; i < 4; ++i) {
            const long long row = m0 + ty * 4 + i;
            float mx = NEG_INF;
            int nan_seen = 0;
            for (int j = 0; j < 4; ++j) {
                const long long key = t0 + tx + 16 * j;
                const bool ok = key < kend && (!causal || key <= row + offset);
                if (!ok) s[i][j] = NEG_INF;
                else if (isnan(s[i][j])) nan_seen = 1;
                mx = fmaxf(mx, s[i][j]);  // (a NaN is skipped: nan_seen keeps it)
            }
            // The row's 16 threads are a half warp: lanes that differ in the low four bits.
            for (int o = 8; o > 0; o >>= 1) {
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                nan_seen |= __shfl_xor_sync(0xffffffffu, nan_seen, o);
            }
            nan_row[i] |= nan_seen;
            const float mn = fmaxf(m[i], mx);
            float corr = 1.0f, sum = 0.0f;
            if (mn == NEG_INF) {  // nothing visible to this row yet
                for (int j = 0; j < 4; ++j) s[i][j] = 0.0f;
            } else {
                corr = expf(m[i] - mn);  // 0 while m[i] is -inf
                for (int j = 0; j < 4; ++j) {
                    const float p = s[i][j] == NEG_INF ? 0.0f : expf(s[i][j] - mn);
                    s[i][j] = p;
                    sum += p;
                }
            }
            for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            l[i] = l[i] * corr + sum;
            for (int j = 0; j < NJ; ++j) acc[i][j] *= corr;
            m[i] = mn;
            for (int j = 0; j < 4; ++j) Ps[(ty * 4 + i) * SP + tx + 16 * j] = s[i][j];
        }
        __syncthreads();
#pragma unroll 4
        for (int n = 0; n < SN; ++n) {
            float p[4], w[NJ];
            for (int i = 0; i < 4; ++i) p[i] = Ps[(ty * 4 + i) * SP + n];
            for (int j = 0; j < NJ; ++j) w[j] = Vs[n * D + tx + 16 * j];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < NJ; ++j) acc[i][j] = fmaf(p[i], w[j], acc[i][j]);
        }
    }
    for (int i = 0; i < 4; ++i) {
        const long long row = m0 + ty * 4 + i;
        if (row >= Sq) continue;
        float* o = out + qoff + row * qrs;
        for (int j = 0; j < NJ; ++j)
            o[tx + 16 * j] = nan_row[i] ? __int_as_float(0x7fffffff)
                                        : (l[i] > 0.0f ? acc[i][j] / l[i] : 0.0f);
    }
}

// BLOCKS: the blocks an SM should hold (ptxas keeps the registers to 65536 / (256 BLOCKS)):
// two at head dims 16, 32 and 64 (three spill: sm_80 at 32, sm_90 at 16), one at 128 (its
// shared memory allows one).
#define SIMT_ATTENTION(DIM, BLOCKS)                                                           \
extern "C" __global__ void __launch_bounds__(256, BLOCKS) simt_attention_f32_d##DIM(          \
        const float* q, const float* k, const float* v, float* out, int H, int Hkv,           \
        long long Sq, long long Sk, float scale, int causal, int seq_major)                   \
    { simt_attention<DIM>(q, k, v, out, H, Hkv, Sq, Sk, scale, causal, seq_major); }

SIMT_ATTENTION(16, 2)
SIMT_ATTENTION(32, 2)
SIMT_ATTENTION(64, 2)
SIMT_ATTENTION(128, 1)
"""


if __name__ == "__main__":
    sys.exit(main(sys.argv))
