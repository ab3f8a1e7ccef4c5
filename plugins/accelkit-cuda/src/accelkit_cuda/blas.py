"""GEMMs on cuBLAS as PyTorch makes them: ``cublasGemmEx`` with a workspace, F32 accumulation.

``cupy.matmul`` calls cuBLAS without a workspace of its own, and every CuPy call sets the handle's
stream, which resets cuBLAS to its default workspace pool (``cublasSetStream`` does so
unconditionally). PyTorch instead hands cuBLAS a workspace after each ``cublasSetStream`` (32 MiB
on Hopper and newer, where cuBLAS's fastest GEMM kernels want one; 8 MiB before) and calls
``cublasGemmEx`` itself. :func:`matmul_into` does the same, on the submission thread's cuBLAS
handle (CuPy's, per thread and device), with one workspace per CUDA stream (GEMMs on two streams
may overlap, so they must not share one). It calls cuBLAS through ctypes (:class:`Cublas`, on
the library CuPy loaded), not through CuPy's wrappers: those call CuPy's ``cublas.setStream``,
which raises ``NotImplementedError('calling cuBLAS API during stream capture is currently
unsupported')`` on a capturing stream, whereas cuBLAS itself can be captured into a CUDA graph
when it has a workspace of its own (cuBLAS's documentation, "CUDA Graphs Support").

Where it serves (:func:`matmul`):

- while the thread captures a CUDA graph (:mod:`accelkit_cuda.capturing`): every floating-point
  GEMM, other layouts made contiguous first (a copy kernel, captured too);
- TF32 GEMMs (f32 operands, ``backend.allow_tf32``);
- every other eager GEMM whose layout :func:`plan` takes (:func:`eager_route`), unless
  ``ACCELKIT_CUDA_GEMM_WORKSPACE=0``.

Why every eager GEMM (measured on an H100, 2026-11-27, ``benchmarks/bench_cuda.py`` and
``benchmarks/profile_cuda_block.py``): CuPy 14 has no BF16 GEMM (its fallback, F32 copies and
an F32 GEMM without tensor cores, ran at 0.06x PyTorch at 8192; here 0.98x device time);
``cupy.matmul`` of the transformer block's ``[4, 256, 512] @ w.T`` copies the transposed weight
and builds pointer arrays for a batched GEMM (16 extra kernels a block) and spends about 200 us
of the submission thread's time a call in its gufunc machinery, where this path folds the batch
into the rows and reads the weight transposed in place; F16 at 8192 ran at 0.98x device time
here against 0.95x through ``cupy.matmul``.

Types (:func:`compute_type`): f16 and bf16 operands with F32 accumulation
(``CUBLAS_COMPUTE_32F``) into an output of their type or f32; f32 with F32 arithmetic, or on
TF32 tensor cores (``CUBLAS_COMPUTE_32F_FAST_TF32``) only where the user allowed it; f64 with
``CUBLAS_COMPUTE_64F``. ``alpha`` and ``beta`` are host scalars of the compute type's scalar
type (:func:`scalars`: float for the 32F types, double for 64F), as cuBLAS reads them.

Layouts (:func:`plan`): row-major operands, ``a`` C-contiguous ``[..., m, k]`` and ``b``
``[k, n]`` C-contiguous or the transpose of a C-contiguous ``[n, k]`` (``linear``'s weight), the
batch folded into ``m``; or both ``[batch, m, k]`` and ``[batch, k, n]`` C-contiguous (a strided
batched GEMM). Anything else outside a capture is left to ``cupy.matmul``.

The capture path is unverified on a GPU (tested over a stand-in for CuPy and cuBLAS only).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import Any

from accelkit_cuda import capturing
from accelkit_cuda.submission import SubmissionThread, turn

__all__ = [
    "WORKSPACE_BYTES", "Cublas", "compute_type", "gemm_ptrs", "linear_plan", "matmul",
    "matmul_into", "open_library", "plan", "prepare", "ready", "scalar_args", "scalars",
    "stream_context", "type_of", "workspace_bytes", "workspace_route",
]  # fmt: skip

#: PyTorch's cuBLAS workspace on compute capability 9.0 and newer (CUBLAS_WORKSPACE_CONFIG
#: ":4096:8"), and, before, about its ":4096:2:16:8".
WORKSPACE_BYTES = 32 << 20
_OLDER_BYTES = 8 << 20

# cuBLAS and CUDA enums (cublas_api.h, library_types.h).
_OP_N, _OP_T = 0, 1
_R_32F, _R_64F, _R_16F, _R_16BF = 0, 1, 2, 14
_COMPUTE_32F, _COMPUTE_64F, _COMPUTE_32F_FAST_TF32 = 68, 70, 77
_GEMM_DEFAULT = -1
_POINTER_MODE_HOST = 0

#: numpy/CuPy dtype name -> cudaDataType.
_TYPES = {"float16": _R_16F, "bfloat16": _R_16BF, "float32": _R_32F, "float64": _R_64F}
#: The scalar type cuBLAS reads ``alpha``/``beta`` as, per compute type (cuBLAS's cublasGemmEx
#: table: float for every 32F compute type, double for 64F).
_SCALARS: dict[int, Any] = {
    _COMPUTE_32F: ctypes.c_float, _COMPUTE_32F_FAST_TF32: ctypes.c_float,
    _COMPUTE_64F: ctypes.c_double,
}  # fmt: skip

_lock = threading.Lock()
#: (device, stream pointer) -> the workspace (CuPy memory, held for the process's life).
_workspaces: dict[tuple[int, int], Any] = {}
#: The cuBLAS entry points (:class:`Cublas`), False where the library is not found.
_cublas: Any = None


def workspace_bytes(compute_capability: tuple[int, int]) -> int:
    """The workspace PyTorch gives cuBLAS on a device of this compute capability."""
    return WORKSPACE_BYTES if compute_capability >= (9, 0) else _OLDER_BYTES


#: dtype object -> its cudaDataType (or None): NumPy's ``dtype.name`` is Python code (about
#: 5 us on an H100 host, three a GEMM; the block's profile of 2026-11-27 showed it), a dict
#: lookup by the dtype object is not.
_TYPE_OF: dict[Any, int | None] = {}


def _type(dtype: Any) -> int | None:
    try:
        return _TYPE_OF[dtype]
    except KeyError:
        found = _TYPE_OF[dtype] = _TYPES.get(getattr(dtype, "name", str(dtype)))
        return found
    except TypeError:  # not hashable: not a NumPy dtype
        return _TYPES.get(getattr(dtype, "name", str(dtype)))


def type_of(dtype: Any) -> int | None:
    """The cudaDataType of a NumPy dtype (f16, bf16, f32, f64), or None."""
    return _type(dtype)


def compute_type(in_type: int, out_type: int, tf32: bool = False) -> int | None:
    """cuBLAS's compute type for operands of ``in_type`` into ``out_type`` (cudaDataType
    values), or None (a combination not taken): f16/bf16 into their own type or f32, F32
    accumulation; f32 into f32 (TF32 with ``tf32``); f64 into f64."""
    if in_type in (_R_16F, _R_16BF) and out_type in (in_type, _R_32F):
        return _COMPUTE_32F
    if in_type == out_type == _R_32F:
        return _COMPUTE_32F_FAST_TF32 if tf32 else _COMPUTE_32F
    if in_type == out_type == _R_64F:
        return _COMPUTE_64F
    return None


def scalars(compute: int, alpha: float, beta: float) -> tuple[Any, Any]:
    """``alpha`` and ``beta`` as the host scalars cuBLAS reads for ``compute`` (ctypes objects;
    their addresses go to cuBLAS, so keep them alive over the call)."""
    kind = _SCALARS[compute]
    return kind(alpha), kind(beta)


#: (compute, alpha, beta) -> (alpha, beta, their addresses) for the pairs every GEMM uses
#: (1, 0) and (1, 1): made once, never written (cuBLAS reads host scalars before it returns,
#: and a graph capture reads them at capture), so shared by every thread.
_CONSTANT_SCALARS: dict[tuple[int, float, float], tuple[Any, Any, int, int]] = {}


def scalar_args(compute: int, alpha: float, beta: float) -> tuple[Any, Any, int, int]:
    """``alpha`` and ``beta`` as :func:`scalars` makes them, and their addresses: shared
    constants for (1, 0) and (1, 1) (never written), new objects otherwise (keep them alive
    over the call)."""
    key = (compute, alpha, beta)
    found = _CONSTANT_SCALARS.get(key)
    if found is None:
        a, b = scalars(compute, alpha, beta)
        found = (a, b, ctypes.addressof(a), ctypes.addressof(b))
        if alpha == 1.0 and beta in (0.0, 1.0):
            _CONSTANT_SCALARS[key] = found
    return found


def _c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    expect = itemsize
    for i in range(len(shape) - 1, -1, -1):
        d = shape[i]
        if d != 1 and strides[i] != expect:
            return False
        expect *= d
    return True


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

    if not _c_contiguous(a_shape, a_strides, itemsize):
        return None
    if len(b_shape) == 2:
        rows = 1
        for d in a_shape[:-1]:
            rows *= d
        if _c_contiguous(b_shape, b_strides, itemsize):
            trans_b, ldb = _OP_N, n
        elif b_strides == (itemsize, k * itemsize) or (n == 1 and b_strides[0] == itemsize):
            trans_b, ldb = _OP_T, k  # the transpose of a C-contiguous [n, k]
        else:
            return None
        return (trans_b, _OP_N, n, rows, k, ldb, k, n, 0, 0, 0, 1)
    if len(a_shape) != 3 or len(b_shape) != 3 or a_shape[0] != b_shape[0]:
        return None
    if not _c_contiguous(b_shape, b_strides, itemsize):
        return None
    batch = a_shape[0]
    return (_OP_N, _OP_N, n, m, k, n, k, n, k * n, m * k, m * n, batch)


class Cublas:
    """The cuBLAS entry points :func:`matmul_into` calls, through ctypes on a loaded cuBLAS
    library (``lib``): no CuPy wrapper, so nothing refuses a capturing stream. Each raises
    RuntimeError on a status other than CUBLAS_STATUS_SUCCESS."""

    def __init__(self, lib: Any, held: Any = None) -> None:
        """``lib``: the library through ``ctypes.CDLL`` (a call releases the interpreter lock);
        ``held``: the same library through ``ctypes.PyDLL`` (a call keeps it), for the three
        setters: each is a few host instructions, and releasing the lock for one lets the
        loop's or the completer's thread take it, which the submission thread then waits
        for (three hand-offs a GEMM). The GEMM itself releases it."""
        vp, i, ll, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_size_t
        sigs = {
            "cublasSetStream_v2": [vp, vp],
            "cublasSetWorkspace_v2": [vp, vp, sz],
            "cublasSetPointerMode_v2": [vp, i],
            "cublasGemmEx": [vp, i, i, i, i, i, vp, vp, i, i, vp, i, i, vp, vp, i, i, i, i],
            "cublasGemmStridedBatchedEx": [
                vp, i, i, i, i, i, vp, vp, i, i, ll, vp, i, i, ll, vp, vp, i, i, ll, i, i, i,
            ],
        }  # fmt: skip
        self._fns: dict[str, Any] = {}
        for name, argtypes in sigs.items():
            fn = getattr(held if held is not None and "Gemm" not in name else lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
            self._fns[name] = fn

    def _call(self, name: str, *args: Any) -> None:
        status = self._fns[name](*args)
        if status != 0:
            raise RuntimeError(f"{name} failed: cuBLAS status {status}")

    def set_stream(self, handle: int, stream: int) -> None:
        self._call("cublasSetStream_v2", handle, stream)

    def set_workspace(self, handle: int, ptr: int, size: int) -> None:
        self._call("cublasSetWorkspace_v2", handle, ptr, size)

    def set_pointer_mode(self, handle: int, mode: int) -> None:
        self._call("cublasSetPointerMode_v2", handle, mode)

    def gemm_ex(self, *args: Any) -> None:
        """``cublasGemmEx`` with its arguments in cuBLAS's order."""
        self._call("cublasGemmEx", *args)

    def gemm_strided_batched_ex(self, *args: Any) -> None:
        """``cublasGemmStridedBatchedEx`` with its arguments in cuBLAS's order."""
        self._call("cublasGemmStridedBatchedEx", *args)


