"""Where one step's time goes on the CUDA backend: a probe for benchmarks (issue 29).

A step is some ops submitted by the caller and then awaited (``await y.to_host()``). Around
one step, :class:`StepProbe` measures, in milliseconds from the moment the caller starts
submitting (``begin``):

- ``submit_ms``: when the caller's last op returned (``submitted``);
- ``first_launch_ms``: when the step's first launch began: the submission thread starting
  the step's first closure, or the caller taking the thread's turn to launch in place
  (inline launches, ``accelkit_cuda.stream.INLINE``), whichever came first;
- ``launched_ms``: when the submission thread reached a probe closure queued right after the
  step's ops, i.e. had launched them all;
- ``completed_ms``: when the stream's completer thread saw the step's last position complete;
- ``done_ms``: when the await returned (``finish``);
- ``gpu_ms``: device time between two timing events recorded on the stream around the step's
  ops (it includes any time the GPU sat idle waiting for launches);
- ``thread_busy_ms``: time the submission thread spent in the step's closures;
- ``inline_positions`` and ``inline_ms``: the step's positions launched on the caller's thread,
  and the time callers held the thread's turn while the step was submitted (its launches: the
  trace stops at ``submitted``, before the await's end events);
- ``thread_waited_ms`` (and ``thread_max_wait_ms``): time a closure was queued while the
  submission thread was free but had not started it yet, summed (and the longest): its wake-up
  from the queue's condition plus its wait for the GIL (the caller or the completer running
  Python meanwhile). It cannot tell the two apart;
- per step: ``closures`` (the step's ops' closures), ``positions`` (stream positions, the
  await's copy included), ``events_created`` and ``events_recorded`` (end-of-position CUDA
  events), ``completer_rounds`` and ``thread_rounds`` (times the completer and the submission
  thread took work off their queues).

:meth:`StepProbe.begin` queues its first timing event, then waits (blocking, briefly) until the
submission thread is idle again, as it is after an await: the step starts as a real one does,
and its plain launches can be made inline where that is switched on (the timing event queued
just before them kept them all queued before). Nothing here runs unless a benchmark makes a probe: the submission thread's tracing is made of
attributes it sets for the step (:meth:`SubmissionThread.start_trace`), the counters are plain
integers the stream and thread keep anyway. A traced step is a little slower than an untraced
one (a wrapper and three clock reads per closure, two timing events, a probe closure): read the
timeline next to the untraced figure, for its proportions. Unverified on a GPU: written and
tested over the plugin's stand-in for CuPy; its first GPU figures come from
``benchmarks/bench_cuda.py``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accelkit_cuda.backend import CUDABackend

__all__ = ["FIELDS", "StepProbe", "describe", "medians"]

#: The figures of one step, in the order :func:`medians` reports them.
FIELDS = (
    "submit_ms", "first_launch_ms", "launched_ms", "completed_ms", "done_ms", "gpu_ms",
    "thread_busy_ms", "thread_waited_ms", "thread_max_wait_ms", "inline_ms", "closures",
    "positions", "inline_positions", "events_created", "events_recorded", "completer_rounds",
    "thread_rounds",
)  # fmt: skip


class StepProbe:
    """Times one step at a time on ``backend``'s default stream: call :meth:`begin` before the
    step's first op, :meth:`submitted` after its last, :meth:`finish` once its await returned
    (see the module docstring). Not reentrant; one step at a time."""

    def __init__(self, backend: CUDABackend) -> None:
        self.thread = backend.thread
        self.stream = backend.default_stream

    def _counts(self) -> tuple[int, ...]:
        s = self.stream
        return (
            s.submitted, s.events_created, s.events_recorded, s.completer_rounds,
            self.thread.rounds, s.inline_launches,
        )  # fmt: skip

    def begin(self, idle_timeout: float = 1.0) -> None:
        """Before the step's first op: records the first timing event (queued for the
        submission thread), then spins (blocking, yielding the interpreter lock, at most
        ``idle_timeout`` seconds) until that thread is idle again. The event is recorded when
        the thread runs it, so ``gpu_ms`` counts the few microseconds from there to the idle
        thread seen here as device idle time."""
        self._counts0 = self._counts()
        self._ev0 = self.stream.record_event()
        thread = self.thread
        deadline = time.perf_counter() + idle_timeout
        while not thread.idle and time.perf_counter() < deadline:
            time.sleep(0)
        self._turns: list[tuple[float, float]] = []
        self._trace = thread.start_trace(turns=self._turns)
        self._t0 = time.perf_counter()

    def submitted(self) -> None:
        """Right after the step's last op returned (before the await)."""
        self._t_submit = time.perf_counter()
        self.thread.stop_trace()
        launched: list[float] = []
        self._launched = launched
        self.thread.submit(lambda: launched.append(time.perf_counter()))
        self._ev1 = self.stream.record_event()
        completed: list[float] = []
        self._completed = completed
        self.stream.add_waiter(self.stream.submitted, lambda: completed.append(time.perf_counter()))

    def finish(self) -> dict[str, float]:
        """Once the step's await returned: its figures (blocks briefly for the device time)."""
        t_done = time.perf_counter()
        t0 = self._t0
        gpu_ms = self._ev0.elapsed_ms(self._ev1)
        trace = list(self._trace)
        busy = waited = longest = 0.0
        free_since = float("-inf")
        for queued, started, ended in trace:
            wait = started - max(queued, free_since)
            if wait > 0:
                waited += wait
                longest = max(longest, wait)
            busy += ended - started
            free_since = ended
        c0, c1 = self._counts0, self._counts()
        d = [b - a for a, b in zip(c0, c1, strict=True)]
        turns = [t for t in self._turns if t[0] >= t0]  # (a turn taken before begin: none)
        starts = [trace[0][1]] if trace else []
        if turns:
            starts.append(turns[0][0])
        first = min(starts) if starts else float("nan")
        return {
            "submit_ms": 1e3 * (self._t_submit - t0),
            "first_launch_ms": 1e3 * (first - t0),
            "launched_ms": 1e3 * (self._launched[0] - t0) if self._launched else float("nan"),
            "completed_ms": 1e3 * (self._completed[0] - t0) if self._completed else float("nan"),
            "done_ms": 1e3 * (t_done - t0),
            "gpu_ms": gpu_ms,
            "thread_busy_ms": 1e3 * busy,
            "thread_waited_ms": 1e3 * waited,
            "thread_max_wait_ms": 1e3 * longest,
            "inline_ms": 1e3 * sum(left - entered for entered, left in turns),
            "closures": float(len(trace)),
            "positions": float(d[0]),
            "inline_positions": float(d[5]),
            "events_created": float(d[1]),
            "events_recorded": float(d[2]),
            "completer_rounds": float(d[3]),
            "thread_rounds": float(d[4]),
        }


