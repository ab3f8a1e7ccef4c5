"""TensorFactory, tensor metadata, transfers and operators."""

from __future__ import annotations

import array
from typing import Any

import numpy as np
import pytest

import accelkit
from accelkit import ComputeBackend, DType, Tensor

from .checks import ALL_DTYPES, FLOATS, assert_close, fetch, ids, require_dtype, sample

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ids(ALL_DTYPES))
async def test_empty_metadata(backend: ComputeBackend, dtype: DType) -> None:
    require_dtype(backend, dtype)
    t = backend.tensor_factory.empty((2, 3, 4), dtype)
    assert isinstance(t, Tensor)
    assert t.shape == (2, 3, 4)
    assert t.dtype is dtype
    assert t.ndim == 3
    assert t.size == 24
    assert t.nbytes == 24 * dtype.itemsize
    assert len(t) == 2
    assert t.device == backend.device
    assert t.backend is backend
    assert t.is_alive
    assert dtype.value in repr(t)
    host = await fetch(t, dtype)
    assert host.shape == (2, 3, 4)


async def test_empty_accepts_int_and_list_shapes_and_dtype_names(backend: ComputeBackend) -> None:
    f = backend.tensor_factory
    assert f.empty(5).shape == (5,)
    assert f.empty([2, 3]).shape == (2, 3)
    assert f.empty((), "float64").dtype is DType.F64
    # a NumPy type: accepted at run time beyond the declared DType | str
    assert f.empty((0, 4), np.int32).shape == (0, 4)  # type: ignore[arg-type]
    assert (await fetch(f.empty((0, 4)))).size == 0


async def test_zero_d_tensor_has_no_len(backend: ComputeBackend) -> None:
    t = backend.tensor_factory.zeros(())
    assert t.ndim == 0
    assert t.size == 1
    with pytest.raises(TypeError):
        len(t)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ids(ALL_DTYPES))
async def test_zeros_ones_full(backend: ComputeBackend, dtype: DType) -> None:
    require_dtype(backend, dtype)
    f = backend.tensor_factory
    npd = dtype.to_numpy()
    np.testing.assert_array_equal(await fetch(f.zeros((3, 2), dtype), dtype), np.zeros((3, 2), npd))
    np.testing.assert_array_equal(await fetch(f.ones((4,), dtype), dtype), np.ones((4,), npd))
    value = True if dtype is DType.BOOL else 7
    np.testing.assert_array_equal(
        await fetch(f.full((2, 2), value, dtype), dtype), np.full((2, 2), value, npd)
    )


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
async def test_full_float_value(backend: ComputeBackend, dtype: DType) -> None:
    require_dtype(backend, dtype)
    got = await fetch(backend.tensor_factory.full((3,), -2.5, dtype), dtype)
    np.testing.assert_array_equal(got.astype(np.float64), [-2.5, -2.5, -2.5])


async def test_full_integral_float_into_int_dtype(backend: ComputeBackend) -> None:
    got = await fetch(backend.tensor_factory.full((2,), 3.0, DType.I32), DType.I32)
    np.testing.assert_array_equal(got, [3, 3])


@pytest.mark.parametrize("dtype", [DType.F32, DType.I32, DType.BF16, DType.U8], ids=str)
async def test_like_constructors(backend: ComputeBackend, dtype: DType) -> None:
    require_dtype(backend, dtype)
    f = backend.tensor_factory
    src = f.ones((2, 5), dtype)
    e = f.empty_like(src)
    assert (e.shape, e.dtype) == ((2, 5), dtype)
    z = f.zeros_like(src)
    np.testing.assert_array_equal(await fetch(z, dtype), np.zeros((2, 5), dtype.to_numpy()))
    z64 = f.zeros_like(src, dtype=DType.F64)
    assert z64.dtype is DType.F64
    assert z64.shape == (2, 5)
    assert f.empty_like(src, "i64").dtype is DType.I64


