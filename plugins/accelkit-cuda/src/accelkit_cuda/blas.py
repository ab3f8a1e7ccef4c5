"""GEMMs on cuBLAS as PyTorch makes them: ``cublasGemmEx`` with a workspace, F32 accumulation.

``cupy.matmul`` calls cuBLAS without a workspace of its own, and every CuPy call sets the handle's
stream, which resets cuBLAS to its default workspace pool (``cublasSetStream`` does so
unconditionally). PyTorch instead hands cuBLAS a workspace after each ``cublasSetStream`` (32 MiB
on Hopper and newer, where cuBLAS's fastest GEMM kernels want one; 8 MiB before) and calls
``cublasGemmEx`` itself. :func:`matmul_into` does the same, on the submission thread's cuBLAS
handle (CuPy's, per thread and device), with one workspace per CUDA stream (GEMMs on two streams
may overlap, so they must not share one):

- f16 and bf16 operands with F32 accumulation (``CUBLAS_COMPUTE_32F``; bf16 runs on its tensor
  cores, where ``cupy.matmul`` has no bf16 GEMM and the backend multiplied it in F32);
- f32 with F32 arithmetic, or on TF32 tensor cores (``CUBLAS_COMPUTE_32F_FAST_TF32``: inputs
  rounded to 10-bit mantissas) only where the user allowed it: ``backend.allow_tf32 = True`` or
  ``ACCELKIT_CUDA_ALLOW_TF32=1`` (off by default, as ``torch.backends.cuda.matmul.allow_tf32``);
- row-major operands: ``a`` C-contiguous ``[..., m, k]`` and ``b`` ``[k, n]`` C-contiguous or
  the transpose of a C-contiguous ``[n, k]`` (``linear``'s weight), the batch folded into ``m``;
  or both ``[batch, m, k]`` and ``[batch, k, n]`` C-contiguous (a strided batched GEMM).

Anything else (other dtypes, other layouts, a cuBLAS without ``cublasSetWorkspace``) is left to
``cupy.matmul``: :func:`matmul_into` returns False and does nothing. Unmeasured on a GPU as
written: benchmarks/bench_cuda_attention.py times it against ``torch.matmul``.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

import numpy as np

__all__ = ["WORKSPACE_BYTES", "matmul", "matmul_into", "plan", "workspace_bytes"]

#: PyTorch's cuBLAS workspace on compute capability 9.0 and newer (CUBLAS_WORKSPACE_CONFIG
#: ":4096:8"), and, before, about its ":4096:2:16:8".
WORKSPACE_BYTES = 32 << 20
_OLDER_BYTES = 8 << 20

# cuBLAS and CUDA enums (cublas_api.h, library_types.h).
_OP_N, _OP_T = 0, 1
_R_32F, _R_16F, _R_16BF = 0, 2, 14
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32 = 68, 77
_GEMM_DEFAULT = -1
_POINTER_MODE_HOST = 0

_ONE = np.ones(1, np.float32)
_ZERO = np.zeros(1, np.float32)

_lock = threading.Lock()
#: (device, stream pointer) -> the workspace (CuPy memory, held for the process's life).
_workspaces: dict[tuple[int, int], Any] = {}
#: ``cublasSetWorkspace_v2`` through ctypes (CuPy does not bind it); False where missing.
_set_workspace: Any = None


def workspace_bytes(compute_capability: tuple[int, int]) -> int:
    """The workspace PyTorch gives cuBLAS on a device of this compute capability."""
    return WORKSPACE_BYTES if compute_capability >= (9, 0) else _OLDER_BYTES


def _type(dtype: Any) -> int | None:
    name = getattr(dtype, "name", str(dtype))
    return {"float16": _R_16F, "bfloat16": _R_16BF, "float32": _R_32F}.get(name)


def plan(
    a_shape: tuple[int, ...], a_strides: tuple[int, ...], b_shape: tuple[int, ...],
    b_strides: tuple[int, ...], itemsize: int,
) -> tuple[Any, ...] | None:  # fmt: skip
    """The column-major GEMM computing row-major ``a @ b``, or None (not a layout taken).

    Returns ``(transa, transb, m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c, batch)``
    in cuBLAS's terms (C^T = B^T A^T: cuBLAS's first operand is ``b``)."""
    if len(a_shape) < 2 or len(b_shape) < 2:
        return None
    m, k = a_shape[-2], a_shape[-1]
    if b_shape[-2] != k:
        return None
    n = b_shape[-1]
    if 0 in (m, n, k) or 0 in a_shape:
        return None

    def c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
        expect = itemsize
        for d, s in zip(reversed(shape), reversed(strides), strict=True):
            if d != 1 and s != expect:
                return False
            expect *= d
        return True

    if not c_contiguous(a_shape, a_strides):
        return None
    if len(b_shape) == 2:
        rows = 1
        for d in a_shape[:-1]:
            rows *= d
        if c_contiguous(b_shape, b_strides):
            trans_b, ldb = _OP_N, n
        elif b_strides == (itemsize, k * itemsize) or (n == 1 and b_strides[0] == itemsize):
            trans_b, ldb = _OP_T, k  # the transpose of a C-contiguous [n, k]
        else:
            return None
        return (trans_b, _OP_N, n, rows, k, ldb, k, n, 0, 0, 0, 1)
    if len(a_shape) != 3 or len(b_shape) != 3 or a_shape[0] != b_shape[0]:
        return None
    if not c_contiguous(b_shape, b_strides):
        return None
    batch = a_shape[0]
    return (_OP_N, _OP_N, n, m, k, n, k, n, k * n, m * k, m * n, batch)


def _setter() -> Any:
    """``cublasSetWorkspace_v2`` from the cuBLAS library CuPy loaded, or False."""
    global _set_workspace
    if _set_workspace is None:
        found: Any = False
        try:
            import cupy as cp

            major = cp.cuda.runtime.runtimeGetVersion() // 1000
            names = [f"libcublas.so.{major}", "libcublas.so"]
        except Exception:  # no CUDA runtime (a stand-in): cupy.matmul serves
            names = []
        for name in names:
            try:
                lib = ctypes.CDLL(name)  # already loaded by CuPy: the same library
                fn = lib.cublasSetWorkspace_v2
            except (OSError, AttributeError):
                continue
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
            fn.restype = ctypes.c_int
            found = fn
            break
        _set_workspace = found
    return _set_workspace


def _workspace(device: int, stream: int, size: int) -> Any:
    import cupy as cp

    key = (device, stream)
    with _lock:
        memory = _workspaces.get(key)
        if memory is None:
            memory = _workspaces[key] = cp.cuda.alloc(size)
        return memory


_capabilities: dict[int, tuple[int, int]] = {}


def _compute_capability(device: Any) -> tuple[int, int]:
    cc = _capabilities.get(device.id)
    if cc is None:
        value = int(device.compute_capability)  # "90"
        cc = _capabilities[device.id] = (value // 10, value % 10)
    return cc


def matmul(a: Any, b: Any, out: Any = None, tf32: bool = False) -> Any:
    """``a @ b`` through :func:`matmul_into`, into ``out`` where it is C-contiguous and of the
    result's dtype and shape (else a new array); None (nothing done) where it does not apply.

    Only for TF32 GEMMs, or with ``ACCELKIT_CUDA_GEMM_WORKSPACE=1``: measured on an H100
    (2026-11-27, ``benchmarks/bench_cuda.py``), this path ran f16/bf16 GEMMs at 8192 at 0.70-0.75x
    PyTorch against ``cupy.matmul``'s 0.93x, so ``cupy.matmul`` serves by default."""
    if not (tf32 or os.environ.get("ACCELKIT_CUDA_GEMM_WORKSPACE", "").strip() == "1"):
        return None
    if _type(a.dtype) is None or a.dtype != b.dtype or a.ndim < 2 or b.ndim < 2:
        return None
    if plan(a.shape, a.strides, b.shape, b.strides, a.itemsize) is None or not _setter():
        return None
    shape = (*a.shape[:-1], b.shape[-1])
    if out is None or out.dtype != a.dtype or out.shape != shape or not out.flags.c_contiguous:
        import cupy as cp

        out = cp.empty(shape, a.dtype)
    return out if matmul_into(a, b, out, tf32) else None


