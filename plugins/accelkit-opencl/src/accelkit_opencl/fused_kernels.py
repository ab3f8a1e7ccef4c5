"""The OpenCL backend's KernelOps: every sub-interface, each hook enqueueing OpenCL kernels.

Ops that TensorOps already runs on this device (rms_norm, layer_norm, attention, linear, gelu,
argmax) enqueue the same kernels through :class:`~accelkit_opencl.tensor_kernels.OpenCLTensorKernels`'s hooks;
silu_mul is one generated elementwise kernel; the rest are the kernels of
:mod:`accelkit_opencl.opencl_fused`. Nothing is computed on the host: the only host data sent
are constants a kernel reads (rotary frequencies, sample_token's seeded noise, which is the
backend's own ``uniform`` so both routes draw the same tokens). A dtype with no OpenCL C type
(BF16) raises UnsupportedOperationError, which the dispatcher answers with the composition.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyopencl as cl

from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError, UnsupportedOperationError
from accelkit.quant import QuantFormat
from accelkit.sdk import (
    FusedKernels,
    GeluApproximation,
    SamplingParams,
    rotary_inv_freq,
    storage,
)
from accelkit.tensor import Tensor
from accelkit_opencl.opencl_elementwise import Operand, elementwise_source
from accelkit_opencl.opencl_fused import (
    BAD_BLOCK,
    BAD_LENGTH,
    paged_attention_source,
    quantized_linear_source,
    rms_norm_residual_source,
    rotary_source,
    sample_token_source,
    silu_mul_expr,
)
from accelkit_opencl.opencl_types import STORE_TYPES, load_type, numpy_scalar
from accelkit_opencl.programs import enqueue_kernel
from accelkit_opencl.stream import cl_errors
from accelkit_opencl.submit import CLComponent, launch

if TYPE_CHECKING:
    from accelkit_opencl.backend import OpenCLBackend
    from accelkit_opencl.tensor_kernels import OpenCLTensorKernels

__all__ = [
    "OpenCLActivationKernels",
    "OpenCLAttentionKernels",
    "OpenCLFusedKernels",
    "OpenCLLinearKernels",
    "OpenCLNormKernels",
    "OpenCLPositionKernels",
    "OpenCLSamplingKernels",
]

_i64 = np.int64


def _compute(dtype: DType) -> DType:
    return DType.F64 if dtype is DType.F64 else DType.F32


class _FusedComponent(CLComponent):
    """What every sub-interface shares: the dtype guard, TensorOps' hooks, checked launches."""

    def _supported(self, op: str, *tensors: Tensor | None) -> None:
        for t in tensors:
            if t is not None and t.dtype not in STORE_TYPES:
                raise UnsupportedOperationError(
                    f"opencl: no fused {op} for {t.dtype.value} (OpenCL C has no such type)"
                )

    def __init__(self, backend: OpenCLBackend, tensor: OpenCLTensorKernels) -> None:
        super().__init__(backend)
        #: The backend's TensorKernels, whose kernels the ops TensorOps also has enqueue.
        self._ops = tensor

    def _enqueue_reporting(
        self,
        fn: Callable[[Any, list[Any] | None, Any], Any],
        inputs: Iterable[Any],
        outputs: list[Tensor],
        error: Callable[[int, int], BaseException],
        keepalive: Iterable[Any] = (),
    ) -> None:
        """``_enqueue_checked`` with an error kind: ``fn(queue, wait_for, err)`` gets a zeroed
        buffer of three longs (flag, kind, value; see :mod:`accelkit_opencl.opencl_fused`),
        copied back by the same command; ``error(kind, value)`` is raised when the outputs are
        awaited if the flag was set."""
        host = np.zeros(3, np.int64)
        with cl_errors(str(self.backend._device_obj)):
            flag = cl.Buffer(
                self.backend._context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                hostbuf=host,
            )  # fmt: skip

        def run(queue: Any, wait_for: list[Any] | None) -> Any:
            fn(queue, wait_for, flag)
            return cl.enqueue_copy(queue, host, flag, is_blocking=False)

        seq = self.launch(run, inputs, outputs, keepalive=(flag, host, *keepalive))

        def check() -> BaseException | None:
            return error(int(host[1]), int(host[2])) if host[0] else None

        self.current_stream.add_check(seq, check)


def _with_err(
    kernel: Any, args: list[Any], index: int, global_size: tuple[int, ...], local: Any
) -> Callable[[Any, list[Any] | None, Any], Any]:
    """A launch that puts the error buffer at ``args[index]``."""

    def run(queue: Any, wait_for: list[Any] | None, err: Any) -> Any:
        args[index] = err
        return enqueue_kernel(queue, kernel, args, global_size, local, wait_for)

    return run


