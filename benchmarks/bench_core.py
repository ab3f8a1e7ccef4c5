"""Core benchmarks of the CPU backend, as ratios against peers timed in the same process.

Run with ``nox -s bench`` (installs PyTorch's CPU build as a peer) or ``python
benchmarks/bench_core.py [--quick] [--json PATH]``. Each figure names its peer:

- small-op overhead: a 64x64 f32 add through TensorOps (submitted and completed) vs ``np.add``;
- GEMM: 2048x2048 f32 matmul throughput vs NumPy's ``@``;
- event-loop latency: the worst and 99th-percentile lateness of a 1 ms heartbeat while 4096x4096
  matmuls run on the backend, vs the same NumPy call made on the loop, and vs the same loop left
  idle for as long (what the machine itself costs: on a shared VM, several ms at worst);
- transformer block (batch 4, seq 256, width 512, 8 heads, causal, 4x tanh-GELU MLP) vs PyTorch
  CPU, vs plain NumPy, and vs itself on NumPy's kernels (the CPU JIT kernels off, interleaved);
- the block's ops that the JIT kernels serve (layer_norm, causal attention, tanh-GELU), each
  alone: with the JIT kernels, with NumPy's, and PyTorch's;
- the demo's image pipeline (8 RGB u8 256x256 images: grayscale, Gaussian blur, Sobel, threshold)
  vs plain NumPy and vs the same filters in SciPy's ndimage;
- memory: reserved bytes over 10,000 allocate/free cycles of mixed sizes, and ``used`` after
  shutdown;
- per-op cost against size: an f32 add of 16 to 4M elements (submitted and completed) through
  accelkit, NumPy and PyTorch, as a table and a plot (``benchmarks/results/per_op_cost.png``,
  with matplotlib) that shows where the fixed cost stops mattering.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

# accelkit before NumPy, as an application that imports it first: it sets OpenBLAS's thread
# timeout before NumPy loads OpenBLAS (docs/backends/cpu.md).
import accelkit as ak

# isort: split
import anyio
import numpy as np

from accelkit.cli.bench import interleaved
from accelkit.sdk.host import JIT
from accelkit.workloads import (
    BlockConfig,
    block_weights,
    image_pipeline,
    image_pipeline_numpy,
    synthetic_images,
    transformer_block,
    transformer_block_numpy,
    upload_weights,
)


def per_call_us(fn: Callable[[], object], calls: int = 200, rounds: int = 50) -> float:
    """Median over ``rounds`` of the mean time of ``calls`` back-to-back calls, in us."""
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls)
    return 1e6 * statistics.median(samples)


async def small_op(backend: ak.ComputeBackend, report: dict[str, Any]) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    a_h = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    b_h = a_h * 2
    a, b = f.from_host(a_h), f.from_host(b_h)

    def through_accelkit() -> None:
        out = ops.add(a, b)
        assert out._stream.completed >= out._seq  # completed, not only submitted

    np_us = per_call_us(lambda: np.add(a_h, b_h))
    ak_us = per_call_us(through_accelkit)
    np.testing.assert_allclose(ops.add(a, b).numpy(), a_h + b_h)
    report["small_op"] = {"numpy_us": np_us, "accelkit_us": ak_us, "overhead_us": ak_us - np_us}


async def gemm(backend: ak.ComputeBackend, report: dict[str, Any], n: int, repeats: int) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    rng = np.random.default_rng(1)
    a_h = rng.standard_normal((n, n)).astype(np.float32)
    b_h = rng.standard_normal((n, n)).astype(np.float32)
    a, b = f.from_host(a_h), f.from_host(b_h)

    async def run() -> None:
        ops.matmul(a, b)
        await backend.synchronize()

    await run()
    t_ak, t_np = await interleaved(run, lambda: a_h @ b_h, repeats)
    flops = 2 * n**3
    report["gemm"] = {
        "n": n,
        "numpy_gflops": flops / t_np / 1e9,
        "accelkit_gflops": flops / t_ak / 1e9,
        "ratio": t_np / t_ak,
    }


async def heartbeat(backend: ak.ComputeBackend, report: dict[str, Any], n: int) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    rng = np.random.default_rng(2)
    a_h = rng.standard_normal((n, n)).astype(np.float32)
    a = f.from_host(a_h)

    async def measure(work: Callable[[], Any]) -> list[float]:
        late: list[float] = []
        done = anyio.Event()

        async def beat() -> None:
            while not done.is_set():
                t0 = time.perf_counter()
                await anyio.sleep(0.001)
                late.append(1e3 * (time.perf_counter() - t0 - 0.001))

        async with anyio.create_task_group() as tg:
            tg.start_soon(beat)
            await anyio.sleep(0.01)
            await work()
            await anyio.sleep(0.01)
            done.set()
        return late

    async def on_backend() -> None:
        for _ in range(3):
            ops.matmul(a, a)
        await backend.synchronize()

    async def on_loop() -> None:
        _ = a_h @ a_h

    t0 = time.perf_counter()
    busy = await measure(on_backend)
    seconds = time.perf_counter() - t0

    async def idle() -> None:
        await anyio.sleep(seconds)

    # The same heartbeat with nothing running, as long: what this machine's scheduler (and, in
    # a virtual machine, the host's) costs a loop by itself. On the shared VM issue 11 was
    # measured on, an idle loop was 6-10 ms late at worst, more than the target.
    quiet = await measure(idle)
    report["heartbeat"] = {
        "n": n,
        "accelkit_max_late_ms": max(busy),
        "accelkit_p99_late_ms": float(np.percentile(busy, 99)),
        "accelkit_beats_over_2ms": sum(x > 2 for x in busy),
        "beats": len(busy),
        "idle_max_late_ms": max(quiet),
        "idle_p99_late_ms": float(np.percentile(quiet, 99)),
        "idle_beats_over_2ms": sum(x > 2 for x in quiet),
        "idle_beats": len(quiet),
        "numpy_on_loop_max_late_ms": max(await measure(on_loop)),
    }


async def block(backend: ak.ComputeBackend, report: dict[str, Any], repeats: int) -> None:
    cfg = BlockConfig()
    rng = np.random.default_rng(3)
    x_h = rng.standard_normal((cfg.batch, cfg.seq, cfg.width)).astype(np.float32)
    w_h = block_weights(cfg)
    w = upload_weights(backend, w_h)
    x = backend.tensor_factory.from_host(x_h)

    async def run() -> None:
        await transformer_block(backend, x, w, cfg).to_host()

    await run()
    t_ak, t_np = await interleaved(run, lambda: transformer_block_numpy(x_h, w_h, cfg), repeats)
    entry: dict[str, Any] = {
        "accelkit_ms": 1e3 * t_ak,
        "numpy_ms": 1e3 * t_np,
        "vs_numpy": t_np / t_ak,
    }
    try:
        import torch
    except ImportError:
        entry["torch_ms"] = None
    else:
        tw = {k: torch.from_numpy(v) for k, v in w_h.items()}
        tx = torch.from_numpy(x_h)

        def torch_block() -> None:
            with torch.inference_mode():
                _torch_block(torch, tx, tw, cfg)

        # Not interleaved with accelkit: PyTorch's OpenMP threads spin after each call and
        # would steal the cores from OpenBLAS's threads (and theirs from PyTorch's). Each side
        # gets its own block of runs, with a pause between for spinning threads to park.
        await anyio.sleep(0.5)
        for _ in range(3):
            torch_block()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch_block()
            times.append(time.perf_counter() - t0)
        t_t = statistics.median(times)
        await anyio.sleep(0.5)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            await run()
            times.append(time.perf_counter() - t0)
        t_ak = statistics.median(times)
        entry["accelkit_ms"] = 1e3 * t_ak
        entry.update(torch_ms=1e3 * t_t, vs_torch=t_t / t_ak, torch_threads=torch.get_num_threads())

    async def run_without_jit() -> None:
        with JIT.disabled():
            await run()

    # The same block on NumPy's kernels (what a plain `pip install .` runs), interleaved.
    t_jit, t_nojit = await interleaved(run, run_without_jit, repeats)
    entry.update(
        jit_ms=1e3 * t_jit, numpy_kernels_ms=1e3 * t_nojit, vs_numpy_kernels=t_nojit / t_jit
    )
    entry["timeline"] = await block_timeline(
        backend, lambda: transformer_block(backend, x, w, cfg), repeats
    )
    entry["timeline_steps"] = repeats
    report["transformer_block"] = entry


async def block_timeline(
    backend: ak.ComputeBackend, step: Callable[[], Any], steps: int
) -> dict[str, float]:
    """Where a step's time goes: ``step()`` submits some ops and returns a tensor whose
    ``to_host()`` is awaited; the medians over ``steps`` steps of when the ops were submitted
    (``submit_ms``) and when the await returned (``done_ms``), in ms from the first op. On the
    CUDA backend, also when its submission thread launched them, their GPU time, its waits and
    the per-step counts (``accelkit_cuda.timeline``); on other backends those two only."""
    probe: Any = None
    if str(backend.device).startswith("cuda"):
        from accelkit_cuda.timeline import StepProbe

        cuda: Any = backend  # a CUDABackend
        probe = StepProbe(cuda)
    rows: list[dict[str, float]] = []
    for _ in range(steps):
        if probe is not None:
            probe.begin()
        t0 = time.perf_counter()
        y = step()
        t1 = time.perf_counter()
        if probe is not None:
            probe.submitted()
        await y.to_host()
        t2 = time.perf_counter()
        rows.append(
            probe.finish()
            if probe is not None
            else {"submit_ms": 1e3 * (t1 - t0), "done_ms": 1e3 * (t2 - t0)}
        )
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def describe_timeline(m: dict[str, float], steps: int) -> list[str]:
    """Lines (one, two on CUDA) for :func:`block_timeline`'s medians ``m``."""
    if "gpu_ms" in m:
        from accelkit_cuda.timeline import describe

        lines: list[str] = describe(m, steps)
        return lines
    return [
        f"step timeline (median of {steps}, ms from the first op): ops submitted"
        f" {m['submit_ms']:.2f}, await returned {m['done_ms']:.2f}"
    ]


