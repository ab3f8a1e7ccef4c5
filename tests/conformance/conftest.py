"""The ``backend`` fixture of the conformance suite: one parameter per backend, each opened with
``accelkit.open_backend(name)`` under asyncio and under trio."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import accelkit
from accelkit.abc.backend import ComputeBackend

from .backends import conformance_backends


@pytest.fixture(params=conformance_backends())
async def backend(
    request: pytest.FixtureRequest, anyio_backend: str
) -> AsyncIterator[ComputeBackend]:
    async with accelkit.open_backend(request.param) as b:
        yield b
