"""The Philox4x32-10 draws of issues 27/29 (accelkit_cuda.philox) without a GPU: the NumPy
implementation written from the paper against Random123's known-answer vectors, the draws'
statistics (bounds from the sample size), the key and the grid, and the kernels' NVRTC compile
for the architectures the backend supports (no warnings, no spills). The kernels' NumPy port
runs through the backend over the stand-in CuPy in test_offloop.py and test_sampling.py; the
kernels themselves run on a GPU in test_gpu.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import philox_reference as ref
import pytest
from accelkit_cuda import philox
from nvrtc_checks import assert_compiles_without_spills
from scipy import stats  # type: ignore[import-untyped]

#: Random123's known-answer vectors for philox4x32 with 10 rounds: tests/kat_vectors of
#: https://github.com/DEShawResearch/random123 (v1.14.0; the same on main at 9545ff64), the
#: three "philox4x32 10" lines: counter (4 words), key (2 words), expected output (4 words).
KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]  # fmt: skip

#: How many standard errors a sample statistic may stray (fixed seeds: no flakes; a wrong
#: transform is off by far more at these sample sizes).
K = 5.0
N = 1 << 20


@pytest.mark.parametrize(("counter", "key", "expected"), KAT, ids=["zeros", "ones", "pi"])
def test_philox4x32_10_gives_random123s_known_answers(
    counter: tuple[int, ...], key: tuple[int, int], expected: tuple[int, ...]
) -> None:
    got = ref.philox4x32_10(np.array([counter], np.uint32), key)
    assert [int(w) for w in got[0]] == list(expected)
    # Vectorised: the same answers in a batch, each row its own counter.
    batch = ref.philox4x32_10(np.array([counter, counter], np.uint32), key)
    assert batch.tolist() == [list(expected)] * 2


def test_fewer_rounds_give_other_words() -> None:
    """The round count matters (the KAT is not passed by a generator that ignores it)."""
    counter, key, expected = KAT[2]
    got = ref.philox4x32_10(np.array([counter], np.uint32), key, rounds=7)
    assert [int(w) for w in got[0]] != list(expected)


def test_the_counter_is_the_element_index() -> None:
    """Element i comes from counter i // 4 (f32) or i // 2 (f64): a shorter draw is a prefix
    of a longer one, whatever the grid; counters past 2**32 carry into the second word."""
    key = philox.key_of(2024)
    long = ref.uniforms(1001, key, "f32")
    np.testing.assert_array_equal(ref.uniforms(17, key, "f32"), long[:17])
    np.testing.assert_array_equal(ref.uniforms(7, key, "f64"), ref.uniforms(300, key, "f64")[:7])
    w = ref.words(3, key)
    assert w.tolist() == ref.philox4x32_10(np.array([[i, 0, 0, 0] for i in range(3)]), key).tolist()


@pytest.mark.parametrize(
    ("seed", "key"),
    [(0, (0, 0)), (5, (5, 0)), ((7 << 32) | 3, (3, 7)), ((1 << 64) - 1, (0xFFFFFFFF,) * 2),
     (-1, (0xFFFFFFFF,) * 2), ((1 << 64) | 9, (8, 0))],
)  # fmt: skip
def test_the_key_is_the_seeds_64_bits(seed: int, key: tuple[int, int]) -> None:
    assert philox.key_of(seed) == key


def test_no_seed_draws_a_fresh_key() -> None:
    keys = {philox.key_of(None) for _ in range(8)}
    assert len(keys) == 8
    assert all(0 <= k < 1 << 32 for pair in keys for k in pair)


@pytest.mark.parametrize("acc", ["f32", "f64"])
def test_uniform_values_lie_in_0_1_and_are_uniform(acc: str) -> None:
    u = ref.uniforms(N, philox.key_of(11), acc)
    assert u.dtype == (np.float32 if acc == "f32" else np.float64)
    assert u.min() >= 0.0
    assert u.max() < 1.0
    # The largest value a word can give is 1 - 2**-24 (f32), 1 - 2**-53 (f64): never 1.0.
    assert (np.uint32(0xFFFFFFFF) >> 8) * np.float32(2.0**-24) == np.float32(1 - 2.0**-24)
    x = u.astype(np.float64)
    n = x.size
    assert abs(x.mean() - 0.5) <= K * np.sqrt(1 / 12) / np.sqrt(n)
    # Var((U - 1/2)^2) = E[(U - 1/2)^4] - (1/12)^2 = 1/80 - 1/144 = 1/180.
    assert abs(((x - 0.5) ** 2).mean() - 1 / 12) <= K * np.sqrt(1 / 180) / np.sqrt(n)
    assert stats.kstest(x, "uniform").pvalue > 1e-4
    # The resolution: f32 values are multiples of 2**-24, f64 of 2**-53 (and use the bits).
    bits = 24 if acc == "f32" else 53
    k = x * 2.0**bits
    np.testing.assert_array_equal(k, np.round(k))
    assert np.count_nonzero(np.round(k) % 2) > n // 3  # the lowest bit is random too


@pytest.mark.parametrize("acc", ["f32", "f64"])
def test_normal_values_are_standard_normal(acc: str) -> None:
    z = ref.normals(N, philox.key_of(12), acc).astype(np.float64)
    n = z.size
    assert np.isfinite(z).all()
    assert abs(z.mean()) <= K / np.sqrt(n)
    # Var(Z^2) = E[Z^4] - 1 = 2.
    assert abs((z**2).mean() - 1.0) <= K * np.sqrt(2.0) / np.sqrt(n)
    assert stats.kstest(z, "norm").pvalue > 1e-4
    # Box-Muller's pairs are independent: their correlation is within its standard error.
    assert abs(np.corrcoef(z[0::2], z[1::2])[0, 1]) <= K / np.sqrt(n / 2)
    bound = np.sqrt(-2 * np.log(2.0 ** -(24 if acc == "f32" else 53)))
    assert np.abs(z).max() <= bound * (1 + 1e-6)


@pytest.mark.parametrize("out", [np.float16, np.float32, np.float64, "bfloat16"])
def test_draws_are_scaled_in_the_accumulator_then_rounded_once(out: Any) -> None:
    import ml_dtypes

    dtype = np.dtype(ml_dtypes.bfloat16 if out == "bfloat16" else out)
    acc = "f64" if dtype == np.float64 else "f32"
    wide = np.float64 if acc == "f64" else np.float32
    key = philox.key_of(3)
    got = ref.draw("uniform", 4096, key, acc, -3.0, 8.0, dtype)
    assert got.dtype == dtype
    expected = (wide(-3.0) + wide(8.0) * ref.uniforms(4096, key, acc)).astype(dtype)
    np.testing.assert_array_equal(got, expected)
    assert got.astype(np.float64).min() >= -3.0
    assert got.astype(np.float64).max() <= 5.0  # f16/bf16: rounding may reach b itself


@pytest.mark.parametrize(
    ("a", "b", "acc", "out"),
    [
        (0.0, 1.0, "f32", "bfloat16"),  # 2166 of 2**20 rounded up to 1.0 with scale b - a
        (0.0, 1.0, "f32", np.float16),  # 281
        (-3.0, 5.0, "f32", "bfloat16"),
        (1e6, 1e6 + 1, "f32", np.float32),  # 33149: a spacing of 1/16 there
        (1e6, 1e6 + 1, "f64", np.float32),  # through float32 from float64
        (0.0, 1.0, "f32", np.float32),  # no value reaches b: the scale stays b - a
        (0.0, 1.0, "f64", np.float64),
        (1.0001, 1.5, "f32", "bfloat16"),  # a low BF16 does not hold: 1.0 was drawn
        (0.1, 0.2, "f32", np.float16),
        (1e6 + 0.01, 1e6 + 1, "f32", np.float32),
    ],
)
def test_the_uniform_bounds_keep_every_rounded_value_in_a_b(
    a: float, b: float, acc: str, out: Any
) -> None:
    """``factory_kernels.uniform_bounds`` over the kernels' NumPy port: every value of a
    million-sample draw lies in [a, b) in the output's dtype, the bounds are (a, b - a)
    wherever that already holds, and they move by about a spacing of the dtype otherwise."""
    import ml_dtypes
    from accelkit_cuda.factory_kernels import uniform_bounds

    dtype = np.dtype(ml_dtypes.bfloat16 if out == "bfloat16" else out)
    key = philox.key_of(0)
    offset, scale = uniform_bounds(a, b, acc, dtype)
    x = ref.draw("uniform", 1 << 20, key, acc, offset, scale, dtype).astype(np.float64)
    assert x.min() >= a
    assert x.max() < b
    plain = ref.draw("uniform", 1 << 20, key, acc, a, b - a, dtype).astype(np.float64)
    spacing = 2 * max(float(np.spacing(np.array(v, dtype)).astype(np.float64)) for v in (a, b))
    if plain.min() >= a and plain.max() < b:
        assert (offset, scale) == (a, float(np.float32(b - a)) if acc == "f32" else b - a)
    else:
        assert 0 <= offset - a <= spacing
        assert abs((b - a) - scale) <= 2 * spacing


def test_different_seeds_give_different_streams() -> None:
    a = ref.uniforms(1024, philox.key_of(1), "f32")
    b = ref.uniforms(1024, philox.key_of(2), "f32")
    assert np.count_nonzero(a == b) < 16  # 2**-24 a coincidence


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_draw_kernel_compiles_without_spills(arch: str) -> None:
    assert_compiles_without_spills(philox.SOURCE, arch, philox.NAMES, "accelkit_philox.cu")


def test_a_kernel_for_every_draw() -> None:
    assert len(philox.NAMES) == len(set(philox.NAMES)) == 2 * 7
    for name in philox.NAMES:
        assert f"void {name}(" in philox.SOURCE
    assert set(philox.OUTS.values()) == set(philox.ACCS["f64"])


@pytest.mark.parametrize(
    ("n", "acc", "blocks"),
    [(1, "f32", 1), (4 * 256, "f32", 1), (4 * 256 + 1, "f32", 2), (2 * 256, "f64", 1),
     (2 * 256 + 1, "f64", 2), (1 << 40, "f32", 65535 * 8)],
)  # fmt: skip
def test_the_grid_has_a_thread_a_counter(n: int, acc: str, blocks: int) -> None:
    (grid,) = philox.grid_for(n, acc)
    assert grid == blocks
    counters = -(-n // philox.per_counter(acc))
    assert grid * philox.BLOCK >= counters or grid == 65535 * 8  # grid-stride beyond


_HOST_SHIMS = r"""
#include <cstdint>
typedef long long i64;
typedef unsigned int u32;
typedef unsigned long long u64;
#define __device__
#define __forceinline__ inline
static inline u32 __umulhi(u32 a, u32 b) { return (u32)(((u64)a * b) >> 32); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
"""
_HOST_ENTRIES = r"""
extern "C" void words(const u32* ctr, u32 k0, u32 k1, u32* out) {
    w4 c = {ctr[0], ctr[1], ctr[2], ctr[3]};
    w4 r = philox4x32_10(c, k0, k1);
    out[0] = r.x; out[1] = r.y; out[2] = r.z; out[3] = r.w;
}
extern "C" void uniform_f32(long n, u32 k0, u32 k1, float a, float s, float* out) {
    for (long c = 0; c * 4 < n; ++c) {
        w4 ctr = {(u32)c, (u32)((u64)c >> 32), 0u, 0u};
        w4 r = philox4x32_10(ctr, k0, k1);
        float v[4] = {u24(r.x), u24(r.y), u24(r.z), u24(r.w)};
        for (int j = 0; j < 4 && c * 4 + j < n; ++j) out[c * 4 + j] = affine(a, s, v[j]);
    }
}
extern "C" void uniform_f64(long n, u32 k0, u32 k1, double a, double s, double* out) {
    for (long c = 0; c * 2 < n; ++c) {
        w4 ctr = {(u32)c, (u32)((u64)c >> 32), 0u, 0u};
        w4 r = philox4x32_10(ctr, k0, k1);
        double v[2] = {u53(r.x, r.y), u53(r.z, r.w)};
        for (int j = 0; j < 2 && c * 2 + j < n; ++j) out[c * 2 + j] = affine(a, s, v[j]);
    }
}
"""


@pytest.fixture(scope="module")
def host_core(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """accelkit_cuda.philox.CORE, the kernels' own text of the generator and the uniform
    transforms, built for the host (``__device__`` defined away, CUDA's round-to-nearest
    intrinsics as plain operations, no contraction), with the kernels' loops around it."""
    import ctypes
    import shutil
    import subprocess

    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no host C++ compiler to build the Philox core with")
    lib = tmp_path_factory.mktemp("philox") / "philox_host.so"
    subprocess.run(
        [compiler, "-O1", "-ffp-contract=off", "-fno-fast-math", "-Wno-unknown-pragmas",
         "-shared", "-fPIC", "-x", "c++", "-", "-o", str(lib)],
        input=(_HOST_SHIMS + philox.CORE + _HOST_ENTRIES).encode(), check=True,
        capture_output=True,
    )  # fmt: skip
    return ctypes.CDLL(str(lib))


@pytest.mark.parametrize(("counter", "key", "expected"), KAT, ids=["zeros", "ones", "pi"])
def test_the_kernels_generator_gives_random123s_known_answers(
    host_core: Any, counter: tuple[int, ...], key: tuple[int, int], expected: tuple[int, ...]
) -> None:
    import ctypes

    ctr = np.array(counter, np.uint32)
    out = np.zeros(4, np.uint32)
    host_core.words(
        ctypes.c_void_p(ctr.ctypes.data), ctypes.c_uint32(key[0]), ctypes.c_uint32(key[1]),
        ctypes.c_void_p(out.ctypes.data),
    )  # fmt: skip
    assert [int(w) for w in out] == list(expected)


@pytest.mark.parametrize("acc", ["f32", "f64"])
def test_the_kernels_uniforms_are_the_numpy_ports_bit_for_bit(host_core: Any, acc: str) -> None:
    import ctypes

    n, (k0, k1) = 10_001, philox.key_of(0xDEADBEEF12345)
    wide = np.float32 if acc == "f32" else np.float64
    c_wide = ctypes.c_float if acc == "f32" else ctypes.c_double
    out = np.empty(n, wide)
    getattr(host_core, f"uniform_{acc}")(
        ctypes.c_long(n), ctypes.c_uint32(k0), ctypes.c_uint32(k1), c_wide(-3.0), c_wide(8.0),
        ctypes.c_void_p(out.ctypes.data),
    )  # fmt: skip
    np.testing.assert_array_equal(out, ref.draw("uniform", n, (k0, k1), acc, -3.0, 8.0, wide))
