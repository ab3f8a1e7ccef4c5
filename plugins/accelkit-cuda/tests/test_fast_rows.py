"""The one-launch unary and row kernels of issue 29 (accelkit_cuda.fast_elementwise), run end to
end over the stand-in CuPy: fake_cupy computes each raw kernel with a NumPy port of its CUDA code,
so these tests check the backend's routing (which op takes one launch, which keeps CuPy's path)
and the ports' numerics against float64 NumPy with tolerances from the dtype's eps, NaN/inf rows
and rows longer than a block included. **Not run on a GPU**: the CUDA code itself is only
compiled (test_fast_elementwise.py)."""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable
from typing import Any

import anyio
import fake_cupy
import ml_dtypes
import numpy as np
import pytest
from test_offloop import Plugin, _open, plugin  # noqa: F401

from accelkit.dtype import DType
from accelkit.workloads import BlockConfig, block_weights, transformer_block, upload_weights

pytestmark = pytest.mark.anyio

_ERF = np.vectorize(math.erf, otypes=[np.float64])
REFERENCE: dict[str, Callable[[Any], Any]] = {
    "gelu": lambda a: 0.5 * a * (1 + _ERF(a / math.sqrt(2))),
    "gelu_tanh": lambda a: 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3))),
    "silu": lambda a: a / (1 + np.exp(-a)),
    "sigmoid": lambda a: 1 / (1 + np.exp(-a)),
    "exp": np.exp, "tanh": np.tanh, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda a: 1 / np.sqrt(a), "sin": np.sin, "cos": np.cos, "erf": _ERF,
    "relu": lambda a: np.where(np.isnan(a), a, np.maximum(a, 0)), "abs": np.abs,
    "neg": np.negative,
}  # fmt: skip
DTYPES = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


_EPS = {"f32": 2.0**-23, "f64": 2.0**-52, "f16": 2.0**-10, "bf16": 2.0**-7}


def _eps(name: str) -> float:
    """The dtype's machine epsilon."""
    return _EPS[name]


async def _ready(backend: Any) -> None:
    fast = backend.tensor_ops.kernels.fast
    fast.start()
    for _ in range(500):
        if fast.ready or fast.error is not None:
            break
        await anyio.sleep(0.01)
    assert fast.ready, fast.error


def _launches(prefix: str) -> list[str]:
    return [name for name, _ in fake_cupy.CALLS if name.startswith("launch " + prefix)]


