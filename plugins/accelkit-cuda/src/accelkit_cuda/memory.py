"""The CUDA backend's memory kernels: device blocks from a caching pool, pinned host transfers.

Blocks are ``cudaMalloc`` allocations (:class:`Block`, wrapped for CuPy as unowned memory that
keeps its buffer alive) handed out by the core's :class:`~accelkit._core.pool.CachingPool`, which
keeps the exact statistics, the limit and ``trim()``. Their memory has one owner,
:class:`DeviceMemory`: only the pool (under its lock) and the backend's teardown release it,
never a garbage collector. A freed block is reused at once by later work on the same stream (stream order makes
that safe). With more than one stream, submissions keep their tensors alive until an event after
them has completed, and an explicit ``free`` returns the block once the other streams have passed
the point where it was freed, so no stream is handed a block another is still using.

Every CUDA call here runs on the backend's submission thread (:mod:`accelkit_cuda.submission`):
a pool miss queues the block's ``cudaMalloc`` there (its pointer exists before any work that
uses it runs, since that work is queued after it), and a release by the pool queues its
``cudaFree`` (after the work queued so far). On a poisoned context nothing is freed.

Host transfers are real asynchronous copies through pinned (page-locked) staging memory from
CuPy's pinned pool, allocated on the submission thread: ``cudaMemcpyAsync`` on the stream, awaited
without blocking the loop; the copy between the staging block and the caller's array runs on a
worker thread when large (``sdk.host.copy_into``). The staging block stays alive until the copy
completes, even if the awaiting task is cancelled.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import cupy
import numpy as np

from accelkit.device import Device
from accelkit.errors import DeviceError
from accelkit.memory import MemoryPoolConfig
from accelkit.sdk import (
    CachingPool,
    DeviceBuffer,
    MemoryKernels,
    buffer_of,
    last_writer,
    mark_written,
    other_writers,
    pending_writes,
)
from accelkit.sdk.host import copy_into
from accelkit.tensor import Tensor
from accelkit_cuda.capturing import defer
from accelkit_cuda.errors import OUT_OF_MEMORY, error_code, translate
from accelkit_cuda.stream import CUDA_ERRORS, CUDAStream, reported_failure

if TYPE_CHECKING:
    from accelkit_cuda.backend import CUDABackend

__all__ = [
    "Block",
    "CUDAMemoryKernels",
    "DeviceMemory",
    "block_failed",
    "block_is_live",
    "memptr",
    "pinned_empty",
]

_log = logging.getLogger("accelkit.cuda")

_H2D = 1  # cudaMemcpyHostToDevice
_D2H = 2
_D2D = 3


class Block:
    """One ``cudaMalloc`` allocation. It never frees itself: its memory has one owner, the
    :class:`DeviceMemory` of its backend, which frees it when the pool lets it go (under the
    pool's lock) or at the backend's teardown. A ``__del__`` that freed it would run in the same
    garbage collection that puts a buffer dying in a reference cycle back into the pool, and the
    pool would then hand out freed memory (the race of issue 27).

    ``ptr`` is 0 until the ``cudaMalloc`` queued at allocation has run on the submission thread
    (``pending`` until then; every use of the block is queued after it), and stays 0 with
    ``error`` set if it failed.

    ``use`` is the number (:attr:`SubmissionThread.queued`) of the last closure queued that
    reads or writes the block's pointer without holding its tensor (binary's raw launch, a
    device-to-device copy, an upload): the block may be back in the pool's cache before that
    closure ran, and a ``cudaFree`` of it on the submission thread waits until it has
    (:meth:`DeviceMemory.free`).

    ``reported`` is set once an await has raised the OutOfMemoryError of its failed
    ``cudaMalloc``: later uses raise StaleHandleError, not that failure again (set by
    :meth:`CUDAStream.claim_error_locked`, under a lock all streams share)."""

    __slots__ = ("error", "freed", "pending", "ptr", "reported", "size", "use")

    def __init__(self, ptr: int, size: int) -> None:
        self.ptr = ptr
        self.size = size
        self.pending = False
        self.freed = False
        self.error: BaseException | None = None
        self.use = 0
        self.reported = False

    def __repr__(self) -> str:
        return f"Block({self.ptr:#x}, {self.size})"


def block_is_live(block: Block) -> bool:
    """The pool's check before it hands a cached block out again: not freed, and allocated (or
    its ``cudaMalloc`` still queued: it runs before any work that uses the block). A block whose
    ``cudaMalloc`` failed is not: the pool replaces it (:func:`block_failed`). ``pending`` is
    read before ``ptr``: the ``cudaMalloc`` sets ``ptr``, then clears ``pending``, so a block
    whose allocation ends between the two reads is seen live either way."""
    return not block.freed and (block.pending or block.ptr != 0)


def block_failed(block: Block) -> bool:
    """Whether ``block``'s ``cudaMalloc`` ran and failed (the pool's ``is_failed``: a cached
    block that failed after its tensor died is freed and a fresh one queued in its place, so a
    new tensor never inherits the failure)."""
    return not block.freed and not block.ptr and not block.pending and block.error is not None


def _ptr(block: Block) -> int:
    """A block's pointer on the submission thread; a failed ``cudaMalloc`` raises here."""
    if not block.ptr:
        from accelkit_cuda.submit import block_error

        raise block_error(block)
    return block.ptr