async def block_parts(backend: ak.ComputeBackend, report: dict[str, Any], repeats: int) -> None:
    """The block's ops that the JIT kernels serve, each timed alone: accelkit with them, with
    NumPy's kernels, and PyTorch."""
    cfg = BlockConfig()
    b, s, d, h, hd = cfg.batch, cfg.seq, cfg.width, cfg.heads, cfg.head_dim
    rng = np.random.default_rng(4)
    x_h = rng.standard_normal((b, s, d)).astype(np.float32)
    m_h = rng.standard_normal((b, s, 4 * d)).astype(np.float32)
    q_h = rng.standard_normal((b, h, s, hd)).astype(np.float32)
    g_h, bias_h = rng.standard_normal((2, d)).astype(np.float32)
    f, ops = backend.tensor_factory, backend.tensor_ops
    x, m, q, g, bias = (f.from_host(a) for a in (x_h, m_h, q_h, g_h, bias_h))
    cases: list[tuple[str, Callable[[], Any], Callable[[Any], Any]]] = [
        (
            f"layer_norm [{b},{s},{d}]",
            lambda: ops.layer_norm(x, g, bias, cfg.eps),
            lambda t: t.nn.functional.layer_norm(t.x, (d,), t.g, t.b, cfg.eps),
        ),
        (
            f"causal attention [{b},{h},{s},{hd}]",
            lambda: ops.attention(q, q, q, causal=True),
            lambda t: t.nn.functional.scaled_dot_product_attention(t.q, t.q, t.q, is_causal=True),
        ),
        (
            f"tanh-GELU [{b},{s},{4 * d}]",
            lambda: ops.gelu(m, approximate="tanh"),
            lambda t: t.nn.functional.gelu(t.m, approximate="tanh"),
        ),
    ]
    try:
        import torch
    except ImportError:
        torch = None
    rows = []
    for name, ak_op, torch_op in cases:
        # Each op is waited for without copying its result to the host (PyTorch's call
        # returns with the result in place, and a 2 MiB copy would be most of a layer_norm).
        async def with_jit(op: Callable[[], Any] = ak_op) -> None:
            out = op()
            await backend.synchronize()
            del out

        async def without_jit(op: Callable[[], Any] = ak_op) -> None:
            with JIT.disabled():
                out = op()
                await backend.synchronize()
            del out

        row: dict[str, Any] = {"op": name}
        if torch is not None:
            # PyTorch first, after a pause: OpenBLAS's threads spin for a while after a GEMM,
            # and PyTorch's after its calls; each side gets the cores to itself.
            await anyio.sleep(0.5)
            t = _TorchArgs(torch, x_h, m_h, q_h, g_h, bias_h)
            with torch.inference_mode():
                for _ in range(3):
                    torch_op(t)
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    torch_op(t)
                    times.append(time.perf_counter() - t0)
            row["torch_ms"] = 1e3 * statistics.median(times)
            await anyio.sleep(0.5)
        await with_jit()
        await without_jit()
        t_jit, t_np = await interleaved(with_jit, without_jit, repeats)
        row.update(jit_ms=1e3 * t_jit, numpy_kernels_ms=1e3 * t_np)
        rows.append(row)
    report["block_parts"] = rows


