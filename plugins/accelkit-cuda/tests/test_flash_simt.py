"""The register-tiled f32 attention kernel (``accelkit_cuda.flash_simt``) without a GPU.

Its CUDA text is built for the host with a C++ compiler and run as the device would run it:
one OS thread per CUDA thread of a block (256), ``__syncthreads`` a barrier of the block,
``__shfl_xor_sync`` an exchange through a per-warp buffer between two barriers of the warp,
the dynamic shared memory one buffer per block. A wrong index, mask, reduction or missing
barrier (a race between threads that really run at once) shows against the float64 reference
within the kernel's own error bound (:func:`~accelkit_cuda.flash_simt.tolerance`). NVRTC
compiles every variant for sm_80 and sm_90 without spills; the backend routes f32 attention
to it once it is verified, and not before.
"""

from __future__ import annotations

import ctypes
import importlib
import math
import shutil
import subprocess
from typing import Any

import numpy as np
import pytest
import test_offloop
from accelkit_cuda.flash_simt import (
    CHECK_SHAPES,
    HEAD_DIMS,
    SOURCE,
    compare,
    geometry,
    kernel_name,
    kernel_names,
    refusal,
    shared_bytes,
    tolerance,
)

from accelkit.dtype import DType

#: The stand-in's plugin, imported over ``fake_cupy`` (test_offloop's fixture).
plugin = test_offloop.plugin

#: [B, H, S, D] <-> [B, S, H, D]
SWAP = (0, 2, 1, 3)

_HOST_SHIMS = r"""
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>
using std::isnan;
struct Dim3 { unsigned int x, y, z; };
static thread_local Dim3 threadIdx;
static Dim3 blockIdx, blockDim, gridDim;
static std::barrier<>* block_barrier;
static std::barrier<>* warp_barrier[8];
static double warp_exchange[8][32];
static float* host_shared;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define DYNAMIC_SHARED(T, name) T* name = (T*)host_shared
static void __syncthreads() { block_barrier->arrive_and_wait(); }
template <class T> static T __shfl_xor_sync(unsigned, T value, int offset) {
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    warp_exchange[w][lane] = (double)value;  // float and int are exact in a double
    warp_barrier[w]->arrive_and_wait();
    const T got = (T)warp_exchange[w][lane ^ offset];
    warp_barrier[w]->arrive_and_wait();
    return got;
}
static float __int_as_float(int bits) { float f; std::memcpy(&f, &bits, 4); return f; }
"""

_DRIVER = r"""
extern "C" void host_d{d}(const float* q, const float* k, const float* v, float* out, int H,
                          int Hkv, long long Sq, long long Sk, float scale, int causal,
                          int seq_major, unsigned int gx, unsigned int gy, long long smem) {{
    std::vector<float> shared(smem / 4);
    host_shared = shared.data();
    gridDim = {{gx, gy, 1}};
    blockDim = {{256, 1, 1}};
    for (unsigned int by = 0; by < gy; ++by)
        for (unsigned int bx = 0; bx < gx; ++bx) {{
            blockIdx = {{bx, by, 0}};
            std::barrier<> block(256);
            block_barrier = &block;
            std::vector<std::barrier<>*> warps;
            for (int w = 0; w < 8; ++w) warp_barrier[w] = new std::barrier<>(32);
            std::fill(shared.begin(), shared.end(), NAN);  // nothing read before it is written
            std::vector<std::thread> threads;
            for (unsigned int t = 0; t < 256; ++t)
                threads.emplace_back([=] {{
                    threadIdx = {{t, 0, 0}};
                    simt_attention_f32_d{d}(q, k, v, out, H, Hkv, Sq, Sk, scale, causal, seq_major);
                }});
            for (auto& t : threads) t.join();
            for (int w = 0; w < 8; ++w) delete warp_barrier[w];
        }}
}}
"""


@pytest.fixture(scope="module")
def host_kernel(tmp_path_factory: pytest.TempPathFactory) -> Any:
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no host C++ compiler to build the attention kernel with")
    lib = tmp_path_factory.mktemp("simt") / "simt_host.so"
    source = _HOST_SHIMS + SOURCE + "".join(_DRIVER.format(d=d) for d in HEAD_DIMS)
    done = subprocess.run(
        [compiler, "-std=c++20", "-O2", "-pthread", "-shared", "-fPIC", "-Wno-unknown-pragmas",
         "-x", "c++", "-", "-o", str(lib)],
        input=source.encode(), capture_output=True,
    )  # fmt: skip
    if done.returncode and b"barrier" in done.stderr:
        pytest.skip(f"the host compiler lacks C++20's <barrier>: {done.stderr[:200]!r}")
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return ctypes.CDLL(str(lib))


