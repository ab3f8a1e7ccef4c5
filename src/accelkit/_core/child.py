"""A child process that reports progress as JSON events, with a timeout on each step.

What the self-test (:mod:`accelkit._core.selftest`) and the CPU JIT's crash check
(:mod:`accelkit._core.host_jit.verify`) share: code that may crash or hang its process runs
in a child, which prints one JSON object per line on stdout (after ``marker``) as it goes; the
parent kills it when a step (start-up until the first event, then from one event to the next,
then the exit) takes longer than ``step_timeout``, and keeps the tail of its stderr to say why
it died.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ChildRun", "crash_line", "ending", "run_child", "signal_name"]

_STDERR_TAIL = 400  # lines


@dataclass
class ChildRun:
    """What a child did: its events in order, how it ended, the last lines of its stderr."""

    events: list[dict[str, Any]]
    returncode: int
    timed_out: bool
    stderr: str
    seconds: float


def run_child(
    cmd: Sequence[str],
    *,
    step_timeout: float,
    marker: str = "",
    on_event: Callable[[dict[str, Any]], None] | None = None,
    env: Mapping[str, str] | None = None,
) -> ChildRun:
    """Run ``cmd`` to its end, or until a step takes over ``step_timeout`` seconds (then its
    whole process group is killed). ``on_event`` is called from a reader thread with each
    event as it arrives. Raises OSError if the child cannot be started."""
    start = time.monotonic()
    proc = subprocess.Popen(
        list(cmd),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=None if env is None else dict(env),
        start_new_session=True,  # a timeout kills the whole group, helpers included
    )
    events: list[dict[str, Any]] = []
    tail: collections.deque[str] = collections.deque(maxlen=_STDERR_TAIL)
    progress = [start]  # when the child last reported an event: each step gets the timeout

    def read_stdout() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace")
            if not line.startswith(marker):
                continue
            try:
                event = json.loads(line[len(marker) :])
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
                progress[0] = time.monotonic()
                if on_event is not None:
                    on_event(event)

    def read_stderr() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            tail.append(raw.decode("utf-8", "replace").rstrip("\n"))

    readers = [threading.Thread(target=f, daemon=True) for f in (read_stdout, read_stderr)]
    for t in readers:
        t.start()
    timed_out = False
    try:
        while True:
            left = progress[0] + step_timeout - time.monotonic()
            if left <= 0:
                timed_out = True
                _kill_group(proc)
                proc.wait()
                break
            try:
                proc.wait(timeout=left)
                break
            except subprocess.TimeoutExpired:
                continue  # the child may have reported progress meanwhile
    except BaseException:  # Ctrl-C in the parent: never leave the child behind
        _kill_group(proc)
        proc.wait()
        raise
    for t in readers:
        t.join(timeout=5.0)
    return ChildRun(events, proc.returncode, timed_out, "\n".join(tail), time.monotonic() - start)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (OSError, AttributeError):
        proc.kill()


def ending(run: ChildRun, hang: str) -> str:
    """How a child ended that did not finish its work, in words: ``hang`` where it ran past
    its timeout, else the signal that killed it or its exit status, with the last meaningful
    line of its stderr (:func:`crash_line`)."""
    if run.timed_out:
        return hang
    if run.returncode < 0:
        reason = f"crashed the process ({signal_name(run.returncode)})"
    else:
        reason = f"ended the process (status {run.returncode})"
    line = crash_line(run.stderr)
    return f"{reason}: {line}" if line else reason


def signal_name(returncode: int) -> str:
    """``SIGABRT`` for a return code of -6 (a process killed by a signal)."""
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


#: Lines that say what went wrong, from native code or Python, best first within one line.
_ERROR_LINE = re.compile(
    r"(LLVM ERROR|Fatal Python error|terminate called|Assertion .* failed|"
    r"Segmentation fault|\bSIG[A-Z]+\b|\bpanicked at\b|\berror\b|\bError\b|ERROR|"
    r"\bfailed\b|\bexception\b|\bException\b|\babort)",
)
#: Lines that are noise when looking for the reason: faulthandler's stack dump, compiler
#: warnings, progress, and Python's warnings machinery.
_NOISE_LINE = re.compile(
    r"^(\s|File \"|Current thread|Thread 0x|Extension modules|Stack \(most recent|"
    r"warning:|.*Warning:|\d+ warnings? generated|accelkit selftest:|Traceback|<no Python frame>)"
)
_MAX_REASON = 200


def crash_line(stderr: str) -> str:
    """The last meaningful line of a crashed process's stderr: the last line that names an
    error (``LLVM ERROR: ...``, ``terminate called ...``, ``Fatal Python error: ...`` only where
    nothing better precedes it), else the last line that is not noise; shortened."""
    # pytest's progress dots leave no newline before a fatal error's first line
    text = stderr.replace("Fatal Python error", "\nFatal Python error")
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    candidates = [line for line in lines if not _NOISE_LINE.match(line)]
    fatal = [line for line in candidates if line.startswith("Fatal Python error")]
    errors = [
        line
        for line in candidates
        if _ERROR_LINE.search(line) and not line.startswith("Fatal Python error")
    ]
    pick = (errors or fatal or candidates or [""])[-1]
    if pick.startswith("LLVM ERROR"):  # LLVM names the function it gave up on further down
        after = candidates[candidates.index(pick) + 1 :]
        where = next((line for line in after if line.startswith("In function:")), "")
        if where:
            pick += f" ({where.rstrip()})"
    # Addresses differ on every run and say nothing to a reader.
    pick = re.sub(r"\s*\b0x[0-9a-fA-F]{6,}\b:?", "", pick)
    pick = re.sub(r"(\s*,)+(?=\s*(\(|$))", "", pick).strip()
    return pick if len(pick) <= _MAX_REASON else pick[: _MAX_REASON - 3] + "..."
