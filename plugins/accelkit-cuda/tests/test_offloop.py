"""No CUDA call runs on the event loop's thread: checked with a stand-in for CuPy, no GPU.

``fake_cupy`` replaces ``cupy`` and ``cupyx`` for a fresh import of the plugin and records the
thread of every call that would reach CUDA in real CuPy (kernels, array operations, mallocs,
frees, copies, pinned allocations, streams, events, module loads). The backend then runs a
service-like mix (host data and random tensors in, TensorOps, KernelOps, user kernels, copies,
streams and events, synchronize, shutdown) under asyncio and trio, and the test fails if any
call came from the loop's thread. Values the stand-in computes (NumPy under the arrays) are
checked too, and so are ordering, errors at the await, and submissions that return while the
submission thread is busy.
"""

from __future__ import annotations

import gc
import importlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import fake_cupy
import numpy as np
import philox_reference
import pytest

from accelkit.device import Device
from accelkit.dtype import DType
from accelkit.errors import ContextPoisonedError, DeviceError

pytestmark = pytest.mark.anyio


class Plugin:
    """The plugin's modules, imported over the stand-in."""

    def __init__(self) -> None:
        self.backend = importlib.import_module("accelkit_cuda.backend")
        self.stream = importlib.import_module("accelkit_cuda.stream")


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Plugin]:
    roots = ("accelkit_cuda", "cupy", "cupyx")
    before = set()
    for name in list(sys.modules):
        if name.split(".")[0] in roots:
            before.add(name)
            monkeypatch.delitem(sys.modules, name)  # put back after the test
    for name, module in fake_cupy.install().items():
        monkeypatch.setitem(sys.modules, name, module)
    p = Plugin()
    from accelkit_cuda import driver, nvrtc

    attrs = {
        driver.Attr.COMPUTE_CAPABILITY_MAJOR: 9, driver.Attr.COMPUTE_CAPABILITY_MINOR: 0,
        driver.Attr.MULTIPROCESSOR_COUNT: 132, driver.Attr.CLOCK_RATE: 1_980_000,
        driver.Attr.MAX_THREADS_PER_BLOCK: 1024, driver.Attr.WARP_SIZE: 32,
        driver.Attr.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 227 * 1024,
    }  # fmt: skip
    props = driver.DeviceProps(0, "Stand-in GPU", 1 << 30, attrs, 12040)
    monkeypatch.setattr(p.backend, "_devices", lambda: [props])

    class Driver:
        def param_sizes(self, function: int) -> None:
            fake_cupy.record("cuFuncGetParamInfo")

        def reset_primary_context(self, index: int) -> None:
            fake_cupy.record("cuDevicePrimaryCtxReset")

    monkeypatch.setattr(driver, "driver", lambda: Driver())
    compiled = nvrtc.Compiled(b"\0cubin", "cubin", "", "stand-in")
    monkeypatch.setattr(nvrtc, "compile_cached", lambda *a, **k: compiled)
    fake_cupy.CALLS.clear()
    fake_cupy.MALLOCED.clear()
    fake_cupy.FREED.clear()
    yield p
    fake_cupy.CALLS.clear()
    # Modules first imported over the stand-in go, so later tests import the real ones.
    for name in list(sys.modules):
        if name.split(".")[0] in roots and name not in before:
            del sys.modules[name]


async def _open(plugin: Plugin) -> Any:
    backend = plugin.backend.CUDABackend()
    await backend.initialize(Device("cuda", 0))
    return backend


def _on(thread: int) -> list[str]:
    return sorted({name for name, ident in fake_cupy.CALLS if ident == thread})


