"""OpenCL backend benchmarks on its first device, as ratios against NumPy in the same process.

Run with ``python benchmarks/bench_opencl.py`` where accelkit-opencl is installed (PoCL gives a
CPU OpenCL device). Figures (issue 4's targets in brackets):

- f32 GEMM 1024x1024x1024 throughput vs NumPy's ``@`` [>= 25 %];
- a 4M-element f32 add vs NumPy's [<= 1.5x NumPy's time];
- loading a cached program in a new process-like cache state [<= 30 ms];
- the transformer block of the core benchmark, end to end on the device, vs plain NumPy.
"""

from __future__ import annotations

import os
import tempfile
import time

import anyio
import numpy as np

import accelkit as ak
from accelkit.cli.bench import interleaved
from accelkit.workloads import (
    BlockConfig,
    block_weights,
    transformer_block,
    transformer_block_numpy,
    upload_weights,
)


async def main() -> None:
    from accelkit_opencl.caches import cache_folder

    # Kernel-variant verdicts stay in the user's store (verification is once per device: the
    # first run pays it, below), while programs are built into a fresh folder.
    os.environ.setdefault("ACCELKIT_OPENCL_VARIANTS_FILE", str(cache_folder() / "variants.json"))
    os.environ.setdefault("ACCELKIT_OPENCL_CACHE", tempfile.mkdtemp(prefix="akcl-"))
    async with ak.open_backend("opencl") as backend:
        f, ops = backend.tensor_factory, backend.tensor_ops
        print(f"device: {backend.device} ({ak.select('opencl').report.candidates[0].name})")
        t0 = time.perf_counter()
        await backend.prepare(progress=lambda line: print("      " + line, flush=True))
        routes = ", ".join(f"{c.family}={c.variant}" for c in backend.kernel_variants())  # type: ignore[attr-defined]
        print(f"kernel variants ({time.perf_counter() - t0:.1f} s to verify or load): {routes}")
        rng = np.random.default_rng(0)

        print("[1/4] f32 GEMM 1024 ...", flush=True)
        n = 1024
        a_h = rng.standard_normal((n, n)).astype(np.float32)
        a = f.from_host(a_h)

        async def gemm() -> None:
            ops.matmul(a, a)
            await backend.synchronize()

        await gemm()
        t_cl, t_np = await interleaved(gemm, lambda: a_h @ a_h, 5)
        print(
            f"      accelkit-opencl {2 * n**3 / t_cl / 1e9:.1f} GFLOP/s, NumPy"
            f" {2 * n**3 / t_np / 1e9:.1f} GFLOP/s: {t_np / t_cl:.1%} of NumPy (target >= 25 %)"
        )

        print("[2/4] f32 add, 4M elements ...", flush=True)
        x_h = rng.standard_normal(1 << 22).astype(np.float32)
        x = f.from_host(x_h)

        async def add() -> None:
            ops.add(x, x)
            await backend.synchronize()

        await add()
        t_cl, t_np = await interleaved(add, lambda: x_h + x_h, 9)
        print(
            f"      accelkit-opencl {1e3 * t_cl:.2f} ms, NumPy {1e3 * t_np:.2f} ms:"
            f" {t_cl / t_np:.2f}x NumPy's time (target <= 1.5x)"
        )

        print("[3/4] cached program load ...", flush=True)
        ex = backend.kernel_executor
        assert ex is not None
        src = "__kernel void scale(__global float *x, float s) { x[get_global_id(0)] *= s; }"
        await ex.load_kernel(src, "scale", language="opencl")
    # A new backend has an empty in-memory cache: the program comes from the disk cache.
    async with ak.open_backend("opencl") as backend:
        ex = backend.kernel_executor
        assert ex is not None
        t0 = time.perf_counter()
        await ex.load_kernel(src, "scale", language="opencl")
        print(
            f"      {1e3 * (time.perf_counter() - t0):.1f} ms from the disk cache (target <= 30 ms)"
        )

        print("[4/4] transformer block end to end ...", flush=True)
        cfg = BlockConfig()
        x_h3 = rng.standard_normal((cfg.batch, cfg.seq, cfg.width)).astype(np.float32)
        w_h = block_weights(cfg)
        w = upload_weights(backend, w_h)
        xb = backend.tensor_factory.from_host(x_h3)

        async def block() -> None:
            await transformer_block(backend, xb, w, cfg).to_host()

        await block()
        t_cl, t_np = await interleaved(block, lambda: transformer_block_numpy(x_h3, w_h, cfg), 3)
        got = await transformer_block(backend, xb, w, cfg).to_host()
        want = transformer_block_numpy(x_h3, w_h, cfg)
        err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        print(
            f"      accelkit-opencl {1e3 * t_cl:.0f} ms, plain NumPy {1e3 * t_np:.0f} ms"
            f" ({t_np / t_cl:.2f}x); max relative error {err:.1e}"
        )


if __name__ == "__main__":
    anyio.run(main)
