"""The WebGPU backend's FactoryKernels: fills on the device, host data written to the queue."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from accelkit import Tensor
from accelkit.sdk import FactoryKernels
from accelkit.sdk import host as h
from accelkit_webgpu.submit import WebGPUComponent, block, scalar_words
from accelkit_webgpu.wgsl import compute_type, map_kernel, param_value


class WebGPUFactoryKernels(WebGPUComponent, FactoryKernels):
    def fill(self, out: Tensor, value: int | float | bool) -> None:
        # The value travels as a parameter word (one pipeline per dtype, not per value).
        ct = compute_type(out.dtype)
        lo, hi = scalar_words(value, out.dtype)
        load = param_value(out.dtype, 1, 2)
        src = map_kernel([], out.dtype, f"fn value(e: u32) -> {ct} {{ return {load}; }}\n")
        self.run_map(src, [out.size, lo, hi], [], out)

    def from_host(self, out: Tensor, array: np.ndarray[Any, Any]) -> None:
        # Snapshot now (the caller may reuse its array at once), in the tensor's dtype.
        typed = np.empty(out.shape, out.dtype.to_numpy())
        h.assign(typed, array)
        gpu, target = self.gpu, block(out)
        self.launch(lambda: gpu.write(target, typed, keep_tail=False), (), (out,))

    def generate(self, out: Tensor, make: Callable[[], np.ndarray[Any, Any]]) -> None:
        # Random tensors are generated on the host (in stream order), then written.
        gpu, target = self.gpu, block(out)
        dt = out.dtype.to_numpy()

        def run() -> None:
            typed = np.empty(out.shape, dt)
            h.assign(typed, make())
            gpu.write(target, typed, keep_tail=False)

        self.launch(run, (), (out,))
