"""``SubsetBackend``: the CPU backend's kernels on device ``subset:0``, without attention and
without ``adam_update``."""

from __future__ import annotations

import dataclasses

from accelkit.backends.cpu.backend import CPUBackend
from accelkit.backends.cpu.factory_kernels import CPUFactoryKernels
from accelkit.backends.cpu.fused_kernels import CPUFusedKernels
from accelkit.backends.cpu.tensor_kernels import CPUTensorKernels
from accelkit.capabilities import BackendCapabilities
from accelkit.device import Device
from accelkit.errors import InvalidArgumentError, UnsupportedOperationError
from accelkit.sdk import FusedKernels, HostStream, Opened
from accelkit.tensor import Tensor
from accelkit_testplug_subset.probe import capabilities


class SubsetTensorKernels(CPUTensorKernels):
    """The CPU kernels, except that ``attention`` and ``adam_update`` (which writes its
    arguments in place) are refused before anything is enqueued."""

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
        raise UnsupportedOperationError(
            "backend 'subset' does not implement attention; open it with a fallback backend"
            " (e.g. fallback='cpu') to run it elsewhere"
        )

    def adam_update(
        self, param: Tensor, grad: Tensor, m: Tensor, v: Tensor, lr: float, beta1: float,
        beta2: float, eps: float, step: int, weight_decay: float,
    ) -> None:  # fmt: skip
        raise UnsupportedOperationError("backend 'subset' does not implement adam_update")


class SubsetFusedKernels(CPUFusedKernels):
    """The CPU fused kernels without the attention ones (KernelOps composes those)."""

    attention = FusedKernels.attention
    paged_attention = FusedKernels.paged_attention


class SubsetBackend(CPUBackend):
    """Device ``subset:0``: everything the CPU backend does except attention."""

    name = "subset"
    version = "0.1.0"
    device_kinds = frozenset({"subset"})

    def supports_device(self, device: Device | str) -> bool:
        try:
            d = Device.parse(device)
        except InvalidArgumentError:
            return False
        return d.kind == "subset" and d.index == 0

    @property
    def capabilities(self) -> BackendCapabilities:
        return capabilities()

    async def _initialize(self, device: Device) -> Opened[HostStream]:
        opened = await super()._initialize(device)
        return dataclasses.replace(
            opened,
            tensor=SubsetTensorKernels(self),
            factory=CPUFactoryKernels(self),
            fused=SubsetFusedKernels(self),
        )
