"""Inline launches (``accelkit_cuda.stream.INLINE``), over the stand-in for CuPy (no GPU): a
plain launch is made on the caller's thread only in the submission thread's turn (the thread
idle, nothing queued, the caller's thread on the device's context, few positions in flight),
never before work queued ahead of it; the caller's thread then makes launches, event records
and cuBLAS calls on the submission thread's handle, and nothing else (no allocation, free,
copy, module load, compile or synchronization); the end of inline positions is marked when
someone waits, from any path; an inline launch's error is raised by its await. Whether it pays
on a GPU is ``benchmarks/bench_cuda.py``'s to say (unmeasured when written)."""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import fake_cupy
import numpy as np
import pytest
import test_graphs
import test_offloop
from test_offloop import Plugin, _open

from accelkit.errors import DeviceError

pytestmark = pytest.mark.anyio

#: The plugin's modules over the stand-in (test_offloop's fixture, found here by its name), and
#: the stand-in's cuBLAS where the plugin's blas module finds it (test_graphs').
plugin = test_offloop.plugin
cublas = test_graphs.cublas

#: What the caller's thread may call in the submission thread's turn: launches, CuPy's current
#: stream, the end events, the context check, and cuBLAS/cuBLASLt calls on a handle made before.
_ALLOWED_PREFIXES = ("launch ", "cublas", "driver.ctx", "Stream.__", "Event.record", "Event()")
_FORBIDDEN = (
    "runtime.malloc", "runtime.free", "runtime.memcpyAsync", "Module()", "Module.load",
    "alloc_pinned_memory", "Stream.synchronize", "Event.synchronize", "get_cublas_handle",
    "Stream()", "Device.use",
)  # fmt: skip


@pytest.fixture
def inline(plugin: Plugin, monkeypatch: pytest.MonkeyPatch) -> Plugin:
    monkeypatch.setattr(plugin.stream, "INLINE", True)
    return plugin


def _on(thread: int) -> list[str]:
    return sorted({name for name, ident in fake_cupy.CALLS if ident == thread})


def _check_caller_calls(thread: int) -> list[str]:
    names = _on(thread)
    for name in names:
        assert name.startswith(_ALLOWED_PREFIXES), f"{name} on the caller's thread"
        assert name not in _FORBIDDEN
    return names


async def _warm(backend: Any) -> None:
    await backend.tensor_ops.kernels.fast.load()
    await backend.synchronize()


async def _idle(backend: Any) -> None:
    """Until the submission thread waits with nothing queued (a read's last closures, or an
    allocation's, may still be running when the await returns)."""
    thread = backend.thread
    with anyio.fail_after(10):
        while not thread.idle:  # noqa: ASYNC110 - a thread's state
            await anyio.sleep(0.001)


async def _steady(
    backend: Any, a_h: np.ndarray[Any, Any], step: Callable[[Any, Any], Any] | None = None
) -> tuple[Any, Any]:
    """Ready for inline launches: the kernels loaded, ``a_h`` uploaded, ``step(ops, a)`` (an
    add) run and read twice (the blocks it takes are the pool's cached ones from then on), and
    the submission thread idle. Returns the TensorOps and the uploaded tensor."""
    await _warm(backend)
    ops = backend.tensor_ops
    a = backend.tensor_factory.from_host(a_h)
    for _ in range(2):
        await (step(ops, a) if step is not None else ops.add(a, a)).to_host()
    await _idle(backend)
    return ops, a


def _small_block(backend: Any) -> tuple[Any, Any, Any]:
    """A small transformer block's config, weights and input on ``backend``."""
    from accelkit.workloads import BlockConfig, block_weights, upload_weights

    cfg = BlockConfig(batch=1, seq=4, width=16, heads=2)
    w = upload_weights(backend, block_weights(cfg))
    return cfg, w, backend.tensor_factory.from_host(np.ones((1, 4, 16), np.float32))


@contextlib.contextmanager
def _before_launch(hook: Callable[[str], object]) -> Iterator[None]:
    """Within: each launch of the stand-in first calls ``hook(kernel name)`` (which may raise
    instead of launching)."""
    run = fake_cupy.Function.__call__

    def launch(self: Any, grid: Any, block: Any, args: Any, **kwargs: Any) -> None:
        hook(self.name)
        run(self, grid, block, args, **kwargs)

    fake_cupy.Function.__call__ = launch  # type: ignore[method-assign]
    try:
        yield
    finally:
        fake_cupy.Function.__call__ = run  # type: ignore[method-assign]


