"""A stand-in for CuPy on the host, recording which thread makes every call.

Enough of CuPy's surface for the CUDA backend to run end to end without a GPU: arrays are NumPy
arrays (a subclass) over host memory that ``runtime.malloc`` hands out, copies are ``memmove``,
streams and events complete at once, modules load anything and their kernels do nothing (but
the raw elementwise and Philox kernels, computed by NumPy ports), and ``cupy.random``'s
generator is NumPy's PCG64.
Every function, array operation, launch, copy, stream and event call appends ``(name, thread
ident)`` to :data:`CALLS`; what counts as a call is what reaches CUDA in real CuPy (making an
array over memory it is given does not; a ufunc, a copy, ``astype`` or a new array does).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.machinery
import math
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

CALLS: list[tuple[str, int]] = []
#: The thread's cuBLAS handle ``cupy.cuda.device.get_cublas_handle`` answers (cuBLASLt is given
#: it too, cast, as PyTorch does).
CUBLAS_HANDLE = 0x6B1A5
#: Device pointers handed out and freed (by ``runtime.malloc`` / ``runtime.free``).
MALLOCED: set[int] = set()
FREED: set[int] = set()
_calls_lock = threading.Lock()


def record(name: str) -> None:
    with _calls_lock:
        CALLS.append((name, threading.get_ident()))


def recorded(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        record(name)
        return fn(*args, **kwargs)

    wrapper.__name__ = name
    return wrapper


# -- device memory ------------------------------------------------------------------------------
_device_memory: dict[int, np.ndarray[Any, Any]] = {}


def _malloc(size: int) -> int:
    record("runtime.malloc")
    block = np.zeros(max(size, 1) + 256, np.uint8)
    ptr = (block.ctypes.data + 255) // 256 * 256
    _device_memory[ptr] = block
    MALLOCED.add(ptr)
    return ptr


def _free(ptr: int) -> None:
    record("runtime.free")
    _device_memory.pop(ptr, None)
    FREED.add(ptr)


def _memcpy(dst: int, src: int, nbytes: int, kind: int, stream: int = 0) -> None:
    record("runtime.memcpyAsync")
    ctypes.memmove(dst, src, nbytes)


class CUDARuntimeError(RuntimeError):
    def __init__(self, status: int) -> None:
        self.status = status
        super().__init__(f"cudaError {status}")


class CUDADriverError(RuntimeError):
    pass


class OutOfMemoryError(MemoryError):
    pass


class _Ptr:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class UnownedMemory:
    def __init__(self, ptr: int, size: int, owner: Any, device_id: int = 0) -> None:
        self.ptr, self.size, self.owner = ptr, size, owner


class MemoryPointer:
    def __init__(self, mem: UnownedMemory, offset: int) -> None:
        self.mem = mem
        self.ptr = mem.ptr + offset


class ndarray(np.ndarray):  # noqa: N801 - CuPy's name
    """A CuPy array: host memory; every new array or operation is recorded."""

    def __new__(
        cls, shape: Any, dtype: Any = float, memptr: MemoryPointer | None = None, **_: Any
    ) -> ndarray:
        dt = np.dtype(dtype)
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        if memptr is None:
            record("ndarray")
            return np.ndarray.__new__(cls, shape, dt)
        n = int(np.prod(shape)) * dt.itemsize
        buf = (ctypes.c_char * max(n, 1)).from_address(memptr.ptr)
        arr = np.ndarray.__new__(cls, shape, dt, buffer=buf)
        arr._owner = memptr  # type: ignore[attr-defined]
        return arr

    def __array_finalize__(self, obj: Any) -> None:
        if obj is not None:
            record("ndarray op")

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        record(f"ufunc {ufunc.__name__}")
        args = [np.asarray(i) if isinstance(i, ndarray) else i for i in inputs]
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(np.asarray(o) if isinstance(o, ndarray) else o for o in out)
        with np.errstate(all="ignore"):  # CuPy's device ufuncs never warn
            result = getattr(ufunc, method)(*args, **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        if isinstance(result, np.ndarray):
            return result.view(ndarray)
        if isinstance(result, tuple):
            return tuple(r.view(ndarray) if isinstance(r, np.ndarray) else r for r in result)
        return result

    def fill(self, value: Any) -> None:
        record("ndarray.fill")
        np.asarray(self).fill(value)

    def __setitem__(self, key: Any, value: Any) -> None:
        record("ndarray.__setitem__")
        np.asarray(self)[key] = np.asarray(value)

    def astype(self, *args: Any, **kwargs: Any) -> Any:
        record("ndarray.astype")
        return np.asarray(self).astype(*args, **kwargs).view(ndarray)

    @property
    def data(self) -> _Ptr:  # type: ignore[override]
        return _Ptr(self.ctypes.data)

    def get(self) -> np.ndarray[Any, Any]:
        record("ndarray.get")
        return np.array(self)


def _wrap_result(value: Any) -> Any:
    if isinstance(value, np.ndarray) and not isinstance(value, ndarray):
        return value.view(ndarray)
    return value


def _array_function(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        record(name)
        return _wrap_result(fn(*args, **kwargs))

    call.__name__ = name
    return call


# -- streams, events, devices ------------------------------------------------------------------
class Stream:
    def __init__(self, non_blocking: bool = False, **_: Any) -> None:
        record("Stream()")
        self.ptr = id(self)

    def __enter__(self) -> Stream:
        record("Stream.__enter__")
        _current.streams.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        record("Stream.__exit__")
        _current.streams.pop()

    def wait_event(self, event: Any) -> None:
        record("Stream.wait_event")

    def synchronize(self) -> None:
        record("Stream.synchronize")

    @property
    def done(self) -> bool:
        record("Stream.done")
        return True

    def begin_capture(self, mode: Any = None) -> None:
        record("Stream.begin_capture")
        CAPTURING.append(self)

    def end_capture(self) -> Graph:
        record("Stream.end_capture")
        CAPTURING.remove(self)
        if FAIL_CAPTURE:
            raise CUDARuntimeError(900)  # cudaErrorStreamCaptureUnsupported
        return Graph()


class _NullStream:
    """The default stream (``cupy.cuda.get_current_stream()`` outside a ``with stream``)."""

    ptr = 0

    def synchronize(self) -> None:
        record("Stream.synchronize")


_NULL_STREAM = _NullStream()


class _Current(threading.local):
    """The streams entered on this thread (``with stream``), innermost last."""

    def __init__(self) -> None:
        self.streams: list[Any] = []


_current = _Current()


def _current_stream() -> Any:
    """``cupy.cuda.get_current_stream()``: the innermost stream entered on this thread."""
    streams = _current.streams
    return streams[-1] if streams else _NULL_STREAM


#: Streams capturing now; set FAIL_CAPTURE to make end_capture fail (an invalidated capture).
CAPTURING: list[Stream] = []
FAIL_CAPTURE = False


class Graph:
    """A captured graph: the stand-in's work ran at capture time, so a launch only counts."""

    def launch(self, stream: Any = None) -> None:
        record("Graph.launch")


