"""The CPU backend's TensorFactory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from accelkit._core.host_arrays import assign
from accelkit.backends.cpu.submit import CPUComponent
from accelkit.sdk.kernels import FactoryKernels
from accelkit.tensor import Tensor

__all__ = ["CPUFactoryKernels"]


class CPUFactoryKernels(CPUComponent, FactoryKernels):
    def fill(self, out: Tensor, value: int | float | bool) -> None:
        def run() -> None:
            with np.errstate(all="ignore"):
                out._data.fill(value)

        self._launch(run, out._size, (), (out,))

    def generate(self, out: Tensor, make: Callable[[], np.ndarray[Any, Any]]) -> None:
        # Generating a large random tensor takes a while (100 ms for 16M normals): it runs in
        # stream order on the worker, not on the event loop's thread.
        self._launch(lambda: assign(out._data, make()), 8 * out._size, (), (out,))

    def from_host(self, out: Tensor, array: np.ndarray[Any, Any]) -> None:
        # The snapshot is the copy itself, made now: the caller may reuse `array` at once.
        assign(out._data, array)
