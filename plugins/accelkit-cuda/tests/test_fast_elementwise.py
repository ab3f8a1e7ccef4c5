"""The raw elementwise kernels of issue 29 (accelkit_cuda.fast_elementwise): every one compiles
with NVRTC for the architectures the backend supports, without warnings (no GPU needed); the
stand-in's run of them is in test_offloop.py."""

from __future__ import annotations

import pytest
from accelkit_cuda import nvrtc
from accelkit_cuda.fast_elementwise import BLOCK, OPS, SOURCE, grid_for, kernel_name

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
