"""Fixtures shared by every test: each async test runs under both asyncio and trio, and
``backend`` is an initialized CPU backend (the conformance suite has its own, one per installed
backend)."""

from __future__ import annotations

from accelkit.testing.fixtures import anyio_backend, backend_fixture, isolate_compiler_caches

__all__ = ["anyio_backend", "backend"]

# Compiler caches of device backends (PyOpenCL, PoCL, accelkit's program cache) go to a folder of
# this test run, set before any plugin's probe imports its driver.
isolate_compiler_caches("accelkit-test-caches-")

backend = backend_fixture("cpu")
