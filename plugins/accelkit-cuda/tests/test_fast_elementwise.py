"""The raw elementwise kernels of issue 29 (accelkit_cuda.fast_elementwise): every one compiles
with NVRTC for the architectures the backend supports, without warnings (no GPU needed); the
stand-in's run of them is in test_offloop.py."""

from __future__ import annotations

import pytest
from accelkit_cuda import nvrtc
from accelkit_cuda.fast_elementwise import (
    BIAS_DTYPES,
    BLOCK,
    OPS,
    ROW_OPS,
    SOURCE,
    UNARY_OPS,
    bias_kernel_name,
    grid_for,
    kernel_name,
    permute_kernel_name,
    row_block,
    row_kernel_name,
    unary_kernel_name,
)
from nvrtc_checks import assert_compiles_without_spills

from accelkit.dtype import DType

try:
    nvrtc.nvrtc_version()
except nvrtc.NVRTCUnavailable as exc:
    pytest.skip(f"NVRTC is not installed: {exc}", allow_module_level=True)

DTYPES = (DType.F32, DType.F64, DType.F16, DType.BF16)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_elementwise_kernel_compiles(arch: str) -> None:
    compiled = nvrtc.compile_cuda(SOURCE, arch, (), "accelkit_elementwise.cu")
    assert compiled.kind == "cubin"
    assert compiled.binary[:4] == b"\x7fELF"
    for op in OPS:
        for dtype in DTYPES:
            name = kernel_name(op, dtype)
            assert name.encode() + b"\0" in compiled.binary, name
    assert "warning" not in compiled.log.lower(), compiled.log


@pytest.mark.parametrize(
    ("n", "blocks"), [(1, 1), (BLOCK, 1), (BLOCK + 1, 2), (64 * 64, 16), (1 << 40, 65535 * 8)]
)
def test_the_grid_covers_the_elements(n: int, blocks: int) -> None:
    (grid,) = grid_for(n)
    assert grid == blocks
    assert grid * BLOCK >= n or grid == 65535 * 8  # a grid-stride loop covers the rest


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_unary_and_row_kernel_compiles_without_spills(arch: str) -> None:
    """Issue 29's one-launch kernels: every unary op and row op on every float dtype, and the
    permute kernels (test_fast_permute.py), are in the cubin, with no warning and no spill (ptxas's report of every kernel of the source)."""
    names = [kernel_name(op, dt) for op in OPS for dt in DTYPES]
    names += [unary_kernel_name(op, dt) for op in UNARY_OPS for dt in DTYPES]
    names += [row_kernel_name(op, dt) for op in ROW_OPS for dt in DTYPES]
    names += [permute_kernel_name(w, wide) for w in (1, 2, 4, 8) for wide in (False, True)]
    names += [bias_kernel_name(dt) for dt in BIAS_DTYPES]
    # F64 sin, cos and tan call CUDA's (not inlined) argument reduction for large arguments:
    # ptxas reports it as a function of its own, once for each of them
    names += ["__internal_trig_reduction_slowpathd"] * 3
    assert_compiles_without_spills(SOURCE, arch, names, "accelkit_elementwise.cu")


@pytest.mark.parametrize(("n", "threads"), [(1, 32), (7, 32), (33, 64), (256, 256), (4096, 256)])
def test_a_row_block_is_whole_warps(n: int, threads: int) -> None:
    assert row_block(n) == (threads,)
