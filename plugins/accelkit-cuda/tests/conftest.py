"""Fixtures of the CUDA plugin's tests.

Most tests need no GPU (the probe, capabilities, NVRTC compilation, error translation). Tests
marked ``gpu`` run on a CUDA device and skip with the reason elsewhere; async tests run on asyncio
and on trio. Kernel caches point into each test's temporary folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from accelkit.errors import DeviceError
from accelkit.testing.fixtures import anyio_backend, backend_fixture, isolate_compiler_caches

__all__ = ["anyio_backend", "backend", "cuda_cache"]

isolate_compiler_caches("accelkit-cuda-test-caches-")


def _gpu_reason() -> str | None:
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "CuPy is not installed (pip install 'accelkit-cuda[cuda12]')"
    from accelkit_cuda.probe import probe

    try:
        probe()
    except DeviceError as exc:
        return str(exc)
    return None


GPU_REASON = _gpu_reason()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped with the reason elsewhere)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if GPU_REASON is None:
        return
    skip = pytest.mark.skip(reason=f"no CUDA GPU: {GPU_REASON}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def cuda_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cuda-cache"
    monkeypatch.setenv("ACCELKIT_CUDA_CACHE", str(cache))
    return cache


backend = backend_fixture("cuda:0")
