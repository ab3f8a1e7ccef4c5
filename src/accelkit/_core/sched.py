"""Keeping the event loop's thread responsive while device work keeps every core busy.

On a machine whose cores are all running compute (BLAS threads and a backend's workers on the
CPU backend, host threads feeding a GPU), Linux wakes a sleeping event-loop thread only when its
scheduler decides to preempt the thread on the core; with the default time slice that takes 3-5
ms, so a 1 ms timer fires late by that much. Since Linux 6.12 (EEVDF), a thread may ask for a
shorter slice through ``sched_setattr``'s ``sched_runtime`` (no privilege needed; the kernel
clamps it to 0.1-100 ms): a thread with a shorter slice gets an earlier deadline and preempts the
running thread when it wakes. That is exactly an event loop's pattern: wake briefly, often.

:func:`request_loop_slice` asks for it for the calling thread (the one running the event loop).
It changes nothing else: not the thread's priority or share of the CPU, nor any other thread
(threads it starts later get the default slice).
``ACCELKIT_LOOP_SLICE_US`` sets the slice (microseconds; default 100, ``0`` leaves the thread as
it is). Elsewhere (not Linux, older kernels, an architecture without the call) it does nothing
and says why.

The interpreter has a scheduler of its own: a thread running Python code keeps the GIL for up to
``sys.getswitchinterval()`` (5 ms by default) while another thread waits for it. A backend's
worker thread that builds task graphs or drives a device API in Python (a Dask flush, wgpu-py's
calls) then keeps a woken event loop waiting that long. :func:`request_switch_interval` lowers
the interval to 1 ms (``ACCELKIT_SWITCH_INTERVAL_US``; ``0`` leaves it alone), and only while it
is still Python's default: an application that chose its own keeps it.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading

from accelkit.errors import InvalidArgumentError

__all__ = [
    "DEFAULT_SLICE_US", "DEFAULT_SWITCH_US", "loop_slice_us", "read_slice_ns",
    "request_loop_slice", "request_switch_interval", "switch_interval_us",
]  # fmt: skip

DEFAULT_SLICE_US = 100
DEFAULT_SWITCH_US = 1000
_ENV = "ACCELKIT_LOOP_SLICE_US"
_SWITCH_ENV = "ACCELKIT_SWITCH_INTERVAL_US"
_PYTHON_SWITCH_S = 0.005  # CPython's default sys.getswitchinterval()
# sched_setattr / sched_getattr syscall numbers (there is no libc wrapper in glibc < 2.41).
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275), "arm64": (274, 275)}
_SCHED_FLAG_RESET_ON_FORK = 0x01
_done: dict[int, int] = {}  # native thread id -> slice (ns) already requested
_lock = threading.Lock()


class _SchedAttr(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("sched_policy", ctypes.c_uint32),
        ("sched_flags", ctypes.c_uint64),
        ("sched_nice", ctypes.c_int32),
        ("sched_priority", ctypes.c_uint32),
        ("sched_runtime", ctypes.c_uint64),
        ("sched_deadline", ctypes.c_uint64),
        ("sched_period", ctypes.c_uint64),
        ("sched_util_min", ctypes.c_uint32),
        ("sched_util_max", ctypes.c_uint32),
    ]


def _env_us(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidArgumentError(
            f"{name}={raw!r} is not a whole number of microseconds >= 0 (0 turns it off)"
        )
    return value


def loop_slice_us() -> int:
    """The slice ``ACCELKIT_LOOP_SLICE_US`` asks for (0: leave the loop's thread alone)."""
    return _env_us(_ENV, DEFAULT_SLICE_US)


def switch_interval_us() -> int:
    """The interpreter's switch interval ``ACCELKIT_SWITCH_INTERVAL_US`` asks for (0: leave it
    alone)."""
    return _env_us(_SWITCH_ENV, DEFAULT_SWITCH_US)


def request_switch_interval() -> str:
    """Lower the interpreter's thread switch interval to the configured one while it is still
    Python's default (see the module docstring); returns what happened, in words."""
    want_us = switch_interval_us()
    if want_us == 0:
        return f"left alone ({_SWITCH_ENV}=0)"
    with _lock:
        current = sys.getswitchinterval()
        if abs(current - want_us / 1e6) < 1e-9:
            return f"{want_us} us"
        if abs(current - _PYTHON_SWITCH_S) > 1e-9:
            return f"left at the application's {round(current * 1e6)} us"
        sys.setswitchinterval(want_us / 1e6)
    return f"{want_us} us"


def _syscalls() -> tuple[int, int] | str:
    if not sys.platform.startswith("linux"):
        return f"not Linux ({sys.platform})"
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        return f"no sched_setattr number known for {platform.machine()}"
    release = platform.release().split(".")
    try:
        major, minor = int(release[0]), int(release[1].split("-")[0])
    except (IndexError, ValueError):
        return f"unrecognised kernel release {platform.release()!r}"
    if (major, minor) < (6, 12):
        return f"Linux {major}.{minor} has no per-thread slice (6.12 and later)"
    return numbers


def read_slice_ns(tid: int = 0) -> int | None:
    """The time slice (ns) the thread ``tid`` (0: the calling one) runs with, or None where it
    cannot be read."""
    numbers = _syscalls()
    if isinstance(numbers, str):
        return None
    attr = _SchedAttr()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(numbers[1], tid, ctypes.byref(attr), ctypes.sizeof(attr), 0) != 0:
        return None
    return int(attr.sched_runtime)


def request_loop_slice() -> str:
    """Ask for the configured short slice for the calling thread; returns what happened, in
    words (``"slice 100 us"``, or the reason nothing was done). Idempotent per thread."""
    slice_us = loop_slice_us()
    if slice_us == 0:
        return f"left alone ({_ENV}=0)"
    numbers = _syscalls()
    if isinstance(numbers, str):
        return f"left alone: {numbers}"
    tid = threading.get_native_id()
    want = slice_us * 1000
    with _lock:
        if _done.get(tid) == want:
            return f"slice {slice_us} us"
        libc = ctypes.CDLL(None, use_errno=True)
        attr = _SchedAttr()
        if libc.syscall(numbers[1], 0, ctypes.byref(attr), ctypes.sizeof(attr), 0) != 0:
            return f"left alone: sched_getattr failed ({os.strerror(ctypes.get_errno())})"
        if attr.sched_policy != 0:  # SCHED_OTHER only: a real-time or idle thread is left be
            return f"left alone: the thread runs under policy {attr.sched_policy}, not SCHED_OTHER"
        attr.size = ctypes.sizeof(attr)
        # Reset on fork: threads this one starts later (a backend's workers, which would
        # otherwise compete on equal terms again) get the default slice.
        attr.sched_flags = _SCHED_FLAG_RESET_ON_FORK
        attr.sched_runtime = want
        if libc.syscall(numbers[0], 0, ctypes.byref(attr), 0) != 0:
            return f"left alone: sched_setattr failed ({os.strerror(ctypes.get_errno())})"
        _done[tid] = want
    return f"slice {slice_us} us"
