"""``SubsetBackend``: the CPU backend's kernels on device ``subset:0``, without attention."""

from __future__ import annotations

from accelkit.abc.kernel_ops import KernelOps
from accelkit.backends.cpu.backend import CPUBackend
from accelkit.backends.cpu.kernel_ops import (
    CPUActivationOps,
    CPULinearOps,
    CPUNormOps,
    CPUPositionOps,
    CPUSamplingOps,
)
from accelkit.backends.cpu.ops import CPUTensorOps
from accelkit.capabilities import BackendCapabilities
from accelkit.device import Device
from accelkit.errors import InvalidArgumentError, UnsupportedOperationError
from accelkit.tensor import Tensor
from accelkit_testplug_subset.probe import capabilities


class SubsetTensorOps(CPUTensorOps):
    """The CPU TensorOps, except that ``attention`` is refused before anything is allocated."""

    def attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float | None = None,
        causal: bool = False,
        mask: Tensor | None = None,
    ) -> Tensor:
        raise UnsupportedOperationError(
            "backend 'subset' does not implement attention; open it with a fallback backend"
            " (e.g. fallback='cpu') to run it elsewhere"
        )


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

    async def _initialize(self, device: Device) -> None:
        await super()._initialize(device)
        self._tensor_ops = SubsetTensorOps(self)
        self._kernel_ops = KernelOps(
            self,
            norm_ops=CPUNormOps(self),
            position_ops=CPUPositionOps(self),
            attention_ops=None,
            activation_ops=CPUActivationOps(self),
            linear_ops=CPULinearOps(self),
            sampling_ops=CPUSamplingOps(self),
        )
