"""accelkit's pytest plugin (entry point ``pytest11``): the ``--accelkit-backend`` option of the
conformance suite (``pytest --pyargs accelkit.testing --accelkit-backend NAME``), and the
``one_loop`` marker.

It adds only these: the suite's fixtures live in ``accelkit/testing/conftest.py`` and so apply
to the suite alone, never to a project's own tests. The marker changes nothing for a test that
does not carry it.

``@pytest.mark.one_loop`` (on a test, a class or a module's ``pytestmark``) runs a test that is
parametrized by ``anyio_backend`` (asyncio and trio, :mod:`accelkit.testing.fixtures`) under one
of the two loops only: for tests that check what a kernel computes, whose code path below the
await is the same under either loop. Tests of the execution model (awaits, cancellation,
streams, transfers, lifecycle) keep both. The loop is picked per test function by a hash of its
module and name, so about half of such functions run under each loop, and a given function
always under the same one; the other is deselected (pytest's summary counts it).
``ACCELKIT_TEST_LOOPS=both`` (or ``--accelkit-loops both``) runs every test under both loops.
"""

from __future__ import annotations

import os
import tempfile
import zlib
from typing import Any

#: The environment variable the option sets (read by :mod:`accelkit.testing.backends`).
BACKEND_ENV = "ACCELKIT_TEST_BACKEND"
#: ``both`` runs ``one_loop`` tests under both event loops too (``--accelkit-loops``).
LOOPS_ENV = "ACCELKIT_TEST_LOOPS"
#: The loops of the ``anyio_backend`` fixture, in the order the hash picks from.
LOOPS = ("asyncio", "trio")


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
    group.addoption(
        "--accelkit-loops",
        action="store",
        default=None,
        choices=("one", "both"),
        help=(
            "'both' runs tests marked one_loop under asyncio and trio too"
            f" (default: ${LOOPS_ENV}, else one)"
        ),
    )


def pytest_configure(config: Any) -> None:
    name = config.getoption("--accelkit-backend", default=None)
    if name:
        os.environ[BACKEND_ENV] = name
    config.addinivalue_line(
        "markers",
        "one_loop: a kernel check parametrized by anyio_backend runs under one event loop"
        " (picked per test function), not both; ACCELKIT_TEST_LOOPS=both runs both",
    )


def loop_for(module: str, function: str) -> str:
    """The event loop a ``one_loop`` test function runs under: the same one on every run and
    machine, and about half of the functions on each."""
    return LOOPS[zlib.crc32(f"{module}::{function}".encode()) % len(LOOPS)]


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    wanted = config.getoption("--accelkit-loops", default=None) or os.environ.get(LOOPS_ENV, "")
    if wanted.strip().lower() == "both":
        return
    keep: list[Any] = []
    drop: list[Any] = []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        loop = params.get("anyio_backend")
        if loop is None or item.get_closest_marker("one_loop") is None:
            keep.append(item)
            continue
        module = getattr(getattr(item, "module", None), "__name__", "") or str(item.path)
        function = getattr(item, "originalname", "") or item.name
        (keep if loop == loop_for(module, function) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


#: A folder for the compiler caches of a whole test run (every part of ``nox -s tests`` shares
#: it), instead of a new one per process (:func:`isolate_compiler_caches`).
CACHES_ENV = "ACCELKIT_TEST_CACHES"


def isolate_compiler_caches(prefix: str = "accelkit-test-caches-") -> str:
    """Point the compiler caches of device backends (PyOpenCL, PoCL, accelkit's program caches,
    OpenCL variant verdicts and CUDA kernel verdicts, Numba's for the CPU backend's JIT kernels, and their verdicts)
    at a new temporary folder, unless already set; call it before any plugin's probe imports its
    driver. Returns the folder.

    Where ``$ACCELKIT_TEST_CACHES`` names a folder, the device program caches (PoCL, PyOpenCL,
    accelkit's OpenCL, CUDA and WebGPU caches) go there instead: the nox session sets it, so
    that the processes of one run (its parts run side by side) compile each kernel once. Those
    write one file per entry, atomically. The stores that keep many entries in one file (the
    OpenCL variant verdicts, Numba's index, the CPU JIT verdicts) stay the process's own. A test
    about a cache sets its own. Returns the process's own folder."""
    own = tempfile.mkdtemp(prefix=prefix)
    shared = os.environ.get(CACHES_ENV, "").strip()
    if shared:
        os.makedirs(shared, exist_ok=True)
    caches = shared or own
    # Program caches keep one file per entry, written atomically: processes can share them.
    for var, sub in (
        ("PYOPENCL_CACHE_DIR", "pyopencl"),
        ("POCL_CACHE_DIR", "pocl"),
        ("ACCELKIT_OPENCL_CACHE", "accelkit-opencl"),
        ("ACCELKIT_CUDA_CACHE", "accelkit-cuda"),
        ("ACCELKIT_WEBGPU_CACHE", "accelkit-webgpu"),
        ("ACCELKIT_CUDA_VERDICTS", "accelkit-cuda-verdicts"),
    ):
        os.environ.setdefault(var, os.path.join(caches, sub))
    # One file for many entries, read, changed and replaced: processes writing it at once would
    # lose each other's entries (and a lost Numba index entry is a recompile that a test with a
    # short timeout may not survive), so each process keeps its own.
    for var, sub in (
        ("ACCELKIT_OPENCL_VARIANTS_FILE", "accelkit-opencl-variants.json"),
        ("NUMBA_CACHE_DIR", "numba"),
        ("ACCELKIT_CPU_JIT_VERDICTS", "accelkit-cpu-jit-verdicts.json"),
    ):
        os.environ.setdefault(var, os.path.join(own, sub))
    return own
