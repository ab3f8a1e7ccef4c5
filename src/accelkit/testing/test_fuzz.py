"""Property-based fuzzing (Hypothesis) of TensorOps and TensorFactory, on every backend.

Two properties:

- **Accepted calls are right.** Elementwise ops (broadcast shapes, zero-size included, strided
  and permuted inputs, NaN and infinities), reductions and casts match NumPy, computed in float64
  from the same inputs, within the dtype's tolerance (exactly for integers and bools).
- **Refused calls are clean.** A call with bad arguments (garbage shapes, axes, dtypes, scalars,
  seeds, shapes that do not broadcast) raises an ``AccelError`` with a message, and before
  allocating anything: ``memory_info().used`` and the allocation count are unchanged.

The profile is ``ACCELKIT_FUZZ_PROFILE``: ``accelkit-ci`` (the default: a few dozen examples per
property, derandomized, so that CI is repeatable) or ``accelkit-fuzz`` (hundreds, random: what
``nox -s fuzz`` runs). Hypothesis keeps no example database here (nothing is written to disk).
Blocking reads (``Tensor.numpy()``) are used inside the properties: Hypothesis drives plain
functions, and a blocking read waits on the stream, not on the event loop.
"""

from __future__ import annotations

import gc
import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from accelkit import AccelError, ComputeBackend, DType, Tensor

from .checks import assert_close

# A kernel check: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]

settings.register_profile(
    "accelkit-ci",
    max_examples=30,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "accelkit-fuzz",
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
PROFILE = settings.get_profile(os.environ.get("ACCELKIT_FUZZ_PROFILE", "accelkit-ci"))

SPECIALS = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0]
VALUE_DTYPES = [DType.F32, DType.F64, DType.I32, DType.I64, DType.U8, DType.BOOL]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "mod", "eq", "ne", "lt", "le", "gt"]
UNARY = ["neg", "abs", "relu", "exp", "log", "sqrt", "tanh", "sigmoid", "floor", "ceil", "round"]
REDUCE = ["sum", "max", "min", "argmax", "argmin", "mean"]


def _dtypes(backend: ComputeBackend, pool: list[DType]) -> list[DType]:
    found = [d for d in pool if d in backend.capabilities.dtypes]
    if not found:
        pytest.skip(f"{backend.name} claims none of {[d.value for d in pool]}")
    return found


def _values(dtype: DType) -> st.SearchStrategy[Any]:
    npd = dtype.to_numpy()
    if dtype is DType.BOOL:
        return st.booleans()
    if dtype.is_integer:
        info = np.iinfo(npd)
        edges = [int(info.min), int(info.max), 0, -1 if info.min < 0 else 1]
        return st.one_of(
            st.integers(-100, 100).filter(lambda v: info.min <= v <= info.max),
            st.sampled_from(edges),
        )
    return st.one_of(
        st.floats(-1e4, 1e4, width=32 if dtype is DType.F32 else 64),
        st.sampled_from(SPECIALS),
    )


def _array(dtype: DType, shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray[Any, Any]]:
    return hnp.arrays(dtype.to_numpy(), shape, elements=_values(dtype))


def _device(backend: ComputeBackend, host: np.ndarray[Any, Any], layout: int) -> Tensor:
    """The host array on the device, as a dense tensor (layout 0) or as a permuted/strided view
    of a larger tensor (layouts 1, 2): what an op sees after transpose or narrow."""
    f, ops = backend.tensor_factory, backend.tensor_ops
    if layout == 1 and host.ndim >= 2:
        t = f.from_host(np.ascontiguousarray(np.swapaxes(host, -1, -2)))
        return ops.transpose(t, -1, -2)
    if layout == 2 and host.ndim >= 1:
        wide = np.concatenate([host, host], axis=-1)
        return ops.narrow(f.from_host(wide), host.ndim - 1, host.shape[-1], host.shape[-1])
    return f.from_host(host)


def _compare(got: np.ndarray[Any, Any], expected: np.ndarray[Any, Any], what: str) -> None:
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    if got.dtype.kind == "f":
        assert (np.isnan(got) == np.isnan(expected)).all(), f"{what}: NaN differ: {got} {expected}"
        dt = DType.F64 if got.dtype == np.float64 else DType.F32
        assert_close(got.astype(np.float64), expected.astype(np.float64), dt, scale=4.0)
    else:
        np.testing.assert_array_equal(got, expected.astype(got.dtype), err_msg=what)


