"""Device identity: ``Device`` names a device, ``DeviceInfo`` describes one."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from accelkit.capabilities import BackendCapabilities
from accelkit.errors import InvalidArgumentError

__all__ = ["Device", "DeviceInfo"]

_DEVICE_RE = re.compile(r"^([a-z][a-z0-9_]*)(?::([0-9]+))?$")
#: ``kind://address``: a device reached at an address (a Dask scheduler, ``dask://host:8786``).
_ADDRESS_RE = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)://(\S+)$")


class Device:
    """A device: a kind (``"cpu"``, ``"cuda"``, ``"opencl"``...) and an index, or a kind and the
    address it is reached at.

    ``Device.parse("cuda:1")`` and ``str(Device("cuda", 1)) == "cuda:1"``; ``"cpu"`` means
    ``cpu:0``. A device on another machine is named by its address:
    ``Device.parse("dask://10.0.0.5:8786")`` is ``Device("dask", address="10.0.0.5:8786")``
    (index 0). Devices are immutable, hashable and compare equal to their string form; a
    Device and its canonical string (``"cuda:1"``) are the same dict key.
    """

    __slots__ = ("_address", "_index", "_kind")

    def __init__(self, kind: str, index: int = 0, *, address: str | None = None) -> None:
        if not isinstance(kind, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", kind):
            raise InvalidArgumentError(
                f"device kind must be a lower-case name like 'cpu' or 'cuda'; got {kind!r}"
            )
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise InvalidArgumentError(
                f"device index must be a non-negative int; got {index!r} for kind {kind!r}"
            )
        if address is not None and (
            not isinstance(address, str) or not address or any(c.isspace() for c in address)
        ):
            raise InvalidArgumentError(
                f"device address must be a non-empty string without spaces, like"
                f" '10.0.0.5:8786'; got {address!r} for kind {kind!r}"
            )
        self._kind = kind
        self._index = index
        self._address = address

    @classmethod
    def parse(cls, value: str | Device) -> Device:
        """Parse ``"kind"``, ``"kind:index"`` (``"cpu"``, ``"cuda:0"``, ``"opencl:1"``) or
        ``"kind://address"`` (``"dask://10.0.0.5:8786"``)."""
        if isinstance(value, Device):
            return value
        if not isinstance(value, str):
            raise InvalidArgumentError(
                f"expected a device string like 'cpu' or 'cuda:0'; got {type(value).__name__}"
            )
        text = value.strip()
        a = _ADDRESS_RE.match(text)
        if a is not None:  # the kind is case-insensitive, as in 'CPU:0'; the address is kept
            return cls(a.group(1).lower(), 0, address=a.group(2))
        m = _DEVICE_RE.match(text.lower())
        if m is None:
            raise InvalidArgumentError(
                f"malformed device {value!r}; expected 'kind', 'kind:index' with a non-negative"
                " index or 'kind://address', e.g. 'cpu', 'cuda:0', 'dask://10.0.0.5:8786'"
            )
        return cls(m.group(1), int(m.group(2)) if m.group(2) is not None else 0)

    @property
    def kind(self) -> str:
        return self._kind

    @property
    def index(self) -> int:
        return self._index

    @property
    def address(self) -> str | None:
        """Where a remote device is reached (``"10.0.0.5:8786"``); None for a local one."""
        return self._address

    def __str__(self) -> str:
        if self._address is not None:
            return f"{self._kind}://{self._address}"
        return f"{self._kind}:{self._index}"

    def __repr__(self) -> str:
        if self._address is not None:
            return f"Device(kind={self._kind!r}, address={self._address!r})"
        return f"Device(kind={self._kind!r}, index={self._index})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Device):
            return (
                self._kind == other._kind
                and self._index == other._index
                and self._address == other._address
            )
        if isinstance(other, str):
            try:
                return self == Device.parse(other)
            except InvalidArgumentError:
                return False
        return NotImplemented

    def __hash__(self) -> int:
        # The hash of the string form, as equality with it requires: a Device and "cuda:1" are
        # the same key of a dict or set.
        return hash(str(self))

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """As a field of a pydantic model: validated from a Device (kept as it is) or its string
        form (parsed once, where the model is made), serialized as the string (``"cuda:1"``) in
        both ``model_dump`` modes and in JSON."""
        from pydantic_core import core_schema

        return core_schema.no_info_plain_validator_function(
            _validate,
            serialization=core_schema.plain_serializer_function_ser_schema(str),
            json_schema_input_schema=core_schema.str_schema(),
        )

    def __reduce__(self) -> tuple[Any, ...]:
        if self._address is not None:
            return (_addressed, (self._kind, self._address))
        return (Device, (self._kind, self._index))


def _validate(value: Any) -> Device:
    """A pydantic field's validator: a Device as it is, anything else through ``Device.parse``
    (looked up on each call, so that a test can count the parses)."""
    if isinstance(value, Device):
        return value
    return Device.parse(value)  # refuses a non-string, saying what it expected


def _addressed(kind: str, address: str) -> Device:
    """Unpickle a device named by its address."""
    return Device(kind, 0, address=address)


class DeviceInfo(BaseModel):
    """What a backend's probe reports about one device (cheap to obtain, no context created).

    ``device`` is a :class:`Device`; a probe may pass ``Device("cuda", 1)`` or its string form
    ``"cuda:1"`` (parsed once, here). In ``model_dump`` and JSON it is the string, so
    ``accelkit info --json`` shows ``"device": "cuda:1"`` and a dumped record validates back.
    """

    model_config = ConfigDict(frozen=True)

    device: Device = Field(description="the device ('kind:index' or 'kind://address' in JSON)")
    backend: str = Field(description="the backend that can drive it")
    name: str = Field(description="human-readable device name")
    vendor: str = ""
    memory_bytes: int = Field(0, ge=0, description="total device memory, 0 if unknown")
    compute_units: int = Field(0, ge=0)
    capabilities: BackendCapabilities | None = Field(
        None, description="what the backend can do on it, as probed (used by the selector)"
    )
    extra: dict[str, Any] = Field(default_factory=dict, description="vendor-specific data")
