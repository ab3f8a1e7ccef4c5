"""``KernelExecutor``: compiling and launching user kernels, for backends that compile.

Compilation is a coroutine (it may take seconds and runs off the event loop); programs are cached
in memory and on disk keyed by source, options and device. Launches are submissions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["KernelExecutor", "KernelHandle", "KernelInfo"]


class KernelHandle(BaseModel):
    """A compiled kernel, valid until unloaded or until its context is rebuilt."""

    model_config = ConfigDict(frozen=True)

    name: str
    language: str
    key: str = Field(description="cache key: hash of source, options and device")
    backend: str
    device: str
    generation: int = 0


class KernelInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    max_threads_per_block: int = 0
    registers: int = 0
    shared_memory_bytes: int = 0
    extra: dict[str, Any] = Field(default_factory=dict)


class KernelExecutor(ABC):
    """Compiles and runs user kernels (None on backends that compile nothing)."""

    languages: frozenset[str] = frozenset()

    @abstractmethod
    async def load_kernel(
        self, source: str, name: str, *, language: str, options: Sequence[str] = ()
    ) -> KernelHandle:
        """Compile (or fetch from cache) kernel ``name`` of ``source``; KernelCompileError with
        the compiler's log on failure."""

    @abstractmethod
    def execute_kernel(
        self,
        handle: KernelHandle,
        grid: Sequence[int],
        block: Sequence[int],
        args: Sequence[Any],
    ) -> None:
        """Submit a launch on the current stream."""

    @abstractmethod
    def kernel_info(self, handle: KernelHandle) -> KernelInfo: ...

    @abstractmethod
    def unload_kernel(self, handle: KernelHandle) -> None: ...

    def dispatch_compute(
        self,
        shader: bytes | str,
        bindings: Sequence[Any],
        push_constants: bytes = b"",
        workgroups: Sequence[int] = (1, 1, 1),
    ) -> None:
        """Run a SPIR-V or WGSL compute shader (backends that take them)."""
        from accelkit.errors import UnsupportedOperationError

        raise UnsupportedOperationError(f"{type(self).__name__} does not dispatch compute shaders")