async def test_plain_launches_are_made_on_the_callers_thread_when_the_thread_is_idle(
    inline: Plugin,
) -> None:
    backend = await _open(inline)
    me = threading.get_ident()
    rng = np.random.default_rng(0)
    a_h = rng.standard_normal((64, 64)).astype(np.float32)
    b_h = rng.standard_normal((64, 64)).astype(np.float32)
    try:
        await _warm(backend)
        f, ops = backend.tensor_factory, backend.tensor_ops
        a, b = f.from_host(a_h), f.from_host(b_h)
        for _ in range(2):  # the blocks, cached from now on
            await ops.exp(ops.mul(ops.add(a, b), b)).to_host()
        stream = backend.default_stream
        before = stream.inline_launches
        fake_cupy.CALLS.clear()
        for _ in range(3):  # the pool's cached blocks serve: no cudaMalloc queued ahead
            await _idle(backend)
            got = await ops.exp(ops.mul(ops.add(a, b), b)).to_host()
            np.testing.assert_allclose(got, np.exp((a_h + b_h) * b_h), rtol=4e-6)
        names = _check_caller_calls(me)
        # the three ops of each round were launched here, each on its own kernel
        assert {"launch ew_add_f32", "launch ew_mul_f32", "launch eu_exp_f32"} <= set(names)
        assert stream.inline_launches - before == 9
    finally:
        await backend.shutdown()


async def test_work_queued_first_runs_first(inline: Plugin) -> None:
    # While the submission thread is busy, or has work queued, a launch is queued behind it
    # (an op that reads a queued op's output must not run before it); once the thread is idle
    # again the caller launches in place.
    backend = await _open(inline)
    a_h = np.arange(4096, dtype=np.float32).reshape(64, 64)
    gate = threading.Event()
    try:
        await _warm(backend)
        f, ops = backend.tensor_factory, backend.tensor_ops
        a, b = f.from_host(a_h), f.from_host(a_h / 7)
        y = z = None
        for _ in range(2):  # the blocks y and z take (and the two they replace), cached
            y = ops.add(a, b)
            z = ops.sub(y, b)
            await z.to_host()
        stream = backend.default_stream
        await _idle(backend)
        before = stream.inline_launches
        backend.thread.submit(lambda: gate.wait(30))
        y = ops.add(a, b)
        z = ops.sub(y, b)  # reads y, queued behind it
        assert stream.inline_launches == before
        assert not stream.query()
        gate.set()
        np.testing.assert_allclose(await z.to_host(), (a_h + a_h / 7) - a_h / 7, rtol=1e-6)
        await _idle(backend)
        y = ops.add(a, b)
        z = ops.sub(y, b)
        assert stream.inline_launches == before + 2
        np.testing.assert_allclose(await z.to_host(), (a_h + a_h / 7) - a_h / 7, rtol=1e-6)
    finally:
        gate.set()
        await backend.shutdown()


async def test_a_wait_marks_the_end_of_inline_positions(inline: Plugin) -> None:
    # Inline positions share an end event recorded when someone waits for them: an await
    # (in the turn, on this thread), a query, a blocking wait on another thread, an event's
    # query, and an await while the submission thread is busy (a closure queued for it).
    backend = await _open(inline)
    a_h = np.ones((8, 8), np.float32)
    gate = threading.Event()
    try:
        await _warm(backend)
        f, ops = backend.tensor_factory, backend.tensor_ops
        a = f.from_host(a_h)
        for _ in range(2):
            y = ops.add(ops.add(a, a), a)
            await y.to_host()
        stream = backend.default_stream
        await _idle(backend)
        y = ops.add(a, a)
        seq = stream.submitted
        assert stream._covered  # no event marks it yet
        assert stream.completed < seq
        with anyio.fail_after(10):
            await stream.wait_for(seq)  # marked now, in the turn
        assert stream.completed >= seq
        assert not stream._covered

        await _idle(backend)
        y = ops.add(y, a)
        seq = stream.submitted
        assert stream._covered
        with anyio.fail_after(10):
            while not stream.query():  # noqa: ASYNC110 - a query marks it too
                await anyio.sleep(0.001)
        assert stream.completed >= seq

        await _idle(backend)
        y = ops.add(y, a)
        seq = stream.submitted
        assert stream._covered
        await anyio.to_thread.run_sync(stream.wait_for_blocking, seq)
        await _idle(backend)
        event_y = ops.add(y, a)
        assert stream._covered
        event = stream.record_event()
        with anyio.fail_after(10):
            while not event.query():  # noqa: ASYNC110 - the query is what is tested
                await anyio.sleep(0.001)

        await _idle(backend)
        y = ops.add(event_y, a)
        seq = stream.submitted
        assert stream._covered
        backend.thread.submit(lambda: gate.wait(30))  # the thread is busy: a closure marks it
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(stream.wait_for, seq)
                await anyio.sleep(0.01)
                assert stream.completed < seq
                gate.set()
        np.testing.assert_array_equal(await y.to_host(), a_h * 6)
    finally:
        gate.set()
        await backend.shutdown()