class _TorchArgs:
    def __init__(self, torch: Any, *arrays: np.ndarray[Any, Any]) -> None:
        self.nn = torch.nn
        self.x, self.m, self.q, self.g, self.b = (torch.from_numpy(a) for a in arrays)


def _torch_block(torch: Any, x: Any, w: dict[str, Any], cfg: BlockConfig) -> Any:
    fn = torch.nn.functional
    b, s, d, h, hd = cfg.batch, cfg.seq, cfg.width, cfg.heads, cfg.head_dim
    y = fn.layer_norm(x, (d,), w["ln1_g"], w["ln1_b"], cfg.eps)
    qkv = fn.linear(y, w["w_qkv"], w["b_qkv"]).view(b, s, 3, h, hd).permute(2, 0, 3, 1, 4)
    att = fn.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
    x = x + fn.linear(att.transpose(1, 2).reshape(b, s, d), w["w_o"], w["b_o"])
    y = fn.layer_norm(x, (d,), w["ln2_g"], w["ln2_b"], cfg.eps)
    m = fn.gelu(fn.linear(y, w["w_1"], w["b_1"]), approximate="tanh")
    return x + fn.linear(m, w["w_2"], w["b_2"])


def image_pipeline_ndimage(images: np.ndarray[Any, Any], threshold: float = 40.0) -> Any:
    """The image pipeline with SciPy's ndimage filters (correlate1d, edge replication)."""
    from scipy import ndimage

    x = images.astype(np.float32)
    gray = np.clip(np.rint(0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]), 0, 255)
    r = np.arange(7) - 3
    g = np.exp(-(r**2) / 2.0)
    g = (g / g.sum()).astype(np.float32)
    smooth = ndimage.correlate1d(gray, g, axis=2, mode="nearest")
    smooth = ndimage.correlate1d(smooth, g, axis=1, mode="nearest")
    smooth = np.clip(np.rint(smooth), 0, 255)
    gx = ndimage.sobel(smooth, axis=2, mode="nearest")
    gy = ndimage.sobel(smooth, axis=1, mode="nearest")
    mag = np.hypot(gx, gy)
    return np.where(mag > threshold, 255.0, 0.0).astype(np.float32)[:, None]


