"""``linear`` as cuBLAS's GEMM on the blocks' pointers plus one raw bias kernel
(``CUDATensorKernels._raw_linear``), over the stand-ins for CuPy and cuBLAS (no GPU): the
answers are float64 NumPy's within the arithmetic's bound, the submission thread makes no CuPy
array or ufunc call for it, and every case it leaves (an F16 bias, the workspace route off,
cuBLAS not found yet) takes ``cupy_tensor.linear``'s path with the same answers. The GEMM's
and the kernel's numerics on a device are the GPU check's (conformance's linear cases)."""

from __future__ import annotations

import importlib
from typing import Any

import fake_cupy
import ml_dtypes
import numpy as np
import pytest
from test_offloop import Plugin, _open, plugin

from accelkit.workloads import BlockConfig, block_weights, transformer_block, upload_weights

__all__ = ["plugin"]

pytestmark = pytest.mark.anyio


def _cublas(monkeypatch: pytest.MonkeyPatch) -> fake_cupy.Cublas:
    """The stand-in's cuBLAS, as the plugin's (fresh) blas module finds it on a GPU."""
    lib = fake_cupy.Cublas()
    monkeypatch.setattr(importlib.import_module("accelkit_cuda.blas"), "_cublas", lib)
    return lib


def _names() -> list[str]:
    return [name for name, _ in fake_cupy.CALLS]


def _bound(x: Any, w: Any, b: Any, eps: float) -> Any:
    """|error| of x @ w.T + b accumulated in a type of ``eps`` (k products and sums, then the
    bias added and rounded): (k + 1) eps (|x| @ |w|.T + |b|)."""
    k = x.shape[-1]
    mag = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    if b is not None:
        mag = mag + np.abs(b.astype(np.float64))
    return (k + 1) * eps * mag


@pytest.mark.parametrize(
    ("dtype", "x_shape", "with_bias"),
    [
        ("float32", (2, 5, 16), True),
        ("float32", (7, 16), False),
        ("float64", (3, 16), True),
        ("float16", (2, 3, 16), False),
        ("bfloat16", (4, 16), False),
    ],
)
async def test_the_raw_linear_is_numpys(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch, dtype: str, x_shape: tuple[int, ...],
    with_bias: bool,
) -> None:  # fmt: skip
    lib = _cublas(monkeypatch)
    dt = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    rng = np.random.default_rng(4)
    n = 12
    x_h = rng.standard_normal(x_shape).astype(dt)
    w_h = (rng.standard_normal((n, x_shape[-1])) / 4).astype(dt)
    b_h = rng.standard_normal(n).astype(dt) if with_bias else None
    backend = await _open(plugin)
    try:
        await backend.tensor_ops.kernels.fast.load()
        f, ops = backend.tensor_factory, backend.tensor_ops
        x, w = f.from_host(x_h), f.from_host(w_h)
        b = None if b_h is None else f.from_host(b_h)
        await ops.linear(x, w, b).to_host()  # the first GEMM finds cuBLAS (CuPy's path)
        fake_cupy.CALLS.clear()
        lib.calls.clear()
        got = await ops.linear(x, w, b).to_host()
        names = _names()
    finally:
        await backend.shutdown()
    ref = x_h.astype(np.float64) @ w_h.astype(np.float64).T
    if b_h is not None:
        ref = ref + b_h.astype(np.float64)
    acc_eps = float(np.finfo(np.float64 if dtype == "float64" else np.float32).eps)
    store_eps = float(ml_dtypes.finfo(dt).eps) if dt.itemsize == 2 else 0.0
    tol = _bound(x_h, w_h, b_h, acc_eps) + store_eps * np.abs(ref)
    assert got.dtype == dt
    assert np.all(np.abs(got.astype(np.float64) - ref) <= tol)
    assert names.count("cublasGemmEx") == 1
    assert names.count(f"launch eb_add_{dtype[0]}{dtype[-2:]}") == (1 if with_bias else 0)
    # No CuPy array made, no ufunc, no copy: the pointers alone (the read's copy aside).
    assert not [m for m in names if m.startswith(("ufunc", "ndarray"))], names


