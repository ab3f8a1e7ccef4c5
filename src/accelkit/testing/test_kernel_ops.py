"""KernelOps: each backend's fused kernels, the TensorOps compositions and a NumPy reference agree.

Every op is run, on every conformance backend, through two dispatchers on the same backend: one
preferring the fused kernels and one forcing the compositions; both results are checked against a
formula written here in float64 NumPy, independent of either implementation. A case whose dtype
the backend has no tensors of is skipped, saying so; tests of the CPU backend's own machinery
(its NumPy kernels' chunking) run on the CPU backend only.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest
from scipy.special import erf  # type: ignore[import-untyped]

import accelkit
from accelkit import DType, InvalidArgumentError, StaleHandleError, UnsupportedOperationError
from accelkit.ops.kernel_ops import KERNEL_OPS, KernelOps
from accelkit.quant import QuantFormat, quantize
from accelkit.sdk import TENSOR_OPS, ComposedOnly, FusedKernels

from .backends import conformance_backends
from .checks import FUSED_TOLERANCES

Array = np.ndarray[Any, Any]

# Kernel checks: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = pytest.mark.one_loop

FLOATS = [DType.F32, DType.F16, DType.BF16, DType.F64]
TOL = FUSED_TOLERANCES


class Env:
    """A backend with a fused-first and a composed-only dispatcher, and data helpers."""

    def __init__(self, backend: accelkit.ComputeBackend) -> None:
        self.backend = backend
        self.f = backend.tensor_factory
        self.fused = backend.kernel_ops.twin()
        self.composed = backend.kernel_ops.twin("composed")
        self.rng = np.random.default_rng(1234)

    def t(self, array: Any, dtype: DType | None = None) -> accelkit.Tensor:
        return self.f.from_host(np.asarray(array), dtype=dtype)

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> accelkit.Tensor:
        return self.f.from_host(np.zeros(shape, dtype))

    def f32(self, *shape: int) -> accelkit.Tensor:
        return self.zeros(shape, np.float32)

    def other_float(self, *shape: int) -> accelkit.Tensor:
        """Zeros of a float dtype other than F32 that the backend has (F16, else F64): for
        dtype-mismatch cases."""
        dtype = DType.F16 if DType.F16 in self.backend.supported_dtypes else DType.F64
        return self.zeros(shape, dtype.to_numpy())

    def i32(self, *shape: int) -> accelkit.Tensor:
        return self.zeros(shape, np.int32)

    def i8(self, *shape: int) -> accelkit.Tensor:
        return self.zeros(shape, np.int8)

    def u8(self, *shape: int) -> accelkit.Tensor:
        return self.zeros(shape, np.uint8)

    def cache(self) -> tuple[accelkit.Tensor, accelkit.Tensor]:
        """An empty paged K/V cache pair: 4 blocks of 2 slots, 2 kv heads of 8."""
        return self.f32(4, 2, 2, 8), self.f32(4, 2, 2, 8)

    def data(self, shape: tuple[int, ...], dtype: DType, scale: float = 1.0) -> Array:
        """Random values already rounded to ``dtype`` (so the reference sees what the kernels
        see), returned as float64."""
        values = self.rng.standard_normal(shape) * scale
        return values.astype(dtype.to_numpy()).astype(np.float64)

    async def both(self, op: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``op`` as the backend prefers it and composed; check each took its route (fused
        where the backend has a fused kernel for ``op``); return host results."""
        results = []
        preferred = "fused" if op in self.fused.ops else "composed"
        for dispatcher, route in ((self.fused, preferred), (self.composed, "composed")):
            out = getattr(dispatcher, op)(*args, **kwargs)
            assert dispatcher.last_route is not None
            assert (dispatcher.last_route.op, dispatcher.last_route.route) == (op, route)
            if isinstance(out, tuple):
                results.append(tuple([await o.to_host() for o in out]))
            else:
                results.append(await out.to_host())
        return results


@pytest.fixture(params=conformance_backends())
async def env(request: pytest.FixtureRequest, anyio_backend: str) -> AsyncIterator[Env]:
    """Each conformance backend, opened by name; ``anyio_backend`` (tests/conftest.py) runs each
    test under asyncio and under trio. A test parametrized by a ``dtype`` the backend has no
    tensors of is skipped here, with the reason."""
    callspec = getattr(request.node, "callspec", None)
    dtype = callspec.params.get("dtype") if callspec is not None else None
    async with accelkit.open_backend(request.param) as backend:
        if dtype is not None and dtype not in backend.supported_dtypes:
            pytest.skip(f"{backend.name} has no {dtype.value} tensors on {backend.device}")
        yield Env(backend)


def cpu_only(env: Env) -> None:
    if env.backend.name != "cpu":
        pytest.skip("tests the CPU backend's NumPy kernels")