async def test_no_cuda_call_on_the_loop_thread(plugin: Plugin) -> None:
    loop_thread = threading.get_ident()
    backend = await _open(plugin)
    f, ops, mm, kops = (
        backend.tensor_factory, backend.tensor_ops, backend.memory_manager, backend.kernel_ops,
    )  # fmt: skip
    host = np.arange(24, dtype=np.float32).reshape(4, 6) / 10
    try:
        x = f.from_host(host)
        n = f.normal((4, 6), seed=3)
        u = f.uniform((6, 4), -1.0, 1.0, seed=4)
        r = f.arange(0, 8, 1)
        z = f.zeros((4, 4))
        h = ops.gelu(ops.matmul(x, u))  # matmul, then an elementwise kernel
        h = ops.layer_norm(h)
        s = ops.softmax(h, axis=-1)
        total = ops.reduce("sum", s, axis=-1)
        fused = kops.rms_norm(x)  # a fused NVRTC kernel (a no-op launch here)
        bf16 = DType.BF16 in backend.capabilities.dtypes  # CuPy 14 and ml_dtypes installed
        xb = f.from_host(host, dtype="bf16" if bf16 else "f32")
        gb = ops.matmul(xb, ops.transpose(xb))  # cuBLAS on bf16
        kops.rms_norm(xb)  # the bf16 fused kernel
        kops.silu_mul(x, n)
        idx = f.from_host(np.array([2, 0], np.int64))
        emb = ops.embedding(idx, x)  # a checked launch: its flag is copied to pinned memory
        s2 = backend.create_stream()
        e = backend.default_stream.record_event()
        s2.wait_event(e)
        with backend.use_stream(s2):
            w = x + 1.0  # on another stream, after x's writer
        buf = mm.allocate(64)
        await mm.copy_htod(buf, np.arange(16, dtype=np.float32))
        mm.copy_dtod(z, buf)
        back = np.empty(16, np.float32)
        await mm.copy_dtoh(back, buf)
        mm.free(buf)
        handle = await backend.kernel_executor.load_kernel(
            'extern "C" __global__ void k(float* x) {}', "k"
        )
        backend.kernel_executor.execute_kernel(handle, (1,), (32,), [x])
        got = {
            "x": await x.to_host(), "n": await n.to_host(), "u": await u.to_host(),
            "r": await r.to_host(), "z": await z.to_host(), "total": await total.to_host(),
            "s": await s.to_host(), "emb": await emb.to_host(), "w": await w.to_host(),
            "gb": await gb.to_host(),
        }  # fmt: skip
        await fused.to_host()
        await e.wait()
        await backend.synchronize()
        del x, n, u, h, s, z, w, fused, emb, xb, gb
        gc.collect()  # blocks go back to the pool; a trim frees them
        mm.trim()
    finally:
        await backend.shutdown()
    gc.collect()

    on_loop = _on(loop_thread)
    assert not on_loop, f"CUDA calls on the event loop's thread: {on_loop}"
    on_submission = sorted({name for name, ident in fake_cupy.CALLS if ident != loop_thread})
    for expected in (
        "runtime.malloc", "runtime.memcpyAsync", "alloc_pinned_memory", "Stream()",
        "Module.load", "launch rms_norm_f32", "ufunc matmul", "runtime.free",
        "launch philox_normal_f32_f32", "launch philox_uniform_f32_f32",
    ):  # fmt: skip
        assert expected in on_submission, (expected, on_submission)
    np.testing.assert_array_equal(got["x"], host)
    # Drawn on the device by the Philox kernel (its NumPy port here): 0 + 1 * Z in float32.
    z = philox_reference.draw("normal", 24, (3, 0), "f32", 0.0, 1.0, np.float32)
    np.testing.assert_array_equal(got["n"], z.reshape(4, 6))
    np.testing.assert_array_equal(got["r"], np.arange(8))
    np.testing.assert_array_equal(got["z"], np.arange(16, dtype=np.float32).reshape(4, 4))
    np.testing.assert_array_equal(back, np.arange(16, dtype=np.float32))
    np.testing.assert_allclose(got["total"], np.ones(4), rtol=1e-5)
    np.testing.assert_array_equal(got["emb"], host[[2, 0]])
    np.testing.assert_allclose(got["w"], host + 1.0)
    hb = host.astype(got["gb"].dtype).astype(np.float32)
    np.testing.assert_allclose(got["gb"].astype(np.float32), hb @ hb.T, rtol=1e-2)
    assert backend.memory_manager.memory_info().used == 0


async def test_submissions_return_while_the_thread_is_busy(plugin: Plugin) -> None:
    backend = await _open(plugin)
    gate = threading.Event()
    try:
        backend._thread.submit(lambda: gate.wait(30))  # the device thread is busy
        t0 = time.perf_counter()
        x = backend.tensor_factory.from_host(np.ones((64, 64), np.float32))
        y = backend.tensor_ops.matmul(x, x)
        y = backend.tensor_ops.add(y, 1.0)
        elapsed = time.perf_counter() - t0
        assert not backend.default_stream.query()  # nothing has run yet
        gate.set()
        got = await y.to_host()
    finally:
        gate.set()
        await backend.shutdown()
    assert elapsed < 5.0  # the calls did not wait for the gate (30 s)
    np.testing.assert_array_equal(got, np.full((64, 64), 65.0, np.float32))


