"""The Dask backend's memory kernels: a pool of :class:`~accelkit_dask.submit.Slot` blocks whose
size is the cluster's memory. A block holds a dask array (its chunks on the workers); transfers
go through the client, on a stream's worker thread or awaited without blocking the loop."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np

from accelkit import Tensor
from accelkit.device import Device
from accelkit.memory import MemoryPoolConfig
from accelkit.sdk import CachingPool, DeviceBuffer, HostStream, MemoryKernels
from accelkit.sdk import host as h
from accelkit_dask.submit import (
    Array,
    Graphs,
    Slot,
    first_error,
    lost_or,
    map_error,
    release,
    wait_futures,
)

if TYPE_CHECKING:
    from accelkit_dask.backend import DaskBackend
    from accelkit_dask.factory_kernels import DaskFactoryKernels


class DaskMemoryKernels(MemoryKernels):
    """Transfers go through ``kernels`` (the backend's FactoryKernels, opened with it). The
    core's memory manager checks the arguments and waits for the writers of what is read."""

    backend: DaskBackend

    def __init__(
        self,
        backend: DaskBackend,
        device: Device,
        total: int,
        config: MemoryPoolConfig,
        kernels: DaskFactoryKernels,
    ) -> None:
        #: Every block made, live or cached (weakly): :meth:`release_all` empties them.
        self._slots: weakref.WeakSet[Slot] = weakref.WeakSet()

        def alloc(nbytes: int) -> Slot:
            slot = Slot()
            self._slots.add(slot)
            return slot

        super().__init__(backend, CachingPool(device, alloc, release, total, config))
        self.kernels = kernels

    def release_all(self) -> None:
        """At shutdown: every block lets go of its array (its chunks on the cluster), those of
        tensors the program still holds included (they are stale, and read nothing more)."""
        for slot in list(self._slots):
            release(slot)

    def _stream(self) -> HostStream:
        return self.backend.current_stream

    def free(self, buffer: DeviceBuffer) -> None:
        # Stream-ordered: the block (and its chunks on the cluster) go after the work submitted so
        # far on every stream, which may still read it.
        h.free_in_stream_order(self.pool, buffer, self._stream(), self.backend.streams)

    # -- host transfers ---------------------------------------------------------------------------
    async def write(self, buffer: DeviceBuffer, data: Array, dst: Tensor | None) -> None:
        # ``data`` is the core's snapshot of the caller's bytes (MemoryKernels.stage).
        factory = self.kernels
        whole = dst.nbytes if dst is not None else buffer.nbytes
        if data.nbytes < whole:
            # Into the start of the block, the rest kept: a dask array is replaced whole, so the
            # block's bytes are read and spliced here (a partial write dropped the tail, and
            # one into a tensor raised NumPy's reshape error).
            current = await (
                self.read_tensor(dst) if dst is not None else self._read_slot(buffer.handle)
            )
            data = _spliced(data, current, whole)
        if dst is not None:
            typed = data[: dst.nbytes].view(dst.dtype.to_numpy()).reshape(dst.shape)
            factory.put(dst, typed)
        else:
            graphs = self.backend.graphs

            def run() -> None:
                graphs.upload(buffer, data, ((data.size,),))

            factory.run_heavy(run)
        await self._stream().synchronize()

    async def read(self, out: Array, buffer: DeviceBuffer, src: Tensor | None) -> None:
        if src is not None:
            data = await self.read_tensor(src)
        else:
            data = await self._read_slot(buffer.handle)
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)[: out.nbytes]
        out[: raw.size] = raw
        out[raw.size :] = 0  # never written: zeros, as a typed read gives (not the caller's bytes)

    def copy(
        self,
        dst: DeviceBuffer,
        src: DeviceBuffer,
        nbytes: int,
        dst_tensor: Tensor | None,
        src_tensor: Tensor | None,
    ) -> None:
        kernels = self.kernels
        if nbytes < dst.nbytes or (
            dst_tensor is not None
            and src_tensor is not None
            and dst_tensor.shape != src_tensor.shape
        ):
            self._copy_spliced(dst, src, nbytes, dst_tensor, src_tensor)
            return
        if (
            dst_tensor is not None
            and src_tensor is not None
            and dst_tensor.dtype == src_tensor.dtype
        ):
            shape = dst_tensor.shape
            kernels.launch(
                lambda: kernels.arr(src_tensor).reshape(shape), (src_tensor,), (dst_tensor,)
            )
            return
        # A raw copy: the destination holds the source's array (dask arrays are immutable, so
        # sharing it is a copy); a typed read reinterprets its bytes.
        graphs = self.backend.graphs

        def run() -> None:
            slot: Slot = src.handle
            if slot.array is not None:
                graphs.store(dst, slot.array) if not slot.lazy else graphs.write(dst, slot.array)

        kernels.run_heavy(run, [dst_tensor] if dst_tensor is not None else [])

    def _copy_spliced(
        self,
        dst: DeviceBuffer,
        src: DeviceBuffer,
        nbytes: int,
        dst_tensor: Tensor | None,
        src_tensor: Tensor | None,
    ) -> None:
        """``nbytes`` of ``src`` into the start of ``dst``, the rest of ``dst`` kept: both read
        on the stream's worker (in stream order), spliced, and uploaded (the destination took
        the source's whole array: its tail was lost, or zeros in a typed read)."""
        graphs, kernels = self.backend.graphs, self.kernels

        def host_bytes(tensor: Tensor | None, buffer: DeviceBuffer) -> Array:
            array = kernels.arr(tensor) if tensor is not None else buffer.handle.array
            if array is None:
                return np.zeros(0, np.uint8)
            graphs.flush(array)
            return np.ascontiguousarray(fetch(graphs, graphs.extra)).reshape(-1).view(np.uint8)

        def run() -> None:
            head = host_bytes(src_tensor, src)[:nbytes]
            merged = _spliced(head, host_bytes(dst_tensor, dst), dst.nbytes)
            graphs.upload(dst, merged, ((merged.size,),))

        kernels.run_heavy(run, [dst_tensor] if dst_tensor is not None else [])

    # -- reading: the core has waited for the tensor's writers ------------------------------------
    async def read_tensor(self, tensor: Tensor) -> Array:
        if tensor.size == 0:
            return np.empty(tensor.shape, tensor.dtype.to_numpy())
        kernels = self.kernels
        return await self._compute(lambda: kernels.arr(tensor), f"reading {tensor!r}")

    async def _read_slot(self, slot: Slot) -> Array:
        if slot.array is None:
            return np.zeros(0, np.uint8)
        return await self._compute(lambda: slot.array, "reading a buffer")

    async def _compute(self, array: Any, what: str) -> Array:
        """Flush pending graphs, then compute ``array()`` and bring it to the host, awaited
        without blocking the loop; cancelling the wait cancels its futures that no other read
        waits on."""
        from distributed import futures_of

        graphs = self.backend.graphs
        box: dict[str, Any] = {}

        def submit() -> None:
            # One persist for the pending graphs and the array read (one message to the
            # scheduler), then its chunks are gathered here and assembled.
            graphs.flush(array())
            box["array"] = graphs.extra
            box["parts"] = futures_of(graphs.extra)

        graphs.reads_in_flight += 1  # (on the loop's thread only) shutdown waits for it
        try:
            stream = self._stream()
            # (Cancelled before the flush was made, the read leaves its futures computing: a
            # flush persists every pending graph, fused into tasks other tensors share.)
            await stream.wait_for(stream.submit(submit, True))
            parts = box["parts"]
            cancelled = [False]

            def cancel() -> None:
                cancelled[0] = True

            graphs.read_started(parts)
            try:
                await wait_futures(parts, cancel)
            finally:  # a cancelled wait cancels the futures no other read waits on
                graphs.read_ended(parts, cancelled[0])
            error = first_error(parts, what)
            if error is not None:
                error = await lost_or(error, parts, graphs)
                failed = next((f for f in parts if f.status == "error"), None)
                graphs.reported(error, failed.exception() if failed is not None else None)
                try:
                    raise error
                finally:
                    # Break the cycle error -> traceback -> this frame -> error, which would
                    # keep the tensor read (and its memory) alive until a gc pass.
                    del error, array
            arr = box["array"]
            try:
                # Gathering and joining the chunks (a copy of the whole tensor) run off the
                # loop.
                return await anyio.to_thread.run_sync(fetch, graphs, arr)
            except Exception as exc:
                raise map_error(exc, what) from None
        finally:
            graphs.reads_in_flight -= 1

    def read_tensor_blocking(self, tensor: Tensor) -> Array:
        if tensor.size == 0:
            return np.empty(tensor.shape, tensor.dtype.to_numpy())
        graphs = self.backend.graphs
        stream = self._stream()
        box: dict[str, Any] = {}
        kernels = self.kernels

        def submit() -> None:
            graphs.flush(kernels.arr(tensor))
            box["array"] = graphs.extra

        stream.wait_for_blocking(stream.submit(submit, True))
        try:
            return fetch(graphs, box["array"])
        except Exception as exc:
            raise map_error(exc, f"reading {tensor!r}") from None

    def dlpack_device(self, tensor: Tensor) -> tuple[int, int]:
        return (1, 0)  # exported as a host copy

    def export_dlpack(self, tensor: Tensor, *, stream: Any = None, **kwargs: Any) -> Any:
        # The tensor lives on the cluster: DLPack gets a host copy of it.
        return self.read_tensor_blocking(tensor).__dlpack__(**kwargs)


