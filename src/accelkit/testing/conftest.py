"""The conformance suite's fixtures: ``anyio_backend`` (every async test runs under asyncio and
under trio) and ``backend`` (one parameter per backend under test, each opened with
``accelkit.open_backend(name)``). Compiler caches of device backends go to a temporary folder of
the run, set before any plugin's probe imports its driver.

A test whose work needs a dtype the backend does not claim (an index op's I64 result, an F64
source array) and that the backend refuses with the documented ``UnsupportedOperationError``
is skipped with that reason: the refusal is the specified behaviour, and the test checks
something that backend cannot hold. A refusal of a dtype the backend *does* claim still fails.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from typing import Any

import pytest

from accelkit.abc.backend import ComputeBackend
from accelkit.dtype import DType
from accelkit.errors import UnsupportedOperationError
from accelkit.testing.fixtures import anyio_backend, backend_fixture, isolate_compiler_caches

from .backends import conformance_backends

__all__ = ["anyio_backend", "backend"]

isolate_compiler_caches("accelkit-conformance-caches-")

#: One parameter per backend under test, each opened with ``accelkit.open_backend(name)``.
backend = backend_fixture(params=conformance_backends())

_REFUSED_DTYPE = re.compile(r"does not support dtype (\w+)")


def unclaimed_dtype(backend: Any, exc: BaseException) -> str | None:
    """The dtype ``exc`` says ``backend`` refused, if the backend does not claim it."""
    if not isinstance(exc, UnsupportedOperationError):
        return None
    match = _REFUSED_DTYPE.search(str(exc))
    if match is None:
        return None
    try:
        dtype = DType(match.group(1))
    except ValueError:
        return None
    claimed = getattr(getattr(backend, "capabilities", None), "dtypes", None)
    if claimed is None or dtype in claimed:
        return None
    return dtype.value


def _backend_of(funcargs: dict[str, Any]) -> ComputeBackend | None:
    """The backend a test runs on: its ``backend`` argument, or the ``backend`` of a fixture
    object that carries one (the KernelOps tests' ``env``)."""
    for value in funcargs.values():
        if isinstance(value, ComputeBackend):
            return value
        inner = getattr(value, "backend", None)
        if isinstance(inner, ComputeBackend):
            return inner
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    try:
        return (yield)
    except UnsupportedOperationError as exc:
        backend_obj = _backend_of(getattr(item, "funcargs", {}))
        missing = unclaimed_dtype(backend_obj, exc) if backend_obj is not None else None
        if missing is None:
            raise
        name = getattr(backend_obj, "name", "the backend")
        pytest.skip(f"{name} does not claim dtype {missing}, which this test needs")
