"""CUDA backend benchmarks on a GPU, as ratios against PyTorch in the same process.

Run with ``python benchmarks/bench_cuda.py`` where accelkit-cuda, CuPy and PyTorch (CUDA) are
installed; without them, or without a GPU, it says why and exits with status 2 (nothing
measured). It fits the GPU check's cap (tools/gpu-check/run.sh step ``bench``, 120 s) and ends
with a summary of every figure. Figures (issue 29's targets in brackets):

- GEMM 8192x8192x8192 in f16, bf16 and f32 (no TF32 on either side) vs ``torch.matmul``
  [>= 0.97x], ten GEMMs a repeat, with the device time of one (CUDA events) on both sides; on
  the default route (cuBLAS with a workspace) and, f16 and f32, on ``cupy.matmul``
  (``ACCELKIT_CUDA_GEMM_WORKSPACE=0``);
- ``linear`` with a bias at 4096 in f16, bf16 and f32 vs ``torch.nn.functional.linear`` (both
  with the bias in cuBLASLt's epilogue), and how many calls took accelkit's epilogue route;
- causal f16 attention, batch 8, 16 heads, seq 4096, head_dim 128, vs
  ``torch.nn.functional.scaled_dot_product_attention``, for the fused flash kernel
  (KernelOps) and the cuBLAS route (TensorOps) (cuDNN's figures: their own script);
- host time to submit a small op (64x64 f32: add, mul, add of a scalar, matmul, exp, relu, a
  row sum; the cases of ``benchmarks/bench_host.py``), next to PyTorch's [<= PyTorch's], and
  where the add's goes on the caller's thread (Python calls and bytecodes per op, cProfile's
  top functions);
- the transformer block of ``benchmarks/bench_core.py`` (batch 4, seq 256, width 512, 8 heads)
  vs PyTorch CUDA eager [>= 1.0x; with capture >= 1.5x, once accelkit has a capture API], and
  one step of it as a timeline (``accelkit_cuda.timeline``: when the ops were submitted, when
  the submission thread launched them, their GPU time, when the await returned, the thread's
  waits and the per-step counts; docs/backends/cuda.md says how to read it), and the block
  again at GIL switch intervals of 0.2 ms and 5 ms (CPython's default; the process runs at
  accelkit's 1 ms), an experiment: the interval is put back; and with the streams' completer
  threads waiting on each position or on the newest pending one (another experiment);
- how late a 1 ms heartbeat task runs while the loop awaits a long GEMM chain [<= 1 ms].

Timings are medians of interleaved repeats, each ending in a device synchronization (the
small ops: blocks of back-to-back submissions, the synchronization after each block untimed).
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np

import accelkit as ak
from accelkit.cli.bench import interleaved
from accelkit.errors import AccelError
from accelkit.workloads import BlockConfig, block_weights, transformer_block, upload_weights

# Beside this script: the small-op cases and their timing, and PyTorch's transformer block.
from bench_core import _torch_block, block_timeline, describe_timeline  # isort: skip
from bench_cuda_attention import device_ms, torch_device_ms  # isort: skip
from bench_host import (  # isort: skip
    CASES, TINY_BLOCK, ThreadCPU, collector_cost, host_times, profile_lines, python_work,
)  # fmt: skip

STEPS = 5
#: Blocks over which the tiny block's CPU time is split by thread (:func:`_tiny_block`).
SPLIT_BLOCKS = 50
GEMM_N = 8192
GEMM_CALLS = 10  # GEMMs a timed repeat
LINEAR_N = 4096  # linear+bias: [4096, 4096] @ w.T + b, a projection of a 4096-token prefill
_WS_ENV = "ACCELKIT_CUDA_GEMM_WORKSPACE"
SMALL_CALLS = 500
SMALL_ROUNDS = 15
BLOCK_ROUNDS = 15


def no_gpu() -> str | None:
    """Why nothing can be measured here, or None."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed (the peer of every figure)"
    if not torch.cuda.is_available():
        return f"PyTorch {torch.__version__} sees no CUDA device"
    try:
        import accelkit_cuda  # noqa: F401
        import cupy  # noqa: F401
    except ImportError as exc:
        return f"the CUDA backend cannot be imported: {exc}"
    return None


def block_inputs(backend: ak.ComputeBackend) -> tuple[BlockConfig, Any, Any, Any, Any]:
    """The transformer block's config, host input and weights, and both on the device."""
    cfg = BlockConfig()
    x_h = np.random.default_rng(3).standard_normal((cfg.batch, cfg.seq, cfg.width))
    x_h = x_h.astype(np.float32)
    w_h = block_weights(cfg)
    return cfg, x_h, w_h, backend.tensor_factory.from_host(x_h), upload_weights(backend, w_h)


async def on_cuda(script: str, body: Callable[[ak.ComputeBackend], Any]) -> int:
    """Run ``await body(backend)`` on an open cuda backend: 0, or 2 where nothing can be
    measured (no GPU, no PyTorch, the backend did not open), said on stderr as ``script``'s."""
    reason = no_gpu()
    if reason is not None:
        print(f"{script}: nothing measured: {reason}", file=sys.stderr)
        return 2
    try:
        async with ak.open_backend("cuda") as backend:
            await body(backend)
    except AccelError as exc:
        print(f"{script}: the cuda backend did not open: {exc}", file=sys.stderr)
        return 2
    return 0


