"""How the WebGPU backend's components allocate outputs and submit work.

A tensor's storage is its pool block (:class:`~accelkit_webgpu.gpu.Block`). Work runs on the
current stream's worker thread, after the work writing its inputs on other streams: the worker
records the commands and submits them to the device's one queue, which runs them in submission
order. So a stream's position is reached when its commands are *submitted*; reads through
``queue.read_buffer`` wait for the device to finish them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit import Tensor
from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError, UnsupportedOperationError
from accelkit.sdk import HostStream, last_writer, mark_written, new_tensor, prod, storage, view_of
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


class WebGPUComponent:
    """Allocation and submission shared by the WebGPU backend's components."""

    def __init__(self, backend: WebGPUBackend) -> None:
        self._backend = backend

    @property
    def backend(self) -> WebGPUBackend:
        return self._backend

    @property
    def gpu(self) -> GPU:
        return self._backend.gpu

    def empty(self, shape: tuple[int, ...], dtype: DType) -> Tensor:
        backend = self._backend
        backend.gpu.check()
        if dtype not in backend.supported_dtypes:
            raise UnsupportedOperationError(
                f"webgpu on {backend.device} does not support dtype {dtype.value} (WGSL has no"
                " f64, and the backend does not emulate it); supported: "
                + ", ".join(sorted(d.value for d in backend.supported_dtypes))
            )
        size = prod(shape) * dtype.itemsize
        limit = backend.gpu.max_binding
        # (more than the device holds is the pool's OutOfMemoryError, raised below)
        if limit < size <= backend.pool.total:
            raise InvalidArgumentError(
                f"a {dtype.value} tensor of shape {shape} needs {size} bytes, more than one"
                f" storage binding of {backend.device} holds ({limit} bytes,"
                " maxStorageBufferBindingSize); split it into smaller tensors"
            )
        buf = backend.pool.allocate(size)
        stream = backend.current_stream
        return new_tensor(backend, buf, buf.handle, shape, dtype, stream.device, stream)

    @property
    def loops_capped(self) -> bool:
        """A software adapter: Mesa's llvmpipe ends an invocation's loops after 65,535
        iterations in all, silently. A real GPU has no such limit."""
        return bool(self._backend.capabilities.extra.get("software"))

    def check_loop(self, op: str, what: str, trips: int, limit: int) -> None:
        """Refuse work whose invocations would loop more than ``limit`` times where loops are
        capped (:attr:`loops_capped`): the result would be wrong."""
        if trips > limit and self.loops_capped:
            raise UnsupportedOperationError(
                f"webgpu: {op} with {what} {trips} is more than the software adapter"
                f" {self._backend.device} runs correctly (at most {limit}: llvmpipe stops an"
                " invocation's loops after 65,535 iterations); use a GPU adapter or another"
                " backend"
            )

    def view(self, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        return view_of(x, shape)

    def launch(
        self, fn: Callable[[], None], inputs: Iterable[Any], outputs: Iterable[Tensor]
    ) -> None:
        """Run ``fn`` on the current stream's worker after the inputs' writers on other streams;
        the outputs are then written by it.

        The queued work holds the tensors themselves (not only their blocks) until it has run:
        a tensor the caller drops meanwhile keeps its block out of the pool, where another
        stream could otherwise take it and write it before this work has read it.
        """
        self._backend.gpu.check()  # a lost device refuses work at once: ContextPoisonedError
        stream: HostStream = self._backend.current_stream  # type: ignore[assignment]
        deps: list[tuple[HostStream, int]] = []
        held: list[Tensor] = []
        for t in inputs:
            if isinstance(t, Tensor):
                held.append(t)
                writer, seq = last_writer(t)
                if writer is not stream:
                    deps.append((writer, seq))  # type: ignore[arg-type]
        outs = list(outputs)
        held.extend(outs)

        def run() -> None:
            fn()
            held.clear()

        seq = stream.submit(run, True, deps)
        mark_written(outs, stream, seq)

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
