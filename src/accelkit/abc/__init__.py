"""The contracts: what a backend is (:class:`ComputeBackend`), its streams and events, its memory
and its kernel executor. Abstract only, as ``anyio.abc`` is.

The user-facing components built over a backend's kernels (TensorOps, TensorFactory, KernelOps)
are in :mod:`accelkit.ops`; the kernel contracts a backend implements, and the tools to write
one, are in :mod:`accelkit.sdk`.
"""

from accelkit.abc.backend import ComputeBackend
from accelkit.abc.kernels import KernelExecutor, KernelHandle, KernelInfo
from accelkit.abc.memory import DeviceBuffer, DeviceMemoryManager
from accelkit.abc.stream import Event, Stream

__all__ = [
    "ComputeBackend",
    "DeviceBuffer",
    "DeviceMemoryManager",
    "Event",
    "KernelExecutor",
    "KernelHandle",
    "KernelInfo",
    "Stream",
]