async def test_errors_of_a_submission_surface_at_the_await(plugin: Plugin) -> None:
    loop_thread = threading.get_ident()
    backend = await _open(plugin)
    try:
        ops = backend.tensor_ops
        x = backend.tensor_factory.ones((4,))

        def fail() -> None:
            raise RuntimeError("boom")

        y = ops.add(x, 1.0)
        ops.kernels.launch(fail, (x,), (y,), what="a failing kernel")  # returns: no raise
        with pytest.raises(DeviceError, match="a failing kernel failed: RuntimeError"):
            await y.to_host()
        # Reported once; later work runs as usual.
        np.testing.assert_array_equal(await ops.add(x, 2.0).to_host(), np.full(4, 3.0))

        def sticky() -> None:
            raise fake_cupy.CUDARuntimeError(700)

        ops.kernels.launch(sticky, (x,), (y,), what="a trapping kernel")
        with pytest.raises(ContextPoisonedError, match="cudaErrorIllegalAddress"):
            await y.to_host()
        assert backend.poisoned
        with pytest.raises(ContextPoisonedError):
            ops.add(x, 1.0)  # refused at the call once the context is known poisoned
        # For good: there is no in-process rebuild (a sticky error cannot be cleared).
        assert not hasattr(backend, "recover")
        with pytest.raises(ContextPoisonedError, match="must be restarted"):
            await backend.reopen()  # the base's rebuild after a lost device refuses too
        with pytest.raises(ContextPoisonedError, match="must be restarted"):
            backend.tensor_factory.full((4,), 5.0)
    finally:
        await backend.shutdown()
    loop_calls = _on(loop_thread)
    assert not loop_calls, loop_calls
    assert "cuDevicePrimaryCtxReset" not in {name for name, _ in fake_cupy.CALLS}


async def test_shutdown_frees_the_cached_blocks_off_the_loop(plugin: Plugin) -> None:
    from accelkit.sdk import storage

    loop_thread = threading.get_ident()
    backend = await _open(plugin)
    kept = backend.tensor_factory.full((1024,), 2.0)
    dropped = backend.tensor_factory.full((4096,), 1.0)
    await kept.to_host()
    await dropped.to_host()
    dropped_ptr = storage(dropped).buffer.handle.ptr
    kept_ptr = storage(kept).buffer.handle.ptr
    del dropped
    gc.collect()  # its block goes back to the pool's cache
    await backend.shutdown()
    assert dropped_ptr in fake_cupy.FREED  # the cache is freed by the shutdown
    # A block still held by a live tensor is freed by the shutdown too (its one owner, on the
    # submission thread); the tensor is stale now.
    assert kept_ptr in fake_cupy.FREED
    del kept
    gc.collect()
    assert sum(1 for name, _ in fake_cupy.CALLS if name == "runtime.free") == len(
        fake_cupy.FREED
    )  # no block freed twice: its death after shutdown frees nothing again
    frees = [t for name, t in fake_cupy.CALLS if name == "runtime.free"]
    assert loop_thread not in frees


async def test_a_cancelled_wait_leaves_the_work_and_the_memory_right(plugin: Plugin) -> None:
    backend = await _open(plugin)
    gate = threading.Event()
    try:
        backend._thread.submit(lambda: gate.wait(30))  # nothing runs until the gate opens
        x = backend.tensor_factory.full((256,), 3.0)
        y = backend.tensor_ops.mul(x, 2.0)
        with anyio.move_on_after(0.05) as scope:
            await y.to_host()
        assert scope.cancelled_caught
        gate.set()
        np.testing.assert_array_equal(await y.to_host(), np.full(256, 6.0, np.float32))
        del x, y
        gc.collect()
    finally:
        gate.set()
        await backend.shutdown()
    assert backend.memory_manager.memory_info().used == 0


async def test_shutdown_finishes_failed_work_without_raising(plugin: Plugin) -> None:
    backend = await _open(plugin)
    x = backend.tensor_factory.ones((4,))

    def fail() -> None:
        raise RuntimeError("nobody awaits this")

    gate = threading.Event()
    backend._thread.submit(lambda: gate.wait(30))  # the failure comes after shutdown began
    backend.tensor_ops.kernels.launch(fail, (x,), (x,))
    threading.Timer(0.05, gate.set).start()
    await backend.shutdown()  # the error has nobody to go to: dropped, not raised
    assert backend.memory_manager.memory_info().used == 0


