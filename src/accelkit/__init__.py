"""accelkit: async-first tensor compute on whatever accelerator a machine has.

Quick start::

    import accelkit as ak

    async with ak.open_backend("cpu") as backend:
        f, ops = backend.tensor_factory, backend.tensor_ops
        x = f.normal((512, 512), seed=0)
        y = ops.relu(x @ x)          # submissions: return at once
        print(await y.to_host())     # awaiting a transfer observes the result

Names are loaded on first use (as anyio and NumPy load theirs): ``import accelkit`` imports
neither NumPy nor any backend, so a broken or slow driver can never break it.
"""

from __future__ import annotations

import importlib
import os as _os
import sys as _sys
from typing import TYPE_CHECKING, Any

__version__ = "0.3.0"

#: OpenBLAS's worker threads spin for up to 2**28 cycles (tens of ms) after each GEMM before they
#: sleep, holding a core that the CPU backend's next kernel wants: its JIT kernels split between
#: the cores, and the event loop wants one too. In the transformer block this cost 8 ms in 60
#: (docs/backends/cpu.md). 2**14 cycles (a few us) still spans back-to-back calls. OpenBLAS reads
#: the setting when it loads, with NumPy: it takes effect only where accelkit is imported first,
#: and a value already set is left alone (OPENBLAS_THREAD_TIMEOUT=28 keeps OpenBLAS's own).
_OPENBLAS_THREAD_TIMEOUT = "14"
if "numpy" not in _sys.modules:
    _os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", _OPENBLAS_THREAD_TIMEOUT)

#: public name -> module that defines it
_LAZY: dict[str, str] = {
    # types
    "Device": "accelkit.device",
    "DeviceInfo": "accelkit.device",
    "DType": "accelkit.dtype",
    "Tensor": "accelkit.tensor",
    "BackendCapabilities": "accelkit.capabilities",
    "BackendStatus": "accelkit.capabilities",
    "Features": "accelkit.capabilities",
    "LifecycleState": "accelkit.capabilities",
    "Limits": "accelkit.capabilities",
    "PerformanceHints": "accelkit.capabilities",
    "Requirements": "accelkit.capabilities",
    "MemoryInfo": "accelkit.memory",
    "MemoryPoolConfig": "accelkit.memory",
    "MemoryPressure": "accelkit.memory",
    # interfaces
    "ComputeBackend": "accelkit.abc",
    "DeviceBuffer": "accelkit.abc",
    "DeviceMemoryManager": "accelkit.abc",
    "Event": "accelkit.abc",
    "KernelExecutor": "accelkit.abc",
    "KernelOps": "accelkit.ops",
    "Stream": "accelkit.abc",
    "TensorFactory": "accelkit.ops",
    "TensorOps": "accelkit.ops",
    # functions users call first
    "create_backend": "accelkit._api",
    "open_backend": "accelkit._api",
    "devices": "accelkit._api",
    "select": "accelkit.selector",
    "Selection": "accelkit.selector",
    "PluginDescriptor": "accelkit.plugins",
    "PLUGIN_API_VERSION": "accelkit.plugins",
    "Route": "accelkit.routes",
    "CapturedGraph": "accelkit.capture",
    # errors
    "AccelError": "accelkit.errors",
    "BackendNotFoundError": "accelkit.errors",
    "CaptureError": "accelkit.errors",
    "ContextPoisonedError": "accelkit.errors",
    "DeviceError": "accelkit.errors",
    "IncompatiblePluginError": "accelkit.errors",
    "InvalidArgumentError": "accelkit.errors",
    "KernelCompileError": "accelkit.errors",
    "NotInitializedError": "accelkit.errors",
    "OutOfMemoryError": "accelkit.errors",
    "PluginLoadError": "accelkit.errors",
    "StaleHandleError": "accelkit.errors",
    "TimeoutError": "accelkit.errors",
    "UnsupportedOperationError": "accelkit.errors",
    "WorkerLostError": "accelkit.errors",
    "IsolatedBackend": "accelkit.isolation",
}
_SUBMODULES = frozenset({"errors", "quant", "registry", "calibration", "workloads"})

__all__ = [
    "AccelError",
    "BackendCapabilities",
    "BackendNotFoundError",
    "BackendStatus",
    "CaptureError",
    "CapturedGraph",
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
    "IsolatedBackend",
    "KernelCompileError",
    "KernelExecutor",
    "KernelOps",
    "LifecycleState",
    "Limits",
    "MemoryInfo",
    "MemoryPoolConfig",
    "MemoryPressure",
    "NotInitializedError",
    "OutOfMemoryError",
    "PLUGIN_API_VERSION",
    "PerformanceHints",
    "PluginDescriptor",
    "PluginLoadError",
    "Requirements",
    "Route",
    "Selection",
    "StaleHandleError",
    "Stream",
    "Tensor",
    "TensorFactory",
    "TensorOps",
    "TimeoutError",
    "UnsupportedOperationError",
    "WorkerLostError",
    "__version__",
    "calibration",
    "create_backend",
    "devices",
    "errors",
    "open_backend",
    "quant",
    "registry",
    "select",
    "workloads",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"accelkit.{name}")
    else:
        raise AttributeError(f"module 'accelkit' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:
    from accelkit import calibration, errors, quant, registry, workloads
    from accelkit._api import create_backend, devices, open_backend
    from accelkit.abc import (
        ComputeBackend,
        DeviceBuffer,
        DeviceMemoryManager,
        Event,
        KernelExecutor,
        Stream,
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
    from accelkit.capture import CapturedGraph
    from accelkit.device import Device, DeviceInfo
    from accelkit.dtype import DType
    from accelkit.errors import (
        AccelError,
        BackendNotFoundError,
        CaptureError,
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
        WorkerLostError,
    )
    from accelkit.isolation import IsolatedBackend
    from accelkit.memory import MemoryInfo, MemoryPoolConfig, MemoryPressure
    from accelkit.ops import KernelOps, TensorFactory, TensorOps
    from accelkit.plugins import PLUGIN_API_VERSION, PluginDescriptor
    from accelkit.routes import Route
    from accelkit.selector import Selection, select
    from accelkit.tensor import Tensor
