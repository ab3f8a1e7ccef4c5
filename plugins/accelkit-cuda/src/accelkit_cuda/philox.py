"""Counter-based random numbers on the device: Philox4x32-10 as raw NVRTC kernels (issues 27/29).

Philox4x32-10 is the counter-based generator of Salmon, Moraes, Dror and Shaw, "Parallel random
numbers: as easy as 1, 2, 3" (SC'11), as in their Random123 library: ten rounds of two 32x32->64
bit multiplications (by ``0xD2511F53`` and ``0xCD9E8D57``) and XORs with a 64-bit key that is
bumped by the Weyl constants ``0x9E3779B9`` and ``0xBB67AE85`` between rounds, turning a 128-bit
counter into four 32-bit random words. Here the **key** is the draw's 64-bit seed (low word,
high word) and the **counter** is ``(c, c >> 32, 0, 0)`` for the counter index ``c``: element
``i`` of a draw is a function of the seed and ``i`` alone, so a draw is one launch without
state, and a seed gives the same numbers on any grid and any device.

What a counter makes (``acc`` is the dtype the draw is computed in, :func:`random_dtype
<accelkit_cuda.factory_kernels.random_dtype>`):

- **uniform, f32**: four values ``U = (w >> 8) * 2**-24`` from the four words, in
  ``[0, 1 - 2**-24]``: never 1.0, and **0 can occur** (probability ``2**-24`` per value).
- **uniform, f64**: two values ``U = ((w0 >> 5) * 2**26 + (w1 >> 6)) * 2**-53`` from the word
  pairs (0, 1) and (2, 3), in ``[0, 1 - 2**-53]``; 0 can occur (probability ``2**-53``).
- **normal**: Box-Muller (Box and Muller, 1958) on pairs of uniforms: ``U1`` in ``(0, 1]`` (the
  uniform above plus one step, so the logarithm is finite), ``U2`` in ``[0, 1)``,
  ``Z0 = sqrt(-2 ln U1) cos(2 pi U2)`` and ``Z1 = sqrt(-2 ln U1) sin(2 pi U2)``: four values a
  counter in f32 (words 0, 1 and 2, 3 make the two pairs), two in f64 (one pair of 53-bit
  uniforms). ``|Z|`` is at most ``sqrt(2 ln 2**24)``, about 5.77, in f32 (``sqrt(2 ln 2**53)``,
  about 8.57, in f64): tails beyond are not drawn (5.77 sigma: probability about 8e-9).

The output is ``o + s * U`` (uniform; ``a`` and ``b - a``, or nudged by a spacing where that
rounded a value out of ``[a, b)`` in the output's dtype: ``factory_kernels.uniform_bounds``) or ``a + b * Z``
(normal), each operation rounded once in ``acc`` (no contraction into an FMA, so NumPy
computes the same uniform bits), and
written straight in the output's dtype (f16, bf16, f32 or f64: rounded to nearest even), so a
draw is one launch and no cast follows. Element ``i`` comes from counter ``i // 4`` (f32) or
``i // 2`` (f64).

The kernels compile on a worker thread at ``initialize`` and load on the submission thread
before the backend serves (:class:`PhiloxProgram`); if NVRTC is missing or the compile fails,
every draw takes CuPy's generator instead (``cupy.random.default_rng(seed)``, the path before
this module: other numbers for a seed). **Unverified on a GPU** when written: the kernels
compile in the GPU-free tests and their NumPy port (tests/philox_reference.py, checked against
Random123's known-answer vectors) runs through the backend over the stand-in CuPy.
"""

from __future__ import annotations

import secrets
from typing import Any

from accelkit_cuda.fast_elementwise import HALF_IO
from accelkit_cuda.nvrtc import RawProgram

__all__ = [
    "ACCS",
    "BLOCK",
    "CORE",
    "KINDS",
    "NAMES",
    "OUTS",
    "SOURCE",
    "PhiloxProgram",
    "grid_for",
    "kernel_name",
    "key_of",
    "per_counter",
]


#: Threads per block of the draw kernels.
BLOCK = 256
#: Blocks at most in a launch: a grid-stride loop over the counters covers the rest.
_MAX_BLOCKS = 65535 * 8
_MASK64 = (1 << 64) - 1

#: The draws (RandomDraw.kind).
KINDS = ("uniform", "normal")
#: The dtypes a draw is computed in, and the output dtypes each writes.
ACCS: dict[str, tuple[str, ...]] = {
    "f32": ("f32", "f16", "bf16"),
    "f64": ("f64", "f32", "f16", "bf16"),
}
#: Every output dtype, by NumPy name.
OUTS = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}

_HEADER = (
    "\ntypedef long long i64;\ntypedef unsigned int u32;\ntypedef unsigned long long u64;\n\n"
    + HALF_IO
)

#: The generator and the transforms (device functions of plain C++ and CUDA's rounding
#: intrinsics: the tests build this text for the host and compare it with the NumPy port).
CORE = r"""
struct w4 { u32 x, y, z, w; };

// Philox4x32-10 (Salmon et al., SC'11; Random123's philox4x32round and philox4x32bumpkey).
__device__ __forceinline__ w4 philox4x32_10(w4 c, u32 k0, u32 k1) {
    #pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        u32 hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        u32 hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        w4 n = {hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
        c = n;
    }
    return c;
}

#define TWO_M24 5.9604644775390625e-08f     // 2**-24
#define TWO_M53 1.1102230246251565e-16      // 2**-53
__device__ __forceinline__ float u24(u32 w) { return (float)(w >> 8) * TWO_M24; }
__device__ __forceinline__ double u53(u32 hi, u32 lo) {
    return (double)(((u64)(hi >> 5) << 26) | (u64)(lo >> 6)) * TWO_M53;
}
__device__ __forceinline__ float affine(float a, float s, float x) {
    return __fadd_rn(a, __fmul_rn(s, x));
}
__device__ __forceinline__ double affine(double a, double s, double x) {
    return __dadd_rn(a, __dmul_rn(s, x));
}
"""