def assert_close(actual: Array, expected: Array, dtype: DType, atol_scale: float = 1.0) -> None:
    rtol, atol = TOL[dtype]
    assert actual.dtype == dtype.to_numpy()
    np.testing.assert_allclose(
        actual.astype(np.float64), expected, rtol=rtol, atol=atol * atol_scale
    )


def rms_ref(x: Array, w: Array | None, eps: float) -> Array:
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    result: Array = y if w is None else y * w
    return result


def softmax_ref(s: Array) -> Array:
    e = np.exp(s - np.max(s, axis=-1, keepdims=True))
    result: Array = e / np.sum(e, axis=-1, keepdims=True)
    return result


def attention_ref(q: Array, k: Array, v: Array, scale: float, mask: Array | None = None) -> Array:
    """[B, H, Sq, D] with grouped KV heads; ``mask`` bool [.., Sq, Skv] (True = visible)."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    result: Array = softmax_ref(s) @ v
    return result


# -- the interface --------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_names_and_capabilities(env: Env) -> None:
    assert {
        "rms_norm_residual",
        "paged_attention",
        "quantized_linear",
        "sample_token",
    } <= KERNEL_OPS
    assert len(KERNEL_OPS) == 12
    kernel_ops = env.backend.kernel_ops
    assert kernel_ops is not None
    # The fused ops a backend claims are exactly those its FusedKernels overrides (the rest run
    # composed), and the KernelOps names never appear among the TensorOps names it claims.
    assert kernel_ops.ops <= KERNEL_OPS
    assert env.backend.capabilities.fused_ops == kernel_ops.ops
    assert not env.backend.capabilities.ops & (KERNEL_OPS - TENSOR_OPS)
    assert KernelOps(env.backend, _NormsOnly(kernel_ops.kernels)).ops == {
        "rms_norm",
        "rms_norm_residual",
        "layer_norm",
    }
    assert KernelOps(env.backend, ComposedOnly(env.backend.tensor_ops.kernels)).ops == set()


def require_fused(env: Env, *ops: str) -> None:
    """Skip unless the backend has a fused kernel for every op (a test of routing between a
    backend's fused kernels and the composition needs some)."""
    missing = sorted(set(ops) - env.backend.kernel_ops.ops)
    if missing:
        pytest.skip(f"{env.backend.name} has no fused kernel for {', '.join(missing)}")


class _NormsOnly(FusedKernels):
    """A backend's fused norms and nothing else: the other ops keep FusedKernels' defaults."""

    def __init__(self, full: FusedKernels) -> None:
        super().__init__(full.backend)
        self.full = full

    def empty(self, shape: tuple[int, ...], dtype: DType) -> accelkit.Tensor:
        return self.full.empty(shape, dtype)

    def view(self, x: accelkit.Tensor, shape: tuple[int, ...]) -> accelkit.Tensor:
        return self.full.view(x, shape)

    def rms_norm(self, *args: Any) -> None:
        self.full.rms_norm(*args)

    def rms_norm_residual(self, *args: Any) -> None:
        self.full.rms_norm_residual(*args)

    def layer_norm(self, *args: Any) -> None:
        self.full.layer_norm(*args)


# -- norms ----------------------------------------------------------------------------------------
@pytest.mark.anyio
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("with_weight", [True, False])
async def test_rms_norm(env: Env, dtype: DType, with_weight: bool) -> None:
    x, w = env.data((3, 4, 64), dtype), env.data((64,), dtype)
    weight = env.t(w, dtype) if with_weight else None
    expected = rms_ref(x, w if with_weight else None, 1e-5)
    for got in await env.both("rms_norm", env.t(x, dtype), weight, eps=1e-5):
        assert_close(got, expected, dtype)


@pytest.mark.anyio
@pytest.mark.parametrize("dtype", FLOATS)
async def test_rms_norm_residual(env: Env, dtype: DType) -> None:
    x, r, w = env.data((2, 5, 32), dtype), env.data((2, 5, 32), dtype), env.data((32,), dtype)
    summed = (x + r).astype(dtype.to_numpy()).astype(np.float64)
    fused, composed = await env.both(
        "rms_norm_residual", env.t(x, dtype), env.t(r, dtype), env.t(w, dtype)
    )
    for normed_got, summed_got in (fused, composed):
        assert_close(summed_got, x + r, dtype)
        assert_close(normed_got, rms_ref(summed, w, 1e-6), dtype)
    # normed is computed from summed as stored, so both routes agree to the bit
    np.testing.assert_array_equal(fused[1], composed[1])


@pytest.mark.anyio
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("affine", [True, False])
async def test_layer_norm(env: Env, dtype: DType, affine: bool) -> None:
    x = env.data((6, 48), dtype, scale=3.0) + 2.0
    x = x.astype(dtype.to_numpy()).astype(np.float64)
    w, b = env.data((48,), dtype), env.data((48,), dtype)
    xc = x - x.mean(-1, keepdims=True)
    expected = xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + 1e-5)
    if affine:
        expected = expected * w + b
    args = (env.t(w, dtype), env.t(b, dtype)) if affine else (None, None)
    for got in await env.both("layer_norm", env.t(x, dtype), *args):
        assert_close(got, expected, dtype, atol_scale=2.0)