async def test_an_inline_launch_error_is_raised_by_its_await(inline: Plugin) -> None:
    # A launch that fails on the caller's thread is reported as a queued one is: by the await
    # that covers it, not by the call that submitted it; later work is unaffected.
    backend = await _open(inline)
    a_h = np.ones((8, 8), np.float32)

    def failing(name: str) -> None:
        if name.startswith("ew_mul"):
            raise fake_cupy.CUDARuntimeError(1)  # cudaErrorInvalidValue: not sticky

    try:
        ops, a = await _steady(backend, a_h, lambda ops, a: ops.mul(a, a))
        before = backend.default_stream.inline_launches
        with _before_launch(failing):
            y = ops.mul(a, a)  # returns: the error waits for the await
            assert backend.default_stream.inline_launches == before + 1
            with pytest.raises(DeviceError, match="CUDA error 1"):
                await y.to_host()
            del y  # (its block serves the add below: nothing is allocated, nothing queued)
        await _idle(backend)
        np.testing.assert_array_equal(await ops.add(a, a).to_host(), a_h * 2)
        assert backend.default_stream.inline_launches == before + 2
    finally:
        await backend.shutdown()


async def test_a_caller_on_another_context_queues(inline: Plugin) -> None:
    # The caller's thread has another device's context current: its launches go to the
    # submission thread (a launch needs the kernel's context current); with none current, the
    # device's is made current: cuda:0's stays (what the runtime makes current on a thread's
    # first call), another device's is unset after the launch (the user's CUDA code on that
    # thread finds the runtime's default, not this backend's device).
    backend = await _open(inline)
    a_h = np.ones((8, 8), np.float32)
    stub = fake_cupy._context
    try:
        await _warm(backend)
        f, ops = backend.tensor_factory, backend.tensor_ops
        a = f.from_host(a_h)
        for _ in range(2):
            await ops.add(a, a).to_host()
        stream = backend.default_stream
        await _idle(backend)
        stub.current = fake_cupy.CONTEXT + 1
        before = stream.inline_launches
        np.testing.assert_array_equal(await ops.add(a, a).to_host(), a_h * 2)
        assert stream.inline_launches == before
        assert stub.current == fake_cupy.CONTEXT + 1  # left as it was
        stub.current = 0
        await _idle(backend)
        seen: list[int] = []
        with _before_launch(lambda _name: seen.append(stub.current)):
            y = ops.add(a, a)  # cuda:0: its context stays (the runtime's default anyway)
            np.testing.assert_array_equal(await y.to_host(), a_h * 2)
            assert seen == [fake_cupy.CONTEXT]
            assert stub.current == fake_cupy.CONTEXT
            stub.current = 0
            backend.thread.device_index = 1  # as if cuda:1: its context is lent for the launch
            del y  # (its block serves the next add: no allocation queued ahead of it)
            await _idle(backend)
            y = ops.add(a, a)
            np.testing.assert_array_equal(await y.to_host(), a_h * 2)
            assert seen == [fake_cupy.CONTEXT] * 2
            assert stub.current == 0  # and taken back
        assert stream.inline_launches == before + 2
    finally:
        stub.current = 0
        await backend.shutdown()


async def test_a_deep_stream_queues(inline: Plugin, monkeypatch: pytest.MonkeyPatch) -> None:
    # With INLINE_DEPTH positions in flight, launches are queued (the thread, not the loop's,
    # would block on a driver's full launch queue).
    monkeypatch.setattr(inline.stream, "INLINE_DEPTH", 3)
    backend = await _open(inline)
    a_h = np.ones((8, 8), np.float32)
    try:
        await _warm(backend)
        f, ops = backend.tensor_factory, backend.tensor_ops
        a = f.from_host(a_h)
        for _ in range(2):
            y = ops.add(a, a)
            y = ops.add(y, a)
            await y.to_host()
        y = ops.add(a, a)
        await y.to_host()
        stream = backend.default_stream
        await _idle(backend)
        before = stream.inline_launches
        for _ in range(6):
            y = ops.add(y, a)  # none awaited: the inline ones are not seen complete
        assert stream.inline_launches - before == 3
        np.testing.assert_array_equal(await y.to_host(), a_h * 8)
    finally:
        await backend.shutdown()


