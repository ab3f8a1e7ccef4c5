"""``accelkit demo``: an async workload on a backend, checked against NumPy and timed.

It runs a transformer block (batch 4, seq 256, width 512, 8 heads, causal attention, 4x
tanh-GELU MLP) and an image pipeline (grayscale, blur, Sobel, threshold on 8 RGB images of
256x256), while a heartbeat task on the same event loop measures how late it gets woken: the
number that shows whether device work blocked the loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np

from accelkit._api import open_backend
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

if TYPE_CHECKING:
    from accelkit.abc.backend import ComputeBackend
    from accelkit.selector import Selection

__all__ = ["DemoResult", "run_demo"]


@dataclass
class DemoResult:
    backend: str
    device: str
    timings_ms: dict[str, float] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    heartbeat_late_ms: float = 0.0
    ok: bool = True


def _best_of(
    runs: int, fn: Callable[[], np.ndarray[Any, Any]]
) -> tuple[np.ndarray[Any, Any], float]:
    """``fn()``'s result and its best time in seconds over ``runs`` runs."""
    best, result = float("inf"), None
    for _ in range(max(1, runs)):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    assert result is not None
    return result, best


async def _heartbeat(period: float, lateness: list[float], stop: anyio.Event) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        await anyio.sleep(period)
        lateness.append(time.perf_counter() - t0 - period)


async def _prepare(backend: ComputeBackend, say: Callable[[str], None]) -> None:
    """Have the backend do its one-time work before timing anything (the CPU backend compiles
    its JIT kernels: seconds on the first run, a fraction of one from Numba's cache after), off
    the event loop."""
    said: list[str] = []

    def progress(line: str) -> None:
        said.append(line)
        say(f"  {line}")

    t0 = time.perf_counter()
    note = await backend.prepare(progress)
    if note and note not in said:
        say(f"  {note}")
    seconds = time.perf_counter() - t0
    if seconds >= 0.05:
        say(f"  prepared in {seconds:.1f} s")


async def run_demo(
    target: str | Selection = "cpu",
    repeats: int = 3,
    say: Callable[[str], None] = print,
    isolate: bool = False,
) -> DemoResult:
    """Run the demo workloads on ``target`` (a backend name, a device, or a Selection, as
    :func:`~accelkit.open_backend` takes; ``isolate``: in a worker process); report timings and
    agreement with NumPy."""
    cfg = BlockConfig()
    async with open_backend(target, isolate=isolate) as backend:
        result = DemoResult(backend=backend.name, device=str(backend.device))
        say(f"accelkit demo on backend {backend.name!r} ({backend.device})")
        await _prepare(backend, say)
        rng = np.random.default_rng(0)
        x_host = rng.standard_normal((cfg.batch, cfg.seq, cfg.width)).astype(np.float32)
        w_host = block_weights(cfg)
        images_host = synthetic_images(rng, 8, 256)

        lateness: list[float] = []
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_heartbeat, 0.002, lateness, stop)

            w = upload_weights(backend, w_host)
            x = backend.tensor_factory.from_host(x_host)
            best = float("inf")
            out = None
            for i in range(repeats):
                t0 = time.perf_counter()
                out = transformer_block(backend, x, w, cfg)
                got = await out.to_host()
                best = min(best, time.perf_counter() - t0)
                say(
                    f"  transformer block, run {i + 1}/{repeats}: {1e3 * (time.perf_counter() - t0):.1f} ms"
                )
            imgs = backend.tensor_factory.from_host(images_host)
            best_images = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                edges = await image_pipeline(backend, imgs).to_host()
                best_images = min(best_images, time.perf_counter() - t0)
            result.timings_ms["image_pipeline"] = 1e3 * best_images
            stop.set()

        # The NumPy references run on this thread, outside the heartbeat's window; each side's
        # figure is its best of the same number of runs.
        want, numpy_s = _best_of(repeats, lambda: transformer_block_numpy(x_host, w_host, cfg))
        err = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) or 1.0))
        result.timings_ms["transformer_block"] = 1e3 * best
        result.timings_ms["transformer_block_numpy"] = 1e3 * numpy_s
        result.errors["transformer_block"] = err
        want_edges, images_numpy_s = _best_of(repeats, lambda: image_pipeline_numpy(images_host))
        result.timings_ms["image_pipeline_numpy"] = 1e3 * images_numpy_s
        mismatch = float(np.mean(edges != want_edges))
        result.errors["image_pipeline"] = mismatch

        result.heartbeat_late_ms = 1e3 * max(lateness, default=0.0)
        result.ok = err < 1e-3 and mismatch < 1e-3
        t = result.timings_ms
        say("")
        say(f"{'workload':<22}{'accelkit':>12}{'plain NumPy':>14}{'ratio':>9}   check")
        say(
            f"{'transformer block':<22}{t['transformer_block']:>10.1f}ms"
            f"{t['transformer_block_numpy']:>12.1f}ms"
            f"{t['transformer_block_numpy'] / t['transformer_block']:>8.2f}x"
            f"   max rel err {err:.1e}"
        )
        say(
            f"{'image pipeline':<22}{t['image_pipeline']:>10.1f}ms{t['image_pipeline_numpy']:>12.1f}ms"
            f"{t['image_pipeline_numpy'] / t['image_pipeline']:>8.2f}x"
            f"   {100 * mismatch:.3f}% pixels differ"
        )
        say(
            f"event loop: heartbeat (every 2 ms) woke at most {result.heartbeat_late_ms:.1f} ms late"
            f" (loop thread: {backend.loop_thread_scheduling})"
        )
        say(f"memory: {backend.memory_manager.memory_info().peak / 2**20:.1f} MiB peak")
        say("result: " + ("OK, matches NumPy" if result.ok else "MISMATCH against NumPy"))
    return result
