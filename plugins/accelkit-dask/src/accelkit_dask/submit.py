"""How the Dask backend's components hold tensors and submit work.

A pool block's handle is a :class:`Slot`: the dask array the block holds (None until written).
A kernel builds a dask graph from its inputs' arrays and stores it in its outputs' slots,
*lazily*: nothing reaches the scheduler yet. The pending graphs go to the cluster together
(:meth:`Graphs.flush`, one ``client.persist``) when a result is read, at ``synchronize``, and
every :data:`FLUSH_EVERY` writes, so that a chain of small ops costs one round trip through the
scheduler instead of one each, and shared inputs are computed once. After a flush a slot holds
the persisted array: its chunks live on the workers as futures.

Graph building runs on the current stream (inline when the stream is idle: it only builds a
graph); flushes and host transfers run on the stream's worker thread, never on the event loop.
"""

from __future__ import annotations

import collections
import itertools
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np

from accelkit import Tensor
from accelkit.errors import AccelError, ContextPoisonedError, DeviceError
from accelkit.sdk import (
    DeviceBuffer,
    HostStream,
    KernelBase,
    buffer_of,
    mark_written,
    prod,
    storage,
    wait_for_callback,
)
from accelkit_dask import blocks

if TYPE_CHECKING:
    import dask.array as da

    from accelkit_dask.backend import DaskBackend
    from accelkit_dask.cluster import Cluster

Array = np.ndarray[Any, Any]

#: Pending writes that trigger a flush without a read (bounds the size of a lazy graph).
FLUSH_EVERY = 256
#: A flush whose arrays are all single blocks up to this size runs as one task.
FUSE_BYTES = 16 << 20
#: ... and whose graph has at most this many tasks.
FUSE_TASKS = 4096
#: Host arrays up to this size are sent inside the graph (recomputable after a worker dies);
#: larger ones are scattered to the workers and replicated.
GRAPH_BYTES = 32 << 20
#: Host arrays larger than this are sent off the event loop, on the stream's worker thread.
SCATTER_BYTES = 1 << 20

_ids = itertools.count()
#: This process's part of every key (keys are unique across the clients of a scheduler; one
#: random prefix per process, not a uuid per op: that costs a system call each).
_PROCESS = uuid.uuid4().hex[:12]


def _forked() -> None:
    global _PROCESS
    _PROCESS = uuid.uuid4().hex[:12]


os.register_at_fork(after_in_child=_forked)  # a forked child is another process


def unique(op: str) -> str:
    """A fresh key prefix for one op's output (explicit names spare dask hashing the inputs)."""
    return f"accelkit-{op}-{_PROCESS}-{next(_ids)}"


class Slot:
    """A pool block of the Dask backend: the distributed array it holds."""

    __slots__ = ("__weakref__", "array", "lazy", "owner")

    def __init__(self) -> None:
        self.array: da.Array | None = None
        self.lazy = False
        self.owner: weakref.ref[DeviceBuffer] | None = None

    def clear(self) -> None:
        self.array = None
        self.lazy = False


def release(slot: Slot) -> None:
    """The pool's raw free: the block's chunks are released on the cluster."""
    slot.clear()
    slot.owner = None


def _owner_died(slot: Slot) -> Callable[[weakref.ref[DeviceBuffer]], None]:
    def died(ref: weakref.ref[DeviceBuffer]) -> None:
        if slot.owner is ref:  # not a later owner of the recycled block
            slot.clear()

    return died


def _own(slot: Slot, buf: DeviceBuffer) -> None:
    """Record ``buf`` as the slot's owner: its chunks are dropped when the buffer dies."""
    if slot.owner is None or slot.owner() is not buf:
        slot.owner = weakref.ref(buf, _owner_died(slot))


def map_error(exc: BaseException, what: str) -> AccelError:
    """The accelkit error for a task that failed on the cluster: the worker's accelkit error as
    itself (without the remote traceback), anything else as a DeviceError saying what failed."""
    if isinstance(exc, AccelError):
        return type(exc)(str(exc))
    name = type(exc).__name__
    if name in ("CancelledError", "FutureCancelledError"):
        reason = str(exc) or "cancelled"
        if "lost" in reason or "connection" in reason:
            return ContextPoisonedError(
                f"{what}: the connection to the Dask scheduler was lost ({reason}); call"
                " `await backend.recover()`"
            )
        return DeviceError(f"{what} was cancelled ({reason})")
    if name == "KilledWorker":
        return DeviceError(f"{what}: the workers running it died repeatedly ({exc})")
    return DeviceError(f"{what} failed on the cluster: {name}: {exc}")