def _run(
    lib: Any, q: np.ndarray[Any, Any], k: np.ndarray[Any, Any], v: np.ndarray[Any, Any],
    scale: float, causal: bool, seq_major: bool = False,
) -> np.ndarray[Any, Any]:  # fmt: skip
    """The kernel on head-major ``q``, ``k``, ``v``; with ``seq_major`` it is given them
    stored [B, S, H, D] (copies) and writes such an output, returned head-major."""
    b, h, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    if seq_major:
        q, k, v = (np.ascontiguousarray(a.transpose(SWAP)) for a in (q, k, v))
        out = np.full((b, sq, h, d), np.nan, np.float32)  # every element must be written
    else:
        out = np.full((b, h, sq, d), np.nan, np.float32)
    (gx, gy), _, smem = geometry(b, h, sq, d)
    getattr(lib, f"host_d{d}")(
        *(ctypes.c_void_p(a.ctypes.data) for a in (q, k, v, out)), ctypes.c_int(h),
        ctypes.c_int(hk), ctypes.c_longlong(sq), ctypes.c_longlong(sk), ctypes.c_float(scale),
        ctypes.c_int(causal), ctypes.c_int(seq_major), ctypes.c_uint(gx), ctypes.c_uint(gy),
        ctypes.c_longlong(smem),
    )  # fmt: skip
    return out.transpose(SWAP) if seq_major else out


def _inputs(
    seed: int, b: int, h: int, hk: int, sq: int, sk: int, d: int
) -> tuple[np.ndarray[Any, Any], ...]:
    rng = np.random.default_rng(seed)
    return tuple(
        np.ascontiguousarray(rng.standard_normal((b, n, s, d)), np.float32)
        for n, s in ((h, sq), (hk, sk), (hk, sk))
    )


@pytest.mark.parametrize("seq_major", [False, True], ids=["bhsd", "bshd"])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize(
    "shape", CHECK_SHAPES, ids=lambda s: "B{}H{}/{}Sq{}Sk{}{}".format(*s[:5], "c" * s[5])
)
def test_the_kernels_text_matches_the_reference(
    host_kernel: Any, d: int, shape: tuple[int, int, int, int, int, bool], seq_major: bool
) -> None:
    # The shapes of the on-device check: partial tiles, several tiles, grouped heads, causal
    # rows that see no key (Sq > Sk), a single row; head-major and sequence-major storage
    # (``attention_bshd``: rows H * D apart, grouped KV heads Hkv * D apart).
    b, h, hk, sq, sk, causal = shape
    q, k, v = _inputs(d + sq, b, h, hk, sq, sk, d)
    scale = 1.0 / math.sqrt(d)
    got = _run(host_kernel, q, k, v, scale, causal, seq_major)
    assert compare(got, q, k, v, scale, causal) is None
    if causal and sq > sk:  # the rows that see no key are zero
        assert not got[:, :, : sq - sk].any()


def test_large_scores_and_the_online_rescaling(host_kernel: Any) -> None:
    # Scores of a few hundred (each tile's maximum far above the last): the running maxima and
    # the rescaling of the accumulators must keep every probability finite and right.
    q, k, v = _inputs(7, 1, 2, 2, 65, 200, 64)
    q *= 8.0
    got = _run(host_kernel, q, k, v, 1.0, False)
    assert compare(got, q, k, v, 1.0, False) is None


def test_a_nan_score_makes_its_row_nan_and_no_other(host_kernel: Any) -> None:
    q, k, v = _inputs(3, 1, 2, 2, 70, 70, 32)
    q[0, 1, 5, 3] = np.nan  # row 5 of head 1: every score NaN
    k[0, 0, 66, 0] = np.nan  # key 66 of head 0: seen (causal) by rows 66..69 only
    got = _run(host_kernel, q, k, v, 0.25, True)
    assert np.isnan(got[0, 1, 5]).all()
    assert np.isnan(got[0, 0, 66:]).all()
    nan_rows = np.isnan(got).any(-1)
    assert nan_rows.sum() == 1 + 4, np.argwhere(nan_rows)


