"""``KernelExecutor`` for user CUDA C++ kernels: NVRTC, the disk cache, and launches.

``load_kernel`` compiles on a worker thread (the loop is never blocked) through the cache of
:mod:`accelkit_cuda.nvrtc`, keyed by source, options, the device's architecture and NVRTC's
version, then loads the CUBIN into the backend's context. Kernels are ``extern "C"`` functions
(no C++ name mangling).

Arguments of ``execute_kernel``: tensors and device buffers (passed as pointers), NumPy scalars
(passed as their type), Python ``int``/``float``/``bool`` (sized from the kernel's parameter list
where the driver reports it, CUDA 12.4+; otherwise int32/float32), and at most one
:class:`SharedMemory` giving the dynamic shared memory. Every tensor argument is treated as read
and written, so later work waits for the launch.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import cupy
import numpy as np

from accelkit.errors import InvalidArgumentError, StaleHandleError, UnsupportedOperationError
from accelkit.sdk import (
    DeviceBuffer,
    KernelExecutor,
    KernelHandle,
    KernelInfo,
    check_launch_dims,
    check_tensor,
)
from accelkit.tensor import Tensor
from accelkit_cuda.submit import CUDAComponent, storage

if TYPE_CHECKING:
    from accelkit_cuda.backend import CUDABackend

__all__ = ["CUDAKernelExecutor", "SharedMemory"]


@dataclass(frozen=True)
class SharedMemory:
    """Dynamic shared memory for a launch (``extern __shared__``), in bytes."""

    nbytes: int


_ATTRS = {
    "max_threads_per_block": 0, "shared_size_bytes": 1, "const_size_bytes": 2,
    "local_size_bytes": 3, "num_regs": 4, "ptx_version": 5, "binary_version": 6,
    "max_dynamic_shared_size_bytes": 8,
}  # fmt: skip
_SCALAR = {
    (int, 4): np.int32, (int, 8): np.int64, (float, 4): np.float32, (float, 8): np.float64,
    (bool, 1): np.bool_, (int, 2): np.int16, (int, 1): np.int8, (float, 2): np.float16,
}  # fmt: skip


class _BufferArg:
    """A DeviceBuffer argument: its CuPy array is made at launch, on the submission thread."""

    __slots__ = ("buffer", "device", "nbytes")

    def __init__(self, buffer: DeviceBuffer, nbytes: int, device: int) -> None:
        self.buffer, self.nbytes, self.device = buffer, nbytes, device

    def array(self) -> Any:
        from accelkit_cuda.memory import memptr

        # memptr(buffer): the array keeps the *buffer* alive, so the pool cannot recycle it.
        return cupy.ndarray((self.nbytes,), cupy.uint8, memptr=memptr(self.buffer, self.device))


def _native(value: Any) -> Any:
    if type(value) is Tensor:
        return storage(value)
    if type(value) is _BufferArg:
        return value.array()
    return value


class CUDAKernelExecutor(CUDAComponent, KernelExecutor):
    languages = frozenset({"cuda"})

    def __init__(self, backend: CUDABackend) -> None:
        super().__init__(backend)
        self._loaded: dict[str, tuple[Any, Any, list[int] | None, dict[str, int]]] = {}
        self._lock = threading.Lock()

    async def load_kernel(
        self, source: str, name: str, *, language: str = "cuda", options: Sequence[str] = ()
    ) -> KernelHandle:
        backend = self.backend
        backend.check_ready()
        if language != "cuda":
            raise UnsupportedOperationError(
                f"the CUDA backend compiles CUDA C++ kernels; got language {language!r}"
            )
        if not isinstance(source, str) or not source.strip():
            raise InvalidArgumentError("load_kernel: source must be a non-empty string")
        if not isinstance(name, str) or not name.isidentifier():
            raise InvalidArgumentError(f"load_kernel: name must be a C identifier; got {name!r}")
        opts = tuple(options)
        if not all(isinstance(o, str) for o in opts):
            raise InvalidArgumentError("load_kernel: options must be strings")
        generation = backend.generation

        def build() -> Any:
            from accelkit_cuda.nvrtc import compile_cached

            return compile_cached(source, backend._arch, opts, f"{name}.cu")

        def load(binary: bytes) -> tuple[Any, Any, list[int] | None, dict[str, int]]:
            # On the submission thread: the module lives in the backend's context there.
            from accelkit_cuda.driver import driver

            module = cupy.cuda.function.Module()
            module.load(binary)
            try:
                function = module.get_function(name)
            except cupy.cuda.driver.CUDADriverError:
                raise InvalidArgumentError(
                    f"load_kernel: the program has no kernel named {name!r} (declare it"
                    ' extern "C" __global__)'
                ) from None
            attrs = {
                k: int(cupy.cuda.driver.funcGetAttribute(v, function.ptr))
                for k, v in _ATTRS.items()
            }
            return module, function, driver().param_sizes(function.ptr), attrs

        # NVRTC needs no context: a worker thread, so the submission thread keeps launching.
        compiled = await anyio.to_thread.run_sync(build)
        key = compiled.key
        module, function, params, attrs = await backend.thread.call(lambda: load(compiled.binary))
        with self._lock:
            # A kernel loaded twice keeps its first module: replacing it would unload a module
            # that queued launches may still use.
            self._loaded.setdefault(f"{key}:{name}:{generation}", (module, function, params, attrs))
        return KernelHandle(
            name=name, language="cuda", key=key, backend="cuda", device=str(backend.device),
            generation=generation,
        )  # fmt: skip

    def _entry(self, handle: KernelHandle) -> tuple[Any, Any, list[int] | None, dict[str, int]]:
        if not isinstance(handle, KernelHandle):
            raise InvalidArgumentError(f"expected a KernelHandle; got {type(handle).__name__}")
        self.backend.check_ready()
        if handle.generation != self.backend.generation:
            raise StaleHandleError(
                f"kernel {handle.name!r} was loaded before the CUDA context was rebuilt; load it"
                " again"
            )
        entry = self._loaded.get(f"{handle.key}:{handle.name}:{handle.generation}")
        if entry is None:
            raise StaleHandleError(f"kernel {handle.name!r} was unloaded or belongs elsewhere")
        return entry

    def _dims(
        self, value: Sequence[int], what: str, limits: tuple[int, int, int]
    ) -> tuple[int, ...]:
        dims = check_launch_dims(value, what)
        for d, limit, axis in zip(dims, limits, "xyz", strict=False):
            if d > limit:
                raise InvalidArgumentError(f"{what}.{axis} = {d} exceeds the device limit {limit}")
        return dims

    def _arg(self, value: Any, size: int | None, index: int) -> Any:
        if isinstance(value, Tensor):
            return check_tensor(self.backend, value, f"args[{index}]")  # its array: at launch
        if isinstance(value, DeviceBuffer):
            buf = self.backend.memory_manager.owned_buffer(value, f"args[{index}]")
            return _BufferArg(buf, buf.nbytes, self.backend.device_index)
        if isinstance(value, np.generic):
            if size is not None and value.nbytes != size:
                raise InvalidArgumentError(
                    f"args[{index}]: the kernel's parameter is {size} bytes; got a"
                    f" {value.dtype} ({value.nbytes} bytes)"
                )
            return value
        if isinstance(value, (bool, int, float)):
            kind = bool if isinstance(value, bool) else type(value)
            scalar = _SCALAR.get((kind, size if size is not None else (1 if kind is bool else 4)))
            if scalar is None:
                raise InvalidArgumentError(
                    f"args[{index}]: cannot pass a Python {kind.__name__} as a {size}-byte"
                    " parameter; pass a NumPy scalar of the right type"
                )
            try:
                return scalar(value)
            except OverflowError:
                raise InvalidArgumentError(
                    f"args[{index}] = {value} does not fit {scalar.__name__}"
                ) from None
        raise InvalidArgumentError(
            f"args[{index}]: expected a Tensor, DeviceBuffer, SharedMemory or a scalar; got"
            f" {type(value).__name__}"
        )

    def execute_kernel(
        self, handle: KernelHandle, grid: Sequence[int], block: Sequence[int], args: Sequence[Any]
    ) -> None:
        _, function, params, attrs = self._entry(handle)
        caps = self.backend.capabilities
        g = self._dims(grid, "grid", (2**31 - 1, 65535, 65535))
        b = self._dims(block, "block", (1024, 1024, 64))
        threads = int(np.prod(b))
        max_threads = attrs["max_threads_per_block"]
        if threads > max_threads:
            raise InvalidArgumentError(
                f"block {b} has {threads} threads; kernel {handle.name!r} allows at most"
                f" {max_threads} on {caps.device}"
            )
        if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
            raise InvalidArgumentError("args must be a sequence")
        shared = [a for a in args if isinstance(a, SharedMemory)]
        plain = [a for a in args if not isinstance(a, SharedMemory)]
        if len(shared) > 1:
            raise InvalidArgumentError("at most one SharedMemory argument per launch")
        smem = shared[0].nbytes if shared else 0
        limit = int(caps.extra.get("shared_memory_per_block_optin") or 48 * 1024)
        if smem < 0 or smem > limit:
            raise InvalidArgumentError(f"SharedMemory({smem}) exceeds the device's {limit} bytes")
        if params is not None and len(plain) != len(params):
            raise InvalidArgumentError(
                f"kernel {handle.name!r} takes {len(params)} arguments; got {len(plain)}"
            )
        values = tuple(
            self._arg(a, params[i] if params is not None else None, i) for i, a in enumerate(plain)
        )
        tensors = [a for a in plain if isinstance(a, Tensor)]
        stream = self.current_stream

        def run() -> None:
            if smem > 48 * 1024:
                cupy.cuda.driver.funcSetAttribute(
                    function.ptr, _ATTRS["max_dynamic_shared_size_bytes"], smem
                )
            launch = tuple(_native(v) for v in values)
            function(g, b, launch, shared_mem=smem, stream=stream.cp)

        self.launch(run, tensors, tensors, keepalive=values, what=f"kernel {handle.name!r}")

    def kernel_info(self, handle: KernelHandle) -> KernelInfo:
        _, _, params, attrs = self._entry(handle)
        return KernelInfo(
            name=handle.name,
            max_threads_per_block=attrs["max_threads_per_block"],
            registers=attrs["num_regs"],
            shared_memory_bytes=attrs["shared_size_bytes"],
            extra={**attrs, "arch": self.backend._arch, "parameter_bytes": params},
        )

    def unload_kernel(self, handle: KernelHandle) -> None:
        """Forget the kernel. Its module is unloaded (``cuModuleUnload``, by CuPy, when the
        module object goes) only after the launches queued so far on every stream have
        completed: each stream holds it until the position queued now has completed, and its
        completer thread drops it then (no CUDA call on the loop's thread)."""
        entry = self._entry(handle)
        with self._lock:
            self._loaded.pop(f"{handle.key}:{handle.name}:{handle.generation}", None)
        for stream in self.backend.streams:
            stream.hold((entry,))
