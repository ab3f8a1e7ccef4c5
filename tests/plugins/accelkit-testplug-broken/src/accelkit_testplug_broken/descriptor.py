"""A descriptor module that fails on import, as one with a broken dependency would."""

from __future__ import annotations

raise RuntimeError("accelkit-testplug-broken: this descriptor module fails on import, on purpose")
