"""bench_cuda.py's GEMM figures run over the stand-in CuPy and a stand-in PyTorch: every dtype on
both routes (CuPy's matmul and the cuBLAS workspace route), the workspace switch put back after,
and lines the GPU check keeps whole. The figures themselves need a GPU."""

from __future__ import annotations

import importlib
import os
import sys
import types
from typing import Any

import numpy as np
import pytest
import test_offloop
from test_offloop import Plugin, _open
from test_timeline import BENCHMARKS

pytestmark = pytest.mark.anyio

plugin = test_offloop.plugin


class _TorchTensor:
    def __init__(self, a: np.ndarray[Any, Any]) -> None:
        self.a = a

    def cuda(self) -> _TorchTensor:
        return self

    def to(self, dtype: Any) -> _TorchTensor:
        return _TorchTensor(self.a.astype(dtype))


class _TorchEvent:
    def __init__(self, enable_timing: bool = False) -> None:
        self.recorded = False

    def record(self) -> None:
        self.recorded = True

    def elapsed_time(self, end: _TorchEvent) -> float:
        assert self.recorded
        assert end.recorded
        return 1.0


def _fake_torch(calls: list[tuple[int, ...]]) -> types.ModuleType:
    import ml_dtypes

    torch = types.ModuleType("torch")
    torch.float16, torch.bfloat16, torch.float32 = np.float16, ml_dtypes.bfloat16, np.float32  # type: ignore[attr-defined]
    torch.from_numpy = _TorchTensor  # type: ignore[attr-defined]

    def matmul(x: _TorchTensor, y: _TorchTensor) -> _TorchTensor:
        calls.append(x.a.shape)
        return _TorchTensor(x.a @ y.a)

    torch.matmul = matmul  # type: ignore[attr-defined]
    torch.cuda = types.SimpleNamespace(synchronize=lambda: None, Event=_TorchEvent)  # type: ignore[attr-defined]
    return torch


async def test_the_gemm_figures_run_on_both_routes(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    for name in ("bench_core", "bench_cuda", "bench_host", "bench_cuda_attention"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    calls: list[tuple[int, ...]] = []
    torch = _fake_torch(calls)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.delenv("ACCELKIT_CUDA_GEMM_WORKSPACE", raising=False)
    bench_cuda = importlib.import_module("bench_cuda")
    import fake_cupy

    monkeypatch.setattr(
        importlib.import_module("accelkit_cuda.blas"), "_cublas", fake_cupy.Cublas()
    )
    backend = await _open(plugin)
    fake_cupy.CALLS.clear()
    try:
        lines = await bench_cuda._gemm_figures(backend, torch, 8, np.random.default_rng(0))
    finally:
        await backend.shutdown()
    assert "ACCELKIT_CUDA_GEMM_WORKSPACE" not in os.environ
    routes = [line.split(":")[0] for line in lines]
    assert routes == [
        "GEMM 8 f16 (cuBLAS+workspace)", "GEMM 8 f16 (cupy.matmul)",
        "GEMM 8 bf16 (cuBLAS+workspace)", "GEMM 8 f32 (cuBLAS+workspace)",
        "GEMM 8 f32 (cupy.matmul)",
    ]  # fmt: skip
    assert all("device time" in line and len(line) < 390 for line in lines)
    assert all("target" in line for line in lines[:3])
    assert not any("target" in line for line in lines[3:])
    # The workspace routes' GEMMs (the default), and only theirs, went to cuBLAS through
    # blas.py.
    gemms = sum(name == "cublasGemmEx" for name, _ in fake_cupy.CALLS)
    assert gemms == 3 * bench_cuda.GEMM_CALLS * (1 + 7 + 1)
    # Warm-up, 7 rounds, the device-time calls: GEMM_CALLS each, on each of the 5 routes.
    assert len(calls) == 5 * bench_cuda.GEMM_CALLS * (1 + 7 + 1)
