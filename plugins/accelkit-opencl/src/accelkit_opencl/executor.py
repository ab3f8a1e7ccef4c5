"""The KernelExecutor for user kernels (OpenCL C, or SPIR-V where the device takes it).

Programs come from :class:`~accelkit_opencl.programs.ProgramCache` (memory, disk, compiler); a
build that fails, yields no kernel or logs errors raises KernelCompileError with the log.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np
import pyopencl as cl

from accelkit.errors import (
    InvalidArgumentError,
    StaleHandleError,
    UnsupportedOperationError,
)
from accelkit.sdk import (
    DeviceBuffer,
    KernelExecutor,
    KernelHandle,
    KernelInfo,
    check_launch_dims,
    check_tensor,
    storage,
)
from accelkit.tensor import Tensor
from accelkit_opencl.programs import (
    ProgramCache,
    enqueue_kernel,
    program_kernel_names,
)
from accelkit_opencl.stream import cl_errors
from accelkit_opencl.submit import CLComponent

if TYPE_CHECKING:
    from accelkit_opencl.backend import OpenCLBackend

__all__ = ["LocalMemory", "OpenCLKernelExecutor"]

#: A ``__local`` kernel argument of the given size in bytes (``LocalMemory(4096)``).
LocalMemory = cl.LocalMemory

_SCALARS = {
    "char": np.int8, "uchar": np.uint8, "short": np.int16, "ushort": np.uint16,
    "int": np.int32, "uint": np.uint32, "long": np.int64, "ulong": np.uint64,
    "float": np.float32, "double": np.float64, "half": np.float16, "size_t": np.uint64,
    "bool": np.uint8,
}  # fmt: skip


_SPIRV_MAGIC_LE = (0x07230203).to_bytes(4, "little")
_SPIRV_MAGIC_BE = (0x07230203).to_bytes(4, "big")


def il_versions(device: Any) -> str:
    """The intermediate languages ``device`` accepts (e.g. "SPIR-V_1.2"), "" if none."""
    try:
        return str(device.il_version).strip()
    except (cl.Error, AttributeError):
        return ""


def _arg_types(kernel: Any) -> list[tuple[str, int]] | None:
    """(type name, address qualifier) per argument, or None where the program carries no
    argument info (SPIR-V modules usually do not)."""
    types = []
    try:
        for i in range(kernel.num_args):
            type_name = str(kernel.get_arg_info(i, cl.kernel_arg_info.TYPE_NAME)).strip()
            qualifier = kernel.get_arg_info(i, cl.kernel_arg_info.ADDRESS_QUALIFIER)
            types.append((type_name, int(qualifier)))
    except cl.Error:
        return None
    return types


class _Loaded:
    __slots__ = ("arg_types", "kernel", "program")

    def __init__(self, program: Any, kernel: Any, arg_types: list[tuple[str, int]] | None) -> None:
        self.program = program
        self.kernel = kernel
        self.arg_types = arg_types


class OpenCLKernelExecutor(CLComponent, KernelExecutor):
    """User kernels in OpenCL C (``language="opencl"``).

    ``execute_kernel(handle, grid, block, args)`` takes CUDA's convention: ``grid`` counts
    work-groups per dimension and ``block`` is the work-group size, so the global size is
    ``grid * block``. Arguments: Tensors and DeviceBuffers for ``__global`` pointers,
    :data:`LocalMemory` for ``__local`` ones, Python or NumPy numbers for scalars (converted to
    the declared type). Every tensor argument is treated as read and written.
    """

    languages = frozenset({"opencl", "spirv"})

    def __init__(self, backend: OpenCLBackend) -> None:
        super().__init__(backend)
        self._loaded: dict[tuple[str, str], _Loaded] = {}
        self.languages = frozenset(
            {"opencl", "spirv"} if il_versions(backend._cl_device) else {"opencl"}
        )

    @property
    def programs(self) -> ProgramCache:
        return self.backend._programs

    async def load_kernel(
        self, source: str, name: str, *, language: str = "opencl", options: Sequence[str] = ()
    ) -> KernelHandle:
        self.backend.check_ready()
        if language not in ("opencl", "spirv"):
            raise UnsupportedOperationError(
                f"the opencl backend takes OpenCL C (language='opencl') or SPIR-V"
                f" (language='spirv'); got {language!r}"
            )
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError("load_kernel: name must be a non-empty string")
        if isinstance(options, str) or not all(isinstance(o, str) for o in options):
            raise InvalidArgumentError("load_kernel: options must be a sequence of strings")
        if language == "spirv":
            return await self._load_spirv(source, name, options)
        if not isinstance(source, str) or not source:
            raise InvalidArgumentError("load_kernel: OpenCL C source must be a non-empty string")
        opts = (*options, "-cl-kernel-arg-info")
        key, program = await anyio.to_thread.run_sync(self.programs.get, source, opts)
        try:
            kernel = cl.Kernel(program, name)
        except cl.Error:
            names = ";".join(program_kernel_names(program))
            raise InvalidArgumentError(
                f"load_kernel: the program has no kernel {name!r}; it defines: {names}"
            ) from None
        return self._register(key, name, "opencl", program, kernel, _arg_types(kernel))

    async def _load_spirv(self, il: Any, name: str, options: Sequence[str]) -> KernelHandle:
        if not isinstance(il, bytes | bytearray | memoryview):
            raise InvalidArgumentError(
                f"load_kernel: a SPIR-V module is bytes; got {type(il).__name__}"
            )
        il = bytes(il)
        if len(il) < 20 or len(il) % 4 or il[:4] not in (_SPIRV_MAGIC_LE, _SPIRV_MAGIC_BE):
            raise InvalidArgumentError(
                "load_kernel: not a SPIR-V module (no SPIR-V magic number 0x07230203, or a"
                " length that is not a whole number of 32-bit words)"
            )
        device = self.backend._cl_device
        if not il_versions(device):
            raise UnsupportedOperationError(
                f"{self.backend.device} ({device.name.strip()}) accepts no intermediate language:"
                " it reports no CL_DEVICE_IL_VERSION (OpenCL 2.1 / cl_khr_il_program); pass"
                " OpenCL C source instead"
            )
        key, program = await anyio.to_thread.run_sync(self.programs.get, il, tuple(options))
        try:
            kernel = cl.Kernel(program, name)
        except cl.Error:
            raise InvalidArgumentError(
                f"load_kernel: the SPIR-V module has no kernel {name!r}"
            ) from None
        return self._register(key, name, "spirv", program, kernel, _arg_types(kernel))

    def _register(
        self, key: str, name: str, language: str, program: Any, kernel: Any,
        arg_types: list[tuple[str, int]] | None,
    ) -> KernelHandle:  # fmt: skip
        self._loaded[(key, name)] = _Loaded(program, kernel, arg_types)
        return KernelHandle(
            name=name,
            language=language,
            key=key,
            backend="opencl",
            device=str(self.backend.device),
            generation=self.backend.generation,
        )

    def _get(self, handle: KernelHandle) -> _Loaded:
        self.backend.check_ready()
        if not isinstance(handle, KernelHandle):
            raise InvalidArgumentError(f"expected a KernelHandle; got {type(handle).__name__}")
        loaded = self._loaded.get((handle.key, handle.name))
        if loaded is None or handle.generation != self.backend.generation:
            raise StaleHandleError(
                f"kernel {handle.name!r} was unloaded, or belongs to another backend or context"
            )
        return loaded

    def execute_kernel(
        self,
        handle: KernelHandle,
        grid: Sequence[int],
        block: Sequence[int],
        args: Sequence[Any],
    ) -> None:
        loaded = self._get(handle)
        device = self.backend._cl_device
        grid_t, block_t = check_launch_dims(grid, "grid"), check_launch_dims(block, "block")
        if len(grid_t) != len(block_t):
            raise InvalidArgumentError(
                f"execute_kernel: grid {grid_t} and block {block_t} have different ranks"
            )
        with cl_errors(str(self.backend._device_obj)):
            limits = device.max_work_item_sizes
            group = 1
            for i, b in enumerate(block_t):
                group *= b
                if b > limits[i]:
                    raise InvalidArgumentError(
                        f"execute_kernel: block[{i}]={b} exceeds the device's limit {limits[i]}"
                    )
            max_group = loaded.kernel.get_work_group_info(
                cl.kernel_work_group_info.WORK_GROUP_SIZE, device
            )
            if group > max_group:
                raise InvalidArgumentError(
                    f"execute_kernel: a block of {group} work-items exceeds the {max_group} this"
                    f" kernel allows on {device.name.strip()}"
                )
            num_args = int(loaded.kernel.num_args)
        if len(args) != num_args:
            raise InvalidArgumentError(
                f"execute_kernel: {handle.name} takes {num_args} arguments; got {len(args)}"
            )
        values: list[Any] = []
        tensors: list[Tensor] = []
        keep: list[Any] = []
        for i, arg in enumerate(args):
            if loaded.arg_types is None:
                values.append(self._untyped_arg(i, arg, tensors, keep))
            else:
                type_name, qualifier = loaded.arg_types[i]
                values.append(self._arg(i, arg, type_name, qualifier, tensors, keep))
        global_size = tuple(g * b for g, b in zip(grid_t, block_t, strict=True))
        kernel = loaded.kernel

        def launch(queue: Any, wait_for: list[Any] | None) -> Any:
            return enqueue_kernel(queue, kernel, values, global_size, block_t, wait_for)

        self.launch(launch, tensors, tensors, keepalive=(*keep, loaded))

    def _untyped_arg(self, i: int, arg: Any, tensors: list[Tensor], keep: list[Any]) -> Any:
        """An argument of a kernel without argument info (SPIR-V): taken by its own type."""
        if isinstance(arg, Tensor | DeviceBuffer):
            return self._arg(i, arg, "void*", 0, tensors, keep)
        if isinstance(arg, cl.LocalMemory | np.generic):
            return arg
        raise InvalidArgumentError(
            f"execute_kernel: argument {i}: this kernel carries no argument types (SPIR-V), so"
            f" scalars must be NumPy scalars of the parameter's type (np.float32(x), np.int32(n));"
            f" got {type(arg).__name__}"
        )

    def _arg(
        self,
        i: int,
        arg: Any,
        type_name: str,
        qualifier: int,
        tensors: list[Tensor],
        keep: list[Any],
    ) -> Any:
        aq = cl.kernel_arg_address_qualifier
        if qualifier == aq.LOCAL:
            if not isinstance(arg, cl.LocalMemory):
                raise InvalidArgumentError(
                    f"execute_kernel: argument {i} is __local {type_name}; pass LocalMemory(nbytes)"
                )
            return arg
        if type_name.endswith("*"):
            if isinstance(arg, Tensor):
                check_tensor(self.backend, arg, f"args[{i}]")
                tensors.append(arg)
                return storage(arg)
            if isinstance(arg, DeviceBuffer):
                self.backend.memory_manager.owned_buffer(arg, f"args[{i}]")  # live and ours
                keep.append(arg)
                return arg.handle
            raise InvalidArgumentError(
                f"execute_kernel: argument {i} is a pointer ({type_name}); pass a Tensor or a"
                f" DeviceBuffer, not {type(arg).__name__}"
            )
        scalar = _SCALARS.get(type_name)
        if scalar is None:
            raise InvalidArgumentError(
                f"execute_kernel: argument {i} has type {type_name}, which cannot be passed"
            )
        if isinstance(arg, Tensor | DeviceBuffer) or not isinstance(
            arg, int | float | np.number | np.bool_
        ):
            raise InvalidArgumentError(
                f"execute_kernel: argument {i} is a {type_name} scalar; got {type(arg).__name__}"
            )
        if isinstance(arg, float) and np.dtype(scalar).kind in "iu":
            raise InvalidArgumentError(
                f"execute_kernel: argument {i} is an integer ({type_name}); got the float {arg}"
            )
        return np.array(arg).astype(scalar)[()]

    def kernel_info(self, handle: KernelHandle) -> KernelInfo:
        loaded = self._get(handle)
        device = self.backend._cl_device
        info = cl.kernel_work_group_info

        def query(what: Any) -> int:
            """A work-group property (None: the argument count); 0 where the driver fails."""
            try:
                if what is None:
                    return int(loaded.kernel.num_args)
                return int(loaded.kernel.get_work_group_info(what, device))
            except cl.Error:
                return 0

        return KernelInfo(
            name=handle.name,
            max_threads_per_block=query(info.WORK_GROUP_SIZE),
            shared_memory_bytes=query(info.LOCAL_MEM_SIZE),
            extra={
                "preferred_work_group_size_multiple": query(
                    info.PREFERRED_WORK_GROUP_SIZE_MULTIPLE
                ),
                "private_mem_bytes": query(info.PRIVATE_MEM_SIZE),
                "num_args": query(None),
                "arg_types": None if loaded.arg_types is None else [t for t, _ in loaded.arg_types],
            },
        )

    def unload_kernel(self, handle: KernelHandle) -> None:
        self._get(handle)
        self._loaded.pop((handle.key, handle.name), None)
        if not any(k == handle.key for k, _ in self._loaded):
            self.programs.forget(handle.key)

    def release(self) -> None:
        """Drop every loaded kernel and its program (at shutdown, before the program cache: the
        driver releases kernels before their programs)."""
        self._loaded.clear()