async def main() -> int:
    return await on_cuda("bench_cuda", measure)


async def _tiny_block(backend: ak.ComputeBackend, torch: Any) -> str:
    """bench_core's block at 1 x 8 x 32 (2 heads), each block awaited, against PyTorch CUDA
    eager: both sides' device work is a few microseconds, so the ratio is the host paths'
    (the caller's, the submission thread's and the completer's against PyTorch's one
    thread); ``bench_host.py --block`` times accelkit's side without a GPU. After the ratio,
    which thread bounds accelkit's block: the CPU time a block of the caller submitting it,
    of the submission thread in its closures, and PyTorch's one thread's (the op calls
    without the final copy), over :data:`SPLIT_BLOCKS` more blocks each."""
    cfg = BlockConfig(**TINY_BLOCK)
    w_h = block_weights(cfg)
    x_h = np.random.default_rng(3).standard_normal((cfg.batch, cfg.seq, cfg.width))
    x_h = x_h.astype(np.float32)
    w = upload_weights(backend, w_h)
    x = backend.tensor_factory.from_host(x_h)
    tw = {k: torch.from_numpy(v).cuda() for k, v in w_h.items()}
    tx = torch.from_numpy(x_h).cuda()

    async def ak_block() -> None:
        await transformer_block(backend, x, w, cfg).to_host()

    def torch_block() -> None:
        with torch.inference_mode():
            _torch_block(torch, tx, tw, cfg).cpu()

    t_ak, t_th = await interleaved(ak_block, torch_block, BLOCK_ROUNDS)
    caller = thread = torch_cpu = 0.0
    with ThreadCPU(backend) as sub:
        for _ in range(SPLIT_BLOCKS):
            t = time.thread_time()
            y = transformer_block(backend, x, w, cfg)
            caller += time.thread_time() - t
            await y.to_host()
    thread = sub.ns / 1e9
    with torch.inference_mode():
        for _ in range(SPLIT_BLOCKS):
            t = time.thread_time()
            ty = _torch_block(torch, tx, tw, cfg)
            torch_cpu += time.thread_time() - t
            ty.cpu()

    def us(total: float) -> str:
        return f"{total / SPLIT_BLOCKS * 1e6:.0f}"

    return (
        f"tiny transformer block [1,8,32] f32, each awaited (the host paths): accelkit"
        f" {t_ak * 1e6:.0f} us (CPU a block: caller {us(caller)} us, submission thread"
        f" {us(thread)} us), torch eager {t_th * 1e6:.0f} us (its thread {us(torch_cpu)} us):"
        f" {t_th / t_ak:.2f}x torch"
    )


def _epilogue_launches() -> int:
    """Linears run so far with their bias in cuBLASLt's epilogue (``accelkit_cuda.blaslt``)."""
    from accelkit_cuda import blaslt

    return blaslt.stats["launches"]


async def _block_parts(
    backend: ak.ComputeBackend, torch: Any, x: Any, w: dict[str, Any], tx: Any,
    tw: dict[str, Any], cfg: BlockConfig,
) -> str:  # fmt: skip
    """Each op of the transformer block alone, at the block's shapes, against PyTorch's: ms per
    call and synchronize, medians of interleaved rounds. The CuPy compositions launch many
    kernels where PyTorch launches one (over the stand-in: layer_norm 11, tanh-GELU 10, a linear
    with its bias 2, a permute 1 copy; docs/backends/cuda.md)."""
    import torch.nn.functional as F  # noqa: N812

    ops = backend.tensor_ops
    b, s, d, h, hd = cfg.batch, cfg.seq, cfg.width, cfg.heads, cfg.head_dim
    y = ops.layer_norm(x, w["ln1_g"], w["ln1_b"], cfg.eps)
    heads = [
        ops.permute(ops.reshape(ops.linear(y, w[f"w_{n}"], w[f"b_{n}"]), (b, s, h, hd)), (0, 2, 1, 3))
        for n in "qkv"
    ]  # fmt: skip
    seq_major = [ops.reshape(ops.linear(y, w[f"w_{n}"], w[f"b_{n}"]), (b, s, h, hd)) for n in "qkv"]
    m = ops.linear(y, w["w_1"], w["b_1"])
    with torch.inference_mode():
        ty = F.layer_norm(tx, (d,), tw["ln1_g"], tw["ln1_b"], cfg.eps)
        tl = F.linear(ty, tw["w_qkv"][:d], tw["b_qkv"][:d])
        tq = tl.reshape(b, s, h, hd).permute(0, 2, 1, 3).contiguous()
        tv = tl.reshape(b, s, h, hd).transpose(1, 2)  # a strided view, as the block passes it
        tm = F.linear(ty, tw["w_1"], tw["b_1"])
    cases: list[tuple[str, Any, Any]] = [
        ("layer_norm", lambda: ops.layer_norm(x, w["ln1_g"], w["ln1_b"], cfg.eps),
         lambda: F.layer_norm(tx, (d,), tw["ln1_g"], tw["ln1_b"], cfg.eps)),
        ("linear+bias", lambda: ops.linear(y, w["w_q"], w["b_q"]),
         lambda: F.linear(ty, tw["w_qkv"][:d], tw["b_qkv"][:d])),
        ("permute", lambda: ops.permute(ops.reshape(y, (b, s, h, hd)), (0, 2, 1, 3)),
         lambda: tl.reshape(b, s, h, hd).permute(0, 2, 1, 3).contiguous()),
        ("attention f32 causal", lambda: ops.attention(*heads, causal=True),
         lambda: F.scaled_dot_product_attention(tq, tq, tq, is_causal=True)),
        # The block's own call: [B, S, H, D] read in place where a kernel can (no permutes).
        ("attention f32 causal bshd", lambda: ops.attention(*seq_major, causal=True, layout="bshd"),
         lambda: F.scaled_dot_product_attention(tv, tv, tv, is_causal=True).transpose(1, 2)),
        ("tanh-GELU", lambda: ops.gelu(m, approximate="tanh"),
         lambda: F.gelu(tm, approximate="tanh")),
        ("add", lambda: ops.add(x, y), lambda: tx + ty),
    ]  # fmt: skip
    parts = []
    for name, ak_op, torch_op in cases:

        async def ak_run(op: Any = ak_op) -> None:
            op()
            await backend.synchronize()

        def torch_run(op: Any = torch_op) -> None:
            with torch.inference_mode():
                op()
            torch.cuda.synchronize()

        await ak_run()
        torch_run()
        t_ak, t_th = await interleaved(ak_run, torch_run, BLOCK_ROUNDS)
        parts.append(f"{name} {t_ak * 1e3:.3f}/{t_th * 1e3:.3f}")
    return "block parts, ms per call accelkit/torch: " + ", ".join(parts)


