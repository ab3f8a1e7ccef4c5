"""Graph capture on the CUDA backend without a GPU, over the stand-in for CuPy (``fake_cupy``,
whose work runs at once on NumPy): the capture's closures are captured into a CUDA graph on the
submission thread, a replay is one ``Graph.launch`` there, and a capture CUDA refuses falls back
to replaying the calls, with the right numbers.

The stand-in refuses CuPy's cuBLAS calls (``cupy.matmul`` and the like) while a stream captures,
with CuPy's own NotImplementedError, as CuPy 13/14 does; the capture's GEMMs must therefore go to
cuBLAS through ``accelkit_cuda.blas`` (here the stand-in's cuBLAS, ``fake_cupy.Cublas``, which
computes them on the host). Whether a real CUDA graph computes the right numbers is for
``test_gpu.py`` (skipped without a GPU: unverified here)."""

from __future__ import annotations

import importlib
import threading
from typing import Any

import fake_cupy
import numpy as np
import pytest
import test_offloop
from test_offloop import Plugin, _open

from accelkit.errors import StaleHandleError
from accelkit.testing.graphs import decode_step, make_decode_step

pytestmark = pytest.mark.anyio

#: The plugin's modules over the stand-in (test_offloop's fixture, found here by its name).
plugin = test_offloop.plugin


def _calls(name: str) -> list[int]:
    return [ident for n, ident in fake_cupy.CALLS if n == name]


@pytest.fixture
def cublas(plugin: Plugin, monkeypatch: pytest.MonkeyPatch) -> fake_cupy.Cublas:
    """The stand-in's cuBLAS, as accelkit_cuda.blas finds the library CuPy loaded."""
    lib = fake_cupy.Cublas()
    monkeypatch.setattr(importlib.import_module("accelkit_cuda.blas"), "_cublas", lib)
    return lib


def _gemms(lib: fake_cupy.Cublas) -> list[tuple[str, tuple[Any, ...]]]:
    return [c for c in lib.calls if c[0].startswith("cublasGemm")]


async def test_a_capture_becomes_one_cuda_graph_launch(
    plugin: Plugin, cublas: fake_cupy.Cublas
) -> None:
    backend = await _open(plugin)
    try:
        step = make_decode_step(backend)
        await backend.synchronize()
        eager = len(_gemms(cublas))  # initialize's warm-up GEMMs (cuBLAS's eager route too)
        async with backend.capture() as graph:
            y = decode_step(backend, step)
        assert graph.kind == "cuda-graph"  # H100, CuPy 14.2: "calls" (CuPy refused cuBLAS)
        thread = backend.thread.ident
        assert _calls("Stream.begin_capture") == [thread]
        assert _calls("Stream.end_capture") == [thread]
        assert not fake_cupy.CAPTURING
        # The step's two GEMMs, captured through cuBLAS itself: each after the capture's stream
        # and a workspace were set on the handle (a cublasSetStream resets the workspace).
        # the block's own run and the capture: both on cuBLAS (the eager route too)
        assert len(_gemms(cublas)) - eager == 2 * 2
        assert set(_calls("cublasGemmEx")) == {thread}
        names = [name for name, _ in cublas.calls]
        for i, name in enumerate(names):
            if name == "cublasGemmEx":
                assert names[i - 3 : i] == [
                    "cublasSetStream", "cublasSetWorkspace", "cublasSetPointerMode",
                ]  # fmt: skip
        for _ in range(3):
            graph.replay()
        await y.to_host()
        assert _calls("Graph.launch") == [thread] * 3
        assert threading.get_ident() not in {ident for _, ident in fake_cupy.CALLS}
    finally:
        await backend.shutdown()


