"""The kernel interfaces a backend implements (defined in :mod:`accelkit._core.kernel_api`;
see there for the contracts)."""

from accelkit._core.kernel_api import (
    ComposedOnly,
    FactoryKernels,
    FusedKernels,
    Operand,
    TensorKernels,
)

__all__ = ["ComposedOnly", "FactoryKernels", "FusedKernels", "Operand", "TensorKernels"]
