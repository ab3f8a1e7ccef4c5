from __future__ import annotations

import numpy as np
import pytest
from accelkit_opencl.backend import OpenCLBackend

import accelkit as ak
from accelkit.errors import NotInitializedError, StaleHandleError, UnsupportedOperationError

pytestmark = pytest.mark.anyio


async def test_open_backend_runs_on_the_device() -> None:
    async with ak.open_backend("opencl") as b:
        assert b.name == "opencl"
        assert str(b.device) == "opencl:0"
        assert b.is_ready
        assert b.kernel_executor is not None
        x = b.tensor_factory.from_host(np.arange(4, dtype=np.float32))
        np.testing.assert_array_equal(await (x * 2).to_host(), np.arange(4) * 2)
        assert b.capabilities.dtypes == b.supported_dtypes


async def test_shutdown_releases_everything_and_invalidates() -> None:
    b = OpenCLBackend()
    await b.initialize("opencl:0")
    x = b.tensor_factory.ones((256,))
    await b.synchronize()
    assert b.memory_manager.memory_info().used == 1024
    await b.shutdown()
    info = b.memory_manager.memory_info()
    assert info.used == 0
    assert info.reserved == 0
    with pytest.raises(NotInitializedError):
        b.tensor_ops  # noqa: B018
    with pytest.raises((NotInitializedError, StaleHandleError)):
        await x.to_host()
    await b.shutdown()  # twice is fine


async def test_unsupported_device_and_dtype() -> None:
    b = OpenCLBackend()
    assert not b.supports_device("opencl:999")
    assert not b.supports_device("cuda:0")
    with pytest.raises(UnsupportedOperationError):
        await b.initialize("opencl:999")
    b = OpenCLBackend()
    await b.initialize()
    try:
        with pytest.raises(UnsupportedOperationError, match="bf16"):
            b.tensor_factory.zeros((2,), "bf16")
        if ak.DType.F16 not in b.supported_dtypes:
            with pytest.raises(UnsupportedOperationError, match="f16"):
                b.tensor_factory.zeros((2,), "f16")
    finally:
        await b.shutdown()
