"""Special values on every backend, against the rules in docs/operations.md ("Special values"):
NaN and infinities through softmax, attention and arithmetic, integer remainder at its edges, and
no NumPy warnings from a backend's kernels (a warning turned into an error must not fail an op)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

from accelkit import ComputeBackend, DType

from .checks import assert_close, fetch, require_dtype

# A kernel check: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]

NAN, INF = float("nan"), float("inf")

# Rows of a softmax input, and whether the rule makes the whole row NaN.
SOFTMAX_ROWS = {
    "a NaN": ([NAN, 1.0, 2.0, 0.5], True),
    "+inf": ([INF, 1.0, 2.0, 0.5], True),
    "two +inf": ([INF, INF, 1.0, 0.5], True),
    "all -inf": ([-INF, -INF, -INF, -INF], True),
    "some -inf": ([-INF, 0.0, 1.0, -INF], False),
    "finite": ([1.0, 2.0, 3.0, -1.0], False),
    "-inf and NaN": ([-INF, NAN, 1.0, 0.0], True),
}


def _softmax_reference(row: list[float], log: bool) -> np.ndarray[Any, Any]:
    x = np.array(row, np.float64)
    m = x.max()
    with np.errstate(all="ignore"):
        e = np.exp(x - m)
        out: np.ndarray[Any, Any] = (x - m - np.log(e.sum())) if log else e / e.sum()
    return out


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [DType.F32, DType.F64], ids=["f32", "f64"])
async def test_softmax_rows_follow_the_special_value_rule(
    backend: ComputeBackend, log: bool, dtype: DType
) -> None:
    """A row holding NaN or +inf, or only -inf, is NaN throughout (as IEEE arithmetic and
    PyTorch give); -inf entries of a row with a finite maximum get probability 0 (log: -inf)."""
    require_dtype(backend, dtype)
    rows = [row for row, _ in SOFTMAX_ROWS.values()]
    x = backend.tensor_factory.from_host(np.array(rows, dtype.to_numpy()))
    run = backend.tensor_ops.log_softmax if log else backend.tensor_ops.softmax
    got = await fetch(run(x, axis=-1), dtype)
    for i, (name, (row, nan_row)) in enumerate(SOFTMAX_ROWS.items()):
        if nan_row:
            assert np.isnan(got[i]).all(), f"row with {name}: {got[i]} should be NaN throughout"
        else:
            assert_close(got[i], _softmax_reference(row, log), dtype)


@pytest.mark.parametrize("where", ["q", "k", "v"])
async def test_attention_propagates_nan_to_the_rows_that_see_it(
    backend: ComputeBackend, where: str
) -> None:
    """NaN in a query row makes that output row NaN (and no other); NaN in a key makes every
    row that sees the key NaN, and no row that cannot see it; NaN in a value reaches the rows
    that see it (a row that cannot see it may get NaN too where a backend multiplies the value
    by the row's zero weight: 0 * NaN is NaN)."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 5, 8)).astype(np.float32) for _ in range(3))
    target = {"q": q, "k": k, "v": v}[where]
    target[0, 1, 2, 3] = np.nan  # head 1, position 2
    f = backend.tensor_factory
    got = await fetch(
        backend.tensor_ops.attention(f.from_host(q), f.from_host(k), f.from_host(v), causal=True)
    )
    # causal: query i sees keys 0..i, so key/value 2 is seen by queries 2, 3, 4
    nan_rows = {"q": [2], "k": [2, 3, 4], "v": [2, 3, 4]}[where]
    for h in range(2):
        for i in range(5):
            row = got[0, h, i]
            if h == 1 and i in nan_rows:
                if where == "v":
                    assert np.isnan(row[3]), f"head {h} row {i}: {row} should carry the NaN"
                else:
                    assert np.isnan(row).all(), f"head {h} row {i}: {row} should be NaN"
            elif where != "v" or h == 0:
                assert np.isfinite(row).all(), f"head {h} row {i}: {row} should be finite"


@pytest.mark.parametrize("dtype", [DType.I8, DType.I16, DType.I32, DType.I64], ids=str)
async def test_integer_remainder_at_its_edges(backend: ComputeBackend, dtype: DType) -> None:
    """``mod`` takes the divisor's sign (as Python and NumPy); ``INT_MIN mod -1`` is 0 (C leaves
    ``%`` undefined there) and ``x mod 0`` is 0 (NumPy's value, without its warning)."""
    require_dtype(backend, dtype)
    lo, hi = np.iinfo(dtype.to_numpy()).min, np.iinfo(dtype.to_numpy()).max
    a = np.array([lo, lo, hi, -7, 7, -7, 5, lo], dtype.to_numpy())
    b = np.array([-1, 1, -1, 2, -2, -2, 0, 0], dtype.to_numpy())
    f = backend.tensor_factory
    got = await fetch(backend.tensor_ops.mod(f.from_host(a), f.from_host(b)), dtype)
    expected = [0, 0, 0, 1, -1, -1, 0, 0]
    np.testing.assert_array_equal(got, np.array(expected, dtype.to_numpy()))


async def test_kernels_raise_no_numpy_warnings(backend: ComputeBackend) -> None:
    """Overflow, division by zero and invalid operations give inf and NaN silently: a backend's
    kernels must not emit NumPy RuntimeWarnings (noise in users' logs, and a failed op when the
    user's code turns warnings into errors)."""
    f, ops = backend.tensor_factory, backend.tensor_ops
    big = np.full((4, 4), 1e38, np.float32)
    odd = np.array([[NAN, INF, -INF, 1e38], [1.0, -1.0, 0.0, 4.0]], np.float32)
    tb, to = f.from_host(big), f.from_host(odd)
    w = f.ones((4,))
    with np.errstate(all="ignore"):
        cases: dict[str, tuple[Any, Any]] = {
            "matmul overflow": (lambda: ops.matmul(tb, tb), np.full((4, 4), np.inf)),
            "mul overflow": (lambda: ops.mul(tb, tb), big * big),
            "sum overflow": (lambda: ops.sum(tb), np.float32(np.inf)),
            "div by zero": (lambda: ops.div(to, 0.0), odd / np.float32(0.0)),
            "log of negatives": (lambda: ops.log(to), np.log(odd)),
            "sqrt of negatives": (lambda: ops.sqrt(to), np.sqrt(odd)),
            "exp overflow": (lambda: ops.exp(tb), np.exp(big)),
            "layer_norm": (lambda: ops.layer_norm(to, w, w), None),
            "rms_norm": (lambda: ops.rms_norm(to, w), None),
            "softmax": (lambda: ops.softmax(to), None),
        }
    for name, (run, expected) in cases.items():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = await run().to_host()
        if expected is not None:
            # NaN and infinities exactly where NumPy has them; finite values to a few ulp (a
            # device's log need not round like NumPy's)
            np.testing.assert_allclose(
                got,
                np.asarray(expected, np.float32),
                rtol=2e-6,
                atol=0,
                err_msg=f"{name}: special values differ",
            )


# A matrix of special values: rows with a NaN, with both infinities, with NaN only in places,
# and a finite row.
SPECIAL = np.array(
    [[1, NAN, 3, -INF], [INF, 2, -INF, 0], [NAN, NAN, 1, 1], [2, 5, 5, 1]], np.float32
)


def _numpy(fn: Any) -> Any:
    with np.errstate(all="ignore"):
        return fn(SPECIAL.astype(np.float64))


def _cast_rule(x: np.ndarray[Any, Any], dtype: Any) -> np.ndarray[Any, Any]:
    """accelkit's float-to-integer cast: truncation; NaN and out-of-range values give 0."""
    info = np.iinfo(dtype)
    with np.errstate(all="ignore"):
        ok = np.isfinite(x) & (np.trunc(x) >= info.min) & (np.trunc(x) <= info.max)
        return np.where(ok, np.trunc(np.where(ok, x, 0)), 0).astype(dtype)


FLOAT_CASES: dict[str, tuple[Any, Any]] = {
    # reductions: NaN propagates (max/min too); argmax/argmin give the first NaN, as NumPy
    "sum": (lambda o, t: o.sum(t, axis=-1), lambda x: x.sum(-1)),
    "mean": (lambda o, t: o.mean(t, axis=-1), lambda x: x.mean(-1)),
    "prod": (lambda o, t: o.reduce("prod", t, axis=-1), lambda x: x.prod(-1)),
    "max": (lambda o, t: o.reduce("max", t, axis=-1), lambda x: x.max(-1)),
    "min": (lambda o, t: o.reduce("min", t, axis=-1), lambda x: x.min(-1)),
    "max of all": (lambda o, t: o.reduce("max", t), lambda x: x.max()),
    "argmax": (lambda o, t: o.reduce("argmax", t, axis=-1), lambda x: x.argmax(-1)),
    "argmin": (lambda o, t: o.reduce("argmin", t, axis=-1), lambda x: x.argmin(-1)),
    "argmax of all": (lambda o, t: o.reduce("argmax", t), lambda x: x.argmax()),
    # comparisons: False with NaN, except ne
    "eq": (lambda o, t: o.eq(t, t), lambda x: x == x),
    "ne": (lambda o, t: o.ne(t, t), lambda x: x != x),
    "lt": (lambda o, t: o.lt(t, 2.0), lambda x: x < 2.0),
    "ge": (lambda o, t: o.ge(t, 2.0), lambda x: x >= 2.0),
    # maximum/minimum return the NaN
    "maximum": (lambda o, t: o.maximum(t, 2.0), lambda x: np.maximum(x, 2.0)),
    "minimum": (lambda o, t: o.minimum(t, 2.0), lambda x: np.minimum(x, 2.0)),
    # elementwise functions at the infinities
    "relu": (lambda o, t: o.relu(t), lambda x: np.maximum(x, 0)),
    "sigmoid": (lambda o, t: o.sigmoid(t), lambda x: 1 / (1 + np.exp(-x))),
    "tanh": (lambda o, t: o.tanh(t), np.tanh),
    # silu(-inf) = -inf * sigmoid(-inf) = -inf * 0: NaN, as IEEE arithmetic (and PyTorch) give
    "silu": (lambda o, t: o.silu(t), lambda x: x * (1 / (1 + np.exp(-x)))),
    "exp": (lambda o, t: o.exp(t), np.exp),
    "abs": (lambda o, t: o.abs(t), np.abs),
    "round": (lambda o, t: o.round(t), np.round),
    "pow 0": (lambda o, t: o.pow(t, 0.0), lambda x: x**0.0),
    # C99's pow: (-inf) ** 2.5 is +inf and (-inf) ** -0.5 is +0 (WebGPU gave NaN); a finite
    # negative base with a non-integer exponent is NaN
    "pow 2.5": (lambda o, t: o.pow(t, 2.5), lambda x: x**2.5),
    "pow -0.5": (lambda o, t: o.pow(t, -0.5), lambda x: x**-0.5),
    "div by 0": (lambda o, t: o.div(t, 0.0), lambda x: x / 0.0),
    # norms: a NaN in a row makes the row NaN; an infinity too (layer_norm), or the infinite
    # entries (rms_norm: the finite ones scale by 1/inf to 0)
    "layer_norm": (
        lambda o, t: o.layer_norm(t, None, None),
        lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5),
    ),
    "rms_norm": (
        lambda o, t: o.rms_norm(t, None),
        lambda x: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6),
    ),
    # casts
    "cast to i32": (lambda o, t: o.cast(t, DType.I32), lambda x: _cast_rule(x, np.int32)),
    "cast to u8": (
        lambda o, t: o.cast(o.mul(t, 100.0), DType.U8),
        lambda x: _cast_rule(x * 100, np.uint8),
    ),
    "cast to bool": (lambda o, t: o.cast(t, DType.BOOL), lambda x: x != 0),
}