class OpenCLNormKernels(_FusedComponent):
    def rms_norm(self, x: Tensor, weight: Tensor | None, eps: float, out: Tensor) -> None:
        self._supported("rms_norm", x)
        self._ops.rms_norm(x, weight, eps, out)

    def rms_norm_residual(
        self, x: Tensor, residual: Tensor, weight: Tensor | None, eps: float, normed: Tensor,
        summed: Tensor,
    ) -> None:  # fmt: skip
        self._supported("rms_norm_residual", x)
        if x.size == 0:
            self.skip([normed, summed])
            return
        d = x.shape[-1]
        wg = self.backend._reduce_wg
        source = rms_norm_residual_source(x.dtype, weight is not None, wg)
        kernel = self.backend._kernel(source, "rms_residual")
        args: list[Any] = [storage(normed), storage(summed), storage(x), storage(residual)]
        if weight is not None:
            args.append(storage(weight))
        args += [_i64(d), numpy_scalar(load_type(x.dtype), eps)]
        self.launch(
            launch(kernel, args, ((x.size // d) * wg,), (wg,)),
            [x, residual, weight], [normed, summed],
        )  # fmt: skip

    def layer_norm(
        self, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, out: Tensor
    ) -> None:
        self._supported("layer_norm", x)
        self._ops.layer_norm(x, weight, bias, eps, out)


class OpenCLPositionKernels(_FusedComponent):
    def rotary_embedding(
        self, x: Tensor, positions: Tensor | None, base: float, offset: int, out: Tensor
    ) -> None:
        self._supported("rotary_embedding", x)
        if x.size == 0:
            self.skip([out])
            return
        _, h, s, d = x.shape
        half = d // 2
        inv_freq = self.backend.tensor_factory.from_host(
            rotary_inv_freq(d, base), dtype=_compute(x.dtype)
        )
        per_batch = positions is not None and positions.ndim == 2
        pdt = positions.dtype if positions is not None else None
        kernel = self.backend._kernel(rotary_source(x.dtype, pdt, per_batch), "rotary")
        args: list[Any] = [storage(out), storage(x), storage(inv_freq)]
        if positions is not None:
            args.append(storage(positions))
        args += [_i64(h), _i64(s), _i64(half), _i64(offset)]
        self.launch(launch(kernel, args, (x.size // 2,), None), [x, inv_freq, positions], [out])


class OpenCLAttentionKernels(_FusedComponent):
    def attention(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, out: Tensor, scale: float,
        causal: bool,
    ) -> None:  # fmt: skip
        self._supported("attention", q, mask)
        self._ops.attention(q, k, v, mask, out, scale, causal)

    def paged_attention(
        self, q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor,
        context_lens: Tensor, scale: float, out: Tensor,
    ) -> None:  # fmt: skip
        self._supported("paged_attention", q)
        if out.size == 0:
            self.skip([out])
            return
        b, h, d = q.shape
        num_blocks, block_size, hk, _ = k_cache.shape
        max_blocks = block_table.shape[1]
        source = paged_attention_source(
            q.dtype, block_table.dtype, context_lens.dtype, d, block_size
        )
        kernel = self.backend._kernel(source, "paged_attention")
        args: list[Any] = [
            storage(out), storage(q), storage(k_cache), storage(v_cache), storage(block_table),
            storage(context_lens), None, _i64(h), _i64(h // hk), _i64(hk), _i64(num_blocks),
            _i64(max_blocks), numpy_scalar(load_type(q.dtype), scale),
        ]  # fmt: skip
        max_len = max_blocks * block_size

        def error(kind: int, value: int) -> BaseException:
            if kind == BAD_LENGTH:
                return InvalidArgumentError(
                    f"paged_attention: context_lens must lie in 0..{max_len} (max_blocks *"
                    f" block_size); got {value}"
                )
            assert kind == BAD_BLOCK
            return InvalidArgumentError(
                f"paged_attention: block_table refers to block {value}; the cache has blocks"
                f" 0..{num_blocks - 1}"
            )

        self._enqueue_reporting(
            _with_err(kernel, args, 6, (b * h,), None),
            [q, k_cache, v_cache, block_table, context_lens], [out], error,
        )  # fmt: skip


class OpenCLActivationKernels(_FusedComponent):
    def silu_mul(self, gate: Tensor, up: Tensor, out: Tensor) -> None:
        self._supported("silu_mul", gate)
        n = out.size
        if n == 0:
            self.skip([out])
            return
        dt = gate.dtype
        operands = (Operand("a", dt, True), Operand("b", dt, True))
        source = elementwise_source(dt, dt, operands, silu_mul_expr(dt), 1)
        kernel = self.backend._kernel(source, "ew")
        args = [
            storage(out),
            _i64(0),
            storage(gate),
            _i64(0),
            storage(up),
            _i64(0),
            _i64(n),
            _i64(n),
        ]
        args += [_i64(1)] * 3  # contiguous strides of out, a and b
        self.launch(launch(kernel, args, (n,), None), [gate, up], [out])

    def gelu(self, x: Tensor, approximate: GeluApproximation, out: Tensor) -> None:
        self._supported("gelu", x)
        self._ops.unary("gelu" if approximate == "none" else "gelu_tanh", x, out)


class OpenCLLinearKernels(_FusedComponent):
    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> None:
        self._supported("linear", x, weight, bias, out)
        self._ops.linear(x, weight, bias, out)

    def quantized_linear(
        self, x: Tensor, qweight: Tensor, scales: Tensor, bias: Tensor | None,
        format: QuantFormat, out: Tensor,
    ) -> None:  # fmt: skip
        self._supported("quantized_linear", x)
        if out.size == 0:
            self.skip([out])
            return
        n_out, n_in = qweight.shape[0], x.shape[-1]
        rows = x.size // n_in
        source = quantized_linear_source(x.dtype, format, scales.dtype, bias is not None)
        kernel = self.backend._kernel(source, "qlinear")
        args: list[Any] = [storage(out), storage(x), storage(qweight), storage(scales)]
        if bias is not None:
            args.append(storage(bias))
        args += [_i64(n_out), _i64(n_in)]
        self.launch(launch(kernel, args, (n_out, rows), None), [x, qweight, scales, bias], [out])


class OpenCLSamplingKernels(_FusedComponent):
    def argmax(self, logits: Tensor, out: Tensor) -> None:
        self._supported("argmax", logits)
        self._ops.reduce("argmax", logits, (logits.ndim - 1,), False, out)

    def sample_token(
        self, logits: Tensor, previous_tokens: Tensor | None, params: SamplingParams, out: Tensor
    ) -> None:
        self._supported("sample_token", logits)
        vocab = logits.shape[-1]
        rows = logits.size // vocab
        if rows == 0:
            self.skip([out])
            return
        ct = _compute(logits.dtype)
        greedy = params.temperature == 0.0
        top_k = 0 < params.top_k < vocab
        top_p = params.top_p < 1.0
        previous = previous_tokens if params.repetition_penalty != 1.0 else None
        wg = self.backend._reduce_wg
        source = sample_token_source(
            logits.dtype, previous.dtype if previous is not None else None, greedy,
            top_k and not greedy, top_p and not greedy, wg,
        )  # fmt: skip
        kernel = self.backend._kernel(source, "sample")
        z = self.empty((rows, vocab), ct)
        p = self.empty((rows, vocab) if top_p and not greedy else (1,), ct)
        t = load_type(ct)
        args: list[Any] = [storage(out), storage(logits), storage(z), storage(p)]
        inputs: list[Any] = [logits]
        if previous is not None:
            n_prev = previous.size // rows
            args += [storage(previous), _i64(n_prev), None]
            inputs.append(previous)
        if not greedy:
            # The composition's noise, made by this backend's factory for the same seed.
            noise = self.backend.tensor_factory.uniform((rows, vocab), seed=params.seed)
            args.append(storage(noise))
            inputs.append(noise)
        args += [
            _i64(vocab), numpy_scalar(t, params.repetition_penalty),
            numpy_scalar(t, params.temperature or 1.0), _i64(params.top_k),
            numpy_scalar(t, params.top_p),
        ]  # fmt: skip
        launch_size = ((rows * wg,), (wg,))
        if previous is None:
            self.launch(launch(kernel, args, *launch_size), inputs, [out, z, p])
            return

        def error(kind: int, value: int) -> BaseException:
            return InvalidArgumentError(
                f"sample_token: previous_tokens must lie in 0..{vocab - 1} (negative entries are"
                f" padding); got {value}"
            )

        self._enqueue_reporting(
            _with_err(kernel, args, 6, *launch_size), inputs, [out, z, p], error
        )


class OpenCLFusedKernels(
    OpenCLNormKernels,
    OpenCLPositionKernels,
    OpenCLAttentionKernels,
    OpenCLActivationKernels,
    OpenCLLinearKernels,
    OpenCLSamplingKernels,
    FusedKernels,
):
    """Every fused op, from the group mixins above."""
