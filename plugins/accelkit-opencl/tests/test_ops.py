"""Every implemented op against a NumPy reference, for every dtype the device supports."""

from __future__ import annotations

import numpy as np
import pytest
from accelkit_opencl.backend import OpenCLBackend

from accelkit._core.op_names import BINARY_OPS, UNARY_OPS
from accelkit.dtype import DType, result_type
from accelkit.testing.checks import assert_gemm_close

# Kernel checks: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]

RNG = np.random.default_rng(0)
_REF_UNARY = {
    "relu": lambda x: np.maximum(x, 0), "abs": np.abs, "neg": np.negative, "floor": np.floor,
    "ceil": np.ceil, "round": np.round, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "tanh": np.tanh, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "sin": np.sin, "cos": np.cos, "tan": np.tan,
    "erf": np.vectorize(__import__("math").erf),
    "gelu": lambda x: 0.5 * x * (1 + np.vectorize(__import__("math").erf)(x / np.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1 + np.exp(-x)), "bitwise_not": np.invert,
}  # fmt: skip


def _data(dtype: DType, shape: tuple[int, ...], positive: bool = False) -> np.ndarray:
    npd = dtype.to_numpy()
    if dtype is DType.BOOL:
        return RNG.random(shape) > 0.5
    if dtype.is_floating:
        v = RNG.uniform(0.1 if positive else -3, 3, shape)
        return v.astype(npd)
    lo = 1 if positive or not dtype.is_signed else -20
    return RNG.integers(lo, 20, shape).astype(npd)


def _tol(dtype: DType) -> dict[str, float]:
    return {"rtol": 1e-5, "atol": 1e-5} if dtype is DType.F32 else {"rtol": 1e-3, "atol": 1e-3}


@pytest.mark.parametrize("op", sorted(UNARY_OPS))
async def test_unary(backend: OpenCLBackend, op: str) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    for dt in sorted(backend.supported_dtypes, key=lambda d: d.value):
        if dt is DType.BOOL and op in ("neg", "floor", "ceil", "round"):
            continue
        if UNARY_OPS[op] == "int" and dt.is_floating:
            continue
        x = _data(dt, (3, 5), positive=op in ("log", "sqrt", "rsqrt"))
        got = await o.unary(op, f.from_host(x)).to_host()
        xf = x.astype(np.float64) if UNARY_OPS[op] == "float" else x
        want = _REF_UNARY[op](xf)
        assert got.dtype == (
            np.float32 if UNARY_OPS[op] == "float" and not dt.is_floating else x.dtype
        )
        np.testing.assert_allclose(
            got.astype(np.float64),
            np.asarray(want, np.float64),
            rtol=1e-4,
            atol=1e-5,
            err_msg=f"{op} {dt}",
        )


_REF_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "maximum": np.maximum, "minimum": np.minimum, "pow": np.power, "mod": np.mod,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal, "floor_divide": np.floor_divide, "fmod": np.fmod,
    "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
    "left_shift": np.left_shift, "right_shift": np.right_shift,
}  # fmt: skip


@pytest.mark.parametrize("op", sorted(BINARY_OPS))
async def test_binary_with_broadcasting(backend: OpenCLBackend, op: str) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    for dt in sorted(backend.supported_dtypes, key=lambda d: d.value):
        kind = BINARY_OPS[op]
        if dt is DType.BOOL and (op in ("sub", "pow", "mod") or kind in ("intdiv", "shift")):
            continue
        if kind in ("bitwise", "shift") and dt.is_floating:
            continue
        a = _data(dt, (4, 1, 3))
        b = _data(dt, (5, 1), positive=op in ("div", "mod", "pow", "floor_divide", "fmod"))
        if kind == "shift":
            b = np.minimum(b, 7).astype(b.dtype)
        if op == "pow" and not dt.is_floating:
            b = np.minimum(b, 3).astype(b.dtype)
            a = np.clip(a, -5, 5).astype(a.dtype)
        if op == "pow" and dt.is_floating:
            a = np.abs(a) + 0.5
        got = await o.binary(op, f.from_host(a), f.from_host(b)).to_host()
        with np.errstate(all="ignore"):
            want = _REF_BINARY[op](a, b)
        assert got.shape == (4, 5, 3)
        np.testing.assert_allclose(
            got.astype(np.float64),
            want.astype(np.float64),
            rtol=1e-4,
            atol=1e-5,
            err_msg=f"{op} {dt}",
        )