async def test_gemms_in_the_turn_use_the_submission_threads_cublas_handle(
    inline: Plugin, cublas: fake_cupy.Cublas
) -> None:
    # A linear is launched in place once the submission thread has made its cuBLAS handle and
    # the stream's workspace (the first GEMM, queued): the caller's thread then makes cuBLAS
    # calls on that handle, and no handle, workspace or plan allocation of its own.
    backend = await _open(inline)
    me = threading.get_ident()
    rng = np.random.default_rng(1)
    x_h = rng.standard_normal((4, 6, 16)).astype(np.float32)
    w_h = rng.standard_normal((12, 16)).astype(np.float32)
    b_h = rng.standard_normal(12).astype(np.float32)
    want = x_h.astype(np.float64) @ w_h.T.astype(np.float64) + b_h
    bound = 17 * np.finfo(np.float32).eps * (np.abs(x_h) @ np.abs(w_h).T + np.abs(b_h))
    try:
        await _warm(backend)
        f, ops = backend.tensor_factory, backend.tensor_ops
        x, w, b = f.from_host(x_h), f.from_host(w_h), f.from_host(b_h)
        fake_cupy.CALLS.clear()
        await ops.linear(x, w, b).to_host()  # finds cuBLAS (CuPy's path)
        await _idle(backend)
        await ops.linear(x, w, b).to_host()  # the raw route, queued: the thread's handle
        stream = backend.default_stream
        await _idle(backend)
        _check_caller_calls(me)  # the first two made none of theirs here
        before = stream.inline_launches
        fake_cupy.CALLS.clear()
        cublas.calls.clear()
        got = await ops.linear(x, w, b).to_host()
        assert stream.inline_launches == before + 1
        assert np.all(np.abs(got - want) <= bound)
        names = _check_caller_calls(me)
        assert any(n.startswith("cublas") for n in names), names
        assert all(c[1][0] == fake_cupy.CUBLAS_HANDLE for c in cublas.calls if c[1])
    finally:
        await backend.shutdown()


async def test_a_graph_is_launched_in_place_once_it_has_run(
    inline: Plugin, cublas: fake_cupy.Cublas
) -> None:
    # A CUDA graph's first launch uploads it (queued); later replays are plain launches.
    backend = await _open(inline)
    me = threading.get_ident()
    a_h = np.arange(64, dtype=np.float32).reshape(8, 8) / 16
    try:
        await _warm(backend)
        f, ops = backend.tensor_factory, backend.tensor_ops
        a = f.from_host(a_h)
        await backend.synchronize()
        async with backend.capture() as graph:
            out = ops.exp(ops.add(a, a))  # a replay writes it again
        assert graph.kind == "cuda-graph"
        await backend.synchronize()
        launches = []
        for _ in range(3):
            await _idle(backend)
            fake_cupy.CALLS.clear()
            graph.replay()
            np.testing.assert_allclose(await out.to_host(), np.exp(a_h * 2), rtol=4e-6)
            launches.append([i for n, i in fake_cupy.CALLS if n == "Graph.launch"])
        assert launches[0] == [backend.thread.ident]
        assert launches[1] == launches[2] == [me]
    finally:
        await backend.shutdown()


@pytest.mark.parametrize(
    ("value", "on", "warned"),
    [
        ("", False, False),
        ("1", True, False),
        ("on", True, False),
        ("0", False, False),
        ("sometimes", False, True),
    ],
)
def test_the_switch_reads_the_environment(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, value: str, on: bool,
    warned: bool,
) -> None:  # fmt: skip
    stream = importlib.import_module("accelkit_cuda.stream")
    monkeypatch.setenv("ACCELKIT_CUDA_INLINE", value)
    with caplog.at_level("WARNING", logger="accelkit.cuda"):
        assert stream._inline() is on
    assert ("ACCELKIT_CUDA_INLINE" in caplog.text) is warned


