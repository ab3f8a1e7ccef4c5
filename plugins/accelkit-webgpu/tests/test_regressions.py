"""Regressions found by review: each failed before its fix, against NumPy or the CPU backend."""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest
from accelkit_webgpu.backend import WebGPUBackend

from accelkit.errors import InvalidArgumentError, UnsupportedOperationError

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("values", "dtype", "scalar"),
    [([1, 100], np.uint8, -1), ([1, 100], np.int32, 2**40), ([1, -1], np.int64, 2**63),
     ([0, 2**32 - 1], np.uint32, -1), ([5, -5], np.int16, -40000)],
)  # fmt: skip
async def test_comparing_with_an_int_outside_the_dtype_compares_exact_values(
    backend: WebGPUBackend, values: list[int], dtype: type, scalar: int
) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    x_h = np.array(values, dtype)
    x = f.from_host(x_h)
    names = {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal",
             "gt": "greater", "ge": "greater_equal"}  # fmt: skip
    for op, name in names.items():
        compare = getattr(np, name)
        got = await ops.binary(op, x, scalar).to_host()
        np.testing.assert_array_equal(got, compare(x_h, scalar), op)
        got = await ops.binary(op, scalar, x).to_host()  # the scalar on the left
        np.testing.assert_array_equal(got, compare(scalar, x_h), op)


async def test_unsigned_indices_past_i32_are_out_of_range_and_named(
    backend: WebGPUBackend,
) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.from_host(np.array([[10.0], [20.0], [30.0]], np.float32))
    for idx, shown in ((np.uint32(2**32 - 1), "4294967295"), (np.uint64(2**63 + 5), "9223372036854775813"),
                       (np.int64(2**40), "1099511627776")):  # fmt: skip
        with pytest.raises(InvalidArgumentError, match=shown):
            await ops.gather(x, 0, f.from_host(np.array([[idx]]))).to_host()
    with pytest.raises(InvalidArgumentError, match="-1"):
        await ops.embedding(f.from_host(np.array([-1], np.int8)), f.ones((3, 2))).to_host()


async def test_scatter_converts_a_source_of_another_dtype(backend: WebGPUBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    got = ops.scatter(
        f.zeros((3,), "f32"), 0, f.from_host(np.array([1], np.int64)),
        f.from_host(np.array([5], np.int32)),
    )  # fmt: skip
    np.testing.assert_array_equal(await got.to_host(), [0.0, 5.0, 0.0])


async def test_loops_past_the_software_adapters_limit_are_refused(backend: WebGPUBackend) -> None:
    if not backend.capabilities.extra.get("software"):
        pytest.skip("a hardware adapter has no loop limit")
    f, ops = backend.tensor_factory, backend.tensor_ops
    used = backend.memory_manager.memory_info().used
    a, b = f.ones((1, 70000)), f.ones((70000, 1))
    with pytest.raises(UnsupportedOperationError, match="65,535"):
        ops.matmul(a, b)
    q = f.ones((1, 1, 1, 64))
    kv = f.ones((1, 1, 512, 64))
    with pytest.raises(UnsupportedOperationError, match="attention"):
        ops.attention(q, kv, kv)
    del a, b, q, kv
    await backend.synchronize()  # the fills' queued work holds its tensors until it has run
    gc.collect()  # the refusals' tracebacks hold the outputs the core had allocated
    assert backend.memory_manager.memory_info().used == used
    # inside the limit: right
    np.testing.assert_array_equal(
        await ops.matmul(f.ones((1, 60000)), f.ones((60000, 1))).to_host(), [[60000.0]]
    )


async def test_small_and_subnormal_arguments_keep_their_precision(backend: WebGPUBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    x_h = np.array([1e-6, 1e-4, 6e-4, 0.3, -0.05], np.float32)
    x = f.from_host(x_h)
    erf = np.array([math.erf(float(v)) for v in x_h])
    np.testing.assert_allclose(await ops.erf(x).to_host(), erf, rtol=2e-6)
    np.testing.assert_allclose(
        await ops.tanh(x).to_host(), np.tanh(x_h.astype(np.float64)), rtol=2e-6
    )
    tiny = np.array([1e-40, 1e-45, 3e-39], np.float32)  # subnormals
    got = await ops.log(f.from_host(tiny)).to_host()
    np.testing.assert_allclose(got, np.log(tiny.astype(np.float64)), rtol=1e-6)
