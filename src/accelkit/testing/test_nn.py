"""Neural-network ops against explicit-loop references: conv2d, attention, softmax, norms,
cross_entropy, embedding and the AdamW step."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from accelkit import ComputeBackend, DType

from . import reference as ref
from .checks import FLOATS, assert_close, f64, fetch, ids, require_dtype, sample

# A kernel check: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]


# -- conv2d -----------------------------------------------------------------------------------------
CONV_CASES: dict[str, dict[str, Any]] = {
    "plain": dict(x=(2, 3, 7, 6), w=(4, 3, 3, 3)),
    "bias": dict(x=(1, 2, 5, 5), w=(3, 2, 3, 3), bias=True),
    "stride2": dict(x=(1, 2, 8, 7), w=(2, 2, 3, 3), stride=2),
    "stride_hw": dict(x=(1, 1, 9, 8), w=(2, 1, 2, 3), stride=(2, 3)),
    "padding1": dict(x=(2, 2, 5, 4), w=(3, 2, 3, 3), padding=1, bias=True),
    "padding_hw": dict(x=(1, 2, 4, 5), w=(2, 2, 3, 2), padding=(1, 2)),
    "dilation2": dict(x=(1, 2, 9, 9), w=(2, 2, 3, 3), dilation=2),
    "groups2": dict(x=(1, 4, 6, 6), w=(6, 2, 3, 3), groups=2, bias=True),
    "depthwise": dict(x=(2, 3, 5, 5), w=(3, 1, 3, 3), groups=3, padding=1),
    "combo": dict(
        x=(1, 4, 11, 10), w=(4, 2, 3, 2), stride=(2, 1), padding=(2, 1), dilation=(1, 2), groups=2
    ),
    "1x1": dict(x=(2, 5, 3, 4), w=(2, 5, 1, 1)),
    "kernel_is_input": dict(x=(1, 1, 3, 3), w=(1, 1, 3, 3)),
}


def _pair(v: int | tuple[int, int]) -> tuple[int, int]:
    return v if isinstance(v, tuple) else (v, v)


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize("case", list(CONV_CASES))
async def test_conv2d(backend: ComputeBackend, case: str, dtype: DType) -> None:
    require_dtype(backend, dtype)
    c = CONV_CASES[case]
    x_h = sample(c["x"], dtype, low=-1, high=1, seed=1)
    w_h = sample(c["w"], dtype, low=-1, high=1, seed=2)
    b_h = sample((c["w"][0],), dtype, seed=3) if c.get("bias") else None
    f = backend.tensor_factory
    kwargs = {k: c[k] for k in ("stride", "padding", "dilation", "groups") if k in c}
    y = backend.tensor_ops.conv2d(
        f.from_host(x_h), f.from_host(w_h), None if b_h is None else f.from_host(b_h), **kwargs
    )
    expected = ref.conv2d(
        f64(x_h), f64(w_h), None if b_h is None else f64(b_h),
        stride=_pair(c.get("stride", 1)), padding=_pair(c.get("padding", 0)),
        dilation=_pair(c.get("dilation", 1)), groups=c.get("groups", 1),
    )  # fmt: skip
    assert y.shape == expected.shape
    assert_close(await fetch(y, dtype), expected, dtype, scale=3.0)


async def test_conv2d_matches_scipy_correlate(backend: ComputeBackend) -> None:
    """A second, independent reference: scipy's N-d correlation summed over input channels."""
    from scipy.signal import correlate  # type: ignore[import-untyped]

    x_h = sample((1, 3, 12, 10), DType.F64, seed=4)
    w_h = sample((2, 3, 5, 3), DType.F64, seed=5)
    f = backend.tensor_factory
    y = backend.tensor_ops.conv2d(f.from_host(x_h), f.from_host(w_h))
    expected = np.stack([correlate(x_h[0], w_h[o], mode="valid")[0] for o in range(2)])[None]
    assert_close(await fetch(y, DType.F64), expected, DType.F64)