@contextlib.contextmanager
def _using_allocator(allocator: Any = None) -> Iterator[None]:
    record("using_allocator")
    yield


class Event:
    def __init__(self, block: bool = False, disable_timing: bool = False, **_: Any) -> None:
        record("Event()")

    def record(self, stream: Any = None) -> None:
        record("Event.record")

    def synchronize(self) -> None:
        record("Event.synchronize")

    @property
    def done(self) -> bool:
        record("Event.done")
        return True


#: The stand-in's CUDA context of device N: ``CONTEXT + N`` (``driver.ctxGetCurrent``).
CONTEXT = 0xC0000


class _Context(threading.local):
    current = 0


_context = _Context()


def _ctx_get() -> int:
    record("driver.ctxGetCurrent")
    return _context.current


def _ctx_set(ctx: int) -> None:
    record("driver.ctxSetCurrent")
    _context.current = ctx


class Device:
    compute_capability = "90"

    def __init__(self, device: int = 0) -> None:
        self.id = device

    def use(self) -> None:
        record("Device.use")
        _context.current = CONTEXT + self.id

    def __enter__(self) -> Device:
        record("Device.__enter__")
        self._before = _context.current
        _context.current = CONTEXT + self.id
        return self

    def __exit__(self, *exc: object) -> None:
        record("Device.__exit__")
        _context.current = self._before


class Function:
    def __init__(self, name: str) -> None:
        self.name = name
        self.ptr = id(self)

    def __call__(self, grid: Any, block: Any, args: Any, **kwargs: Any) -> None:
        record(f"launch {self.name}")
        if self.name.startswith("ew_"):
            _elementwise(self.name, args)
        elif self.name.startswith("philox_"):
            _philox(self.name, args)
        elif self.name.startswith("eu_"):
            _unary(self.name, args)
        elif self.name.startswith("row_"):
            _rows(self.name, grid, args)
        elif self.name.startswith("perm"):
            _permute(self.name, args)
        elif self.name.startswith("eb_add_"):
            _bias_add(self.name, args)


def _bias_add(name: str, args: Any) -> None:
    """What fast_elementwise's ``eb_add_<sfx>`` does: ``o[i] += b[i % cols]`` in o's dtype."""
    dtype = _dtype_of(name.rsplit("_", 1)[1])
    pb, po, n, cols = (int(v) for v in args)
    out = _view(po, n, dtype).reshape(-1, cols)
    out += _view(pb, cols, dtype)


