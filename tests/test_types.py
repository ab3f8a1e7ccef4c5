"""Core types: Device, DType and the promotion rules, the pydantic models, and the errors."""

from __future__ import annotations

import builtins
import itertools
import json
import pickle
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

import accelkit
from accelkit import (
    BackendCapabilities,
    BackendStatus,
    Device,
    DeviceInfo,
    DType,
    Features,
    InvalidArgumentError,
    LifecycleState,
    Limits,
    MemoryInfo,
    MemoryPoolConfig,
    MemoryPressure,
    PerformanceHints,
    Requirements,
)
from accelkit.dtype import result_type, scalar_result_type
from support.device_parses import count_parses


# -- Device -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "kind", "index"),
    [
        ("cuda:0", "cuda", 0),
        ("cuda:12", "cuda", 12),
        ("cpu", "cpu", 0),
        ("opencl:1", "opencl", 1),
        ("CPU", "cpu", 0),  # case-insensitive
        ("  cuda:2 ", "cuda", 2),  # surrounding spaces are ignored
        ("web_gpu2:3", "web_gpu2", 3),
    ],
)
def test_device_parse(text: str, kind: str, index: int) -> None:
    d = Device.parse(text)
    assert (d.kind, d.index) == (kind, index)
    assert str(d) == f"{kind}:{index}"
    assert repr(d) == f"Device(kind={kind!r}, index={index})"
    assert Device.parse(d) is d


@pytest.mark.parametrize(
    ("text", "kind", "address"),
    [
        ("dask://10.0.0.5:8786", "dask", "10.0.0.5:8786"),
        ("DASK://Sched.Example:8786", "dask", "Sched.Example:8786"),  # the kind's case only
        (" dask://tls://h:1 ", "dask", "tls://h:1"),
    ],
)
def test_device_parse_addresses(text: str, kind: str, address: str) -> None:
    d = Device.parse(text)
    assert (d.kind, d.index, d.address) == (kind, 0, address)
    assert str(d) == f"{kind}://{address}"
    assert Device.parse(str(d)) == d


@pytest.mark.parametrize(
    "text",
    ["cuda:", "cuda:-1", "gpu:x", "", ":0", "cuda:0:1", "1cuda", "cu da", "cuda:1.5", "cuda:+1"],
)
def test_device_parse_refuses_malformed_strings(text: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Device.parse(text)
    assert repr(text) in str(info.value)
    assert "kind:index" in str(info.value)


@pytest.mark.parametrize("value", [0, None, ("cuda", 0), b"cpu"])
def test_device_parse_refuses_non_strings(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match=type(value).__name__):
        Device.parse(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "index", "fragment"),
    [
        ("CUDA", 0, "'CUDA'"),
        ("", 0, "''"),
        ("cuda", -1, "-1"),
        ("cuda", True, "True"),
        ("cuda", 1.0, "1.0"),
        (3, 0, "3"),
    ],
)
def test_device_constructor_is_strict(kind: Any, index: Any, fragment: str) -> None:
    with pytest.raises(InvalidArgumentError, match=fragment):
        Device(kind, index)


def test_device_equality_hashing_and_pickling() -> None:
    assert Device("cpu") == Device("cpu", 0)
    for text in ("cpu", "cpu:0", "CPU:0"):
        assert Device("cpu") == text
        assert text == Device("cpu")
    assert Device("cuda", 1) != "cuda:0"
    assert Device("cuda", 1) != Device("opencl", 1)
    assert Device("cuda") != "not a device:"  # malformed strings compare unequal, never raise
    assert Device("cuda") != 5
    assert len({Device("cuda", 0), Device.parse("cuda"), Device("cuda", 1)}) == 2
    assert {Device("cpu"): 1}[Device.parse("cpu:0")] == 1
    # a Device and its string form are the same key (equal, so hashed alike)
    by_device: dict[object, int] = {Device("cuda", 1): 1}
    by_string: dict[object, int] = {"cuda:1": 1}
    assert by_device["cuda:1"] == by_string[Device("cuda", 1)] == 1
    assert {Device("cpu"), Device("cuda", 1)} == {"cpu:0", "cuda:1"}
    remote: set[tuple[str, object]] = {("dask", Device("dask", address="10.0.0.5:8786"))}
    assert ("dask", "dask://10.0.0.5:8786") in remote
    d = Device("opencl", 3)
    assert pickle.loads(pickle.dumps(d)) == d
    with pytest.raises(AttributeError):
        d.index = 4  # type: ignore[misc]


