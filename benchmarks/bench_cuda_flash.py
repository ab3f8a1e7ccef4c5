"""The tensor-core attention kernel of the CUDA backend against the older kernel and PyTorch.

Run with ``python benchmarks/bench_cuda_flash.py`` where accelkit-cuda, CuPy and PyTorch (CUDA)
are installed. Causal attention, batch 8, 16 heads, seq 4096, head_dim 128, f16 and bf16:
``kernel_ops.attention`` through the FlashAttention-2-style kernel (``flash2``), through the
warp-per-row kernel (``flash2.enabled = False``), both with cuDNN switched off
(``attention_engines.enabled = False``: it precedes them where installed), then through cuDNN
where installed, and ``torch.nn.functional.scaled_dot_product_attention``; ratios against SDPA
(issue 29's target for the NVRTC fallback: >= 0.5x). Timings are medians of interleaved
repeats of ``CALLS`` calls, each repeat ending in a device synchronization; the route of the
last call is printed in brackets.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np

import accelkit as ak
from accelkit.cli.bench import interleaved

SHAPE = (8, 16, 4096, 128)
CALLS = 5  # calls a timed repeat: the device's throughput, not one synchronization's latency


async def bench(backend: Any, name: str, host: list[np.ndarray[Any, Any]]) -> None:
    """One dtype: the tensor-core kernel and the older one, each interleaved with SDPA."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    f, kops, flash2 = backend.tensor_factory, backend.kernel_ops, backend.flash2
    b, h, s, d = SHAPE
    flops = 4 * b * h * s * s * d / 2  # two GEMMs, half the scores under the causal mask
    tdt = torch.float16 if name == "f16" else torch.bfloat16
    q, k, v = (f.from_host(x, dtype=name) for x in host)
    tq, tk, tv = (torch.from_numpy(x).cuda().to(tdt) for x in host)

    async def ak_attention() -> None:
        for _ in range(CALLS):
            kops.attention(q, k, v, causal=True)
        await backend.synchronize()

    def torch_sdpa() -> None:
        for _ in range(CALLS):
            F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
        torch.cuda.synchronize()

    torch_sdpa()
    engines = backend.attention_engines
    try:
        for label, enabled, rounds in (
            ("flash2", True, 7), ("warp-per-row", False, 3), ("cuDNN", True, 7)
        ):  # fmt: skip
            if label == "cuDNN" and engines.engine != "cudnn":
                continue
            flash2.enabled = enabled
            engines.enabled = label == "cuDNN"  # otherwise cuDNN would serve every row
            await ak_attention()
            await ak_attention()  # cuDNN: its graph was built after the first call
            route = engines.last_route
            t_ak, t_th = await interleaved(ak_attention, torch_sdpa, rounds)
            t_ak, t_th = t_ak / CALLS, t_th / CALLS
            print(
                f"{name} causal {b}x{h}x{s}x{d}: {label:12s} {t_ak * 1e3:8.2f} ms"
                f" ({flops / t_ak / 1e12:6.1f} TFLOP/s) vs SDPA {t_th * 1e3:.2f} ms"
                f" ({flops / t_th / 1e12:.0f} TFLOP/s): {t_th / t_ak:.3f}x SDPA"
                f" [{route.engine if route else '?'}]",
                flush=True,
            )
    finally:
        flash2.enabled = True
        engines.enabled = True


async def main() -> None:
    async with ak.open_backend("cuda") as backend:
        flash2: Any = backend.flash2  # type: ignore[attr-defined]
        print(f"device: {backend.device} ({backend.capabilities.extra['arch']})", flush=True)
        print(f"tensor-core kernel: {flash2.describe()} (target >= 0.5x SDPA)", flush=True)
        rng = np.random.default_rng(0)
        host = [rng.standard_normal(SHAPE, np.float32) for _ in range(3)]
        for name in ("f16", "bf16"):
            if ak.DType(name) not in backend.capabilities.dtypes:
                print(f"{name}: not held by this backend (CuPy < 14 or no ml_dtypes)")
                continue
            await bench(backend, name, host)


if __name__ == "__main__":
    anyio.run(main)
