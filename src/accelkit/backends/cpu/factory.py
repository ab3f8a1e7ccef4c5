"""The CPU backend's TensorFactory."""

from __future__ import annotations

from typing import Any

import numpy as np

from accelkit._core.ops.elementwise import check_int_scalar
from accelkit._core.validation import check_dtype
from accelkit.abc.factory import ShapeLike, TensorFactory
from accelkit.backends.cpu.numpy_elementwise import cast_into
from accelkit.backends.cpu.submit import CPUComponent
from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError
from accelkit.tensor import Tensor

__all__ = ["CPUTensorFactory"]


class CPUTensorFactory(CPUComponent, TensorFactory):
    def full(
        self, shape: ShapeLike, value: int | float | bool, dtype: DType | str = DType.F32
    ) -> Tensor:
        # A value the dtype cannot hold is refused before the output is allocated (the base
        # class would allocate first, and the fill would then fail inside the kernel).
        dt = check_dtype(self.backend, dtype)
        if isinstance(value, int | float) and not isinstance(value, bool) and not dt.is_floating:
            if isinstance(value, float) and not value.is_integer():
                raise InvalidArgumentError(f"full: {value} is not representable in {dt.value}")
            check_int_scalar("full", "value", int(value), dt)
        return super().full(shape, value, dt)

    def _k_fill(self, out: Tensor, value: int | float | bool) -> None:
        def run() -> None:
            with np.errstate(all="ignore"):
                out._data.fill(value)

        if not out._dtype.is_floating and isinstance(value, float) and not value.is_integer():
            raise InvalidArgumentError(f"full: {value} is not representable in {out._dtype.value}")
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
