"""The CUDA backend's TensorFactory: fills and random numbers on the device, host data by pinned
async copies.

``from_host`` snapshots its input on the caller's thread (plain NumPy, as the contract asks);
the pinned staging block, the copy into it and the ``cudaMemcpyAsync`` happen on the submission
thread. Range tensors are made there too (``generate``), never on the loop's thread.

Random tensors (``uniform``, ``normal``) are drawn on the device by CuPy's generator
(``cupy.random.default_rng(seed)``), launched from the submission thread in stream order like
every other kernel (:meth:`CUDAFactoryKernels.random`): a seed gives the same numbers on every
CUDA run, and not the numbers of NumPy's PCG64 that the host backends draw.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cupy
import numpy as np

from accelkit.dtype import DType
from accelkit.sdk import FactoryKernels, RandomDraw, buffer_of
from accelkit.sdk import host_assign as assign
from accelkit.tensor import Tensor
from accelkit_cuda.cupy_tensor import cast_into
from accelkit_cuda.memory import pinned_empty
from accelkit_cuda.submit import CUDAComponent, storage

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
            block, raw = pinned_empty(nbytes)
            assign(raw.view(dtype).reshape(shape), make())
            cupy.cuda.runtime.memcpyAsync(
                handle.ptr, raw.ctypes.data, nbytes, cupy.cuda.runtime.memcpyHostToDevice,
                stream.cp.ptr,
            )  # fmt: skip
            return block  # alive until the copy has completed

        self.launch(run, (), (out,), what=what)

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
        """Draw on the device: ``cupy.random.default_rng(draw.seed)`` (CuPy's XORWOW) makes
        ``U`` in [0, 1) (``Generator.random``) or ``Z`` standard normal
        (``Generator.standard_normal``), and ``out`` gets ``a + (b - a) * U`` (uniform) or
        ``a + b * Z`` (normal). The arithmetic is float32 (float64 for f64 tensors, and where
        a bound or the scale exceeds float32's range), drawn straight into ``out`` when it has
        that dtype, else cast once (f16, bf16). It runs on the submission thread, in stream
        order like every launch; nothing here touches CUDA on the caller's thread."""
        if out.size == 0:
            self.skip([out])
            return
        dtype = random_dtype(draw, out.dtype is DType.F64)

        def run() -> None:
            dst = storage(out)
            direct = dst.dtype == dtype  # f32 (or f64): drawn into the output itself
            x = device_draw(draw, dtype, dst if direct else None)
            if not direct:
                cast_into(x, dst)

        self.launch(run, (), (out,), what=f"random numbers ({draw.kind})")


def random_dtype(draw: RandomDraw, f64: bool = False) -> Any:
    """The dtype :meth:`CUDAFactoryKernels.random` computes ``draw`` in: float64 for an f64
    output (``f64``) or a bound or scale beyond float32's range, else float32."""
    a, b = draw.a, draw.b
    scale = b - a if draw.kind == "uniform" else b
    return np.float64 if f64 or max(abs(a), abs(b), abs(scale)) > _F32_MAX else np.float32


def device_draw(draw: RandomDraw, dtype: Any, out: Any = None) -> Any:
    """``draw`` on the device, in ``dtype`` (into ``out`` where given, of that dtype and the
    draw's shape): ``cupy.random.default_rng(draw.seed)`` makes ``U`` in [0, 1) or ``Z``, then
    ``a + (b - a) * U`` or ``a + b * Z``. The one place a CUDA draw is made, so that every
    user of a seed (``tensor_factory.uniform``, the fused ``sample_token``) gets the same
    numbers. On the submission thread."""
    a, b = draw.a, draw.b
    scale = b - a if draw.kind == "uniform" else b
    rng = cupy.random.default_rng(draw.seed)
    draw_fn = rng.random if draw.kind == "uniform" else rng.standard_normal
    x = draw_fn(draw.shape, dtype=dtype, out=out)
    x *= scale  # a + (b - a) * U, a + b * Z, in x's dtype (the scalars rounded to it)
    x += a
    return x


#: The largest finite float32: bounds beyond it are computed in float64.
_F32_MAX = float(np.finfo(np.float32).max)