async def test_binary_scalars_and_mixed_dtypes(backend: OpenCLBackend) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    t = f.from_host(x)
    np.testing.assert_array_equal(await (t + 2).to_host(), x + 2)
    np.testing.assert_allclose(await (2.5 * t).to_host(), 2.5 * x)
    np.testing.assert_array_equal(await (10 - t).to_host(), 10 - x)
    y = np.linspace(0, 1, 3).astype(np.float32)
    got = await (t + f.from_host(y)).to_host()
    assert got.dtype == result_type(DType.I32, DType.F32).to_numpy()
    np.testing.assert_allclose(got, x + y)
    np.testing.assert_array_equal(await o.lt(t, 2.5).to_host(), x < 2.5)


async def test_where_and_cast(backend: OpenCLBackend) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    c = RNG.random((3, 4)) > 0.5
    a = RNG.standard_normal((3, 4)).astype(np.float32)
    got = await o.where(f.from_host(c), f.from_host(a), 0.0).to_host()
    np.testing.assert_array_equal(got, np.where(c, a, np.float32(0)))
    got = await o.where(f.from_host(c[:1]), 1, f.from_host(np.arange(4, dtype=np.int64))).to_host()
    np.testing.assert_array_equal(got, np.where(c[:1], 1, np.arange(4)))
    x = np.array([1.7, -2.5, np.nan, 300.0, -0.0, 1e20], np.float32)
    np.testing.assert_array_equal(
        await o.cast(f.from_host(x), "i32").to_host(), [1, -2, 0, 300, 0, 0]
    )
    np.testing.assert_array_equal(await o.cast(f.from_host(x), "u8").to_host(), [1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(await o.cast(f.from_host(x), "bool").to_host(), x != 0)
    for dt in backend.supported_dtypes:
        v = _data(DType.I32, (7,), positive=True)
        got = await o.cast(f.from_host(v), dt).to_host()
        np.testing.assert_array_equal(got, v.astype(dt.to_numpy()))


@pytest.mark.parametrize(
    ("shape_a", "shape_b"),
    [
        ((37, 50), (50, 29)),
        ((2, 3, 64, 16), (16, 65)),
        ((5,), (5, 7)),
        ((4, 6), (6,)),
        ((3, 1, 4, 5), (2, 5, 6)),
    ],
)
async def test_matmul(
    backend: OpenCLBackend, shape_a: tuple[int, ...], shape_b: tuple[int, ...]
) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    a = RNG.standard_normal(shape_a).astype(np.float32)
    b = RNG.standard_normal(shape_b).astype(np.float32)
    assert_gemm_close(await o.matmul(f.from_host(a), f.from_host(b)).to_host(), a, b)


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
async def test_gemm_transposes_alpha_beta(
    backend: OpenCLBackend, trans_a: bool, trans_b: bool
) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    m, k, n = 33, 20, 45
    a = RNG.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = RNG.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    c = RNG.standard_normal((1, n)).astype(np.float32)
    got = await o.gemm(
        f.from_host(a),
        f.from_host(b),
        f.from_host(c),
        trans_a=trans_a,
        trans_b=trans_b,
        alpha=0.5,
        beta=2.0,
    ).to_host()
    assert_gemm_close(got, a.T if trans_a else a, b.T if trans_b else b, alpha=0.5, add=2.0 * c)
    ab = RNG.standard_normal((3, m, k)).astype(np.float32)
    bb = RNG.standard_normal((3, k, n)).astype(np.float32)
    got = await o.batched_gemm(f.from_host(ab), f.from_host(bb)).to_host()
    assert_gemm_close(got, ab, bb)


async def test_integer_and_f64_matmul(backend: OpenCLBackend) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    a = RNG.integers(-5, 5, (9, 11)).astype(np.int32)
    b = RNG.integers(-5, 5, (11, 4)).astype(np.int32)
    np.testing.assert_array_equal(await o.matmul(f.from_host(a), f.from_host(b)).to_host(), a @ b)
    if DType.F64 in backend.supported_dtypes:
        a64, b64 = a.astype(np.float64) / 3, b.astype(np.float64) / 7
        np.testing.assert_allclose(
            await o.matmul(f.from_host(a64), f.from_host(b64)).to_host(), a64 @ b64, rtol=1e-12
        )


async def test_linear(backend: OpenCLBackend) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    x = RNG.standard_normal((2, 7, 12)).astype(np.float32)
    w = RNG.standard_normal((9, 12)).astype(np.float32)
    bias = RNG.standard_normal(9).astype(np.float32)
    got = await o.linear(f.from_host(x), f.from_host(w), f.from_host(bias)).to_host()
    assert_gemm_close(got, x, w.T, add=bias)
    got = await o.linear(f.from_host(x), f.from_host(w)).to_host()
    assert_gemm_close(got, x, w.T)


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "prod", "argmax", "argmin"])
@pytest.mark.parametrize("axis", [None, 0, 1, (0, 2), -1])
async def test_reduce(backend: OpenCLBackend, op: str, axis: object) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    if op in ("argmax", "argmin") and isinstance(axis, tuple):
        return
    for dt in (DType.F32, DType.I32, DType.U8, DType.BOOL):
        x = _data(dt, (3, 300, 4)) if op != "prod" else _data(dt, (3, 5, 4))
        if op == "prod" and dt.is_floating:
            x = (x / 3 + 1).astype(x.dtype)
        got = await o.reduce(op, f.from_host(x), axis, keepdims=False).to_host()
        xr = x.astype(np.int64) if dt is DType.BOOL and op in ("sum", "prod", "mean") else x
        want = getattr(np, op)(xr, axis=axis)
        if op == "mean" and not dt.is_floating:
            want = want.astype(np.float32)
        np.testing.assert_allclose(
            np.asarray(got, np.float64),
            np.asarray(want, np.float64),
            rtol=1e-4,
            atol=1e-4,
            err_msg=f"{op} {dt}",
        )