def _lib() -> Any:
    """The :class:`Cublas` of the cuBLAS library CuPy loaded, or None (no cuBLAS, or one without
    ``cublasSetWorkspace``: ``cupy.matmul`` serves)."""
    global _cublas
    if _cublas is None:
        try:
            from cupy_backends.cuda.libs import cublas  # noqa: F401 - loads CuPy's libcublas
        except Exception:  # no CUDA runtime (a stand-in): cupy.matmul serves
            _cublas = False
        else:
            _cublas = open_library("cublas", Cublas)
    return _cublas or None


def open_library(stem: str, make: Callable[[Any, Any], Any]) -> Any:
    """``make(CDLL, PyDLL)`` of ``lib<stem>.so.<major>`` (the CUDA runtime's major version, as
    CuPy loaded it: ``dlopen`` finds a loaded library by its soname), else of ``lib<stem>.so``;
    False where neither loads or has the entry points ``make`` asks for."""
    try:
        import cupy as cp

        major = cp.cuda.runtime.runtimeGetVersion() // 1000
    except Exception:  # no CUDA runtime (a stand-in)
        return False
    for name in (f"lib{stem}.so.{major}", f"lib{stem}.so"):
        try:
            return make(ctypes.CDLL(name), ctypes.PyDLL(name))
        except (OSError, AttributeError):
            continue
    return False


