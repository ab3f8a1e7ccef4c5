"""The conformance suite's fixtures: ``anyio_backend`` (every async test runs under asyncio and
under trio) and ``backend`` (one parameter per backend under test, each opened with
``accelkit.open_backend(name)``). Compiler caches of device backends go to a temporary folder of
the run, set before any plugin's probe imports its driver."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import accelkit
from accelkit.abc.backend import ComputeBackend
from accelkit.testing.plugin import isolate_compiler_caches

from .backends import conformance_backends

isolate_compiler_caches("accelkit-conformance-caches-")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Every ``anyio`` test of the suite runs on both event loops."""
    return str(request.param)


@pytest.fixture(params=conformance_backends())
async def backend(
    request: pytest.FixtureRequest, anyio_backend: str
) -> AsyncIterator[ComputeBackend]:
    async with accelkit.open_backend(request.param) as b:
        yield b
