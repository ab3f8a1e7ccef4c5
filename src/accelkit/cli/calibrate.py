"""``accelkit calibrate``: measure each device and store the figures the selector ranks by.

Each device is initialized on its own backend, measured by :func:`accelkit.calibration.measure`
(GEMM GFLOP/s per dtype, copy bandwidth, launch latency), and shut down. A device that fails is
reported (and its plugin quarantined, as ``open_backend`` would) while the others go on; the
figures that were measured are stored in one atomic write at the end.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from accelkit.cli.render import Progress, print_json, table

if TYPE_CHECKING:
    from accelkit.calibration import CalibrationEntry
    from accelkit.device import DeviceInfo

__all__ = ["run"]

# Steps that calibration.measure() announces besides one GEMM per dtype.
_FIXED_STEPS = 2
_GEMM_DTYPES = 3  # f32, f16, f64 where supported: the bar's first estimate, made exact later


async def _calibrate(
    infos: list[DeviceInfo], quick: bool, bar: Progress
) -> tuple[list[CalibrationEntry], list[dict[str, str]]]:
    from accelkit import calibration, registry
    from accelkit.dtype import DType
    from accelkit.errors import InvalidArgumentError

    entries, failures = [], []
    for info in infos:
        bar.label = f"{info.backend} on {info.device}"
        bar.show("initializing")
        start, steps = bar.done, _FIXED_STEPS + _GEMM_DTYPES
        try:
            backend = registry.backend_class(info.backend)()
            try:
                await backend.initialize(info.device)
            except InvalidArgumentError:  # a malformed setting: every device's, exit 2
                raise
            except Exception as exc:  # as open_backend does: doctor shows why
                dist = registry.descriptor(info.backend).distribution
                registry.quarantine(info.backend, "initialize", exc, distribution=dist)
                raise
            try:
                await backend.prepare(progress=bar.show)  # e.g. kernel-variant verification
                gemms = sum(
                    d in backend.supported_dtypes for d in (DType.F32, DType.F16, DType.F64)
                )
                bar.total -= _GEMM_DTYPES - gemms  # now exact for this device
                steps = _FIXED_STEPS + gemms
                entries.append(
                    await calibration.measure(backend, info.name, quick=quick, progress=bar.advance)
                )
            finally:
                await backend.shutdown()
        except InvalidArgumentError:
            raise
        except Exception as exc:
            failures.append(
                {"backend": info.backend, "device": str(info.device), "error": str(exc)}
            )
        bar.done = start + steps  # this device's steps are done, however it went
    return entries, failures


def run(args: argparse.Namespace) -> int:
    import anyio

    from accelkit import calibration, registry

    if args.backend:
        names = [registry.descriptor(args.backend.strip().lower()).name]
    else:
        names = [d.name for d in registry.descriptors()]
    infos = [info for name in names for info in registry.probe(name)]
    if not infos:
        from accelkit.errors import BackendNotFoundError

        raise BackendNotFoundError(
            "no device to calibrate"
            + (f" for backend {args.backend!r}" if args.backend else "")
            + "; run 'accelkit doctor' to see why"
        )
    bar = Progress(
        len(infos) * (_FIXED_STEPS + _GEMM_DTYPES),
        enabled=args.progress or sys.stderr.isatty(),
    )
    try:
        entries, failures = anyio.run(_calibrate, infos, args.quick, bar)
    finally:
        bar.close()
    path = calibration.save({calibration.entry_key(e): e for e in entries}) if entries else None

    if args.json:
        print_json(
            {
                "path": path if path else calibration.calibration_path(),
                "entries": entries,
                "failed": failures,
            }
        )
        return 1 if failures else 0
    if entries:
        rows = [
            [
                e.backend,
                e.device,
                e.device_name,
                _gflops(e, "f32"),
                _gflops(e, "f16"),
                _gflops(e, "f64"),
                f"{e.bandwidth_gbs:.2f}",
                f"{e.launch_latency_us:.1f}",
            ]
            for e in entries
        ]
        print(
            table(
                (
                    "backend",
                    "device",
                    "name",
                    "f32 GFLOP/s",
                    "f16 GFLOP/s",
                    "f64 GFLOP/s",
                    "copy GB/s",
                    "launch us",
                ),
                rows,
                right=(3, 4, 5, 6, 7),
            )
        )
        print(f"stored in {path}")
    for f in failures:
        print(
            f"accelkit calibrate: {f['backend']} on {f['device']} failed: {f['error']}",
            file=sys.stderr,
        )
    return 1 if failures else 0


def _gflops(entry: CalibrationEntry, dtype: str) -> str:
    from accelkit.dtype import DType

    value = entry.gflops.get(DType(dtype))
    return "-" if value is None else f"{value:.1f}"