def _workspace(device: int, stream: int, size: int) -> Any:
    import cupy as cp

    key = (device, stream)
    with _lock:
        memory = _workspaces.get(key)
        if memory is None:
            memory = _workspaces[key] = cp.cuda.alloc(size)
        return memory


class _State:
    """What :func:`matmul_into` asks CuPy for once per submission thread, not per GEMM: the
    thread's device (``cudaGetDevice``), CuPy's cuBLAS handle for it, the workspace size, and
    the workspace pointer of each stream used. Kept on the :class:`SubmissionThread` (its
    ``blas_state``), so that a caller holding the thread's turn (an inline launch) makes its
    GEMMs on the same handle and workspaces, one turn at a time (cuBLAS allows a handle to
    serve several threads so long as they do not use it at once). A submission thread serves
    one device for its life, so none of this changes."""

    __slots__ = ("device", "handle", "size", "workspaces")

    def __init__(self, cp: Any) -> None:
        dev = cp.cuda.Device()
        self.device: int = dev.id
        self.handle: int = cp.cuda.device.get_cublas_handle()
        self.size: int = workspace_bytes(_compute_capability(dev))
        self.workspaces: dict[int, int] = {}


class _ThreadState(threading.local):
    """The state of a thread that holds no submission thread's turn (tests, scripts)."""

    state: _State | None = None


