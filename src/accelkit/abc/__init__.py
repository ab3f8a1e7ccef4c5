"""The user-facing component interfaces (see each module's docstring for the guarantees).

What a backend *implements* is in :mod:`accelkit.sdk`: kernel objects behind these components.
"""

from accelkit.abc.backend import ComputeBackend
from accelkit.abc.factory import TensorFactory
from accelkit.abc.kernel_ops import KernelOps
from accelkit.abc.kernels import KernelExecutor, KernelHandle, KernelInfo
from accelkit.abc.memory import DeviceBuffer, DeviceMemoryManager
from accelkit.abc.stream import Event, Stream
from accelkit.abc.tensor_ops import TensorOps

__all__ = [
    "ComputeBackend",
    "DeviceBuffer",
    "DeviceMemoryManager",
    "Event",
    "KernelExecutor",
    "KernelHandle",
    "KernelInfo",
    "KernelOps",
    "Stream",
    "TensorFactory",
    "TensorOps",
]