# -- DType ------------------------------------------------------------------------------------------
ITEMSIZE = {
    DType.F16: 2, DType.BF16: 2, DType.F32: 4, DType.F64: 8, DType.I8: 1, DType.I16: 2,
    DType.I32: 4, DType.I64: 8, DType.U8: 1, DType.U16: 2, DType.U32: 4, DType.U64: 8,
    DType.BOOL: 1,
}  # fmt: skip
NUMPY = {
    DType.F16: np.float16, DType.BF16: ml_dtypes.bfloat16, DType.F32: np.float32,
    DType.F64: np.float64, DType.I8: np.int8, DType.I16: np.int16, DType.I32: np.int32,
    DType.I64: np.int64, DType.U8: np.uint8, DType.U16: np.uint16, DType.U32: np.uint32,
    DType.U64: np.uint64, DType.BOOL: np.bool_,
}  # fmt: skip


@pytest.mark.parametrize("dtype", list(DType), ids=str)
def test_dtype_itemsize_and_numpy(dtype: DType) -> None:
    assert dtype.itemsize == ITEMSIZE[dtype]
    assert dtype.to_numpy() == np.dtype(NUMPY[dtype])
    assert dtype.to_numpy().itemsize == dtype.itemsize
    assert str(dtype) == dtype.value
    assert DType.from_any(dtype) is dtype
    assert DType.from_any(dtype.value) is dtype
    assert DType.from_any(dtype.value.upper()) is dtype
    assert DType.from_any(dtype.to_numpy()) is dtype
    assert DType.from_any(NUMPY[dtype]) is dtype


def test_dtype_kinds() -> None:
    floats = {DType.F16, DType.BF16, DType.F32, DType.F64}
    ints = {DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.U16, DType.U32, DType.U64}
    for d in DType:
        assert d.is_floating == (d in floats)
        assert d.is_integer == (d in ints)
        assert d.is_signed == (d in floats or d.value.startswith("i"))


@pytest.mark.parametrize(
    ("value", "dtype"),
    [
        ("float32", DType.F32), ("float", DType.F32), ("double", DType.F64), ("half", DType.F16),
        ("bfloat16", DType.BF16), ("int8", DType.I8), ("uint64", DType.U64), ("bool", DType.BOOL),
        (np.float64, DType.F64), (np.dtype("int16"), DType.I16), (bool, DType.BOOL), ("f8", DType.F64),
    ],
)  # fmt: skip
def test_dtype_from_any_aliases(value: object, dtype: DType) -> None:
    assert DType.from_any(value) is dtype


@pytest.mark.parametrize(
    "value",
    [
        "fp8", "complex64", np.complex128, "float128", object(), 3.5, None,
    ],
)  # fmt: skip
def test_dtype_from_any_refuses_unknown(value: object) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        DType.from_any(value)
    msg = str(info.value)
    assert "unknown dtype" in msg
    assert "f32" in msg
    assert "bf16" in msg


@pytest.mark.parametrize(
    ("a", "b", "out"),
    [
        (DType.F32, DType.F64, DType.F64),
        (DType.F16, DType.F32, DType.F32),
        (DType.BF16, DType.F16, DType.F32),
        (DType.BF16, DType.F32, DType.F32),
        (DType.BF16, DType.I64, DType.BF16),
        (DType.BF16, DType.BOOL, DType.BF16),
        (DType.F16, DType.I64, DType.F16),
        (DType.F32, DType.U64, DType.F32),
        (DType.I8, DType.U8, DType.I16),
        (DType.I16, DType.U16, DType.I32),
        (DType.I32, DType.U32, DType.I64),
        (DType.U64, DType.I64, DType.I64),
        (DType.U64, DType.I8, DType.I64),
        (DType.U64, DType.U8, DType.U64),
        (DType.BOOL, DType.U8, DType.U8),
        (DType.BOOL, DType.BOOL, DType.BOOL),
    ],
    ids=lambda d: d.value,
)
def test_result_type_table(a: DType, b: DType, out: DType) -> None:
    assert result_type(a, b) is out
    assert result_type(b, a) is out


