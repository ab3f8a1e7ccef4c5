"""A tensor whose ``cudaMalloc`` found the device full (over the stand-in for CuPy).

The allocation runs on the submission thread, after the op that made the tensor returned: the
tensor exists without memory. Its failure is raised once, by the first await that covers a use
of its block (the uses at or before that position on the stream go with it); a use awaited
later raises StaleHandleError; the failed block is never handed to another tensor.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import numpy as np
import pytest
from test_fast_rows import _full_device, _lagging, _ramp, _ready
from test_offloop import Plugin, _open, plugin  # noqa: F401

from accelkit.errors import DeviceError, OutOfMemoryError, StaleHandleError

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def _ramped(plugin: Plugin) -> AsyncIterator[tuple[Any, Any, Any, Any, Any]]:  # noqa: F811
    """An initialized CUDA backend over the stand-in, its raw kernels loaded: ``(backend, its
    tensor ops, its factory, a [64, 64] f32 ramp on the host, the same on the device)``; shut
    down on exit."""
    backend = await _open(plugin)
    try:
        await _ready(backend)
        x_h, x = await _ramp(backend, 64)
        yield backend, backend.tensor_ops, backend.tensor_factory, x_h, x
    finally:
        await backend.shutdown()


async def test_a_failed_allocation_is_reported_once(
    plugin: Plugin,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An op's output whose ``cudaMalloc`` found the device full: the await that covers the op
    raises OutOfMemoryError, once. The tensor has no memory: a later read of it (``to_host``,
    ``numpy``) or an op that takes it raises StaleHandleError saying the failure was raised
    already, not the same OutOfMemoryError again (both reads raised it a second time), and
    no await raises anything more."""
    async with _ramped(plugin) as (backend, ops, _f, _, x):
        full = _full_device(monkeypatch)
        y = ops.exp(x)
        with pytest.raises(OutOfMemoryError, match="16384-byte block"):
            await backend.synchronize()
        full[0] = 0  # room again: y still has no memory
        with pytest.raises(StaleHandleError, match="earlier await raised"):
            await y.to_host()
        with pytest.raises(StaleHandleError, match="earlier await raised"):
            y.numpy()
        with pytest.raises(StaleHandleError, match="earlier await raised"):
            await ops.add(y, x).to_host()
        await backend.synchronize()  # nothing left to raise
        np.testing.assert_allclose(await ops.exp(x).to_host(), np.exp(x.numpy()), rtol=1e-6)


