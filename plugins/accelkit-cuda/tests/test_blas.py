"""The cuBLAS GEMM path (accelkit_cuda.blas) without a GPU.

:func:`~accelkit_cuda.blas.plan` turns row-major operands into a column-major cuBLAS call; the
call is replayed here by a NumPy emulation of ``cublasGemmEx`` / ``cublasGemmStridedBatchedEx``
over the operands' raw memory, and must give ``a @ b``. The TF32 switch is checked to reach the
GEMM on the backend over the CuPy stand-in (where cuBLAS itself is absent, ``cupy.matmul``
serves). The GEMMs themselves, and their speed, need a GPU (benchmarks/bench_cuda_attention.py).
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest
from accelkit_cuda import blas
from test_offloop import Plugin, plugin

from accelkit.device import Device

__all__ = ["plugin"]


def _emulate(p: tuple[Any, ...], first: Any, second: Any) -> Any:
    """cuBLAS's column-major GEMM over flat element buffers: C = op(A) op(B), batched."""
    ta, tb, m, n, k, lda, ldb, ldc, sa, sb, sc, batch = p
    c = np.zeros(sc * (batch - 1) + ldc * n)

    def op(flat: Any, offset: int, trans: int, rows: int, cols: int, ld: int) -> Any:
        if trans == 0:  # stored rows x cols, column-major
            return np.array([[flat[offset + i + j * ld] for j in range(cols)] for i in range(rows)])
        return np.array([[flat[offset + j + i * ld] for j in range(cols)] for i in range(rows)])

    for i in range(batch):
        prod = op(first, i * sa, ta, m, k, lda) @ op(second, i * sb, tb, k, n, ldb)
        for col in range(n):
            c[i * sc + col * ldc : i * sc + col * ldc + m] = prod[:, col]
    return c


@pytest.mark.parametrize(
    ("a_shape", "b_kind", "b_shape"),
    [
        ((5, 3), "c", (3, 4)),
        ((5, 3), "t", (3, 4)),  # linear's weight: the transpose of a C-contiguous [n, k]
        ((2, 5, 3), "c", (3, 4)),  # a batch folded into the rows
        ((2, 3, 5, 3), "t", (3, 1)),
        ((3, 5, 3), "batch", (3, 3, 4)),  # a strided batched GEMM
        ((1, 1), "t", (1, 1)),
    ],
)
def test_the_plan_computes_a_times_b(
    a_shape: tuple[int, ...], b_kind: str, b_shape: tuple[int, ...]
) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype(np.float32)
    if b_kind == "t":
        w = rng.standard_normal(b_shape[::-1]).astype(np.float32)
        b, b_memory = w.T, w.ravel()
    else:
        b = rng.standard_normal(b_shape).astype(np.float32)
        b_memory = b.ravel()
    p = blas.plan(a.shape, a.strides, b.shape, b.strides, a.itemsize)
    assert p is not None
    out = _emulate(p, b_memory, a.ravel())  # cuBLAS's first operand is b
    want = a @ b
    np.testing.assert_allclose(out[: want.size].reshape(want.shape), want, rtol=1e-5, atol=1e-5)


def test_layouts_the_plan_leaves_to_cupy() -> None:
    a = np.zeros((4, 3), np.float32)
    b = np.zeros((3, 2), np.float32)

    def plan(x: Any, y: Any) -> Any:
        return blas.plan(x.shape, x.strides, y.shape, y.strides, x.itemsize)

    assert plan(a, b) is not None
    assert plan(np.zeros((3, 4), np.float32).T, b) is None  # a transposed: not taken
    assert plan(a, np.zeros((3, 4), np.float32)[:, ::2]) is None  # b strided
    assert plan(a, np.zeros((2, 3), np.float32)) is None  # k differs
    assert plan(np.zeros((2, 4, 3), np.float32), np.zeros((3, 3, 2), np.float32)) is None
    assert plan(np.zeros((0, 3), np.float32), b) is None  # empty
    assert plan(np.zeros(3, np.float32), b) is None  # a vector
    assert blas.workspace_bytes((9, 0)) == 32 << 20
    assert blas.workspace_bytes((8, 0)) < 32 << 20


@pytest.mark.anyio
async def test_tf32_is_off_unless_allowed(plugin: Plugin, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, bool]] = []
    module = importlib.import_module("accelkit_cuda.blas")

    def matmul(a: Any, b: Any, out: Any = None, tf32: bool = False) -> None:
        seen.append((a.dtype.name, tf32))
        return None  # cupy.matmul serves

    monkeypatch.setattr(module, "matmul", matmul)
    monkeypatch.delenv("ACCELKIT_CUDA_ALLOW_TF32", raising=False)
    backend = plugin.backend.CUDABackend()
    await backend.initialize(Device("cuda", 0))
    try:
        assert backend.allow_tf32 is False
        assert backend.capabilities.extra["tf32"] is True  # the device has TF32 cores
        f, ops = backend.tensor_factory, backend.tensor_ops
        x = f.from_host(np.eye(4, dtype=np.float32) * 2)
        y = ops.matmul(x, x)
        np.testing.assert_array_equal(await y.to_host(), np.eye(4) * 4)
        backend.allow_tf32 = True
        await ops.linear(x, x).to_host()
        await backend.synchronize()
    finally:
        await backend.shutdown()
    assert ("float32", False) in seen
    assert ("float32", True) in seen
    monkeypatch.setenv("ACCELKIT_CUDA_ALLOW_TF32", "1")
    assert plugin.backend.CUDABackend().allow_tf32 is True
