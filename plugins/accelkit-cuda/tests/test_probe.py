"""The probe and the capabilities, without a GPU: a fake driver library stands in for libcuda,
and the figures are checked against the vendors' published specifications."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest
from accelkit_cuda import driver as drv
from accelkit_cuda.driver import Attr, DeviceProps, Driver, DriverUnavailable
from accelkit_cuda.probe import backend_dtypes, capabilities, cupy_bf16, probe

import accelkit as ak
from accelkit.dtype import DType
from accelkit.errors import BackendNotFoundError, DeviceError


class FakeLibcuda:
    """The few libcuda entry points the probe calls, answering for the devices given."""

    def __init__(self, devices: list[DeviceProps], init_error: int = 0) -> None:
        self.devices = devices
        self.init_error = init_error

    @staticmethod
    def _set(ref: Any, value: Any) -> int:
        ref._obj.value = value
        return 0

    def cuInit(self, flags: int) -> int:  # noqa: N802 - libcuda's names
        return self.init_error

    def cuGetErrorString(self, code: int, ref: Any) -> int:  # noqa: N802
        ref._obj.value = b"no CUDA-capable device is detected" if code == 100 else b"error"
        return 0

    def cuDriverGetVersion(self, ref: Any) -> int:  # noqa: N802
        return self._set(ref, 12040)

    def cuDeviceGetCount(self, ref: Any) -> int:  # noqa: N802
        return self._set(ref, len(self.devices))

    def cuDeviceGet(self, ref: Any, index: int) -> int:  # noqa: N802
        return self._set(ref, index)

    def cuDeviceGetName(self, buf: Any, size: int, dev: Any) -> int:  # noqa: N802
        buf.value = self.devices[dev.value].name.encode()
        return 0

    def cuDeviceTotalMem_v2(self, ref: Any, dev: Any) -> int:  # noqa: N802
        return self._set(ref, self.devices[dev.value].total_memory)

    def cuDeviceGetAttribute(self, ref: Any, attr: int, dev: Any) -> int:  # noqa: N802
        attrs = self.devices[dev.value].attributes
        if attr not in attrs:
            return 1  # CUDA_ERROR_INVALID_VALUE
        return self._set(ref, attrs[attr])


def gpu(
    name: str, cc: tuple[int, int], sms: int, mhz: int, mem_mhz: int, bus: int, gib: int
) -> DeviceProps:
    attrs = {
        Attr.COMPUTE_CAPABILITY_MAJOR: cc[0], Attr.COMPUTE_CAPABILITY_MINOR: cc[1],
        Attr.MULTIPROCESSOR_COUNT: sms, Attr.CLOCK_RATE: mhz * 1000,
        Attr.MEMORY_CLOCK_RATE: mem_mhz * 1000, Attr.GLOBAL_MEMORY_BUS_WIDTH: bus,
        Attr.MAX_THREADS_PER_BLOCK: 1024, Attr.WARP_SIZE: 32, Attr.MANAGED_MEMORY: 1,
        Attr.MAX_SHARED_MEMORY_PER_BLOCK: 48 * 1024,
        Attr.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 227 * 1024,
    }  # fmt: skip
    return DeviceProps(0, name, gib << 30, attrs, 12040)


# Published figures: (props, F32 TFLOP/s, dense F16 tensor TFLOP/s, memory TB/s)
H100 = gpu("NVIDIA H100 80GB HBM3", (9, 0), 132, 1980, 2619, 5120, 80)
A100 = gpu("NVIDIA A100-SXM4-40GB", (8, 0), 108, 1410, 1215, 5120, 40)
V100 = gpu("Tesla V100-SXM2-16GB", (7, 0), 80, 1530, 877, 4096, 16)
T4 = gpu("Tesla T4", (7, 5), 40, 1590, 5001, 256, 15)


@pytest.mark.parametrize(
    ("props", "f32_tflops", "f16_tflops", "tbs"),
    [(H100, 67, 1070, 3.35), (A100, 19.5, 312, 1.555), (V100, 15.7, 125, 0.9), (T4, 8.1, 65, 0.32)],
)
def test_peak_figures_match_the_specifications(
    props: DeviceProps, f32_tflops: float, f16_tflops: float, tbs: float
) -> None:
    caps = capabilities(props)
    peak = caps.performance.peak_gflops
    assert peak[DType.F32] / 1000 == pytest.approx(f32_tflops, rel=0.03)
    assert peak[DType.F16] / 1000 == pytest.approx(f16_tflops, rel=0.03)
    assert caps.performance.bandwidth_gbs / 1000 == pytest.approx(tbs, rel=0.03)
    assert caps.limits.compute_units == props.attr(Attr.MULTIPROCESSOR_COUNT)
    assert caps.limits.memory_bytes == props.total_memory


def test_features_follow_the_compute_capability() -> None:
    h100, a100, v100, t4 = (capabilities(p) for p in (H100, A100, V100, T4))
    assert [c.features.bf16 for c in (h100, a100, v100, t4)] == [True, True, False, False]
    assert [c.extra["fp8"] for c in (h100, a100, v100, t4)] == [True, False, False, False]
    assert all(c.extra["tensor_cores"] for c in (h100, a100, v100, t4))
    assert h100.extra["arch"] == "sm_90"
    assert t4.extra["compute_capability"] == "7.5"
    for caps in (h100, t4):
        assert DType.F16 in caps.dtypes
        assert {"attention", "gemm"} <= caps.ops
        assert {"paged_attention", "quantized_linear"} <= caps.fused_ops
        assert caps.kernel_languages == {"cuda"}


def test_bf16_is_claimed_from_sm_80_where_cupy_holds_it() -> None:
    assert DType.BF16 in backend_dtypes((9, 0), bf16=True)
    assert DType.BF16 in backend_dtypes((8, 0), bf16=True)
    assert DType.BF16 not in backend_dtypes((7, 5), bf16=True)  # no native bf16 (T4)
    assert DType.BF16 not in backend_dtypes((9, 0), bf16=False)  # CuPy < 14 or no ml_dtypes


@pytest.mark.parametrize(
    ("installed", "ml_dtypes", "expected"),
    [
        ({"cupy-cuda12x": "14.2.0"}, True, True),
        ({"cupy-cuda13x": "14.0.1"}, True, True),
        ({"cupy-cuda12x": "13.6.0"}, True, False),
        ({"cupy-cuda12x": "14.2.0"}, False, False),
        ({}, True, False),
    ],
)
def test_cupy_bf16_reads_the_installed_versions(
    installed: dict[str, str], ml_dtypes: bool, expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.metadata
    import importlib.util

    real_find_spec = importlib.util.find_spec

    def version(dist: str) -> str:
        if dist not in installed:
            raise importlib.metadata.PackageNotFoundError(dist)
        return installed[dist]

    def find_spec(name: str, *args: Any) -> Any:
        if name == "ml_dtypes":
            return real_find_spec(name) if ml_dtypes else None
        return real_find_spec(name, *args)

    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert cupy_bf16() is expected
    caps = capabilities(H100)
    assert (DType.BF16 in caps.dtypes) is expected


def test_the_fake_driver_is_read_like_libcuda(monkeypatch: pytest.MonkeyPatch) -> None:
    d = Driver(FakeLibcuda([H100, T4]))  # type: ignore[arg-type]
    monkeypatch.setattr(drv, "_driver", d)
    devices = drv.read_devices()
    assert [p.name for p in devices] == [H100.name, T4.name]
    assert devices[0].compute_capability == (9, 0)
    assert devices[1].total_memory == T4.total_memory
    assert devices[0].attributes == H100.attributes
    assert devices[0].driver_version == 12040
    infos = probe() if _has_cupy() else None
    if infos is not None:
        assert [i.device for i in infos] == ["cuda:0", "cuda:1"]
        assert infos[0].capabilities is not None
        assert infos[0].extra["bf16"]


def _has_cupy() -> bool:
    import importlib.util

    return importlib.util.find_spec("cupy") is not None


def test_no_device_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drv, "_driver", None)
    monkeypatch.setattr(
        drv,
        "Driver",
        lambda lib: Driver(FakeLibcuda([], init_error=100)),  # type: ignore[arg-type]
    )
    monkeypatch.setattr(ctypes, "CDLL", lambda name: object())
    with pytest.raises(DeviceError, match="no CUDA-capable device is detected"):
        probe()


def test_no_driver_library_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drv, "_driver", None)

    def missing(name: str) -> Any:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    with pytest.raises(DriverUnavailable, match=r"libcuda\.so\.1"):
        drv.driver()
    with pytest.raises(DeviceError, match="no CUDA devices: the NVIDIA driver library"):
        probe()


def test_listing_backends_imports_no_cupy() -> None:
    import subprocess
    import sys

    code = (
        "import sys, accelkit as ak; ak.devices();"
        "assert 'cupy' not in sys.modules, sorted(m for m in sys.modules if 'cupy' in m)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _gpu_present() -> bool:
    try:
        return bool(probe())
    except DeviceError:
        return False


GPU_PRESENT = _gpu_present()


@pytest.mark.skipif(GPU_PRESENT, reason="a GPU is present")
def test_without_a_gpu_the_selector_rejects_cuda_with_the_reason() -> None:
    explained = ak.select("cpu").report.explain()
    assert "cuda: drives cuda, not cpu" in explained
    with pytest.raises(BackendNotFoundError, match="no CUDA devices"):
        ak.select(backend="cuda")
    info = {d.backend for d in ak.devices()}
    assert "cuda" not in info


@pytest.mark.skipif(GPU_PRESENT, reason="a GPU is present")
@pytest.mark.anyio
async def test_without_a_gpu_initialize_fails_cleanly() -> None:
    pytest.importorskip("cupy")
    from accelkit_cuda.backend import CUDABackend

    backend = CUDABackend()
    assert not backend.supports_device("cuda:0")
    with pytest.raises((DeviceError, ak.UnsupportedOperationError), match="cuda"):
        await backend.initialize("cuda:0")
    assert not backend.is_ready
