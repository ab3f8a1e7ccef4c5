"""attention's options (causal alignment, sliding window, key lengths of a padded batch, logit
soft-capping, returned weights), through TensorOps and KernelOps, and apply_rotary with
caller-supplied tables (rotate-half and interleaved, partial rotary dimension), against float64
NumPy written here."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from accelkit import ComputeBackend, DType
from accelkit.errors import AccelError, InvalidArgumentError

from .checks import FLOATS, assert_close, fetch, ids, require_dtype, require_op, sample

# A kernel check: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]

Array = np.ndarray[Any, Any]


def _attention(
    q: Array, k: Array, v: Array, *, causal: bool = False, top_left: bool = False,
    window: int | None = None, lengths: Array | None = None, softcap: float | None = None,
) -> tuple[Array, Array]:  # fmt: skip
    """The definition, one score matrix at a time; rows that see no key are zeros."""
    b, h, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    out = np.zeros((b, h, sq, v.shape[3]))
    weights = np.zeros((b, h, sq, sk))
    for bi in range(b):
        for hi in range(h):
            kv = hi // (h // hk)
            s = q[bi, hi].astype(np.float64) @ k[bi, kv].astype(np.float64).T / np.sqrt(d)
            if softcap is not None:
                s = softcap * np.tanh(s / softcap)
            seen = np.ones((sq, sk), bool)
            if causal:
                pos = np.arange(sq)[:, None] + (0 if top_left else sk - sq)
                seen &= np.arange(sk)[None, :] <= pos
                if window is not None:
                    seen &= np.arange(sk)[None, :] > pos - window
            if lengths is not None:
                seen &= np.arange(sk)[None, :] < lengths[bi]
            s = np.where(seen, s, -np.inf)
            for i in range(sq):
                if seen[i].any():
                    e = np.exp(s[i] - s[i].max())
                    weights[bi, hi, i] = e / e.sum()
            out[bi, hi] = weights[bi, hi] @ v[bi, kv].astype(np.float64)
    return out, weights


CASES: list[dict[str, Any]] = [
    {"causal": True, "causal_alignment": "top_left"},
    {"causal": True, "window": 3},
    {"causal": True, "causal_alignment": "top_left", "window": 2},
    {"key_lengths": [5, 0]},
    {"softcap": 2.0},
    {"causal": True, "key_lengths": [3, 7], "softcap": 5.0},
]


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("sq", [4, 7])
async def test_attention_options(backend: ComputeBackend, dtype: DType, case: int, sq: int) -> None:
    require_op(backend, "attention")
    require_dtype(backend, dtype)
    opts = dict(CASES[case])
    q_h = sample((2, 4, sq, 8), dtype, seed=91)
    k_h = sample((2, 2, 7, 8), dtype, seed=92)
    v_h = sample((2, 2, 7, 5), dtype, seed=93)
    f = backend.tensor_factory
    lengths = opts.pop("key_lengths", None)
    if lengths is not None:
        opts["key_lengths"] = f.from_host(np.array(lengths, np.int32))
    q, k, v = f.from_host(q_h), f.from_host(k_h), f.from_host(v_h)
    want, weights = _attention(
        q_h, k_h, v_h, causal=opts.get("causal", False),
        top_left=opts.get("causal_alignment") == "top_left", window=opts.get("window"),
        lengths=None if lengths is None else np.array(lengths), softcap=opts.get("softcap"),
    )  # fmt: skip
    out, got_w = backend.tensor_ops.attention(q, k, v, return_weights=True, **opts)
    assert_close(await fetch(out, dtype), want, dtype, scale=4.0)
    assert_close(await fetch(got_w, dtype), weights, dtype, scale=4.0)
    fused = backend.kernel_ops.attention(q, k, v, **opts)
    assert_close(await fetch(fused, dtype), want, dtype, scale=4.0)
    route = backend.kernel_ops.last_route
    assert route is not None
    assert route.route == "composed"


BSHD_CASES: list[dict[str, Any]] = [
    {},
    {"causal": True},
    {"causal": True, "grouped": True},
    {"causal": True, "sq": 3},  # fewer queries than keys: bottom-right alignment
    {"mask": True},
    {"causal": True, "return_weights": True},
    {"causal": True, "window": 2},
    # head_dim == head_dim_v == 16: what in-place kernels take (CUDA: the tiled f32 kernel,
    # cuDNN for f16/bf16, with the mask too), not only the core's permutes
    {"causal": True, "grouped": True, "wide": True},
    {"mask": True, "wide": True},
]


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize("case", range(len(BSHD_CASES)))
async def test_sequence_major_layout(backend: ComputeBackend, dtype: DType, case: int) -> None:
    """``layout="bshd"``: q [B, Sq, H, D], k/v [B, Skv, Hkv, D], output [B, Sq, H, Dv], the
    same numbers as the head-major call on the transposed tensors (the backend's in-place
    kernel where it has one, else the core's permutes), through TensorOps and KernelOps."""
    require_op(backend, "attention")
    require_dtype(backend, dtype)
    opts = dict(BSHD_CASES[case])
    sq, hk = opts.pop("sq", 6), 2 if opts.pop("grouped", False) else 4
    with_mask = opts.pop("mask", False)
    d, dv = (16, 16) if opts.pop("wide", False) else (8, 5)
    # Sequence-major on the host; the reference reads them transposed to head-major.
    q_h = sample((2, sq, 4, d), dtype, seed=81)
    k_h = sample((2, 6, hk, d), dtype, seed=82)
    v_h = sample((2, 6, hk, dv), dtype, seed=83)
    heads = (0, 2, 1, 3)
    f = backend.tensor_factory
    q, k, v = f.from_host(q_h), f.from_host(k_h), f.from_host(v_h)
    want, weights = _attention(
        q_h.transpose(heads), k_h.transpose(heads), v_h.transpose(heads),
        causal=opts.get("causal", False), window=opts.get("window"),
    )  # fmt: skip
    if with_mask:  # a bool mask [1, H, Sq, Skv]: keys 0 and 3 hidden from every query of
        # head 1, and query 2 of head 3 sees no key at all (zeros, in the output's layout)
        keep = np.ones((1, 4, sq, 6), bool)
        keep[0, 1, :, [0, 3]] = False
        keep[0, 3, 2] = False
        opts["mask"] = f.from_host(keep)
        want = np.stack(
            [_masked(q_h.transpose(heads)[b], k_h.transpose(heads)[b], v_h.transpose(heads)[b],
                     keep[0]) for b in range(2)]
        )  # fmt: skip
    res = backend.tensor_ops.attention(q, k, v, layout="bshd", **opts)
    out = res[0] if isinstance(res, tuple) else res
    assert out.shape == (2, sq, 4, dv)
    assert_close(await fetch(out, dtype), want.transpose(heads), dtype, scale=4.0)
    if isinstance(res, tuple):
        assert res[1].shape == (2, 4, sq, 6)  # the weights keep the scores' layout
        assert_close(await fetch(res[1], dtype), weights, dtype, scale=4.0)
    opts.pop("return_weights", None)
    fused = backend.kernel_ops.attention(q, k, v, layout="bshd", **opts)
    assert_close(await fetch(fused, dtype), want.transpose(heads), dtype, scale=4.0)


def _masked(q: Array, k: Array, v: Array, keep: Array) -> Array:
    """One batch element of attention with ``keep`` [H, Sq, Skv] (True: the key is seen); a
    query that sees no key gets zeros."""
    h, hk = q.shape[0], k.shape[0]
    out = np.zeros((h, q.shape[1], v.shape[2]))
    for hi in range(h):
        kv = hi // (h // hk)
        s = q[hi].astype(np.float64) @ k[kv].astype(np.float64).T / np.sqrt(q.shape[2])
        s = np.where(keep[hi], s, -np.inf)
        for i in range(s.shape[0]):
            if keep[hi, i].any():
                e = np.exp(s[i] - s[i].max())
                out[hi, i] = (e / e.sum()) @ v[kv].astype(np.float64)
    return out


async def test_default_alignment_is_bottom_right(backend: ComputeBackend) -> None:
    """With no option the backend's kernel runs; it must agree with the composition's
    bottom-right rule, and top-left must differ when Sq < Skv."""
    require_op(backend, "attention")
    q_h, k_h, v_h = (
        sample(s, DType.F32, seed=94 + i)
        for i, s in enumerate(((1, 2, 3, 4), (1, 2, 6, 4), (1, 2, 6, 4)))
    )
    f, ops = backend.tensor_factory, backend.tensor_ops
    q, k, v = f.from_host(q_h), f.from_host(k_h), f.from_host(v_h)
    plain = await fetch(ops.attention(q, k, v, causal=True))
    out, _ = ops.attention(q, k, v, causal=True, return_weights=True)
    assert_close(plain, await fetch(out), DType.F32, scale=4.0)
    assert_close(plain, _attention(q_h, k_h, v_h, causal=True)[0], DType.F32, scale=4.0)
    top_left = await fetch(ops.attention(q, k, v, causal=True, causal_alignment="top_left"))
    assert not np.allclose(top_left, plain)


async def test_key_lengths_out_of_range_are_reported(backend: ComputeBackend) -> None:
    require_op(backend, "attention")
    f = backend.tensor_factory
    q = f.ones((2, 1, 3, 4))
    out = backend.tensor_ops.attention(q, q, q, key_lengths=f.from_host(np.array([1, 4])))
    with pytest.raises(InvalidArgumentError):
        await out.to_host()


def _rotary(x: Array, cos: Array, sin: Array, interleaved: bool, r: int) -> Array:
    x = x.astype(np.float64)
    out = x.copy()
    half = r // 2
    for i in range(half):
        ia, ib = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
        a, b = x[..., ia], x[..., ib]
        out[..., ia] = a * cos[..., i] - b * sin[..., i]
        out[..., ib] = b * cos[..., i] + a * sin[..., i]
    return out


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [None, 4, 0])
async def test_apply_rotary(
    backend: ComputeBackend, dtype: DType, interleaved: bool, rotary_dim: int | None
) -> None:
    require_op(backend, "apply_rotary")
    require_dtype(backend, dtype)
    x_h = sample((2, 3, 5, 8), dtype, seed=97)
    r = 8 if rotary_dim is None else rotary_dim
    angles = np.arange(5)[:, None] * (10000.0 ** (-np.arange(r // 2) / max(r // 2, 1)))
    cos_h, sin_h = np.cos(angles).astype(dtype.to_numpy()), np.sin(angles).astype(dtype.to_numpy())
    f = backend.tensor_factory
    got = backend.tensor_ops.apply_rotary(
        f.from_host(x_h), f.from_host(cos_h), f.from_host(sin_h), interleaved=interleaved,
        rotary_dim=rotary_dim,
    )  # fmt: skip
    want = _rotary(x_h, cos_h.astype(np.float64), sin_h.astype(np.float64), interleaved, r)
    assert_close(await fetch(got, dtype), want, dtype, scale=4.0)


async def test_apply_rotary_agrees_with_rotary_embedding(backend: ComputeBackend) -> None:
    """Tables from the same frequencies give KernelOps.rotary_embedding's result."""
    require_op(backend, "apply_rotary")
    from accelkit.sdk import rotary_inv_freq

    x_h = sample((1, 2, 6, 8), DType.F32, seed=98)
    angles = (np.arange(6)[:, None] * rotary_inv_freq(8, 10000.0)[None, :]).astype(np.float32)
    f = backend.tensor_factory
    x = f.from_host(x_h)
    mine = backend.tensor_ops.apply_rotary(
        x, f.from_host(np.cos(angles)), f.from_host(np.sin(angles))
    )
    theirs = backend.kernel_ops.rotary_embedding(x)
    assert_close(await fetch(mine), await fetch(theirs), DType.F32, scale=8.0)


BAD_CALLS: list[tuple[str, Any, str]] = [
    ("attention", lambda o, t: o.attention(t["q"], t["q"], t["q"], causal_alignment="left"), "causal_alignment"),
    ("attention", lambda o, t: o.attention(t["q"], t["q"], t["q"], window=2), "needs causal"),
    ("attention", lambda o, t: o.attention(t["q"], t["q"], t["q"], causal=True, window=0), "window"),
    ("attention", lambda o, t: o.attention(t["q"], t["q"], t["q"], key_lengths=t["len3"]), r"must be \[2\]"),
    ("attention", lambda o, t: o.attention(t["q"], t["q"], t["q"], key_lengths=t["c"]), "integer"),
    ("attention", lambda o, t: o.attention(t["q"], t["q"], t["q"], softcap=0.0), "softcap"),
    ("attention", lambda o, t: o.attention(t["q"], t["q"], t["q"], layout="bsdh"), "layout must be"),
    ("attention", lambda o, t: o.attention(t["c"], t["c"], t["c"], layout="bshd"), r"\[batch, seq, heads"),
    # [B, S, H, D]: q has 3 heads, k 2 (read head-major, both would have one)
    ("attention", lambda o, t: o.attention(t["q"], t["k2"], t["k2"], layout="bshd"), "not a multiple"),
    # KernelOps with an option (its composition): the same checks, before anything is permuted
    ("attention", lambda o, t: o.backend.kernel_ops.attention(t["q"], t["k2"], t["k2"], causal=True, window=2, layout="bshd"), "not a multiple"),
    ("apply_rotary", lambda o, t: o.apply_rotary(t["q"], t["c"], t["c"], rotary_dim=3), "even"),
    ("apply_rotary", lambda o, t: o.apply_rotary(t["q"], t["c"], t["c"]), "broadcast"),
    ("apply_rotary", lambda o, t: o.apply_rotary(t["q"], t["c2"], t["c"], rotary_dim=4), "one shape"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("op", "call", "message"), BAD_CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)]
)
async def test_bad_arguments_are_refused_before_allocating(
    backend: ComputeBackend, op: str, call: Any, message: str
) -> None:
    require_op(backend, op)
    f = backend.tensor_factory
    inputs = {
        "q": f.ones((2, 1, 3, 8)), "len3": f.ones((3,), "i32"), "c": f.ones((3, 3)),
        "c2": f.ones((3, 2)), "k2": f.ones((2, 1, 2, 8)),
    }  # fmt: skip
    await backend.synchronize()
    used = backend.memory_manager.memory_info().used
    with pytest.raises(AccelError, match=message):
        call(backend.tensor_ops, inputs)
    assert backend.memory_manager.memory_info().used == used
