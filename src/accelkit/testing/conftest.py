"""The conformance suite's fixtures: ``anyio_backend`` (every async test runs under asyncio and
under trio) and ``backend`` (one parameter per backend under test, each opened with
``accelkit.open_backend(name)``). Compiler caches of device backends go to a temporary folder of
the run, set before any plugin's probe imports its driver."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator

import pytest

import accelkit
from accelkit.abc.backend import ComputeBackend

from .backends import conformance_backends

_CACHES = tempfile.mkdtemp(prefix="accelkit-conformance-caches-")
for _var, _sub in (
    ("PYOPENCL_CACHE_DIR", "pyopencl"),
    ("POCL_CACHE_DIR", "pocl"),
    ("ACCELKIT_OPENCL_CACHE", "accelkit-opencl"),
    ("ACCELKIT_CUDA_CACHE", "accelkit-cuda"),
    ("ACCELKIT_OPENCL_VARIANTS_FILE", "accelkit-opencl-variants.json"),
):
    os.environ.setdefault(_var, os.path.join(_CACHES, _sub))


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
