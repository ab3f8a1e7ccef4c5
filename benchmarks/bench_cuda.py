"""CUDA backend benchmarks on a GPU, as ratios against PyTorch in the same process.

Run with ``python benchmarks/bench_cuda.py`` where accelkit-cuda, CuPy and PyTorch (CUDA) are
installed. Figures (issue 5's targets in brackets):

- f16 GEMM 8192x8192x8192 vs ``torch.matmul`` [>= 0.95x];
- causal f16 attention, batch 8, 16 heads, seq 4096, head_dim 128, vs
  ``torch.nn.functional.scaled_dot_product_attention`` [>= 0.8x], for the fused flash kernel
  (KernelOps) and the cuBLAS route (TensorOps);
- host time to submit a small op [<= 10 us], next to PyTorch's;
- how late a 1 ms heartbeat task runs while the loop awaits a long GEMM chain [<= 1 ms].

Timings are medians of interleaved repeats, each ending in a device synchronization.
"""

from __future__ import annotations

import statistics
import time

import anyio
import numpy as np

import accelkit as ak
from accelkit.cli.bench import interleaved


async def main() -> None:
    import torch
    import torch.nn.functional as F  # noqa: N812

    async with ak.open_backend("cuda") as backend:
        f, ops, kops = backend.tensor_factory, backend.tensor_ops, backend.kernel_ops
        assert kops is not None
        assert "attention" in kops.ops
        print(f"device: {backend.device} ({backend.capabilities.extra['arch']})", flush=True)
        rng = np.random.default_rng(0)

        print("[1/4] f16 GEMM 8192 ...", flush=True)
        n = 8192
        a_h = (rng.standard_normal((n, n)) * 0.1).astype(np.float16)
        a = f.from_host(a_h)
        ta = torch.from_numpy(a_h).cuda()

        async def ak_gemm() -> None:
            ops.matmul(a, a)
            await backend.synchronize()

        def torch_gemm() -> None:
            torch.matmul(ta, ta)
            torch.cuda.synchronize()

        await ak_gemm()
        torch_gemm()
        t_ak, t_th = await interleaved(ak_gemm, torch_gemm, 7)
        tflops = 2 * n**3 / 1e12
        print(
            f"      accelkit {tflops / t_ak:.0f} TFLOP/s, torch {tflops / t_th:.0f} TFLOP/s:"
            f" {t_th / t_ak:.2f}x torch (target >= 0.95x)"
        )

        print("[2/4] causal f16 attention 8x16x4096x128 ...", flush=True)
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
        await ak_tensor_ops()
        t_ak, t_th = await interleaved(ak_tensor_ops, torch_sdpa, 3)
        print(f"      cuBLAS route:       {t_ak * 1e3:.1f} ms vs SDPA {t_th * 1e3:.1f} ms:"
              f" {t_th / t_ak:.2f}x torch")  # fmt: skip

        print("[3/4] small-op submission ...", flush=True)
        x = f.from_host(np.ones((64, 64), np.float32))
        tx = torch.ones((64, 64), device="cuda")
        reps = 2000
        for _ in range(100):
            ops.add(x, x)
        await backend.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            ops.add(x, x)
        t_ak = (time.perf_counter() - t0) / reps
        await backend.synchronize()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            tx + tx
        t_th = (time.perf_counter() - t0) / reps
        torch.cuda.synchronize()
        print(f"      accelkit {t_ak * 1e6:.1f} us/op host time, torch {t_th * 1e6:.1f} us/op"
              " (target <= 10 us)")  # fmt: skip

        print("[4/4] heartbeat while awaiting a long GEMM chain ...", flush=True)
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


if __name__ == "__main__":
    anyio.run(main)
