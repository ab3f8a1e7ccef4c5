"""Hardware detection for ``accelkit doctor``, on fake file systems (procfs, sysfs, ICD folders)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from accelkit._core import hardware
from accelkit._core.hardware import detect_hardware


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def pci(root: Path, slot: str, cls: str, vendor: str, driver: str | None = None) -> None:
    dev = root / "sys/bus/pci/devices" / slot
    write(dev / "class", cls + "\n")
    write(dev / "vendor", vendor + "\n")
    if driver:
        target = root / "sys/bus/pci/drivers" / driver
        target.mkdir(parents=True, exist_ok=True)
        (dev / "driver").symlink_to(target)


def test_nothing_found_on_an_empty_machine(tmp_path: Path) -> None:
    assert detect_hardware(tmp_path, run_tools=False) == []


def test_nvidia_gpus_from_procfs_with_the_cuda_extra_for_the_driver(tmp_path: Path) -> None:
    for i, model in enumerate(["NVIDIA H100 80GB HBM3", "NVIDIA L4"]):
        write(
            tmp_path / f"proc/driver/nvidia/gpus/0000:0{i}:00.0/information",
            f"Model: \t\t {model}\nIRQ:   \t\t 42\n",
        )
    write(
        tmp_path / "proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build\n",
    )
    # the same GPU on the PCI bus is not reported twice
    pci(tmp_path, "0000:00:00.0", "0x030200", "0x10de", driver="nvidia")
    items = detect_hardware(tmp_path, run_tools=False)
    assert [i.name for i in items] == ["NVIDIA H100 80GB HBM3", "NVIDIA L4"]
    for item in items:
        assert (item.kind, item.vendor, item.plugin) == ("gpu", "NVIDIA", "cuda")
        assert item.requirement == "accelkit-cuda[cuda13]"  # driver 580 runs CUDA 13
        assert item.install_command == "pip install 'accelkit-cuda[cuda13]'"
        assert item.detail == "driver 580.65"


def test_pci_scan_finds_gpus_whose_driver_is_not_loaded(tmp_path: Path) -> None:
    pci(tmp_path, "0000:01:00.0", "0x030000", "0x10de", driver="nouveau")
    pci(tmp_path, "0000:02:00.0", "0x030000", "0x1002", driver="amdgpu")
    pci(tmp_path, "0000:03:00.0", "0x038000", "0x8086")
    pci(tmp_path, "0000:04:00.0", "0x030000", "0x1234")  # QEMU's VGA adapter: not compute
    pci(tmp_path, "0000:05:00.0", "0x030000", "0x1a03")  # an ASPEED BMC: not compute
    pci(tmp_path, "0000:06:00.0", "0x020000", "0x10de")  # NVIDIA, but not a display controller
    items = detect_hardware(tmp_path, run_tools=False)
    assert [(i.vendor, i.plugin) for i in items] == [
        ("NVIDIA", "cuda"),
        ("AMD", "webgpu"),
        ("Intel", "webgpu"),
    ]
    assert "the NVIDIA driver is not loaded" in items[0].detail
    assert items[0].requirement == "accelkit-cuda[cuda12]"
    assert items[1].detail == "kernel driver amdgpu"
    assert items[2].detail == "no kernel driver bound"


def test_opencl_and_vulkan_driver_registries(tmp_path: Path) -> None:
    write(tmp_path / "etc/OpenCL/vendors/pocl.icd", "libpocl.so.2\n")
    write(
        tmp_path / "usr/share/vulkan/icd.d/lvp_icd.x86_64.json",
        '{"ICD": {"library_path": "/usr/lib/libvulkan_lvp.so"}}',
    )
    write(tmp_path / "etc/vulkan/icd.d/broken.json", "{ not json")
    items = detect_hardware(tmp_path, run_tools=False)
    assert [(i.kind, i.plugin) for i in items] == [
        ("opencl-icd", "opencl"),
        ("vulkan-icd", "webgpu"),
        ("vulkan-icd", "webgpu"),
    ]
    assert items[0].detail == "libpocl.so.2"
    assert items[0].requirement == "accelkit-opencl[pocl]"
    assert items[1].detail.startswith("software rasterizer")
    assert items[2].name == "Vulkan driver broken"


def test_nvidia_smi_is_asked_when_procfs_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    def fake_run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append((cmd, kwargs))
        return subprocess.CompletedProcess(
            cmd, 0, stdout="GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-1234)\nGPU 1: Tesla T4\n"
        )

    # Path, shutil and subprocess are the very objects accelkit._core.hardware uses.
    monkeypatch.setattr(Path, "iterdir", _no_procfs(Path.iterdir))
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(subprocess, "run", fake_run)
    names = [i.name for i in hardware._nvidia_gpus(Path("/"), run_tools=True)]
    assert names == ["NVIDIA A100-SXM4-40GB", "Tesla T4"]
    ((cmd, kwargs),) = calls
    assert cmd == ["/usr/bin/nvidia-smi", "-L"]
    assert 0 < kwargs["timeout"] <= 5


def test_a_hanging_nvidia_smi_is_given_up_on(monkeypatch: pytest.MonkeyPatch) -> None:
    def hang(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])

    # Path, shutil and subprocess are the very objects accelkit._core.hardware uses.
    monkeypatch.setattr(Path, "iterdir", _no_procfs(Path.iterdir))
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(subprocess, "run", hang)
    assert hardware._nvidia_gpus(Path("/"), run_tools=True) == []


def _no_procfs(iterdir: Any) -> Any:
    """Path.iterdir, except that /proc/driver/nvidia/gpus does not exist."""

    def patched(self: Path) -> Any:
        if str(self).startswith("/proc/driver/nvidia"):
            raise FileNotFoundError(self)
        return iterdir(self)

    return patched
