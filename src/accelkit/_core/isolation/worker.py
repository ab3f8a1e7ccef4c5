"""The worker process of an isolated backend: it opens the real backend and runs what the user's
process sends, in order.

Started as a fresh interpreter (never forked) by :mod:`accelkit._core.isolation.backend`. Messages arrive
on one pipe as pickled lists; tensors and buffers in them are references (``("t", id)``,
``("b", id)``) to the worker's own objects, resolved when unpickled. Each kernel call carries
the user's stream and position; the worker calls the real kernel object on the matching real
stream and, once the real work has completed, reports the position (and the errors of failed
work) back. A sender thread batches those reports. The worker exits when the pipe closes (its
parent died or shut it down) or its parent's pid changes; a sticky device error (the real
backend failed, or a ContextPoisonedError) is reported as fatal and ends it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import io
import os
import pickle
import socket
import struct
import sys
import threading
import time
import weakref
from collections import deque
from typing import Any

__all__ = ["main", "ref_buffer", "ref_tensor"]

_HEAD = struct.Struct("!i")
_HEAD8 = struct.Struct("!Q")


def main() -> None:
    """The worker's entry point: ``python -c "...; main()" FD PARENT_PID SYS_PATH_JSON``, started
    by the user's process with one end of a socket pair as FD and its stderr sent to a file."""
    import json
    import signal
    from multiprocessing.connection import Connection

    fd, parent_pid = int(sys.argv[1]), int(sys.argv[2])
    sys.path[:] = [p for p in json.loads(sys.argv[3]) if p not in ("",)] + sys.path
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    faulthandler.enable()
    sock = socket.socket(fileno=fd)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
    conn = Connection(sock.detach())

    def watch_parent() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                os._exit(3)

    threading.Thread(target=watch_parent, daemon=True, name="accelkit-iso-parent").start()
    import anyio

    worker = _Worker(conn)
    try:
        anyio.run(worker.serve)
    finally:
        sys.stderr.flush()
        os._exit(0)


class _Ref:
    """A tensor (``t``) or buffer (``b``) of the user's process, as unpickled: resolved to the
    worker's own when its message is handled (a message before it may create it)."""

    __slots__ = ("ident", "kind")

    def __init__(self, kind: str, ident: int) -> None:
        self.kind = kind
        self.ident = ident


def ref_tensor(tid: int) -> _Ref:
    """Unpickles a tensor of the user's process (see :class:`_Ref`)."""
    return _Ref("t", tid)


def ref_buffer(bid: int) -> _Ref:
    """Unpickles a buffer of the user's process (see :class:`_Ref`)."""
    return _Ref("b", bid)


def _resolve(w: _Worker, x: Any) -> Any:
    if type(x) is _Ref:
        if x.kind == "t":
            t = w.tensors.get(x.ident)
            if t is None or isinstance(t, BaseException):
                raise t if isinstance(t, BaseException) else _stale("tensor", x.ident)
            return t
        buf = w.raw.get(x.ident)
        if buf is None:
            buf = w.bufs.get(x.ident)
        if buf is None:
            raise _stale("buffer", x.ident)
        return buf
    return x


def _resolve_msg(w: _Worker, msg: tuple[Any, ...]) -> tuple[Any, ...]:
    """``msg`` with its references resolved (two levels into tuples, lists and dicts: a call's
    arguments, and a list of tensors among them)."""
    out = []
    for a in msg:
        ta = type(a)
        if ta is _Ref:
            a = _resolve(w, a)
        elif ta is tuple or ta is list:
            a = ta(
                _resolve(w, x) if type(x) is not list else [_resolve(w, y) for y in x] for x in a
            )
        elif ta is dict:
            a = {
                k: _resolve(w, v) if type(v) is not list else [_resolve(w, y) for y in v]
                for k, v in a.items()
            }
        out.append(a)
    return tuple(out)


def _add_waiter(stream: Any, pos: int, cb: Any) -> Any:
    return stream.add_waiter(pos, cb)


def _stale(what: str, ident: int) -> Exception:
    from accelkit.errors import StaleHandleError

    return StaleHandleError(f"the worker holds no {what} {ident}: it was freed or never made")


#: The messages whose references are resolved before they are handled.
_RESOLVED = frozenset({"c", "cp", "we", "q", "f"})
#: The requests that read the device's memory: the user's process sends them at once, with the
#: positions of their writers, and the worker waits for those (one round trip, not two).
_READS = frozenset({"read", "readb"})