def test_a_wrong_bound_or_layout_is_caught() -> None:
    # compare() is what the on-device check and these tests rely on: a swapped pair of keys or a
    # dropped causal mask is far outside the bound; the bound is of the order of the arithmetic.
    q, k, v = _inputs(5, 1, 2, 1, 40, 40, 32)
    from accelkit_cuda.flash_attention import reference

    right = reference(q, k, v, 0.2, True).astype(np.float32)
    assert compare(right, q, k, v, 0.2, True) is None
    assert compare(reference(q, k, v, 0.2, False).astype(np.float32), q, k, v, 0.2, True)
    swapped = k.copy()
    swapped[:, :, [3, 4]] = swapped[:, :, [4, 3]]
    wrong = reference(q, swapped, v, 0.2, True).astype(np.float32)
    assert compare(wrong, q, k, v, 0.2, True)
    assert 0 < tolerance(40, 32, 5.0) < 1e-4


def test_what_the_kernel_refuses() -> None:
    loaded = set(kernel_names())
    shape = (2, 4, 100, 64)
    assert refusal(DType.F32, shape, shape, shape, loaded) is None
    assert "f32" in (refusal(DType.F16, shape, shape, shape, loaded) or "")
    odd = (2, 4, 100, 48)
    assert "head_dim" in (refusal(DType.F32, odd, odd, odd, loaded) or "")
    assert "head_dim_v" in (refusal(DType.F32, shape, shape, (2, 4, 100, 32), loaded) or "")
    assert "shared memory" in (
        refusal(DType.F32, shape, shape, shape, loaded - {kernel_name(64)}) or ""
    )
    assert "empty" in (refusal(DType.F32, (2, 4, 0, 64), shape, shape, loaded) or "")
    assert shared_bytes(64) == (2 * 64 * 65 + 64 * 64 + 64 * 65) * 4


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_variant_compiles_without_spills(arch: str) -> None:
    from nvrtc_checks import assert_compiles_without_spills

    assert_compiles_without_spills(SOURCE, arch, kernel_names(), "accelkit_flash_simt.cu")