async def images(backend: ak.ComputeBackend, report: dict[str, Any], repeats: int) -> None:
    imgs_h = synthetic_images(np.random.default_rng(4), 8, 256)
    imgs = backend.tensor_factory.from_host(imgs_h)

    async def run() -> None:
        await image_pipeline(backend, imgs).to_host()

    await run()
    t_ak, t_np = await interleaved(run, lambda: image_pipeline_numpy(imgs_h), repeats)
    _, t_nd = await interleaved(run, lambda: image_pipeline_ndimage(imgs_h), repeats)
    report["image_pipeline"] = {
        "accelkit_ms": 1e3 * t_ak,
        "numpy_ms": 1e3 * t_np,
        "ndimage_ms": 1e3 * t_nd,
        "vs_numpy": t_np / t_ak,
        "vs_ndimage": t_nd / t_ak,
    }


PLOT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "per_op_cost.png")
CURVE_SIZES = (16, 256, 4096, 1 << 16, 1 << 18, 1 << 20, 1 << 22)


async def per_op_curve(backend: ak.ComputeBackend, report: dict[str, Any], quick: bool) -> None:
    """Median microseconds per f32 add (submitted and completed) at each size."""
    f, ops = backend.tensor_factory, backend.tensor_ops
    try:
        import torch
    except ImportError:
        torch = None

    def measure(n: int) -> dict[str, Any]:
        a_h = np.random.default_rng(5).standard_normal(n).astype(np.float32)
        b_h = a_h * 2
        a, b = f.from_host(a_h), f.from_host(b_h)
        calls = max(2, min(200, (1 << 22) // (n * 8)))
        rounds = 5 if quick else 15

        def through_accelkit() -> None:
            out = ops.add(a, b)
            out._stream.wait_for_blocking(out._seq)  # completed, not only submitted

        row = {
            "elements": n,
            "numpy_us": per_call_us(lambda: np.add(a_h, b_h), calls, rounds),
            "accelkit_us": per_call_us(through_accelkit, calls, rounds),
        }
        if torch is not None:
            ta, tb = torch.from_numpy(a_h), torch.from_numpy(b_h)
            row["torch_us"] = per_call_us(lambda: torch.add(ta, tb), calls, rounds)
        return row

    rows = [measure(n) for n in (CURVE_SIZES[:-2] if quick else CURVE_SIZES)]
    report["per_op_curve"] = rows


def plot_curve(rows: list[dict[str, Any]], path: str) -> str:
    """Write the per-op cost plot; returns what happened, for the report."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install matplotlib)"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sizes = [r["elements"] for r in rows]
    for key, label in (
        ("accelkit_us", "accelkit (cpu)"),
        ("numpy_us", "NumPy"),
        ("torch_us", "PyTorch CPU"),
    ):
        if all(key in r for r in rows):
            ax.loglog(sizes, [r[key] for r in rows], marker="o", label=label)
    ax.set_xlabel("elements (f32 add)")
    ax.set_ylabel("microseconds per call (submitted and completed)")
    ax.set_title("Per-op cost against size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"plot written to {path}"


async def memory(report: dict[str, Any], cycles: int) -> None:
    backend = ak.create_backend("cpu")
    await backend.initialize()
    mm = backend.memory_manager
    rng = np.random.default_rng(4)
    sizes = rng.integers(1, 1 << 20, size=64).tolist()
    live: list[Any] = []
    reserved = []
    for i in range(cycles):
        live.append(mm.allocate(sizes[i % len(sizes)]))
        if len(live) > 16:
            mm.free(live.pop(int(rng.integers(len(live)))))
        if i % (cycles // 20) == 0:
            reserved.append(mm.memory_info().reserved)
    live.clear()
    info = mm.memory_info()
    await backend.shutdown()
    after = backend.memory_manager.memory_info()
    report["memory"] = {
        "cycles": cycles,
        "reserved_samples_mib": [r / 2**20 for r in reserved],
        # After the first quarter (warm-up), reserved should stay within a narrow band.
        "reserved_band_after_warmup": max(reserved[5:]) / min(reserved[5:]),
        "reserved_first_last_mib": [reserved[5] / 2**20, reserved[-1] / 2**20],
        "used_after_frees": info.used,
        "used_after_shutdown": after.used,
        "reserved_after_shutdown": after.reserved,
    }


async def main(quick: bool) -> dict[str, Any]:
    report: dict[str, Any] = {"numpy": np.__version__, "accelkit": ak.__version__}
    repeats = 3 if quick else 11
    # The CPU backend's JIT kernels, compiled before anything is timed (seconds on a cold cache).
    print("compiling the CPU JIT kernels ...", flush=True)
    report["cpu_jit"] = {**JIT.describe(), "kernels": JIT.wait()}
    report["openblas_thread_timeout"] = os.environ.get("OPENBLAS_THREAD_TIMEOUT")
    async with ak.open_backend("cpu") as backend:
        steps = [
            ("small-op overhead", small_op(backend, report)),
            ("2048 GEMM", gemm(backend, report, 1024 if quick else 2048, repeats)),
            ("event-loop heartbeat", heartbeat(backend, report, 2048 if quick else 4096)),
            ("transformer block", block(backend, report, repeats)),
            ("the block's JIT-served ops", block_parts(backend, report, repeats)),
            ("image pipeline", images(backend, report, repeats)),
            ("per-op cost against size", per_op_curve(backend, report, quick)),
        ]
        for i, (name, coro) in enumerate(steps, 1):
            print(f"[{i}/{len(steps) + 1}] {name} ...", flush=True)
            await coro
    print(f"[{len(steps) + 1}/{len(steps) + 1}] memory cycles ...", flush=True)
    await memory(report, 2000 if quick else 10_000)
    return report


def show(r: dict[str, Any]) -> None:
    s, g, h, t, m = r["small_op"], r["gemm"], r["heartbeat"], r["transformer_block"], r["memory"]
    print()
    jit_info = r["cpu_jit"]
    ready = sum(v == "ready" for v in jit_info["kernels"].values())
    print(
        f"CPU JIT kernels: Numba {jit_info['numba']}, {ready} of {len(jit_info['kernels'])} ready"
        if jit_info["numba"]
        else "CPU JIT kernels: Numba not installed (pip install 'accelkit[jit]')"
    )
    timeout = r["openblas_thread_timeout"] or "unset (OpenBLAS's default spin)"
    print(f"OPENBLAS_THREAD_TIMEOUT: {timeout}")
    print(f"{'benchmark':<34}{'accelkit':>14}{'peer':>14}   result")
    print(
        f"{'64x64 f32 add (median/call)':<34}{s['accelkit_us']:>12.2f}us{s['numpy_us']:>12.2f}us"
        f"   +{s['overhead_us']:.2f} us over NumPy (target <= 2 us)"
    )
    print(
        f"{str(g['n']) + 'x' + str(g['n']) + ' f32 matmul':<34}{g['accelkit_gflops']:>8.0f} GFLOP/s"
        f"{g['numpy_gflops']:>8.0f} GFLOP/s   {g['ratio']:.2f}x NumPy's throughput (target >= 0.95)"
    )
    print(
        f"{'heartbeat during ' + str(h['n']) + ' matmul':<34}{h['accelkit_max_late_ms']:>12.2f}ms"
        f"{h['numpy_on_loop_max_late_ms']:>12.1f}ms   worst lateness (target <= 2 ms; peer: NumPy on"
        " the loop)"
    )
    print(
        f"{'  the same: p99, beats over 2 ms':<34}{h['accelkit_p99_late_ms']:>12.2f}ms"
        f"{h['idle_p99_late_ms']:>12.2f}ms   {h['accelkit_beats_over_2ms']}/{h['beats']} beats over"
        f" 2 ms (peer: the loop idle as long, {h['idle_beats_over_2ms']}/{h['idle_beats']} over 2 ms,"
        f" worst {h['idle_max_late_ms']:.2f} ms)"
    )
    if t.get("torch_ms"):
        print(
            f"{'transformer block':<34}{t['accelkit_ms']:>12.1f}ms{t['torch_ms']:>12.1f}ms"
            f"   {t['accelkit_ms'] / t['torch_ms']:.2f}x PyTorch CPU's time (target <= 1.0)"
        )
    print(
        f"{'transformer block':<34}{t['accelkit_ms']:>12.1f}ms{t['numpy_ms']:>12.1f}ms"
        f"   {t['vs_numpy']:.2f}x faster than plain NumPy"
    )
    print(
        f"{'transformer block':<34}{t['jit_ms']:>12.1f}ms{t['numpy_kernels_ms']:>12.1f}ms"
        f"   {t['vs_numpy_kernels']:.2f}x faster than on NumPy's kernels (JIT off)"
    )
    if "timeline" in t:
        for line in describe_timeline(t["timeline"], t["timeline_steps"]):
            print(f"  transformer block {line}")
    for p in r["block_parts"]:
        torch_part = (
            f"; {p['jit_ms'] / p['torch_ms']:.2f}x PyTorch's time ({p['torch_ms']:.2f} ms)"
            if "torch_ms" in p
            else ""
        )
        print(
            f"{'  ' + p['op']:<34}{p['jit_ms']:>12.2f}ms{p['numpy_kernels_ms']:>12.2f}ms"
            f"   {p['numpy_kernels_ms'] / p['jit_ms']:.2f}x NumPy's kernels' speed{torch_part}"
        )
    im = r["image_pipeline"]
    print(
        f"{'image pipeline (8x256x256 RGB)':<34}{im['accelkit_ms']:>12.1f}ms{im['numpy_ms']:>12.1f}ms"
        f"   {im['vs_numpy']:.2f}x faster than plain NumPy (target >= 1.5)"
    )
    print(
        f"{'image pipeline (8x256x256 RGB)':<34}{im['accelkit_ms']:>12.1f}ms{im['ndimage_ms']:>12.1f}ms"
        f"   {im['vs_ndimage']:.2f}x faster than SciPy ndimage (target >= 1.0)"
    )
    print()
    print(f"{'f32 add, elements':<20}{'accelkit':>12}{'NumPy':>12}{'PyTorch':>12}   accelkit/NumPy")
    for row in r["per_op_curve"]:
        torch_us = f"{row['torch_us']:>10.1f}us" if "torch_us" in row else f"{'-':>12}"
        print(
            f"{row['elements']:<20}{row['accelkit_us']:>10.1f}us{row['numpy_us']:>10.1f}us"
            f"{torch_us}   {row['accelkit_us'] / row['numpy_us']:.2f}x"
        )
    print(plot_curve(r["per_op_curve"], PLOT_PATH))
    print(
        f"{str(m['cycles']) + ' alloc/free cycles':<34}{'':>14}{'':>14}   reserved after warm-up"
        f" {m['reserved_first_last_mib'][0]:.1f} -> {m['reserved_first_last_mib'][1]:.1f} MiB"
        f" (max/min {m['reserved_band_after_warmup']:.2f}); used after shutdown ="
        f" {m['used_after_shutdown']}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    result = anyio.run(main, args.quick)
    show(result)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