@given(st.sampled_from(list(DType)), st.sampled_from(list(DType)))
def test_result_type_properties(a: DType, b: DType) -> None:
    r = result_type(a, b)
    assert r is result_type(b, a)
    assert result_type(a, a) is a
    # The result holds both operands' kinds: a float if either is one.
    if a.is_floating or b.is_floating:
        assert r.is_floating
    # Between two integers (unsigned 64 with a signed one aside) it is NumPy's promotion.
    if a.is_integer and b.is_integer and DType.U64 not in (a, b):
        assert r.to_numpy() == np.promote_types(a.to_numpy(), b.to_numpy())
    # Between two floats of the same family it is the wider one.
    if a.is_floating and b.is_floating and DType.BF16 not in (a, b):
        assert r.itemsize == max(a.itemsize, b.itemsize)


def test_result_type_is_associative_enough_for_three_ints() -> None:
    ints = [DType.I8, DType.I16, DType.U8, DType.U16, DType.I32]
    for a, b, c in itertools.product(ints, repeat=3):
        assert result_type(result_type(a, b), c) is result_type(a, result_type(b, c))


@pytest.mark.parametrize(
    ("t", "scalar", "out"),
    [
        (DType.I32, 2, DType.I32), (DType.I32, 2.5, DType.F32), (DType.U8, 1000, DType.U8),
        (DType.BOOL, 1, DType.I64), (DType.BOOL, True, DType.BOOL), (DType.BOOL, 1.0, DType.F32),
        (DType.F16, 1.0, DType.F16), (DType.BF16, 3, DType.BF16), (DType.I64, False, DType.I64),
    ],
)  # fmt: skip
def test_scalar_result_type(t: DType, scalar: bool | float, out: DType) -> None:
    assert scalar_result_type(t, scalar) is out


@pytest.mark.parametrize("scalar", ["1", None, 1j, [1]])
def test_scalar_result_type_refuses_non_scalars(scalar: object) -> None:
    with pytest.raises(InvalidArgumentError, match=type(scalar).__name__):
        scalar_result_type(DType.F32, scalar)


# -- pydantic models --------------------------------------------------------------------------------
def _caps(**kw: Any) -> BackendCapabilities:
    base: dict[str, Any] = dict(
        backend="toy",
        device="toy:0",
        dtypes={DType.F32, DType.F16},
        ops={"add", "matmul"},
        kernel_languages={"wgsl"},
        features=Features(fp16=True, async_copy=True),
        limits=Limits(memory_bytes=1 << 30, compute_units=8),
        performance=PerformanceHints(peak_gflops={DType.F32: 100.0}, bandwidth_gbs=50.0),
    )
    base.update(kw)
    return BackendCapabilities(**base)


