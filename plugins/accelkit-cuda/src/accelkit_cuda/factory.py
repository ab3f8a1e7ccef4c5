"""The CUDA backend's TensorFactory: fills on the device, host data by pinned async copies."""

from __future__ import annotations

from typing import Any

import cupy
import numpy as np

from accelkit.sdk import FactoryKernels, buffer_of, storage
from accelkit.sdk import host_assign as assign
from accelkit.tensor import Tensor
from accelkit_cuda.memory import pinned_empty
from accelkit_cuda.submit import CUDAComponent

__all__ = ["CUDAFactoryKernels"]


class CUDAFactoryKernels(CUDAComponent, FactoryKernels):
    def fill(self, out: Tensor, value: int | float | bool) -> None:
        if out.size == 0:
            self._skip([out])
            return
        with np.errstate(all="ignore"):
            scalar = np.array(value).astype(out.dtype.to_numpy())
        self._launch(lambda: storage(out).fill(scalar), (), (out,), what="fill")

    def from_host(self, out: Tensor, array: np.ndarray[Any, Any]) -> None:
        if out.size == 0:
            self._skip([out])
            return
        # The snapshot (with the dtype conversion) is made now, into pinned memory: the caller
        # may reuse `array` at once, and the copy is a real asynchronous one.
        block, raw = pinned_empty(out.nbytes)
        host = raw.view(out.dtype.to_numpy()).reshape(out.shape)
        assign(host, array)
        stream = self._stream

        def run() -> None:
            cupy.cuda.runtime.memcpyAsync(
                buffer_of(out).handle.ptr, host.ctypes.data, out.nbytes,
                cupy.cuda.runtime.memcpyHostToDevice, stream.cp.ptr,
            )  # fmt: skip

        self._launch(run, (), (out,), what="from_host")
        stream.hold((block, buffer_of(out)))
