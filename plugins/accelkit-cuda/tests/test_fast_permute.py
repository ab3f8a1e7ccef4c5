"""``permute`` as one raw copy kernel (accelkit_cuda.fast_elementwise.PERMUTE_SOURCE), without a
GPU: the arguments computed for it describe NumPy's transpose; the kernels' own text, built for
the host with a loop over the grid and its threads, copies every element where NumPy's
transpose puts it (every element width, both index widths, a grid smaller than the elements);
every kernel compiles with NVRTC without a spill; over the stand-in for CuPy the backend's
permute takes the kernel up to four dims and CuPy's path beyond, with NumPy's answers."""

from __future__ import annotations

import ctypes
import importlib
import itertools
import shutil
import subprocess
from typing import Any

import numpy as np
import pytest
from accelkit_cuda.fast_elementwise import (
    PERMUTE_RANK,
    PERMUTE_SOURCE,
    permute_args,
    permute_kernel_name,
)
from test_offloop import Plugin, _open, plugin

__all__ = ["plugin"]

pytestmark = pytest.mark.anyio

WIDTHS = (1, 2, 4, 8)

#: CUDA's names for the host: the grid and thread indices as globals the driver sets.
_HOST_SHIMS = r"""
#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__ __restrict
typedef long long i64;
struct Dim { unsigned int x; };
static Dim blockIdx, blockDim, threadIdx, gridDim;
"""

_DRIVER = r"""
extern "C" void host_{name}(const {t}* x, {t}* y, i64 n, i64 d1, i64 d2, i64 d3, i64 s0, i64 s1,
                            i64 s2, i64 s3, unsigned int grid, unsigned int block) {{
    gridDim.x = grid; blockDim.x = block;
    for (unsigned int b = 0; b < grid; ++b)
        for (unsigned int t = 0; t < block; ++t) {{
            blockIdx.x = b; threadIdx.x = t;
            {name}(x, y, n, d1, d2, d3, s0, s1, s2, s3);
        }}
}}
"""
_C_TYPES = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory: pytest.TempPathFactory) -> Any:
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no host C++ compiler to build the permute kernels with")
    drivers = "".join(
        _DRIVER.format(name=permute_kernel_name(w, wide), t=_C_TYPES[w])
        for w in WIDTHS
        for wide in (False, True)
    )
    lib = tmp_path_factory.mktemp("permute") / "permute_host.so"
    subprocess.run(
        [compiler, "-O1", "-shared", "-fPIC", "-x", "c++", "-", "-o", str(lib)],
        input=(_HOST_SHIMS + PERMUTE_SOURCE + drivers).encode(), check=True, capture_output=True,
    )  # fmt: skip
    return ctypes.CDLL(str(lib))


def _cases() -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    shapes = [(7,), (3, 5), (2, 3, 4), (2, 3, 5, 7), (1, 4, 1, 3), (4, 9, 2, 6)]
    return [(s, axes) for s in shapes for axes in itertools.permutations(range(len(s)))]


