"""Same-dtype binary elementwise ops as raw NVRTC kernels: the short launch path of small ops.

A 64x64 ``add`` through CuPy's ufunc costs the submission thread a CuPy array for the output
(an ``UnownedMemory``, a ``MemoryPointer``, an ``ndarray``) and the ufunc's dispatch (dtype
resolution, broadcasting, its kernel cache); on a GPU that work is most of the host time per
small op, and it competes for the GIL with the loop's thread. Here the same op is one kernel
launch on raw pointers: the kernel function is looked up once per (op, dtype), the grid is
computed when the op is submitted, and the launch packs four arguments.

Covered: ``add sub mul maximum minimum`` of two tensors of one float dtype (F16, BF16, F32, F64)
and one shape, the commonest small ops. F16 and BF16 are computed in F32 and rounded once (for
one add, subtract or multiply this is the correctly rounded result); ``maximum``/``minimum``
propagate NaN as NumPy and CuPy do. Everything else (broadcasting, scalars, mixed dtypes) takes
CuPy's path, as before.

The same program holds the one-launch kernels of the float unary ops (:data:`UNARY_OPS`, same
dtype in and out) and of the row ops over the last axis (:data:`ROW_OPS`: softmax,
log_softmax, layer_norm, rms_norm; one block per row, F32 accumulation, F64 for F64, the
special values of ``cupy_tensor.softmax_rows`` and the composed norms), where CuPy composed up
to a dozen launches.

And ``permute`` of up to four dims, any dtype of 1, 2, 4 or 8 bytes, as one copy kernel
(:data:`PERMUTE_SOURCE`), where ``cupy.copyto`` of a transposed view cost the submission thread
60-100 us a call on an H100 host.

The program compiles on a thread of its own from the first such op on (from the disk cache:
milliseconds; cold: about a second) and loads on the submission thread; until then, or if
NVRTC is missing, every op takes CuPy's path. **Unmeasured on a GPU** when written
(issue 29): the kernels compile in the GPU-free tests, the launch has not run on a device.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from accelkit.dtype import DType
from accelkit_cuda.nvrtc import RawProgram

if TYPE_CHECKING:
    from accelkit_cuda.backend import CUDABackend

__all__ = [
    "BIAS_DTYPES", "BLOCK", "HALF_IO", "OPS", "PERMUTE_CORE", "PERMUTE_RANK", "PERMUTE_SOURCE",
    "ROW_OPS", "SOURCE", "UNARY_OPS", "ElementwiseProgram", "bias_kernel_name", "grid_for",
    "kernel_name", "permute_args", "permute_kernel_name", "row_block", "row_kernel_name",
    "unary_kernel_name",
]  # fmt: skip


#: Threads per block of the elementwise kernels.
BLOCK = 256
#: Blocks at most in a launch: a grid-stride loop covers the rest.
_MAX_BLOCKS = 65535 * 8

#: op -> the expression of ``a`` and ``b`` (both of the accumulation type) it computes.
OPS: dict[str, str] = {
    "add": "a + b",
    "sub": "a - b",
    "mul": "a * b",
    # NaN in either operand gives NaN (NumPy's maximum and minimum, not fmax/fmin).
    "maximum": "(a != a || a > b) ? a : b",
    "minimum": "(a != a || a < b) ? a : b",
}
#: Float unary op -> its expression of ``a`` (the accumulation type; ``{f}`` is ``f`` for the
#: F32 math functions, empty for F64), as cupy_tensor.unary composes it from CuPy ufuncs.
UNARY_OPS: dict[str, str] = {
    "gelu": "(acc)0.5 * a * ((acc)1 + erf{f}(a * (acc)0.7071067811865476))",
    "gelu_tanh": (
        "(acc)0.5 * a * ((acc)1 + tanh{f}((acc)0.7978845608028654 * (a + (acc)0.044715 * a * a * a)))"
    ),
    "silu": "a / ((acc)1 + exp{f}(-a))",
    "sigmoid": "(acc)1 / ((acc)1 + exp{f}(-a))",
    "exp": "exp{f}(a)",
    "tanh": "tanh{f}(a)",
    "log": "log{f}(a)",
    "sqrt": "sqrt{f}(a)",
    "rsqrt": "(acc)1 / sqrt{f}(a)",  # not rsqrt{f}: that one is not correctly rounded
    "sin": "sin{f}(a)",
    "cos": "cos{f}(a)",
    "tan": "tan{f}(a)",
    "erf": "erf{f}(a)",
    "relu": "(a > (acc)0 || a != a) ? a : (acc)0",  # NaN stays NaN, as cupy.maximum(x, 0)
    "abs": "fabs{f}(a)",
    "neg": "-a",
}
#: Row ops over the last axis: ``softmax log_softmax layer_norm rms_norm``, and attention's
#: softmax (``attn_softmax``: a row of only -inf gives zeros, not NaN).
ROW_OPS = ("softmax", "log_softmax", "layer_norm", "rms_norm", "attn_softmax")
_SUFFIX = {DType.F32: "f32", DType.F64: "f64", DType.F16: "f16", DType.BF16: "bf16"}

#: F16 and BF16 as their bits, and ``ld``/``st`` of every float type computed in float (double):
#: the raw programs' common text (this one's, :mod:`accelkit_cuda.philox`'s). Needs ``i64``.
HALF_IO = r"""
// F16 and BF16 as their bits with explicit conversions (no cuda_fp16.h: NVRTC has no include
// path on a bare machine), as in accelkit_fused.cu.
struct f16 { unsigned short bits; };
struct bf16 { unsigned short bits; };
__device__ __forceinline__ float ld(const float* p, i64 i) { return p[i]; }
__device__ __forceinline__ double ld(const double* p, i64 i) { return p[i]; }
__device__ __forceinline__ float ld(const f16* p, i64 i) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p[i].bits)); return f;
}
__device__ __forceinline__ float ld(const bf16* p, i64 i) {
    return __uint_as_float(((unsigned int)p[i].bits) << 16);
}
__device__ __forceinline__ void st(float* p, i64 i, float v) { p[i] = v; }
__device__ __forceinline__ void st(double* p, i64 i, double v) { p[i] = v; }
__device__ __forceinline__ void st(f16* p, i64 i, float v) {
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v)); p[i].bits = h;
}
__device__ __forceinline__ void st(bf16* p, i64 i, float v) {
    unsigned int u = __float_as_uint(v);
    unsigned short h;
    if ((u & 0x7fffffffu) > 0x7f800000u) h = (unsigned short)((u >> 16) | 0x40u);  // quiet NaN
    else h = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // nearest even
    p[i].bits = h;
}
"""

_HEADER = "\ntypedef long long i64;\n\n" + HALF_IO

_KERNEL = r"""
extern "C" __global__ void ew_{op}_{sfx}(const {t}* x, const {t}* y, {t}* o, i64 n) {{
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n;
         i += (i64)gridDim.x * blockDim.x) {{
        {acc} a = ld(x, i), b = ld(y, i);
        st(o, i, {expr});
    }}
}}
"""

# A linear's bias added in place to its GEMM's output (F32, F64: the output's rounding, as
# ``cupy.add(out, bias, out=out)``): element ``i`` of a C-contiguous [rows, cols] gets
# ``b[i % cols]``.
_BIAS_KERNEL = r"""
extern "C" __global__ void eb_add_{sfx}(const {t}* b, {t}* o, i64 n, i64 cols) {{
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n;
         i += (i64)gridDim.x * blockDim.x) {{
        o[i] = o[i] + b[i % cols];
    }}
}}
"""
#: The dtypes of the bias kernels.
BIAS_DTYPES = (DType.F32, DType.F64)

_UNARY_KERNEL = r"""
extern "C" __global__ void eu_{op}_{sfx}(const {t}* x, {t}* o, i64 n) {{
    typedef {acc} acc;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n;
         i += (i64)gridDim.x * blockDim.x) {{
        acc a = ld(x, i);
        st(o, i, {expr});
    }}
}}
"""

# One block per row (blockIdx.x), blockDim.x a multiple of 32 up to 1024; accumulation in
# ``acc`` (F32, F64 for F64). The special values follow cupy_tensor.softmax_rows and the norms:
# a row holding NaN or +inf, or only -inf, is NaN (softmax); the norms' arithmetic gives NaN
# for a row holding NaN or an infinity.
_ROW_COMMON = r"""
template <typename A> __device__ __forceinline__ A nanmax(A a, A b) {
    return (a != a || a > b) ? a : b;  // NaN in either gives NaN
}
template <typename A> __device__ A block_sum(A v, A* shared) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    __syncthreads();  // shared is reused across calls
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : (A)0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <typename A> __device__ A block_max(A v, A* shared) {
    for (int o = 16; o > 0; o >>= 1) v = nanmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : (A)(-1.0 / 0.0);
    for (int o = 16; o > 0; o >>= 1) v = nanmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
"""

_ROW_KERNELS = r"""
extern "C" __global__ void row_softmax_{sfx}(const {t}* x, {t}* o, i64 n) {{
    typedef {acc} acc;
    __shared__ acc shared[32];
    const {t}* r = x + blockIdx.x * n;
    {t}* w = o + blockIdx.x * n;
    acc m = (acc)(-1.0 / 0.0);
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) m = nanmax(m, ld(r, i));
    m = block_max(m, shared);
    if (!(m - m == (acc)0)) {{  // NaN, +inf or -inf: the row is NaN
        for (i64 i = threadIdx.x; i < n; i += blockDim.x) st(w, i, (acc)(0.0 / 0.0));
        return;
    }}
    acc total = (acc)0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) total += exp{f}(ld(r, i) - m);
    total = block_sum(total, shared);
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) st(w, i, exp{f}(ld(r, i) - m) / total);
}}

