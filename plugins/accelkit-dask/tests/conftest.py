"""Fixtures of the Dask plugin's tests: clusters started as separate processes (the way a user
runs one), backends on them, and async tests under asyncio and trio.

``shared_cluster`` (one per test session: ``python -m accelkit_dask.serve``, a LocalCluster of two
worker processes) serves the op tests; the fault tests start their own, since they kill workers.
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from accelkit.testing.fixtures import anyio_backend

if TYPE_CHECKING:
    from accelkit_dask.cluster import Served

__all__ = ["anyio_backend", "backend", "free_port", "serve_cluster", "shared_cluster"]

pytest.importorskip("distributed", reason="dask.distributed is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_cluster(workers: int = 2) -> Served:
    """``python -m accelkit_dask.serve``: a LocalCluster of ``workers`` single-threaded
    processes, started and stopped (``close``) the way the ``dask`` device does it."""
    from accelkit_dask.cluster import LocalSize, Served, system_memory

    return Served.start(LocalSize(workers, 1, system_memory() // (2 * workers)), nice=0)


@pytest.fixture(scope="session")
def shared_cluster() -> Iterator[Served]:
    from accelkit_dask.cluster import close_connections

    served = serve_cluster()
    yield served
    close_connections()  # before the scheduler goes: no reconnection attempts at exit
    served.close()


@pytest.fixture
async def backend(shared_cluster: Served, anyio_backend: str) -> AsyncIterator[Any]:
    """A Dask backend on the shared cluster, with 4 KiB chunks: small tensors span several
    blocks, so every op's blockwise plan is exercised."""
    from accelkit_dask.backend import DaskBackend

    b = DaskBackend(chunk_bytes=4096)
    await b.initialize(f"dask://{shared_cluster.address.removeprefix('tcp://')}")
    try:
        yield b
    finally:
        await b.shutdown()


@pytest.fixture(autouse=True)
def _no_scheduler_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests name their clusters; a scheduler configured outside must not leak in."""
    monkeypatch.delenv("ACCELKIT_DASK_SCHEDULER", raising=False)
    monkeypatch.delenv("ACCELKIT_DASK_CHUNK_BYTES", raising=False)
    os.environ.setdefault("ACCELKIT_DASK_PROBE_TIMEOUT", "2")
