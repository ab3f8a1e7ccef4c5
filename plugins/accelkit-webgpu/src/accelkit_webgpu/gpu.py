"""One WebGPU device: its queue, the lock around every wgpu call, pipelines and dispatches.

wgpu-py's objects are used from the stream workers' threads and from transfer threads, never from
the event loop's thread (the GL backend runs a compute pass inside ``queue.submit``, which may take
milliseconds). wgpu-native is internally synchronised, but wgpu-py keeps some state of its own
(a shared staging buffer for reads), so every call goes through :attr:`GPU.lock`.

Memory blocks are :class:`Block` objects whose ``wgpu.GPUBuffer`` is created on first use, on the
thread that uses it: the pool hands out blocks from the event loop's thread without touching wgpu.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from accelkit.errors import AccelError, ContextPoisonedError, DeviceError, KernelCompileError

__all__ = ["GPU", "Block", "groups_for"]

#: The most workgroups along one dispatch dimension (WebGPU's default limit).
MAX_GROUPS = 65535


class Block:
    """A pool block: ``size`` bytes of device memory, created lazily on a worker thread.

    The ``wgpu.GPUBuffer`` is also held in its GPU's registry, never only here. A pool block can
    be part of a garbage cycle that Python's collector finalizes and then resurrects (the
    ``DeviceBuffer`` finalizer puts its buffer back in the pool's release queue): finalizing a
    GPUBuffer releases its native handle, and the block would come back from the pool with a
    dead buffer (binding it aborts the process inside wgpu-native). Held by the registry, the
    buffer is always reachable, so it is never finalized while its block may still be used.
    """

    __slots__ = ("_buffer", "gpu", "size")

    def __init__(self, gpu: GPU, size: int) -> None:
        self.gpu = gpu
        self.size = size
        self._buffer: Any = None

    def buffer(self) -> Any:
        """The ``wgpu.GPUBuffer`` (call with :attr:`GPU.lock` held)."""
        buf = self._buffer
        if buf is None:
            buf = self._buffer = self.gpu.create_buffer(self.size)
            self.gpu.live_buffers[id(self)] = buf
        return buf

    def release(self) -> None:
        """Give the buffer back (the pool's ``raw_free``). The pool calls this on any thread,
        the event loop's included, so it only queues the buffer: a worker destroys it under the
        lock at its next call (no wait on the lock, which a long read may hold, here)."""
        buf, self._buffer = self._buffer, None
        if buf is not None:
            self.gpu.graveyard.append((id(self), buf))  # list.append: atomic in CPython

    def __repr__(self) -> str:
        return f"Block({self.size} bytes)"


def groups_for(units: int, per_group: int) -> tuple[int, int]:
    """(x, y) workgroup counts covering ``units`` work items, ``per_group`` per workgroup."""
    groups = max(1, -(-units // per_group))
    if groups <= MAX_GROUPS:
        return groups, 1
    return MAX_GROUPS, -(-groups // MAX_GROUPS)


class GPU:
    """A ``wgpu.GPUDevice`` with the lock, caches and helpers the backend's kernels use."""

    def __init__(self, adapter: Any, device: Any, label: str) -> None:
        import wgpu

        self.wgpu = wgpu
        self.adapter = adapter
        self.device = device
        self.queue = device.queue
        self.label = label
        self.lock = threading.RLock()
        self.limits = dict(device.limits)
        self.max_binding = int(self.limits.get("max-storage-buffer-binding-size", 1 << 27))
        self.max_buffer = int(self.limits.get("max-buffer-size", 1 << 28))
        self.max_storage_buffers = int(self.limits.get("max-storage-buffers-per-shader-stage", 8))
        self.max_invocations = int(self.limits.get("max-compute-invocations-per-workgroup", 256))
        self.max_wg_size = (
            int(self.limits.get("max-compute-workgroup-size-x", 256)),
            int(self.limits.get("max-compute-workgroup-size-y", 256)),
            int(self.limits.get("max-compute-workgroup-size-z", 64)),
        )
        self.max_groups = int(self.limits.get("max-compute-workgroups-per-dimension", MAX_GROUPS))
        self._usage = (
            wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        )
        #: Compute pipelines by (WGSL source or SPIR-V module, entry point).
        self._pipelines: dict[tuple[str | bytes, str], Any] = {}
        self._layouts: dict[tuple[bool, ...], tuple[Any, Any]] = {}
        #: Set (with the reason) when the device was lost: every later call raises.
        self.lost: str | None = None
        self.compiles = 0
        self._fence: Any = None
        #: Every block's GPUBuffer, by ``id(block)`` (see :class:`Block`).
        self.live_buffers: dict[int, Any] = {}
        #: Released blocks' buffers, destroyed by the next call that holds the lock.
        self.graveyard: list[tuple[int, Any]] = []

    # -- health -----------------------------------------------------------------------------------
    def bury(self) -> None:
        """Destroy the buffers of released blocks (call with the lock held)."""
        while self.graveyard:
            key, buf = self.graveyard.pop()
            if self.live_buffers.get(key) is buf:
                del self.live_buffers[key]
            with contextlib.suppress(Exception):  # a lost device: nothing left to free
                buf.destroy()

    def check(self) -> None:
        # RLock._is_owned is CPython's (both lock implementations have it), not in typeshed
        if self.graveyard and self.lock._is_owned():  # type: ignore[attr-defined]
            self.bury()
        if self.lost is not None:
            raise ContextPoisonedError(
                f"the WebGPU device {self.label} was lost ({self.lost}); call recover()"
            )

    def mark_lost(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason or "device lost"

    def failed(self, what: str, exc: BaseException) -> DeviceError:
        """The accelkit error for a wgpu call that raised: ContextPoisonedError (and the device
        marked lost) when wgpu says the device is lost, DeviceError with wgpu's message
        otherwise."""
        text = str(exc)
        if "lost" in text.lower():
            self.mark_lost(text.strip().splitlines()[-1].strip() or "device lost")
            return ContextPoisonedError(
                f"the WebGPU device {self.label} was lost during {what} ({self.lost});"
                " call recover()"
            )
        return DeviceError(f"{what} failed on {self.label}: {text}")

    def warm_up(self) -> None:
        """Run each kind of wgpu call once (a write, a one-word kernel, a copy, a read).

        wgpu-py builds its C structures through cffi, which parses each type string the first
        time it meets it, in Python, holding the GIL for tens of milliseconds. Done here, on a
        worker thread at initialize, that cost never lands on a user's first op, where it would
        keep the event loop's thread from running (40-50 ms late, measured)."""
        src = (
            "@group(0) @binding(0) var<storage, read> P: array<u32>;\n"
            "@group(0) @binding(1) var<storage, read> t_x: array<u32>;\n"
            "@group(0) @binding(2) var<storage, read_write> t_out: array<u32>;\n"
            "@compute @workgroup_size(1) fn main() { t_out[0] = t_x[0] + P[0]; }\n"
        )
        a, b = Block(self, 4), Block(self, 4)
        try:
            self.write(a, np.array([41], np.uint32))
            self.dispatch(src, [1], [(a, 4)], [(b, 4)], (1, 1))
            self.copy(a, b, 4)
            value = int(self.read(a, 4).view(np.uint32)[0])
            self.wait_idle()
        finally:
            a.release()
            b.release()
        if value != 42:
            raise DeviceError(f"{self.label} failed its first kernel (41 + 1 gave {value})")

    def close(self) -> None:
        """Drop the caches and destroy the device (its buffers go with it)."""
        with self.lock:
            self._pipelines.clear()
            self._layouts.clear()
            self.live_buffers.clear()
            self.graveyard.clear()
            device, self.device = self.device, None
            self.lost = self.lost or "the backend was shut down"
            if device is not None:
                with contextlib.suppress(Exception):  # already gone: nothing to release
                    device.destroy()

    # -- memory ------------------------------------------------------------------------------------
    def create_buffer(self, size: int) -> Any:
        self.check()
        try:
            return self.device.create_buffer(size=max(4, size), usage=self._usage)
        except Exception as exc:
            raise DeviceError(
                f"cannot create a {size}-byte buffer on {self.label}: {exc}"
            ) from None

    def write(
        self, block: Block, data: np.ndarray[Any, Any], offset: int = 0, keep_tail: bool = True
    ) -> None:
        """Copy ``data``'s bytes to ``block`` at ``offset`` (a multiple of 4). ``keep_tail``
        false: the bytes after them up to the next multiple of 4 may be zeroed (a whole tensor's
        write, after which nothing of the block is in use)."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if raw.size == 0:
            return
        # WebGPU writes whole 4-byte words: a size that is not a multiple of 4 ends in a word
        # whose other bytes are the block's own, read back and kept (zero padding overwrote
        # them: a 5-byte write into an 8-byte u8 tensor zeroed its last three bytes).
        aligned = raw.size - raw.size % 4
        with self.lock:
            self.check()
            try:
                buffer = block.buffer()
                if aligned:
                    self.queue.write_buffer(buffer, offset, raw[:aligned])
                if aligned < raw.size and keep_tail:
                    self._write_tail(buffer, offset + aligned, raw[aligned:])
                elif aligned < raw.size:
                    word = np.zeros(4, np.uint8)
                    word[: raw.size - aligned] = raw[aligned:]
                    self.queue.write_buffer(buffer, offset + aligned, word)
            except Exception as exc:
                raise self.failed("a write", exc) from None

    def _write_tail(self, buffer: Any, at: int, tail: np.ndarray[Any, Any]) -> None:
        """Write ``tail`` (1 to 3 bytes) at ``at`` (a multiple of 4), keeping the rest of that
        word (a read waits for the work before it; the lock is held)."""
        word = np.array(np.frombuffer(self.queue.read_buffer(buffer, at, 4), np.uint8))
        word[: tail.size] = tail
        self.queue.write_buffer(buffer, at, word)

    def read(self, block: Block, nbytes: int) -> np.ndarray[Any, Any]:
        """``nbytes`` of ``block`` as ``uint8`` (waits for the work submitted before)."""
        if nbytes == 0:
            return np.empty(0, np.uint8)
        size = -(-nbytes // 4) * 4
        with self.lock:
            self.check()
            try:
                data = self.queue.read_buffer(block.buffer(), 0, size)
            except Exception as exc:
                raise self.failed("a read", exc) from None
        return np.frombuffer(data, np.uint8, count=nbytes)

    def copy(self, dst: Block, src: Block, nbytes: int) -> None:
        """``nbytes`` from the start of ``src`` to the start of ``dst``; the bytes of ``dst``
        after them are kept (a copy of whole words overwrote up to three with ``src``'s)."""
        aligned = nbytes - nbytes % 4
        if nbytes == 0:
            return
        with self.lock:
            self.check()
            try:
                if aligned:
                    enc = self.device.create_command_encoder()
                    enc.copy_buffer_to_buffer(src.buffer(), 0, dst.buffer(), 0, aligned)
                    self.queue.submit([enc.finish()])
                if aligned < nbytes:
                    tail = np.frombuffer(self.queue.read_buffer(src.buffer(), aligned, 4), np.uint8)
                    self._write_tail(dst.buffer(), aligned, tail[: nbytes - aligned])
            except Exception as exc:
                raise self.failed("a copy", exc) from None

    def wait_idle(self) -> None:
        """Block until every submitted command has run."""
        with self.lock:
            self.check()
            # Mapping a buffer waits for the commands submitted before it (wgpu-py's
            # on_submitted_work_done is broken in some releases; a 4-byte read is as good).
            if self._fence is None:
                self._fence = self.create_buffer(4)
            try:
                self.queue.read_buffer(self._fence, 0, 4)
            except Exception as exc:
                raise self.failed("waiting for the queue", exc) from None

    # -- pipelines ----------------------------------------------------------------------------------
    def _layout(self, writable: tuple[bool, ...]) -> tuple[Any, Any]:
        """The bind group layout and pipeline layout of bindings 0..n (True: read-write)."""
        found = self._layouts.get(writable)
        if found is None:
            wgpu = self.wgpu
            entries = [
                {
                    "binding": i,
                    "visibility": wgpu.ShaderStage.COMPUTE,
                    "buffer": {
                        "type": wgpu.BufferBindingType.storage
                        if rw
                        else wgpu.BufferBindingType.read_only_storage
                    },
                }
                for i, rw in enumerate(writable)
            ]
            bgl = self.device.create_bind_group_layout(entries=entries)
            found = (bgl, self.device.create_pipeline_layout(bind_group_layouts=[bgl]))
            self._layouts[writable] = found
        return found

    def pipeline(self, source: str, writable: tuple[bool, ...], entry: str = "main") -> Any:
        """The compute pipeline of ``source`` (cached by source), with explicit bindings
        ``writable`` (binding 0 first). A WGSL error raises KernelCompileError with wgpu's
        message, which names the line and column."""
        key = (source, entry)
        found = self._pipelines.get(key)
        if found is not None:
            return found
        with self.lock:
            self.check()
            _, layout = self._layout(writable)
            try:
                module = self.device.create_shader_module(code=source)
                found = self.device.create_compute_pipeline(
                    layout=layout, compute={"module": module, "entry_point": entry}
                )
            except Exception as exc:
                raise KernelCompileError(
                    f"WGSL compilation failed on {self.label}:\n{exc}"
                ) from None
            self.compiles += 1
            self._pipelines[key] = found
        return found

    def dispatch(
        self,
        source: str,
        params: Sequence[int] | np.ndarray[Any, Any],
        inputs: Sequence[tuple[Block, int]],
        outputs: Sequence[tuple[Block, int]],
        groups: tuple[int, int] | tuple[int, int, int],
    ) -> None:
        """Run ``source``'s ``main`` over ``groups`` workgroups with binding 0 the parameter
        words, then ``inputs`` (read-only) and ``outputs`` (read-write), each (block, bytes)."""
        writable = (False,) + (False,) * len(inputs) + (True,) * len(outputs)
        pipe = self.pipeline(source, writable)
        words = np.asarray(params, dtype=np.int64).astype(np.uint32) if len(params) else None
        if words is None or words.size == 0:
            words = np.zeros(1, np.uint32)
        with self.lock:
            self.check()
            try:
                self._record(pipe, words, inputs, outputs, writable, groups)
            except AccelError:
                raise
            except Exception as exc:
                raise self.failed("a dispatch", exc) from None

    def _record(
        self,
        pipe: Any,
        words: np.ndarray[Any, Any],
        inputs: Sequence[tuple[Block, int]],
        outputs: Sequence[tuple[Block, int]],
        writable: tuple[bool, ...],
        groups: tuple[int, int] | tuple[int, int, int],
    ) -> None:
        wgpu = self.wgpu
        pbuf = self.device.create_buffer_with_data(data=words, usage=wgpu.BufferUsage.STORAGE)
        entries = [{"binding": 0, "resource": {"buffer": pbuf, "offset": 0, "size": pbuf.size}}]
        for i, (block, nbytes) in enumerate([*inputs, *outputs], start=1):
            entries.append(
                {
                    "binding": i,
                    "resource": {
                        "buffer": block.buffer(),
                        "offset": 0,
                        "size": max(4, -(-nbytes // 4) * 4),
                    },
                }
            )
        bgl, _ = self._layout(writable)
        group = self.device.create_bind_group(layout=bgl, entries=entries)
        enc = self.device.create_command_encoder()
        cpass = enc.begin_compute_pass()
        cpass.set_pipeline(pipe)
        cpass.set_bind_group(0, group)
        cpass.dispatch_workgroups(*groups)
        cpass.end()
        self.queue.submit([enc.finish()])
