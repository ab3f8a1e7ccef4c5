"""The selector: policies, requirements, explicit requests that fail loudly, environment overrides,
the report, and ``open_backend`` following the selection.

The ``fakegpu`` backend (the ``accelkit-testplug-good`` test plugin) declares a slow device
``fakegpu:0`` (2 GFLOP/s F32, 512 MiB, 1 W) and a fast one ``fakegpu:1`` (4 GFLOP/s, 256 MiB, 4 W),
so each policy picks a different one; both declare far less than the CPU backend, so the CPU
stays the default choice with the test plugins installed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import accelkit
from accelkit import Device, DType, Requirements, Selection
from accelkit.capabilities import BackendCapabilities, PerformanceHints
from accelkit.device import DeviceInfo
from accelkit.errors import (
    BackendNotFoundError,
    DeviceError,
    InvalidArgumentError,
    PluginLoadError,
)
from accelkit.plugins import PluginDescriptor
from accelkit.registry import Registry
from accelkit.sdk import HostStream, Opened
from support.device_parses import count_parses, string_parses
from support.entry_points import without_entry_point as _without_entry_point

_SETTINGS = ("ACCELKIT_PLUGINS", "ACCELKIT_DISABLE_PLUGINS", "ACCELKIT_BACKEND", "ACCELKIT_DEVICE")
_MIB = 1 << 20


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No administrator setting from the outside, and no calibration file from the user."""
    for name in _SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ACCELKIT_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def reg() -> Registry:
    return Registry()


def _ranked(sel: Selection) -> list[str]:
    return [f"{c.backend}@{c.device}" for c in sel.report.candidates]


# -- policies ---------------------------------------------------------------------------------------
def test_the_cpu_stays_the_default_choice_with_the_test_plugins_installed(reg: Registry) -> None:
    sel = accelkit.select(registry=reg)
    assert (sel.backend, str(sel.device)) == ("cpu", "cpu:0")
    ranked = _ranked(sel)
    # every candidate is in the report, best first
    assert ranked[0] == "cpu@cpu:0"
    assert ranked.index("fakegpu@fakegpu:1") < ranked.index("fakegpu@fakegpu:0")
    assert "subset@subset:0" in ranked


@pytest.mark.parametrize(
    "how", [{"device": "fakegpu"}, {"backend": "fakegpu"}, {"device": Device("fakegpu", 1)}]
)
def test_performance_picks_the_fast_device(reg: Registry, how: dict[str, object]) -> None:
    sel = accelkit.select(**how, registry=reg)  # type: ignore[arg-type]
    assert (sel.backend, str(sel.device)) == ("fakegpu", "fakegpu:1")
    best = sel.report.candidates[0]
    assert (best.score, best.basis, best.name) == (4.0, "declared", "FakeGPU Fast 900")
    if how != {"device": Device("fakegpu", 1)}:
        assert _ranked(sel) == ["fakegpu@fakegpu:1", "fakegpu@fakegpu:0"]
        assert sel.report.candidates[1].score == 2.0


def test_a_required_dtype_without_a_figure_leaves_the_others_to_rank(reg: Registry) -> None:
    """Requiring I32 (no device declares an I32 figure) scored every device 0, and the ranking
    fell to plugin priority: the slow device could win."""
    sel = accelkit.select("fakegpu", Requirements(dtypes={DType.F32, DType.I32}), registry=reg)
    assert str(sel.device) == "fakegpu:1"
    assert [c.score for c in sel.report.candidates] == [4.0, 2.0]
    sel = accelkit.select("fakegpu", Requirements(dtypes={DType.F64, DType.I32}), registry=reg)
    assert [c.score for c in sel.report.candidates] == [2.0, 1.0]  # F64's figures


def test_memory_policy_picks_the_device_with_more_memory(reg: Registry) -> None:
    sel = accelkit.select("fakegpu", policy="memory", registry=reg)
    assert sel.device == "fakegpu:0"
    assert [c.score for c in sel.report.candidates] == [0.5, 0.25]  # GiB
    # globally, the host's memory beats both
    assert accelkit.select(policy="memory", registry=reg).device == "cpu:0"


