"""The conformance suite's fixtures: ``anyio_backend`` (every async test runs under asyncio and
under trio) and ``backend`` (one parameter per backend under test, each opened with
``accelkit.open_backend(name)``). Compiler caches of device backends go to a temporary folder of
the run, set before any plugin's probe imports its driver."""

from __future__ import annotations

from accelkit.testing.fixtures import anyio_backend, backend_fixture, isolate_compiler_caches

from .backends import conformance_backends

__all__ = ["anyio_backend", "backend"]

isolate_compiler_caches("accelkit-conformance-caches-")

#: One parameter per backend under test, each opened with ``accelkit.open_backend(name)``.
backend = backend_fixture(params=conformance_backends())
