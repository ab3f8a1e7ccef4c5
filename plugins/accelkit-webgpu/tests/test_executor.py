"""User WGSL kernels: compile, run, caches, argument and limit checks, SPIR-V refusal on GL."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from accelkit_webgpu.backend import WebGPUBackend
from accelkit_webgpu.executor import WebGPUKernelExecutor, kernel_cache_dir, reflect_wgsl

from accelkit.errors import (
    InvalidArgumentError,
    KernelCompileError,
    StaleHandleError,
    UnsupportedOperationError,
)

pytestmark = pytest.mark.anyio

AXPY = """
@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> a: f32;
@group(0) @binding(3) var<storage, read> n: u32;

@compute @workgroup_size(64)
fn axpy(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < n) { y[i] = y[i] + a * x[i]; }
}
"""


def _executor(backend: WebGPUBackend) -> WebGPUKernelExecutor:
    ex = backend.kernel_executor
    assert isinstance(ex, WebGPUKernelExecutor)
    return ex


async def test_compile_and_run(backend: WebGPUBackend) -> None:
    ex = _executor(backend)
    assert "wgsl" in ex.languages
    h = await ex.load_kernel(AXPY, "axpy", language="wgsl")
    f = backend.tensor_factory
    y = f.ones((100,))
    x = f.from_host(np.arange(100, dtype=np.float32))
    ex.execute_kernel(h, (2,), (64,), [y, x, 2.0, 100])
    np.testing.assert_allclose(await y.to_host(), 1 + 2 * np.arange(100))
    info = ex.kernel_info(h)
    assert info.name == "axpy"
    assert info.max_threads_per_block == 64
    assert info.extra["workgroup_size"] == [64, 1, 1]
    assert [b["access"] for b in info.extra["bindings"]] == ["read_write", "read", "read", "read"]


async def test_dispatch_compute_runs_a_wgsl_string(backend: WebGPUBackend) -> None:
    ex = _executor(backend)
    f = backend.tensor_factory
    y = f.zeros((10,))
    x = f.ones((10,))
    ex.dispatch_compute(AXPY, [y, x, 3.0, 10], workgroups=(1, 1, 1))
    np.testing.assert_allclose(await y.to_host(), np.full(10, 3.0))
    with pytest.raises(UnsupportedOperationError, match="push constants"):
        ex.dispatch_compute(AXPY, [y, x, 3.0, 10], push_constants=b"\0\0\0\0")
    with pytest.raises(InvalidArgumentError, match="4 bindings"):
        ex.dispatch_compute(AXPY, [y, x], workgroups=(1,))


async def test_compile_errors_carry_the_line_and_column(backend: WebGPUBackend) -> None:
    ex = _executor(backend)
    bad = AXPY.replace("y[i] + a * x[i]", "y[i] + a * undefined_thing")
    with pytest.raises(KernelCompileError) as info:
        await ex.load_kernel(bad, "axpy", language="wgsl")
    message = str(info.value)
    assert "undefined_thing" in message
    assert re.search(r"\d+:\d+", message), message  # wgsl:LINE:COLUMN


async def test_unknown_entry_point_and_language(backend: WebGPUBackend) -> None:
    ex = _executor(backend)
    with pytest.raises(InvalidArgumentError, match="axpy"):
        await ex.load_kernel(AXPY, "nope", language="wgsl")
    with pytest.raises(UnsupportedOperationError, match="wgsl"):
        await ex.load_kernel(AXPY, "axpy", language="opencl")
    with pytest.raises(InvalidArgumentError, match="options"):
        await ex.load_kernel(AXPY, "axpy", language="wgsl", options=["-O3"])


async def test_wrong_binding_counts_and_kinds(backend: WebGPUBackend) -> None:
    ex = _executor(backend)
    h = await ex.load_kernel(AXPY, "axpy", language="wgsl")
    f = backend.tensor_factory
    y, x = f.ones((8,)), f.ones((8,))
    with pytest.raises(InvalidArgumentError, match="declares 4 bindings"):
        ex.execute_kernel(h, (1,), (64,), [y, x, 2.0])
    with pytest.raises(InvalidArgumentError, match="declares 4 bindings"):
        ex.execute_kernel(h, (1,), (64,), [y, x, 2.0, 8, 9])
    with pytest.raises(InvalidArgumentError, match="Tensor"):
        ex.execute_kernel(h, (1,), (64,), [1.0, x, 2.0, 8])  # a scalar for an array
    with pytest.raises(InvalidArgumentError, match="float"):
        ex.execute_kernel(h, (1,), (64,), [y, x, 2.0, 8.5])  # a float for a u32
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        ex.execute_kernel(h, (1,), (64,), [y, x, 2.0, -1])
    with pytest.raises(InvalidArgumentError, match="workgroup_size"):
        ex.execute_kernel(h, (1,), (32,), [y, x, 2.0, 8])  # block != @workgroup_size
    uniform = AXPY.replace("var<storage, read> a: f32", "var<uniform> a: f32")
    with pytest.raises(UnsupportedOperationError, match="storage"):
        await ex.load_kernel(uniform, "axpy", language="wgsl")
    gap = AXPY.replace("@binding(3)", "@binding(5)")
    with pytest.raises(InvalidArgumentError, match="without gaps"):
        await ex.load_kernel(gap, "axpy", language="wgsl")


async def test_workgroup_over_the_limit(backend: WebGPUBackend) -> None:
    ex = _executor(backend)
    gpu = backend.gpu
    too_wide = AXPY.replace("@workgroup_size(64)", f"@workgroup_size({gpu.max_wg_size[0] + 1})")
    with pytest.raises(InvalidArgumentError, match="maxComputeWorkgroupSizeX"):
        await ex.load_kernel(too_wide, "axpy", language="wgsl")
    side = int(gpu.max_invocations**0.5) + 1
    too_many = AXPY.replace("@workgroup_size(64)", f"@workgroup_size({side}, {side})")
    if side <= gpu.max_wg_size[1]:
        with pytest.raises(InvalidArgumentError, match="maxComputeInvocationsPerWorkgroup"):
            await ex.load_kernel(too_many, "axpy", language="wgsl")
    h = await ex.load_kernel(AXPY, "axpy", language="wgsl")
    f = backend.tensor_factory
    y, x = f.ones((8,)), f.ones((8,))
    with pytest.raises(InvalidArgumentError, match="maxComputeWorkgroupsPerDimension"):
        ex.execute_kernel(h, (gpu.max_groups + 1,), (64,), [y, x, 2.0, 8])
    assert gpu.compiles >= 1


async def test_second_load_does_not_recompile(backend: WebGPUBackend, kernel_cache: Path) -> None:
    ex = _executor(backend)
    gpu = backend.gpu
    h1 = await ex.load_kernel(AXPY, "axpy", language="wgsl")
    compiles = gpu.compiles
    h2 = await ex.load_kernel(AXPY, "axpy", language="wgsl")
    assert gpu.compiles == compiles
    assert h1 == h2
    assert ex.hits["memory"] >= 1
    # The validated metadata went to the disk cache under ACCELKIT_CACHE_DIR.
    assert kernel_cache_dir().is_relative_to(kernel_cache)
    assert (kernel_cache_dir() / f"{h1.key}.json").exists()


async def test_disk_cache_in_a_new_backend(kernel_cache: Path) -> None:
    b1 = WebGPUBackend()
    await b1.initialize("webgpu:0")
    try:
        h1 = await b1.kernel_executor.load_kernel(AXPY, "axpy", language="wgsl")
        assert b1.kernel_executor.hits["parsed"] == 1  # type: ignore[attr-defined]
    finally:
        await b1.shutdown()
    b2 = WebGPUBackend()
    await b2.initialize("webgpu:0")
    try:
        ex = b2.kernel_executor
        h2 = await ex.load_kernel(AXPY, "axpy", language="wgsl")
        assert h2.key == h1.key
        assert ex.hits == {"memory": 0, "disk": 1, "parsed": 0}  # type: ignore[attr-defined]
        f = b2.tensor_factory
        y, x = f.zeros((8,)), f.ones((8,))
        ex.execute_kernel(h2, (1,), (64,), [y, x, 3.0, 8])
        np.testing.assert_allclose(await y.to_host(), np.full(8, 3.0))
    finally:
        await b2.shutdown()


async def test_unload_makes_the_handle_stale(backend: WebGPUBackend) -> None:
    ex = _executor(backend)
    h = await ex.load_kernel(AXPY, "axpy", language="wgsl")
    ex.unload_kernel(h)
    with pytest.raises(StaleHandleError):
        ex.kernel_info(h)
    with pytest.raises(StaleHandleError):
        ex.unload_kernel(h)


async def test_spirv_is_refused_where_the_adapter_takes_none(backend: WebGPUBackend) -> None:
    ex = _executor(backend)
    with pytest.raises(InvalidArgumentError, match="bytes"):
        await ex.load_kernel("not bytes", "main", language="spirv")
    if ex.spirv_supported:
        with pytest.raises(InvalidArgumentError, match="SPIR-V"):
            await ex.load_kernel(b"\0" * 20, "main", language="spirv")
        return
    assert "spirv" not in ex.languages
    module = (0x07230203).to_bytes(4, "little") + b"\0" * 16
    with pytest.raises(UnsupportedOperationError, match="SPIR-V"):
        await ex.load_kernel(module, "main", language="spirv")  # type: ignore[arg-type]
    with pytest.raises(UnsupportedOperationError, match="SPIR-V"):
        ex.dispatch_compute(module, [])


def test_reflection_reads_declarations() -> None:
    meta = reflect_wgsl(
        """
        const WG = 128u;
        /* @group(0) @binding(9) var<storage, read> ghost: array<f32>; */
        @binding(1) @group(0) var<storage, read_write> out: array<vec4<f32>>;
        @group(0) @binding(0) var<storage, read> params: array<u32, 4>;
        @compute @workgroup_size(WG, 2) fn main() {}
        @compute @workgroup_size(8, 8, 4) fn other() {}
        fn helper() {}
        """
    )
    assert meta.entries == {"main": (128, 2, 1), "other": (8, 8, 4)}
    assert [(b.binding, b.name, b.access, b.runtime_array) for b in meta.bindings] == [
        (0, "params", "read", False),
        (1, "out", "read_write", True),
    ]
