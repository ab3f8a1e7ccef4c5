"""The backend facade, imported only when a user creates an ``example`` backend.

:class:`accelkit.sdk.StreamBackend` owns the streams, the pool, the counters, the stream checks and
the generation; this class says how many devices there are, what they can do, how to open one
(streams, memory manager, kernel objects) and how to close it.
"""

from __future__ import annotations

import anyio

from accelkit.capabilities import BackendCapabilities
from accelkit.device import Device
from accelkit.sdk import HostStream, StreamBackend
from accelkit_example import __version__
from accelkit_example.probe import DTYPES, capabilities


class ExampleBackend(StreamBackend):
    """Device ``example:0``: untyped host memory, every kernel on a stream's worker thread."""

    name = "example"
    version = __version__
    device_kinds = frozenset({"example"})

    def _device_count(self) -> int:
        return 1

    def _device_capabilities(self, index: int) -> BackendCapabilities:
        return capabilities()

    # -- lifecycle --------------------------------------------------------------------------------
    async def _initialize(self, device: Device) -> None:
        from accelkit_example.factory import ExampleFactoryKernels
        from accelkit_example.memory import ExampleMemoryManager
        from accelkit_example.ops import ExampleTensorKernels

        self.supported_dtypes = DTYPES
        self._streams = []
        self._add_stream(HostStream(device, f"{device}/default"))
        self._memory_manager = ExampleMemoryManager(self, device, self._pool_config)
        self._pool = self._memory_manager.pool
        # No FusedKernels: every KernelOps op runs as the core's composition of TensorOps.
        self.install_kernels(ExampleTensorKernels(self), ExampleFactoryKernels(self))

    async def _shutdown(self) -> None:
        try:
            # Let queued work finish (shielded: a cancelled shutdown still releases everything).
            with anyio.CancelScope(shield=True):
                for stream in list(self._streams):
                    await stream.wait_for_quietly(stream.submitted)
                    await anyio.to_thread.run_sync(stream.close)
        finally:
            self.pool.invalidate_all(close=True)
            self._streams = []

    # -- streams ----------------------------------------------------------------------------------
    def create_stream(self) -> HostStream:
        self._require_ready()
        stream = HostStream(self.default_stream.device, f"example:0/stream{len(self._streams)}")
        self._add_stream(stream)
        return stream