#: The values one counter makes: f32 draws four, f64 draws two.
_BODIES = {
    ("uniform", "f32"): """
        v[0] = u24(r.x); v[1] = u24(r.y); v[2] = u24(r.z); v[3] = u24(r.w);""",
    ("uniform", "f64"): """
        v[0] = u53(r.x, r.y); v[1] = u53(r.z, r.w);""",
    ("normal", "f32"): """
        float s0, c0, s1, c1;
        float q0 = sqrtf(-2.0f * logf(u24(r.x) + TWO_M24));
        float q1 = sqrtf(-2.0f * logf(u24(r.z) + TWO_M24));
        sincospif(2.0f * u24(r.y), &s0, &c0);
        sincospif(2.0f * u24(r.w), &s1, &c1);
        v[0] = q0 * c0; v[1] = q0 * s0; v[2] = q1 * c1; v[3] = q1 * s1;""",
    ("normal", "f64"): """
        double s0, c0;
        double q0 = sqrt(-2.0 * log(u53(r.x, r.y) + TWO_M53));
        sincospi(2.0 * u53(r.z, r.w), &s0, &c0);
        v[0] = q0 * c0; v[1] = q0 * s0;""",
}

_KERNEL = r"""
extern "C" __global__ void {name}({t}* o, i64 n, u32 k0, u32 k1, {acc} a, {acc} s) {{
    const i64 m = (n + {per} - 1) / {per};
    for (i64 c = blockIdx.x * (i64)blockDim.x + threadIdx.x; c < m;
         c += (i64)gridDim.x * blockDim.x) {{
        w4 ctr = {{(u32)c, (u32)((u64)c >> 32), 0u, 0u}};
        w4 r = philox4x32_10(ctr, k0, k1);
        {acc} v[{per}];{body}
        const i64 base = c * {per};
        #pragma unroll
        for (int j = 0; j < {per}; ++j)
            if (base + j < n) st(o, base + j, ({store})affine(a, s, v[j]));
    }}
}}
"""

_CTYPES = {"f32": "float", "f64": "double", "f16": "f16", "bf16": "bf16"}


def per_counter(acc: str) -> int:
    """How many values one counter makes in ``acc`` ("f32": 4, "f64": 2)."""
    return 4 if acc == "f32" else 2


def kernel_name(kind: str, acc: str, out: str) -> str:
    """The entry point of a ``kind`` draw computed in ``acc``, written as ``out``
    (``philox_uniform_f32_f16``)."""
    return f"philox_{kind}_{acc}_{out}"


def _source() -> str:
    parts = [_HEADER, CORE]
    for kind in KINDS:
        for acc, outs in ACCS.items():
            for out in outs:
                parts.append(
                    _KERNEL.format(
                        name=kernel_name(kind, acc, out), t=_CTYPES[out], acc=_CTYPES[acc],
                        per=per_counter(acc), body=_BODIES[kind, acc],
                        store="double" if out == "f64" else "float",
                    )
                )  # fmt: skip
    return "".join(parts)


#: The CUDA C++ of every draw kernel.
SOURCE = _source()
#: Every kernel's name.
NAMES = tuple(kernel_name(k, acc, out) for k in KINDS for acc, outs in ACCS.items() for out in outs)


def grid_for(n: int, acc: str) -> tuple[int]:
    """The grid of a draw of ``n`` values (``n`` > 0) computed in ``acc``: a thread a counter."""
    m = (n + per_counter(acc) - 1) // per_counter(acc)
    return (min((m + BLOCK - 1) // BLOCK, _MAX_BLOCKS),)


def key_of(seed: int | None) -> tuple[int, int]:
    """The Philox key of ``seed``: its low and high 32-bit words (a seed beyond 64 bits is
    folded by XOR of its 64-bit words; a negative one taken in two's complement); None draws
    a fresh 64-bit key from the OS's entropy."""
    if seed is None:
        value = secrets.randbits(64)
    else:
        value, rest = seed & _MASK64, seed >> 64
        while rest not in (0, -1):
            value ^= rest & _MASK64
            rest >>= 64
    return value & 0xFFFFFFFF, value >> 32


class PhiloxProgram(RawProgram):
    """The kernels of :data:`SOURCE` for one backend, compiled on a worker thread and loaded
    on the submission thread by :meth:`load` (which ``initialize`` awaits, so every draw of a
    backend takes one path: a seed's numbers never depend on when the compile finished).
    :meth:`function` answers without waiting: None when compiling or loading failed, and
    the draw takes CuPy's generator then."""

    SOURCE = SOURCE
    FILENAME = "accelkit_philox.cu"
    SWITCH = "ACCELKIT_CUDA_PHILOX"
    FALLBACK = "CuPy's generator draws"

    def function(self, kind: str, acc: str, out: str) -> Any:
        """The loaded kernel of a ``kind`` draw in ``acc`` written as ``out``, or None."""
        return self._functions.get(kernel_name(kind, acc, out))

    def _lookup(self, module: Any) -> dict[Any, Any]:
        return {name: module.get_function(name) for name in NAMES}