// Attention's weights (cupy_tensor.softmax_rows with empty_rows="zero"): a row holding NaN or
// +inf is NaN, a row of only -inf (a query that sees no key) is zeros.
extern "C" __global__ void row_attn_softmax_{sfx}(const {t}* x, {t}* o, i64 n) {{
    typedef {acc} acc;
    __shared__ acc shared[32];
    const {t}* r = x + blockIdx.x * n;
    {t}* w = o + blockIdx.x * n;
    acc m = (acc)(-1.0 / 0.0);
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) m = nanmax(m, ld(r, i));
    m = block_max(m, shared);
    if (!(m - m == (acc)0)) {{
        acc fill = m == (acc)(-1.0 / 0.0) ? (acc)0 : (acc)(0.0 / 0.0);
        for (i64 i = threadIdx.x; i < n; i += blockDim.x) st(w, i, fill);
        return;
    }}
    acc total = (acc)0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) total += exp{f}(ld(r, i) - m);
    total = block_sum(total, shared);
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) st(w, i, exp{f}(ld(r, i) - m) / total);
}}

extern "C" __global__ void row_log_softmax_{sfx}(const {t}* x, {t}* o, i64 n) {{
    typedef {acc} acc;
    __shared__ acc shared[32];
    const {t}* r = x + blockIdx.x * n;
    {t}* w = o + blockIdx.x * n;
    acc m = (acc)(-1.0 / 0.0);
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) m = nanmax(m, ld(r, i));
    m = block_max(m, shared);
    if (!(m - m == (acc)0)) {{
        for (i64 i = threadIdx.x; i < n; i += blockDim.x) st(w, i, (acc)(0.0 / 0.0));
        return;
    }}
    acc total = (acc)0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) total += exp{f}(ld(r, i) - m);
    acc lse = log{f}(block_sum(total, shared));
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) st(w, i, (ld(r, i) - m) - lse);
}}

