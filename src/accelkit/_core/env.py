"""Environment settings, parsed strictly and read when used (never cached at import).

A malformed value raises :class:`~accelkit.errors.InvalidArgumentError` naming the variable, the
value and the accepted forms, instead of being half-understood.
"""

from __future__ import annotations

import os
import re

from accelkit.errors import InvalidArgumentError

__all__ = ["env_flag", "env_name", "env_names", "env_seconds", "env_str"]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def env_str(name: str) -> str | None:
    """The stripped value, or None when unset or empty."""
    value = os.environ.get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def env_flag(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise InvalidArgumentError(
        f"{name}={value!r} is not a boolean; use 1/true/yes/on or 0/false/no/off"
    )


def env_seconds(name: str, default: float) -> float:
    """A finite number of seconds >= 0, or ``default`` when unset or empty."""
    value = env_str(name)
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0.0 <= seconds < float("inf"):  # NaN too
        raise InvalidArgumentError(
            f"{name}={value!r} is not a number of seconds >= 0 (like 300 or 2.5)"
        )
    return seconds


#: The lists that allow only what they name: one of separators alone is an error (a deny list
#: of nothing denies nothing, and stays harmless).
_ALLOW_LISTS = frozenset({"ACCELKIT_PLUGINS"})


def env_names(name: str) -> frozenset[str] | None:
    """A comma-separated list of backend names, or None when unset."""
    value = env_str(name)
    if value is None:
        return None
    names = [n.strip().lower() for n in value.split(",") if n.strip()]
    bad = [n for n in names if not _NAME.match(n)]
    if bad:
        raise InvalidArgumentError(
            f"{name}={value!r}: {', '.join(map(repr, bad))} is not a backend name; expected a"
            " comma-separated list like 'cpu,opencl'"
        )
    if not names and name in _ALLOW_LISTS:  # ',' allowed nothing: every plugin was disabled
        raise InvalidArgumentError(
            f"{name}={value!r} names no plugin; expected a comma-separated list like"
            " 'cpu,opencl' (an empty value is the same as an unset one)"
        )
    return frozenset(names)


def env_name(name: str) -> str | None:
    """One backend name (lower-cased), or None when unset."""
    value = env_str(name)
    if value is None:
        return None
    if not _NAME.match(value.lower()):
        raise InvalidArgumentError(
            f"{name}={value!r} is not a backend name; expected one name like 'cpu'"
        )
    return value.lower()