@pytest.mark.parametrize(
    ("model", "field", "value"),
    [
        (Features(), "fp16", True),
        (Limits(), "memory_bytes", 5),
        (PerformanceHints(), "bandwidth_gbs", 1.0),
        (Requirements(), "min_memory_bytes", 1),
        (MemoryPoolConfig(), "enabled", False),
        (DeviceInfo(device="cpu:0", backend="cpu", name="host"), "name", "other"),
        (BackendStatus(backend="cpu", state=LifecycleState.READY), "state", LifecycleState.FAILED),
        (
            MemoryInfo(
                total=10,
                used=1,
                free=9,
                reserved=2,
                peak=1,
                active_allocations=1,
                fragmentation=0.5,
            ),
            "used",
            2,
        ),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, str | int | float | bool) else str(v),
)
def test_models_are_frozen(model: BaseModel, field: str, value: object) -> None:
    with pytest.raises(ValidationError, match="frozen"):
        setattr(model, field, value)


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: Limits(memory_bytes=-1), "memory_bytes"),
        (lambda: Limits(compute_units="many"), "compute_units"),
        (lambda: PerformanceHints(bandwidth_gbs=-0.5), "bandwidth_gbs"),
        (lambda: PerformanceHints(peak_gflops={"f128": 1.0}), "peak_gflops"),
        (lambda: Requirements(dtypes={"f33"}), "dtypes"),
        (lambda: Requirements(min_memory_bytes=-1), "min_memory_bytes"),
        (lambda: MemoryPoolConfig(limit_bytes=0), "limit_bytes"),
        (lambda: MemoryPoolConfig(alignment=0), "alignment"),
        (lambda: MemoryPoolConfig(max_cached_bytes=-1), "max_cached_bytes"),
        (
            lambda: MemoryInfo(
                total=1, used=0, free=1, reserved=0, peak=0, active_allocations=0, fragmentation=1.5
            ),
            "fragmentation",
        ),
        (
            lambda: DeviceInfo(device="cpu:0", backend="cpu", name="x", memory_bytes=-1),
            "memory_bytes",
        ),
        (lambda: DeviceInfo(device="cuda:-1", backend="cuda", name="x"), "device"),
        (lambda: DeviceInfo(device=0, backend="cuda", name="x"), "device"),
        (lambda: BackendStatus(backend="cpu", state="sleeping"), "state"),
        (
            lambda: BackendStatus(backend="cpu", state="ready", pending_operations=-1),
            "pending_operations",
        ),
        (
            # no ops: deliberately incomplete, the error under test
            lambda: BackendCapabilities(backend="x", device="x:0", dtypes={DType.F32}),  # type: ignore[call-arg]
            "ops",
        ),
    ],
)
def test_models_validate_their_fields(make: Callable[[], object], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        make()
    assert field in str(info.value)


def test_models_coerce_at_the_boundary() -> None:
    req = Requirements(ops=["matmul", "add"], dtypes=["f16", DType.F32], features=["fp16"])
    assert req.ops == frozenset({"matmul", "add"})
    assert req.dtypes == frozenset({DType.F16, DType.F32})
    status = BackendStatus(backend="cpu", state="ready")
    assert status.state is LifecycleState.READY
    assert MemoryPoolConfig().alignment == 64
    assert MemoryPoolConfig().limit_bytes is None


def test_capabilities_round_trip_through_json() -> None:
    caps = _caps()
    again = BackendCapabilities.model_validate_json(caps.model_dump_json())
    assert again == caps
    assert again.performance.peak_gflops == {DType.F32: 100.0}


@pytest.mark.parametrize("text", ["cuda:1", "dask://10.0.0.5:8786"])
def test_device_info_holds_a_device_and_round_trips_through_json(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = count_parses(monkeypatch)
    info = DeviceInfo(device=text, backend="x", name="n", capabilities=_caps())
    assert calls == [text]  # a probe's string: parsed once, where the record is made
    assert type(info.device) is Device
    assert (info.device.kind, str(info.device)) == (text.split(":")[0], text)
    # dumped, it is the string (as `accelkit info --json` shows it), in both modes
    assert info.model_dump()["device"] == text
    assert info.model_dump(mode="json")["device"] == text
    data = info.model_dump_json()
    assert json.loads(data)["device"] == text
    calls.clear()
    again = DeviceInfo.model_validate_json(data)
    assert calls == [text]
    assert again == info
    assert type(again.device) is Device
    assert DeviceInfo.model_validate(info.model_dump()) == info
    assert pickle.loads(pickle.dumps(info)) == info
    # a Device is taken as it is: not parsed, not copied
    calls.clear()
    made = DeviceInfo(device=info.device, backend="x", name="n")
    assert made.device is info.device
    assert calls == []
    assert DeviceInfo.model_json_schema()["properties"]["device"]["type"] == "string"


def test_capabilities_meets_explains_every_miss() -> None:
    caps = _caps()
    ok = caps.meets(
        Requirements(
            ops={"add"},
            dtypes={DType.F16},
            features={"fp16"},
            min_memory_bytes=1 << 20,
            kernel_languages={"wgsl"},
        )
    )
    assert ok
    assert ok.ok
    assert ok.reasons == ()
    check = caps.meets(
        Requirements(
            ops={"attention", "add", "conv2d"},
            dtypes={DType.BF16, DType.F32},
            features={"fp64", "fp16", "teleport"},
            min_memory_bytes=2 << 30,
            kernel_languages={"cuda", "wgsl"},
        )
    )
    assert not check
    assert check.ok is False
    text = "\n".join(check.reasons)
    assert len(check.reasons) == 6
    assert "lacks ops: attention, conv2d" in text
    assert "lacks dtypes: bf16" in text
    assert "lacks feature fp64" in text
    assert "unknown feature 'teleport'" in text
    assert "fp16" in text
    assert str(1 << 30) in text
    assert str(2 << 30) in text
    assert "cuda" in text
    assert "wgsl" not in text.split("compiles no")[-1]
    assert all("toy" in r for r in check.reasons if "unknown feature" not in r)


def test_fused_ops_are_named_apart_from_tensor_ops() -> None:
    caps = _caps(fused_ops={"rms_norm", "paged_attention"})
    assert caps.meets(Requirements(fused_ops={"paged_attention"}))
    check = caps.meets(Requirements(ops={"add"}, fused_ops={"sample_token", "rms_norm"}))
    assert check.reasons == ("toy on toy:0 has no fused kernel for: sample_token",)
    # A KernelOps-only name among the TensorOps names is the 1.x shape: refused, saying where
    # it goes now (names both kinds share, such as rms_norm, are TensorOps names too).
    with pytest.raises(ValidationError, match=r"paged_attention.*fused_ops"):
        _caps(ops={"add", "paged_attention"})
    with pytest.raises(ValidationError, match=r"silu_mul.*fused_ops"):
        Requirements(ops={"silu_mul"})
    assert "rms_norm" in _caps(ops={"rms_norm"}).ops
    with pytest.raises(ValidationError, match=r"not KernelOps names.*add"):
        _caps(fused_ops={"add"})


def test_capabilities_memory_unknown_is_not_a_miss() -> None:
    assert _caps(limits=Limits()).meets(Requirements(min_memory_bytes=1 << 40))


@pytest.mark.parametrize(
    ("fraction", "level"),
    [
        (0.0, "low"),
        (0.4999, "low"),
        (0.5, "medium"),
        (0.7499, "medium"),
        (0.75, "high"),
        (0.8999, "high"),
        (0.9, "critical"),
        (1.5, "critical"),
    ],
)
def test_memory_pressure_levels(fraction: float, level: str) -> None:
    assert MemoryPressure.from_fraction(fraction) is MemoryPressure(level)


def test_cpu_capabilities_are_available_before_initialize() -> None:
    caps = accelkit.create_backend("cpu").capabilities
    assert caps.backend == "cpu"
    assert caps.device == "cpu:0"
    assert caps.dtypes == frozenset(DType)
    assert {"attention", "conv2d", "gaussian_blur", "adam_update"} <= caps.ops
    assert caps.features.bf16
    assert caps.features.fp64
    assert caps.meets(Requirements(ops={"attention"}, dtypes={DType.F16}))


# -- errors -----------------------------------------------------------------------------------------
def test_error_hierarchy() -> None:
    names = [
        "NotInitializedError", "UnsupportedOperationError", "InvalidArgumentError",
        "OutOfMemoryError", "DeviceError", "ContextPoisonedError", "StaleHandleError",
        "KernelCompileError", "BackendNotFoundError", "PluginLoadError",
        "IncompatiblePluginError", "TimeoutError",
    ]  # fmt: skip
    for name in names:
        cls = getattr(accelkit, name)
        assert issubclass(cls, accelkit.AccelError), name
        assert cls is getattr(accelkit.errors, name)
    assert issubclass(accelkit.InvalidArgumentError, ValueError)
    assert issubclass(accelkit.OutOfMemoryError, MemoryError)
    assert issubclass(accelkit.BackendNotFoundError, LookupError)
    assert issubclass(accelkit.TimeoutError, builtins.TimeoutError)
    assert issubclass(accelkit.ContextPoisonedError, accelkit.DeviceError)
    assert issubclass(accelkit.IncompatiblePluginError, accelkit.PluginLoadError)


def test_error_payloads() -> None:
    oom = accelkit.OutOfMemoryError("too big", requested=10, used=5, limit=12)
    assert (oom.requested, oom.used, oom.limit) == (10, 5, 12)
    err = accelkit.KernelCompileError("kernel k failed", log="line 3: syntax error")
    assert err.log == "line 3: syntax error"
    assert "line 3: syntax error" in str(err)
    assert "kernel k failed" in str(err)
    assert str(accelkit.KernelCompileError("no log")) == "no log"
