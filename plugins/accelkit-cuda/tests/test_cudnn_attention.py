"""cuDNN attention (accelkit_cuda.cudnn_attention) without a GPU.

Graph keys, refusals and the cache are checked directly; the graph descriptions with the real
frontend where it is installed (``nvidia-cudnn-frontend`` describes graphs without a device);
and the whole route, end to end, on the backend over the CuPy stand-in with the cuDNN stand-in
(``fake_cudnn``: it computes the attention from the pointers it is handed), under asyncio and
trio: the first call of a shape runs elsewhere while its graph is built on the submission
thread, later calls run on cuDNN, every engine is recorded, nothing runs on the loop's thread.
Building and running real cuDNN graphs needs a GPU: the GPU check does it (test_gpu.py).
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

import fake_cudnn
import fake_cupy
import numpy as np
import pytest
from accelkit_cuda import cudnn_attention as ca
from test_offloop import Plugin, plugin

from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError

__all__ = ["plugin"]


# -- keys, refusals, the cache ------------------------------------------------------------------
def test_sequence_major_strides() -> None:
    # [B, H, S, D] stored [B, S, H, D]: a head's rows are H * D apart, its heads D apart.
    assert ca._strides((2, 4, 8, 64), True) == [8 * 4 * 64, 64, 4 * 64, 1]
    assert ca._strides((2, 4, 8, 64)) == [4 * 8 * 64, 8 * 64, 64, 1]
    key = ca.attention_key(
        (2, 4, 8, 64), (2, 2, 16, 64), (2, 2, 16, 64), DType.F16, None, True, 1, True
    )
    assert key.seq_major
    assert key != ca.attention_key(
        (2, 4, 8, 64), (2, 2, 16, 64), (2, 2, 16, 64), DType.F16, None, True, 1
    )


def test_keys_say_the_mask_kind_and_the_bias_extent() -> None:
    q, k = (2, 4, 8, 64), (2, 2, 16, 64)
    assert ca.attention_key(q, k, k, DType.F16, None, False, 0.1).mask == "none"
    causal = ca.attention_key(q, k, k, DType.F16, None, True, 0.1)
    assert (causal.mask, causal.bias) == ("causal", None)
    padding = ca.attention_key(q, k, k, DType.F16, (2, 1, 1, 16), True, 0.1)
    assert (padding.mask, padding.bias) == ("bool+causal", (2, 1, 8, 16))
    square = ca.attention_key(q, k, k, DType.BF16, (8, 16), False, 0.1)
    assert (square.mask, square.bias) == ("bool", (1, 1, 8, 16))
    per_head = ca.attention_key(q, k, k, DType.F16, (1, 4, 8, 16), False, 0.1)
    assert per_head.bias == (1, 4, 8, 16)
    # Scale, dtype and shapes each make another graph.
    assert causal != ca.attention_key(q, k, k, DType.F16, None, True, 0.2)
    assert causal != ca.attention_key(q, k, k, DType.BF16, None, True, 0.1)
    paged = ca.paged_key((3, 4, 64), (6, 4, 2, 64), (6, 4, 2, 64), (3, 3), DType.F16, 0.1)
    assert (paged.op, paged.table, paged.mask) == ("paged_attention", (3, 3), "none")


@pytest.mark.parametrize(
    ("dtype", "q", "k", "causal", "why"),
    [
        (DType.F32, (1, 2, 8, 64), (1, 2, 8, 64), False, "f16 and bf16"),
        (DType.F64, (1, 2, 8, 64), (1, 2, 8, 64), False, "f16 and bf16"),
        (DType.F16, (1, 2, 8, 60), (1, 2, 8, 60), False, "multiples of 8"),
        (DType.F16, (1, 2, 8, 512), (1, 2, 8, 512), False, "multiples of 8"),
        (DType.F16, (1, 2, 9, 64), (1, 2, 8, 64), True, "more queries than keys"),
        (DType.BF16, (1, 2, 0, 64), (1, 2, 8, 64), False, "empty"),
        (DType.F16, (1, 2, 8, 64), (1, 2, 8, 64), True, None),
        (DType.BF16, (1, 8, 1, 128), (1, 2, 4096, 128), True, None),
        (DType.F16, (1, 2, 9, 64), (1, 2, 8, 64), False, None),
    ],
)
def test_refusals(
    dtype: DType, q: tuple[int, ...], k: tuple[int, ...], causal: bool, why: str | None
) -> None:
    got = ca.refusal(ca.attention_key(q, k, k, dtype, None, causal, 0.1))
    assert (got is None) if why is None else (got is not None and why in got), got


def _engine(cc: tuple[int, int] = (9, 0)) -> tuple[ca.CudnnAttention, list[Any], Any]:
    jobs: list[Any] = []
    frontend = fake_cudnn.install()
    return ca.CudnnAttention(frontend, None, cc, jobs.append), jobs, frontend


def test_a_graph_is_built_once_per_key_off_the_callers_thread() -> None:
    engine, jobs, _ = _engine()
    key = ca.attention_key((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64), DType.F16, None, True, 0.1)
    assert engine.engine == "cudnn"
    assert engine.state(key) == "new"
    first = engine.lookup(key)
    assert isinstance(first, str)
    assert "being built" in first
    assert len(jobs) == 1
    assert engine.state(key) == "pending"
    again = engine.lookup(key)
    assert isinstance(again, str)
    assert "being built" in again
    assert len(jobs) == 1  # never queued twice
    jobs.pop()()
    assert engine.state(key) == "built"
    assert engine.builds == 1
    built = engine.lookup(key)
    assert not isinstance(built, str)
    assert built.graph.steps == [
        "validate", "build_operation_graph", "create_execution_plans", "check_support",
        "build_plans",
    ]  # fmt: skip
    assert built.workspace == 1024
    for _ in range(3):
        assert engine.lookup(key) is built
    assert not jobs
    assert engine.builds == 1


def test_a_refused_key_is_remembered_and_never_rebuilt() -> None:
    engine, jobs, frontend = _engine()
    frontend.pygraph.refuse = staticmethod(lambda g: "no engine for this head dim")
    key = ca.attention_key((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64), DType.F16, None, False, 1)
    engine.lookup(key)
    jobs.pop()()
    assert engine.state(key) == "refused"
    assert engine.builds == 0
    assert "no engine for this head dim" in (engine.reason(key) or "")
    why = engine.lookup(key)
    assert isinstance(why, str)
    assert "refused" in why
    assert "head dim" in why
    assert not jobs
    # A key the route refuses itself (f32) is never queued at all.
    f32 = ca.attention_key((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64), DType.F32, None, False, 1)
    why = engine.lookup(f32)
    assert isinstance(why, str)
    assert "f16 and bf16" in why
    assert not jobs
    assert engine.state(f32) == "refused"


@pytest.mark.parametrize(
    ("q", "k", "mask", "band"),
    [
        ((2, 8, 48, 64), (2, 2, 80, 64), (2, 1, 48, 80), None),  # the H100's failing case
        ((2, 8, 48, 64), (2, 2, 80, 64), None, "BOTTOM_RIGHT"),
        ((2, 8, 80, 64), (2, 2, 80, 64), (2, 1, 80, 80), "TOP_LEFT"),
        ((1, 2, 8, 64), (1, 2, 9, 64), (1, 1, 1, 9), None),
    ],
)
def test_bool_and_causal_together_build(
    q: tuple[int, ...], k: tuple[int, ...], mask: tuple[int, ...] | None, band: str | None
) -> None:
    """A BOOL mask with causal and more keys than queries once never reached cuDNN: the graph
    asked for a bottom-right band beside the bias, which the frontend refuses (the stand-in
    applies the frontend's rule). Every combination must build, and the band be where cuDNN
    takes it."""
    engine, jobs, _ = _engine()
    for dtype in (DType.F16, DType.BF16):
        key = ca.attention_key(q, k, k, dtype, mask, True, 0.125)
        assert ca.causal_in_graph(key) is (band is not None)
        engine.lookup(key)
        jobs.pop()()
        assert engine.state(key) == "built", engine.reason(key)
        built = engine.lookup(key)
        assert not isinstance(built, str)
        assert built.graph.options.get("diagonal_alignment") == band
        assert ("bias" in built.graph.options) is (mask is not None)
    # The rule itself: the band beside a bias is refused, with the frontend's reason kept.
    frontend = fake_cudnn.install()
    key = ca.attention_key(q, k, k, DType.F16, (1, 1, q[2], k[2]), True, 0.125)
    graph = ca.describe(frontend, key)
    graph.options.update(diagonal_alignment="BOTTOM_RIGHT", diagonal_band_right_bound=0)
    with pytest.raises(RuntimeError, match="Bottom right causal mask"):
        graph.validate()


def test_no_frontend_or_an_old_device_means_nvrtc() -> None:
    absent = ca.CudnnAttention(None, "not installed here", (9, 0), lambda job: None)
    assert absent.engine == "nvrtc"
    assert absent.unavailable == "not installed here"
    key = ca.attention_key((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64), DType.F16, None, False, 1)
    why = absent.lookup(key)
    assert isinstance(why, str)
    assert "not installed here" in why
    old, _, _ = _engine((7, 5))
    assert old.engine == "nvrtc"
    assert "8.0" in (old.unavailable or "")
    old.record("attention", "warp", "because")
    assert old.last_route == ca.EngineRoute(op="attention", engine="warp", reason="because")
    assert old.routes == {"attention": {"warp": 1}}


def test_the_frontend_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELKIT_CUDA_CUDNN", "0")
    assert ca.load_frontend() == (None, "turned off (ACCELKIT_CUDA_CUDNN=0)")
    from accelkit_cuda import probe

    assert probe.attention_engine((9, 0)) == ("nvrtc", "turned off (ACCELKIT_CUDA_CUDNN=0)")
    monkeypatch.delenv("ACCELKIT_CUDA_CUDNN")
    engine, why = probe.attention_engine((7, 0))
    assert engine == "nvrtc"
    assert why


# -- the graphs, described by the real frontend (no device needed) --------------------------------
def test_the_real_frontend_describes_the_graphs() -> None:
    try:
        cudnn = importlib.import_module("cudnn")
    except ImportError:
        pytest.skip(
            "nvidia-cudnn-frontend is not installed (pip install 'nvidia-cudnn-frontend<1.29')"
        )
    key = ca.attention_key(
        (2, 4, 8, 64), (2, 2, 16, 64), (2, 2, 16, 32), DType.BF16, (2, 1, 1, 16), True, 0.125
    )
    (node,) = ca.describe(cudnn, key).nodes
    assert node.params["attn_scale"] == 0.125
    assert node.params["generate_stats"] is False
    # A bias with more keys than queries: the causal condition is in the bias, not a
    # bottom-right band (which the frontend refuses beside a bias).
    assert node.params.get("diagonal_band_right_bound") is None
    got = {n: (t.uid, list(t.dim), list(t.stride)) for n, t in node.inputs.items()}
    assert got == {
        "q": (ca.UID_Q, [2, 4, 8, 64], [2048, 512, 64, 1]),
        "k": (ca.UID_K, [2, 2, 16, 64], [2048, 1024, 64, 1]),
        "v": (ca.UID_V, [2, 2, 16, 32], [1024, 512, 32, 1]),
        "bias": (ca.UID_BIAS, [2, 1, 8, 16], [128, 128, 16, 1]),
    }
    assert all(t.data_type == cudnn.data_type.BFLOAT16 for t in node.inputs.values())
    out = node.outputs["O"]
    assert (out.uid, list(out.dim), list(out.stride)) == (
        ca.UID_O,
        [2, 4, 8, 32],
        [1024, 256, 32, 1],
    )
    causal = ca.attention_key(
        (2, 4, 8, 64), (2, 2, 16, 64), (2, 2, 16, 32), DType.BF16, None, True, 0.125
    )
    (node,) = ca.describe(cudnn, causal).nodes
    assert node.params["diagonal_alignment"] == cudnn.diagonal_alignment.BOTTOM_RIGHT
    assert node.params["diagonal_band_right_bound"] == 0
    # Square causal: top-left (the same mask, the most widely served alignment).
    square = ca.attention_key((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64), DType.F16, None, True, 1)
    (node,) = ca.describe(cudnn, square).nodes
    assert node.params["diagonal_alignment"] == cudnn.diagonal_alignment.TOP_LEFT
    assert set(node.inputs) == {"q", "k", "v"}
    # Sequence-major storage ([B, S, H, D]): the same dims, the layout's strides.
    major = ca.attention_key(
        (2, 4, 8, 64), (2, 2, 16, 64), (2, 2, 16, 32), DType.F16, None, True, 0.125, True
    )
    (node,) = ca.describe(cudnn, major).nodes
    got = {n: (list(t.dim), list(t.stride)) for n, t in node.inputs.items()}
    assert got == {
        "q": ([2, 4, 8, 64], [2048, 64, 256, 1]),
        "k": ([2, 2, 16, 64], [2048, 64, 128, 1]),
        "v": ([2, 2, 16, 32], [1024, 32, 64, 1]),
    }
    out = node.outputs["O"]
    assert (list(out.dim), list(out.stride)) == ([2, 4, 8, 32], [1024, 32, 128, 1])
    plain = ca.attention_key((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64), DType.F16, None, False, 1)
    assert "diagonal_band_right_bound" not in ca.describe(cudnn, plain).nodes[0].params
    # Paged: the caches [blocks, block_size, Hk, D] read in place as [blocks, Hk, block_size, D].
    paged = ca.paged_key((3, 4, 64), (6, 4, 2, 64), (6, 4, 2, 64), (3, 3), DType.F16, 0.125)
    (node,) = ca.describe(cudnn, paged).nodes
    assert node.params["use_padding_mask"] is True
    assert node.params["paged_attention_max_seq_len_kv"] == 12
    got = {n: (t.uid, list(t.dim), list(t.stride)) for n, t in node.inputs.items()}
    assert got["q"] == (ca.UID_Q, [3, 4, 1, 64], [256, 64, 64, 1])
    assert got["k"] == (ca.UID_K, [6, 2, 4, 64], [512, 64, 128, 1])
    assert got["paged_attention_k_table"] == (ca.UID_TABLE_K, [3, 1, 3, 1], [3, 3, 1, 1])
    assert got["seq_len_kv"][:2] == (ca.UID_SEQ_KV, [3, 1, 1, 1])
    assert node.inputs["paged_attention_v_table"].data_type == cudnn.data_type.INT32


# -- end to end on the stand-ins --------------------------------------------------------------------


def _reference(q: Any, k: Any, v: Any, keep: Any) -> Any:
    h, hk = q.shape[1], k.shape[1]
    kk = np.repeat(k.astype(np.float64), h // hk, axis=1)
    vv = np.repeat(v.astype(np.float64), h // hk, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), kk) / np.sqrt(q.shape[-1])
    s = np.where(keep, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.where(keep, np.exp(s - np.where(np.isfinite(m), m, 0)), 0)
    total = p.sum(-1, keepdims=True)
    return np.einsum(
        "bhqk,bhkd->bhqd", np.where(total > 0, p / np.where(total > 0, total, 1), 0), vv
    )


async def _open(p: Plugin, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    frontend = fake_cudnn.install()
    module = importlib.import_module("accelkit_cuda.cudnn_attention")
    monkeypatch.setattr(module, "load_frontend", lambda: (frontend, None))
    from accelkit.device import Device

    backend = p.backend.CUDABackend()
    await backend.initialize(Device("cuda", 0))
    return backend, frontend


@pytest.mark.anyio
async def test_attention_runs_on_cudnn_once_its_graph_is_built(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_cudnn.CALLS.clear()
    loop = threading.get_ident()
    backend, _ = await _open(plugin, monkeypatch)
    try:
        assert backend.capabilities.extra["attention_engine"] == "cudnn"
        f, kops, engines = backend.tensor_factory, backend.kernel_ops, backend.attention_engines
        rng = np.random.default_rng(5)
        qh = rng.standard_normal((2, 4, 4, 16)).astype(np.float16)
        kh = rng.standard_normal((2, 2, 8, 16)).astype(np.float16)
        vh = rng.standard_normal((2, 2, 8, 16)).astype(np.float16)
        mh = np.ones((2, 1, 1, 8), bool)
        mh[0, 0, 0, 5:] = False
        mh[1] = False  # batch 1 sees no key: zeros
        q, k, v, m = (f.from_host(x) for x in (qh, kh, vh, mh))
        causal = np.arange(8)[None, :] <= np.arange(4)[:, None] + 4  # bottom-right

        kops.attention(q, k, v, causal=True)  # its graph is queued: the NVRTC kernel runs
        assert engines.last_route is not None
        assert engines.last_route.engine == "warp"
        assert "being built" in engines.last_route.reason
        await backend.synchronize()  # the build ran on the submission thread
        out = kops.attention(q, k, v, causal=True)
        assert engines.last_route.engine == "cudnn", engines.last_route
        assert kops.last_route is not None
        assert kops.last_route.route == "fused"
        got = (await out.to_host()).astype(np.float64)
        np.testing.assert_allclose(got, _reference(qh, kh, vh, causal), atol=2e-3, rtol=2e-3)

        with backend.use_stream(backend.create_stream()):  # a new stream: its CuPy stream later
            out = kops.attention(q, k, v, causal=True)
        assert engines.last_route.engine == "cudnn"
        got = (await out.to_host()).astype(np.float64)
        np.testing.assert_allclose(got, _reference(qh, kh, vh, causal), atol=2e-3, rtol=2e-3)

        kops.attention(q, k, v, mask=m)  # a BOOL mask: no NVRTC kernel takes it
        assert kops.last_route.route == "composed"
        assert "being built" in kops.last_route.reason
        await backend.synchronize()
        for causal_too in (False, True):
            if causal_too:
                kops.attention(q, k, v, mask=m, causal=True)
                await backend.synchronize()
            out = kops.attention(q, k, v, mask=m, causal=causal_too)
            assert engines.last_route.engine == "cudnn"
            keep = np.broadcast_to(mh, (2, 4, 4, 8)) & (causal if causal_too else True)
            got = (await out.to_host()).astype(np.float64)
            np.testing.assert_allclose(got, _reference(qh, kh, vh, keep), atol=2e-3, rtol=2e-3)
            assert not got[1].any()  # no visible key: zeros, not cuDNN's NaN

        # Sequence-major ([B, S, H, D], attention(layout="bshd")): cuDNN reads and writes them
        # in place through the strides (the stand-in's graphs honour dims and strides); a
        # query row that sees no key (row 2 of batch 0 here) is zeroed in that layout too.
        ops, swap = backend.tensor_ops, (0, 2, 1, 3)
        qs, ks, vs = (f.from_host(np.ascontiguousarray(x.transpose(swap))) for x in (qh, kh, vh))
        mr = np.ones((2, 1, 4, 8), bool)
        mr[0, 0, 2] = False
        mr[1, 0, :, 6:] = False
        m2 = f.from_host(mr)
        for mask_s, causal_too in ((None, True), (m2, False), (m2, True)):
            ops.attention(qs, ks, vs, mask=mask_s, causal=causal_too, layout="bshd")
            await backend.synchronize()  # (the first call queues the graph: permutes serve it)
            out = ops.attention(qs, ks, vs, mask=mask_s, causal=causal_too, layout="bshd")
            assert engines.last_route.engine == "cudnn", engines.last_route
            assert "sequence-major" in engines.last_route.reason
            assert out.shape == (2, 4, 4, 16)
            keep = np.broadcast_to(causal if mask_s is None else mr, (2, 4, 4, 8))
            keep = keep & (causal if causal_too else True)
            got = (await out.to_host()).astype(np.float64).transpose(swap)
            np.testing.assert_allclose(got, _reference(qh, kh, vh, keep), atol=2e-3, rtol=2e-3)
            if mask_s is not None:
                assert not got[0, :, 2].any()  # every head of the row that sees no key

        if DType.BF16 in backend.capabilities.dtypes:
            qb, kb, vb = (f.from_host(x, dtype="bf16") for x in (qh, kh, vh))
            kops.attention(qb, kb, vb, causal=True)
            await backend.synchronize()
            out = kops.attention(qb, kb, vb, causal=True)
            assert engines.last_route.engine == "cudnn"
            qr, kr, vr = (x.astype(out.dtype.to_numpy()).astype(np.float64) for x in (qh, kh, vh))
            got = (await out.to_host()).astype(np.float64)
            np.testing.assert_allclose(got, _reference(qr, kr, vr, causal), atol=3e-2, rtol=3e-2)

        q32, k32, v32 = (f.from_host(x.astype(np.float32)) for x in (qh, kh, vh))
        kops.attention(q32, k32, v32, causal=True)
        assert engines.last_route.engine == "warp"
        assert "f16 and bf16" in engines.last_route.reason
        builds = engines.builds
        for _ in range(3):
            kops.attention(q, k, v, causal=True)
        assert engines.builds == builds  # never rebuilt
        assert engines.routes["attention"]["cudnn"] >= 6
        await backend.synchronize()
    finally:
        await backend.shutdown()
    names = [name for name, _ in fake_cudnn.CALLS]
    assert names.count("execute") >= 6
    assert "destroy_handle" in names
    assert names.count("create_handle") == 1
    assert not [c for c in fake_cudnn.CALLS if c[1] == loop], "cuDNN called on the loop thread"
    assert not [c for c in fake_cupy.CALLS if c[1] == loop], "CuPy called on the loop thread"


@pytest.mark.anyio
async def test_paged_attention_runs_on_cudnn_and_checks_the_table(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, _ = await _open(plugin, monkeypatch)
    try:
        f, kops, engines = backend.tensor_factory, backend.kernel_ops, backend.attention_engines
        rng = np.random.default_rng(7)
        nb, bs, hk, d, b, h = 6, 4, 2, 16, 3, 4
        kc = rng.standard_normal((nb, bs, hk, d)).astype(np.float16)
        vc = rng.standard_normal((nb, bs, hk, d)).astype(np.float16)
        qh = rng.standard_normal((b, h, d)).astype(np.float16)
        table = np.array([[4, 1, -1], [-1, -1, -1], [0, 5, 2]], np.int32)
        lens = np.array([5, 0, 9], np.int32)
        args = [f.from_host(x) for x in (qh, kc, vc, table, lens)]

        kops.paged_attention(*args)
        assert engines.last_route is not None
        assert engines.last_route.op == "paged_attention"
        await backend.synchronize()
        out = kops.paged_attention(*args)
        assert engines.last_route.engine == "cudnn", engines.last_route
        got = (await out.to_host()).astype(np.float64)
        want = np.zeros((b, h, d))
        for i in range(b):
            rows = [(table[i, t // bs], t % bs) for t in range(lens[i])]
            if not rows:
                continue
            keys = np.stack([kc[blk, r] for blk, r in rows]).astype(np.float64)  # [n, hk, d]
            vals = np.stack([vc[blk, r] for blk, r in rows]).astype(np.float64)
            for j in range(h):
                s = keys[:, j // (h // hk)] @ qh[i, j].astype(np.float64) / np.sqrt(d)
                p = np.exp(s - s.max())
                want[i, j] = (p / p.sum()) @ vals[:, j // (h // hk)]
        np.testing.assert_allclose(got, want, atol=2e-3, rtol=2e-3)
        assert not got[1].any()  # length 0: zeros

        bad = table.copy()
        bad[2, 1] = 9  # a used entry naming no block of the cache
        out = kops.paged_attention(*args[:3], f.from_host(bad), args[4])
        assert engines.last_route.engine == "cudnn"
        with pytest.raises(InvalidArgumentError, match="refers to block 9"):
            await out.to_host()
        long = np.array([5, 0, 13], np.int32)
        out = kops.paged_attention(*args[:4], f.from_host(long))
        with pytest.raises(InvalidArgumentError, match=r"context_lens must lie in 0\.\.12"):
            await out.to_host()
    finally:
        await backend.shutdown()