@pytest.mark.anyio
async def test_the_backend_routes_f32_attention_to_it_once_verified(
    plugin: Any, host_kernel: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    # Over the stand-in for CuPy: the on-device check's child passes (its answer stubbed), so
    # the backend loads the kernel and f32 attention launches it; the launch runs this text on
    # the host over the stand-in's memory, so the answer checks the arguments the backend
    # passes (pointers, heads, lengths, scale, mask) and the grid and shared memory it asks for.
    import fake_cupy

    monkeypatch.setenv("ACCELKIT_CUDA_VERDICTS", str(tmp_path))
    fa = importlib.import_module("accelkit_cuda.flash_attention")
    monkeypatch.setattr(fa, "_run_child", lambda *a: (None, True))
    launches: list[tuple[Any, ...]] = []
    others: list[str] = []
    call = fake_cupy.Function.__call__

    def launch(self: Any, grid: Any, block: Any, args: Any, **kwargs: Any) -> None:
        if not self.name.startswith("simt_attention_f32_d"):
            others.append(self.name)
            call(self, grid, block, args, **kwargs)
            return
        launches.append((self.name, grid, block, kwargs.get("shared_mem")))
        ptrs, rest = args[:4], args[4:]
        getattr(host_kernel, "host_d" + self.name.rsplit("_d", 1)[1])(
            *(ctypes.c_void_p(int(p)) for p in ptrs), ctypes.c_int(int(rest[0])),
            ctypes.c_int(int(rest[1])), ctypes.c_longlong(int(rest[2])),
            ctypes.c_longlong(int(rest[3])), ctypes.c_float(float(rest[4])),
            ctypes.c_int(int(rest[5])), ctypes.c_int(int(rest[6])), ctypes.c_uint(grid[0]),
            ctypes.c_uint(grid[1]), ctypes.c_longlong(kwargs["shared_mem"]),
        )  # fmt: skip

    monkeypatch.setattr(fake_cupy.Function, "__call__", launch)
    backend = plugin.backend.CUDABackend()
    await backend.initialize("cuda:0")
    try:
        assert backend.flash_simt.verified, backend.flash_simt.describe()
        f, kops = backend.tensor_factory, backend.kernel_ops
        q, k, v = _inputs(11, 2, 4, 2, 70, 75, 64)
        got = await kops.attention(
            f.from_host(q), f.from_host(k), f.from_host(v), causal=True
        ).to_host()
        route = backend.attention_engines.last_route
        assert route is not None
        assert route.engine == "simt", route
        assert launches == [("simt_attention_f32_d64", (2, 8), (256,), shared_bytes(64))]
        assert compare(got, q, k, v, 1.0 / 8.0, True) is None
        # Sequence-major (a projection's output reshaped to heads): the same kernel reads and
        # writes it in place, and nothing else is launched (no permute before or after).
        qs, ks, vs = (f.from_host(np.ascontiguousarray(a.transpose(SWAP))) for a in (q, k, v))
        await backend.synchronize()
        others.clear()
        res = backend.tensor_ops.attention(qs, ks, vs, causal=True, layout="bshd")
        assert res.shape == (2, 70, 4, 64)
        got = (await res.to_host()).transpose(SWAP)
        assert others == []
        route = backend.attention_engines.last_route
        assert route is not None
        assert route.engine == "simt", route
        assert "sequence-major in place" in route.reason
        assert launches[1:] == [("simt_attention_f32_d64", (2, 8), (256,), shared_bytes(64))]
        assert compare(got, q, k, v, 1.0 / 8.0, True) is None
        got = (await kops.attention(qs, ks, vs, causal=True, layout="bshd").to_host()).transpose(
            SWAP
        )
        assert kops.last_route is not None
        assert kops.last_route.route == "fused"  # KernelOps: the same kernel, in place
        assert others == []
        assert len(launches) == 3
        assert compare(got, q, k, v, 1.0 / 8.0, True) is None
        del launches[1:]
        backend.flash_simt.enabled = False  # the warp-per-row kernel again
        kops.attention(f.from_host(q), f.from_host(k), f.from_host(v), causal=True)
        await backend.synchronize()
        route = backend.attention_engines.last_route
        assert route is not None
        assert route.engine == "warp"
        assert "f32 tiled kernel: " in route.reason
        assert "switched off" in route.reason
        assert len(launches) == 1
        # Sequence-major with no kernel that reads it in place: declined, so the core permutes
        # around the warp-per-row kernel (four permute copies; the stand-in does not run the
        # warp-per-row kernel, whose answers the GPU tests check).
        others.clear()
        res = backend.tensor_ops.attention(qs, ks, vs, causal=True, layout="bshd")
        await res.to_host()
        assert res.shape == (2, 70, 4, 64)
        assert backend.attention_engines.last_route.engine == "warp"  # type: ignore[union-attr]
        assert len(launches) == 1
        assert others == ["perm32_i32"] * 3 + ["flash_attention_f32", "perm32_i32"]
    finally:
        await backend.shutdown()


def test_the_check_fails_where_no_variant_was_loaded() -> None:
    # A device whose shared memory holds no variant (or a shared-memory limit read as 0)
    # must not pass the on-device check by checking nothing.
    from accelkit_cuda.flash_simt import _check

    assert _check({"": object()}) == "no variant fits the device's shared memory"


@pytest.mark.anyio
@pytest.mark.parametrize("optin", [24 * 1024, 40 * 1024, 100 * 1024])
async def test_a_device_with_little_shared_memory(plugin: Any, optin: int) -> None:
    # What the device reports decides what is loaded, never trusted blind: below the smallest
    # variant's 29 KiB the kernel is unavailable (nothing compiled, the warp-per-row kernel
    # serves); at 40 KiB only head dim 16 is loaded (32 needs 42 KiB); at 100 KiB the
    # head-dim-128 variant (115 KiB) is refused per call while the others serve.
    from types import SimpleNamespace

    from accelkit_cuda.driver import Attr, DeviceProps
    from accelkit_cuda.flash_simt import SimtAttention

    props = DeviceProps(0, "small", 1 << 30, {Attr.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: optin}, 12040)
    simt = SimtAttention(SimpleNamespace(_arch="sm_90"), props)
    if optin < shared_bytes(min(HEAD_DIMS)):
        await simt.load()  # (no compile: it stops at the precondition)
        assert simt.state == "unavailable"
        assert f"the device allows {optin}" in simt.reason
        assert "unavailable" in (refusal_of(simt) or "")
        return
    # (the stand-in for CuPy's module: the variants looked up are what the device can hold)
    fs = importlib.import_module("accelkit_cuda.flash_simt")
    loaded = set(fs._load(b"\0cubin", optin)) - {""}
    fits = (16,) if optin < 42 * 1024 else (16, 32, 64)
    assert loaded == {kernel_name(d) for d in fits}
    big = (1, 2, 10, 128)
    assert "shared memory is too small" in (refusal(DType.F32, big, big, big, loaded) or "")
    small = (1, 2, 10, fits[-1])
    assert refusal(DType.F32, small, small, small, loaded) is None


def refusal_of(simt: Any) -> str | None:
    shape = (1, 2, 10, 64)
    q = type("T", (), {"dtype": DType.F32, "shape": shape})()
    return simt.refusal(q, q, q)  # type: ignore[no-any-return]