async def test_a_service_mix_makes_only_plain_launches_on_the_loop_thread(
    inline: Plugin, cublas: fake_cupy.Cublas
) -> None:
    # test_offloop's mix of ops, three times: in the last round (blocks cached, kernels loaded,
    # cuBLAS found) the loop's thread launches in place whatever is a plain launch, and makes
    # no other CUDA call; the rest (CuPy's paths, checked launches, copies) is queued as
    # before; the answers are NumPy's either way.
    backend = await _open(inline)
    me = threading.get_ident()
    host = np.arange(24, dtype=np.float32).reshape(4, 6) / 10
    w_h = (np.arange(48, dtype=np.float32).reshape(8, 6) - 20) / 30
    eps = float(np.finfo(np.float32).eps)
    try:
        await _warm(backend)
        f, ops, kops = backend.tensor_factory, backend.tensor_ops, backend.kernel_ops
        x, w = f.from_host(host), f.from_host(w_h)
        idx = f.from_host(np.array([2, 0], np.int64))
        stream = backend.default_stream
        for round_ in range(3):
            if round_ == 2:
                await _idle(backend)
                fake_cupy.CALLS.clear()
                before = stream.inline_launches
            h = ops.gelu(ops.linear(x, w))
            s = ops.softmax(ops.layer_norm(h), axis=-1)
            t = ops.transpose(ops.exp(s))
            total = ops.reduce("sum", s, axis=-1)
            r = kops.rms_norm(x)
            g = kops.silu_mul(x, x)
            emb = ops.embedding(idx, x)  # a checked launch: queued
            got = {
                "total": await total.to_host(), "t": await t.to_host(), "r": await r.to_host(),
                "g": await g.to_host(), "emb": await emb.to_host(),
            }  # fmt: skip
            del h, s, t, total, r, g, emb
        inline_now = stream.inline_launches - before
        names = _check_caller_calls(me)
    finally:
        await backend.shutdown()
    assert inline_now >= 6, inline_now  # linear, gelu, layer_norm, softmax, exp, permute
    assert "launch eu_gelu_f32" in names
    np.testing.assert_allclose(got["total"], np.ones(4), rtol=8 * eps)
    np.testing.assert_array_equal(got["emb"], host[[2, 0]])
    # (the stand-in's fused kernels, rms_norm and silu_mul, compute nothing: not checked)
    # t = exp(s).T for rows s that sum to 1: log(t) sums to 1 down each column (8 terms,
    # each off by exp's few ulps, relative, read through log as absolute)
    assert got["t"].shape == (8, 4)
    np.testing.assert_allclose(np.log(got["t"].astype(np.float64)).sum(axis=0), 1, atol=64 * eps)


async def test_a_blocking_call_made_in_the_turn_runs_in_place(inline: Plugin) -> None:
    # Code that runs inside a launch in place (a finalizer, say) and makes a blocking call on
    # the submission thread runs it itself: the thread cannot run it before the turn is given
    # back (without this, a deadlock).
    backend = await _open(inline)
    a_h = np.ones((8, 8), np.float32)
    seen: list[int] = []

    def calling(name: str) -> None:
        if name.startswith("ew_add"):
            seen.append(backend.thread.call_blocking(threading.get_ident))

    try:
        ops, a = await _steady(backend, a_h)
        before = backend.default_stream.inline_launches
        with _before_launch(calling):
            y = ops.add(a, a)
        assert backend.default_stream.inline_launches == before + 1
        assert seen == [threading.get_ident()]
        np.testing.assert_array_equal(await y.to_host(), a_h * 2)
    finally:
        await backend.shutdown()


async def test_the_thread_waits_for_the_turn(inline: Plugin) -> None:
    # Work queued from another thread while a launch is made in place (the launch lets the
    # interpreter lock go) runs after it, not beside it: the thread runs its rounds in its turn.
    backend = await _open(inline)
    a_h = np.ones((8, 8), np.float32)
    order: list[str] = []

    def slow(name: str) -> None:
        if name.startswith("ew_add"):
            other = threading.Thread(
                target=backend.thread.submit, args=(lambda: order.append("queued"),)
            )
            other.start()
            other.join()
            time.sleep(0.05)  # the thread, rung, would run the closure now without the turn
            order.append("inline")

    try:
        ops, a = await _steady(backend, a_h)
        before = backend.default_stream.inline_launches
        with _before_launch(slow):
            y = ops.add(a, a)
        assert backend.default_stream.inline_launches == before + 1
        np.testing.assert_array_equal(await y.to_host(), a_h * 2)
        await backend.synchronize()
        assert order == ["inline", "queued"]
    finally:
        await backend.shutdown()


