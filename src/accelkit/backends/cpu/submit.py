"""How CPU components allocate outputs and submit work to a host stream."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit._core.host_stream import HostStream
from accelkit._core.kernel_base import ITEMSIZE, KernelBase, other_writers
from accelkit.abc.memory import DeviceBuffer
from accelkit.dtype import DType
from accelkit.sdk.tensors import storage
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit.backends.cpu.backend import CPUBackend

__all__ = ["INLINE_MAX_COST", "CPUComponent", "arr"]

#: Work estimated below this many element-operations runs inline when the stream is idle (up to
#: about 40 us of a NumPy add, a few hundred us of a transcendental); above it, on the stream's
#: worker thread. The hand-off costs 60-80 us (two thread wake-ups), so a lower bound made
#: mid-size ops several times slower than NumPy (a 64k-element add: 84 us against 6 us; now
#: 14 us) while the loop never waits long on inline work.
INLINE_MAX_COST = 1 << 18

_NUMPY_DTYPES = {d: d.to_numpy() for d in DType}


def arr(x: Any) -> Any:
    """The NumPy array behind a tensor (or the scalar itself)."""
    return x._data if type(x) is Tensor else x


class CPUComponent(KernelBase[HostStream]):
    """Allocation and submission shared by the CPU backend's components: NumPy arrays over the
    pool's blocks, work on host streams (inline when small and the stream is idle)."""

    backend: CPUBackend

    def make_storage(self, buffer: DeviceBuffer, shape: tuple[int, ...], dtype: DType) -> Any:
        return np.ndarray(shape, _NUMPY_DTYPES[dtype], buffer.handle)

    def empty(self, shape: tuple[int, ...], dtype: DType) -> Tensor:
        """:meth:`KernelBase.empty` in one frame: the CPU components have neither an output
        check nor a hook before allocation, and their storage is a NumPy array over the block
        (every op allocates through here: each call saved is about 0.1 us of a few)."""
        backend = self.backend
        size = 1
        for d in shape:
            size *= d
        pool = backend._pool
        if pool is None:
            pool = backend.pool  # raises NotInitializedError, saying why
        buf = pool.allocate(size * ITEMSIZE[dtype])
        stream: HostStream = backend._stream_var.get() or backend._default  # type: ignore[assignment]  # set while ready
        data = np.ndarray(shape, _NUMPY_DTYPES[dtype], buf.handle)
        return Tensor(backend, buf, data, shape, dtype, stream._device, size, stream, 0)

    def reshape_storage(self, x: Tensor, shape: tuple[int, ...]) -> Any:
        return storage(x).reshape(shape)

    def submit(
        self,
        stream: Any,
        fn: Callable[..., Any],
        deps: list[tuple[Any, int]],
        hold: tuple[Any, ...],
        cost: int = INLINE_MAX_COST + 1,
        **options: Any,
    ) -> int:
        """On the stream's worker thread, or inline when ``cost`` (element-operations) is at
        most :data:`INLINE_MAX_COST` and the stream is idle. The stream holds ``hold`` until
        ``fn`` has run, so that the buffers stay out of the pool meanwhile."""
        s: HostStream = stream
        return s.submit(fn, cost > INLINE_MAX_COST, deps, hold)

    def _launch(
        self,
        fn: Callable[[], object],
        cost: int,
        inputs: Iterable[Any],
        outputs: Iterable[Tensor],
    ) -> None:
        """Submit ``fn`` (about ``cost`` element-operations) to the current stream after the
        inputs' writers on other streams: :meth:`KernelBase.launch` with :meth:`submit`, in one
        frame (the CPU backend's small ops are a few microseconds in all)."""
        backend = self.backend
        stream: HostStream = backend._stream_var.get() or backend._default  # type: ignore[assignment]  # set while ready
        # With one stream every writer is this stream (streams are only added): no deps.
        deps = () if len(backend._streams) == 1 else other_writers(stream, (*inputs, *outputs))
        seq = stream.submit(fn, cost > INLINE_MAX_COST, deps, (inputs, outputs))  # type: ignore[arg-type]  # fn's result is dropped
        write = (stream, seq)  # mark_written(outputs, stream, seq), inlined
        for o in outputs:
            o._stream = stream
            o._seq = seq
            o._buffer.last_write = write