async def test_conv2d_large_runs_correctly(backend: ComputeBackend) -> None:
    x_h = sample((2, 8, 32, 32), DType.F32, seed=6)
    w_h = sample((16, 8, 3, 3), DType.F32, seed=7)
    f = backend.tensor_factory
    y = backend.tensor_ops.conv2d(f.from_host(x_h), f.from_host(w_h), padding=1, stride=2)
    from scipy.signal import correlate

    xp = np.pad(f64(x_h), ((0, 0), (0, 0), (1, 1), (1, 1)))
    expected = np.stack(
        [
            np.stack([correlate(xp[n], f64(w_h)[o], mode="valid")[0][::2, ::2] for o in range(16)])
            for n in range(2)
        ]
    )
    assert_close(await fetch(y), expected, DType.F32, scale=5.0)


# -- attention --------------------------------------------------------------------------------------
def _qkv(
    dtype: DType,
    b: int,
    h: int,
    hk: int,
    sq: int,
    skv: int,
    d: int,
    dv: int | None = None,
    seed: int = 0,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    dv = d if dv is None else dv
    return (
        sample((b, h, sq, d), dtype, low=-1, high=1, seed=seed),
        sample((b, hk, skv, d), dtype, low=-1, high=1, seed=seed + 1),
        sample((b, hk, skv, dv), dtype, low=-1, high=1, seed=seed + 2),
    )


ATTN_CASES: dict[str, dict[str, Any]] = {
    "plain": dict(dims=(2, 2, 2, 5, 5, 8)),
    "scale": dict(dims=(1, 2, 2, 4, 6, 4), scale=0.3),
    "causal_square": dict(dims=(1, 2, 2, 6, 6, 4), causal=True),
    "causal_kv_cache": dict(dims=(2, 2, 2, 3, 7, 4), causal=True),  # Sq < Skv: bottom-right
    "causal_single_query": dict(dims=(1, 2, 2, 1, 5, 4), causal=True),
    "causal_more_queries": dict(dims=(1, 1, 1, 6, 4, 4), causal=True),  # first rows see nothing
    "grouped_2": dict(dims=(1, 4, 2, 5, 6, 8)),
    "grouped_1": dict(dims=(2, 4, 1, 3, 4, 4), causal=True),
    "value_dim": dict(dims=(1, 2, 2, 4, 5, 6), dv=3),
}


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize("case", list(ATTN_CASES))
async def test_attention(backend: ComputeBackend, case: str, dtype: DType) -> None:
    require_dtype(backend, dtype)
    c = ATTN_CASES[case]
    b, h, hk, sq, skv, d = c["dims"]
    q_h, k_h, v_h = _qkv(dtype, b, h, hk, sq, skv, d, c.get("dv"))
    f = backend.tensor_factory
    y = backend.tensor_ops.attention(
        f.from_host(q_h), f.from_host(k_h), f.from_host(v_h),
        scale=c.get("scale"), causal=c.get("causal", False),
    )  # fmt: skip
    expected = ref.attention(f64(q_h), f64(k_h), f64(v_h), c.get("scale"), c.get("causal", False))
    assert y.shape == expected.shape
    assert_close(await fetch(y, dtype), expected, dtype, scale=2.0)


async def test_attention_causal_rows_that_see_no_key_are_zero(backend: ComputeBackend) -> None:
    q_h, k_h, v_h = _qkv(DType.F32, 1, 1, 1, 5, 3, 4)
    f = backend.tensor_factory
    got = await fetch(
        backend.tensor_ops.attention(
            f.from_host(q_h), f.from_host(k_h), f.from_host(v_h), causal=True
        )
    )
    # Query i sees keys j <= i + (3 - 5): rows 0 and 1 see none.
    np.testing.assert_array_equal(got[0, 0, :2], np.zeros((2, 4), np.float32))
    assert np.all(np.isfinite(got))
    # The last query sees every key.
    expected = ref.attention(f64(q_h), f64(k_h), f64(v_h), causal=True)
    assert_close(got, expected, DType.F32)


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize("mask_shape", [(1, 1, 4, 6), (2, 1, 1, 6), (2, 3, 4, 6), (4, 6), (6,)])
async def test_attention_bool_mask(
    backend: ComputeBackend, dtype: DType, mask_shape: tuple[int, ...]
) -> None:
    require_dtype(backend, dtype)
    q_h, k_h, v_h = _qkv(dtype, 2, 3, 3, 4, 6, 4, seed=3)
    mask_h = np.random.default_rng(1).random(mask_shape) < 0.6
    mask_h[..., 0] = True  # every row keeps a key here (fully masked rows are tested below)
    f = backend.tensor_factory
    y = backend.tensor_ops.attention(
        f.from_host(q_h), f.from_host(k_h), f.from_host(v_h), mask=f.from_host(mask_h)
    )
    expected = ref.attention(f64(q_h), f64(k_h), f64(v_h), mask=mask_h)
    assert_close(await fetch(y, dtype), expected, dtype, scale=2.0)


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
async def test_attention_float_mask_is_added(backend: ComputeBackend, dtype: DType) -> None:
    require_dtype(backend, dtype)
    q_h, k_h, v_h = _qkv(dtype, 1, 2, 2, 4, 5, 4, seed=5)
    mask_h = sample((1, 1, 4, 5), dtype, low=-2, high=2, seed=9)
    f = backend.tensor_factory
    y = backend.tensor_ops.attention(
        f.from_host(q_h), f.from_host(k_h), f.from_host(v_h), mask=f.from_host(mask_h)
    )
    expected = ref.attention(f64(q_h), f64(k_h), f64(v_h), mask=f64(mask_h))
    assert_close(await fetch(y, dtype), expected, dtype, scale=2.0)


async def test_attention_mask_and_causal_combine(backend: ComputeBackend) -> None:
    q_h, k_h, v_h = _qkv(DType.F64, 1, 2, 1, 4, 6, 4, seed=6)
    mask_h = np.random.default_rng(2).random((1, 2, 4, 6)) < 0.7
    mask_h[..., 0] = True
    f = backend.tensor_factory
    y = backend.tensor_ops.attention(
        f.from_host(q_h), f.from_host(k_h), f.from_host(v_h), mask=f.from_host(mask_h), causal=True
    )
    expected = ref.attention(q_h, k_h, v_h, causal=True, mask=mask_h)
    assert_close(await fetch(y, DType.F64), expected, DType.F64)


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
async def test_attention_fully_masked_rows_yield_zeros(
    backend: ComputeBackend, dtype: DType
) -> None:
    require_dtype(backend, dtype)
    q_h, k_h, v_h = _qkv(dtype, 1, 2, 2, 3, 4, 4, seed=7)
    f, ops = backend.tensor_factory, backend.tensor_ops
    bool_mask = np.ones((1, 2, 3, 4), bool)
    bool_mask[0, 1, 2] = False
    bool_mask[0, 0, 0] = False
    y = await fetch(
        ops.attention(
            f.from_host(q_h), f.from_host(k_h), f.from_host(v_h), mask=f.from_host(bool_mask)
        ),
        dtype,
    )
    np.testing.assert_array_equal(f64(y[0, 1, 2]), np.zeros(4))
    np.testing.assert_array_equal(f64(y[0, 0, 0]), np.zeros(4))
    assert np.all(np.isfinite(f64(y)))
    assert_close(y, ref.attention(f64(q_h), f64(k_h), f64(v_h), mask=bool_mask), dtype, scale=2.0)

    float_mask = np.zeros((3, 4), dtype.to_numpy())
    float_mask[1] = -np.inf
    y = await fetch(
        ops.attention(
            f.from_host(q_h), f.from_host(k_h), f.from_host(v_h), mask=f.from_host(float_mask)
        ),
        dtype,
    )
    np.testing.assert_array_equal(f64(y[:, :, 1]), np.zeros((1, 2, 4)))
    assert np.all(np.isfinite(f64(y)))


async def test_attention_large_sequence(backend: ComputeBackend) -> None:
    """Long enough to exercise any chunking over query rows."""
    q_h, k_h, v_h = _qkv(DType.F32, 1, 2, 1, 300, 300, 16, seed=8)
    f = backend.tensor_factory
    y = backend.tensor_ops.attention(
        f.from_host(q_h), f.from_host(k_h), f.from_host(v_h), causal=True
    )
    # Vectorised float64 reference (the loop reference is too slow at this size).
    s = np.einsum("bhqd,bhkd->bhqk", f64(q_h), np.repeat(f64(k_h), 2, axis=1)) / 4.0
    s = np.where(np.tril(np.ones((300, 300), bool)), s, -np.inf)
    expected = np.einsum("bhqk,bhkd->bhqd", ref.softmax(s), np.repeat(f64(v_h), 2, axis=1))
    assert_close(await fetch(y), expected, DType.F32, scale=5.0)


# -- softmax ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("log", [False, True])
async def test_softmax(backend: ComputeBackend, dtype: DType, axis: int, log: bool) -> None:
    require_dtype(backend, dtype)
    x_h = sample((3, 4, 5), dtype, low=-4, high=4, seed=1)
    ops = backend.tensor_ops
    x = backend.tensor_factory.from_host(x_h)
    y = ops.log_softmax(x, axis=axis) if log else ops.softmax(x, axis=axis)
    expected = (ref.log_softmax if log else ref.softmax)(f64(x_h), axis=axis)
    assert_close(await fetch(y, dtype), expected, dtype, scale=2.0)


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
async def test_softmax_is_stable_for_large_logits(backend: ComputeBackend, dtype: DType) -> None:
    require_dtype(backend, dtype)
    big = 60000.0 if dtype is DType.F16 else 1e4
    x_h = np.array([[big, big - 1, big - 2], [-big, -big, -big]], dtype.to_numpy())
    x = backend.tensor_factory.from_host(x_h)
    got = f64(await fetch(backend.tensor_ops.softmax(x), dtype))
    assert np.all(np.isfinite(got))
    assert_close(got, ref.softmax(f64(x_h)), dtype)
    lsm = f64(await fetch(backend.tensor_ops.log_softmax(x), dtype))
    assert_close(lsm, ref.log_softmax(f64(x_h)), dtype, scale=2.0)


async def test_softmax_with_minus_inf_entries(backend: ComputeBackend) -> None:
    x_h = np.array([[0.0, -np.inf, 1.0], [-np.inf, 2.0, -np.inf]], np.float32)
    got = await fetch(backend.tensor_ops.softmax(backend.tensor_factory.from_host(x_h)))
    e = np.exp([0.0, 1.0])
    assert_close(got, np.array([[e[0] / e.sum(), 0.0, e[1] / e.sum()], [0.0, 1.0, 0.0]]), DType.F32)


@pytest.mark.parametrize("dtype", [DType.I32, DType.U8], ids=str)
async def test_softmax_of_integers_gives_f32(backend: ComputeBackend, dtype: DType) -> None:
    x_h = np.array([[0, 1, 2], [3, 3, 3]], dtype.to_numpy())
    y = backend.tensor_ops.softmax(backend.tensor_factory.from_host(x_h))
    assert_close(await fetch(y, DType.F32), ref.softmax(f64(x_h)), DType.F32)


async def test_softmax_large_rows(backend: ComputeBackend) -> None:
    x_h = sample((200, 1000), DType.F32, low=-10, high=10, seed=2)
    y = backend.tensor_ops.softmax(backend.tensor_factory.from_host(x_h))
    got = await fetch(y)
    np.testing.assert_allclose(f64(got).sum(axis=-1), np.ones(200), rtol=1e-5)
    assert_close(got, ref.softmax(f64(x_h)), DType.F32)


# -- norms ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize(
    ("weight", "bias"), [(False, False), (True, False), (True, True), (False, True)]
)
@pytest.mark.parametrize("shape", [(4, 16), (2, 3, 8), (32,)])
async def test_layer_norm(
    backend: ComputeBackend, dtype: DType, weight: bool, bias: bool, shape: tuple[int, ...]
) -> None:
    require_dtype(backend, dtype)
    x_h = sample(shape, dtype, low=-3, high=5, seed=1)
    w_h = sample((shape[-1],), dtype, low=0.5, high=1.5, seed=2) if weight else None
    b_h = sample((shape[-1],), dtype, seed=3) if bias else None
    f = backend.tensor_factory
    y = backend.tensor_ops.layer_norm(
        f.from_host(x_h),
        None if w_h is None else f.from_host(w_h),
        None if b_h is None else f.from_host(b_h),
        eps=1e-3,
    )
    expected = ref.layer_norm(
        f64(x_h), None if w_h is None else f64(w_h), None if b_h is None else f64(b_h), 1e-3
    )
    assert_close(await fetch(y, dtype), expected, dtype, scale=3.0)


