"""The memory manager is the core's facade over a backend's ``sdk.MemoryKernels``: every argument
is checked there, once, so memory kernels that check nothing never see a bad one; reads wait for
the writers where the kernels say the host reads completed memory (``wait_for_writers``), and
not where they queue the read themselves. Under asyncio and trio."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import numpy as np
import pytest

import accelkit
from accelkit import (
    DType,
    InvalidArgumentError,
    NotInitializedError,
    StaleHandleError,
    Tensor,
    UnsupportedOperationError,
)
from accelkit.backends.cpu.backend import CPUBackend
from accelkit.backends.cpu.factory_kernels import CPUFactoryKernels
from accelkit.backends.cpu.memory import CPUMemoryKernels
from accelkit.backends.cpu.tensor_kernels import CPUTensorKernels
from accelkit.device import Device
from accelkit.ops import MemoryManager
from accelkit.sdk import DeviceBuffer, HostStream, MemoryKernels, Opened, mark_written

pytestmark = pytest.mark.anyio


class Trusting(CPUMemoryKernels):
    """The CPU backend's memory kernels (which check nothing), asserting on every call that the
    arguments are what the core promises, and recording the calls."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.calls: list[str] = []
        #: Run inside ``stage``, between the core's checks and ``write`` (the test frees there).
        self.during_stage: Callable[[], None] | None = None
        #: Whether the writers of each tensor read were complete when the read came here.
        self.complete: list[bool] = []

    def _buffer(self, buf: Any) -> None:
        assert isinstance(buf, DeviceBuffer), buf
        assert buf._pool is self.pool, f"{buf!r} is another pool's"
        assert buf.is_alive, f"{buf!r} was freed"

    def _tensor(self, t: Any, buf: DeviceBuffer | None = None) -> None:
        assert t is None or isinstance(t, Tensor), t
        if t is not None:
            assert t._backend is self.backend, f"{t!r} is another backend's"
            assert t.is_alive, f"{t!r} was freed"
            assert buf is None or t._buffer is buf

    def _note_writers(self, t: Tensor) -> None:
        own = t._stream.completed >= t._seq
        shared = t._buffer.last_write
        self.complete.append(own and (shared is None or shared[0].completed >= shared[1]))

    def free(self, buffer: DeviceBuffer) -> None:
        self._buffer(buffer)
        self.calls.append("free")
        super().free(buffer)

    async def stage(self, data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        assert isinstance(data, np.ndarray)
        assert data.dtype == np.uint8
        assert data.ndim == 1
        assert data.nbytes > 0
        self.calls.append("stage")
        if self.during_stage is not None:
            self.during_stage()
        await anyio.lowlevel.checkpoint()
        return await super().stage(data)

    async def write(
        self, buffer: DeviceBuffer, data: np.ndarray[Any, Any], dst: Tensor | None
    ) -> None:
        self._buffer(buffer)
        self._tensor(dst, buffer)
        assert 0 < data.nbytes <= buffer.nbytes
        self.calls.append("write")
        await super().write(buffer, data, dst)

    async def read(
        self, out: np.ndarray[Any, Any], buffer: DeviceBuffer, src: Tensor | None
    ) -> None:
        self._buffer(buffer)
        self._tensor(src, buffer)
        assert out.dtype == np.uint8
        assert out.ndim == 1
        assert out.flags.c_contiguous
        assert out.flags.writeable
        assert 0 < out.nbytes <= buffer.nbytes
        if src is not None:
            self._note_writers(src)
        self.calls.append("read")
        await super().read(out, buffer, src)

    def copy(
        self,
        dst: DeviceBuffer,
        src: DeviceBuffer,
        nbytes: int,
        dst_tensor: Tensor | None,
        src_tensor: Tensor | None,
    ) -> None:
        self._buffer(dst)
        self._buffer(src)
        self._tensor(dst_tensor, dst)
        self._tensor(src_tensor, src)
        assert 0 < nbytes <= min(dst.nbytes, src.nbytes)
        self.calls.append("copy")
        super().copy(dst, src, nbytes, dst_tensor, src_tensor)

    async def read_tensor(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        self._tensor(tensor)
        self._note_writers(tensor)
        self.calls.append("read_tensor")
        return await super().read_tensor(tensor)

    def read_tensor_blocking(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        self._tensor(tensor)
        self._note_writers(tensor)
        self.calls.append("read_tensor_blocking")
        return super().read_tensor_blocking(tensor)

    def export_dlpack(self, tensor: Tensor, *, stream: Any = None, **kwargs: Any) -> Any:
        self._tensor(tensor)
        self._note_writers(tensor)
        self.calls.append("export_dlpack")
        return super().export_dlpack(tensor, stream=stream, **kwargs)

    def dlpack_device(self, tensor: Tensor) -> tuple[int, int]:
        self._tensor(tensor)
        self.calls.append("dlpack_device")
        return super().dlpack_device(tensor)


class Queued(Trusting):
    """The same, for a backend that orders its reads itself (a device queue): the core must
    not wait, and these wait for the tensor's writer."""

    wait_for_writers = False

    async def read_tensor(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        self._note_writers(tensor)
        self.calls.append("read_tensor")
        await tensor._stream.wait_for(tensor._seq)
        return await super(Trusting, self).read_tensor(tensor)


class TrustingBackend(CPUBackend):
    """The CPU backend over :class:`Trusting` memory kernels."""

    kernels_class: type[Trusting] = Trusting

    async def _initialize(self, device: Device) -> Opened[HostStream]:
        self.memory = self.kernels_class(self, device, self.pool_config)
        return Opened(
            streams=[HostStream(device, f"{device}/default")],
            memory=self.memory,
            tensor=CPUTensorKernels(self),
            factory=CPUFactoryKernels(self),
            dtypes=frozenset(DType),
        )


@pytest.fixture
async def trusting(anyio_backend: str) -> AsyncIterator[TrustingBackend]:
    b = TrustingBackend()
    await b.initialize()
    try:
        yield b
    finally:
        await b.shutdown()


def _blocked_writer(backend: CPUBackend, t: Tensor) -> threading.Event:
    """Make ``t``'s last writer work on its stream that runs until the returned event is set."""
    go = threading.Event()

    def writer() -> None:
        go.wait(10)

    stream = backend.current_stream
    mark_written((t,), stream, stream.submit(writer, True))
    return go


async def test_the_memory_manager_is_the_core_facade_over_the_record(
    trusting: TrustingBackend,
) -> None:
    mm = trusting.memory_manager
    assert isinstance(mm, MemoryManager)
    assert mm.kernels is trusting.memory
    assert mm.pool is trusting.memory.pool is trusting.pool


async def test_bad_arguments_never_reach_the_kernels(trusting: TrustingBackend) -> None:
    mm, f, kernels = trusting.memory_manager, trusting.tensor_factory, trusting.memory
    buf, small, t = mm.allocate(64), mm.allocate(8), f.ones((4,))
    freed, freed_t = mm.allocate(16), f.ones((4,))
    mm.free(freed)
    mm.free(freed_t)
    transposed = np.zeros((4, 4), np.uint8).T
    read_only = np.zeros(8, np.uint8)
    read_only.flags.writeable = False
    kernels.calls.clear()
    async with accelkit.open_backend("cpu") as other:
        foreign, foreign_t = other.memory_manager.allocate(16), other.tensor_factory.ones((4,))
        refusals: list[tuple[type[Exception], Callable[[], Any]]] = [
            (StaleHandleError, lambda: mm.free(freed)),
            (StaleHandleError, lambda: mm.free(freed_t)),
            (StaleHandleError, lambda: mm.free(foreign)),
            (InvalidArgumentError, lambda: mm.free(foreign_t)),
            (InvalidArgumentError, lambda: mm.free(np.zeros(4))),  # type: ignore[arg-type]  # tested
            (InvalidArgumentError, lambda: mm.copy_dtod(small, buf)),
            (StaleHandleError, lambda: mm.copy_dtod(buf, freed)),
            (StaleHandleError, lambda: mm.copy_dtod(freed_t, small)),
            (InvalidArgumentError, lambda: mm.copy_dtod(buf, foreign_t)),
            (StaleHandleError, lambda: mm.read_tensor_blocking(freed_t)),
            (InvalidArgumentError, lambda: mm.read_tensor_blocking(foreign_t)),
            (InvalidArgumentError, lambda: mm.read_tensor_blocking(buf)),  # type: ignore[arg-type]  # tested
            (StaleHandleError, lambda: mm.export_dlpack(freed_t)),
            (StaleHandleError, lambda: mm.dlpack_device(freed_t)),
        ]
        for error, call in refusals:
            with pytest.raises(error):
                call()
        awaited: list[tuple[type[Exception], Callable[[], Any]]] = [
            (InvalidArgumentError, lambda: mm.copy_htod(buf, object())),
            (InvalidArgumentError, lambda: mm.copy_htod(small, np.zeros(4, np.float32))),
            (StaleHandleError, lambda: mm.copy_htod(freed, b"ab")),
            (StaleHandleError, lambda: mm.copy_htod(freed_t, b"ab")),
            (StaleHandleError, lambda: mm.copy_htod(foreign, b"ab")),
            (InvalidArgumentError, lambda: mm.copy_dtoh(transposed, buf)),
            (InvalidArgumentError, lambda: mm.copy_dtoh(read_only, buf)),
            (InvalidArgumentError, lambda: mm.copy_dtoh([0] * 8, buf)),  # type: ignore[arg-type]  # tested
            (InvalidArgumentError, lambda: mm.copy_dtoh(np.zeros(16, np.uint8), small)),
            (StaleHandleError, lambda: mm.copy_dtoh(np.zeros(4, np.uint8), freed)),
            (InvalidArgumentError, lambda: mm.copy_dtoh(np.zeros(4, np.uint8), foreign_t)),
            (StaleHandleError, lambda: mm.read_tensor(freed_t)),
            (InvalidArgumentError, lambda: mm.read_tensor(foreign_t)),
        ]
        for error, call in awaited:
            with pytest.raises(error):
                await call()
    assert kernels.calls == []
    # Empty copies reach no kernel either; valid ones do, with checked arguments.
    await mm.copy_htod(buf, b"")
    await mm.copy_dtoh(np.zeros(0, np.uint8), buf)
    mm.copy_dtod(buf, mm.allocate(0))
    assert kernels.calls == []
    await mm.copy_htod(t, np.arange(4, dtype=np.float32))
    mm.copy_dtod(buf, t)
    back = np.zeros(4, np.float32)
    await mm.copy_dtoh(back, buf)
    np.testing.assert_array_equal(back, np.arange(4, dtype=np.float32))
    assert kernels.calls == ["stage", "write", "copy", "read"]


async def test_a_destination_freed_while_its_bytes_are_staged_is_refused(
    trusting: TrustingBackend,
) -> None:
    mm, kernels = trusting.memory_manager, trusting.memory
    buf = mm.allocate(16)
    kernels.during_stage = lambda: mm.free(buf)
    with pytest.raises(StaleHandleError, match="dst"):
        await mm.copy_htod(buf, np.ones(4, np.float32))
    assert kernels.calls == ["stage", "free"]  # and no write into the freed block


async def test_a_failed_backend_refuses_before_the_kernels(trusting: TrustingBackend) -> None:
    mm, t = trusting.memory_manager, trusting.tensor_factory.ones((4,))
    buf = mm.allocate(16)
    trusting.memory.calls.clear()
    trusting.mark_failed("the test says so")
    with pytest.raises(NotInitializedError, match="the test says so"):
        await t.to_host()
    with pytest.raises(NotInitializedError, match="the test says so"):
        t.numpy()
    with pytest.raises(NotInitializedError, match="the test says so"):
        mm.free(buf)
    with pytest.raises(NotInitializedError, match="the test says so"):
        await mm.copy_htod(buf, b"abcd")
    assert trusting.memory.calls == []


async def test_reads_wait_for_the_writers_where_the_kernels_ask(
    trusting: TrustingBackend,
) -> None:
    f, mm, kernels = trusting.tensor_factory, trusting.memory_manager, trusting.memory
    assert kernels.wait_for_writers
    t = f.full((4,), 3.0)
    go = _blocked_writer(trusting, t)
    results: list[np.ndarray[Any, Any]] = []

    async def read() -> None:
        results.append(await t.to_host())

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        await anyio.sleep(0.05)
        assert kernels.calls == []  # still waiting for the writer, in the core
        go.set()
    np.testing.assert_array_equal(results[0], np.full(4, 3.0, np.float32))
    # The blocking read and the export wait too (the writer released from another thread),
    # and so does a copy to the host.
    threading.Timer(0.05, _blocked_writer(trusting, t).set).start()
    np.testing.assert_array_equal(t.numpy(), np.full(4, 3.0, np.float32))
    threading.Timer(0.05, _blocked_writer(trusting, t).set).start()
    np.testing.assert_array_equal(np.from_dlpack(t), np.full(4, 3.0, np.float32))
    threading.Timer(0.05, _blocked_writer(trusting, t).set).start()
    back = np.zeros(4, np.float32)
    await mm.copy_dtoh(back, t)
    np.testing.assert_array_equal(back, np.full(4, 3.0, np.float32))
    assert [c for c in kernels.calls if c != "dlpack_device"] == [
        "read_tensor", "read_tensor_blocking", "export_dlpack", "read",
    ]  # fmt: skip
    assert kernels.complete == [True] * 4


async def test_reads_are_handed_over_at_once_where_the_kernels_order_them(
    anyio_backend: str,
) -> None:
    class QueuedBackend(TrustingBackend):
        kernels_class = Queued

    b = QueuedBackend()
    await b.initialize()
    try:
        t = b.tensor_factory.full((4,), 5.0)
        go = _blocked_writer(b, t)
        results: list[np.ndarray[Any, Any]] = []

        async def read() -> None:
            results.append(await t.to_host())

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await anyio.sleep(0.05)
            assert b.memory.calls == ["read_tensor"]  # the kernels have it, writer pending
            go.set()
        assert b.memory.complete == [False]
        np.testing.assert_array_equal(results[0], np.full(4, 5.0, np.float32))
    finally:
        await b.shutdown()


def test_opened_takes_memory_kernels_only() -> None:
    with pytest.raises(TypeError, match=r"no accelkit\.sdk\.MemoryKernels"):
        Opened(
            streams=[HostStream(Device("cpu", 0), "s")],
            memory=object(),  # type: ignore[arg-type]  # the mistake tested
            tensor=None,  # type: ignore[arg-type]
            factory=None,  # type: ignore[arg-type]
            dtypes=frozenset(),
        )


def test_memory_kernels_without_dlpack_refuse_it() -> None:
    class Bare(MemoryKernels):
        def free(self, buffer: DeviceBuffer) -> None: ...
        async def write(self, buffer: Any, data: Any, dst: Any) -> None: ...
        async def read(self, out: Any, buffer: Any, src: Any) -> None: ...
        def copy(self, *args: Any) -> None: ...
        async def read_tensor(self, tensor: Tensor) -> Any: ...
        def read_tensor_blocking(self, tensor: Tensor) -> Any: ...

    class Named:
        name = "bare"

    bare = Bare(Named(), None)  # type: ignore[arg-type]  # only the name is read
    with pytest.raises(UnsupportedOperationError, match="bare"):
        bare.dlpack_device(None)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedOperationError, match="bare"):
        bare.export_dlpack(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="read_tensor"):
        type("Forgetful", (MemoryKernels,), {})(Named(), None)
