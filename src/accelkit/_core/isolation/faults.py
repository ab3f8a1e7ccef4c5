"""The log of isolated workers' faults, kept so that ``accelkit doctor`` (another process, run
later) can show them.

Each fault an :class:`~accelkit._core.isolation.backend.IsolatedBackend` survives appends one
JSON line to ``faults.jsonl`` under ``isolation/`` in accelkit's cache folder
(:func:`accelkit.calibration.cache_dir`): when, the user's process, the backend and device, the
generation the fault ended, its cause and first line. The file keeps the last :data:`KEEP`
lines. Writing it never raises: a fault must not fail twice because a disk is full.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["KEEP", "FaultRecord", "log_path", "now", "read", "record"]

#: Lines kept in the log.
KEEP = 50
_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class FaultRecord:
    """One fault of an isolated worker."""

    time: float  # seconds since the epoch
    pid: int  # the user's process
    backend: str
    device: str
    generation: int  # the generation the fault ended (the recovered backend's is one more)
    cause: str  # the signal's name, "hang", "sticky", ...
    message: str  # the fault's first line


def log_path() -> Path:
    """The log's file (it may not exist)."""
    from accelkit.calibration import cache_dir

    return cache_dir() / "isolation" / "faults.jsonl"


def record(entry: FaultRecord) -> None:
    """Append ``entry``, keeping the last :data:`KEEP` lines; errors are swallowed."""
    path = log_path()
    try:
        with _lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = path.read_text().splitlines()[-(KEEP - 1) :] if path.exists() else []
            lines.append(json.dumps(asdict(entry)))
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text("\n".join(lines) + "\n")
            os.replace(tmp, path)
    except (OSError, ValueError):
        pass


def read(since: float | None = None) -> list[FaultRecord]:
    """The logged faults, oldest first (those at or after ``since`` where given); lines that do
    not parse are skipped."""
    try:
        text = log_path().read_text()
    except OSError:
        return []
    out: list[FaultRecord] = []
    for line in text.splitlines():
        try:
            entry = FaultRecord(**json.loads(line))
        except (ValueError, TypeError, RecursionError):  # (nesting deeper than json parses)
            continue
        if since is None or entry.time >= since:
            out.append(entry)
    return out


def now() -> float:
    """Seconds since the epoch (the records' clock)."""
    return time.time()
