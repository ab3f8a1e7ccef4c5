"""Isolated backends: any backend run in a supervised worker process (see
:mod:`accelkit._core.isolation.backend`; the worker's side is
:mod:`accelkit._core.isolation.worker`, which imports nothing of the user's side)."""
