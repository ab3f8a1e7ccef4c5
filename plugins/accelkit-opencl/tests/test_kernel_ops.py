"""The OpenCL backend's fused KernelOps beyond the shared suite (tests/test_kernel_ops.py): that
they are device kernels, that they follow stream order, F64 sampling, and device-side errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from accelkit import DType, InvalidArgumentError
from accelkit.ops.kernel_ops import KERNEL_OPS
from accelkit.quant import dequantize, quantize

# Kernel checks: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]


async def test_every_op_is_an_opencl_kernel(backend: Any) -> None:
    from accelkit_opencl.fused_kernels import OpenCLFusedKernels

    kernel_ops = backend.kernel_ops
    assert isinstance(kernel_ops.kernels, OpenCLFusedKernels)
    assert kernel_ops.ops == KERNEL_OPS
    assert backend.capabilities.fused_ops == KERNEL_OPS
    for op in KERNEL_OPS:
        method = getattr(type(kernel_ops.kernels), op)
        assert method.__module__ == "accelkit_opencl.fused_kernels", op


async def test_fused_kernels_wait_for_inputs_written_on_another_stream(backend: Any) -> None:
    f, fused = backend.tensor_factory, backend.kernel_ops.twin()
    rng = np.random.default_rng(0)
    x, r = rng.standard_normal((64, 256)), rng.standard_normal((64, 256))
    s1, s2 = backend.create_stream(), backend.create_stream()
    with backend.use_stream(s1):
        xt = f.from_host(x, dtype=DType.F32)
        rt = backend.tensor_ops.mul(f.from_host(r, dtype=DType.F32), 1.0)
    with backend.use_stream(s2):
        normed, summed = fused.rms_norm_residual(xt, rt)
        gated = fused.silu_mul(summed, normed)
    assert fused.last_route is not None
    assert fused.last_route.route == "fused"
    s = (x.astype(np.float32) + r.astype(np.float32)).astype(np.float64)
    n = s / np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(await summed.to_host(), s, rtol=1e-6)
    np.testing.assert_allclose(await normed.to_host(), n, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        await gated.to_host(), s / (1 + np.exp(-s)) * n, rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize(
    "settings",
    [{}, {"top_k": 7}, {"top_p": 0.6, "temperature": 0.5}, {"top_k": 30, "top_p": 0.9},
     {"repetition_penalty": 1.3, "top_k": 10}],
)  # fmt: skip
async def test_f64_sampling_routes_agree(backend: Any, settings: dict[str, Any]) -> None:
    f = backend.tensor_factory
    rng = np.random.default_rng(3)
    logits = f.from_host(rng.standard_normal((5, 1000)) * 3, dtype=DType.F64)
    previous = f.from_host(rng.integers(-1, 1000, size=(5, 12)))
    routes = [backend.kernel_ops.twin(), backend.kernel_ops.twin("composed")]
    for seed in (0, 1, 2):
        tokens = [
            await d.sample_token(logits, previous_tokens=previous, seed=seed, **settings).to_host()
            for d in routes
        ]
        assert tokens[0].tolist() == tokens[1].tolist()


async def test_quantized_linear_with_many_rows(backend: Any) -> None:
    rng = np.random.default_rng(4)
    f, fused = backend.tensor_factory, backend.kernel_ops.twin()
    w = rng.standard_normal((40, 128)).astype(np.float32)
    x = rng.standard_normal((33, 128)).astype(np.float32)
    for fmt in ("q8_0", "q4_0"):
        qweight, scales = quantize(w, fmt, scale_dtype=np.float32)  # type: ignore[arg-type]
        got = fused.quantized_linear(
            f.from_host(x), f.from_host(qweight), f.from_host(scales), format=fmt
        )
        expected = x.astype(np.float64) @ dequantize(qweight, scales, fmt).astype(np.float64).T  # type: ignore[arg-type]
        np.testing.assert_allclose(await got.to_host(), expected, rtol=1e-4, atol=1e-4)


async def test_a_device_error_is_raised_once_and_later_work_runs(backend: Any) -> None:
    f, fused = backend.tensor_factory, backend.kernel_ops.twin()
    q = f.from_host(np.ones((1, 2, 8), np.float32))
    cache = f.from_host(np.ones((3, 4, 2, 8), np.float32))
    bad = fused.paged_attention(
        q, cache, cache, f.from_host(np.array([[0, 7]], np.int32)), f.from_host(np.array([6]))
    )
    with pytest.raises(InvalidArgumentError, match=r"block 7; the cache has blocks 0\.\.2"):
        await bad.to_host()
    good = fused.paged_attention(
        q, cache, cache, f.from_host(np.array([[0, 2]], np.int32)), f.from_host(np.array([6]))
    )
    np.testing.assert_allclose(await good.to_host(), np.ones((1, 2, 8)), rtol=1e-6)
    tokens = fused.sample_token(
        f.from_host(np.zeros((2, 5), np.float32)),
        repetition_penalty=1.5,
        previous_tokens=f.from_host(np.array([[1, -1], [2, 5]])),
        seed=0,
    )
    with pytest.raises(InvalidArgumentError, match=r"previous_tokens must lie in 0\.\.4 .*got 5"):
        await tokens.to_host()
    await backend.synchronize()