async def test_layer_norm_default_eps_and_constant_rows(backend: ComputeBackend) -> None:
    x_h = np.array([[2.0, 2.0, 2.0, 2.0], [1.0, 2.0, 3.0, 4.0]], np.float64)
    got = await fetch(
        backend.tensor_ops.layer_norm(backend.tensor_factory.from_host(x_h)), DType.F64
    )
    assert_close(got, ref.layer_norm(x_h, None, None, 1e-5), DType.F64)
    np.testing.assert_array_equal(got[0], np.zeros(4))


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize("weight", [False, True])
@pytest.mark.parametrize("shape", [(4, 16), (2, 3, 8)])
async def test_rms_norm(
    backend: ComputeBackend, dtype: DType, weight: bool, shape: tuple[int, ...]
) -> None:
    require_dtype(backend, dtype)
    x_h = sample(shape, dtype, low=-3, high=3, seed=4)
    w_h = sample((shape[-1],), dtype, low=0.5, high=1.5, seed=5) if weight else None
    f = backend.tensor_factory
    y = backend.tensor_ops.rms_norm(
        f.from_host(x_h), None if w_h is None else f.from_host(w_h), eps=1e-4
    )
    expected = ref.rms_norm(f64(x_h), None if w_h is None else f64(w_h), 1e-4)
    assert_close(await fetch(y, dtype), expected, dtype, scale=3.0)
    default = backend.tensor_ops.rms_norm(f.from_host(x_h))
    assert_close(await fetch(default, dtype), ref.rms_norm(f64(x_h), None, 1e-6), dtype, scale=3.0)