async def test_captured_tensor_ops_compute_the_right_numbers(
    plugin: Plugin, cublas: fake_cupy.Cublas
) -> None:
    """bench_core's transformer-block ops that TensorOps serves on CuPy (matmul, a batched
    matmul of a transposed view, linear with a bias, layer_norm, softmax, tanh-GELU, a
    reduction, add) in one capture: a CUDA graph whose GEMMs ran on cuBLAS. The stand-in ran
    the capture's closures (its graph's nodes) again over the same tensors, so the outputs hold
    what the captured work computed."""
    backend = await _open(plugin)
    try:
        rng = np.random.default_rng(5)
        h = {
            "x": rng.standard_normal((2, 3, 8)), "w": rng.standard_normal((8, 8)),
            "b": rng.standard_normal(8), "g": rng.uniform(0.5, 1.5, 8),
            "q": rng.standard_normal((2, 2, 3, 4)), "k": rng.standard_normal((2, 2, 3, 4)),
        }  # fmt: skip
        h = {name: v.astype(np.float32) for name, v in h.items()}
        f, ops = backend.tensor_factory, backend.tensor_ops
        t = {name: f.from_host(v) for name, v in h.items()}
        await backend.synchronize()
        eager = len(_gemms(cublas))  # initialize's warm-up GEMMs (cuBLAS's eager route too)
        async with backend.capture() as graph:
            y = ops.layer_norm(t["x"], t["g"], t["b"], 1e-5)
            y = ops.gelu(ops.linear(y, t["w"], t["b"]), approximate="tanh")
            y = ops.add(t["x"], ops.matmul(y, t["w"]))
            s = ops.softmax(ops.matmul(t["q"], ops.transpose(t["k"], -1, -2)), axis=-1)
            total = ops.reduce("sum", s, axis=-1)
        assert graph.kind == "cuda-graph"
        # the block's own run and the capture on cuBLAS, but for q @ k^T in the own run: a
        # batched b that is transposed is not a layout blas.plan takes (cupy.matmul serves;
        # the capture copies it contiguous first)
        assert len(_gemms(cublas)) - eager == 2 + 3
        got_y, got_s, got_total = await y.to_host(), await s.to_host(), await total.to_host()
    finally:
        await backend.shutdown()
    x = h["x"].astype(np.float64)
    ln = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    z = (ln * h["g"] + h["b"]) @ h["w"].T + h["b"]
    gelu = 0.5 * z * (1 + np.tanh(0.7978845608028654 * (z + 0.044715 * z**3)))
    want_y = x + gelu @ h["w"]
    scores = h["q"].astype(np.float64) @ np.swapaxes(h["k"], -1, -2)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    want_s = e / e.sum(-1, keepdims=True)
    tol = 64 * 8 * float(np.finfo(np.float32).eps)
    np.testing.assert_allclose(got_y, want_y, rtol=tol, atol=tol)
    np.testing.assert_allclose(got_s, want_s, rtol=tol, atol=tol)
    np.testing.assert_allclose(got_total, want_s.sum(-1), rtol=tol, atol=tol)


async def test_without_cublas_a_capture_replays_its_calls(plugin: Plugin) -> None:
    """No cuBLAS library found (as on a machine where CuPy's is not reachable by ctypes): CuPy
    refuses the GEMM during the capture, and the calls are replayed (with the right numbers)."""
    backend = await _open(plugin)
    try:
        f, ops = backend.tensor_factory, backend.tensor_ops
        w_host = np.arange(16, dtype=np.float32).reshape(4, 4) / 8
        x, w = f.ones((2, 4)), f.from_host(w_host)
        async with backend.capture() as graph:
            y = ops.matmul(x, w)
        assert graph.kind == "calls"
        await graph.write(x, np.full((2, 4), 2, np.float32))
        graph.replay()
        np.testing.assert_allclose(await y.to_host(), np.full((2, 4), 2) @ w_host, rtol=1e-6)
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


async def test_a_free_on_the_submission_thread_waits_for_the_capture_to_end(
    plugin: Plugin,
) -> None:
    """A ``cudaFree`` may synchronize the device, which invalidates a capture: a block freed on
    the submission thread while it captures is freed when the capture ends."""
    from accelkit_cuda.capturing import capturing

    backend = await _open(plugin)
    try:
        blocks = backend._memory.blocks
        block = await backend.thread.call(lambda: blocks.alloc(1024))  # cudaMalloc in place
        ptr = block.ptr
        assert ptr in fake_cupy.MALLOCED

        def free_while_capturing() -> tuple[bool, bool]:
            with capturing(1):
                blocks.free(block)
                during = ptr in fake_cupy.FREED
            return during, ptr in fake_cupy.FREED

        during, after = await backend.thread.call(free_while_capturing)
        assert (during, after) == (False, True)
    finally:
        await backend.shutdown()


