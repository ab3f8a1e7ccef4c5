"""``KernelDispatcher``: every KernelOps op on any backend, fused where possible, and saying which.

For each call the dispatcher takes the backend's fused kernel when ``backend.kernel_ops`` has the
op's sub-interface (and ``prefer`` is "fused"), and the TensorOps composition from
:mod:`accelkit._core.composite` otherwise. A fused kernel that refuses the call with
:class:`~accelkit.errors.UnsupportedOperationError` (a dtype it lacks, say) is retried as the
composition: a call that raises has changed nothing, so the retry is safe. Bad arguments raise
the same InvalidArgumentError on both routes and are not retried.

Every call records its route in ``last_route`` and ``routes`` and logs it at debug level on the
``accelkit._core.dispatch`` logger. Both routes are submissions that return at once; the work of
either runs in stream order on the current stream.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar

from accelkit._core import composite
from accelkit.abc.kernel_ops import GeluApproximation, KernelOps
from accelkit.errors import InvalidArgumentError, UnsupportedOperationError
from accelkit.quant import QuantFormat
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit.abc.backend import ComputeBackend

__all__ = ["KernelDispatcher", "Route"]

logger = logging.getLogger(__name__)

RouteName = Literal["fused", "composed"]
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Route:
    """Which implementation ran one call, and why."""

    op: str
    route: RouteName
    backend: str
    reason: str


class KernelDispatcher:
    """The KernelOps methods (same signatures) routed to fused kernels or compositions.

    ``prefer="composed"`` always runs the composition, e.g. to check a fused kernel against it.
    """

    def __init__(self, backend: ComputeBackend, prefer: RouteName = "fused") -> None:
        if prefer not in ("fused", "composed"):
            raise InvalidArgumentError(
                f"KernelDispatcher: prefer must be 'fused' or 'composed'; got {prefer!r}"
            )
        self.backend = backend
        self.prefer: RouteName = prefer
        #: The route of the most recent successful call (None before the first).
        self.last_route: Route | None = None
        #: Calls per op and route: ``{"rms_norm": {"fused": 3, "composed": 0}}``.
        self.routes: dict[str, dict[RouteName, int]] = {}
        self._no_kernels = KernelOps(backend)

    @property
    def _kernels(self) -> KernelOps:
        # Read on every call: kernel_ops exists only while the backend is initialized (and
        # reading it raises NotInitializedError otherwise, which is the right error here).
        return self.backend.kernel_ops or self._no_kernels

    def _run(
        self, op: str, group: str, fused: Callable[[], _T] | None, composed: Callable[[], _T]
    ) -> _T:
        if fused is None:
            reason = f"{self.backend.name} has no fused {group}"
        elif self.prefer == "composed":
            reason = "prefer='composed'"
        else:
            try:
                result = fused()
            except UnsupportedOperationError as exc:
                reason = f"the fused kernel refused: {exc}"
            else:
                self._record(op, "fused", f"{self.backend.name} {group}")
                return result
        result = composed()
        self._record(op, "composed", reason)
        return result

    def _record(self, op: str, route: RouteName, reason: str) -> None:
        self.last_route = Route(op, route, self.backend.name, reason)
        counts = self.routes.setdefault(op, {"fused": 0, "composed": 0})
        counts[route] += 1
        logger.debug("%s on %s: %s (%s)", op, self.backend.name, route, reason)

    # -- norms ------------------------------------------------------------------------------------
    def rms_norm(self, x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
        k = self._kernels.norm_ops
        return self._run(
            "rms_norm", "norm_ops",
            None if k is None else lambda: k.rms_norm(x, weight, eps),
            lambda: composite.rms_norm(self.backend, x, weight, eps),
        )  # fmt: skip

    def rms_norm_residual(
        self, x: Tensor, residual: Tensor, weight: Tensor | None = None, eps: float = 1e-6
    ) -> tuple[Tensor, Tensor]:
        k = self._kernels.norm_ops
        return self._run(
            "rms_norm_residual", "norm_ops",
            None if k is None else lambda: k.rms_norm_residual(x, residual, weight, eps),
            lambda: composite.rms_norm_residual(self.backend, x, residual, weight, eps),
        )  # fmt: skip

    def layer_norm(
        self,
        x: Tensor,
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        eps: float = 1e-5,
    ) -> Tensor:
        k = self._kernels.norm_ops
        return self._run(
            "layer_norm", "norm_ops",
            None if k is None else lambda: k.layer_norm(x, weight, bias, eps),
            lambda: composite.layer_norm(self.backend, x, weight, bias, eps),
        )  # fmt: skip

    # -- positions --------------------------------------------------------------------------------
    def rotary_embedding(
        self,
        x: Tensor,
        positions: Tensor | None = None,
        base: float = 10000.0,
        offset: int = 0,
    ) -> Tensor:
        k = self._kernels.position_ops
        return self._run(
            "rotary_embedding", "position_ops",
            None if k is None else lambda: k.rotary_embedding(x, positions, base, offset),
            lambda: composite.rotary_embedding(self.backend, x, positions, base, offset),
        )  # fmt: skip

    # -- attention --------------------------------------------------------------------------------
    def attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float | None = None,
        causal: bool = False,
        mask: Tensor | None = None,
    ) -> Tensor:
        a = self._kernels.attention_ops
        return self._run(
            "attention", "attention_ops",
            None if a is None
            else lambda: a.attention(q, k, v, scale=scale, causal=causal, mask=mask),
            lambda: composite.attention(
                self.backend, q, k, v, scale=scale, causal=causal, mask=mask
            ),
        )  # fmt: skip

    def paged_attention(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        block_table: Tensor,
        context_lens: Tensor,
        scale: float | None = None,
    ) -> Tensor:
        a = self._kernels.attention_ops
        args = (q, k_cache, v_cache, block_table, context_lens, scale)
        return self._run(
            "paged_attention", "attention_ops",
            None if a is None else lambda: a.paged_attention(*args),
            lambda: composite.paged_attention(self.backend, *args),
        )  # fmt: skip

    # -- activations ------------------------------------------------------------------------------
    def silu_mul(self, gate: Tensor, up: Tensor) -> Tensor:
        k = self._kernels.activation_ops
        return self._run(
            "silu_mul", "activation_ops",
            None if k is None else lambda: k.silu_mul(gate, up),
            lambda: composite.silu_mul(self.backend, gate, up),
        )  # fmt: skip

    def gelu(self, x: Tensor, approximate: GeluApproximation = "none") -> Tensor:
        k = self._kernels.activation_ops
        return self._run(
            "gelu", "activation_ops",
            None if k is None else lambda: k.gelu(x, approximate),
            lambda: composite.gelu(self.backend, x, approximate),
        )  # fmt: skip

    # -- linear -----------------------------------------------------------------------------------
    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        k = self._kernels.linear_ops
        return self._run(
            "linear", "linear_ops",
            None if k is None else lambda: k.linear(x, weight, bias),
            lambda: composite.linear(self.backend, x, weight, bias),
        )  # fmt: skip

    def quantized_linear(
        self,
        x: Tensor,
        qweight: Tensor,
        scales: Tensor,
        bias: Tensor | None = None,
        format: QuantFormat = "q8_0",
    ) -> Tensor:
        k = self._kernels.linear_ops
        return self._run(
            "quantized_linear", "linear_ops",
            None if k is None else lambda: k.quantized_linear(x, qweight, scales, bias, format),
            lambda: composite.quantized_linear(self.backend, x, qweight, scales, bias, format),
        )  # fmt: skip

    # -- sampling ---------------------------------------------------------------------------------
    def argmax(self, logits: Tensor) -> Tensor:
        k = self._kernels.sampling_ops
        return self._run(
            "argmax", "sampling_ops",
            None if k is None else lambda: k.argmax(logits),
            lambda: composite.argmax(self.backend, logits),
        )  # fmt: skip

    def sample_token(
        self,
        logits: Tensor,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        repetition_penalty: float = 1.0,
        previous_tokens: Tensor | None = None,
        seed: int | None = None,
    ) -> Tensor:
        k = self._kernels.sampling_ops
        args = (logits, temperature, top_k, top_p, repetition_penalty, previous_tokens, seed)
        return self._run(
            "sample_token", "sampling_ops",
            None if k is None else lambda: k.sample_token(*args),
            lambda: composite.sample_token(self.backend, *args),
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"<KernelDispatcher {self.backend.name} prefer={self.prefer}>"
