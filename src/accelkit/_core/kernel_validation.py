"""Argument checks of the KernelOps, shared by the fused interfaces and the compositions.

:mod:`accelkit.ops.kernel_ops` runs them before allocating and launching a fused kernel, and
:mod:`accelkit.ops.composite` before composing TensorOps calls, so a bad call fails before
anything is queued, with the same message on either route. Each check returns the validated
scalar settings; messages name what was expected and what was given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from accelkit._core.validation import (
    FLOAT_DTYPES,
    check_float,
    check_float_param,
    check_index,
    check_int,
    check_same_dtype,
    check_tensor,
    is_live_tensor,
)
from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError
from accelkit.quant import BLOCK_SIZE, QuantFormat, check_format
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit.abc.backend import ComputeBackend

__all__ = [
    "GUMBEL_UNIFORM_MAX",
    "rotary_inv_freq",
    "GeluApproximation", "SamplingParams", "check_gelu", "check_logits", "check_norm",
    "check_paged_attention", "check_quantized_linear", "check_rms_norm_residual",
    "check_rotary", "check_sampling", "check_silu_mul",
]  # fmt: skip

GeluApproximation = Literal["none", "tanh"]


def check_norm(
    backend: ComputeBackend, op: str, x: Tensor, eps: object, **params: Tensor | None
) -> float:
    """``x`` floating with >= 1 dimension; each param ``[x.shape[-1]]`` of x's dtype -> eps."""
    if type(eps) is float and eps > 0.0 and is_live_tensor(backend, x):
        # The common case in one frame: live tensors of this backend, one float dtype, the
        # params of x's last axis, a positive float eps (the checks below agree).
        dt, shape = x._dtype, x._shape
        if dt in FLOAT_DTYPES and shape:
            last = (shape[-1],)
            if all(
                p is None or (is_live_tensor(backend, p) and p._dtype is dt and p._shape == last)
                for p in params.values()
            ):
                return eps
    check_tensor(backend, x)
    check_float(x, op)
    if x.ndim < 1:
        raise InvalidArgumentError(f"{op} needs at least 1 dimension; got a 0-d tensor")
    for name, p in params.items():
        if p is None:
            continue
        check_tensor(backend, p, name)
        if p._shape != (x._shape[-1],):
            raise InvalidArgumentError(
                f"{op}: {name} must be [{x._shape[-1]}] (x's last axis); got {p._shape}"
            )
    check_same_dtype(op, x=x, **params)
    return check_float_param(eps, "eps", positive=True)


def check_rms_norm_residual(
    backend: ComputeBackend, x: Tensor, residual: Tensor, weight: Tensor | None, eps: object
) -> float:
    eps_ = check_norm(backend, "rms_norm_residual", x, eps, weight=weight)
    check_tensor(backend, residual, "residual")
    if residual._shape != x._shape:
        raise InvalidArgumentError(
            f"rms_norm_residual: residual has shape {residual._shape}, x has {x._shape}"
        )
    check_same_dtype("rms_norm_residual", x=x, residual=residual)
    return eps_


def check_rotary(
    backend: ComputeBackend, x: Tensor, positions: Tensor | None, base: object, offset: object
) -> tuple[float, int]:
    """-> (base, offset) after checking x [B, H, S, D] (D even) and positions [S] or [B, S]."""
    check_tensor(backend, x)
    check_float(x, "rotary_embedding")
    if x.ndim != 4 or x._shape[3] % 2 or x._shape[3] == 0:
        raise InvalidArgumentError(
            "rotary_embedding: x must be [batch, heads, seq, head_dim] with an even, non-zero"
            f" head_dim; got {x._shape}"
        )
    base_ = check_float_param(base, "base", positive=True)
    offset_ = check_int(offset, "offset", minimum=0)
    if offset_ + x._shape[2] - 1 > (1 << 63) - 1:  # the positions are I64 on every route
        raise InvalidArgumentError(
            f"rotary_embedding: offset={offset_} puts positions beyond 2**63 - 1 (I64's range)"
        )
    if positions is not None:
        check_tensor(backend, positions, "positions")
        check_index(positions, "rotary_embedding", "positions")
        b, _, s, _ = x._shape
        if positions._shape not in ((s,), (b, s)):
            raise InvalidArgumentError(
                f"rotary_embedding: positions must be [{s}] or [{b}, {s}] for x {x._shape};"
                f" got {positions._shape}"
            )
        if offset_:
            raise InvalidArgumentError(
                "rotary_embedding: give positions or offset, not both (positions already say"
                f" where each token is); got offset={offset_}"
            )
    return base_, offset_


