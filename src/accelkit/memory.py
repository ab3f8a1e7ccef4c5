"""Memory statistics and pool configuration, shared by every backend's memory manager."""

from __future__ import annotations

import enum

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["MemoryInfo", "MemoryPoolConfig", "MemoryPressure"]


class MemoryPressure(enum.Enum):
    """How full the device (or the configured limit) is: below 50 %, 75 %, 90 %, or above."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"

    @classmethod
    def from_fraction(cls, used_fraction: float) -> MemoryPressure:
        if used_fraction < 0.5:
            return cls.LOW
        if used_fraction < 0.75:
            return cls.MEDIUM
        if used_fraction < 0.9:
            return cls.HIGH
        return cls.CRITICAL


class MemoryInfo(BaseModel):
    """Exact memory statistics of one backend on one device, in bytes.

    ``used`` counts the bytes of live allocations as requested; ``reserved`` counts what the backend
    holds from the device (live blocks rounded to their size class plus cached free blocks);
    ``fragmentation`` is the share of ``reserved`` not in use (0 when nothing is reserved).
    """

    model_config = ConfigDict(frozen=True)

    total: int = Field(ge=0, description="device memory, or the configured limit if lower")
    used: int = Field(ge=0)
    free: int = Field(ge=0, description="total - used")
    reserved: int = Field(ge=0)
    peak: int = Field(ge=0, description="highest `used` since initialize or reset_peak")
    active_allocations: int = Field(ge=0)
    fragmentation: float = Field(ge=0.0, le=1.0)


class MemoryPoolConfig(BaseModel):
    """Settings of a backend's caching allocator."""

    model_config = ConfigDict(frozen=True)

    enabled: bool = Field(True, description="cache freed blocks for reuse")
    limit_bytes: int | None = Field(
        None, gt=0, description="cap on `used`; going past it raises OutOfMemoryError"
    )
    max_cached_bytes: int | None = Field(
        None, ge=0, description="cap on cached free blocks; older ones are released past it"
    )
    alignment: int = Field(
        64,
        gt=0,
        description="byte alignment of every block (a power of two; set when the backend is"
        " created: a later config may ask for less, not more)",
    )

    @field_validator("alignment")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError(f"alignment must be a power of two; got {value}")
        return value
