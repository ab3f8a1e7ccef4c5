"""Fixtures of the CUDA plugin's tests.

Most tests need no GPU (the probe, capabilities, NVRTC compilation, error translation). Tests
marked ``gpu`` run on a CUDA device and skip with the reason elsewhere; async tests run on asyncio
and on trio. Kernel caches point into each test's temporary folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from accelkit.errors import DeviceError
from accelkit.testing.fixtures import anyio_backend, backend_fixture, isolate_compiler_caches

__all__ = ["HostDivision", "anyio_backend", "backend", "cuda_cache", "host_division"]

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
    config.addinivalue_line(
        "markers", "division: runs the CUDA division kernels built for the host (a C++ compiler)"
    )


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


class HostDivision:
    """:data:`accelkit_cuda.division.SOURCE` built by the host's C++ compiler (``__device__``
    defined away), with the same Python API as the module: the kernels' own text, run on the
    CPU, so that their IEEE arithmetic is checked against NumPy without a GPU."""

    _TYPES: ClassVar[dict[str, str]] = {
        "float32": "float", "float64": "double", "int8": "int8_t", "int16": "int16_t",
        "int32": "int32_t", "int64": "int64_t", "uint8": "uint8_t", "uint16": "uint16_t",
        "uint32": "uint32_t", "uint64": "uint64_t",
    }  # fmt: skip
    _FLOAT_OPS = ("floor_divide", "remainder")

    def __init__(self, folder: Path) -> None:
        import ctypes
        import shutil
        import subprocess

        from accelkit_cuda.division import SOURCE

        compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
        if compiler is None:
            pytest.skip("no host C++ compiler to build the division kernels with")
        loops = []
        for dt, ct in self._TYPES.items():
            ops = self._FLOAT_OPS if dt.startswith("float") else ("int_fmod",)
            for op in ops:
                loops.append(
                    f'extern "C" void {op}_{dt}(const {ct}* a, const {ct}* b, {ct}* out, long n)'
                    f" {{ for (long i = 0; i < n; ++i) out[i] = ak_{op}<{ct}>(a[i], b[i]); }}"
                )
        text = (
            "#include <cmath>\n#include <cstdint>\nusing std::copysign; using std::floor;"
            " using std::fmod;\n#define __device__\n" + SOURCE + "\n".join(loops) + "\n"
        )
        lib = folder / "division_host.so"
        # No contraction and no fast math: each operation rounds once, as NVRTC's defaults do.
        subprocess.run(
            [compiler, "-O1", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC",
             "-x", "c++", "-", "-o", str(lib)],
            input=text.encode(), check=True, capture_output=True,
        )  # fmt: skip
        self._lib = ctypes.CDLL(str(lib))

    def _run(self, op: str, a: Any, b: Any) -> Any:
        import ctypes

        import numpy as np

        a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
        assert a.dtype == b.dtype, (a.dtype, b.dtype)
        a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
        out = np.empty_like(a)
        fn = getattr(self._lib, f"{op}_{a.dtype.name}")
        fn(*(ctypes.c_void_p(x.ctypes.data) for x in (a, b, out)), ctypes.c_long(a.size))
        return out

    def floor_divide(self, a: Any, b: Any) -> Any:
        return self._run("floor_divide", a, b)

    def remainder(self, a: Any, b: Any) -> Any:
        return self._run("remainder", a, b)

    def int_fmod(self, a: Any, b: Any) -> Any:
        return self._run("int_fmod", a, b)


@pytest.fixture(scope="session")
def host_division(tmp_path_factory: pytest.TempPathFactory) -> HostDivision:
    return HostDivision(tmp_path_factory.mktemp("division"))