def _permute(name: str, args: Any) -> None:
    """What fast_elementwise's ``perm<bits>_<index>`` copies: output element ``i`` (C order
    over ``d0..d3``) from input offset ``i0*s0 + i1*s1 + i2*s2 + i3*s3``, as a strided view."""
    bits = int(name[4:].split("_")[0])
    dtype = np.dtype(f"u{bits // 8}")
    px, py, n, d1, d2, d3, *steps = (int(v) for v in args)
    d0 = n // (d1 * d2 * d3)
    span = 1 + sum((d - 1) * st for d, st in zip((d0, d1, d2, d3), steps, strict=True))
    src = np.lib.stride_tricks.as_strided(
        _view(px, span, dtype), (d0, d1, d2, d3), [st * dtype.itemsize for st in steps]
    )
    _view(py, n, dtype)[...] = src.reshape(-1)


_EW_UFUNCS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum,
              "minimum": np.minimum}  # fmt: skip


def _elementwise(name: str, args: Any) -> None:
    """What accelkit_cuda.fast_elementwise's kernel ``name`` computes (the operands in F32, or
    F64, rounded once), on the host memory the stand-in's device pointers address."""
    import ml_dtypes

    _, op, sfx = name.split("_", 2)
    dtype = np.dtype({"f32": np.float32, "f64": np.float64, "f16": np.float16,
                      "bf16": ml_dtypes.bfloat16}[sfx])  # fmt: skip
    pa, pb, po, n = (int(v) for v in args)

    def view(ptr: int) -> np.ndarray[Any, Any]:
        buf = (ctypes.c_char * max(n * dtype.itemsize, 1)).from_address(ptr)
        return np.ndarray((n,), dtype, buffer=buf)

    acc = np.float64 if sfx == "f64" else np.float32
    out = _EW_UFUNCS[op](view(pa).astype(acc), view(pb).astype(acc))
    view(po)[...] = out.astype(dtype)


def _philox(name: str, args: Any) -> None:
    """What accelkit_cuda.philox's kernel ``name`` writes (its NumPy port,
    philox_reference.draw), on the host memory the stand-in's device pointer addresses."""
    import ml_dtypes
    import philox_reference

    _, kind, acc, sfx = name.split("_")
    dtype = np.dtype({"f32": np.float32, "f64": np.float64, "f16": np.float16,
                      "bf16": ml_dtypes.bfloat16}[sfx])  # fmt: skip
    ptr, n, k0, k1, a, s = args
    n = int(n)
    buf = (ctypes.c_char * max(n * dtype.itemsize, 1)).from_address(int(ptr))
    out = np.ndarray((n,), dtype, buffer=buf)
    out[...] = philox_reference.draw(kind, n, (int(k0), int(k1)), acc, a, s, dtype)


def _dtype_of(sfx: str) -> np.dtype[Any]:
    import ml_dtypes

    dt: np.dtype[Any] = np.dtype({"f32": np.float32, "f64": np.float64, "f16": np.float16,
                                  "bf16": ml_dtypes.bfloat16}[sfx])  # fmt: skip
    return dt