def _random_calls() -> list[tuple[str, int]]:
    return [
        (name, t)
        for name, t in fake_cupy.CALLS
        if name.startswith(("random.", "launch philox_", "ufunc", "astype"))
    ]


def _reference(
    kind: str, a: float, b: float, shape: tuple[int, ...], seed: int, dt: Any, philox: bool = True
) -> Any:
    """What CUDAFactoryKernels.random computes, in NumPy: the Philox kernel's port (or, with
    ``philox`` false, the stand-in's CuPy generator, NumPy's PCG64): U or Z in float32 (float64
    for f64 or huge bounds), then a + scale * U (the scale that keeps every value below b in
    the output's dtype: ``factory_kernels.uniform_bounds``) or a + b * Z in that dtype, cast
    once."""
    from accelkit_cuda.factory_kernels import uniform_bounds

    huge = max(abs(a), abs(b), abs(b - a)) > float(np.finfo(np.float32).max)
    wide = np.float64 if dt == np.float64 or huge else np.float32
    acc = "f64" if wide is np.float64 else "f32"
    if kind == "uniform":
        a, scale = uniform_bounds(a, b, acc, np.dtype(dt))
    else:
        scale = b
    if philox:
        n = int(np.prod(shape))
        key = (seed & 0xFFFFFFFF, seed >> 32)
        return philox_reference.draw(kind, n, key, acc, a, scale, dt).reshape(shape)
    rng = np.random.default_rng(seed)  # the stand-in's generator
    if kind == "uniform":
        x = rng.random(shape, dtype=wide) * wide(scale) + wide(a)
    else:
        x = rng.standard_normal(shape, dtype=wide) * wide(scale) + wide(a)
    return x.astype(dt)


