"""A linear's bias in cuBLASLt's epilogue: ``x @ w.T + b`` as one launch, as PyTorch's
``addmm`` makes it (``at::cuda::blas::gemm_and_bias``, ``CUBLASLT_EPILOGUE_BIAS``).

Without it a linear with a bias is two launches on the CUDA backend (cuBLAS's GEMM into the
output, then a raw kernel adding the bias in place: ``tensor_kernels._raw_linear``), and an F16
or BF16 one is CuPy's path (an F32 product, the bias added, a cast: several launches and CuPy
arrays on the submission thread). The profile of the transformer block on an H100
(2026-11-27) put the six bias adds of a block at 31 us of 471 us of device time, plus a
closure's launch each on the submission thread; PyTorch runs none of them.

How (cuBLASLt's documentation, ``cublasLtMatmul``): ``D = alpha op(A) op(B) + beta C``, then
the epilogue adds ``bias[i]`` to row ``i`` of the column-major ``D``. A row-major linear's
output ``[rows, n]`` is the column-major ``[n, rows]``, so its rows are the output's columns
and the bias, of length ``n``, is what ``CUBLASLT_EPILOGUE_BIAS`` broadcasts. The bias is of
``D``'s type and is added to the product in the scale type (F32 for F16/BF16/F32, F64 for F64),
before the single rounding to ``D``'s type: the arithmetic of the F32 product plus the bias
rounded once, which ``cupy_tensor.linear`` computes in several launches.

Plans (:class:`_Plan`): the operation descriptor, the three matrix layouts and the algorithm
cuBLASLt's heuristic picks (``cublasLtMatmulAlgoGetHeuristic``, one result, the stream's
workspace allowed, the operands' pointer alignment declared as PyTorch declares it) are made
once per GEMM shape, types and alignment, on the submission thread at the first call (the
heuristic reads the device), and kept per thread (a submission thread serves one device; a
heuristic's algorithm is the device's). A call sets the descriptor's bias pointer and calls
``cublasLtMatmul`` on the stream (the capturing one during a CUDA graph capture: cuBLASLt may
be captured with a workspace of its own), with :mod:`accelkit_cuda.blas`'s workspace of that
stream (calls on one stream run in order, so cuBLAS's GEMMs and these share it) and its cuBLAS
handle (CuPy's for the thread), which serves as a cuBLASLt handle (PyTorch does the same).

Split-K reductions are kept to the compute type (F16/BF16 partial sums are not reduced in 16
bits). Where cuBLASLt is not found, the heuristic finds no algorithm (F64 with a bias epilogue
on some versions, odd alignments), ``cublasLtMatmul`` returns an error status (the plan is
dropped, as PyTorch's ``gemm_and_bias`` falls back to the unfused GEMM), the input or output is
a single row or column (:func:`signature`), or ``ACCELKIT_CUDA_LT=0``, :func:`linear_bias`
returns False (or is not called) and the caller takes the two-launch path. Written and tested
without a GPU (ctypes marshalling against the real ``libcublasLt`` where one is installed; the
arithmetic over a stand-in): unmeasured and unverified on a device until the next GPU check
(issue 29).
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

from accelkit_cuda import blas, capturing
from accelkit_cuda.submission import SubmissionThread, turn

__all__ = [
    "CublasLt", "Signature", "available", "enabled", "linear_bias", "signature", "stats",
]  # fmt: skip

# cublasLt.h (CUDA 12.9): attributes and their C types.
_DESC_TRANSA, _DESC_TRANSB = 3, 4  # int32_t (cublasOperation_t)
_DESC_EPILOGUE = 7  # uint32_t (cublasLtEpilogue_t)
_DESC_BIAS_POINTER = 8  # const void*
_DESC_BIAS_DATA_TYPE = 26  # int32_t (cudaDataType)
_EPILOGUE_BIAS = 4
_PREF_MAX_WORKSPACE_BYTES = 1  # uint64_t
_PREF_REDUCTION_SCHEME_MASK = 3  # uint32_t
_PREF_MIN_ALIGNMENT = (5, 6, 7, 8)  # A, B, C, D bytes: uint32_t, default 256
#: Split-K reductions in the compute type only (or none): INPLACE and OUTPUT_TYPE would reduce
#: F16/BF16 partial sums in 16 bits (PyTorch's mask where reduced-precision reductions are off).
_REDUCTION_COMPUTE_TYPE = 2
_OP_N = 0
_R_32F, _R_64F = 0, 1
_COMPUTE_64F = 70
#: ``cublasLtMatmulHeuristicResult_t``: the algorithm (``uint64_t data[8]``), ``size_t
#: workspaceSize``, ``cublasStatus_t state``, ``float wavesCount``, ``int reserved[4]``.
HEURISTIC_BYTES = 96
_STATE_OFFSET = 72
#: Plans a thread keeps before it frees them all and starts over.
_PLANS = 256

#: What the route did in this process: ``launches`` (linears with their bias in the epilogue),
#: ``no_algorithm`` (plans the heuristic found no algorithm for) and ``launch_failed`` (plans
#: dropped when ``cublasLtMatmul`` returned an error status): the calls of those took the
#: two-launch path. Read by the GPU tests and the benchmarks, written by submission threads.
stats = {"launches": 0, "no_algorithm": 0, "launch_failed": 0}

#: The cuBLASLt entry points (:class:`CublasLt`); False where the library is not found.
_lt: Any = None
_load_lock = threading.Lock()


class CublasLt:
    """The cuBLASLt entry points, through ctypes on the loaded library: ``lib`` a ``CDLL``
    (a call releases the interpreter lock: ``cublasLtMatmul`` and the heuristic), ``held`` the
    same library as a ``PyDLL`` (a call keeps it: the attribute setters, a few host
    instructions each, as :class:`accelkit_cuda.blas.Cublas` does). Each method raises
    RuntimeError on a status other than CUBLAS_STATUS_SUCCESS."""

    def __init__(self, lib: Any, held: Any = None) -> None:
        vp, i, u64, i64, sz = (
            ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64, ctypes.c_size_t,
        )  # fmt: skip
        pvp = ctypes.POINTER(ctypes.c_void_p)
        sigs: dict[str, tuple[list[Any], bool]] = {
            "cublasLtMatmulDescCreate": ([pvp, i, i], True),
            "cublasLtMatmulDescSetAttribute": ([vp, i, vp, sz], True),
            "cublasLtMatmulDescDestroy": ([vp], True),
            "cublasLtMatrixLayoutCreate": ([pvp, i, u64, u64, i64], True),
            "cublasLtMatrixLayoutDestroy": ([vp], True),
            "cublasLtMatmulPreferenceCreate": ([pvp], True),
            "cublasLtMatmulPreferenceSetAttribute": ([vp, i, vp, sz], True),
            "cublasLtMatmulPreferenceDestroy": ([vp], True),
            "cublasLtMatmulAlgoGetHeuristic": (
                [vp, vp, vp, vp, vp, vp, vp, i, vp, ctypes.POINTER(ctypes.c_int)], False,
            ),
            "cublasLtMatmul": (
                [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, sz, vp], False,
            ),
        }  # fmt: skip
        self._fns: dict[str, Any] = {}
        for name, (argtypes, host_only) in sigs.items():
            fn = getattr(held if held is not None and host_only else lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
            self._fns[name] = fn
        self._matmul = self._fns["cublasLtMatmul"]
        self._set_desc = self._fns["cublasLtMatmulDescSetAttribute"]

    def _call(self, name: str, *args: Any) -> None:
        status = self._fns[name](*args)
        if status != 0:
            raise RuntimeError(f"{name} failed: cuBLAS status {status}")

    def _create(self, name: str, *args: Any) -> int:
        made = ctypes.c_void_p()
        self._call(name, ctypes.byref(made), *args)
        return made.value or 0

    def desc_create(self, compute: int, scale: int) -> int:
        return self._create("cublasLtMatmulDescCreate", compute, scale)

    def desc_set(self, desc: int, attr: int, value: Any) -> None:
        """Set an attribute of an operation descriptor to ``value``, a ctypes object of the
        attribute's C type."""
        self._call(
            "cublasLtMatmulDescSetAttribute", desc, attr, ctypes.byref(value),
            ctypes.sizeof(value),
        )  # fmt: skip

    def set_bias(self, desc: int, ptr: Any) -> None:
        """The bias pointer of a descriptor (``ptr``: a ``ctypes.c_void_p`` kept by the
        caller), by the per-call path: one setter call, no size computed."""
        status = self._set_desc(desc, _DESC_BIAS_POINTER, ctypes.byref(ptr), 8)
        if status != 0:
            raise RuntimeError(f"cublasLtMatmulDescSetAttribute failed: cuBLAS status {status}")

    def desc_destroy(self, desc: int) -> None:
        self._call("cublasLtMatmulDescDestroy", desc)

    def layout_create(self, dtype: int, rows: int, cols: int, ld: int) -> int:
        """A column-major ``rows`` x ``cols`` matrix of cudaDataType ``dtype``, columns ``ld``
        elements apart."""
        return self._create("cublasLtMatrixLayoutCreate", dtype, rows, cols, ld)

    def layout_destroy(self, layout: int) -> None:
        self._call("cublasLtMatrixLayoutDestroy", layout)

    def pref_create(self) -> int:
        return self._create("cublasLtMatmulPreferenceCreate")

    def pref_set(self, pref: int, attr: int, value: Any) -> None:
        self._call(
            "cublasLtMatmulPreferenceSetAttribute", pref, attr, ctypes.byref(value),
            ctypes.sizeof(value),
        )  # fmt: skip

    def pref_destroy(self, pref: int) -> None:
        self._call("cublasLtMatmulPreferenceDestroy", pref)

    def heuristic(
        self, handle: int, desc: int, a: int, b: int, c: int, d: int, pref: int
    ) -> Any | None:
        """The heuristic's first result (a :data:`HEURISTIC_BYTES` ctypes buffer whose first
        64 bytes are the algorithm), or None where it finds none for the descriptors."""
        result = (ctypes.c_char * HEURISTIC_BYTES)()
        count = ctypes.c_int(0)
        status = self._fns["cublasLtMatmulAlgoGetHeuristic"](
            handle, desc, a, b, c, d, pref, 1, result, ctypes.byref(count)
        )
        if status != 0 or count.value < 1:
            return None
        if ctypes.c_int.from_buffer(result, _STATE_OFFSET).value != 0:
            return None
        return result

    def matmul(self, *args: Any) -> None:
        """``cublasLtMatmul`` with its sixteen arguments in cuBLASLt's order."""
        status = self._matmul(*args)
        if status != 0:
            raise RuntimeError(f"cublasLtMatmul failed: cuBLAS status {status}")


