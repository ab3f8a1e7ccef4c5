"""The CUDA driver library through ctypes: enough to count devices and read their properties.

This is what the probe uses, so that listing devices never imports CuPy (a second or more, and
hundreds of MiB of libraries). It creates no context: ``cuInit`` plus attribute queries only.
On a machine without the driver, :func:`driver` raises :class:`DriverUnavailable` with the reason.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from dataclasses import dataclass, field

__all__ = ["Attr", "DeviceProps", "Driver", "DriverUnavailable", "driver", "read_devices"]


class DriverUnavailable(RuntimeError):
    """No usable CUDA driver (library missing, cuInit failed, no device): says which."""


class Attr:
    """``CUdevice_attribute`` values (cuda.h); stable across CUDA versions."""

    MAX_THREADS_PER_BLOCK = 1
    MAX_SHARED_MEMORY_PER_BLOCK = 8
    WARP_SIZE = 10
    CLOCK_RATE = 13  # kHz
    MULTIPROCESSOR_COUNT = 16
    PCI_BUS_ID = 33
    MEMORY_CLOCK_RATE = 36  # kHz
    GLOBAL_MEMORY_BUS_WIDTH = 37  # bits
    L2_CACHE_SIZE = 38
    UNIFIED_ADDRESSING = 41
    COMPUTE_CAPABILITY_MAJOR = 75
    COMPUTE_CAPABILITY_MINOR = 76
    MANAGED_MEMORY = 83
    MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
    MEMORY_POOLS_SUPPORTED = 115


@dataclass(frozen=True)
class DeviceProps:
    """What the driver says about one device (everything the capabilities are computed from)."""

    index: int
    name: str
    total_memory: int
    attributes: dict[int, int] = field(default_factory=dict)
    driver_version: int = 0  # e.g. 12040 for CUDA 12.4

    def attr(self, attr: int, default: int = 0) -> int:
        return self.attributes.get(attr, default)

    @property
    def compute_capability(self) -> tuple[int, int]:
        return self.attr(Attr.COMPUTE_CAPABILITY_MAJOR), self.attr(Attr.COMPUTE_CAPABILITY_MINOR)


_QUERIED = [v for k, v in vars(Attr).items() if not k.startswith("_")]
_LIBRARIES = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")


class Driver:
    """A loaded CUDA driver library (``libcuda``), initialized with ``cuInit(0)``."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        self._check(lib.cuInit(0), "cuInit")

    def _error(self, code: int) -> str:
        text = ctypes.c_char_p()
        try:
            self._lib.cuGetErrorString(code, ctypes.byref(text))
        except AttributeError:
            return f"CUresult {code}"
        return f"{text.value.decode() if text.value else 'unknown error'} (CUresult {code})"

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            raise DriverUnavailable(f"{what} failed: {self._error(code)}")

    def version(self) -> int:
        v = ctypes.c_int()
        self._check(self._lib.cuDriverGetVersion(ctypes.byref(v)), "cuDriverGetVersion")
        return v.value

    def count(self) -> int:
        n = ctypes.c_int()
        self._check(self._lib.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
        return n.value

    def props(self, index: int) -> DeviceProps:
        lib = self._lib
        dev = ctypes.c_int()
        self._check(lib.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
        name = ctypes.create_string_buffer(256)
        self._check(lib.cuDeviceGetName(name, 256, dev), "cuDeviceGetName")
        total = ctypes.c_size_t()
        self._check(lib.cuDeviceTotalMem_v2(ctypes.byref(total), dev), "cuDeviceTotalMem")
        attributes = {}
        for attr in _QUERIED:
            value = ctypes.c_int()
            if lib.cuDeviceGetAttribute(ctypes.byref(value), attr, dev) == 0:
                attributes[attr] = value.value
        return DeviceProps(
            index, name.value.decode(errors="replace"), total.value, attributes, self.version()
        )

    def param_sizes(self, function: int) -> list[int] | None:
        """Byte sizes of a kernel's parameters (``cuFuncGetParamInfo``, CUDA 12.4+), or None
        where the driver cannot say."""
        get = getattr(self._lib, "cuFuncGetParamInfo", None)
        if get is None:
            return None
        sizes = []
        offset, size = ctypes.c_size_t(), ctypes.c_size_t()
        for index in range(4096):
            code = get(ctypes.c_void_p(function), ctypes.c_size_t(index), ctypes.byref(offset),
                       ctypes.byref(size))  # fmt: skip
            if code != 0:
                break
            sizes.append(size.value)
        return sizes or None  # a failing first query: unknown (or a kernel without parameters)


_lock = threading.Lock()
_driver: Driver | None = None


def driver() -> Driver:
    """The process's driver handle (loaded and initialized once); DriverUnavailable if none."""
    global _driver
    with _lock:
        if _driver is None:
            errors = []
            names = list(_LIBRARIES)
            found = ctypes.util.find_library("cuda")
            if found:
                names.append(found)
            for name in names:
                try:
                    lib = ctypes.CDLL(name)
                except OSError as exc:
                    errors.append(str(exc))
                    continue
                _driver = Driver(lib)
                break
            else:
                raise DriverUnavailable(
                    "the NVIDIA driver library (libcuda.so.1) was not found: no NVIDIA driver is"
                    " installed, or this is a container started without GPU access"
                )
        return _driver


def read_devices() -> list[DeviceProps]:
    """Every visible CUDA device (``CUDA_VISIBLE_DEVICES`` applies), in ``cuda:N`` order."""
    drv = driver()
    return [drv.props(i) for i in range(drv.count())]