_thread = _ThreadState()


def _state(cp: Any) -> _State:
    owner = turn()
    if owner is not None:
        state: _State | None = owner.blas_state
        if state is None:
            state = owner.blas_state = _State(cp)
        return state
    state = _thread.state
    if state is None:
        state = _thread.state = _State(cp)
    return state


def ready_on(thread: SubmissionThread, stream: Any) -> bool:
    """Whether ``thread`` has made its cuBLAS handle and the workspace of ``stream`` (a
    ``cupy.cuda.Stream``, or None before it is made): a GEMM on that stream in the thread's
    turn on another thread then makes neither there (no ``cublasCreate``, no ``cudaMalloc``)."""
    state: _State | None = thread.blas_state
    return state is not None and stream is not None and stream.ptr in state.workspaces


def _workspace_ptr(state: _State, stream: int) -> int:
    workspaces = state.workspaces
    ptr = workspaces.get(stream)
    if ptr is None:
        ptr = workspaces[stream] = _workspace(state.device, stream, state.size).ptr
    return ptr


_capabilities: dict[int, tuple[int, int]] = {}


def stream_context(cp: Any, stream: int) -> tuple[int, int, int]:
    """The calling thread's cuBLAS handle (CuPy's, for the thread's device) and the workspace of
    ``stream`` (a CUDA stream pointer), as ``(handle, pointer, bytes)``: what the GEMMs on that
    stream share (they run in order). A cuBLAS handle serves cuBLASLt too (cast, as PyTorch's
    ``getCurrentCUDABlasLtHandle`` does)."""
    state = _state(cp)
    return state.handle, _workspace_ptr(state, stream), state.size


