"""Output for the ``accelkit`` command: aligned tables, JSON, and a progress bar on stderr.

Hand-written on purpose: the command must start fast and pull in no dependency for looks.
"""

from __future__ import annotations

import datetime
import enum
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any, TextIO

from pydantic import BaseModel

from accelkit.device import Device

__all__ = ["Progress", "fmt_bytes", "jsonable", "print_json", "table"]


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    right: Sequence[int] = (),
    indent: int = 2,
) -> str:
    """Rows under headers, columns padded to their widest cell; ``right`` columns (by index)
    are right-aligned (numbers). The last column is not padded, so long text does not drag
    trailing spaces. A cell of several lines (an error with its traceback's text) shows its
    first, with `` ...`` (the table stays one line per row)."""
    cells = [[str(h) for h in headers]] + [[_one_line(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        parts = []
        for i, cell in enumerate(row):
            if i in right:
                parts.append(cell.rjust(widths[i]))
            elif i == len(row) - 1:
                parts.append(cell)
            else:
                parts.append(cell.ljust(widths[i]))
        lines.append(" " * indent + "  ".join(parts).rstrip())
        if n == 0:
            lines.append(" " * indent + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _one_line(cell: object) -> str:
    text = "" if cell is None else str(cell)
    parts = text.splitlines()  # (any line break: \r, \v and \f garble a row too)
    if len(parts) <= 1 and (not parts or parts[0] == text):
        return text
    lines = [line.rstrip() for line in parts if line.strip()]
    return f"{lines[0]} ..." if lines else ""


def fmt_bytes(n: int) -> str:
    """``"23.5 GiB"``; ``"?"`` for 0 (unknown)."""
    if n <= 0:
        return "?"
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            break
    return f"{size:.1f} {unit}"


def jsonable(value: Any) -> Any:
    """Plain JSON data with a stable order: sets become sorted lists, enums their values,
    devices their string form (``"cuda:1"``)."""
    if isinstance(value, BaseModel):
        return jsonable(value.model_dump(mode="python"))
    if isinstance(value, Mapping):
        return {str(jsonable(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(v) for v in value), key=lambda v: (str(type(v)), str(v)))
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, (PurePath, Device)):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):  # NaN and infinities are not JSON
        return None
    return value


def print_json(data: Any, out: TextIO | None = None) -> None:
    """``data`` as strict JSON (NaN and infinities as null: ``Infinity`` is no JSON, and
    strict parsers refused a broken backend's ``"max_error": Infinity``)."""
    print(json.dumps(jsonable(data), indent=2, allow_nan=False), file=out or sys.stdout)


class Progress:
    """A one-line bar on stderr, redrawn with ``\\r``: ``label [#####-----] 3/6 what``.

    Drawn only when ``enabled`` (stderr is a terminal, or ``--progress``), so logs and pipes get
    no control characters. ``close()`` clears the line.
    """

    WIDTH = 24

    def __init__(
        self, total: int, *, enabled: bool, label: str = "", out: TextIO | None = None
    ) -> None:
        self.total = max(1, total)
        self.done = 0
        self.enabled = enabled
        self.label = label
        self._out = out or sys.stderr
        self._shown = 0

    def advance(self, what: str = "", steps: int = 1) -> None:
        self.done = min(self.total, self.done + steps)
        self.show(what)

    def show(self, what: str = "") -> None:
        if not self.enabled:
            return
        filled = self.WIDTH * self.done // self.total
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        line = f"{self.label} [{bar}] {self.done}/{self.total} {what}".strip()[:100]
        pad = " " * max(0, self._shown - len(line))
        self._out.write(f"\r{line}{pad}")
        self._out.flush()
        self._shown = len(line)

    def close(self) -> None:
        if self.enabled and self._shown:
            self._out.write("\r" + " " * self._shown + "\r")
            self._out.flush()
            self._shown = 0
