"""The backend's lifecycle on a local cluster it owns and on an external one; awaiting results
without blocking the loop; cancelling a read cancels its futures; worker errors as accelkit
errors. Every test runs under asyncio and trio."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from accelkit_dask.backend import DaskBackend
from accelkit_dask.cluster import LocalSize
from accelkit_dask.priority import lower_priority

from accelkit.errors import (
    ContextPoisonedError,
    DeviceError,
    InvalidArgumentError,
    NotInitializedError,
)

pytestmark = pytest.mark.anyio


async def test_a_local_cluster_is_started_owned_and_closed(
    monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    from distributed import Client

    monkeypatch.setenv("ACCELKIT_DASK_WORKER_NICE", "10")

    own_nice = os.getpriority(os.PRIO_PROCESS, 0) if sys.platform == "linux" else 0
    backend = DaskBackend(local_size=LocalSize(2, 1, 1 << 30))
    await backend.initialize("dask:0")
    try:
        assert backend.owns_cluster
        workers = await backend.workers()
        assert len(workers) == 2
        assert all(w.threads == 1 for w in workers)
        pids = await anyio.to_thread.run_sync(lambda: backend.client.run(os.getpid))
        assert len(set(pids.values())) == 2  # two processes,
        assert os.getpid() not in pids.values()  # neither of them this one
        # and the scheduler runs in a process of its own, not on this one's interpreter
        scheduler = await anyio.to_thread.run_sync(
            lambda: backend.client.run_on_scheduler(os.getpid)
        )
        assert scheduler != os.getpid()
        assert scheduler not in pids.values()
        if sys.platform == "linux":
            # The workers yield the cores to this process: every thread of theirs runs at a
            # lower priority, a worker the nanny restarts too; this process is left as it was.
            nices = await anyio.to_thread.run_sync(lambda: backend.client.run(lower_priority, 0))
            assert all(n >= 10 for each in nices.values() for n in each)
            assert all(len(each) > 1 for each in nices.values())
            assert os.getpriority(os.PRIO_PROCESS, 0) == own_nice
            first = next(iter(pids))
            await anyio.to_thread.run_sync(lambda: backend.client.restart_workers([first]))
            nices = await anyio.to_thread.run_sync(lambda: backend.client.run(lower_priority, 0))
            assert len(nices) == 2
            assert all(n >= 10 for each in nices.values() for n in each)
        memory = await backend.cluster_memory()
        assert memory["total"] == 2 << 30
        assert memory["workers"] == 2
        assert backend.memory_manager.memory_info().total == 2 << 30
        x = backend.tensor_factory.from_host(np.arange(10.0, dtype=np.float32))
        np.testing.assert_array_equal(
            await backend.tensor_ops.mul(x, x).to_host(), np.arange(10.0) ** 2
        )
        address = backend.cluster_address
    finally:
        await backend.shutdown()
    # Shut down: the cluster the backend started is gone.
    with pytest.raises(OSError, match="connect"):
        await anyio.to_thread.run_sync(lambda: Client(address, timeout=2, set_as_default=False))
    with pytest.raises(NotInitializedError):
        backend.tensor_factory  # noqa: B018


async def test_an_external_cluster_keeps_running_after_shutdown(
    shared_cluster: Any, anyio_backend: str
) -> None:
    device = "dask://" + shared_cluster.address.removeprefix("tcp://")
    for _ in range(2):  # the second backend reuses the pooled connection
        backend = DaskBackend()
        await backend.initialize(device)
        assert not backend.owns_cluster
        x = backend.tensor_factory.from_host(np.ones((4, 4), np.float32))
        assert float(await backend.tensor_ops.sum(x).to_host()) == 16.0
        await backend.shutdown()
    assert shared_cluster.proc.poll() is None
    backend = DaskBackend()
    await backend.initialize(device)
    assert len(await backend.workers()) == 2
    await backend.shutdown()


async def test_shutdown_releases_the_data_of_tensors_still_held(
    shared_cluster: Any, anyio_backend: str
) -> None:
    """On an external cluster, the chunks of tensors the program still holds after shutdown
    (stale: they read nothing more) stayed in the cluster's memory until it dropped them."""
    import gc

    from accelkit_dask.cluster import Cluster

    address = shared_cluster.address.removeprefix("tcp://")
    client = Cluster.connect(address).client

    async def keys() -> int:
        return len(await anyio.to_thread.run_sync(client.who_has))

    gc.collect()
    before = await keys()
    backend = DaskBackend(chunk_bytes=1 << 16)
    await backend.initialize("dask://" + address)
    x = backend.tensor_factory.from_host(np.ones((512, 512), np.float32))
    y = backend.tensor_ops.add(x, 1.0)
    assert float((await y.to_host())[0, 0]) == 2.0
    assert await keys() > before
    await backend.shutdown()
    gc.collect()
    with anyio.fail_after(10):
        while await keys() > before:  # noqa: ASYNC110 - the scheduler forgets released keys shortly after
            await anyio.sleep(0.1)
    assert x.shape == y.shape  # both still held


