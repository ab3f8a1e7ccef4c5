"""Memory helpers for backends whose device memory is host memory (the CPU backend, the example
backend): aligned blocks for the caching pool, stream-ordered frees on a host stream, copies to
the host that leave the event loop when they are large, and DLPack export that keeps the block
alive."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import numpy as np

from accelkit.abc.memory import DeviceBuffer

if TYPE_CHECKING:
    from accelkit._core.host_stream import HostStream
    from accelkit._core.pool import CachingPool

__all__ = [
    "OFF_LOOP_COPY_BYTES",
    "aligned_allocator",
    "copy_into",
    "copy_to_host",
    "export_dlpack",
    "free_in_stream_order",
    "release_block",
]

#: Host copies of at least this many bytes run on a worker thread, not the event loop's: a
#: 1 MiB copy takes about 0.1 ms, a 64 MiB one (4096x4096 f32) 10 to 150 ms with page faults.
OFF_LOOP_COPY_BYTES = 1 << 20

Array = np.ndarray[Any, Any]


def aligned_allocator(alignment: int) -> Callable[[int], Array]:
    """A pool ``raw_alloc``: flat ``uint8`` blocks whose first byte is ``alignment``-aligned."""

    def alloc(size: int) -> Array:
        raw = np.empty(size + alignment, np.uint8)
        offset = (-raw.ctypes.data) % alignment
        return raw[offset : offset + size]

    return alloc


def release_block(handle: Any) -> None:
    """A pool ``raw_free`` for host blocks: the memory goes back to the allocator when the last
    reference to the array is dropped."""


def free_in_stream_order(
    pool: CachingPool,
    buffer: DeviceBuffer,
    stream: HostStream,
    others: Iterable[HostStream] = (),
) -> None:
    """Free ``buffer`` now (stale and uncounted at once); its block returns to the pool after the
    work submitted so far on ``stream`` and on ``others`` (pass the backend's streams: work
    queued on any of them may still read the block, and the pool may hand it to any of them
    next)."""
    busy = [(s, s.submitted) for s in others if s is not stream and not s.query()]
    if not busy:
        if stream.query():
            if not _being_read(buffer):
                pool.free(buffer)
            else:  # a to_host copying it off the loop: the block returns when it is done
                pool.free(buffer, lambda recycle: _after_reads(buffer, recycle))
            return

        def recycle_later(recycle: Callable[[], None]) -> None:
            stream.submit(lambda: _after_reads(buffer, recycle), heavy=True)

        pool.free(buffer, recycle_later)
        return
    if not stream.query():
        busy.append((stream, stream.submitted))

    def after_all(recycle: Callable[[], None]) -> None:
        # The last of the streams to pass its point returns the block (on its own thread, or
        # here where one passed already), without holding any stream's later work back.
        left = [len(busy)]
        lock = threading.Lock()

        def one() -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            _after_reads(buffer, recycle)

        for s, seq in busy:
            s.add_waiter(seq, one)

    pool.free(buffer, after_all)


# -- blocks read by host copies off the event loop --------------------------------------------------
# A large to_host copies on a worker thread after its writers have completed, while other work
# of the stream goes on (it waits for nothing else). A stream-ordered free meanwhile sees an
# idle stream: the block must still wait for the copy (the next allocation wrote into it while
# it was copied, and the copy returned the new tensor's data).
_reads_lock = threading.Lock()
#: id(buffer) -> [copies reading it, what runs once the last one is done]
_reads: dict[int, list[Any]] = {}


def _being_read(buffer: DeviceBuffer) -> bool:
    return id(buffer) in _reads


@contextlib.contextmanager
def reading(buffer: DeviceBuffer | None) -> Iterator[None]:
    """A host copy reads ``buffer`` (None: not a pooled block) inside the block; what waits
    for its reads (:func:`_after_reads`: a stream-ordered free, :func:`free_in_stream_order`)
    runs once the last one ends. A backend whose read of a buffer's block runs outside its
    streams (on a worker thread) reads inside this block, so that a free meanwhile does not
    hand the block to other work before the read is done."""
    if buffer is None:
        yield
        return
    with _reads_lock:
        _reads.setdefault(id(buffer), [0, []])[0] += 1
    try:
        yield
    finally:
        with _reads_lock:
            entry = _reads[id(buffer)]
            entry[0] -= 1
            done = not entry[0]
            if done:
                del _reads[id(buffer)]
        if done:
            for fn in entry[1]:
                fn()


def _after_reads(buffer: DeviceBuffer, fn: Callable[[], None]) -> None:
    """Run ``fn`` once no host copy reads ``buffer`` (now, where none does)."""
    with _reads_lock:
        entry = _reads.get(id(buffer))
        if entry is not None:
            entry[1].append(fn)
            return
    fn()


def export_dlpack(buffer: DeviceBuffer, array: Array, **kwargs: Any) -> Any:
    """``array.__dlpack__(**kwargs)`` through a holder whose lifetime keeps ``buffer`` (and so
    its block) out of the pool while the consumer still reads it."""
    return np.asarray(_Holder(buffer, array)).__dlpack__(**kwargs)


class _Holder:
    __slots__ = ("__array_interface__", "buffer", "data")

    def __init__(self, buffer: DeviceBuffer, data: Array) -> None:
        self.buffer = buffer
        self.data = data
        self.__array_interface__ = data.__array_interface__


async def copy_to_host(array: Array, buffer: DeviceBuffer | None = None) -> Array:
    """A new host array equal to ``array``, copied on a worker thread when it is large (at least
    :data:`OFF_LOOP_COPY_BYTES`), so that a ``to_host`` never stalls the event loop. Cancelling
    the wait lets the copy finish (it is short) and raises; the source must stay alive, which
    the caller's reference ensures. ``buffer``: the pooled buffer ``array`` views, which a
    stream-ordered free (:func:`free_in_stream_order`) keeps out of the pool until the copy is
    done."""
    if array.nbytes < OFF_LOOP_COPY_BYTES:
        return _copy(array)
    with reading(buffer):
        copied: Array = await anyio.to_thread.run_sync(_copy, array)
    return copied


def _copy(array: Array) -> Array:
    return np.array(array, copy=True)


async def copy_into(dst: Array, src: Array, buffer: DeviceBuffer | None = None) -> None:
    """``dst[...] = src`` (same shape), on a worker thread when large, as :func:`copy_to_host`
    (``buffer``: the pooled buffer ``src`` views)."""
    if src.nbytes < OFF_LOOP_COPY_BYTES:
        dst[...] = src
        return
    with reading(buffer):
        await anyio.to_thread.run_sync(np.copyto, dst, src)