def test_power_policy_picks_the_most_gflops_per_watt(reg: Registry) -> None:
    sel = accelkit.select("fakegpu", policy="power", registry=reg)
    assert sel.device == "fakegpu:0"  # 2 GFLOP/s per W against 1
    assert [c.score for c in sel.report.candidates] == [2.0, 1.0]
    assert "GFLOP/s per W" in sel.report.candidates[0].detail


def test_power_policy_ranks_devices_of_unknown_power_last(reg: Registry) -> None:
    hints = {"cool": 1.0, "unknown": 0.0}
    for name, watts in hints.items():
        reg.register(_descriptor(name, kind="pw"), probe=_probe(name, "pw", 0, 10.0, watts=watts))
    sel = accelkit.select("pw", policy="power", registry=reg)
    assert sel.backend == "cool"
    assert "power unknown" in sel.report.candidates[-1].detail


def test_prefer_puts_a_kind_first_then_ranks_by_performance(reg: Registry) -> None:
    sel = accelkit.select(policy="prefer:fakegpu", registry=reg)
    assert sel.device == "fakegpu:1"  # preferred over the faster CPU; the fast one of the two
    assert _ranked(sel)[:3] == ["fakegpu@fakegpu:1", "fakegpu@fakegpu:0", "cpu@cpu:0"]
    assert "preferred kind fakegpu" in sel.report.candidates[0].detail
    assert accelkit.select(policy="prefer:cpu", registry=reg).device == "cpu:0"
    # case-insensitive, as a kind is everywhere else ("CPU" was refused as not lower-case)
    assert accelkit.select(policy="prefer:FakeGPU", registry=reg).device == "fakegpu:1"
    # a preference, not a requirement: with no device of that kind the best other one is chosen
    assert accelkit.select(policy="prefer:cuda", registry=reg).device == "cpu:0"