def check_paged_attention(
    backend: ComputeBackend,
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    context_lens: Tensor,
    scale: object,
) -> float:
    """-> the scale, after checking the shapes and dtypes of a decode step over a paged cache."""
    op = "paged_attention"
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(backend, t, name)
    check_float(q, op, "q")
    check_same_dtype(op, q=q, k_cache=k_cache, v_cache=v_cache)
    if q.ndim != 3:
        raise InvalidArgumentError(f"{op}: q must be [batch, heads, head_dim]; got {q._shape}")
    if k_cache.ndim != 4 or 0 in k_cache._shape[:2]:
        raise InvalidArgumentError(
            f"{op}: k_cache must be [num_blocks, block_size, kv_heads, head_dim] with at least"
            f" one block of at least one slot; got {k_cache._shape}"
        )
    if v_cache._shape != k_cache._shape:
        raise InvalidArgumentError(
            f"{op}: v_cache {v_cache._shape} must have k_cache's shape {k_cache._shape}"
        )
    b, h, d = q._shape
    hk, dk = k_cache._shape[2], k_cache._shape[3]
    if dk != d:
        raise InvalidArgumentError(f"{op}: q head_dim {d} != k_cache head_dim {dk}")
    if hk == 0 or h % hk:
        raise InvalidArgumentError(
            f"{op}: q has {h} heads, which is not a multiple of the cache's {hk} kv heads"
        )
    for name, t, want in (("block_table", block_table, 2), ("context_lens", context_lens, 1)):
        check_tensor(backend, t, name)
        if t._dtype not in (DType.I32, DType.I64):
            raise InvalidArgumentError(f"{op}: {name} must be i32 (or i64); got {t._dtype.value}")
        if t.ndim != want or t._shape[0] != b:
            raise InvalidArgumentError(
                f"{op}: {name} must be {'[batch, max_blocks]' if want == 2 else '[batch]'} with"
                f" batch {b} (q's); got {t._shape}"
            )
    if scale is None:
        return 1.0 / d**0.5 if d else 1.0
    return check_float_param(scale, "scale", finite=True)


def check_silu_mul(backend: ComputeBackend, gate: Tensor, up: Tensor) -> None:
    check_tensor(backend, gate, "gate")
    check_tensor(backend, up, "up")
    check_float(gate, "silu_mul", "gate")
    check_same_dtype("silu_mul", gate=gate, up=up)
    if gate._shape != up._shape:
        raise InvalidArgumentError(f"silu_mul: gate has shape {gate._shape}, up has {up._shape}")


def check_gelu(backend: ComputeBackend, x: Tensor, approximate: object) -> GeluApproximation:
    check_tensor(backend, x)
    check_float(x, "gelu")
    if approximate == "none":
        return "none"
    if approximate == "tanh":
        return "tanh"
    raise InvalidArgumentError(f"gelu: approximate must be 'none' or 'tanh'; got {approximate!r}")