async def wait_futures(futures: Sequence[Any], cancel: Callable[[], None] | None = None) -> None:
    """Wait, without blocking the event loop, until every future has finished (done, erred or
    cancelled); ``cancel`` runs if the wait itself is cancelled."""
    remaining = [f for f in futures if not f.done()]
    if not remaining:
        return
    lock = threading.Lock()
    left = [len(remaining)]

    def register(callback: Callable[[], None]) -> None:
        def one_done(_: Any) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                callback()

        for f in remaining:
            f.add_done_callback(one_done)

    try:
        await wait_for_callback(register)
    except BaseException:
        if cancel is not None and any(not f.done() for f in remaining):
            cancel()
        raise


def first_error(
    futures: Iterable[Any], what: str, skip: set[str] | None = None
) -> AccelError | None:
    """The first failure among finished ``futures`` as an accelkit error (those whose cause is
    in ``skip``, already reported, are passed over)."""
    for f in futures:
        status = f.status
        if status == "error":
            exc = f.exception()
            if skip and str(exc) in skip:
                continue
            return map_error(exc, what)
        if status in ("cancelled", "lost"):
            reason = ""
            try:
                f.result()
            except BaseException as exc:
                reason = str(exc)
            return map_error(_Cancelled(reason or status), what)
    return None


#: The reason given when a cancelled read cancels its futures.
CANCELLED_HERE = "its read was cancelled"
#: Seconds a read that found its futures cancelled waits for the client to say whether it lost
#: the scheduler (it cancels the futures first and changes its status moments later).
LOST_GRACE_S = 2.0


async def lost_or(error: AccelError, futures: Sequence[Any], graphs: Graphs) -> AccelError:
    """``error``, unless the futures were cancelled because the scheduler went away: then the
    ContextPoisonedError that says so (and poisons the backend). Nothing here cancelled them (a
    cancelled read gives :data:`CANCELLED_HERE`), so another cancellation is most likely the
    connection dropping; the client's status is waited for up to :data:`LOST_GRACE_S`."""
    if (
        isinstance(error, ContextPoisonedError)
        or CANCELLED_HERE in str(error)
        or not any(f.status in ("cancelled", "lost") for f in futures)
    ):
        return error
    deadline = time.monotonic() + LOST_GRACE_S
    while True:
        try:
            graphs.check()
        except ContextPoisonedError as poisoned:
            return poisoned
        if time.monotonic() >= deadline:
            return error
        await anyio.sleep(0.05)


def _single_key(keys: Any) -> Any:
    while isinstance(keys, list):
        keys = keys[0]
    return keys


class _Cancelled(Exception):
    pass


_Cancelled.__name__ = "CancelledError"


