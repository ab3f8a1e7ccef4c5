"""The conformance suite's GEMM check (accelkit.testing.checks.assert_gemm_close): its bound
comes from the arithmetic, so it accepts every correctly rounded float32 GEMM, whatever the
order of the sums, and refuses a result with one product left out."""

from __future__ import annotations

import numpy as np
import pytest

from accelkit.testing.checks import assert_gemm_close, gemm_error_bound


def _sum_in_order(a: np.ndarray, b: np.ndarray, order: np.ndarray) -> np.ndarray:
    """a @ b summed in float32, one product at a time, in the given order of k."""
    out = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in order:
        out += np.outer(a[:, k], b[k, :]).astype(np.float32)
    return out


def test_float32_gemms_summed_in_any_order_are_within_the_bound() -> None:
    rng = np.random.default_rng(0)
    # large magnitudes with cancellation: where an absolute tolerance breaks first
    a = (rng.standard_normal((24, 512)) * 300).astype(np.float32)
    b = (rng.standard_normal((512, 16)) * 300).astype(np.float32)
    for order in (np.arange(512), np.arange(512)[::-1], rng.permutation(512)):
        assert_gemm_close(_sum_in_order(a, b, order), a, b)
    assert_gemm_close(a @ b, a, b)  # NumPy's BLAS, blocked and vectorized
    c = (rng.standard_normal((16,)) * 1e4).astype(np.float32)
    assert_gemm_close(np.float32(0.5) * (a @ b) + np.float32(2.0) * c, a, b, alpha=0.5, add=2 * c)


def test_a_result_missing_one_product_is_refused() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((32, 256)).astype(np.float32)
    b = rng.standard_normal((256, 8)).astype(np.float32)
    good = a @ b
    bad = good.copy()
    bad[5, 3] -= a[5, 100] * b[100, 3]  # a k-step skipped for one element
    with pytest.raises(AssertionError, match=r"1 of 256 elements .* worst at \(5, 3\)"):
        assert_gemm_close(bad, a, b)


def test_the_bound_is_gamma_k_times_the_absolute_product() -> None:
    a = np.ones((2, 1000), np.float32)
    b = np.ones((1000, 3), np.float32)
    u = 2.0**-24
    k = 1000 + 2
    want = k * u / (1 - k * u) * 1000
    np.testing.assert_allclose(gemm_error_bound(a, b), np.full((2, 3), want), rtol=1e-12)
    assert gemm_error_bound(a, b, dtype=np.float64).max() < 1e-9
