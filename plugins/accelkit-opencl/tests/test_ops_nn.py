"""conv2d, gather, scatter and embedding on the device, against NumPy, for every dtype the device
supports; out-of-range indices reported when the result is awaited, once, from the device."""

from __future__ import annotations

import numpy as np
import pytest
from accelkit_opencl.backend import OpenCLBackend

from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError

# Kernel checks: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]

RNG = np.random.default_rng(1)
_INDEX_DTYPES = (DType.I64, DType.I32, DType.U8, DType.U64, DType.I8)


def _floats(backend: OpenCLBackend) -> list[DType]:
    return [d for d in (DType.F16, DType.F32, DType.F64) if d in backend.supported_dtypes]


def _data(dtype: DType, shape: tuple[int, ...]) -> np.ndarray:
    if dtype is DType.BOOL:
        return RNG.random(shape) > 0.5
    if dtype.is_floating:
        return RNG.uniform(-2, 2, shape).astype(dtype.to_numpy())
    return RNG.integers(0 if not dtype.is_signed else -50, 50, shape).astype(dtype.to_numpy())


def _conv_reference(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    groups: int,
) -> np.ndarray:
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for oc in range(o):
        g = oc // og
        for i in range(kh):
            for j in range(kw):
                patch = xp[
                    :, g * cg : (g + 1) * cg,
                    i * dh : i * dh + sh * (oh - 1) + 1 : sh,
                    j * dw : j * dw + sw * (ow - 1) + 1 : sw,
                ]  # fmt: skip
                out[:, oc] += np.einsum("nchw,c->nhw", patch, w[oc, :, i, j])
        if b is not None:
            out[:, oc] += b[oc]
    return out


