"""The CUDA stream's completer thread (accelkit_cuda.stream.COMPLETER) over the stand-in: with
"newest" a backlog of positions completes in one wake-up, with "each" in one a position; in both
every result is right, every awaiter wakes, and each position's keepalive is dropped once done.
Which is faster on a GPU is benchmarks/bench_cuda.py's to say (unmeasured when written)."""

from __future__ import annotations

import importlib
import threading
import time
import weakref

import anyio
import fake_cupy
import numpy as np
import pytest
import test_offloop
from test_offloop import Plugin, _open

pytestmark = pytest.mark.anyio

plugin = test_offloop.plugin


@pytest.mark.parametrize("mode", ["each", "newest"])
async def test_a_backlog_completes_in_one_round_with_newest(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    stream_mod = importlib.import_module("accelkit_cuda.stream")
    monkeypatch.setattr(stream_mod, "COMPLETER", mode)
    backend = await _open(plugin)
    try:
        f, ops = backend.tensor_factory, backend.tensor_ops
        x = f.from_host(np.arange(16, dtype=np.float32))
        await backend.synchronize()
        stream = backend.default_stream
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
        stream.submit(lambda: None, keepalive=kept)
        del kept
        y = x
        for _ in range(20):
            y = ops.add(y, x)
        before = stream.completer_rounds
        deadline = time.monotonic() + 30
        while len(stream._pending) < 21:  # the submission thread has recorded all 21
            assert time.monotonic() < deadline
            await anyio.sleep(0.001)
        gate.set()
        got = await y.to_host()
        rounds = stream.completer_rounds - before
    finally:
        await backend.shutdown()
    np.testing.assert_array_equal(got, np.arange(16, dtype=np.float32) * 21)
    assert gone() is None
    if mode == "each":
        assert rounds >= 21
    else:
        # the held first wait (the oldest position), then the rest in one round, then to_host's
        assert rounds <= 4


async def test_the_benchmarks_completer_experiment_runs(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench_cuda.py's block under both completer modes: it runs over the stand-in, in one
    line the GPU check keeps whole, and puts the mode back."""
    import sys

    from test_timeline import BENCHMARKS

    from accelkit.workloads import BlockConfig, block_weights, transformer_block, upload_weights

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    for name in ("bench_core", "bench_cuda", "bench_host", "bench_cuda_attention"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    bench_cuda = importlib.import_module("bench_cuda")
    monkeypatch.setattr(bench_cuda, "BLOCK_ROUNDS", 3)
    stream_mod = importlib.import_module("accelkit_cuda.stream")
    seen: list[str] = []
    mode = stream_mod.COMPLETER
    backend = await _open(plugin)
    try:
        cfg = BlockConfig(batch=1, seq=4, width=16, heads=2)
        w = upload_weights(backend, block_weights(cfg))
        x = backend.tensor_factory.from_host(np.ones((1, 4, 16), np.float32))

        async def ak_block() -> None:
            seen.append(stream_mod.COMPLETER)
            transformer_block(backend, x, w, cfg)
            await backend.synchronize()

        line = await bench_cuda._completer_modes(ak_block)
    finally:
        await backend.shutdown()
    assert stream_mod.COMPLETER == mode  # noqa: SIM300 (the mode put back)
    assert set(seen) == {"each", "newest"}
    assert line.startswith("block by completer mode: each position ")
    assert len(line) < 390
