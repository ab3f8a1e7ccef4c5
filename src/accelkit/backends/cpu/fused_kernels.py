"""The CPU backend's KernelOps: every sub-interface, each hook submitting a NumPy body, with the
CPU JIT as its accelerator where it takes one.

Bodies that TensorOps already has on this backend (rms_norm, layer_norm, attention, linear,
gelu) are shared with it; the rest live in :mod:`accelkit._core.host_kernels.fused`. Costs passed
to ``_launch`` are rough element-operation counts: they only decide whether the work runs inline
or on the stream's worker thread.
"""

from __future__ import annotations

from accelkit._core.host_jit import JIT
from accelkit._core.host_kernels import elementwise as ew
from accelkit._core.host_kernels import fused, nn
from accelkit.backends.cpu.submit import CPUComponent, arr
from accelkit.quant import QuantFormat
from accelkit.sdk import FusedKernels, GeluApproximation, SamplingParams
from accelkit.tensor import Tensor

__all__ = [
    "CPUActivationKernels",
    "CPUAttentionKernels",
    "CPUFusedKernels",
    "CPULinearKernels",
    "CPUNormKernels",
    "CPUPositionKernels",
    "CPUSamplingKernels",
]


class CPUNormKernels(CPUComponent):
    def rms_norm(self, x: Tensor, weight: Tensor | None, eps: float, out: Tensor) -> None:
        self._launch(
            lambda: nn.rms_norm(x._data, arr(weight), eps, out._data, accel=JIT),
            3 * x._size, (x, weight), (out,),
        )  # fmt: skip

    def rms_norm_residual(
        self, x: Tensor, residual: Tensor, weight: Tensor | None, eps: float, normed: Tensor,
        summed: Tensor,
    ) -> None:  # fmt: skip
        self._launch(
            lambda: fused.rms_norm_residual(
                x._data, residual._data, arr(weight), eps, normed._data, summed._data,
                accel=JIT,
            ),
            4 * x._size, (x, residual, weight), (normed, summed),
        )  # fmt: skip

    def layer_norm(
        self, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, out: Tensor
    ) -> None:
        self._launch(
            lambda: nn.layer_norm(x._data, arr(weight), arr(bias), eps, out._data, accel=JIT),
            4 * x._size, (x, weight, bias), (out,),
        )  # fmt: skip


class CPUPositionKernels(CPUComponent):
    def rotary_embedding(
        self, x: Tensor, positions: Tensor | None, base: float, offset: int, out: Tensor
    ) -> None:
        self._launch(
            lambda: fused.rotary_embedding(x._data, arr(positions), base, offset, out._data),
            4 * x._size, (x, positions), (out,),
        )  # fmt: skip


class CPUAttentionKernels(CPUComponent):
    def attention(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, out: Tensor, scale: float,
        causal: bool,
    ) -> None:  # fmt: skip
        self._launch(
            lambda: nn.attention(
                q._data, k._data, v._data, arr(mask), out._data, scale, causal, accel=JIT
            ),
            2 * q._size * k._shape[2], (q, k, v, mask), (out,),
        )  # fmt: skip

    def paged_attention(
        self, q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor,
        context_lens: Tensor, scale: float, out: Tensor,
    ) -> None:  # fmt: skip
        max_len = block_table._shape[1] * k_cache._shape[1]
        self._launch(
            lambda: fused.paged_attention(
                q._data, k_cache._data, v_cache._data, block_table._data, context_lens._data,
                scale, out._data, accel=JIT,
            ),
            2 * q._size * max_len, (q, k_cache, v_cache, block_table, context_lens), (out,),
        )  # fmt: skip


class CPUActivationKernels(CPUComponent):
    def silu_mul(self, gate: Tensor, up: Tensor, out: Tensor) -> None:
        self._launch(
            lambda: fused.silu_mul(gate._data, up._data, out._data), 4 * gate._size, (gate, up),
            (out,),
        )  # fmt: skip

    def gelu(self, x: Tensor, approximate: GeluApproximation, out: Tensor) -> None:
        op = "gelu" if approximate == "none" else "gelu_tanh"
        self._launch(lambda: ew.unary(op, x._data, out._data, accel=JIT), 8 * x._size, (x,), (out,))


class CPULinearKernels(CPUComponent):
    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> None:
        self._launch(
            lambda: nn.linear(x._data, weight._data, arr(bias), out._data),
            out._size * weight._shape[1], (x, weight, bias), (out,),
        )  # fmt: skip

    def quantized_linear(
        self, x: Tensor, qweight: Tensor, scales: Tensor, bias: Tensor | None,
        format: QuantFormat, out: Tensor,
    ) -> None:  # fmt: skip
        self._launch(
            lambda: fused.quantized_linear(
                x._data, qweight._data, scales._data, arr(bias), format, out._data
            ),
            out._size * x._shape[-1] + 2 * qweight._size, (x, qweight, scales, bias), (out,),
        )  # fmt: skip


class CPUSamplingKernels(CPUComponent):
    def argmax(self, logits: Tensor, out: Tensor) -> None:
        self._launch(lambda: fused.argmax(logits._data, out._data), logits._size, (logits,), (out,))

    def sample_token(
        self, logits: Tensor, previous_tokens: Tensor | None, params: SamplingParams, out: Tensor
    ) -> None:
        # Sorting for top-p makes the cost n log n; noise generation alone is ~10 ops/element.
        self._launch(
            lambda: fused.sample_token(logits._data, arr(previous_tokens), params, out._data),
            16 * logits._size, (logits, previous_tokens), (out,),
        )  # fmt: skip


class CPUFusedKernels(
    CPUNormKernels,
    CPUPositionKernels,
    CPUAttentionKernels,
    CPUActivationKernels,
    CPULinearKernels,
    CPUSamplingKernels,
    FusedKernels,
):
    """Every fused op, from the group mixins above."""
