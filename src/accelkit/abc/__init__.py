"""The interfaces every backend implements (see each module's docstring for the guarantees)."""

from accelkit.abc.backend import ComputeBackend
from accelkit.abc.factory import TensorFactory
from accelkit.abc.kernel_ops import (
    ActivationOps,
    AttentionOps,
    KernelOps,
    LinearOps,
    NormOps,
    PositionOps,
    SamplingOps,
)
from accelkit.abc.kernels import KernelExecutor, KernelHandle, KernelInfo
from accelkit.abc.memory import DeviceBuffer, DeviceMemoryManager
from accelkit.abc.stream import Event, Stream
from accelkit.abc.tensor_ops import TensorOps

__all__ = [
    "ActivationOps",
    "AttentionOps",
    "ComputeBackend",
    "DeviceBuffer",
    "DeviceMemoryManager",
    "Event",
    "KernelExecutor",
    "KernelHandle",
    "KernelInfo",
    "KernelOps",
    "LinearOps",
    "NormOps",
    "PositionOps",
    "SamplingOps",
    "Stream",
    "TensorFactory",
    "TensorOps",
]
