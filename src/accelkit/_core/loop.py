"""Waking an event loop from a worker thread, under asyncio and trio alike.

anyio has no non-blocking "call soon from another thread"; ``anyio.from_thread.run_sync`` would
block the device's worker until the loop runs the callback. So the two loops' own thread-safe
entry points are used, picked once per wait by sniffio.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import anyio
import sniffio

__all__ = ["threadsafe_caller", "wait_for_callback"]


def threadsafe_caller() -> Callable[[Callable[[], object]], None]:
    """A function that schedules a callback on the current event loop from any thread."""
    library = sniffio.current_async_library()
    if library == "asyncio":
        import asyncio

        loop = asyncio.get_running_loop()

        def call_asyncio(fn: Callable[[], object]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(fn)

        return call_asyncio
    if library == "trio":
        import trio

        token = trio.lowlevel.current_trio_token()

        def call_trio(fn: Callable[[], object]) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(fn)

        return call_trio
    raise RuntimeError(f"accelkit supports asyncio and trio; running under {library}")


async def wait_for_callback(
    register: Callable[[Callable[[], None]], Callable[[], None] | None],
) -> None:
    """Wait until the callback given to ``register`` is called (from any thread).

    ``register`` may call the callback at once; it returns a function that unregisters it (or
    None), used when the wait is cancelled.
    """
    event = anyio.Event()
    call_soon = threadsafe_caller()
    unregister = register(lambda: call_soon(event.set))
    try:
        await event.wait()
    finally:
        if unregister is not None and not event.is_set():
            unregister()