async def test_an_inline_chain_records_an_end_event_every_cover_max_positions(
    inline: Plugin,
) -> None:
    # A chain never awaited gets an end event every COVER_MAX + 1 positions, recorded in the
    # turn: its positions complete (and what they keep goes) without anyone waiting.
    backend = await _open(inline)
    a_h = np.ones((8, 8), np.float32)
    cover = inline.stream.COVER_MAX
    try:
        ops, a = await _steady(backend, a_h, lambda ops, a: ops.add(ops.add(a, a), a))
        stream = backend.default_stream
        before = (stream.inline_launches, stream.events_recorded)
        y = ops.add(a, a)
        for _ in range(cover):
            y = ops.add(y, a)
        assert stream.inline_launches - before[0] == cover + 1
        assert stream.events_recorded - before[1] == 1
        assert not stream._covered
        seq = stream.submitted
        with anyio.fail_after(10):
            while stream.completed < seq:  # noqa: ASYNC110 - the completer's counter
                await anyio.sleep(0.001)
        np.testing.assert_array_equal(await y.to_host(), a_h * (cover + 2))
    finally:
        await backend.shutdown()


async def _quiet_side(backend: Any, a_h: np.ndarray[Any, Any]) -> tuple[Any, Any, Any, Any]:
    """A second stream with one position launched inline and never awaited (no end event
    marks it), the thread idle: returns the TensorOps, the memory manager, ``a_h`` uploaded,
    and that stream."""
    await _warm(backend)
    f, ops, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager
    side = backend.create_stream()
    a = f.from_host(a_h)
    with backend.use_stream(side):
        for _ in range(3):
            await ops.add(a, a).to_host()
    await backend.synchronize()
    await _idle(backend)
    with backend.use_stream(side):
        before = side.inline_launches
        ops.add(a, a)
        assert side.inline_launches == before + 1
    return ops, mm, a, side


async def test_a_quiet_stream_does_not_hold_back_frees(inline: Plugin) -> None:
    # With two streams a freed block waits until every stream has passed the point of its
    # free. A position launched inline on a stream nobody awaits has no end event: the poll
    # before an allocation marks it once the stream has stayed quiet (poll_quiet), so frees do
    # not pile up and the pool reuses its blocks.
    backend = await _open(inline)
    a_h = np.ones((64, 64), np.float32)
    try:
        ops, mm, a, side = await _quiet_side(backend, a_h)
        mallocs = 0
        for i in range(30):
            y = ops.mul(ops.add(a, a), a)
            await y.to_host()
            mm.free(y)
            del y
            if i == 4:  # the polls have found the side stream quiet and marked its position
                with anyio.fail_after(10):
                    while side.completed < side.submitted:  # noqa: ASYNC110 - the completer's
                        await anyio.sleep(0.001)
                mallocs = len(fake_cupy.MALLOCED)
        assert len(backend._deferred) <= 1  # (the last free's: the next allocation's prune)
        assert len(fake_cupy.MALLOCED) - mallocs <= 2
    finally:
        await backend.shutdown()


async def test_a_blocking_wait_racing_an_inline_launch_returns(inline: Plugin) -> None:
    # Another thread blocks on the stream while a launch is made in place (the launch lets the
    # interpreter lock go), after the position was numbered and before it was covered: the
    # launch sees the waiter and records the end event, so the wait returns.
    backend = await _open(inline)
    a_h = np.ones((8, 8), np.float32)
    stream = backend.default_stream
    workers: list[threading.Thread] = []

    def racing(_name: str) -> None:
        t = threading.Thread(target=stream.synchronize_blocking, daemon=True)
        workers.append(t)
        t.start()
        deadline = time.monotonic() + 5
        while not stream._blocked and time.monotonic() < deadline:
            time.sleep(0.001)

    try:
        ops, a = await _steady(backend, a_h)
        before = stream.inline_launches
        with _before_launch(racing):
            y = ops.add(a, a)
        assert stream.inline_launches == before + 1
        await anyio.to_thread.run_sync(workers[0].join, 10.0)
        assert not workers[0].is_alive(), "the blocking wait hangs on a covered position"
        np.testing.assert_array_equal(await y.to_host(), a_h * 2)
    finally:
        await backend.shutdown()