@pytest.mark.parametrize("case", list(FLOAT_CASES))
async def test_special_values_table(backend: ComputeBackend, case: str) -> None:
    """Each op on NaN and the infinities, against NumPy in float64 (the rules of the table in
    docs/operations.md): infinities and NaN where the reference has them, in the same places."""
    run, reference = FLOAT_CASES[case]
    ops = backend.tensor_ops
    got = await run(ops, backend.tensor_factory.from_host(SPECIAL)).to_host()
    expected = np.asarray(_numpy(reference))
    assert got.shape == expected.shape, f"{case}: shape {got.shape} != {expected.shape}"
    if got.dtype.kind == "f":
        assert (np.isnan(got) == np.isnan(expected)).all(), f"{case}: NaN at {got} vs {expected}"
        assert_close(got, expected.astype(np.float64), DType.F32)
    else:
        np.testing.assert_array_equal(got, expected.astype(got.dtype), err_msg=case)


async def test_tanh_reaches_one_and_gelu_tanh_zero_far_out(backend: ComputeBackend) -> None:
    """tanh is exactly +-1 where F32 holds nothing closer (PoCL's stopped at 1 - 2**-24, at
    the infinities too), so gelu_tanh of a large negative is 0 (it was -29.8 at -1e9), and
    gelu_tanh(-inf) is NaN (-inf x 0), as silu(-inf)."""
    f, ops = backend.tensor_factory, backend.tensor_ops
    big = np.array([-INF, -1e9, -100.0, -20.0, -10.0, 10.0, 20.0, 1e9, INF], np.float32)
    np.testing.assert_array_equal(await fetch(ops.tanh(f.from_host(big))), np.sign(big))
    far = np.array([-1e9, -1e6, -1e4, -100.0, -20.0], np.float32)
    got = await fetch(ops.gelu(f.from_host(far), approximate="tanh"))
    assert np.all(np.abs(got) < 1e-30), got
    assert np.isnan(await fetch(ops.gelu(f.from_host(np.array([-INF], np.float32)), "tanh")))


