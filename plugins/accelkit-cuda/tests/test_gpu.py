"""The CUDA backend on a GPU (skipped with the reason elsewhere). The shared conformance suite
(tests/conformance) and tests/test_kernel_ops.py also run on it wherever a GPU is present."""

from __future__ import annotations

from typing import Any

import numpy as np
import philox_reference
import pytest

import accelkit as ak
from accelkit.errors import (
    InvalidArgumentError,
    KernelCompileError,
    OutOfMemoryError,
    StaleHandleError,
)

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]

SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""
BAD_WRITE = r"""
extern "C" __global__ void bad_write(float* p) { *(volatile float*)(p + (1ll << 40)) = 1.0f; }
"""


async def test_user_kernel_compiles_runs_and_is_cached(backend: Any) -> None:
    ex = backend.kernel_executor
    handle = await ex.load_kernel(SAXPY, "saxpy", language="cuda")
    again = await ex.load_kernel(SAXPY, "saxpy", language="cuda")
    assert again.key == handle.key
    n = 10_000
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
    tx, ty = backend.tensor_factory.from_host(x), backend.tensor_factory.from_host(y)
    ex.execute_kernel(handle, ((n + 255) // 256,), (256,), [np.float32(3.0), tx, ty, n])
    got = (await ty.to_host()).astype(np.float64)
    ax, y64 = 3.0 * x.astype(np.float64), y.astype(np.float64)  # exact in float64
    # NVCC may contract a*x+y into one FMA (one rounding) or not (two): with u = eps/2, the
    # error is at most u|ax| + u|fl(ax) + y| <= (2u + u^2)(|ax| + |y|) = eps(1 + eps/2)(...).
    eps = float(np.finfo(np.float32).eps)
    bound = eps * (1 + eps) * (np.abs(ax) + np.abs(y64))
    assert np.all(np.abs(got - (ax + y64)) <= bound)
    info = ex.kernel_info(handle)
    assert info.max_threads_per_block >= 256
    assert info.registers > 0
    assert info.extra["parameter_bytes"] in (None, [4, 8, 8, 8])


async def test_bad_launches_are_refused(backend: Any) -> None:
    ex = backend.kernel_executor
    handle = await ex.load_kernel(SAXPY, "saxpy", language="cuda")
    t = backend.tensor_factory.zeros((4,), ak.DType.F32)
    with pytest.raises(InvalidArgumentError, match=r"threads|exceeds"):
        ex.execute_kernel(handle, (1,), (2048,), [np.float32(1), t, t, 4])
    if ex.kernel_info(handle).extra["parameter_bytes"] is not None:
        with pytest.raises(InvalidArgumentError, match="takes 4 arguments; got 3"):
            ex.execute_kernel(handle, (1,), (32,), [np.float32(1), t, t])
    with pytest.raises(InvalidArgumentError, match="args\\[0\\]"):
        ex.execute_kernel(handle, (1,), (32,), ["x", t, t, 4])
    with pytest.raises(KernelCompileError, match="compile"):
        await ex.load_kernel(SAXPY.replace("x[i]", "q[i]"), "saxpy", language="cuda")
    with pytest.raises(InvalidArgumentError, match="no kernel named"):
        await ex.load_kernel(SAXPY, "nope", language="cuda")
    ex.unload_kernel(handle)
    with pytest.raises(StaleHandleError):
        ex.execute_kernel(handle, (1,), (32,), [np.float32(1), t, t, 4])


def _bf16() -> Any:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    return ml_dtypes.bfloat16


@pytest.mark.parametrize("dtype", [np.float32, np.float16, "bf16"])
@pytest.mark.parametrize("causal", [False, True])
async def test_flash_attention_matches_the_reference(
    backend: Any, dtype: Any, causal: bool
) -> None:
    if dtype == "bf16":
        if ak.DType.BF16 not in backend.capabilities.dtypes:
            pytest.skip("no bf16 here (CuPy < 14, no ml_dtypes, or before sm_80)")
        dtype = _bf16()
    rng = np.random.default_rng(1)
    b, h, hk, sq, sk, d = 2, 8, 2, 200, 333, 64
    q = rng.standard_normal((b, h, sq, d)).astype(dtype)
    k = rng.standard_normal((b, hk, sk, d)).astype(dtype)
    v = rng.standard_normal((b, hk, sk, d)).astype(dtype)
    f = backend.tensor_factory
    got = await backend.kernel_ops.attention(
        f.from_host(q), f.from_host(k), f.from_host(v), causal=causal
    ).to_host()
    qf, kf, vf = (a.astype(np.float64) for a in (q, k, v))
    kf, vf = np.repeat(kf, h // hk, axis=1), np.repeat(vf, h // hk, axis=1)
    s = qf @ np.swapaxes(kf, -1, -2) / np.sqrt(d)
    if causal:
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ vf
    tol = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 2e-5}.get(np.dtype(dtype), 2e-2)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol)


async def test_bf16_storage_elementwise_reductions_gemm_and_norms(backend: Any) -> None:
    if ak.DType.BF16 not in backend.capabilities.dtypes:
        pytest.skip("no bf16 here (CuPy < 14, no ml_dtypes, or before sm_80)")
    bf = np.dtype(_bf16())
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 96)).astype(bf)
    w = rng.standard_normal((96, 32)).astype(bf)
    f, ops, kops = backend.tensor_factory, backend.tensor_ops, backend.kernel_ops
    tx, tw = f.from_host(x), f.from_host(w)
    np.testing.assert_array_equal(await tx.to_host(), x)  # storage round trip
    xf, wf = x.astype(np.float32), w.astype(np.float32)
    got = await ops.gelu(tx).to_host()
    assert got.dtype == bf
    np.testing.assert_allclose(
        got.astype(np.float32), 0.5 * xf * (1 + _erf(xf / np.sqrt(2))), atol=2e-2
    )
    total = await ops.reduce("sum", tx, axis=-1).to_host()
    np.testing.assert_allclose(total.astype(np.float32), xf.sum(-1), rtol=2e-2, atol=5e-2)
    prod = await ops.matmul(tx, tw).to_host()
    assert prod.dtype == bf
    np.testing.assert_allclose(prod.astype(np.float32), xf @ wf, rtol=2e-2, atol=1e-1)
    for normed in (ops.layer_norm(tx), kops.rms_norm(tx)):
        assert (await normed.to_host()).dtype == bf
    assert (await ops.cast(tx, ak.DType.F32).to_host()).dtype == np.float32


