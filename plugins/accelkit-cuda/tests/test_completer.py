"""The CUDA stream's completer thread (accelkit_cuda.stream.COMPLETER) over the stand-in: with
"newest" a backlog of positions completes in one wake-up, with "each" in one an event; in both
every result is right, every awaiter wakes, and each position's keepalive is dropped once done.
Which is faster on a GPU is benchmarks/bench_cuda.py's to say (unmeasured when written).

A chain of positions shares one end event (``accelkit_cuda.stream.COVER_MAX``): where the
submission thread's next closure is the same stream's work, none is recorded; the next one
recorded covers them. Any other closure next (a ``call``, another stream's work) finds every
earlier position's end recorded, and a fault that the shared event reports is raised by an
await of any position it covers."""

from __future__ import annotations

import importlib
import threading
import time
import weakref
from typing import Any

import anyio
import fake_cupy
import numpy as np
import pytest
import test_offloop
from test_offloop import Plugin, _open

pytestmark = pytest.mark.anyio

plugin = test_offloop.plugin


async def _open_with_x(plugin: Plugin) -> tuple[Any, Any, Any, Any]:
    """An open backend over the stand-in, its TensorOps, ``x`` (0..15, f32, on the device)
    and its default stream, everything queued so far complete."""
    backend = await _open(plugin)
    x = backend.tensor_factory.from_host(np.arange(16, dtype=np.float32))
    await backend.synchronize()
    return backend, backend.tensor_ops, x, backend.default_stream


async def _until(condition: Any, what: str) -> None:
    """Poll ``condition()`` (state of other threads) until true, for at most 30 s."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        await anyio.sleep(0.001)


@pytest.mark.parametrize("mode", ["each", "newest"])
async def test_a_backlog_completes_in_one_round_with_newest(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    stream_mod = importlib.import_module("accelkit_cuda.stream")
    monkeypatch.setattr(stream_mod, "COMPLETER", mode)
    backend, ops, x, stream = await _open_with_x(plugin)
    try:
        gate = threading.Event()
        real = fake_cupy.Event.synchronize

        def held(event: fake_cupy.Event) -> None:  # the device is busy until the gate opens
            gate.wait(30)
            real(event)

        monkeypatch.setattr(fake_cupy.Event, "synchronize", held)

        class Kept:
            pass

        kept = Kept()
        gone = weakref.ref(kept)
        before, events = stream.completer_rounds, stream.events_recorded  # all complete here
        stream.submit(lambda: None, keepalive=kept)
        del kept
        y = x
        for _ in range(20):
            y = ops.add(y, x)
        await _until(lambda: len(stream._pending) >= 21, "the thread records all 21")
        gate.set()
        got = await y.to_host()
        rounds = stream.completer_rounds - before
        events = stream.events_recorded - events
    finally:
        await backend.shutdown()
    np.testing.assert_array_equal(got, np.arange(16, dtype=np.float32) * 21)
    assert gone() is None
    if mode == "each":  # a round an event (positions that shared one go with it)
        assert rounds == events
    else:
        # the held first wait (the oldest position), then the rest in one round, then to_host's
        assert rounds <= 4


def _bench_cuda(monkeypatch: pytest.MonkeyPatch) -> Any:
    """benchmarks/bench_cuda.py, imported afresh, its interleaved rounds cut to 3."""
    import sys

    from test_timeline import BENCHMARKS

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    for name in ("bench_core", "bench_cuda", "bench_host", "bench_cuda_attention"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    bench_cuda = importlib.import_module("bench_cuda")
    monkeypatch.setattr(bench_cuda, "BLOCK_ROUNDS", 3)
    return bench_cuda


def _small_block(backend: Any, seen: list[Any], setting: Any) -> Any:
    """bench_cuda's ``ak_block`` on a small transformer block of ``backend``: each run notes
    ``setting()`` in ``seen``, submits the block and synchronizes."""
    from accelkit.workloads import BlockConfig, block_weights, transformer_block, upload_weights

    cfg = BlockConfig(batch=1, seq=4, width=16, heads=2)
    w = upload_weights(backend, block_weights(cfg))
    x = backend.tensor_factory.from_host(np.ones((1, 4, 16), np.float32))

    async def ak_block() -> None:
        seen.append(setting())
        transformer_block(backend, x, w, cfg)
        await backend.synchronize()

    return ak_block


async def test_the_benchmarks_completer_experiment_runs(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench_cuda.py's block under both completer modes: it runs over the stand-in, in one
    line the GPU check keeps whole, and puts the mode back."""
    bench_cuda = _bench_cuda(monkeypatch)
    stream_mod = importlib.import_module("accelkit_cuda.stream")
    seen: list[str] = []
    mode = stream_mod.COMPLETER
    backend = await _open(plugin)
    try:
        ak_block = _small_block(backend, seen, lambda: stream_mod.COMPLETER)
        line = await bench_cuda._completer_modes(ak_block)
    finally:
        await backend.shutdown()
    assert stream_mod.COMPLETER == mode  # noqa: SIM300 (the mode put back)
    assert set(seen) == {"each", "newest"}
    assert line.startswith("block by completer mode: each position ")
    assert len(line) < 390


