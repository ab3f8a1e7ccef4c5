"""Counting device parses: a spy on ``Device.parse``, for the tests that pin "a device's string
form is parsed once, at the public boundary"."""

from __future__ import annotations

import pytest

from accelkit.device import Device


def count_parses(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every value ``Device.parse`` is called with from now on, in order. A pydantic field typed
    ``Device`` calls it too for a string (and not for a Device), as does comparing a Device with
    a string."""
    calls: list[object] = []
    parse = Device.parse.__func__  # type: ignore[attr-defined]

    def spy(cls: type[Device], value: str | Device) -> Device:
        calls.append(value)
        result: Device = parse(cls, value)
        return result

    monkeypatch.setattr(Device, "parse", classmethod(spy))
    return calls


def string_parses(calls: list[object]) -> list[str]:
    """The calls that parsed a string (``Device.parse`` hands a Device back as it is)."""
    return [c for c in calls if isinstance(c, str)]