@pytest.mark.parametrize("case", ["f16 bias", "route off", "cublas not found yet"])
async def test_what_the_raw_linear_leaves_to_cupys_path(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    if case != "cublas not found yet":
        _cublas(monkeypatch)
    if case == "route off":
        monkeypatch.setenv("ACCELKIT_CUDA_GEMM_WORKSPACE", "0")
    dt = np.dtype(np.float16 if case == "f16 bias" else np.float32)
    rng = np.random.default_rng(5)
    x_h = rng.standard_normal((3, 8)).astype(dt)
    w_h = (rng.standard_normal((5, 8)) / 3).astype(dt)
    b_h = rng.standard_normal(5).astype(dt)
    backend = await _open(plugin)
    try:
        await backend.tensor_ops.kernels.fast.load()
        f, ops = backend.tensor_factory, backend.tensor_ops
        x, w, b = f.from_host(x_h), f.from_host(w_h), f.from_host(b_h)
        await ops.linear(x, w, b).to_host()
        fake_cupy.CALLS.clear()
        got = await ops.linear(x, w, b).to_host()
        names = _names()
    finally:
        await backend.shutdown()
    ref = x_h.astype(np.float64) @ w_h.astype(np.float64).T + b_h.astype(np.float64)
    eps = float(np.finfo(np.float32).eps)
    # F32 accumulation, then at most two roundings to the stored type (CuPy's path over the
    # stand-in may round the F16 product before the bias is added, then the sum)
    tol = _bound(x_h, w_h, b_h, eps) + 2 * _bound(x_h, w_h, b_h, float(np.finfo(dt).eps)) / 9
    assert np.all(np.abs(got.astype(np.float64) - ref) <= tol)
    assert not [m for m in names if m.startswith("launch eb_add")]
    assert [m for m in names if m.startswith(("ufunc", "ndarray"))]  # CuPy's path ran


async def test_a_chain_of_raw_linears_and_permutes_is_numpys(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MLP half of bench_core's block and a head-major permute and back (the stand-in
    runs no fused attention kernel, so not the whole block), f32, against float64 NumPy: each
    output a sum of at most 4 * width products of unit-sized terms, two layers deep."""
    _cublas(monkeypatch)
    cfg = BlockConfig(batch=2, seq=8, width=32, heads=4)
    w_h = block_weights(cfg)
    b, s_, d, h = cfg.batch, cfg.seq, cfg.width, cfg.heads
    x_h = np.random.default_rng(6).standard_normal((b, s_, d)).astype(np.float32)
    backend = await _open(plugin)
    try:
        await backend.tensor_ops.kernels.fast.load()
        ops = backend.tensor_ops
        w = upload_weights(backend, w_h)
        x = backend.tensor_factory.from_host(x_h)

        def chain() -> Any:
            m = ops.gelu(ops.linear(x, w["w_1"], w["b_1"]), approximate="tanh")
            y = ops.add(x, ops.linear(m, w["w_2"], w["b_2"]))
            heads = ops.permute(ops.reshape(y, (b, s_, h, d // h)), (0, 2, 1, 3))
            return ops.reshape(ops.permute(heads, (0, 2, 1, 3)), (b, s_, d))

        await chain().to_host()  # the first GEMM finds cuBLAS
        fake_cupy.CALLS.clear()
        got = await chain().to_host()
        names = _names()
        await transformer_block(backend, x, w, cfg).to_host()
        fake_cupy.CALLS.clear()
        await transformer_block(backend, x, w, cfg).to_host()
        block = _names()
    finally:
        await backend.shutdown()
    f64 = {k: v.astype(np.float64) for k, v in w_h.items()}
    m = x_h.astype(np.float64) @ f64["w_1"].T + f64["b_1"]
    m = 0.5 * m * (1 + np.tanh(0.7978845608028654 * (m + 0.044715 * m**3)))
    want = x_h + m @ f64["w_2"].T + f64["b_2"]
    eps = float(np.finfo(np.float32).eps)
    np.testing.assert_allclose(got, want, rtol=0, atol=8 * 4 * d * eps * np.abs(want).max())
    assert names.count("cublasGemmEx") == 2
    assert names.count("launch eb_add_f32") == 2
    assert names.count("launch perm32_i32") == 2
    assert not [n for n in names if n.startswith("ufunc")], names
    # The whole block: six linears and four permutes, all on the raw kernels.
    assert block.count("cublasGemmEx") == 6
    assert block.count("launch eb_add_f32") == 6
    assert block.count("launch perm32_i32") == 4


async def test_a_fused_launch_passes_pointers_not_arrays(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fused kernels' launches (here the f32 flash attention kernel) get each tensor as
    its block's device pointer, as CuPy passes an array's, without a CuPy array made for it."""
    from accelkit.sdk import buffer_of

    seen: list[tuple[str, tuple[Any, ...], list[str]]] = []
    plain = fake_cupy.Function.__call__

    def call(self: Any, grid: Any, block: Any, args: Any, **kwargs: Any) -> None:
        seen.append((self.name, tuple(args), _names()))
        plain(self, grid, block, args, **kwargs)

    monkeypatch.setattr(fake_cupy.Function, "__call__", call)
    rng = np.random.default_rng(7)
    q_h, k_h, v_h = (rng.standard_normal((1, 2, 5, 8)).astype(np.float32) for _ in range(3))
    backend = await _open(plugin)
    try:
        f, ops = backend.tensor_factory, backend.tensor_ops
        q, k, v = f.from_host(q_h), f.from_host(k_h), f.from_host(v_h)
        await backend.synchronize()
        fake_cupy.CALLS.clear()
        out = ops.attention(q, k, v, causal=True)
        await backend.synchronize()
        ptrs = [buffer_of(t).handle.ptr for t in (q, k, v, out)]
    finally:
        await backend.shutdown()
    ((name, args, before),) = [s for s in seen if s[0].startswith("flash_attention")]
    assert name == "flash_attention_f32"
    assert [int(a) for a in args[:4]] == ptrs
    assert all(type(a) is np.uintp for a in args[:4])
    assert not [n for n in before if n.startswith("ndarray")], before