def _view(ptr: int, n: int, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    buf = (ctypes.c_char * max(n * dtype.itemsize, 1)).from_address(ptr)
    return np.ndarray((n,), dtype, buffer=memoryview(buf))


def _unary_port(op: str, a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """accelkit_cuda.fast_elementwise.UNARY_OPS in NumPy, in ``a``'s (accumulation) dtype."""
    t = a.dtype.type
    erf = np.vectorize(math.erf, otypes=[a.dtype])
    table: dict[str, Callable[[], Any]] = {
        "gelu": lambda: t(0.5) * a * (t(1) + erf(a * t(0.7071067811865476))),
        "gelu_tanh": lambda: t(0.5) * a * (
            t(1) + np.tanh(t(0.7978845608028654) * (a + t(0.044715) * a * a * a))
        ),
        "silu": lambda: a / (t(1) + np.exp(-a)),
        "sigmoid": lambda: t(1) / (t(1) + np.exp(-a)),
        "exp": lambda: np.exp(a), "tanh": lambda: np.tanh(a), "log": lambda: np.log(a),
        "sqrt": lambda: np.sqrt(a), "rsqrt": lambda: t(1) / np.sqrt(a), "sin": lambda: np.sin(a),
        "cos": lambda: np.cos(a), "tan": lambda: np.tan(a), "erf": lambda: erf(a),
        "relu": lambda: np.where((a > 0) | np.isnan(a), a, t(0)),
        "abs": lambda: np.abs(a), "neg": lambda: -a,
    }  # fmt: skip
    with np.errstate(all="ignore"):
        return np.asarray(table[op](), a.dtype)


def _unary(name: str, args: Any) -> None:
    """What fast_elementwise's unary kernel ``name`` (``eu_<op>_<sfx>``) computes."""
    _, rest = name.split("_", 1)
    op, sfx = rest.rsplit("_", 1)
    dtype = _dtype_of(sfx)
    px, po, n = (int(v) for v in args)
    acc = np.float64 if sfx == "f64" else np.float32
    _view(po, n, dtype)[...] = _unary_port(op, _view(px, n, dtype).astype(acc)).astype(dtype)


def _rows(name: str, grid: Any, args: Any) -> None:
    """What fast_elementwise's row kernel ``name`` (``row_<op>_<sfx>``) computes: per row (one
    block each), the reductions in the accumulation type and the special-value rules of the
    CUDA code (a softmax row whose max is not finite is NaN)."""
    _, rest = name.split("_", 1)
    op, sfx = rest.rsplit("_", 1)
    dtype = _dtype_of(sfx)
    acc = np.dtype(np.float64 if sfx == "f64" else np.float32)
    (rows,) = grid
    ptrs = [int(v) for v in args[:-2]] if op in ("layer_norm", "rms_norm") else [int(args[0]),
                                                                                 int(args[1])]  # fmt: skip
    n = int(args[-2]) if op in ("layer_norm", "rms_norm") else int(args[-1])
    x = _view(ptrs[0], rows * n, dtype).astype(acc).reshape(rows, n)
    out = _view(ptrs[-1], rows * n, dtype).reshape(rows, n)
    with np.errstate(all="ignore"):
        if op in ("softmax", "log_softmax", "attn_softmax"):
            m = np.max(x, axis=1, keepdims=True)
            bad = ~np.isfinite(m)
            s = x - np.where(bad, 0, m).astype(acc)
            lse = np.log(np.sum(np.exp(s), axis=1, keepdims=True, dtype=acc))
            res = s - lse if op == "log_softmax" else np.exp(s) / np.exp(lse)
            fill = np.where((m == -np.inf) & (op == "attn_softmax"), 0, np.nan)
            res = np.where(bad, fill, res).astype(acc)
        else:
            eps = acc.type(args[-1])
            if op == "layer_norm":
                d = x - np.sum(x, axis=1, keepdims=True, dtype=acc) / acc.type(n)
            else:
                d = x
            inv = acc.type(1) / np.sqrt(np.sum(d * d, axis=1, keepdims=True, dtype=acc)
                                        / acc.type(n) + eps)  # fmt: skip
            res = d * inv
            params = ptrs[1:-1]
            if params[0]:
                res = res * _view(params[0], n, dtype).astype(acc)
            if op == "layer_norm" and params[1]:
                res = res + _view(params[1], n, dtype).astype(acc)
    out[...] = res.astype(dtype)


class Module:
    def __init__(self) -> None:
        record("Module()")

    def load(self, binary: bytes) -> None:
        record("Module.load")

    def get_function(self, name: str) -> Function:
        record("Module.get_function")
        return Function(name)


class _Pool:
    def free_all_blocks(self) -> None:
        record("pool.free_all_blocks")

    def malloc(self, size: int) -> Any:
        record("pool.malloc")


def _alloc_pinned(nbytes: int) -> bytearray:
    record("alloc_pinned_memory")
    return bytearray(nbytes)


def _erf(x: Any) -> Any:
    record("special.erf")
    arr = np.asarray(x)
    return np.vectorize(math.erf, otypes=[arr.dtype])(arr).view(ndarray)


def _scatter(name: str, ufunc: Any) -> Callable[..., None]:
    def scatter(a: Any, index: Any, values: Any) -> None:
        record(name)
        ufunc.at(np.asarray(a), np.asarray(index), np.asarray(values))

    return scatter


class Generator:
    """``cupy.random.Generator``: NumPy's PCG64 under the stand-in (CuPy's own is XORWOW, so the
    numbers differ from a GPU's; what the tests check is where the draw runs and the arithmetic
    around it). ``out``, as in CuPy, must have the dtype and the shape asked for."""

    def __init__(self, seed: int | None = None) -> None:
        self._rng = np.random.default_rng(seed)

    def _draw(self, name: str, size: Any, dtype: Any, out: Any) -> Any:
        record(f"random.Generator.{name}")
        target = None if out is None else np.asarray(out)
        if target is not None and (target.dtype != np.dtype(dtype) or target.shape != size):
            raise ValueError(f"{name}: out is {target.dtype}{target.shape}")
        values = getattr(self._rng, name)(size, dtype=dtype, out=target)
        return out if out is not None else values.view(ndarray)

    def random(self, size: Any = None, dtype: Any = np.float64, out: Any = None) -> Any:
        return self._draw("random", size, dtype, out)

    def standard_normal(self, size: Any = None, dtype: Any = np.float64, out: Any = None) -> Any:
        return self._draw("standard_normal", size, dtype, out)


_CUBLAS_REFUSAL = "calling cuBLAS API during stream capture is currently unsupported"


def _refuses_capture(name: str) -> Callable[..., Any]:
    """CuPy's cuBLAS-backed functions: CuPy's ``cublas.setStream`` (which each of its cuBLAS
    wrappers calls first) raises this NotImplementedError while the stream is capturing
    (cupy_backends/cuda/libs/cublas.pyx). Integer products take CuPy's own kernel, no cuBLAS."""
    fn = getattr(np, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        record(name)
        floating = any(np.asarray(a).dtype.kind == "f" or np.asarray(a).dtype.name == "bfloat16"
                       for a in args[:2])  # fmt: skip
        if CAPTURING and floating:
            raise NotImplementedError(_CUBLAS_REFUSAL)
        return _wrap_result(fn(*args, **kwargs))

    call.__name__ = name
    return call


def _bf16() -> Any:
    import ml_dtypes

    return ml_dtypes.bfloat16


#: cudaDataType -> the NumPy dtype of its elements.
_CUDA_TYPES: dict[int, Callable[[], Any]] = {
    0: lambda: np.float32, 1: lambda: np.float64, 2: lambda: np.float16, 14: _bf16,
}  # fmt: skip
#: cublasComputeType_t -> the host scalar type cuBLAS reads alpha and beta as.
_SCALAR_TYPES: dict[int, Any] = {68: ctypes.c_float, 77: ctypes.c_float, 70: ctypes.c_double}


class Cublas:
    """A stand-in for cuBLAS as ``accelkit_cuda.blas.Cublas`` calls it (ctypes, no CuPy
    wrapper): each call is recorded in :data:`CALLS` and, with its arguments, in ``calls``;
    GEMMs run in float64 on the host memory behind the stand-in's device pointers, reading
    ``alpha``/``beta`` as the compute type's scalar type (as cuBLAS does), and store in the
    output's type. cuBLAS itself may be captured: nothing here refuses a capturing stream."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def _note(self, name: str, args: tuple[Any, ...]) -> None:
        record(name)
        self.calls.append((name, args))

    def set_stream(self, handle: int, stream: int) -> None:
        self._note("cublasSetStream", (handle, stream))

    def set_workspace(self, handle: int, ptr: int, size: int) -> None:
        self._note("cublasSetWorkspace", (handle, ptr, size))

    def set_pointer_mode(self, handle: int, mode: int) -> None:
        self._note("cublasSetPointerMode", (handle, mode))

    def gemm_ex(self, *args: Any) -> None:
        self._note("cublasGemmEx", args)
        _h, ta, tb, m, n, k, alpha, pa, at, lda, pb, bt, ldb, beta, pc, ct, ldc, comp, _ = args
        self._gemm(ta, tb, m, n, k, alpha, (pa, at, lda, 0), (pb, bt, ldb, 0), beta,
                   (pc, ct, ldc, 0), 1, comp)  # fmt: skip

    def gemm_strided_batched_ex(self, *args: Any) -> None:
        self._note("cublasGemmStridedBatchedEx", args)
        (_h, ta, tb, m, n, k, alpha, pa, at, lda, sa, pb, bt, ldb, sb, beta, pc, ct, ldc, sc,
         batch, comp, _) = args  # fmt: skip
        self._gemm(ta, tb, m, n, k, alpha, (pa, at, lda, sa), (pb, bt, ldb, sb), beta,
                   (pc, ct, ldc, sc), batch, comp)  # fmt: skip

    @staticmethod
    def _gemm(ta: int, tb: int, m: int, n: int, k: int, alpha: int, a: Any, b: Any, beta: int,
              c: Any, batch: int, compute: int) -> None:  # fmt: skip
        """C = alpha op(A) op(B) + beta C, column-major, over raw memory."""
        kind = _SCALAR_TYPES[compute]
        al, be = kind.from_address(alpha).value, kind.from_address(beta).value

        def flat(ptr: int, dtype_code: int, count: int) -> np.ndarray[Any, Any]:
            dtype = np.dtype(_CUDA_TYPES[dtype_code]())
            buf = (ctypes.c_char * (count * dtype.itemsize)).from_address(ptr)
            return np.ndarray((count,), dtype, buffer=buf)

        def op(x: np.ndarray[Any, Any], off: int, trans: int, rows: int, cols: int,
               ld: int) -> np.ndarray[Any, Any]:  # fmt: skip
            stored = (rows, cols) if trans == 0 else (cols, rows)  # column-major, ld apart
            mat = np.lib.stride_tricks.as_strided(
                x[off:], shape=stored, strides=(x.itemsize, ld * x.itemsize)
            ).astype(np.float64)
            return mat if trans == 0 else mat.T

        (pa, at, lda, sa), (pb, bt, ldb, sb), (pc, ct, ldc, sc) = a, b, c
        span_a = sa * (batch - 1) + lda * (k if ta == 0 else m)
        span_b = sb * (batch - 1) + ldb * (n if tb == 0 else k)
        span_c = sc * (batch - 1) + ldc * n
        fa, fb, fc = flat(pa, at, span_a), flat(pb, bt, span_b), flat(pc, ct, span_c)
        for i in range(batch):
            prod = op(fa, i * sa, ta, m, k, lda) @ op(fb, i * sb, tb, k, n, ldb)
            cv = np.lib.stride_tricks.as_strided(
                fc[i * sc :], shape=(m, n), strides=(fc.itemsize, ldc * fc.itemsize)
            )
            old = cv.astype(np.float64) if be != 0 else 0.0
            cv[...] = (al * prod + be * old).astype(fc.dtype)


class CublasLt:
    """A stand-in for cuBLASLt as ``accelkit_cuda.blaslt.CublasLt`` calls it: handles,
    descriptors, layouts and preferences are dicts behind integer handles, each setter's value
    read from its ctypes object; every call is recorded in :data:`CALLS` (and ``calls``).
    ``cublasLtMatmul`` computes ``D = alpha op(A) op(B) + beta C`` plus the bias epilogue in
    float64 over the host memory behind the pointers and rounds once to ``D``'s type (as
    cuBLASLt adds the bias in the scale type), after checking what cuBLASLt requires: the
    bias of ``D``'s type and of ``D``'s row count, the scale type of the compute type, every
    pointer aligned as the heuristic's preference declared, and the algorithm one the
    heuristic returned for these descriptors, split-K reductions in the compute type only for
    F16/BF16. ``algorithms=False``: the heuristic finds none; ``launch_status``: what
    ``cublasLtMatmul`` fails with (RuntimeError, as the ctypes wrapper raises), 0 to run."""

    def __init__(self, algorithms: bool = True, launch_status: int = 0) -> None:
        self.algorithms = algorithms
        self.launch_status = launch_status
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.objects: dict[int, dict[str, Any]] = {}
        self._next = 0x1000
        self._algos: dict[int, tuple[int, int, int, int, int]] = {}

    def _note(self, name: str, args: tuple[Any, ...]) -> None:
        record(name)
        self.calls.append((name, args))

    def _new(self, **fields: Any) -> int:
        self._next += 16
        self.objects[self._next] = fields
        return self._next

    def live(self, kind: str) -> int:
        """How many objects of ``kind`` (desc, layout, pref) exist (made, not destroyed)."""
        return sum(1 for o in self.objects.values() if o["kind"] == kind)

    def desc_create(self, compute: int, scale: int) -> int:
        self._note("cublasLtMatmulDescCreate", (compute, scale))
        return self._new(kind="desc", compute=compute, scale=scale, attrs={})

    def desc_set(self, desc: int, attr: int, value: Any) -> None:
        self._note("cublasLtMatmulDescSetAttribute", (desc, attr, value.value))
        self.objects[desc]["attrs"][attr] = value.value

    def set_bias(self, desc: int, ptr: Any) -> None:
        self._note("cublasLtMatmulDescSetAttribute", (desc, 8, ptr.value))
        self.objects[desc]["attrs"][8] = ptr.value

    def desc_destroy(self, desc: int) -> None:
        self._note("cublasLtMatmulDescDestroy", (desc,))
        assert self.objects.pop(desc)["kind"] == "desc"

    def layout_create(self, dtype: int, rows: int, cols: int, ld: int) -> int:
        self._note("cublasLtMatrixLayoutCreate", (dtype, rows, cols, ld))
        assert ld >= rows  # column-major, columns ld apart
        return self._new(kind="layout", dtype=dtype, rows=rows, cols=cols, ld=ld)

    def layout_destroy(self, layout: int) -> None:
        self._note("cublasLtMatrixLayoutDestroy", (layout,))
        assert self.objects.pop(layout)["kind"] == "layout"

    def pref_create(self) -> int:
        self._note("cublasLtMatmulPreferenceCreate", ())
        return self._new(kind="pref", attrs={})

    def pref_set(self, pref: int, attr: int, value: Any) -> None:
        self._note("cublasLtMatmulPreferenceSetAttribute", (pref, attr, value.value))
        self.objects[pref]["attrs"][attr] = value.value

    def pref_destroy(self, pref: int) -> None:
        self._note("cublasLtMatmulPreferenceDestroy", (pref,))
        assert self.objects.pop(pref)["kind"] == "pref"

    def heuristic(
        self, handle: int, desc: int, a: int, b: int, c: int, d: int, pref: int
    ) -> Any | None:
        self._note("cublasLtMatmulAlgoGetHeuristic", (handle, desc, a, b, c, d, pref))
        assert handle == CUBLAS_HANDLE
        attrs = self.objects[pref]["attrs"]
        aligns = tuple(attrs.get(i, 256) for i in (5, 6, 7, 8))
        bias = self.objects[desc]["attrs"].get(8, 0)
        if self.objects[d]["dtype"] in (2, 14):  # F16/BF16: no 16-bit split-K reduction
            assert attrs.get(3, 7) & ~2 == 0, attrs
        # cuBLASLt reads the bias pointer's alignment from its value here
        if not self.algorithms or any(bias % al for al in aligns):
            return None
        result = (ctypes.c_char * 96)()
        ident = len(self._algos) + 1
        ctypes.c_int64.from_buffer(result, 0).value = ident
        self._algos[ident] = aligns
        return result

    def matmul(self, *args: Any) -> None:
        self._note("cublasLtMatmul", args)
        (_h, desc, alpha, pa, adesc, pb, bdesc, beta, pc, cdesc, pd, ddesc, algo, ws, size,
         _stream) = args  # fmt: skip
        assert _h == CUBLAS_HANDLE
        if self.launch_status:
            raise RuntimeError(f"cublasLtMatmul failed: cuBLAS status {self.launch_status}")
        aligns = self._algos[ctypes.c_int64.from_address(algo).value]
        op = self.objects[desc]
        attrs = op["attrs"]
        assert attrs[8] % min(aligns) == 0  # the bias aligned as the heuristic was told
        assert op["scale"] == (1 if op["compute"] == 70 else 0)
        la, lb, lc, ld = (self.objects[h] for h in (adesc, bdesc, cdesc, ddesc))
        for ptr, al in zip((pa, pb, pc, pd), aligns, strict=True):
            assert ptr % al == 0, (ptr, al)
        assert ws
        assert size >= 0
        kind = _SCALAR_TYPES[op["compute"]]
        al_v, be_v = kind.from_address(alpha).value, kind.from_address(beta).value

        def mat(ptr: int, lay: dict[str, Any]) -> np.ndarray[Any, Any]:
            dtype = np.dtype(_CUDA_TYPES[lay["dtype"]]())
            span = lay["ld"] * (lay["cols"] - 1) + lay["rows"]
            buf = (ctypes.c_char * (span * dtype.itemsize)).from_address(ptr)
            flat = np.ndarray((span,), dtype, buffer=buf)
            return np.lib.stride_tricks.as_strided(
                flat, shape=(lay["rows"], lay["cols"]),
                strides=(dtype.itemsize, lay["ld"] * dtype.itemsize),
            )  # fmt: skip

        a = mat(pa, la).astype(np.float64)
        b = mat(pb, lb).astype(np.float64)
        a = a.T if attrs.get(3, 0) else a
        b = b.T if attrs.get(4, 0) else b
        res = al_v * (a @ b)
        if be_v != 0:
            res = res + be_v * mat(pc, lc).astype(np.float64)
        epilogue = attrs.get(7, 1)
        if epilogue & 4:  # BIAS: bias[i] added to row i of D
            assert attrs.get(26, -1) in (-1, ld["dtype"])  # the bias is of D's type
            bias_t = np.dtype(_CUDA_TYPES[ld["dtype"]]())
            rows = ld["rows"]
            buf = (ctypes.c_char * (rows * bias_t.itemsize)).from_address(attrs[8])
            res = res + np.ndarray((rows,), bias_t, buffer=buf).astype(np.float64)[:, None]
        assert epilogue in (1, 4)
        out = mat(pd, ld)
        out[...] = res.astype(out.dtype)


class _FakeCupy(types.ModuleType):
    """``cupy``: the names above, and NumPy's functions (recorded) for the rest."""

    def __getattr__(self, name: str) -> Any:
        value = getattr(np, name)
        if isinstance(value, type) or not callable(value):
            return value  # dtypes, classes and constants: no device call
        return _array_function(name, value)


def install() -> dict[str, types.ModuleType]:
    """The fake modules, keyed by their import names (put them into ``sys.modules``)."""
    cupy = _FakeCupy("cupy")
    cupy.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
    cupy.__version__ = "13.6.0"  # type: ignore[attr-defined]
    cupy.ndarray = ndarray  # type: ignore[attr-defined]
    cupy.get_default_memory_pool = lambda: _Pool()  # type: ignore[attr-defined]
    cupy.get_default_pinned_memory_pool = lambda: _Pool()  # type: ignore[attr-defined]
    cupy.asarray = _array_function("asarray", np.asarray)  # type: ignore[attr-defined]
    cupy.empty = _array_function("empty", np.empty)  # type: ignore[attr-defined]
    for name in ("matmul", "dot", "tensordot", "inner", "vdot", "einsum"):
        setattr(cupy, name, _refuses_capture(name))
    cuda = types.ModuleType("cupy.cuda")
    runtime = types.ModuleType("cupy.cuda.runtime")
    runtime.malloc = _malloc  # type: ignore[attr-defined]
    runtime.free = _free  # type: ignore[attr-defined]
    runtime.memcpyAsync = _memcpy  # type: ignore[attr-defined]
    runtime.memcpyHostToDevice = 1  # type: ignore[attr-defined]
    runtime.memcpyDeviceToHost = 2  # type: ignore[attr-defined]
    runtime.CUDARuntimeError = CUDARuntimeError  # type: ignore[attr-defined]
    driver = types.ModuleType("cupy.cuda.driver")
    driver.CUDADriverError = CUDADriverError  # type: ignore[attr-defined]
    driver.ctxGetCurrent = _ctx_get  # type: ignore[attr-defined]
    driver.ctxSetCurrent = _ctx_set  # type: ignore[attr-defined]
    driver.funcGetAttribute = recorded("driver.funcGetAttribute", lambda a, f: 1024)  # type: ignore[attr-defined]
    driver.funcSetAttribute = recorded("driver.funcSetAttribute", lambda f, a, v: None)  # type: ignore[attr-defined]
    memory = types.ModuleType("cupy.cuda.memory")
    memory.OutOfMemoryError = OutOfMemoryError  # type: ignore[attr-defined]
    function = types.ModuleType("cupy.cuda.function")
    function.Module = Module  # type: ignore[attr-defined]
    for name, value in {
        "runtime": runtime, "driver": driver, "memory": memory, "function": function,
        "Stream": Stream, "Event": Event, "Device": Device, "MemoryPointer": MemoryPointer,
        "UnownedMemory": UnownedMemory, "alloc_pinned_memory": _alloc_pinned,
        "get_elapsed_time": recorded("get_elapsed_time", lambda a, b: 0.0),
        "set_allocator": recorded("set_allocator", lambda f: None),
        "set_pinned_memory_allocator": recorded("set_pinned_memory_allocator", lambda f: None),
        "MemoryPool": _Pool, "PinnedMemoryPool": _Pool, "Graph": Graph,
        "using_allocator": _using_allocator,
        "is_available": lambda: True,
    }.items():  # fmt: skip
        setattr(cuda, name, value)
    device = types.ModuleType("cupy.cuda.device")
    device.get_cublas_handle = recorded("get_cublas_handle", lambda: CUBLAS_HANDLE)  # type: ignore[attr-defined]
    cuda.device = device  # type: ignore[attr-defined]
    cuda.get_current_stream = _current_stream  # type: ignore[attr-defined]
    cuda.alloc = lambda size: MemoryPointer(UnownedMemory(_malloc(size), size, None), 0)  # type: ignore[attr-defined]
    cupy.cuda = cuda  # type: ignore[attr-defined]
    random = types.ModuleType("cupy.random")
    random.default_rng = recorded("random.default_rng", Generator)  # type: ignore[attr-defined]
    random.Generator = Generator  # type: ignore[attr-defined]
    cupy.random = random  # type: ignore[attr-defined]
    util = types.ModuleType("cupy._util")
    util.clear_memo = recorded("clear_memo", lambda: None)  # type: ignore[attr-defined]
    cupy._util = util  # type: ignore[attr-defined]
    cupyx = types.ModuleType("cupyx")
    cupyx.scatter_max = _scatter("scatter_max", np.maximum)  # type: ignore[attr-defined]
    cupyx.scatter_min = _scatter("scatter_min", np.minimum)  # type: ignore[attr-defined]
    scipy = types.ModuleType("cupyx.scipy")
    special = types.ModuleType("cupyx.scipy.special")
    special.erf = _erf  # type: ignore[attr-defined]
    scipy.special = special  # type: ignore[attr-defined]
    cupyx.scipy = scipy  # type: ignore[attr-defined]
    return {
        "cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.runtime": runtime,
        "cupy.cuda.driver": driver, "cupy.cuda.memory": memory, "cupy.cuda.function": function,
        "cupy.cuda.device": device, "cupy._util": util, "cupy.random": random, "cupyx": cupyx,
        "cupyx.scipy": scipy,
        "cupyx.scipy.special": special,
    }  # fmt: skip


__all__ = ["CALLS", "CONTEXT", "FREED", "MALLOCED", "Cublas", "install", "record"]
