"""Host-side preparation of GGML block-quantized weights for ``quantized_linear``.

Two formats, both with blocks of :data:`BLOCK_SIZE` (32) consecutive elements along the input
(last) axis and one scale per block:

``q8_0``
    ``qweight`` is int8 ``[..., in]``; ``w = scale * q`` with ``q`` in ``-127..127``.
``q4_0``
    ``qweight`` is uint8 ``[..., in/2]``, two 4-bit values per byte: within each block of 32,
    byte ``j`` (0..15) holds element ``j`` in its low nibble and element ``j + 16`` in its high
    nibble (GGML's layout); ``w = scale * (nibble - 8)``.

``scales`` is ``[..., in/32]``, float16 by default (GGML stores fp16 scales) or float32.
:func:`quantize` follows GGML's reference quantizers (``quantize_row_q8_0_ref``,
``quantize_row_q4_0_ref``) bit for bit, so weights prepared here load into llama.cpp-style
runtimes and back.

Example::

    from accelkit.quant import quantize

    qweight, scales = quantize(weight, "q4_0")          # weight: float array [out, in]
    f = backend.tensor_factory
    y = backend.kernel_ops.quantized_linear(x, f.from_host(qweight), f.from_host(scales),
                                            format="q4_0")
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError

__all__ = ["BLOCK_SIZE", "FORMATS", "QuantFormat", "dequantize", "quantize"]

Array = np.ndarray[Any, Any]
QuantFormat = Literal["q8_0", "q4_0"]

#: Elements per quantization block (along the input axis), for every format.
BLOCK_SIZE = 32
#: The supported formats.
FORMATS: tuple[QuantFormat, ...] = ("q8_0", "q4_0")

_SCALE_DTYPES = (np.dtype(np.float16), np.dtype(np.float32))


def check_format(fmt: object) -> QuantFormat:
    """``fmt`` must name a supported format."""
    if fmt == "q8_0":
        return "q8_0"
    if fmt == "q4_0":
        return "q4_0"
    raise InvalidArgumentError(f"quantization format must be one of {FORMATS}; got {fmt!r}")


def quantize(
    weight: Any, format: QuantFormat = "q8_0", *, scale_dtype: Any = np.float16
) -> tuple[Array, Array]:
    """Quantize a float array ``[..., in]`` (``in`` a multiple of 32) -> ``(qweight, scales)``.

    ``q8_0``: per block ``d = max|x| / 127`` and ``q = round(x / d)`` (half away from zero).
    ``q4_0``: per block ``d = m / -8`` where ``m`` is the element of largest magnitude (sign
    kept) and ``q = min(15, floor(x / d + 8.5))``. Work is in float32 as in GGML; an all-zero
    block gets scale 0. The error per element is at most ``|d| / 2`` for q8_0 and ``|d|`` for
    q4_0, plus the rounding of ``d`` to ``scale_dtype``.
    """
    fmt = check_format(format)
    sdt = np.dtype(scale_dtype)
    if sdt not in _SCALE_DTYPES:
        raise InvalidArgumentError(f"quantize: scale_dtype must be float16 or float32; got {sdt}")
    w = np.asarray(weight)
    if w.dtype.kind != "f" and w.dtype != DType.BF16.to_numpy():  # ml_dtypes' kind is "V"
        raise InvalidArgumentError(f"quantize: weight must be a float array; got {w.dtype}")
    n_in = w.shape[-1] if w.ndim else 0
    if w.ndim < 1 or n_in % BLOCK_SIZE or n_in == 0:
        raise InvalidArgumentError(
            f"quantize: the last axis must be a positive multiple of {BLOCK_SIZE}; got shape"
            f" {w.shape}"
        )
    blocks = w.astype(np.float32).reshape(*w.shape[:-1], n_in // BLOCK_SIZE, BLOCK_SIZE)
    d: Array  # the per-block scale, float32
    with np.errstate(divide="ignore", invalid="ignore"):
        if fmt == "q8_0":
            d = np.max(np.abs(blocks), axis=-1) / np.float32(127)
            inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
            v = (blocks * inv[..., None]).astype(np.float64)  # the product in f32, as GGML
            q8 = np.sign(v) * np.floor(np.abs(v) + 0.5)  # C's roundf: half away from zero
            qweight = q8.astype(np.int8).reshape(w.shape)
        else:
            at = np.argmax(np.abs(blocks), axis=-1)[..., None]
            d = np.take_along_axis(blocks, at, axis=-1)[..., 0] / np.float32(-8)
            inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
            shifted = blocks * inv[..., None] + np.float32(8.5)  # >= 0.5: truncation is floor
            q4 = np.minimum(15, np.trunc(shifted)).astype(np.uint8)
            packed = q4[..., :16] | (q4[..., 16:] << 4)
            qweight = packed.reshape(*w.shape[:-1], n_in // 2)
    return qweight, d.astype(sdt)


def dequantize(
    qweight: Any, scales: Any, format: QuantFormat = "q8_0", *, dtype: Any = np.float32
) -> Array:
    """Expand ``(qweight, scales)`` back to a float array ``[..., in]`` of ``dtype``.

    The scale is converted to ``dtype`` first, then multiplied by the integer value: the same
    arithmetic as the ``quantized_linear`` kernels, so their results can be reproduced here.
    """
    fmt = check_format(format)
    q, s = np.asarray(qweight), np.asarray(scales)
    want = np.dtype(np.int8) if fmt == "q8_0" else np.dtype(np.uint8)
    if q.dtype != want:
        raise InvalidArgumentError(f"dequantize: {fmt} qweight must be {want}; got {q.dtype}")
    if s.dtype not in _SCALE_DTYPES:
        raise InvalidArgumentError(f"dequantize: scales must be float16 or float32; got {s.dtype}")
    n_in = (q.shape[-1] if fmt == "q8_0" else 2 * q.shape[-1]) if q.ndim else 0
    nb = n_in // BLOCK_SIZE
    if q.ndim < 1 or n_in % BLOCK_SIZE or s.shape != (*q.shape[:-1], nb):
        raise InvalidArgumentError(
            f"dequantize: {fmt} qweight {q.shape} holds {n_in} inputs per row, which needs"
            f" scales of shape {(*q.shape[:-1], nb)} (one per block of {BLOCK_SIZE}); got"
            f" scales {s.shape}"
        )
    ct = np.dtype(dtype)
    if fmt == "q8_0":
        values = q.reshape(*q.shape[:-1], nb, BLOCK_SIZE).astype(ct)
    else:
        packed = q.reshape(*q.shape[:-1], nb, BLOCK_SIZE // 2)
        nibbles = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)
        values = nibbles.astype(ct) - ct.type(8)
    out: Array = values * s.astype(ct)[..., None]
    return out.reshape(*q.shape[:-1], n_in)
