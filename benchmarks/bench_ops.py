"""Issue 12's operations on each named backend, as time ratios against NumPy in the same process.

Run ``python benchmarks/bench_ops.py [backend ...]`` (default: cpu). Each row times one call
submitted and completed (``await backend.synchronize()``; reading the result back is not
counted) against the NumPy expression that computes the same thing, interleaved round by round
(:func:`accelkit.cli.bench.interleaved`), and prints the median times and their ratio (above 1:
slower than NumPy). Sizes suit a 2-core machine.

Where a backend has no kernel of its own for an op (OpenCL and CUDA for scans and sorts), the
row measures the core's composition on the device: that is what a user of that backend gets.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np

import accelkit as ak
from accelkit.cli.bench import interleaved


def _cases(
    rng: np.random.Generator,
) -> list[tuple[str, dict[str, np.ndarray[Any, Any]], Callable[..., Any], Callable[..., Any]]]:
    vec = rng.standard_normal(1 << 20).astype(np.float32)
    rows = rng.standard_normal((256, 1024)).astype(np.float32)
    img = rng.standard_normal((8, 32, 128, 128)).astype(np.float32)
    ints = rng.integers(-(2**40), 2**40, 1 << 20)

    def max_pool(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        n, c, h, w = x.shape
        return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))

    return [
        ("cumsum 1M f32", {"x": vec}, lambda o, x: o.cumsum(x, 0), lambda x: np.cumsum(x)),
        ("argsort 256x1024 f32", {"x": rows}, lambda o, x: o.argsort(x, -1),
         lambda x: np.argsort(x, -1, kind="stable")),
        ("topk 256x1024 k=8", {"x": rows}, lambda o, x: o.topk(x, 8)[1],
         lambda x: np.argsort(-x, -1, kind="stable")[:, :8]),
        ("flip 1M f32", {"x": vec}, lambda o, x: o.flip(x), lambda x: np.ascontiguousarray(x[::-1])),
        ("pad reflect 8x32x128x128", {"x": img},
         lambda o, x: o.pad(x, [(0, 0), (0, 0), (2, 2), (2, 2)], "reflect"),
         lambda x: np.pad(x, [(0, 0), (0, 0), (2, 2), (2, 2)], "reflect")),
        ("max_pool2d 2x2 8x32x128x128", {"x": img}, lambda o, x: o.max_pool2d(x, 2), max_pool),
        ("floor_divide 1M i64", {"x": ints}, lambda o, x: o.floor_divide(x, 7),
         lambda x: np.floor_divide(x, 7)),
    ]  # fmt: skip


async def run(name: str) -> None:
    rng = np.random.default_rng(0)
    async with ak.open_backend(name) as backend:
        f, ops = backend.tensor_factory, backend.tensor_ops
        print(
            f"\n{name} ({backend.device}): median of interleaved rounds, ratio = accelkit / NumPy"
        )
        print(f"  {'op':<30} {'accelkit':>10} {'numpy':>10} {'ratio':>7}")
        for label, inputs, call, peer in _cases(rng):
            tensors = {k: f.from_host(v) for k, v in inputs.items()}
            arrays = list(inputs.values())

            async def subject(call: Any = call, tensors: dict[str, Any] = tensors) -> None:
                call(ops, *tensors.values())
                await backend.synchronize()

            await subject()  # compile and warm
            t_ak, t_np = await interleaved(
                subject, lambda peer=peer, arrays=arrays: peer(*arrays), 7, budget_s=20.0
            )
            print(f"  {label:<30} {t_ak * 1e3:>8.2f}ms {t_np * 1e3:>8.2f}ms {t_ak / t_np:>6.2f}x")


async def main() -> None:
    for name in sys.argv[1:] or ["cpu"]:
        await run(name)


if __name__ == "__main__":
    anyio.run(main)