extern "C" __global__ void row_layer_norm_{sfx}(
    const {t}* x, const {t}* g, const {t}* b, {t}* o, i64 n, {acc} eps) {{
    typedef {acc} acc;
    __shared__ acc shared[32];
    const {t}* r = x + blockIdx.x * n;
    {t}* w = o + blockIdx.x * n;
    acc s = (acc)0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) s += ld(r, i);
    acc mean = block_sum(s, shared) / (acc)n;
    acc q = (acc)0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) {{ acc d = ld(r, i) - mean; q += d * d; }}
    acc inv = (acc)1 / sqrt{f}(block_sum(q, shared) / (acc)n + eps);
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) {{
        acc v = (ld(r, i) - mean) * inv;
        if (g) v = v * ld(g, i);
        if (b) v = v + ld(b, i);
        st(w, i, v);
    }}
}}

extern "C" __global__ void row_rms_norm_{sfx}(
    const {t}* x, const {t}* g, {t}* o, i64 n, {acc} eps) {{
    typedef {acc} acc;
    __shared__ acc shared[32];
    const {t}* r = x + blockIdx.x * n;
    {t}* w = o + blockIdx.x * n;
    acc q = (acc)0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) {{ acc v = ld(r, i); q += v * v; }}
    acc inv = (acc)1 / sqrt{f}(block_sum(q, shared) / (acc)n + eps);
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) {{
        acc v = ld(r, i) * inv;
        if (g) v = v * ld(g, i);
        st(w, i, v);
    }}
}}
"""

_TYPES = {"f32": ("float", "float"), "f64": ("double", "double"), "f16": ("f16", "float"),
          "bf16": ("bf16", "float")}  # fmt: skip

#: ``permute`` as a copy: output element ``i`` (C order over the output's dims ``d0..d3``)
#: from input offset ``i0*s0 + i1*s1 + i2*s2 + i3*s3`` (the input's strides, in elements, in
#: the output's axis order). Any dtype, by its width (a copy moves bits); index arithmetic in
#: ``I``: 32-bit where every index and offset fits (three divisions an element, not the
#: emulated 64-bit ones), else 64-bit. Written so that it also builds for the host
#: (tests/test_fast_permute.py runs this text there against NumPy's transpose).
PERMUTE_CORE = r"""
template <typename T, typename I>
__device__ __forceinline__ void permute4(
    const T* __restrict__ x, T* __restrict__ y, I n, I d1, I d2, I d3, I s0, I s1, I s2, I s3) {
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < n;
         i += (I)gridDim.x * (I)blockDim.x) {
        I r = i / d3, i3 = i - r * d3;
        I q = r / d2, i2 = r - q * d2;
        I i0 = q / d1, i1 = q - i0 * d1;
        y[i] = x[i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3];
    }
}
"""

_PERMUTE_KERNEL = r"""
extern "C" __global__ void perm{bits}_{index}(
    const {t}* x, {t}* y, i64 n, i64 d1, i64 d2, i64 d3, i64 s0, i64 s1, i64 s2, i64 s3) {{
    permute4<{t}, {i}>(x, y, ({i})n, ({i})d1, ({i})d2, ({i})d3, ({i})s0, ({i})s1, ({i})s2,
                       ({i})s3);
}}
"""
#: Element width in bits -> the C type a permute copies it as.
_WIDTHS = {8: "unsigned char", 16: "unsigned short", 32: "unsigned int", 64: "unsigned long long"}
#: The index widths of the permute kernels: name -> C type.
_INDEX = {"i32": "unsigned int", "i64": "i64"}
#: The permute kernels' text: :data:`PERMUTE_CORE` and an entry point per element width and
#: index width (``perm32_i32``), part of :data:`SOURCE`.
PERMUTE_SOURCE = PERMUTE_CORE + "".join(
    _PERMUTE_KERNEL.format(bits=bits, index=index, t=t, i=i)
    for bits, t in _WIDTHS.items()
    for index, i in _INDEX.items()
)
#: Dims a permute kernel takes (fewer are padded with leading 1s).
PERMUTE_RANK = 4
_I32_LIMIT = 1 << 31


def permute_kernel_name(itemsize: int, wide: bool) -> str:
    """The permute kernel for elements of ``itemsize`` bytes, 64-bit indices if ``wide``."""
    return f"perm{itemsize * 8}_{'i64' if wide else 'i32'}"


def permute_args(
    shape: tuple[int, ...], axes: tuple[int, ...]
) -> tuple[bool, tuple[int, ...]] | None:
    """For ``permute(x, axes)`` of a C-contiguous ``x`` of ``shape``: whether 64-bit indices
    are needed, and the kernel's ``(n, d1, d2, d3, s0, s1, s2, s3)``; None where ``x`` has more
    than :data:`PERMUTE_RANK` dims or no element."""
    rank = len(shape)
    if rank > PERMUTE_RANK or 0 in shape:
        return None
    strides = [1] * rank
    for k in range(rank - 2, -1, -1):
        strides[k] = strides[k + 1] * shape[k + 1]
    pad = PERMUTE_RANK - rank
    dims = [1] * pad + [shape[a] for a in axes]
    steps = [0] * pad + [strides[a] for a in axes]
    n = 1
    for d in shape:
        n *= d
    last = sum((d - 1) * st for d, st in zip(dims, steps, strict=True))
    wide = n >= _I32_LIMIT or last >= _I32_LIMIT
    return wide, (n, dims[1], dims[2], dims[3], *steps)


def kernel_name(op: str, dtype: DType) -> str:
    """The entry point of ``op`` on ``dtype`` (``ew_add_f32``)."""
    return f"ew_{op}_{_SUFFIX[dtype]}"


def unary_kernel_name(op: str, dtype: DType) -> str:
    """The entry point of the unary ``op`` on ``dtype`` (``eu_gelu_f32``)."""
    return f"eu_{op}_{_SUFFIX[dtype]}"


def bias_kernel_name(dtype: DType) -> str:
    """The entry point of the in-place bias add on ``dtype`` (``eb_add_f32``)."""
    return f"eb_add_{_SUFFIX[dtype]}"


def row_kernel_name(op: str, dtype: DType) -> str:
    """The entry point of the row ``op`` on ``dtype`` (``row_softmax_f32``)."""
    return f"row_{op}_{_SUFFIX[dtype]}"


def row_block(n: int) -> tuple[int]:
    """The block of a row kernel over rows of ``n`` elements: a warp for short rows, up to 256
    threads (a multiple of 32) for long ones; each thread strides over the row."""
    return (min(256, max(32, (n + 31) // 32 * 32)),)


def _source() -> str:
    parts = [_HEADER, _ROW_COMMON, PERMUTE_SOURCE]
    for dtype in BIAS_DTYPES:
        sfx = _SUFFIX[dtype]
        parts.append(_BIAS_KERNEL.format(sfx=sfx, t=_TYPES[sfx][0]))
    for sfx, (t, acc) in _TYPES.items():
        f = "f" if acc == "float" else ""
        for op, expr in OPS.items():
            parts.append(_KERNEL.format(op=op, sfx=sfx, t=t, acc=acc, expr=expr))
        for op, expr in UNARY_OPS.items():
            parts.append(_UNARY_KERNEL.format(op=op, sfx=sfx, t=t, acc=acc, expr=expr.format(f=f)))
        parts.append(_ROW_KERNELS.format(sfx=sfx, t=t, acc=acc, f=f))
    return "".join(parts)


#: The CUDA C++ of every kernel of this module.
SOURCE = _source()


def grid_for(n: int) -> tuple[int]:
    """The grid of a launch over ``n`` elements (``n`` > 0)."""
    return (min((n + BLOCK - 1) // BLOCK, _MAX_BLOCKS),)


class ElementwiseProgram(RawProgram):
    """The kernels of :data:`SOURCE` for one backend: compiled on a thread of its own and
    loaded on the submission thread; :meth:`function` answers without waiting (None until
    they are loaded, and for good if compiling or loading failed)."""

    SOURCE = SOURCE
    FILENAME = "accelkit_elementwise.cu"
    SWITCH = "ACCELKIT_CUDA_RAW_KERNELS"
    FALLBACK = "CuPy's path serves every op"

    def __init__(self, backend: CUDABackend) -> None:
        super().__init__(backend)
        self._started = False
        self._lock = threading.Lock()

    def function(self, op: str, dtype: DType) -> Any:
        """The loaded kernel of ``op`` on ``dtype``, or None (CuPy's path then): a binary op
        by its name, a unary op as ``u_<op>``, a row op as ``row_<op>``, the bias add as
        ``bias_add``. (:meth:`_get`, inlined: every raw launch asks.)"""
        fn = self._functions.get((op, dtype))
        if fn is None and not self._started:
            self.start()
        return fn

    def permute_function(self, itemsize: int, wide: bool) -> Any:
        """The loaded permute kernel for elements of ``itemsize`` bytes (64-bit indices if
        ``wide``), or None (CuPy's path then)."""
        return self._get(("perm", itemsize, wide))

    def _get(self, key: tuple[Any, ...]) -> Any:
        fn = self._functions.get(key)
        if fn is None and not self._started:
            self.start()
        return fn

    def start(self) -> None:
        """Compile (from the disk cache when it holds them) on a thread of its own, then
        queue the load for the submission thread. Once only."""
        with self._lock:
            if self._started:
                return
            self._started = True
        threading.Thread(target=self._compile, name="accelkit-cuda-ew-compile", daemon=True).start()

    async def load(self) -> None:
        """Compile (on a worker thread) and load (on the submission thread) now, and return
        once the kernels are loaded or have failed: ``initialize`` awaits it beside the fused
        program, so the first request's compile (NVRTC, the disk cache's reads, the module
        load: milliseconds to seconds of a thread that competes for the interpreter lock)
        happens before the service serves. Nothing if :meth:`start` ran already."""
        with self._lock:
            if self._started:
                return
            self._started = True
        await super().load()

    def _lookup(self, module: Any) -> dict[Any, Any]:
        functions: dict[Any, Any] = {
            (op, dtype): module.get_function(kernel_name(op, dtype))
            for op in OPS
            for dtype in _SUFFIX
        }
        for dtype in BIAS_DTYPES:
            functions["bias_add", dtype] = module.get_function(bias_kernel_name(dtype))
        for bits in _WIDTHS:
            for wide in (False, True):
                name = permute_kernel_name(bits // 8, wide)
                functions["perm", bits // 8, wide] = module.get_function(name)
        for dtype in _SUFFIX:
            for op in UNARY_OPS:
                functions["u_" + op, dtype] = module.get_function(unary_kernel_name(op, dtype))
            for op in ROW_OPS:
                functions["row_" + op, dtype] = module.get_function(row_kernel_name(op, dtype))
        return functions