def matmul_into(a: Any, b: Any, out: Any, tf32: bool = False) -> bool:
    """``out[...] = a @ b`` on cuBLAS with a workspace (see the module docstring), on the
    submission thread and the current stream; False (nothing done) where it does not apply."""
    dtype = _type(a.dtype)
    if dtype is None or a.dtype != b.dtype or out.dtype != a.dtype or not out.flags.c_contiguous:
        return False
    p = plan(a.shape, a.strides, b.shape, b.strides, a.itemsize)
    if p is None:
        return False
    setter = _setter()
    if not setter:
        return False
    import cupy as cp
    from cupy_backends.cuda.libs import cublas

    trans_a, trans_b, m, n, k, lda, ldb, ldc, sa, sb, sc, batch = p
    stream = cp.cuda.get_current_stream()
    dev = cp.cuda.Device()
    device = dev.id
    handle = cp.cuda.device.get_cublas_handle()
    size = workspace_bytes(_compute_capability(dev))
    ws = _workspace(device, stream.ptr, size)
    cublas.setStream(handle, stream.ptr)
    # After every cublasSetStream (which resets it), as PyTorch does.
    if setter(handle, ws.ptr, size) != 0:
        return False
    cublas.setPointerMode(handle, _POINTER_MODE_HOST)
    compute = _COMPUTE_32F_FAST_TF32 if tf32 and dtype == _R_32F else _COMPUTE_32F
    alpha, beta = _ONE.ctypes.data, _ZERO.ctypes.data
    # C^T = B^T A^T in column-major: cuBLAS's first operand is b.
    if batch == 1:
        cublas.gemmEx(
            handle, trans_a, trans_b, m, n, k, alpha, b.data.ptr, dtype, lda, a.data.ptr, dtype,
            ldb, beta, out.data.ptr, dtype, ldc, compute, _GEMM_DEFAULT,
        )  # fmt: skip
    else:
        cublas.gemmStridedBatchedEx(
            handle, trans_a, trans_b, m, n, k, alpha, b.data.ptr, dtype, lda, sa, a.data.ptr,
            dtype, ldb, sb, beta, out.data.ptr, dtype, ldc, sc, batch, compute, _GEMM_DEFAULT,
        )  # fmt: skip
    return True
