"""Fixtures of the OpenCL plugin's tests: skipped cleanly without PyOpenCL or a device; the
compiler caches are the run's (shared by its tests, and by every part of ``nox -s tests``), and a
test about the cache asks for ``opencl_cache``, a folder of its own; async tests run on asyncio
and trio."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelkit.errors import DeviceError
from accelkit.testing.fixtures import anyio_backend, backend_fixture, isolate_compiler_caches

__all__ = ["anyio_backend", "backend", "opencl_cache"]

# PoCL and PyOpenCL read their cache folders once, when the platform is first loaded (below, at
# collection): point them into a folder of this run before that happens. Kernel-variant verdicts
# get one store for the run (the verification runs once per device and run, in the background;
# tests of it use their own).
isolate_compiler_caches("accelkit-opencl-test-caches-")

pytest.importorskip("pyopencl")

try:
    from accelkit_opencl.probe import cl_devices

    HAVE_DEVICE = bool(cl_devices())
except DeviceError:
    HAVE_DEVICE = False

if not HAVE_DEVICE:
    pytest.skip("no OpenCL device here", allow_module_level=True)


@pytest.fixture
def opencl_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """accelkit's and PyOpenCL's program caches in this test's own folder (the accelkit one is
    returned): for the tests about the cache. The others share the run's, so that a kernel is
    compiled once per run, not once per test. (PoCL reads its folder once per process.)"""
    cache = tmp_path / "opencl-cache"
    monkeypatch.setenv("ACCELKIT_OPENCL_CACHE", str(cache))
    monkeypatch.setenv("PYOPENCL_CACHE_DIR", str(tmp_path / "pyopencl-cache"))
    monkeypatch.setenv("POCL_CACHE_DIR", str(tmp_path / "pocl-cache"))
    return cache


backend = backend_fixture("opencl:0")
