"""The CUDA backend's streams and threads at the edges of its life, over the stand-in for CuPy:
work submitted while a shutdown drains, a stream kept past its backend, a poisoned shutdown
with work still queued, an initialize that fails or is cancelled after its submission thread
started. Each case once hung an await, returned from one before its work had run, or left a
thread running (found by a review; every test fails on the tree before the fix)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import numpy as np
import pytest
import test_offloop
from test_offloop import Plugin, _open

from accelkit.device import Device
from accelkit.errors import ContextPoisonedError, StaleHandleError

pytestmark = pytest.mark.anyio

#: The plugin's modules over the stand-in (test_offloop's fixture, found here by its name).
plugin = test_offloop.plugin


def _held(backend: Any) -> threading.Event:
    """Keep the submission thread busy (a closure waiting) until the returned event is set."""
    gate = threading.Event()
    backend.thread.submit(lambda: gate.wait(30))
    return gate


def _set_later(*steps: tuple[float, threading.Event]) -> None:
    """Set each event after its delay, one after the other, on a thread of its own."""

    def run() -> None:
        for delay, event in steps:
            time.sleep(delay)
            event.set()

    threading.Thread(target=run, daemon=True).start()


def _cuda_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("accelkit-cuda")}


async def test_work_submitted_while_shutdown_drains_runs_before_its_await_returns(
    plugin: Plugin,
) -> None:
    """Shutdown waits for the positions submitted when it began, then closes the streams. Work
    a request submits meanwhile must run before its await returns (it returned at once, its
    work still queued, and a to_host of it raised a misleading DeviceError)."""
    backend = await _open(plugin)
    ops, f = backend.tensor_ops, backend.tensor_factory
    a = f.from_host(np.full((8, 8), 2, np.float32))
    await ops.add(a, a).to_host()
    stream = backend.default_stream
    first = _held(backend)
    ops.add(a, a)  # queued behind it: shutdown waits for this position
    second = threading.Event()
    ran: list[bool] = []
    results: list[Any] = []

    async def request() -> None:  # a request in flight while the service shuts down
        await anyio.sleep(0.05)  # shutdown has begun waiting
        backend.thread.submit(lambda: second.wait(30))  # busy again when it closes the stream
        seq = stream.submit(lambda: ran.append(True), what="late work")
        y = ops.add(a, a)
        results.append(await y.to_host())  # its copy queued now, before the stream closes
        results.append(bool(ran))  # stream order: the late work ran before the copy
        await stream.wait_for(seq)

    async with anyio.create_task_group() as tg:
        tg.start_soon(request)
        await anyio.sleep(0.01)
        _set_later((0.2, first), (0.5, second))
        await backend.shutdown()
    np.testing.assert_array_equal(results[0], np.full((8, 8), 4, np.float32))
    assert results[1] is True


async def test_a_stream_closed_by_shutdown_refuses_work(plugin: Plugin) -> None:
    """A stream object kept past its backend's shutdown refuses every submission with
    NotInitializedError (it took them, ran them on threads of their own, unordered, and a
    synchronize of them never returned); waiting for what it ran before returns."""
    backend = await _open(plugin)
    f, ops = backend.tensor_factory, backend.tensor_ops
    a = f.from_host(np.ones((8, 8), np.float32))
    await ops.add(a, a).to_host()
    stream = backend.default_stream
    event = stream.record_event()
    submitted = stream.submitted
    await backend.shutdown()
    for call in (
        lambda: stream.wait_event(event),
        lambda: stream.hold([object()]),
        lambda: stream.record_event(),
        lambda: stream.submit(lambda: None),
    ):
        with pytest.raises(StaleHandleError, match="the stream was closed"):
            call()
    assert stream.submitted == submitted
    with anyio.fail_after(5):
        await stream.synchronize()


async def test_a_poisoned_shutdown_ends_the_awaits_of_dropped_work(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sticky fault, then shutdown while work is still queued: the streams are abandoned
    and the queued work dropped. An await of it raises the poisoning (it waited forever)."""
    monkeypatch.setattr(plugin.backend, "_POISONED_DEVICES", {})
    backend = await _open(plugin)
    ops, f = backend.tensor_ops, backend.tensor_factory
    a = f.from_host(np.ones((8, 8), np.float32))
    await a.to_host()
    stream = backend.default_stream
    gate = _held(backend)
    seq = ops.add(a, a)._seq  # queued behind the busy thread
    outcome: list[BaseException | None] = []

    async def waiter() -> None:
        try:
            await stream.wait_for(seq)
        except ContextPoisonedError as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    blocking: list[BaseException | None] = []

    def blocking_waiter() -> None:
        try:
            stream.wait_for_blocking(seq)
        except ContextPoisonedError as exc:
            blocking.append(exc)
        else:
            blocking.append(None)

    waiting = threading.Thread(target=blocking_waiter)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            waiting.start()
            await anyio.sleep(0.05)
            assert not outcome
            # What the completer does on a sticky status (as_accel_error through on_error).
            backend._failed(ContextPoisonedError("stand-in sticky fault"))
            _set_later((0.2, gate))
            await backend.shutdown()
        waiting.join(5)
    assert isinstance(outcome[0], ContextPoisonedError)
    assert "stand-in sticky fault" in str(outcome[0])
    assert isinstance(blocking[0], ContextPoisonedError)


