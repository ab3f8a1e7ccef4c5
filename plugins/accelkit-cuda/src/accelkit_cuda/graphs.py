"""CUDA graphs for accelkit's graph capture (``backend.capture()``): the CUDA backend's
``_capture_graph`` hook.

When a capture block ends, its calls have run once on the stream as usual. This hook then:

1. re-issues the recorded calls with the stream's ``submit`` shadowed, collecting the closures
   they would queue for the submission thread (nothing is queued; no CUDA call is made); a
   submission another thread makes to the stream meanwhile is queued as usual;
2. on the submission thread, runs those closures between ``stream.begin_capture()`` and
   ``stream.end_capture()`` on the capture's own CUDA stream (CuPy's relaxed capture mode), so
   that their kernels, cuBLAS calls and copies become the nodes of one ``cupy.cuda.Graph``
   instead of running; CuPy's temporaries come from a memory pool of the graph's own
   (``cupy.cuda.using_allocator``), kept as long as the graph, so that no later work reuses
   memory the graph's nodes write. Meanwhile the thread is marked as capturing
   (:mod:`accelkit_cuda.capturing`): GEMMs go to cuBLAS through :mod:`accelkit_cuda.blas`
   (CuPy refuses its own cuBLAS calls on a capturing stream), whose handle and workspace for
   the stream are made before ``begin_capture``, and frees of the backend's pool wait until
   the capture ends;
3. returns a :class:`~accelkit.sdk.NativeGraph` whose ``launch()`` is one position on the
   stream: ``graph.launch(stream)`` after the pending writers of the graph's inputs on other
   streams, with every output recorded as written there.

If any of it fails (an operation CUDA cannot capture, such as a copy from pageable host memory
or a synchronizing call), the capture is ended, the failure is logged on the ``accelkit.cuda``
logger, and the graph replays its recorded calls instead (``graph.kind == "calls"``).
``ACCELKIT_CUDA_GRAPHS=0`` turns CUDA graphs off (the calls are replayed), to compare.

What a CUDA graph does not repeat: the value checks of a launch that finds bad input on the
device (an embedding index out of range) are made for the capture's own run, not for each
replay.

Unverified on a GPU: written against CuPy 13/14's ``Stream.begin_capture``/``end_capture`` and
``Graph.launch``, and tested here only over a stand-in for CuPy and cuBLAS (no device in this
repository's CI); the GPU tests (``tests/test_gpu.py``: a captured decode step and transformer
block) and ``benchmarks/bench_cuda.py`` check it on a device. An H100 run of 2026-11-27 (before
the GEMMs went to blas.py) got ``"calls"``: CuPy refused cuBLAS.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import cupy

from accelkit.sdk import GraphRecording, NativeGraph, env_str, mark_written, other_writers
from accelkit_cuda import blas
from accelkit_cuda.capturing import capturing, collecting

if TYPE_CHECKING:
    from accelkit_cuda.backend import CUDABackend
    from accelkit_cuda.stream import CUDAStream

__all__ = ["capture_graph", "graphs_enabled"]

_log = logging.getLogger("accelkit.cuda")


def graphs_enabled() -> bool:
    """False where ``ACCELKIT_CUDA_GRAPHS`` is 0/false/no/off (read when used)."""
    value = env_str("ACCELKIT_CUDA_GRAPHS")
    return value is None or value.lower() not in ("0", "false", "no", "off")


def _collect(recording: GraphRecording) -> list[Callable[[], object]]:
    """The closures the recorded calls queue, without queueing them (see the module docstring)."""
    stream: CUDAStream = recording.stream  # type: ignore[assignment]  # the CUDA backend's
    collected: list[Callable[[], object]] = []
    real = stream.submit
    collector = threading.get_ident()

    def submit(
        fn: Callable[[], object], keepalive: Any = (), after: Any = (), what: str = "a kernel",
        inline: Any = False,
    ) -> int:  # fmt: skip
        if threading.get_ident() != collector:
            # Another thread's submission to the stream meanwhile (a worker's copy for another
            # task): queued as usual, not taken into the graph.
            return real(fn, keepalive, after, what, inline)
        collected.append(fn)
        return stream.submitted  # a position already handed out: nothing new is queued

    setattr(stream, "submit", submit)  # noqa: B010 - an instance attribute, removed below
    try:
        with collecting():
            for call in recording.calls:
                call()
    finally:
        delattr(stream, "submit")
    return collected


async def capture_graph(backend: CUDABackend, recording: GraphRecording) -> NativeGraph | None:
    """The CUDA graph of a finished capture, or None (its calls are then replayed); see the
    module docstring."""
    if not graphs_enabled() or not recording.calls:
        return None
    stream: CUDAStream = recording.stream  # type: ignore[assignment]
    try:
        closures = _collect(recording)
    except Exception as exc:  # a call that cannot be re-issued: replay the calls
        _log.warning("no CUDA graph for this capture (%r): its calls are replayed", exc)
        return None

    def build() -> tuple[Any, Any, list[object]]:
        cp = stream.cp
        # cuBLAS's handle and this stream's workspace exist before the capture begins.
        blas.prepare(cp.ptr)
        pool = cupy.cuda.MemoryPool()
        kept: list[object] = []
        with capturing(cp.ptr), cupy.cuda.using_allocator(pool.malloc), cp:
            cp.begin_capture()
            try:
                for fn in closures:
                    kept.append(fn())
            except BaseException:
                try:
                    cp.end_capture()  # leave capture mode; the partial graph is dropped
                except Exception:  # the capture was invalidated: it is over either way
                    _log.debug("ending a failed CUDA graph capture", exc_info=True)
                raise
            graph = cp.end_capture()
        return graph, pool, kept

    try:
        graph, pool, kept = await backend.thread.call(build)
    except Exception as exc:
        _log.warning("no CUDA graph for this capture (%r): its calls are replayed", exc)
        return None
    inputs, outputs = recording.inputs, recording.outputs
    keep = (graph, pool, kept, recording)

    uploaded = False

    def run() -> None:
        nonlocal uploaded
        graph.launch(stream.cp)
        uploaded = True

    def launch() -> None:
        # A plain launch once it has run (its first launch uploads the graph to the device).
        writers = other_writers(stream, inputs)
        seq = stream.submit(run, keep, writers, "a CUDA graph", uploaded)
        mark_written(outputs, stream, seq)

    return NativeGraph(launch, "cuda-graph")
