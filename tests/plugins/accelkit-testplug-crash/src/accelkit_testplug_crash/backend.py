"""``CrashBackend``: the CPU backend's kernels on device ``crash:0``, with a matmul that
misbehaves as ``ACCELKIT_TESTPLUG_CRASH`` says (see the package docstring)."""

from __future__ import annotations

import atexit
import dataclasses
import os
import sys
import time

from accelkit.backends.cpu.backend import CPUBackend
from accelkit.backends.cpu.factory_kernels import CPUFactoryKernels
from accelkit.backends.cpu.fused_kernels import CPUFusedKernels
from accelkit.backends.cpu.tensor_kernels import CPUTensorKernels
from accelkit.capabilities import BackendCapabilities
from accelkit.device import Device
from accelkit.errors import DeviceError, InvalidArgumentError
from accelkit.sdk import HostStream, Opened
from accelkit.tensor import Tensor
from accelkit_testplug_crash.probe import capabilities

#: The fatal line printed before aborting, as a driver's compiler would (tests look for it).
FATAL_LINE = "LLVM ERROR: Cannot select: fma (accelkit-testplug-crash aborts in matmul on purpose)"


def _mode() -> str:
    return os.environ.get("ACCELKIT_TESTPLUG_CRASH", "abort").strip().lower() or "abort"


def _abort_at_exit() -> None:
    sys.stderr.write("accelkit-testplug-crash: fatal error: still holding a context at exit\n")
    sys.stderr.flush()
    os.abort()


class CrashTensorKernels(CPUTensorKernels):
    def matmul(self, a: Tensor, b: Tensor, out: Tensor) -> None:
        mode = _mode()
        if mode == "abort":
            sys.stderr.write("warning: a compiler warning before the fatal error\n")
            sys.stderr.write(FATAL_LINE + "\n")
            sys.stderr.write("  0x55c3b6e10320: i64,ch = CopyFromReg (a DAG dump line)\n")
            sys.stderr.flush()
            os.abort()
        if mode == "hang":
            time.sleep(3600)
        if mode == "slow":
            time.sleep(2.5)
        if mode == "raise":
            raise DeviceError("the crash device lost its context (on purpose)")
        if mode == "exit":
            atexit.register(_abort_at_exit)
        super().matmul(a, b, out)
        if mode == "wrong":
            self.binary("add", out, 1.0, out)  # in stream order, after the product


class CrashBackend(CPUBackend):
    """Device ``crash:0``: the CPU backend, except matmul."""

    name = "crash"
    version = "0.1.0"
    device_kinds = frozenset({"crash"})

    def supports_device(self, device: Device | str) -> bool:
        try:
            d = Device.parse(device)
        except InvalidArgumentError:
            return False
        return d.kind == "crash" and d.index == 0

    @property
    def capabilities(self) -> BackendCapabilities:
        return capabilities()

    async def _initialize(self, device: Device) -> Opened[HostStream]:
        opened = await super()._initialize(device)
        return dataclasses.replace(
            opened,
            tensor=CrashTensorKernels(self),
            factory=CPUFactoryKernels(self),
            fused=CPUFusedKernels(self),
        )