@pytest.mark.parametrize("philox", [True, False], ids=["philox", "no-nvrtc"])
async def test_random_numbers_are_drawn_on_the_device_in_stream_order(
    plugin: Plugin, philox: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uniform and normal launch the Philox kernels (without NVRTC: CuPy's generator) from
    the submission thread, queued like any kernel: the calls return while that thread is busy,
    no draw runs on the loop's thread, and the values are the generator's numbers scaled and
    shifted in float32 (f64: float64). A Philox draw is one launch a tensor, in its dtype."""
    from accelkit_cuda import nvrtc

    from accelkit.sdk import last_writer

    if not philox:  # NVRTC missing for the draw kernels only: CuPy's generator draws
        stand_in = nvrtc.compile_cached

        def compile_cached(source: str, *args: Any, **kwargs: Any) -> Any:
            if "philox4x32_10" in source:
                raise nvrtc.NVRTCUnavailable("no NVRTC (test)")
            return stand_in(source, *args, **kwargs)

        monkeypatch.setattr(nvrtc, "compile_cached", compile_cached)
    loop_thread = threading.get_ident()
    backend = await _open(plugin)
    assert backend.philox is not None
    assert backend.philox.ready is philox, backend.philox.error
    f = backend.tensor_factory
    assert f.kernels.device_random
    dtypes = [DType.F32, DType.F64, DType.F16]
    if DType.BF16 in backend.capabilities.dtypes:
        dtypes.append(DType.BF16)
    gate = threading.Event()
    try:
        backend._thread.submit(lambda: gate.wait(30))  # the submission thread is busy
        fake_cupy.CALLS.clear()
        drawn = {}
        for dt in dtypes:
            drawn["uniform", dt] = f.uniform((5, 7), -3.0, 5.0, seed=11, dtype=dt)
            drawn["normal", dt] = f.normal((5, 7), 2.0, 0.5, seed=4, dtype=dt)
        wide = f.uniform((64,), -3e38, 3e38, seed=2)  # b - a exceeds float32: drawn in float64
        empty = f.normal((0, 3), seed=1)  # nothing to draw
        fresh = f.normal((3,))  # no seed: fresh entropy
        other = backend.create_stream()
        with backend.use_stream(other):
            on_other = f.uniform((4,), seed=5)
        assert last_writer(on_other)[0] is other  # in that stream's order
        assert not _random_calls(), "drawn before the submission thread was free"
        gate.set()
        got = {key: await t.to_host() for key, t in drawn.items()}
        got_wide = await wide.to_host()
        assert (await empty.to_host()).shape == (0, 3)
        assert np.isfinite(await fresh.to_host()).all()
        np.testing.assert_array_equal(
            await on_other.to_host(),
            _reference("uniform", 0.0, 1.0, (4,), 5, np.float32, philox),
        )
        submission = backend._thread.ident
    finally:
        gate.set()
        await backend.shutdown()
    calls = _random_calls()
    names = [name for name, _ in calls]
    if philox:  # one launch a tensor (fresh: 1), in its dtype: no generator, no cast
        assert len(names) == 2 * len(dtypes) + 3, names
        assert {f"launch philox_{k}_f32_{dt}" for k in ("uniform", "normal")
                for dt in ("f32", "f16")} <= set(names)  # fmt: skip
        assert "launch philox_uniform_f64_f32" in names  # the huge bounds: f64, written as f32
        assert not [n for n in names if not n.startswith("launch philox_")], names
    else:
        assert {
            "random.default_rng",
            "random.Generator.random",
            "random.Generator.standard_normal",
        } <= set(names)
    threads = {t for _, t in calls}
    assert loop_thread not in threads, "random numbers drawn on the event loop's thread"
    assert threads == {submission}
    for (kind, dt), values in got.items():
        a, b, seed = (-3.0, 5.0, 11) if kind == "uniform" else (2.0, 0.5, 4)
        expected = _reference(kind, a, b, (5, 7), seed, dt.to_numpy(), philox)
        assert values.dtype == expected.dtype, (kind, dt)
        np.testing.assert_array_equal(
            values.astype(np.float64), expected.astype(np.float64), err_msg=f"{kind} {dt}"
        )
    assert np.isfinite(got_wide).all()
    np.testing.assert_allclose(
        got_wide,
        _reference("uniform", -3e38, 3e38, (64,), 2, np.float32, philox),
    )


async def test_same_dtype_binary_ops_launch_the_raw_kernels(plugin: Plugin) -> None:
    """add sub mul maximum minimum of two tensors of one float dtype and shape: one raw NVRTC
    kernel on the submission thread (issue 29), with the values of NumPy's ufuncs (the
    stand-in computes the kernels); a broadcast or a scalar still takes CuPy's path."""
    loop_thread = threading.get_ident()
    backend = await _open(plugin)
    rng = np.random.default_rng(5)
    a_h = rng.standard_normal((8, 16)).astype(np.float32)
    b_h = rng.standard_normal((8, 16)).astype(np.float32)
    b_h[0, :3] = np.nan
    try:
        fast = backend.tensor_ops.kernels.fast
        fast.start()  # what the first such op does
        for _ in range(500):  # compiled (a stand-in here), then loaded on the submission thread
            if fast.ready or fast.error is not None:
                break
            await anyio.sleep(0.01)
        assert fast.ready, fast.error
        f, ops = backend.tensor_factory, backend.tensor_ops
        a, b = f.from_host(a_h), f.from_host(b_h)
        fake_cupy.CALLS.clear()
        outs = {op: ops.binary(op, a, b) for op in ("add", "sub", "mul", "maximum", "minimum")}
        half = ops.add(ops.cast(a, "f16"), ops.cast(b, "f16"))
        got = {op: await t.to_host() for op, t in outs.items()}
        got_half = await half.to_host()
        launches = {name for name, ident in fake_cupy.CALLS if name.startswith("launch ew_")}
        assert not {name for name, ident in fake_cupy.CALLS if ident == loop_thread}
        fake_cupy.CALLS.clear()
        row = f.from_host(b_h[:1])
        broadcast = await ops.add(a, row).to_host()  # CuPy's path
        scalar = await ops.mul(a, 2.0).to_host()
        assert not any(name.startswith("launch ew_") for name, _ in fake_cupy.CALLS)
    finally:
        await backend.shutdown()
    assert launches == {
        "launch ew_add_f32", "launch ew_sub_f32", "launch ew_mul_f32", "launch ew_maximum_f32",
        "launch ew_minimum_f32", "launch ew_add_f16",
    }  # fmt: skip
    np.testing.assert_array_equal(got["add"], a_h + b_h)
    np.testing.assert_array_equal(got["sub"], a_h - b_h)
    np.testing.assert_array_equal(got["mul"], a_h * b_h)
    np.testing.assert_array_equal(got["maximum"], np.maximum(a_h, b_h))  # NaN propagates
    np.testing.assert_array_equal(got["minimum"], np.minimum(a_h, b_h))
    a16, b16 = a_h.astype(np.float16), b_h.astype(np.float16)
    want16 = (a16.astype(np.float32) + b16.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(got_half, want16)
    np.testing.assert_array_equal(broadcast, a_h + b_h[:1])
    np.testing.assert_array_equal(scalar, a_h * 2.0)
