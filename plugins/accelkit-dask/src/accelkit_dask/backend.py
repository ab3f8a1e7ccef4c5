"""The backend facade: a Dask distributed cluster as an accelkit device.

``dask:0`` is a local cluster the backend starts on initialize (one single-threaded worker
process per core) and closes on shutdown; ``dask://host:port`` is an existing scheduler the
backend connects to and leaves running. With no device, ``ACCELKIT_DASK_SCHEDULER`` names the
scheduler when set.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np

from accelkit.capabilities import BackendCapabilities
from accelkit.device import Device
from accelkit.errors import DeviceError, InvalidArgumentError
from accelkit.memory import MemoryPoolConfig
from accelkit.sdk import HostStream, Opened, StreamBackend, env_str
from accelkit_dask import __version__
from accelkit_dask.cluster import Cluster, LocalSize, WorkerInfo, device_address
from accelkit_dask.probe import capabilities, capabilities_of, local_info, remote_info
from accelkit_dask.submit import Graphs, first_error, lost_or, wait_futures

if TYPE_CHECKING:
    from accelkit_dask.memory import DaskMemoryKernels

#: (scheduler, worker) pairs whose worker has run warm_up for this process.
_WARM: set[tuple[str, str]] = set()


def warm_up() -> None:
    """Run on every worker at initialize: import what the tasks run (dask.array looks for
    CuPy and sparse chunk types on import: seconds, cold)."""
    import dask.array
    import dask.order  # noqa: F401

    import accelkit_dask.blocks  # noqa: F401


#: Bytes per chunk of a new tensor (``ACCELKIT_DASK_CHUNK_BYTES`` or ``chunk_bytes=``).
DEFAULT_CHUNK_BYTES = 64 << 20


@dataclass(frozen=True)
class Plan:
    """How one op ran on the cluster, where it had to leave the blockwise plan: ``gathered``
    says it needed a whole tensor in one task, ``reason`` why."""

    op: str
    gathered: bool
    reason: str


#: How long ``shutdown`` waits for the reads in flight before it closes the cluster.
READS_GRACE_S = 30.0


class DaskBackend(StreamBackend[HostStream]):
    """A Dask cluster: tensors are dask arrays chunked over its workers."""

    name = "dask"
    version = __version__
    device_kinds = frozenset({"dask"})

    def __init__(
        self,
        pool_config: MemoryPoolConfig | None = None,
        *,
        chunk_bytes: int | None = None,
        split_every: int | None = None,
        local_size: LocalSize | None = None,
        worker_backend: str | None = None,
    ) -> None:
        super().__init__(pool_config)
        env_chunk = env_str("ACCELKIT_DASK_CHUNK_BYTES")
        if chunk_bytes is None and env_chunk is not None:
            try:
                chunk_bytes = int(env_chunk)
            except ValueError:
                raise InvalidArgumentError(
                    f"ACCELKIT_DASK_CHUNK_BYTES must be a byte count; got {env_chunk!r}"
                ) from None
        if chunk_bytes is not None and chunk_bytes < 1:
            raise InvalidArgumentError(f"chunk_bytes must be positive; got {chunk_bytes}")
        if split_every is not None and split_every < 2:
            raise InvalidArgumentError(f"split_every must be at least 2; got {split_every}")
        #: Bytes per chunk of a new tensor (ops keep their inputs' chunking where they can).
        self.chunk_bytes = chunk_bytes or DEFAULT_CHUNK_BYTES
        #: How many partials a reduction combines per task (dask's default when None).
        self.split_every = split_every
        self._local_size = local_size
        self._memory_kernels: DaskMemoryKernels | None = None
        #: The accelkit backend the workers run GEMM, attention and conv blocks on (None: the
        #: workers' ACCELKIT_DASK_WORKER_BACKEND, else their CPU). See accelkit_dask.worker.
        self.worker_backend = worker_backend
        self._cluster: Cluster | None = None
        self._graphs: Graphs | None = None
        self._recoveries: list[float] = []
        #: Ops that left the blockwise plan (gathered a whole tensor into one task), newest last.
        self.plans: deque[Plan] = deque(maxlen=256)

    # -- devices ----------------------------------------------------------------------------------
    def _device_count(self) -> int:
        return 1

    def _device_capabilities(self, index: int) -> BackendCapabilities:
        return capabilities_of(local_info())

    def supports_device(self, device: Device | str) -> bool:
        try:
            d = Device.parse(device)
        except InvalidArgumentError:
            return False
        return d.kind == "dask" and (d.address is not None or d.index == 0)

    def _default_device(self) -> Device:
        address = env_str("ACCELKIT_DASK_SCHEDULER")
        if address is not None:
            return Device("dask", address=device_address(address))
        return Device("dask", 0)

    @property
    def capabilities(self) -> BackendCapabilities:
        if self.device is not None:  # opened (and maybe shut down since): the opened cluster's
            return super().capabilities
        device = self._default_device()
        if device.address is not None:
            return capabilities_of(remote_info(device.address))
        return capabilities_of(local_info())

    # -- the cluster ------------------------------------------------------------------------------
    @property
    def graphs(self) -> Graphs:
        graphs = self._graphs
        if graphs is None:
            self.check_ready()
            raise DeviceError("the Dask backend has no cluster")
        return graphs

    @property
    def client(self) -> Any:
        """The ``distributed.Client`` (synchronous, on its own loop thread): do not call its
        blocking methods from the event loop."""
        return self.graphs.client

    @property
    def cluster_address(self) -> str:
        return self.graphs.cluster.address

    @property
    def owns_cluster(self) -> bool:
        """Whether the backend started the cluster (and so closes it on shutdown)."""
        return self.graphs.cluster.owned

    async def workers(self) -> list[WorkerInfo]:
        """The cluster's workers: threads, memory limit, memory in use (from the scheduler)."""
        return await anyio.to_thread.run_sync(self.graphs.cluster.workers)

    async def cluster_memory(self) -> dict[str, int]:
        """The cluster's memory as its scheduler reports it: ``total`` (the workers' limits),
        ``used`` (data held by the workers, this backend's and others') and ``workers``."""
        workers = await self.workers()
        return {
            "total": sum(w.memory_limit for w in workers),
            "used": sum(w.memory_used for w in workers),
            "workers": len(workers),
        }

    def chunks_for(
        self, shape: tuple[int, ...], dtype: np.dtype[Any]
    ) -> tuple[tuple[int, ...], ...]:
        """The chunking of a new tensor: dask's "auto", at most ``chunk_bytes`` per block."""
        from dask.array.core import normalize_chunks

        if not shape:
            return ()
        if 0 in shape:
            return tuple((n,) for n in shape)
        chunks: tuple[tuple[int, ...], ...] = normalize_chunks(
            "auto", shape, limit=self.chunk_bytes, dtype=dtype
        )  # dask is untyped
        return chunks

    def record_plan(self, op: str, *, gathered: bool, reason: str) -> None:
        self.plans.append(Plan(op, gathered, reason))

    @property
    def last_plan(self) -> Plan | None:
        return self.plans[-1] if self.plans else None

    # -- lifecycle --------------------------------------------------------------------------------
    async def _initialize(self, device: Device) -> Opened[HostStream]:
        if self._cluster is not None:
            # reopen() (recover() after a lost scheduler): the old cluster goes first; the
            # recoveries keep counting.
            await self._close_cluster()
        else:
            self._recoveries = []
            self.plans.clear()
        return await self._open(device)

    async def _open(self, device: Device) -> Opened[HostStream]:
        from accelkit_dask.factory_kernels import DaskFactoryKernels
        from accelkit_dask.fused_kernels import DaskFusedKernels
        from accelkit_dask.memory import DaskMemoryKernels
        from accelkit_dask.tensor_kernels import DaskTensorKernels

        if device.address is not None:
            cluster = await anyio.to_thread.run_sync(Cluster.connect, device.address)
        else:
            size = self._local_size
            cluster = await anyio.to_thread.run_sync(lambda: Cluster.start_local(size))
        try:
            target = self.worker_backend
            if target is not None:
                from accelkit_dask.worker import plugin

                await anyio.to_thread.run_sync(
                    lambda: cluster.client.register_plugin(plugin(target))
                )
            workers = await anyio.to_thread.run_sync(cluster.workers)
            # Each worker imports what the tasks run now, in parallel (seconds each, cold),
            # rather than inside the first task that needs it (once per worker and process).
            cold = [w.address for w in workers if (cluster.address, w.address) not in _WARM]
            if cold:
                await anyio.to_thread.run_sync(lambda: cluster.client.run(warm_up, workers=cold))
                _WARM.update((cluster.address, a) for a in cold)
        except BaseException:  # cancelled too: the close must run (it left the cluster up)
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(cluster.close)
            raise
        threads = sum(w.threads for w in workers)
        memory = sum(w.memory_limit for w in workers) or local_info().memory_bytes
        extra = {
            "cluster": "local (owned by this backend)" if cluster.owned else "external",
            "scheduler": cluster.address,
            "workers": len(workers),
        }
        caps = capabilities(device, threads, memory, extra)
        self._cluster = cluster
        self._graphs = Graphs(cluster, self.chunk_bytes, lambda: self.pool.reclaim())
        factory = DaskFactoryKernels(self)
        self._memory_kernels = DaskMemoryKernels(self, device, memory, self.pool_config, factory)
        return Opened(
            streams=[HostStream(device, f"{device}/default")],
            memory=self._memory_kernels,
            tensor=DaskTensorKernels(self),
            factory=factory,
            fused=DaskFusedKernels(self),
            dtypes=caps.dtypes,
            capabilities=caps,
        )

    async def _synchronize(self) -> None:
        """Every op submitted so far has run on the cluster (its errors raised here)."""
        await super()._synchronize()
        graphs = self.graphs
        stream = self.default_stream
        box: list[Any] = []
        await stream.wait_for(stream.submit(lambda: box.extend(graphs.flush()), True))
        await wait_futures(box, lambda: graphs.cancel(box))
        error = first_error(box, "an operation", graphs.reported_causes)
        if error is not None:
            error = await lost_or(error, box, graphs)
        graphs.settle(box)
        graphs.reported_causes.clear()
        if error is not None:
            try:
                raise error
            finally:
                del error  # no cycle error -> traceback -> this frame -> error

    async def _close_cluster(self) -> None:
        """Close the cluster (a local one) or disconnect from it (an external one)."""
        with anyio.CancelScope(shield=True):
            cluster = self._cluster
            self._cluster = None
            if cluster is not None:
                if self.worker_backend is not None and cluster.connected:
                    from accelkit_dask.worker import plugin

                    name = plugin(self.worker_backend).name
                    with contextlib.suppress(Exception):  # leave an external cluster as found
                        await anyio.to_thread.run_sync(
                            lambda: cluster.client.unregister_worker_plugin(name)
                        )
                await anyio.to_thread.run_sync(cluster.close)

    async def _shutdown(self) -> None:
        try:
            try:
                await self._reads_done()
                await super()._shutdown()  # the streams' work, then the pool (its chunks)
            finally:
                await self._reads_done()  # (one that began as the streams drained)
                # The blocks of tensors the program still holds (stale now) let go of their
                # chunks too: on an external cluster they held its memory until dropped.
                if self._memory_kernels is not None:
                    self._memory_kernels.release_all()
                    self._memory_kernels = None
                if self._graphs is not None:
                    self._graphs.drop()
                await self._close_cluster()
        finally:
            self._graphs = None

    async def _reads_done(self) -> None:
        """Until the reads awaited now have their results, for at most ``READS_GRACE_S``
        (shutdown is shielded: a hung worker must not hold it forever; the reads then fail,
        "the scheduler is gone"). Their futures are not stream work, and closing the cluster
        under them failed them, where the other backends' reads in flight at shutdown return
        their results."""
        graphs = self._graphs
        with anyio.move_on_after(READS_GRACE_S):
            while graphs is not None and graphs.reads_in_flight and graphs.lost is None:  # noqa: ASYNC110
                await anyio.sleep(0.005)

    # -- streams ----------------------------------------------------------------------------------
    def _open_stream(self) -> HostStream:
        """A stream: ops on it build their graphs in its order (the cluster runs them as their
        data allows)."""
        device = self.default_stream.device
        return HostStream(device, f"{device}/stream{len(self.streams)}")

    # -- a lost scheduler -------------------------------------------------------------------------
    @property
    def poisoned(self) -> bool:
        """Whether the scheduler was lost (every call raises ContextPoisonedError until
        :meth:`recover`)."""
        graphs = self._graphs
        if graphs is None:
            return False
        try:
            graphs.check()
        except DeviceError:
            return True
        return False

    async def recover(self) -> None:
        """Reconnect after the scheduler was lost: to the same address, or a new local cluster.

        Every tensor and buffer from before becomes stale (StaleHandleError: their chunks went
        with the scheduler). More than three recoveries within ten minutes mark the backend
        failed (DeviceError).
        """
        self.check_ready()
        if not self.poisoned:
            return
        now = time.monotonic()
        self._recoveries = [t for t in self._recoveries if now - t < 600.0] + [now]
        if len(self._recoveries) > 3:
            reason = (
                f"the Dask scheduler of {self.device} was lost {len(self._recoveries)} times in"
                " ten minutes; the backend is marked failed: shut it down"
            )
            self.mark_failed(reason)
            raise DeviceError(reason)
        # The streams are closed, the pool goes stale (its generations continue) and
        # _initialize closes the old cluster and opens a new one.
        await self.reopen()