def _close(got: Any, want: Any, rtol: float, atol: float) -> None:
    got = np.asarray(got, np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("dt", ["f32", "f64", "f16", "bf16"])
async def test_float_unary_ops_are_one_launch(plugin: Plugin, dt: str) -> None:  # noqa: F811
    backend = await _open(plugin)
    rng = np.random.default_rng(1)
    host = (rng.standard_normal(300) * 3).astype(DTYPES[dt])
    host[:4] = [np.nan, np.inf, -np.inf, 0]
    try:
        await _ready(backend)
        f, ops = backend.tensor_factory, backend.tensor_ops
        x = f.from_host(host)
        fake_cupy.CALLS.clear()
        outs = {op: ops.unary(op, x) for op in REFERENCE}
        got = {op: await t.to_host() for op, t in outs.items()}
        launched = _launches("eu_")
    finally:
        await backend.shutdown()
    assert sorted(launched) == sorted(f"launch eu_{op}_{dt}" for op in REFERENCE)
    eps = _eps(dt)
    xr = host.astype(np.float64)
    with np.errstate(all="ignore"):
        for op, fn in REFERENCE.items():
            want = fn(xr).astype(DTYPES[dt]).astype(np.float64)  # rounded to the dtype once
            _close(got[op], want, rtol=8 * eps, atol=8 * eps)


async def test_a_norm_in_f32_then_f64_of_one_shape_gets_each_dtypes_eps(plugin: Plugin) -> None:  # noqa: F811
    """layer_norm in f32 then f64 over one shape and eps: the row kernels' launch arguments
    are kept per signature (``_row_config``), and the f64 launch gets a float64 eps, not the
    f32 call's (a key without the dtype's flag would hand it that tail). A row of 700 values
    about 1e-3 apart from its mean: eps (1e-5) weighs in the result, which an f32 eps of
    1e-5 (off by about 2.5e-9 relative) would move beyond float64's rounding of the 700-sum
    (700 * 2**-53 ≈ 8e-14 relative; 1e-13 allowed)."""
    backend = await _open(plugin)
    rng = np.random.default_rng(3)
    h = rng.standard_normal((6, 700)) * 1e-3
    try:
        await _ready(backend)
        f, ops = backend.tensor_factory, backend.tensor_ops
        await ops.layer_norm(f.from_host(h.astype(np.float32)), None, None, 1e-5).to_host()
        got = await ops.layer_norm(f.from_host(h), None, None, 1e-5).to_host()
    finally:
        await backend.shutdown()
    d = h - h.mean(-1, keepdims=True)
    want = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


def _softmax_ref(x: Any, log: bool) -> Any:
    """float64 softmax with docs/operations.md's rule: a row holding NaN or +inf, or only
    -inf, is NaN."""
    m = x.max(axis=-1, keepdims=True)
    bad = ~np.isfinite(m)
    with np.errstate(all="ignore"):
        s = x - np.where(bad, 0, m)
        lse = np.log(np.exp(s).sum(axis=-1, keepdims=True))
        res = s - lse if log else np.exp(s - lse)
    return np.where(bad, np.nan, res)


def _rows(rng: np.random.Generator, shape: tuple[int, ...]) -> Any:
    x = rng.standard_normal(shape) * 4
    flat = x.reshape(-1, shape[-1])
    flat[0, 1] = np.nan
    flat[1, 2] = np.inf
    flat[2, :] = -np.inf
    flat[3, ::2] = -np.inf  # some -inf: still a distribution
    return x


@pytest.mark.parametrize("dt", ["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("cols", [7, 1000])  # a warp's row, a row longer than a block
async def test_softmax_rows_are_one_launch(plugin: Plugin, dt: str, cols: int) -> None:  # noqa: F811
    backend = await _open(plugin)
    host = _rows(np.random.default_rng(2), (2, 3, cols)).astype(DTYPES[dt])
    try:
        await _ready(backend)
        f, ops = backend.tensor_factory, backend.tensor_ops
        x = f.from_host(host)
        fake_cupy.CALLS.clear()
        sm, lsm = ops.softmax(x, axis=-1), ops.log_softmax(x, axis=-1)
        got, got_log = await sm.to_host(), await lsm.to_host()
        launched = _launches("row_")
        fake_cupy.CALLS.clear()
        other = await ops.softmax(x, axis=1).to_host()  # another axis: CuPy's path
        assert not _launches("row_")
    finally:
        await backend.shutdown()
    assert launched == [f"launch row_softmax_{dt}", f"launch row_log_softmax_{dt}"]
    xr = host.astype(np.float64)
    eps = _eps(dt)
    tol = 4 * eps + (0.0 if dt in ("f16", "bf16") else cols * _EPS["f32"] / 8)
    if dt == "f64":
        tol = 64 * eps
    _close(got, _softmax_ref(xr, False), rtol=tol, atol=tol)
    want_log = _softmax_ref(xr, True)
    _close(
        got_log,
        want_log,
        rtol=tol,
        atol=tol * max(1.0, float(np.abs(want_log[np.isfinite(want_log)]).max())),
    )
    want_other = np.moveaxis(_softmax_ref(np.moveaxis(xr, 1, -1), False), -1, 1)
    _close(other, want_other, rtol=tol, atol=tol)


@pytest.mark.parametrize("dt", ["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("cols", [5, 700])
@pytest.mark.parametrize("affine", [True, False])
async def test_norms_are_one_launch(plugin: Plugin, dt: str, cols: int, affine: bool) -> None:  # noqa: F811
    backend = await _open(plugin)
    rng = np.random.default_rng(3)
    host = (rng.standard_normal((6, cols)) * 2 + 1).astype(DTYPES[dt])
    host[1, 0] = np.nan
    host[2, 1] = np.inf
    g_h = rng.standard_normal(cols).astype(DTYPES[dt])
    b_h = rng.standard_normal(cols).astype(DTYPES[dt])
    try:
        await _ready(backend)
        f, ops = backend.tensor_factory, backend.tensor_ops
        x, g, b = f.from_host(host), f.from_host(g_h), f.from_host(b_h)
        fake_cupy.CALLS.clear()
        ln = ops.layer_norm(x, g if affine else None, b if affine else None, 1e-5)
        rms = ops.rms_norm(x, g if affine else None, 1e-6)
        got_ln, got_rms = await ln.to_host(), await rms.to_host()
        launched = _launches("row_")
    finally:
        await backend.shutdown()
    assert launched == [f"launch row_layer_norm_{dt}", f"launch row_rms_norm_{dt}"]
    xr = host.astype(np.float64)
    gr, br = g_h.astype(np.float64), b_h.astype(np.float64)
    with np.errstate(all="ignore"):
        d = xr - xr.mean(-1, keepdims=True)
        want_ln = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)
        want_rms = xr / np.sqrt((xr * xr).mean(-1, keepdims=True) + 1e-6)
    if affine:
        want_ln, want_rms = want_ln * gr + br, want_rms * gr
    eps = _eps(dt)
    tol = 8 * eps + (cols * 2e-8 if dt != "f64" else 0.0)
    scale = 1 + float(np.abs(gr).max() + np.abs(br).max()) if affine else 1.0
    _close(got_ln, want_ln, rtol=tol, atol=tol * scale)
    _close(got_rms, want_rms, rtol=tol, atol=tol * scale)


#: What the stand-in records for a kernel launch: a raw kernel, a ufunc (a reduction too), a
#: copy, a cast, a fill, an indexed store.
_KERNEL_CALLS = frozenset({"copyto", "ndarray.astype", "ndarray.fill", "ndarray.__setitem__"})


def kernel_launches() -> list[str]:
    """The kernel launches fake_cupy recorded since its CALLS were last cleared."""
    return [
        name
        for name, _ in fake_cupy.CALLS
        if name.startswith(("launch ", "ufunc ", "special.")) or name in _KERNEL_CALLS
    ]


async def test_a_transformer_block_takes_few_launches(plugin: Plugin) -> None:  # noqa: F811
    """bench_core's block (issue 29): with the one-launch kernels loaded, the two layer norms,
    the GELU and the residual adds are a launch each, attention one (the fused kernel), a
    linear two (GEMM, bias added in place), each permute one copy: 20 in all, against 62 with
    the norms and the GELU composed of CuPy ufuncs and the bias copied over (the count before issue 29 over
    this stand-in, at any size)."""
    backend = await _open(plugin)
    cfg = BlockConfig(batch=2, seq=16, width=32, heads=4)
    rng = np.random.default_rng(4)
    try:
        await _ready(backend)
        w = upload_weights(backend, block_weights(cfg))
        x = backend.tensor_factory.from_host(
            rng.standard_normal((cfg.batch, cfg.seq, cfg.width)).astype(np.float32)
        )
        await transformer_block(backend, x, w, cfg).to_host()  # warm: the fused program loads
        fake_cupy.CALLS.clear()
        await transformer_block(backend, x, w, cfg).to_host()
        launches = kernel_launches()
    finally:
        await backend.shutdown()
    assert launches.count("launch row_layer_norm_f32") == 2
    assert launches.count("launch eu_gelu_tanh_f32") == 1
    assert launches.count("ufunc matmul") == 6
    assert len(launches) <= 24, sorted(launches)


@pytest.mark.parametrize("dt", ["f32", "f64", "f16"])
async def test_masked_attention_takes_the_one_launch_softmax(plugin: Plugin, dt: str) -> None:  # noqa: F811
    """With a mask the fused engines decline and attention stays composed on cuBLAS; its
    softmax is the one-launch ``row_attn_softmax`` kernel, with attention's rule: a query that
    sees no key gets zeros (the softmax op's rule would give NaN)."""
    backend = await _open(plugin)
    rng = np.random.default_rng(6)
    b, h, sq, sk, d = 2, 3, 5, 300, 8  # rows longer than a block
    q_h, k_h, v_h = (rng.standard_normal((b, h, n, d)).astype(DTYPES[dt]) for n in (sq, sk, sk))
    mask_h = rng.random((b, h, sq, sk)) < 0.7
    mask_h[0, 0, 1] = False  # sees no key
    try:
        await _ready(backend)
        f, ops = backend.tensor_factory, backend.tensor_ops
        q, k, v, mask = (f.from_host(a) for a in (q_h, k_h, v_h, mask_h))
        fake_cupy.CALLS.clear()
        got = (await ops.attention(q, k, v, mask=mask).to_host()).astype(np.float64)
        launches = kernel_launches()
    finally:
        await backend.shutdown()
    ct = "f64" if dt == "f64" else "f32"
    assert launches.count(f"launch row_attn_softmax_{ct}") == 1, launches
    assert "ufunc exp" not in launches
    qr, kr, vr = (a.astype(np.float64) for a in (q_h, k_h, v_h))
    s = np.where(mask_h, qr @ kr.transpose(0, 1, 3, 2) / math.sqrt(d), -np.inf)
    m = s.max(-1, keepdims=True)
    with np.errstate(all="ignore"):
        p = np.exp(s - np.where(np.isfinite(m), m, 0))
        p = np.where(np.isfinite(m), p / p.sum(-1, keepdims=True), 0)
    want = p @ vr
    assert not want[0, 0, 1].any()
    tol = {"f64": 64 * _eps(dt), "f32": 1e-5, "f16": 8 * _eps(dt)}[dt]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_array_equal(got[0, 0, 1], 0)


async def test_the_raw_kernels_and_philox_can_be_switched_off(
    plugin: Plugin,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``ACCELKIT_CUDA_RAW_KERNELS=0`` and ``ACCELKIT_CUDA_PHILOX=0`` (a way out should a GPU
    disagree with these unverified kernels): no raw launch at all, CuPy's composed ops and
    generator serve, and the answers are still NumPy's."""
    monkeypatch.setenv("ACCELKIT_CUDA_RAW_KERNELS", "0")
    monkeypatch.setenv("ACCELKIT_CUDA_PHILOX", "0")
    backend = await _open(plugin)
    rng = np.random.default_rng(5)
    x_h = rng.standard_normal((3, 40)).astype(np.float32)
    try:
        assert backend.tensor_ops is not None
        f, ops = backend.tensor_factory, backend.tensor_ops
        x = f.from_host(x_h)
        # initialize warmed CuPy's generator up, the draws' path now
        assert any(name == "random.default_rng" for name, _ in fake_cupy.CALLS)
        fake_cupy.CALLS.clear()
        got = [
            await ops.add(x, x).to_host(),
            await ops.gelu(x, approximate="tanh").to_host(),
            await ops.softmax(x, axis=-1).to_host(),
            await ops.layer_norm(x, None, None, 1e-5).to_host(),
        ]
        u = await f.uniform((1000,), seed=3).to_host()
        launched = [name for name, _ in fake_cupy.CALLS if name.startswith("launch ")]
        assert "ACCELKIT_CUDA_RAW_KERNELS=0" in str(backend.tensor_ops.kernels.fast.error)
    finally:
        await backend.shutdown()
    assert launched == []
    x64 = x_h.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    d = x64 - x64.mean(axis=1, keepdims=True)
    want = [
        2 * x64,
        0.5 * x64 * (1 + np.tanh(0.7978845608028654 * (x64 + 0.044715 * x64**3))),
        e / e.sum(axis=1, keepdims=True),
        d / np.sqrt((d * d).mean(axis=1, keepdims=True) + 1e-5),
    ]
    eps = float(np.finfo(np.float32).eps)
    for g, w in zip(got, want, strict=True):  # a few roundings of values of magnitude <= 10
        np.testing.assert_allclose(g, w, rtol=64 * eps, atol=64 * eps)
    assert u.min() >= 0.0
    assert u.max() < 1.0


def _softmax64(a: Any) -> Any:
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm64(a: Any) -> Any:
    return (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5)


#: op -> (the call, the prefix of its raw launch, a float64 reference, a bound in f32 eps, taken
#: relative and absolute): rows of 64 elements of magnitude <= 2. exp: about 2 ulps; add: exact
#: but for the rounding; softmax: the row's 64-term sum, the exp and the division (64 + 8);
#: layer_norm: the mean's and the variance's 64-term sums and the normalisation, over values
#: of magnitude <= 2 (4 x 64); permute: exact.
_RAW_CASES: dict[str, tuple[Callable[[Any, Any], Any], str, Callable[[Any], Any], float]] = {
    "exp": (lambda ops, x: ops.exp(x), "eu_exp", np.exp, 2),
    "add": (lambda ops, x: ops.add(x, x), "ew_add", lambda a: 2 * a, 1),
    "softmax": (lambda ops, x: ops.softmax(x), "row_softmax", _softmax64, 72),
    "layer_norm": (
        lambda ops, x: ops.layer_norm(x, None, None, 1e-5),
        "row_layer_norm",
        _layer_norm64,
        256,
    ),
    "permute": (lambda ops, x: ops.permute(x, (1, 0)), "perm32", lambda a: a.T, 0),
}


def _full_device(monkeypatch: pytest.MonkeyPatch, times: int | None = None) -> list[int]:
    """Make the stand-in's ``cudaMalloc`` find the device full (cudaErrorMemoryAllocation):
    ``times`` times, or every time (None); the failures still to come, counted down."""
    cuda = sys.modules["cupy"].cuda  # the stand-in the fixture installed
    plain, left = cuda.runtime.malloc, [-1 if times is None else times]

    def malloc(size: int) -> int:
        if left[0]:
            left[0] -= left[0] > 0
            raise fake_cupy.CUDARuntimeError(2)
        return int(plain(size))

    monkeypatch.setattr(cuda.runtime, "malloc", malloc)
    return left


def _lagging(backend: Any) -> threading.Event:
    """Hold the submission thread until the returned event is set: what is submitted meanwhile
    is queued behind, not run."""
    gate = threading.Event()
    backend.thread.submit(lambda: gate.wait(10))
    return gate


async def _ramp(backend: Any, rows: int) -> tuple[Any, Any]:
    """A [rows, 64] f32 ramp over [-2, 2] on the host and on ``backend`` (written)."""
    x_h = np.linspace(-2, 2, rows * 64, dtype=np.float32).reshape(rows, 64)
    x = backend.tensor_factory.from_host(x_h)
    await backend.synchronize()
    return x_h, x


@pytest.mark.parametrize("op", list(_RAW_CASES))
async def test_a_raw_launch_into_a_block_without_memory_raises_its_error(
    plugin: Plugin,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    op: str,
) -> None:
    """A raw launch whose output's ``cudaMalloc`` found the device full launches nothing: the
    await that covers it raises OutOfMemoryError (as CuPy's path would), and the backend goes
    on."""
    from accelkit.errors import OutOfMemoryError

    call, launch, reference, ulps = _RAW_CASES[op]
    backend = await _open(plugin)
    try:
        await _ready(backend)
        ops = backend.tensor_ops
        _, x = await _ramp(backend, 64)
        full = _full_device(monkeypatch)
        fake_cupy.CALLS.clear()
        _y = call(ops, x)
        with pytest.raises(OutOfMemoryError, match="16384-byte block"):
            await backend.synchronize()  # (reported once: reading _y raises StaleHandleError)
        assert not _launches(launch)
        full[0] = 0  # the device has room again
        del _y  # its failed block goes to the pool's cache
        # The same size: the pool finds the failed block cached and allocates a fresh one in
        # its place (the upload's and the op's blocks both: a new tensor never inherits it).
        z_h, z = await _ramp(backend, 64)
        got = await call(ops, z).to_host()
    finally:
        await backend.shutdown()
    want = reference(z_h.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=ulps * 2.0**-23, atol=ulps * 2.0**-23)
    assert _launches(launch)


@pytest.mark.parametrize("op", list(_RAW_CASES))
async def test_an_input_dropped_before_its_launch_survives_a_full_devices_trim(
    plugin: Plugin,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    op: str,
) -> None:
    """One stream, the submission thread behind: an op is queued after its output's
    ``cudaMalloc``, and its input dies before either runs (its block goes to the pool's
    cache). The ``cudaMalloc`` finds the device full once and its retry frees the cached blocks
    in place on the submission thread: the launch must still find its input (unary, row and
    permute closures hold the input tensors; binary's holds their blocks, whose frees wait for
    it: Block.use; both failed with "freed", found in review)."""
    call, launch, reference, ulps = _RAW_CASES[op]
    backend = await _open(plugin)
    try:
        await _ready(backend)
        f, ops = backend.tensor_factory, backend.tensor_ops
        x_h, x = await _ramp(backend, 64)
        fails = _full_device(monkeypatch, times=1)
        gate = _lagging(backend)
        y = call(ops, x)  # y's cudaMalloc queued: it fails once, then trims and retries
        del x
        f.empty((7,), DType.F32)  # an allocation drains x's dead block into the cache
        gate.set()
        got = await y.to_host()
        assert fails == [0]  # the retry ran
        assert _launches(launch)  # on the raw kernel
    finally:
        await backend.shutdown()
    want = reference(x_h.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=ulps * 2.0**-23, atol=ulps * 2.0**-23)


async def test_a_dropped_output_of_a_queued_add_is_not_freed_under_it(
    plugin: Plugin,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Binary's raw launch holds its output's block, not the tensor: an add whose result the
    caller drops at once sends the block to the pool's cache before the add ran. A full
    device's ``cudaMalloc`` retry queued before the add (another op's output) trims the cache
    in place: the add's block is freed only after the add ran (Block.use), so the add finds it
    allocated and nothing fails."""
    from accelkit_cuda import memory

    from accelkit.sdk import buffer_of

    backend = await _open(plugin)
    try:
        await _ready(backend)
        ops = backend.tensor_ops
        _, x = await _ramp(backend, 64)
        big_h, big = await _ramp(backend, 128)  # an output of another size: a fresh block
        ops.add(x, x)  # leaves a block of x's size in the cache
        await backend.synchronize()
        gate = _lagging(backend)
        fails = _full_device(monkeypatch, times=1)
        y = ops.exp(big)  # its cudaMalloc, queued first, fails once, trims and retries
        dropped = ops.add(x, x)  # dropped below: its block goes back to the cache
        block, add = buffer_of(dropped).handle, backend.thread.queued
        del dropped
        runs: dict[int, int] = {}  # pointer freed: the closure running then
        plain_free = memory.cupy.cuda.runtime.free

        def free(ptr: int) -> None:
            runs[ptr] = backend.thread.started
            plain_free(ptr)

        monkeypatch.setattr(memory.cupy.cuda.runtime, "free", free)
        ptr = block.ptr
        gate.set()
        got = await y.to_host()
        await backend.synchronize()  # the add did not fail
    finally:
        await backend.shutdown()
    assert fails == [0]  # the retry ran
    assert runs[ptr] > add  # the add's block was freed, after the add's closure
    np.testing.assert_allclose(got, np.exp(big_h.astype(np.float64)), rtol=2 * 2.0**-23)


async def test_a_dropped_source_of_a_queued_copy_is_not_freed_under_it(
    plugin: Plugin,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A device-to-device copy on one stream holds the blocks, not the tensors (as binary's
    raw launch): its source, dropped after it was queued, is not freed by a full device's
    retry trimming the cache in place before the copy ran (found in review: "freed")."""
    backend = await _open(plugin)
    try:
        await _ready(backend)
        ops, mm = backend.tensor_ops, backend.memory_manager
        x_h, x = await _ramp(backend, 64)
        src, dst = ops.exp(x), ops.exp(x)
        _, big = await _ramp(backend, 128)
        await backend.synchronize()
        gate = _lagging(backend)
        fails = _full_device(monkeypatch, times=1)
        y = ops.exp(big)  # its cudaMalloc, queued first, fails once, trims in place
        mm.copy_dtod(dst, src)
        del src  # its block to the pool's cache, before the copy ran
        gate.set()
        await y.to_host()
        got = await dst.to_host()
    finally:
        await backend.shutdown()
    assert fails == [0]
    np.testing.assert_allclose(got, np.exp(x_h.astype(np.float64)), rtol=2 * 2.0**-23)


async def test_a_dropped_upload_is_not_freed_under_its_copy(
    plugin: Plugin,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An upload (``from_host``) holds its block, not the tensor: dropped at once, its block is
    not freed by a full device's retry before the copy into it ran (found in review: the
    stand-in crashed on a copy to address 0), and nothing fails."""
    backend = await _open(plugin)
    try:
        await _ready(backend)
        ops, f = backend.tensor_ops, backend.tensor_factory
        x_h, x = await _ramp(backend, 64)
        ops.exp(x)  # a block of x's size in the cache
        big_h, big = await _ramp(backend, 128)
        await backend.synchronize()
        gate = _lagging(backend)
        fails = _full_device(monkeypatch, times=1)
        y = ops.exp(big)
        f.from_host(x_h)  # dropped at once
        z = ops.exp(big)
        gate.set()
        await y.to_host()
        got = await z.to_host()
        await backend.synchronize()
    finally:
        await backend.shutdown()
    assert fails == [0]
    np.testing.assert_allclose(got, np.exp(big_h.astype(np.float64)), rtol=2 * 2.0**-23)


async def test_an_allocation_on_the_submission_thread_retries_without_a_deadlock(
    plugin: Plugin,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An allocation made on the submission thread runs its ``cudaMalloc`` in place, under the
    pool's lock: a full device's retry there must not trim through the pool (which takes the
    lock again: it hung); the pool's own retry trims, its lock held, and allocates."""
    backend = await _open(plugin)
    await _ready(backend)
    f = backend.tensor_factory
    f.empty((256,), DType.F32)  # a block of another size to the pool's cache
    await backend.thread.call(lambda: None)  # (its cudaMalloc, queued, has run)
    fails = _full_device(monkeypatch, times=1)
    try:
        with anyio.fail_after(20):
            t = await backend.thread.call(lambda: f.empty((12345,), DType.F32))
    except TimeoutError:  # no shutdown: the submission thread is stuck for good
        pytest.fail("an allocation on the submission thread hung in its cudaMalloc's retry")
    try:
        assert fails == [0]  # failed once, then allocated
        assert t.shape == (12345,)
        got = await backend.tensor_ops.add(t, t).to_host()  # its block is usable
        assert got.shape == (12345,)
    finally:
        await backend.shutdown()
