"""Heavy blocks on the workers' own accelkit backend (``worker_backend=``): here the example
backend stands in for a worker's GPU backend (CUDA on a GPU worker), which no CI machine has."""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest
from accelkit_dask import worker
from accelkit_dask.backend import DaskBackend

from accelkit.testing.checks import assert_gemm_close

pytestmark = pytest.mark.anyio


async def _stats(backend: DaskBackend) -> list[dict[str, Any]]:
    runs = await anyio.to_thread.run_sync(lambda: backend.client.run(worker.stats))
    return list(runs.values())


async def test_heavy_blocks_run_on_the_workers_backend(
    shared_cluster: Any, anyio_backend: str
) -> None:
    pytest.importorskip("accelkit_example", reason="the example backend is not installed")
    device = "dask://" + shared_cluster.address.removeprefix("tcp://")
    backend = DaskBackend(chunk_bytes=4096, worker_backend="example")
    await backend.initialize(device)
    try:
        rng = np.random.default_rng(0)
        a_h = rng.standard_normal((64, 48), dtype=np.float32)
        b_h = rng.standard_normal((48, 40), dtype=np.float32)
        f, ops = backend.tensor_factory, backend.tensor_ops
        got = await ops.matmul(f.from_host(a_h), f.from_host(b_h)).to_host()
        assert_gemm_close(got, a_h, b_h)
        x_h = rng.standard_normal((2, 3, 10, 10), dtype=np.float32)
        w_h = rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
        conv = await ops.conv2d(f.from_host(x_h), f.from_host(w_h), padding=1).to_host()
        assert conv.shape == (2, 4, 10, 10)
        stats = await _stats(backend)
        assert {s["backend"] for s in stats if s["blocks"]} == {"example"}
        assert sum(s["blocks"].get("matmul", 0) for s in stats) > 1  # several blocks
        assert sum(s["blocks"].get("conv2d", 0) for s in stats) >= 1
    finally:
        await backend.shutdown()
    # Unregistered at shutdown: the shared cluster's workers are back on their CPU kernels.
    plain = DaskBackend()
    await plain.initialize(device)
    try:
        assert {s["backend"] for s in await _stats(plain)} == {"cpu"}
    finally:
        await plain.shutdown()


async def test_a_worker_backend_that_cannot_open_falls_back_to_the_cpu(
    shared_cluster: Any, anyio_backend: str
) -> None:
    device = "dask://" + shared_cluster.address.removeprefix("tcp://")
    backend = DaskBackend(worker_backend="no-such-backend")
    await backend.initialize(device)
    try:
        a_h = np.arange(12, dtype=np.float32).reshape(3, 4)
        a = backend.tensor_factory.from_host(a_h)
        got = await backend.tensor_ops.matmul(a, backend.tensor_ops.transpose(a)).to_host()
        np.testing.assert_array_equal(got, a_h @ a_h.T)
        failed = [s["failed"] for s in await _stats(backend) if s["failed"]]
        assert failed
        assert "no-such-backend" in failed[0]
    finally:
        await backend.shutdown()
