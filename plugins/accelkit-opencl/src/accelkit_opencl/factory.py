"""The OpenCL backend's TensorFactory: fills on the device, host data by asynchronous copies."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl

from accelkit.abc.factory import TensorFactory
from accelkit.backends.cpu.numpy_elementwise import assign
from accelkit.dtype import DType
from accelkit.tensor import Tensor
from accelkit_opencl.submit import CLComponent

__all__ = ["OpenCLTensorFactory"]


class OpenCLTensorFactory(CLComponent, TensorFactory):
    def _k_fill(self, out: Tensor, value: int | float | bool) -> None:
        if out._size == 0:
            self._skip([out])
            return
        with np.errstate(all="ignore"):
            if out._dtype is DType.BOOL:
                pattern = np.array(bool(value), np.uint8)
            else:
                pattern = np.array(value).astype(out._dtype.to_numpy())
        nbytes = out.nbytes

        def run(queue: Any, wait_for: list[Any] | None) -> Any:
            return cl.enqueue_fill_buffer(queue, out._data, pattern, 0, nbytes, wait_for=wait_for)

        self._enqueue(run, (), (out,), (pattern,))

    def _k_from_host(self, out: Tensor, array: np.ndarray[Any, Any]) -> None:
        # The snapshot (with the dtype conversion) is made now: the caller may reuse `array`.
        host = np.empty(out._shape, out._dtype.to_numpy())
        assign(host, array)
        if out._size == 0:
            self._skip([out])
            return

        def run(queue: Any, wait_for: list[Any] | None) -> Any:
            return cl.enqueue_copy(queue, out._data, host, is_blocking=False, wait_for=wait_for)

        self._enqueue(run, (), (out,), (host,))
