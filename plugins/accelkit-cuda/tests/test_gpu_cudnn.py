"""cuDNN attention and the cuBLAS GEMM path on a GPU (skipped with the reason elsewhere).

The cuDNN tests also skip where the backend's attention engine is not cuDNN (the frontend or its
library absent: ``pip install 'accelkit-cuda[cuda13,cudnn13]'``); the reason names what was missing.
Results are compared with float64 NumPy, tolerances from the dtype's epsilon.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import accelkit as ak
from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]


def _reference(q: Any, k: Any, v: Any, keep: Any) -> Any:
    h, hk = q.shape[1], k.shape[1]
    kk = np.repeat(k.astype(np.float64), h // hk, axis=1)
    vv = np.repeat(v.astype(np.float64), h // hk, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), kk) / np.sqrt(q.shape[-1])
    s = np.where(keep, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.where(keep, np.exp(s - np.where(np.isfinite(m), m, 0)), 0)
    total = p.sum(-1, keepdims=True)
    p = np.where(total > 0, p / np.where(total > 0, total, 1), 0)
    return np.einsum("bhqk,bhkd->bhqd", p, vv)


def _cudnn(backend: Any) -> Any:
    engines = backend.attention_engines
    if engines.engine != "cudnn":
        pytest.skip(f"attention is not on cuDNN here: {engines.unavailable}")
    return engines


async def _twice(backend: Any, call: Any) -> Any:
    """The first call of a shape queues its graph's build; the second (after it) runs on cuDNN."""
    call()
    await backend.synchronize()
    out = call()
    engines = backend.attention_engines
    # When cuDNN declines, the route records why (a composed call leaves last_route alone:
    # KernelOps's own record has the reason then, with cuDNN's refusal in it).
    why = engines.last_route or backend.kernel_ops.last_route
    assert engines.last_route is not None, why
    assert engines.last_route.engine == "cudnn", why
    return out


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("masking", ["causal", "bool", "bool+causal", "bool+causal-square", "none"])
async def test_cudnn_attention_matches_numpy(backend: Any, dtype: str, masking: str) -> None:
    _cudnn(backend)
    f, kops = backend.tensor_factory, backend.kernel_ops
    backend.attention_engines.last_route = None
    rng = np.random.default_rng(1)
    b, h, hk, sq, sk, d = 2, 8, 2, 48, 80, 64
    if masking.endswith("-square"):  # the causal band (top-left) beside the bias
        sq = sk
    qh, kh, vh = (
        rng.standard_normal(s).astype(np.float32)
        for s in ((b, h, sq, d), (b, hk, sk, d), (b, hk, sk, d))
    )
    q, k, v = (f.from_host(x, dtype=dtype) for x in (qh, kh, vh))
    mh = rng.random((b, 1, sq, sk)) < 0.7
    mh[1, 0, 3] = False  # a query that sees no key: zeros
    m = f.from_host(mh)
    causal = "causal" in masking
    keep = np.ones((b, h, sq, sk), bool)
    if causal:
        keep &= np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
    if "bool" in masking:
        keep &= mh
    mask = m if "bool" in masking else None
    out = await _twice(backend, lambda: kops.attention(q, k, v, causal=causal, mask=mask))
    got = (await out.to_host()).astype(np.float64)
    qr, kr, vr = [(await t.to_host()).astype(np.float64) for t in (q, k, v)]
    eps = 2.0**-7 if dtype == "bf16" else 2.0**-10
    np.testing.assert_allclose(got, _reference(qr, kr, vr, keep), atol=8 * eps, rtol=8 * eps)


