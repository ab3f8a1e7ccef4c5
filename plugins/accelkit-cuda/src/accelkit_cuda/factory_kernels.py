"""The CUDA backend's TensorFactory: fills and random numbers on the device, host data by pinned
async copies.

``from_host`` snapshots its input on the caller's thread (plain NumPy, as the contract asks);
the pinned staging block, the copy into it and the ``cudaMemcpyAsync`` happen on the submission
thread. Range tensors are made there too (``generate``), never on the loop's thread.

Random tensors (``uniform``, ``normal``) are drawn on the device by Philox4x32-10, a
counter-based generator (:mod:`accelkit_cuda.philox`: the key is the seed, the counter the
element index), one raw NVRTC launch per draw that writes the output's dtype directly, from the
submission thread in stream order like every other kernel (:meth:`CUDAFactoryKernels.random`,
:func:`device_draw`). A seed gives the same numbers on every CUDA run and any grid, and not the
numbers of NumPy's PCG64 that the host backends draw. If NVRTC is missing (the kernels failed to
compile or load at ``initialize``), CuPy's generator draws instead
(``cupy.random.default_rng(seed)``, XORWOW: other numbers for a seed, a state initialised per
draw). Before 0.3.0 CuPy's generator drew every time, so a seed's CUDA numbers changed with the
switch. **Unverified on a GPU** when written (issues 27/29).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cupy
import numpy as np

from accelkit.dtype import DType
from accelkit.sdk import FactoryKernels, RandomDraw, buffer_of, uniform_range
from accelkit.sdk import host_assign as assign
from accelkit.tensor import Tensor
from accelkit_cuda.cupy_tensor import cast_into
from accelkit_cuda.memory import pinned_empty
from accelkit_cuda.philox import BLOCK, OUTS, grid_for, key_of
from accelkit_cuda.submit import CUDAComponent, block_error, storage

__all__ = ["CUDAFactoryKernels", "device_draw", "random_dtype"]


class CUDAFactoryKernels(CUDAComponent, FactoryKernels):
    def fill(self, out: Tensor, value: int | float | bool) -> None:
        if out.size == 0:
            self.skip([out])
            return
        with np.errstate(all="ignore"):
            scalar = np.array(value).astype(out.dtype.to_numpy())
        self.launch(lambda: storage(out).fill(scalar), (), (out,), what="fill")

    def _upload(self, out: Tensor, make: Callable[[], np.ndarray[Any, Any]], what: str) -> None:
        """Queue: ``make()`` the host data, cast it into pinned memory, copy it to ``out``."""
        stream = self.current_stream
        handle = buffer_of(out).handle
        dtype, shape, nbytes = out.dtype.to_numpy(), out.shape, out.nbytes

        def run() -> Any:
            ptr = handle.ptr
            if not ptr:
                raise block_error(handle)
            block, raw = pinned_empty(nbytes)
            assign(raw.view(dtype).reshape(shape), make())
            cupy.cuda.runtime.memcpyAsync(
                ptr, raw.ctypes.data, nbytes, cupy.cuda.runtime.memcpyHostToDevice,
                stream.cp.ptr,
            )  # fmt: skip
            return block  # alive until the copy has completed

        self.launch(run, (), (out,), what=what)
        # The closure holds the block, not ``out``: a full device's cudaMalloc retry that
        # trims the cache in place must not free it before the copy ran (see Block.use).
        handle.use = stream.thread.queued

    def from_host(self, out: Tensor, array: np.ndarray[Any, Any]) -> None:
        if out.size == 0:
            self.skip([out])
            return
        # The snapshot is taken now (the caller may reuse `array` at once): a NumPy copy, no
        # CUDA call; the cast into pinned memory and the copy run on the submission thread.
        snapshot = np.array(array, copy=True, order="C")
        self._upload(out, lambda: snapshot, "from_host")

    def generate(self, out: Tensor, make: Callable[[], np.ndarray[Any, Any]]) -> None:
        if out.size == 0:
            self.skip([out])
            return
        self._upload(out, make, "generate")

    def random(self, out: Tensor, draw: RandomDraw) -> None:
        """Draw on the device (:func:`device_draw`): ``out`` gets ``offset + scale * U``
        (uniform; ``a`` and ``b - a``, or nudged by a spacing where that rounded a value out of
        ``[a, b)`` in ``out``'s dtype: :func:`uniform_bounds`) or ``a + b * Z`` (normal),
        computed in float32
        (float64 for f64 tensors, and
        where a bound or the scale exceeds float32's range: :func:`random_dtype`) and written
        in ``out``'s dtype by the one Philox launch. It runs on the submission thread, in
        stream order like every launch; nothing here touches CUDA on the caller's thread."""
        if out.size == 0:
            self.skip([out])
            return
        dtype = random_dtype(draw, out.dtype is DType.F64)
        program = getattr(self.backend, "philox", None)
        self.launch(
            lambda: device_draw(draw, dtype, storage(out), program), (), (out,),
            what=f"random numbers ({draw.kind})",
        )  # fmt: skip


def random_dtype(draw: RandomDraw, f64: bool = False) -> Any:
    """The dtype :meth:`CUDAFactoryKernels.random` computes ``draw`` in: float64 for an f64
    output (``f64``) or a bound or scale beyond float32's range, else float32."""
    a, b = draw.a, draw.b
    scale = b - a if draw.kind == "uniform" else b
    return np.float64 if f64 or max(abs(a), abs(b), abs(scale)) > _F32_MAX else np.float32


def device_draw(draw: RandomDraw, dtype: Any, out: Any = None, program: Any = None) -> Any:
    """``draw`` on the device, computed in ``dtype`` (float32 or float64), into ``out`` (a
    CuPy array of the draw's shape, of any float dtype: f16, bf16, f32, f64) or a new array of
    ``dtype``; returns it. The one place a CUDA draw is made, so that every user of a seed
    (``tensor_factory.uniform``, the fused ``sample_token``) gets the same numbers. On the
    submission thread, on the current stream.

    With ``program`` (the backend's :class:`~accelkit_cuda.philox.PhiloxProgram`) loaded: one
    Philox4x32-10 launch, key = the seed, counter = the element index, writing
    ``a + (b - a) * U`` or ``a + b * Z`` in ``out``'s dtype (:mod:`accelkit_cuda.philox`).
    Without (NVRTC missing): ``cupy.random.default_rng(draw.seed)`` (XORWOW) makes ``U`` or
    ``Z`` in ``dtype``, scaled and shifted in place, cast once into ``out`` if its dtype
    differs."""
    acc = "f64" if np.dtype(dtype) == np.float64 else "f32"
    if out is None:
        out = cupy.empty(draw.shape, dtype)
    a, b = draw.a, draw.b
    if draw.kind == "uniform":
        a, scale = uniform_bounds(a, b, acc, out.dtype)
    else:
        scale = b
    fn = None
    if program is not None:
        fn = program.function(draw.kind, acc, OUTS.get(np.dtype(out.dtype).name, ""))
    if fn is not None:
        n = out.size
        if n:
            k0, k1 = key_of(draw.seed)
            wide = np.float64 if acc == "f64" else np.float32
            args = (np.uintp(out.data.ptr), np.int64(n), np.uint32(k0), np.uint32(k1),
                    wide(a), wide(scale))  # fmt: skip
            fn(grid_for(n, acc), (BLOCK,), args, stream=cupy.cuda.get_current_stream())
        return out
    # CuPy's generator (the path before the Philox kernels; NVRTC missing).
    direct = out.dtype == dtype
    rng = cupy.random.default_rng(draw.seed)
    draw_fn = rng.random if draw.kind == "uniform" else rng.standard_normal
    x = draw_fn(draw.shape, dtype=dtype, out=out if direct else None)
    x *= scale  # offset + scale * U, a + b * Z, in x's dtype (the scalars rounded to it)
    x += a
    if not direct:
        cast_into(x, out)
    return out


#: The largest uniform ``U`` of each accumulator: ``(2**24 - 1) * 2**-24`` from 24 bits in
#: float32, ``(2**53 - 1) * 2**-53`` in float64 (:mod:`accelkit_cuda.philox`; CuPy's generator
#: keeps to the same bounds).
_U_MAX = {"f32": 1.0 - 2.0**-24, "f64": 1.0 - 2.0**-53}


def uniform_bounds(a: float, b: float, acc: str, out: Any) -> tuple[float, float]:
    """The ``(offset, scale)`` of a uniform draw ``offset + scale * U`` (each operation rounded
    in ``acc``, then the result rounded to ``out``'s dtype, through float32 from float64) whose
    every value lies in ``[a, b)`` once rounded: ``(a, b - a)`` unless a value would round out
    of it. Then the offset is the dtype's smallest value from ``a`` on (a low the dtype does
    not hold rounded samples below it: BF16 over [1.0001, 1.5) drew 1.0), and the scale the
    largest whose largest value stays at or below the dtype's largest value under ``b``
    (``a + (b - a) * (1 - 2**-24)`` is 1.0 in BF16 over [0, 1), and ``1e6 + 1`` in float32
    over [1e6, 1e6 + 1)). Where no value of the dtype lies in ``[a, b)``: ``(a, b - a)``."""
    wide = np.float32 if acc == "f32" else np.float64
    t = np.dtype(out)
    u = wide(_U_MAX[acc])

    def rounded(v: Any) -> float:
        if t not in (np.dtype(np.float64), np.dtype(wide)):
            v = np.float32(v)
        return float(np.array(v).astype(t))

    def top_of(offset: Any, scale: Any) -> float:
        return rounded(wide(offset) + wide(scale) * u)  # NumPy's rounding is the kernel's

    plain = (a, float(wide(b - a)))
    bounds = uniform_range(a, b, t)  # (None where a >= b, too)
    if bounds is None:
        return plain
    if rounded(wide(a)) >= a and top_of(a, plain[1]) < b:
        return plain
    offset, below = bounds  # exact in acc: the dtype's values are acc's
    scale = wide(below - offset)
    while scale > 0 and top_of(offset, scale) >= b:
        scale = np.nextafter(scale, wide(0))
    return offset, float(scale)


#: The largest finite float32: bounds beyond it are computed in float64.
_F32_MAX = float(np.finfo(np.float32).max)
