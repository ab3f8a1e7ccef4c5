"""scatter and adam_update against loops over the definitions (I32 and I64 indices, every dtype
the backend stores), beyond the conformance suite's cases."""

from __future__ import annotations

import itertools
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from accelkit_webgpu.backend import WebGPUBackend

from accelkit.errors import InvalidArgumentError
from accelkit.sdk import host

# Kernel checks: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]

Array = np.ndarray[Any, Any]


def _scatter_loop(x: Array, axis: int, index: Array, src: Any) -> Array:
    out = x.copy()
    dim = x.shape[axis]
    for pos in itertools.product(*(range(d) for d in index.shape)):
        dest = list(pos)
        dest[axis] = int(index[pos]) % dim
        out[tuple(dest)] = src[pos] if isinstance(src, np.ndarray) else src
    return out


_DTYPES = [np.float32, np.float16, np.int32, np.uint8, np.int8, np.int16, np.uint16, np.bool_]


@pytest.mark.parametrize("dtype", _DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("index_dtype", [np.int32, np.uint8, np.int64], ids=str)
async def test_scatter_matches_the_loop(
    backend: WebGPUBackend, dtype: Any, index_dtype: Any
) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    rng = np.random.default_rng(7)
    for axis in (0, 1, 2):
        x = rng.integers(0, 50, (5, 6, 7)).astype(dtype)
        shape = [4, 5, 6]
        shape[axis] = 9  # more entries than destinations: duplicates
        dim = x.shape[axis]
        low = 0 if np.dtype(index_dtype).kind == "u" else -dim
        idx = rng.integers(low, dim, shape).astype(index_dtype)
        src = rng.integers(50, 100, [s + 1 for s in shape]).astype(dtype)
        got = ops.scatter(f.from_host(x), axis, f.from_host(idx), f.from_host(src))
        np.testing.assert_array_equal(await got.to_host(), _scatter_loop(x, axis, idx, src))
        scalar = True if dtype is np.bool_ else 7
        got = ops.scatter(f.from_host(x), axis, f.from_host(idx), scalar)
        want = _scatter_loop(x, axis, idx, np.dtype(dtype).type(scalar))
        np.testing.assert_array_equal(await got.to_host(), want)


async def test_scatter_duplicates_keep_the_last_write_at_scale(backend: WebGPUBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, 500)).astype(np.float32)
    idx = rng.integers(-300, 300, (700, 500)).astype(np.int32)
    src = rng.standard_normal((700, 500)).astype(np.float32)
    want = _scatter_loop(x, 0, idx, src)
    for _ in range(2):
        got = ops.scatter(f.from_host(x), 0, f.from_host(idx), f.from_host(src))
        np.testing.assert_array_equal(await got.to_host(), want)


async def test_scatter_index_out_of_range_surfaces_when_awaited(backend: WebGPUBackend) -> None:
    f, ops, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager
    x = f.ones((3, 2))
    baseline = mm.memory_info().used
    for bad in (3, -4):
        s = ops.scatter(x, 0, f.from_host(np.array([[bad, 0]], np.int32)), 2.0)
        with pytest.raises(InvalidArgumentError, match=str(bad)):
            await s.to_host()
        del s
    ok = ops.scatter(x, 0, f.from_host(np.array([[2, 0]], np.int32)), 2.0)
    np.testing.assert_array_equal(await ok.to_host(), [[1, 2], [1, 1], [2, 1]])
    del ok
    await backend.synchronize()
    assert mm.memory_info().used == baseline


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=str)
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
async def test_adam_update_matches_the_cpu_backend(
    backend: WebGPUBackend, dtype: Any, weight_decay: float
) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    rng = np.random.default_rng(1)
    for n in (1, 7, 1001):
        p, g, m = (rng.standard_normal(n).astype(dtype) for _ in range(3))
        v = rng.uniform(0.01, 1.0, n).astype(dtype)
        tp, tg, tm, tv = (f.from_host(a) for a in (p, g, m, v))
        hyper = dict(lr=0.01, beta1=0.8, beta2=0.95, eps=1e-6, weight_decay=weight_decay)
        for step in (1, 2, 3):
            assert ops.adam_update(tp, tg, tm, tv, step=step, **hyper) is tp
            host.adam_update(p, g, m, v, 0.01, 0.8, 0.95, 1e-6, step, weight_decay)
        for t, want in ((tp, p), (tm, m), (tv, v)):
            got = await t.to_host()
            np.testing.assert_allclose(
                got.astype(np.float64), want.astype(np.float64), rtol=1e-6, atol=1e-7
            )