def _binary_reference(op: str, a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> Any:
    with np.errstate(all="ignore"):
        if op == "div":
            return a.astype(np.float64) / b.astype(np.float64)
        if op == "mod" and a.dtype.kind in "iu":
            safe = np.where(b == 0, 1, b)
            r = np.mod(a, safe)
            return np.where(b == 0, 0, r).astype(a.dtype)
        if a.dtype == np.bool_ and op in ("add", "mul"):
            return (np.logical_or if op == "add" else np.logical_and)(a, b)
        return _NUMPY_BINARY[op](a, b)


_NUMPY_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum,
    "minimum": np.minimum, "mod": np.mod, "eq": np.equal, "ne": np.not_equal, "lt": np.less,
    "le": np.less_equal, "gt": np.greater,
}  # fmt: skip


async def test_binary_ops_match_numpy(backend: ComputeBackend) -> None:
    dtypes = _dtypes(backend, VALUE_DTYPES)

    @PROFILE
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        dtype = data.draw(st.sampled_from(dtypes), "dtype")
        op = data.draw(st.sampled_from(BINARY), "op")
        if dtype is DType.BOOL and op in ("sub", "div", "mod"):
            return  # refused for bool (checked by the bad-input suite)
        if op == "mod" and not dtype.is_integer and dtype is not DType.BOOL:
            return  # float mod near 0 divisors differs by rounding at the sign flip
        shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4))
        a = data.draw(_array(dtype, shapes.input_shapes[0]), "a")
        b = data.draw(_array(dtype, shapes.input_shapes[1]), "b")
        layout = data.draw(st.integers(0, 2), "layout")
        got = getattr(backend.tensor_ops, op)(_device(backend, a, layout), _device(backend, b, 0))
        _compare(got.numpy(), np.asarray(_binary_reference(op, a, b)), f"{op} {dtype.value}")

    check()


async def test_unary_ops_match_numpy(backend: ComputeBackend) -> None:
    dtypes = _dtypes(backend, [DType.F32, DType.F64])
    refs: dict[str, Callable[[Any], Any]] = {
        "neg": np.negative, "abs": np.abs, "relu": lambda x: np.maximum(x, 0), "exp": np.exp,
        "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
        "floor": np.floor, "ceil": np.ceil, "round": np.round,
    }  # fmt: skip

    @PROFILE
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        dtype = data.draw(st.sampled_from(dtypes), "dtype")
        op = data.draw(st.sampled_from(UNARY), "op")
        shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
        x = data.draw(_array(dtype, shape), "x")
        if op == "exp":  # keep away from the overflow threshold, where rounding decides inf
            x = np.where(np.isfinite(x), np.clip(x, -80, 80), x).astype(x.dtype)
        layout = data.draw(st.integers(0, 2), "layout")
        got = getattr(backend.tensor_ops, op)(_device(backend, x, layout)).numpy()
        with np.errstate(all="ignore"):
            expected = np.asarray(refs[op](x.astype(np.float64))).astype(x.dtype)
        _compare(got, expected, f"{op} {dtype.value}")

    check()


async def test_reductions_match_numpy_or_refuse_cleanly(backend: ComputeBackend) -> None:
    dtypes = _dtypes(backend, [DType.F32, DType.F64, DType.I32, DType.I64])

    @PROFILE
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        dtype = data.draw(st.sampled_from(dtypes), "dtype")
        op = data.draw(st.sampled_from(REDUCE), "op")
        shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5))
        x = data.draw(_array(dtype, shape), "x")
        axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)), "axis")
        t = _device(backend, x, data.draw(st.integers(0, 2), "layout"))
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's "mean of empty slice"
            try:
                expected = getattr(np, op)(x.astype(np.float64), axis=axis)
            except ValueError:  # NumPy refuses max/argmax of an empty axis: so must accelkit
                _refused(backend, lambda: backend.tensor_ops.reduce(op, t, axis=axis).numpy())
                return
        got = backend.tensor_ops.reduce(op, t, axis=axis).numpy()
        if op in ("sum", "max", "min") and dtype.is_integer:
            expected = getattr(np, op)(x, axis=axis)  # integer arithmetic, wrapping
        _compare(got, np.asarray(expected), f"{op} {dtype.value} axis={axis} of {shape}")

    check()


