"""``accelkit select``: the best backend and device for a workload, and why."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

from accelkit.cli.render import print_json, table

if TYPE_CHECKING:
    from accelkit.capabilities import Requirements
    from accelkit.selector import SelectionReport

__all__ = ["explain_table", "parse_size", "requirements", "run"]

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``"8GiB"``, ``"8G"``, ``"512MiB"`` or a number of bytes."""
    from accelkit.errors import InvalidArgumentError

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if m is None:
        raise InvalidArgumentError(
            f"--min-memory {text!r} is not a size; expected e.g. 512MiB, 8GiB or a byte count"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def requirements(args: argparse.Namespace) -> Requirements:
    """The Requirements that ``--require``, ``--dtype``, ``--feature`` and ``--min-memory``
    describe; InvalidArgumentError naming any unknown dtype or feature. A ``--require`` name
    that only KernelOps has (``paged_attention``) asks for a fused kernel of it."""
    from accelkit._core.op_names import KERNEL_OPS, TENSOR_OPS
    from accelkit.capabilities import Features, Requirements
    from accelkit.dtype import DType
    from accelkit.errors import InvalidArgumentError

    known = sorted(Features.model_fields)
    unknown = [f for f in args.feature if f not in known]
    if unknown:
        raise InvalidArgumentError(
            f"unknown feature {', '.join(map(repr, unknown))}; expected any of: {', '.join(known)}"
        )
    names = frozenset(args.require)
    fused = names & (KERNEL_OPS - TENSOR_OPS)
    return Requirements(
        ops=names - fused,
        fused_ops=fused,
        dtypes=frozenset(DType.from_any(d) for d in args.dtype),
        features=frozenset(args.feature),
        min_memory_bytes=parse_size(args.min_memory) if args.min_memory else 0,
    )


def explain_table(report: SelectionReport) -> str:
    """A SelectionReport as aligned tables: the candidates ranked, then the rejections."""
    lines = [f"policy: {report.policy}"]
    if report.requested_backend or report.requested_device:
        lines.append(
            f"requested: backend {report.requested_backend or 'any'},"
            f" device {report.requested_device or 'any'}"
        )
    lines.append("candidates (best first)")
    if report.candidates:
        rows = [
            [i, c.backend, c.device, c.name, f"{c.score:.4g}", c.basis, c.detail]
            for i, c in enumerate(report.candidates, 1)
        ]
        lines.append(
            table(
                ("#", "backend", "device", "name", "score", "basis", "detail"), rows, right=(0, 4)
            )
        )
    else:
        lines.append("  (none)")
    if report.rejected:
        lines.append("rejected")
        rows = [[r.backend, r.device or "-", "; ".join(r.reasons)] for r in report.rejected]
        lines.append(table(("backend", "device", "reasons"), rows))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from accelkit.selector import select

    backend = args.backend.strip().lower() if args.backend else None
    sel = select(args.device, requirements(args), args.policy, backend=backend)
    if args.json:
        print_json(sel)
        return 0
    best = sel.report.candidates[0]
    print(f"selected: {sel.backend} on {sel.device} ({best.name})")
    if args.explain:
        print()
        print(explain_table(sel.report))
    return 0
