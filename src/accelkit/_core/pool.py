"""A caching allocator with exact statistics, shared by every backend's memory manager.

The backend supplies two functions, ``raw_alloc(size) -> handle`` and ``raw_free(handle)``; the
pool rounds requests to size classes (at most 12.5 % waste), caches freed blocks per class and
keeps the counters that :class:`~accelkit.memory.MemoryInfo` reports.

Buffers are released from ``DeviceBuffer.__del__``, which may run on any thread and at any point
(even inside the pool, through the garbage collector). Releases therefore only append to a deque
(atomic in CPython); the deque is drained under the lock at the next allocation or query.

Ownership: a handle's memory is freed by ``raw_free`` only, which the pool calls under its lock
(or the backend at its teardown). A handle must never free itself from a finalizer: a buffer
that dies in a reference cycle is resurrected into the deque by ``DeviceBuffer.__del__`` in the
same collection that would run the handle's finalizer, and the pool would hand out freed
memory. A backend that can tell a dead handle passes ``is_live``; the pool then refuses to hand
one out (an internal error, never an address 0). A backend whose allocations complete later
(CUDA's ``cudaMalloc`` runs on its submission thread) may find one failed after its handle was
cached: with ``is_failed`` it says so of a handle ``is_live`` refused, and the pool frees that
handle and hands out a fresh one instead (the tensor that got the failed block is told by its
own work; a new tensor must not inherit the failure).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from accelkit.abc.memory import DeviceBuffer
from accelkit.device import Device
from accelkit.errors import (
    DeviceError,
    InvalidArgumentError,
    NotInitializedError,
    OutOfMemoryError,
    StaleHandleError,
)
from accelkit.memory import MemoryInfo, MemoryPoolConfig

__all__ = ["CachingPool", "size_class"]

_MIN_BLOCK = 64
_MAX_ALLOC = 1 << 48


def size_class(nbytes: int) -> int:
    """Round ``nbytes`` up to its size class: multiples of 64 up to 512, then 8 steps per octave."""
    if nbytes <= 512:
        return max(_MIN_BLOCK, (nbytes + 63) & ~63)
    step = 1 << (nbytes.bit_length() - 4)
    return (nbytes + step - 1) & ~(step - 1)


def _fmt(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError


class CachingPool:
    """Size-class caching allocator with exact accounting (see module docstring)."""

    def __init__(
        self,
        device: Device,
        raw_alloc: Callable[[int], Any],
        raw_free: Callable[[Any], None],
        total_bytes: int,
        config: MemoryPoolConfig | None = None,
        is_live: Callable[[Any], bool] | None = None,
        is_failed: Callable[[Any], bool] | None = None,
    ) -> None:
        self.device = device
        self._raw_alloc = raw_alloc
        self._raw_free = raw_free
        self._is_live = is_live
        self._is_failed = is_failed
        self._device_total = total_bytes
        self._config = config or MemoryPoolConfig()
        #: The alignment the blocks have: the allocator's, made with the first config's (a
        #: later config may ask for less, never more).
        self.alignment = self._config.alignment
        self._update_total()
        self._lock = threading.Lock()
        self._released: deque[DeviceBuffer] = deque()
        self._cache: dict[int, list[Any]] = {}
        self.generation = 1
        self.closed = False
        #: Buffers freed explicitly (``free``), ever: a captured graph re-checks its tensors only
        #: when this moved since it last looked.
        self.frees = 0
        self._used = 0
        self._reserved = 0
        self._cached = 0
        self._active = 0
        self._peak = 0
        #: Called (outside the lock) where an allocation would exceed the limit, before it is
        #: refused: the backend waits there for queued work that may hold buffers the program
        #: has dropped, and releases them (``StreamBackend``); the allocation is tried again once.
        self.on_limit: Callable[[], None] | None = None

    # -- configuration ----------------------------------------------------------------------------
    @property
    def config(self) -> MemoryPoolConfig:
        return self._config

    def configure(self, config: MemoryPoolConfig) -> None:
        if not isinstance(config, MemoryPoolConfig):
            raise InvalidArgumentError(f"expected a MemoryPoolConfig; got {type(config).__name__}")
        if "alignment" not in config.model_fields_set:
            # Not asked for (the field's default): the blocks keep theirs (a plain limit change
            # was refused for raising a pool made with 16 to the default 64).
            config = config.model_copy(update={"alignment": self.alignment})
        elif config.alignment > self.alignment:
            raise InvalidArgumentError(
                f"the blocks of {self.device} are aligned to {self.alignment} bytes, set when the"
                f" backend was created; a config cannot raise it to {config.alignment} (pass that"
                " MemoryPoolConfig to the backend's constructor: pool_config=)"
            )
        with self._lock:
            self._config = config
            self._update_total()
            if not config.enabled:
                self._trim_locked(0)
            elif config.max_cached_bytes is not None:
                self._trim_locked(config.max_cached_bytes)

    @property
    def total(self) -> int:
        """Device memory, or the configured limit if lower."""
        return self._total

    def _update_total(self) -> None:
        cfg = self._config
        limit = cfg.limit_bytes
        self._total = min(limit, self._device_total) if limit else self._device_total
        self._max_cached = cfg.max_cached_bytes if cfg.max_cached_bytes is not None else 1 << 62
        self._caching = cfg.enabled

    # -- allocation -------------------------------------------------------------------------------
    def allocate(self, nbytes: int, _again: bool = False) -> DeviceBuffer:
        """Allocate a buffer of ``nbytes`` (validated by the caller as a non-negative int)."""
        # size_class(), inlined: this is every tensor's allocation.
        if nbytes <= 512:
            block = ((nbytes + 63) & ~63) or 64
        else:
            step = 1 << (nbytes.bit_length() - 4)
            block = (nbytes + step - 1) & ~(step - 1)
        with self._lock:
            if self.closed:
                raise NotInitializedError(
                    f"the memory pool of {self.device} is closed: its backend was shut down"
                )
            released = self._released
            handle = None
            if released:
                buf = released[0]
                if (
                    len(released) == 1
                    and buf.block_size == block
                    and buf._pool is self
                    and buf._gen == self.generation
                    and self._caching
                ):
                    # The commonest case, whole: the one buffer that died since the last
                    # allocation (a loop's previous result) is of this size class, and its block
                    # is handed straight back (one buffer out, one in: the active count stays).
                    # Anything else (over the limit, a block that is not live) takes the general
                    # path below, which drains it like any other.
                    handle = buf.handle
                    used = self._used - buf.nbytes + nbytes
                    is_live = self._is_live
                    if used <= self._total and (is_live is None or is_live(handle)):
                        released.popleft()
                        buf._pool = None
                        self._used = used
                        if used > self._peak:
                            self._peak = used
                        return DeviceBuffer(
                            self, handle, nbytes, block, self.device, self.generation
                        )
                handle = self._drain_locked(block)
            used = self._used + nbytes
            if used > self._total:
                if handle is not None:  # the block swapped in above goes to the cache
                    self._recycle_locked(handle, block)
                # (a request over the whole limit: no wait would make it fit)
                if self.on_limit is None or _again or nbytes > self._total:
                    total = self._total
                    raise OutOfMemoryError(
                        f"allocating {_fmt(nbytes)} on {self.device} would exceed the"
                        f" {'limit' if self._config.limit_bytes else 'device memory'} of"
                        f" {_fmt(total)} ({_fmt(self._used)} in use, {_fmt(total - self._used)}"
                        " free)",
                        requested=nbytes,
                        used=self._used,
                        limit=total,
                    )
            else:  # within the limit
                if handle is None:
                    free_list = self._cache.get(block)
                    if free_list:
                        handle = free_list.pop()
                        self._cached -= block
                        if self._is_live is not None and not self._is_live(handle):
                            handle = self._dead_locked(handle, block, nbytes)
                    else:
                        handle = self._fresh_locked(nbytes, block)
                elif self._is_live is not None and not self._is_live(handle):
                    handle = self._dead_locked(handle, block, nbytes)
                self._used = used
                self._active += 1
                if used > self._peak:
                    self._peak = used
                return DeviceBuffer(self, handle, nbytes, block, self.device, self.generation)
        on_limit = self.on_limit
        assert on_limit is not None
        on_limit()  # (outside the lock: it waits for the streams, whose work allocates)
        return CachingPool.allocate(self, nbytes, True)  # (not a subclass's: it wraps this)

    def _dead_locked(self, handle: Any, block: int, nbytes: int) -> Any:
        """A cached handle that is not live, dropped (never handed out): one whose allocation
        failed (``is_failed``) is freed and a fresh handle returned in its place; one whose
        memory is gone is an internal error."""
        self._reserved -= block
        if self._is_failed is not None and self._is_failed(handle):
            self._raw_free(handle)
            return self._fresh_locked(nbytes, block)
        raise DeviceError(
            f"internal error in the memory pool of {self.device}: a cached block ({handle!r})"
            " was already freed; it was dropped instead of being handed out (a bug: please report it)"
        )

    def _fresh_locked(self, nbytes: int, block: int) -> Any:
        if block > _MAX_ALLOC:
            raise OutOfMemoryError(
                f"cannot allocate {_fmt(nbytes)} on {self.device}: larger than any device",
                requested=nbytes,
                used=self._used,
                limit=self.total,
            )
        # Keep what the pool holds under the limit by giving back cached blocks first.
        if self._cached and self._reserved + block > self.total:
            self._trim_locked(max(0, self.total - self._reserved - block + self._cached))
        try:
            handle = self._raw_alloc(block)
        except MemoryError:
            self._trim_locked(0)
            try:
                handle = self._raw_alloc(block)
            except MemoryError as exc:
                raise OutOfMemoryError(
                    f"the device {self.device} has no {_fmt(nbytes)} left"
                    f" ({_fmt(self._used)} in use by accelkit)",
                    requested=nbytes,
                    used=self._used,
                    limit=self.total,
                ) from exc
        self._reserved += block
        return handle

    def release_later(self, buffer: DeviceBuffer) -> None:
        """Called from ``DeviceBuffer.__del__``: queue the block for return to the cache."""
        self._released.append(buffer)

    def free(
        self,
        buffer: DeviceBuffer,
        recycle_later: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        """Free ``buffer``: it is stale and uncounted at once; its block returns to the cache
        now, or, with ``recycle_later``, when the function given to it is called (a backend
        passes one that runs after the work already queued, which may still use the block)."""
        with self._lock:
            if buffer._pool is not self or buffer._gen != self.generation:
                raise StaleHandleError(
                    f"{buffer!r} was already freed, or belongs to another backend or to a"
                    " context that was shut down"
                )
            buffer._pool = None
            self.frees += 1
            self._used -= buffer.nbytes
            self._active -= 1
            if recycle_later is None:
                self._recycle_locked(buffer.handle, buffer.block_size)
                return
        handle, block, gen = buffer.handle, buffer.block_size, self.generation

        def recycle() -> None:
            with self._lock:
                if gen == self.generation:
                    self._recycle_locked(handle, block)

        recycle_later(recycle)

    def _drain_locked(self, want: int = 0) -> Any:
        """Account for the buffers released since the last drain, and cache (or free) their
        blocks; returns the handle of one of block size ``want`` instead, when caching is on,
        or None. The hot path of every allocation after a tensor died: one tight loop."""
        released, gen, cache = self._released, self.generation, self._cache
        caching, max_cached = self._caching, self._max_cached
        taken = None
        while released:
            buf = released.popleft()
            if buf._gen == gen and buf._pool is self:
                block = buf.block_size
                self._used -= buf.nbytes
                self._active -= 1
                if caching and block == want and taken is None:
                    taken = buf.handle
                elif caching and self._cached + block <= max_cached:
                    free_list = cache.get(block)
                    if free_list is None:
                        cache[block] = [buf.handle]
                    else:
                        free_list.append(buf.handle)
                    self._cached += block
                else:
                    self._raw_free(buf.handle)
                    self._reserved -= block
            buf._pool = None
        return taken

    def _return_locked(self, buf: DeviceBuffer) -> None:
        self._used -= buf.nbytes
        self._active -= 1
        self._recycle_locked(buf.handle, buf.block_size)

    def _recycle_locked(self, handle: Any, block: int) -> None:
        if self._config.enabled and self._cached + block <= self._max_cached:
            self._cache.setdefault(block, []).append(handle)
            self._cached += block
        else:
            self._raw_free(handle)
            self._reserved -= block

    # -- maintenance ------------------------------------------------------------------------------
    def reclaim(self) -> None:
        """Take back now the blocks of buffers that died since the last allocation (the next
        allocation would): afterwards a dead buffer is gone, and a weak reference to it is dead.
        A backend that keeps per-block work pending (the Dask backend's lazy graphs) calls it
        before deciding which blocks are still wanted."""
        if self._released:
            with self._lock:
                self._drain_locked()

    def trim(self) -> int:
        with self._lock:
            self._drain_locked()
            return self._trim_locked(0)

    def _trim_locked(self, keep: int) -> int:
        released = 0
        for block in sorted(self._cache, reverse=True):
            free_list = self._cache[block]
            while free_list and self._cached > keep:
                self._raw_free(free_list.pop())
                self._cached -= block
                self._reserved -= block
                released += block
        self._cache = {k: v for k, v in self._cache.items() if v}
        return released

    def reset_peak(self) -> None:
        with self._lock:
            self._drain_locked()
            self._peak = self._used

    def invalidate_all(self, close: bool = False) -> None:
        """Shutdown or context rebuild: every live buffer becomes stale, all memory is released.

        With ``close``, later allocations raise NotInitializedError."""
        with self._lock:
            self.closed = close
            self._drain_locked()
            self.generation += 1
            self._trim_locked(0)
            # Live blocks are released by dropping the pool's claim on them: their handles die
            # with the last tensor that references them.
            self._reserved = 0
            self._used = 0
            self._active = 0
            self._peak = 0

    def info(self) -> MemoryInfo:
        with self._lock:
            self._drain_locked()
            total = self.total
            reserved = self._reserved
            used = self._used
            return MemoryInfo(
                total=total,
                used=used,
                free=max(0, total - used),
                reserved=reserved,
                peak=self._peak,
                active_allocations=self._active,
                fragmentation=(1.0 - used / reserved) if reserved else 0.0,
            )
