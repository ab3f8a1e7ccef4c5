"""``accelkit devices``: every device that every usable plugin reports."""

from __future__ import annotations

import argparse

from accelkit.cli.render import fmt_bytes, print_json, table
from accelkit.device import DeviceInfo
from accelkit.dtype import DType

__all__ = ["device_rows", "devices_table", "run", "unavailable"]

HEADERS = ("device", "backend", "name", "memory", "units", "f32 GFLOP/s", "basis")


def device_rows(infos: list[DeviceInfo]) -> list[list[object]]:
    from accelkit import calibration

    rows: list[list[object]] = []
    for info in infos:
        measured = calibration.lookup(info.backend, info.device, info.name)
        declared = info.capabilities.performance.peak_gflops if info.capabilities else {}
        gflops = (measured.gflops if measured else declared).get(DType.F32)
        rows.append(
            [
                info.device,
                info.backend,
                info.name,
                fmt_bytes(info.memory_bytes),
                info.compute_units or "?",
                f"{gflops:.0f}" if gflops else "?",
                "calibrated" if measured else ("declared" if gflops else ""),
            ]
        )
    return rows


def devices_table(infos: list[DeviceInfo]) -> str:
    if not infos:
        return "  (no devices)"
    return table(HEADERS, device_rows(infos), right=(3, 4, 5))


def unavailable(backends: list[str]) -> list[dict[str, str]]:
    """Plugins (already probed) that report no device, with the reason."""
    from accelkit import registry

    out = []
    for name in backends:
        reason = registry.default_registry.unavailable_reason(name)
        if reason is not None:
            out.append({"backend": name, "reason": reason})
    return out


def run(args: argparse.Namespace) -> int:
    from accelkit import registry

    if args.backend:
        names = [registry.descriptor(args.backend.strip().lower()).name]
    else:
        names = [d.name for d in registry.descriptors()]
    infos = [info for name in names for info in registry.probe(name)]
    missing = unavailable(names)
    if args.json:
        print_json({"devices": infos, "unavailable": missing})
        return 0
    print(devices_table(infos))
    for item in missing:
        print(f"  {item['backend']}: no device ({item['reason']})")
    return 0
