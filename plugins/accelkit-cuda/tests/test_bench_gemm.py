"""bench_cuda.py's GEMM figures run over the stand-in CuPy and a stand-in PyTorch: every dtype on
both routes (CuPy's matmul and the cuBLAS workspace route), the workspace switch put back after,
and lines the GPU check keeps whole. The figures themselves need a GPU."""

from __future__ import annotations

import contextlib
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

    def linear(x: _TorchTensor, w: _TorchTensor, b: _TorchTensor) -> _TorchTensor:
        calls.append(x.a.shape)
        return _TorchTensor(x.a @ w.a.T + b.a)

    functional = types.SimpleNamespace(linear=linear)
    torch.nn = types.SimpleNamespace(functional=functional)  # type: ignore[attr-defined]
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


class _BlockTensor(_TorchTensor):
    """What bench_core._torch_block asks of a PyTorch tensor, on NumPy (float64)."""

    def __add__(self, other: _BlockTensor) -> _BlockTensor:
        return _BlockTensor(self.a + other.a)

    def __getitem__(self, i: int) -> _BlockTensor:
        return _BlockTensor(self.a[i])

    def cuda(self) -> _BlockTensor:
        return _BlockTensor(self.a.astype(np.float64))

    def cpu(self) -> _BlockTensor:
        return self

    def view(self, *shape: int) -> _BlockTensor:
        return _BlockTensor(self.a.reshape(shape))

    reshape = view

    def permute(self, *axes: int) -> _BlockTensor:
        return _BlockTensor(self.a.transpose(axes))

    def transpose(self, i: int, j: int) -> _BlockTensor:
        return _BlockTensor(np.swapaxes(self.a, i, j))


def _block_torch(calls: list[str]) -> types.ModuleType:
    """A stand-in PyTorch for ``_torch_block``: the functions it calls, in NumPy."""
    torch = types.ModuleType("torch")
    torch.from_numpy = _BlockTensor  # type: ignore[attr-defined]
    torch.inference_mode = lambda: contextlib.nullcontext()  # type: ignore[attr-defined]

    def layer_norm(x: Any, shape: Any, g: Any, b: Any, eps: float) -> _BlockTensor:
        calls.append("layer_norm")
        mu = x.a.mean(-1, keepdims=True)
        var = ((x.a - mu) ** 2).mean(-1, keepdims=True)
        return _BlockTensor((x.a - mu) / np.sqrt(var + eps) * g.a + b.a)

    def linear(x: Any, w: Any, b: Any) -> _BlockTensor:
        calls.append("linear")
        return _BlockTensor(x.a @ w.a.T + b.a)

    def sdpa(q: Any, k: Any, v: Any, is_causal: bool) -> _BlockTensor:
        calls.append("sdpa")
        s = q.a @ np.swapaxes(k.a, -1, -2) / np.sqrt(q.a.shape[-1])
        n = s.shape[-1]
        s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        return _BlockTensor(p / p.sum(-1, keepdims=True) @ v.a)

    def gelu(x: Any, approximate: str) -> _BlockTensor:
        a = x.a
        return _BlockTensor(0.5 * a * (1 + np.tanh(0.7978845608028654 * (a + 0.044715 * a**3))))

    torch.nn = types.SimpleNamespace(  # type: ignore[attr-defined]
        functional=types.SimpleNamespace(
            layer_norm=layer_norm, linear=linear, scaled_dot_product_attention=sdpa, gelu=gelu
        )
    )
    return torch


async def test_the_tiny_block_figure_runs(plugin: Plugin, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench_cuda's host-bound figure (bench_core's block at 1 x 8 x 32 against PyTorch eager):
    both sides run the block each round and the line says the ratio, and the CPU time a block
    of accelkit's caller and submission thread and of PyTorch's thread."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    for name in ("bench_core", "bench_cuda", "bench_host", "bench_cuda_attention"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    calls: list[str] = []
    torch = _block_torch(calls)
    monkeypatch.setitem(sys.modules, "torch", torch)
    bench_cuda = importlib.import_module("bench_cuda")
    monkeypatch.setattr(bench_cuda, "BLOCK_ROUNDS", 3)
    monkeypatch.setattr(bench_cuda, "SPLIT_BLOCKS", 4)
    backend = await _open(plugin)
    try:
        line = await bench_cuda._tiny_block(backend, torch)
    finally:
        await backend.shutdown()
    assert line.startswith("tiny transformer block [1,8,32] f32, each awaited"), line
    assert line.endswith("x torch"), line
    assert len(line) < 390
    caller = float(line.split("caller ")[1].split(" us")[0])
    thread = float(line.split("submission thread ")[1].split(" us")[0])
    theirs = float(line.split("its thread ")[1].split(" us")[0])
    assert caller > 0
    assert thread > 0
    assert theirs >= 0  # (the stand-in for PyTorch: NumPy on this thread)
    assert calls.count("sdpa") >= 3 + 4  # PyTorch's side ran every round, and 4 blocks more
    assert calls.count("linear") == 4 * calls.count("sdpa")


async def test_the_linear_figures_count_the_epilogue_route(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench_cuda's linear+bias lines: one a dtype, each saying how many of accelkit's timed
    calls took cuBLASLt's epilogue (all of them with the stand-in's cuBLASLt)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    for name in ("bench_core", "bench_cuda", "bench_host", "bench_cuda_attention"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    calls: list[tuple[int, ...]] = []
    torch = _fake_torch(calls)
    monkeypatch.setitem(sys.modules, "torch", torch)
    bench_cuda = importlib.import_module("bench_cuda")
    import fake_cupy

    monkeypatch.setattr(
        importlib.import_module("accelkit_cuda.blas"), "_cublas", fake_cupy.Cublas()
    )
    monkeypatch.setattr(
        importlib.import_module("accelkit_cuda.blaslt"), "_lt", fake_cupy.CublasLt()
    )
    backend = await _open(plugin)
    try:
        await backend.tensor_ops.kernels.fast.load()
        lines = await bench_cuda._linear_figures(backend, torch, 8, np.random.default_rng(0))
    finally:
        await backend.shutdown()
    n = bench_cuda.GEMM_CALLS
    figures = [line for line in lines if "TFLOP/s" in line]
    assert [line.split(":")[0] for line in figures] == [
        "linear+bias 8 f16", "linear+bias 8 bf16", "linear+bias 8 f32",
    ]  # fmt: skip
    timed = 7 * n
    assert all(f"{timed} of {timed} timed calls in cuBLASLt's epilogue" in line for line in figures)
    assert all("device time" in line for line in figures)
    # After f16's figure, where one of its repeats' time went (accelkit_cuda.timeline).
    timeline = lines[1:3]
    assert timeline[0].startswith(f"linear+bias 8 f16 x{n} step timeline (median of 7"), timeline
    assert f"per step {n} closures" in timeline[1], timeline
    assert len(lines) == 5
    assert all(len(line) < 390 for line in lines)
    # Warm-up, 7 rounds, the device-time calls, on PyTorch's side too.
    assert len(calls) == 3 * n * (1 + 7 + 1)