@pytest.mark.parametrize(("shape", "axes"), _cases())
def test_the_arguments_describe_numpys_transpose(
    shape: tuple[int, ...], axes: tuple[int, ...]
) -> None:
    x = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    found = permute_args(shape, axes)
    assert found is not None
    wide, (n, d1, d2, d3, *steps) = found
    assert not wide
    want = np.transpose(x, axes)
    assert n == want.size
    dims = (n // (d1 * d2 * d3), d1, d2, d3)
    view = np.lib.stride_tricks.as_strided(x.reshape(-1), dims, [s * 8 for s in steps])
    np.testing.assert_array_equal(view.reshape(-1), want.reshape(-1))


def test_the_index_width_and_what_is_left_to_cupy() -> None:
    assert permute_args((1 << 15, 1 << 15), (1, 0))[0] is False  # type: ignore[index]
    assert permute_args((1 << 16, 1 << 15), (1, 0))[0] is True  # type: ignore[index]
    assert permute_args((2, 3, 4, 5, 6), (4, 3, 2, 1, 0)) is None  # more dims than a kernel's
    assert permute_args((3, 0, 2), (2, 1, 0)) is None  # nothing to copy
    assert PERMUTE_RANK == 4


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize(
    ("shape", "axes", "grid", "block"),
    [
        ((2, 3, 5, 7), (0, 2, 1, 3), 1, 32),  # the block's head-major permute; a grid-stride loop
        ((2, 3, 5, 7), (3, 1, 0, 2), 3, 64),
        ((6, 5), (1, 0), 2, 8),
        ((11,), (0,), 1, 4),
        ((4, 1, 3), (2, 0, 1), 4, 256),  # more threads than elements
    ],
)
def test_the_kernels_text_copies_as_numpys_transpose(
    host_kernels: Any, width: int, wide: bool, shape: tuple[int, ...], axes: tuple[int, ...],
    grid: int, block: int,
) -> None:  # fmt: skip
    rng = np.random.default_rng(width)
    dtype = np.dtype(f"u{width}")
    x = rng.integers(0, np.iinfo(dtype).max, shape, dtype=dtype, endpoint=True)
    found = permute_args(shape, axes)
    assert found is not None
    _, args = found
    y = np.zeros(x.size, dtype)
    getattr(host_kernels, f"host_{permute_kernel_name(width, wide)}")(
        ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(y.ctypes.data),
        *(ctypes.c_longlong(v) for v in args), ctypes.c_uint(grid), ctypes.c_uint(block),
    )  # fmt: skip
    np.testing.assert_array_equal(y, np.transpose(x, axes).reshape(-1))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_permute_kernel_compiles_without_spills(arch: str) -> None:
    from nvrtc_checks import assert_compiles_without_spills

    names = [permute_kernel_name(w, wide) for w in WIDTHS for wide in (False, True)]
    source = "\ntypedef long long i64;\n" + PERMUTE_SOURCE
    assert_compiles_without_spills(source, arch, names, "accelkit_permute.cu")


@pytest.mark.parametrize(
    ("dtype", "shape", "axes", "kernel"),
    [
        ("float32", (2, 5, 3, 4), (0, 2, 1, 3), "perm32_i32"),
        ("bfloat16", (3, 4, 5), (2, 0, 1), "perm16_i32"),
        ("bool", (6, 7), (1, 0), "perm8_i32"),
        ("int64", (3, 2, 4, 2), (3, 2, 1, 0), "perm64_i32"),
        ("float64", (2, 3, 2, 2, 3), (4, 0, 3, 1, 2), None),  # five dims: CuPy's path
    ],
)
async def test_the_backends_permute(
    plugin: Plugin, dtype: str, shape: tuple[int, ...], axes: tuple[int, ...], kernel: str | None
) -> None:
    import fake_cupy
    import ml_dtypes

    dt = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    rng = np.random.default_rng(2)
    x_h = (rng.standard_normal(shape) * 50).astype(dt)
    backend = await _open(plugin)
    try:
        await backend.tensor_ops.kernels.fast.load()
        x = backend.tensor_factory.from_host(x_h)
        await backend.synchronize()
        fake_cupy.CALLS.clear()
        got = await backend.tensor_ops.permute(x, axes).to_host()
        launches = [n for n, _ in fake_cupy.CALLS if n.startswith("launch perm")]
    finally:
        await backend.shutdown()
    np.testing.assert_array_equal(got, np.transpose(x_h, axes))
    assert got.dtype == dt
    assert launches == ([] if kernel is None else [f"launch {kernel}"])


def test_the_program_looks_the_permute_kernels_up() -> None:
    mod = importlib.import_module("accelkit_cuda.fast_elementwise")

    class Module:
        def get_function(self, name: str) -> str:
            return name

    program = mod.ElementwiseProgram.__new__(mod.ElementwiseProgram)
    table = program._lookup(Module())
    for w in WIDTHS:
        for wide in (False, True):
            assert table["perm", w, wide] == permute_kernel_name(w, wide)
