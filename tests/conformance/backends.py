"""Which backends the conformance suite runs against."""

from __future__ import annotations

import accelkit as ak

#: The registry tests install small plugins of their own; they are not backends to certify.
TEST_PLUGIN_PREFIX = "accelkit-testplug-"


def conformance_backends() -> list[str]:
    """Names of every installed backend plugin that reports a device, each opened with
    ``accelkit.open_backend(name)`` (the test plugins excluded)."""
    names = []
    for desc in ak.registry.descriptors():
        if desc.distribution.startswith(TEST_PLUGIN_PREFIX):
            continue
        if ak.registry.probe(desc.name):
            names.append(desc.name)
    return names or ["cpu"]