def _load() -> Any:
    """The :class:`CublasLt` of the cuBLASLt library beside the cuBLAS CuPy loaded (cuBLAS links
    it, so ``dlopen`` finds it by its soname), or None."""
    global _lt
    if _lt is None:
        with _load_lock:
            if _lt is None:
                _lt = blas.open_library("cublasLt", CublasLt)
    return _lt or None


def enabled() -> bool:
    """False where ``ACCELKIT_CUDA_LT=0`` turns the epilogue route off (a way back should a GPU
    run find it slower somewhere: the two-launch path serves)."""
    return os.environ.get("ACCELKIT_CUDA_LT", "").strip() != "0"


def available() -> bool:
    """Whether cuBLASLt can serve (found; only after cuBLAS was, by a GEMM on the submission
    thread: :func:`accelkit_cuda.blas.ready`)."""
    return blas.ready() and _load() is not None


#: A linear's GEMM for :func:`linear_bias`: :func:`accelkit_cuda.blas.plan`'s tuple, the
#: operands' cudaDataType and cuBLAS's compute type.
Signature = tuple[tuple[Any, ...], int, int]


def signature(p: tuple[Any, ...], in_type: int, compute: int) -> Signature | None:
    """The :data:`Signature` of a GEMM :func:`linear_bias` takes, or None: one matrix (no
    batch), every dimension above 1 (PyTorch keeps a row or column vector off cuBLASLt: its
    heuristic refuses some with CUBLAS_STATUS_INVALID_VALUE)."""
    if p[-1] != 1 or min(p[2], p[3], p[4]) < 2:
        return None
    return (p, in_type, compute)