def _erf(x: Any) -> Any:
    import math

    return np.vectorize(math.erf)(x)


async def test_a_captured_decode_step_replays_as_a_cuda_graph(backend: Any) -> None:
    from accelkit.testing.graphs import (
        decode_reference,
        decode_step,
        make_decode_step,
        tolerance,
    )

    step = make_decode_step(backend)
    async with backend.capture() as graph:
        y = decode_step(backend, step)
    assert graph.kind == "cuda-graph"
    tol = tolerance()
    rng = np.random.default_rng(5)
    for _ in range(3):
        x = rng.standard_normal(step.host["x"].shape).astype(np.float32)
        await graph.write(step.x, x)
        graph.replay()
        got = await y.to_host()
        np.testing.assert_allclose(got, decode_reference(step.host, x), rtol=tol, atol=tol)
    graph.copy(step.x, y)  # the output feeds the next replay, on the device
    graph.replay()
    want = decode_reference(step.host, got.astype(np.float32))
    np.testing.assert_allclose(await y.to_host(), want, rtol=tol, atol=tol)


async def test_a_captured_transformer_block_replays_as_a_cuda_graph(backend: Any) -> None:
    """bench_core's transformer block (layer_norm, linear with bias, permute, causal attention,
    tanh-GELU, add; its GEMMs on cuBLAS through accelkit_cuda.blas while capturing) as one CUDA
    graph, replayed with new input (the H100 of 2026-11-27 replayed its calls: CuPy refused
    cuBLAS during the capture)."""
    from accelkit.workloads import (
        BlockConfig,
        block_weights,
        transformer_block,
        transformer_block_numpy,
        upload_weights,
    )

    cfg = BlockConfig(batch=2, seq=16, width=64, heads=4)
    w_h = block_weights(cfg)
    w = upload_weights(backend, w_h)
    rng = np.random.default_rng(6)
    shape = (cfg.batch, cfg.seq, cfg.width)
    x = backend.tensor_factory.from_host(rng.standard_normal(shape).astype(np.float32))
    async with backend.capture() as graph:
        y = transformer_block(backend, x, w, cfg)
    assert graph.kind == "cuda-graph"
    tol = float(64 * 4 * cfg.width * np.finfo(np.float32).eps)
    for _ in range(2):
        x_h = rng.standard_normal(shape).astype(np.float32)
        await graph.write(x, x_h)
        graph.replay()
        want = transformer_block_numpy(x_h.astype(np.float64), w_h, cfg)
        np.testing.assert_allclose(await y.to_host(), want, rtol=tol, atol=tol)


