"""Fixtures of the OpenCL plugin's tests: skipped cleanly without PyOpenCL or a device; every
compiler cache points into the test's temporary folder; async tests run on asyncio and trio."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from accelkit.errors import DeviceError

# PoCL and PyOpenCL read their cache folders once, when the platform is first loaded (below, at
# collection): point them into a folder of this run before that happens.
_CACHES = tempfile.mkdtemp(prefix="accelkit-opencl-test-caches-")
os.environ.setdefault("POCL_CACHE_DIR", os.path.join(_CACHES, "pocl"))
os.environ.setdefault("PYOPENCL_CACHE_DIR", os.path.join(_CACHES, "pyopencl"))
# Kernel-variant verdicts: one store for the run (tests' program caches are per test, but the
# verification runs once per device and run, in the background; tests of it use their own).
os.environ.setdefault("ACCELKIT_OPENCL_VARIANTS_FILE", os.path.join(_CACHES, "variants.json"))

pytest.importorskip("pyopencl")

try:
    from accelkit_opencl.probe import cl_devices

    HAVE_DEVICE = bool(cl_devices())
except DeviceError:
    HAVE_DEVICE = False

if not HAVE_DEVICE:
    pytest.skip("no OpenCL device here", allow_module_level=True)


@pytest.fixture(autouse=True)
def opencl_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "opencl-cache"
    monkeypatch.setenv("ACCELKIT_OPENCL_CACHE", str(cache))
    monkeypatch.setenv("PYOPENCL_CACHE_DIR", str(tmp_path / "pyopencl-cache"))
    monkeypatch.setenv("POCL_CACHE_DIR", str(tmp_path / "pocl-cache"))
    return cache


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def backend(anyio_backend: str) -> AsyncIterator[object]:
    from accelkit_opencl.backend import OpenCLBackend

    b = OpenCLBackend()
    await b.initialize("opencl:0")
    try:
        yield b
    finally:
        await b.shutdown()