INT_CASES: dict[str, tuple[Any, Any]] = {
    # two's complement: add, mul, neg and abs wrap; sums of int64 wrap too
    "add wraps": (lambda o, t: o.add(t, t), lambda x: x + x),
    "mul wraps": (lambda o, t: o.mul(t, t), lambda x: x * x),
    "neg wraps": (lambda o, t: o.neg(t), lambda x: -x),
    "abs wraps": (lambda o, t: o.abs(t), np.abs),
    "pow": (lambda o, t: o.pow(t, 2), lambda x: x**2),
    # integer div is true division (F32): x / 0 is +-inf, 0 / 0 NaN
    "div by 0": (lambda o, t: o.div(t, 0), lambda x: x.astype(np.float64) / 0),
    "div by -1": (lambda o, t: o.div(t, -1), lambda x: x.astype(np.float64) / -1),  # INT_MIN too
    "mod by -1": (lambda o, t: o.mod(t, -1), lambda x: np.zeros_like(x)),
}


@pytest.mark.parametrize("case", list(INT_CASES))
async def test_integer_special_cases(backend: ComputeBackend, case: str) -> None:
    require_dtype(backend, DType.I32)
    run, reference = INT_CASES[case]
    x = np.array([2**31 - 1, -(2**31), 5, 0, -3], np.int32)
    got = await run(backend.tensor_ops, backend.tensor_factory.from_host(x)).to_host()
    with np.errstate(all="ignore"):
        expected = np.asarray(reference(x))
    if got.dtype.kind == "f":
        assert (np.isnan(got) == np.isnan(expected)).all(), f"{case}: {got} vs {expected}"
        assert_close(got, expected.astype(np.float64), DType.F32)
    else:
        np.testing.assert_array_equal(got, expected.astype(got.dtype), err_msg=case)


