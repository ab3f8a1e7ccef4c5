"""What a queued op keeps for the garbage collector (over the stand-in for CuPy).

Every object the collector tracks (a function, a closure's cell, a tuple holding objects)
counts toward its next collection while it lives, and is traversed by every collection it
lives through. A caller that runs ahead of the submission thread keeps each queued op's objects
alive until the op has run: with a closure per launch (one cell per captured variable, the
function, the cells' tuple) and another per stream position, an add kept 18 such objects and a
run of 20,000 queued adds triggered 400 collections, three of them full ones of about 18 ms on
a process of 50,000 objects (``benchmarks/bench_host.py``'s collector line). The raw launches and
the stream's work are ``functools.partial`` objects of module functions now: what a queued op
keeps is counted here by type, against what it must keep.
"""

from __future__ import annotations

import gc
import importlib
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_fast_rows import _lagging, _ready
from test_offloop import Plugin, _open, plugin  # noqa: F401

pytestmark = pytest.mark.anyio
BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"

#: Each case: the call, its NumPy reference, and how many tracked objects a queued call may
#: keep. Every raw launch keeps its launch (a partial and its arguments' tuple), its stream
#: work (the same two) and the submission queue's entry ``(work, stream)``: 5. Binary's launch
#: holds blocks, not tensors (``Block.use``): its output dies at once. A launch that holds its
#: tensors until it runs (unary, the row kernels, linear) also keeps the output: the Tensor,
#: its DeviceBuffer, its Storage and its last-writer record ``(stream, position)``, and a shape
#: of its own where it is not its input's (linear): 9 or 10.
CASES: dict[str, tuple[Callable[..., Any], Callable[..., Any], int]] = {
    "add": (lambda ops, x, w, b: ops.add(x, x), lambda x, w, b: x + x, 5),
    "relu": (lambda ops, x, w, b: ops.relu(x), lambda x, w, b: np.maximum(x, 0), 9),
    "softmax": (
        lambda ops, x, w, b: ops.softmax(x, axis=-1),
        lambda x, w, b: (
            np.exp(x - x.max(-1, keepdims=True))
            / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)
        ),
        9,
    ),
    "linear": (lambda ops, x, w, b: ops.linear(x, w, b), lambda x, w, b: x @ w.T + b, 10),
}

#: Queued calls counted.
CALLS = 50


def _queued(backend: Any, call: Callable[[], object]) -> tuple[list[Any], object]:
    """``CALLS`` calls of ``call`` queued behind a held submission thread: the objects the
    collector tracks that they left alive (the youngest generation after a full collection
    holds only what was made since; the collector is off meanwhile), and the last call's
    result. The others' results are dropped as they are made, as a loop drops them."""
    gate = _lagging(backend)
    try:
        gc.collect()
        gc.disable()
        try:
            for _ in range(CALLS):
                last = call()
            young = gc.get_objects(generation=0)
        finally:
            gc.enable()
    finally:
        gate.set()
    return young, last


def _kind(o: object) -> str:
    return type(o).__name__


@pytest.mark.parametrize("op", list(CASES))
async def test_gc_tracked_objects_per_queued_op(
    plugin: Plugin,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    op: str,
) -> None:
    """A queued op keeps no closure (no function, no cell) and at most the objects its case
    names; the ops still compute NumPy's answer once the submission thread runs them."""
    import importlib

    import fake_cupy

    # The stand-in's cuBLAS (NumPy GEMMs), for the linear's raw launch (as test_blas does).
    blas = importlib.import_module("accelkit_cuda.blas")
    monkeypatch.setattr(blas, "_cublas", fake_cupy.Cublas())
    call, reference, most = CASES[op]
    rng = np.random.default_rng(5)
    x_h = rng.standard_normal((16, 32)).astype(np.float32)
    w_h = rng.standard_normal((24, 32)).astype(np.float32)
    b_h = rng.standard_normal(24).astype(np.float32)
    backend = await _open(plugin)
    try:
        await _ready(backend)
        f, ops = backend.tensor_factory, backend.tensor_ops
        x, w, b = f.from_host(x_h), f.from_host(w_h), f.from_host(b_h)
        # Warm: cuBLAS found, launch configurations kept, and the pool holding a block for
        # each queued output (a launch that holds its output keeps its block from reuse).
        await backend.synchronize()
        _queued(backend, lambda: call(ops, x, w, b))
        await backend.synchronize()
        young, last = _queued(backend, lambda: call(ops, x, w, b))
        got = await last.to_host()  # type: ignore[attr-defined]
    finally:
        await backend.shutdown()
    kinds = Counter(_kind(o) for o in young)
    assert not kinds["function"], kinds
    assert not kinds["cell"], kinds
    # (and, once each: the last result with its buffer, storage and position record, and the
    # held thread's wait, its condition and lock: about a dozen more)
    assert len(young) <= most * CALLS + 16, (len(young) / CALLS, kinds)
    want = reference(x_h.astype(np.float64), w_h.astype(np.float64), b_h.astype(np.float64))
    # f32 against float64: a sum of 32 products of magnitude <= |x||w| plus the bias
    # (linear), a row of 32 exponentials summed and divided (softmax), or one rounding.
    bound = np.abs(x_h) @ np.abs(w_h).T + np.abs(b_h) if op == "linear" else np.abs(want)
    assert np.all(np.abs(got - want) <= 35 * 2.0**-24 * bound), op


async def test_bench_hosts_collector_figure_counts_collections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bench_host.collector_cost (bench_host's and bench_cuda's collector figure): a side that
    leaves a reference cycle a call brings collections on, about one a threshold's worth of
    cycles (the youngest generation's 700 allocations); one that allocates nothing tracked
    brings none; the collector is on again and its callback gone afterwards."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delitem(sys.modules, "bench_host", raising=False)
    bench_host = importlib.import_module("bench_host")

    def cycle() -> None:
        a: list[object] = []
        a.append(a)

    def nothing() -> None:
        return None

    callbacks = list(gc.callbacks)
    got = await bench_host.collector_cost(
        {"cycles": (cycle, nothing), "none": (nothing, nothing)}, 1000, 3
    )
    assert gc.isenabled()
    assert gc.callbacks == callbacks
    threshold = gc.get_threshold()[0]
    # Each collection frees the cycles made since the last; the rate is one per `threshold`
    # cycles (give or take the objects the loop's own frames make).
    assert 0.5 * 1000 / threshold <= got["cycles"][1] <= 2 * 1000 / threshold, got
    assert got["cycles"][0] > 0
    assert got["none"] == (0.0, 0.0)