def _with(module: Any, name: str, value: Any, run: Callable[[], Any]) -> Callable[[], Any]:
    """``run`` (awaited) with ``module.name`` set to ``value``, put back after each run."""

    async def timed() -> None:
        current = getattr(module, name)
        setattr(module, name, value)
        try:
            await run()
        finally:
            setattr(module, name, current)

    return timed


async def _completer_modes(ak_block: Callable[[], Any]) -> str:
    """The block (``ak_block``: submit and synchronize) with the streams' completer threads
    waiting on each position's event in turn and on the newest pending one
    (``accelkit_cuda.stream.COMPLETER``), interleaved: whether the completer's wake-ups (one a
    position, each a GIL acquisition beside the submission thread and the loop) are where
    the block's time goes. The mode is put back after each run."""
    from accelkit_cuda import stream

    current = stream.COMPLETER
    t_each, t_newest = await interleaved(
        _with(stream, "COMPLETER", "each", ak_block),
        _with(stream, "COMPLETER", "newest", ak_block),
        BLOCK_ROUNDS,
    )
    return (
        f"block by completer mode: each position {t_each * 1e3:.2f} ms, newest pending"
        f" {t_newest * 1e3:.2f} ms per step: {t_each / t_newest:.2f}x (interleaved; the figures"
        f" above ran with {current!r}; ACCELKIT_CUDA_COMPLETER)"
    )


