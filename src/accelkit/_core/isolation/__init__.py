"""Isolated backends: any backend run in a supervised worker process (see
:mod:`accelkit._core.isolation.backend`)."""

from __future__ import annotations

from accelkit._core.isolation.backend import IsolatedBackend

__all__ = ["IsolatedBackend"]
