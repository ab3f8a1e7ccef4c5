"""Built OpenCL programs: where caches live, the program cache, and references to kernels.

**Where.** In :func:`~accelkit_opencl.caches.cache_folder`, accelkit's, per plugin version. It
holds program binaries (``<key>.bin``), the verdicts of
kernel-variant verification (``variants.json``, :mod:`accelkit_opencl.variants`) and PoCL's own
kernel cache (``pocl/``; :mod:`accelkit_opencl.caches`).

**The program cache.** Programs are cached in memory and on disk, keyed by a hash of the source,
the build options and the device (platform, name, driver version). Disk entries are written to a
temporary file and renamed into place (atomic: concurrent processes never read a half-written
entry). An entry that fails to load, or loads with no kernels, is deleted and rebuilt from source.
A build that fails, that yields no kernels, or whose log reports errors raises
:class:`~accelkit.errors.KernelCompileError` with the log.

**Kernel references.** Internal kernels are referenced by :class:`KernelRef`, which builds its
program on first use. Submissions create references at once and the build happens where the
command is enqueued, off the event loop's thread (:mod:`accelkit_opencl.stream`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyopencl as cl

from accelkit.errors import KernelCompileError
from accelkit.sdk import env_str
from accelkit_opencl.caches import cache_folder

__all__ = [
    "KernelRef",
    "ProgramCache",
    "enqueue_kernel",
]


#: Lines of a build log that report an error (clang's ``error:``; some drivers' ``ERROR:``).
_LOG_ERROR = re.compile(r"(^|\s)(error|ERROR|fatal error):")

#: Kernel objects carry their arguments as state: setting them and enqueuing is one step, and
#: streams enqueue from their own threads.
_LAUNCH_LOCK = threading.Lock()


def program_kernel_names(program: Any) -> list[str]:
    try:
        names = str(program.get_info(cl.program_info.KERNEL_NAMES))
    except cl.Error:
        return []
    return [n for n in names.split(";") if n]


def build_log(program: Any, device: Any) -> str:
    try:
        return str(program.get_build_info(device, cl.program_build_info.LOG)).strip()
    except cl.Error:
        return ""


_CL_PROGRAM_BINARY_SIZES = 0x1165
_CL_PROGRAM_BINARIES = 0x1166
_libopencl: Any = None


def _opencl_library() -> Any:
    """The OpenCL ICD loader PyOpenCL itself uses (its wheel bundles one), through ctypes."""
    global _libopencl
    if _libopencl is None:
        import ctypes
        import ctypes.util
        import glob

        folder = os.path.join(os.path.dirname(cl.__file__), ".libs")
        names = sorted(glob.glob(os.path.join(folder, "libOpenCL*.so*")))
        names += [n for n in (ctypes.util.find_library("OpenCL"), "libOpenCL.so.1") if n]
        for name in names:
            try:
                _libopencl = ctypes.CDLL(name)
                break
            except OSError:
                continue
        else:
            _libopencl = False
    return _libopencl


def program_binary(program: Any) -> bytes:
    """The device binary of a program built for one device.

    On PoCL, asking for the binary runs the code generator (seconds for a large kernel), and
    PyOpenCL's ``get_info`` holds the GIL through it, which stalls every other thread, the event
    loop's included. A ctypes call releases the GIL, so this asks the loader directly and falls
    back to PyOpenCL only where the loader cannot be found."""
    import ctypes

    lib = _opencl_library()
    if not lib:
        return bytes(program.get_info(cl.program_info.BINARIES)[0])
    handle = ctypes.c_void_p(program.int_ptr)
    size = ctypes.c_size_t(0)
    status = lib.clGetProgramInfo(
        handle, ctypes.c_uint(_CL_PROGRAM_BINARY_SIZES), ctypes.c_size_t(ctypes.sizeof(size)),
        ctypes.byref(size), None,
    )  # fmt: skip
    if status != 0 or size.value == 0:
        return b""
    data = ctypes.create_string_buffer(size.value)
    pointers = (ctypes.c_void_p * 1)(ctypes.cast(data, ctypes.c_void_p))
    status = lib.clGetProgramInfo(
        handle, ctypes.c_uint(_CL_PROGRAM_BINARIES), ctypes.c_size_t(ctypes.sizeof(pointers)),
        pointers, None,
    )  # fmt: skip
    return data.raw if status == 0 else b""


class _NoKernels(Exception):
    """A build that succeeded with no kernels in it (see :meth:`ProgramCache._compile`)."""

    def __init__(self, log: str) -> None:
        super().__init__(log)
        self.log = log


class ProgramCache:
    """Built programs of one context and device, from memory, disk, or the compiler."""

    def __init__(self, context: Any, device: Any) -> None:
        self.context = context
        self.device = device
        self._device_id = "\0".join(
            s.strip()
            for s in (device.platform.name, device.name, device.driver_version, device.version)
        )
        self._programs: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._rebuilds = 0
        self.hits = {"memory": 0, "disk": 0, "compiled": 0, "discarded": 0}
        #: Programs go to disk unless ``ACCELKIT_OPENCL_PROGRAM_CACHE=0`` (the verifying child).
        self.persistent = env_str("ACCELKIT_OPENCL_PROGRAM_CACHE") not in ("0", "false", "no")

    def key(self, source: str | bytes, options: Sequence[str]) -> str:
        if isinstance(source, bytes):  # SPIR-V: the module's bytes
            head = b"spirv\0" + hashlib.sha256(source).digest()
            source = head.hex()
        text = "\0\0".join((source, "\0".join(options), self._device_id))
        return hashlib.sha256(text.encode()).hexdigest()

    def get(self, source: str | bytes, options: Sequence[str] = ()) -> tuple[str, Any]:
        """``(key, program)`` for OpenCL C (``str``) or a SPIR-V module (``bytes``); raises
        KernelCompileError with the build log."""
        key = self.key(source, options)
        with self._lock:
            program = self._programs.get(key)
        if program is not None:
            self.hits["memory"] += 1
            return key, program
        program = self._load(key, options)
        if program is None:
            program = self._compile(source, options)
            self._store(key, program)
            self.hits["compiled"] += 1
        else:
            self.hits["disk"] += 1
        with self._lock:
            program = self._programs.setdefault(key, program)
        return key, program

    def rebuild(self, source: str | bytes, options: Sequence[str] = ()) -> tuple[str, Any]:
        """Build ``source`` again from scratch after its cached program proved bad (it yields no
        kernel): the disk entry is deleted, and the compiler is asked with an extra define, so
        that a driver-side cache keyed by source and options (PoCL's) cannot hand the same bad
        entry back."""
        key = self.key(source, options)
        self.discard(key)
        salt = self._salt()
        program = self._compile(source, (*options, salt) if isinstance(source, str) else options)
        self._store(key, program)
        self.hits["compiled"] += 1
        with self._lock:
            self._programs[key] = program
        return key, program

    def _salt(self) -> str:
        """A define that makes a build's options new to any driver-side cache."""
        with self._lock:
            self._rebuilds += 1
            return f"-DACCELKIT_REBUILD={self._rebuilds}"

    def forget(self, key: str) -> None:
        with self._lock:
            self._programs.pop(key, None)

    def discard(self, key: str) -> None:
        """Forget ``key`` in memory and on disk."""
        self.forget(key)
        self.hits["discarded"] += 1
        with contextlib.suppress(OSError):
            self._path(key).unlink()

    def clear(self) -> None:
        """Drop every program (at shutdown, before the context goes)."""
        with self._lock:
            self._programs.clear()

    def _path(self, key: str) -> Path:
        return cache_folder() / f"{key}.bin"

    def _load(self, key: str, options: Sequence[str]) -> Any | None:
        if not self.persistent:
            return None
        path = self._path(key)
        try:
            binary = path.read_bytes()
        except OSError:
            return None
        try:
            program = cl.Program(self.context, [self.device], [binary])
            program.build(options=list(options), devices=[self.device])
            if program_kernel_names(program):
                return program
        except (cl.Error, ValueError):
            pass
        # A corrupt, foreign or empty entry: drop it, and build from source.
        self.hits["discarded"] += 1
        with contextlib.suppress(OSError):
            path.unlink()
        return None

    def _compile(self, source: str | bytes, options: Sequence[str]) -> Any:
        """Build from source. A build that yields no kernels although the source defines some
        is what a driver-side cache poisoned by a crashed compiler gives (PoCL's is keyed by
        source and options): it is built once more with an extra define, which misses that
        entry, before KernelCompileError is raised."""
        try:
            return self._build(source, options)
        except _NoKernels:
            try:
                return self._build(source, (*options, self._salt()))
            except _NoKernels as exc:
                raise KernelCompileError(
                    f"OpenCL program built on {self.device.name.strip()} with no kernels in it"
                    " (a broken compiler or driver cache), twice",
                    log=exc.log,
                ) from None

    def _build(self, source: str | bytes, options: Sequence[str]) -> Any:
        # PyOpenCL creates SPIR-V programs with clCreateProgramWithIL (it checks the magic).
        name = self.device.name.strip()
        program: Any = None
        try:
            program = cl.Program(self.context, source)
            # cache_dir=False: accelkit caches binaries itself (PyOpenCL's stub says str | None)
            program.build(options=list(options), devices=[self.device], cache_dir=False)
        except cl.Error as exc:
            log = build_log(program, self.device) if program is not None else ""
            raise KernelCompileError(
                f"OpenCL program failed to build on {name}", log=log or str(exc)
            ) from None
        log = build_log(program, self.device)
        if _LOG_ERROR.search(log):
            raise KernelCompileError(
                f"OpenCL program built on {name}, but the build log reports errors", log=log
            )
        if isinstance(source, str) and "__kernel" in source and not program_kernel_names(program):
            raise _NoKernels(log)
        return program

    def _store(self, key: str, program: Any) -> None:
        if not self.persistent:
            return
        try:
            binary = program_binary(program)
        except cl.Error:
            return
        if not binary:
            return
        folder = cache_folder()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(binary)
                os.replace(tmp, self._path(key))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError:
            pass  # an unwritable cache costs a compile next time, nothing else


class KernelRef:
    """Kernel ``name`` of the generated program ``source``, built on first :meth:`get` (once per
    backend; the program comes from the cache where it can)."""

    __slots__ = ("_kernel", "_kernels", "_lock", "_programs", "gate", "name", "source")

    def __init__(
        self, programs: ProgramCache, kernels: dict[tuple[str, str], Any], source: str, name: str
    ) -> None:
        self._programs = programs
        self._kernels = kernels
        self._lock = threading.Lock()
        self.source = source
        self.name = name
        self._kernel: Any = kernels.get((source, name))
        #: Called before the first build (may wait, or raise why this kernel cannot be built).
        self.gate: Callable[[], None] | None = None

    def get(self) -> Any:
        kernel = self._kernel
        if kernel is not None:
            return kernel
        with self._lock:
            kernel = self._kernels.get((self.source, self.name))
            if kernel is None:
                if self.gate is not None:
                    self.gate()
                kernel = self._build()
                self._kernels[(self.source, self.name)] = kernel
            self._kernel = kernel
            return kernel

    def _build(self) -> Any:
        _, program = self._programs.get(self.source)
        try:
            return cl.Kernel(program, self.name)
        except cl.Error:
            pass
        # The program has no such kernel although its source defines it: a poisoned cache entry
        # (accelkit's or the driver's). Build it again from scratch, once.
        _, program = self._programs.rebuild(self.source)
        try:
            return cl.Kernel(program, self.name)
        except cl.Error as exc:
            raise KernelCompileError(
                f"OpenCL program built without its kernel {self.name!r}: {exc}",
                log=build_log(program, self._programs.device),
            ) from None


def enqueue_kernel(
    queue: Any,
    kernel: KernelRef | Any,
    args: Sequence[Any],
    global_size: tuple[int, ...],
    local: Any,
    wait_for: list[Any] | None = None,
) -> Any:
    """Set ``kernel``'s arguments and enqueue it (building it first if it is a reference)."""
    k = kernel.get() if isinstance(kernel, KernelRef) else kernel
    with _LAUNCH_LOCK:
        k.set_args(*args)
        return cl.enqueue_nd_range_kernel(queue, k, global_size, local, wait_for=wait_for)