def _spliced(head: Array, current: Array, nbytes: int) -> Array:
    """``nbytes`` bytes: ``head``'s, then ``current``'s after them (zeros past its end)."""
    out = np.zeros(nbytes, np.uint8)
    cur = np.ascontiguousarray(current).reshape(-1).view(np.uint8)[:nbytes]
    out[: cur.size] = cur
    raw = np.ascontiguousarray(head).reshape(-1).view(np.uint8)
    out[: raw.size] = raw
    return out


def fetch(graphs: Graphs, array: Any) -> Array:
    """A persisted dask array's chunks gathered here and joined (blocking)."""
    from distributed import futures_of

    parts = futures_of(array)
    chunks = graphs.client.gather(parts)
    return assemble(array, dict(zip([f.key for f in parts], chunks, strict=True)))


def assemble(array: Any, chunks: dict[Any, Array]) -> Array:
    """A persisted dask array's chunks (by key) as one host array."""
    from dask.array.core import concatenate3
    from distributed import Future

    graph = dict(array.__dask_graph__())

    def chunk(key: Any) -> Array:
        value = graph.get(key)
        # a persisted array's graph maps each block to its future, whose key may differ (the
        # blocks of a scattered array are keyed by their content)
        return chunks[value.key if isinstance(value, Future) else key]

    def build(keys: Any) -> Any:
        if isinstance(keys, list):
            return [build(k) for k in keys]
        return chunk(keys)

    keys = array.__dask_keys__()
    if array.ndim == 0:
        return np.asarray(chunk(keys[0] if isinstance(keys, list) else keys))
    return np.asarray(concatenate3(build(keys)))
