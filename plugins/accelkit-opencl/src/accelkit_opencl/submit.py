"""How OpenCL components allocate outputs and enqueue work on a command queue."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyopencl as cl

from accelkit.dtype import DType
from accelkit.sdk import last_writer, mark_written, new_tensor, view_of
from accelkit.tensor import Tensor
from accelkit_opencl.programs import enqueue_kernel
from accelkit_opencl.stream import CLStream

if TYPE_CHECKING:
    from accelkit_opencl.backend import OpenCLBackend

__all__ = ["CLComponent", "dependencies", "launch", "positions"]


def positions(stream: CLStream, inputs: Iterable[Any]) -> list[tuple[CLStream, int]]:
    """The pending positions of the inputs' writers on other streams (the same in-order queue
    needs none: its commands run in order). Pure Python: no OpenCL call."""
    deps: list[tuple[CLStream, int]] = []
    for t in inputs:
        if type(t) is Tensor:
            writer, seq = last_writer(t)
            s: CLStream = writer  # type: ignore[assignment]
            if s is not stream and seq > s._completed_upto:
                deps.append((s, seq))
    return deps


def dependencies(stream: CLStream, inputs: Iterable[Any]) -> list[Any]:
    """OpenCL events for the inputs' pending writers on other streams, for code that enqueues
    on a stream's queue itself (see :meth:`CLStream.event_for`: never waits). Submissions pass
    :func:`positions` to :meth:`CLStream.submit` instead."""
    deps = []
    for s, seq in positions(stream, inputs):
        event = s.event_for(seq)
        if event is not None:
            deps.append(event)
    return deps


class CLComponent:
    """Allocation and submission shared by the OpenCL backend's components."""

    backend: OpenCLBackend

    def __init__(self, backend: OpenCLBackend) -> None:
        self.backend = backend

    def empty(self, shape: tuple[int, ...], dtype: DType) -> Tensor:
        backend = self.backend
        size = 1
        for d in shape:
            size *= d
        # Completed commands release the buffers they kept alive, so the pool can reuse them.
        backend._prune_streams()
        buf = backend.pool.allocate(size * dtype.itemsize)
        stream = backend._stream_var.get() or backend._default
        assert stream is not None
        return new_tensor(backend, buf, buf.handle, shape, dtype, backend._device_obj, stream)

    def view(self, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        return view_of(x, shape)

    @property
    def _stream(self) -> CLStream:
        backend = self.backend
        stream = backend._stream_var.get() or backend._default
        assert stream is not None
        return stream  # type: ignore[return-value]

    def _enqueue(
        self,
        fn: Callable[[Any, list[Any]], Any],
        inputs: Iterable[Any],
        outputs: Iterable[Tensor],
        keepalive: Iterable[Any] = (),
    ) -> None:
        """Submit ``fn(queue, wait_for) -> event`` on the current stream after the inputs'
        writers, and record the outputs as written by it.

        ``fn`` runs on the stream's submitter thread (:mod:`accelkit_opencl.stream`): this
        makes no OpenCL call. The tensors (and ``keepalive``) stay referenced until the command
        has completed, so that their buffers do not go back to the pool while the device still
        uses them.
        """
        stream = self._stream
        inputs = [t for t in inputs if t is not None]
        outputs = list(outputs)
        seq = stream.submit(
            fn,  # type: ignore[arg-type]
            (*inputs, *outputs, *keepalive),
            positions(stream, inputs),
        )
        mark_written(outputs, stream, seq)

    def _enqueue_checked(
        self,
        fn: Callable[[Any, list[Any], Any], Any],
        inputs: Iterable[Any],
        outputs: Iterable[Tensor],
        error: Callable[[int], BaseException],
        *,
        unsigned: bool = False,
    ) -> None:
        """Like :meth:`_enqueue`, for a kernel that can find bad input only on the device.

        ``fn(queue, wait_for, err)`` enqueues the kernel with ``err``, a zeroed buffer of two
        longs: a work-item that finds a bad value sets ``err[0]`` (atomically, so one wins) and
        stores the value in ``err[1]``. The flag is copied back in the same command (an in-order
        queue), and when the outputs are awaited ``error(value)`` is raised if it was set
        (``unsigned``: the value is read as an unsigned 64-bit integer).
        """
        host = np.zeros(2, np.int64)
        context = self.backend._context
        flags: list[Any] = []  # the device flag, made by the submitter, kept with the closure

        def run(queue: Any, wait_for: list[Any]) -> Any:
            flag = cl.Buffer(
                context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host
            )
            flags.append(flag)
            fn(queue, wait_for, flag)
            return cl.enqueue_copy(queue, host, flag, is_blocking=False)

        outputs = list(outputs)
        self._enqueue(run, inputs, outputs, (host,))

        def check() -> BaseException | None:
            if not host[0]:
                return None
            value = int(host[1:].view(np.uint64)[0]) if unsigned else int(host[1])
            return error(value)

        self._stream.add_check(last_writer(outputs[0])[1], check)

    def _skip(self, outputs: Iterable[Tensor]) -> None:
        """Record empty outputs (nothing to compute) as written now."""
        stream = self._stream
        mark_written(outputs, stream, 0)


def launch(kernel: Any, args: Sequence[Any], global_size: tuple[int, ...], local: Any) -> Any:
    def run(queue: Any, wait_for: list[Any] | None) -> Any:
        return enqueue_kernel(queue, kernel, args, global_size, local, wait_for)

    return run
