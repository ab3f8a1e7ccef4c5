"""Isolated backends: any backend run in a supervised worker process (guide: docs/isolation.md).

``ak.open_backend(name, isolate=True)`` opens an :class:`IsolatedBackend`; its worker's faults
(a signal, an abort, a sticky device error, a hang) raise
:class:`~accelkit.errors.WorkerLostError` at every pending await, make every handle from
before stale, and ``await backend.recover()`` starts a new worker. :func:`fault_log` reads the
faults isolated workers survived on this machine (what ``accelkit doctor`` shows).
"""

from __future__ import annotations

from accelkit._core.isolation.backend import DEFAULT_DEADLINE, IsolatedBackend
from accelkit._core.isolation.faults import FaultRecord
from accelkit._core.isolation.faults import read as fault_log

__all__ = ["DEFAULT_DEADLINE", "FaultRecord", "IsolatedBackend", "fault_log"]