async def _spin_modes(
    backend: ak.ComputeBackend, torch: Any, ak_block: Callable[[], Any], spin_us: float = 200.0
) -> str:
    """An add's round trip (a 64x64 add, then ``synchronize``) and the block (``ak_block``) with
    the completer sleeping on each end event at once and polling it first for ``spin_us``
    (``accelkit_cuda.stream.SPIN_US``), interleaved, and PyTorch's add and synchronize beside:
    whether the driver's wake-up of a blocking-sync wait is where an await's latency goes. The
    setting is put back after each run."""
    from accelkit_cuda import stream

    current = stream.SPIN_US
    ops = backend.tensor_ops
    a = backend.tensor_factory.from_host(np.ones((64, 64), np.float32))
    ta = torch.ones((64, 64), device="cuda")

    async def add() -> None:
        ops.add(a, a)
        await backend.synchronize()

    def torch_add() -> None:
        ta + ta
        torch.cuda.synchronize()

    def at(spin: float, run: Callable[[], Any]) -> Callable[[], Any]:
        return _with(stream, "SPIN_US", spin, run)

    polled = backend.default_stream.polled_done  # type: ignore[attr-defined]
    t_off, t_on = await interleaved(at(0.0, add), at(spin_us, add), BLOCK_ROUNDS)
    b_off, b_on = await interleaved(at(0.0, ak_block), at(spin_us, ak_block), BLOCK_ROUNDS)
    polled = backend.default_stream.polled_done - polled  # type: ignore[attr-defined]
    torch_add()
    rounds = []
    for _ in range(BLOCK_ROUNDS):
        t0 = time.perf_counter()
        torch_add()
        rounds.append(time.perf_counter() - t0)
    t_th = sorted(rounds)[len(rounds) // 2]
    return (
        f"completer polling {spin_us:g} us (ACCELKIT_CUDA_SPIN_US; the figures above ran at"
        f" {current:g}): add round trip {t_off * 1e3:.3f} ms without, {t_on * 1e3:.3f} ms with"
        f" ({t_off / t_on:.2f}x; torch {t_th * 1e3:.3f} ms); block {b_off * 1e3:.2f} ms without,"
        f" {b_on * 1e3:.2f} ms with ({b_off / b_on:.2f}x); {polled} rounds saw their event done"
        " by polling"
    )


async def _inline_modes(
    backend: ak.ComputeBackend, torch: Any, ak_block: Callable[[], Any], want: Any,
    block: Callable[[], Any],
) -> list[str]:  # fmt: skip
    """The block (``ak_block``: submit and synchronize), a 64x64 add's caller time (blocks of
    SMALL_CALLS back-to-back adds, the synchronization after each untimed) and its round trip
    (an add, then ``synchronize``) with plain launches queued for the submission thread and
    made on the caller's thread (``accelkit_cuda.stream.INLINE``), interleaved, PyTorch's
    beside; the block's answer with inline launches against PyTorch's (``want``), how many
    of a block's positions were launched inline, and the block's step timeline with them
    (``block()`` submits a block). The setting is put back after each run."""
    from accelkit_cuda import stream

    current = stream.INLINE
    s: Any = backend.default_stream
    ops = backend.tensor_ops
    a = backend.tensor_factory.from_host(np.ones((64, 64), np.float32))
    ta = torch.ones((64, 64), device="cuda")

    def at(on: bool, run: Callable[[], Any]) -> Callable[[], Any]:
        return _with(stream, "INLINE", on, run)

    async def check() -> None:
        got = await block().to_host()
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)

    await at(True, check)()
    inline0, submitted0 = s.inline_launches, s.submitted
    await at(True, ak_block)()
    per_block = (s.inline_launches - inline0, s.submitted - submitted0)
    b_off, b_on = await interleaved(at(False, ak_block), at(True, ak_block), BLOCK_ROUNDS)

    times: dict[bool, list[float]] = {False: [], True: []}

    def adds(on: bool) -> Callable[[], Any]:
        async def run() -> None:
            await backend.synchronize()
            t0 = time.perf_counter()
            for _ in range(SMALL_CALLS):
                ops.add(a, a)
            times[on].append((time.perf_counter() - t0) / SMALL_CALLS)
            await backend.synchronize()

        return at(on, run)

    for _ in range(BLOCK_ROUNDS):
        for on in (False, True):
            await adds(on)()
    torch.cuda.synchronize()
    t_th = []
    for _ in range(BLOCK_ROUNDS):
        t0 = time.perf_counter()
        for _ in range(SMALL_CALLS):
            ta + ta
        t_th.append((time.perf_counter() - t0) / SMALL_CALLS)
        torch.cuda.synchronize()

    async def trip() -> None:
        ops.add(a, a)
        await backend.synchronize()

    r_off, r_on = await interleaved(at(False, trip), at(True, trip), BLOCK_ROUNDS)
    timeline: list[str] = []

    async def steps() -> None:  # the block's step timeline with the switch on
        try:  # (a figure, never a reason to lose the lines above)
            m = await block_timeline(backend, block, 15)
        except Exception as exc:
            timeline.append(
                f"block inline step timeline: not measured ({type(exc).__name__}: {exc})"
            )
            return
        timeline.extend(f"block inline {line}" for line in describe_timeline(m, 15))

    await at(True, steps)()
    med = statistics.median
    return [
        f"inline launches (ACCELKIT_CUDA_INLINE; the figures above ran with {current}): block"
        f" {b_off * 1e3:.2f} ms queued, {b_on * 1e3:.2f} ms inline ({b_off / b_on:.2f}x;"
        f" {per_block[0]} of its {per_block[1]} positions inline; its answer checked)",
        f"inline launches: add 64x64 caller time {med(times[False]) * 1e6:.1f} us queued,"
        f" {med(times[True]) * 1e6:.1f} us inline (torch {med(t_th) * 1e6:.1f} us, launch"
        f" included); add round trip {r_off * 1e3:.3f} ms queued, {r_on * 1e3:.3f} ms inline",
        *timeline,
    ]


async def _sync_timeline(
    backend: ak.ComputeBackend, submit: Callable[[], Any], steps: int = 15
) -> dict[str, float]:
    """The medians of :class:`accelkit_cuda.timeline.StepProbe` over ``steps`` steps of
    ``submit()`` then ``await backend.synchronize()`` (bench_core's block timeline awaits a
    read instead, whose copy is then part of the step)."""
    from accelkit_cuda.timeline import StepProbe, medians

    cuda: Any = backend
    probe = StepProbe(cuda)
    submit()
    await backend.synchronize()
    rows = []
    for _ in range(steps):
        probe.begin()
        submit()
        probe.submitted()
        await backend.synchronize()
        rows.append(probe.finish())
    return medians(rows)


async def _switch_intervals(
    backend: ak.ComputeBackend,
    ak_block: Callable[[], Any],
    step: Callable[[], Any],
    short: float = 0.0002,
    long: float = 0.005,
) -> list[str]:
    """The block (``ak_block``: submit and synchronize) at a ``short`` and a ``long`` (CPython's
    default) GIL switch interval, interleaved, and the step timeline at ``short``: whether the
    submission thread's waits for the GIL (a thread that wants it may wait a whole interval
    while another runs Python) are where the block's time goes. The process's own interval (1 ms
    once a backend opened, ``ACCELKIT_SWITCH_INTERVAL_US``) is put back after each run."""
    current = sys.getswitchinterval()

    def at(interval: float) -> Callable[[], Any]:
        async def run() -> None:
            sys.setswitchinterval(interval)
            try:
                await ak_block()
            finally:
                sys.setswitchinterval(current)

        return run

    t_short, t_long = await interleaved(at(short), at(long), BLOCK_ROUNDS)
    sys.setswitchinterval(short)
    try:
        m = await block_timeline(backend, step, 15)
    finally:
        sys.setswitchinterval(current)
    return [
        f"block at a {short * 1e3:g} ms GIL switch interval: {t_short * 1e3:.2f} ms per step; at"
        f" {long * 1e3:g} ms (CPython's default): {t_long * 1e3:.2f} ms (interleaved; the figures"
        f" above ran at {current * 1e3:g} ms)",
        *(f"block ({short * 1e3:g} ms) {line}" for line in describe_timeline(m, 15)),
    ]


