from __future__ import annotations

from pathlib import Path

import anyio
import numpy as np
import pytest
from accelkit_opencl.backend import OpenCLBackend
from accelkit_opencl.executor import LocalMemory

from accelkit.errors import (
    InvalidArgumentError,
    KernelCompileError,
    StaleHandleError,
    UnsupportedOperationError,
)

pytestmark = pytest.mark.anyio

AXPY = """
__kernel void axpy(__global float* y, __global const float* x, float a, int n) {
    int i = get_global_id(0);
    if (i < n) y[i] += a * x[i];
}
__kernel void block_sum(__global const float* x, __global float* out, __local float* tmp) {
    int l = get_local_id(0);
    tmp[l] = x[get_global_id(0)];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (l == 0) { float s = 0; for (int i = 0; i < get_local_size(0); ++i) s += tmp[i];
                  out[get_group_id(0)] = s; }
}
"""


async def test_compile_and_run(backend: OpenCLBackend) -> None:
    ex = backend.kernel_executor
    h = await ex.load_kernel(AXPY, "axpy", language="opencl")
    f = backend.tensor_factory
    y = f.ones((100,))
    x = f.from_host(np.arange(100, dtype=np.float32))
    ex.execute_kernel(h, (4,), (32,), [y, x, 2.0, 100])
    np.testing.assert_allclose(await y.to_host(), 1 + 2 * np.arange(100))
    info = ex.kernel_info(h)
    assert info.name == "axpy"
    assert info.max_threads_per_block > 0
    assert info.extra["num_args"] == 4


async def test_local_memory_argument(backend: OpenCLBackend) -> None:
    ex = backend.kernel_executor
    h = await ex.load_kernel(AXPY, "block_sum", language="opencl")
    f = backend.tensor_factory
    x = f.from_host(np.arange(64, dtype=np.float32))
    out = f.zeros((4,))
    ex.execute_kernel(h, (4,), (16,), [x, out, LocalMemory(16 * 4)])
    np.testing.assert_allclose(await out.to_host(), np.arange(64).reshape(4, 16).sum(1))


async def test_cache_hit_from_disk_in_a_new_backend(opencl_cache: Path) -> None:
    b1 = OpenCLBackend()
    await b1.initialize("opencl:0")
    h1 = await b1.kernel_executor.load_kernel(AXPY, "axpy", language="opencl")
    assert b1._programs.hits["compiled"] >= 1
    await b1.kernel_executor.load_kernel(AXPY, "axpy", language="opencl")
    assert b1._programs.hits["memory"] >= 1
    await b1.shutdown()
    assert await anyio.Path(opencl_cache / f"{h1.key}.bin").exists()
    b2 = OpenCLBackend()
    await b2.initialize("opencl:0")
    try:
        h2 = await b2.kernel_executor.load_kernel(AXPY, "axpy", language="opencl")
        assert h2.key == h1.key
        assert b2._programs.hits == {"memory": 0, "disk": 1, "compiled": 0, "discarded": 0}
        y = b2.tensor_factory.zeros((8,))
        x = b2.tensor_factory.ones((8,))
        b2.kernel_executor.execute_kernel(h2, (1,), (8,), [y, x, 3.0, 8])
        np.testing.assert_allclose(await y.to_host(), np.full(8, 3.0))
    finally:
        await b2.shutdown()


async def test_corrupt_cache_entry_is_rebuilt(opencl_cache: Path) -> None:
    b1 = OpenCLBackend()
    await b1.initialize("opencl:0")
    h = await b1.kernel_executor.load_kernel(AXPY, "axpy", language="opencl")
    await b1.shutdown()
    (opencl_cache / f"{h.key}.bin").write_bytes(b"not a binary")
    b2 = OpenCLBackend()
    await b2.initialize("opencl:0")
    try:
        await b2.kernel_executor.load_kernel(AXPY, "axpy", language="opencl")
        assert b2._programs.hits["compiled"] == 1
        assert (opencl_cache / f"{h.key}.bin").read_bytes() != b"not a binary"
    finally:
        await b2.shutdown()


async def test_options_are_part_of_the_key(backend: OpenCLBackend) -> None:
    ex = backend.kernel_executor
    h1 = await ex.load_kernel(AXPY, "axpy", language="opencl")
    h2 = await ex.load_kernel(AXPY, "axpy", language="opencl", options=["-DFOO=1"])
    assert h1.key != h2.key


async def test_compile_error_carries_the_log(backend: OpenCLBackend) -> None:
    with pytest.raises(KernelCompileError) as info:
        await backend.kernel_executor.load_kernel(
            "__kernel void broken(__global float* x) { x[0] = undefined_name; }",
            "broken",
            language="opencl",
        )
    assert "undefined_name" in info.value.log
    assert "undefined_name" in str(info.value)


async def test_bad_launches(backend: OpenCLBackend) -> None:
    ex = backend.kernel_executor
    h = await ex.load_kernel(AXPY, "axpy", language="opencl")
    y = backend.tensor_factory.ones((8,))
    with pytest.raises(InvalidArgumentError, match="takes 4 arguments"):
        ex.execute_kernel(h, (1,), (8,), [y, y, 1.0])
    with pytest.raises(InvalidArgumentError, match="pointer"):
        ex.execute_kernel(h, (1,), (8,), [1.0, y, 1.0, 8])
    with pytest.raises(InvalidArgumentError, match="scalar"):
        ex.execute_kernel(h, (1,), (8,), [y, y, y, 8])
    with pytest.raises(InvalidArgumentError, match="integer"):
        ex.execute_kernel(h, (1,), (8,), [y, y, 1.0, 8.5])
    with pytest.raises(InvalidArgumentError):
        ex.execute_kernel(h, (1,), (1 << 20,), [y, y, 1.0, 8])
    with pytest.raises(InvalidArgumentError):
        ex.execute_kernel(h, (0,), (8,), [y, y, 1.0, 8])
    with pytest.raises(InvalidArgumentError, match="no kernel"):
        await ex.load_kernel(AXPY, "missing", language="opencl")
    ex.unload_kernel(h)
    with pytest.raises(StaleHandleError):
        ex.execute_kernel(h, (1,), (8,), [y, y, 1.0, 8])


# A SPIR-V module header: magic, version 1.0, generator, bound, schema (then no instructions).
SPIRV_HEADER = np.array([0x07230203, 0x00010000, 0, 1, 0], np.uint32).tobytes()


async def test_spirv_is_refused_clearly_where_the_device_takes_no_il(
    backend: OpenCLBackend,
) -> None:
    from accelkit_opencl.executor import il_versions

    ex = backend.kernel_executor
    with pytest.raises(InvalidArgumentError, match="not a SPIR-V module"):
        await ex.load_kernel(b"\x00" * 20, "k", language="spirv")
    with pytest.raises(InvalidArgumentError, match="SPIR-V module is bytes"):
        await ex.load_kernel("__kernel void k() {}", "k", language="spirv")
    with pytest.raises(UnsupportedOperationError, match="language='spirv'"):
        await ex.load_kernel(AXPY, "axpy", language="wgsl")
    if il_versions(backend._cl_device):
        assert "spirv" in ex.languages
        assert "spirv" in backend.capabilities.kernel_languages
        pytest.skip("this device takes SPIR-V; no SPIR-V compiler here to make a kernel")
    assert ex.languages == {"opencl"}
    assert backend.capabilities.kernel_languages == {"opencl"}
    with pytest.raises(UnsupportedOperationError, match="accepts no intermediate language"):
        await ex.load_kernel(SPIRV_HEADER, "k", language="spirv")