# -- cross entropy and embedding --------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("target_dtype", [DType.I64, DType.I32, DType.U8], ids=str)
async def test_cross_entropy(
    backend: ComputeBackend, dtype: DType, reduction: str, target_dtype: DType
) -> None:
    require_dtype(backend, dtype, target_dtype)
    logits_h = sample((6, 5), dtype, low=-3, high=3, seed=1)
    targets_h = np.array([0, 4, 2, 2, 1, 3], target_dtype.to_numpy())
    f = backend.tensor_factory
    loss, probs = backend.tensor_ops.cross_entropy(
        f.from_host(logits_h), f.from_host(targets_h), reduction
    )
    exp_loss, exp_probs = ref.cross_entropy(f64(logits_h), targets_h, reduction)
    assert loss.shape == ((6,) if reduction == "none" else ())
    assert_close(await fetch(loss, dtype), exp_loss, dtype, scale=2.0)
    assert_close(await fetch(probs, dtype), exp_probs, dtype, scale=2.0)


async def test_cross_entropy_default_is_mean_and_probs_give_the_gradient(
    backend: ComputeBackend,
) -> None:
    logits_h = sample((4, 3), DType.F64, seed=2)
    targets_h = np.array([2, 0, 1, 1])
    f = backend.tensor_factory
    loss, probs = backend.tensor_ops.cross_entropy(f.from_host(logits_h), f.from_host(targets_h))
    assert loss.shape == ()
    got_probs = await fetch(probs, DType.F64)
    # Numerical gradient of the summed loss w.r.t. one logit == probs - one_hot.
    eps = 1e-6
    bumped = logits_h.copy()
    bumped[1, 2] += eps
    l0, _ = ref.cross_entropy(logits_h, targets_h, "sum")
    l1, _ = ref.cross_entropy(bumped, targets_h, "sum")
    assert abs(float(l1 - l0) / eps - (got_probs[1, 2] - 0.0)) < 1e-4
    assert_close(
        await fetch(loss, DType.F64), ref.cross_entropy(logits_h, targets_h, "mean")[0], DType.F64
    )