async def test_inline_launches_on_the_device(backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """ACCELKIT_CUDA_INLINE's path on a GPU: plain launches made on the loop's thread (the
    primary context made current there) for the transformer block, eager and captured, and a
    chain of small ops none of which is awaited before the last; the answers are NumPy's and
    most of the block's positions were launched inline."""
    from accelkit_cuda import stream as cuda_stream

    from accelkit.workloads import (
        BlockConfig,
        block_weights,
        transformer_block,
        transformer_block_numpy,
        upload_weights,
    )

    s = getattr(backend, "default_stream", None)
    if not hasattr(s, "inline_launches"):
        pytest.skip("an isolated backend: its plugin runs in another process")
    monkeypatch.setattr(cuda_stream, "INLINE", True)
    cfg = BlockConfig(batch=2, seq=16, width=64, heads=4)
    w_h = block_weights(cfg)
    w = upload_weights(backend, w_h)
    rng = np.random.default_rng(7)
    shape = (cfg.batch, cfg.seq, cfg.width)
    tol = float(64 * 4 * cfg.width * np.finfo(np.float32).eps)
    f = backend.tensor_factory
    for _ in range(4):  # from the second on, the pool's cached blocks serve: launches inline
        x_h = rng.standard_normal(shape).astype(np.float32)
        x = f.from_host(x_h)
        await backend.synchronize()
        before = (s.inline_launches, s.submitted)
        y = transformer_block(backend, x, w, cfg)
        counts = (s.inline_launches - before[0], s.submitted - before[1])
        want = transformer_block_numpy(x_h.astype(np.float64), w_h, cfg)
        np.testing.assert_allclose(await y.to_host(), want, rtol=tol, atol=tol)
    assert counts[0] >= counts[1] // 2, counts
    async with backend.capture() as graph:
        y = transformer_block(backend, x, w, cfg)
    for _ in range(3):  # the first launch uploads the graph (queued); the rest are inline
        x_h = rng.standard_normal(shape).astype(np.float32)
        await graph.write(x, x_h)
        graph.replay()
        want = transformer_block_numpy(x_h.astype(np.float64), w_h, cfg)
        np.testing.assert_allclose(await y.to_host(), want, rtol=tol, atol=tol)
    ops = backend.tensor_ops
    one = f.from_host(np.ones((256, 256), np.float32))
    acc = f.from_host(np.zeros((256, 256), np.float32))
    for _ in range(2):
        y = acc
        for _ in range(300):  # more than COVER_MAX positions, awaited once (exact in f32)
            y = ops.add(y, one)
        np.testing.assert_array_equal(await y.to_host(), np.full((256, 256), 300, np.float32))


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "f64"])
async def test_a_linear_with_a_bias_runs_in_cublaslts_epilogue(backend: Any, dtype: str) -> None:
    """``linear`` with a bias as one cuBLASLt launch, the bias in the epilogue
    (accelkit_cuda.blaslt): F16, BF16 and F32 must take it on a GPU (F64 may find no
    algorithm and take the GEMM and the bias kernel); against float64 NumPy within the
    arithmetic's bound: k + 1 roundings of the F32 (F64) accumulator over the magnitudes
    summed, then one rounding to the stored type (the bias added before it)."""

    from accelkit_cuda import blaslt

    if dtype == "bf16" and ak.DType.BF16 not in backend.supported_dtypes:
        pytest.skip("no bf16 on this device")
    f, ops = backend.tensor_factory, backend.tensor_ops
    rng = np.random.default_rng(21)
    rows, n, k = 3 * 70, 96, 136
    x = f.from_host(rng.standard_normal((3, 70, k)).astype(np.float32), dtype=dtype)
    w = f.from_host((rng.standard_normal((n, k)) / 8).astype(np.float32), dtype=dtype)
    b = f.from_host(rng.standard_normal(n).astype(np.float32), dtype=dtype)
    xr, wr, br = [(await t.to_host()).astype(np.float64) for t in (x, w, b)]
    await ops.linear(x, w, b).to_host()  # the first GEMM finds cuBLAS (and cuBLASLt)
    before = dict(blaslt.stats)
    got = (await ops.linear(x, w, b).to_host()).astype(np.float64)
    want = xr.reshape(rows, k) @ wr.T + br
    acc = float(np.finfo(np.float64 if dtype == "f64" else np.float32).eps)
    store = {"f16": 2.0**-10, "bf16": 2.0**-7, "f32": 0.0, "f64": 0.0}[dtype]
    mag = np.abs(xr.reshape(rows, k)) @ np.abs(wr).T + np.abs(br)
    tol = (k + 1) * acc * mag + store * np.abs(want)
    assert np.all(np.abs(got.reshape(rows, n) - want) <= tol)
    if dtype != "f64":
        assert blaslt.stats["launches"] == before["launches"] + 1, (before, blaslt.stats)


