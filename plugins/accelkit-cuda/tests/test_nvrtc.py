"""NVRTC compilation and its disk cache, on any machine with libnvrtc (no GPU needed):
every fused kernel of the backend compiles for the architectures it supports."""

from __future__ import annotations

from pathlib import Path

import pytest
from accelkit_cuda import nvrtc
from accelkit_cuda.cuda_fused import SOURCE, kernel_names

from accelkit.errors import KernelCompileError

try:
    nvrtc.nvrtc_version()
except nvrtc.NVRTCUnavailable as exc:
    pytest.skip(f"NVRTC is not installed: {exc}", allow_module_level=True)

SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_fused_kernel_compiles(arch: str) -> None:
    compiled = nvrtc.compile_cuda(SOURCE, arch, (), "accelkit_fused.cu")
    assert compiled.kind == "cubin"
    assert compiled.binary[:4] == b"\x7fELF"
    for name in kernel_names():  # extern "C": the symbol is the plain name
        assert name.encode() + b"\0" in compiled.binary, name
    assert "warning" not in compiled.log.lower(), compiled.log


def test_the_flash_kernels_geometry_matches_python() -> None:
    """The warp-per-row flash kernel's rows a block and key tile (#define ROWS/TILE in SOURCE)
    are the ones the launch (grid, threads) and flash_shared_bytes use."""
    import re

    from accelkit_cuda.cuda_fused import FLASH_ROWS, FLASH_TILE, flash_shared_bytes

    assert re.search(rf"^#define ROWS {FLASH_ROWS}$", SOURCE, re.M)
    assert re.search(rf"^#define TILE {FLASH_TILE}$", SOURCE, re.M)
    assert 32 * FLASH_ROWS <= 1024  # threads a block
    # The block's causal f32 attention (head dim 64) fits the default 48 KiB, as does 128.
    assert flash_shared_bytes(128, 128, 4) <= 48 * 1024


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_flash_kernel_compiles_without_spills(arch: str) -> None:
    compiled = nvrtc.compile_cuda(SOURCE, arch, ("-Xptxas=-v",), "accelkit_fused.cu")
    for name in ("flash_attention_f32", "flash_attention_f16", "flash_attention_f64"):
        part = compiled.log.split(f"Compiling entry function '{name}'")[1].split("Compile time")[0]
        assert " 0 bytes spill stores" in part, part


def test_ptx_for_a_virtual_architecture() -> None:
    compiled = nvrtc.compile_cuda(SAXPY, "compute_80")
    assert compiled.kind == "ptx"
    assert b".entry saxpy" in compiled.binary


def test_a_compile_error_carries_the_log() -> None:
    with pytest.raises(KernelCompileError) as info:
        nvrtc.compile_cuda(SAXPY.replace("a * x[i]", "a * z[i]"), "sm_80", (), "saxpy.cu")
    assert 'identifier "z" is undefined' in info.value.log
    assert "saxpy.cu(4)" in info.value.log  # the file name and line


def test_options_reach_the_compiler() -> None:
    src = "#if !defined(SCALE)\n#error SCALE missing\n#endif\n" + SAXPY
    with pytest.raises(KernelCompileError, match="NVRTC"):
        nvrtc.compile_cuda(src, "sm_80")
    assert nvrtc.compile_cuda(src, "sm_80", ("-DSCALE=2",)).kind == "cubin"


def test_disk_cache_hits_and_keys(cuda_cache: Path) -> None:
    before = dict(nvrtc.hits)
    first = nvrtc.compile_cached(SAXPY, "sm_80")
    again = nvrtc.compile_cached(SAXPY, "sm_80")
    assert nvrtc.hits["compiled"] == before["compiled"] + 1
    assert nvrtc.hits["disk"] == before["disk"] + 1
    assert again.binary == first.binary
    assert again.key == first.key
    keys = {
        first.key,
        nvrtc.cache_key(SAXPY, "sm_90", ()),
        nvrtc.cache_key(SAXPY, "sm_80", ("-DX=1",)),
        nvrtc.cache_key(SAXPY + " ", "sm_80", ()),
    }
    assert len(keys) == 4  # arch, options and source all change the key
    assert [p.name for p in cuda_cache.iterdir()] == [f"{first.key}.cubin"]


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_a_corrupt_entry_is_rebuilt(cuda_cache: Path, damage: str) -> None:
    first = nvrtc.compile_cached(SAXPY, "sm_80")
    path = cuda_cache / f"{first.key}.cubin"
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        path.write_bytes(data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:])
    else:
        path.write_bytes(b"")
    compiled_before = nvrtc.hits["compiled"]
    rebuilt = nvrtc.compile_cached(SAXPY, "sm_80")
    assert nvrtc.hits["compiled"] == compiled_before + 1
    assert rebuilt.binary == first.binary
    assert path.read_bytes() == data  # and the entry is whole again


def test_concurrent_processes_share_the_cache_safely(cuda_cache: Path) -> None:
    import subprocess
    import sys

    code = (
        "from accelkit_cuda import nvrtc; import sys;"
        "c = nvrtc.compile_cached(sys.argv[1], 'sm_80'); print(c.key)"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, SAXPY], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    keys = {p.communicate()[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(keys) == 1
    entries = list(cuda_cache.iterdir())
    assert [e.name for e in entries] == [f"{keys.pop()}.cubin"]  # no temporary files left
    assert nvrtc.compile_cached(SAXPY, "sm_80").binary[:4] == b"\x7fELF"
