"""No PyOpenCL exception reaches a public API: driver failures come out as accelkit errors.

Each test makes one PyOpenCL call fail the way a broken driver does (the call raises its
``pyopencl.Error``) and checks that the public call that reached it raises the accelkit error
instead, with nothing leaked and the backend still usable afterwards.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl
import pytest
from accelkit_opencl.backend import OpenCLBackend

from accelkit.errors import AccelError, DeviceError

pytestmark = pytest.mark.anyio


def _driver_error(routine: str, code: int = cl.status_code.INVALID_VALUE) -> cl.Error:
    return cl.LogicError(cl._cl._ErrorRecord(f"{routine} failed", code, routine))


def _failing(routine: str, code: int = cl.status_code.INVALID_VALUE) -> Any:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise _driver_error(routine, code)

    return fail


async def test_a_queue_the_driver_refuses_is_a_device_error(
    backend: OpenCLBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cl, "CommandQueue", _failing("clCreateCommandQueue"))
    with pytest.raises(DeviceError, match="clCreateCommandQueue") as info:
        backend.create_stream()
    assert not isinstance(info.value, cl.Error)
    monkeypatch.undo()
    x = backend.tensor_factory.from_host(np.arange(6, dtype=np.float32))
    np.testing.assert_array_equal(await (x + 1).to_host(), np.arange(6) + 1)


async def test_an_allocation_the_driver_refuses_is_a_device_error(
    backend: OpenCLBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    used = backend.memory_manager.memory_info().used
    monkeypatch.setattr(cl, "Buffer", _failing("clCreateBuffer"))
    with pytest.raises(DeviceError, match="could not allocate"):
        backend.tensor_factory.empty((1 << 20,))
    monkeypatch.undo()
    assert backend.memory_manager.memory_info().used == used


async def test_an_allocation_out_of_resources_is_out_of_memory(
    backend: OpenCLBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelkit.errors import OutOfMemoryError

    used = backend.memory_manager.memory_info().used
    monkeypatch.setattr(
        cl, "Buffer", _failing("clCreateBuffer", cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE)
    )
    with pytest.raises(OutOfMemoryError):
        backend.tensor_factory.empty((1 << 20,))
    monkeypatch.undo()
    assert backend.memory_manager.memory_info().used == used


async def test_a_failing_enqueue_is_reported_when_awaited(
    backend: OpenCLBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = backend.tensor_factory.from_host(np.arange(8, dtype=np.float32))
    await backend.synchronize()
    monkeypatch.setattr(cl, "enqueue_nd_range_kernel", _failing("clEnqueueNDRangeKernel"))
    y = backend.tensor_ops.exp(x)
    with pytest.raises(AccelError, match="clEnqueueNDRangeKernel") as info:
        await y.to_host()
    assert not isinstance(info.value, cl.Error)
    monkeypatch.undo()
    np.testing.assert_allclose(
        await backend.tensor_ops.exp(x).to_host(), np.exp(np.arange(8)), rtol=1e-6
    )


async def test_shutdown_completes_when_the_driver_fails_to_finish_and_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    b = OpenCLBackend()
    await b.initialize("opencl:0")
    x = b.tensor_factory.ones((1024,))
    await (x * 2).to_host()
    monkeypatch.setattr(cl.CommandQueue, "finish", _failing("clFinish"))
    released: list[object] = []
    real_release = cl.Buffer.release

    def release(self: Any) -> None:
        released.append(self)
        real_release(self)
        raise _driver_error("clReleaseMemObject")

    monkeypatch.setattr(cl.Buffer, "release", release)
    await b.shutdown()
    assert released, "the pool released its buffers"
    info = b.memory_manager.memory_info()
    assert (info.used, info.reserved) == (0, 0)
    assert not b.is_ready
