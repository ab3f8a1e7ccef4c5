"""The example backend's FactoryKernels: fills and copies from the host."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from accelkit import Tensor
from accelkit.sdk import FactoryKernels
from accelkit.sdk import host as h
from accelkit_example.submit import ExampleComponent
from accelkit_example.submit import array as typed


class ExampleFactoryKernels(ExampleComponent, FactoryKernels):
    def fill(self, out: Tensor, value: int | float | bool) -> None:
        def run() -> None:
            with np.errstate(all="ignore"):
                typed(out).fill(value)

        self.launch(run, (), (out,))

    def from_host(self, out: Tensor, array: np.ndarray[Any, Any]) -> None:
        # Snapshot now (the caller may reuse its array at once), copy on the stream.
        snapshot = np.array(array, copy=True)
        self.launch(lambda: h.assign(typed(out), snapshot), (), (out,))

    def generate(self, out: Tensor, make: Callable[[], np.ndarray[Any, Any]]) -> None:
        # Random tensors are generated on the worker too, in stream order.
        self.launch(lambda: h.assign(typed(out), make()), (), (out,))