class _Plan:
    """What a call needs, made once: the operation descriptor (epilogue, transposes, bias
    type), the layouts of ``A`` (the weight), ``B`` (the input) and ``D`` (the output, also
    ``C``), the algorithm, the scalars 1 and 0 of the scale type, and a pointer object the
    bias goes through."""

    __slots__ = ("algo", "alpha", "b", "beta", "bias", "d", "desc", "result", "w")

    def __init__(self, desc: int, w: int, b: int, d: int, result: Any, compute: int) -> None:
        self.desc, self.w, self.b, self.d, self.result = desc, w, b, d, result
        self.algo = ctypes.addressof(result)
        _a, _b, self.alpha, self.beta = blas.scalar_args(compute, 1.0, 0.0)
        self.bias = ctypes.c_void_p(0)

    def free(self, lt: CublasLt) -> None:
        _free(lt, self.desc, [self.w, self.b, self.d])


class _ThreadState(threading.local):
    """The plans of a thread that holds no submission thread's turn (tests, scripts); a
    submission thread keeps its own (``lt_plans``), used by whoever holds its turn."""

    plans: dict[tuple[Signature, int], _Plan | None] | None = None


_thread = _ThreadState()


def _build(lt: CublasLt, handle: int, sig: Signature, align: int, workspace: int) -> _Plan | None:
    """The :class:`_Plan` of a signature at an alignment, or None (no algorithm)."""
    p, in_type, compute = sig
    trans_w, trans_x, m, n, k, ldw, ldx, ldd = p[:8]
    scale = _R_64F if compute == _COMPUTE_64F else _R_32F
    desc = lt.desc_create(compute, scale)
    layouts: list[int] = []
    try:
        lt.desc_set(desc, _DESC_TRANSA, ctypes.c_int32(trans_w))
        lt.desc_set(desc, _DESC_TRANSB, ctypes.c_int32(trans_x))
        lt.desc_set(desc, _DESC_EPILOGUE, ctypes.c_uint32(_EPILOGUE_BIAS))
        lt.desc_set(desc, _DESC_BIAS_DATA_TYPE, ctypes.c_int32(in_type))
        # The heuristic reads the bias pointer's alignment from its value (it never reads
        # through it): a placeholder aligned exactly as the plan's key says, so a later call
        # whose bias is aligned less than this one's, but as its key says, is served right.
        lt.desc_set(desc, _DESC_BIAS_POINTER, ctypes.c_void_p(align))
        # Column-major: op(A) = op(weight) is m x k, op(B) = op(input) k x n, D m x n.
        w_rows, w_cols = (m, k) if trans_w == _OP_N else (k, m)
        x_rows, x_cols = (k, n) if trans_x == _OP_N else (n, k)
        layouts.append(lt.layout_create(in_type, w_rows, w_cols, ldw))
        layouts.append(lt.layout_create(in_type, x_rows, x_cols, ldx))
        layouts.append(lt.layout_create(in_type, m, n, ldd))
        pref = lt.pref_create()
        try:
            lt.pref_set(pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.c_uint64(workspace))
            lt.pref_set(pref, _PREF_REDUCTION_SCHEME_MASK, ctypes.c_uint32(_REDUCTION_COMPUTE_TYPE))
            for attr in _PREF_MIN_ALIGNMENT:
                lt.pref_set(pref, attr, ctypes.c_uint32(align))
            w_l, x_l, d_l = layouts
            result = lt.heuristic(handle, desc, w_l, x_l, d_l, d_l, pref)
        finally:
            lt.pref_destroy(pref)
    except BaseException:
        _free(lt, desc, layouts)
        raise
    if result is None:
        _free(lt, desc, layouts)
        return None
    return _Plan(desc, w_l, x_l, d_l, result, compute)