def medians(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    """The median of each figure over ``rows`` (one per step)."""
    return {k: statistics.median(r[k] for r in rows) for k in FIELDS if rows and k in rows[0]}


def describe(m: dict[str, Any], steps: int) -> list[str]:
    """Two lines (each under 400 characters, the GPU check's cut) for a benchmark's output:
    the medians ``m`` of ``steps`` steps, the times, then the thread's share and the counts."""
    return [
        f"step timeline (median of {steps}, ms from the first op): ops submitted"
        f" {m['submit_ms']:.2f}, first launch {m['first_launch_ms']:.2f}, all launched"
        f" {m['launched_ms']:.2f}, completer saw the end {m['completed_ms']:.2f}, await returned"
        f" {m['done_ms']:.2f}; GPU {m['gpu_ms']:.2f} ms event to event",
        f"step: submission thread busy {m['thread_busy_ms']:.2f} ms, waited with work queued"
        f" {m['thread_waited_ms']:.2f} ms (longest {m['thread_max_wait_ms']:.2f}); per step"
        f" {m['closures']:.0f} closures, {m['positions']:.0f} positions"
        f" ({m['inline_positions']:.0f} inline, {m['inline_ms']:.2f} ms in the caller's turns),"
        f" {m['events_recorded']:.0f} events recorded ({m['events_created']:.0f} new),"
        f" {m['completer_rounds']:.0f} completer rounds, {m['thread_rounds']:.0f} submission"
        " rounds",
    ]
