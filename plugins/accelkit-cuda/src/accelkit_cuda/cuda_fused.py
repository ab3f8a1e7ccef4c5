"""CUDA C++ sources of the fused kernels, compiled with NVRTC (one program for all of them).

Every kernel is a template over the storage type (``float``, ``f16`` bits, ``bf16`` bits,
``double``) with F32 accumulation for F16 and BF16 (F64 for F64), instantiated as ``extern "C"``
entry points named ``<op>_<f32|f16|f64|bf16>``. The half types are their bits with explicit
conversions rather than ``cuda_fp16.h``/``cuda_bf16.h``: NVRTC has no include path on a machine
with only its library (the test suite's), and the program must compile there and for every
architecture (BF16 rounds to nearest even in integer arithmetic, no sm_80 instruction).
Kernels that can meet bad input on the device (a block id out of range)
set an error flag ``err[0]`` (atomically: the first one wins) with the offending value in
``err[1]``; the launcher reads it back when the result is awaited.

The attention kernels are flash-style: each warp owns one query row and streams the keys in
tiles of 32 through shared memory with an online softmax, so no score matrix is ever stored.
They run on the CUDA cores (no tensor-core MMA yet): correct and memory-lean, not the fastest.
"""

from __future__ import annotations

__all__ = ["DTYPE_SUFFIX", "FLASH_TILE", "SOURCE", "flash_shared_bytes", "kernel_names"]

FLASH_TILE = 32
#: Query rows (warps) a block: each K/V tile a block loads serves this many rows. 4 on the H100
#: run of 2026-11-27 (the block's causal f32 attention, [4, 8, 256, 64]: 200 us where PyTorch's
#: memory-efficient kernel took 31): the tile loads, with an index division an element, were
#: most of the kernel's instructions. Must match ``ROWS`` in SOURCE (a test checks).
FLASH_ROWS = 16
MAX_DV = 256  # head_dim of V the register accumulators hold

DTYPE_SUFFIX = {"float32": "f32", "float16": "f16", "float64": "f64", "bfloat16": "bf16"}

_OPS = (
    "rms_norm", "rms_norm_residual", "layer_norm", "softmax_rows", "rotary", "silu_mul",
    "gelu_erf", "gelu_tanh", "flash_attention", "paged_attention", "qlinear_q8_0",
    "qlinear_q4_0", "argmax_rows",
)  # fmt: skip


def kernel_names() -> list[str]:
    return [f"{op}_{s}" for op in _OPS for s in DTYPE_SUFFIX.values()]


def flash_shared_bytes(d: int, dv: int, itemsize: int) -> int:
    """Dynamic shared memory of one flash_attention block (accumulator type of ``itemsize``)."""
    return (FLASH_TILE * (d + 1) + FLASH_TILE * dv + FLASH_ROWS * d) * itemsize


