"""``KernelBase``: what a backend's kernel objects share (allocation, views, ordered launches).

Every kernel object (TensorKernels, FactoryKernels, FusedKernels) allocates its outputs from the
backend's pool on the current stream and enqueues work after the writers of its inputs on other
streams, recording its outputs as written at the position the work got. :class:`KernelBase`
does that once; a backend says only what differs, in four hooks:

- :meth:`KernelBase.make_storage`: the native handle kernels read over a new block (the block
  itself by default; a typed NumPy array, a lazily made CuPy array, ...);
- :meth:`KernelBase.reshape_storage`: the handle of a view with another shape (None by default:
  the same handle, for backends whose handles carry no shape);
- :meth:`KernelBase.check_output`: refuse an output the device cannot hold before allocating it;
- :meth:`KernelBase.submit`: hand the work to the stream (abstract: each stream type takes
  its work differently).

:meth:`KernelBase.before_allocation` runs before each allocation (a backend whose frees wait for
device events returns completed ones to the pool there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from math import prod
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from accelkit.dtype import DType
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit._core.positions import PositionStream
    from accelkit._core.stream_backend import StreamBackend
    from accelkit.abc.memory import DeviceBuffer

__all__ = ["ITEMSIZE", "KernelBase", "other_writers"]

#: The backend's stream type (``KernelBase[HostStream]``).
S = TypeVar("S")

#: Bytes per element of each dtype: a dict lookup where ``DType.itemsize`` is a property call.
ITEMSIZE: dict[DType, int] = {d: d.itemsize for d in DType}


def other_writers(stream: PositionStream, inputs: Iterable[Any]) -> list[tuple[Any, int]]:
    """The ``(stream, position)`` of each input's last writer on another stream whose work has
    not completed yet, and of the last write to its buffer through any view of it (a
    ``reshape`` or ``narrow`` written on another stream is a write of the tensor it views):
    what work on ``stream`` must wait for. Non-tensors are skipped. A write's outputs belong
    here too where they may have been written before (in place: a copy, a scatter), so that
    two writes of one buffer on two streams land in submission order."""
    deps: list[tuple[Any, int]] = []
    for t in inputs:
        if type(t) is Tensor:
            writer, seq = t._stream, t._seq
            if writer is not stream and seq > writer.completed:
                deps.append((writer, seq))
            shared = t._buffer.last_write
            if shared is not None:
                other, at = shared
                if (
                    other is not stream
                    and (other is not writer or at != seq)
                    and (at > other.completed)
                ):
                    deps.append(shared)
    return deps


class KernelBase(Generic[S]):
    """Allocation and stream-ordered submission for a backend's kernel objects (see the module
    docstring), generic in the backend's stream type. A backend writes one subclass with its
    hooks (``class MyKernels(KernelBase[MyStream])``) and mixes it into its TensorKernels,
    FactoryKernels and FusedKernels."""

    def __init__(self, backend: StreamBackend[Any]) -> None:
        self.backend = backend  # type: ignore[misc]  # a plain attribute: read on every launch
        # The allocation path calls only the hooks a subclass overrides (each call costs about
        # 0.1 us, and a small op's whole submission is a few us).
        cls = type(self)
        self._checks_output = cls.check_output is not KernelBase.check_output
        self._prepares = cls.before_allocation is not KernelBase.before_allocation

    if TYPE_CHECKING:
        # Read-only to the type checker, so that a backend's kernels may narrow it to their own
        # backend class (``backend: MyBackend``).
        @property
        def backend(self) -> StreamBackend[Any]: ...

    # -- hooks ------------------------------------------------------------------------------------
    def make_storage(self, buffer: DeviceBuffer, shape: tuple[int, ...], dtype: DType) -> Any:
        """The native handle a new tensor's kernels read (the pooled block itself by default)."""
        return buffer.handle

    def reshape_storage(self, x: Tensor, shape: tuple[int, ...]) -> Any:
        """The handle of a view of ``x`` with ``shape``; None keeps x's (the default)."""
        return None

    def check_output(self, shape: tuple[int, ...], dtype: DType) -> None:
        """Raise before allocating an output this device cannot hold (nothing by default)."""

    def before_allocation(self) -> None:
        """Run before each allocation (nothing by default)."""

    def submit(
        self,
        stream: S,
        fn: Callable[..., Any],
        deps: list[tuple[Any, int]],
        hold: tuple[Any, ...],
        **options: Any,
    ) -> int:
        """Enqueue ``fn`` on ``stream`` after the positions ``deps`` of other streams, keeping
        ``hold`` (the inputs, the outputs, anything else the work reads) referenced until it
        has run; return the position it got. ``options`` are the backend's own (a cost, a
        label), passed through from :meth:`launch`."""
        raise NotImplementedError(f"{type(self).__name__} must implement KernelBase.submit")

    # -- what the kernels call --------------------------------------------------------------------
    @property
    def current_stream(self) -> S:
        """The stream work is submitted to in this context (the backend's ``current_stream``,
        inlined as :meth:`launch` does: the kernels ask on every launch)."""
        backend = self.backend
        stream: S = backend._stream_var.get() or backend._default  # type: ignore[assignment]
        return stream

    def empty(self, shape: tuple[int, ...], dtype: DType) -> Tensor:
        """A new tensor on the current stream, not yet written."""
        if self._checks_output:
            self.check_output(shape, dtype)
        if self._prepares:
            self.before_allocation()
        backend = self.backend
        size = prod(shape)
        pool = backend._pool
        if pool is None:
            pool = backend.pool  # raises NotInitializedError, saying why
        buf = pool.allocate(size * ITEMSIZE[dtype])
        stream: Any = backend._stream_var.get() or backend._default
        data = self.make_storage(buf, shape, dtype)
        return Tensor(backend, buf, data, shape, dtype, stream.device, size, stream, 0)

    def view(self, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        """A tensor sharing ``x``'s buffer and last writer with another shape of the same size."""
        data = self.reshape_storage(x, shape)
        return Tensor(
            x._backend, x._buffer, x._data if data is None else data, shape, x._dtype,
            x._device, x._size, x._stream, x._seq,
        )  # fmt: skip

    def launch(
        self,
        fn: Callable[..., Any],
        inputs: Iterable[Any],
        outputs: Iterable[Tensor],
        **options: Any,
    ) -> int:
        """Enqueue ``fn`` on the current stream after the writers on other streams of the
        inputs and outputs (:func:`other_writers`), and record ``outputs`` as written by it;
        returns its position."""
        backend = self.backend
        stream: Any = backend._stream_var.get() or backend._default
        inputs = tuple(inputs)
        outputs = tuple(outputs)
        # With one stream every input's writer is this stream (streams are only added, and a
        # tensor of an earlier session is refused as stale before it gets here): no deps.
        deps = [] if len(backend._streams) == 1 else other_writers(stream, inputs + outputs)
        seq = self.submit(stream, fn, deps, (inputs, outputs), **options)
        write = (stream, seq)
        for o in outputs:
            o._stream = stream
            o._seq = seq
            o._buffer.last_write = write
        return seq

    def skip(self, outputs: Iterable[Tensor]) -> None:
        """Record outputs with nothing to compute (empty tensors) as written: by nothing."""
        stream = self.backend.current_stream
        write = (stream, 0)
        for o in outputs:
            o._stream = stream
            o._seq = 0
            o._buffer.last_write = write
