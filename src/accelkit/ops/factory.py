"""``TensorFactory``: making tensors on a backend's device.

Factory calls are submissions like TensorOps calls: they return a tensor at once, and the fill
runs in stream order. ``from_host`` snapshots its input before returning, so the caller may reuse
the host array at once. Seeded random tensors are generated with NumPy's PCG64 on the host by
default, so the same seed gives the same values on every backend.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import anyio.to_thread
import numpy as np

from accelkit._core.host_memory import OFF_LOOP_COPY_BYTES
from accelkit._core.validation import (
    check_dtype,
    check_float_param,
    check_int,
    check_seed,
    check_shape,
)
from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError
from accelkit.ops._mixins.base import OpsBase
from accelkit.ops._mixins.elementwise import _bounds, check_int_scalar
from accelkit.sdk.kernels import FactoryKernels, RandomDraw, uniform_range
from accelkit.tensor import Tensor

__all__ = ["TensorFactory"]

ShapeLike = int | tuple[int, ...] | list[int]
#: A number argument: a Python one or a NumPy scalar (``np.float32(1.5)``), as NumPy takes.
Number = int | float | np.integer[Any] | np.floating[Any] | np.bool_


#: The range of I64 (arange computes integer arguments in it).
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1

#: The Python scalars from_host reads as Python numbers (exact types: NumPy's float64 scalar
#: is a float too, and keeps its dtype), besides lists and tuples.
_PYTHON_SCALARS = frozenset({float, int, bool})


def _big_int(data: Any, arr: np.ndarray[Any, Any]) -> bool:
    """Whether Python ints NumPy read as float64 (ints that fit no 64-bit type together, as
    ``[2**63, -1]``) or as objects (``[2**64]``) hold one beyond I64, with no float among them:
    looked for in float64 data only where a value is that large."""
    if arr.dtype.kind == "f" and (
        not arr.size or not np.isfinite(arr).all() or np.abs(arr).max() < 2.0**63
    ):
        return False
    if arr.dtype.kind == "u" and (not arr.size or int(arr.max()) <= _I64_MAX):
        return False  # typed unsigned data (u8 image planes in a list): no Python int beyond
    stack, big = [data], False
    while stack:
        item = stack.pop()
        if type(item) is float:  # floats among them: the data is F32's, as any float list
            return False
        if type(item) is int and not _I64_MIN <= item <= _I64_MAX:
            big = True
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return big


def _number(value: Any) -> Any:
    """A NumPy scalar (``np.float32(1.5)``, ``np.int64(3)``) as the Python number it holds, as
    NumPy's own functions take one; anything else as it is."""
    return value.item() if isinstance(value, np.generic) else value


def _shown(value: int | float) -> str:
    """``value`` for an error message: an int of hundreds of digits by its first ones."""
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:8]}... ({len(text)} digits)"


def _check_float_fits(op: str, name: str, value: int | float, dt: DType) -> None:
    """A finite number that floating ``dt`` holds only as an infinity (``1e39`` in F32,
    ``70000`` in F16, an int beyond float64) is refused, as PyTorch refuses it; an infinity
    given is kept."""
    try:
        v = float(value)
    except OverflowError:  # an int beyond float64's range
        raise InvalidArgumentError(
            f"{op}: {name}={_shown(value)} is beyond the range of {dt.value}"
        ) from None
    if -65504.0 <= v <= 65504.0:  # every float dtype holds it (F16's largest): the common case
        return
    if math.isfinite(v):
        with np.errstate(over="ignore"):
            stored = np.array(v, dt.to_numpy())
        if not np.isfinite(stored):
            big = float(np.finfo(dt.to_numpy()).max)
            raise InvalidArgumentError(
                f"{op}: {name}={_shown(value)} overflows {dt.value} (its largest value is {big:g})"
            )


def _check_holds(op: str, name: str, value: int | float, dt: DType) -> None:
    """``value`` must be one ``dt`` holds: an integer dtype's range (a float's integer part,
    as the cast keeps it), 0 or 1 for BOOL, a finite float's dtype without overflow."""
    if dt.is_floating:
        _check_float_fits(op, name, value, dt)
        return
    lo, hi = (0, 1) if dt is DType.BOOL else _bounds(dt)
    if not ((isinstance(value, int) or math.isfinite(value)) and lo <= math.trunc(value) <= hi):
        raise InvalidArgumentError(
            f"{op}: {name}={_shown(value)} does not fit {dt.value} ({lo}..{hi})"
        )