async def test_worker_errors_arrive_as_accelkit_errors(backend: Any) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    y = ops.embedding(f.from_host(np.array([0, 12], np.int64)), f.ones((5, 3)))
    with pytest.raises(InvalidArgumentError, match="12") as info:
        await y.to_host()
    assert info.value.__cause__ is None
    assert "Traceback" not in str(info.value)
    z = ops.add(y, 1.0)  # downstream of the failed task: the same error, at synchronize
    del z
    await backend.synchronize()  # reported once: nothing left to raise


async def test_cancelling_a_read_cancels_its_futures(
    anyio_backend: str, shared_cluster: Any
) -> None:
    from distributed import futures_of

    backend = DaskBackend(chunk_bytes=1 << 20)
    await backend.initialize("dask://" + shared_cluster.address.removeprefix("tcp://"))
    try:
        f, ops = backend.tensor_factory, backend.tensor_ops
        a = f.from_host(np.random.default_rng(0).standard_normal((2048, 2048), dtype=np.float32))
        y = a
        # seconds of GEMMs on two single-threaded workers, on any machine: with 6 of 1536 a
        # fast one finished some of the last chunks before the cancel (a finished future
        # stays finished), and the test failed there, 1 run in 3
        for _ in range(8):
            y = ops.matmul(y, a)
        with anyio.move_on_after(0.3) as scope:
            await y.to_host()
        assert scope.cancelled_caught
        slot = backend.tensor_ops.kernels.arr(y)
        futures = futures_of(slot)
        assert futures

        def all_cancelled() -> bool:
            return all(fut.status in ("cancelled", "lost") for fut in futures)

        for _ in range(600):
            if all_cancelled():
                break
            await anyio.sleep(0.05)
        assert all_cancelled()
        with pytest.raises(DeviceError, match="its read was cancelled") as info:
            await y.to_host()
        assert not isinstance(info.value, ContextPoisonedError)  # a cancel is not a lost scheduler
        assert not backend.poisoned
    finally:
        with anyio.CancelScope(shield=True):
            await backend.shutdown()


async def test_a_cancelled_read_leaves_another_task_s_read_of_it_alone(
    anyio_backend: str, shared_cluster: Any
) -> None:
    """Two tasks read one tensor; the one with a timeout gives up: the other gets the result
    (the timeout cancelled their shared futures, and the task nothing cancelled raised "its
    read was cancelled"). The last reader to give up still cancels them."""
    backend = DaskBackend(chunk_bytes=1 << 20)
    await backend.initialize("dask://" + shared_cluster.address.removeprefix("tcp://"))
    try:
        f, ops = backend.tensor_factory, backend.tensor_ops
        a_h = np.random.default_rng(2).standard_normal((768, 768)).astype(np.float32) / 16
        a = f.from_host(a_h)
        y = ops.matmul(ops.matmul(a, a), a)
        got: dict[str, Any] = {}

        async def patient() -> None:
            got["y"] = await y.to_host()

        async def impatient() -> None:
            with anyio.move_on_after(0.02) as scope:
                await y.to_host()
            got["gave up"] = scope.cancelled_caught

        async with anyio.create_task_group() as tg:
            tg.start_soon(patient)
            tg.start_soon(impatient)
        want = a_h.astype(np.float64) @ a_h @ a_h
        # f32 GEMMs of 768-term sums of terms below about 0.1: a few ulp of the result
        np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-5)
    finally:
        with anyio.CancelScope(shield=True):
            await backend.shutdown()


