"""accelkit's pytest plugin (entry point ``pytest11``): the ``--accelkit-backend`` option of the
conformance suite (``pytest --pyargs accelkit.testing --accelkit-backend NAME``).

It adds only the option: the suite's fixtures live in ``accelkit/testing/conftest.py`` and so
apply to the suite alone, never to a project's own tests.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

#: The environment variable the option sets (read by :mod:`accelkit.testing.backends`).
BACKEND_ENV = "ACCELKIT_TEST_BACKEND"


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("accelkit", "accelkit conformance suite")
    group.addoption(
        "--accelkit-backend",
        action="store",
        default=None,
        metavar="NAME[,NAME...]",
        help=(
            "the installed backend(s) the accelkit.testing conformance suite runs against"
            f" (default: ${BACKEND_ENV}, else every installed backend with a device)"
        ),
    )


def pytest_configure(config: Any) -> None:
    name = config.getoption("--accelkit-backend", default=None)
    if name:
        os.environ[BACKEND_ENV] = name


def isolate_compiler_caches(prefix: str = "accelkit-test-caches-") -> str:
    """Point the compiler caches of device backends (PyOpenCL, PoCL, accelkit's program caches
    and OpenCL variant verdicts, Numba's for the CPU backend's JIT kernels, and their verdicts)
    at a new temporary folder, unless already set; call it before any plugin's probe imports its
    driver. Returns the folder."""
    caches = tempfile.mkdtemp(prefix=prefix)
    for var, sub in (
        ("PYOPENCL_CACHE_DIR", "pyopencl"),
        ("POCL_CACHE_DIR", "pocl"),
        ("ACCELKIT_OPENCL_CACHE", "accelkit-opencl"),
        ("ACCELKIT_CUDA_CACHE", "accelkit-cuda"),
        ("ACCELKIT_WEBGPU_CACHE", "accelkit-webgpu"),
        ("ACCELKIT_OPENCL_VARIANTS_FILE", "accelkit-opencl-variants.json"),
        ("NUMBA_CACHE_DIR", "numba"),
        ("ACCELKIT_CPU_JIT_VERDICTS", "accelkit-cpu-jit-verdicts.json"),
    ):
        os.environ.setdefault(var, os.path.join(caches, sub))
    return caches