def check_quantized_linear(
    backend: ComputeBackend,
    x: Tensor,
    qweight: Tensor,
    scales: Tensor,
    bias: Tensor | None,
    format: object,
) -> QuantFormat:
    """-> the format, after checking x [..., in], qweight, scales [out, in/32] and bias [out]."""
    op = "quantized_linear"
    fmt = check_format(format)
    check_tensor(backend, x)
    check_tensor(backend, qweight, "qweight")
    check_tensor(backend, scales, "scales")
    check_float(x, op)
    want, per_byte = (DType.I8, 1) if fmt == "q8_0" else (DType.U8, 2)
    if qweight._dtype is not want or qweight.ndim != 2:
        layout = "[out, in]" if fmt == "q8_0" else "[out, in/2] (two 4-bit values per byte)"
        raise InvalidArgumentError(
            f"{op}: {fmt} qweight must be {want.value} {layout}; got {qweight._dtype.value}"
            f" {qweight._shape}"
        )
    n_out, n_in = qweight._shape[0], qweight._shape[1] * per_byte
    if x.ndim < 1 or x._shape[-1] != n_in:
        raise InvalidArgumentError(
            f"{op}: x {x._shape} has {x._shape[-1] if x._shape else 0} input features but {fmt}"
            f" qweight {qweight._shape} holds {n_in}"
        )
    if n_in % BLOCK_SIZE or n_in == 0:
        raise InvalidArgumentError(
            f"{op}: the input features ({n_in}) must be a positive multiple of the block size"
            f" {BLOCK_SIZE}"
        )
    if scales._dtype not in (DType.F16, DType.F32) or scales._shape != (n_out, n_in // BLOCK_SIZE):
        raise InvalidArgumentError(
            f"{op}: scales must be f16 or f32 [{n_out}, {n_in // BLOCK_SIZE}] (one per block of"
            f" {BLOCK_SIZE} inputs); got {scales._dtype.value} {scales._shape}"
        )
    if bias is not None:
        check_tensor(backend, bias, "bias")
        if bias._shape != (n_out,):
            raise InvalidArgumentError(f"{op}: bias must be [{n_out}]; got {bias._shape}")
        check_same_dtype(op, x=x, bias=bias)
    return fmt


def check_logits(backend: ComputeBackend, op: str, logits: Tensor) -> None:
    check_tensor(backend, logits, "logits")
    check_float(logits, op, "logits")
    if logits.ndim not in (1, 2) or logits._shape[-1] == 0:
        raise InvalidArgumentError(
            f"{op}: logits must be [batch, vocab] or [vocab] with vocab >= 1; got {logits._shape}"
        )


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Validated ``sample_token`` settings (see ``SamplingOps.sample_token``)."""

    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    seed: int | None


def check_sampling(
    backend: ComputeBackend,
    logits: Tensor,
    previous_tokens: Tensor | None,
    temperature: object,
    top_k: object,
    top_p: object,
    repetition_penalty: object,
    seed: object,
) -> SamplingParams:
    op = "sample_token"
    check_logits(backend, op, logits)
    t = check_float_param(temperature, "temperature")
    if not 0.0 <= t < float("inf"):
        raise InvalidArgumentError(f"{op}: temperature must be finite and >= 0; got {t}")
    k = check_int(top_k, "top_k", minimum=0)
    p = check_float_param(top_p, "top_p")
    if not 0.0 < p <= 1.0:
        raise InvalidArgumentError(f"{op}: top_p must be in (0, 1]; got {p}")
    penalty = check_float_param(repetition_penalty, "repetition_penalty", positive=True)
    seed_ = None if seed is None else check_int(seed, "seed", minimum=0)
    if previous_tokens is not None:
        check_tensor(backend, previous_tokens, "previous_tokens")
        check_index(previous_tokens, op, "previous_tokens")
        lead = logits._shape[:-1]
        if previous_tokens.ndim != len(lead) + 1 or previous_tokens._shape[:-1] != lead:
            want = f"[{lead[0]}, n]" if lead else "[n]"
            raise InvalidArgumentError(
                f"{op}: previous_tokens must be {want} for logits {logits._shape}; got"
                f" {previous_tokens._shape}"
            )
    return SamplingParams(t, k, p, penalty, seed_)


#: sample_token clamps its uniform noise to the largest float32 below 1, so that the Gumbel
#: transform ``-log(-log(u))`` stays finite.
GUMBEL_UNIFORM_MAX = float(np.nextafter(np.float32(1), np.float32(0)))


def rotary_inv_freq(head_dim: int, base: float) -> np.ndarray[tuple[int], np.dtype[np.float64]]:
    """The rotary frequencies ``base ** (-2i / head_dim)`` for ``i < head_dim / 2`` (float64).

    Every implementation converts them to its compute dtype (F32, or F64 for F64 input) and
    takes angles as ``position * frequency`` in that dtype, as the Hugging Face Llama code does.
    """
    return 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
