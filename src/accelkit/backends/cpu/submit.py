"""How CPU components allocate outputs and submit work to a host stream."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit._core.host_stream import HostStream
from accelkit.dtype import DType
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


class CPUComponent:
    """Allocation and submission shared by the CPU backend's components."""

    backend: CPUBackend

    def __init__(self, backend: CPUBackend) -> None:
        self.backend = backend

    def empty(self, shape: tuple[int, ...], dtype: DType) -> Tensor:
        backend = self.backend
        size = 1
        for d in shape:
            size *= d
        npdt = _NUMPY_DTYPES[dtype]
        buf = backend._pool.allocate(size * npdt.itemsize)  # type: ignore[union-attr]
        data = np.ndarray(shape, npdt, buf.handle)
        stream = backend._stream_var.get() or backend._default
        assert stream is not None
        return Tensor(backend, buf, data, shape, dtype, backend._device_obj, size, stream, 0)

    def view(self, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        return Tensor(
            x._backend,
            x._buffer,
            x._data.reshape(shape),
            shape,
            x._dtype,
            x._device,
            x._size,
            x._stream,
            x._seq,
        )

    def _launch(
        self,
        fn: Callable[[], object],
        cost: int,
        inputs: Iterable[Any],
        outputs: Iterable[Tensor],
    ) -> None:
        """Submit ``fn`` to the current stream after the inputs' writers on other streams.

        The stream holds ``inputs`` and ``outputs`` until ``fn`` has run, so that their
        buffers stay out of the pool meanwhile (``fn`` may reach only their arrays).
        """
        backend = self.backend
        stream: HostStream = backend._stream_var.get() or backend._default  # type: ignore[assignment]
        deps: list[tuple[HostStream, int]] | None = None
        for t in inputs:
            if type(t) is Tensor:
                s: HostStream = t._stream  # type: ignore[assignment]
                if s is not stream and s.completed < t._seq:
                    if deps is None:
                        deps = []
                    deps.append((s, t._seq))
        seq = stream.submit(fn, cost > INLINE_MAX_COST, deps or (), (inputs, outputs))  # type: ignore[arg-type]
        write = (stream, seq)
        for o in outputs:
            o._stream = stream
            o._seq = seq
            o._buffer.last_write = write