@pytest.fixture
def no_thread_left() -> Iterator[None]:
    """The CUDA threads started by the test are gone at its end."""
    before = _cuda_threads()
    yield
    deadline = time.monotonic() + 5
    while (left := _cuda_threads() - before) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not left, sorted(t.name for t in left)


async def test_a_failed_initialize_ends_its_threads(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch, no_thread_left: None
) -> None:
    """An initialize that fails after its submission thread and default stream exist ends
    them (they ran on, and shutdown, with nothing opened, closed nothing)."""
    real = plugin.backend.CUDABackend._build

    def build(self: Any, *args: Any) -> Any:
        opened = real(self, *args)
        opened.streams[0].hold([object()])  # the stream has had work: its completer runs
        raise RuntimeError("fails after the default stream opened")

    monkeypatch.setattr(plugin.backend.CUDABackend, "_build", build)
    backend = plugin.backend.CUDABackend()
    with pytest.raises(RuntimeError, match="after the default stream opened"):
        await backend.initialize(Device("cuda", 0))
    assert backend._thread.closed
    await backend.shutdown()


async def test_a_cancelled_initialize_ends_its_threads(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch, no_thread_left: None
) -> None:
    """The same when the initialize is cancelled during its warm-up."""
    monkeypatch.setattr(plugin.backend, "_warm_up", lambda draws: time.sleep(0.5))
    backend = plugin.backend.CUDABackend()
    with anyio.move_on_after(0.2) as scope:
        await backend.initialize(Device("cuda", 0))
    assert scope.cancelled_caught
    assert backend._thread.closed
    await backend.shutdown()


async def test_a_result_whose_wait_was_cancelled_is_dropped_on_the_submission_thread(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SubmissionThread.call`` cancelled after its function returned: the result (a loaded
    module, say, whose destructor is a CUDA call) is dropped on the submission thread, not on
    the loop's thread by the cancelled frame."""
    from accelkit_cuda import submission

    backend = await _open(plugin)
    try:
        dropped_on: list[int] = []

        class Module:
            def __del__(self) -> None:
                dropped_on.append(threading.get_ident())

        real_wait = submission.wait_for_callback
        with anyio.CancelScope() as scope:

            async def wait_then_cancelled(register: Any) -> None:
                await real_wait(register)  # the result is in; the wait is cancelled all the same
                scope.cancel()
                await anyio.sleep(1)

            monkeypatch.setattr(submission, "wait_for_callback", wait_then_cancelled)
            await backend.thread.call(Module)
        assert scope.cancelled_caught
        monkeypatch.undo()
        await backend.thread.call(lambda: None)  # after the drop queued behind it
        assert dropped_on == [backend.thread.ident]
    finally:
        await backend.shutdown()


async def test_a_stream_closes_in_bounded_time_with_its_thread_stuck(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream's close waits for the submission thread to run the work queued before it, but
    not forever: a thread stuck on a lost device must not hang shutdown or reopen."""
    monkeypatch.setattr(plugin.stream, "_CLOSE_TIMEOUT", 0.3)
    backend = await _open(plugin)
    stream = backend.default_stream
    gate = _held(backend)
    try:
        t0 = time.monotonic()
        await anyio.to_thread.run_sync(stream.close)
        assert time.monotonic() - t0 < 5
        with pytest.raises(StaleHandleError, match="the stream was closed"):
            stream.submit(lambda: None)
    finally:
        gate.set()
        await backend.shutdown()
