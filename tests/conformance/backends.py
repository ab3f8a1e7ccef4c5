"""Which backends the conformance suite runs against."""

from __future__ import annotations


def conformance_backends() -> list[str]:
    """Names of the backends to test, each opened with ``accelkit.open_backend(name)``.

    For now the embedded CPU backend only; once the plugin registry lands this lists every
    installed plugin (the entry-point group ``accelkit.backends``).
    """
    return ["cpu"]