def _paged_case(
    rng: Any, b: int, hk: int, h: int, d: int, bs: int, lens: list[int], dtype: Any
) -> list[Any]:
    """q, a shuffled paged cache (table entries past each length -1), table and lengths."""
    mb = max(1, -(-max(lens) // bs))
    nb = b * mb + 2
    table = rng.permutation(nb)[: b * mb].reshape(b, mb).astype(np.int32)
    for i, n in enumerate(lens):
        table[i, -(-n // bs) :] = -1
    kc, vc = (rng.standard_normal((nb, bs, hk, d)).astype(dtype) for _ in range(2))
    qh = rng.standard_normal((b, h, d)).astype(dtype)
    return [qh, kc, vc, table, np.array(lens, np.int32)]


def _paged_reference(q: Any, kc: Any, vc: Any, table: Any, lens: Any) -> Any:
    """Decode over the paged cache in float64, from the definition; no key: zeros."""
    b, h, d = q.shape
    bs, hk = kc.shape[1], kc.shape[2]
    want = np.zeros((b, h, vc.shape[3]))
    for i in range(b):
        n = int(lens[i])
        if n == 0:
            continue
        blocks = np.array([table[i, t // bs] for t in range(n)])
        keys, vals = kc[blocks, np.arange(n) % bs], vc[blocks, np.arange(n) % bs]
        for j in range(h):
            s = keys[:, j // (h // hk)] @ q[i, j] / np.sqrt(d)
            p = np.exp(s - s.max())
            want[i, j] = (p / p.sum()) @ vals[:, j // (h // hk)]
    return want


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
async def test_split_kv_decode_matches_numpy(backend: Any, dtype: str) -> None:
    """The split-KV decode kernel (accelkit_cuda.flash_decode) through paged_attention: a long
    sequence (many chunks), a short one, an empty one, 32/8 and 12/1 heads, head dims 128/64."""
    await _split_kv_decode(backend, dtype, False)


# One event loop: the variants' device code is what differs (the route's async path is the
# plain test's, under both loops), and each run opens a backend of its own whose program, with
# the pipelined variants, compiles and is checked cold (the GPU check's time caps).
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_split_kv_decode_pipelined_matches_numpy(anyio_backend: str) -> None:
    """The same, on the pipelined variants, every dtype: they are compiled where asked for
    when a backend opens (sm_80 and newer)."""
    with pytest.MonkeyPatch.context() as m:
        m.setenv("ACCELKIT_CUDA_DECODE_PIPELINE", "1")
        async with ak.open_backend("cuda:0") as piped:
            if not piped.flash_decode.has_pipelined:
                pytest.skip("no pipelined decode variants before compute capability 8.0")
            for dtype in ("f16", "bf16", "f32"):
                await _split_kv_decode(piped, dtype, True)


async def _split_kv_decode(backend: Any, dtype: str, pipelined: bool) -> None:
    decode = backend.flash_decode
    if decode.state == "unavailable":
        pytest.skip(f"the split-KV decode kernel is unavailable: {decode.reason}")
    assert decode.verified, decode.describe()  # its on-device check must pass on a GPU
    assert not decode.pipelined_failure
    decode.pipelined = pipelined  # (plain: whatever ACCELKIT_CUDA_DECODE_PIPELINE says)
    f, kops, engines = backend.tensor_factory, backend.kernel_ops, backend.attention_engines
    rng = np.random.default_rng(4)
    np_dt = np.float32 if dtype == "f32" else np.float16
    eps = {"f16": 2.0**-10, "bf16": 2.0**-7, "f32": 2.0**-23}[dtype]
    for b, h, hk, d, bs, lens in (
        (3, 32, 8, 128, 16, [4096, 37, 0]),
        (2, 12, 1, 64, 8, [1, 700]),
    ):
        host = _paged_case(rng, b, hk, h, d, bs, lens, np_dt)
        args = [f.from_host(x, dtype=dtype) for x in host[:3]]
        args += [f.from_host(x) for x in host[3:]]
        qr, kr, vr = [(await t.to_host()).astype(np.float64) for t in args[:3]]
        want = _paged_reference(qr, kr, vr, host[3], host[4])  # the values as held
        out = kops.paged_attention(*args)
        assert engines.last_route is not None
        assert engines.last_route.engine == "flash_decode", engines.last_route
        assert engines.last_route.reason.endswith(", pipelined") is pipelined  # (d <= 128)
        got = (await out.to_host()).astype(np.float64)
        tol = 2 * (eps + (max(lens) + d) * 2.0**-23) * np.abs(vr).max()
        np.testing.assert_allclose(got, want, atol=tol, rtol=0)
        assert not got[lens.index(0)].any() if 0 in lens else True
    bad = host[3].copy()
    bad[1, 0] = 10_000
    out = kops.paged_attention(*args[:3], f.from_host(bad), args[4])
    with pytest.raises(InvalidArgumentError, match="refers to block 10000"):
        await out.to_host()


async def test_cudnn_paged_attention_matches_numpy(backend: Any) -> None:
    _cudnn(backend)
    f, kops = backend.tensor_factory, backend.kernel_ops
    decode = backend.flash_decode
    if decode is not None:  # it precedes cuDNN where verified
        decode.enabled = False
    try:
        await _cudnn_paged(backend, f, kops)
    finally:
        if decode is not None:
            decode.enabled = True


async def _cudnn_paged(backend: Any, f: Any, kops: Any) -> None:
    rng = np.random.default_rng(2)
    nb, bs, hk, d, b, h = 16, 16, 2, 128, 3, 8
    kc = rng.standard_normal((nb, bs, hk, d)).astype(np.float16)
    vc = rng.standard_normal((nb, bs, hk, d)).astype(np.float16)
    qh = rng.standard_normal((b, h, d)).astype(np.float16)
    table = np.array([[3, 7, 1, -1], [-1, -1, -1, -1], [0, 15, 2, 9]], np.int32)
    lens = np.array([40, 0, 64], np.int32)
    args = [f.from_host(x) for x in (qh, kc, vc, table, lens)]
    out = await _twice(backend, lambda: kops.paged_attention(*args))
    got = (await out.to_host()).astype(np.float64)
    want = np.zeros((b, h, d))
    for i in range(b):
        rows = [(table[i, t // bs], t % bs) for t in range(lens[i])]
        if not rows:
            continue
        keys = np.stack([kc[blk, r] for blk, r in rows]).astype(np.float64)
        vals = np.stack([vc[blk, r] for blk, r in rows]).astype(np.float64)
        for j in range(h):
            s = keys[:, j // (h // hk)] @ qh[i, j].astype(np.float64) / np.sqrt(d)
            p = np.exp(s - s.max())
            want[i, j] = (p / p.sum()) @ vals[:, j // (h // hk)]
    np.testing.assert_allclose(got, want, atol=8 * 2.0**-10, rtol=8 * 2.0**-10)
    assert not got[1].any()


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
async def test_gemms_on_the_workspace_path_match_numpy(backend: Any, dtype: str) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    rng = np.random.default_rng(3)
    xh = rng.standard_normal((3, 64, 96)).astype(np.float32)
    wh = rng.standard_normal((80, 96)).astype(np.float32)
    yh = rng.standard_normal((3, 96, 40)).astype(np.float32)
    x, w, y, x2 = (f.from_host(a, dtype=dtype) for a in (xh, wh, yh, xh[0]))
    xr, wr, yr = [(await t.to_host()).astype(np.float64) for t in (x, w, y)]
    eps = {"f16": 2.0**-10, "bf16": 2.0**-7, "f32": 2.0**-23}[dtype]
    tol = 4 * eps * np.sqrt(96)
    for got, want in (
        (ops.matmul(x2, y), xr[0] @ yr),  # 2-D by batched: cupy.matmul's broadcast
        (ops.linear(x, w), xr @ wr.T),  # the weight's transpose: cuBLAS's op T
        (ops.matmul(x, y), xr @ yr),  # strided batched
    ):
        g = (await got.to_host()).astype(np.float64)
        scale = np.abs(want).max()
        np.testing.assert_allclose(g, want, atol=tol * scale, rtol=tol)
    if dtype == "f32":
        backend.allow_tf32 = True
        try:
            got = (await ops.matmul(x, y).to_host()).astype(np.float64)
        finally:
            backend.allow_tf32 = False
        want = xr @ yr
        # TF32 rounds the inputs to 10-bit mantissas.
        tol = 4 * 2.0**-10 * np.sqrt(96)
        np.testing.assert_allclose(got, want, atol=tol * np.abs(want).max(), rtol=tol)


@pytest.mark.parametrize("d", [32, 64, 128])
async def test_f32_tiled_attention_matches_numpy(backend: Any, d: int) -> None:
    """The register-tiled f32 kernel (accelkit_cuda.flash_simt) through attention: it must pass
    its on-device check on a GPU and serve f32; partial tiles, grouped heads, causal with rows
    that see no key, the transformer block's shape; against float64 NumPy within the kernel's
    own bound (the magnitudes of its sums)."""
    from accelkit_cuda.flash_simt import compare

    simt = backend.flash_simt
    if simt.state == "unavailable":
        pytest.skip(f"the f32 tiled kernel is unavailable: {simt.reason}")
    assert simt.verified, simt.describe()
    f, kops, engines = backend.tensor_factory, backend.kernel_ops, backend.attention_engines
    rng = np.random.default_rng(d)
    for b, h, hk, sq, sk, causal in ((2, 4, 2, 70, 133, False), (1, 2, 1, 97, 45, True),
                                     (4, 8, 8, 256, 256, True)):  # fmt: skip
        q, k, v = (
            rng.standard_normal((b, n, s, d)).astype(np.float32)
            for n, s in ((h, sq), (hk, sk), (hk, sk))
        )
        out = kops.attention(f.from_host(q), f.from_host(k), f.from_host(v), causal=causal)
        assert engines.last_route is not None
        assert engines.last_route.engine == "simt", engines.last_route
        got = await out.to_host()
        assert compare(got, q, k, v, 1.0 / np.sqrt(d), causal) is None


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
async def test_sequence_major_attention_is_read_in_place(backend: Any, dtype: str) -> None:
    """``attention(..., layout="bshd")`` on q [B, S, H, D] and grouped k/v [B, S, Hkv, D] (a
    projection's output reshaped to heads): cuDNN (through the strides) where it serves the
    dtype, else the tensor-core or the tiled f32 kernel once verified, reads and writes them
    in place, and the answer is the head-major reference's, within the kernels' own bounds;
    with a bool mask (cuDNN) a query row that sees no key is zeros in that layout."""
    from accelkit_cuda import flash_attention as fa
    from accelkit_cuda.flash_simt import compare

    f, ops, engines = backend.tensor_factory, backend.tensor_ops, backend.attention_engines
    rng = np.random.default_rng(5)
    b, h, hk, sq, sk, d = 2, 8, 2, 130, 197, 64
    heads = (0, 2, 1, 3)
    host = [
        rng.standard_normal((b, s, n, d)).astype(np.float32)
        for n, s in ((h, sq), (hk, sk), (hk, sk))
    ]
    q, k, v = (f.from_host(a, dtype=dtype) for a in host)
    qr, kr, vr = [(await t.to_host()).astype(np.float64).transpose(heads) for t in (q, k, v)]
    cudnn = dtype != "f32" and backend.capabilities.extra.get("attention_engine") == "cudnn"
    kernel = backend.flash_simt if dtype == "f32" else backend.flash2
    keep = np.ones((b, 1, sq, sk), bool)
    keep[0, 0, 3] = False  # query 3 of batch 0 sees no key
    cases = [(None, True)] + ([(f.from_host(keep), False)] if cudnn else [])
    for mask, causal in cases:
        ops.attention(q, k, v, mask=mask, causal=causal, layout="bshd")
        await backend.synchronize()  # a cuDNN graph is built off the caller's thread first
        out = ops.attention(q, k, v, mask=mask, causal=causal, layout="bshd")
        assert out.shape == (b, sq, h, d)
        route = engines.last_route
        assert route is not None
        if cudnn:
            assert route.engine == "cudnn", route
        elif kernel is not None and kernel.verified:
            assert route.engine == ("simt" if dtype == "f32" else "flash2"), route
        if route.engine in ("cudnn", "simt", "flash2"):
            assert "sequence-major" in route.reason, route
        got = (await out.to_host()).astype(np.float64).transpose(heads)
        if mask is not None:
            assert not got[0, :, 3].any()
            kk, vv = (np.repeat(x, h // hk, axis=1) for x in (kr, vr))
            sc = np.where(keep, qr @ np.swapaxes(kk, -1, -2) / 8.0, -np.inf)
            mx = np.max(sc, -1, keepdims=True)
            e = np.exp(sc - np.where(np.isfinite(mx), mx, 0))
            tot = e.sum(-1, keepdims=True)
            want = np.where(tot > 0, e / np.where(tot > 0, tot, 1), 0) @ vv
            bound = fa.tolerance(DType(dtype), sk, d) * np.abs(vr).max()
            np.testing.assert_array_less(np.abs(got - want), bound)
            continue
        if dtype == "f32":
            assert compare(got.astype(np.float32), qr, kr, vr, 1.0 / 8.0, True) is None
        else:
            want = fa.reference(qr, kr, vr, 1.0 / 8.0, True)
            bound = fa.tolerance(DType(dtype), sk, d) * np.abs(vr).max()
            np.testing.assert_array_less(np.abs(got - want), bound)