class Graphs:
    """The graphs of one backend's tensors: pending (lazy) writes, flushes and what is in flight
    on the cluster."""

    def __init__(
        self, cluster: Cluster, chunk_bytes: int, reclaim: Callable[[], None] | None = None
    ) -> None:
        #: The pool's ``reclaim``: called before a flush, so that the blocks of tensors that
        #: died meanwhile are not sent as results of their own.
        self._reclaim = reclaim
        self.cluster = cluster
        self.chunk_bytes = chunk_bytes
        self.client = cluster.client
        self._lock = threading.Lock()
        self._lazy: dict[int, Slot] = {}
        self._inflight: list[Any] = []
        self.writes = 0
        self._flushed_at = 0
        self.flushes = 0
        #: A flush is due (set by a write, taken by the next launch).
        self.due = False
        #: Causes of failures a read reported since the last synchronize.
        self.reported_causes: set[str] = set()
        # The persisted array of the last flush's ``extra``, per thread (streams flush at once).
        self._local = threading.local()
        self.lost: str | None = None
        #: The reads waiting on each future's key (:meth:`read_started`), and the reads in
        #: flight, from their flush to their gather (shutdown waits for them).
        self._readers: collections.Counter[str] = collections.Counter()
        self.reads_in_flight = 0

    @property
    def extra(self) -> Any:
        """The persisted array of the ``extra`` of this thread's last :meth:`flush`."""
        return getattr(self._local, "extra", None)

    @extra.setter
    def extra(self, value: Any) -> None:
        self._local.extra = value

    def drop(self) -> None:
        """At shutdown: let go of every future and pending graph held here (the kernels keep
        this object, and with it the cluster's memory on an external cluster)."""
        with self._lock:
            self._lazy.clear()
            self._inflight.clear()
        self._local = threading.local()

    def check(self) -> None:
        """ContextPoisonedError once the scheduler is gone (until ``recover``)."""
        if self.lost is None and not self.cluster.connected:
            self.lost = f"the client is {getattr(self.client, 'status', 'closed')}"
        if self.lost is not None:
            raise ContextPoisonedError(
                f"the Dask scheduler at {self.cluster.address} is gone ({self.lost}); call"
                " `await backend.recover()`"
            )

    def write(self, buf: DeviceBuffer, array: da.Array) -> bool:
        """Store ``array`` as the block's content (lazily); True when a flush is due. A result
        no larger than a chunk is kept in one block (a concat or a take may have split it)."""
        if array.npartitions > 1 and array.nbytes <= self.chunk_bytes:
            array = array.rechunk(tuple((n,) for n in array.shape))
        slot: Slot = buf.handle
        slot.array = array
        slot.lazy = True
        _own(slot, buf)
        with self._lock:
            self._lazy[id(slot)] = slot
            self.writes += 1
            # Counted in writes, not pending blocks: the pool recycles blocks, and a chain of
            # ops through a few of them would otherwise grow one graph without end.
            return self.writes - self._flushed_at >= FLUSH_EVERY

    def store(self, buf: DeviceBuffer, array: da.Array) -> None:
        """Store an array that is already on the cluster (persisted or scattered)."""
        slot: Slot = buf.handle
        slot.array = array
        slot.lazy = False
        _own(slot, buf)
        with self._lock:
            self._lazy.pop(id(slot), None)

    def flush(self, extra: Any = None) -> list[Any]:
        """Send every pending graph to the cluster in one persist (blocking: call it from a
        stream's worker thread); returns the futures now in flight. ``extra`` (an array to read)
        goes in the same persist, and is replaced by its persisted self in ``self.extra``."""
        from distributed import futures_of

        self.check()
        if self._reclaim is not None:
            self._reclaim()  # dead intermediates' slots are cleared (their owners die here)
        with self._lock:
            slots = list(self._lazy.values())
            self._lazy.clear()
            self._flushed_at = self.writes
        live: list[tuple[Slot | None, Any]] = []
        for s in slots:
            owner = s.owner() if s.owner is not None else None
            if s.lazy and s.array is not None and owner is not None and owner.is_alive:
                live.append((s, s.array))
        self.extra = None
        # Where the array read is a pending block's own array (a read of an op's output), it
        # is persisted once, as that block's: as a second array of the same keys it would cost
        # the fused path a task of its own to pick it out.
        same = -1
        if extra is not None:
            same = next((i for i, (_, a) in enumerate(live) if a.name == extra.name), -1)
            if same < 0 and (not futures_of(extra) or len(extra.dask) != extra.npartitions):
                live.append((None, extra))  # not on the cluster yet, or not only its futures
            elif same < 0:
                self.extra = extra  # already persisted: read as it is
        if live:
            arrays = [a for _, a in live]
            persisted = self._fused(arrays)
            if persisted is None:
                persisted = self.client.persist(arrays)
            if same >= 0:
                self.extra = persisted[same]
            elif live[-1][0] is None:
                self.extra = persisted[-1]
                live, persisted = live[:-1], persisted[:-1]
            with self._lock:
                for (slot, before), after in zip(live, persisted, strict=True):
                    if slot is not None and slot.array is before:  # not rewritten meanwhile
                        slot.array = after
                        slot.lazy = False
                self._inflight = [f for f in self._inflight if not f.done()]
                self._inflight.extend(futures_of(persisted))
                if self.extra is not None:
                    self._inflight.extend(futures_of(self.extra))
            self.flushes += 1
        with self._lock:
            return list(self._inflight)

    def flush_pending(self) -> None:
        """:meth:`flush`, for a stream (which takes functions returning nothing)."""
        self.flush()

    def _fused(self, arrays: list[da.Array]) -> list[da.Array] | None:
        """The arrays computed by one task running their whole graph, when they are small
        single blocks computed from single-block inputs (a chain of small ops then costs one
        trip through the scheduler, not one per op); None otherwise (the graph is persisted as
        it is, its block tasks spread over the workers)."""
        import cloudpickle
        import dask.array as da
        from dask.highlevelgraph import HighLevelGraph
        from distributed import Future

        if any(a.npartitions != 1 or a.nbytes > FUSE_BYTES for a in arrays):
            return None
        graph = dict(HighLevelGraph.merge(*[a.__dask_graph__() for a in arrays]))
        if len(graph) > FUSE_TASKS:
            return None
        inputs: dict[Any, Any] = {}
        tasks: dict[Any, Any] = {}
        for key, value in graph.items():
            if isinstance(value, Future):
                if isinstance(key, tuple) and any(i != 0 for i in key[1:]):
                    return None  # an input of several blocks: a large tensor
                inputs[key] = value
            else:
                tasks[key] = value
        if len(tasks) <= 1:
            return None  # nothing to fuse
        out_keys = [a.__dask_keys__() for a in arrays]
        flat = [_single_key(k) for k in out_keys]
        blob = cloudpickle.dumps((tasks, flat, list(inputs)))
        if len(arrays) == 1:  # one result (a read of a single pending op): the task's own
            a = arrays[0]
            name = unique("part")
            key = (name,) + (0,) * a.ndim
            one = self.client.submit(
                blocks.run_graph_one, blob, *inputs.values(), key=key, pure=False
            )
            return [da.Array({key: one}, name, chunks=a.chunks, meta=a._meta)]
        fused = self.client.submit(
            blocks.run_graph, blob, *inputs.values(), key=unique("fused"), pure=False
        )
        results = []
        for i, a in enumerate(arrays):
            name = unique("part")
            key = (name,) + (0,) * a.ndim
            part = self.client.submit(blocks.pick, fused, i, key=key, pure=False)
            results.append(da.Array({key: part}, name, chunks=a.chunks, meta=a._meta))
        with self._lock:
            self._inflight.append(fused)  # held until its parts have taken their results
        return results

    def cancel(self, futures: Iterable[Any]) -> None:
        """Cancel the unfinished ``futures`` (an awaited read was cancelled), saying so."""
        self.client.cancel([f for f in futures if not f.done()], reason=CANCELLED_HERE)

    def read_started(self, futures: Sequence[Any]) -> None:
        """A read waits on ``futures`` (counted per key: reads of one tensor share them)."""
        with self._lock:
            self._readers.update(f.key for f in futures)

    def read_ended(self, futures: Sequence[Any], cancelled: bool) -> None:
        """A read stopped waiting on ``futures``; if it was ``cancelled``, cancel those that no
        other read waits on (one task's timeout cancelled another task's read of the same
        tensor, which raised "cancelled" though nothing cancelled it)."""
        idle = []
        with self._lock:
            for f in futures:
                n = self._readers[f.key] - 1
                if n > 0:
                    self._readers[f.key] = n
                else:
                    del self._readers[f.key]
                    idle.append(f)
        if cancelled and idle:
            self.cancel(idle)

    def settle(self, futures: Iterable[Any]) -> None:
        """Forget finished futures (their errors were reported)."""
        done = {f.key for f in futures}
        with self._lock:
            self._inflight = [f for f in self._inflight if f.key not in done]

    def reported(self, error: BaseException, cause: BaseException | None = None) -> None:
        """A read raised ``error``: forget the failed futures with the same cause, so that it is
        reported once (the tasks downstream of a failed one fail with its exception, until the
        next synchronize)."""
        text = str(error)
        if cause is not None:
            self.reported_causes.add(str(cause))
        with self._lock:
            self._inflight = [
                f
                for f in self._inflight
                if not (f.status == "error" and text.endswith(str(f.exception())))
            ]

    def upload(self, buf: DeviceBuffer, array: Array, chunks: tuple[tuple[int, ...], ...]) -> None:
        """``array`` as the block's content: pending in the graph (sent with the next flush) or
        already scattered (see :meth:`scatter`)."""
        from distributed import futures_of

        result = self.scatter(array, chunks)
        if futures_of(result):
            self.store(buf, result)
        else:
            self.write(buf, result)

    def scatter(self, array: Array, chunks: tuple[tuple[int, ...], ...]) -> da.Array:
        """``array`` on the cluster, chunked as ``chunks`` (blocking: a stream's worker thread).

        Up to :data:`GRAPH_BYTES` it goes in the graph: the scheduler keeps the task that makes
        it, so a worker that dies holding it is survived (Dask recomputes it). Larger, it is
        scattered to the workers and replicated on two, since scattered data has no task to
        recompute it from."""
        import dask.array as da

        if array.nbytes <= GRAPH_BYTES:
            return da.from_array(array, chunks=chunks, name=unique("host"), asarray=False)
        from dask.array.core import slices_from_chunks

        slices = slices_from_chunks(chunks)
        parts = [np.ascontiguousarray(array[s]) for s in slices]
        futures = self.client.scatter(parts, hash=False)
        if len(self.client.scheduler_info().get("workers", {})) > 1:
            self.client.replicate(futures, n=2)
        name = unique("scatter")
        keys = list(itertools.product(*(range(len(c)) for c in chunks)))
        graph = {(name, *k): f for k, f in zip(keys, futures, strict=True)}
        return da.Array(graph, name, chunks=chunks, meta=np.empty((0,) * array.ndim, array.dtype))


