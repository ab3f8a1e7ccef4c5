"""Graph capture: record a fixed-shape sequence of submissions once, replay it as one call.

``async with backend.capture() as graph:`` records every kernel call the task submits on its
current stream while the block runs. The calls also run, as usual (the capture is a warm-up
run as well: kernels compile, pools fill, the outputs hold that run's results); afterwards
``graph.replay()`` submits the same calls again, on the same tensors, without the facades'
validation and allocation, or as one native launch where the backend has graphs (its
``_capture_graph`` hook: CUDA graphs on the CUDA backend).

Where it records: the facades (TensorOps, TensorFactory, KernelOps, the memory manager) call
a backend's kernel objects (:mod:`accelkit.sdk.kernels`) with validated inputs and allocated
outputs. While a capture is open, the kernel objects' work methods are shadowed by recording
wrappers (instance attributes, removed when the capture ends), so a submission outside a capture
costs nothing more: no flag is tested on the hot path. A call made inside a recorded call (a
fused kernel that composes TensorOps) runs but is not recorded again: replaying the outer call
makes it.

What the capture refuses, in the capturing task: host reads and waits (``to_host``, ``numpy``,
``copy_dtoh``, ``copy_htod``, ``synchronize``, event and stream waits on the capture stream),
frees, another stream, a nested capture. Other tasks are not affected: their submissions, on
any stream, run as usual and are not recorded.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit._core.op_names import KERNEL_OPS_IN_ORDER
from accelkit.abc.memory import DeviceBuffer
from accelkit.errors import (
    CaptureError,
    StaleHandleError,
    UnsupportedOperationError,
)
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit._core.pool import CachingPool
    from accelkit._core.positions import PositionStream
    from accelkit._core.stream_backend import StreamBackend

__all__ = [
    "CapturedGraph",
    "GraphCapture",
    "GraphRecording",
    "NativeGraph",
    "RecordedCall",
]

#: The recorder of the capture this context (task) is inside, if any.
_CAPTURING: contextvars.ContextVar[_Recorder | None] = contextvars.ContextVar(
    "accelkit_capturing", default=None
)

#: The kernel objects' methods that submit work (and so are recorded), by SDK interface. The
#: rest (``empty``, ``view``, ``overrides``, ``fused_ops``, ...) pass through untouched.
_TENSOR_WORK = (
    "unary", "binary", "where", "cast", "gemm", "matmul", "linear", "reduce", "permute",
    "concat", "narrow", "gather", "scatter", "conv2d", "attention", "softmax", "layer_norm",
    "rms_norm", "cross_entropy", "embedding", "adam_update", "depthwise", "separable_filter",
    "sobel_magnitude", "grayscale", "take", "cumulative", "argsort", "scatter_reduce",
    "attention_bshd",
)  # fmt: skip
_FACTORY_WORK = ("fill", "from_host", "random", "generate")
_FUSED_WORK = (*KERNEL_OPS_IN_ORDER, "attention_bshd")
_EXECUTOR_WORK = ("execute_kernel", "dispatch_compute")
#: Memory kernels: ``copy`` (copy_dtod) is a submission and is recorded; the host transfers and
#: frees are refused inside a capture (the memory manager says so before calling them).
_MEMORY_WORK = ("copy",)


def _buffers(values: Any) -> Iterator[DeviceBuffer]:
    for v in values:
        if isinstance(v, DeviceBuffer):
            yield v


def _tensors(values: Any) -> Iterator[Tensor]:
    for v in values:
        if type(v) is Tensor:
            yield v
        elif isinstance(v, (list, tuple)):
            for w in v:
                if type(w) is Tensor:
                    yield w


@dataclass(frozen=True, eq=False)
class RecordedCall:
    """One kernel call of a capture: ``getattr(kernels, name)(*args, **kwargs)``, with the
    tensors it read (``inputs``) and wrote (``outputs``, seen by their writer changing)."""

    kernels: Any
    name: str
    method: Callable[..., Any] = field(repr=False)
    args: tuple[Any, ...] = field(repr=False)
    kwargs: dict[str, Any] = field(repr=False)
    inputs: tuple[Tensor, ...] = field(repr=False)
    outputs: tuple[Tensor, ...] = field(repr=False)
    #: The raw buffers it was given (``memory_manager.copy_dtod(buffer, ...)``): a replay uses
    #: them as they are, so they must stay allocated as the tensors do.
    buffers: tuple[DeviceBuffer, ...] = field(default=(), repr=False)

    def __call__(self) -> Any:
        """Submit the call again (on the current stream), as the facade did."""
        return self.method(*self.args, **self.kwargs)


@dataclass(frozen=True, eq=False)
class GraphRecording:
    """What a capture recorded, as a backend's ``_capture_graph`` hook receives it: the stream,
    the calls in order, and the tensors the graph reads from outside (``inputs``) and writes
    (``outputs``). Replaying ``calls`` in order on ``stream`` is the generic replay."""

    stream: PositionStream
    calls: tuple[RecordedCall, ...]
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]


@dataclass(frozen=True)
class NativeGraph:
    """A backend's own replay of a recording (what ``_capture_graph`` returns where it has one):
    ``launch()`` submits the whole graph on the recording's stream (a submission: it returns at
    once and records the outputs as written, :func:`accelkit.sdk.mark_written`); ``kind`` names
    it (``"cuda-graph"``)."""

    launch: Callable[[], object]
    kind: str


class _Inside(threading.local):
    #: 1 while a recorded call runs on this thread.
    depth = 0


class _Recorder:
    """The state of one open capture."""

    def __init__(self, backend: StreamBackend[Any], stream: PositionStream) -> None:
        self.backend = backend
        self.stream = stream
        self.calls: list[RecordedCall] = []
        #: Per thread, whether a recorded call is running there: a call it makes (a fused
        #: kernel composing TensorOps) runs unrecorded. Per thread, not per capture: another
        #: task's call running meanwhile on another thread (``from_host_async``'s copy on a
        #: worker thread) must not hide this task's calls from the recording.
        self.inside = _Inside()
        #: The buffers allocated while the capture is open (:meth:`watch_allocations`).
        self.fresh: weakref.WeakSet[Any] = weakref.WeakSet()
        self.open = True
        self.shadowed: list[tuple[Any, str]] = []

    # -- refusals -----------------------------------------------------------------------------------
    def mine(self) -> bool:
        return _CAPTURING.get() is self

    def refuse(self, what: str) -> None:
        """Raise CaptureError when the calling task is inside this capture."""
        if self.open and _CAPTURING.get() is self:
            raise CaptureError(
                f"{what} inside a graph capture: a captured sequence may not read the device"
                " or wait for it (its replay would not read again); read the outputs after"
                " the capture block, or after a replay"
            )

    # -- recording ----------------------------------------------------------------------------------
    def shadow(self, obj: Any, names: tuple[str, ...]) -> None:
        if obj is None:
            return
        for name in names:
            if any(o is obj and n == name for o, n in self.shadowed):
                continue  # one object serving two roles: wrapped once
            real = getattr(obj, name, None)
            if real is None or not callable(real):
                continue
            try:
                setattr(obj, name, self._wrapper(obj, name, real))
            except AttributeError:
                raise UnsupportedOperationError(
                    f"graph capture needs to record {type(obj).__name__}.{name}; its object"
                    " takes no attributes (__slots__)"
                ) from None
            self.shadowed.append((obj, name))

    def watch_allocations(self, pool: Any) -> None:
        """Note every buffer ``pool`` hands out while the capture is open (in :attr:`fresh`):
        an output in new memory is written, not read, by its call."""
        if pool is None:
            return
        real = pool.allocate
        fresh = self.fresh

        def allocate(nbytes: int) -> Any:
            buf = real(nbytes)
            fresh.add(buf)
            return buf

        pool.allocate = allocate
        self.shadowed.append((pool, "allocate"))

    def guard_waits(self, stream: Any) -> None:
        """Refuse this task's waits on the capture stream (``event.wait()``,
        ``stream.synchronize()``) while the capture is open; best effort (a stream whose class
        has ``__slots__`` keeps its own)."""
        for name in ("wait_for", "wait_for_blocking"):
            real = getattr(stream, name)

            def guarded(seq: int, _real: Callable[..., Any] = real, _name: str = name) -> Any:
                self.refuse(f"waiting for {self.stream!r}")
                return _real(seq)

            try:
                setattr(stream, name, guarded)
            except AttributeError:
                return
            self.shadowed.append((stream, name))

    def unshadow(self) -> None:
        for obj, name in reversed(self.shadowed):
            with contextlib.suppress(AttributeError):
                delattr(obj, name)
        self.shadowed = []

    def _wrapper(self, obj: Any, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            inside = self.inside
            if not self.open or inside.depth:
                return real(*args, **kwargs)
            if _CAPTURING.get() is not self:  # another task: runs, is not recorded
                return real(*args, **kwargs)
            if self.backend.current_stream is not self.stream:
                raise CaptureError(
                    f"a graph capture records one stream ({self.stream!r}); this submission"
                    f" goes to {self.backend.current_stream!r}"
                )
            tensors = list(_tensors(args))
            tensors.extend(_tensors(kwargs.values()))
            before = [(t._stream, t._seq, t._buffer.last_write) for t in tensors]
            fresh = self.fresh
            inside.depth = 1
            try:
                result = real(*args, **kwargs)
            finally:
                inside.depth = 0
            outputs: list[Tensor] = []
            inputs: list[Tensor] = []
            for t, (s, q, written) in zip(tensors, before, strict=True):
                if t._stream is not s or t._seq != q:
                    outputs.append(t)
                    # Unless it is new memory (allocated in the capture, never written), it held
                    # values before the call, which the call may read as well (an in-place
                    # update: adam_update's param, m and v): the graph reads it too.
                    if written is not None or t._buffer not in fresh:
                        inputs.append(t)
                else:
                    inputs.append(t)
            # Host arrays (from_host's source) as they are now: a replay submits what the
            # captured run read, not what the caller's array holds by then (a CUDA graph keeps
            # its copy of them too).
            if any(type(a) is np.ndarray for a in args):
                args = tuple(a.copy() if type(a) is np.ndarray else a for a in args)
            if any(type(a) is np.ndarray for a in kwargs.values()):
                kwargs = {k: a.copy() if type(a) is np.ndarray else a for k, a in kwargs.items()}
            buffers = (*_buffers(args), *_buffers(kwargs.values()))
            self.calls.append(
                RecordedCall(obj, name, real, args, kwargs, tuple(inputs), tuple(outputs), buffers)
            )
            return result

        recorded.__name__ = name
        recorded.__wrapped__ = real  # type: ignore[attr-defined]
        return recorded

    def recording(self) -> GraphRecording:
        written: set[int] = set()
        inputs: dict[int, Tensor] = {}
        outputs: dict[int, Tensor] = {}
        for call in self.calls:
            for t in call.inputs:
                if id(t._buffer) not in written:
                    inputs.setdefault(id(t), t)
            for t in call.outputs:
                written.add(id(t._buffer))
                outputs[id(t)] = t
        return GraphRecording(
            self.stream, tuple(self.calls), tuple(inputs.values()), tuple(outputs.values())
        )


class CapturedGraph:
    """A recorded sequence of submissions (``backend.capture()`` makes it): replay it with
    :meth:`replay`, after writing new values into its input tensors with :meth:`write` or
    :meth:`copy` (the shapes are fixed). See docs/execution-model.md, "Graph capture"."""

    def __init__(self, backend: StreamBackend[Any], stream: PositionStream) -> None:
        self.backend = backend
        #: The stream it was captured on, and replays on.
        self.stream = stream
        self._pool: CachingPool | None = backend._pool
        self._gen = self._pool.generation if self._pool is not None else -1
        self._calls: tuple[RecordedCall, ...] = ()
        self._native: NativeGraph | None = None
        self._ready = False
        self._reads: frozenset[int] = frozenset()
        #: Every tensor the calls read or write, one per buffer (checked live at each use).
        self._held: tuple[Tensor, ...] = ()
        self._held_buffers: tuple[DeviceBuffer, ...] = ()
        self._frees = 0
        #: The tensors the graph reads that it did not write first (write new values here).
        self.inputs: tuple[Tensor, ...] = ()
        #: The tensors the graph writes (those allocated inside the capture belong to it).
        self.outputs: tuple[Tensor, ...] = ()

    def _finish(self, recording: GraphRecording, native: NativeGraph | None) -> None:
        self._calls = recording.calls
        self.inputs = recording.inputs
        self.outputs = recording.outputs
        self._reads = frozenset(id(t._buffer) for c in recording.calls for t in c.inputs)
        held: dict[int, Tensor] = {}
        for c in recording.calls:
            for t in (*c.inputs, *c.outputs):
                held.setdefault(id(t._buffer), t)
        self._held = tuple(held.values())
        self._held_buffers = tuple({id(b): b for c in recording.calls for b in c.buffers}.values())
        self._frees = -1  # the first use looks (a free may have come during the build)
        self._native = native
        self._ready = True

    # -- what it is ---------------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        """How it replays: ``"calls"`` (the recorded kernel calls, in order) or the backend's
        native graph (``"cuda-graph"``)."""
        return self._native.kind if self._native is not None else "calls"

    @property
    def num_calls(self) -> int:
        """How many kernel calls it recorded."""
        return len(self._calls)

    def __repr__(self) -> str:
        state = "ready" if self._ready else "unfinished"
        return (
            f"<CapturedGraph on {self.backend.name} {self.stream!r}: {len(self._calls)} calls,"
            f" {self.kind}, {state}>"
        )

    # -- checks -------------------------------------------------------------------------------------
    def _check(self, what: str, stream: object = None) -> None:
        backend = self.backend
        pool = backend._pool
        if (
            not backend.is_ready
            or pool is None
            or pool is not self._pool
            or pool.generation != self._gen
        ):
            raise StaleHandleError(
                f"{what}: this graph was captured on {backend.name} before a shutdown (or a"
                " device reset); capture it again"
            )
        if not self._ready:
            raise CaptureError(f"{what}: the capture of this graph did not complete")
        if pool.frees != self._frees:  # something was freed since the last look
            self._check_held(what)
            self._frees = pool.frees
        current = backend.current_stream
        target = current if stream is None else stream
        if target is not self.stream:
            raise CaptureError(
                f"{what}: this graph was captured on {self.stream!r} and replays there only;"
                f" asked for {target!r}"
            )
        if current is not self.stream:
            raise CaptureError(
                f"{what}: the current stream is {current!r}; this graph replays on"
                f" {self.stream!r} (use `with backend.use_stream(graph.stream):`)"
            )
        rec = backend._capture
        if rec is not None and rec.mine():
            raise CaptureError(f"{what} inside a graph capture (captures do not nest)")

    def _check_held(self, what: str) -> None:
        """Raise StaleHandleError if a tensor of the graph was freed since the capture."""
        for t in self._held:
            if t._buffer._pool is None:
                # Freed (memory_manager.free) since the capture: its block may hold another
                # tensor by now, which a replay would overwrite (a CUDA graph keeps addresses).
                role = "reads" if id(t._buffer) in self._reads else "writes"
                raise StaleHandleError(
                    f"{what}: a tensor this graph {role} ({t.shape} {t.dtype.value}) was freed"
                    " after the capture; its memory may hold another tensor now. Keep a graph's"
                    " tensors while it is replayed, or capture it again"
                )
        for b in self._held_buffers:
            if b._pool is None:  # a raw buffer given to a copy: the same hazard
                raise StaleHandleError(
                    f"{what}: a buffer this graph uses ({b.nbytes} bytes) was freed after the"
                    " capture; its memory may hold another tensor now. Keep a graph's buffers"
                    " while it is replayed, or capture it again"
                )

    def _check_input(self, what: str, dst: Tensor) -> None:
        if type(dst) is not Tensor:
            raise CaptureError(f"{what}: dst must be a Tensor; got {type(dst).__name__}")
        if id(dst._buffer) not in self._reads:
            raise CaptureError(
                f"{what}: dst {dst.shape} {dst.dtype.value} is no tensor this graph reads; write"
                " into the tensors the capture used (graph.inputs)"
            )

    # -- use ----------------------------------------------------------------------------------------
    def replay(self, stream: object = None) -> None:
        """Submit the graph again on its stream (a submission: returns at once); its outputs
        are then written as by the captured run, from the inputs' current values. Await them as
        usual. ``stream``, when given, must be the stream it was captured on."""
        self._check("replay", stream)
        native = self._native
        if native is not None:
            native.launch()
            return
        for call in self._calls:
            call.method(*call.args, **call.kwargs)

    async def write(self, dst: Tensor, values: Any) -> None:
        """Copy host ``values`` into the input tensor ``dst`` (after the work queued so far on
        the graph's stream and dst's last write, before the next replay; a read of dst queued
        on another stream is the program's to order, with an event). The shape is fixed:
        ``values`` must have ``dst``'s shape; it is converted to ``dst``'s dtype as
        ``np.asarray`` would."""
        self._check("write")
        self._check_input("write", dst)
        array = np.ascontiguousarray(values, dtype=dst.dtype.to_numpy())
        if array.shape != dst.shape:
            raise CaptureError(
                f"write: the graph was captured with {dst.shape}; got values of shape"
                f" {array.shape} (a captured graph has fixed shapes: capture another)"
            )
        await self.backend.memory_manager.copy_htod(dst, array)

    def copy(self, dst: Tensor, src: Tensor) -> None:
        """Copy the tensor ``src`` into the input tensor ``dst`` on the device (a submission),
        e.g. the token a replay sampled into the next replay's input. Shapes and dtypes must be
        equal."""
        self._check("copy")
        self._check_input("copy", dst)
        if type(src) is not Tensor:
            raise CaptureError(f"copy: src must be a Tensor; got {type(src).__name__}")
        if src.shape != dst.shape or src.dtype is not dst.dtype:
            raise CaptureError(
                f"copy: the graph was captured with dst {dst.shape} {dst.dtype.value}; src is"
                f" {src.shape} {src.dtype.value} (a captured graph has fixed shapes)"
            )
        self.backend.memory_manager.copy_dtod(dst, src)


class GraphCapture:
    """``async with backend.capture() as graph:``: records the submissions of the block (see
    the module docstring); ``graph`` (a :class:`CapturedGraph`) is ready once the block ends."""

    def __init__(self, backend: StreamBackend[Any]) -> None:
        self.backend = backend
        self._recorder: _Recorder | None = None
        self._token: contextvars.Token[_Recorder | None] | None = None
        self._graph: CapturedGraph | None = None

    async def __aenter__(self) -> CapturedGraph:
        backend = self.backend
        backend.check_ready()
        if self._recorder is not None:
            raise CaptureError("a GraphCapture is entered once; call backend.capture() again")
        # (A task started inside a capture keeps a copy of its context, and so the recorder,
        # after the capture has ended: only an open one counts.)
        outer = _CAPTURING.get()
        if outer is not None and outer.open and outer.backend is not backend:
            raise CaptureError(
                f"a graph capture on {outer.backend.name} is open in this task (captures do not"
                " nest, across backends either: end it first, or capture in another task)"
            )
        if (outer is not None and outer.open) or backend._capture is not None:
            raise CaptureError(
                "a graph capture is already open on this backend (captures do not nest; one"
                " at a time per backend)"
            )
        if backend._fallback_ops is not None:
            raise UnsupportedOperationError(
                "graph capture does not record the work a fallback backend runs; capture on a"
                " backend without enable_fallback"
            )
        stream = backend.current_stream
        rec = _Recorder(backend, stream)
        try:
            tensor_ops, factory, kernel_ops = (
                backend._tensor_ops,
                backend._tensor_factory,
                backend._kernel_ops,
            )
            rec.shadow(tensor_ops.kernels if tensor_ops else None, _TENSOR_WORK)
            rec.shadow(factory.kernels if factory else None, _FACTORY_WORK)
            rec.shadow(kernel_ops.kernels if kernel_ops else None, _FUSED_WORK)
            mm = backend._memory_manager
            rec.shadow(mm.kernels if mm else None, _MEMORY_WORK)
            rec.shadow(backend._kernel_executor, _EXECUTOR_WORK)
            rec.watch_allocations(backend._pool)
            rec.guard_waits(stream)
        except BaseException:
            rec.unshadow()
            raise
        self._recorder = rec
        backend._capture = rec
        self._token = _CAPTURING.set(rec)
        self._graph = CapturedGraph(backend, stream)
        return self._graph

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        import anyio

        rec, graph, backend = self._recorder, self._graph, self.backend
        assert rec is not None
        assert graph is not None
        rec.open = False
        rec.unshadow()
        if backend._capture is rec:
            backend._capture = None
        if self._token is not None:
            try:
                _CAPTURING.reset(self._token)
            except ValueError:  # left in another context (a task group's child): just clear
                _CAPTURING.set(None)
            self._token = None
        if exc_type is not None:
            return  # the graph stays unfinished: replay refuses
        recording = rec.recording()
        with anyio.CancelScope(shield=True):  # bounded: builds the backend's graph, if any
            native = await backend._capture_graph(recording)
        graph._finish(recording, native)
