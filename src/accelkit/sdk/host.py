"""NumPy bodies of the TensorKernels kernels, on host arrays: for backends whose storage the host
can read (a host-memory device, a backend that stages through the host, a test double).

The optional kernels' bodies are here too (``take``, ``cumulative``, ``argsort``,
``scatter_reduce`` and the image kernels ``depthwise``, ``separable_filter``,
``sobel_magnitude``, ``grayscale``), with the signatures of their TensorKernels methods, and
the fused KernelOps bodies (``rms_norm_residual``, ``rotary_embedding``, ``paged_attention``,
``silu_mul``, ``quantized_linear``, ``sample_token``) with those of FusedKernels.

Each function reads its inputs and writes ``out`` (an array of the result's shape and dtype, which
the core has already worked out), with exactly the semantics the conformance suite checks:
promotion with weak Python scalars, true division, integer overflow wrapping, F16/BF16 computed
in F32 and rounded once, index errors raised as InvalidArgumentError. The CPU backend runs these
same functions. A backend that computes elsewhere (a device) needs none of them; its results are
compared with these by the suite's NumPy references.

The bodies are plain NumPy. Those with a hot float32 step (``unary``, ``softmax``,
``attention``, ``layer_norm``, ``rms_norm``, ``rms_norm_residual``, ``paged_attention``) take a
keyword argument ``accel``, a :class:`HostAccelerator` asked first for that step: by default
:data:`NUMPY_ONLY` (none); :data:`JIT` is the CPU JIT the CPU backend passes (Numba kernels,
``pip install "accelkit[jit]"``, ``ACCELKIT_CPU_JIT``; docs/backends/cpu.md), which a host
backend may pass too (``h.attention(..., accel=h.JIT)``) and warm up in its ``prepare``
(``return await h.JIT.prepare(progress)``).

Also here, for backends whose device memory is host memory: an aligned block allocator and its
release for the caching pool, stream-ordered frees on a host stream, ``copy_to_host`` and
``copy_into`` (the copies of a ``read_tensor`` or a transfer, moved off the event loop when
large), ``reading`` (a read of a block on a thread of the backend's own, which a free waits
for) and DLPack export.
"""

from __future__ import annotations

from accelkit._core.host_arrays import assign, cast_into
from accelkit._core.host_jit import JIT, JITAccelerator
from accelkit._core.host_kernels import NUMPY_ONLY, HostAccelerator
from accelkit._core.host_kernels.elementwise import (
    argsort,
    binary,
    cumulative,
    reduce,
    take,
    unary,
    where,
)
from accelkit._core.host_kernels.fused import (
    paged_attention,
    quantized_linear,
    rms_norm_residual,
    rotary_embedding,
    sample_token,
    silu_mul,
)
from accelkit._core.host_kernels.image import (
    depthwise_replicate as depthwise,
)
from accelkit._core.host_kernels.image import (
    grayscale,
    separable_filter,
    sobel_magnitude,
)
from accelkit._core.host_kernels.nn import (
    adam_update,
    attention,
    conv2d,
    cross_entropy,
    embedding,
    gather,
    gemm,
    layer_norm,
    linear,
    matmul,
    rms_norm,
    scatter,
    scatter_reduce,
    softmax,
)
from accelkit._core.host_memory import (
    OFF_LOOP_COPY_BYTES,
    aligned_allocator,
    copy_into,
    copy_to_host,
    export_dlpack,
    free_in_stream_order,
    reading,
    release_block,
)

__all__ = [
    "JIT", "NUMPY_ONLY", "OFF_LOOP_COPY_BYTES", "HostAccelerator", "JITAccelerator",
    "adam_update", "aligned_allocator", "argsort", "assign", "attention",
    "binary", "cast_into", "conv2d", "copy_into", "copy_to_host", "cross_entropy", "cumulative",
    "depthwise", "embedding", "export_dlpack", "free_in_stream_order", "gather", "gemm",
    "grayscale", "layer_norm", "linear", "matmul", "paged_attention", "quantized_linear",
    "reading", "reduce", "release_block", "rms_norm", "rms_norm_residual", "rotary_embedding",
    "sample_token", "scatter", "scatter_reduce", "separable_filter", "silu_mul",
    "sobel_magnitude", "softmax", "take", "unary", "where",
]  # fmt: skip
