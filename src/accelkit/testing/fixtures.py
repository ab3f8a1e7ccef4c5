"""Fixtures for a backend plugin's own tests, so that every plugin's conftest.py is a few lines.

Import the ones a conftest needs (pytest finds fixtures by name in the conftest's namespace)::

    from accelkit.testing.fixtures import anyio_backend, backend_fixture, isolate_compiler_caches

    isolate_compiler_caches("accelkit-mybackend-tests-")  # before the driver is imported
    backend = backend_fixture("mybackend:0")

- :func:`anyio_backend`: every ``anyio`` test runs under asyncio and under trio.
- :func:`backend_fixture`: a fixture that opens a backend for each test (after
  ``anyio_backend``, so under both loops) and shuts it down after, whatever happened.
- :func:`isolate_compiler_caches`: every device compiler cache in a temporary folder of the run.

The conformance suite (``accelkit.testing``) uses the same fixtures.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import accelkit
from accelkit.abc.backend import ComputeBackend
from accelkit.testing.plugin import isolate_compiler_caches

__all__ = ["anyio_backend", "backend_fixture", "isolate_compiler_caches"]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Every ``anyio`` test runs on both event loops."""
    return str(request.param)


#: Set to 1 to run the tests on the isolated form of each backend (a worker process each:
#: ``accelkit.open_backend(name, isolate=True)``).
ISOLATE_ENV = "ACCELKIT_TEST_ISOLATE"


def isolated() -> bool:
    """Whether ``ACCELKIT_TEST_ISOLATE`` asks for the isolated form of the backends."""
    if os.environ.get(ISOLATE_ENV, "").strip() in ("", "0"):
        return False
    # A backend per test: the workers are kept and reused rather than started for each.
    os.environ.setdefault("ACCELKIT_ISOLATE_SPARE", "1")
    return True


def backend_fixture(
    target: str | None = None, *, params: list[str] | None = None
) -> Callable[..., AsyncIterator[ComputeBackend]]:
    """A fixture yielding an initialized backend: ``accelkit.open_backend(target)`` (isolated
    where ``ACCELKIT_TEST_ISOLATE=1``), or with
    ``params``, one test per name or device in it (the test id shows which)."""

    @pytest.fixture(params=params)
    async def backend(request: pytest.FixtureRequest, anyio_backend: str) -> AsyncIterator[Any]:
        name = getattr(request, "param", None) or target
        async with accelkit.open_backend(name, isolate=isolated()) as b:
            yield b

    return backend
