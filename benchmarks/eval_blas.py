"""Which BLAS is fastest for the transformer block's GEMM shapes on this machine?

Compares the BLAS NumPy links (OpenBLAS in PyPI's wheels) with Intel MKL (``pip install mkl``:
``cblas_sgemm`` from its ``libmkl_rt``, through ctypes) and BLIS (``pip install blis``, single
threaded), on ``x @ w.T`` for the block's shapes. Libraries that are not installed are skipped
with a note. Prints GFLOP/s (median of 15 runs each, same process).

    python benchmarks/eval_blas.py
"""

from __future__ import annotations

import ctypes
import glob
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]
SHAPES = ((1024, 512, 512), (1024, 2048, 512), (1024, 512, 2048), (2048, 2048, 2048))


def _mkl() -> Callable[[Array, Array, Array], None] | None:
    found = glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*"))
    if not found:
        return None
    lib = ctypes.CDLL(found[0])
    c_int, c_float, ptr = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    lib.cblas_sgemm.argtypes = [c_int] * 6 + [c_float, ptr, c_int, ptr, c_int, c_float, ptr, c_int]
    row_major, no_trans, trans = 101, 111, 112

    def linear(x: Array, w: Array, out: Array) -> None:
        m, k = x.shape
        n = w.shape[0]
        lib.cblas_sgemm(
            row_major, no_trans, trans, m, n, k, 1.0, x.ctypes.data, k, w.ctypes.data, k, 0.0,
            out.ctypes.data, n,
        )  # fmt: skip

    return linear


def _blis() -> Callable[[Array, Array, Array], None] | None:
    try:
        import blis.py as blis_py
    except ImportError:
        return None
    return lambda x, w, out: blis_py.gemm(x, w, trans2=True, out=out, beta=0.0)


def median_s(fn: Callable[[], object], runs: int = 15) -> float:
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    libs: dict[str, Callable[[Array, Array, Array], None]] = {
        "numpy": lambda x, w, out: np.matmul(x, w.T, out=out)
    }
    for name, make in (("mkl", _mkl), ("blis", _blis)):
        fn = make()
        if fn is None:
            print(f"{name}: not installed (pip install {name}); skipped")
        else:
            libs[name] = fn
    rng = np.random.default_rng(0)
    print(f"{'m, n, k':<22}" + "".join(f"{name:>12}" for name in libs) + "   (GFLOP/s)")
    for m, n, k in SHAPES:
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        want = x @ w.T
        cells = []
        for fn in libs.values():
            out = np.empty((m, n), np.float32)
            fn(x, w, out)
            np.testing.assert_allclose(out, want, rtol=1e-3, atol=1e-2)
            cells.append(
                2 * m * n * k / 1e9 / median_s(lambda fn=fn, x=x, w=w, out=out: fn(x, w, out))
            )
        print(f"{(m, n, k)!s:<22}" + "".join(f"{c:>12.0f}" for c in cells))


if __name__ == "__main__":
    main()
