"""Host time per small op: accelkit against PyTorch and NumPy in the same process, interleaved.

Run ``python benchmarks/bench_host.py [--calls N] [--rounds R] [--json PATH]`` (PyTorch is
optional: without it the PyTorch column is empty). Each op is a 64x64 f32 operation (add, mul,
matmul, exp, relu, a row sum, an add of a scalar) submitted ``calls`` times back to back; a
round times one block of calls for each side in turn (accelkit, PyTorch, NumPy), and the figure
is the median over the rounds of the mean time per call. On the CPU backend a 64x64 op runs
inline when its stream is idle, so the figure is what a caller waits for each call, compute
included, as it is for PyTorch CPU (on one thread) and NumPy; the difference is the per-op
overhead of the submission path (validation, output allocation from the pool, the launch,
stream bookkeeping).

``--backend cuda --standin`` runs the CUDA backend without a GPU, over the stand-in for CuPy of
the plugin's tests (``plugins/accelkit-cuda/tests/fake_cupy.py``: the raw elementwise kernels run
as NumPy on the submission thread): the figure is then the caller thread's cost of a submission
(validation, allocation, the closure queued), best read with ``--cpu-time``. ``--profile`` adds,
per case, where accelkit's calls spend that time (cProfile, the functions with the most own
time), ``--cases add,mul`` picks cases. For example::

    python benchmarks/bench_host.py --backend cuda --standin --cpu-time --cases add --profile

``--block`` times a tiny transformer block instead (:func:`block_host`: wall and process CPU a
block, every thread's; on CUDA the end events and completer rounds a block), with ``--inline``
twice (interleaved rounds with plain launches queued and made on the caller's thread)::

    python benchmarks/bench_host.py --backend cuda --standin --block [--inline]

``benchmarks/bench_cuda.py`` runs the same cases on the CUDA backend against PyTorch CUDA
(:func:`host_times` with ``sync``): there the figure is the host time to submit, the device
work being awaited once per round outside the timed block.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import json
import pstats
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np

import accelkit as ak

#: (label, accelkit call on (ops, a, b), PyTorch call on (torch, a, b), NumPy call on (a, b)).
Case = tuple[
    str, Callable[[Any, Any, Any], Any], Callable[[Any, Any, Any], Any], Callable[..., Any]
]

CASES: list[Case] = [
    ("add", lambda o, a, b: o.add(a, b), lambda t, a, b: t.add(a, b), np.add),
    ("mul", lambda o, a, b: o.mul(a, b), lambda t, a, b: t.mul(a, b), np.multiply),
    ("add scalar", lambda o, a, b: o.add(a, 1.5), lambda t, a, b: t.add(a, 1.5),
     lambda a, b: np.add(a, np.float32(1.5))),
    ("matmul", lambda o, a, b: o.matmul(a, b), lambda t, a, b: t.matmul(a, b), np.matmul),
    ("exp", lambda o, a, b: o.exp(a), lambda t, a, b: t.exp(a), lambda a, b: np.exp(a)),
    ("relu", lambda o, a, b: o.relu(a), lambda t, a, b: t.relu(a),
     lambda a, b: np.maximum(a, np.float32(0))),
    ("sum rows", lambda o, a, b: o.sum(a, -1), lambda t, a, b: t.sum(a, -1),
     lambda a, b: np.sum(a, -1)),
    ("linear", lambda o, a, b: o.linear(a, b), lambda t, a, b: t.nn.functional.linear(a, b),
     lambda a, b: a @ b.T),
    ("permute", lambda o, a, b: o.permute(a, (1, 0)),
     lambda t, a, b: t.permute(a, (1, 0)).contiguous(), lambda a, b: np.ascontiguousarray(a.T)),
]  # fmt: skip


class ThreadCPU:
    """The CPU time a backend's submission thread (CUDA's: ``backend.thread``) spends in the
    closures queued while it is on (:meth:`SubmissionThread.start_trace` with
    ``time.thread_time``): the other half of an op's host cost, which the caller's clock does
    not see and which, on a GPU, competes with the caller for the interpreter lock. Read
    :attr:`ns` once the closures have run (after a synchronize); nothing on a backend without
    a submission thread."""

    def __init__(self, backend: Any) -> None:
        self.thread = getattr(backend, "thread", None)
        self._trace: list[tuple[float, float, float]] = []

    @property
    def ns(self) -> float:
        return sum(end - start for _, start, end in self._trace) * 1e9

    def __enter__(self) -> ThreadCPU:
        if self.thread is not None:
            self._trace = self.thread.start_trace(time.thread_time)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.thread is not None:
            self.thread.stop_trace()


#: The clock of the timed blocks: wall time, or with ``--cpu-time`` the calling thread's CPU
#: time (on a shared machine, time the thread spent descheduled is not counted; only for work
#: that runs on the calling thread, as the CPU backend's small ops do).
CLOCK: list[Callable[[], int]] = [time.perf_counter_ns]


def block_us(fn: Callable[[], object], calls: int) -> float:
    """Mean microseconds per call of ``calls`` back-to-back calls."""
    clock = CLOCK[0]
    t0 = clock()
    for _ in range(calls):
        fn()
    return (clock() - t0) / calls / 1e3


async def host_times(
    sides: dict[str, tuple[Callable[[], object], Callable[[], Awaitable[None] | None]]],
    calls: int,
    rounds: int,
) -> dict[str, float]:
    """Median over ``rounds`` of each side's mean microseconds per call, the sides taking
    turns within each round. A side is ``(call, sync)``: ``sync`` runs after its block,
    outside the timing (awaited where it returns an awaitable); the garbage collector is off
    within a block, as ``timeit`` does, and runs between blocks."""
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for call, sync in sides.values():  # warm: kernels compiled, pools filled
        for _ in range(min(calls, 50)):
            call()
        done = sync()
        if done is not None:
            await done
    for _ in range(rounds):
        for name, (call, sync) in sides.items():
            gc.collect()
            gc.disable()
            try:
                samples[name].append(block_us(call, calls))
            finally:
                gc.enable()
            done = sync()
            if done is not None:
                await done
    return {name: statistics.median(s) for name, s in samples.items()}


def _collector_timer(
    clock: Callable[[], int],
) -> tuple[Callable[[str, dict[str, Any]], None], list[int]]:
    """A ``gc.callbacks`` entry, and the list it adds each collection's time (``clock``'s
    units) and count to: ``[time, collections, when the running one started]``."""
    spent = [0, 0, 0]

    def timer(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            spent[2] = clock()
        else:
            spent[0] += clock() - spent[2]
            spent[1] += 1

    return timer, spent


async def collector_cost(
    sides: dict[str, tuple[Callable[[], object], Callable[[], Awaitable[None] | None]]],
    calls: int,
    rounds: int,
) -> dict[str, tuple[float, float]]:
    """Per side of :func:`host_times`: the garbage collector's time a call (microseconds, by
    :data:`CLOCK`) and its collections a 1000 calls, over ``rounds`` blocks of ``calls`` calls
    (each followed by its ``sync``) with the collector on, as in an application (the timed
    blocks of :func:`host_times` run with it off, as ``timeit`` does). What a side allocates and
    keeps alive while its work is queued brings collections on; each is timed through
    ``gc.callbacks`` on the thread that triggered it (the caller's or the submission thread's:
    with ``--cpu-time``, that thread's CPU time). The figure is mostly young-generation
    collections: each side starts from a full collection (``gc.collect()``), which resets what
    brings the next full one on, so a window of a few rounds seldom holds one. A full
    collection costs milliseconds in a process of many objects and stalls the thread it runs
    on; how often an application meets one grows with what its ops keep alive, which
    ``plugins/accelkit-cuda/tests/test_gc_objects.py`` counts. It depends, too, on how far the
    caller runs ahead of the submission thread (``calls`` queued a block)."""
    if not gc.isenabled():
        raise RuntimeError("collector_cost: the garbage collector is off; nothing to measure")
    out: dict[str, tuple[float, float]] = {}
    for name, (call, sync) in sides.items():
        timer, spent = _collector_timer(CLOCK[0])
        gc.collect()
        gc.callbacks.append(timer)
        try:
            for _ in range(rounds):
                for _ in range(calls):
                    call()
                done = sync()
                if done is not None:
                    await done
        finally:
            gc.callbacks.remove(timer)
        n = calls * rounds
        out[name] = (spent[0] / n / 1e3, spent[1] / n * 1e3)
    return out


def profile_lines(fn: Callable[[], object], calls: int, top: int = 12) -> list[str]:
    """Where ``calls`` calls of ``fn`` spend their time: cProfile's ``top`` functions by own
    time, as ``us/call  calls/call  function`` lines (microseconds per call of ``fn``; under
    the profiler every function call costs more, so read the shares, not the sum)."""
    # Wall time (time.perf_counter): a thread CPU clock is a system call per function event,
    # more than most of the functions cost.
    prof = cProfile.Profile(time.perf_counter)
    gc.collect()
    gc.disable()
    try:
        prof.enable()
        for _ in range(calls):
            fn()
        prof.disable()
    finally:
        gc.enable()
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (path, line, name), (_cc, nc, tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if name == "<lambda>" and path == __file__:
            continue
        where = f"{Path(path).name}:{line}" if line else path
        rows.append((tt, nc, f"{name} ({where})"))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    head = f"function (profiled: {total / calls * 1e6:.1f} us/call)"
    out = [f"{'us/call':>9}{'share':>7}{'n/call':>8}  {head}"]
    for tt, nc, what in rows[:top]:
        out.append(f"{tt / calls * 1e6:>9.2f}{tt / total:>7.0%}{nc / calls:>8.1f}  {what}")
    return out


def python_work(fn: Callable[[], object], calls: int) -> tuple[float, float]:
    """Python function calls and bytecodes executed per call of ``fn`` on this thread (a
    trace function counts them; the loop and ``fn``'s own frame are taken out): what a
    change to the submission path's Python removes, exactly, where wall-clock figures of a
    few microseconds move by half between runs on a shared machine. Calls into C (a NumPy
    scalar, a lock) count one bytecode each, whatever they cost."""
    counts = {"call": 0, "opcode": 0}

    def tracer(frame: Any, event: str, arg: object) -> Any:
        frame.f_trace_opcodes = True
        if event in counts:
            counts[event] += 1
        return tracer

    def per_call(f: Callable[[], object]) -> tuple[float, float]:
        counts.update(call=0, opcode=0)
        sys.settrace(tracer)
        try:
            for _ in range(calls):
                f()
        finally:
            sys.settrace(None)
        return counts["call"] / calls, counts["opcode"] / calls

    frames, ops = per_call(fn)
    frames0, ops0 = per_call(lambda: None)
    return frames - frames0, ops - ops0


def install_cuda_standin() -> None:
    """Make ``open_backend("cuda")`` open the CUDA backend over the plugin tests' stand-in for
    CuPy (no GPU: one 1 GiB device, NVRTC compiles answered with a placeholder binary, the raw
    elementwise kernels run as NumPy on the submission thread), as their ``test_offloop``
    does. Call before anything imports ``accelkit_cuda``."""
    tests = Path(__file__).resolve().parent.parent / "plugins" / "accelkit-cuda" / "tests"
    sys.path.insert(0, str(tests))
    import fake_cupy

    sys.modules.update(fake_cupy.install())
    from accelkit_cuda import backend, driver, nvrtc

    attrs = {
        driver.Attr.COMPUTE_CAPABILITY_MAJOR: 9, driver.Attr.COMPUTE_CAPABILITY_MINOR: 0,
        driver.Attr.MULTIPROCESSOR_COUNT: 132, driver.Attr.CLOCK_RATE: 1_980_000,
        driver.Attr.MAX_THREADS_PER_BLOCK: 1024, driver.Attr.WARP_SIZE: 32,
        driver.Attr.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 227 * 1024,
    }  # fmt: skip
    props = driver.DeviceProps(0, "Stand-in GPU", 1 << 30, attrs, 12040)

    class Calls(fake_cupy.Cublas):
        """The stand-in's cuBLAS, its calls not recorded, its GEMMs computed (NumPy, float64)
        while :data:`STANDIN_GEMMS` says so: :func:`block_host` turns that off while it times
        (the host path alone), the small ops' answers are checked with it on."""

        def _note(self, name: str, args: tuple[Any, ...]) -> None:
            return None

        def gemm_ex(self, *args: Any) -> None:
            if STANDIN_GEMMS[0]:
                super().gemm_ex(*args)

        def gemm_strided_batched_ex(self, *args: Any) -> None:
            if STANDIN_GEMMS[0]:
                super().gemm_strided_batched_ex(*args)

    class LtCalls(fake_cupy.CublasLt):
        """The stand-in's cuBLASLt (a linear's bias in the epilogue), as :class:`Calls`."""

        def _note(self, name: str, args: tuple[Any, ...]) -> None:
            return None

        def matmul(self, *args: Any) -> None:
            if STANDIN_GEMMS[0]:
                super().matmul(*args)

    from accelkit_cuda import blas, blaslt

    blas._cublas = Calls()
    blaslt._lt = LtCalls()
    backend._devices = lambda: [props]  # type: ignore[attr-defined]

    class Driver:
        def param_sizes(self, function: int) -> None:
            return None

        def reset_primary_context(self, index: int) -> None:
            return None

    driver.driver = lambda: Driver()  # type: ignore[assignment,return-value]
    compiled = nvrtc.Compiled(b"\0cubin", "cubin", "", "stand-in")
    nvrtc.compile_cached = lambda *a, **k: compiled  # type: ignore[assignment]
    # The stand-in records every CUDA call it answers (its tests read them): keep it short.
    STANDIN_SYNC.append(fake_cupy.CALLS.clear)


@contextlib.asynccontextmanager
async def open_bench_backend(name: str) -> AsyncIterator[Any]:
    """``ak.open_backend(name)``; over the stand-in (:func:`install_cuda_standin`) the CUDA
    backend itself, opened as the plugin's tests open it (its probe needs a driver)."""
    if not STANDIN_SYNC:
        async with ak.open_backend(name) as backend:
            yield backend
        return
    from accelkit_cuda.backend import CUDABackend

    from accelkit.device import Device

    backend = CUDABackend()
    await backend.initialize(Device("cuda", 0))
    try:
        yield backend
    finally:
        await backend.shutdown()


#: Run after each timed block of accelkit's side (the stand-in's call records are dropped).
STANDIN_SYNC: list[Callable[[], None]] = []
#: Whether the stand-in's cuBLAS computes its GEMMs (:func:`install_cuda_standin`).
STANDIN_GEMMS = [True]


#: bench_core's block at a size whose device work is negligible: what the host paths cost
#: (:func:`block_host`; bench_cuda.py's tiny block against PyTorch).
TINY_BLOCK = {"batch": 1, "seq": 8, "width": 32, "heads": 2}


async def block_host(
    backend_name: str, blocks: int = 20, rounds: int = 15, inline: bool = False
) -> list[str]:
    """The host's cost of bench_core's transformer block at a tiny size (1 x 8 x 32, 2 heads:
    the device's work is negligible, the host path is what is timed): wall time and the
    process's CPU time (every thread: the caller, a submission thread, a completer) a block,
    each block awaited, median of ``rounds`` rounds of ``blocks``; of it, the caller thread's
    CPU time submitting a block (the ops' Python: validation, allocation, closures queued),
    and the Python function calls and bytecodes that submission runs (:func:`python_work`:
    exact, where a few microseconds move by half between runs); on CUDA also the stream's
    end-of-position events and completer rounds a block. ``--standin`` runs it over the
    stand-ins for CuPy and cuBLAS (whose GEMMs compute nothing while it times: only the
    calls). ``inline`` (CUDA): each round twice, interleaved, with plain launches queued for
    the submission thread and made on the caller's thread (``accelkit_cuda.stream.INLINE``),
    a line each, with the positions a block launched inline."""
    from accelkit.workloads import BlockConfig, block_weights, transformer_block, upload_weights

    cfg = BlockConfig(**TINY_BLOCK)
    rng = np.random.default_rng(3)
    x_h = rng.standard_normal((cfg.batch, cfg.seq, cfg.width)).astype(np.float32)
    module: Any = None
    modes: tuple[bool | None, ...] = (None,)
    if inline:
        from accelkit_cuda import stream as module

        modes = (False, True)
    figures: dict[bool | None, dict[str, list[Any]]] = {
        m: {"walls": [], "cpus": [], "callers": [], "counts": []} for m in modes
    }
    works: dict[bool | None, list[float]] = {}
    async with open_bench_backend(backend_name) as backend:
        fast = getattr(getattr(backend.tensor_ops, "kernels", None), "fast", None)
        if fast is not None:
            await fast.load()
        w = upload_weights(backend, block_weights(cfg))
        x = backend.tensor_factory.from_host(x_h)
        for _ in range(10):
            await transformer_block(backend, x, w, cfg).to_host()
        stream = getattr(backend, "default_stream", None)

        def counters() -> tuple[int, int, int, int]:
            return (
                getattr(stream, "events_recorded", 0),
                getattr(stream, "completer_rounds", 0),
                getattr(stream, "inline_launches", 0),
                getattr(stream, "submitted", 0),
            )

        STANDIN_GEMMS[0] = False  # (the stand-in's: its GEMMs' NumPy is not the host path)
        saved = None if module is None else module.INLINE
        try:
            for _ in range(rounds):
                for mode in modes:
                    if mode is not None:
                        module.INLINE = mode
                        await transformer_block(backend, x, w, cfg).to_host()  # its blocks
                    fig = figures[mode]
                    before = counters()
                    caller = 0.0
                    t0, c0 = time.perf_counter(), time.process_time()
                    for _ in range(blocks):
                        t = time.thread_time()
                        y = transformer_block(backend, x, w, cfg)
                        caller += time.thread_time() - t
                        await y.to_host()
                    fig["walls"].append((time.perf_counter() - t0) / blocks * 1e6)
                    fig["cpus"].append((time.process_time() - c0) / blocks * 1e6)
                    fig["callers"].append(caller / blocks * 1e6)
                    after = counters()
                    fig["counts"].append(
                        tuple((b - a) / blocks for a, b in zip(before, after, strict=True))
                    )
                    for clear in STANDIN_SYNC:
                        clear()
            # Counted in steady state: each block's submission finds the last one's
            # intermediates released (as in the rounds above, where each block is awaited).
            for mode in modes:
                if mode is not None:
                    module.INLINE = mode
                work = [0.0, 0.0]
                for _ in range(3):
                    await backend.synchronize()
                    work = list(python_work(lambda: transformer_block(backend, x, w, cfg), 1))
                    await backend.synchronize()
                works[mode] = work
        finally:
            STANDIN_GEMMS[0] = True
            if module is not None:
                module.INLINE = saved
        device = str(backend.device) + (" (stand-ins for CuPy and cuBLAS)" if STANDIN_SYNC else "")
    lines = []
    for mode in modes:
        fig, work = figures[mode], works[mode]
        label = "" if mode is None else (" inline launches" if mode else " queued launches")
        line = (
            f"transformer block 1x8x32 on {backend_name}{label} ({device}): wall"
            f" {statistics.median(fig['walls']):.0f} us, process CPU"
            f" {statistics.median(fig['cpus']):.0f} us a block (median of {rounds} rounds of"
            f" {blocks}{', interleaved' if mode is not None else ''}); the caller submitting"
            f" it: {statistics.median(fig['callers']):.0f} us CPU, {work[0]:.0f} Python calls,"
            f" {work[1]:.0f} bytecodes"
        )
        if stream is not None and hasattr(stream, "events_recorded"):
            events, completions, inlined, positions = (
                statistics.median(c[i] for c in fig["counts"]) for i in range(4)
            )
            line += f"; {events:.1f} end events, {completions:.1f} completer rounds a block"
            if mode:
                line += f"; {inlined:.0f} of its {positions:.0f} positions launched inline"
        lines.append(line)
    return lines


async def run(
    backend_name: str, calls: int, rounds: int, cases: list[str] | None = None,
    profile: bool = False,
) -> dict[str, Any]:  # fmt: skip
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and backend_name == "cpu":
        # One thread, as every side's small op runs on the calling thread: PyTorch's spare
        # threads spin after a call and, on a small or shared machine, take the others' cores.
        torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    a_h = rng.standard_normal((64, 64)).astype(np.float32)
    b_h = rng.standard_normal((64, 64)).astype(np.float32)
    report: dict[str, Any] = {
        "backend": backend_name,
        "calls": calls,
        "rounds": rounds,
        "numpy": np.__version__,
        "torch": None if torch is None else torch.__version__,
        "clock": "thread CPU time" if CLOCK[0] is time.thread_time_ns else "wall time",
        "rows": [],
        "profiles": {},
    }
    async with open_bench_backend(backend_name) as backend:
        f, ops = backend.tensor_factory, backend.tensor_ops
        a, b = f.from_host(a_h), f.from_host(b_h)
        report["device"] = str(backend.device) + (" (stand-in for CuPy)" if STANDIN_SYNC else "")
        fast = getattr(ops.kernels, "fast", None)  # CUDA's raw elementwise kernels
        if fast is not None:
            await fast.load()  # as initialize does (a no-op where it did)

        def no_sync() -> None:
            return None

        async def ak_sync() -> None:
            await backend.synchronize()
            for clear in STANDIN_SYNC:
                clear()

        for label, ak_call, torch_call, np_call in CASES:
            if cases is not None and label not in cases:
                continue
            np.testing.assert_allclose(
                ak_call(ops, a, b).numpy(), np_call(a_h, b_h), rtol=1e-5, atol=1e-4
            )
            sides: dict[str, tuple[Callable[[], object], Callable[[], Any]]] = {
                "accelkit": (lambda c=ak_call: c(ops, a, b), ak_sync),
            }
            if torch is not None:
                ta, tb = torch.from_numpy(a_h), torch.from_numpy(b_h)
                sides["torch"] = (lambda c=torch_call, x=ta, y=tb: c(torch, x, y), no_sync)
            sides["numpy"] = (lambda c=np_call: c(a_h, b_h), no_sync)
            times = await host_times(sides, calls, rounds)
            row = {"op": f"{label} 64x64 f32", **times}
            row["gc"] = await collector_cost(sides, calls, max(3, rounds // 3))
            if getattr(backend, "thread", None) is not None:
                samples = []
                for _ in range(max(3, rounds // 3)):
                    with ThreadCPU(backend) as probe:
                        for _ in range(calls):
                            sides["accelkit"][0]()
                    await ak_sync()  # every closure has run: its time is in
                    samples.append(probe.ns / calls / 1e3)
                row["thread"] = statistics.median(samples)
            report["rows"].append(row)
            if profile:
                call = sides["accelkit"][0]
                frames, codes = python_work(call, calls)
                await ak_sync()
                report["profiles"][label] = [
                    f"Python per call: {frames:.0f} function calls, {codes:.0f} bytecodes",
                    *profile_lines(call, calls * 4),
                ]
                await ak_sync()
    return report


def show(r: dict[str, Any]) -> None:
    print(
        f"\nhost time per op on {r['backend']} ({r['device']}), us ({r['clock']}): median of"
        f" {r['rounds']} interleaved rounds of {r['calls']} calls (NumPy {r['numpy']}, PyTorch"
        f" {r['torch']})"
    )
    print(f"  {'op':<24}{'accelkit':>10}{'torch':>10}{'numpy':>10}{'vs torch':>10}{'vs numpy':>10}")
    for row in r["rows"]:
        t = row.get("torch")
        print(
            f"  {row['op']:<24}{row['accelkit']:>10.2f}"
            f"{'-' if t is None else format(t, '10.2f'):>10}{row['numpy']:>10.2f}"
            f"{'' if t is None else format(row['accelkit'] / t, '9.2f') + 'x':>10}"
            f"{row['accelkit'] / row['numpy']:>9.2f}x"
        )
    threaded = [row for row in r["rows"] if "thread" in row]
    if threaded:
        print(
            "  the submission thread's CPU time a call, us (thread_time inside its closures,"
            " median of blocks of the same calls):"
        )
        print(
            "  "
            + ", ".join(f"{row['op'].split(' 64x64')[0]} {row['thread']:.1f}" for row in threaded)
        )
    print(
        "  the garbage collector, on (the timed blocks above run with it off), us a call"
        " (collections a 1000 calls):"
    )
    for row in r["rows"]:
        print(
            f"  {row['op'].split(' 64x64')[0]}: "
            + ", ".join(f"{side} {us:.2f} ({n:.1f})" for side, (us, n) in row["gc"].items())
        )
    for label, lines in r["profiles"].items():
        print(f"\n  where accelkit's {label} goes (caller thread):")
        for line in lines:
            print(f"  {line}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", default="cpu", help="the accelkit backend (default: cpu)")
    parser.add_argument("--calls", type=int, default=500, help="calls per timed block")
    parser.add_argument("--rounds", type=int, default=21, help="interleaved rounds")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--standin",
        action="store_true",
        help="with --backend cuda: over the stand-in for CuPy of the plugin's tests (no GPU)",
    )
    parser.add_argument("--cases", help="comma-separated case labels (default: all)")
    parser.add_argument(
        "--block",
        action="store_true",
        help="instead: the host's cost of a tiny transformer block (wall, process CPU)",
    )
    parser.add_argument(
        "--inline",
        action="store_true",
        help="with --block on cuda: rounds with launches queued and made inline, interleaved",
    )
    parser.add_argument(
        "--profile", action="store_true", help="also profile accelkit's calls of each case"
    )
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time the calling thread's CPU time instead of wall time (a shared machine)",
    )
    args = parser.parse_args()
    if args.cpu_time:
        CLOCK[0] = time.thread_time_ns
    if args.standin:
        install_cuda_standin()
    if args.block:
        for line in anyio.run(block_host, args.backend, 20, args.rounds, args.inline):
            print(line)
        sys.exit(0)
    cases = None if args.cases is None else [c.strip() for c in args.cases.split(",")]
    result = anyio.run(run, args.backend, args.calls, args.rounds, cases, args.profile)
    show(result)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
