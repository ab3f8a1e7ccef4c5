"""Regressions found by review: each failed before its fix, against NumPy or the CPU backend."""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest
from accelkit_webgpu.backend import WebGPUBackend

from accelkit.errors import InvalidArgumentError, UnsupportedOperationError

# Kernel checks: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]


@pytest.mark.parametrize(
    ("values", "dtype", "scalar"),
    [([1, 100], np.uint8, -1), ([1, 100], np.int32, 2**40), ([1, -1], np.int64, 2**63),
     ([0, 2**32 - 1], np.uint32, -1), ([5, -5], np.int16, -40000)],
)  # fmt: skip
async def test_comparing_with_an_int_outside_the_dtype_compares_exact_values(
    backend: WebGPUBackend, values: list[int], dtype: type, scalar: int
) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    x_h = np.array(values, dtype)
    x = f.from_host(x_h)
    names = {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal",
             "gt": "greater", "ge": "greater_equal"}  # fmt: skip
    for op, name in names.items():
        compare = getattr(np, name)
        got = await ops.binary(op, x, scalar).to_host()
        np.testing.assert_array_equal(got, compare(x_h, scalar), op)
        got = await ops.binary(op, scalar, x).to_host()  # the scalar on the left
        np.testing.assert_array_equal(got, compare(scalar, x_h), op)


async def test_unsigned_indices_past_i32_are_out_of_range_and_named(
    backend: WebGPUBackend,
) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.from_host(np.array([[10.0], [20.0], [30.0]], np.float32))
    for idx, shown in ((np.uint32(2**32 - 1), "4294967295"), (np.uint64(2**63 + 5), "9223372036854775813"),
                       (np.int64(2**40), "1099511627776")):  # fmt: skip
        with pytest.raises(InvalidArgumentError, match=shown):
            await ops.gather(x, 0, f.from_host(np.array([[idx]]))).to_host()
    with pytest.raises(InvalidArgumentError, match="-1"):
        await ops.embedding(f.from_host(np.array([-1], np.int8)), f.ones((3, 2))).to_host()


async def test_scatter_refuses_a_source_of_another_dtype(backend: WebGPUBackend) -> None:
    """It converted here, the CPU too, and OpenCL read the source's bits as x's dtype: the core
    refuses it now on every backend, as scatter(reduce=), scatter_nd and PyTorch do."""
    f, ops = backend.tensor_factory, backend.tensor_ops
    with pytest.raises(InvalidArgumentError, match="src is i32, x is f32"):
        ops.scatter(
            f.zeros((3,), "f32"), 0, f.from_host(np.array([1], np.int64)),
            f.from_host(np.array([5], np.int32)),
        )  # fmt: skip


async def test_loops_past_the_software_adapters_limit_are_refused(backend: WebGPUBackend) -> None:
    if not backend.capabilities.extra.get("software"):
        pytest.skip("a hardware adapter has no loop limit")
    f, ops = backend.tensor_factory, backend.tensor_ops
    used = backend.memory_manager.memory_info().used
    a, b = f.ones((1, 40000)), f.ones((40000, 1))  # wrong from 41,938 on lavapipe
    with pytest.raises(UnsupportedOperationError, match="65,535"):
        ops.matmul(a, b)
    del a, b
    await backend.synchronize()  # the fills' queued work holds its tensors until it has run
    gc.collect()  # the refusals' tracebacks hold the outputs the core had allocated
    assert backend.memory_manager.memory_info().used == used
    # inside the limit: right
    for m, n in ((1, 1), (64, 64), (128, 64)):  # the row, medium and large tiles
        got = await ops.matmul(f.ones((m, 32768)), f.ones((32768, n))).to_host()
        np.testing.assert_array_equal(got, np.full((m, n), 32768.0))


