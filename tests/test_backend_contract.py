"""The base class of every backend (``accelkit.sdk.StreamBackend``, plugin API 3.0): what it does
with the ``Opened`` record, ``reopen()`` after a lost device, and a reopen that fails. Run on the
CPU backend, under asyncio and trio."""

from __future__ import annotations

import numpy as np
import pytest

import accelkit
from accelkit import (
    DeviceError,
    LifecycleState,
    NotInitializedError,
    StaleHandleError,
    UnsupportedOperationError,
)
from accelkit.backends.cpu.backend import CPUBackend
from accelkit.device import Device
from accelkit.sdk import HostStream, Opened

pytestmark = pytest.mark.anyio


class _Reopening(CPUBackend):
    """The CPU backend, whose second and later opens fail when ``fail_next`` is set."""

    fail_next = False

    async def _initialize(self, device: Device) -> Opened[HostStream]:
        if self.fail_next:
            raise DeviceError("the device did not come back")
        return await super()._initialize(device)


async def test_initialize_installs_the_record_and_create_stream_registers() -> None:
    b = CPUBackend()
    await b.initialize("cpu:0")
    try:
        assert b.streams == (b.default_stream,)
        assert b.memory_manager.pool is b.pool
        s = b.create_stream()
        assert list(b.streams) == [b.default_stream, s]
        with b.use_stream(s):
            y = b.tensor_ops.add(b.tensor_factory.ones((4,)), 1.0)
        np.testing.assert_array_equal(await y.to_host(), np.full(4, 2.0, np.float32))
    finally:
        await b.shutdown()
    assert not b.streams
    assert b.memory_manager.memory_info().used == 0


async def test_a_record_that_is_no_opened_is_refused_naming_the_method() -> None:
    class Wrong(CPUBackend):
        async def _initialize(self, device: Device) -> Opened[HostStream]:
            opened = await super()._initialize(device)
            return {"streams": list(opened.streams)}  # type: ignore[return-value]  # the mistake tested

    b = Wrong()
    with pytest.raises(TypeError, match=r"_initialize must return accelkit\.sdk\.Opened; got dict"):
        await b.initialize()
    assert b.state is LifecycleState.FAILED


def test_opened_needs_position_streams() -> None:
    with pytest.raises(TypeError, match="at least one stream"):
        Opened(streams=[], memory=None, tensor=None, factory=None, dtypes=frozenset())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"no accelkit\.sdk\.PositionStream"):
        Opened(streams=[object()], memory=None, tensor=None, factory=None, dtypes=frozenset())  # type: ignore[arg-type, type-var]


async def test_reopen_makes_every_old_handle_stale_and_keeps_the_fallback() -> None:
    b = _Reopening()
    await b.initialize()
    spare = CPUBackend()
    await spare.initialize()
    try:
        fallback = b.enable_fallback(spare)
        fallback.counts["marker"] = 1  # a record of before, which reopen keeps
        old = b.tensor_factory.from_host(np.arange(6, dtype=np.float32))
        generation = b.generation
        old_streams = b.streams
        await b.reopen()
        assert b.generation > generation
        assert b.is_ready
        assert all(s not in old_streams for s in b.streams)
        with pytest.raises(StaleHandleError):
            b.tensor_ops.add(old, 1.0)
        # The same fallback wrapper, with its records, over the new TensorOps.
        assert b.fallback is fallback
        assert fallback.counts["marker"] == 1
        new = b.tensor_ops.mul(b.tensor_factory.from_host(np.arange(6, dtype=np.float32)), 2.0)
        np.testing.assert_array_equal(await new.to_host(), np.arange(6) * 2.0)
    finally:
        await b.shutdown()
        await spare.shutdown()
    assert b.memory_manager.memory_info().used == 0


async def test_a_reopen_that_fails_marks_the_backend_failed_and_shutdown_returns() -> None:
    b = _Reopening()
    await b.initialize()
    b.fail_next = True
    with pytest.raises(DeviceError, match="did not come back"):
        await b.reopen()
    assert b.state is LifecycleState.FAILED
    assert "did not come back" in (b.status.error or "")
    with pytest.raises(NotInitializedError, match="reopening cpu:0 failed"):
        b.tensor_ops  # noqa: B018 - the access is what is tested
    await b.shutdown()  # releases what is left, without raising
    assert b.status.state is LifecycleState.SHUT_DOWN
    await b.shutdown()  # twice: nothing


async def test_a_backend_refuses_a_device_it_does_not_drive() -> None:
    b = CPUBackend()
    with pytest.raises(UnsupportedOperationError, match="cannot drive device cuda:0"):
        await b.initialize("cuda:0")
    assert b.state is LifecycleState.CREATED
    await b.shutdown()  # never opened: nothing to do
    assert isinstance(accelkit.create_backend("cpu"), CPUBackend)


async def test_an_index_based_backend_refuses_a_device_named_by_address() -> None:
    """``cpu://10.0.0.5:8786`` names no CPU of this machine: the default ``supports_device``
    took it for cpu:0 (an address gives index 0), and the backend initialized on it."""
    backend = CPUBackend()
    assert backend.supports_device("cpu:0")
    assert not backend.supports_device("cpu://10.0.0.5:8786")
    assert not backend.supports_device(Device("cpu", address="10.0.0.5:8786"))
    with pytest.raises(
        UnsupportedOperationError, match=r"cannot drive device cpu://10\.0\.0\.5:8786"
    ):
        await backend.initialize("cpu://10.0.0.5:8786")
    assert not backend.is_ready
