r"""``accelkit.sdk``: everything a backend author needs, and the only accelkit module besides the
public user API (``accelkit``, ``accelkit.errors``, ``accelkit.device``, ...) that a backend
plugin imports.

A backend is a :class:`StreamBackend` (or a :class:`QueuedBackend`, a StreamBackend for devices
whose frees wait for device events). It implements four hooks: ``_device_count``,
``_device_capabilities``, ``_initialize`` (which opens the device and returns an
:class:`Opened` record: its streams, kernel objects, executor, dtypes and capabilities) and
``_open_stream``; the base class does the rest. Its streams are :class:`PositionStream`\ s
(:class:`HostStream` runs work on a worker thread). Its kernel objects derive from
:class:`KernelBase` (allocation, views, ordered launches; five hooks) and implement:

- :class:`TensorKernels`: every TensorOps kernel (abstract: all required);
- :class:`FactoryKernels`: fills and host copies (abstract);
- :class:`FusedKernels`: optional fused transformer kernels (every method has a composed default);

and its :class:`MemoryKernels` hold the pool (a :class:`CachingPool` over the device's
allocator) and do the raw part of the memory manager: a stream-ordered free, the copies,
reading a tensor.

The core validates every argument before a kernel runs; kernels read tensors through the
backend-facing tensor API (:func:`storage`, :func:`new_tensor`, :func:`view_of`,
:func:`mark_written`, :func:`last_writer`). :mod:`accelkit.testing` is the conformance suite
to run against a backend: ``pytest --pyargs accelkit.testing --accelkit-backend NAME``.
docs/backend-authors.md walks through writing one.
"""

from __future__ import annotations

from accelkit._core.device_errors import DeviceErrors
from accelkit._core.env import env_str
from accelkit._core.host_arrays import assign as host_assign
from accelkit._core.host_arrays import cast_into as host_cast_into
from accelkit._core.host_stream import HostStream
from accelkit._core.kernel_base import KernelBase, other_writers
from accelkit._core.kernel_validation import (
    GUMBEL_UNIFORM_MAX,
    GeluApproximation,
    SamplingParams,
    rotary_inv_freq,
)
from accelkit._core.loop import wait_for_callback
from accelkit._core.op_names import (
    BINARY_OPS,
    COMPOSED_OPS,
    KERNEL_OPS,
    KERNEL_OPS_IN_ORDER,
    REDUCE_OPS,
    TENSOR_OPS,
    UNARY_OPS,
)
from accelkit._core.pool import CachingPool
from accelkit._core.positions import PositionEvent, PositionStream, Waiters
from accelkit._core.queued_backend import QueuedBackend
from accelkit._core.shapes import broadcast_shapes, prod
from accelkit._core.stream_backend import Opened, StreamBackend
from accelkit._core.validation import check_launch_dims, check_tensor
from accelkit.abc.backend import ComputeBackend
from accelkit.abc.kernels import KernelExecutor, KernelHandle, KernelInfo
from accelkit.abc.memory import DeviceBuffer, DeviceMemoryManager
from accelkit.abc.stream import Event, Stream
from accelkit.capabilities import BackendCapabilities, LifecycleState
from accelkit.capture import GraphRecording, NativeGraph, RecordedCall
from accelkit.memory import MemoryPoolConfig
from accelkit.plugins import PLUGIN_API_VERSION, PluginDescriptor
from accelkit.sdk.kernels import (
    ComposedOnly,
    FactoryKernels,
    FusedKernels,
    MemoryKernels,
    Operand,
    RandomDraw,
    TensorKernels,
    uniform_range,
)
from accelkit.sdk.tensors import (
    buffer_of,
    last_writer,
    mark_written,
    new_tensor,
    pending_writes,
    storage,
    view_of,
)

__all__ = [
    "RandomDraw",
    "uniform_range",
    "RecordedCall",
    "other_writers",
    "Waiters",
    "PositionEvent",
    "PositionStream",
    "Opened",
    "KernelBase",
    "BINARY_OPS",
    "COMPOSED_OPS",
    "GUMBEL_UNIFORM_MAX",
    "KERNEL_OPS",
    "KERNEL_OPS_IN_ORDER",
    "PLUGIN_API_VERSION",
    "REDUCE_OPS",
    "TENSOR_OPS",
    "UNARY_OPS",
    "BackendCapabilities",
    "CachingPool",
    "ComposedOnly",
    "ComputeBackend",
    "DeviceBuffer",
    "DeviceErrors",
    "DeviceMemoryManager",
    "Event",
    "FactoryKernels",
    "FusedKernels",
    "GeluApproximation",
    "GraphRecording",
    "HostStream",
    "KernelExecutor",
    "KernelHandle",
    "KernelInfo",
    "LifecycleState",
    "MemoryKernels",
    "MemoryPoolConfig",
    "NativeGraph",
    "Operand",
    "PluginDescriptor",
    "QueuedBackend",
    "StreamBackend",
    "SamplingParams",
    "Stream",
    "TensorKernels",
    "broadcast_shapes",
    "buffer_of",
    "check_launch_dims",
    "check_tensor",
    "env_str",
    "host_assign",
    "host_cast_into",
    "last_writer",
    "mark_written",
    "new_tensor",
    "pending_writes",
    "prod",
    "rotary_inv_freq",
    "storage",
    "view_of",
    "wait_for_callback",
]