async def test_small_and_subnormal_arguments_keep_their_precision(backend: WebGPUBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    x_h = np.array([1e-6, 1e-4, 6e-4, 0.3, -0.05], np.float32)
    x = f.from_host(x_h)
    erf = np.array([math.erf(float(v)) for v in x_h])
    np.testing.assert_allclose(await ops.erf(x).to_host(), erf, rtol=2e-6)
    np.testing.assert_allclose(
        await ops.tanh(x).to_host(), np.tanh(x_h.astype(np.float64)), rtol=2e-6
    )
    tiny = np.array([1e-40, 1e-45, 3e-39], np.float32)  # subnormals
    got = await ops.log(f.from_host(tiny)).to_host()
    np.testing.assert_allclose(got, np.log(tiny.astype(np.float64)), rtol=1e-6)


def _attention_reference(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, mask: np.ndarray | None
) -> np.ndarray:
    """Textbook attention in float64: grouped KV heads repeated, hidden keys at -inf, rows that
    see no key 0, rows that see a NaN or +inf score NaN."""
    _, h, sq, d = q.shape
    g = h // k.shape[1]
    k64, v64 = np.repeat(k, g, 1).astype(np.float64), np.repeat(v, g, 1).astype(np.float64)
    s = (q.astype(np.float64) @ np.swapaxes(k64, -1, -2)) / np.sqrt(d)
    skv = k.shape[2]
    hidden = np.zeros((sq, skv), bool)
    if causal:
        hidden = np.arange(skv)[None, :] > np.arange(sq)[:, None] + (skv - sq)
    if mask is not None:
        hidden = hidden | ~mask
    s = np.where(hidden, -np.inf, s)
    bad = np.isnan(s).any(-1, keepdims=True) | np.isposinf(s).any(-1, keepdims=True)
    m = np.max(s, -1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.exp(s - np.where(np.isfinite(m), m, 0))
        total = p.sum(-1, keepdims=True)
        out = np.where(total > 0, (p / np.where(total > 0, total, 1)) @ v64, 0.0)
    return np.where(bad, np.nan, out)


@pytest.mark.parametrize(
    ("b", "h", "hk", "sq", "skv", "d", "causal", "masked", "nan_key"),
    [
        (1, 2, 1, 70, 900, 64, True, False, None),  # past llvmpipe's limit as it is (384 keys)
        (2, 4, 2, 37, 150, 8, True, False, None),  # the tests below: 40 keys a dispatch
        (1, 2, 2, 20, 130, 8, False, True, None),  # a boolean mask, some rows seeing nothing
        (1, 1, 1, 9, 100, 8, True, False, 95),  # a NaN key: only rows that see it are NaN
    ],
)  # fmt: skip
async def test_attention_past_the_software_loop_limit_is_split_over_dispatches(
    backend: WebGPUBackend,
    monkeypatch: pytest.MonkeyPatch,
    b: int, h: int, hk: int, sq: int, skv: int, d: int, causal: bool, masked: bool,
    nan_key: int | None,
) -> None:  # fmt: skip
    """Work that loops past llvmpipe's 65,535 iterations (which it stops silently) was refused;
    now the keys are split over dispatches that carry the online softmax between them."""
    from accelkit_webgpu import kernels_linalg

    if d != 64:  # a few keys a dispatch: many ranges on small shapes
        monkeypatch.setattr(kernels_linalg, "ATTENTION_KEY_TRIPS", 40 * 2 * d)
    software = bool(backend.capabilities.extra.get("software"))
    gpu = backend.gpu
    dispatches: list[int] = []
    real = gpu.dispatch

    def counted(source: str, *args: object, **kwargs: object) -> None:
        if "t_st" in source:
            dispatches.append(1)
        real(source, *args, **kwargs)

    monkeypatch.setattr(gpu, "dispatch", counted)
    f, ops = backend.tensor_factory, backend.tensor_ops
    rng = np.random.default_rng(skv)
    q_h = rng.standard_normal((b, h, sq, d)).astype(np.float32)
    k_h = rng.standard_normal((b, hk, skv, d)).astype(np.float32)
    v_h = rng.standard_normal((b, hk, skv, d)).astype(np.float32)
    if nan_key is not None:
        k_h[..., nan_key, 0] = np.nan
    mask_h = None
    if masked:
        mask_h = rng.random((sq, skv)) < 0.3
        mask_h[3] = False  # a row that sees no key
    used = backend.memory_manager.memory_info().used
    out = ops.attention(
        f.from_host(q_h), f.from_host(k_h), f.from_host(v_h),
        mask=None if mask_h is None else f.from_host(mask_h), causal=causal,
    )  # fmt: skip
    got = await out.to_host()
    want = _attention_reference(q_h, k_h, v_h, causal, mask_h)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    if nan_key is not None:  # the check above compares NaN positions too; make sure some exist
        assert np.isnan(got).any()
        assert not np.isnan(got).all()
    if software:
        assert len(dispatches) >= 2, "the keys were not split over dispatches"
    del out
    await backend.synchronize()
    gc.collect()
    assert backend.memory_manager.memory_info().used == used  # the scratch state was freed