async def _gemm_figures(backend: ak.ComputeBackend, torch: Any, n: int, rng: Any) -> list[str]:
    """GEMM ``n``x``n``x``n`` in f16, bf16 and f32 against ``torch.matmul``: one line a dtype and
    route, each with the throughput of interleaved repeats of GEMM_CALLS GEMMs and the device
    time of one GEMM by CUDA events, on both sides."""
    f, ops = backend.tensor_factory, backend.tensor_ops
    lines: list[str] = []
    a32 = (rng.standard_normal((n, n), dtype=np.float32) * 0.1).astype(np.float32)
    tflops = 2 * n**3 / 1e12
    dtypes = [("f16", torch.float16), ("bf16", torch.bfloat16), ("f32", torch.float32)]
    for name, tdt in dtypes:
        if ak.DType(name) not in backend.capabilities.dtypes:
            lines.append(f"GEMM {n} {name}: not held by this backend (CuPy without bf16): skipped")
            continue
        a = f.from_host(a32, dtype=name)
        ta = torch.from_numpy(a32).cuda().to(tdt)
        # Issue 29's 0.93x was timed one GEMM and one synchronize a repeat: ~0.1 ms of a
        # 1.5 ms GEMM was the await, not cuBLAS. A repeat now queues GEMM_CALLS GEMMs, and the
        # device's own time (CUDA events, no host in it) is printed beside. Each on the default
        # route (cuBLAS with PyTorch's workspace, blas.eager_route) and on cupy.matmul
        # (ACCELKIT_CUDA_GEMM_WORKSPACE=0), except BF16: CuPy 14 has no BF16 GEMM (its
        # fallback, F32 copies and an F32 GEMM, ran at 0.06x PyTorch).
        routes: list[tuple[str, str | None]] = [("cuBLAS+workspace", None)]
        if name != "bf16":
            routes.append(("cupy.matmul", "0"))
        for route, env in routes:
            saved = os.environ.get(_WS_ENV)
            if env is not None:
                os.environ[_WS_ENV] = env
            else:
                os.environ.pop(_WS_ENV, None)
            try:

                async def ak_gemm(a: Any = a) -> None:
                    for _ in range(GEMM_CALLS):
                        ops.matmul(a, a)
                    await backend.synchronize()

                def torch_gemm(ta: Any = ta) -> None:
                    for _ in range(GEMM_CALLS):
                        torch.matmul(ta, ta)
                    torch.cuda.synchronize()

                await ak_gemm()
                torch_gemm()
                t_ak, t_th = await interleaved(ak_gemm, torch_gemm, 7)
                t_ak, t_th = t_ak / GEMM_CALLS, t_th / GEMM_CALLS
                d_ak = await device_ms(backend, lambda a=a: ops.matmul(a, a), GEMM_CALLS)
                d_th = torch_device_ms(lambda ta=ta: torch.matmul(ta, ta), GEMM_CALLS)
            finally:
                if saved is None:
                    os.environ.pop(_WS_ENV, None)
                else:
                    os.environ[_WS_ENV] = saved
            line = (
                f"GEMM {n} {name} ({route}): accelkit {tflops / t_ak:.0f} TFLOP/s, torch"
                f" {tflops / t_th:.0f} TFLOP/s: {t_th / t_ak:.2f}x torch"
                + (" (target >= 0.97x)" if name != "f32" else "")
                + f"; device time {d_ak:.3f} vs {d_th:.3f} ms: {d_th / d_ak if d_ak else math.nan:.2f}x"
            )
            lines.append(line)
        del a, ta
    return lines


