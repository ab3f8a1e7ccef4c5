"""How OpenCL components allocate outputs and enqueue work on a command queue."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyopencl as cl

from accelkit.sdk import KernelBase, other_writers
from accelkit.tensor import Tensor
from accelkit_opencl.programs import enqueue_kernel
from accelkit_opencl.stream import CLStream

if TYPE_CHECKING:
    from accelkit_opencl.backend import OpenCLBackend

__all__ = ["CLComponent", "dependencies", "launch"]


def dependencies(stream: CLStream, inputs: Iterable[Any]) -> list[Any]:
    """OpenCL events for the inputs' pending writers on other streams, for code that enqueues
    on a stream's queue itself (see :meth:`CLStream.event_for`: never waits). Submissions pass
    positions (:func:`accelkit.sdk.other_writers`) to :meth:`CLStream.submit` instead."""
    deps = []
    for s, seq in other_writers(stream, inputs):
        event = s.event_for(seq)
        if event is not None:
            deps.append(event)
    return deps


class CLComponent(KernelBase[CLStream]):
    """Allocation and submission shared by the OpenCL backend's components.

    :class:`accelkit.sdk.KernelBase` allocates outputs (a tensor's storage is its ``cl.Buffer``
    block) and launches work after the writers of its inputs on other streams; this class says
    how a :class:`CLStream` takes it (:meth:`submit`) and what runs before an allocation.
    Work is ``fn(queue, wait_for) -> event``, run on the stream's submitter thread
    (:mod:`accelkit_opencl.stream`): launching makes no OpenCL call. The tensors (and the
    ``keepalive`` option) stay referenced until the command has completed, so that their
    buffers do not go back to the pool while the device still uses them.
    """

    backend: OpenCLBackend

    def before_allocation(self) -> None:
        # Completed commands released the buffers they kept alive; deferred frees whose
        # events have completed return to the pool now, so it can reuse them.
        self.backend.prune_streams()

    def submit(
        self,
        stream: CLStream,
        fn: Callable[..., Any],
        deps: list[tuple[Any, int]],
        hold: tuple[Any, ...],
        keepalive: Iterable[Any] | None = None,
        **options: Any,
    ) -> int:
        """Queue ``fn(queue, wait_for) -> event`` on ``stream`` after ``deps`` (positions of
        other streams: the submitter passes their events in ``wait_for``), keeping ``hold``
        and ``keepalive`` referenced until it has completed."""
        return stream.submit(fn, hold if keepalive is None else (*hold, keepalive), deps)

    def _enqueue_checked(
        self,
        fn: Callable[[Any, list[Any], Any], Any],
        inputs: Iterable[Any],
        outputs: Iterable[Tensor],
        error: Callable[[int], BaseException],
        *,
        unsigned: bool = False,
    ) -> None:
        """Like :meth:`launch`, for a kernel that can find bad input only on the device.

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

        seq = self.launch(run, inputs, outputs, keepalive=(host,))

        def check() -> BaseException | None:
            if not host[0]:
                return None
            value = int(host[1:].view(np.uint64)[0]) if unsigned else int(host[1])
            return error(value)

        self.current_stream.add_check(seq, check)


def launch(kernel: Any, args: Sequence[Any], global_size: tuple[int, ...], local: Any) -> Any:
    def run(queue: Any, wait_for: list[Any] | None) -> Any:
        return enqueue_kernel(queue, kernel, args, global_size, local, wait_for)

    return run
