"""``accelkit info``: the version, the plugins with their status, and the devices."""

from __future__ import annotations

import argparse
import platform

from accelkit.cli.devices import devices_table
from accelkit.cli.render import print_json, table

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    from accelkit import __version__, calibration, registry
    from accelkit._core.host_jit import jit
    from accelkit.plugins import PLUGIN_API_VERSION

    statuses = registry.statuses()
    devices = registry.devices()
    cache = calibration.cache_dir()
    measured = calibration.load()
    if args.json:
        print_json(
            {
                "accelkit": __version__,
                "plugin_api": PLUGIN_API_VERSION,
                "python": platform.python_version(),
                "platform": f"{platform.system()} {platform.machine()}",
                "cache_dir": cache,
                "calibration_file": calibration.calibration_path(),
                "calibrated_devices": sorted(measured),
                "cpu_jit": jit.describe(),
                "plugins": statuses,
                "devices": devices,
            }
        )
        return 0
    print(
        f"accelkit {__version__} (plugin API {PLUGIN_API_VERSION}) on Python"
        f" {platform.python_version()}, {platform.system()} {platform.machine()}"
    )
    print(f"cache: {cache} ({len(measured)} device(s) calibrated)")
    print(f"CPU JIT kernels: {_jit_line(jit.describe())}")
    print()
    print("plugins")
    rows = [[s.name, s.status, s.version, s.distribution, s.devices, s.reason] for s in statuses]
    print(table(("name", "status", "version", "distribution", "devices", "note"), rows, right=(4,)))
    print()
    print("devices")
    print(devices_table(devices))
    if any(s.status == "quarantined" for s in statuses):
        print()
        print("run 'accelkit doctor' for why the quarantined plugins failed")
    return 0


def _jit_line(jit: dict[str, str | None]) -> str:
    if jit["mode"] == "off":
        return "off (ACCELKIT_CPU_JIT=0)"
    if jit["numba"] is None:
        return "not installed: NumPy kernels (pip install 'accelkit[jit]')"
    return f"Numba {jit['numba']}, compiled {'on first use' if jit['mode'] == 'eager' else 'in the background'}"
