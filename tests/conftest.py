"""Fixtures shared by every test: each async test runs under both asyncio and trio."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import accelkit  # imports no backend, so no driver: the cache settings below still apply
from accelkit.abc.backend import ComputeBackend
from accelkit.testing.plugin import isolate_compiler_caches

# Compiler caches of device backends (PyOpenCL, PoCL, accelkit's program cache) go to a folder of
# this test run, set before any plugin's probe imports its driver.
isolate_compiler_caches("accelkit-test-caches-")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Overrides anyio's fixture (asyncio only) so that every ``anyio`` test runs on both loops."""
    return str(request.param)


@pytest.fixture
async def backend(anyio_backend: str) -> AsyncIterator[ComputeBackend]:
    """An initialized CPU backend, shut down after the test (the conformance suite overrides this
    with one backend per installed plugin)."""
    async with accelkit.open_backend("cpu") as b:
        yield b
