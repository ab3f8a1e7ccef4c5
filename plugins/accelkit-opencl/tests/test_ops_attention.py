"""The flash-style attention kernel, cross_entropy and the AdamW step on the device, at sizes
that cross the kernels' tile and work-group boundaries (the conformance suite covers the small
cases and the semantics)."""

from __future__ import annotations

import numpy as np
import pytest
from accelkit_opencl.backend import OpenCLBackend
from accelkit_opencl.opencl_attention import attention_key_tile, attention_source

from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError

# Kernel checks: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]

RNG = np.random.default_rng(7)


def _floats(backend: OpenCLBackend) -> list[DType]:
    return [d for d in (DType.F16, DType.F32, DType.F64) if d in backend.supported_dtypes]


def _tol(dtype: DType) -> dict[str, float]:
    return {
        DType.F16: {"rtol": 2e-2, "atol": 2e-2},
        DType.F32: {"rtol": 1e-4, "atol": 1e-5},
        DType.F64: {"rtol": 1e-10, "atol": 1e-12},
    }[dtype]


def _attention_ref(q, k, v, scale, causal=False, mask=None):  # type: ignore[no-untyped-def]
    h, hk = q.shape[1], k.shape[1]
    kk = np.repeat(k, h // hk, axis=1)
    vv = np.repeat(v, h // hk, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q, kk) * scale
    sq, sk = q.shape[2], k.shape[2]
    keep = np.ones(s.shape, bool)
    if causal:
        keep &= np.arange(sk)[None, :] <= np.arange(sq)[:, None] + sk - sq
    if mask is not None:
        if mask.dtype == np.bool_:
            keep &= np.broadcast_to(mask, s.shape)
        else:
            s = s + mask
    s = np.where(keep, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    e = np.where(np.isfinite(m), np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return np.einsum("bhqk,bhkd->bhqd", p, vv)


def _sample(shape: tuple[int, ...], dtype: DType) -> np.ndarray:
    return RNG.uniform(-1, 1, shape).astype(dtype.to_numpy())


@pytest.mark.parametrize(
    "dims",
    [
        (1, 2, 1, 97, 131, 24, 24),  # several key tiles, a partial query block, grouped heads
        (2, 4, 2, 33, 65, 8, 5),  # Dv != D
        (1, 1, 1, 1, 300, 16, 16),  # one query against a long cache
    ],
)
@pytest.mark.parametrize("causal", [False, True])
async def test_attention_across_tiles(
    backend: OpenCLBackend, dims: tuple[int, ...], causal: bool
) -> None:
    b, h, hk, sq, sk, d, dv = dims
    f, o = backend.tensor_factory, backend.tensor_ops
    for dt in _floats(backend):
        q, k, v = (
            _sample((b, h, sq, d), dt),
            _sample((b, hk, sk, d), dt),
            _sample((b, hk, sk, dv), dt),
        )
        got = await o.attention(
            f.from_host(q), f.from_host(k), f.from_host(v), causal=causal
        ).to_host()
        want = _attention_ref(*(a.astype(np.float64) for a in (q, k, v)), d**-0.5, causal)
        np.testing.assert_allclose(got.astype(np.float64), want, **_tol(dt))


@pytest.mark.parametrize("mask_shape", [(1, 1, 40, 70), (2, 1, 1, 70), (70,), (2, 3, 40, 70)])
@pytest.mark.parametrize("kind", ["bool", "float"])
async def test_attention_broadcast_masks_with_causal(
    backend: OpenCLBackend, mask_shape: tuple[int, ...], kind: str
) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    q, k, v = (
        _sample((2, 3, 40, 8), DType.F32),
        _sample((2, 3, 70, 8), DType.F32),
        _sample((2, 3, 70, 8), DType.F32),
    )
    if kind == "bool":
        mask = RNG.random(mask_shape) > 0.3
    else:
        mask = np.where(RNG.random(mask_shape) > 0.3, RNG.uniform(-2, 2, mask_shape), -np.inf)
        mask = mask.astype(np.float32)
    got = await o.attention(
        f.from_host(q),
        f.from_host(k),
        f.from_host(v),
        mask=f.from_host(mask),
        causal=True,
        scale=0.5,
    ).to_host()
    want = _attention_ref(
        q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), 0.5, True,
        mask if kind == "bool" else mask.astype(np.float64),
    )  # fmt: skip
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


async def test_attention_allocates_only_its_output(backend: OpenCLBackend) -> None:
    """No score matrix: the call's only device allocation is the [B, H, Sq, Dv] output."""
    f, o, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager
    q, k, v = (f.from_host(_sample((1, 2, 512, 16), DType.F32)) for _ in range(3))
    await backend.synchronize()
    before = mm.memory_info().used
    y = o.attention(q, k, v, causal=True)
    assert mm.memory_info().used - before == y.nbytes
    await y.to_host()


def test_attention_tile_fits_local_memory() -> None:
    assert attention_key_tile(DType.F32, 64, 64, 1 << 16) == 32
    assert attention_key_tile(DType.F64, 4096, 4096, 1 << 15) == 0
    src = attention_source(DType.F32, DType.BOOL, 8, 8, 32, 16, True)
    assert "__local T kt[BK][DA]" in src
    assert "mask" in src


@pytest.mark.parametrize("classes", [3, 1000])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
async def test_cross_entropy_wide_rows(
    backend: OpenCLBackend, classes: int, reduction: str
) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    for dt in _floats(backend):
        for tdt in (np.int64, np.int32, np.uint8):
            logits = (RNG.standard_normal((37, classes)) * 4).astype(dt.to_numpy())
            targets = RNG.integers(0, min(classes, 255), 37).astype(tdt)
            loss, probs = o.cross_entropy(f.from_host(logits), f.from_host(targets), reduction)
            x = logits.astype(np.float64)
            logp = x - x.max(1, keepdims=True)
            logp -= np.log(np.exp(logp).sum(1, keepdims=True))
            rows = -logp[np.arange(37), targets.astype(np.int64)]
            want = {"mean": rows.mean(), "sum": rows.sum(), "none": rows}[reduction]
            np.testing.assert_allclose(await probs.to_host(), np.exp(logp), **_tol(dt))
            np.testing.assert_allclose(await loss.to_host(), want, **_tol(dt))


async def test_cross_entropy_no_rows(backend: OpenCLBackend) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    logits = f.from_host(np.zeros((0, 4), np.float32))
    targets = f.from_host(np.zeros(0, np.int64))
    assert np.isnan(await o.cross_entropy(logits, targets)[0].to_host())
    assert await o.cross_entropy(logits, targets, "sum")[0].to_host() == 0


async def test_cross_entropy_bad_target_is_reported_once_not_clamped(
    backend: OpenCLBackend,
) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    loss, probs = o.cross_entropy(
        f.from_host(np.zeros((3, 4), np.float32)), f.from_host([0, -2, 1])
    )
    with pytest.raises(InvalidArgumentError, match="-2"):
        await loss.to_host()
    np.testing.assert_allclose(await probs.to_host(), np.full((3, 4), 0.25), rtol=1e-6)
    rows, _ = o.cross_entropy(
        f.from_host(np.zeros((2, 4), np.float32)), f.from_host([4, 0]), reduction="none"
    )
    with pytest.raises(InvalidArgumentError, match="4"):
        await backend.synchronize()
    got = await rows.to_host()  # reported once; the bad row is NaN, never a clamped class
    assert np.isnan(got[0])
    assert got[1] == pytest.approx(np.log(4), rel=1e-6)


async def test_adam_update_many_steps(backend: OpenCLBackend) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    for dt in _floats(backend):
        shape = (1000, 3)
        p_h, m_h, v_h = (
            _sample(shape, dt),
            np.zeros(shape, dt.to_numpy()),
            np.zeros(shape, dt.to_numpy()),
        )
        p, m, v = f.from_host(p_h), f.from_host(m_h), f.from_host(v_h)
        pr, mr, vr = (a.astype(np.float64) for a in (p_h, m_h, v_h))
        hyper = {"lr": 1e-2, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6, "weight_decay": 0.1}
        for step in range(1, 4):
            g_h = _sample(shape, dt)
            assert o.adam_update(p, f.from_host(g_h), m, v, step=step, **hyper) is p
            g = g_h.astype(np.float64)
            mr = 0.8 * mr + 0.2 * g
            vr = 0.99 * vr + 0.01 * g * g
            upd = (mr / (1 - 0.8**step)) / (np.sqrt(vr / (1 - 0.99**step)) + 1e-6) + 0.1 * pr
            pr = pr - 1e-2 * upd
        for got, want in ((p, pr), (m, mr), (v, vr)):
            np.testing.assert_allclose((await got.to_host()).astype(np.float64), want, **_tol(dt))