async def _linear_figures(backend: ak.ComputeBackend, torch: Any, n: int, rng: Any) -> list[str]:
    """``linear`` with a bias, ``[n, n] @ w.T + b`` (w ``[n, n]``), in f16, bf16 and f32 against
    ``torch.nn.functional.linear`` (cuBLASLt's bias epilogue in PyTorch): throughput of
    interleaved repeats of GEMM_CALLS calls, the device time of one call, and how many of
    accelkit's timed calls took cuBLASLt's epilogue (``accelkit_cuda.blaslt``)."""
    from accelkit_cuda import blaslt

    f, ops = backend.tensor_factory, backend.tensor_ops
    lines: list[str] = []
    x32 = (rng.standard_normal((n, n), dtype=np.float32) * 0.1).astype(np.float32)
    b32 = rng.standard_normal(n, dtype=np.float32)
    tflops = 2 * n**3 / 1e12
    for name, tdt in (("f16", torch.float16), ("bf16", torch.bfloat16), ("f32", torch.float32)):
        if ak.DType(name) not in backend.capabilities.dtypes:
            lines.append(f"linear+bias {n} {name}: not held by this backend: skipped")
            continue
        x, w, b = (
            f.from_host(x32, dtype=name),
            f.from_host(x32, dtype=name),
            f.from_host(b32, dtype=name),
        )
        tx, tb = torch.from_numpy(x32).cuda().to(tdt), torch.from_numpy(b32).cuda().to(tdt)

        async def ak_linear(x: Any = x, w: Any = w, b: Any = b) -> None:
            for _ in range(GEMM_CALLS):
                ops.linear(x, w, b)
            await backend.synchronize()

        def torch_linear(tx: Any = tx, tb: Any = tb) -> None:
            for _ in range(GEMM_CALLS):
                torch.nn.functional.linear(tx, tx, tb)
            torch.cuda.synchronize()

        await ak_linear()
        torch_linear()
        before = blaslt.stats["launches"]
        t_ak, t_th = await interleaved(ak_linear, torch_linear, 7)
        epilogue = blaslt.stats["launches"] - before
        t_ak, t_th = t_ak / GEMM_CALLS, t_th / GEMM_CALLS
        d_ak = await device_ms(backend, lambda x=x, w=w, b=b: ops.linear(x, w, b), GEMM_CALLS)
        d_th = torch_device_ms(
            lambda tx=tx, tb=tb: torch.nn.functional.linear(tx, tx, tb), GEMM_CALLS
        )
        lines.append(
            f"linear+bias {n} {name}: accelkit {tflops / t_ak:.0f} TFLOP/s, torch"
            f" {tflops / t_th:.0f} TFLOP/s: {t_th / t_ak:.2f}x torch; device time {d_ak:.3f} vs"
            f" {d_th:.3f} ms: {d_th / d_ak if d_ak else math.nan:.2f}x; {epilogue} of"
            f" {7 * GEMM_CALLS} timed calls in cuBLASLt's epilogue"
        )
        if name == "f16":  # where a repeat's time goes beside the device's
            from accelkit_cuda.timeline import describe

            m = await _sync_timeline(
                backend, lambda x=x, w=w, b=b: [ops.linear(x, w, b) for _ in range(GEMM_CALLS)], 7
            )
            lines += [f"linear+bias {n} f16 x{GEMM_CALLS} {line}" for line in describe(m, 7)]
        del x, w, b, tx, tb
    return lines