@pytest.mark.parametrize("dtype", [*FLOATS, DType.I32], ids=ids([*FLOATS, DType.I32]))
@pytest.mark.parametrize("index_dtype", [DType.I64, DType.I32, DType.U8, DType.I16], ids=str)
@pytest.mark.parametrize("index_shape", [(5,), (2, 3), ()])
async def test_embedding(
    backend: ComputeBackend, dtype: DType, index_dtype: DType, index_shape: tuple[int, ...]
) -> None:
    require_dtype(backend, dtype, index_dtype)
    weight_h = sample((7, 4), dtype, seed=1)
    idx_h = np.random.default_rng(3).integers(0, 7, size=index_shape).astype(index_dtype.to_numpy())
    f = backend.tensor_factory
    y = backend.tensor_ops.embedding(f.from_host(idx_h), f.from_host(weight_h))
    assert y.shape == (*index_shape, 4)
    expected = np.empty((*index_shape, 4), weight_h.dtype)
    for pos in np.ndindex(*index_shape):
        expected[pos] = weight_h[int(idx_h[pos])]
    np.testing.assert_array_equal(await fetch(y, dtype), expected)


# -- AdamW ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [DType.F32, DType.F64], ids=str)
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
async def test_adam_update_matches_the_adamw_equations(
    backend: ComputeBackend, dtype: DType, weight_decay: float
) -> None:
    require_dtype(backend, dtype)
    f, ops = backend.tensor_factory, backend.tensor_ops
    p_h = sample((4, 6), dtype, seed=1)
    param, m, v = f.from_host(p_h), f.zeros((4, 6), dtype), f.zeros((4, 6), dtype)
    p_ref, m_ref, v_ref = f64(p_h), np.zeros((4, 6)), np.zeros((4, 6))
    hyper = dict(lr=0.01, beta1=0.8, beta2=0.95, eps=1e-6, weight_decay=weight_decay)
    for step in range(1, 4):
        g_h = sample((4, 6), dtype, seed=10 + step)
        returned = ops.adam_update(param, f.from_host(g_h), m, v, step=step, **hyper)
        assert returned is param  # in place
        p_ref, m_ref, v_ref = ref.adamw(p_ref, f64(g_h), m_ref, v_ref, step=step, **hyper)
    assert_close(await fetch(param, dtype), p_ref, dtype, scale=10.0)
    assert_close(await fetch(m, dtype), m_ref, dtype, scale=10.0)
    assert_close(await fetch(v, dtype), v_ref, dtype, scale=10.0)


