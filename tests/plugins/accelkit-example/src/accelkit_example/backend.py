"""The backend facade, imported only when a user creates an ``example`` backend.

:class:`accelkit.sdk.StreamBackend` does the lifecycle, the streams, the pool, the counters and
the checks; this class says how many devices there are, what they can do, what opening one makes
(an :class:`accelkit.sdk.Opened` record: streams, memory and other kernel objects, dtypes) and
how to make another stream. Closing needs nothing of its own: the base class finishes each
stream's work, closes it and releases the pool.
"""

from __future__ import annotations

from accelkit.capabilities import BackendCapabilities
from accelkit.device import Device
from accelkit.sdk import HostStream, Opened, StreamBackend
from accelkit_example import __version__
from accelkit_example.probe import DTYPES, capabilities


class ExampleBackend(StreamBackend[HostStream]):
    """Device ``example:0``: untyped host memory, every kernel on a stream's worker thread."""

    name = "example"
    version = __version__
    device_kinds = frozenset({"example"})

    def _device_count(self) -> int:
        return 1

    def _device_capabilities(self, index: int) -> BackendCapabilities:
        return capabilities()

    # -- lifecycle --------------------------------------------------------------------------------
    async def _initialize(self, device: Device) -> Opened[HostStream]:
        from accelkit_example.factory_kernels import ExampleFactoryKernels
        from accelkit_example.memory import ExampleMemoryKernels
        from accelkit_example.tensor_kernels import ExampleTensorKernels

        # No FusedKernels: every KernelOps op runs as the core's composition of TensorOps.
        return Opened(
            streams=[HostStream(device, f"{device}/default")],
            memory=ExampleMemoryKernels(self, device, self.pool_config),
            tensor=ExampleTensorKernels(self),
            factory=ExampleFactoryKernels(self),
            dtypes=DTYPES,
            capabilities=capabilities(),
        )

    # -- streams ----------------------------------------------------------------------------------
    def _open_stream(self) -> HostStream:
        return HostStream(self.default_stream.device, f"example:0/stream{len(self.streams)}")
