"""NVRTC through ctypes, and the on-disk cache of compiled kernels.

The backend compiles CUDA C++ itself rather than through CuPy's ``RawModule`` so that the cache
key is exactly what the contract names (source, options, device architecture, NVRTC's CUDA
version) and so that compilation needs no GPU: the test suite compiles every kernel of this
package on a machine without one (``pip install nvidia-cuda-nvrtc-cu12`` provides the library).

Cache entries are CUBIN files named by the key's hash, written to a temporary file and renamed
into place (atomic: concurrent processes never read half an entry). Each starts with a header
holding the hash of its body, so a truncated or corrupt entry is detected, deleted and rebuilt.
The folder is ``$ACCELKIT_CUDA_CACHE``, or ``cuda/`` under :func:`accelkit.calibration.cache_dir`.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import hashlib
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accelkit.errors import KernelCompileError
from accelkit.sdk import env_str

__all__ = [
    "Compiled",
    "NVRTCUnavailable",
    "RawProgram",
    "cache_folder",
    "compile_cuda",
    "compile_cached",
    "nvrtc_version",
]

_log = logging.getLogger("accelkit.cuda")

_MAGIC = b"AKCUBIN1"


class NVRTCUnavailable(RuntimeError):
    """The NVRTC library could not be found or loaded."""


def _candidates() -> list[str]:
    names = [f"libnvrtc.so.{v}" for v in (13, 12, 11)] + ["libnvrtc.so"]
    # The pip wheels (nvidia-cuda-nvrtc-cu12, nvidia-cuda-nvrtc) put it in site-packages.
    for base in sys.path:
        for pattern in ("nvidia/cuda_nvrtc/lib/libnvrtc.so*", "nvidia/cu13/lib/libnvrtc.so*"):
            names.extend(sorted(glob.glob(os.path.join(base, pattern)), reverse=True))
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    names.extend(sorted(glob.glob(os.path.join(cuda_home, "lib64", "libnvrtc.so*")), reverse=True))
    return [n for n in names if "builtins" not in os.path.basename(n) and "alt" not in n]


_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()


def _nvrtc() -> ctypes.CDLL:
    global _lib
    with _lib_lock:
        if _lib is None:
            tried = []
            for name in _candidates():
                try:
                    lib = ctypes.CDLL(name)
                    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
                    _lib = lib
                    break
                except (OSError, AttributeError):
                    tried.append(name)
            else:
                raise NVRTCUnavailable(
                    "NVRTC (libnvrtc) was not found: install the CUDA toolkit, or"
                    " pip install nvidia-cuda-nvrtc-cu12 (or nvidia-cuda-nvrtc for CUDA 13)"
                )
        return _lib


def nvrtc_version() -> tuple[int, int]:
    lib = _nvrtc()
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


class Compiled:
    """A compiled program: the CUBIN (or PTX where NVRTC cannot emit CUBIN) and the log."""

    def __init__(self, binary: bytes, kind: str, log: str, key: str) -> None:
        self.binary = binary
        self.kind = kind  # "cubin" or "ptx"
        self.log = log
        self.key = key


def _check(lib: ctypes.CDLL, code: int, what: str) -> None:
    if code != 0:
        raise KernelCompileError(f"NVRTC {what} failed: {lib.nvrtcGetErrorString(code).decode()}")


def compile_cuda(
    source: str, arch: str, options: Sequence[str] = (), name: str = "kernel.cu"
) -> Compiled:
    """Compile ``source`` for ``arch`` (e.g. ``"sm_90"``); KernelCompileError carries the log."""
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    _check(
        lib,
        lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
        "nvrtcCreateProgram",
    )
    try:
        opts = [f"--gpu-architecture={arch}", "--std=c++17", *options]
        argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        code = lib.nvrtcCompileProgram(prog, len(opts), argv)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(max(size.value, 1))
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace").strip()
        if code != 0:
            raise KernelCompileError(
                f"CUDA kernel {name!r} failed to compile for {arch}"
                f" ({lib.nvrtcGetErrorString(code).decode()})",
                log=log,
            )
        kind = "cubin" if arch.startswith("sm_") else "ptx"
        get_size = lib.nvrtcGetCUBINSize if kind == "cubin" else lib.nvrtcGetPTXSize
        get = lib.nvrtcGetCUBIN if kind == "cubin" else lib.nvrtcGetPTX
        _check(lib, get_size(prog, ctypes.byref(size)), "get size")
        out = ctypes.create_string_buffer(size.value)
        _check(lib, get(prog, out), "get binary")
        return Compiled(out.raw[: size.value], kind, log, "")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def cache_folder() -> Path:
    override = env_str("ACCELKIT_CUDA_CACHE")
    if override:
        return Path(override)
    from accelkit.calibration import cache_dir

    return cache_dir() / "cuda"


def cache_key(source: str, arch: str, options: Sequence[str]) -> str:
    version = ".".join(map(str, nvrtc_version()))
    text = "\0\0".join((source, "\0".join(options), arch, f"nvrtc {version}"))
    return hashlib.sha256(text.encode()).hexdigest()


def _read(path: Path) -> bytes | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    head = len(_MAGIC) + 32
    body = data[head:]
    if data[: len(_MAGIC)] != _MAGIC or data[len(_MAGIC) : head] != hashlib.sha256(body).digest():
        with contextlib.suppress(OSError):
            path.unlink()  # corrupt or truncated: rebuilt below
        return None
    return body


def _write(path: Path, body: bytes) -> None:
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + hashlib.sha256(body).digest() + body)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


#: Where each result came from, for tests and `accelkit doctor`.
hits = {"disk": 0, "compiled": 0}


def compile_cached(
    source: str, arch: str, options: Sequence[str] = (), name: str = "kernel.cu"
) -> Compiled:
    """:func:`compile_cuda` through the disk cache (see the module docstring)."""
    key = cache_key(source, arch, options)
    kind = "cubin" if arch.startswith("sm_") else "ptx"
    path = cache_folder() / f"{key}.{kind}"
    body = _read(path)
    if body is not None:
        hits["disk"] += 1
        return Compiled(body, kind, "", key)
    compiled = compile_cuda(source, arch, options, name)
    compiled.key = key
    _write(path, compiled.binary)
    hits["compiled"] += 1
    return compiled


class RawProgram:
    """A program of raw NVRTC kernels for one backend: :meth:`_compile` builds :attr:`SOURCE`
    (from the disk cache when it holds it) on the calling thread, off the loop, and queues the
    module's load for the submission thread, where :meth:`_lookup` names its functions. Until
    then, and for good if compiling or loading failed (:attr:`error`), ``ready`` is false and
    callers take their fallback. ``<SWITCH>=0`` in the environment switches it off."""

    SOURCE: str = ""
    FILENAME: str = ""
    SWITCH: str = ""
    #: What the fallback is, for the log line when the program is unavailable.
    FALLBACK: str = ""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self._functions: dict[Any, Any] = {}
        self._module: Any = None
        #: Why the kernels are not used (switched off, compiling or loading failed), or None.
        self.error: BaseException | None = None

    @property
    def ready(self) -> bool:
        """True once the kernels are loaded."""
        return bool(self._functions)

    def _lookup(self, module: Any) -> dict[Any, Any]:
        raise NotImplementedError

    async def load(self) -> None:
        """Compile (on a worker thread, from the disk cache when it holds it) and load (on the
        submission thread); returns once the kernels are loaded or have failed."""
        import anyio

        await anyio.to_thread.run_sync(self._compile)
        await self._backend.thread.call(lambda: None)  # after the load _compile queued

    def _compile(self) -> None:
        if env_str(self.SWITCH) == "0":
            self.error = RuntimeError(f"switched off ({self.SWITCH}=0)")
            return
        backend = self._backend
        try:
            compiled = compile_cached(self.SOURCE, backend._arch, (), self.FILENAME)
            backend.thread.submit(lambda: self._load(compiled.binary))
        except Exception as exc:  # no NVRTC, an unknown architecture, a backend shut down
            self.error = exc
            _log.info("%s is unavailable; %s", self.FILENAME, self.FALLBACK, exc_info=True)

    def _load(self, binary: bytes) -> None:
        """On the submission thread: load the module and look up its kernels."""
        try:
            import cupy

            module = cupy.cuda.function.Module()
            module.load(binary)
            functions = self._lookup(module)
        except Exception as exc:
            self.error = exc
            _log.info("%s could not be loaded; %s", self.FILENAME, self.FALLBACK, exc_info=True)
            return
        self._module = module  # the functions live as long as their module
        self._functions = functions