@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16], ids=str)
async def test_adam_update_one_low_precision_step(backend: ComputeBackend, dtype: DType) -> None:
    require_dtype(backend, dtype)
    f, ops = backend.tensor_factory, backend.tensor_ops
    p_h, g_h = sample((3, 5), dtype, seed=1), sample((3, 5), dtype, seed=2)
    m_h = sample((3, 5), dtype, low=-0.1, high=0.1, seed=3)
    v_h = sample((3, 5), dtype, low=0.01, high=0.1, seed=4)
    param, m, v = f.from_host(p_h), f.from_host(m_h), f.from_host(v_h)
    hyper = dict(lr=0.05, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
    ops.adam_update(param, f.from_host(g_h), m, v, step=5, **hyper)
    p_ref, m_ref, v_ref = ref.adamw(f64(p_h), f64(g_h), f64(m_h), f64(v_h), step=5, **hyper)
    assert_close(await fetch(param, dtype), p_ref, dtype)
    assert_close(await fetch(m, dtype), m_ref, dtype)
    assert_close(await fetch(v, dtype), v_ref, dtype)


async def test_adam_update_default_hyperparameters(backend: ComputeBackend) -> None:
    f = backend.tensor_factory
    p_h, g_h = sample((8,), DType.F64, seed=1), sample((8,), DType.F64, seed=2)
    param, m, v = f.from_host(p_h), f.zeros((8,), DType.F64), f.zeros((8,), DType.F64)
    backend.tensor_ops.adam_update(param, f.from_host(g_h), m, v, lr=1e-3, step=1)
    p_ref, _, _ = ref.adamw(
        p_h,
        g_h,
        np.zeros(8),
        np.zeros(8),
        lr=1e-3,
        beta1=0.9,
        beta2=0.999,
        eps=1e-8,
        step=1,
        weight_decay=0.0,
    )
    assert_close(await fetch(param, DType.F64), p_ref, DType.F64)
    # The first bias-corrected step moves each weight by about lr * sign(g).
    np.testing.assert_allclose(p_h - await fetch(param), 1e-3 * np.sign(g_h), rtol=1e-4)
    assert math.isclose(float(np.abs(p_h - p_ref).max()), 1e-3, rel_tol=1e-4)