@pytest.mark.parametrize(
    ("args", "kwargs", "expected", "dtype"),
    [
        ((5,), {}, np.arange(5), DType.I64),
        ((2, 9, 3), {}, np.arange(2, 9, 3), DType.I64),
        ((5, 0, -2), {}, np.array([5, 3, 1]), DType.I64),
        ((0, 1, 0.25), {}, np.array([0.0, 0.25, 0.5, 0.75]), DType.F32),
        ((1.5,), {}, np.array([0.0, 1.0]), DType.F32),
        ((0, 4), {"dtype": DType.F64}, np.arange(4.0), DType.F64),
        ((3, 1), {}, np.arange(0), DType.I64),
        ((-3, 3, 2), {"dtype": "i8"}, np.array([-3, -1, 1]), DType.I8),
        # Integers beyond float64's 2**53, exactly (range's values, and its length).
        ((2**53, 2**53 + 4), {}, np.array(range(2**53, 2**53 + 4)), DType.I64),
        (
            (-(2**63), 2**63 - 1, 2**62 + 1),
            {},
            np.array(range(-(2**63), 2**63 - 1, 2**62 + 1)),
            DType.I64,
        ),
        ((0, 2**60 + 1, 2**60), {}, np.array([0, 2**60]), DType.I64),
    ],
)
async def test_arange(
    backend: ComputeBackend,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    expected: np.ndarray[Any, Any],
    dtype: DType,
) -> None:
    require_dtype(backend, dtype)
    t = backend.tensor_factory.arange(*args, **kwargs)
    assert_close(await fetch(t, dtype), expected, dtype)


async def test_arange_beyond_int64_is_refused(backend: ComputeBackend) -> None:
    f = backend.tensor_factory
    for args in [(2**63, 2**63 + 1), (0, 2**64, 2**63), (-(2**63) - 1, 0, 2**62)]:
        with pytest.raises(accelkit.InvalidArgumentError, match="64-bit"):
            f.arange(args[0], args[1], args[2] if len(args) > 2 else 1)


async def test_numbers_the_dtype_cannot_hold_are_refused(backend: ComputeBackend) -> None:
    """``arange``, ``full``, ``from_host`` of Python numbers and ``uniform`` refuse what the
    dtype asked for cannot hold, before allocating: arange(250, 260, u8) wrapped to 0 after
    255, from_host([300], u8) gave 44 and [2**64] raised a raw OverflowError, full(2**200, F32)
    gave inf (2**1100 a raw OverflowError), and uniform over [1.0001, 1.0002) in F16 gave 1.0,
    below low (F32 holds no value in [1 + 1e-8, 1 + 2e-8) either). Arrays keep NumPy's casting (``astype``)."""
    f = backend.tensor_factory
    await backend.synchronize()
    used = backend.memory_manager.memory_info().used
    calls: list[tuple[Any, str]] = [
        (lambda: f.arange(250, 260, dtype="u8"), "does not fit u8"),
        (lambda: f.arange(-3, 3, dtype="u8"), "does not fit u8"),
        (lambda: f.arange(2**31 - 2, 2**31 + 2, dtype="i32"), "does not fit i32"),
        (lambda: f.arange(0, 5, dtype="bool"), "does not fit bool"),
        (lambda: f.arange(0.5, 300.5, dtype="u8"), "does not fit u8"),
        (lambda: f.from_host([300], dtype="u8"), "cannot read list as u8"),
        (lambda: f.from_host([[1], [-1]], dtype="u64"), "cannot read list as u64"),
        (lambda: f.from_host([2**64], dtype="u64"), "cannot read list as u64"),
        (lambda: f.from_host([float("nan")], dtype="i32"), "cannot read list as i32"),
        (lambda: f.from_host(10**400, dtype="i64"), "cannot read int as i64"),
        (lambda: f.from_host([None, 1], dtype="i32"), "cannot read list as i32"),
        (lambda: f.from_host([2**1100], dtype="f32"), "cannot read list as f32"),
        (lambda: f.full((2,), 2**200, "f32"), "overflows f32"),
        (lambda: f.full((2,), 2**1100, "f32"), "beyond the range"),
        (lambda: f.full((2,), 1e39, "f32"), "overflows f32"),
        (lambda: f.uniform((4,), 1 + 1e-8, 1 + 2e-8, dtype="f32"), "holds no value"),
    ]
    for call, message in calls:
        with pytest.raises(accelkit.InvalidArgumentError, match=message):
            call()
    assert backend.memory_manager.memory_info().used == used
    # What fits is kept: the bounds themselves, an infinity asked for, NumPy scalars, arrays
    # cast as astype casts them, and any number as a bool.
    np.testing.assert_array_equal(await fetch(f.arange(250, 256, dtype="u8")), np.arange(250, 256))
    np.testing.assert_array_equal(await fetch(f.from_host([0, 255], dtype="u8")), [0, 255])
    big = await fetch(f.from_host([2**64 - 1, 0], dtype="u64"))  # exact: not read via float64
    np.testing.assert_array_equal(big, np.array([2**64 - 1, 0], np.uint64))
    typed = await fetch(f.from_host([np.array([300], np.int32)], dtype="u8"))  # cast as astype
    np.testing.assert_array_equal(typed, np.array([[300]], np.int32).astype(np.uint8))
    np.testing.assert_array_equal(await fetch(f.from_host(["1.5", "2"], dtype="f32")), [1.5, 2])
    np.testing.assert_array_equal(await fetch(f.from_host([2, 0], dtype="bool")), [True, False])
    np.testing.assert_array_equal(
        await fetch(f.from_host(np.array([300]), dtype="u16")), np.array([300], np.uint16)
    )
    np.testing.assert_array_equal(await fetch(f.full((2,), float("inf"), "f32")), np.inf)
    np.testing.assert_array_equal(await fetch(f.full((2,), np.float32(1.5), "f32")), 1.5)
    np.testing.assert_array_equal(await fetch(f.arange(np.int64(3))), [0, 1, 2])
    np.testing.assert_array_equal(await fetch(f.uniform((3,), 2.0, 2.0)), 2.0)


