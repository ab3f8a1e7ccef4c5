"""The OpenCL backend's TensorFactory: fills on the device, host data by asynchronous copies.

Nothing here runs OpenCL, or costly host work, on the caller's thread: fills and uploads are
closures that the stream's submitter thread runs in order (:mod:`accelkit_opencl.stream`).
Random and range tensors are generated there too, with the same NumPy generators as every other
backend (the same seed gives the same values). ``from_host`` snapshots its input at the call (the
caller may reuse it at once): small inputs are converted to the tensor's dtype there and then;
larger ones are copied as they are (one memcpy) and converted by the submitter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl

from accelkit.dtype import DType
from accelkit.sdk import FactoryKernels, storage
from accelkit.sdk import host_assign as assign
from accelkit.tensor import Tensor
from accelkit_opencl.memory import LARGE_COPY
from accelkit_opencl.submit import CLComponent

__all__ = ["OpenCLFactoryKernels"]


class OpenCLFactoryKernels(CLComponent, FactoryKernels):
    def fill(self, out: Tensor, value: int | float | bool) -> None:
        if out.size == 0:
            self.skip([out])
            return
        with np.errstate(all="ignore"):
            if out.dtype is DType.BOOL:
                pattern = np.array(bool(value), np.uint8)
            else:
                pattern = np.array(value).astype(out.dtype.to_numpy())
        nbytes = out.nbytes

        def run(queue: Any, wait_for: list[Any] | None) -> Any:
            return cl.enqueue_fill_buffer(
                queue, storage(out), pattern, 0, nbytes, wait_for=wait_for
            )

        self.launch(run, (), (out,), keepalive=(pattern,))

    def _upload(self, out: Tensor, make: Callable[[], np.ndarray[Any, Any]]) -> None:
        """Fill ``out`` from the host array ``make()``, which the submitter runs in stream order
        and converts to ``out``'s dtype before it enqueues the copy."""
        if out.size == 0:
            self.skip([out])
            return
        shape, dtype = out.shape, out.dtype.to_numpy()
        hosts: list[np.ndarray[Any, Any]] = []  # the uploaded array, kept with the closure

        def run(queue: Any, wait_for: list[Any] | None) -> Any:
            array = make()
            if array.dtype == dtype and array.shape == shape and array.flags.c_contiguous:
                host = array
            else:
                host = np.empty(shape, dtype)
                assign(host, array)
            del array
            hosts.append(host)
            return cl.enqueue_copy(queue, storage(out), host, is_blocking=False, wait_for=wait_for)

        self.launch(run, (), (out,))

    def generate(self, out: Tensor, make: Callable[[], np.ndarray[Any, Any]]) -> None:
        # Generating a large random tensor takes milliseconds: the submitter does it.
        self._upload(out, make)

    def from_host(self, out: Tensor, array: np.ndarray[Any, Any]) -> None:
        # The snapshot is made now: the caller may reuse `array` at once.
        if out.size == 0:
            self.skip([out])
            return
        dtype = out.dtype.to_numpy()
        if array.dtype == dtype or max(array.nbytes, out.nbytes) <= LARGE_COPY:
            # The snapshot is the converted array itself (one copy either way).
            host = np.empty(out.shape, dtype)
            assign(host, array)
            self._upload(out, lambda: host)
        else:
            # One memcpy now, the conversion on the submitter.
            snapshot = np.array(array, copy=True, order="C")
            self._upload(out, lambda: snapshot)