def _gated(backend: object) -> threading.Event:
    """Hold the submission thread until the returned event is set: what is submitted meanwhile
    runs in one round, in order."""
    gate = threading.Event()
    backend.thread.submit(lambda: gate.wait(30))  # type: ignore[attr-defined]
    return gate


async def test_a_chain_of_positions_shares_one_event(plugin: Plugin) -> None:
    stream_mod = importlib.import_module("accelkit_cuda.stream")
    backend, ops, x, stream = await _open_with_x(plugin)
    try:
        y = x
        for _ in range(41):  # the pool's blocks, allocated now (a cudaMalloc is a closure
            y = ops.add(y, x)  # of the thread's own, not the stream's: it ends a chain)
        del y
        await backend.synchronize()
        events, first = stream.events_recorded, stream.submitted
        gate = _gated(backend)

        class Kept:
            pass

        kept = Kept()
        gone = weakref.ref(kept)
        stream.submit(lambda: None, keepalive=kept)  # the chain's first position keeps it
        del kept
        y = x
        for _ in range(40):
            y = ops.add(y, x)
        chain = stream.submitted - first
        gate.set()
        await backend.synchronize()
        events = stream.events_recorded - events
        assert gone() is None  # dropped once the event that covers it completed
        got = await y.to_host()
    finally:
        await backend.shutdown()
    np.testing.assert_array_equal(got, np.arange(16, dtype=np.float32) * 41)
    assert chain == 41
    # One event for every COVER_MAX + 1 positions in a row, and the chain's last one's.
    assert events == chain // (stream_mod.COVER_MAX + 1) + 1


async def test_another_closure_next_finds_every_earlier_end_recorded(plugin: Plugin) -> None:
    backend, ops, x, stream = await _open_with_x(plugin)
    try:
        gate = _gated(backend)
        ops.add(x, x)
        ops.add(x, x)
        seen: list[tuple[int, int, bool]] = []

        def probe() -> None:  # not the stream's work: both adds' ends are marked by now
            last = stream._pending[-1]
            seen.append((len(stream._covered), last[0], last[1] is not stream_mod.COVERED))

        stream_mod = importlib.import_module("accelkit_cuda.stream")
        backend.thread.submit(probe)
        seq = stream.submitted
        y = ops.add(x, x)
        gate.set()
        got = await y.to_host()
    finally:
        await backend.shutdown()
    assert seen == [(0, seq, True)]
    np.testing.assert_array_equal(got, np.arange(16, dtype=np.float32) * 2)


