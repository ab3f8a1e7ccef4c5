"""Faults: a worker killed in the middle of a GEMM (Dask recomputes what it lost and the result is
still right), and the remote path on the real ``dask scheduler`` and ``dask worker`` commands,
including a scheduler that disappears (ContextPoisonedError, then ``recover()``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from accelkit_dask.backend import DaskBackend
from numpy.testing import assert_allclose as assert_close

from accelkit.errors import ContextPoisonedError, DeviceError, StaleHandleError
from accelkit.testing.checks import assert_gemm_close
from conftest import free_port, serve_cluster

pytestmark = pytest.mark.anyio


async def test_a_worker_killed_mid_gemm_is_survived(anyio_backend: str) -> None:
    served = serve_cluster()  # its own cluster: this test kills a worker of it
    backend = DaskBackend(chunk_bytes=256 << 10)
    try:
        await backend.initialize("dask://" + served.address.removeprefix("tcp://"))
        rng = np.random.default_rng(0)
        a_h = rng.standard_normal((1024, 1024), dtype=np.float32)
        b_h = rng.standard_normal((1024, 1024), dtype=np.float32)
        f, ops = backend.tensor_factory, backend.tensor_ops
        a, b = f.from_host(a_h), f.from_host(b_h)
        await backend.synchronize()  # the inputs are on the workers

        def chain() -> Any:  # a hundred block tasks, under new keys each time
            return ops.matmul(ops.matmul(ops.matmul(a, b), b), b)

        # The reference: the same graph on the same cluster, with no fault. Each output block is
        # one float32 GEMM of whole rows and columns (concatenate=True), and a recomputed block
        # runs the same kernel on the same inputs, so a survived fault changes no bit.
        fault_free = await chain().to_host()
        y = chain()
        pids = await anyio.to_thread.run_sync(lambda: backend.client.run(os.getpid))
        result: dict[str, Any] = {}

        async def read() -> None:
            result["y"] = await y.to_host()

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            # In the middle of it: once a worker is running one of its tasks, that worker dies.
            busy: list[str] = []
            for _ in range(2000):
                processing = await anyio.to_thread.run_sync(backend.client.processing)
                busy = [w for w, keys in processing.items() if keys]
                if busy or "y" in result:
                    break
                await anyio.sleep(0.005)
            assert busy, "the GEMM ended before a worker could be killed"
            assert "y" not in result
            os.kill(pids[busy[0]], signal.SIGKILL)
        np.testing.assert_array_equal(result["y"], fault_free)
        # And both are the product: within the float32 error bound of a chain of three GEMMs of
        # inner length K (Higham, Accuracy and Stability, 3.5): |Y^ - Y| <= ((1 + g)^3 - 1)
        # |A||B||B||B|, g = K u / (1 - K u), u = 2^-24.
        k, u = a_h.shape[1], float(np.finfo(np.float32).eps) / 2
        g = k * u / (1 - k * u)
        a64, b64 = a_h.astype(np.float64), b_h.astype(np.float64)
        want = ((a64 @ b64) @ b64) @ b64
        bound = ((1 + g) ** 3 - 1) * (((np.abs(a64) @ np.abs(b64)) @ np.abs(b64)) @ np.abs(b64))
        error = np.abs(result["y"].astype(np.float64) - want)
        assert (error <= bound).all(), f"max error / bound {(error / bound).max():.3g}"
        # The nanny restarted the worker: the cluster is whole again.
        for _ in range(300):
            if len(await backend.workers()) == 2:
                break
            await anyio.sleep(0.2)
        assert len(await backend.workers()) == 2
    finally:
        with anyio.CancelScope(shield=True):
            await backend.shutdown()
        served.close()


def _dask_command() -> list[str]:
    exe = Path(sys.executable).with_name("dask")
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-m", "dask"]


class Remote:
    """``dask scheduler`` and ``dask worker`` processes, as an operator starts them."""

    def __init__(self, port: int, log: Path) -> None:
        self.port = port
        self.log = log
        self.scheduler: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def start_scheduler(self) -> None:
        out = open(self.log, "ab")  # noqa: SIM115 - the process writes it until it ends
        self.scheduler = subprocess.Popen(
            [
                *_dask_command(),
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--no-dashboard",
            ],
            stdout=out,
            stderr=out,
        )

    def start_worker(self) -> None:
        out = open(self.log, "ab")  # noqa: SIM115
        self.workers.append(
            subprocess.Popen(
                [
                    *_dask_command(),
                    "worker",
                    self.address,
                    "--nthreads",
                    "1",
                    "--no-dashboard",
                    "--memory-limit",
                    "1GiB",
                ],
                stdout=out,
                stderr=out,
            )
        )

    def wait_for_workers(self, n: int, timeout: float = 90) -> None:
        from distributed import Client

        deadline = time.monotonic() + timeout
        while True:
            try:
                with Client(self.address, timeout=5, set_as_default=False) as c:
                    c.wait_for_workers(n, timeout=max(1.0, deadline - time.monotonic()))
                    return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(self.log.read_text()[-3000:]) from None
                time.sleep(0.5)

    def kill_scheduler(self) -> None:
        assert self.scheduler is not None
        self.scheduler.kill()
        self.scheduler.wait()

    def stop(self) -> None:
        for p in [*self.workers, self.scheduler]:
            if p is not None and p.poll() is None:
                p.terminate()
        for p in [*self.workers, self.scheduler]:
            if p is not None:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[Remote]:
    r = Remote(free_port(), tmp_path / "dask.log")
    try:
        r.start_scheduler()
        r.start_worker()
        r.start_worker()
        r.wait_for_workers(2)
        yield r
    finally:
        r.stop()


async def test_the_real_dask_commands_and_a_lost_scheduler(
    remote: Remote, anyio_backend: str
) -> None:
    backend = DaskBackend(chunk_bytes=4096)
    await backend.initialize(f"dask://127.0.0.1:{remote.port}")
    try:
        assert len(await backend.workers()) == 2
        f, ops = backend.tensor_factory, backend.tensor_ops
        x_h = np.random.default_rng(3).standard_normal((64, 64), dtype=np.float32)
        x = f.from_host(x_h)
        assert_gemm_close(await ops.matmul(x, x).to_host(), x_h, x_h)

        remote.kill_scheduler()
        error: DeviceError | None = None
        for _ in range(600):  # the client notices the closed connection within moments
            try:
                await ops.add(x, 1.0).to_host()
            except DeviceError as exc:
                error = exc
                break
            await anyio.sleep(0.2)
        assert error is not None, "the lost scheduler went unnoticed"
        assert "scheduler" in str(error)
        assert backend.poisoned
        with pytest.raises(ContextPoisonedError, match="recover"):
            ops.add(x, 1.0)

        remote.start_scheduler()
        remote.start_worker()
        await anyio.to_thread.run_sync(lambda: remote.wait_for_workers(1))
        await backend.recover()
        assert not backend.poisoned
        with pytest.raises(StaleHandleError):
            ops.add(x, 1.0)  # its chunks went with the old scheduler
        y = f.from_host(x_h)
        assert_close(await ops.mul(y, 2.0).to_host(), x_h * 2, rtol=1e-6, atol=0)
    finally:
        with anyio.CancelScope(shield=True):
            await backend.shutdown()
