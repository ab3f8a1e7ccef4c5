"""Which backends the conformance suite runs against.

Every installed backend plugin that reports a device, by default. ``ACCELKIT_TEST_BACKEND``
(a name, or comma-separated names) restricts the suite to those: the nox session runs the suite
once per backend, each in its own process, so that a driver that aborts the process takes only
its own part down. A name there that is not installed, or reports no device, is an error (a
conformance run that silently tests nothing would look green).
"""

from __future__ import annotations

import os

import accelkit as ak

#: The registry tests install small plugins of their own; they are not backends to certify.
TEST_PLUGIN_PREFIX = "accelkit-testplug-"
#: Restricts the suite to these backends (comma-separated names); ``--accelkit-backend`` sets it
#: (:mod:`accelkit.testing.plugin`).
BACKEND_ENV = "ACCELKIT_TEST_BACKEND"
#: The test files and folders (from the repository root) with tests parametrized by
#: :func:`conformance_backends`, through one of :data:`BACKEND_FIXTURES`: the nox session runs
#: those tests once per backend, each backend in a process of its own, and every other test once,
#: in the core part (tests/support/parts.py, ``split``).
PER_BACKEND_TESTS = ("src/accelkit/testing",)
#: The fixtures whose params are :func:`conformance_backends`.
BACKEND_FIXTURES = ("backend", "env")


def installed_backends() -> list[dict[str, object]]:
    """Every installed backend plugin (the test plugins excluded), each as ``{"name", "devices",
    "reason"}``: how many devices its probe reports, and why none where it reports none."""
    found: list[dict[str, object]] = []
    for desc in ak.registry.descriptors():
        if desc.distribution.startswith(TEST_PLUGIN_PREFIX):
            continue
        devices = len(ak.registry.probe(desc.name))
        why = ak.registry.default_registry.unavailable_reason(desc.name)
        reason = "" if devices else why or "no device"
        found.append({"name": desc.name, "devices": devices, "reason": reason})
    return found


def conformance_backends() -> list[str]:
    """Names of the backends to certify, each opened with ``accelkit.open_backend(name)``: those
    named by ``ACCELKIT_TEST_BACKEND``, else every installed backend plugin that reports a device
    (the test plugins excluded), else the CPU backend."""
    wanted = [n.strip().lower() for n in os.environ.get(BACKEND_ENV, "").split(",") if n.strip()]
    if wanted:
        installed = {str(b["name"]): b for b in installed_backends()}
        for name in wanted:
            if name not in installed:
                raise RuntimeError(
                    f"{BACKEND_ENV} names {name!r}, which is not an installed backend (installed:"
                    f" {', '.join(sorted(installed)) or 'none'})"
                )
            if not installed[name]["devices"]:
                raise RuntimeError(
                    f"{BACKEND_ENV} names {name!r}, which reports no device here:"
                    f" {installed[name]['reason']}"
                )
        return wanted
    names = [str(b["name"]) for b in installed_backends() if b["devices"]]
    return names or ["cpu"]