async def test_work_queued_after_the_turn_began_goes_first(
    inline: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another thread queues work on the stream between the moment a caller takes the turn
    # and the moment it numbers its position: the caller queues its launch behind that work
    # instead of launching first (the other work's position is lower, and its end would mark
    # the caller's as done before the caller's launch ran).
    backend = await _open(inline)
    a_h = np.ones((8, 8), np.float32)
    stream = backend.default_stream
    thread = backend.thread
    order: list[str] = []
    enter = type(thread).enter

    def entering(self: Any) -> int | None:
        queued = enter(self)
        if queued is not None and not order:
            other = threading.Thread(
                target=stream.submit, args=(lambda: order.append("other"),), daemon=True
            )
            other.start()
            other.join()
        return queued

    try:
        ops, a = await _steady(backend, a_h)
        before = stream.inline_launches
        monkeypatch.setattr(type(thread), "enter", entering)
        with _before_launch(lambda _name: order.append("add")):  # (queued: run by the thread)
            y = ops.add(a, a)
            assert stream.inline_launches == before
            np.testing.assert_array_equal(await y.to_host(), a_h * 2)
        assert order == ["other", "add"]
    finally:
        await backend.shutdown()


@pytest.mark.parametrize("on", [False, True], ids=["queued", "inline"])
async def test_frees_polling_busy_streams_queue_nothing_and_record_little(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch, on: bool
) -> None:
    # With two streams every free's point is polled before each allocation. The polls mark a
    # stream's inline positions only once it has gone quiet: they queue no closure, make no
    # CUDA call on the loop's thread with inline launches off, and with them on do not record
    # an end event per allocation (a busy stream's chain gets one within COVER_MAX positions).
    monkeypatch.setattr(plugin.stream, "INLINE", on)
    backend = await _open(plugin)
    me = threading.get_ident()
    a_h = np.ones((64, 64), np.float32)
    queued: list[Any] = []
    try:
        await _warm(backend)
        f, ops, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager
        backend.create_stream()
        a = f.from_host(a_h)
        for _ in range(3):
            y = ops.mul(ops.add(a, a), a)
            await y.to_host()
            mm.free(y)
            del y
        await _idle(backend)
        submit = backend.thread.submit
        monkeypatch.setattr(
            backend.thread, "submit", lambda fn, owner=None: (queued.append(fn), submit(fn, owner))
        )
        stream = backend.default_stream
        events = stream.events_recorded
        fake_cupy.CALLS.clear()
        for _ in range(40):
            y = a
            for _ in range(8):
                y = ops.add(y, a)
                mm.free(ops.mul(y, a))  # a free (deferred: two streams) and an allocation
            await y.to_host()
            del y
        calls = _on(me)
    finally:
        await backend.shutdown()
    flushes = [fn for fn in queued if getattr(fn, "func", None) is plugin.stream._flush_covered]
    if not on:
        assert not flushes
        assert not [c for c in calls if c.startswith("driver.ctx")], calls
    else:
        # Polls queue none; an await that finds the thread busy (its read) queues one at most.
        assert len(flushes) <= 40, len(flushes)
        # each round: 16 positions, one await; an event a COVER_MAX + 1 positions at most
        assert stream.events_recorded - events <= 40 * 3, stream.events_recorded - events


async def test_a_quiet_stream_does_not_hold_back_frees_while_the_thread_is_busy(
    inline: Plugin,
) -> None:
    # As above, with the submission thread kept busy by other work at every allocation: the
    # poll queues one closure for the quiet stream (not one an allocation, and not none).
    backend = await _open(inline)
    a_h = np.ones((64, 64), np.float32)
    stop = threading.Event()
    try:
        ops, mm, a, side = await _quiet_side(backend, a_h)
        thread = backend.thread

        def busy() -> None:  # other work keeping the thread busy
            time.sleep(0.0005)
            if not stop.is_set():
                thread.requeue(busy)

        thread.submit(busy)
        for _ in range(40):
            y = ops.mul(ops.add(a, a), a)
            await y.to_host()
            mm.free(y)
            del y
        assert side.completed == side.submitted
        assert len(backend._deferred) <= 2, len(backend._deferred)
    finally:
        stop.set()
        await backend.shutdown()


async def test_an_interrupt_in_an_inline_launch_is_the_callers(inline: Plugin) -> None:
    # Ctrl-C lands in a launch made in place: the caller gets its KeyboardInterrupt (not a
    # DeviceError at a later await), the turn is given back, and the stream goes on.
    backend = await _open(inline)
    a_h = np.ones((8, 8), np.float32)

    def interrupted(_name: str) -> None:
        raise KeyboardInterrupt

    try:
        ops, a = await _steady(backend, a_h)
        stream = backend.default_stream
        before = stream.inline_launches
        with _before_launch(interrupted), pytest.raises(KeyboardInterrupt):
            ops.add(a, a)
        assert stream.inline_launches == before + 1
        assert not backend.thread._turn._is_owned()
        with anyio.fail_after(10), pytest.raises(DeviceError, match="KeyboardInterrupt"):
            await stream.wait_for(stream.submitted)  # the position's own report
        await _idle(backend)
        np.testing.assert_array_equal(await ops.add(a, a).to_host(), a_h * 2)
    finally:
        await backend.shutdown()


@pytest.mark.parametrize("on", [False, True], ids=["queued", "inline"])
async def test_the_step_timeline_sees_inline_launches(
    plugin: Plugin, cublas: fake_cupy.Cublas, monkeypatch: pytest.MonkeyPatch, on: bool
) -> None:
    """The step timeline (``accelkit_cuda.timeline``) waits for an idle submission thread
    before a step, so that the step's launches go inline with the switch on (its first timing
    event, queued just before them, kept them all queued), and counts them: the positions and
    the caller's time in the thread's turn; none with the switch off. Tracing leaves nothing
    behind on the thread."""
    from test_timeline import BENCHMARKS

    from accelkit.workloads import transformer_block

    monkeypatch.setattr(plugin.stream, "INLINE", on)
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delitem(sys.modules, "bench_core", raising=False)
    bench_core = importlib.import_module("bench_core")
    backend = await _open(plugin)
    try:
        await _warm(backend)
        cfg, w, x = _small_block(backend)
        for _ in range(2):  # the pool's blocks and the GEMM plans, made now
            await transformer_block(backend, x, w, cfg).to_host()
        m = await bench_core.block_timeline(
            backend, lambda: transformer_block(backend, x, w, cfg), 5
        )
        leftover = {"submit", "enter", "leave"} & set(vars(backend.thread))
    finally:
        await backend.shutdown()
    assert not leftover
    assert m["first_launch_ms"] <= m["launched_ms"] <= m["done_ms"]
    if on:
        # The block's launches (not the await's copy) on the caller's thread, at once.
        assert 10 <= m["inline_positions"] < m["positions"]
        assert 0 < m["inline_ms"] <= m["submit_ms"]  # (turns while the step is submitted)
        assert m["first_launch_ms"] <= m["submit_ms"]
    else:
        assert m["inline_positions"] == 0
        assert m["inline_ms"] == 0
    line = bench_core.describe_timeline(m, 5)[1]
    assert f"({m['inline_positions']:.0f} inline," in line
    assert len(line) < 390


async def test_the_benchmarks_inline_experiment_runs(
    plugin: Plugin, cublas: fake_cupy.Cublas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench_cuda.py's queued-against-inline lines over the stand-in: the answer is checked
    (the stand-in runs only some kernels, so the step checked and timed here is a chain of
    them, against NumPy), the block's inline positions are counted, the add figures and the
    inline step timeline follow, in lines the GPU check keeps whole, and the switch is put
    back."""
    import types

    from test_completer import _bench_cuda

    from accelkit.workloads import transformer_block

    bench_cuda = _bench_cuda(monkeypatch)
    monkeypatch.setattr(bench_cuda, "SMALL_CALLS", 5)
    setting = plugin.stream.INLINE  # (ACCELKIT_CUDA_INLINE's)
    torch = types.SimpleNamespace(
        ones=lambda shape, device: np.ones(shape, np.float32),
        cuda=types.SimpleNamespace(synchronize=lambda: None),
    )
    backend = await _open(plugin)
    try:
        await _warm(backend)
        cfg, w, x = _small_block(backend)
        ops = backend.tensor_ops
        a_h = np.random.default_rng(3).standard_normal((8, 8)).astype(np.float32)
        a = backend.tensor_factory.from_host(a_h)

        async def ak_block() -> None:
            transformer_block(backend, x, w, cfg)
            await backend.synchronize()

        def chain() -> Any:
            return ops.sub(ops.mul(ops.add(a, a), a), a)

        lines = await bench_cuda._inline_modes(
            backend, torch, ak_block, (a_h + a_h) * a_h - a_h, chain
        )
    finally:
        await backend.shutdown()
    assert plugin.stream.INLINE is setting  # put back
    assert len(lines) == 4
    assert lines[0].startswith("inline launches (ACCELKIT_CUDA_INLINE; the figures above ran")
    counts = lines[0].split("x; ")[1].split(" positions")[0]
    inline, positions = (int(v) for v in counts.split(" of its "))
    # How many depends on whether the thread has caught up: over the stand-in, whose queued
    # kernels run NumPy, the first op after a read often finds it still busy, and the rest of
    # the block queues behind that one (the step timeline waits for an idle thread instead).
    assert 1 <= inline < positions
    assert lines[1].startswith("inline launches: add 64x64 caller time")
    assert lines[2].startswith("block inline step timeline (median of 15")
    assert lines[3].startswith("block inline step: submission thread busy")
    assert "positions (3 inline," in lines[3]
    assert all(len(line) < 390 for line in lines)