async def test_casts_follow_the_cast_rule(backend: ComputeBackend) -> None:
    sources = _dtypes(backend, [DType.F32, DType.F64])
    targets = _dtypes(backend, [DType.I32, DType.I64, DType.U8, DType.BOOL, DType.F32, DType.F64])

    @PROFILE
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        src = data.draw(st.sampled_from(sources), "src")
        dst = data.draw(st.sampled_from(targets), "dst")
        shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=6))
        x = data.draw(
            hnp.arrays(src.to_numpy(), shape, elements=st.one_of(
                st.floats(-3e9, 3e9, width=32), st.sampled_from(SPECIALS))),
        )  # fmt: skip
        got = backend.tensor_ops.cast(backend.tensor_factory.from_host(x), dst).numpy()
        npd = dst.to_numpy()
        with np.errstate(all="ignore"):
            if dst is DType.BOOL:
                expected = x != 0
            elif dst.is_integer:
                info = np.iinfo(npd)
                t = np.trunc(x.astype(np.float64))
                ok = np.isfinite(t) & (t >= info.min) & (t <= info.max)
                expected = np.where(ok, np.where(ok, t, 0), 0).astype(npd)
            else:
                expected = x.astype(npd)
        _compare(got, np.asarray(expected), f"cast {src.value} -> {dst.value}")

    check()


# -- refusals ---------------------------------------------------------------------------------------
# Integers are small, or far too large for any device: a valid request of several GB (an
# arange of 2**30 elements) would be honoured, and would only measure the machine's memory.
_INTS = st.one_of(st.integers(-3, 64), st.sampled_from([2**40, 2**62, 2**70, -(2**40)]))
_GARBAGE = st.one_of(
    st.none(),
    st.text(max_size=3),
    st.floats(allow_nan=True, allow_infinity=True).filter(lambda v: not 64 < abs(v) < 2**40),
    _INTS,
    st.booleans(),
    st.lists(st.one_of(_INTS, st.text(max_size=2), st.none()), max_size=4),
    st.tuples(st.integers(2**31, 2**40), st.integers(2**31, 2**40), st.just(0)),
    st.just(object()),
    st.just(np.float32(1.5)),
)


def _refused(backend: ComputeBackend, call: Callable[[], Any]) -> None:
    """``call`` must raise an AccelError with a message, with memory as it was."""
    mm = backend.memory_manager
    gc.collect()  # tensors of earlier examples in cycles would otherwise be freed mid-call
    before = mm.memory_info()
    error = _raised(call, "the call")
    after = mm.memory_info()
    assert error is not None, "the call was accepted"
    # Not "equal": a device backend's stream-ordered frees of earlier examples may land during
    # the call (gc.collect() queues them; the stream retires them when it gets there).
    assert after.used <= before.used, f"used {before.used} -> {after.used} on a refusal"
    assert after.active_allocations <= before.active_allocations


def _raised(call: Callable[[], Any], what: str) -> AccelError | None:
    """The AccelError ``call`` raised, or None if it returned (its result is then read); fails
    on a raw exception, or on an AccelError without a message."""
    error: AccelError | None = None
    try:
        result = call()
    except AccelError as exc:
        error = exc
    except Exception as exc:  # a raw exception escaped the API
        raise AssertionError(f"{what}: raw {type(exc).__name__} escaped: {exc!r}") from exc
    else:
        if isinstance(result, Tensor):
            result.numpy()
    assert error is None or str(error), f"{what}: {type(error).__name__} without a message"
    return error


