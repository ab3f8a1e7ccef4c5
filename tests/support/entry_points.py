"""Hiding an installed plugin from the registry, for tests of what accelkit says about a known
plugin that is not installed (the test environment installs every known plugin)."""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import Iterator
from typing import Any
from unittest import mock


@contextlib.contextmanager
def without_entry_point(name: str) -> Iterator[None]:
    """``importlib.metadata.entry_points`` without the ``accelkit.backends`` entry ``name``
    while the context lasts."""
    real = importlib.metadata.entry_points

    def entry_points(**kwargs: Any) -> Any:
        found = real(**kwargs)
        if kwargs.get("group") != "accelkit.backends":
            return found
        kept: list[Any] = [ep for ep in found if getattr(ep, "name", None) != name]
        return importlib.metadata.EntryPoints(kept)

    with mock.patch("importlib.metadata.entry_points", entry_points):
        yield
