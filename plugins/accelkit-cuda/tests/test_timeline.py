"""The step timeline (``accelkit_cuda.timeline``, benchmarks/bench_cuda.py's block timeline) and
the per-position costs it counts, over the stand-in for CuPy (no GPU): the benchmark's code runs
and its figures are consistent; a warm stream records its end-of-position events again instead
of making new ones; the submission thread takes all that is queued in one round. The timings
themselves mean something only on a GPU (unverified here)."""

from __future__ import annotations

import importlib
import math
import sys
import threading
from pathlib import Path

import fake_cupy
import numpy as np
import pytest
import test_offloop
from test_offloop import Plugin, _open

pytestmark = pytest.mark.anyio

#: The plugin's modules over the stand-in (test_offloop's fixture, found here by its name).
plugin = test_offloop.plugin

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def _count(name: str) -> int:
    return sum(1 for n, _ in fake_cupy.CALLS if n == name)


async def test_the_benchmarks_block_timeline_runs(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delitem(sys.modules, "bench_core", raising=False)
    bench_core = importlib.import_module("bench_core")
    from accelkit.workloads import BlockConfig, block_weights, transformer_block, upload_weights

    backend = await _open(plugin)
    try:
        cfg = BlockConfig(batch=1, seq=4, width=16, heads=2)
        w = upload_weights(backend, block_weights(cfg))
        x = backend.tensor_factory.from_host(np.ones((1, 4, 16), np.float32))
        steps = 5
        m = await bench_core.block_timeline(
            backend, lambda: transformer_block(backend, x, w, cfg), steps
        )
        timeline = importlib.import_module("accelkit_cuda.timeline")
        assert set(m) == set(timeline.FIELDS)
        assert all(math.isfinite(v) and v >= 0 for v in m.values()), m
        # In the order a step runs: submitted and launched before the await returned.
        assert m["first_launch_ms"] <= m["launched_ms"] <= m["done_ms"]
        assert m["submit_ms"] <= m["done_ms"]
        assert m["completed_ms"] <= m["done_ms"]
        assert m["thread_busy_ms"] <= m["done_ms"]
        assert m["thread_max_wait_ms"] <= m["thread_waited_ms"]
        # The block is many closures, each one position; the await's copy adds positions of
        # its own. A position ends in a recorded event, or shares the next one's where the
        # thread's next closure is the stream's too (test_completer.py); at least the step's
        # last position records one. Warm, a step reuses the events the previous step's
        # positions returned to the pool (test_a_warm_stream_makes_no_new_event_per_position
        # bounds the total).
        assert m["closures"] >= 10
        assert m["positions"] >= m["closures"]
        assert 1 <= m["events_recorded"] <= m["positions"]
        assert m["events_created"] <= m["events_recorded"]
        # A round an event ("each"), or fewer where events were pending together.
        stream = importlib.import_module("accelkit_cuda.stream")
        if stream.COMPLETER == "each":
            assert m["completer_rounds"] == m["events_recorded"]
        else:
            assert 1 <= m["completer_rounds"] <= m["events_recorded"]
        assert 1 <= m["thread_rounds"] <= m["closures"] + 3
        lines = bench_core.describe_timeline(m, steps)
        assert len(lines) == 2
        assert all(len(line) < 390 for line in lines)  # run.sh cuts summary lines at 400
        assert not any(name == "submit" for name in vars(backend.thread))  # tracing is off
    finally:
        await backend.shutdown()


async def test_the_timeline_on_the_cpu_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    bench_core = importlib.import_module("bench_core")
    import accelkit as ak
    from accelkit.workloads import BlockConfig, block_weights, transformer_block, upload_weights

    async with ak.open_backend("cpu") as backend:
        cfg = BlockConfig(batch=1, seq=4, width=16, heads=2)
        w = upload_weights(backend, block_weights(cfg))
        x = backend.tensor_factory.from_host(np.ones((1, 4, 16), np.float32))
        m = await bench_core.block_timeline(
            backend, lambda: transformer_block(backend, x, w, cfg), 3
        )
    assert set(m) == {"submit_ms", "done_ms"}
    assert 0 <= m["submit_ms"] <= m["done_ms"]
    assert len(bench_core.describe_timeline(m, 3)) == 1


async def test_a_warm_stream_makes_no_new_event_per_position(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an event for each position (no position sharing the next one's: ``COVER_MAX``
    0), each ends in a blocking-sync event; once the completer has seen one complete, it is
    recorded again for a later position: rounds of 40 positions make at most 40 events in all
    (as many as were ever outstanding), not one per position (200 before)."""
    monkeypatch.setattr(importlib.import_module("accelkit_cuda.stream"), "COVER_MAX", 0)
    backend = await _open(plugin)
    try:
        x = backend.tensor_factory.from_host(np.ones((8, 8), np.float32))
        await backend.synchronize()
        stream = backend.default_stream
        created, recorded = _count("Event()"), stream.events_recorded
        for _ in range(5):
            y = x
            for _ in range(40):
                y = y + 1.0
            got = await y.to_host()
        np.testing.assert_array_equal(got, np.full((8, 8), 41.0, np.float32))
        positions = stream.events_recorded - recorded
        assert positions >= 200
        assert _count("Event()") - created <= 41
        assert stream.events_created <= _count("Event()")
    finally:
        await backend.shutdown()


async def test_a_failed_event_is_not_recorded_again(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event whose synchronize failed is dropped, not handed back for reuse; the failure is
    raised by the await that covers its position, as before."""
    from accelkit.errors import AccelError

    backend = await _open(plugin)
    try:
        x = backend.tensor_factory.from_host(np.ones((4,), np.float32))
        await backend.synchronize()
        stream = backend.default_stream
        spares_before = len(stream._spare_events)
        failing: list[object] = []
        plain = fake_cupy.Event.synchronize

        def synchronize(self: object) -> None:
            if not failing:
                failing.append(self)
                raise fake_cupy.CUDARuntimeError(999)  # an unknown, not sticky, error
            plain(self)  # type: ignore[arg-type]

        monkeypatch.setattr(fake_cupy.Event, "synchronize", synchronize)
        y = x + 1.0
        with pytest.raises(AccelError):
            await y.to_host()
        monkeypatch.setattr(fake_cupy.Event, "synchronize", plain)
        assert failing
        assert all(e is not failing[0] for e in stream._spare_events)
        assert len(stream._spare_events) <= spares_before + 2
    finally:
        await backend.shutdown()


async def test_the_submission_thread_takes_all_queued_work_in_one_round(plugin: Plugin) -> None:
    """50 closures queued while the thread is busy run in order, in one round (one lock round
    trip), not one round each; tracing times each of them and costs nothing once stopped."""
    submission = importlib.import_module("accelkit_cuda.submission")
    thread = submission.SubmissionThread(0, "test")
    gate, running = threading.Event(), threading.Event()
    ran: list[int] = []
    try:
        thread.submit(lambda: (running.set(), gate.wait()))
        assert running.wait(10)
        rounds = thread.rounds
        trace = thread.start_trace()
        for i in range(50):
            thread.submit(lambda i=i: ran.append(i))
        thread.stop_trace()
        assert "submit" not in vars(thread)
        gate.set()
        thread.call_blocking(lambda: None)
        assert ran == list(range(50))
        assert thread.rounds - rounds <= 2  # the 50, and perhaps the call on its own
        assert len(trace) == 50
        assert all(q <= s <= e for q, s, e in trace)
        assert [s for _, s, _ in trace] == sorted(s for _, s, _ in trace)
    finally:
        gate.set()
        thread.close()


async def test_the_benchmarks_switch_interval_experiment_runs(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench_cuda.py's block at other GIL switch intervals: it runs over the stand-in, says
    both figures and the timeline in lines the GPU check keeps whole, and puts the process's
    switch interval back."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    for name in ("bench_core", "bench_cuda", "bench_host"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    bench_cuda = importlib.import_module("bench_cuda")
    monkeypatch.setattr(bench_cuda, "BLOCK_ROUNDS", 3)
    from accelkit.workloads import BlockConfig, block_weights, transformer_block, upload_weights

    backend = await _open(plugin)
    default = sys.getswitchinterval()  # the one opening a backend chose
    try:
        cfg = BlockConfig(batch=1, seq=4, width=16, heads=2)
        w = upload_weights(backend, block_weights(cfg))
        x = backend.tensor_factory.from_host(np.ones((1, 4, 16), np.float32))

        async def ak_block() -> None:
            transformer_block(backend, x, w, cfg)
            await backend.synchronize()

        lines = await bench_cuda._switch_intervals(
            backend, ak_block, lambda: transformer_block(backend, x, w, cfg)
        )
    finally:
        await backend.shutdown()
    assert sys.getswitchinterval() == default
    assert len(lines) == 3
    assert lines[0].startswith("block at a 0.2 ms GIL switch interval")
    assert all(len(line) < 390 for line in lines)


async def test_bench_hosts_thread_probe_times_the_submission_thread(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench_host.ThreadCPU (bench_host's and bench_cuda's "submission thread" figure): the
    closures run under it are timed on the thread, they keep their stream tag (a chain still
    shares one end event), and the thread's ``submit`` is its own again afterwards."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delitem(sys.modules, "bench_host", raising=False)
    bench_host = importlib.import_module("bench_host")
    backend = await _open(plugin)
    try:
        ops = backend.tensor_ops
        x = backend.tensor_factory.from_host(np.ones((8, 8), np.float32))
        ys = [ops.add(x, x) for _ in range(10)]  # the pool's blocks, allocated now (a
        del ys  # cudaMalloc is a closure of the thread's own: it ends a chain)
        await backend.synchronize()
        stream = backend.default_stream
        gate = threading.Event()
        backend.thread.submit(lambda: gate.wait(30))
        events = stream.events_recorded
        with bench_host.ThreadCPU(backend) as probe:
            ys = [ops.add(x, x) for _ in range(10)]
        gate.set()
        await backend.synchronize()
        assert "submit" not in vars(backend.thread)
        assert probe.ns > 0
        assert stream.events_recorded - events <= 2  # the ten shared one event (+ synchronize's)
        np.testing.assert_array_equal(await ys[0].to_host(), np.full((8, 8), 2.0, np.float32))
    finally:
        await backend.shutdown()


async def test_bench_hosts_block_figure_runs(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``bench_host.py --backend cuda --standin --block`` (the host's cost of a tiny block):
    one line, its figures finite, the caller's share of a block (its CPU time at most the
    process's; its Python calls and bytecodes, a few per op at least), the end events and
    completer rounds a block counted (one a block at least, the block's 16 closures and the
    read's at most)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delitem(sys.modules, "bench_host", raising=False)
    bench_host = importlib.import_module("bench_host")
    monkeypatch.setattr(
        importlib.import_module("accelkit_cuda.blas"), "_cublas", fake_cupy.Cublas()
    )
    monkeypatch.setattr(bench_host, "STANDIN_SYNC", [fake_cupy.CALLS.clear])
    (line,) = await bench_host.block_host("cuda", blocks=2, rounds=3)
    assert line.startswith("transformer block 1x8x32 on cuda (cuda:0 (stand-ins"), line
    wall = float(line.split("wall ")[1].split(" us")[0])
    cpu = float(line.split("process CPU ")[1].split(" us")[0])
    events = float(line.split("; ")[-1].split(" end events")[0])
    rounds = float(line.split("end events, ")[1].split(" completer")[0])
    caller = float(line.split("submitting it: ")[1].split(" us CPU")[0])
    calls = float(line.split("us CPU, ")[1].split(" Python calls")[0])
    bytecodes = float(line.split("Python calls, ")[1].split(" bytecodes")[0])
    assert wall > 0
    assert cpu > 0
    assert 0 < caller <= cpu
    # 21 ops (16 launches, 5 views): each at least a call into TensorOps and its checks.
    assert 21 * 2 <= calls <= bytecodes
    assert 1 <= events <= 17
    assert 1 <= rounds <= events
