"""Pydantic models that describe backends: capabilities, status, and what a workload requires.

They are frozen: validated once where they are made, then trusted.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from accelkit._core.op_names import KERNEL_OPS, TENSOR_OPS
from accelkit.dtype import DType

__all__ = [
    "BackendCapabilities",
    "BackendStatus",
    "Features",
    "Limits",
    "PerformanceHints",
    "Requirements",
    "RequirementCheck",
    "LifecycleState",
]


class Features(BaseModel):
    """Optional hardware and driver features."""

    model_config = ConfigDict(frozen=True)

    fp16: bool = False
    bf16: bool = False
    fp64: bool = False
    unified_memory: bool = False
    async_copy: bool = False
    custom_kernels: bool = False
    graphs: bool = False


class Limits(BaseModel):
    """Hard limits of the device (0 means unknown or unlimited)."""

    model_config = ConfigDict(frozen=True)

    memory_bytes: int = Field(0, ge=0, description="total memory usable by the backend")
    max_alloc_bytes: int = Field(0, ge=0, description="largest single allocation")
    compute_units: int = Field(0, ge=0)
    max_work_group_size: int = Field(0, ge=0)


#: A performance figure: finite and not negative (a NaN peak ranked first, above every real
#: figure, and an infinite one made ``select --json`` print ``Infinity``).
Figure = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]


class PerformanceHints(BaseModel):
    """Declared (or calibrated) performance figures the selector ranks by."""

    model_config = ConfigDict(frozen=True)

    peak_gflops: dict[DType, Figure] = Field(default_factory=dict, description="per dtype")
    bandwidth_gbs: Figure = Field(0.0, description="device memory bandwidth, GB/s")
    launch_latency_us: Figure = Field(0.0, description="cost of submitting one op")
    power_watts: Figure = Field(0.0, description="typical board power (0: unknown)")
    calibrated: bool = Field(False, description="figures measured by `accelkit calibrate`")


def _check_tensor_op_names(ops: frozenset[str]) -> frozenset[str]:
    """``ops`` holds TensorOps names; a KernelOps-only name there is a 1.x habit: say where it
    goes now."""
    misplaced = sorted(ops & (KERNEL_OPS - TENSOR_OPS))
    if misplaced:
        raise ValueError(
            f"{', '.join(misplaced)} are KernelOps names: every KernelOps op is always available"
            " (composed where a backend has no fused kernel); list fused ones in fused_ops"
        )
    return ops


def _check_kernel_op_names(ops: frozenset[str]) -> frozenset[str]:
    unknown = sorted(ops - KERNEL_OPS)
    if unknown:
        raise ValueError(
            f"fused_ops lists {', '.join(unknown)}, which are not KernelOps names (known:"
            f" {', '.join(sorted(KERNEL_OPS))})"
        )
    return ops


#: TensorOps names (a KernelOps-only name is refused, saying where it goes).
TensorOpNames = Annotated[frozenset[str], AfterValidator(_check_tensor_op_names)]
#: KernelOps names.
KernelOpNames = Annotated[frozenset[str], AfterValidator(_check_kernel_op_names)]


class Requirements(BaseModel):
    """What a workload needs from a backend."""

    model_config = ConfigDict(frozen=True)

    ops: TensorOpNames = Field(default_factory=frozenset, description="TensorOps names")
    fused_ops: KernelOpNames = Field(
        default_factory=frozenset,
        description="KernelOps names that must run as one fused kernel (not the composition)",
    )
    dtypes: frozenset[DType] = Field(default_factory=frozenset)
    features: frozenset[str] = Field(default_factory=frozenset, description="Features field names")
    min_memory_bytes: int = Field(0, ge=0)
    kernel_languages: frozenset[str] = Field(default_factory=frozenset)


class RequirementCheck(BaseModel):
    """The answer of :meth:`BackendCapabilities.meets`: ``ok`` and, when not, every reason."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    reasons: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.ok


class BackendCapabilities(BaseModel):
    """What one backend can do on one device."""

    model_config = ConfigDict(frozen=True)

    backend: str
    device: str
    dtypes: frozenset[DType]
    ops: TensorOpNames = Field(description="supported TensorOps names")
    fused_ops: KernelOpNames = Field(
        default_factory=frozenset,
        description="KernelOps names with a fused kernel on this device (every KernelOps op is"
        " available: the others run as the core's composition of TensorOps)",
    )
    kernel_languages: frozenset[str] = frozenset()
    features: Features = Features()
    limits: Limits = Limits()
    performance: PerformanceHints = PerformanceHints()
    extra: dict[str, Any] = Field(default_factory=dict, description="vendor-specific data")

    def meets(self, requirements: Requirements) -> RequirementCheck:
        """Check ``requirements`` and explain every miss."""
        reasons: list[str] = []
        if missing := sorted(requirements.ops - self.ops):
            reasons.append(f"{self.backend} on {self.device} lacks ops: {', '.join(missing)}")
        if missing_f := sorted(requirements.fused_ops - self.fused_ops):
            reasons.append(
                f"{self.backend} on {self.device} has no fused kernel for: {', '.join(missing_f)}"
            )
        if missing_d := sorted(d.value for d in requirements.dtypes - self.dtypes):
            reasons.append(f"{self.backend} on {self.device} lacks dtypes: {', '.join(missing_d)}")
        known = set(Features.model_fields)
        for feat in sorted(requirements.features):
            if feat not in known:
                reasons.append(f"unknown feature {feat!r}; known: {', '.join(sorted(known))}")
            elif not getattr(self.features, feat):
                reasons.append(f"{self.backend} on {self.device} lacks feature {feat}")
        mem = self.limits.memory_bytes
        if requirements.min_memory_bytes and mem and mem < requirements.min_memory_bytes:
            reasons.append(
                f"{self.backend} on {self.device} has {mem} bytes of memory;"
                f" {requirements.min_memory_bytes} required"
            )
        if missing_l := sorted(requirements.kernel_languages - self.kernel_languages):
            reasons.append(f"{self.backend} compiles no {', '.join(missing_l)} kernels")
        return RequirementCheck(ok=not reasons, reasons=tuple(reasons))


class LifecycleState(enum.Enum):
    CREATED = "created"
    READY = "ready"
    SHUT_DOWN = "shut_down"
    FAILED = "failed"


class BackendStatus(BaseModel):
    """A snapshot of a backend's state, cheap to take at any time."""

    model_config = ConfigDict(frozen=True)

    backend: str
    state: LifecycleState
    device: str | None = None
    generation: int = Field(0, description="bumped each time the device context is rebuilt")
    pending_operations: int = Field(0, ge=0, description="submitted and not yet completed")
    completed_operations: int = Field(0, ge=0)
    memory_used_bytes: int = Field(0, ge=0)
    error: str | None = None
