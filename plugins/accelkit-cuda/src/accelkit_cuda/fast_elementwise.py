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

The program compiles on a thread of its own from the first such op on (from the disk cache:
milliseconds; cold: about a second) and loads on the submission thread; until then, or if
NVRTC is missing, every op takes CuPy's path. **Unmeasured on a GPU** when written
(issue 29): the kernels compile in the GPU-free tests, the launch has not run on a device.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from accelkit.dtype import DType

if TYPE_CHECKING:
    from accelkit_cuda.backend import CUDABackend

__all__ = ["BLOCK", "OPS", "SOURCE", "ElementwiseProgram", "grid_for", "kernel_name"]

_log = logging.getLogger("accelkit.cuda")

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
_SUFFIX = {DType.F32: "f32", DType.F64: "f64", DType.F16: "f16", DType.BF16: "bf16"}

_HEADER = r"""
typedef long long i64;

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

_KERNEL = r"""
extern "C" __global__ void ew_{op}_{sfx}(const {t}* x, const {t}* y, {t}* o, i64 n) {{
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n;
         i += (i64)gridDim.x * blockDim.x) {{
        {acc} a = ld(x, i), b = ld(y, i);
        st(o, i, {expr});
    }}
}}
"""

_TYPES = {"f32": ("float", "float"), "f64": ("double", "double"), "f16": ("f16", "float"),
          "bf16": ("bf16", "float")}  # fmt: skip


def kernel_name(op: str, dtype: DType) -> str:
    """The entry point of ``op`` on ``dtype`` (``ew_add_f32``)."""
    return f"ew_{op}_{_SUFFIX[dtype]}"


def _source() -> str:
    parts = [_HEADER]
    for op, expr in OPS.items():
        for sfx, (t, acc) in _TYPES.items():
            parts.append(_KERNEL.format(op=op, sfx=sfx, t=t, acc=acc, expr=expr))
    return "".join(parts)


#: The CUDA C++ of every kernel of this module.
SOURCE = _source()


def grid_for(n: int) -> tuple[int]:
    """The grid of a launch over ``n`` elements (``n`` > 0)."""
    return (min((n + BLOCK - 1) // BLOCK, _MAX_BLOCKS),)


class ElementwiseProgram:
    """The kernels of :data:`SOURCE` for one backend: compiled on a thread of its own and
    loaded on the submission thread; :meth:`function` answers without waiting (None until
    they are loaded, and for good if compiling or loading failed)."""

    def __init__(self, backend: CUDABackend) -> None:
        self._backend = backend
        self._functions: dict[tuple[str, DType], Any] = {}
        self._module: Any = None
        #: Why the kernels are not used (compiling or loading failed), or None.
        self.error: BaseException | None = None
        self._started = False
        self._lock = threading.Lock()

    @property
    def ready(self) -> bool:
        """True once the kernels are loaded."""
        return bool(self._functions)

    def function(self, op: str, dtype: DType) -> Any:
        """The loaded kernel of ``op`` on ``dtype``, or None (CuPy's path then)."""
        fn = self._functions.get((op, dtype))
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
        import anyio

        with self._lock:
            if self._started:
                return
            self._started = True
        await anyio.to_thread.run_sync(self._compile)
        await self._backend.thread.call(lambda: None)  # after the load _compile queued

    def _compile(self) -> None:
        from accelkit_cuda.nvrtc import compile_cached

        backend = self._backend
        try:
            compiled = compile_cached(SOURCE, backend._arch, (), "accelkit_elementwise.cu")
            backend.thread.submit(lambda: self._load(compiled.binary))
        except Exception as exc:  # no NVRTC, an unknown architecture, a backend shut down:
            self.error = exc  # CuPy's path for good
            _log.debug("the elementwise kernels are unavailable", exc_info=True)

    def _load(self, binary: bytes) -> None:
        """On the submission thread: load the module and look up every kernel."""
        try:
            import cupy

            module = cupy.cuda.function.Module()
            module.load(binary)
            functions = {
                (op, dtype): module.get_function(kernel_name(op, dtype))
                for op in OPS
                for dtype in _SUFFIX
            }
        except Exception as exc:
            self.error = exc
            _log.debug("the elementwise kernels could not be loaded", exc_info=True)
            return
        self._module = module  # the functions live as long as their module
        self._functions = functions
