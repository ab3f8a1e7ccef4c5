"""Device identity: ``Device`` names a device, ``DeviceInfo`` describes one."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from accelkit.capabilities import BackendCapabilities
from accelkit.errors import InvalidArgumentError

__all__ = ["Device", "DeviceInfo"]

_DEVICE_RE = re.compile(r"^([a-z][a-z0-9_]*)(?::([0-9]+))?$")


class Device:
    """A device: a kind (``"cpu"``, ``"cuda"``, ``"opencl"``...) and an index.

    ``Device.parse("cuda:1")`` and ``str(Device("cuda", 1)) == "cuda:1"``; ``"cpu"`` means
    ``cpu:0``. Devices are immutable, hashable and compare equal to their string form.
    """

    __slots__ = ("_index", "_kind")

    def __init__(self, kind: str, index: int = 0) -> None:
        if not isinstance(kind, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", kind):
            raise InvalidArgumentError(
                f"device kind must be a lower-case name like 'cpu' or 'cuda'; got {kind!r}"
            )
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise InvalidArgumentError(
                f"device index must be a non-negative int; got {index!r} for kind {kind!r}"
            )
        self._kind = kind
        self._index = index

    @classmethod
    def parse(cls, value: str | Device) -> Device:
        """Parse ``"kind"`` or ``"kind:index"`` (``"cpu"``, ``"cuda:0"``, ``"opencl:1"``)."""
        if isinstance(value, Device):
            return value
        if not isinstance(value, str):
            raise InvalidArgumentError(
                f"expected a device string like 'cpu' or 'cuda:0'; got {type(value).__name__}"
            )
        m = _DEVICE_RE.match(value.strip().lower())
        if m is None:
            raise InvalidArgumentError(
                f"malformed device {value!r}; expected 'kind' or 'kind:index' with a non-negative"
                " index, e.g. 'cpu', 'cuda:0', 'opencl:1'"
            )
        return cls(m.group(1), int(m.group(2)) if m.group(2) is not None else 0)

    @property
    def kind(self) -> str:
        return self._kind

    @property
    def index(self) -> int:
        return self._index

    def __str__(self) -> str:
        return f"{self._kind}:{self._index}"

    def __repr__(self) -> str:
        return f"Device(kind={self._kind!r}, index={self._index})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Device):
            return self._kind == other._kind and self._index == other._index
        if isinstance(other, str):
            try:
                return self == Device.parse(other)
            except InvalidArgumentError:
                return False
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self._kind, self._index))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Device, (self._kind, self._index))


class DeviceInfo(BaseModel):
    """What a backend's probe reports about one device (cheap to obtain, no context created)."""

    model_config = ConfigDict(frozen=True)

    device: str = Field(description="the device as 'kind:index'")
    backend: str = Field(description="the backend that can drive it")
    name: str = Field(description="human-readable device name")
    vendor: str = ""
    memory_bytes: int = Field(0, ge=0, description="total device memory, 0 if unknown")
    compute_units: int = Field(0, ge=0)
    capabilities: BackendCapabilities | None = Field(
        None, description="what the backend can do on it, as probed (used by the selector)"
    )
    extra: dict[str, Any] = Field(default_factory=dict, description="vendor-specific data")
