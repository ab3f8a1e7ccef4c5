"""The caller-thread path of a small op, over the stand-in for CuPy (no GPU): what the raw
elementwise launch keeps per element count, what its closure keeps alive, and the submission
thread's and the stream's wake-ups (notified only when they wait).

The stand-in (``fake_cupy``) runs each raw kernel as NumPy over the element count it is passed,
so a launch with another tensor's count or grid computes the wrong values or is caught here.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

import fake_cupy
import numpy as np
import pytest
import test_offloop
from accelkit_cuda.fast_elementwise import grid_for

pytestmark = pytest.mark.anyio

#: The stand-in's plugin, imported over ``fake_cupy`` (test_offloop's fixture).
plugin = test_offloop.plugin
Plugin = test_offloop.Plugin


def _record_launches(
    monkeypatch: pytest.MonkeyPatch, expect: list[int]
) -> list[tuple[str, Any, int]]:
    """Record each raw launch's (kernel name, grid, element count), then run it as before when
    its count is ``expect[0]`` (the element count of the tensors of the op now submitted): a
    launch over another count is recorded and not run (it would write past the blocks)."""
    launches: list[tuple[str, Any, int]] = []
    run = fake_cupy.Function.__call__

    def call(self: Any, grid: Any, block: Any, args: Any, **kwargs: Any) -> None:
        if self.name.startswith("ew_"):
            launches.append((self.name, grid, int(args[3])))
            if int(args[3]) != expect[0]:
                return
        run(self, grid, block, args, **kwargs)

    monkeypatch.setattr(fake_cupy.Function, "__call__", call)
    return launches


@pytest.mark.parametrize("table", [256, 2], ids=["kept", "table-starts-over"])
async def test_raw_launch_config_follows_the_element_count(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch, table: int
) -> None:
    # Each element count gets its own grid and count; with a table of 2 the kept
    # configurations are dropped and made again (a stale entry would launch over another
    # tensor's count: wrong values, or a grid that does not cover the tensor).
    tk = importlib.import_module("accelkit_cuda.tensor_kernels")
    monkeypatch.setattr(tk, "_RAW_CONFIGS", table)
    expect = [0]
    launches = _record_launches(monkeypatch, expect)
    backend = await test_offloop._open(plugin)
    f, ops = backend.tensor_factory, backend.tensor_ops
    await ops.kernels.fast.load()
    rng = np.random.default_rng(0)
    cases = [((64, 64), "float32"), ((3, 5), "float32"), ((1,), "float64"), ((64, 64), "float64"),
             ((700, 1000), "float32"), ((3, 5), "float64"), ((64, 64), "float32")]  # fmt: skip
    try:
        for shape, dtype in cases:
            a_h = rng.standard_normal(shape).astype(dtype)
            b_h = rng.standard_normal(shape).astype(dtype)
            a, b = f.from_host(a_h), f.from_host(b_h)
            expect[0] = a_h.size
            got_add = await ops.add(a, b).to_host()
            got_mul = await ops.mul(a, b).to_host()
            np.testing.assert_array_equal(got_add, a_h + b_h)
            np.testing.assert_array_equal(got_mul, a_h * b_h)
    finally:
        await backend.shutdown()
    sfx = {"float32": "f32", "float64": "f64"}
    want = [
        (f"ew_{op}_{sfx[dtype]}", grid_for(int(np.prod(shape))), int(np.prod(shape)))
        for shape, dtype in cases
        for op in ("add", "mul")
    ]
    assert launches == want
    assert grid_for(700_000) != grid_for(4096) != grid_for(15)  # the cases tell grids apart


async def test_a_dropped_output_is_reused_while_the_launches_lag(plugin: Plugin) -> None:
    # The raw launch's closure holds the blocks, not the tensors: an output dropped while its
    # launch is still queued goes back to the pool, and the next add takes its block (one
    # stream: stream order puts the block's next writer after this launch). Holding the
    # tensors, each of these adds would allocate a block of its own.
    backend = await test_offloop._open(plugin)
    f, ops = backend.tensor_factory, backend.tensor_ops
    await ops.kernels.fast.load()
    a_h = np.arange(4096, dtype=np.float32).reshape(64, 64)
    a, b = f.from_host(a_h), f.from_host(a_h * 2)
    gate = threading.Event()
    try:
        await backend.synchronize()
        mallocs = sum(name == "runtime.malloc" for name, _ in fake_cupy.CALLS)
        backend.thread.submit(lambda: gate.wait(30))  # the launches lag
        for _ in range(20):
            out = ops.add(a, b)
        assert not backend.default_stream.query()  # nothing has run yet
        gate.set()
        got = await out.to_host()
        await backend.synchronize()
        new = sum(name == "runtime.malloc" for name, _ in fake_cupy.CALLS) - mallocs
    finally:
        gate.set()
        await backend.shutdown()
    np.testing.assert_array_equal(got, a_h * 3)
    assert new <= 2, f"{new} blocks allocated for 20 adds whose outputs were dropped"


async def test_the_threads_wake_for_work_after_they_idled(plugin: Plugin) -> None:
    # The submission thread and the completer are notified only while they wait: work queued
    # after each has gone idle (from the loop and from another thread), and a blocking wait
    # from another thread, all complete.
    backend = await test_offloop._open(plugin)
    f, ops = backend.tensor_factory, backend.tensor_ops
    x_h = np.full((8, 8), 2.0, np.float32)
    try:
        x = f.from_host(x_h)
        for step in range(5):
            await backend.synchronize()
            thread, stream = backend.thread, backend.default_stream
            for _ in range(1000):  # until both threads wait again (10 s at most)
                if thread._bell.idle and stream._work_bell.idle:
                    break
                threading.Event().wait(0.01)
            assert thread._bell.idle
            assert stream._work_bell.idle
            x = ops.add(x, x)
            box: list[Any] = []
            other = threading.Thread(target=lambda y=x, got=box: got.append(y.numpy()))  # blocks
            other.start()
            other.join(10)
            assert not other.is_alive()
            np.testing.assert_array_equal(box[0], x_h * 2 ** (step + 1))
        np.testing.assert_array_equal(await x.to_host(), x_h * 32)
    finally:
        await backend.shutdown()


async def test_allocation_prunes_only_what_needs_it(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An allocation prunes the streams (five calls) only for a poisoned backend or frees
    # deferred until other streams pass a point: 20 adds on one stream prune nothing, and a
    # tensor freed with two streams is still taken back by the next allocation once its
    # events completed (its block reused: no new cudaMalloc).
    backend = await test_offloop._open(plugin)
    f, ops, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager
    await ops.kernels.fast.load()
    prunes = [0]
    prune = type(backend).prune_streams

    def counted(self: Any) -> None:
        prunes[0] += 1
        prune(self)

    monkeypatch.setattr(type(backend), "prune_streams", counted)
    a_h = np.arange(4096, dtype=np.float32).reshape(64, 64)
    try:
        a, b = f.from_host(a_h), f.from_host(a_h * 2)
        await backend.synchronize()
        prunes[0] = 0
        for _ in range(20):
            out = ops.add(a, b)
        np.testing.assert_array_equal(await out.to_host(), a_h * 3)
        assert prunes[0] == 0

        backend.create_stream()  # two streams: a free waits for both to pass its point
        big = f.from_host(np.ones((1024, 1024), np.float32))
        await backend.synchronize()
        mm.free(big)
        assert backend.deferred_pending  # the block waits for the streams' events
        await backend.synchronize()  # (its events complete; synchronize prunes, too)
        big = f.from_host(np.ones((1024, 1024), np.float32))
        mm.free(big)
        assert backend.deferred_pending
        await backend.default_stream.synchronize()  # completes, without pruning
        for stream in backend.streams:
            await stream.synchronize()
        mallocs = sum(name == "runtime.malloc" for name, _ in fake_cupy.CALLS)
        prunes[0] = 0
        again = f.empty((1024, 1024))  # prunes: the deferred free returns, its block reused
        assert prunes[0] == 1
        assert not backend.deferred_pending
        assert sum(name == "runtime.malloc" for name, _ in fake_cupy.CALLS) == mallocs
        del again
    finally:
        await backend.shutdown()


async def test_a_dtype_this_cupy_cannot_hold_is_refused_before_the_pool_is_asked(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CuPy without bf16 (before CuPy 14, or without ml_dtypes): a new bf16 tensor, from the
    factory or as an op's output, raises InvalidArgumentError saying why, before the pool is
    asked: nothing is reserved, no cudaMalloc queued, and a limit the request would pass does
    not turn the refusal into an OutOfMemoryError. The backend's supported dtypes are made to
    claim bf16, so that the front end's own dtype check lets it through to the backend's."""
    from accelkit import DType, InvalidArgumentError, MemoryPoolConfig

    submit = importlib.import_module("accelkit_cuda.submit")
    held = {k: v for k, v in submit._NUMPY.items() if k is not DType.BF16}
    backend = await test_offloop._open(plugin)
    try:
        f, ops, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager
        x = f.from_host(np.ones(8, np.float32))
        await x.to_host()
        before = mm.memory_info()
        thread = backend.thread
        queued = thread.queued
        monkeypatch.setattr(submit, "_NUMPY", held)
        backend.supported_dtypes = backend.supported_dtypes | {DType.BF16}
        with pytest.raises(InvalidArgumentError, match="holds no bf16"):
            f.empty((1 << 20,), DType.BF16)
        with pytest.raises(InvalidArgumentError, match="holds no bf16"):
            ops.cast(x, DType.BF16)
        after = mm.memory_info()
        assert (after.used, after.reserved) == (before.used, before.reserved)
        assert thread.queued == queued  # no cudaMalloc (nor anything else) queued
        mm.configure_pool(MemoryPoolConfig(limit_bytes=1 << 20))
        with pytest.raises(InvalidArgumentError, match="holds no bf16"):
            f.empty((1 << 20,), DType.BF16)  # 2 MiB: over the limit, refused for its dtype
        y = ops.add(x, x)  # f32 is still held
        np.testing.assert_array_equal(await y.to_host(), np.full(8, 2, np.float32))
    finally:
        await backend.shutdown()