def reshape(a: da.Array, shape: tuple[int, ...]) -> da.Array:
    """``a`` viewed as ``shape``: dask's reshape where its chunks allow, else with the trailing
    axes whole (dask reshapes by merging or splitting whole rows), else as one block."""
    try:
        return a.reshape(shape)
    except (NotImplementedError, ValueError):
        pass
    try:
        return a.rechunk({i: -1 for i in range(1, a.ndim)}).reshape(shape)
    except (NotImplementedError, ValueError):
        return a.rechunk(-1).reshape(shape)


class DaskComponent(KernelBase[HostStream]):
    """Allocation and submission shared by the Dask backend's components: a tensor's storage is
    its pool block's :class:`Slot` (a view shares it: :func:`arr` reshapes), and a launch builds
    its graph on a host stream."""

    backend: DaskBackend

    @property
    def graphs(self) -> Graphs:
        return self.backend.graphs

    def before_allocation(self) -> None:
        self.backend.graphs.check()  # ContextPoisonedError once the scheduler is gone

    # -- tensors as dask arrays -------------------------------------------------------------------
    def chunks(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> tuple[tuple[int, ...], ...]:
        """The backend's chunking of a new array (about ``chunk_bytes`` per block)."""
        return self.backend.chunks_for(shape, dtype)

    def arr(self, x: Tensor) -> da.Array:
        """The dask array of ``x`` (its block's array, reshaped through a view)."""
        import dask.array as da

        slot: Slot = storage(x)
        dt = x.dtype.to_numpy()
        a = slot.array
        if a is None:  # never written: zeros, like fresh memory on most devices
            return da.map_blocks(
                blocks.zeros,
                dt,
                dtype=dt,
                chunks=self.chunks(x.shape, dt),
                meta=np.empty((0,) * x.ndim, dt),
                name=unique("zeros"),
            )
        if a.dtype != dt or a.size != prod(x.shape):
            # A raw buffer's bytes (a copy into a DeviceBuffer) read as a typed tensor.
            n = prod(x.shape)
            flat = da.map_blocks(
                blocks.reinterpret,
                a.reshape(-1).rechunk(-1),
                (n,),
                dt,
                dtype=dt,
                chunks=((n,),),
                meta=np.empty((0,), dt),
                name=unique("reinterpret"),
            )
            return flat.reshape(x.shape)
        if a.shape != x.shape:
            a = reshape(a, x.shape)
        return a

    def operand(self, x: Any) -> Any:
        return self.arr(x) if isinstance(x, Tensor) else x

    # -- submission -------------------------------------------------------------------------------
    def submit(
        self,
        stream: Any,
        fn: Callable[..., Any],
        deps: list[tuple[Any, int]],
        hold: tuple[Any, ...],
        **options: Any,
    ) -> int:
        """Graph building runs inline when the stream is idle (it only builds a graph); the
        stream holds ``hold`` until ``fn`` has run."""
        s: HostStream = stream
        return s.submit(fn, False, deps, hold)

    def launch(
        self,
        fn: Callable[..., Any],
        inputs: Iterable[Any],
        outputs: Iterable[Tensor],
        literal: bool = False,
        **options: Any,
    ) -> int:
        """Build ``fn``'s graph on the current stream, after the inputs' writers on other
        streams; its outputs are then written by it. ``fn`` returns the arrays of ``outputs``,
        in order, which are stored lazily in their slots. A ``literal`` (small host data in the
        graph) is never persisted on its own: it travels inside the graphs that use it, so that
        reading a result does not wait for it to be fetched from another worker."""
        graphs = self.graphs
        graphs.check()
        outs = tuple(outputs)

        def run() -> None:
            results = fn()
            if not isinstance(results, (list, tuple)):
                results = (results,)
            for o, r in zip(outs, results, strict=True):
                if r is None:
                    continue
                if literal:
                    graphs.store(buffer_of(o), r)
                elif graphs.write(buffer_of(o), r):
                    graphs.due = True

        seq = super().launch(run, inputs, outs)
        if graphs.due:
            graphs.due = False
            self.backend.current_stream.submit(graphs.flush_pending, True)
        return seq

    def run_heavy(self, fn: Callable[[], None], outputs: Iterable[Tensor] = ()) -> int:
        """Run blocking work (a scatter, a flush) on the current stream's worker thread."""
        self.graphs.check()
        stream = self.backend.current_stream
        outs = list(outputs)
        seq = stream.submit(fn, True)
        if outs:
            mark_written(outs, stream, seq)
        return seq