async def test_int64_sums_wrap(backend: ComputeBackend) -> None:
    require_dtype(backend, DType.I64)
    x = np.array([2**62, 2**62, 2**62], np.int64)
    got = await backend.tensor_ops.sum(backend.tensor_factory.from_host(x)).to_host()
    with np.errstate(all="ignore"):
        assert int(got) == int(x.sum())  # -2**62: wrapped


@pytest.mark.parametrize("dtype", [DType.I32, DType.I64, DType.U8], ids=str)
async def test_integer_mean_sums_exactly(backend: ComputeBackend, dtype: DType) -> None:
    """Found by the fuzzing suite: the mean of [INT_MIN, INT_MAX] was 0 (an F32 running sum loses
    the low digits of large integers); integers are summed exactly, then divided once."""
    require_dtype(backend, dtype)
    info = np.iinfo(dtype.to_numpy())
    x = np.array([info.min, info.max, info.max, info.min + 1], dtype.to_numpy())
    got = await backend.tensor_ops.mean(backend.tensor_factory.from_host(x)).to_host()
    assert_close(got, x.astype(np.float64).mean(), DType.F32)


async def test_int64_mean_does_not_overflow(backend: ComputeBackend) -> None:
    """Found by the fuzzing suite on OpenCL: a 64-bit integer running sum overflowed for the
    mean of [1, INT64_MAX]; the mean is taken as NumPy takes it (a float64 sum)."""
    require_dtype(backend, DType.I64)
    x = np.array([1, np.iinfo(np.int64).max], np.int64)
    got = await backend.tensor_ops.mean(backend.tensor_factory.from_host(x)).to_host()
    assert_close(got, x.astype(np.float64).mean(), DType.F32)


SAMPLING: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0},
    "sampled": {},
    "top_k": {"top_k": 2},
    "top_p": {"top_p": 0.5},
    "top_k_and_top_p": {"top_k": 3, "top_p": 0.6},
}


@pytest.mark.parametrize("route", ["fused", "composed"])
@pytest.mark.parametrize("options", list(SAMPLING), ids=list(SAMPLING))
async def test_sampling_outside_its_precondition(
    backend: ComputeBackend, options: str, route: str
) -> None:
    """Logits must be finite or -inf with one finite per row; outside that, every backend and
    route gives the same token: the first NaN (NaN wins, as in argmax), else the first +inf,
    and 0 for a row of only -inf. Top-k and top-p masked the NaN or +inf away (token 0, or a
    finite one)."""
    rows = np.array(
        [
            [0.0, 1.0, NAN, 2.0], [-INF, -INF, -INF, -INF], [0.0, INF, 1.0, INF],
            [1.0, INF, 2.0, NAN], [3.0, 2.0, 1.0, INF], [0, 50, 1, 2],
        ],
        np.float32,
    )  # fmt: skip
    f, ko = backend.tensor_factory, backend.kernel_ops.twin(route)  # type: ignore[arg-type]
    for row, want in zip(rows, [2, 0, 1, 3, 3, 1], strict=True):
        got = await ko.sample_token(f.from_host(row), seed=1, **SAMPLING[options]).to_host()
        assert int(got) == want, f"{row}: token {int(got)}, expected {want}"