SOURCE = r"""
typedef long long i64;

// F16 storage without cuda_fp16.h (NVRTC has no include path on a bare machine): the bits, and
// PTX conversions (round to nearest even on the way down).
struct f16 { unsigned short bits; };
__device__ __forceinline__ float h2f(f16 h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits)); return f;
}
__device__ __forceinline__ f16 f2h(float f) {
    f16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f)); return h;
}

// BF16 storage: the high half of an F32. Widening is exact; narrowing rounds to nearest even
// (NaN stays a quiet NaN), as __float2bfloat16_rn does.
struct bf16 { unsigned short bits; };
__device__ __forceinline__ float b2f(bf16 h) { return __uint_as_float(((unsigned int)h.bits) << 16); }
__device__ __forceinline__ bf16 f2b(float f) {
    unsigned int u = __float_as_uint(f);
    bf16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u) { h.bits = (unsigned short)((u >> 16) | 0x40u); return h; }
    u += 0x7fffu + ((u >> 16) & 1u);
    h.bits = (unsigned short)(u >> 16);
    return h;
}

template <typename T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };

__device__ __forceinline__ float ld(const float* p, i64 i) { return p[i]; }
__device__ __forceinline__ float ld(const f16* p, i64 i) { return h2f(p[i]); }
__device__ __forceinline__ float ld(const bf16* p, i64 i) { return b2f(p[i]); }
__device__ __forceinline__ double ld(const double* p, i64 i) { return p[i]; }
__device__ __forceinline__ void st(float* p, i64 i, float v) { p[i] = v; }
__device__ __forceinline__ void st(f16* p, i64 i, float v) { p[i] = f2h(v); }
__device__ __forceinline__ void st(bf16* p, i64 i, float v) { p[i] = f2b(v); }
__device__ __forceinline__ void st(double* p, i64 i, double v) { p[i] = v; }

__device__ __forceinline__ float neg_inf(float) { return -__int_as_float(0x7f800000); }
__device__ __forceinline__ double neg_inf(double) { return -__longlong_as_double(0x7ff0000000000000LL); }
__device__ __forceinline__ float qnan(float) { return __int_as_float(0x7fc00000); }
__device__ __forceinline__ double qnan(double) { return __longlong_as_double(0x7ff8000000000000LL); }
__device__ __forceinline__ float xexp(float x) { return expf(x); }
__device__ __forceinline__ double xexp(double x) { return exp(x); }

template <typename A> __device__ __forceinline__ A warp_sum(A v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <typename A> __device__ __forceinline__ A warp_max(A v) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
template <typename A> __device__ A block_sum(A v, A* shm) {
    int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (l == 0) shm[w] = v;
    __syncthreads();
    v = (threadIdx.x < nw) ? shm[threadIdx.x] : A(0);
    if (w == 0) v = warp_sum(v);
    if (threadIdx.x == 0) shm[0] = v;
    __syncthreads();
    return shm[0];
}
template <typename A> __device__ A block_max(A v, A* shm) {
    int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (l == 0) shm[w] = v;
    __syncthreads();
    v = (threadIdx.x < nw) ? shm[threadIdx.x] : neg_inf(A(0));
    if (w == 0) v = warp_max(v);
    if (threadIdx.x == 0) shm[0] = v;
    __syncthreads();
    return shm[0];
}

__device__ __forceinline__ void set_error(i64* err, i64 code, i64 value) {
    if (atomicCAS((unsigned long long*)err, 0ull, (unsigned long long)code) == 0ull) err[1] = value;
}

// ---- norms: one block per row -------------------------------------------------------------
template <typename T> __device__ void rms_norm_impl(
        const T* x, const T* w, T* out, i64 d, double eps) {
    typedef typename Acc<T>::type A;
    __shared__ A shm[32];
    const T* xr = x + blockIdx.x * d;
    T* o = out + blockIdx.x * d;
    A s = 0;
    for (i64 i = threadIdx.x; i < d; i += blockDim.x) { A v = ld(xr, i); s += v * v; }
    s = block_sum(s, shm);
    A r = A(1) / sqrt(s / A(d) + A(eps));
    for (i64 i = threadIdx.x; i < d; i += blockDim.x) {
        A v = A(ld(xr, i)) * r;
        if (w) v *= A(ld(w, i));
        st(o, i, v);
    }
}

template <typename T> __device__ void rms_norm_residual_impl(
        const T* x, const T* res, const T* w, T* normed, T* summed, i64 d, double eps) {
    typedef typename Acc<T>::type A;
    i64 base = blockIdx.x * d;
    for (i64 i = threadIdx.x; i < d; i += blockDim.x)
        st(summed + base, i, A(ld(x + base, i)) + A(ld(res + base, i)));
    __syncthreads();  // each thread re-reads only what it wrote; kept for clarity of order
    rms_norm_impl<T>(summed, w, normed, d, eps);
}

template <typename T> __device__ void layer_norm_impl(
        const T* x, const T* w, const T* b, T* out, i64 d, double eps) {
    typedef typename Acc<T>::type A;
    __shared__ A shm[32];
    const T* xr = x + blockIdx.x * d;
    T* o = out + blockIdx.x * d;
    A s = 0;
    for (i64 i = threadIdx.x; i < d; i += blockDim.x) s += A(ld(xr, i));
    A mean = block_sum(s, shm) / A(d);
    A q = 0;
    for (i64 i = threadIdx.x; i < d; i += blockDim.x) { A c = A(ld(xr, i)) - mean; q += c * c; }
    A r = A(1) / sqrt(block_sum(q, shm) / A(d) + A(eps));
    for (i64 i = threadIdx.x; i < d; i += blockDim.x) {
        A v = (A(ld(xr, i)) - mean) * r;
        if (w) v *= A(ld(w, i));
        if (b) v += A(ld(b, i));
        st(o, i, v);
    }
}

template <typename T> __device__ void softmax_rows_impl(const T* x, T* out, i64 d, int log_) {
    typedef typename Acc<T>::type A;
    __shared__ A shm[32];
    const T* xr = x + blockIdx.x * d;
    T* o = out + blockIdx.x * d;
    A m = neg_inf(A(0)), bad = 0;  // bad: a NaN or a +inf in the row (max() skips NaN)
    for (i64 i = threadIdx.x; i < d; i += blockDim.x) {
        A v = A(ld(xr, i));
        m = max(m, v);
        if (isnan(v) || v == -neg_inf(A(0))) bad = 1;
    }
    m = block_max(m, shm);
    bad = block_max(bad, shm);
    if (bad > A(0) || m == neg_inf(A(0))) {  // NaN, +inf or only -inf: the row is NaN
        for (i64 i = threadIdx.x; i < d; i += blockDim.x) st(o, i, qnan(A(0)));
        return;
    }
    A s = 0;
    for (i64 i = threadIdx.x; i < d; i += blockDim.x) s += xexp(A(ld(xr, i)) - m);
    s = block_sum(s, shm);
    A lse = log(s);
    for (i64 i = threadIdx.x; i < d; i += blockDim.x) {
        A z = A(ld(xr, i)) - m;
        st(o, i, log_ ? z - lse : (s > A(0) ? xexp(z) / s : A(0)));
    }
}

// ---- rotary: x [B, H, S, D]; positions [S] or [B, S] (int64) or none (offset + s) --------------
template <typename T> __device__ void rotary_impl(
        const T* x, const i64* pos, const typename Acc<T>::type* inv, T* out,
        i64 B, i64 H, i64 S, i64 D, int pos_batched, i64 offset) {
    typedef typename Acc<T>::type A;
    i64 half = D / 2;
    i64 n = B * H * S * half;
    for (i64 t = blockIdx.x * (i64)blockDim.x + threadIdx.x; t < n; t += (i64)gridDim.x * blockDim.x) {
        i64 i = t % half, r = t / half;  // r = (b * H + h) * S + s
        i64 s = r % S, b = r / (H * S);
        i64 p = pos ? (pos_batched ? pos[b * S + s] : pos[s]) : offset + s;
        A a = A(p) * inv[i];
        A c = cos(a), sn = sin(a);
        A x1 = ld(x, r * D + i), x2 = ld(x, r * D + i + half);
        st(out, r * D + i, x1 * c - x2 * sn);
        st(out, r * D + i + half, x2 * c + x1 * sn);
    }
}

// ---- activations ---------------------------------------------------------------------------------
template <typename T> __device__ void silu_mul_impl(const T* g, const T* u, T* out, i64 n) {
    typedef typename Acc<T>::type A;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        A gv = ld(g, i);
        st(out, i, gv / (A(1) + xexp(-gv)) * A(ld(u, i)));
    }
}
template <typename T> __device__ void gelu_erf_impl(const T* x, T* out, i64 n) {
    typedef typename Acc<T>::type A;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        A v = ld(x, i);
        st(out, i, A(0.5) * v * (A(1) + erf(v * A(0.7071067811865476))));
    }
}
template <typename T> __device__ void gelu_tanh_impl(const T* x, T* out, i64 n) {
    typedef typename Acc<T>::type A;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        A v = ld(x, i);
        A u = A(0.7978845608028654) * (v + A(0.044715) * v * v * v);
        st(out, i, A(0.5) * v * (A(1) + tanh(u)));
    }
}

// ---- flash attention ------------------------------------------------------------------------------
// q [B, H, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv], out [B, H, Sq, Dv]; grid
// (ceil(Sq / ROWS), B * H), block (32 * ROWS); dynamic shared memory flash_shared_bytes().
#define TILE 32
#define ROWS 16
#define MAXC 8
template <typename T> __device__ void flash_impl(
        const T* q, const T* k, const T* v, T* out, int H, int Hkv, i64 Sq, i64 Sk, int D,
        int Dv, double scale, int causal) {
    typedef typename Acc<T>::type A;
    extern __shared__ unsigned char smem_raw[];
    A* Ks = (A*)smem_raw;                 // [TILE][D + 1]
    A* Vs = Ks + TILE * (D + 1);          // [TILE][Dv]
    A* Qs = Vs + TILE * Dv;               // [ROWS][D]
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    i64 bh = blockIdx.y;
    i64 b = bh / H, h = bh % H, hk = h / (H / Hkv);
    i64 row = (i64)blockIdx.x * ROWS + warp;
    bool live = row < Sq;
    const T* qr = q + (bh * Sq + (live ? row : 0)) * D;
    const T* kb = k + (b * Hkv + hk) * Sk * D;
    const T* vb = v + (b * Hkv + hk) * Sk * Dv;
    for (int d = lane; d < D; d += 32) Qs[warp * D + d] = live ? A(ld(qr, d)) * A(scale) : A(0);
    i64 offset = Sk - Sq;
    i64 last_row = min(Sq - 1, (i64)blockIdx.x * ROWS + ROWS - 1);
    i64 kend = causal ? min(Sk, last_row + offset + 1) : Sk;
    A m = neg_inf(A(0)), l = 0, acc[MAXC];
    bool nan_seen = false;  // max() skips NaN: a NaN score must still make the row NaN
    for (int c = 0; c < MAXC; ++c) acc[c] = 0;
    for (i64 t0 = 0; t0 < kend; t0 += TILE) {
        __syncthreads();
        // A warp a key row in turn, its lanes along the row: coalesced, no index division.
        for (int j = warp; j < TILE; j += ROWS) {
            bool in = t0 + j < Sk;
            const T* kr = kb + (t0 + j) * D;
            const T* vr = vb + (t0 + j) * Dv;
            for (int d = lane; d < D; d += 32) Ks[j * (D + 1) + d] = in ? A(ld(kr, d)) : A(0);
            for (int d = lane; d < Dv; d += 32) Vs[j * Dv + d] = in ? A(ld(vr, d)) : A(0);
        }
        __syncthreads();
        if (!live) continue;
        i64 key = t0 + lane;
        bool ok = key < kend && (!causal || key <= row + offset);
        A s = neg_inf(A(0));
        if (ok) {
            s = 0;
            for (int d = 0; d < D; ++d) s += Qs[warp * D + d] * Ks[lane * (D + 1) + d];
        }
        nan_seen |= __any_sync(0xffffffffu, ok && isnan(s)) != 0;
        A mt = warp_max(s);
        A mn = max(m, mt);
        if (mn == neg_inf(A(0))) continue;  // nothing visible to this row yet
        A p = ok ? xexp(s - mn) : A(0);
        A corr = xexp(m - mn);
        l = l * corr + warp_sum(p);
        for (int c = 0; c < MAXC; ++c) acc[c] *= corr;
        for (int j = 0; j < TILE; ++j) {
            A pj = __shfl_sync(0xffffffffu, p, j);
            if (pj != A(0))
                for (int c = 0; c < MAXC; ++c) {
                    int d = lane + 32 * c;
                    if (d < Dv) acc[c] += pj * Vs[j * Dv + d];
                }
        }
        m = mn;
    }
    if (!live) return;
    T* o = out + (bh * Sq + row) * Dv;
    for (int c = 0; c < MAXC; ++c) {
        int d = lane + 32 * c;
        if (d < Dv) st(o, d, nan_seen ? qnan(A(0)) : (l > A(0) ? acc[c] / l : A(0)));
    }
}

// ---- paged attention (one query per sequence and head) --------------------------------------------
// q [B, H, D]; caches [NB, BS, Hkv, D]; block_table [B, MB] and lens [B] int64; out [B, H, D].
// One warp per (b, h). err: 1 = context length out of range, 2 = block id out of range.
template <typename T> __device__ void paged_impl(
        const T* q, const T* kc, const T* vc, const i64* table, const i64* lens, T* out,
        int H, int Hkv, int D, i64 NB, int BS, int MB, double scale, i64* err) {
    typedef typename Acc<T>::type A;
    int lane = threadIdx.x & 31;
    i64 bh = blockIdx.x, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    const T* qr = q + bh * D;
    T* o = out + bh * D;
    i64 n = lens[b];
    if (n < 0 || n > (i64)MB * BS) {
        if (lane == 0 && h == 0) set_error(err, 1, n);
        n = 0;
    }
    A m = neg_inf(A(0)), l = 0, acc[MAXC];
    bool nan_seen = false;  // max() skips NaN: a NaN score must still make the row NaN
    for (int c = 0; c < MAXC; ++c) acc[c] = 0;
    for (i64 t0 = 0; t0 < n; t0 += 32) {
        i64 key = t0 + lane;
        bool ok = key < n;
        i64 rowoff = 0;
        if (ok) {
            i64 blk = table[b * MB + key / BS];
            if (blk < 0 || blk >= NB) {
                set_error(err, 2, blk);
                ok = false;
            } else {
                rowoff = ((blk * BS + key % BS) * Hkv + hk) * D;
            }
        }
        A s = neg_inf(A(0));
        if (ok) {
            s = 0;
            for (int d = 0; d < D; ++d) s += A(ld(qr, d)) * A(ld(kc, rowoff + d));
            s *= A(scale);
        }
        nan_seen |= __any_sync(0xffffffffu, ok && isnan(s)) != 0;
        A mn = max(m, warp_max(s));
        if (mn == neg_inf(A(0))) continue;
        A p = ok ? xexp(s - mn) : A(0);
        A corr = xexp(m - mn);
        l = l * corr + warp_sum(p);
        for (int c = 0; c < MAXC; ++c) acc[c] *= corr;
        for (int j = 0; j < 32; ++j) {
            A pj = __shfl_sync(0xffffffffu, p, j);
            i64 rj = __shfl_sync(0xffffffffu, rowoff, j);
            if (pj != A(0))
                for (int c = 0; c < MAXC; ++c) {
                    int d = lane + 32 * c;
                    if (d < D) acc[c] += pj * A(ld(vc, rj + d));
                }
        }
        m = mn;
    }
    for (int c = 0; c < MAXC; ++c) {
        int d = lane + 32 * c;
        if (d < D) st(o, d, nan_seen ? qnan(A(0)) : (l > A(0) ? acc[c] / l : A(0)));
    }
}

// ---- quantized linear: out[m, n] = sum_k x[m, k] * w[n, k] + bias[n] ------------------------------
// One warp per (m, n); each lane takes whole 32-element quantization blocks. scales are f32
// (converted by the launcher; the integer times the scale is exact in f32 as on the host).
template <typename T> __device__ void qlinear_impl(
        const T* x, const signed char* q8, const unsigned char* q4, const float* scales,
        const T* bias, T* out, i64 M, i64 N, i64 K) {
    typedef typename Acc<T>::type A;
    int lane = threadIdx.x & 31;
    i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (warp >= M * N) return;
    i64 mi = warp / N, ni = warp % N;
    i64 nb = K / 32;
    const T* xr = x + mi * K;
    A s = 0;
    for (i64 blk = lane; blk < nb; blk += 32) {
        A sc = scales[ni * nb + blk];
        A part = 0;
        if (q8) {
            const signed char* wq = q8 + ni * K + blk * 32;
            for (int j = 0; j < 32; ++j) part += A(ld(xr, blk * 32 + j)) * (A(wq[j]) * sc);
        } else {
            const unsigned char* wq = q4 + ni * (K / 2) + blk * 16;
            for (int j = 0; j < 16; ++j) {
                int byte = wq[j];
                part += A(ld(xr, blk * 32 + j)) * (A((byte & 15) - 8) * sc);
                part += A(ld(xr, blk * 32 + j + 16)) * (A((byte >> 4) - 8) * sc);
            }
        }
        s += part;
    }
    s = warp_sum(s);
    if (lane == 0) st(out, mi * N + ni, s + (bias ? A(ld(bias, ni)) : A(0)));
}

// ---- argmax over rows (NumPy's rule: the first NaN, else the first maximum) ---------------------
template <typename A> __device__ __forceinline__ bool better(A v, i64 i, A bv, i64 bi) {
    bool vn = v != v, bn = bv != bv;
    if (vn != bn) return vn;
    if (!vn && v != bv) return v > bv;
    return i < bi;
}
template <typename T> __device__ void argmax_impl(const T* x, i64* out, i64 d) {
    typedef typename Acc<T>::type A;
    __shared__ A sv[1024];
    __shared__ i64 si[1024];
    const T* xr = x + blockIdx.x * d;
    A best = neg_inf(A(0));
    i64 bi = d;  // "none yet": loses every tie
    for (i64 i = threadIdx.x; i < d; i += blockDim.x) {
        A v = ld(xr, i);
        if (better(v, i, best, bi)) { best = v; bi = i; }
    }
    sv[threadIdx.x] = best;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s && better(sv[threadIdx.x + s], si[threadIdx.x + s], sv[threadIdx.x],
                                      si[threadIdx.x])) {
            sv[threadIdx.x] = sv[threadIdx.x + s];
            si[threadIdx.x] = si[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = si[0] < d ? si[0] : 0;
}

#define INSTANTIATE(T, S)                                                                        \
extern "C" __global__ void rms_norm_##S(const T* x, const T* w, T* o, i64 d, double eps)        \
    { rms_norm_impl<T>(x, w, o, d, eps); }                                                        \
extern "C" __global__ void rms_norm_residual_##S(const T* x, const T* r, const T* w, T* n,      \
        T* s, i64 d, double eps) { rms_norm_residual_impl<T>(x, r, w, n, s, d, eps); }           \
extern "C" __global__ void layer_norm_##S(const T* x, const T* w, const T* b, T* o, i64 d,      \
        double eps) { layer_norm_impl<T>(x, w, b, o, d, eps); }                                  \
extern "C" __global__ void softmax_rows_##S(const T* x, T* o, i64 d, int log_)                  \
    { softmax_rows_impl<T>(x, o, d, log_); }                                                      \
extern "C" __global__ void rotary_##S(const T* x, const i64* p, const Acc<T>::type* inv, T* o,  \
        i64 B, i64 H, i64 S_, i64 D, int pb, i64 off)                                            \
    { rotary_impl<T>(x, p, inv, o, B, H, S_, D, pb, off); }                                       \
extern "C" __global__ void silu_mul_##S(const T* g, const T* u, T* o, i64 n)                    \
    { silu_mul_impl<T>(g, u, o, n); }                                                             \
extern "C" __global__ void gelu_erf_##S(const T* x, T* o, i64 n) { gelu_erf_impl<T>(x, o, n); } \
extern "C" __global__ void gelu_tanh_##S(const T* x, T* o, i64 n) { gelu_tanh_impl<T>(x, o, n); }\
extern "C" __global__ void flash_attention_##S(const T* q, const T* k, const T* v, T* o, int H, \
        int Hkv, i64 Sq, i64 Sk, int D, int Dv, double scale, int causal)                        \
    { flash_impl<T>(q, k, v, o, H, Hkv, Sq, Sk, D, Dv, scale, causal); }                          \
extern "C" __global__ void paged_attention_##S(const T* q, const T* kc, const T* vc,            \
        const i64* table, const i64* lens, T* o, int H, int Hkv, int D, i64 NB, int BS, int MB,  \
        double scale, i64* err)                                                                   \
    { paged_impl<T>(q, kc, vc, table, lens, o, H, Hkv, D, NB, BS, MB, scale, err); }             \
extern "C" __global__ void qlinear_q8_0_##S(const T* x, const signed char* q,                   \
        const float* sc, const T* bias, T* o, i64 M, i64 N, i64 K)                               \
    { qlinear_impl<T>(x, q, nullptr, sc, bias, o, M, N, K); }                                     \
extern "C" __global__ void qlinear_q4_0_##S(const T* x, const unsigned char* q,                 \
        const float* sc, const T* bias, T* o, i64 M, i64 N, i64 K)                               \
    { qlinear_impl<T>(x, nullptr, q, sc, bias, o, M, N, K); }                                     \
extern "C" __global__ void argmax_rows_##S(const T* x, i64* o, i64 d) { argmax_impl<T>(x, o, d); }

INSTANTIATE(float, f32)
INSTANTIATE(f16, f16)
INSTANTIATE(double, f64)
INSTANTIATE(bf16, bf16)
"""