def _copied(cell: list[np.ndarray[Any, Any]], buffer: DeviceBuffer) -> np.ndarray[Any, Any]:
    """The pinned array a read's copy filled. A copy that did not run failed, and its error was
    raised by another await that covered it (a use of a block whose failed ``cudaMalloc`` an
    await raised, once): this read raises too, never reads an empty cell."""
    if cell:
        return cell[0]
    block = buffer.handle
    if not block.ptr and block.reported:
        raise reported_failure(block)
    raise DeviceError(
        "reading device memory: the copy to the host did not run (its error was raised by"
        " another await)"
    )


def _malloc(size: int) -> int:
    try:
        return int(cupy.cuda.runtime.malloc(size))
    except CUDA_ERRORS as exc:
        # By the status code only: "an illegal memory access was encountered" mentions memory
        # too, and is a sticky fault, not a full device.
        if error_code(exc) == OUT_OF_MEMORY:
            raise MemoryError(str(exc)) from None
        raise


class DeviceMemory:
    """Every block a backend has ``cudaMalloc``-ed and not yet freed: the one owner of its
    device memory. The pool calls :meth:`alloc` and :meth:`free` (its ``raw_alloc`` and
    ``raw_free``) under its lock, at allocation, ``trim`` and statistics calls, never from a
    garbage collector; the CUDA calls themselves are queued on the backend's submission thread
    (run in place when there is none, or when already on it). :meth:`release_all` (the
    backend's teardown, after its streams have finished) frees what tensors alive at shutdown
    still hold. On a poisoned context nothing is freed: ``cudaFree`` would fail, and the memory
    goes with the process, which must exit anyway."""

    def __init__(self, backend: CUDABackend) -> None:
        self.backend = backend
        self._lock = threading.Lock()
        #: Every block allocated (or queued for allocation) and not yet freed.
        self._live: dict[int, Block] = {}
        #: Blocks (and bytes) not freed because the context was poisoned: logged at teardown.
        self._left = [0, 0]
        #: Set by :meth:`release_all`: the pool was released, and the frees from now on are
        #: the teardown's (the pool frees nothing more: its buffers are stale).
        self.torn_down = False

    def _in_place(self) -> bool:
        """Whether work for the submission thread runs here and now: there is none (or it is
        closed), or this is it."""
        thread = self.backend._thread
        return thread is None or thread.closed or thread.on_thread()

    def _run(self, fn: Any, in_place: bool | None = None) -> bool:
        """Run ``fn`` on the submission thread (queued), or here and now where
        :meth:`_in_place` (or ``in_place``, decided before) says so; True if it ran here."""
        if in_place is None:
            in_place = self._in_place()
        thread = self.backend._thread
        if in_place or thread is None:
            fn()
            return True
        thread.submit(fn)  # in order after the work queued so far (or on a thread of its own)
        return False

    def alloc(self, size: int) -> Block:
        backend = self.backend
        backend._check_usable()
        block = Block(0, size)
        block.pending = True
        with self._lock:
            self._live[id(block)] = block
        # Run in place (as _run decides), this is the pool's raw_alloc under the pool's lock,
        # which a trim here would take again (a deadlock): the pool's own retry trims instead.
        in_place = self._in_place()

        def malloc() -> None:
            try:
                with self._lock:
                    gone = id(block) not in self._live
                if gone:
                    # Freed while this was queued (a cached block trimmed in place by a full
                    # device's retry on this thread): its free found no memory to give back,
                    # and memory allocated now would belong to nobody.
                    return
                if backend._poisoned is not None:
                    raise backend._poison_error()
                try:
                    ptr = _malloc(size)
                except MemoryError:
                    # CuPy's own pool (temporaries of its kernels) and the free blocks of ours
                    # may hold the memory: return them to the driver and try once more.
                    cupy.get_default_memory_pool().free_all_blocks()
                    if in_place:
                        raise  # to the pool, which trims (its lock held) and calls again
                    backend.pool.trim()
                    ptr = _malloc(size)
                block.ptr = ptr
            except CUDA_ERRORS as exc:
                block.error = backend._failed(translate(exc, f"allocating {size} bytes"))
            except BaseException as exc:
                block.error = exc
            finally:
                block.pending = False

        if self._run(malloc, in_place) and block.error is not None:
            # Ran in place (no submission thread, or on it): the pool's caller is told.
            with self._lock:
                del self._live[id(block)]
            raise block.error
        return block

    def free(self, block: Block) -> None:
        """Free ``block`` (the pool let it go): queued on the submission thread, or there and
        then when already on it, except a block a closure still queued reads (``use``: binary's
        raw launch, of a tensor that died after it was queued, whose block a full device's
        ``cudaMalloc`` retry trims from the cache in place): its free is queued after that
        closure, so the launch finds it allocated (the memory comes back a little later)."""
        if block.freed:
            return
        block.freed = True
        backend = self.backend

        def free() -> None:
            if defer(free):  # a CUDA graph is being captured on this thread: after it ends
                return
            with self._lock:
                if self._live.pop(id(block), None) is None:
                    return
            ptr, block.ptr = block.ptr, 0
            if not ptr:
                return
            if backend._poisoned is not None:
                self._left[0] += 1
                self._left[1] += block.size
                return
            try:
                cupy.cuda.runtime.free(ptr)
            except CUDA_ERRORS as exc:  # never raised into the pool: noted, the block left
                error = backend._failed(translate(exc, "freeing device memory"))
                _log.warning("%s: a block of %d bytes was not freed: %s", backend._device_obj,
                             block.size, error)  # fmt: skip

        thread = backend._thread
        if (
            block.use
            and thread is not None
            and thread.on_thread()
            and thread.queued_after(block.use)
        ):
            thread.requeue(free)  # after the closure that reads it (closing or not)
            return
        self._run(free)

    def release_all(self) -> None:
        """The backend's teardown: free every block still allocated (held by tensors that
        outlive the backend; they are stale now, so nothing reads the memory again). The frees
        are queued on the submission thread, after everything queued so far.

        It runs after ``pool.invalidate_all``: the pool calls :meth:`free` no more (every buffer
        is stale, the cache is empty, allocations refuse), so it needs no pool lock; each
        block is freed once, under this object's lock."""
        with self._lock:
            self.torn_down = True
            blocks = list(self._live.values())
        for block in blocks:
            self.free(block)
        self._run(self._report)

    def _report(self) -> None:
        count, nbytes = self._left
        if count:
            _log.warning(
                "%s: %d blocks (%d bytes) of device memory left to the process: the CUDA context"
                " is poisoned (%s), so they cannot be freed; the process must be restarted",
                self.backend._device_obj, count, nbytes, self.backend._poisoned,
            )  # fmt: skip
            self._left = [0, 0]


