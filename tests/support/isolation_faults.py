"""A test-only backend for the isolation tests: the CPU backend with a kernel executor whose
"kernels" are Python functions (``language="python"``), so that a test can make the worker
abort, hang, or hit a sticky device error from a user kernel. Opened in the worker by its
import path: ``IsolatedBackend("support.isolation_faults:FaultyBackend")``."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from accelkit.abc.kernels import KernelExecutor, KernelHandle, KernelInfo
from accelkit.backends.cpu.backend import CPUBackend
from accelkit.backends.cpu.submit import CPUComponent
from accelkit.device import Device
from accelkit.errors import ContextPoisonedError, StaleHandleError
from accelkit.sdk import HostStream, Opened
from accelkit.tensor import Tensor

__all__ = ["FaultyBackend", "PythonExecutor"]


class PythonExecutor(CPUComponent, KernelExecutor):
    """Compiles Python source; ``execute_kernel`` runs the function named on the stream with
    the NumPy arrays of its tensor arguments (and the backend as ``backend``)."""

    languages = frozenset({"python"})

    def __init__(self, backend: FaultyBackend) -> None:
        super().__init__(backend)
        self._kernels: dict[str, Callable[..., None]] = {}

    async def load_kernel(
        self, source: str, name: str, *, language: str, options: Sequence[str] = ()
    ) -> KernelHandle:
        scope: dict[str, Any] = {}
        exec(compile(source, f"<kernel {name}>", "exec"), scope)
        key = hashlib.sha256(source.encode()).hexdigest()[:16]
        self._kernels[key] = scope[name]
        return KernelHandle(
            name=name, language=language, key=key, backend=self.backend.name, device="cpu:0",
            generation=self.backend.generation,
        )  # fmt: skip

    def execute_kernel(
        self, handle: KernelHandle, grid: Sequence[int], block: Sequence[int], args: Sequence[Any]
    ) -> None:
        fn = self._kernels.get(handle.key)
        if fn is None:
            raise StaleHandleError(f"kernel {handle.name} was not loaded here")
        tensors = [a for a in args if type(a) is Tensor]
        values = [a._data if type(a) is Tensor else a for a in args]
        backend = self.backend

        def run() -> None:
            fn(backend, *values)

        self._launch(run, 1 << 30, tensors, tensors)

    def kernel_info(self, handle: KernelHandle) -> KernelInfo:
        return KernelInfo(name=handle.name)

    def unload_kernel(self, handle: KernelHandle) -> None:
        self._kernels.pop(handle.key, None)


class FaultyBackend(CPUBackend):
    """The CPU backend with :class:`PythonExecutor` (device cpu:0)."""

    async def _initialize(self, device: Device) -> Opened[HostStream]:
        opened = await super()._initialize(device)
        return dataclasses.replace(opened, executor=PythonExecutor(self))


#: User kernels for the tests.
KERNELS = """
import os, time

def scale(backend, x, factor):
    x *= factor

def abort(backend, x):
    import sys
    sys.stderr.write("fatal error: the test kernel aborts on purpose\\n")
    sys.stderr.flush()
    os.abort()

def hang(backend, x):
    time.sleep(3600)

def poison(backend, x):
    from accelkit.errors import ContextPoisonedError
    backend.mark_failed("an illegal address (the test kernel's sticky error)")
    raise ContextPoisonedError("an illegal memory access was encountered (test)")
"""

_ = ContextPoisonedError  # the kernels raise it in the worker
