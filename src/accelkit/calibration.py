"""Measured performance figures, stored per device in the user's cache directory.

``accelkit calibrate`` measures each device (GEMM GFLOP/s per dtype, host-device copy bandwidth,
the cost of submitting a small op) and stores the figures; the selector prefers them to a
plugin's declared hints, so a fast discrete device beats a slow one of the same kind.

The file is data, never code: JSON, versioned, validated on load, written atomically (a temporary
file renamed over the old one). A corrupt or foreign file is moved aside with a warning, never
trusted, and the next calibration writes a fresh one. ``ACCELKIT_CACHE_DIR`` overrides the folder.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from accelkit._core.env import env_str
from accelkit.capabilities import Figure
from accelkit.dtype import DType

if TYPE_CHECKING:
    from accelkit.abc.backend import ComputeBackend
    from accelkit.device import Device

__all__ = [
    "CalibrationEntry",
    "CalibrationWarning",
    "cache_dir",
    "calibration_path",
    "load",
    "lookup",
    "measure",
    "save",
]

FORMAT = "accelkit-calibration"
VERSION = 1
_MAX_BYTES = 1 << 20


class CalibrationWarning(UserWarning):
    """The calibration file could not be used."""


class CalibrationEntry(BaseModel):
    """What ``accelkit calibrate`` measured on one device."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str
    device: str
    device_name: str = Field(description="the probe's device name: a swapped card invalidates it")
    backend_version: str
    gflops: dict[DType, Figure] = Field(description="GEMM throughput per dtype")
    bandwidth_gbs: Figure = Field(description="host <-> device copy bandwidth")
    launch_latency_us: Figure = Field(description="submitting and completing a small op")
    measured_at: datetime


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["accelkit-calibration"]
    version: Literal[1]
    entries: dict[str, CalibrationEntry]


def cache_dir() -> Path:
    """``ACCELKIT_CACHE_DIR``, or the user's cache folder, as platformdirs would give it (accelkit
    does not depend on it): ``$XDG_CACHE_HOME/accelkit`` (default ``~/.cache/accelkit``),
    ``~/Library/Caches/accelkit`` on macOS, ``%LOCALAPPDATA%\\accelkit\\Cache`` on Windows."""
    override = env_str("ACCELKIT_CACHE_DIR")
    if override:
        # '~' expanded, and a relative path made absolute once, here: it named a different
        # folder from each working directory ('./~/.cache/...').
        return Path(override).expanduser().absolute()
    if sys.platform == "win32":
        local = env_str("LOCALAPPDATA")
        return Path(local or Path.home() / "AppData" / "Local") / "accelkit" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "accelkit"
    xdg = env_str("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "accelkit"


def calibration_path() -> Path:
    return cache_dir() / "calibration.json"


def _key(backend: str, device: Device | str) -> str:
    return f"{backend}/{device}"


_cache: tuple[Path, tuple[int, int, int], dict[str, CalibrationEntry]] | None = None


def load() -> dict[str, CalibrationEntry]:
    """Entries keyed ``backend/device`` ({} when there is no usable file). Cached while the file's
    (mtime, size, inode) stay the same."""
    global _cache
    path = calibration_path()
    try:
        st = path.stat()
    except OSError:
        return {}
    stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    if _cache is not None and _cache[0] == path and _cache[1] == stamp:
        return _cache[2]
    try:
        if st.st_size > _MAX_BYTES:
            raise ValueError(f"larger than {_MAX_BYTES} bytes")
        data = _File.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, ValidationError, RecursionError) as exc:
        # (RecursionError: nesting deeper than the parser goes, as 100k "[" in a row)
        aside = path.with_suffix(".json.corrupt")
        try:
            os.replace(path, aside)
        except OSError:
            aside = path
        warnings.warn(
            f"ignoring the calibration file {path}: it is not an accelkit calibration file of"
            f" version {VERSION} ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); moved"
            f" to {aside}. Run `accelkit calibrate` to measure again.",
            CalibrationWarning,
            stacklevel=2,
        )
        return {}
    _cache = (path, stamp, data.entries)
    return data.entries


def save(entries: dict[str, CalibrationEntry]) -> Path:
    """Write ``entries`` (merged over what is stored) atomically; returns the file's path."""
    path = calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = {**load(), **entries}
    payload = _File(format=FORMAT, version=VERSION, entries=merged).model_dump_json(indent=2)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".calibration-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    global _cache
    _cache = None  # a rewrite within the file system's timestamp resolution must not look unchanged
    return path


def lookup(backend: str, device: Device | str, device_name: str) -> CalibrationEntry | None:
    """The stored entry for this device, if it was measured on the same hardware (the entries
    are keyed by the device's string form, ``"cuda:1"``: a Device is not parsed again)."""
    entry = load().get(_key(backend, device))
    if entry is None or entry.device_name != device_name:
        return None
    return entry


async def measure(
    backend: ComputeBackend,
    device_name: str,
    *,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
) -> CalibrationEntry:
    """Measure an initialized backend's device (a few seconds; ``quick`` for tests)."""
    import numpy as np

    say = progress or (lambda _msg: None)
    f, ops = backend.tensor_factory, backend.tensor_ops
    n = 256 if quick else 1024
    gflops: dict[DType, float] = {}
    dtypes = [d for d in (DType.F32, DType.F16, DType.F64) if d in backend.supported_dtypes]
    for dt in dtypes:
        say(f"GEMM {n}x{n} {dt.value}")
        a = f.uniform((n, n), -1.0, 1.0, seed=1, dtype=dt)
        await backend.synchronize()
        times = []
        for _ in range(2 if quick else 5):
            t0 = time.perf_counter()
            ops.matmul(a, a)
            await backend.synchronize()
            times.append(time.perf_counter() - t0)
        gflops[dt] = 2 * n**3 / min(times) / 1e9

    say("host <-> device bandwidth")
    size = (1 << 20) if quick else (32 << 20)
    host = np.ones(size // 4, np.float32)
    t = f.empty((size // 4,), DType.F32)
    times = []
    for _ in range(2 if quick else 5):
        t0 = time.perf_counter()
        await backend.memory_manager.copy_htod(t, host)
        await backend.memory_manager.copy_dtoh(host, t)
        times.append(time.perf_counter() - t0)
    bandwidth = 2 * size / min(times) / 1e9

    say("launch latency")
    x = f.ones((16,), DType.F32)
    lat = []
    for _ in range(20 if quick else 200):
        t0 = time.perf_counter()
        ops.add(x, x)
        await backend.synchronize()
        lat.append(time.perf_counter() - t0)
    device = str(backend.device)
    return CalibrationEntry(
        backend=backend.name,
        device=device,
        device_name=device_name,
        backend_version=backend.version,
        gflops=gflops,
        bandwidth_gbs=bandwidth,
        launch_latency_us=1e6 * statistics.median(lat),
        measured_at=datetime.now(UTC),
    )


def entry_key(entry: CalibrationEntry) -> str:
    return _key(entry.backend, entry.device)