def _python_data_as(data: Any, dt: DType) -> np.ndarray[Any, Any]:
    """Python numbers (a scalar, nested lists or tuples) read as ``dt``, by NumPy 2's rules: a
    Python int must fit the dtype (``[300]`` as U8 is refused, not wrapped; NumPy 1.x only
    warned), typed values in the lists (NumPy scalars, arrays) are cast as ``astype`` casts
    them, floats round (to an infinity where they overflow a float dtype, as a cast does)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # NumPy 1.x: an int out of bounds
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                return np.asarray(data, dtype=dt.to_numpy())
        except (OverflowError, ValueError, TypeError, DeprecationWarning) as exc:
            raise InvalidArgumentError(
                f"from_host: cannot read {type(data).__name__} as {dt.value}: {exc}"
            ) from None


class TensorFactory(OpsBase[FactoryKernels]):
    """Creates tensors: validates, allocates through the backend's FactoryKernels (``accelkit.sdk``)
    and calls its ``fill``, ``from_host`` or ``generate``."""

    def empty(self, shape: ShapeLike, dtype: DType | str = DType.F32) -> Tensor:
        """Uninitialized memory (reading it before writing gives arbitrary values)."""
        return self._empty(check_shape(shape), check_dtype(self.backend, dtype))

    def full(self, shape: ShapeLike, value: Number, dtype: DType | str = DType.F32) -> Tensor:
        """Every element ``value`` (a Python or NumPy number), which the dtype must hold: an
        integer dtype's range, and for a float dtype a finite value that does not overflow it
        (``full(s, 1e39, "f32")`` is refused, as PyTorch refuses it; ``inf`` is kept)."""
        value = _number(value)
        if not isinstance(value, int | float):  # bool is an int
            raise InvalidArgumentError(f"full: value must be a number; got {type(value).__name__}")
        # A value the dtype cannot hold is refused before anything is allocated.
        dt = check_dtype(self.backend, dtype)
        if not dt.is_floating and not isinstance(value, bool):
            if isinstance(value, float) and not value.is_integer():
                raise InvalidArgumentError(f"full: {value} is not representable in {dt.value}")
            check_int_scalar("full", "value", int(value), dt)
        elif dt.is_floating:
            _check_float_fits("full", "value", value, dt)
        out = self.empty(shape, dt)
        self.kernels.fill(out, value)
        return out

    def zeros(self, shape: ShapeLike, dtype: DType | str = DType.F32) -> Tensor:
        return self.full(shape, 0, dtype)

    def ones(self, shape: ShapeLike, dtype: DType | str = DType.F32) -> Tensor:
        return self.full(shape, 1, dtype)

    def empty_like(self, x: Tensor, dtype: DType | str | None = None) -> Tensor:
        return self.empty(x.shape, x.dtype if dtype is None else dtype)

    def zeros_like(self, x: Tensor, dtype: DType | str | None = None) -> Tensor:
        return self.zeros(x.shape, x.dtype if dtype is None else dtype)

    def arange(
        self,
        start: Number,
        stop: Number | None = None,
        step: Number = 1,
        dtype: DType | str | None = None,
    ) -> Tensor:
        """``start, start+step, ...`` below ``stop`` (``arange(n)`` is ``0..n-1``).

        The dtype defaults to I64 for int arguments, F32 otherwise; every value must fit the
        dtype (``arange(250, 260, dtype="u8")`` is refused rather than wrapping to 0).
        """
        return self._arange(_number(start), _number(stop), _number(step), dtype)

    def _arange(
        self,
        start: int | float,
        stop: int | float | None,
        step: int | float,
        dtype: DType | str | None,
    ) -> Tensor:
        if stop is None:
            start, stop = 0, start
        for name, v in (("start", start), ("stop", stop), ("step", step)):
            check_float_param(v, f"arange: {name}", finite=True)
        if step == 0:
            raise InvalidArgumentError("arange: step must not be 0")
        all_int = all(isinstance(v, int) for v in (start, stop, step))
        dt = check_dtype(
            self.backend, dtype if dtype is not None else (DType.I64 if all_int else DType.F32)
        )
        count = (stop - start) / step  # finite operands; the quotient may still overflow
        if not math.isfinite(count):
            raise InvalidArgumentError(
                f"arange: ({stop} - {start}) / {step} elements is more than any device holds"
            )
        # ceil((stop - start) / step), exactly for integers (the float quotient rounds).
        length = -((start - stop) // step) if all_int else math.ceil(count)
        n = check_shape((max(0, length),), "arange: length")[0]
        if all_int:
            # In integers, exactly (in float64, 2**53 + 1 came out as 2**53).
            last = start + (n - 1) * step if n else start
            if not (min(start, last) >= _I64_MIN and max(start, last) <= _I64_MAX):
                raise InvalidArgumentError(
                    f"arange: the values {start} .. {last} do not fit in 64-bit integers"
                )
            if n:  # and in the dtype asked for (u8 from 250 wrapped to 0 after 255)
                _check_holds("arange", "start", start, dt)
                _check_holds("arange", "the last value", last, dt)
            # Modulo 2**64, where every value in between fits (start + i * step wraps back).
            i0, di = np.uint64(start % (1 << 64)), np.uint64(step % (1 << 64))
            out = self._empty((n,), dt)
            self.kernels.generate(
                out, lambda: (np.arange(n, dtype=np.uint64) * di + i0).view(np.int64)
            )
            return out
        if n:
            _check_holds("arange", "start", start, dt)
            _check_holds("arange", "the last value", start + (n - 1) * step, dt)
        out = self._empty((n,), dt)
        self.kernels.generate(out, lambda: np.arange(n, dtype=np.float64) * step + start)
        return out

    def eye(
        self, n: int, m: int | None = None, dtype: DType | str = DType.F32, *, k: int = 0
    ) -> Tensor:
        """``[n, m]`` with ones on diagonal ``k`` (0 the main one, positive above it)."""
        n = check_int(n, "n", minimum=0)
        m = n if m is None else check_int(m, "m", minimum=0)
        k = max(-n - 1, min(check_int(k, "k"), m + 1))  # beyond the matrix: all zeros
        out = self.empty((n, m), dtype)
        self.kernels.generate(out, lambda: np.eye(n, m, k))
        return out

    def from_host(self, data: Any, dtype: DType | str | None = None) -> Tensor:
        """Copy array-like ``data`` (a NumPy array, nested lists, a scalar, anything with the
        buffer protocol) to the device. The dtype defaults to the data's (Python floats give F32,
        Python ints I64). With ``dtype``, Python numbers must fit it (``[300]`` is refused for
        U8, as NumPy 2 refuses it) and arrays are cast as NumPy's ``astype`` casts them."""
        if isinstance(data, Tensor):
            raise InvalidArgumentError("from_host takes host data; use to_device() for a Tensor")
        python = type(data) in _PYTHON_SCALARS or isinstance(data, list | tuple)
        if dtype is not None and python:  # read as the dtype: its ints must fit
            dt = check_dtype(self.backend, DType.from_any(dtype))
            arr = _python_data_as(data, dt)
        else:
            try:
                arr = np.asarray(data)
            except (ValueError, TypeError) as exc:
                raise InvalidArgumentError(
                    f"from_host: cannot read {type(data).__name__}: {exc}"
                ) from None
            if dtype is not None:  # typed data, cast as astype casts it
                dt = DType.from_any(dtype)
            elif python:  # Python numbers (a list or tuple may hold typed ones): floats give F32
                if arr.dtype.kind in "ufO" and _big_int(data, arr):
                    raise InvalidArgumentError(
                        "from_host: Python ints beyond the range of I64 (-2**63 .. 2**63 - 1);"
                        " pass dtype= (for example 'u64') to convert them"
                    )
                dt = DType.F32 if arr.dtype == np.float64 else DType.from_any(arr.dtype)
            else:  # typed data (an array, a buffer, anything with __array__) keeps its dtype
                dt = DType.from_any(arr.dtype)
        dt = check_dtype(self.backend, dt)
        out = self._empty(check_shape(arr.shape), dt)
        self.kernels.from_host(out, arr)
        return out

    async def from_host_async(self, data: Any, dtype: DType | str | None = None) -> Tensor:
        """:meth:`from_host` for async code with large arrays: the same result, but an array of
        1 MiB or more is snapshotted on a worker thread, so the event loop keeps running (a
        plain ``from_host`` must copy before it returns, on the calling thread: 10 to 20 ms for
        64 MiB here). Do not modify ``data`` until the await returns. Small arrays are copied
        at once, as ``from_host`` does."""
        if isinstance(data, Tensor):
            raise InvalidArgumentError(
                "from_host_async takes host data; use to_device() for a Tensor"
            )
        if isinstance(data, np.ndarray) and data.nbytes >= OFF_LOOP_COPY_BYTES:
            tensor: Tensor = await anyio.to_thread.run_sync(self.from_host, data, dtype)
            return tensor
        return self.from_host(data, dtype)

    def uniform(
        self,
        shape: ShapeLike,
        low: float = 0.0,
        high: float = 1.0,
        *,
        seed: int | None = None,
        dtype: DType | str = DType.F32,
    ) -> Tensor:
        """Uniform samples in ``[low, high)``; the same ``seed`` gives the same values on the
        same backend. Backends that draw on the host (``kernels.device_random`` false: the CPU
        backend and most others) draw NumPy's PCG64 stream, so their seeds agree with
        ``numpy.random.default_rng(seed).uniform``; a backend with a device generator draws its
        own."""
        lo = check_float_param(low, "low", finite=True)
        hi = check_float_param(high, "high", finite=True)
        seed = check_seed(seed, "uniform")
        if not hi >= lo:
            raise InvalidArgumentError(f"uniform: high ({hi}) must be >= low ({lo})")
        if not math.isfinite(hi - lo):
            raise InvalidArgumentError(
                f"uniform: high - low ({hi} - {lo}) is beyond float64's range"
            )
        dims, dt = check_shape(shape), self._float_dtype(dtype, "uniform")
        if lo < hi and uniform_range(lo, hi, dt.to_numpy()) is None:
            raise InvalidArgumentError(  # (its samples came out below low)
                f"uniform: {dt.value} holds no value in [{lo}, {hi})"
            )
        out = self._empty(dims, dt)
        self.kernels.random(out, RandomDraw("uniform", lo, hi, dims, seed, dt))
        return out

    def normal(
        self,
        shape: ShapeLike,
        mean: float = 0.0,
        std: float = 1.0,
        *,
        seed: int | None = None,
        dtype: DType | str = DType.F32,
    ) -> Tensor:
        """Normal samples; the same ``seed`` gives the same values on the same backend (see
        :meth:`uniform` for which generator)."""
        mu = check_float_param(mean, "mean", finite=True)
        sd = check_float_param(std, "std", finite=True)
        seed = check_seed(seed, "normal")
        if sd < 0:
            raise InvalidArgumentError(f"normal: std must be >= 0; got {sd}")
        dims, dt = check_shape(shape), self._float_dtype(dtype, "normal")
        out = self._empty(dims, dt)
        self.kernels.random(out, RandomDraw("normal", mu, sd, dims, seed))
        return out

    def _float_dtype(self, dtype: DType | str, op: str) -> DType:
        dt = check_dtype(self.backend, dtype)
        if not dt.is_floating:
            raise InvalidArgumentError(f"{op}: dtype must be floating; got {dt.value}")
        return dt

    def from_dlpack(self, obj: Any) -> Tensor:
        """Import a DLPack producer (copying it into this backend's memory)."""
        rec = getattr(self.backend, "_capture", None)
        if rec is not None and isinstance(obj, Tensor):
            # A read of a tensor's device memory, as to_device's: a replay would not read it
            # again (another producer's array is a constant, as from_host's).
            rec.refuse("from_dlpack of a Tensor (a read of its memory)")
        try:
            arr = np.from_dlpack(obj)
        except (TypeError, BufferError, RuntimeError, AttributeError) as exc:
            raise InvalidArgumentError(
                f"from_dlpack: cannot import {type(obj).__name__}: {exc}"
            ) from None
        return self.from_host(arr)

    async def to_device(self, x: Tensor) -> Tensor:
        """Copy a tensor of any backend to this one (waits for the source's last writer)."""
        if not isinstance(x, Tensor):
            raise InvalidArgumentError(f"to_device takes a Tensor; got {type(x).__name__}")
        rec = getattr(self.backend, "_capture", None)  # (a StreamBackend's open capture)
        if rec is not None:
            # A host read of x, whatever its backend: a replay would not read it again.
            rec.refuse("to_device (a host read of its source)")
        host = await x.to_host()
        return self.from_host(host, dtype=x.dtype)
