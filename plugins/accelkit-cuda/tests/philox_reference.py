"""Philox4x32-10 in NumPy, written from the paper (Salmon, Moraes, Dror, Shaw: "Parallel random
numbers: as easy as 1, 2, 3", SC'11, section 3.3 and table 2), and the port of
accelkit_cuda.philox's draw kernels that the stand-in CuPy runs (fake_cupy.Function) and the
tests compare with. test_philox.py checks :func:`philox4x32_10` against Random123's published
known-answer vectors."""

from __future__ import annotations

from typing import Any

import numpy as np

#: The round's multipliers and the key schedule's Weyl constants (the paper's table 2).
M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
_MASK = np.uint64(0xFFFFFFFF)


def philox4x32_10(counter: Any, key: Any, rounds: int = 10) -> np.ndarray[Any, Any]:
    """The generator on counters ``counter`` (``(..., 4)`` uint32) and a key ``(k0, k1)``:
    ``rounds`` rounds of S-box (two 32x32->64-bit products, hi/lo words permuted, XORed with
    the other words and the round key), the key bumped by (W0, W1) between rounds."""
    ctr = np.asarray(counter, np.uint32).astype(np.uint64)
    c0, c1, c2, c3 = (ctr[..., i] for i in range(4))
    k0, k1 = (np.uint64(int(k)) for k in key)
    for r in range(rounds):
        if r:
            k0 = (k0 + np.uint64(W0)) & _MASK
            k1 = (k1 + np.uint64(W1)) & _MASK
        p0 = np.uint64(M0) * c0  # < 2**64: exact in uint64
        p1 = np.uint64(M1) * c2
        c0, c1, c2, c3 = (
            (p1 >> np.uint64(32)) ^ c1 ^ k0,
            p1 & _MASK,
            (p0 >> np.uint64(32)) ^ c3 ^ k1,
            p0 & _MASK,
        )
    return np.stack([c0, c1, c2, c3], -1).astype(np.uint32)


def words(n_counters: int, key: tuple[int, int]) -> np.ndarray[Any, Any]:
    """The four words of counters ``0 .. n_counters - 1`` (counter ``c`` is ``(c, c >> 32, 0,
    0)``) under ``key``: shape ``(n_counters, 4)``."""
    c = np.arange(n_counters, dtype=np.uint64)
    ctr = np.zeros((n_counters, 4), np.uint32)
    ctr[:, 0] = (c & _MASK).astype(np.uint32)
    ctr[:, 1] = (c >> np.uint64(32)).astype(np.uint32)
    return philox4x32_10(ctr, key)


def uniforms(n: int, key: tuple[int, int], acc: str) -> np.ndarray[Any, Any]:
    """The kernels' uniforms U in [0, 1) of elements ``0 .. n-1`` (exact: they are k * 2**-24
    in float32, k * 2**-53 in float64)."""
    if acc == "f32":
        w = words((n + 3) // 4, key).reshape(-1)[:n]
        return (w >> 8).astype(np.float32) * np.float32(2.0**-24)
    w = words((n + 1) // 2, key).astype(np.uint64).reshape(-1, 2)
    k = ((w[:, 0] >> np.uint64(5)) << np.uint64(26)) | (w[:, 1] >> np.uint64(6))
    return (k.astype(np.float64) * 2.0**-53)[:n]


def normals(n: int, key: tuple[int, int], acc: str) -> np.ndarray[Any, Any]:
    """The kernels' Box-Muller normals of elements ``0 .. n-1``: U1 in (0, 1] and U2 in
    [0, 1) per pair, sqrt(-2 ln U1) (cos, sin)(2 pi U2), computed in float64 and rounded to
    ``acc`` (the device's logf/sincospif differ from this by a few ulps)."""
    if acc == "f32":
        w = words((n + 3) // 4, key)
        u = (w >> 8).astype(np.float64) * 2.0**-24
        u1, u2 = u[:, 0::2] + 2.0**-24, u[:, 1::2]  # pairs (x, y) and (z, w)
    else:
        w = words((n + 1) // 2, key).astype(np.uint64)
        k = ((w[:, 0::2] >> np.uint64(5)) << np.uint64(26)) | (w[:, 1::2] >> np.uint64(6))
        u = k.astype(np.float64) * 2.0**-53
        u1, u2 = u[:, :1] + 2.0**-53, u[:, 1:]
    q = np.sqrt(-2.0 * np.log(u1))
    z = np.stack([q * np.cos(2 * np.pi * u2), q * np.sin(2 * np.pi * u2)], -1)
    return z.reshape(-1)[:n].astype(np.float32 if acc == "f32" else np.float64)


def draw(
    kind: str, n: int, key: tuple[int, int], acc: str, a: float, scale: float, out: Any
) -> np.ndarray[Any, Any]:
    """What kernel ``philox_{kind}_{acc}_{out}`` writes: ``a + scale * X`` with each operation
    rounded once in ``acc`` (``a`` and ``scale`` rounded to it first, as the launch passes
    them), then rounded to the output dtype ``out`` (from f64 through f32 for a narrower one)."""
    wide = np.float32 if acc == "f32" else np.float64
    x = uniforms(n, key, acc) if kind == "uniform" else normals(n, key, acc)
    with np.errstate(over="ignore", invalid="ignore"):
        y = wide(a) + wide(scale) * x
        if np.dtype(out) not in (np.dtype(np.float64), np.dtype(wide)):
            y = y.astype(np.float32)
        return y.astype(out)