async def test_a_captured_transformer_block_is_one_cuda_graph(
    plugin: Plugin, cublas: fake_cupy.Cublas
) -> None:
    """bench_core's transformer block (benchmarks/bench_cuda.py's captured figure, "calls" on
    the H100): every op of it is captured, its six projections on cuBLAS. Its numbers need
    the fused attention kernel, which the stand-in does not run (test_gpu.py checks them)."""
    from accelkit.workloads import BlockConfig, block_weights, transformer_block, upload_weights

    backend = await _open(plugin)
    try:
        cfg = BlockConfig(batch=1, seq=4, width=16, heads=2)
        w = upload_weights(backend, block_weights(cfg))
        x = backend.tensor_factory.from_host(np.ones((1, 4, 16), np.float32))
        await backend.synchronize()
        eager = len(_gemms(cublas))  # initialize's warm-up GEMMs (cuBLAS's eager route too)
        async with backend.capture() as graph:
            transformer_block(backend, x, w, cfg)
        assert graph.kind == "cuda-graph"
        # the block's own run and the capture: both on cuBLAS (the eager route too)
        assert len(_gemms(cublas)) - eager == 2 * 6
    finally:
        await backend.shutdown()


async def test_a_captured_linear_takes_its_bias_in_cublaslts_epilogue(
    plugin: Plugin, cublas: fake_cupy.Cublas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With cuBLASLt at hand a linear's bias is its epilogue inside a capture too: one
    ``cublasLtMatmul`` on the capturing stream, and the captured numbers are float64
    NumPy's."""
    lt = fake_cupy.CublasLt()
    monkeypatch.setattr(importlib.import_module("accelkit_cuda.blaslt"), "_lt", lt)
    capturing = importlib.import_module("accelkit_cuda.capturing")
    captured: list[int | None] = []
    active = capturing.active

    def seen() -> int | None:
        stream = active()
        if stream is not None:
            captured.append(stream)
        return stream

    monkeypatch.setattr(capturing, "active", seen)
    backend = await _open(plugin)
    try:
        rng = np.random.default_rng(8)
        x_h = rng.standard_normal((2, 3, 8)).astype(np.float32)
        w_h, b_h = rng.standard_normal((6, 8), np.float32), rng.standard_normal(6, np.float32)
        f, ops = backend.tensor_factory, backend.tensor_ops
        x, w, b = f.from_host(x_h), f.from_host(w_h), f.from_host(b_h)
        await backend.synchronize()
        lt.calls.clear()
        gemms = len(_gemms(cublas))
        async with backend.capture() as graph:
            y = ops.linear(x, w, b)
        assert graph.kind == "cuda-graph"
        got = await y.to_host()
    finally:
        await backend.shutdown()
    launches = [args for name, args in lt.calls if name == "cublasLtMatmul"]
    # the block's own run and the capture, the latter on the capturing stream
    assert len(launches) == 2
    # (one call asked for the capturing stream, and launched on it: the capture's)
    assert len(captured) == 1
    assert launches[1][-1] == captured[0]
    assert len(_gemms(cublas)) == gemms  # no cuBLAS GEMM, no bias kernel
    assert "launch eb_add_f32" not in [name for name, _ in fake_cupy.CALLS]
    want = x_h.astype(np.float64) @ w_h.astype(np.float64).T + b_h
    eps = float(np.finfo(np.float32).eps)
    mag = np.abs(x_h) @ np.abs(w_h).T + np.abs(b_h)
    assert np.all(np.abs(got - want) <= 9 * eps * mag)


async def test_a_cuda_graph_waits_for_the_writers_of_what_it_updates_in_place(
    plugin: Plugin, cublas: fake_cupy.Cublas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adam_update reads and writes param, m and v: another stream's write of them must come
    before the graph's launch, as it comes before an eager adam_update's."""
    backend = await _open(plugin)
    try:
        f, ops = backend.tensor_factory, backend.tensor_ops
        p, g, m, v = (f.from_host(np.ones(8, np.float32)) for _ in range(4))
        async with backend.capture() as graph:
            ops.adam_update(p, g, m, v, lr=0.1, step=1)
        assert graph.kind == "cuda-graph"
        s2 = backend.create_stream()
        with backend.use_stream(s2):  # another stream updates them in place
            ops.adam_update(p, g, m, v, lr=0.1, step=2)
        writes = {(t._stream, t._seq) for t in (p, m, v)}
        assert {s for s, _ in writes} == {s2}
        after: list[list[tuple[Any, int]]] = []
        stream_type = type(graph.stream)
        real = stream_type.submit

        def spy(self: Any, fn: Any, keepalive: Any = (), deps: Any = (), *a: Any) -> int:
            if self is graph.stream and a and a[0] == "a CUDA graph":
                after.append(list(deps))
            return real(self, fn, keepalive, deps, *a)  # type: ignore[no-any-return]

        monkeypatch.setattr(stream_type, "submit", spy)
        graph.replay()
        assert len(after) == 1
        assert writes <= set(after[0])
    finally:
        await backend.shutdown()


async def test_a_cuda_graph_whose_tensor_was_freed_is_not_launched(
    plugin: Plugin, cublas: fake_cupy.Cublas
) -> None:
    """A CUDA graph keeps its tensors' addresses: once one is freed (its block reused), a
    launch would write into another tensor. The replay is refused before anything launches."""
    backend = await _open(plugin)
    try:
        f, ops, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager
        x = f.from_host(np.arange(64, dtype=np.float32))
        async with backend.capture() as graph:
            y = ops.add(x, x)
        assert graph.kind == "cuda-graph"
        mm.free(y)
        z = f.from_host(np.full(64, 7, np.float32))
        with pytest.raises(StaleHandleError, match="was freed after the capture"):
            graph.replay()
        await z.to_host()
        assert _calls("Graph.launch") == []
        np.testing.assert_array_equal(await z.to_host(), np.full(64, 7, np.float32))
    finally:
        await backend.shutdown()


async def test_another_threads_submission_while_the_graph_is_built_runs_as_usual(
    plugin: Plugin, cublas: fake_cupy.Cublas
) -> None:
    """Building the CUDA graph re-issues the recorded calls with the stream's submit shadowed
    to collect their closures. A submission another thread makes to that stream meanwhile (a
    worker's copy for another task) is queued and runs; it is not taken into the graph."""
    backend = await _open(plugin)
    try:
        f, ops = backend.tensor_factory, backend.tensor_ops
        x = f.from_host(np.arange(8, dtype=np.float32))
        stream = backend.default_stream
        kernels: Any = ops.kernels
        real = kernels.binary
        ran: list[int] = []
        calls = [0]
        before: list[int] = []
        seqs: list[int] = []

        def binary(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] == 2:  # the graph's build re-issues it: another thread submits now
                before.append(stream.submitted)
                other = threading.Thread(
                    target=lambda: seqs.append(stream.submit(lambda: ran.append(1)))
                )
                other.start()
                other.join()
            return real(*args, **kwargs)

        kernels.binary = binary  # wrapped by the capture, which removes both when it ends
        try:
            async with backend.capture() as graph:
                y = ops.add(x, x)
        finally:
            kernels.__dict__.pop("binary", None)
        assert calls[0] == 2
        assert graph.kind == "cuda-graph"
        assert seqs[0] == before[0] + 1  # a position of its own, which an await waits for
        await stream.wait_for(seqs[0])
        assert ran == [1]
        graph.replay()
        np.testing.assert_array_equal(await y.to_host(), 2 * np.arange(8, dtype=np.float32))
        assert ran == [1]  # not part of the graph
    finally:
        await backend.shutdown()


async def test_building_a_graph_adds_no_check_of_a_flag_it_never_copied(
    plugin: Plugin, cublas: fake_cupy.Cublas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An embedding checks its indices on the device: a flag copied to pinned host memory,
    read by a check at its position. Building the graph re-issues the launch to collect it;
    that must add no check: the graph's copy of the flag runs at each replay, so before then
    the host buffer holds whatever it held, and the position is an old one."""
    backend = await _open(plugin)
    try:
        f, ops = backend.tensor_factory, backend.tensor_ops
        weight = f.from_host(np.arange(12, dtype=np.float32).reshape(4, 3))
        indices = f.from_host(np.array([3, 0, 2], np.int64))
        stream = backend.default_stream
        added: list[int] = []
        real = stream.add_check

        def add_check(seq: int, check: Any) -> None:
            added.append(seq)
            real(seq, check)

        monkeypatch.setattr(stream, "add_check", add_check)
        async with backend.capture() as graph:
            y = ops.embedding(indices, weight)
        assert graph.kind == "cuda-graph"
        assert len(added) == 1  # the capture's own run, not the graph's build
        assert added[0] == y._seq
        want = np.arange(12, dtype=np.float32).reshape(4, 3)[[3, 0, 2]]
        np.testing.assert_array_equal(await y.to_host(), want)
    finally:
        await backend.shutdown()