async def test_a_read_awaited_during_shutdown_gets_its_result(anyio_backend: str) -> None:
    """Shutdown waits for the reads in flight, as the other backends do (it closed its local
    cluster under them: "the Dask scheduler ... is gone")."""
    backend = DaskBackend(chunk_bytes=1 << 20)
    await backend.initialize()  # a local cluster of its own
    x = backend.tensor_factory.full((1024, 1024), 0.5)
    y = backend.tensor_ops.matmul(x, x)
    got: dict[str, Any] = {}

    async def reader() -> None:
        got["y"] = await y.to_host()

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        await anyio.lowlevel.checkpoint()  # the read has begun
        await backend.shutdown()
    np.testing.assert_array_equal(got["y"], 256.0)  # 1024 products of 0.25: exact in f32


async def test_awaiting_a_result_leaves_the_loop_running(backend: Any) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    a = f.from_host(np.random.default_rng(1).standard_normal((512, 512), dtype=np.float32))
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        await ops.matmul(a, a).to_host()
        tg.cancel_scope.cancel()
    assert ticks > 10  # the loop ran other tasks while the cluster computed


@pytest.mark.skipif(sys.platform == "win32", reason="a POSIX shell script stands in for Python")
async def test_a_local_cluster_that_cannot_start_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'no module named accelkit_dask.serve' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    backend = DaskBackend(local_size=LocalSize(1, 1, 1 << 30))
    with pytest.raises(
        DeviceError, match=r"(?s)cannot start a local Dask cluster .*no module named"
    ):
        await backend.initialize("dask:0")


class _Future:
    def __init__(self, status: str) -> None:
        self.status = status


class _Graphs:
    """A client that notices the lost scheduler after ``after`` checks (or never)."""

    def __init__(self, after: int | None) -> None:
        self.after = after
        self.checks = 0

    def check(self) -> None:
        self.checks += 1
        if self.after is not None and self.checks > self.after:
            raise ContextPoisonedError("the Dask scheduler at tcp://x:1 is gone; call recover")


async def test_futures_cancelled_by_a_lost_scheduler_poison_the_backend(
    monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    """The client cancels a read's futures (without a reason) a moment before its status says
    the scheduler is gone: the read waits for that and reports the lost scheduler."""
    from accelkit_dask import submit

    monkeypatch.setattr(submit, "LOST_GRACE_S", 0.5)
    cancelled = DeviceError("reading x was cancelled (cancelled for reason: unknown.)")
    graphs: Any = _Graphs(after=2)
    got = await submit.lost_or(cancelled, [_Future("cancelled")], graphs)
    assert isinstance(got, ContextPoisonedError)
    assert "scheduler" in str(got)
    # a client that stays connected: the cancellation as it was, after the grace period
    graphs = _Graphs(after=None)
    assert await submit.lost_or(cancelled, [_Future("cancelled")], graphs) is cancelled
    assert graphs.checks > 1
    # cancelled by a cancelled read, or not cancelled at all: no waiting, no check
    for error, status in (
        (DeviceError(f"reading x was cancelled ({submit.CANCELLED_HERE})"), "cancelled"),
        (DeviceError("reading x failed on the cluster: ValueError: bad"), "error"),
    ):
        graphs = _Graphs(after=0)
        assert await submit.lost_or(error, [_Future(status)], graphs) is error
        assert graphs.checks == 0


async def test_shutdown_waits_for_reads_in_flight_a_bounded_time(
    anyio_backend: str, shared_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that never ends (a hung worker) must not hold the shielded shutdown forever."""
    import time

    from accelkit_dask import backend as dask_backend

    monkeypatch.setattr(dask_backend, "READS_GRACE_S", 0.5)
    backend = DaskBackend(chunk_bytes=1 << 20)
    await backend.initialize("dask://" + shared_cluster.address.removeprefix("tcp://"))
    backend.graphs.reads_in_flight += 1  # a read that will never end
    start = time.monotonic()
    await backend.shutdown()
    assert time.monotonic() - start < 15  # the grace (0.5 s) and closing the client
