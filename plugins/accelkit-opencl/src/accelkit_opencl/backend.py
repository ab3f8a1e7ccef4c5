"""``OpenCLBackend``: one OpenCL device, its context, and in-order command queues as streams.

Imported only when a user creates an ``opencl`` backend; PyOpenCL is imported here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import pyopencl as cl

from accelkit.capabilities import BackendCapabilities
from accelkit.device import Device
from accelkit.dtype import DType
from accelkit.errors import DeviceError, UnsupportedOperationError
from accelkit.memory import MemoryPoolConfig
from accelkit.sdk import Opened, QueuedBackend
from accelkit_opencl import __version__
from accelkit_opencl.probe import capabilities, cl_devices
from accelkit_opencl.programs import KernelRef
from accelkit_opencl.stream import CLStream, cl_errors
from accelkit_opencl.variants import (
    Candidate,
    VariantChoice,
    candidates,
    overrides_from_env,
    pick,
    verifier_for,
)

if TYPE_CHECKING:
    from accelkit_opencl.executor import OpenCLKernelExecutor

__all__ = ["OpenCLBackend"]

log = logging.getLogger("accelkit.opencl")


class OpenCLBackend(QueuedBackend[CLStream]):
    """An OpenCL device (``opencl:N``, numbered over every platform as the probe lists them)."""

    name = "opencl"
    version = __version__
    device_kinds = frozenset({"opencl"})

    def __init__(self, pool_config: MemoryPoolConfig | None = None) -> None:
        super().__init__(pool_config)
        self._device_obj = Device("opencl", 0)
        self._cl_device: Any = None
        self._context: Any = None
        self._kernels: dict[tuple[str, str], Any] = {}
        self._executor: OpenCLKernelExecutor | None = None
        self._variants: dict[str, Candidate] = {}
        self._fallbacks: dict[str, tuple[Candidate, str]] = {}
        self._forced: dict[str, str] = {}

    def _device_count(self) -> int:
        return len(cl_devices())

    def _device_capabilities(self, index: int) -> BackendCapabilities:
        return capabilities(cl_devices()[index], index)

    @staticmethod
    def _event_done(event: Any) -> bool:
        status = event.command_execution_status
        return bool(status == cl.command_execution_status.COMPLETE or status < 0)

    # -- lifecycle --------------------------------------------------------------------------------
    async def _initialize(self, device: Device) -> Opened[CLStream]:
        from accelkit_opencl.executor import OpenCLKernelExecutor
        from accelkit_opencl.factory_kernels import OpenCLFactoryKernels
        from accelkit_opencl.fused_kernels import OpenCLFusedKernels
        from accelkit_opencl.memory import OpenCLMemoryKernels
        from accelkit_opencl.programs import ProgramCache
        from accelkit_opencl.tensor_kernels import OpenCLTensorKernels

        if self._executor is not None:  # reopen(): the old context's programs go first
            self._release_programs()
        cl_device = cl_devices()[device.index]
        try:
            context = await anyio.to_thread.run_sync(lambda: cl.Context([cl_device]))
        except cl.Error as exc:
            raise DeviceError(f"cannot create an OpenCL context on {device}: {exc}") from None
        self._cl_device = cl_device
        self._context = context
        caps = capabilities(cl_device, device.index)
        self._device_obj = device
        default = CLStream(context, cl_device, device, f"{device}/default")
        self._kernels = {}
        self._programs = ProgramCache(context, cl_device)
        self._verifier = verifier_for(cl_device, device.index)
        self._forced = overrides_from_env()
        self._variants = {}
        self._fallbacks = {}
        self._executor = OpenCLKernelExecutor(self)
        tensor = OpenCLTensorKernels(self)
        return Opened(
            streams=[default],
            memory=OpenCLMemoryKernels(
                self, device, context, int(cl_device.global_mem_size), self.pool_config
            ),
            tensor=tensor,
            factory=OpenCLFactoryKernels(self),
            fused=OpenCLFusedKernels(self, tensor),
            executor=self._executor,
            dtypes=self._dtypes(caps),
            capabilities=caps,
        )

    async def _shutdown(self) -> None:
        try:
            # Each stream's queued work finishes (its errors are dropped: nobody is left to
            # tell), the stream closes off the loop, and the pool is released.
            await super()._shutdown()
        finally:
            self._release_programs()

    def _release_programs(self) -> None:
        """Release in the order the driver needs: kernels, then programs, then (later, with the
        last reference) the context: PoCL aborts at exit when a context goes while programs
        of it are alive."""
        self._kernels.clear()
        self._kernels = {}
        if self._executor is not None:
            self._executor.release()
        self._programs.clear()

    # -- device programs --------------------------------------------------------------------------
    def _kernel(self, source: str, name: str) -> KernelRef:
        """The kernel ``name`` of a generated program, built where it is first enqueued (once per
        backend, cached on disk). f64 kernels first wait for the ``fp64`` verdict."""
        ref = KernelRef(self._programs, self._kernels, source, name)
        if "cl_khr_fp64" in source:
            ref.gate = self._require_fp64
        return ref

    def _gemm_tiles(self, dtype: DType) -> tuple[int, int]:
        """(tile, work per item) of the tiled GEMM kernel (a verified variant)."""
        tiles: tuple[int, int] = self._variant("gemm_tiled")
        return tiles

    @property
    def _reduce_wg(self) -> int:
        """The work-group size of row reductions, softmax and norms (a verified variant)."""
        return int(self._variant("reduce_wg"))

    # -- device-dependent kernel variants (accelkit_opencl.variants) -------------------------------
    def _variant(self, family: str) -> Any:
        """The value of the variant ``family`` runs now: forced, verified, or portable."""
        cand = self._variants.get(family)
        if cand is not None:
            return cand.value
        fallback = self._fallbacks.get(family)
        if fallback is not None:
            return fallback[0].value
        self._verifier.start()
        cand, choice = pick(self._verifier, self._cl_device, family, self._forced)
        if choice.state != "pending":  # final: no need to ask again
            self._variants[family] = cand
        return cand.value

    def _variant_failed(self, family: str, error: BaseException) -> None:
        """A verified variant of ``family`` failed to build here after all: run the portable
        one from now on, and record why (see :meth:`kernel_variants`)."""
        portable = candidates(self._cl_device, family)[-1]
        self._fallbacks[family] = (portable, f"{type(error).__name__}: {error}")
        self._variants.pop(family, None)
        log.warning("accelkit-opencl: %s fell back to %s: %s", family, portable.label, error)

    def _force_variant(self, family: str, label: str | None) -> None:
        """Run ``label`` for ``family`` (None: back to the normal choice); the verifying child
        and tests use it."""
        if label is None:
            self._forced.pop(family, None)
        else:
            self._forced[family] = label
        self._variants.pop(family, None)
        self._fallbacks.pop(family, None)

    def kernel_variants(self) -> list[VariantChoice]:
        """Which variant each device-dependent kernel family runs, and why: ``verified``,
        ``pending`` (the portable variant runs until verification ends), ``failed`` (no better
        candidate passed: the portable one runs, or the dtype is refused), ``forced``,
        ``portable`` (verification is off) or ``fallback`` (the verified variant failed to build
        here)."""
        self.check_ready()
        out = []
        for family in self._verifier.families:
            fallback = self._fallbacks.get(family)
            if fallback is not None:
                out.append(VariantChoice(family, fallback[0].label, "fallback", fallback[1]))
                continue
            out.append(pick(self._verifier, self._cl_device, family, self._forced)[1])
        return out

    async def prepare(self, progress: Callable[[str], None] | None = None) -> str | None:
        """Verify this device's kernel variants now (in child processes, off the loop), rather
        than in the background on first need; verdicts are stored, so later runs skip it.
        Returns None when every family runs a verified variant (or verification is off), else a
        note on the families that do not (:meth:`kernel_variants`: ``failed``, ``fallback``,
        or ``pending`` where verification gave up)."""
        self.check_ready()
        await anyio.to_thread.run_sync(self._verifier.run, progress)
        self._variants.clear()
        self._refresh_dtypes()
        left = [c for c in self.kernel_variants() if c.state in ("failed", "fallback", "pending")]
        if not left:
            return None
        return "OpenCL kernel variants: " + "; ".join(
            f"{c.family}: {c.state}" + (f" ({c.reason})" if c.reason else "") for c in left
        )

    def _refresh_dtypes(self) -> None:
        """Update ``supported_dtypes`` after verification (see :meth:`_dtypes`)."""
        self.supported_dtypes = self._dtypes(self.capabilities)

    def _dtypes(self, caps: BackendCapabilities) -> frozenset[DType]:
        """The dtypes the device reports, less F64 where cl_khr_fp64 is reported but its kernels
        failed verification here."""
        if self._verifier.enabled() and self._verifier.choice("fp64")[1].state == "failed":
            return caps.dtypes - {DType.F64}
        return caps.dtypes

    def _require_fp64(self) -> None:
        """Wait for the fp64 verdict (off the loop: kernels are built in stream threads); refuse
        f64 kernels that failed it."""
        if "fp64" in self._forced or not self._verifier.enabled():
            return
        self._verifier.wait("fp64", timeout=300)
        _, choice = self._verifier.choice("fp64")
        if choice.state == "failed":
            raise UnsupportedOperationError(
                f"{self._device_obj}: F64 is not available: {self._cl_device.name.strip()}"
                f" reports cl_khr_fp64, but its f64 kernels failed verification ({choice.reason})"
            )

    # -- streams ----------------------------------------------------------------------------------
    def _open_stream(self) -> CLStream:
        stream = CLStream(
            self._context,
            self._cl_device,
            self._device_obj,
            f"{self._device_obj}/stream{len(self.streams)}",
        )
        # Blocks freed while there was one queue went back to the pool at once; work queued
        # before may still use them, so the new queue starts after it.
        busy = self._busy_events()
        if busy:
            with cl_errors(stream.name):
                stream.record(cl.enqueue_barrier(stream.queue, wait_for=busy))
        return stream

    def _busy_events(self, exclude: CLStream | None = None) -> list[Any]:
        """The last pending event of every stream but ``exclude``."""
        events = []
        for s in self.streams:
            if s is not exclude:
                event = s.last_event()
                if event is not None:
                    events.append(event)
        return events