@pytest.mark.parametrize("path", ["capture", "workspace"])
async def test_gemm_dtypes_on_the_cublas_path(
    backend: Any, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """GEMMs on cublasGemmEx (accelkit_cuda.blas), captured or eager with
    ``ACCELKIT_CUDA_GEMM_WORKSPACE=1``: bf16 and f16 operands into F32 with an F32 addend (the
    product not rounded to the operands' type first: bf16-bf16-f32-f32 failed on the H100),
    and f64 with alpha and beta (double scalars for CUBLAS_COMPUTE_64F)."""
    import ml_dtypes

    if path == "workspace":
        monkeypatch.setenv("ACCELKIT_CUDA_GEMM_WORKSPACE", "1")
    f, ops = backend.tensor_factory, backend.tensor_ops
    rng = np.random.default_rng(7)
    cases = [
        (ml_dtypes.bfloat16, np.float32, 1.0, 1.0),
        (np.float16, np.float32, 1.0, 1.0),
        (np.float64, np.float64, 2.5, -0.5),
    ]
    if ak.DType.BF16 not in backend.supported_dtypes:
        cases = cases[1:]
    tensors: list[Any] = []
    hosts: list[tuple[Any, ...]] = []
    for dt, ct, alpha, beta in cases:
        a_h = rng.uniform(-2, 2, (24, 40)).astype(dt)
        b_h = rng.uniform(-2, 2, (40, 16)).astype(dt)
        c_h = rng.standard_normal((24, 16)).astype(ct)
        tensors.append((f.from_host(a_h), f.from_host(b_h), f.from_host(c_h), alpha, beta))
        hosts.append((a_h, b_h, c_h, alpha, beta, ct))

    def run() -> list[Any]:
        return [ops.gemm(a, b, c, alpha=al, beta=be) for a, b, c, al, be in tensors]

    if path == "capture":
        async with backend.capture() as graph:
            outs = run()
        assert graph.kind == "cuda-graph"
        graph.replay()
    else:
        outs = run()
    for out, (a_h, b_h, c_h, alpha, beta, ct) in zip(outs, hosts, strict=True):
        got = await out.to_host()
        assert got.dtype == ct
        want = alpha * (a_h.astype(np.float64) @ b_h.astype(np.float64)) + beta * c_h
        eps = float(np.finfo(ct).eps)
        np.testing.assert_allclose(got, want, rtol=64 * eps, atol=64 * 40 * eps)


async def test_streams_order_work_across_streams(backend: Any) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    a = f.from_host(np.ones((2048, 2048), np.float32))
    other = backend.create_stream()
    with backend.use_stream(other):
        b = ops.matmul(a, a)  # written on `other`
    c = ops.add(b, 1.0)  # on the default stream: must wait for `other`
    assert float((await c.to_host())[0, 0]) == 2049.0
    event = other.record_event()
    await event.wait()
    assert event.query()


async def test_out_of_memory_says_how_much(backend: Any) -> None:
    total = backend.memory_manager.memory_info().total
    n = total // 2 + total
    with pytest.raises(OutOfMemoryError) as info:
        backend.tensor_factory.empty((n,), ak.DType.U8)
    # The typed error carries the sizes; the message names them (CuPy's and the pool's words
    # differ: "allocating 118.8 GiB ... would exceed ...").
    assert info.value.requested == n
    assert f"{n / 2**30:.1f} GiB" in str(info.value)
    assert backend.memory_manager.memory_info().used == 0


# A sticky fault poisons the whole process's context: it runs in a child process of its own,
# so the tests after it keep a healthy GPU.
STICKY_CHILD = r"""
import sys
import anyio
import numpy as np
import accelkit as ak
from accelkit.errors import ContextPoisonedError

BAD_WRITE = sys.argv[1]


def refused(what, fn):
    try:
        fn()
    except ContextPoisonedError as exc:
        text = str(exc)
        assert "cudaErrorIllegalAddress" in text and "must be restarted" in text, (what, text)
        return
    raise AssertionError(f"{what}: not refused")


async def main():
    backend = ak.create_backend("cuda")
    await backend.initialize("cuda:0")
    f, ops, mm, ex = (backend.tensor_factory, backend.tensor_ops, backend.memory_manager,
                      backend.kernel_executor)
    kops, stream = backend.kernel_ops, backend.default_stream
    keep = f.from_host(np.arange(8, dtype=np.float32))
    handle = await ex.load_kernel(BAD_WRITE, "bad_write", language="cuda")
    ex.execute_kernel(handle, (1,), (1,), [keep])
    try:
        await backend.synchronize()
    except ContextPoisonedError as exc:
        assert "cudaErrorIllegalAddress" in str(exc) or "ILLEGAL_ADDRESS" in str(exc), exc
    else:
        raise AssertionError("the illegal write was not reported")
    assert backend.poisoned
    calls = {
        "ops.add": lambda: ops.add(keep, 1.0), "ops.reshape": lambda: ops.reshape(keep, (2, 4)),
        "factory.zeros": lambda: f.zeros((4,), ak.DType.F32),
        "kernel_ops.silu_mul": lambda: kops.silu_mul(keep, keep),
        "mm.allocate": lambda: mm.allocate(64), "mm.memory_info": mm.memory_info,
        "kernels.execute": lambda: ex.execute_kernel(handle, (1,), (1,), [keep]),
        "create_stream": backend.create_stream, "stream.record_event": stream.record_event,
        "numpy": keep.numpy,
    }
    for what, fn in calls.items():
        refused(what, fn)
    for what, afn in {"synchronize": backend.synchronize, "to_host": keep.to_host}.items():
        try:
            await afn()
        except ContextPoisonedError as exc:
            assert "must be restarted" in str(exc), exc
        else:
            raise AssertionError(f"{what}: not refused")
    assert "must be restarted" in (backend.status.error or ""), backend.status
    with anyio.fail_after(30):
        await backend.shutdown()
    fresh = ak.create_backend("cuda")
    try:
        await fresh.initialize("cuda:0")
    except ContextPoisonedError:
        pass
    else:
        raise AssertionError("a new backend opened the poisoned context")
    print("POISONED-AS-TOLD")


anyio.run(main, backend=sys.argv[2])
"""


async def test_a_sticky_error_poisons_the_process_for_good(anyio_backend: Any) -> None:
    import sys

    import anyio

    name = anyio_backend if isinstance(anyio_backend, str) else anyio_backend[0]
    with anyio.fail_after(180):
        done = await anyio.run_process(
            [sys.executable, "-c", STICKY_CHILD, BAD_WRITE, name], check=False
        )
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0, out[-4000:]
    assert "POISONED-AS-TOLD" in out


async def test_a_buffer_dead_in_a_cycle_comes_back_live(backend: Any) -> None:
    """dead-block-gpu.py (issue 27): the block of a buffer that died in a reference cycle is
    handed out again at its own, live address, and the kernels that use it work."""
    import gc

    f, ops, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager

    def park_in_cycle() -> None:
        t = f.from_host(np.zeros(0, np.float32))  # 0 bytes: a 64 B block, nothing launched
        try:
            raise ValueError("refused")
        except ValueError as e:
            err = e  # err -> __traceback__ -> this frame -> err and t: a cycle
        assert err is not None
        assert t.size == 0

    park_in_cycle()
    gc.collect()
    # The next block of that size class is used for real: a copy in and out through it. (Its
    # cudaMalloc, if the pool had to make one, is queued on the submission thread: the address
    # is read once the copy has run.) Before the fix it was the freed block, at address 0.
    again = mm.allocate(8)
    await mm.copy_htod(again, np.array([1.5, -2.5], np.float32))
    back = np.empty(2, np.float32)
    await mm.copy_dtoh(back, again)
    np.testing.assert_array_equal(back, [1.5, -2.5])
    assert int(again.handle.ptr) != 0
    mm.free(again)
    x = f.from_host(np.full((1, 17), 5.0, np.float32))
    x_h = x.numpy()
    x_h[0, 3] = 1.0
    np.testing.assert_array_equal(ops.argmin(f.from_host(x_h), axis=1).numpy(), [3])
    np.testing.assert_array_equal(ops.cast(f.from_host(np.ones(9)), ak.DType.BOOL).numpy(), True)


async def test_an_isolated_backend_survives_an_illegal_write(anyio_backend: Any) -> None:
    """Issue 30 on a GPU: the illegal write that poisons an in-process backend for good ends
    the isolated backend's worker only. The awaits pending on it raise WorkerLostError naming
    the fault, the event loop keeps running through the fault and the restart (a heartbeat
    task keeps beating), and after ``recover()`` a new worker computes right."""
    import anyio

    from accelkit.errors import NotInitializedError, WorkerLostError

    beats = 0
    stop = anyio.Event()

    async def heartbeat() -> None:
        nonlocal beats
        while not stop.is_set():
            beats += 1
            await anyio.sleep(0.01)

    x = np.arange(8, dtype=np.float32)
    async with ak.open_backend("cuda", isolate=True) as opened, anyio.create_task_group() as tg:
        b: Any = opened  # an accelkit.isolation.IsolatedBackend
        tg.start_soon(heartbeat)
        try:
            ex = b.kernel_executor
            keep = b.tensor_factory.from_host(x)
            np.testing.assert_array_equal(await b.tensor_ops.add(keep, 1.0).to_host(), x + 1)
            handle = await ex.load_kernel(BAD_WRITE, "bad_write", language="cuda")
            ex.execute_kernel(handle, (1,), (1,), [keep])
            before = beats
            with anyio.fail_after(120), pytest.raises(WorkerLostError) as info:
                await keep.to_host()
            text = str(info.value).lower()
            assert "illegal" in text or "700" in text, info.value
            with pytest.raises((WorkerLostError, StaleHandleError, NotInitializedError)):
                b.tensor_ops.add(keep, 1.0)
            generation = b.generation
            with anyio.fail_after(180):
                await b.recover()
            assert b.generation > generation
            y = b.tensor_factory.from_host(x)
            np.testing.assert_array_equal(await b.tensor_ops.add(y, 1.0).to_host(), x + 1)
            assert beats > before + 1, "the event loop stopped while the worker failed"
        finally:
            stop.set()


async def test_philox_draws_are_the_numpy_ports(backend: Any) -> None:
    """Issues 27/29: uniform and normal draw by the Philox kernels (not CuPy's generator, the
    fallback without NVRTC): uniforms bit for bit the NumPy port's (tests/philox_reference.py,
    checked against Random123's known answers), normals within the device's logf/sincospif
    error (a few ulps), in every float dtype; a shorter draw is a prefix of a longer one (a
    different grid), and the fused sample_token draws the same noise (the conformance suite)."""
    from accelkit_cuda.philox import key_of

    program = getattr(backend, "philox", None)  # None when isolated (a proxy)
    if program is not None:
        assert program.ready, program.error
    f = backend.tensor_factory
    shape, n = (300, 37), 300 * 37
    dtypes = [ak.DType.F32, ak.DType.F64, ak.DType.F16]
    if ak.DType.BF16 in backend.capabilities.dtypes:
        dtypes.append(ak.DType.BF16)
    for dt in dtypes:
        out = np.dtype(dt.to_numpy())
        acc = "f64" if dt is ak.DType.F64 else "f32"
        u = await f.uniform(shape, -3.0, 5.0, seed=77, dtype=dt).to_host()
        expected = philox_reference.draw("uniform", n, key_of(77), acc, -3.0, 8.0, out)
        np.testing.assert_array_equal(u.reshape(-1), expected, err_msg=str(dt))
        z = await f.normal(shape, 2.0, 0.5, seed=78, dtype=dt).to_host()
        expected = philox_reference.draw("normal", n, key_of(78), acc, 2.0, 0.5, out)
        eps = float(np.finfo(np.float32 if dt is ak.DType.BF16 else out).eps)
        if dt is ak.DType.BF16:
            eps = 2.0**-7
        tol = 16 * eps * 5.0  # a few ulps of the output (and of Z) at |2 + 0.5 Z| <= 5
        got64, ref64 = z.reshape(-1).astype(np.float64), expected.astype(np.float64)
        assert np.abs(got64 - ref64).max() <= tol, (dt, np.abs(got64 - ref64).max())
    small = await f.uniform((10,), seed=5).to_host()
    big = await f.uniform((100_000,), seed=5).to_host()
    np.testing.assert_array_equal(small, big[:10])
    # Statistics of a large f32 draw on the device (bounds from the sample size).
    z = (await f.normal((1 << 20,), seed=9).to_host()).astype(np.float64)
    assert abs(z.mean()) <= 5 / np.sqrt(z.size)
    assert abs((z**2).mean() - 1) <= 5 * np.sqrt(2) / np.sqrt(z.size)
    u = await f.uniform((1 << 20,), seed=10).to_host()
    assert u.min() >= 0.0
    assert u.max() < 1.0


@pytest.mark.parametrize("dt", ["f32", "f16"])
async def test_the_one_launch_unary_and_row_kernels_on_the_device(backend: Any, dt: str) -> None:
    """Issue 29's raw kernels (loaded during initialize) on the device against float64 NumPy:
    the unary ops, softmax/log_softmax with NaN, +inf and all -inf rows, the norms, a row of a
    warp and one longer than a block (the stand-in's ports are in test_fast_rows.py)."""
    from test_fast_rows import DTYPES, REFERENCE, _eps, _rows, _softmax_ref

    assert backend.tensor_ops.kernels.fast.ready, backend.tensor_ops.kernels.fast.error
    f, ops = backend.tensor_factory, backend.tensor_ops
    rng = np.random.default_rng(7)
    eps = _eps(dt)
    flat = (rng.standard_normal(4096) * 3).astype(DTYPES[dt])
    x = f.from_host(flat)
    xr = flat.astype(np.float64)
    # CUDA's f32 math is within 4 ulp; gelu's 1 + erf(x) cancels for negative x: an absolute
    # error of eps x |x| there
    atol = 8 * eps * (1 + float(np.abs(xr).max()))
    for op, fn in REFERENCE.items():
        got = (await ops.unary(op, x).to_host()).astype(np.float64)
        with np.errstate(all="ignore"):
            want = fn(xr).astype(DTYPES[dt]).astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=8 * eps, atol=atol, equal_nan=True, err_msg=op)
    for cols in (7, 1000):
        host = _rows(rng, (4, cols)).astype(DTYPES[dt])
        t = f.from_host(host)
        hr = host.astype(np.float64)
        tol = 4 * eps + cols * 2e-8
        got = (await ops.softmax(t, axis=-1).to_host()).astype(np.float64)
        want = _softmax_ref(hr, False)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True)
        clean = f.from_host((rng.standard_normal((4, cols)) * 2 + 1).astype(DTYPES[dt]))
        cr = (await clean.to_host()).astype(np.float64)
        d = cr - cr.mean(-1, keepdims=True)
        want_ln = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)
        got_ln = (await ops.layer_norm(clean, None, None, 1e-5).to_host()).astype(np.float64)
        np.testing.assert_allclose(got_ln, want_ln, rtol=8 * eps + tol, atol=8 * eps + tol)