class _Worker:
    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.backend: Any = None
        self.tensors: dict[int, Any] = {}
        self.bufs: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self.raw: dict[int, Any] = {}
        self.streams: dict[int, Any] = {}
        self.events: dict[int, Any] = {}
        self.objs: dict[str, Any] = {}
        # (real position, user position, error or None) per stream, not yet reported.
        self.inflight: dict[int, deque[tuple[int, int, Any]]] = {}
        self.lock = threading.Lock()
        self.out: deque[Any] = deque()
        self.wake = threading.Condition(self.lock)
        self.send_lock = threading.Lock()
        self.closing = False
        self.tg: Any = None
        self.cur_sid: int | None = None
        self.rsock: Any = None
        self.rbuf = bytearray()
        self.outbox: list[Any] | None = None
        self.loop_ident = 0
        self.rchunk = memoryview(bytearray(1 << 18))
        self._pending_done: dict[int, int] = {}
        self._waits: list[tuple[Any, int]] = []

    # -- sending ----------------------------------------------------------------------------------
    def send(self, msg: Any) -> None:
        """Send ``msg``; while the loop handles a batch, with what else the batch sends (one
        write: each write wakes the user's reader)."""
        if self.outbox is not None and threading.get_ident() == self.loop_ident:
            self.outbox.append(msg)
            return
        self._write([msg])

    def _write(self, msgs: list[Any]) -> None:
        data = pickle.dumps(msgs, protocol=pickle.HIGHEST_PROTOCOL)
        with self.send_lock:
            self.conn.send_bytes(data)

    def flush_out(self) -> None:
        """Write what the loop's batch sends, and send at once from now on."""
        out, self.outbox = self.outbox, None
        if out:
            with contextlib.suppress(OSError, ValueError):
                self._write(out)

    def reply(self, req: int, ok: bool, value: Any) -> None:
        from accelkit._core.isolation.proto import encode_error

        self.send(("r", req, ok, value if ok else encode_error(value)))

    def _sender(self) -> None:
        """Reports the positions of work that completed later than its batch was handled (a
        waiter on the real stream woke it)."""
        while True:
            with self.lock:
                while not self.out and not self.closing:
                    self.wake.wait()
                if not self.out:
                    return
                items = list(self.out)
                self.out.clear()
            done: dict[int, int] = {}
            for sid, real_pos in items:
                done[sid] = max(done.get(sid, 0), real_pos)
            self._report(done)

    def _report(self, done: dict[int, int]) -> None:
        """Send the user's positions whose real work completed up to ``done[sid]`` (with the
        errors of failed work); a sticky error ends the worker."""
        from accelkit._core.isolation.proto import encode_error

        msgs = []
        fatal = None
        for sid, real_pos in done.items():
            stream = self.streams.get(sid)
            q = self.inflight.get(sid)
            if stream is None or q is None:
                continue
            errs = []
            last = 0
            with self.lock:
                while q and q[0][0] <= real_pos:
                    pos, seq, err = q.popleft()
                    if err is None:
                        try:
                            stream.raise_errors(pos)
                        except BaseException as exc:
                            err = exc
                    if err is not None:
                        errs.append((seq, encode_error(err)))
                        fatal = fatal or self._sticky(err)
                    last = seq
            if last:
                msgs.append(("d", sid, last, errs))
        if fatal is not None:  # the context is gone: nothing after it can be trusted
            out = self.outbox if threading.get_ident() == self.loop_ident else None
            self.outbox = None
            with contextlib.suppress(OSError, ValueError):
                self._write([*(out or ()), ("F", fatal)])  # written now: the worker ends here
            sys.stderr.write(f"accelkit isolated worker: {fatal}\n")
            sys.stderr.flush()
            os._exit(4)
        if msgs:
            with contextlib.suppress(OSError, ValueError):
                self.send(("D", msgs))

    def _sticky(self, err: BaseException) -> str | None:
        from accelkit.capabilities import LifecycleState
        from accelkit.errors import ContextPoisonedError

        b = self.backend
        if isinstance(err, ContextPoisonedError):
            return f"{type(err).__name__}: {err}"
        if b is not None and b.state is LifecycleState.FAILED:
            return f"the backend failed: {b.status.error or err!r}"
        return None

    def _track(self, sid: int, seq: int, err: BaseException | None) -> None:
        stream = self.streams[sid]
        pos = int(stream.submitted)
        q = self.inflight.setdefault(sid, deque())
        with self.lock:
            q.append((pos, seq, err))

    def _watch(self, sids: set[int]) -> None:
        """Report the work of this batch: at once where it has completed already (small work
        runs inline), else when the real stream reaches it (through the sender thread)."""
        done: dict[int, int] = {}
        for sid in sids:
            stream = self.streams[sid]
            pos = int(stream.submitted)
            if stream.completed >= pos:
                done[sid] = pos
                continue

            def fire(sid: int = sid, pos: int = pos) -> None:
                with self.lock:
                    self.out.append((sid, pos))
                    self.wake.notify()

            stream.add_waiter(pos, fire)
        if done:
            self._report(done)

    def _pending(self, positions: list[tuple[int, int]]) -> bool:
        """Whether the real work behind the user's ``positions`` ((stream id, position) pairs)
        is still running; :attr:`_pending_done` is then what to report, and :attr:`_waits`
        what to wait for."""
        done: dict[int, int] = {}
        waits = []
        for sid, seq in positions:
            q = self.inflight.get(sid)
            stream = self.streams.get(sid)
            if not q or stream is None:
                continue
            real = 0
            with self.lock:
                for pos, s, _err in q:
                    if s > seq:
                        break
                    real = pos
            if not real:
                continue
            if stream.completed < real:
                waits.append((stream, real))
            done[sid] = max(done.get(sid, 0), real)
        self._pending_done = done
        self._waits = waits
        return bool(waits)

    async def _settle(self, positions: list[tuple[int, int]]) -> None:
        """Wait until the user's ``positions`` have completed here, and report them before the
        reply that follows (a read waits for its writers in the worker: one round trip)."""
        from accelkit._core.loop import wait_for_callback

        self._pending(positions)
        done, waits = self._pending_done, self._waits
        for stream, real in waits:
            if stream.completed < real:
                await wait_for_callback(functools.partial(_add_waiter, stream, real))
        if done:
            self._report(done)

    # -- the loop ---------------------------------------------------------------------------------
    def _recv(self) -> list[bytes]:
        """The complete frames (``Connection.send_bytes``'s: a 4-byte big-endian length, or -1
        and an 8-byte one) that can be read now, without blocking; a partial one is kept."""
        buf = self.rbuf
        chunk = self.rchunk
        while True:
            try:
                got = self.rsock.recv_into(chunk, len(chunk), socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                os._exit(0)
            if not got:
                os._exit(0)  # the parent is gone, or closed the pipe
            buf += chunk[:got]
            if got < len(chunk):
                break
        frames = []
        view = memoryview(buf)
        at = 0
        end = len(buf)
        while end - at >= 4:
            (n,) = _HEAD.unpack_from(view, at)
            head = 4
            if n == -1:
                if end - at < 12:
                    break
                (n,) = _HEAD8.unpack_from(view, at + 4)
                head = 12
            if end - at - head < n:
                break
            frames.append(bytes(view[at + head : at + head + n]))
            at += head + n
        view.release()
        if at:
            del buf[:at]
        return frames

    async def serve(self) -> None:
        import anyio

        threading.Thread(target=self._sender, daemon=True, name="accelkit-iso-sender").start()
        fd = self.conn.fileno()
        self.rsock = socket.socket(fileno=os.dup(fd))
        self.loop_ident = threading.get_ident()
        async with anyio.create_task_group() as tg:
            self.tg = tg
            while True:
                # The loop itself waits on the pipe: no thread between a batch and its handling.
                await anyio.wait_readable(fd)
                batch = self._recv()
                if not batch:
                    continue
                touched: set[int] = set()
                self.outbox = []
                for data in batch:
                    f = io.BytesIO(data)
                    while f.tell() < len(data):
                        msgs = pickle.load(f)
                        for msg in msgs:
                            if msg[0] in _RESOLVED:
                                try:
                                    msg = _resolve_msg(self, msg)
                                except BaseException as err:
                                    if msg[0] == "q":
                                        self.reply(msg[1], False, err)
                                    elif msg[0] != "f":  # a call: it fails at its position
                                        self._track(msg[1], msg[2], err)
                                        touched.add(msg[1])
                                    continue
                            if msg[0] == "q" and touched:
                                self._watch(touched)  # what came before is reported first
                                touched = set()
                            if await self.handle(msg, touched):
                                tg.cancel_scope.cancel()
                                return
                if touched:
                    self._watch(touched)
                self.flush_out()

    def _use(self, sid: int) -> None:
        """Make the real stream of ``sid`` current for the calls that follow (the loop's task
        keeps it; set only when it changes, not per call as ``use_stream`` would)."""
        self.backend.check_ready()
        if sid != self.cur_sid:
            self.backend._stream_var.set(self.streams[sid])
            self.cur_sid = sid

    async def handle(self, msg: Any, touched: set[int]) -> bool:
        op = msg[0]
        if op == "c":  # a kernel call: ("c", sid, seq, kind, name, args, kwargs)
            _, sid, seq, kind, name, args, kwargs = msg
            err = None
            try:
                self._use(sid)
                getattr(self.objs[kind], name)(*args, **kwargs)
            except BaseException as exc:
                err = exc
            self._track(sid, seq, err)
            touched.add(sid)
        elif op == "e":  # ("e", tid, bid, shape, dtype, kind, sid)
            _, tid, bid, shape, dtype, kind, sid = msg
            try:
                self._use(sid)
                t = self.objs[kind].empty(shape, dtype)
                self.tensors[tid] = t
                self.bufs[bid] = t._buffer
            except BaseException as exc:
                self.tensors[tid] = exc
        elif op == "v":  # ("v", tid, src_tid, shape, kind)
            _, tid, src, shape, kind = msg
            base = self.tensors.get(src)
            if base is None or isinstance(base, BaseException):
                self.tensors[tid] = base if base is not None else _stale("tensor", src)
            else:
                self.tensors[tid] = self.objs[kind].view(base, shape)
        elif op == "x":  # ("x", tids, bids, eids): the user's handles died
            for tid in msg[1]:
                self.tensors.pop(tid, None)
            for bid in msg[2]:
                self.raw.pop(bid, None)
            for eid in msg[3]:
                self.events.pop(eid, None)
        else:
            return await self.handle_rare(msg, touched)
        return False

    async def handle_rare(self, msg: Any, touched: set[int]) -> bool:
        op = msg[0]
        mm: Any = self.backend.memory_manager if self.backend is not None else None
        if op == "a":  # ("a", bid, nbytes): a raw allocation
            with contextlib.suppress(BaseException):  # the buffer is then stale where used
                self.raw[msg[1]] = mm.allocate(msg[2])
        elif op == "f":  # ("f", sid, buffer, bid)
            with contextlib.suppress(BaseException), self.backend.use_stream(self.streams[msg[1]]):
                mm.free(msg[2])
            self.raw.pop(msg[3], None)
        elif op == "cp":  # ("cp", sid, seq, dst, src)
            _, sid, seq, dst, src = msg
            err = None
            try:
                with self.backend.use_stream(self.streams[sid]):
                    mm.copy_dtod(dst, src)
            except BaseException as exc:
                err = exc
            self._track(sid, seq, err)
            touched.add(sid)
        elif op == "s":  # ("s", sid): a new stream
            self.streams[msg[1]] = self.backend.create_stream()
        elif op == "ev":  # ("ev", sid, eid): record an event
            self.events[msg[2]] = self.streams[msg[1]].record_event()
        elif op == "we":  # ("we", sid, seq, eid)
            _, sid, seq, eid = msg
            err = None
            try:
                self.streams[sid].wait_event(self.events[eid])
            except BaseException as exc:
                err = exc
            self._track(sid, seq, err)
            touched.add(sid)
        elif op == "bad":  # ("bad", sid, seq, text): a call that could not be sent
            from accelkit.errors import InvalidArgumentError

            self._track(msg[1], msg[2], InvalidArgumentError(msg[3]))
            touched.add(msg[1])
        elif op == "q":  # a request: ("q", req, what, *args)
            req, what, args = msg[1], msg[2], msg[3:]
            if what in _READS:  # (..., positions): may wait for its writers; others go on
                if self._pending(args[-1]):
                    self.tg.start_soon(self.answer_read, req, what, args)
                    return False
                self._report(self._pending_done)
                args = args[:-1]
            else:
                self.flush_out()  # it may take a while: what came before goes first
            try:
                value = await self.request(what, *args)
            except BaseException as exc:
                self.reply(req, False, exc)
            else:
                self.reply(req, True, value)
                if what == "shutdown" and not args[0]:
                    return True
        return False

    async def answer_read(self, req: int, what: str, args: tuple[Any, ...]) -> None:
        """A read: once the user's positions it names have completed (reported first), read."""
        try:
            await self._settle(args[-1])
            value = await self.request(what, *args[:-1])
        except BaseException as exc:
            self.reply(req, False, exc)
        else:
            self.reply(req, True, value)

    async def request(self, what: str, *args: Any) -> Any:
        import numpy as np

        from accelkit._core.isolation.proto import map_segment

        b = self.backend
        if what == "ping":  # the user's process checks that an idle worker still answers
            return None
        if what == "open":
            return await self.open(*args)
        mm = b.memory_manager
        if what == "read":  # (tensor, segment path or None)
            t, path = args
            if path is None:
                return await mm.read_tensor(t)
            # straight into the caller's segment: one copy, no array in between
            await mm.copy_dtoh(map_segment(path, t.nbytes), t)
            return None
        if what == "readb":  # (buffer, tensor or None, nbytes, path or None)
            buf, t, nbytes, path = args
            out = np.empty(nbytes, np.uint8) if path is None else map_segment(path, nbytes)
            await mm.copy_dtoh(out, t if t is not None else buf)
            return out if path is None else None
        if what == "write":  # (sid, buffer, tensor or None, bytes or path, nbytes)
            sid, buf, t, data, nbytes = args
            src = np.frombuffer(data, np.uint8) if not isinstance(data, str) else None
            if src is None:
                src = map_segment(data, nbytes)
            with b.use_stream(self.streams[sid]):
                await mm.copy_htod(t if t is not None else buf, src)
            return None
        if what == "info":
            return mm.memory_info()
        if what == "configure":
            mm.configure_pool(args[0])
            return None
        if what in ("trim", "reset_peak"):
            return getattr(mm, what)()
        if what == "load_kernel":
            source, name, language, options = args
            return await b.kernel_executor.load_kernel(
                source, name, language=language, options=options
            )
        if what == "kernel_info":
            return b.kernel_executor.kernel_info(args[0])
        if what == "unload_kernel":
            b.kernel_executor.unload_kernel(args[0])
            return None
        if what == "sync":
            await b.synchronize()
            return None
        if what == "shutdown":  # (keep,): keep serving, for the next open
            return await self.shutdown(bool(args[0]))
        raise ValueError(f"unknown request {what!r}")

    async def open(self, spec: str, device: str | None, pool_config: Any) -> dict[str, Any]:
        from accelkit.registry import _import_path, default_registry
        from accelkit.sdk.kernels import _OPTIONAL_KERNELS as OPTIONAL_KERNELS
        from accelkit.sdk.kernels import FactoryKernels, FusedKernels, TensorKernels

        if ":" in spec and "." in spec.partition(":")[0]:
            cls = _import_path(spec)
        else:
            cls = default_registry.backend_class(spec)
        b = cls(pool_config) if pool_config is not None else cls()
        await b.initialize(device)
        self.backend = b
        self.streams = {0: b.default_stream}
        self.cur_sid = None
        tensor = b.tensor_ops.kernels
        factory = b.tensor_factory.kernels
        fused = b.kernel_ops.kernels
        executor = b.kernel_executor
        self.objs = {"t": tensor, "f": factory, "k": fused, "e": executor, "F": _Uploads(factory)}
        info: dict[str, Any] = {
            "name": b.name,
            "version": getattr(b, "version", ""),
            "device": str(b.device),
            "device_kinds": sorted(b.device_kinds),
            "capabilities": b.capabilities,
            "dtypes": b.supported_dtypes,
            "overrides": sorted(
                n
                for n in OPTIONAL_KERNELS
                if isinstance(tensor, TensorKernels) and tensor.overrides(n)
            ),
            "fused_ops": sorted(fused.fused_ops) if isinstance(fused, FusedKernels) else [],
            "device_random": isinstance(factory, FactoryKernels) and factory.device_random,
            "languages": sorted(executor.languages) if executor is not None else None,
            "pid": os.getpid(),
        }
        return info

    async def shutdown(self, keep: bool) -> int:
        """Shut the real backend down; its memory in use just before (0 when every tensor was
        dropped). With ``keep``, the worker then waits for the next open."""
        b = self.backend
        self.tensors.clear()
        self.raw.clear()
        self.events.clear()
        import gc

        gc.collect()
        used = b.memory_manager.memory_info().used if b is not None else 0
        if b is not None:
            await b.shutdown()
        with self.lock:
            self.inflight.clear()
            self.out.clear()
            self.streams = {}
            self.objs = {}
            self.backend = None
            self.cur_sid = None
            if not keep:
                self.closing = True
                self.wake.notify()
        return int(used)


class _Uploads:
    """Large uploads: the factory's ``from_host`` from a shared-memory segment, unlinked once
    the kernel took its snapshot."""

    def __init__(self, factory: Any) -> None:
        self.factory = factory

    def from_host(self, out: Any, path: str, dtype: str, shape: tuple[int, ...]) -> None:
        import numpy as np

        from accelkit._core.isolation.proto import map_segment

        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        try:
            arr = map_segment(path, n).view(dt).reshape(shape)
            self.factory.from_host(out, arr)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