@pytest.mark.parametrize(("n", "m"), [(3, None), (2, 4), (4, 2), (0, None)])
@pytest.mark.parametrize("dtype", [DType.F32, DType.I64, DType.BOOL, DType.F16], ids=str)
async def test_eye(backend: ComputeBackend, n: int, m: int | None, dtype: DType) -> None:
    require_dtype(backend, dtype)
    t = backend.tensor_factory.eye(n, m, dtype=dtype)
    np.testing.assert_array_equal(await fetch(t, dtype), np.eye(n, m, dtype=dtype.to_numpy()))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ids(ALL_DTYPES))
async def test_from_host_keeps_the_array_dtype(backend: ComputeBackend, dtype: DType) -> None:
    require_dtype(backend, dtype)
    a = sample((3, 4), dtype, seed=3)
    t = backend.tensor_factory.from_host(a)
    np.testing.assert_array_equal(await fetch(t, dtype), a)


@pytest.mark.parametrize(
    ("data", "dtype", "expected"),
    [
        ([[1.5, 2], [3, 4]], DType.F32, [[1.5, 2.0], [3.0, 4.0]]),
        ([1, 2, 3], DType.I64, [1, 2, 3]),
        ([True, False], DType.BOOL, [True, False]),
        (2.5, DType.F32, 2.5),
        (7, DType.I64, 7),
    ],
)
async def test_from_host_python_data_defaults(
    backend: ComputeBackend, data: Any, dtype: DType, expected: Any
) -> None:
    t = backend.tensor_factory.from_host(data)
    assert_close(await fetch(t, dtype), np.asarray(expected), dtype)


@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16, DType.F64, DType.I16, DType.U8], ids=str)
async def test_from_host_explicit_dtype_converts(backend: ComputeBackend, dtype: DType) -> None:
    require_dtype(backend, dtype)
    t = backend.tensor_factory.from_host([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], dtype=dtype)
    got = await fetch(t, dtype)
    np.testing.assert_array_equal(got.astype(np.float64), np.arange(6.0).reshape(2, 3))


async def test_from_host_snapshots_its_input(backend: ComputeBackend) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = backend.tensor_factory.from_host(a)
    a[...] = -1.0  # the caller may reuse its array at once
    np.testing.assert_array_equal(await fetch(t), np.arange(6, dtype=np.float32).reshape(2, 3))


async def test_from_host_non_contiguous_and_bytes(backend: ComputeBackend) -> None:
    f = backend.tensor_factory
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    np.testing.assert_array_equal(await fetch(f.from_host(a.T)), a.T)
    np.testing.assert_array_equal(await fetch(f.from_host(a[:, ::2])), a[:, ::2])
    # ndarray is a Buffer, but numpy's stubs say so only for Python 3.12 and later
    b = f.from_host(memoryview(np.array([1, 2, 3], np.int16)))  # type: ignore[arg-type]
    np.testing.assert_array_equal(await fetch(b, DType.I16), [1, 2, 3])
    # Big-endian data is its values' dtype (it was refused as an unknown dtype).
    big = f.from_host(np.arange(5, dtype=">f4"))
    assert big.dtype is DType.F32
    np.testing.assert_array_equal(await fetch(big), np.arange(5, dtype=np.float32))


