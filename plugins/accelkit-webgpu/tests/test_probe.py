"""The probe: adapters listed without opening a device; capabilities from the adapter's limits."""

from __future__ import annotations

from typing import Any

import pytest
from accelkit_webgpu import probe as probe_mod
from accelkit_webgpu.probe import adapters, capabilities, is_software, probe

from accelkit.dtype import DType


def test_probe_lists_every_adapter_without_creating_a_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found = adapters()
    calls: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        calls.append("request_device")
        raise AssertionError("the probe must not create a device")

    cls = type(found[0])
    for name in ("request_device_sync", "request_device_async"):
        if hasattr(cls, name):
            monkeypatch.setattr(cls, name, refuse)
    infos = probe()
    assert len(infos) == len(found)
    assert calls == []
    for i, info in enumerate(infos):
        assert info.device == f"webgpu:{i}"
        assert info.backend == "webgpu"
        assert info.capabilities is not None
        assert info.extra["backend_type"]


def test_software_flag_for_llvmpipe() -> None:
    for i, adapter in enumerate(adapters()):
        raw = dict(adapter.info)
        caps = capabilities(adapter, i)
        assert caps.extra["software"] == is_software(raw)
        name = f"{raw.get('device', '')} {raw.get('description', '')}".lower()
        if "llvmpipe" in name:
            assert caps.extra["software"] is True
            # ranked below real GPUs
            assert caps.performance.launch_latency_us >= 100
    assert is_software({"device": "llvmpipe (LLVM 15.0.6, 256 bits)"})
    assert is_software({"adapter_type": "CPU"})
    assert not is_software({"device": "NVIDIA GeForce RTX 4090", "adapter_type": "DiscreteGPU"})


def test_limits_are_mapped_from_the_adapter() -> None:
    adapter = adapters()[0]
    limits = dict(adapter.limits)
    caps = capabilities(adapter, 0)
    assert caps.limits.max_alloc_bytes == limits["max-storage-buffer-binding-size"]
    assert caps.limits.max_work_group_size == limits["max-compute-invocations-per-workgroup"]
    assert caps.extra["limits"]["max-buffer-size"] == limits["max-buffer-size"]
    assert caps.limits.memory_bytes > 0


def test_capabilities() -> None:
    adapter = adapters()[0]
    caps = capabilities(adapter, 0)
    assert caps.backend == "webgpu"
    assert caps.device == "webgpu:0"
    # SPIR-V where the adapter is a Vulkan one (lavapipe, with Debian's mesa-vulkan-drivers)
    vulkan = str(adapter.info.get("backend_type", "")) == "Vulkan"
    assert caps.kernel_languages == frozenset({"wgsl", "spirv"} if vulkan else {"wgsl"})
    assert caps.features.custom_kernels
    assert not caps.features.fp64
    assert DType.F64 not in caps.dtypes
    assert {DType.F32, DType.F16, DType.BF16, DType.I32, DType.U8, DType.BOOL} <= caps.dtypes
    assert caps.ops == probe_mod.IMPLEMENTED_OPS
    assert {"scatter", "adam_update"} <= caps.ops