def _calls(backend: ComputeBackend, g: Any) -> list[Callable[[], Any]]:
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.ones((2, 3))
    img = f.ones((1, 3, 5, 5))
    w = f.ones((2, 3, 3, 3))
    q = f.ones((1, 2, 4, 8))
    idx = f.zeros((2, 3), DType.I64)
    targets = f.zeros((2,), DType.I64)
    return [
        lambda: f.empty(g),
        lambda: f.zeros((2, 2), g),
        lambda: f.full((2,), g),
        lambda: f.full(g, 1.0),
        lambda: f.arange(g),
        lambda: f.arange(0, g, 1),
        lambda: f.eye(g),
        lambda: f.normal((3,), seed=g),
        lambda: f.uniform((3,), g, 1.0),
        lambda: f.from_host(g, dtype=g),
        lambda: ops.reshape(x, g),
        lambda: ops.sum(x, axis=g),
        lambda: ops.permute(x, g),
        lambda: ops.transpose(x, g, 0),
        lambda: ops.narrow(x, 1, g, 1),
        lambda: ops.cast(x, g),
        lambda: ops.add(x, g),
        lambda: ops.softmax(x, axis=g),
        lambda: ops.concat(g, 0),
        lambda: ops.matmul(x, g),
        lambda: ops.gaussian_blur(x, g),
        lambda: ops.gaussian_blur(img, 1.0, g),
        lambda: ops.threshold(img, g),
        lambda: ops.brightness(img, g),
        lambda: ops.conv2d(img, w, stride=g),
        lambda: ops.conv2d(img, w, padding=g),
        lambda: ops.conv2d(img, w, groups=g),
        lambda: ops.attention(q, q, q, scale=g),
        lambda: ops.attention(q, q, q, mask=g),
        lambda: ops.layer_norm(x, None, None, eps=g),
        lambda: ops.rms_norm(x, g),
        lambda: ops.cross_entropy(x, g),
        lambda: ops.embedding(g, x),
        lambda: ops.gather(x, 1, g),
        lambda: ops.scatter(x, g, idx, x),
        lambda: ops.split(x, g, 1),
        lambda: ops.stack([x, x], g),
        lambda: ops.gemm(x, x, trans_b=True, alpha=g),
        lambda: ops.linear(x, g),
        lambda: ops.where(g, x, x),
        lambda: ops.reduce(g, x),
        lambda: ops.unary(g, x),
        lambda: ops.binary(g, x, x),
        lambda: ops.pow(x, g),
        lambda: ops.mod(idx, g),
        # issue 12's ops (tile is left out: a valid list of four 64s is a 100M-element tile)
        lambda: ops.floor_divide(idx, g),
        lambda: ops.left_shift(idx, g),
        lambda: ops.bitwise_and(idx, g),
        lambda: ops.pad(x, g),
        lambda: ops.pad(x, 1, g),
        lambda: ops.pad(x, 1, value=g),
        lambda: ops.pad(x, [(0, 0), (g, 1)], "reflect"),
        lambda: ops.broadcast_to(x, g),
        lambda: ops.flip(x, g),
        lambda: ops.narrow(x, 1, 2, 2, g),
        lambda: ops.tril(x, g),
        lambda: ops.one_hot(idx, g),
        lambda: f.eye(3, k=g),
        lambda: ops.cumsum(x, g),
        lambda: ops.cumprod(x, 1, exclusive=g),
        lambda: ops.sort(x, g),
        lambda: ops.argsort(x, descending=g),
        lambda: ops.topk(x, g),
        lambda: ops.argmax(x, 1, last=g),
        lambda: ops.max_pool2d(img, g),
        lambda: ops.avg_pool2d(img, 2, g),
        lambda: ops.avg_pool2d(img, 3, padding=g),
        lambda: ops.adaptive_avg_pool2d(img, g),
        lambda: ops.conv_transpose2d(img, w, output_padding=g),
        lambda: ops.conv1d(x, g),
        lambda: ops.batch_norm(img, training=True, momentum=g),
        lambda: ops.group_norm(img, g),
        lambda: ops.cross_entropy(x, g, label_smoothing=0.1),
        lambda: ops.cross_entropy(x, targets, ignore_index=g),
        lambda: ops.mse_loss(x, g),
        lambda: ops.binary_cross_entropy_with_logits(x, x, pos_weight=g),
        lambda: ops.scatter(x, 0, idx, x, g),
        lambda: ops.index_add(x, 0, g, x),
        lambda: ops.gather_nd(x, g),
        lambda: ops.attention(q, q, q, causal=True, window=g),
        lambda: ops.attention(q, q, q, key_lengths=g),
        lambda: ops.attention(q, q, q, softcap=g),
        lambda: ops.attention(q, q, q, causal_alignment=g),
        lambda: ops.apply_rotary(q, g, g),
    ]


async def test_bad_arguments_raise_accel_errors_before_allocating(backend: ComputeBackend) -> None:
    count = len(_calls(backend, None))

    @PROFILE
    @given(garbage=_GARBAGE, which=st.integers(0, count - 1))
    def check(garbage: Any, which: int) -> None:
        call = _calls(backend, garbage)[which]
        mm = backend.memory_manager
        gc.collect()
        before = mm.memory_info().used
        if _raised(call, f"call {which} with {garbage!r}") is not None:
            # refused: nothing allocated (an accepted call is fine: the garbage was valid)
            # (<=: stream-ordered frees of earlier examples may land meanwhile, see _refused)
            assert mm.memory_info().used <= before, f"call {which} refused {garbage!r} late"

    check()


async def test_shapes_that_do_not_broadcast_are_refused(backend: ComputeBackend) -> None:
    @PROFILE
    @given(
        a=hnp.array_shapes(min_dims=1, max_dims=3, min_side=2, max_side=4),
        b=hnp.array_shapes(min_dims=1, max_dims=3, min_side=2, max_side=4),
    )
    def check(a: tuple[int, ...], b: tuple[int, ...]) -> None:
        try:
            np.broadcast_shapes(a, b)
        except ValueError:
            f = backend.tensor_factory
            x, y = f.ones(a), f.ones(b)
            _refused(backend, lambda: backend.tensor_ops.add(x, y))

    check()