@pytest.mark.parametrize("policy", ["fastest", "prefer:", "prefer:CUDA!", "Performance", ""])
def test_an_unknown_policy_names_it_and_the_accepted_ones(reg: Registry, policy: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        accelkit.select(policy=policy, registry=reg)
    message = str(info.value)
    if policy != "prefer:CUDA!":
        assert repr(policy) in message
        assert "performance, memory, power, prefer:<kind>" in message
    else:  # the policy named, and the kind's form
        assert "policy 'prefer:CUDA!'" in message
        assert "'cuda!'" in message


def test_ties_go_to_the_priority_then_the_name(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELKIT_PLUGINS", "tie_a,tie_b")
    reg.register(_descriptor("tie_a", kind="tie", priority=1), probe=_probe("tie_a", "tie", 0, 8))
    reg.register(_descriptor("tie_b", kind="tie", priority=5), probe=_probe("tie_b", "tie", 0, 8))
    sel = accelkit.select(registry=reg)
    assert sel.backend == "tie_b"
    assert [(c.backend, c.priority) for c in sel.report.candidates] == [("tie_b", 5), ("tie_a", 1)]
    # swap the priorities: the choice follows them, not the names
    reg.register(_descriptor("tie_a", kind="tie", priority=9), probe=_probe("tie_a", "tie", 0, 8))
    assert accelkit.select(registry=reg).backend == "tie_a"
    # equal priorities: the name decides, so the choice is stable
    reg.register(_descriptor("tie_a", kind="tie", priority=5), probe=_probe("tie_a", "tie", 0, 8))
    assert accelkit.select(registry=reg).backend == "tie_a"
    # a better score beats any priority
    reg.register(_descriptor("tie_b", kind="tie", priority=0), probe=_probe("tie_b", "tie", 0, 9))
    assert accelkit.select(registry=reg).backend == "tie_b"


# -- requirements -----------------------------------------------------------------------------------
def test_a_backend_name_is_found_without_case(reg: Registry) -> None:
    """As on the command line and in ACCELKIT_BACKEND ("CPU" was "not installed")."""
    assert accelkit.select(backend="CPU", registry=reg).backend == "cpu"


@pytest.mark.parametrize(
    "hints",
    [
        {"peak_gflops": {DType.F32: float("nan")}},  # was ranked first, scored nan
        {"peak_gflops": {DType.F32: -5.0}},
        {"peak_gflops": {DType.F32: float("inf")}},
        {"bandwidth_gbs": float("inf")},
        {"power_watts": float("nan")},
    ],
)
def test_performance_figures_are_finite_and_not_negative(hints: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"finite|greater than or equal to 0"):
        PerformanceHints(**hints)


def test_requirements_no_backend_meets_list_every_rejection(reg: Registry) -> None:
    with pytest.raises(BackendNotFoundError) as info:
        accelkit.select(requires=Requirements(ops={"warp_drive"}), registry=reg)
    message = str(info.value)
    for where in ("cpu on cpu:0", "fakegpu on fakegpu:0", "fakegpu on fakegpu:1", "subset:0"):
        assert f"{where} lacks ops: warp_drive" in message, where
    assert "badprobe: quarantined (probe)" in message


def test_a_missing_op_rejects_only_the_backend_that_lacks_it(reg: Registry) -> None:
    sel = accelkit.select(requires=Requirements(ops={"attention"}), registry=reg)
    assert sel.backend == "cpu"
    rejected = {(r.backend, str(r.device)): r.reasons for r in sel.report.rejected}
    assert rejected[("subset", "subset:0")] == ("subset on subset:0 lacks ops: attention",)
    assert "subset@subset:0" not in _ranked(sel)
    with pytest.raises(BackendNotFoundError, match="subset on subset:0 lacks ops: attention"):
        accelkit.select(backend="subset", requires=Requirements(ops={"attention"}), registry=reg)


def test_min_memory_rejects_the_small_device_with_the_reason(reg: Registry) -> None:
    sel = accelkit.select(
        "fakegpu", requires=Requirements(min_memory_bytes=300 * _MIB), registry=reg
    )
    assert sel.device == "fakegpu:0"  # the fast one has too little memory
    (rejection,) = [r for r in sel.report.rejected if r.backend == "fakegpu"]
    assert rejection.device == "fakegpu:1"
    assert f"{256 * _MIB} bytes of memory; {300 * _MIB} required" in rejection.reasons[0]


def test_every_reason_of_one_rejection_is_given(reg: Registry) -> None:
    requires = Requirements(
        ops={"warp_drive"}, features={"graphs", "teleport"}, kernel_languages={"cuda"}
    )
    with pytest.raises(BackendNotFoundError) as info:
        accelkit.select(backend="fakegpu", requires=requires, registry=reg)
    message = str(info.value)
    for reason in (
        "lacks ops: warp_drive",
        "lacks feature graphs",
        "unknown feature 'teleport'",
        "compiles no cuda kernels",
    ):
        assert reason in message


def test_the_dtype_requirement_sets_the_performance_figure(reg: Registry) -> None:
    sel = accelkit.select("fakegpu", requires=Requirements(dtypes={DType.F64}), registry=reg)
    assert [c.score for c in sel.report.candidates] == [2.0, 1.0]  # the F64 figures
    assert "f64" in sel.report.candidates[0].detail


def test_a_device_without_probed_capabilities_cannot_meet_requirements(reg: Registry) -> None:
    reg.register(
        _descriptor("bare", kind="bare"),
        probe=lambda: [DeviceInfo(device="bare:0", backend="bare", name="Bare")],
    )
    assert accelkit.select(backend="bare", registry=reg).device == "bare:0"
    with pytest.raises(BackendNotFoundError, match="no capabilities to check requirements"):
        accelkit.select(backend="bare", requires=Requirements(ops={"add"}), registry=reg)


@pytest.mark.parametrize("requires", ["attention", {"ops": ["attention"]}])
def test_requires_must_be_requirements(reg: Registry, requires: object) -> None:
    with pytest.raises(InvalidArgumentError, match="requires must be a Requirements"):
        accelkit.select(requires=requires, registry=reg)  # type: ignore[arg-type]


# -- explicit requests fail loudly ------------------------------------------------------------------
def test_an_unknown_backend_is_an_error_naming_it(reg: Registry) -> None:
    with pytest.raises(BackendNotFoundError) as info:
        accelkit.select(backend="nope", registry=reg)
    assert "no backend named 'nope' is installed" in str(info.value)
    assert "cpu" in str(info.value)


def test_a_known_plugin_not_installed_says_how_to_install_it() -> None:
    # (the test environment installs every known plugin: Dask's entry point is hidden here)
    with _without_entry_point("dask"):
        reg = Registry()
        with pytest.raises(BackendNotFoundError, match=r"pip install 'accelkit-dask'"):
            accelkit.select(backend="dask", registry=reg)
        with pytest.raises(BackendNotFoundError) as info:
            accelkit.select("dask:0", registry=reg)
    assert "no installed plugin drives dask" in str(info.value)
    assert "accelkit-dask" in str(info.value)


def test_a_backend_that_does_not_drive_the_device_asked_for_says_so_not_that_none_is_installed(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--backend fakegpu --device cpu` said "no installed plugin drives cpu" (the hint looked
    at the one backend asked for); a backend from ACCELKIT_BACKEND is named as such."""
    with pytest.raises(BackendNotFoundError) as info:
        accelkit.select("cpu", backend="fakegpu", registry=reg)
    assert "drives fakegpu, not cpu" in str(info.value)
    assert "no installed plugin drives" not in str(info.value)
    monkeypatch.setenv("ACCELKIT_BACKEND", "fakegpu")
    with pytest.raises(BackendNotFoundError, match=r"backend 'fakegpu' \(ACCELKIT_BACKEND\)"):
        accelkit.select("cpu:0", registry=reg)
    monkeypatch.setenv("ACCELKIT_BACKEND", "nosuch")
    with pytest.raises(BackendNotFoundError, match=r"ACCELKIT_BACKEND='nosuch': no backend named"):
        accelkit.select(registry=reg)


def test_a_device_that_does_not_exist_is_an_error_not_another_device(reg: Registry) -> None:
    with pytest.raises(BackendNotFoundError) as info:
        accelkit.select("fakegpu:7", registry=reg)
    message = str(info.value)
    assert "device fakegpu:7" in message
    assert "fakegpu on fakegpu:0: not fakegpu:7" in message
    assert "fakegpu on fakegpu:1: not fakegpu:7" in message
    with pytest.raises(BackendNotFoundError, match="fakegpu:7"):
        accelkit.select("fakegpu:7", backend="fakegpu", registry=reg)


def test_a_backend_asked_for_a_device_it_does_not_drive_is_an_error(reg: Registry) -> None:
    with pytest.raises(BackendNotFoundError, match="drives cpu, not fakegpu"):
        accelkit.select("fakegpu:0", backend="cpu", registry=reg)


@pytest.mark.parametrize("device", ["cuda:", "cuda:-1", "gpu:x", ":0", "CUDA!"])
def test_a_malformed_device_is_an_error_naming_it(reg: Registry, device: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        accelkit.select(device, registry=reg)
    message = str(info.value)
    assert repr(device) in message or repr(device.lower()) in message


def test_a_device_of_the_wrong_type_is_an_error(reg: Registry) -> None:
    with pytest.raises(InvalidArgumentError, match="got int"):
        accelkit.select(0, registry=reg)  # type: ignore[arg-type]


# -- environment overrides --------------------------------------------------------------------------
def test_accelkit_backend_overrides_the_argument(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELKIT_BACKEND", " FakeGPU ")
    sel = accelkit.select(backend="cpu", registry=reg)
    assert (sel.backend, str(sel.device)) == ("fakegpu", "fakegpu:1")
    assert sel.report.requested_backend == "fakegpu"
    monkeypatch.setenv("ACCELKIT_BACKEND", "nope")
    with pytest.raises(BackendNotFoundError, match="'nope'"):
        accelkit.select(registry=reg)
    for malformed in ("cpu;x", "cpu,fakegpu"):  # parsed strictly, as the other settings are
        monkeypatch.setenv("ACCELKIT_BACKEND", malformed)
        with pytest.raises(InvalidArgumentError, match=r"is not a backend name; expected one"):
            accelkit.select(registry=reg)


def test_accelkit_device_overrides_the_argument(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELKIT_DEVICE", "fakegpu:0")
    sel = accelkit.select("fakegpu:1", registry=reg)
    assert sel.device == "fakegpu:0"
    assert sel.report.requested_device == "fakegpu:0"
    monkeypatch.setenv("ACCELKIT_DEVICE", "FAKEGPU")  # a kind: its best device
    assert accelkit.select(registry=reg).device == "fakegpu:1"
    monkeypatch.setenv("ACCELKIT_DEVICE", "fakegpu:7")
    with pytest.raises(BackendNotFoundError, match="fakegpu:7"):
        accelkit.select(registry=reg)


@pytest.mark.parametrize("value", ["cuda:", "cuda:-1", "gpu:x", "gpu!", "two words"])
def test_a_malformed_accelkit_device_is_an_error_naming_the_variable_and_value(
    reg: Registry, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("ACCELKIT_DEVICE", value)
    with pytest.raises(InvalidArgumentError) as info:
        accelkit.select(registry=reg)
    message = str(info.value)
    assert message.startswith("ACCELKIT_DEVICE: ")
    assert repr(value) in message or repr(value.lower()) in message
    assert "cuda:0" in message or "'cpu'" in message  # an accepted form is shown


def test_empty_overrides_are_ignored(reg: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELKIT_BACKEND", "  ")
    monkeypatch.setenv("ACCELKIT_DEVICE", "")
    assert accelkit.select("fakegpu", registry=reg).device == "fakegpu:1"


# -- the report -------------------------------------------------------------------------------------
def test_the_report_explains_the_choice(reg: Registry) -> None:
    sel = accelkit.select("fakegpu", registry=reg)
    text = sel.report.explain()
    assert text.splitlines()[0] == "policy: performance"
    assert "requested: backend=any device=fakegpu" in text
    assert "1. fakegpu on fakegpu:1 (FakeGPU Fast 900): score 4 [declared] 4 GFLOP/s f32" in text
    assert "2. fakegpu on fakegpu:0 (FakeGPU Slow 100): score 2 [declared]" in text
    assert "rejected:" in text
    assert "cpu: drives cpu, not fakegpu" in text


def test_the_report_lists_a_quarantined_probe_as_a_rejection(reg: Registry) -> None:
    sel = accelkit.select(registry=reg)
    reasons = {r.backend: r.reasons for r in sel.report.rejected}
    assert reasons["badprobe"][0].startswith("quarantined (probe): RuntimeError")
    assert "badprobe: quarantined (probe)" in sel.report.explain()


def test_a_probe_without_devices_is_a_rejection_with_its_reason(reg: Registry) -> None:
    def probe() -> list[DeviceInfo]:
        raise DeviceError("no fakeaccel driver loaded")

    reg.register(_descriptor("fakeaccel", kind="fakeaccel"), probe=probe)
    with pytest.raises(BackendNotFoundError, match="fakeaccel: no fakeaccel driver loaded"):
        accelkit.select("fakeaccel", registry=reg)
    reg.register(_descriptor("fakeaccel", kind="fakeaccel"), probe=lambda: [])
    with pytest.raises(BackendNotFoundError, match="its probe found no device"):
        accelkit.select(backend="fakeaccel", registry=reg)


def test_a_warm_select_does_not_probe_again(reg: Registry) -> None:
    calls = []

    def probe() -> list[DeviceInfo]:
        calls.append(1)
        return _probe("counted", "counted", 0, 1.0)()

    reg.register(_descriptor("counted", kind="counted"), probe=probe)
    for _ in range(3):
        assert accelkit.select("counted", registry=reg).backend == "counted"
    assert len(calls) == 1


# -- create_backend and open_backend follow the selection -------------------------------------------
def test_create_backend_imports_and_targets_the_selected_device(reg: Registry) -> None:
    backend = accelkit.create_backend("fakegpu", registry=reg)
    assert type(backend).__name__ == "FakeGPUBackend"
    assert backend.selected_device == Device("fakegpu", 1)
    assert not backend.is_ready
    backend = accelkit.create_backend(accelkit.select("fakegpu:0", registry=reg), registry=reg)
    assert backend.selected_device == Device("fakegpu", 0)
    with pytest.raises(BackendNotFoundError, match="fakegpu:7"):
        accelkit.create_backend("fakegpu:7", registry=reg)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("target", "policy", "device"),
    [
        ("fakegpu", "performance", "fakegpu:1"),
        ("fakegpu", "memory", "fakegpu:0"),
        ("fakegpu:0", "performance", "fakegpu:0"),
    ],
)
async def test_open_backend_initializes_the_selected_fake_device(
    reg: Registry, target: str, policy: str, device: str
) -> None:
    async with accelkit.open_backend(target, policy=policy, registry=reg) as backend:
        assert backend.name == "fakegpu"
        assert backend.device == Device.parse(device)
        assert backend.capabilities.device == device
        x = backend.tensor_factory.from_host(np.arange(6, dtype=np.float32).reshape(2, 3))
        y = backend.tensor_ops.matmul(x, backend.tensor_ops.transpose(x, 0, 1))
        np.testing.assert_allclose(await y.to_host(), [[5.0, 14.0], [14.0, 50.0]])
        assert y.device == Device.parse(device)
    assert not backend.is_ready
    assert backend.memory_manager.memory_info().used == 0


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("target", "parsed", "device"),
    [
        ("cpu:0", ["cpu:0"], "cpu:0"),
        ("example:0", ["example:0"], "example:0"),  # a plugin's device
        ("example", [], "example:0"),  # a backend name is no device: nothing to parse
        (Device("example", 0), [], "example:0"),
    ],
    ids=str,
)
async def test_open_backend_parses_the_users_device_string_once(
    reg: Registry,
    monkeypatch: pytest.MonkeyPatch,
    target: str | Device,
    parsed: list[str],
    device: str,
) -> None:
    # The string is parsed at the public boundary (open_backend's resolution) and the Device
    # passed inward: selection, the probe's records (made with Devices, cached), create_backend,
    # initialize and supports_device parse nothing more. The first round probes, the second
    # reads the registry's cache.
    calls = count_parses(monkeypatch)
    for _ in range(2):
        calls.clear()
        async with accelkit.open_backend(target, registry=reg) as backend:
            seen = string_parses(calls)
            assert type(backend.device) is Device
            assert str(backend.device) == device
            assert backend.selected_device is backend.device
            x = backend.tensor_factory.from_host(np.arange(3, dtype=np.float32))
            np.testing.assert_array_equal(await backend.tensor_ops.add(x, x).to_host(), [0, 2, 4])
        assert seen == parsed


@pytest.mark.anyio
async def test_a_selection_or_a_device_reaches_initialize_unparsed(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    sel = accelkit.select("example:0", registry=reg)
    assert type(sel.device) is Device
    calls = count_parses(monkeypatch)
    async with accelkit.open_backend(sel, registry=reg) as backend:
        assert backend.device is sel.device
    backend = accelkit.create_backend("example", registry=reg)
    await backend.initialize()  # the selected device
    await backend.shutdown()
    assert string_parses(calls) == []
    # initialize is a public boundary too: a user's string is parsed there, once
    backend = accelkit.create_backend("example", registry=reg)
    await backend.initialize("example:0")
    await backend.shutdown()
    assert string_parses(calls) == ["example:0"]


@pytest.mark.anyio
async def test_open_backend_quarantines_a_backend_whose_initialize_fails(reg: Registry) -> None:
    from accelkit.backends.cpu.backend import CPUBackend

    class Flaky(CPUBackend):
        name = "flaky"
        device_kinds = frozenset({"flaky"})

        def supports_device(self, device: Device | str) -> bool:
            return Device.parse(device).kind == "flaky"

        async def _initialize(self, device: Device) -> Opened[HostStream]:
            raise DeviceError("context creation failed: device lost")

    reg.register(_descriptor("flaky", kind="flaky"), Flaky, _probe("flaky", "flaky", 0, 1.0))
    with pytest.raises(DeviceError, match="device lost"):
        async with accelkit.open_backend("flaky", registry=reg):
            pytest.fail("the body must not run")  # pragma: no cover
    record = {r.name: r for r in reg.quarantined()}["flaky"]
    assert record.stage == "initialize"
    assert record.distribution == "accelkit-flaky"
    assert "device lost" in record.error
    assert "Traceback" in record.traceback
    # an explicit request for it now fails with the reason, never becoming another backend
    with pytest.raises(BackendNotFoundError, match=r"quarantined \(initialize\).*device lost"):
        async with accelkit.open_backend("flaky", registry=reg):
            pytest.fail("the body must not run")  # pragma: no cover


@pytest.mark.anyio
async def test_a_backend_class_named_as_another_plugin_is_refused_not_that_plugin(
    reg: Registry,
) -> None:
    """A plugin whose backend subclasses another plugin's class and keeps its ``name`` is
    quarantined itself, at import: its failures were recorded under the other name (a failed
    ``initialize`` put the healthy plugin in quarantine)."""
    from accelkit.backends.cpu.backend import CPUBackend

    class Copied(CPUBackend):  # name stays "cpu"
        device_kinds = frozenset({"copied"})

    reg.register(_descriptor("copied", kind="copied"), Copied, _probe("copied", "copied", 0, 1.0))
    reg.register(_descriptor("cpu", kind="cpu"), CPUBackend, _probe("cpu", "cpu", 0, 1.0))
    with pytest.raises(PluginLoadError, match=r"\.name is 'cpu', not the plugin's name 'copied'"):
        accelkit.create_backend("copied", registry=reg)
    records = [(r.name, r.stage) for r in reg.quarantined()]
    assert ("copied", "import") in records
    assert "cpu" not in [name for name, _ in records]
    async with accelkit.open_backend("cpu", registry=reg) as backend:
        assert backend.name == "cpu"


# -- helpers ----------------------------------------------------------------------------------------
def _descriptor(name: str, *, kind: str, priority: int = 0) -> PluginDescriptor:
    return PluginDescriptor(
        name=name,
        distribution=f"accelkit-{name}",
        version="0.1.0",
        api_version="3.0",
        device_kinds=frozenset({kind}),
        priority=priority,
        backend_class="accelkit.backends.cpu.backend:CPUBackend",
    )


def _probe(
    backend: str, kind: str, index: int, gflops: float, *, watts: float = 0.0
) -> Callable[[], list[DeviceInfo]]:
    def probe() -> list[DeviceInfo]:
        caps = BackendCapabilities(
            backend=backend,
            device=f"{kind}:{index}",
            dtypes=frozenset({DType.F32}),
            ops=frozenset({"add", "matmul"}),
            performance=PerformanceHints(peak_gflops={DType.F32: gflops}, power_watts=watts),
        )
        return [DeviceInfo(device=f"{kind}:{index}", backend=backend, name=kind, capabilities=caps)]

    return probe
