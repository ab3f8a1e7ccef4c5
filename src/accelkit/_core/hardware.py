"""Cheap detection of the compute hardware a machine has, for ``accelkit doctor``.

Plugins answer "which devices can I drive"; this module answers the other half of the question a
user asks when something is missing: "what is in this machine that no installed plugin drives?".
It reads what the kernel and the driver installers leave on disk (procfs, sysfs, ICD registries,
and the ICDs that Python wheels carry inside their own package, as ``pyopencl[pocl]`` does) and
runs at most one tool, ``nvidia-smi -L`` with a short timeout, and only where procfs does not
already say. It never imports a driver library or creates a context, so it is safe (and fast)
on a machine whose driver is broken, which is exactly when ``doctor`` is run.

Each finding names the plugin that would drive it and the pip requirement that installs it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# The registry's table of first-party plugins, so that doctor's fixes and the registry's
# "no backend named ..." hints name the same requirement.
from accelkit.registry import _KNOWN_PLUGINS as PLUGIN_REQUIREMENTS

__all__ = ["HardwareItem", "PLUGIN_REQUIREMENTS", "detect_hardware"]

HardwareKind = Literal["gpu", "opencl-icd", "vulkan-icd", "cluster"]

# PCI vendor ids of GPU makers. Other display controllers (QEMU/virtio/VMware adapters, server
# BMCs such as ASPEED or Matrox) drive a screen, not compute, and are not reported.
_GPU_VENDORS = {"0x10de": "NVIDIA", "0x1002": "AMD", "0x8086": "Intel"}
_NVIDIA_SMI_TIMEOUT_S = 3.0
#: Python packages whose wheels carry an OpenCL ICD loader that reads ICDs from the package's own
#: ``.libs`` folder as well as ``/etc/OpenCL/vendors``: PyOpenCL's wheels do, and
#: ``pocl-binary-distribution`` (what ``pyopencl[pocl]`` installs) puts its ``pocl.icd`` there.
#: Found with ``importlib.util.find_spec``, which imports nothing.
ICD_PACKAGES: tuple[str, ...] = ("pyopencl",)
# NVIDIA drivers from this branch on run CUDA 13; older ones need the CUDA 12 build of CuPy.
_CUDA13_MIN_DRIVER = 580


class HardwareItem(BaseModel):
    """One piece of compute hardware (or a driver registry entry) found on this machine."""

    model_config = ConfigDict(frozen=True)

    kind: HardwareKind = Field(
        description="'gpu' is a physical device; the others are drivers or services that a"
        " plugin could use"
    )
    vendor: str = ""
    name: str
    plugin: str = Field(description="the accelkit plugin that would drive it")
    requirement: str = Field(description="the pip requirement that installs that plugin")
    source: str = Field(description="where it was found (a file, or a command)")
    detail: str = ""

    @property
    def install_command(self) -> str:
        return f"pip install '{self.requirement}'"


def detect_hardware(
    root: Path | str = "/", *, run_tools: bool = True, python_packages: bool | None = None
) -> list[HardwareItem]:
    """Everything found, GPUs first. ``root`` relocates the file system (for tests);
    ``run_tools=False`` never starts a process; ``python_packages`` looks for the OpenCL ICDs
    that wheels carry in the packages of :data:`ICD_PACKAGES` (default: when ``root`` is ``/``)."""
    base = Path(root)
    if python_packages is None:
        python_packages = base == Path("/")
    items = _nvidia_gpus(base, run_tools)
    seen_nvidia = bool(items)
    items += _pci_gpus(base, skip_nvidia=seen_nvidia)
    if platform.system() == "Darwin" and base == Path("/"):
        items.append(
            HardwareItem(
                kind="gpu",
                vendor="Apple",
                name="Apple GPU (Metal)",
                plugin="webgpu",
                requirement=PLUGIN_REQUIREMENTS["webgpu"],
                source="platform",
            )
        )
    items += _opencl_icds(base, python_packages)
    items += _vulkan_icds(base)
    if os.environ.get("DASK_SCHEDULER_ADDRESS", "").strip() and base == Path("/"):
        items.append(
            HardwareItem(
                kind="cluster",
                vendor="Dask",
                name=f"Dask scheduler at {os.environ['DASK_SCHEDULER_ADDRESS'].strip()}",
                plugin="dask",
                requirement=PLUGIN_REQUIREMENTS["dask"],
                source="DASK_SCHEDULER_ADDRESS",
            )
        )
    return items


def _read(path: Path, limit: int = 65536) -> str:
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            return fh.read(limit)
    except OSError:
        return ""


def _cuda_requirement(base: Path) -> tuple[str, str]:
    """The accelkit-cuda requirement that suits the loaded driver, and the driver version."""
    version = _read(base / "proc/driver/nvidia/version")
    m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+)\.(\d+)", version)
    if m is None:
        return PLUGIN_REQUIREMENTS["cuda"], ""
    major = int(m.group(1))
    extra = "cuda13" if major >= _CUDA13_MIN_DRIVER else "cuda12"
    return f"accelkit-cuda[{extra}]", f"{m.group(1)}.{m.group(2)}"


def _nvidia_gpus(base: Path, run_tools: bool) -> list[HardwareItem]:
    requirement, driver = _cuda_requirement(base)
    detail = f"driver {driver}" if driver else ""
    items = []
    gpus = base / "proc/driver/nvidia/gpus"
    try:
        entries = sorted(gpus.iterdir())
    except OSError:
        entries = []
    for entry in entries:
        info = _read(entry / "information")
        fields = {
            k.strip(): v.strip() for k, _, v in (line.partition(":") for line in info.splitlines())
        }
        items.append(
            HardwareItem(
                kind="gpu",
                vendor="NVIDIA",
                name=fields.get("Model") or "NVIDIA GPU",
                plugin="cuda",
                requirement=requirement,
                source=str(entry / "information"),
                detail=detail,
            )
        )
    if items or not run_tools or base != Path("/"):
        return items
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return items
    try:
        out = subprocess.run(
            [smi, "-L"],
            capture_output=True,
            text=True,
            timeout=_NVIDIA_SMI_TIMEOUT_S,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return items
    for line in out.splitlines():
        m = re.match(r"GPU\s+\d+:\s+(.*?)\s*(?:\(UUID:.*\))?$", line.strip())
        if m:
            items.append(
                HardwareItem(
                    kind="gpu",
                    vendor="NVIDIA",
                    name=m.group(1) or "NVIDIA GPU",
                    plugin="cuda",
                    requirement=requirement,
                    source="nvidia-smi -L",
                    detail=detail,
                )
            )
    return items


def _pci_gpus(base: Path, skip_nvidia: bool) -> list[HardwareItem]:
    """GPUs on the PCI bus, seen even when their driver is not loaded."""
    items = []
    try:
        devices = sorted((base / "sys/bus/pci/devices").iterdir())
    except OSError:
        return []
    for dev in devices:
        # class 0x03xxxx: display controller (VGA 0x0300, 3D 0x0302, other 0x0380)
        if not _read(dev / "class", 64).strip().startswith("0x03"):
            continue
        vendor = _GPU_VENDORS.get(_read(dev / "vendor", 64).strip().lower())
        if vendor is None or (vendor == "NVIDIA" and skip_nvidia):
            continue
        driver = (dev / "driver").resolve().name if (dev / "driver").exists() else ""
        if vendor == "NVIDIA":
            plugin, requirement = "cuda", PLUGIN_REQUIREMENTS["cuda"]
            detail = (
                f"kernel driver {driver}; the NVIDIA driver is not loaded"
                if driver != "nvidia"
                else "kernel driver nvidia"
            )
        else:
            # AMD and Intel GPUs compute through Vulkan (webgpu) on every OS.
            plugin, requirement = "webgpu", PLUGIN_REQUIREMENTS["webgpu"]
            detail = f"kernel driver {driver}" if driver else "no kernel driver bound"
        items.append(
            HardwareItem(
                kind="gpu",
                vendor=vendor,
                name=f"{vendor} GPU (PCI {dev.name})",
                plugin=plugin,
                requirement=requirement,
                source=str(dev),
                detail=detail,
            )
        )
    return items


def _package_icd_folders() -> list[tuple[str, Path]]:
    """(package, folder) for the ``.libs`` folder of every installed package of
    :data:`ICD_PACKAGES` (located, not imported)."""
    found = []
    for name in ICD_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            found.append((name, Path(location) / ".libs"))
    return found


def _opencl_icds(base: Path, python_packages: bool) -> list[HardwareItem]:
    items = []
    # ocl-icd's loader reads OCL_ICD_VENDORS (a folder) instead of /etc/OpenCL/vendors.
    override = os.environ.get("OCL_ICD_VENDORS", "").strip() if base == Path("/") else ""
    folders: list[tuple[str, Path]] = [
        ("", Path(override) if override else base / "etc/OpenCL/vendors")
    ]
    if python_packages:
        folders += _package_icd_folders()
    seen: set[Path] = set()
    for package, folder in folders:
        try:
            icds = sorted(folder.glob("*.icd"))
        except OSError:
            continue
        for icd in icds:
            try:
                key = icd.resolve()
            except OSError:
                key = icd
            if key in seen:
                continue
            seen.add(key)
            library = _read(icd, 4096).strip().splitlines()
            detail = library[0] if library else ""
            if package:
                detail += f"{'; ' if detail else ''}shipped inside the Python package {package}"
            items.append(
                HardwareItem(
                    kind="opencl-icd",
                    name=f"OpenCL driver {icd.stem}",
                    plugin="opencl",
                    requirement=PLUGIN_REQUIREMENTS["opencl"],
                    source=str(icd),
                    detail=detail,
                )
            )
    return items


def _vulkan_icds(base: Path) -> list[HardwareItem]:
    items = []
    for folder in (base / "usr/share/vulkan/icd.d", base / "etc/vulkan/icd.d"):
        try:
            manifests = sorted(folder.glob("*.json"))
        except OSError:
            continue
        for manifest in manifests:
            try:
                library = str(json.loads(_read(manifest))["ICD"]["library_path"])
            except (ValueError, KeyError, TypeError, RecursionError):
                library = ""
            software = "lvp" in manifest.stem or "lvp" in library
            items.append(
                HardwareItem(
                    kind="vulkan-icd",
                    name=f"Vulkan driver {manifest.stem}",
                    plugin="webgpu",
                    requirement=PLUGIN_REQUIREMENTS["webgpu"],
                    source=str(manifest),
                    detail=("software rasterizer (llvmpipe); " if software else "") + library,
                )
            )
    return items
