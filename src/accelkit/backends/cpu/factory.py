"""The CPU backend's TensorFactory."""

from __future__ import annotations

from typing import Any

import numpy as np

from accelkit.abc.factory import TensorFactory
from accelkit.backends.cpu.numpy_elementwise import cast_into
from accelkit.backends.cpu.submit import CPUComponent
from accelkit.tensor import Tensor

__all__ = ["CPUTensorFactory"]


class CPUTensorFactory(CPUComponent, TensorFactory):
    def _k_fill(self, out: Tensor, value: int | float | bool) -> None:
        def run() -> None:
            with np.errstate(all="ignore"):
                out._data.fill(value)

        self._launch(run, out._size, (), (out,))

    def _k_from_host(self, out: Tensor, array: np.ndarray[Any, Any]) -> None:
        # The snapshot is the copy itself, made now: the caller may reuse `array` at once.
        if array.dtype == out._data.dtype:
            np.copyto(out._data, array)
        elif array.dtype.kind == "f" and out._data.dtype.kind in "iub":
            cast_into(array, out._data)
        else:
            with np.errstate(all="ignore"):
                out._data[...] = array
