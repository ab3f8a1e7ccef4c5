"""Fixtures of the WebGPU plugin's tests: skipped cleanly without wgpu-py or an adapter; the
kernel metadata cache points into the test's temporary folder; async tests run on asyncio and
trio."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelkit.errors import DeviceError
from accelkit.testing.fixtures import anyio_backend, backend_fixture, isolate_compiler_caches

__all__ = ["anyio_backend", "backend", "kernel_cache"]

isolate_compiler_caches("accelkit-webgpu-test-caches-")

pytest.importorskip("wgpu", reason="wgpu-py is not installed")

try:
    from accelkit_webgpu.probe import adapters

    HAVE_ADAPTER = bool(adapters())
    NO_ADAPTER_REASON = ""
except DeviceError as exc:
    HAVE_ADAPTER = False
    NO_ADAPTER_REASON = str(exc)

if not HAVE_ADAPTER:
    pytest.skip(f"no WebGPU adapter here: {NO_ADAPTER_REASON}", allow_module_level=True)


@pytest.fixture(autouse=True)
def kernel_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own ACCELKIT_CACHE_DIR (the executor's disk cache lives under it,
    unless ACCELKIT_WEBGPU_CACHE names another folder: a test run's cache isolation sets that,
    so it is cleared here)."""
    cache = tmp_path / "accelkit-cache"
    monkeypatch.setenv("ACCELKIT_CACHE_DIR", str(cache))
    monkeypatch.delenv("ACCELKIT_WEBGPU_CACHE", raising=False)
    return cache


backend = backend_fixture("webgpu:0")
