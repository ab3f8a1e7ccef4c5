"""The installed plugins' probes, run first in a child process for ``accelkit doctor``.

A probe runs in the caller's process (``ak.devices()``, ``accelkit info``): one that aborts
it (a driver's native library) or never returns (a ``*-smi`` tool that hangs) takes the
process down. ``doctor`` must survive such a plugin to name it, so before it probes anything
itself it runs every installed plugin's probe in a child
(``python -X faulthandler -m accelkit._core.probe_check``), one after the other, each
announced before it starts. The plugin whose probe was running when the child died, or ran
past the timeout, is quarantined in the parent at stage ``probe`` with the reason (the signal
or exit status, and the last meaningful line of the child's stderr), and the child runs again
without it, until the probes left all return. Plugins registered in-process are not installed
and cannot be seen by a child: the parent probes them as before.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from accelkit._core.child import ending, run_child

__all__ = ["DEFAULT_TIMEOUT_S", "MARKER", "ProbeFailure", "check_probes", "main"]

MARKER = "ACCELKIT_PROBE "
#: Seconds a probe may take in the child before it is taken for a hang (a probe lists devices:
#: it is meant to be cheap; the first import of a driver library takes a few seconds at most).
DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ProbeFailure:
    """A plugin whose probe ended or hung the child: why, and the child's stderr."""

    plugin: str
    reason: str
    stderr: str


def _command(skip: Sequence[str]) -> list[str]:
    cmd = [sys.executable, "-X", "faulthandler", "-m", "accelkit._core.probe_check"]
    for name in skip:
        cmd += ["--skip", name]
    return cmd


def check_probes(timeout: float = DEFAULT_TIMEOUT_S) -> list[ProbeFailure]:
    """Run the installed plugins' probes in a child process (see the module docstring); the
    plugins whose probe crashed, exited or hung it, in the order found. A child that fails
    before any probe (it cannot start, or import accelkit) blames no plugin: the parent's own
    probes report what they meet."""
    failures: list[ProbeFailure] = []
    skip: list[str] = []
    while True:
        try:
            run = run_child(_command(skip), step_timeout=timeout, marker=MARKER)
        except OSError:
            return failures
        started = [str(e["probing"]) for e in run.events if "probing" in e]
        finished = {str(e["probed"]) for e in run.events if "probed" in e}
        # whatever the exit status: a probe that ends the process with os._exit(0) is one
        culprit = next((name for name in reversed(started) if name not in finished), None)
        if culprit is None or culprit in skip:
            return failures
        reason = ending(run, f"did not return within {timeout:g} s (a hang)")
        failures.append(ProbeFailure(culprit, reason, run.stderr))
        skip.append(culprit)


def _emit(event: dict[str, str]) -> None:
    sys.stdout.write(MARKER + json.dumps(event) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """The child: probe every installed plugin that is allowed and loads, but ``--skip``."""
    parser = argparse.ArgumentParser(prog="python -m accelkit._core.probe_check")
    parser.add_argument("--skip", action="append", default=[], help="a plugin not to probe")
    args = parser.parse_args(argv)
    from accelkit.registry import default_registry as reg

    for status in reg.statuses(probe=False):
        if status.status != "ok" or status.name in args.skip:
            continue
        _emit({"probing": status.name})
        with contextlib.suppress(Exception):  # the parent's own probe reports it, as always
            reg.probe(status.name)
        _emit({"probed": status.name})
    return 0


if __name__ == "__main__":
    sys.exit(main())
