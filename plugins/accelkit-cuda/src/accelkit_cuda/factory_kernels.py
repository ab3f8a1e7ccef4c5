"""The CUDA backend's TensorFactory: fills on the device, host data by pinned async copies.

``from_host`` snapshots its input on the caller's thread (plain NumPy, as the contract asks);
the pinned staging block, the copy into it and the ``cudaMemcpyAsync`` happen on the submission
thread. Random and range tensors are made there too (``generate``): the same NumPy generators as
every other backend, so a seed gives the same values everywhere, but never on the loop's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cupy
import numpy as np

from accelkit.sdk import FactoryKernels, buffer_of
from accelkit.sdk import host_assign as assign
from accelkit.tensor import Tensor
from accelkit_cuda.memory import pinned_empty
from accelkit_cuda.submit import CUDAComponent, storage

__all__ = ["CUDAFactoryKernels"]


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