async def test_a_read_that_raised_a_failed_allocation_leaves_nothing_to_raise(
    plugin: Plugin,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Read first: the read of an output whose ``cudaMalloc`` failed raises the op's
    OutOfMemoryError, and its own failed copy (a use of the same block) is covered by it: the
    next ``synchronize`` raised the OutOfMemoryError again. A second read raises
    StaleHandleError. Two awaits at once (a read and a synchronize) raise it once between them,
    and the read raises in any case (it found no copy to read)."""
    async with _ramped(plugin) as (backend, ops, _f, _, x):
        full = _full_device(monkeypatch)
        y = ops.exp(x)
        with pytest.raises(OutOfMemoryError, match="16384-byte block"):
            await y.to_host()
        await backend.synchronize()
        with pytest.raises(StaleHandleError):
            await y.to_host()
        await backend.synchronize()

        gate = _lagging(backend)
        z = ops.exp(x)  # full still: z's cudaMalloc fails
        got: dict[str, BaseException | None] = {}

        async def wait(name: str, aw: Callable[[], Any]) -> None:
            try:
                await aw()
                got[name] = None
            except OutOfMemoryError as exc:
                got[name] = exc
            except StaleHandleError as exc:
                got[name] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait, "sync", backend.synchronize)
            tg.start_soon(wait, "read", z.to_host)
            await anyio.sleep(0.05)
            gate.set()
        kinds = sorted(type(e).__name__ for e in got.values() if e is not None)
        assert kinds.count("OutOfMemoryError") == 1, got
        assert got["read"] is not None, got  # never read from an empty copy
        full[0] = 0
        await backend.synchronize()


class _HookLock:
    """The stream's lock, which runs ``hook`` (holding the real lock) at one acquisition."""

    def __init__(self, lock: Any, hook: Any) -> None:
        self.lock, self.hook = lock, hook

    def __enter__(self) -> Any:
        self.lock.acquire()
        self.hook()
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


async def test_a_completer_round_between_marking_and_filtering_leaves_a_second_report(
    plugin: Plugin,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The block is marked reported and its other checks dropped in the hold of the lock the
    error was taken under (``covered_checks_locked``): a completer round's prune (which calls
    every completed check) at any later acquisition finds nothing of the block left, and a
    later synchronize raises nothing. (Marked, then dropped under a second hold, the prune in
    between turned the other uses' failures into StaleHandleError, raised later: review of
    e88ca09.)"""
    from accelkit_cuda import stream as stream_mod

    async with _ramped(plugin) as (backend, ops, _f, _, x):
        _full_device(monkeypatch, times=2)
        y = ops.exp(x)
        _w = ops.add(y, x)  # a second use of y's failed block, before the await's position
        s = backend.current_stream
        while s.completed < s.submitted:  # noqa: ASYNC110 (the completer thread's counter)
            await anyio.sleep(0.01)
        real = s._lock
        fired = []

        def hook() -> None:  # what the completer's _due_locked does in a round
            if not fired and any(b.reported for b in list(stream_mod._FAILED_BLOCKS.values())):
                fired.append(1)
                s.prune_checks_locked(s._completed_upto)

        s._lock = _HookLock(real, hook)
        try:
            with pytest.raises(OutOfMemoryError):
                await backend.synchronize()
        finally:
            s._lock = real
        await backend.synchronize()  # nothing left to raise (the commit's claim)


async def test_two_threads_awaiting_raise_the_failure_once(
    plugin: Plugin,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Thread A's await takes a use's OutOfMemoryError; another thread's await (``numpy()``
    in a worker, a blocking synchronize) right after A released the lock finds the block
    reported and its other uses dropped: the failure is raised once. (Marked after the lock
    was released, B took the other use's OutOfMemoryError too: review of e88ca09.)"""
    from accelkit_cuda import stream as stream_mod

    async with _ramped(plugin) as (backend, ops, _f, _, x):
        _full_device(monkeypatch, times=2)
        y = ops.exp(x)
        _w = ops.add(y, x)
        s = backend.current_stream
        while s.completed < s.submitted:  # noqa: ASYNC110 (the completer thread's counter)
            await anyio.sleep(0.01)
        raised: list[BaseException] = []
        real_take = s._take_error

        def take(seq: int) -> Any:  # thread A's take; thread B runs in the gap after it
            error = real_take(seq)
            s._take_error = real_take
            try:
                stream_mod.CUDAStream.raise_errors(s, s.submitted)  # thread B
            except BaseException as exc:
                raised.append(exc)
            return error

        s._take_error = take
        with pytest.raises(OutOfMemoryError):
            await backend.synchronize()
        assert not [e for e in raised if isinstance(e, OutOfMemoryError)], raised


async def test_a_read_whose_copy_check_another_await_took_raises(
    plugin: Plugin,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read queued before a synchronize whose await resumes first: the synchronize raises the
    OOM and drops the read's failed copy; the read must raise, not index an empty cell. (The
    concurrent test above has the read resume first, so ``_copied`` is not reached there.)"""
    async with _ramped(plugin) as (backend, ops, _f, _, x):
        _full_device(monkeypatch)
        s = backend.current_stream
        gate = _lagging(backend)
        z = ops.exp(x)
        held: list[Any] = []
        plain = s.add_waiter

        def add_waiter(seq: int, cb: Any) -> Any:
            if not held:  # the read's wait: released only after the synchronize raised
                held.append(cb)
                return lambda: None
            return plain(seq, cb)

        s.add_waiter = add_waiter
        got: dict[str, BaseException | None] = {}

        async def read() -> None:
            try:
                await z.to_host()
                got["read"] = None
            except (OutOfMemoryError, StaleHandleError, DeviceError) as exc:
                got["read"] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await anyio.sleep(0.02)  # the read's copy queued, its wait held
            del s.add_waiter
            gate.set()
            with pytest.raises(OutOfMemoryError):
                await backend.synchronize()
            held[0]()
        assert isinstance(got["read"], StaleHandleError), got


async def test_a_use_on_another_stream_raises_stale_handle_after_the_report(
    plugin: Plugin,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The report covers the uses on the stream whose await raised it: a use of the failed
    block on another stream is that stream's error, raised by a later await as
    StaleHandleError (the OutOfMemoryError is not raised twice), and then nothing."""
    async with _ramped(plugin) as (backend, ops, _f, _, x):
        other = backend.create_stream()
        _full_device(monkeypatch, times=2)
        y = ops.exp(x)
        with backend.use_stream(other):
            _w = ops.add(y, x)  # a use of y's failed block on the other stream
        with pytest.raises(OutOfMemoryError):
            await backend.synchronize()
        with pytest.raises(StaleHandleError, match="earlier await raised"):
            await backend.synchronize()
        await backend.synchronize()


@pytest.mark.parametrize("first", [0, 1], ids=["default-stream-claims", "other-stream-claims"])
async def test_two_streams_awaited_at_once_raise_the_failure_once(
    plugin: Plugin,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    first: int,
) -> None:
    """A failed block used on two streams, their awaits taking its failure at the same moment
    on two threads (each under its own stream's lock; a barrier holds both after their checks
    and before either claims): one raises OutOfMemoryError, the other StaleHandleError for its
    use, with a second use on the other stream, which the same await covers, as a note of its
    own; then nothing is left. (Before the claim under a lock the streams share, both
    raised OutOfMemoryError: stop 43's documented gap.)"""
    import threading
    import time

    from accelkit_cuda import stream as stream_mod

    async with _ramped(plugin) as (backend, ops, _f, _, x):
        other = backend.create_stream()
        _full_device(monkeypatch, times=2)
        y = ops.exp(x)
        with backend.use_stream(other):
            _w = ops.add(y, x)  # a use of y's failed block on the other stream
            _w2 = ops.mul(y, x)  # and a second one
        streams = [backend.default_stream, other]
        for s in streams:
            while s.completed < s.submitted:  # noqa: ASYNC110 (the completer's counter)
                await anyio.sleep(0.01)
        barrier = threading.Barrier(2, timeout=10)
        racers = {"racer-0", "racer-1"}
        check = stream_mod._Failure.__call__

        def held_check(self: Any) -> BaseException | None:
            error = check(self)
            name = threading.current_thread().name
            if name in racers and error is not None:
                # Once a racer: the await goes on to the other checks it covers (as notes).
                racers.discard(name)
                barrier.wait()  # both have their check's error; neither has claimed it
                if name != f"racer-{first}":
                    time.sleep(0.05)  # the other claims first
            return error

        monkeypatch.setattr(stream_mod._Failure, "__call__", held_check)
        raised: dict[int, BaseException | None] = {}

        def take(i: int) -> None:
            try:
                streams[i].raise_errors(streams[i].submitted)
                raised[i] = None
            except BaseException as exc:
                raised[i] = exc

        threads = [threading.Thread(target=take, args=(i,), name=f"racer-{i}") for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        monkeypatch.setattr(stream_mod._Failure, "__call__", check)
        assert isinstance(raised[first], OutOfMemoryError), raised
        assert isinstance(raised[1 - first], StaleHandleError), raised
        if first == 0:
            # The other stream lost: its await covered its second use too, which it reports as
            # a note of its own StaleHandleError (no later await is left to raise it).
            notes = getattr(raised[1], "__notes__", [])
            assert len(notes) == 1, notes
            assert "StaleHandleError" in notes[0], notes
            assert "earlier await raised" in notes[0], notes
        # (When it claimed, its OutOfMemoryError covered both of its uses.)
        for s in streams:
            s.raise_errors(s.submitted)  # nothing left on either stream


def test_block_is_live_with_the_malloc_finishing_between_its_reads(plugin: Plugin) -> None:  # noqa: F811
    """malloc() on the submission thread sets ptr, then pending = False. block_is_live reads
    ptr first, then pending: a malloc that completes between the two reads makes a live block
    'not live', block_failed says 'not failed' (ptr is set by then), and the pool raises its
    internal error (and drops the block from its accounting). ``pending`` is read first now.
    (With the GIL the two reads hardly interleave with another thread; without it they do.)"""
    from accelkit_cuda.memory import Block, block_failed, block_is_live

    from accelkit._core.pool import CachingPool
    from accelkit.device import Device

    class Racing(Block):
        __slots__ = ("_p", "_raced")

        def __init__(self, size: int) -> None:
            self._raced = False
            super().__init__(0, size)
            self.pending = True

        @property  # type: ignore[override]
        def ptr(self) -> int:
            value = self._p
            if self.pending and not self._raced:  # the submission thread runs here
                self._raced = True
                self._p, self.pending = 0x1000, False
            return value

        @ptr.setter
        def ptr(self, value: int) -> None:
            self._p = value

    pool = CachingPool(
        Device("cuda", 0), Racing, lambda b: None, 1 << 20,
        is_live=block_is_live, is_failed=block_failed,
    )  # fmt: skip
    buf = pool.allocate(100)
    first = buf.handle
    pool.free(buf)
    again = pool.allocate(100)  # (was: DeviceError, "a cached block ... was already freed")
    assert again.handle is first


async def test_a_trim_on_the_submission_thread_does_not_leak_a_pending_cached_block(
    plugin: Plugin,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cached block whose cudaMalloc is still queued is freed in place by a
    full device's retry (pool.trim() on the submission thread): free() finds ptr 0 and drops
    it from DeviceMemory._live; then its own malloc runs and sets ptr on a freed block that
    no one owns any more: the device memory was never freed. A freed block's malloc does
    nothing now."""
    async with _ramped(plugin) as (backend, ops, f, _, _x):
        big = f.from_host(np.ones((256, 64), np.float32))
        await backend.synchronize()
        _full_device(monkeypatch, times=2)  # the big output's malloc and its retry
        gate = _lagging(backend)
        _t1 = ops.exp(big)  # its malloc (queued first) fails, and trims the cache in place
        t2 = f.empty((64, 64))  # a block whose malloc is queued after it
        block = t2.buffer.handle
        del t2
        backend.pool.reclaim()  # the block goes to the cache, malloc still queued
        gate.set()
        with pytest.raises(OutOfMemoryError):
            await backend.synchronize()
        live = backend.memory_manager.kernels.blocks._live
        assert not (block.freed and block.ptr and id(block) not in live), block


# -- A block the pool let go before its queued cudaMalloc ran -------------------------------------
# Its cudaFree is queued after the work that uses it (Block.use, or after all work queued), so
# its cudaMalloc must run; only a block whose free already ran (trimmed in place on the
# submission thread) is skipped. (A review of b4c518d, which skipped every block marked freed:
# each of these failed, with a live result, with no full device needed for the last two.)


async def test_a_dropped_fresh_output_of_a_queued_add(
    plugin: Plugin,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As test_a_dropped_output_of_a_queued_add_is_not_freed_under_it, but the add's output
    is a fresh block (its cudaMalloc queued after the failing one), not a cached one."""
    async with _ramped(plugin) as (backend, ops, _f, _, x):
        big_h, big = await _ramp(backend, 128)
        gate = _lagging(backend)
        fails = _full_device(monkeypatch, times=1)
        y = ops.exp(big)  # its cudaMalloc, queued first, fails once, trims and retries
        dropped = ops.add(x, x)  # a fresh block: its cudaMalloc queued after y's
        del dropped
        backend.pool.reclaim()
        gate.set()
        got = await y.to_host()
        await backend.synchronize()  # the add must not fail
    assert fails == [0]
    np.testing.assert_allclose(got, np.exp(big_h.astype(np.float64)), rtol=2 * 2.0**-23)


async def test_a_dropped_fresh_input_of_a_queued_add(
    plugin: Plugin,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A live result c = a + x, whose input a (fresh, malloc queued) the caller drops before
    anything ran: a full device's trim frees a's cached block (its free waits for the add);
    a's cudaMalloc must still run, and the add with it."""
    async with _ramped(plugin) as (backend, ops, f, x_h, x):
        _, big = await _ramp(backend, 128)
        gate = _lagging(backend)
        fails = _full_device(monkeypatch, times=1)
        y = ops.exp(big)
        a = f.empty((64, 64))  # a fresh block, nothing launched
        c = ops.add(a, x)
        del a
        backend.pool.reclaim()
        gate.set()
        await y.to_host()
        got = await c.to_host()
    assert fails == [0]
    assert got.shape == x_h.shape


async def test_an_uploaded_input_of_a_queued_add(
    plugin: Plugin,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """c = from_host(h) + x, the upload a temporary: c is live, its result must be h + x."""
    async with _ramped(plugin) as (backend, ops, f, x_h, x):
        _, big = await _ramp(backend, 128)
        gate = _lagging(backend)
        fails = _full_device(monkeypatch, times=1)
        y = ops.exp(big)
        c = ops.add(f.from_host(x_h), x)
        backend.pool.reclaim()
        gate.set()
        await y.to_host()
        got = await c.to_host()
    assert fails == [0]
    np.testing.assert_allclose(got, 2 * x_h)


async def test_a_trim_on_the_loop_thread_before_a_queued_upload_ran(
    plugin: Plugin,  # noqa: F811
) -> None:
    """No full device: c = from_host(h) + x with the upload a temporary, then the public
    memory_manager.trim() on the loop thread while the submission thread lags. The temporary's
    block is freed (``freed`` at once, its cudaFree queued after the add): its queued
    cudaMalloc must still run, for the upload and the add."""
    async with _ramped(plugin) as (backend, ops, f, x_h, x):
        gate = _lagging(backend)
        c = ops.add(f.from_host(x_h), x)
        backend.memory_manager.trim()
        gate.set()
        got = await c.to_host()
    np.testing.assert_allclose(got, 2 * x_h)


async def test_caching_off_a_dropped_upload_before_it_ran(plugin: Plugin) -> None:  # noqa: F811
    """The pool's cache off (MemoryPoolConfig(enabled=False)): a temporary's block is freed at
    the next allocation's drain, before its queued cudaMalloc ran."""
    from accelkit.device import Device
    from accelkit.memory import MemoryPoolConfig

    backend = plugin.backend.CUDABackend(MemoryPoolConfig(enabled=False))
    await backend.initialize(Device("cuda", 0))
    try:
        await _ready(backend)
        ops, f = backend.tensor_ops, backend.tensor_factory
        x_h, x = await _ramp(backend, 64)
        gate = _lagging(backend)
        c = ops.add(f.from_host(x_h), x)
        d = ops.add(c, x)  # its allocation drains the temporary: freed
        gate.set()
        got = await d.to_host()
    finally:
        await backend.shutdown()
    np.testing.assert_allclose(got, 3 * x_h)
