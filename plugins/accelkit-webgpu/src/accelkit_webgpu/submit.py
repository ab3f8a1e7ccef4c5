"""How the WebGPU backend's components allocate outputs and submit work.

A tensor's storage is its pool block (:class:`~accelkit_webgpu.gpu.Block`). Work runs on the
current stream's worker thread, after the work writing its inputs on other streams: the worker
records the commands and submits them to the device's one queue, which runs them in submission
order. So a stream's position is reached when its commands are *submitted*; reads through
``queue.read_buffer`` wait for the device to finish them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit import Tensor
from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError, UnsupportedOperationError
from accelkit.sdk import HostStream, KernelBase, prod, storage
from accelkit_webgpu.gpu import GPU, Block, groups_for
from accelkit_webgpu.wgsl import WG, elements_per_word

if TYPE_CHECKING:
    from accelkit_webgpu.backend import WebGPUBackend

__all__ = ["WebGPUComponent", "block", "f32_bits", "nbytes", "scalar_words"]


def block(x: Tensor) -> Block:
    b: Block = storage(x)
    return b


def nbytes(x: Tensor) -> int:
    return x.size * x.dtype.itemsize


def f32_bits(value: float) -> int:
    """The bits of ``value`` rounded to f32, as a parameter word."""
    with np.errstate(over="ignore"):
        return int(np.array(value, np.float32).view(np.uint32))


def scalar_words(value: int | float | bool, dtype: DType) -> tuple[int, int]:
    """A Python scalar as the (low, high) parameter words of ``dtype``'s compute type."""
    if dtype is DType.BOOL:
        return int(bool(value)), 0
    if dtype.is_floating:
        return f32_bits(float(value)), 0
    v = int(value) & 0xFFFFFFFFFFFFFFFF
    return v & 0xFFFFFFFF, v >> 32


class WebGPUComponent(KernelBase[HostStream]):
    """Allocation and submission shared by the WebGPU backend's components (see the module
    docstring): a tensor's storage is its pool block (KernelBase's default, shared by views);
    a lost device refuses work at once (ContextPoisonedError)."""

    backend: WebGPUBackend

    @property
    def gpu(self) -> GPU:
        return self.backend.gpu

    def check_output(self, shape: tuple[int, ...], dtype: DType) -> None:
        backend = self.backend
        gpu = backend.gpu
        gpu.check()
        if dtype not in backend.supported_dtypes:
            raise UnsupportedOperationError(
                f"webgpu on {backend.device} does not support dtype {dtype.value} (WGSL has no"
                " f64, and the backend does not emulate it); supported: "
                + ", ".join(sorted(d.value for d in backend.supported_dtypes))
            )
        size = prod(shape) * dtype.itemsize
        limit = gpu.max_binding
        # (more than the device holds is the pool's OutOfMemoryError, raised when allocating)
        if limit < size <= backend.pool.total:
            raise InvalidArgumentError(
                f"a {dtype.value} tensor of shape {shape} needs {size} bytes, more than one"
                f" storage binding of {backend.device} holds ({limit} bytes,"
                " maxStorageBufferBindingSize); split it into smaller tensors"
            )

    def submit(
        self,
        stream: HostStream,
        fn: Callable[..., Any],
        deps: list[tuple[Any, int]],
        hold: tuple[Any, ...],
        **options: Any,
    ) -> int:
        """Run ``fn`` on the stream's worker after ``deps``.

        The stream holds ``hold`` (the tensors themselves, not only their blocks) until ``fn``
        has run: a tensor the caller drops meanwhile keeps its block out of the pool, where
        another stream could otherwise take it and write it before this work has read it.
        """
        self.backend.gpu.check()  # a lost device refuses work at once: ContextPoisonedError
        return stream.submit(fn, True, deps, hold)

    @property
    def loops_capped(self) -> bool:
        """A software adapter: Mesa's llvmpipe ends an invocation's loops after 65,535
        iterations in all, silently. A real GPU has no such limit."""
        return bool(self.backend.capabilities.extra.get("software"))

    def check_loop(self, op: str, what: str, trips: int, limit: int) -> None:
        """Refuse work whose invocations would loop more than ``limit`` times where loops are
        capped (:attr:`loops_capped`): the result would be wrong."""
        if trips > limit and self.loops_capped:
            raise UnsupportedOperationError(
                f"webgpu: {op} with {what} {trips} is more than the software adapter"
                f" {self.backend.device} runs correctly (at most {limit}: llvmpipe stops an"
                " invocation's loops after 65,535 iterations); use a GPU adapter or another"
                " backend"
            )

    def run_map(
        self,
        source: str,
        params: Sequence[int],
        inputs: Sequence[Tensor],
        out: Tensor,
        extra: Sequence[Tensor] = (),
    ) -> None:
        """Launch a :func:`~accelkit_webgpu.wgsl.map_kernel` over ``out`` (``params[0]`` is
        ``out.size``); ``inputs`` bind in order after the parameters."""
        n = out.size
        if n == 0:
            return
        gpu = self.gpu
        groups = groups_for(-(-n // elements_per_word(out.dtype)), WG)
        ins = [(block(t), nbytes(t)) for t in inputs]
        outs = [(block(out), nbytes(out))]
        self.launch(
            lambda: gpu.dispatch(source, params, ins, outs, groups),
            [*inputs, *extra],
            (out,),
        )