async def test_a_fault_told_by_a_shared_event_is_raised_for_each_position_it_covers(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA cannot say which of the positions an event covers faulted: an await of the first
    of them raises the error (not only an await of the one whose event reported it)."""
    from accelkit.errors import AccelError

    backend, ops, x, stream = await _open_with_x(plugin)
    try:
        plain = fake_cupy.Event.synchronize
        failing: list[object] = []

        def synchronize(self: object) -> None:
            if not failing:
                failing.append(self)
                raise fake_cupy.CUDARuntimeError(1)  # not sticky: the backend stays usable
            plain(self)  # type: ignore[arg-type]

        for _ in range(6):  # the pool's blocks, allocated now (see the test above)
            ops.add(x, x)
        await backend.synchronize()
        gate = _gated(backend)
        try:
            ops.add(x, x)
            first = stream.submitted
            for _ in range(5):
                ops.add(x, x)
            assert all(owner is stream for _, owner in list(backend.thread._queue)[1:])
            monkeypatch.setattr(fake_cupy.Event, "synchronize", synchronize)
        finally:
            gate.set()
        with pytest.raises(AccelError, match="CUDA error 1"):
            await stream.wait_for(first)
        monkeypatch.setattr(fake_cupy.Event, "synchronize", plain)
        assert len(failing) == 1
        await backend.synchronize()  # raised once, to the first await that covered it
        np.testing.assert_array_equal(await ops.add(x, x).to_host(), np.arange(16) * 2.0)
    finally:
        await backend.shutdown()


class _Later:
    """A stand-in for a blocking-sync event's state: after each record, ``done`` is False for
    its first ``busy`` queries (the device still at work), then True; ``synchronize`` counts
    its sleeps. ``queries``: the queries of each record (a completed event is recorded again
    for a later position)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, busy: int) -> None:
        self.busy = busy
        self.queries: list[int] = []
        self.sleeps: list[bool] = []  # per sleep: whether a query had already seen it done
        current: dict[int, int] = {}  # id(event) -> its record's index in queries
        record = fake_cupy.Event.record

        def recorded(event: Any, stream: Any = None) -> None:
            current[id(event)] = len(self.queries)
            self.queries.append(0)
            record(event, stream)

        def done(event: object) -> bool:
            i = current[id(event)]
            self.queries[i] += 1
            return self.queries[i] > busy

        def synchronize(event: object) -> None:
            i = current.get(id(event))
            self.sleeps.append(i is not None and self.queries[i] > busy)

        monkeypatch.setattr(fake_cupy.Event, "record", recorded)
        monkeypatch.setattr(fake_cupy.Event, "done", property(done))
        monkeypatch.setattr(fake_cupy.Event, "synchronize", synchronize)


async def _await_behind_gate(backend: Any, stream: Any, y: Any) -> Any:
    """``await y.to_host()`` with the submission thread held (:func:`_gated`) until the await
    waits on the stream: each of its positions reaches the completer with someone waiting."""
    gate = _gated(backend)
    got: list[Any] = []

    async def read() -> None:
        got.append(await y.to_host())

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await _until(lambda: len(stream._waiters), "the await waits")
            gate.set()
    finally:
        gate.set()
    return got[0]


