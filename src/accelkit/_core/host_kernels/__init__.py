"""NumPy bodies of the kernels, on host arrays: pure NumPy, no backend's and no JIT's.

:mod:`.elementwise` (elementwise ops, reductions, shape ops), :mod:`.nn` (matrix products and
neural-network ops), :mod:`.fused` (the fused KernelOps that TensorOps has no kernel for) and
:mod:`.image` (the fused image filters). ``accelkit.sdk.host`` re-exports them for backends whose
storage the host can read; the CPU backend runs them too.

A few bodies have a hot inner step that a faster host kernel may take over (the unary
activations, the softmax of attention's scores, the norms): they take a :class:`HostAccelerator`
as the keyword argument ``accel``, asked first for that step, and run NumPy's code where it
declines. The default, :data:`NUMPY_ONLY`, declines everything. The caller chooses: the CPU
backend passes the CPU JIT (``accelkit._core.host_jit.JIT``); nothing here imports it.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

__all__ = ["NUMPY_ONLY", "HostAccelerator", "NumPyOnly"]

Array = np.ndarray[Any, Any]


class HostAccelerator(Protocol):
    """Faster host kernels for the hot steps of some NumPy bodies. Each method computes its
    step into ``out`` and returns True, or returns False, having written nothing, where it has no
    kernel for the call (a dtype, a layout, a kernel not ready yet): the body then runs NumPy's
    code. A result must agree with NumPy's to within float32 rounding, with NaN and infinities
    where NumPy has them."""

    def unary(self, op: str, x: Array, out: Array) -> bool:
        """``out = op(x)`` (``op`` a unary op name: exp, sigmoid, silu, gelu_tanh, ...)."""
        ...

    def softmax_rows(
        self, s: Array, out: Array, *, empty_nan: bool, period: int = 0, base: int = 0
    ) -> bool:
        """Softmax over the last axis of ``s`` into ``out`` (which may be ``s``). A row that
        sees no key is NaN with ``empty_nan``, else zeros. With ``period`` > 0, flattened row
        ``i`` sees the keys up to ``i % period + base`` (a causal mask)."""
        ...

    def attention(
        self,
        q: Array,
        k: Array,
        v: Array,
        mask: Array | None,
        out: Array,
        scale: float,
        causal: bool,
    ) -> bool:
        """Grouped-KV attention: q [B, H, Sq, D], k [B, Hk, Sk, D], v [B, Hk, Sk, Dv], out
        [B, H, Sq, Dv] (the TensorKernels ``attention`` kernel's semantics)."""
        ...

    def layer_norm(
        self, x: Array, w: Array | None, b: Array | None, eps: float, out: Array
    ) -> bool:
        """Layer norm over the last axis, with an optional per-column weight and bias."""
        ...

    def rms_norm(self, x: Array, w: Array | None, eps: float, out: Array) -> bool:
        """RMS norm over the last axis, with an optional per-column weight."""
        ...


class NumPyOnly:
    """The :class:`HostAccelerator` that declines every call: NumPy's code runs."""

    def unary(self, op: str, x: Array, out: Array) -> bool:
        return False

    def softmax_rows(
        self, s: Array, out: Array, *, empty_nan: bool, period: int = 0, base: int = 0
    ) -> bool:
        return False

    def attention(
        self,
        q: Array,
        k: Array,
        v: Array,
        mask: Array | None,
        out: Array,
        scale: float,
        causal: bool,
    ) -> bool:
        return False

    def layer_norm(
        self, x: Array, w: Array | None, b: Array | None, eps: float, out: Array
    ) -> bool:
        return False

    def rms_norm(self, x: Array, w: Array | None, eps: float, out: Array) -> bool:
        return False


#: The default accelerator of the bodies: none (NumPy's code runs).
NUMPY_ONLY: HostAccelerator = NumPyOnly()