async def measure(backend: ak.ComputeBackend) -> None:
    import torch
    import torch.nn.functional as F  # noqa: N812

    # f32 GEMMs in full f32 on both sides (PyTorch's default; CuPy's unless CUPY_TF32 is set).
    torch.backends.cuda.matmul.allow_tf32 = False
    f, ops, kops = backend.tensor_factory, backend.tensor_ops, backend.kernel_ops
    assert kops is not None
    assert "attention" in kops.ops
    card = torch.cuda.get_device_name()
    print(f"device: {backend.device} ({backend.capabilities.extra.get('arch', '?')}, {card});"
          f" torch {torch.__version__}", flush=True)  # fmt: skip
    rng = np.random.default_rng(0)
    summary: list[str] = [f"card: {card}"]
    done = [0]

    def step() -> str:
        done[0] += 1
        return f"{done[0]}/{STEPS}"

    print(f"[{step()}] GEMM {GEMM_N} f16, bf16, f32 ...", flush=True)
    for line in await _gemm_figures(backend, torch, GEMM_N, rng):
        print(f"      {line}", flush=True)
        summary.append(line)
    try:  # a figure, never a reason to stop the benchmark
        lines = await _linear_figures(backend, torch, LINEAR_N, rng)
    except Exception as exc:
        lines = [f"linear+bias: not measured ({type(exc).__name__}: {exc})"]
    for line in lines:
        print(f"      {line}", flush=True)
        summary.append(line)

    print(f"[{step()}] causal f16 attention 8x16x4096x128 ...", flush=True)
    shape = (8, 16, 4096, 128)
    q_h, k_h, v_h = (rng.standard_normal(shape).astype(np.float16) for _ in range(3))
    q, k, v = (f.from_host(x) for x in (q_h, k_h, v_h))
    tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q_h, k_h, v_h))

    async def ak_flash() -> None:
        kops.attention(q, k, v, causal=True)
        await backend.synchronize()

    async def ak_tensor_ops() -> None:  # TensorOps.attention: scores through cuBLAS
        ops.attention(q, k, v, causal=True)
        await backend.synchronize()

    def torch_sdpa() -> None:
        F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
        torch.cuda.synchronize()

    await ak_flash()
    torch_sdpa()
    t_ak, t_th = await interleaved(ak_flash, torch_sdpa, 3)
    print(f"      fused flash kernel: {t_ak * 1e3:.1f} ms vs SDPA {t_th * 1e3:.1f} ms:"
          f" {t_th / t_ak:.2f}x torch (target >= 0.8x)")  # fmt: skip
    summary.append(f"causal f16 attention, fused flash kernel: {t_ak * 1e3:.1f} ms vs SDPA"
                   f" {t_th * 1e3:.1f} ms: {t_th / t_ak:.2f}x torch")  # fmt: skip
    await ak_tensor_ops()
    t_ak, t_th = await interleaved(ak_tensor_ops, torch_sdpa, 3)
    print(f"      cuBLAS route:       {t_ak * 1e3:.1f} ms vs SDPA {t_th * 1e3:.1f} ms:"
          f" {t_th / t_ak:.2f}x torch")  # fmt: skip
    summary.append(f"causal f16 attention, cuBLAS route: {t_ak * 1e3:.1f} ms vs SDPA"
                   f" {t_th * 1e3:.1f} ms: {t_th / t_ak:.2f}x torch")  # fmt: skip

    print(f"[{step()}] small-op host time (64x64 f32) ...", flush=True)
    fast = getattr(ops.kernels, "fast", None)  # the raw elementwise kernels (issue 29)
    if fast is not None:
        fast.start()  # as the first such op would
    for _ in range(100):  # they compile off the loop and load on the submission thread
        if fast is None or fast.ready or fast.error is not None:
            break
        await anyio.sleep(0.1)
    print(f"      raw elementwise kernels: {'loaded' if fast is not None and fast.ready else 'not loaded'}"
          f"{'' if fast is None or fast.error is None else f' ({fast.error})'}")  # fmt: skip
    a_h = rng.standard_normal((64, 64)).astype(np.float32)
    b_h = rng.standard_normal((64, 64)).astype(np.float32)
    sa, sb = f.from_host(a_h), f.from_host(b_h)
    ta, tb = torch.from_numpy(a_h).cuda(), torch.from_numpy(b_h).cuda()
    for label, ak_call, torch_call, _ in CASES:
        got = await ak_call(ops, sa, sb).to_host()
        want = torch_call(torch, ta, tb).cpu().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3, err_msg=label)
        sides: dict[str, tuple[Callable[[], object], Callable[[], Any]]] = {
            "accelkit": (lambda c=ak_call: c(ops, sa, sb), backend.synchronize),
            "torch": (lambda c=torch_call: c(torch, ta, tb), torch.cuda.synchronize),
        }
        times = await host_times(sides, SMALL_CALLS, SMALL_ROUNDS)
        ratio = times["accelkit"] / times["torch"]
        with ThreadCPU(backend) as probe:  # the submission thread's side of the same calls
            for _ in range(SMALL_CALLS):
                ak_call(ops, sa, sb)
        await backend.synchronize()
        collector = await collector_cost(sides, SMALL_CALLS, 3)  # (the times: with it off)
        line = (
            f"host time per op, {label} 64x64 f32: accelkit {times['accelkit']:.1f} us,"
            f" torch {times['torch']:.1f} us: {ratio:.2f}x torch's time (target <= 1.0);"
            f" accelkit's submission thread {probe.ns / SMALL_CALLS / 1e3:.1f} us CPU a call;"
            f" the garbage collector (off in those times) {collector['accelkit'][0]:.2f} us a"
            f" call, torch's {collector['torch'][0]:.2f}"
        )
        print(f"      {line}", flush=True)
        summary.append(line)
        if label == "add":  # where the caller's time of the commonest small op goes
            frames, codes = python_work(lambda c=ak_call: c(ops, sa, sb), SMALL_CALLS)
            await backend.synchronize()
            top = profile_lines(lambda c=ak_call: c(ops, sa, sb), SMALL_CALLS, top=6)
            await backend.synchronize()
            print(f"      add's caller thread: {frames:.0f} Python calls, {codes:.0f} bytecodes"
                  " per op; cProfile's top functions by own time:")  # fmt: skip
            for row in top:
                print(f"        {row}")
            summary.append(f"add's caller thread: {frames:.0f} Python calls, {codes:.0f}"
                           " bytecodes per op")  # fmt: skip

    print(f"[{step()}] transformer block (bench_core's) vs PyTorch CUDA eager ...", flush=True)
    cfg, x_h, w_h, x, w = block_inputs(backend)
    tw = {k: torch.from_numpy(v).cuda() for k, v in w_h.items()}
    tx = torch.from_numpy(x_h).cuda()

    async def ak_block() -> None:
        transformer_block(backend, x, w, cfg)
        await backend.synchronize()

    def torch_block() -> None:
        with torch.inference_mode():
            _torch_block(torch, tx, tw, cfg)
        torch.cuda.synchronize()

    with torch.inference_mode():
        want = _torch_block(torch, tx, tw, cfg).cpu().numpy()
    got = await transformer_block(backend, x, w, cfg).to_host()
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
    epilogue = _epilogue_launches()
    await transformer_block(backend, x, w, cfg).to_host()
    epilogue = _epilogue_launches() - epilogue
    t_ak, t_th = await interleaved(ak_block, torch_block, BLOCK_ROUNDS)
    line = (
        f"transformer block [{cfg.batch},{cfg.seq},{cfg.width}] f32: accelkit"
        f" {t_ak * 1e3:.2f} ms, torch eager {t_th * 1e3:.2f} ms: {t_th / t_ak:.2f}x torch"
        f" (target >= 1.0x); {epilogue} of its 6 linears with the bias in cuBLASLt's epilogue"
    )
    print(f"      {line}", flush=True)
    summary.append(line)
    try:  # the host's cost alone: the same block at a size whose device work is negligible
        line = await _tiny_block(backend, torch)
    except Exception as exc:
        line = f"tiny transformer block: not measured ({type(exc).__name__}: {exc})"
    print(f"      {line}", flush=True)
    summary.append(line)
    try:  # one step's timeline (accelkit_cuda.timeline): a figure, never a reason to stop
        m = await block_timeline(backend, lambda: transformer_block(backend, x, w, cfg), 15)
        lines = [f"block {line}" for line in describe_timeline(m, 15)]
    except Exception as exc:
        lines = [f"block step timeline: not measured ({type(exc).__name__}: {exc})"]
    for line in lines:
        print(f"      {line}", flush=True)
        summary.append(line)
    try:  # an experiment: the same block at other GIL switch intervals
        lines = await _switch_intervals(
            backend, ak_block, lambda: transformer_block(backend, x, w, cfg)
        )
    except Exception as exc:
        lines = [f"block at other switch intervals: not measured ({type(exc).__name__}: {exc})"]
    for line in lines:
        print(f"      {line}", flush=True)
        summary.append(line)
    try:  # an experiment: the same block with the completer waiting on each or the newest
        line = await _completer_modes(ak_block)
    except Exception as exc:
        line = f"block by completer mode: not measured ({type(exc).__name__}: {exc})"
    print(f"      {line}", flush=True)
    summary.append(line)
    try:  # an experiment: plain launches made on the caller's thread
        lines = await _inline_modes(
            backend, torch, ak_block, want, lambda: transformer_block(backend, x, w, cfg)
        )
    except Exception as exc:
        lines = [f"inline launches: not measured ({type(exc).__name__}: {exc})"]
    for line in lines:
        print(f"      {line}", flush=True)
        summary.append(line)
    try:  # an experiment: the completer polling an awaited event before it sleeps on it
        line = await _spin_modes(backend, torch, ak_block)
    except Exception as exc:
        line = f"completer polling: not measured ({type(exc).__name__}: {exc})"
    print(f"      {line}", flush=True)
    summary.append(line)
    try:  # an add's round trip, step by step (accelkit_cuda.timeline)
        from accelkit_cuda.timeline import describe

        a64 = f.from_host(np.ones((64, 64), np.float32))
        m = await _sync_timeline(backend, lambda: ops.add(a64, a64))
        lines = [f"add 64x64 round trip {line}" for line in describe(m, 15)]
    except Exception as exc:
        lines = [f"add round trip timeline: not measured ({type(exc).__name__}: {exc})"]
    for line in lines:
        print(f"      {line}", flush=True)
        summary.append(line)
    try:  # where the block's time goes: a figure, never a reason to stop the benchmark
        line = await _block_parts(backend, torch, x, w, tx, tw, cfg)
    except Exception as exc:
        line = f"block parts: not measured ({type(exc).__name__}: {exc})"
    print(f"      {line}", flush=True)
    summary.append(line)
    # -- the same block captured once and replayed (issue 29 item 5) ---------------------
    print(f"[{step()}] transformer block, captured and replayed ...", flush=True)
    async with backend.capture() as graph:
        y_cap = transformer_block(backend, x, w, cfg)
    graph.replay()
    got = await y_cap.to_host()
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)

    async def ak_replay() -> None:
        graph.replay()
        await backend.synchronize()

    t_cap, t_th = await interleaved(ak_replay, torch_block, BLOCK_ROUNDS)
    line = (
        f"transformer block captured ({graph.kind}, {graph.num_calls} calls): accelkit"
        f" {t_cap * 1e3:.2f} ms, torch eager {t_th * 1e3:.2f} ms: {t_th / t_cap:.2f}x torch"
        " (target >= 1.5x)"
    )
    print(f"      {line}", flush=True)
    summary.append(line)
    try:  # an experiment: the replay launched on the caller's thread
        from accelkit_cuda import stream as cuda_stream

        c_off, c_on = await interleaved(
            _with(cuda_stream, "INLINE", False, ak_replay),
            _with(cuda_stream, "INLINE", True, ak_replay),
            BLOCK_ROUNDS,
        )
        line = (
            f"captured block replay: {c_off * 1e3:.2f} ms queued, {c_on * 1e3:.2f} ms inline"
            f" ({c_off / c_on:.2f}x; ACCELKIT_CUDA_INLINE)"
        )
    except Exception as exc:
        line = f"captured block replay inline: not measured ({type(exc).__name__}: {exc})"
    print(f"      {line}", flush=True)
    summary.append(line)

    print(f"[{step()}] heartbeat while awaiting a long GEMM chain ...", flush=True)
    big = f.from_host((rng.standard_normal((8192, 8192)) * 0.01).astype(np.float32))
    late: list[float] = []
    done = anyio.Event()

    async def heartbeat() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            await anyio.sleep(0.001)
            late.append(time.perf_counter() - t0 - 0.001)

    async with anyio.create_task_group() as tg:
        tg.start_soon(heartbeat)
        await anyio.sleep(0.01)
        y = big
        for _ in range(20):
            y = ops.matmul(y, big)
        await backend.synchronize()
        done.set()
    print(f"      {len(late)} beats; worst {max(late) * 1e3:.2f} ms late, median"
          f" {statistics.median(late) * 1e3:.3f} ms (target <= 1 ms)")  # fmt: skip
    summary.append(
        f"heartbeat during 20 f32 GEMMs {len(late)} beats: worst {max(late) * 1e3:.2f} ms late"
        " (target <= 1 ms)"
    )

    print("\nsummary:")
    for line in summary:
        print(f"  {line}")


if __name__ == "__main__":
    sys.exit(anyio.run(main))
