"""accelkit.quant on the host: GGML q8_0/q4_0 quantization (no backend involved; the
quantized_linear kernels are checked on every backend by accelkit.testing.test_kernel_ops)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from accelkit import DType, InvalidArgumentError
from accelkit.quant import QuantFormat, dequantize, quantize
from accelkit.testing.test_kernel_ops import dequantize_ref


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("scale_dtype", [np.float16, np.float32])
def test_quantize_round_trip_error_is_bounded(fmt: QuantFormat, scale_dtype: Any) -> None:
    w = np.random.default_rng(5).standard_normal((16, 256)).astype(np.float32)
    w[3, :32] = 0.0  # an all-zero block: scale 0, exact
    qweight, scales = quantize(w, fmt, scale_dtype=scale_dtype)
    assert scales.dtype == scale_dtype
    assert scales.shape == (16, 8)
    assert qweight.shape == ((16, 256) if fmt == "q8_0" else (16, 128))
    back = dequantize(qweight, scales, fmt)
    np.testing.assert_array_equal(back, dequantize_ref(qweight, scales, fmt).astype(np.float32))
    err = np.abs(back - w).reshape(16, 8, 32).max(axis=-1)
    d = np.abs(scales.astype(np.float64))
    # q8_0: half a step; q4_0: a whole step at the far end of the range (15 steps from -8 go
    # only to +7); plus the scale's rounding to f16 (|q| <= 127 or 8 steps of 2^-11).
    bound = 0.5 * d + 127 * d * 2**-11 if fmt == "q8_0" else d + 8 * d * 2**-11
    assert np.all(err <= bound + 1e-7)
    assert np.all(back[3, :32] == 0)
    assert scales[3, 0] == 0
    assert np.mean(np.abs(back - w)) < (0.01 if fmt == "q8_0" else 0.2)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_quantize_takes_bf16_and_f16_weights_as_their_f32_values(fmt: QuantFormat) -> None:
    """BF16 (ml_dtypes, NumPy kind "V": it was refused as not a float array) and F16 weights
    quantize exactly as the same values in F32 do."""
    w = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    for dtype in (DType.BF16.to_numpy(), np.float16):
        low = w.astype(dtype)
        got, want = quantize(low, fmt), quantize(low.astype(np.float32), fmt)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_quantize_matches_the_ggml_layout() -> None:
    # q4_0 with scale 1: element 0 (-8) has the largest magnitude, so d = -8 / -8 = 1 and each
    # element's nibble is x + 8; byte j must hold element j low and element j + 16 high.
    nibbles = np.random.default_rng(2).integers(0, 16, size=32)
    nibbles[0] = 0
    qweight, scales = quantize((nibbles - 8).astype(np.float32)[None], "q4_0")
    assert scales.tolist() == [[1.0]]
    expected = [nibbles[j] | (nibbles[j + 16] << 4) for j in range(16)]
    assert qweight.tolist() == [expected]
    # q8_0 with max |x| = 127: d = 1 and q = x
    ints = np.random.default_rng(3).integers(-127, 128, size=32)
    ints[5] = -127
    qweight, scales = quantize(ints.astype(np.float32)[None], "q8_0")
    assert scales.tolist() == [[1.0]]
    assert qweight.dtype == np.int8
    assert qweight.tolist() == [ints.tolist()]


@pytest.mark.parametrize(
    "call",
    [
        lambda: quantize(np.zeros((4, 48), np.float32), "q8_0"),
        lambda: quantize(np.zeros((4, 64), np.float32), "q5_0"),  # type: ignore[arg-type]
        lambda: quantize(np.zeros((4, 64), np.int32), "q8_0"),
        lambda: dequantize(np.zeros((4, 64), np.uint8), np.zeros((4, 2), np.float16), "q8_0"),
        lambda: dequantize(np.zeros((4, 32), np.uint8), np.zeros((4, 3), np.float16), "q4_0"),
        lambda: dequantize(np.zeros((4, 64), np.int8), np.zeros((4, 2), np.int32), "q8_0"),
    ],
)
def test_quantize_rejects_bad_input(call: Callable[[], object]) -> None:
    with pytest.raises(InvalidArgumentError):
        call()
