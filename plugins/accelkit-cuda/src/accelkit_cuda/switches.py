"""Opt-in switches read from the environment: experiments that stay off until a GPU run says
they pay (inline launches, the pipelined decode kernel)."""

from __future__ import annotations

import logging
import os

__all__ = ["env_switch"]

_log = logging.getLogger("accelkit.cuda")


def env_switch(name: str, off: str) -> bool:
    """``name`` as a flag: 1/true/yes/on is True, unset or 0/false/no/off False; anything else
    is warned about (the warning ends with ``off``, what staying off means) and read as off: a
    mistyped experiment must not stop a service from starting."""
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw not in ("", "0", "false", "no", "off"):
        _log.warning("%s=%r: expected 1/true/yes/on or 0/false/no/off; %s", name, raw, off)
    return False