async def test_reduce_nan_and_keepdims(backend: OpenCLBackend) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    x = np.array([[1.0, np.nan, 3.0], [2.0, 5.0, 5.0]], np.float32)
    np.testing.assert_array_equal(await o.argmax(f.from_host(x), 1).to_host(), np.argmax(x, 1))
    np.testing.assert_array_equal(await o.max(f.from_host(x), 1).to_host(), np.max(x, 1))
    got = await o.sum(f.from_host(x[1:]), 1, keepdims=True).to_host()
    assert got.shape == (1, 1)
    assert got[0, 0] == 12.0


@pytest.mark.parametrize("axis", [-1, 0, 1])
async def test_softmax(backend: OpenCLBackend, axis: int) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    x = RNG.standard_normal((4, 300, 3)).astype(np.float32) * 5
    e = np.exp(x - x.max(axis, keepdims=True))
    want = e / e.sum(axis, keepdims=True)
    np.testing.assert_allclose(
        await o.softmax(f.from_host(x), axis).to_host(), want, rtol=1e-4, atol=1e-6
    )
    np.testing.assert_allclose(
        await o.log_softmax(f.from_host(x), axis).to_host(), np.log(want), rtol=1e-4, atol=1e-4
    )


async def test_norms(backend: OpenCLBackend) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    x = RNG.standard_normal((5, 3, 700)).astype(np.float32) + 2
    w = RNG.standard_normal(700).astype(np.float32)
    b = RNG.standard_normal(700).astype(np.float32)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    want = (x - mu) / np.sqrt(var + 1e-5) * w + b
    got = await o.layer_norm(f.from_host(x), f.from_host(w), f.from_host(b)).to_host()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    got = await o.layer_norm(f.from_host(x)).to_host()
    np.testing.assert_allclose(got, (x - mu) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-4)
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w
    got = await o.rms_norm(f.from_host(x), f.from_host(w)).to_host()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


async def test_shape_ops(backend: OpenCLBackend) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    for dt in sorted(backend.supported_dtypes, key=lambda d: d.value):
        x = _data(dt, (2, 3, 4))
        t = f.from_host(x)
        np.testing.assert_array_equal(await o.permute(t, (2, 0, 1)).to_host(), x.transpose(2, 0, 1))
        np.testing.assert_array_equal(await o.transpose(t).to_host(), x.swapaxes(-1, -2))
        np.testing.assert_array_equal(await o.narrow(t, 1, 1, 2).to_host(), x[:, 1:3])
        y = _data(dt, (2, 5, 4))
        np.testing.assert_array_equal(
            await o.concat([t, f.from_host(y)], 1).to_host(), np.concatenate([x, y], 1)
        )
        np.testing.assert_array_equal(await o.stack([t, t], 0).to_host(), np.stack([x, x]))
        parts = o.split(t, [1, 3], axis=2)
        np.testing.assert_array_equal(await parts[1].to_host(), x[:, :, 1:])
        np.testing.assert_array_equal(await o.reshape(t, (6, 4)).to_host(), x.reshape(6, 4))


async def test_factory(backend: OpenCLBackend) -> None:
    f = backend.tensor_factory
    for dt in backend.supported_dtypes:
        got = await f.full((3, 2), 1, dt).to_host()
        np.testing.assert_array_equal(got, np.ones((3, 2), dt.to_numpy()))
    np.testing.assert_array_equal(await f.arange(5).to_host(), np.arange(5))
    np.testing.assert_array_equal(await f.eye(3).to_host(), np.eye(3, dtype=np.float32))
    assert (await f.zeros((0, 3)).to_host()).shape == (0, 3)
    u = await f.uniform((100,), 0, 1, seed=3).to_host()
    assert u.min() >= 0
    assert u.max() < 1