def memptr(buffer: DeviceBuffer, device_id: int) -> Any:
    """A CuPy memory pointer to a pooled buffer's block. CuPy never frees it (the pool does),
    and every CuPy array over it keeps the *buffer* alive, so the pool cannot hand the block to
    anyone else while such an array exists."""
    block = buffer.handle
    return cupy.cuda.MemoryPointer(
        cupy.cuda.UnownedMemory(block.ptr, block.size, buffer, device_id), 0
    )


def pinned_empty(nbytes: int) -> tuple[Any, np.ndarray[Any, Any]]:
    """A pinned host block of ``nbytes`` and a uint8 NumPy view of it."""
    block = cupy.cuda.alloc_pinned_memory(max(nbytes, 1))
    return block, np.frombuffer(block, np.uint8, nbytes)


class CUDAMemoryKernels(MemoryKernels):
    """The pool over :class:`DeviceMemory`, and the copies, queued on the streams after their
    writers (``wait_for_writers`` is false: the core's memory manager checks the arguments,
    including ``check_ready``, which refuses on a poisoned context, and does not wait)."""

    backend: CUDABackend
    wait_for_writers = False

    def __init__(
        self, backend: CUDABackend, device: Device, total_bytes: int, config: MemoryPoolConfig
    ) -> None:
        self.blocks = DeviceMemory(backend)
        pool = CachingPool(
            device,
            self.blocks.alloc,
            self.blocks.free,
            total_bytes,
            config,
            is_live=block_is_live,
            is_failed=block_failed,
        )
        super().__init__(backend, pool)

    def release_blocks(self) -> None:
        """The backend's teardown (after ``pool.invalidate_all``): free what is still held."""
        self.blocks.release_all()

    def settle(self) -> None:
        # A poisoned backend refuses here (prune_streams checks it first).
        self.backend.prune_streams()

    def _current(self) -> CUDAStream:
        return self.backend.current_stream

    def free(self, buffer: DeviceBuffer) -> None:
        streams = self.backend.streams
        if len(streams) < 2:
            self.pool.free(buffer)  # one stream: every later use is in order after this point
            return
        # Returned once every stream has passed this point: work queued so far on any of them
        # may still use the block, and the pool may hand it to any stream next.
        points = [s.position() for s in streams]
        self.pool.free(buffer, lambda recycle: self.backend.after_events(points, recycle))

    def _submit_copy(
        self, stream: CUDAStream, dst: Any, src: Any, nbytes: int, kind: int,
        inputs: Sequence[Any], keep: tuple[Any, ...], what: str,
    ) -> int:  # fmt: skip
        """Queue ``cudaMemcpyAsync(dst(), src(), ...)`` on ``stream`` (pointers are read on the
        submission thread, where the blocks' mallocs ran); returns its position."""
        self.backend._check_usable()

        def run() -> None:
            cupy.cuda.runtime.memcpyAsync(dst(), src(), nbytes, kind, stream.cp.ptr)

        return stream.submit(run, keep, other_writers(stream, inputs), what)

    async def stage(self, data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Pinned staging memory (allocated on the submission thread) holding the caller's
        bytes: the one host copy of an upload. The array keeps its pinned block alive (its base
        is a memoryview of the block), so holding it until the copy has run holds both."""
        try:
            _, staging = await self.backend.thread.call(lambda: pinned_empty(data.nbytes))
        except CUDA_ERRORS as exc:
            raise self.backend._failed(translate(exc, "pinned staging memory")) from None
        await copy_into(staging, data)  # off the loop when large
        return staging

    async def write(
        self, buffer: DeviceBuffer, data: np.ndarray[Any, Any], dst: Tensor | None
    ) -> None:
        stream = self._current()
        handle, staging = buffer.handle, data
        seq = self._submit_copy(
            stream, lambda: _ptr(handle), lambda: staging.ctypes.data, staging.nbytes, _H2D,
            [dst] if dst is not None else [], (staging, buffer), "copy_htod",
        )  # fmt: skip
        if dst is not None:
            mark_written((dst,), stream, seq)
        await stream.wait_for(seq)

    def _to_staging(
        self, stream: CUDAStream, buf: DeviceBuffer, nbytes: int, inputs: Sequence[Any],
        what: str,
    ) -> tuple[int, list[np.ndarray[Any, Any]]]:  # fmt: skip
        """Queue a copy of ``buf`` into pinned memory allocated there; returns the position and
        a list that holds the pinned array once the submission thread has made it."""
        self.backend._check_usable()
        cell: list[np.ndarray[Any, Any]] = []
        handle = buf.handle

        def run() -> Any:
            block, staging = pinned_empty(nbytes)
            cupy.cuda.runtime.memcpyAsync(
                staging.ctypes.data, _ptr(handle), nbytes, _D2H, stream.cp.ptr
            )
            cell.append(staging)
            return block

        return stream.submit(run, (buf,), other_writers(stream, inputs), what), cell

    async def read(
        self, out: np.ndarray[Any, Any], buffer: DeviceBuffer, src: Tensor | None
    ) -> None:
        stream = self._current()
        inputs = [src] if src is not None else []
        seq, cell = self._to_staging(stream, buffer, out.nbytes, inputs, "copy_dtoh")
        await stream.wait_for(seq)
        await copy_into(out, _copied(cell, buffer))

    def copy(
        self,
        dst: DeviceBuffer,
        src: DeviceBuffer,
        nbytes: int,
        dst_tensor: Tensor | None,
        src_tensor: Tensor | None,
    ) -> None:
        stream = self._current()
        dh, sh = dst.handle, src.handle
        seq = self._submit_copy(
            stream, lambda: _ptr(dh), lambda: _ptr(sh), nbytes, _D2D,
            [t for t in (src_tensor, dst_tensor) if t is not None],
            (dst, src) if stream.track else (), "copy_dtod",
        )  # fmt: skip
        dh.use = sh.use = stream.thread.queued  # held as blocks (see Block.use)
        if dst_tensor is not None:
            mark_written((dst_tensor,), stream, seq)

    # -- tensor transfers -------------------------------------------------------------------------
    def _start_read(self, tensor: Tensor) -> tuple[np.ndarray[Any, Any], Any]:
        """The host array to fill, and the copy to staging queued on the writer's stream (in
        order after the writer; after a write of its buffer through a view on another stream
        too; None for an empty tensor)."""
        out = np.empty(tensor.shape, tensor.dtype.to_numpy())
        if out.nbytes == 0:
            return out, None
        # A tensor of this backend (checked) was last written on one of its CUDA streams.
        stream = cast(CUDAStream, last_writer(tensor)[0])
        seq, cell = self._to_staging(
            stream, buffer_of(tensor), tensor.nbytes, [tensor], "reading a tensor"
        )
        return out, (seq, cell, stream)

    async def read_tensor(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        out, queued = self._start_read(tensor)
        if queued is None:
            return out
        seq, cell, stream = queued
        await stream.wait_for(seq)
        for other, at in pending_writes(tensor)[1:]:  # a view's write: done, its error first
            await other.wait_for(at)
        stream.raise_errors(last_writer(tensor)[1])
        # Out of the pinned staging block, off the event loop when large (sdk.host).
        await copy_into(out.reshape(-1).view(np.uint8), _copied(cell, buffer_of(tensor)))
        return out

    def read_tensor_blocking(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        out, queued = self._start_read(tensor)
        if queued is None:
            return out
        seq, cell, stream = queued
        stream.wait_for_blocking(seq)
        for other, at in pending_writes(tensor)[1:]:
            other.wait_for_blocking(at)
        stream.raise_errors(last_writer(tensor)[1])
        out.reshape(-1).view(np.uint8)[...] = _copied(cell, buffer_of(tensor))
        return out
