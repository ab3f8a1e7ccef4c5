"""What every stream-based backend shares: its streams, its pool, its counters.

A :class:`StreamBackend` keeps

- ``_streams``: every stream of the backend, the default one first (:meth:`_add_stream`);
- ``_default``: the default stream (None before ``initialize``);
- ``_pool``: the :class:`~accelkit._core.pool.CachingPool` its memory manager allocates from
  (:attr:`pool`; None before ``initialize``), whose generation is the backend's;
- ``_pool_config``: the pool configuration it was created with;

and from those answers ``default_stream``, the stream check of ``use_stream``, the
``pending_operations`` / ``completed_operations`` / ``generation`` of ``status``, and a default
``_synchronize`` (every stream, in order). Streams count their work as ``submitted`` and
``completed`` (``HostStream`` does). ``supports_device`` comes from :meth:`_device_count`, and
``capabilities`` from :meth:`_device_capabilities` (or ``_caps``, set at initialize).

The CPU backend, the example backend under tests/plugins and (through :class:`QueuedBackend`,
which adds work deferred until device events complete) the OpenCL and CUDA backends derive from
it. Subclasses implement ``_initialize`` (calling :meth:`_add_stream` for the default stream and
setting ``_pool``), ``_shutdown`` and ``create_stream``.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from accelkit._core.pool import CachingPool
from accelkit.abc.backend import ComputeBackend
from accelkit.abc.stream import Stream
from accelkit.capabilities import BackendCapabilities
from accelkit.device import Device
from accelkit.errors import DeviceError, InvalidArgumentError, NotInitializedError
from accelkit.memory import MemoryPoolConfig

__all__ = ["StreamBackend"]


class StreamBackend(ComputeBackend):
    """A backend whose work runs on streams it owns (see the module docstring)."""

    def __init__(self, pool_config: MemoryPoolConfig | None = None) -> None:
        super().__init__()
        self._pool_config = pool_config or MemoryPoolConfig()
        #: Every stream of the backend, the default one first.
        self._streams: list[Any] = []
        self._default: Any = None
        self._pool: CachingPool | None = None
        #: The capabilities of the open device (set by ``_initialize``; probed while None).
        self._caps: BackendCapabilities | None = None

    # -- devices ----------------------------------------------------------------------------------
    @abstractmethod
    def _device_count(self) -> int:
        """How many devices of this kind there are; DeviceError saying why there are none."""

    @abstractmethod
    def _device_capabilities(self, index: int) -> BackendCapabilities:
        """The capabilities of device ``index`` (without initializing the backend)."""

    def supports_device(self, device: Device | str) -> bool:
        try:
            d = Device.parse(device)
        except InvalidArgumentError:
            return False
        if d.kind not in self.device_kinds:
            return False
        try:
            return d.index < self._device_count()
        except DeviceError:
            return False

    @property
    def capabilities(self) -> BackendCapabilities:
        if self._caps is not None:
            return self._caps
        return self._device_capabilities(self._device.index if self._device is not None else 0)

    # -- memory -----------------------------------------------------------------------------------
    @property
    def pool(self) -> CachingPool:
        """The caching pool the backend allocates from (NotInitializedError before
        ``initialize``)."""
        pool = self._pool
        if pool is None:
            raise NotInitializedError(f"backend {self.name!r} has no memory pool before initialize")
        return pool

    def _generation(self) -> int:
        return self._pool.generation if self._pool is not None else 0

    # -- streams ----------------------------------------------------------------------------------
    def _add_stream(self, stream: Any) -> Any:
        """Register a new stream of this backend (the first becomes the default); returns it."""
        if not self._streams:
            self._default = stream
        self._streams.append(stream)
        return stream

    @property
    def default_stream(self) -> Stream:
        self._require_ready()
        assert self._default is not None
        return self._default  # type: ignore[no-any-return]

    def _check_stream(self, stream: Stream) -> None:
        if stream not in self._streams:
            raise InvalidArgumentError(f"{stream!r} is not a stream of this {self.name} backend")

    async def _synchronize(self) -> None:
        for stream in list(self._streams):
            await stream.synchronize()

    def _pending_operations(self) -> int:
        return sum(int(s.submitted) - int(s.completed) for s in self._streams)

    def _completed_operations(self) -> int:
        return sum(int(s.completed) for s in self._streams)