def _free(lt: CublasLt, desc: int, layouts: list[int]) -> None:
    lt.desc_destroy(desc)
    for layout in layouts:
        lt.layout_destroy(layout)


def _key(sig: Signature, x: int, w: int, bias: int, out: int) -> tuple[Signature, int]:
    """A plan's key: the signature and the lowest alignment of the four pointers (at most 256
    bytes), which the heuristic is told."""
    a = x | w | bias | out | 256
    return (sig, a & -a)


def planned(thread: SubmissionThread, sig: Signature, x: int, w: int, bias: int, out: int) -> bool:
    """Whether ``thread`` has looked for the plan :func:`linear_bias` would take for these
    pointers (found or not): a call in its turn on another thread then builds none there."""
    plans = thread.lt_plans
    return plans is not None and _key(sig, x, w, bias, out) in plans


def linear_bias(cp: Any, sig: Signature, x: int, w: int, bias: int, out: int) -> bool:
    """``out = x @ w.T + bias`` over device pointers in one cuBLASLt launch on the current
    stream (the capturing one during a capture), on the submission thread after
    :func:`available`; False (nothing launched) where cuBLASLt has no algorithm for it or
    refuses the launch (the plan is then dropped)."""
    lt = _lt
    owner = turn()
    plans = _thread.plans if owner is None else owner.lt_plans
    if plans is None:
        plans = {}
        if owner is None:
            _thread.plans = plans
        else:
            owner.lt_plans = plans
    stream = capturing.active()
    if stream is None:
        stream = cp.cuda.get_current_stream().ptr
    handle, ws, size = blas.stream_context(cp, stream)
    key = _key(sig, x, w, bias, out)
    plan = plans.get(key)
    if plan is None and key not in plans:
        if len(plans) >= _PLANS:
            for old in plans.values():
                if old is not None:
                    old.free(lt)
            plans.clear()
        plan = plans[key] = _build(lt, handle, sig, key[1], size)
        if plan is None:
            stats["no_algorithm"] += 1
    if plan is None:
        return False
    plan.bias.value = bias
    lt.set_bias(plan.desc, plan.bias)
    try:
        lt.matmul(
            handle, plan.desc, plan.alpha, w, plan.w, x, plan.b, plan.beta, out, plan.d, out,
            plan.d, plan.algo, ws, size, stream,
        )  # fmt: skip
    except RuntimeError:
        # A status other than success launched nothing: the caller's path serves this call
        # and, the plan dropped, every later one of the key (PyTorch's gemm_and_bias also
        # falls back to the unfused GEMM on any cuBLASLt status).
        plans[key] = None
        plan.free(lt)
        stats["launch_failed"] += 1
        return False
    stats["launches"] += 1
    return True
