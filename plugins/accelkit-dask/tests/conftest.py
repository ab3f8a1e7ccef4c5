"""Fixtures of the Dask plugin's tests: clusters started as separate processes (the way a user
runs one), backends on them, and async tests under asyncio and trio.

``shared_cluster`` (one per test session: ``python -m accelkit_dask.serve``, a LocalCluster of two
worker processes) serves the op tests; the fault tests start their own, since they kill workers.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from accelkit.testing.fixtures import anyio_backend

__all__ = ["anyio_backend", "backend", "free_port", "serve_cluster", "shared_cluster"]

pytest.importorskip("distributed", reason="dask.distributed is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """A cluster in another process: its scheduler address and the process."""

    def __init__(self, proc: subprocess.Popen[bytes], address: str) -> None:
        self.proc = proc
        self.address = address

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # --until-stdin-closes
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def serve_cluster(tmp: Path, workers: int = 2) -> Served:
    """``python -m accelkit_dask.serve``: a LocalCluster of ``workers`` processes."""
    address_file = tmp / f"dask-address-{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "accelkit_dask.serve", "--workers", str(workers),
            "--address-file", str(address_file), "--until-stdin-closes",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not address_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("python -m accelkit_dask.serve did not start a cluster")
        time.sleep(0.05)
    return Served(proc, address_file.read_text().strip())


@pytest.fixture(scope="session")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from accelkit_dask.cluster import close_connections

    served = serve_cluster(tmp_path_factory.mktemp("dask"))
    yield served
    close_connections()  # before the scheduler goes: no reconnection attempts at exit
    served.stop()


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
