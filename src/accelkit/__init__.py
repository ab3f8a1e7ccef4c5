"""accelkit: async-first tensor compute on whatever accelerator a machine has.

Quick start::

    import accelkit as ak

    async with ak.open_backend("cpu") as backend:
        f, ops = backend.tensor_factory, backend.tensor_ops
        x = f.normal((512, 512), seed=0)
        y = ops.relu(x @ x)          # submissions: return at once
        print(await y.to_host())     # awaiting a transfer observes the result
"""

from accelkit import errors, quant
from accelkit._api import create_backend, open_backend
from accelkit._core.dispatch import KernelDispatcher, Route
from accelkit.abc import (
    ComputeBackend,
    DeviceBuffer,
    DeviceMemoryManager,
    Event,
    KernelExecutor,
    KernelOps,
    Stream,
    TensorFactory,
    TensorOps,
)
from accelkit.capabilities import (
    BackendCapabilities,
    BackendStatus,
    Features,
    LifecycleState,
    Limits,
    PerformanceHints,
    Requirements,
)
from accelkit.device import Device, DeviceInfo
from accelkit.dtype import DType
from accelkit.errors import (
    AccelError,
    BackendNotFoundError,
    ContextPoisonedError,
    DeviceError,
    IncompatiblePluginError,
    InvalidArgumentError,
    KernelCompileError,
    NotInitializedError,
    OutOfMemoryError,
    PluginLoadError,
    StaleHandleError,
    TimeoutError,
    UnsupportedOperationError,
)
from accelkit.memory import MemoryInfo, MemoryPoolConfig, MemoryPressure
from accelkit.tensor import Tensor

__version__ = "0.1.0"

__all__ = [
    "AccelError",
    "BackendCapabilities",
    "BackendNotFoundError",
    "BackendStatus",
    "ComputeBackend",
    "ContextPoisonedError",
    "DType",
    "Device",
    "DeviceBuffer",
    "DeviceError",
    "DeviceInfo",
    "DeviceMemoryManager",
    "Event",
    "Features",
    "IncompatiblePluginError",
    "InvalidArgumentError",
    "KernelCompileError",
    "KernelDispatcher",
    "KernelExecutor",
    "KernelOps",
    "LifecycleState",
    "Limits",
    "MemoryInfo",
    "MemoryPoolConfig",
    "MemoryPressure",
    "NotInitializedError",
    "OutOfMemoryError",
    "PerformanceHints",
    "PluginLoadError",
    "Requirements",
    "Route",
    "StaleHandleError",
    "Stream",
    "Tensor",
    "TensorFactory",
    "TensorOps",
    "TimeoutError",
    "UnsupportedOperationError",
    "__version__",
    "create_backend",
    "open_backend",
    "errors",
    "quant",
]