# -- positions ------------------------------------------------------------------------------------
def rotary_ref(x: Array, positions: Array, base: float) -> Array:
    """The Hugging Face Llama formula: ``x * cos + rotate_half(x) * sin``."""
    d = x.shape[-1]
    inv_freq = 1.0 / base ** (np.arange(0, d, 2) / d)
    angles = positions[..., None].astype(np.float64) * inv_freq
    emb = np.concatenate([angles, angles], axis=-1)
    if emb.ndim == 3:  # per-batch positions [B, S, D] -> [B, 1, S, D]
        emb = emb[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    result: Array = x * np.cos(emb) + np.concatenate([-x2, x1], axis=-1) * np.sin(emb)
    return result


@pytest.mark.anyio
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("where", ["arange", "offset", "positions", "batch_positions"])
async def test_rotary_embedding(env: Env, dtype: DType, where: str) -> None:
    b, h, s, d = 2, 3, 5, 16
    x = env.data((b, h, s, d), dtype)
    kwargs: dict[str, Any] = {"base": 500.0}
    pos = np.arange(s)
    if where == "offset":
        kwargs["offset"], pos = 7, np.arange(7, 7 + s)
    elif where == "positions":
        pos = np.array([3, 0, 9, 4, 20], np.int32)
        kwargs["positions"] = env.t(pos)
    elif where == "batch_positions":
        pos = np.array([[0, 1, 2, 3, 4], [11, 12, 13, 14, 15]], np.int64)
        kwargs["positions"] = env.t(pos)
    expected = rotary_ref(x, pos, 500.0)
    for got in await env.both("rotary_embedding", env.t(x, dtype), **kwargs):
        assert_close(got, expected, dtype)


@pytest.mark.anyio
async def test_rotary_scores_depend_only_on_relative_position(env: Env) -> None:
    q, k = env.data((1, 1, 1, 8), DType.F32), env.data((1, 1, 1, 8), DType.F32)

    async def score(m: int, n: int) -> float:
        qr = env.fused.rotary_embedding(env.t(q, DType.F32), offset=m)
        kr = env.fused.rotary_embedding(env.t(k, DType.F32), offset=n)
        return float(np.sum(await qr.to_host() * await kr.to_host()))

    assert await score(3, 1) == pytest.approx(await score(12, 10), rel=1e-5)


# -- attention ------------------------------------------------------------------------------------
@pytest.mark.anyio
@pytest.mark.parametrize("dtype", [DType.F32, DType.F16])
@pytest.mark.parametrize("causal", [False, True])
async def test_attention(env: Env, dtype: DType, causal: bool) -> None:
    q, k, v = (
        env.data((2, 4, 3, 8), dtype),
        env.data((2, 2, 5, 8), dtype),
        env.data((2, 2, 5, 8), dtype),
    )
    mask = np.tril(np.ones((3, 5), bool), k=2) if causal else None
    expected = attention_ref(q, k, v, 0.25, mask)
    for got in await env.both(
        "attention", env.t(q, dtype), env.t(k, dtype), env.t(v, dtype), scale=0.25, causal=causal
    ):
        assert_close(got, expected, dtype)


def paged_case(env: Env, dtype: DType) -> tuple[dict[str, Array], list[Array]]:
    """3 sequences (lengths 5, 0, 10) in a cache of 8 blocks of 4 slots, 4 query heads over 2
    KV heads; unused block-table entries are -1. Also returns each sequence's dense keys."""
    num_blocks, block_size, hk, d = 8, 4, 2, 8
    lens = np.array([5, 0, 10], np.int32)
    table = np.array([[6, 2, -1], [-1, -1, -1], [1, 7, 3]], np.int32)
    arrays = {
        "q": env.data((3, 4, d), dtype),
        "k_cache": env.data((num_blocks, block_size, hk, d), dtype),
        "v_cache": env.data((num_blocks, block_size, hk, d), dtype),
        "block_table": table,
        "context_lens": lens,
    }
    return arrays, [table[i, : -(-n // block_size)] for i, n in enumerate(lens)]


def gather_ref(cache: Array, blocks: Array, n: int) -> Array:
    """Tokens 0..n-1 of one sequence: [n, kv_heads, head_dim] -> [1, kv_heads, n, head_dim]."""
    rows = [cache[blocks[t // cache.shape[1]], t % cache.shape[1]] for t in range(n)]
    dense = np.stack(rows) if rows else np.zeros((0, *cache.shape[2:]))
    return np.swapaxes(dense, 0, 1)[None]


@pytest.mark.anyio
@pytest.mark.parametrize("dtype", [DType.F32, DType.F16])
async def test_paged_attention(env: Env, dtype: DType) -> None:
    a, blocks = paged_case(env, dtype)
    tensors = [
        env.t(a["q"], dtype),
        env.t(a["k_cache"], dtype),
        env.t(a["v_cache"], dtype),
        env.t(a["block_table"]),
        env.t(a["context_lens"]),
    ]
    fused, composed = await env.both("paged_attention", *tensors)
    for i, n in enumerate(a["context_lens"]):
        k = gather_ref(a["k_cache"], blocks[i], int(n))
        v = gather_ref(a["v_cache"], blocks[i], int(n))
        if n == 0:
            expected = np.zeros((4, 8))
        else:
            expected = attention_ref(a["q"][i][None, :, None], k, v, 8**-0.5)[0, :, 0]
            # ... which is also plain attention over the gathered context
            dense = env.fused.attention(
                env.t(a["q"][i][None, :, None], dtype), env.t(k, dtype), env.t(v, dtype)
            )
            assert_close((await dense.to_host())[0, :, 0], expected, dtype)
        assert_close(fused[i], expected, dtype)
        assert_close(composed[i], expected, dtype)


@pytest.mark.anyio
async def test_paged_attention_with_an_empty_block_table(env: Env) -> None:
    q, (k_cache, v_cache) = env.t(env.data((2, 4, 8), DType.F32), DType.F32), env.cache()
    for got in await env.both("paged_attention", q, k_cache, v_cache, env.i32(2, 0), env.i32(2)):
        np.testing.assert_array_equal(got, np.zeros((2, 4, 8), np.float32))


@pytest.mark.anyio
@pytest.mark.parametrize("route", ["fused", "composed"])
async def test_paged_attention_bad_block_id_is_reported_when_awaited(env: Env, route: str) -> None:
    a, _ = paged_case(env, DType.F32)
    a["block_table"][2, 1] = 99
    out = getattr(env, route).paged_attention(*(env.t(v) for v in a.values()))
    with pytest.raises(InvalidArgumentError):
        await out.to_host()


@pytest.mark.anyio
async def test_paged_attention_context_too_long_is_reported_when_awaited(env: Env) -> None:
    a, _ = paged_case(env, DType.F32)
    a["context_lens"][0] = 13  # 3 blocks of 4 hold 12
    # the five tensors: mypy cannot tell that the starred generator stops before scale
    out = env.fused.paged_attention(*(env.t(v) for v in a.values()))  # type: ignore[arg-type]
    # A fused kernel names the culprit; the composition reports the block table's padding that
    # the too-long context made it read (an index error of its gather).
    fused = "paged_attention" in env.fused.ops
    with pytest.raises(InvalidArgumentError, match="context_lens" if fused else "indices"):
        await out.to_host()


@pytest.mark.anyio
@pytest.mark.parametrize("route", ["fused", "composed"])
@pytest.mark.parametrize("length", [13, -1])
async def test_paged_attention_lengths_out_of_range_are_reported_on_both_routes(
    env: Env, route: str, length: int
) -> None:
    """With a block table of valid ids only (no padding for the gather to trip on), the
    composition cut a length past the table to it and gave zeros for a negative one."""
    a, _ = paged_case(env, DType.F32)
    a["block_table"] = np.maximum(a["block_table"], 0)
    a["context_lens"][0] = length  # 3 blocks of 4 hold 12
    out = getattr(env, route).paged_attention(*(env.t(v) for v in a.values()))
    with pytest.raises(InvalidArgumentError):
        await out.to_host()


# -- activations ----------------------------------------------------------------------------------
@pytest.mark.anyio
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("size", [40, 1 << 16])  # small (NumPy) and large (numexpr, off-thread)
async def test_silu_mul(env: Env, dtype: DType, size: int) -> None:
    g, u = env.data((size,), dtype, 3.0), env.data((size,), dtype)
    expected = g / (1 + np.exp(-g)) * u
    for got in await env.both("silu_mul", env.t(g, dtype), env.t(u, dtype)):
        assert_close(got, expected, dtype)


@pytest.mark.anyio
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
async def test_gelu(env: Env, dtype: DType, approximate: str) -> None:
    x = env.data((7, 9), dtype, 2.0)
    if approximate == "none":
        expected = 0.5 * x * (1 + erf(x / np.sqrt(2)))
    else:
        expected = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    for got in await env.both("gelu", env.t(x, dtype), approximate):
        assert_close(got, expected, dtype)


# -- linear ---------------------------------------------------------------------------------------
@pytest.mark.anyio
@pytest.mark.parametrize("dtype", [DType.F32, DType.F16])
async def test_linear(env: Env, dtype: DType) -> None:
    x, w, b = env.data((2, 3, 16), dtype), env.data((5, 16), dtype), env.data((5,), dtype)
    for got in await env.both("linear", env.t(x, dtype), env.t(w, dtype), env.t(b, dtype)):
        assert_close(got, x @ w.T + b, dtype, atol_scale=4.0)


def dequantize_ref(q: Array, s: Array, fmt: str) -> Array:
    """Element by element, from the format's description (not from accelkit.quant)."""
    n_out, n_blocks = s.shape
    w = np.empty((n_out, n_blocks * 32))
    for o in range(n_out):
        for blk in range(n_blocks):
            for j in range(32):
                if fmt == "q8_0":
                    value = int(q[o, 32 * blk + j])
                else:
                    byte = int(q[o, 16 * blk + j % 16])
                    value = (byte & 0x0F if j < 16 else byte >> 4) - 8
                w[o, 32 * blk + j] = float(s[o, blk]) * value
    return w


@pytest.mark.anyio
@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.BF16])
@pytest.mark.parametrize("with_bias", [True, False])
async def test_quantized_linear(env: Env, fmt: QuantFormat, dtype: DType, with_bias: bool) -> None:
    # GGML's f16 scales where the backend has F16 tensors, else f32 ones
    f16 = DType.F16 in env.backend.supported_dtypes
    qweight, scales = quantize(
        env.rng.standard_normal((24, 96)), fmt, scale_dtype=np.float16 if f16 else np.float32
    )
    x, b = env.data((2, 3, 96), dtype), env.data((24,), dtype)
    expected = x @ dequantize_ref(qweight, scales, fmt).T + (b if with_bias else 0.0)
    bias = env.t(b, dtype) if with_bias else None
    results = await env.both(
        "quantized_linear", env.t(x, dtype), env.t(qweight), env.t(scales), bias, format=fmt
    )
    for got in results:
        assert got.shape == (2, 3, 24)
        assert_close(got, expected, dtype, atol_scale=10.0)


@pytest.mark.anyio
async def test_quantized_linear_in_slabs(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_only(env)
    # Expand at most 2 rows of 64 at a time: 5 slabs, the last one short.
    from accelkit._core.host_kernels import fused

    monkeypatch.setattr(fused, "_DEQUANT_CHUNK_ELEMS", 128)
    qweight, scales = quantize(env.rng.standard_normal((9, 64)).astype(np.float32), "q4_0")
    x = env.data((4, 64), DType.F32)
    got = env.fused.quantized_linear(
        env.t(x, DType.F32), env.t(qweight), env.t(scales), format="q4_0"
    )
    expected = x @ dequantize_ref(qweight, scales, "q4_0").T
    assert_close(await got.to_host(), expected, DType.F32)


# -- sampling -------------------------------------------------------------------------------------
@pytest.mark.anyio
@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.F64])
async def test_argmax_and_greedy(env: Env, dtype: DType) -> None:
    logits = env.data((5, 37), dtype)
    expected = np.argmax(logits, axis=-1)
    for got in await env.both("argmax", env.t(logits, dtype)):
        assert got.dtype == np.int64
        assert got.tolist() == expected.tolist()
    for got in await env.both("sample_token", env.t(logits, dtype), temperature=0.0, seed=3):
        assert got.tolist() == expected.tolist()
    one_row = await env.both("sample_token", env.t(logits[2], dtype), temperature=0.0)
    for got in one_row + await env.both("argmax", env.t(logits[2], dtype)):
        assert got.shape == ()
        assert int(got) == expected[2]


@pytest.mark.anyio
@pytest.mark.parametrize("top_k", [1, 3])
async def test_top_k_picks_only_among_the_k_largest(env: Env, top_k: int) -> None:
    logits = env.rng.permutation(40).reshape(2, 20).astype(np.float32) / 4  # distinct values
    allowed = [set(np.argsort(-row)[:top_k]) for row in logits]
    seen: list[set[int]] = [set(), set()]
    for seed in range(40):
        for got in await env.both(
            "sample_token", env.t(logits), temperature=5.0, top_k=top_k, seed=seed
        ):
            for row, token in enumerate(got.tolist()):
                assert token in allowed[row]
                seen[row].add(token)
    assert seen == allowed  # with a high temperature every allowed token turns up


@pytest.mark.anyio
@pytest.mark.parametrize(("top_p", "nucleus"), [(0.7, {0, 1}), (0.85, {0, 1, 2}), (0.4, {0})])
async def test_top_p_keeps_the_smallest_set_reaching_p(
    env: Env, top_p: float, nucleus: set[int]
) -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
    seen: set[int] = set()
    for seed in range(60):
        for got in await env.both("sample_token", env.t(logits), top_p=top_p, seed=seed):
            seen.add(int(got))
    assert seen == nucleus


@pytest.mark.anyio
async def test_sampling_is_deterministic_with_a_seed_and_routes_agree(env: Env) -> None:
    logits = env.t(env.data((6, 300), DType.F32, 2.0), DType.F32)
    settings: list[dict[str, Any]] = [
        {},
        {"top_k": 20},
        {"top_p": 0.9, "temperature": 0.7},
        {"top_k": 50, "top_p": 0.8},
    ]
    for kwargs in settings:
        first = await env.both("sample_token", logits, seed=11, **kwargs)
        again = await env.both("sample_token", logits, seed=11, **kwargs)
        assert first[0].tolist() == again[0].tolist() == first[1].tolist() == again[1].tolist()
    draws = {
        tuple((await env.fused.sample_token(logits, seed=s).to_host()).tolist()) for s in range(5)
    }
    assert len(draws) > 1


@pytest.mark.anyio
@pytest.mark.parametrize("route", ["fused", "composed"])
async def test_sampling_follows_the_softmax(env: Env, route: str) -> None:
    logits = np.array([1.0, 0.5, 0.0, -0.5, 2.0], np.float32)
    temperature, rows, seeds = 0.8, 500, 8
    batch = env.t(np.tile(logits, (rows, 1)))
    dispatcher = getattr(env, route)
    tokens = [
        await dispatcher.sample_token(batch, temperature=temperature, seed=s).to_host()
        for s in range(seeds)
    ]
    freq = np.bincount(np.concatenate(tokens), minlength=5) / (rows * seeds)
    expected = softmax_ref(logits.astype(np.float64) / temperature)
    # 4000 draws: the standard error of each frequency is below 0.008
    np.testing.assert_allclose(freq, expected, atol=0.035)


@pytest.mark.anyio
async def test_repetition_penalty(env: Env) -> None:
    logits = np.array([[1.0, 0.5, 2.0, -1.0], [-1.0, -2.0, -0.5, -3.0]], np.float32)
    previous = np.array([[2, -1, -1], [2, 2, -1]], np.int32)  # -1: padding
    penalized = logits.copy()
    penalized[0, 2] = 2.0 / 4.0  # positive: divided
    penalized[1, 2] = -0.5 * 4.0  # negative: multiplied
    for got in await env.both(
        "sample_token",
        env.t(logits),
        temperature=0.0,
        repetition_penalty=4.0,
        previous_tokens=env.t(previous),
    ):
        assert got.tolist() == np.argmax(penalized, axis=-1).tolist() == [0, 0]
    # without the penalty, token 2 wins both rows; with it but no history, too
    for got in await env.both(
        "sample_token", env.t(logits), temperature=0.0, previous_tokens=env.t(previous)
    ):
        assert got.tolist() == [2, 2]
    # and it applies before sampling: token 2's share drops from 0.61 to softmax([1, .5, .04,
    # -1])[2] = 0.18 (400 draws: standard error 0.02)
    rows = np.tile(logits[0], (400, 1))
    for got in await env.both(
        "sample_token",
        env.t(rows),
        repetition_penalty=50.0,
        previous_tokens=env.t(np.full((400, 1), 2)),
        seed=1,
    ):
        share = softmax_ref(np.array([1.0, 0.5, 2.0 / 50.0, -1.0]))[2]
        assert abs(np.mean(got == 2) - share) < 0.07


@pytest.mark.anyio
@pytest.mark.parametrize("route", ["fused", "composed"])
@pytest.mark.parametrize("token", [9, 4])  # 4: the vocabulary's size (composed: skipped)
async def test_previous_token_out_of_vocab_is_reported_when_awaited(
    env: Env, route: str, token: int
) -> None:
    out = getattr(env, route).sample_token(
        env.t(np.zeros((1, 4), np.float32)),
        repetition_penalty=2.0,
        previous_tokens=env.t(np.array([[token]])),
        seed=0,
    )
    with pytest.raises(InvalidArgumentError):
        await out.to_host()


@pytest.mark.anyio
async def test_large_sampling_runs_off_the_loop_thread(env: Env) -> None:
    logits = env.t(env.data((16, 8192), DType.F32, 3.0), DType.F32)
    fused, composed = await env.both("sample_token", logits, top_k=40, top_p=0.95, seed=7)
    assert fused.tolist() == composed.tolist()


# -- bad input ------------------------------------------------------------------------------------
BadCall = Callable[[KernelOps, "Env"], object]
BAD_CALLS: dict[str, BadCall] = {
    "rms_norm weight shape": lambda d, e: d.rms_norm(e.f32(2, 8), e.f32(7)),
    "rms_norm int x": lambda d, e: d.rms_norm(e.i32(2, 8)),
    "rms_norm 0-d": lambda d, e: d.rms_norm(e.f32()),
    "rms_norm eps": lambda d, e: d.rms_norm(e.f32(2, 8), eps=0.0),
    "rms_norm weight dtype": lambda d, e: d.rms_norm(e.f32(2, 8), e.other_float(8)),
    "residual shape": lambda d, e: d.rms_norm_residual(e.f32(2, 8), e.f32(1, 8)),
    "residual dtype": lambda d, e: d.rms_norm_residual(e.f32(2, 8), e.other_float(2, 8)),
    "layer_norm bias": lambda d, e: d.layer_norm(e.f32(2, 8), e.f32(8), e.f32(4)),
    "rotary odd head_dim": lambda d, e: d.rotary_embedding(e.f32(1, 2, 3, 7)),
    "rotary 3-d": lambda d, e: d.rotary_embedding(e.f32(2, 3, 8)),
    "rotary float positions": lambda d, e: d.rotary_embedding(e.f32(1, 2, 3, 8), e.f32(3)),
    "rotary positions length": lambda d, e: d.rotary_embedding(e.f32(1, 2, 3, 8), e.i32(4)),
    "rotary positions+offset": lambda d, e: d.rotary_embedding(e.f32(1, 2, 3, 8), e.i32(3), 1e4, 2),
    "rotary base": lambda d, e: d.rotary_embedding(e.f32(1, 2, 3, 8), base=0.0),
    "rotary offset": lambda d, e: d.rotary_embedding(e.f32(1, 2, 3, 8), offset=-1),
    "rotary offset beyond i64": lambda d, e: d.rotary_embedding(
        e.f32(1, 2, 3, 8), offset=2**63 - 2
    ),
    "attention scale inf": lambda d, e: d.attention(*[e.f32(1, 2, 2, 8)] * 3, scale=float("inf")),
    "attention 3-d": lambda d, e: d.attention(e.f32(2, 3, 8), e.f32(2, 3, 8), e.f32(2, 3, 8)),
    "attention heads": lambda d, e: d.attention(e.f32(1, 3, 2, 8), *[e.f32(1, 2, 2, 8)] * 2),
    "attention dtype": lambda d, e: d.attention(
        e.f32(1, 2, 2, 8), e.other_float(1, 2, 2, 8), e.f32(1, 2, 2, 8)
    ),
    "paged q 4-d": lambda d, e: d.paged_attention(
        e.f32(1, 2, 1, 8), *e.cache(), e.i32(1, 2), e.i32(1)
    ),
    "paged float table": lambda d, e: d.paged_attention(
        e.f32(1, 2, 8), *e.cache(), e.f32(1, 2), e.i32(1)
    ),
    "paged lens batch": lambda d, e: d.paged_attention(
        e.f32(1, 2, 8), *e.cache(), e.i32(1, 2), e.i32(2)
    ),
    "paged v shape": lambda d, e: d.paged_attention(
        e.f32(1, 2, 8), e.cache()[0], e.f32(4, 2, 2, 4), e.i32(1, 2), e.i32(1)
    ),
    "paged head_dim": lambda d, e: d.paged_attention(
        e.f32(1, 2, 4), *e.cache(), e.i32(1, 2), e.i32(1)
    ),
    "paged heads": lambda d, e: d.paged_attention(
        e.f32(1, 3, 8), *e.cache(), e.i32(1, 2), e.i32(1)
    ),
    "paged cache dtype": lambda d, e: d.paged_attention(
        e.other_float(1, 2, 8), *e.cache(), e.i32(1, 2), e.i32(1)
    ),
    "silu_mul shape": lambda d, e: d.silu_mul(e.f32(2, 8), e.f32(2, 4)),
    "silu_mul dtype": lambda d, e: d.silu_mul(e.f32(2, 8), e.other_float(2, 8)),
    "silu_mul int": lambda d, e: d.silu_mul(e.i32(2, 8), e.i32(2, 8)),
    "gelu approximate": lambda d, e: d.gelu(e.f32(3), "fast"),  # type: ignore[arg-type]
    "gelu int": lambda d, e: d.gelu(e.i32(3)),
    "linear in": lambda d, e: d.linear(e.f32(2, 8), e.f32(4, 7)),
    "qlinear in not /32": lambda d, e: d.quantized_linear(e.f32(2, 48), e.i8(4, 48), e.f32(4, 1)),
    "qlinear x vs qweight": lambda d, e: d.quantized_linear(e.f32(2, 32), e.i8(4, 64), e.f32(4, 2)),
    "qlinear q8 dtype": lambda d, e: d.quantized_linear(e.f32(2, 64), e.u8(4, 64), e.f32(4, 2)),
    "qlinear q4 in": lambda d, e: d.quantized_linear(
        e.f32(2, 64), e.u8(4, 64), e.f32(4, 2), None, "q4_0"
    ),
    "qlinear scales shape": lambda d, e: d.quantized_linear(e.f32(2, 64), e.i8(4, 64), e.f32(4, 1)),
    "qlinear scales dtype": lambda d, e: d.quantized_linear(e.f32(2, 64), e.i8(4, 64), e.i32(4, 2)),
    "qlinear format": lambda d, e: d.quantized_linear(
        e.f32(2, 64),
        e.i8(4, 64),
        e.f32(4, 2),
        None,
        "q5_0",  # type: ignore[arg-type]
    ),
    "qlinear int x": lambda d, e: d.quantized_linear(e.i32(2, 64), e.i8(4, 64), e.f32(4, 2)),
    "qlinear bias": lambda d, e: d.quantized_linear(
        e.f32(2, 64), e.i8(4, 64), e.f32(4, 2), e.f32(3)
    ),
    "argmax 3-d": lambda d, e: d.argmax(e.f32(2, 2, 4)),
    "argmax int": lambda d, e: d.argmax(e.i32(4)),
    "argmax empty vocab": lambda d, e: d.argmax(e.f32(2, 0)),
    "sample temperature": lambda d, e: d.sample_token(e.f32(4), temperature=-1.0),
    "sample top_p 0": lambda d, e: d.sample_token(e.f32(4), top_p=0.0),
    "sample top_p > 1": lambda d, e: d.sample_token(e.f32(4), top_p=1.5),
    "sample top_k": lambda d, e: d.sample_token(e.f32(4), top_k=-1),
    "sample penalty": lambda d, e: d.sample_token(e.f32(4), repetition_penalty=0.0),
    "sample seed": lambda d, e: d.sample_token(e.f32(4), seed=-1),
    "sample previous shape": lambda d, e: d.sample_token(e.f32(2, 4), previous_tokens=e.i32(3, 2)),
    "sample previous float": lambda d, e: d.sample_token(e.f32(2, 4), previous_tokens=e.f32(2, 2)),
    "sample int logits": lambda d, e: d.sample_token(e.i32(2, 4)),
}


@pytest.mark.anyio
@pytest.mark.parametrize("route", ["fused", "composed"])
@pytest.mark.parametrize("case", list(BAD_CALLS))
async def test_bad_input_raises_before_anything_runs(env: Env, route: str, case: str) -> None:
    dispatcher = getattr(env, route)
    with pytest.raises(InvalidArgumentError):
        BAD_CALLS[case](dispatcher, env)
    assert dispatcher.routes == {}


# -- the dispatcher -------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_dispatcher_falls_back_where_a_group_is_missing(
    env: Env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    require_fused(env, "rms_norm", "rms_norm_residual", "layer_norm")
    partial = KernelOps(env.backend, _NormsOnly(env.backend.kernel_ops.kernels))
    monkeypatch.setattr(env, "fused", partial)
    x = env.t(env.data((2, 8), DType.F32), DType.F32)
    with caplog.at_level(logging.DEBUG, logger="accelkit.kernel_ops"):
        env.fused.rms_norm(x)
        assert env.fused.last_route is not None
        assert env.fused.last_route.route == "fused"
        assert env.fused.last_route.backend == env.backend.name
        y = env.fused.silu_mul(x, x)
    # silu_mul set a new last_route: mypy keeps its narrowing to "fused" across the call
    assert env.fused.last_route.route == "composed"  # type: ignore[comparison-overlap]
    assert "no fused silu_mul" in env.fused.last_route.reason
    assert env.fused.routes == {
        "rms_norm": {"fused": 1, "composed": 0},
        "silu_mul": {"fused": 0, "composed": 1},
    }
    assert f"silu_mul on {env.backend.name}: composed" in caplog.text
    assert f"rms_norm on {env.backend.name}: fused" in caplog.text
    assert (await y.to_host()).shape == (2, 8)
    # A backend with no fused kernel at all:
    monkeypatch.setattr(
        env, "fused", KernelOps(env.backend, ComposedOnly(env.backend.tensor_ops.kernels))
    )
    env.fused.argmax(x)
    assert env.fused.last_route.route == "composed"


@pytest.mark.anyio
async def test_dispatcher_retries_a_refused_fused_call_composed(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_fused(env, "gelu")
    kernels = env.backend.kernel_ops.kernels

    def refuse(*args: object, **kwargs: object) -> None:
        raise UnsupportedOperationError("no bf16 gelu here")

    monkeypatch.setattr(kernels, "gelu", refuse)
    dtype = DType.BF16 if DType.BF16 in env.backend.supported_dtypes else DType.F32
    x = env.data((5,), dtype)
    got = await env.fused.gelu(env.t(x, dtype)).to_host()
    assert env.fused.last_route is not None
    assert env.fused.last_route.route == "composed"
    assert "no bf16 gelu here" in env.fused.last_route.reason
    assert_close(got, 0.5 * x * (1 + erf(x / np.sqrt(2))), dtype)


@pytest.mark.anyio
async def test_dispatcher_checks_its_arguments_and_the_backend_state(env: Env) -> None:
    with pytest.raises(InvalidArgumentError, match="prefer"):
        env.backend.kernel_ops.twin("fastest")  # type: ignore[arg-type]
    x = env.t(np.ones((2, 4), np.float32))
    await env.backend.shutdown()
    # x is stale now (docs/execution-model.md: a tensor never outlives its backend's session)
    with pytest.raises(StaleHandleError, match="shut down"):
        env.fused.rms_norm(x)