def _compute_capability(device: Any) -> tuple[int, int]:
    cc = _capabilities.get(device.id)
    if cc is None:
        value = int(device.compute_capability)  # "90"
        cc = _capabilities[device.id] = (value // 10, value % 10)
    return cc


def prepare(stream: int) -> bool:
    """Before a capture on ``stream`` (a CUDA stream pointer): find cuBLAS, create the thread's
    handle and allocate the stream's workspace now, so that the capture makes no allocation of
    theirs. False where cuBLAS is not found (the capture's GEMMs then fail, and its calls are
    replayed)."""
    import cupy as cp

    if _lib() is None:
        return False
    _workspace_ptr(_state(cp), stream)
    return True


def eager_route(in_type: int, tf32: bool) -> bool:
    """Whether an eager GEMM (no capture) of operands of cudaDataType ``in_type`` goes through
    :func:`matmul_into` (where its layout is one :func:`plan` takes): by default every one;
    with ``ACCELKIT_CUDA_GEMM_WORKSPACE=0`` only TF32 ones (``cupy.matmul`` serves the rest;
    a way back should a GPU run find this route slower somewhere)."""
    return (tf32 and in_type == _R_32F) or workspace_route()


def workspace_route() -> bool:
    """False where ``ACCELKIT_CUDA_GEMM_WORKSPACE=0`` turns the eager workspace route off."""
    return os.environ.get("ACCELKIT_CUDA_GEMM_WORKSPACE", "").strip() != "0"


def matmul(a: Any, b: Any, out: Any = None, tf32: bool = False, wide: bool = False) -> Any:
    """``a @ b`` through :func:`matmul_into` (into ``out`` where it is C-contiguous and of the
    result's dtype and shape, else a new array), or None (nothing done: ``cupy.matmul``
    serves). The result is f32 for f16/bf16 operands with ``wide``, else of their dtype.

    It serves while the thread captures a CUDA graph (any layout), and outside a capture where
    :func:`eager_route` says so and :func:`plan` takes the layout (see the module docstring)."""
    in_type = _type(a.dtype)
    if in_type is None or a.dtype != b.dtype:
        return None
    stream = capturing.active()
    if stream is None and not eager_route(in_type, tf32):
        return None
    import cupy as cp

    # Host arrays (tests that put NumPy in for CuPy) never reach cuBLAS.
    if not isinstance(a, cp.ndarray) or not isinstance(b, cp.ndarray) or _lib() is None:
        return None

    out_dtype = cp.float32 if wide and in_type in (_R_16F, _R_16BF) else a.dtype
    squeeze: list[int] = []
    if stream is not None and (a.ndim < 2 or b.ndim < 2):
        if a.ndim == 1:  # as cupy.matmul: a vector is a row, then dropped
            a, squeeze = a[None, :], [*squeeze, -2]
        if b.ndim == 1:
            b, squeeze = b[:, None], [*squeeze, -1]
    if a.ndim < 2 or b.ndim < 2:
        return None
    result_shape = None
    p = plan(a.shape, a.strides, b.shape, b.strides, a.itemsize)
    if p is None:
        if stream is None:
            return None
        # A capture has no cupy.matmul to fall back on: copy the operands into a layout taken.
        a, b, result_shape = _contiguous_batch(cp, a, b)
        p = plan(a.shape, a.strides, b.shape, b.strides, a.itemsize)
    shape = (*a.shape[:-1], b.shape[-1])
    direct = not squeeze and result_shape is None and out is not None
    if direct and out.dtype == out_dtype and out.shape == shape and out.flags.c_contiguous:
        res = out
    else:
        res = cp.empty(shape, out_dtype)
    out_type = _type(res.dtype)
    if p is None or out_type is None:
        return None
    compute = compute_type(in_type, out_type, tf32)
    if compute is None:
        return None
    gemm_ptrs(cp, p, a.data.ptr, b.data.ptr, res.data.ptr, in_type, out_type, compute)
    if result_shape is not None:
        res = res.reshape(result_shape)
    for axis in sorted(squeeze):
        res = res.squeeze(axis)
    return res


def _contiguous_batch(cp: Any, a: Any, b: Any) -> tuple[Any, Any, tuple[int, ...]]:
    """``a`` and ``b`` broadcast over their batch axes and copied C-contiguous, as
    ``[batch, m, k]`` and ``[batch, k, n]`` (``b`` stays ``[k, n]`` where ``a`` alone is
    batched), in a layout :func:`plan` takes; and the shape of ``a @ b``."""
    m, n = a.shape[-2], b.shape[-1]
    if b.ndim == 2:
        return cp.ascontiguousarray(a), cp.ascontiguousarray(b), (*a.shape[:-1], n)
    lead_a = (1,) * (b.ndim - a.ndim) + tuple(a.shape[:-2])
    lead_b = (1,) * (a.ndim - b.ndim) + tuple(b.shape[:-2])
    batch = tuple(max(x, y) for x, y in zip(lead_a, lead_b, strict=True))
    count = 1
    for d in batch:
        count *= d
    a3 = cp.ascontiguousarray(cp.broadcast_to(a, (*batch, *a.shape[-2:])))
    b3 = cp.ascontiguousarray(cp.broadcast_to(b, (*batch, *b.shape[-2:])))
    return (a3.reshape(count, *a.shape[-2:]), b3.reshape(count, *b.shape[-2:]), (*batch, m, n))


def matmul_into(
    a: Any, b: Any, out: Any, tf32: bool = False, alpha: float = 1.0, beta: float = 0.0
) -> bool:
    """``out[...] = alpha * (a @ b) + beta * out`` on cuBLAS with a workspace (see the module
    docstring), on the submission thread and the current stream (the capturing one during a
    capture); False (nothing done) where it does not apply. ``a`` and ``b`` share a dtype;
    ``out`` has a type :func:`compute_type` takes for it (``out``'s batch folded as ``a``'s)."""
    in_type, out_type = _type(a.dtype), _type(out.dtype)
    if in_type is None or out_type is None or a.dtype != b.dtype or not out.flags.c_contiguous:
        return False
    compute = compute_type(in_type, out_type, tf32)
    if compute is None:
        return False
    p = plan(a.shape, a.strides, b.shape, b.strides, a.itemsize)
    if p is None or _lib() is None:
        return False
    import cupy as cp

    gemm_ptrs(cp, p, a.data.ptr, b.data.ptr, out.data.ptr, in_type, out_type, compute, alpha,
              beta)  # fmt: skip
    return True


def ready() -> bool:
    """Whether :func:`gemm_ptrs` may be called: cuBLAS was found (by a GEMM on the submission
    thread, which loads it; False until then, and where it is missing)."""
    return bool(_cublas)


def linear_plan(rows: int, n: int, k: int) -> tuple[Any, ...]:
    """:func:`plan` of ``x @ w.T`` for a C-contiguous ``x`` of ``rows`` x ``k`` and ``w`` of
    ``n`` x ``k`` (a linear's operands, its batch folded into the rows)."""
    p = plan((rows, k), (k, 1), (k, n), (1, k), 1)
    assert p is not None
    return p


def gemm_ptrs(
    cp: Any, p: tuple[Any, ...], a_ptr: int, b_ptr: int, out_ptr: int, in_type: int,
    out_type: int, compute: int, alpha: float = 1.0, beta: float = 0.0,
) -> None:  # fmt: skip
    """``out = alpha * (a @ b) + beta * out`` over device pointers, ``p`` being :func:`plan`'s
    for the operands, their types checked by :func:`compute_type` (on the submission thread,
    after :func:`ready`): the cuBLAS calls alone, no CuPy array."""
    lib = _cublas
    trans_a, trans_b, m, n, k, lda, ldb, ldc, sa, sb, sc, batch = p
    stream = capturing.active()
    if stream is None:
        stream = cp.cuda.get_current_stream().ptr
    state = _state(cp)
    handle, size = state.handle, state.size
    ws = _workspace_ptr(state, stream)
    lib.set_stream(handle, stream)
    lib.set_workspace(handle, ws, size)  # after every cublasSetStream (which resets it)
    lib.set_pointer_mode(handle, _POINTER_MODE_HOST)
    # alive until cuBLAS has read them (the constant pairs, for good)
    alpha_c, beta_c, pa, pb = scalar_args(compute, alpha, beta)
    # C^T = B^T A^T in column-major: cuBLAS's first operand is b.
    if batch == 1:
        lib.gemm_ex(
            handle, trans_a, trans_b, m, n, k, pa, b_ptr, in_type, lda, a_ptr, in_type, ldb, pb,
            out_ptr, out_type, ldc, compute, _GEMM_DEFAULT,
        )  # fmt: skip
    else:
        lib.gemm_strided_batched_ex(
            handle, trans_a, trans_b, m, n, k, pa, b_ptr, in_type, lda, sa, a_ptr, in_type, ldb,
            sb, pb, out_ptr, out_type, ldc, sc, batch, compute, _GEMM_DEFAULT,
        )  # fmt: skip
    del alpha_c, beta_c
