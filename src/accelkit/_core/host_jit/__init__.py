"""The CPU JIT: Numba kernels for the hot float32 steps of the host's NumPy bodies.

:mod:`.jit` compiles and checks each kernel when first wanted (in the background by default,
``ACCELKIT_CPU_JIT``), :mod:`.verify` first checks them in a child process once per machine, and
:mod:`._numba_kernels` holds them. :data:`JIT` is the
:class:`~accelkit._core.host_kernels.HostAccelerator` that a host backend passes to the bodies
(``accel=JIT``); ``accelkit.sdk.host`` offers it. Importing this package imports neither Numba
nor any backend.
"""

from __future__ import annotations

from collections.abc import Callable

from accelkit._core.host_jit import jit

__all__ = ["JIT", "JITAccelerator"]

#: What the JIT's progress lines and notes begin with (``accelkit doctor`` shows them).
SUBJECT = "CPU JIT kernels"


class JITAccelerator:
    """The CPU JIT as a :class:`~accelkit._core.host_kernels.HostAccelerator`: each kernel
    method runs the checked Numba kernel and returns True, or returns False (NumPy's code runs)
    for a call it has no kernel for: not float32, not contiguous, Numba missing, the JIT off
    (``ACCELKIT_CPU_JIT=0``), or the kernel still compiling (by default kernels compile on a
    background thread when first wanted). Use the instance :data:`JIT`.

    Besides the kernels: :meth:`prepare` (compile and check them all now, off the event loop: a
    backend's ``prepare``), :meth:`wait` (the same, blocking), :meth:`status` (each kernel's
    state), :meth:`describe` (Numba's version and the mode, without importing Numba) and
    :meth:`disabled` (a context manager: NumPy's code in place of the JIT while it runs)."""

    # The module's functions as static methods: a call through the instance is one frame.
    unary = staticmethod(jit.unary)
    softmax_rows = staticmethod(jit.softmax_rows)
    attention = staticmethod(jit.attention)
    layer_norm = staticmethod(jit.layer_norm)
    rms_norm = staticmethod(jit.rms_norm)
    wait = staticmethod(jit.wait)
    status = staticmethod(jit.status)
    describe = staticmethod(jit.describe)
    disabled = staticmethod(jit.disabled)

    async def prepare(self, progress: Callable[[str], None] | None = None) -> str | None:
        """Compile and check every kernel now, on a worker thread (the event loop stays free),
        unless the JIT is off; seconds on a machine's first run, a fraction of one from Numba's
        cache after. ``progress`` receives a line before and one after (``CPU JIT kernels: 8 of
        8 ready``). Returns None when every kernel is ready (or the JIT is off on purpose), else
        a note on those left out and why (NumPy's code runs for them): what a backend's
        ``prepare`` returns."""
        import anyio

        say = progress or (lambda line: None)
        if jit.describe()["mode"] == "off":
            say(f"{SUBJECT}: off ({jit.ENV}=0)")
            return None
        if any(state != "ready" for state in jit.status().values()):
            say(f"{SUBJECT}: compiling and checking them (Numba caches them for later runs) ...")
        states = await anyio.to_thread.run_sync(jit.wait)
        ready = [name for name, state in states.items() if state == "ready"]
        unused = {name: state for name, state in states.items() if state != "ready"}
        reasons = sorted(set(unused.values()))
        note: str | None
        if not unused:
            line, note = f"{SUBJECT}: {len(ready)} of {len(states)} ready", None
        elif not ready and len(reasons) == 1:  # Numba missing: one reason for all
            line = note = f"{SUBJECT}: none used: {reasons[0].removeprefix('not used: ')}"
        else:
            line = note = f"{SUBJECT}: {len(ready)} of {len(states)} ready" + "".join(
                f"; {name}: {state}" for name, state in unused.items()
            )
        say(line)
        return note


#: The CPU JIT accelerator (see :class:`JITAccelerator`).
JIT = JITAccelerator()