async def test_an_awaited_position_is_polled_before_the_completer_sleeps(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With SPIN_US, the completer queries an awaited position's event until it is done and
    then does not sleep on it (its synchronize returns at once): the round is counted in
    ``polled_done``, the result is right."""
    stream_mod = importlib.import_module("accelkit_cuda.stream")
    backend, ops, x, stream = await _open_with_x(plugin)
    try:
        monkeypatch.setattr(stream_mod, "SPIN_US", 1e6)  # a second: never reached here
        later = _Later(monkeypatch, busy=3)
        polled = stream.polled_done
        got = await _await_behind_gate(backend, stream, ops.add(x, x))
        polled = stream.polled_done - polled
    finally:
        await backend.shutdown()
    np.testing.assert_array_equal(got, np.arange(16, dtype=np.float32) * 2)
    assert polled >= 1  # the copy's position at least (the add's where nothing was queued)
    polls = [n for n in later.queries if n]
    assert len(polls) >= 1
    assert all(n == later.busy + 1 for n in polls)
    assert later.sleeps
    assert later.sleeps[-1] is True  # the last sleep after its poll saw it done


async def test_a_poll_that_runs_out_falls_back_to_sleeping(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event still busy when SPIN_US ran out is slept on (synchronize) as without polling."""
    stream_mod = importlib.import_module("accelkit_cuda.stream")
    backend, ops, x, stream = await _open_with_x(plugin)
    try:
        monkeypatch.setattr(stream_mod, "SPIN_US", 2000.0)  # 2 ms
        later = _Later(monkeypatch, busy=10**9)  # never done by a query
        polled = stream.polled_done
        got = await _await_behind_gate(backend, stream, ops.add(x, x))
        polled = stream.polled_done - polled
    finally:
        await backend.shutdown()
    np.testing.assert_array_equal(got, np.arange(16, dtype=np.float32) * 2)
    assert polled == 0
    assert any(later.queries)
    assert later.sleeps
    assert not any(later.sleeps)


async def test_no_polling_while_the_submission_thread_has_work_queued(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An awaited position whose end is recorded while more closures wait on the submission
    thread is slept on, not polled (the polls would take the GIL from the launches); the last
    one, nothing queued behind it, is polled."""
    stream_mod = importlib.import_module("accelkit_cuda.stream")
    backend, ops, x, stream = await _open_with_x(plugin)
    try:
        monkeypatch.setattr(stream_mod, "SPIN_US", 1e6)
        later = _Later(monkeypatch, busy=0)
        polled = stream.polled_done
        gate = _gated(backend)
        y = ops.add(x, x)
        first = stream.submitted
        held = threading.Event()
        backend.thread.submit(lambda: held.wait(30))  # queued behind the add
        got: list[Any] = []

        async def read() -> None:
            got.append(await y.to_host())  # its copy queued behind that

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                await _until(lambda: len(stream._waiters), "the await waits")
                gate.set()
                await _until(lambda: stream.completed >= first, "the completer saw the add")
                held.set()
        finally:
            gate.set()
            held.set()
        polled = stream.polled_done - polled
    finally:
        await backend.shutdown()
    np.testing.assert_array_equal(got[0], np.arange(16, dtype=np.float32) * 2)
    assert later.queries[0] == 0  # the add's end: work was queued behind it
    assert later.sleeps[0] is False
    assert polled == 1  # the copy's: nothing behind it
    assert later.queries[-1] == 1


async def test_nobody_waiting_means_no_polling(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Work that nobody awaits completes without a query: polling costs the interpreter lock
    and a CPU, worth it only to someone waiting."""
    stream_mod = importlib.import_module("accelkit_cuda.stream")
    backend, ops, x, stream = await _open_with_x(plugin)
    try:
        monkeypatch.setattr(stream_mod, "SPIN_US", 1e6)
        later = _Later(monkeypatch, busy=0)
        y = ops.add(x, x)
        seq = stream.submitted
        await _until(lambda: stream.completed >= seq, "the add completes")  # not awaited
        assert later.queries
        assert not any(later.queries)
        assert later.sleeps
        np.testing.assert_array_equal(await y.to_host(), np.arange(16, dtype=np.float32) * 2)
    finally:
        await backend.shutdown()


@pytest.mark.parametrize(
    ("raw", "want"), [("", 0.0), ("0", 0.0), (" 150 ", 150.0), ("2.5", 2.5), ("1000000", 1e6)]
)
def test_spin_us_reads_the_environment(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch, raw: str, want: float
) -> None:
    stream_mod = importlib.import_module("accelkit_cuda.stream")
    monkeypatch.setenv("ACCELKIT_CUDA_SPIN_US", raw)
    assert stream_mod._spin_us() == want


@pytest.mark.parametrize("raw", ["fast", "-1", "nan", "2e6", "inf"])
def test_a_bad_spin_us_is_warned_about_by_name_and_read_as_off(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, raw: str
) -> None:
    """A typo must not keep the plugin from loading (the value is read at import)."""
    stream_mod = importlib.import_module("accelkit_cuda.stream")
    monkeypatch.setenv("ACCELKIT_CUDA_SPIN_US", raw)
    with caplog.at_level("WARNING", logger="accelkit.cuda"):
        assert stream_mod._spin_us() == 0.0
    assert f"ACCELKIT_CUDA_SPIN_US={raw!r}" in caplog.text


async def test_a_waiter_for_a_later_position_does_not_make_a_round_polled(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Polling is for the round an await waits for (or an earlier one): work completing ahead
    of the awaited position is slept on."""
    stream_mod = importlib.import_module("accelkit_cuda.stream")
    backend, ops, x, stream = await _open_with_x(plugin)
    try:
        monkeypatch.setattr(stream_mod, "SPIN_US", 1e6)
        later = _Later(monkeypatch, busy=0)
        woken: list[int] = []
        unregister = stream.add_waiter(stream.submitted + 1000, lambda: woken.append(1))
        assert unregister is not None
        y = ops.add(x, x)
        seq = stream.submitted
        await _until(lambda: stream.completed >= seq, "the add completes")
        unregister()
        assert later.queries
        assert not any(later.queries)  # slept on, never polled
        assert not woken
        np.testing.assert_array_equal(await y.to_host(), np.arange(16, dtype=np.float32) * 2)
    finally:
        await backend.shutdown()


async def test_a_cuda_error_while_polling_is_raised_by_the_await(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cudaEventQuery`` reports a fault of the work as ``cudaEventSynchronize`` would: the
    await of that position raises it, and the backend goes on (a non-sticky error)."""
    from accelkit.errors import AccelError

    stream_mod = importlib.import_module("accelkit_cuda.stream")
    backend, ops, x, stream = await _open_with_x(plugin)
    try:
        monkeypatch.setattr(stream_mod, "SPIN_US", 1e6)
        raised: list[object] = []
        plain = fake_cupy.Event.done

        def done(event: object) -> bool:
            if not raised:
                raised.append(event)
                raise fake_cupy.CUDARuntimeError(1)
            return True

        gate = _gated(backend)
        y = ops.add(x, x)
        seq = stream.submitted

        async def open_gate() -> None:  # once the await below waits
            await _until(lambda: len(stream._waiters), "the await waits")
            monkeypatch.setattr(fake_cupy.Event, "done", property(done))
            gate.set()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(open_gate)
                with pytest.raises(AccelError, match="CUDA error 1"):
                    await stream.wait_for(seq)
        finally:
            gate.set()
        monkeypatch.setattr(fake_cupy.Event, "done", plain)
        assert len(raised) == 1
        np.testing.assert_array_equal(await ops.add(y, x).to_host(), np.arange(16) * 3.0)
    finally:
        await backend.shutdown()


async def test_the_benchmarks_polling_experiment_runs(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench_cuda.py's add round trip and block with and without the completer's polling: they
    run over the stand-in (a stand-in PyTorch beside), under both settings, in one line the GPU
    check keeps whole, and the setting is put back."""
    import types

    bench_cuda = _bench_cuda(monkeypatch)
    stream_mod = importlib.import_module("accelkit_cuda.stream")
    torch_adds: list[int] = []
    torch = types.SimpleNamespace(
        ones=lambda shape, device: np.ones(shape, np.float32),
        cuda=types.SimpleNamespace(synchronize=lambda: torch_adds.append(1)),
    )
    seen: list[float] = []
    spin = stream_mod.SPIN_US
    backend = await _open(plugin)
    try:
        ak_block = _small_block(backend, seen, lambda: stream_mod.SPIN_US)
        line = await bench_cuda._spin_modes(backend, torch, ak_block, spin_us=150.0)
    finally:
        await backend.shutdown()
    assert spin == stream_mod.SPIN_US  # put back
    assert sorted(set(seen)) == [0.0, 150.0]
    assert len(torch_adds) == 1 + 3  # warm-up, then a round each
    assert line.startswith("completer polling 150 us (ACCELKIT_CUDA_SPIN_US"), line
    assert "add round trip" in line
    assert "rounds saw their event done by polling" in line
    assert len(line) < 390