async def test_from_host_keeps_typed_data_s_dtype_and_reads_python_numbers(
    backend: ComputeBackend,
) -> None:
    """Typed float64 data (a buffer, array.array, an ``__array__`` object) stays F64; Python
    floats give F32, Python ints I64, and ints beyond I64 are refused (they became F32)."""
    f = backend.tensor_factory
    x64 = np.array([0.1, 1 + 2**-40, 1e300])

    class ArrayLike:
        def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray[Any, Any]:
            return x64

    if DType.F64 in backend.capabilities.dtypes:
        typed: list[Any] = [memoryview(x64.data), array.array("d", x64), ArrayLike()]
        for data in typed:
            t = f.from_host(data)
            assert t.dtype is DType.F64, type(data)
            np.testing.assert_array_equal(await fetch(t, DType.F64), x64)
    assert f.from_host([0.5, 2]).dtype is DType.F32
    assert f.from_host([[1, 2], [3, 4]]).dtype is DType.I64
    # A list of typed data keeps its dtype (u8 planes were refused as big Python ints), and a
    # list subclass or a namedtuple of floats is Python floats (it became F64).
    planes = [np.zeros((2, 2), np.uint8), np.ones((2, 2), np.uint8)]
    assert f.from_host(planes).dtype is DType.U8

    class Floats(list[float]):
        pass

    assert f.from_host(Floats([0.5, 1.5])).dtype is DType.F32
    for big in ([2**63, 1], [2**63], 2**63, [2**64]):
        with pytest.raises(accelkit.InvalidArgumentError, match="beyond"):
            f.from_host(big)


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
async def test_uniform(backend: ComputeBackend, dtype: DType) -> None:
    require_dtype(backend, dtype)
    f = backend.tensor_factory
    a = await fetch(f.uniform((64, 32), -3.0, 5.0, seed=11, dtype=dtype), dtype)
    b = await fetch(f.uniform((64, 32), -3.0, 5.0, seed=11, dtype=dtype), dtype)
    c = await fetch(f.uniform((64, 32), -3.0, 5.0, seed=12, dtype=dtype), dtype)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    x = a.astype(np.float64)
    assert x.min() >= -3.0
    assert x.max() < 5.0
    assert abs(x.mean() - 1.0) < 0.3
    # The documented default generator: NumPy's PCG64, so seeds agree across the backends that
    # draw on the host; a device generator is checked by the statistics above and below.
    if not f.kernels.device_random:
        expected = np.random.default_rng(11).uniform(-3.0, 5.0, size=(64, 32))
        assert_close(a, expected.astype(dtype.to_numpy()), dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
async def test_uniform_stays_below_high_in_the_output_dtype(
    backend: ComputeBackend, dtype: DType
) -> None:
    """``[low, high)`` holds once the samples are rounded to the output's dtype: of 2**20
    samples over [0, 1), BF16 rounded about 2,000 up to 1.0 and F16 about 270; over
    [1e6, 1e6 + 1) F32 (a spacing of 1/16 there) about 31,000 up to 1e6 + 1; and a low the
    dtype does not hold drew samples below it."""
    require_dtype(backend, dtype)
    f = backend.tensor_factory
    wide = dtype in (DType.F32, DType.F64)
    # A low the dtype does not hold: samples rounded below it (BF16 [1.0001, 1.5): 7959 of
    # 2**20 at 1.0; F16 [0.1, 0.2): 73; F32 [1e6 + 0.01, 1e6 + 1): 22497 at 1e6).
    bounds = [(0.0, 1.0), (1.0001, 1.5)] + ([(1e6, 1e6 + 1), (1e6 + 0.01, 1e6 + 1)] if wide else [])
    if dtype is DType.F16:
        bounds.append((0.1, 0.2))
    for low, high in bounds:
        x = await fetch(f.uniform((1 << 20,), low, high, seed=0, dtype=dtype), dtype)
        x = x.astype(np.float64)
        assert x.min() >= low, f"{int(np.sum(x < low))} samples below low {low}"
        assert x.max() < high, f"{int(np.sum(x >= high))} samples equal high {high}"


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
async def test_normal(backend: ComputeBackend, dtype: DType) -> None:
    require_dtype(backend, dtype)
    f = backend.tensor_factory
    a = await fetch(f.normal((100, 100), 2.0, 0.5, seed=4, dtype=dtype), dtype)
    b = await fetch(f.normal((100, 100), 2.0, 0.5, seed=4, dtype=dtype), dtype)
    np.testing.assert_array_equal(a, b)
    x = a.astype(np.float64)
    assert abs(x.mean() - 2.0) < 0.02
    assert abs(x.std() - 0.5) < 0.02
    if not f.kernels.device_random:
        expected = np.random.default_rng(4).normal(2.0, 0.5, size=(100, 100))
        assert_close(a, expected.astype(dtype.to_numpy()), dtype)


async def test_normal_zero_std_is_constant(backend: ComputeBackend) -> None:
    got = await fetch(backend.tensor_factory.normal((10,), 3.0, 0.0, seed=1))
    np.testing.assert_array_equal(got, np.full(10, 3.0, np.float32))


async def test_from_dlpack(backend: ComputeBackend) -> None:
    a = np.arange(10, dtype=np.float32).reshape(2, 5)
    t = backend.tensor_factory.from_dlpack(a)
    np.testing.assert_array_equal(await fetch(t, DType.F32), a)


async def test_dlpack_export_where_supported(backend: ComputeBackend) -> None:
    t = backend.tensor_factory.arange(6, dtype=DType.F32)
    try:
        device = t.__dlpack_device__()
        exported = np.from_dlpack(t)
    except accelkit.UnsupportedOperationError:
        pytest.skip(f"{backend.name} tensors do not export DLPack")
    assert isinstance(device, tuple)
    assert len(device) == 2
    np.testing.assert_array_equal(exported, np.arange(6, dtype=np.float32))


async def test_to_device_from_another_backend_instance(backend: ComputeBackend) -> None:
    src = backend.tensor_factory.from_host(np.arange(6, dtype=np.int32).reshape(3, 2))
    async with accelkit.open_backend("cpu") as other:
        moved = await other.tensor_factory.to_device(src)
        assert moved.backend is other
        np.testing.assert_array_equal(await fetch(moved, DType.I32), np.arange(6).reshape(3, 2))
        back = await backend.tensor_factory.to_device(moved)
        assert back.backend is backend
        np.testing.assert_array_equal(await fetch(back, DType.I32), np.arange(6).reshape(3, 2))


async def test_numpy_is_the_blocking_twin_of_to_host(backend: ComputeBackend) -> None:
    t = backend.tensor_ops.add(backend.tensor_factory.arange(4, dtype=DType.F64), 1.0)
    np.testing.assert_array_equal(t.numpy(), [1.0, 2.0, 3.0, 4.0])


async def test_to_host_returns_a_copy(backend: ComputeBackend) -> None:
    t = backend.tensor_factory.zeros((3,))
    a = await t.to_host()
    a[0] = 5.0
    np.testing.assert_array_equal(await fetch(t), [0.0, 0.0, 0.0])


async def test_operators(backend: ComputeBackend) -> None:
    f = backend.tensor_factory
    a_h = np.array([[1.0, -2.0], [3.0, 4.0]], np.float32)
    b_h = np.array([[0.5, 2.0], [-1.0, 8.0]], np.float32)
    a, b = f.from_host(a_h), f.from_host(b_h)
    cases = {
        "a + b": (a + b, a_h + b_h),
        "a - b": (a - b, a_h - b_h),
        "a * b": (a * b, a_h * b_h),
        "a / b": (a / b, a_h / b_h),
        "a @ b": (a @ b, a_h @ b_h),
        "-a": (-a, -a_h),
        "a ** 2": (a**2, a_h**2),
        "2 + a": (2 + a, 2 + a_h),
        "1 - a": (1 - a, 1 - a_h),
        "3 * a": (3 * a, 3 * a_h),
        "1 / b": (1 / b, 1 / b_h),
        "a - 1.5": (a - 1.5, a_h - 1.5),
    }
    for name, (t, expected) in cases.items():
        assert t.dtype is DType.F32, name
        assert_close(await fetch(t), expected, DType.F32)


@pytest.mark.parametrize("shape", [(3, 4), (1024, 512)], ids=["small", "2MiB"])
async def test_from_host_async_is_from_host_without_blocking_the_loop(
    backend: ComputeBackend, shape: tuple[int, ...]
) -> None:
    """The async twin gives the same tensor; a large array's snapshot is taken on a worker
    thread (so the loop runs meanwhile), a small one's at once."""
    f = backend.tensor_factory
    host = sample(shape, DType.F32, seed=11)
    got = await f.from_host_async(host)
    assert isinstance(got, Tensor)
    assert got.dtype is DType.F32
    np.testing.assert_array_equal(await fetch(got), host)
    as_f64 = (
        await f.from_host_async(host, dtype=DType.F64)
        if DType.F64 in (backend.capabilities.dtypes)
        else None
    )
    if as_f64 is not None:
        np.testing.assert_array_equal(await fetch(as_f64), host.astype(np.float64))
    with pytest.raises(accelkit.InvalidArgumentError, match="to_device"):
        await f.from_host_async(got)
