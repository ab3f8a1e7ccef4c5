"""benchmarks/profile_cuda_block.py (the GPU check's ``profile`` step) runs over the stand-in
CuPy and a stand-in PyTorch: each of the block's closures is labelled with the TensorOps method
that submitted it and timed, cProfile sees inside them, a part that cannot run (the kernel
table needs torch.profiler) says so and the next runs. The figures themselves need a GPU."""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest
import test_offloop
from test_bench_gemm import _fake_torch
from test_offloop import Plugin, _open
from test_timeline import BENCHMARKS

pytestmark = pytest.mark.anyio

plugin = test_offloop.plugin


async def test_the_block_diagnosis_runs(plugin: Plugin, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    for name in ("bench_core", "bench_cuda", "bench_host", "bench_cuda_attention",
                 "profile_cuda_block"):  # fmt: skip
        monkeypatch.delitem(sys.modules, name, raising=False)
    calls: list[tuple[int, ...]] = []
    torch = _fake_torch(calls)
    monkeypatch.setitem(sys.modules, "torch", torch)
    script = importlib.import_module("profile_cuda_block")
    backend = await _open(plugin)
    try:
        lines = await script.diagnose(
            backend,
            torch,
            steps=1,
            gemm_n=16,
            decode_shape=(2, 4, 2, 8, 32, 16),
            attention_shape=(1, 2, 16, 8),
        )
    finally:
        await backend.shutdown()
    text = "\n".join(lines)
    part1 = text.split("[2/7]")[0]
    # (the block passes attention its sequence-major q, k, v: no permute of its own)
    for op in ("layer_norm", "linear", "attention", "add", "gelu"):
        assert f" {op}@" in part1, text
    assert "(outside the block)" not in part1
    closures = [line for line in part1.splitlines()[1:] if " us" in line and "wall" not in line]
    assert len(closures) >= 10
    assert any("closures:" in line and "busy" in line for line in lines)
    gated = text.split("[1b/7]")[1].split("[2/7]")[0]
    assert "(the caller idle)" in gated, gated
    for op in ("layer_norm", "linear", "attention", "gelu"):
        assert f" {op}@" in gated, gated
    part2 = text.split("[2/7]")[1].split("[3/7]")[0]
    assert "by own time" in part2
    assert "by cumulative time" in part2
    assert part2.count("calls") >= 10
    # No torch.profiler in the stand-in: part 3 says so, part 4 still runs.
    assert "not measured (ModuleNotFoundError" in text.split("[3/7]")[1]
    gemms = [line for line in lines if line.startswith(("  bf16:", "  f16:"))]
    assert len(gemms) == 2, gemms
    assert all("x torch" in line for line in gemms), gemms
    for line in gemms:  # the stand-in's GEMM is exact up to the dtype's rounding
        err = float(line.rsplit(" ", 1)[1])
        assert err < 2 * 2.0**-8 * np.sqrt(16), line
    # The four attention routes ran (the tiled kernel is not verified over the stand-in: the
    # warp-per-row kernel served the first three, the sequence-major call declined to the core's
    # permutes, as the engines say); the cuBLAS route agrees with float64 NumPy (f32 scores and
    # sums of 256 terms; the stand-in does not run the NVRTC kernels: test_gpu.py and
    # test_gpu_cudnn.py check them).
    routes = [line for line in lines if line.startswith(("  tiled", "  warp-per-row", "  cuBLAS"))]
    assert len(routes) == 4, routes
    assert routes[0].startswith("  tiled (warp):"), routes[0]
    assert routes[1].startswith("  tiled, sequence-major (warp):"), routes[1]
    assert routes[2].startswith("  warp-per-row (warp):"), routes[2]
    assert routes[3].startswith("  cuBLAS (composed):"), routes[3]
    err = float(routes[3].rsplit(" ", 1)[1])
    assert err < 256 * float(np.finfo(np.float32).eps) * 8, routes[3]
    part6 = text.split("[6/7]")[1]
    assert "not measured (ModuleNotFoundError" in part6  # torch.profiler, after the check:
    # The step ran and was compared (the stand-in runs no fused kernel: its error means nothing
    # here; on a GPU, the split-KV kernel's is within f16's rounding).
    assert float(part6.split("reference): ")[1].split(";")[0]) >= 0, part6
    assert "routes {'" in part6
    part7 = text.split("[7/7]")[1]
    # The call ran on the stand-in (its route said) before torch's SDPA backends were asked for.
    assert "accelkit's route: " in part7, part7
    assert "not measured (ModuleNotFoundError" in part7, part7
