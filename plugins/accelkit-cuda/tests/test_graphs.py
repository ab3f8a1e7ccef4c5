"""Graph capture on the CUDA backend without a GPU, over the stand-in for CuPy (``fake_cupy``,
whose work runs at once on NumPy): the capture's closures are captured into a CUDA graph on the
submission thread, a replay is one ``Graph.launch`` there, and a capture CUDA refuses falls back
to replaying the calls, with the right numbers. Whether a real CUDA graph computes the right
numbers is for ``test_gpu.py`` (skipped without a GPU: unverified here)."""

from __future__ import annotations

import threading

import fake_cupy
import numpy as np
import pytest
import test_offloop
from test_offloop import Plugin, _open

from accelkit.testing.graphs import decode_step, make_decode_step

pytestmark = pytest.mark.anyio

#: The plugin's modules over the stand-in (test_offloop's fixture, found here by its name).
plugin = test_offloop.plugin


def _calls(name: str) -> list[int]:
    return [ident for n, ident in fake_cupy.CALLS if n == name]


async def test_a_capture_becomes_one_cuda_graph_launch(plugin: Plugin) -> None:
    backend = await _open(plugin)
    try:
        step = make_decode_step(backend)
        async with backend.capture() as graph:
            y = decode_step(backend, step)
        assert graph.kind == "cuda-graph"
        thread = backend.thread.ident
        assert _calls("Stream.begin_capture") == [thread]
        assert _calls("Stream.end_capture") == [thread]
        assert not fake_cupy.CAPTURING
        for _ in range(3):
            graph.replay()
        await y.to_host()
        assert _calls("Graph.launch") == [thread] * 3
        assert threading.get_ident() not in {ident for _, ident in fake_cupy.CALLS}
    finally:
        await backend.shutdown()


async def test_a_capture_cuda_refuses_replays_its_calls(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fake_cupy, "FAIL_CAPTURE", True)
    backend = await _open(plugin)
    try:
        # TensorOps only: the stand-in's fused NVRTC kernels are no-op launches.
        rng = np.random.default_rng(3)
        w_host = rng.standard_normal((8, 8)).astype(np.float32)
        f, ops = backend.tensor_factory, backend.tensor_ops
        x, w = f.zeros((2, 8)), f.from_host(w_host)
        async with backend.capture() as graph:
            y = ops.add(ops.matmul(x, w), x)
        assert graph.kind == "calls"
        assert not fake_cupy.CAPTURING
        x_host = rng.standard_normal((2, 8)).astype(np.float32)
        await graph.write(x, x_host)
        graph.replay()
        tol = 64 * 8 * float(np.finfo(np.float32).eps)
        np.testing.assert_allclose(await y.to_host(), x_host @ w_host + x_host, rtol=tol, atol=tol)
        assert not _calls("Graph.launch")
    finally:
        await backend.shutdown()


async def test_cuda_graphs_can_be_turned_off(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELKIT_CUDA_GRAPHS", "0")
    backend = await _open(plugin)
    try:
        x = backend.tensor_factory.ones((4,))
        async with backend.capture() as graph:
            backend.tensor_ops.add(x, x)
        assert graph.kind == "calls"
        assert not _calls("Stream.begin_capture")
    finally:
        await backend.shutdown()
