"""What a backend implements: its kernel objects.

The user-facing components (:class:`~accelkit.ops.TensorOps`, :class:`~accelkit.ops.TensorFactory`,
:class:`~accelkit.ops.KernelOps`) validate every argument once for every backend, allocate the
outputs through the backend and call one of its kernel objects, which receives validated inputs
and allocated outputs and must *enqueue* work that writes the outputs in stream order (running
small work inline on an idle stream is allowed). A kernel method never validates user input and
never returns before its outputs are recorded as written (:func:`accelkit.sdk.mark_written`).

Four interfaces, each an abstract base (an empty subclass cannot be instantiated; a subclass
that forgets a method fails at instantiation, naming it):

- :class:`TensorKernels`: allocation (``empty``, ``view``) and every TensorOps kernel;
- :class:`FactoryKernels`: allocation and the factory's fills (``fill``, ``from_host``;
  ``generate`` has a default);
- :class:`FusedKernels`: optional fused transformer kernels. Every method has a default: the
  core's composition of TensorOps calls runs instead. A backend overrides the ops it fuses;
  :attr:`FusedKernels.fused_ops` lists them;
- :class:`MemoryKernels`: the raw side of the memory manager (the pool, a stream-ordered free,
  the copies, reading a tensor). ``backend.memory_manager`` (:class:`accelkit.ops.MemoryManager`)
  checks every argument once and then calls it, as TensorOps calls TensorKernels.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from accelkit._core.host_memory import copy_to_host
from accelkit._core.kernel_validation import GeluApproximation, SamplingParams
from accelkit._core.op_names import KERNEL_OPS_IN_ORDER
from accelkit.dtype import DType
from accelkit.errors import UnsupportedOperationError
from accelkit.quant import QuantFormat
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit._core.pool import CachingPool
    from accelkit._core.stream_backend import StreamBackend
    from accelkit.abc.backend import ComputeBackend
    from accelkit.abc.memory import DeviceBuffer

__all__ = [
    "ComposedOnly", "FactoryKernels", "FusedKernels", "MemoryKernels", "Operand", "RandomDraw",
    "TensorKernels",
]  # fmt: skip

Operand = Tensor | int | float | bool


class _Allocating(ABC):
    """What every kernel object has: its backend and output allocation."""

    def __init__(self, backend: ComputeBackend) -> None:
        self.backend = backend  # type: ignore[misc]  # a plain attribute: read on every launch

    if TYPE_CHECKING:
        # Read-only to the type checker, so that a backend's kernels may narrow it to their
        # own backend class (``backend: MyBackend``).
        @property
        def backend(self) -> ComputeBackend: ...

    @abstractmethod
    def empty(self, shape: tuple[int, ...], dtype: DType) -> Tensor:
        """A new tensor (validated shape and dtype) on the backend's device, on the current
        stream, not yet written (``stream, seq = current stream, 0``)."""

    @abstractmethod
    def view(self, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        """A tensor sharing ``x``'s buffer with another shape of the same size (and ``x``'s
        last writer)."""


class TensorKernels(_Allocating):
    """Every kernel TensorOps calls. Inputs are validated tensors of this backend (or Python
    scalars where the signature says ``Operand``); outputs are allocated with the result's
    shape and dtype. Dtype rules are the caller's: a kernel casts its inputs to ``out``'s dtype
    where they differ."""

    # -- elementwise ------------------------------------------------------------------------------
    @abstractmethod
    def unary(self, op: str, x: Tensor, out: Tensor) -> None:
        """``out = op(x)`` for ``op`` in :data:`accelkit.sdk.UNARY_OPS`."""

    @abstractmethod
    def binary(self, op: str, a: Operand, b: Operand, out: Tensor) -> None:
        """``out = a op b`` with broadcasting, ``op`` in :data:`accelkit.sdk.BINARY_OPS`."""

    @abstractmethod
    def where(self, cond: Tensor, a: Operand, b: Operand, out: Tensor) -> None:
        """``out = a if cond else b`` with broadcasting."""

    @abstractmethod
    def cast(self, x: Tensor, out: Tensor) -> None:
        """``out = x`` converted to out's dtype (NumPy's unsafe casting)."""

    # -- linear algebra ---------------------------------------------------------------------------
    @abstractmethod
    def gemm(
        self,
        a: Tensor,
        b: Tensor,
        c: Tensor | None,
        out: Tensor,
        trans_a: bool,
        trans_b: bool,
        alpha: float,
        beta: float,
    ) -> None:
        """``out = alpha * op(a) @ op(b) + beta * c`` (2-d; ``c`` broadcasts to out)."""

    @abstractmethod
    def matmul(self, a: Tensor, b: Tensor, out: Tensor) -> None:
        """``out = a @ b`` with NumPy's batching rules (inputs already of out's dtype or cast)."""

    @abstractmethod
    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> None:
        """``out = x @ weight.T + bias``."""

    # -- reductions -------------------------------------------------------------------------------
    @abstractmethod
    def reduce(
        self, op: str, x: Tensor, axes: tuple[int, ...], keepdims: bool, out: Tensor
    ) -> None:
        """``op`` (:data:`accelkit.sdk.REDUCE_OPS`) over ``axes``; argmax/argmin with all axes
        index into the flattened tensor."""

    # -- shape ------------------------------------------------------------------------------------
    @abstractmethod
    def permute(self, x: Tensor, axes: tuple[int, ...], out: Tensor) -> None: ...

    @abstractmethod
    def concat(self, tensors: list[Tensor], axis: int, out: Tensor) -> None: ...

    @abstractmethod
    def narrow(self, x: Tensor, axis: int, start: int, out: Tensor) -> None: ...

    @abstractmethod
    def gather(self, x: Tensor, axis: int, index: Tensor, out: Tensor) -> None:
        """``take_along_axis``; an index out of range is an error raised when awaited."""

    @abstractmethod
    def scatter(
        self, x: Tensor, axis: int, index: Tensor, src: Tensor | int | float, out: Tensor
    ) -> None:
        """``out = x`` with ``src`` put along ``axis`` at ``index``."""

    # -- neural-network ops -----------------------------------------------------------------------
    @abstractmethod
    def conv2d(
        self,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        out: Tensor,
        stride: tuple[int, int],
        padding: tuple[int, int],
        dilation: tuple[int, int],
        groups: int,
    ) -> None: ...

    @abstractmethod
    def attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        out: Tensor,
        scale: float,
        causal: bool,
    ) -> None: ...

    @abstractmethod
    def softmax(self, x: Tensor, axis: int, out: Tensor, log: bool) -> None: ...

    @abstractmethod
    def layer_norm(
        self, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, out: Tensor
    ) -> None: ...

    @abstractmethod
    def rms_norm(self, x: Tensor, weight: Tensor | None, eps: float, out: Tensor) -> None: ...

    @abstractmethod
    def cross_entropy(
        self, logits: Tensor, targets: Tensor, reduction: str, loss: Tensor, probs: Tensor
    ) -> None: ...

    @abstractmethod
    def embedding(self, indices: Tensor, weight: Tensor, out: Tensor) -> None: ...

    @abstractmethod
    def adam_update(
        self,
        param: Tensor,
        grad: Tensor,
        m: Tensor,
        v: Tensor,
        lr: float,
        beta1: float,
        beta2: float,
        eps: float,
        step: int,
        weight_decay: float,
    ) -> None:
        """One Adam(W) step, updating ``param``, ``m`` and ``v`` in place."""

    # -- optional fused kernels (the core composes them where a backend has none) ---------------
    def depthwise(self, x: Tensor, kernel: np.ndarray[Any, Any], out: Tensor) -> None:
        """Optional: correlate every channel of the float NCHW ``x`` with the 2-d host
        ``kernel`` (odd sizes), border pixels replicated, into ``out`` (x's shape and dtype).
        Every image filter (blur, Sobel, sharpen) runs through it. Without an override, the
        core pads with narrow/concat and runs a grouped ``conv2d``."""
        raise NotImplementedError

    def separable_filter(
        self, x: Tensor, col: np.ndarray[Any, Any], row: np.ndarray[Any, Any], out: Tensor
    ) -> None:
        """Optional: correlate every channel of the NCHW ``x`` (any real dtype) with
        ``outer(col, row)`` (1-d host arrays of odd length, in the compute dtype: F64 for F64
        images, F32 otherwise), border pixels replicated, into ``out`` (x's shape and dtype).
        An integer ``out`` gets the result rounded half to even and clipped to ``0..max`` (255
        for U8). ``gaussian_blur`` runs through it; without an override, the core runs two
        :meth:`depthwise` passes (or their composition) with casts around them."""
        raise NotImplementedError

    def sobel_magnitude(self, x: Tensor, out: Tensor) -> None:
        """Optional: ``sqrt(gx^2 + gy^2)`` of the 3x3 Sobel filters on every channel of the
        NCHW ``x`` (any real dtype), border pixels replicated, into the float ``out`` (x's
        shape, in the compute dtype). ``sobel_edges`` runs through it."""
        raise NotImplementedError

    def grayscale(self, x: Tensor, weights: np.ndarray[Any, Any], out: Tensor) -> None:
        """Optional: ``out[:, 0] = sum_c weights[c] * x[:, c]`` over the channels ``weights``
        covers, for the NCHW ``x`` (any real dtype) and ``out`` of shape [N, 1, H, W] and x's
        dtype, rounded and clipped as :meth:`separable_filter` does for an integer ``out``."""
        raise NotImplementedError

    def take(self, x: Tensor, axis: int, index: np.ndarray[Any, Any] | range, out: Tensor) -> None:
        """Optional: ``out = np.take(x, index, axis)`` for the 1-d host ``index``: an I64
        array, or a ``range`` where it is evenly spaced (flip, strided narrow), which a kernel
        may run as a strided copy (``np.asarray(index)`` gives the array). Every value lies in
        ``0..x.shape[axis]-1``; it is computed from shapes, never from data. flip, pad, tile,
        broadcast_to and strided narrow run through it; without an override the core runs
        ``gather`` with the index broadcast on the device."""
        raise NotImplementedError

    def cumulative(
        self, op: str, x: Tensor, axis: int, exclusive: bool, reverse: bool, out: Tensor
    ) -> None:
        """Optional: running ``op`` (``"sum"`` or ``"prod"``) of ``x`` along ``axis`` into
        ``out`` (I64/U64 for integer and bool ``x``, else x's dtype; F16/BF16 accumulate in
        F32). ``exclusive`` starts from the identity and leaves each element out of its own
        result; ``reverse`` runs from the end. Without an override the core composes a
        Hillis-Steele scan."""
        raise NotImplementedError

    def argsort(self, x: Tensor, axis: int, descending: bool, out: Tensor) -> None:
        """Optional: the I64 indices of a stable sort of ``x`` along ``axis`` into ``out``;
        NaN sorts as the largest value; equal elements keep their order in either direction.
        sort, argsort and topk run through it; without an override the core composes a
        bitonic network."""
        raise NotImplementedError

    def scatter_reduce(
        self, op: str, x: Tensor, axis: int, index: Tensor, src: Tensor | int | float, out: Tensor
    ) -> None:
        """Optional: ``out = x`` with every ``src`` value combined by ``op`` (``"add"``,
        ``"multiply"``, ``"max"``, ``"min"``; NaN-propagating max/min) into the element its
        index (``-dim..dim-1``, wrapping) names along ``axis``, duplicates combined in index
        order (deterministic); as :meth:`scatter` for the shapes. An index out of range is an
        error raised when awaited. Without an override the core composes it."""
        raise NotImplementedError

    def attention_bshd(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        out: Tensor,
        scale: float,
        causal: bool,
    ) -> None:
        """Optional: :meth:`attention` on sequence-major tensors, read and written in place:
        ``q`` [B, Sq, H, D], ``k`` [B, Skv, Hkv, D], ``v`` [B, Skv, Hkv, Dv], ``out``
        [B, Sq, H, Dv]; ``mask`` (or None) broadcasts to the scores' [B, H, Sq, Skv] as in
        :meth:`attention`. ``attention(..., layout="bshd")`` runs it. It may decline one call
        by raising :class:`~accelkit.errors.UnsupportedOperationError` before enqueuing
        anything (a mask, a dtype its kernel lacks); without an override, or on a decline, the
        core permutes q, k and v to head-major, runs :meth:`attention` and permutes back."""
        raise NotImplementedError

    def overrides(self, name: str) -> bool:
        """Whether this kernel object overrides the optional kernel ``name`` (one of
        ``"depthwise"``, ``"separable_filter"``, ``"sobel_magnitude"``, ``"grayscale"``,
        ``"take"``, ``"cumulative"``, ``"argsort"``, ``"scatter_reduce"``,
        ``"attention_bshd"``)."""
        if name not in _OPTIONAL_KERNELS:
            raise ValueError(f"{name!r} is not an optional kernel; they are {_OPTIONAL_KERNELS}")
        return getattr(type(self), name) is not getattr(TensorKernels, name)

    @property
    def has_depthwise(self) -> bool:
        """Whether this kernel object overrides :meth:`depthwise`."""
        return self.overrides("depthwise")


_OPTIONAL_KERNELS = (
    "depthwise", "separable_filter", "sobel_magnitude", "grayscale", "take", "cumulative",
    "argsort", "scatter_reduce", "attention_bshd",
)  # fmt: skip


@dataclass(frozen=True)
class RandomDraw:
    """What :meth:`FactoryKernels.random` draws: ``kind`` is ``"uniform"`` (in ``[a, b)``) or
    ``"normal"`` (mean ``a``, standard deviation ``b``), ``shape`` the output's, ``seed`` an
    int or None (fresh entropy), ``dtype`` the output's (None: float64's draw as it is)."""

    kind: Literal["uniform", "normal"]
    a: float
    b: float
    shape: tuple[int, ...]
    seed: int | None
    dtype: DType | None = None

    def host(self) -> np.ndarray[Any, Any]:
        """The draw on the host, from NumPy's PCG64 (float64). A uniform draw for a ``dtype``
        stays in ``[a, b)`` once rounded to it: a sample that rounds up to ``b`` (1968 in a
        million in BF16 over [0, 1)) becomes the largest value of the dtype below ``b``, one
        that rounds below ``a`` the smallest from ``a`` on."""
        rng = np.random.default_rng(self.seed)
        if self.kind == "normal":
            return rng.normal(self.a, self.b, size=self.shape)
        x = rng.uniform(self.a, self.b, size=self.shape)
        if self.dtype is None or self.dtype is DType.F64 or not self.a < self.b:
            return x
        t = self.dtype.to_numpy()
        bounds = uniform_range(self.a, self.b, t)
        if bounds is not None:
            # Still float64 (what generate takes from every backend), exact in the dtype. A
            # low the dtype does not hold rounded samples below it (BF16 [1.0001, 1.5): 7959
            # in a million at 1.0).
            bottom, top = bounds
            rounded = x.astype(t).astype(np.float64)
            np.copyto(x, top, where=rounded >= self.b)
            np.copyto(x, bottom, where=rounded < self.a)
        return x


def uniform_range(a: float, b: float, dtype: Any) -> tuple[float, float] | None:
    """The values of NumPy ``dtype`` a uniform draw over ``[a, b)`` may take once rounded to
    it: its smallest value from ``a`` on and its largest below ``b``, exact as floats; None
    where it holds no value in ``[a, b)`` (``a >= b`` or either NaN included)."""
    if not a < b:  # also what ends the loops below: b > -inf, a < inf
        return None
    t = np.dtype(dtype)
    with np.errstate(over="ignore"):  # a bound beyond the dtype's range rounds to an infinity
        top, bottom = np.array(b, t), np.array(a, t)
    while float(top) >= b:
        top = np.nextafter(top, np.array(-np.inf, t))
    while float(bottom) < a:
        bottom = np.nextafter(bottom, np.array(np.inf, t))
    return (float(bottom), float(top)) if float(bottom) <= float(top) else None


class FactoryKernels(_Allocating):
    """The kernels TensorFactory calls."""

    @abstractmethod
    def fill(self, out: Tensor, value: int | float | bool) -> None:
        """Every element of ``out`` set to ``value`` (already checked to fit out's dtype)."""

    @abstractmethod
    def from_host(self, out: Tensor, array: np.ndarray[Any, Any]) -> None:
        """Copy ``array`` (any dtype, same shape; cast with NumPy's unsafe casting) into
        ``out``. Must snapshot ``array`` before returning: the caller may reuse it at once."""

    def random(self, out: Tensor, draw: RandomDraw) -> None:
        """Fill ``out`` with the random numbers ``draw`` describes.

        The default draws them on the host from NumPy's PCG64 (:meth:`RandomDraw.host`, through
        :meth:`generate`): every backend that keeps it gives the same numbers for a seed. A
        backend with a device generator overrides this to draw on the device (its numbers then
        differ from the host's for the same seed, and are the same on every run of it) and says
        so in :attr:`device_random`."""
        self.generate(out, draw.host)

    @property
    def device_random(self) -> bool:
        """Whether :meth:`random` draws on the device (from its own generator) rather than from
        NumPy's PCG64 on the host: true where the backend's class overrides it."""
        return type(self).random is not FactoryKernels.random

    def generate(self, out: Tensor, make: Callable[[], np.ndarray[Any, Any]]) -> None:
        """Fill ``out`` with the host array ``make()`` returns (random numbers, ranges).

        The default makes it now and copies it with :meth:`from_host`; a backend may instead
        run ``make`` in stream order off the caller's thread (large random tensors take a
        while)."""
        self.from_host(out, make())


class FusedKernels(_Allocating):
    """Fused transformer kernels; every method is optional.

    A method left as defined here means "no fused kernel": KernelOps runs the core's composition
    of TensorOps calls instead (same contract, more launches) and records that it did. A kernel
    may also refuse one call by raising :class:`~accelkit.errors.UnsupportedOperationError`
    before enqueuing anything (a dtype it lacks); the composition then runs. The contracts are
    KernelOps's (see :class:`accelkit.ops.KernelOps`); F16/BF16 are computed in F32 and rounded
    once.
    """

    #: The op names of this interface, in KernelOps's order.
    OPS: ClassVar[tuple[str, ...]] = KERNEL_OPS_IN_ORDER

    @property
    def fused_ops(self) -> frozenset[str]:
        """The ops this backend fuses: those whose method its class overrides."""
        cls = type(self)
        return frozenset(op for op in self.OPS if getattr(cls, op) is not getattr(FusedKernels, op))

    def _none(self, op: str) -> None:
        raise NotImplementedError(
            f"{type(self).__name__} has no fused {op}; KernelOps runs the composition instead"
        )

    # -- norms ------------------------------------------------------------------------------------
    def rms_norm(self, x: Tensor, weight: Tensor | None, eps: float, out: Tensor) -> None:
        self._none("rms_norm")

    def rms_norm_residual(
        self,
        x: Tensor,
        residual: Tensor,
        weight: Tensor | None,
        eps: float,
        normed: Tensor,
        summed: Tensor,
    ) -> None:
        self._none("rms_norm_residual")

    def layer_norm(
        self, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, out: Tensor
    ) -> None:
        self._none("layer_norm")

    # -- positions --------------------------------------------------------------------------------
    def rotary_embedding(
        self, x: Tensor, positions: Tensor | None, base: float, offset: int, out: Tensor
    ) -> None:
        self._none("rotary_embedding")

    # -- attention --------------------------------------------------------------------------------
    def attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        out: Tensor,
        scale: float,
        causal: bool,
    ) -> None:
        self._none("attention")

    def attention_bshd(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        out: Tensor,
        scale: float,
        causal: bool,
    ) -> None:
        """Optional: :meth:`attention` on sequence-major tensors read in place, with
        :meth:`TensorKernels.attention_bshd`'s contract (and its decline), for
        ``KernelOps.attention(..., layout="bshd")``; without it the core permutes around
        :meth:`attention`."""
        self._none("attention_bshd")

    @property
    def has_attention_bshd(self) -> bool:
        """Whether this kernel object's class overrides :meth:`attention_bshd`."""
        return type(self).attention_bshd is not FusedKernels.attention_bshd

    def paged_attention(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        block_table: Tensor,
        context_lens: Tensor,
        scale: float,
        out: Tensor,
    ) -> None:
        self._none("paged_attention")

    # -- activations ------------------------------------------------------------------------------
    def silu_mul(self, gate: Tensor, up: Tensor, out: Tensor) -> None:
        self._none("silu_mul")

    def gelu(self, x: Tensor, approximate: GeluApproximation, out: Tensor) -> None:
        self._none("gelu")

    # -- linear -----------------------------------------------------------------------------------
    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> None:
        self._none("linear")

    def quantized_linear(
        self,
        x: Tensor,
        qweight: Tensor,
        scales: Tensor,
        bias: Tensor | None,
        format: QuantFormat,
        out: Tensor,
    ) -> None:
        self._none("quantized_linear")

    # -- sampling ---------------------------------------------------------------------------------
    def argmax(self, logits: Tensor, out: Tensor) -> None:
        self._none("argmax")

    def sample_token(
        self, logits: Tensor, previous_tokens: Tensor | None, params: SamplingParams, out: Tensor
    ) -> None:
        self._none("sample_token")


class ComposedOnly(FusedKernels):
    """No fused kernel at all: every KernelOps op runs as the composition (what
    ``StreamBackend`` uses when a backend's ``Opened`` record has none)."""

    def __init__(self, tensor: TensorKernels) -> None:
        super().__init__(tensor.backend)
        self._tensor = tensor

    def empty(self, shape: tuple[int, ...], dtype: DType) -> Tensor:
        return self._tensor.empty(shape, dtype)

    def view(self, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        return self._tensor.view(x, shape)


class MemoryKernels(ABC):
    """The raw side of a backend's memory: its pool, and how blocks are freed, written, read and
    copied. ``backend.memory_manager`` is the core's :class:`accelkit.ops.MemoryManager` over
    this object: it checks every argument once (readiness, live buffers and tensors of this
    backend, byte counts, a writable C-contiguous host array), keeps the statistics and the pool
    settings, skips empty copies, and only then calls a method here. So a method receives live
    buffers of :attr:`pool` (and the tensors over them, or None where the caller passed a
    buffer), sizes that fit, and never more than one copy of zero bytes: none.

    ``pool`` is the :class:`~accelkit.sdk.CachingPool` over the backend's raw allocator, which
    every kernel allocates from (``backend.pool``).

    Where the host reads the device's memory once the work that writes it has completed (host
    streams: :attr:`wait_for_writers` true, the default), the core also waits, without blocking
    the event loop, for the writers of what is read before it calls :meth:`read`,
    :meth:`read_tensor`, :meth:`read_tensor_blocking` and :meth:`export_dlpack`. A backend whose
    reads are queued after their writers on the device (a command queue) sets it false and
    orders them itself.
    """

    #: Whether the core waits for the writers of what is read before a read (see the class).
    wait_for_writers: ClassVar[bool] = True

    def __init__(self, backend: StreamBackend[Any], pool: CachingPool) -> None:
        self.backend = backend  # type: ignore[misc]  # a plain attribute at run time
        self.pool = pool

    if TYPE_CHECKING:
        # Read-only to the type checker, so that a backend's memory kernels may narrow it to
        # their own backend class (``backend: MyBackend``).
        @property
        def backend(self) -> StreamBackend[Any]: ...

    def settle(self) -> None:  # noqa: B027 - a hook, nothing by default
        """Return to the pool the blocks whose last use has completed (frees deferred until
        device events), before statistics are read, the pool is trimmed or configured. Nothing
        by default; a :class:`~accelkit.sdk.QueuedBackend`'s kernels call
        ``backend.prune_streams()``."""

    @abstractmethod
    def free(self, buffer: DeviceBuffer) -> None:
        """Free ``buffer`` now (``pool.free``: stale and uncounted at once); its block returns to
        the pool once the work submitted so far on every stream, which may still use it, is
        done (``sdk.host.free_in_stream_order`` on host streams)."""

    async def stage(self, data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """The host bytes ``copy_htod`` writes, as memory of the backend's own: ``data`` is a
        flat ``uint8`` view of the caller's buffer (not empty), which the caller may reuse once
        ``copy_htod`` returns, or is cancelled. The default is a snapshot (off the event loop
        when large: ``sdk.host.copy_to_host``); a backend that copies through staging memory of
        its own (pinned host memory) copies into that instead. The core checks that the
        destination is still live after this await, then calls :meth:`write`."""
        return await copy_to_host(data)

    @abstractmethod
    async def write(
        self, buffer: DeviceBuffer, data: np.ndarray[Any, Any], dst: Tensor | None
    ) -> None:
        """Copy ``data`` (what :meth:`stage` returned: ``data.nbytes`` bytes, at most
        ``buffer.nbytes``) into the start of ``buffer``, after the work queued so far on the
        current stream and the last write of ``dst`` (the tensor over it, when the caller passed
        one: order the write after its writer on any stream, and record it as written), and
        return once the copy has completed. Reads of it queued on other streams are the
        program's to order (an event), as in CUDA."""

    @abstractmethod
    async def read(
        self, out: np.ndarray[Any, Any], buffer: DeviceBuffer, src: Tensor | None
    ) -> None:
        """Copy the first ``out.nbytes`` bytes of ``buffer`` (``src``: the tensor over it, or
        None) into ``out``, a writable flat ``uint8`` view of the caller's array (not empty, at
        most ``buffer.nbytes``), after the work that writes it; return once ``out`` holds them.
        With :attr:`wait_for_writers`, that work and the current stream's have completed."""

    @abstractmethod
    def copy(
        self,
        dst: DeviceBuffer,
        src: DeviceBuffer,
        nbytes: int,
        dst_tensor: Tensor | None,
        src_tensor: Tensor | None,
    ) -> None:
        """Submit a copy of the first ``nbytes`` bytes of ``src`` into ``dst`` (``nbytes`` > 0,
        at most either size) on the current stream, after the writers of ``src_tensor`` and of
        ``dst_tensor`` on any stream (None where the caller passed a buffer), recording
        ``dst_tensor`` as written; return at once. Reads of ``dst_tensor`` queued on other
        streams are the program's to order (an event), as in CUDA."""

    @abstractmethod
    async def read_tensor(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        """A new host array with ``tensor``'s elements (its shape, its dtype's NumPy type), once
        its writers have completed; the writer's error, if it failed, is raised."""

    @abstractmethod
    def read_tensor_blocking(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        """Blocking twin of :meth:`read_tensor` (blocks the calling thread)."""

    def dlpack_device(self, tensor: Tensor) -> tuple[int, int]:
        """``tensor.__dlpack_device__()``; UnsupportedOperationError by default (no DLPack).
        The core asks it before :meth:`export_dlpack` too."""
        raise UnsupportedOperationError(f"{self.backend.name} tensors do not export DLPack")

    def export_dlpack(self, tensor: Tensor, *, stream: Any = None, **kwargs: Any) -> Any:
        """``tensor.__dlpack__(stream=..., **kwargs)``: a capsule over the tensor's memory that
        keeps its buffer out of the pool while the consumer reads it;
        UnsupportedOperationError by default."""
        raise UnsupportedOperationError(f"{self.backend.name} tensors do not export DLPack")