@pytest.mark.parametrize(
    ("stride", "padding", "dilation", "groups", "bias"),
    [
        ((1, 1), (0, 0), (1, 1), 1, False),
        ((1, 1), (1, 1), (1, 1), 1, True),
        ((2, 1), (1, 2), (1, 1), 2, True),
        ((1, 2), (2, 0), (2, 1), 4, False),
        ((3, 3), (0, 1), (1, 2), 1, True),
    ],
)
async def test_conv2d(
    backend: OpenCLBackend,
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    groups: int,
    bias: bool,
) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    for dt in _floats(backend):
        x = _data(dt, (2, 4, 9, 8))
        w = _data(dt, (8, 4 // groups, 3, 2))
        b = _data(dt, (8,)) if bias else None
        got = await o.conv2d(
            f.from_host(x),
            f.from_host(w),
            f.from_host(b) if b is not None else None,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
        ).to_host()
        want = _conv_reference(x, w, b, stride, padding, dilation, groups)
        assert got.dtype == x.dtype
        assert got.shape == want.shape
        tol = 1e-5 if dt is DType.F32 else (1e-2 if dt is DType.F16 else 1e-12)
        np.testing.assert_allclose(
            got.astype(np.float64), want, rtol=tol, atol=tol, err_msg=str(dt)
        )


async def test_conv2d_empty_batch(backend: OpenCLBackend) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    y = o.conv2d(f.zeros((0, 2, 4, 4)), f.zeros((3, 2, 3, 3)))
    assert (await y.to_host()).shape == (0, 3, 2, 2)


@pytest.mark.parametrize("axis", [0, 1, 2])
async def test_gather_every_dtype_and_index_dtype(backend: OpenCLBackend, axis: int) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    for dt in sorted(backend.supported_dtypes, key=lambda d: d.value):
        x = _data(dt, (4, 5, 3))
        shape = [3, 4, 2]
        shape[axis] = 6
        # every index dtype once (with F32); the other dtypes with I64 (one program each)
        for idt in _INDEX_DTYPES if dt is DType.F32 else (DType.I64,):
            idx = RNG.integers(0, x.shape[axis], shape)
            if idt.is_signed:
                idx = idx - x.shape[axis] * (
                    RNG.random(shape) > 0.5
                )  # negative counts from the end
            idx_h = idx.astype(idt.to_numpy())
            got = await o.gather(f.from_host(x), axis, f.from_host(idx_h)).to_host()
            corner = x[
                tuple(slice(0, s) if i != axis else slice(None) for i, s in enumerate(shape))
            ]
            want = np.take_along_axis(corner, idx % x.shape[axis], axis=axis)
            np.testing.assert_array_equal(got, want, err_msg=f"{dt} {idt}")


@pytest.mark.parametrize("axis", [0, 1])
async def test_scatter_tensor_and_scalar_src(backend: OpenCLBackend, axis: int) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    for dt in sorted(backend.supported_dtypes, key=lambda d: d.value):
        x = _data(dt, (5, 6))
        shape = (3, 4)
        # distinct indices along the axis, so the result does not depend on write order
        idx = np.stack(
            [RNG.permutation(x.shape[axis])[: shape[axis]] for _ in range(4 if axis == 0 else 3)]
        )
        idx = idx.T if axis == 0 else idx
        src = _data(dt, (4, 5))
        got = await o.scatter(f.from_host(x), axis, f.from_host(idx), f.from_host(src)).to_host()
        want = x.copy()
        region = want[tuple(slice(0, s) if i != axis else slice(None) for i, s in enumerate(shape))]
        np.put_along_axis(region, idx, src[: shape[0], : shape[1]], axis=axis)
        np.testing.assert_array_equal(got, want, err_msg=str(dt))
        value = True if dt is DType.BOOL else (1.5 if dt.is_floating else 7)
        got = await o.scatter(f.from_host(x), axis, f.from_host(idx), value).to_host()
        want = x.copy()
        region = want[tuple(slice(0, s) if i != axis else slice(None) for i, s in enumerate(shape))]
        np.put_along_axis(region, idx, np.asarray(value, x.dtype), axis=axis)
        np.testing.assert_array_equal(got, want, err_msg=str(dt))


async def test_scatter_duplicates_keep_the_last_write(backend: OpenCLBackend) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    idx = np.zeros((64, 3), np.int64)
    src = np.arange(192, dtype=np.float32).reshape(64, 3)
    got = await o.scatter(f.zeros((2, 3)), 0, f.from_host(idx), f.from_host(src)).to_host()
    np.testing.assert_array_equal(got, [src[-1], [0, 0, 0]])


async def test_embedding_every_dtype(backend: OpenCLBackend) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    for dt in sorted(backend.supported_dtypes, key=lambda d: d.value):
        weight = _data(dt, (11, 5))
        for idt in _INDEX_DTYPES if dt is DType.F32 else (DType.I64,):
            idx = RNG.integers(0, 11, (2, 3, 4)).astype(idt.to_numpy())
            got = await o.embedding(f.from_host(idx), f.from_host(weight)).to_host()
            np.testing.assert_array_equal(got, weight[idx.astype(np.intp)], err_msg=f"{dt} {idt}")


async def test_out_of_range_reported_once_with_the_value(backend: OpenCLBackend) -> None:
    f, o, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager
    baseline = mm.memory_info().used
    weight = f.ones((7, 4))
    huge = f.from_host(np.array([0, 2**64 - 1], np.uint64))
    bad = o.embedding(huge, weight)
    with pytest.raises(InvalidArgumentError, match=str(2**64 - 1)):
        await bad.to_host()
    await backend.synchronize()  # reported once
    neg = o.gather(f.ones((3, 2)), 0, f.from_host([[-4, 0]]))
    with pytest.raises(InvalidArgumentError, match="-4"):
        neg.numpy()
    s = o.scatter(f.ones((3, 2)), 1, f.from_host([[0, 2]]), 1.0)
    with pytest.raises(InvalidArgumentError, match=r"-2\.\.1; got 2"):
        await backend.synchronize()
    np.testing.assert_array_equal(
        await o.gather(f.ones((3, 2)), 0, f.from_host([[-3, 2]])).to_host(), [[1, 1]]
    )
    del bad, neg, s, weight, huge
    await backend.synchronize()
    assert mm.memory_info().used == baseline


async def test_shutdown_drops_unreported_errors() -> None:
    b = OpenCLBackend()
    await b.initialize("opencl:0")
    b.tensor_ops.embedding(b.tensor_factory.from_host([5]), b.tensor_factory.ones((2, 2)))
    await b.shutdown()  # no error: nobody awaited the result
