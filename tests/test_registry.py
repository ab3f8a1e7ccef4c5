"""The plugin registry: discovery without importing backends, the API-version gate, quarantine,
allow/deny lists, programmatic registration, rescan, and cached probes.

The plugins used here are real distributions under ``tests/plugins/`` (installed into the test
environment by the nox ``tests`` session, or by hand with ``pip install -e tests/plugins/<name>``):

- ``accelkit-testplug-good``: backend ``fakegpu``, devices ``fakegpu:0`` (slow) and ``fakegpu:1``;
- ``accelkit-testplug-broken``: its descriptor module raises on import;
- ``accelkit-testplug-future``: built for plugin API 3.0;
- ``accelkit-testplug-badprobe``: its probe raises RuntimeError;
- ``accelkit-testplug-subset``: backend ``subset`` without attention (for the fallback tests);
- ``accelkit-testplug-crash``: backend ``crash``, whose matmul aborts the process (for doctor).

Each test uses a fresh :class:`Registry`, so the process-wide one's caches do not leak between
tests; checks that need a clean interpreter run in a subprocess.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import accelkit
from accelkit.abc.backend import ComputeBackend
from accelkit.device import DeviceInfo
from accelkit.errors import (
    BackendNotFoundError,
    DeviceError,
    IncompatiblePluginError,
    InvalidArgumentError,
    PluginLoadError,
)
from accelkit.plugins import ENTRY_POINT_GROUP, PLUGIN_API_VERSION, PluginDescriptor
from accelkit.registry import Registry
from support.entry_points import without_entry_point as _without_entry_point

TEST_PLUGINS = {
    "fakegpu": "accelkit-testplug-good",
    "broken": "accelkit-testplug-broken",
    "future": "accelkit-testplug-future",
    "badprobe": "accelkit-testplug-badprobe",
    "subset": "accelkit-testplug-subset",
    "crash": "accelkit-testplug-crash",
}
GOOD_BACKEND_MODULE = "accelkit_testplug_good.backend"
_SETTINGS = ("ACCELKIT_PLUGINS", "ACCELKIT_DISABLE_PLUGINS", "ACCELKIT_BACKEND", "ACCELKIT_DEVICE")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No administrator setting from the outside, and no calibration file from the user."""
    for name in _SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ACCELKIT_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def reg() -> Registry:
    return Registry()


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on ``sys.path`` to "install" distributions into; modules imported from it are
    forgotten afterwards."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    before = set(sys.modules)
    yield folder
    for name in set(sys.modules) - before:
        if name.startswith("akt_"):
            del sys.modules[name]


def _install(site: Path, dist: str, entry_points: dict[str, str], modules: dict[str, str]) -> Path:
    """What ``pip install`` leaves behind, reduced to what importlib.metadata reads."""
    for module, source in modules.items():
        (site / f"{module}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    info = site / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n", encoding="utf-8"
    )
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}", encoding="utf-8")
    return info


def _descriptor_module(name: str, module: str, *, declared_name: str | None = None) -> str:
    return f"""
        from accelkit.device import DeviceInfo
        from accelkit.plugins import PluginDescriptor

        DESCRIPTOR = PluginDescriptor(
            name={declared_name or name!r},
            distribution="accelkit-{name}",
            version="0.1.0",
            api_version="3.0",
            device_kinds=frozenset({{{name!r}}}),
            backend_class="accelkit.backends.cpu.backend:CPUBackend",
            probe="{module}:probe",
        )


        def probe():
            return [DeviceInfo(device="{name}:0", backend={name!r}, name="Late device")]
        """


def _run(code: str, tmp_path: Path, **env: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter; it prints one JSON object."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
    clean["ACCELKIT_CACHE_DIR"] = str(tmp_path / "cache")
    clean.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=clean,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


# -- the test plugins are installed -----------------------------------------------------------------
def test_the_test_plugins_are_installed() -> None:
    found = {
        ep.name: ep.dist.name if ep.dist else ""
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    }
    missing = [f"tests/plugins/{dist}" for name, dist in TEST_PLUGINS.items() if name not in found]
    assert not missing, "install the test plugins: pip install " + " ".join(
        f"-e {m}" for m in missing
    )
    for name, dist in TEST_PLUGINS.items():
        assert found[name].replace("_", "-").lower() == dist


def test_cpu_registers_through_accelkits_own_entry_point() -> None:
    (ep,) = [
        ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == "cpu"
    ]
    assert ep.value == "accelkit.backends.cpu.descriptor:DESCRIPTOR"
    assert ep.dist is not None
    assert ep.dist.name == "accelkit"


# -- listing is cheap: nothing heavy is imported ----------------------------------------------------
def test_import_accelkit_imports_neither_numpy_nor_any_backend(tmp_path: Path) -> None:
    out = _run(
        """
        import json, sys
        import accelkit
        print(json.dumps({"modules": sorted(sys.modules)}))
        """,
        tmp_path,
    )
    modules = out["modules"]
    assert isinstance(modules, list)
    heavy = [
        m
        for m in modules
        if m.split(".")[0] in {"numpy", "scipy", "numexpr", "ml_dtypes"}
        or m.startswith(("accelkit.backends", "accelkit_testplug"))
    ]
    assert heavy == []


def test_listing_imports_no_backend_module_in_a_fresh_interpreter(tmp_path: Path) -> None:
    out = _run(
        """
        import json, os, sys
        # Only the plugins this test knows: a real plugin's probe may import its driver.
        os.environ["ACCELKIT_PLUGINS"] = "badprobe,broken,cpu,fakegpu,future,subset"
        import accelkit
        from accelkit import registry

        names = [d.name for d in registry.descriptors()]
        devices = [str(d.device) for d in accelkit.devices()]
        chosen = str(accelkit.select().device)
        statuses = {s.name: s.status for s in registry.statuses()}
        listed = sorted(sys.modules)
        accelkit.create_backend("fakegpu")
        marker = getattr(sys.modules.get("accelkit_testplug_good.backend"),
                         "BACKEND_MODULE_IMPORTED", False)
        print(json.dumps({"names": names, "devices": devices, "chosen": chosen,
                          "statuses": statuses, "listed": listed, "marker": marker}))
        """,
        tmp_path,
    )
    listed = out["listed"]
    assert isinstance(listed, list)
    assert {"cpu", "fakegpu", "subset", "badprobe"} <= set(out["names"])
    assert {"broken", "future"}.isdisjoint(out["names"])
    assert {"cpu:0", "fakegpu:0", "fakegpu:1", "subset:0"} <= set(out["devices"])
    # the test plugins are slower than the CPU, so installing them changes no default choice
    assert out["chosen"] == "cpu:0"
    statuses = out["statuses"]
    assert isinstance(statuses, dict)
    known = {"badprobe", "broken", "cpu", "fakegpu", "future", "subset"}
    # Other real plugins installed beside the test ones (accelkit-opencl, say) may be listed too.
    assert {k: v for k, v in statuses.items() if k in known} == {
        "badprobe": "quarantined",
        "broken": "quarantined",
        "cpu": "ok",
        "fakegpu": "ok",
        "future": "quarantined",
        "subset": "ok",
    }
    # descriptors and probes were read ...
    assert "accelkit_testplug_good.descriptor" in listed
    assert "accelkit_testplug_good.probe" in listed
    # ... but no backend module, not even the refused plugin's, and no NumPy
    for module in (
        "accelkit.backends.cpu.backend",
        GOOD_BACKEND_MODULE,
        "accelkit_testplug_subset.backend",
        "accelkit_testplug_badprobe.backend",
        "accelkit_testplug_future.backend",
        "numpy",
    ):
        assert module not in listed, module
    # creating the backend is what imports it
    assert out["marker"] is True


def test_descriptors_list_the_good_plugin_without_importing_its_backend(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, GOOD_BACKEND_MODULE, raising=False)
    desc = reg.descriptor("fakegpu")
    assert desc.distribution == "accelkit-testplug-good"
    assert desc.device_kinds == {"fakegpu"}
    assert desc.backend_class == "accelkit_testplug_good.backend:FakeGPUBackend"
    assert "fakegpu" in [d.name for d in reg.descriptors()]
    devices = {str(d.device): d for d in reg.devices()}
    assert devices["fakegpu:0"].name == "FakeGPU Slow 100"
    assert devices["fakegpu:1"].name == "FakeGPU Fast 900"
    assert devices["fakegpu:1"].capabilities is not None
    reg.statuses()
    assert GOOD_BACKEND_MODULE not in sys.modules

    cls = reg.backend_class("fakegpu")  # first use imports it
    assert GOOD_BACKEND_MODULE in sys.modules
    assert sys.modules[GOOD_BACKEND_MODULE].BACKEND_MODULE_IMPORTED is True
    assert issubclass(cls, ComputeBackend)
    assert cls.name == "fakegpu"
    assert reg.backend_class("fakegpu") is cls  # imported once


def test_probes_are_cached_until_refresh_or_rescan(reg: Registry) -> None:
    probe_module = importlib.import_module("accelkit_testplug_good.probe")
    start = probe_module.CALLS
    first = reg.probe("fakegpu")
    assert [d.device for d in first] == ["fakegpu:0", "fakegpu:1"]
    reg.probe("fakegpu")
    reg.devices()
    assert probe_module.CALLS - start == 1
    reg.probe("fakegpu", refresh=True)
    assert probe_module.CALLS - start == 2
    reg.rescan()
    reg.devices()
    assert probe_module.CALLS - start == 3


# -- quarantine -------------------------------------------------------------------------------------
def test_a_plugin_whose_import_raises_is_quarantined_with_its_traceback(reg: Registry) -> None:
    names = [d.name for d in reg.descriptors()]  # listing goes on
    assert "broken" not in names
    assert {"cpu", "fakegpu"} <= set(names)
    records = {r.name: r for r in reg.quarantined()}
    record = records["broken"]
    assert record.stage == "load"
    assert record.error.startswith("RuntimeError: accelkit-testplug-broken")
    assert record.distribution.replace("_", "-") == "accelkit-testplug-broken"
    assert "Traceback (most recent call last)" in record.traceback
    assert "accelkit_testplug_broken" in record.traceback
    assert "descriptor.py" in record.traceback
    with pytest.raises(BackendNotFoundError, match=r"'broken' is quarantined \(load\).*on purpose"):
        reg.descriptor("broken")
    status = {s.name: s for s in reg.statuses()}["broken"]
    assert status.status == "quarantined"
    assert status.reason.startswith("load: RuntimeError")


def test_a_broken_plugin_does_not_break_import_or_listing(tmp_path: Path) -> None:
    out = _run(
        """
        import json
        import accelkit
        from accelkit import registry
        names = [d.name for d in registry.descriptors()]
        devices = [str(d.device) for d in accelkit.devices()]
        broken = [r.stage for r in registry.quarantined() if r.name == "broken"]
        print(json.dumps({"names": names, "devices": devices, "broken": broken}))
        """,
        tmp_path,
    )
    assert "cpu" in out["names"]
    assert "cpu:0" in out["devices"]
    assert out["broken"] == ["load"]


def test_a_plugin_for_another_api_version_is_refused_before_its_backend_is_imported(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, "accelkit_testplug_future.backend", raising=False)
    assert "future" not in [d.name for d in reg.descriptors()]
    record = {r.name: r for r in reg.quarantined()}["future"]
    assert record.stage == "version"
    assert record.error.startswith("IncompatiblePluginError:")
    assert "4.0" in record.error
    assert PLUGIN_API_VERSION in record.error
    assert "accelkit-testplug-future" in record.error
    with pytest.raises(BackendNotFoundError, match=r"3\.0"):
        accelkit.select(backend="future", registry=reg)
    with pytest.raises(BackendNotFoundError):
        reg.backend_class("future")
    with pytest.raises(BackendNotFoundError):
        reg.probe("future")
    assert "accelkit_testplug_future.backend" not in sys.modules


def test_a_probe_that_raises_is_quarantined_at_stage_probe(reg: Registry) -> None:
    assert "badprobe" in [d.name for d in reg.descriptors()]  # its descriptor is fine
    devices = [d.device for d in reg.devices()]  # listing goes on without it
    assert "cpu:0" in devices
    assert "fakegpu:1" in devices
    assert not any(d.kind == "badprobe" for d in devices)
    record = {r.name: r for r in reg.quarantined()}["badprobe"]
    assert record.stage == "probe"
    assert record.error == "RuntimeError: accelkit-testplug-badprobe: the probe fails, on purpose"
    assert "probe.py" in record.traceback
    assert record.distribution == "accelkit-testplug-badprobe"
    reason = reg.unavailable_reason("badprobe")
    assert reason is not None
    assert reason.startswith("quarantined (probe): RuntimeError")
    assert reg.probe("badprobe") == []
    assert {s.name: s.status for s in reg.statuses()}["badprobe"] == "quarantined"


def test_a_probe_answering_device_error_means_no_device_not_quarantine(reg: Registry) -> None:
    def probe() -> list[DeviceInfo]:
        raise DeviceError("driver 5.1 is older than the 6.0 this plugin needs")

    reg.register(_manual("nodevice"), probe=probe)
    assert reg.probe("nodevice") == []
    assert reg.unavailable_reason("nodevice") == (
        "driver 5.1 is older than the 6.0 this plugin needs"
    )
    assert "nodevice" not in [r.name for r in reg.quarantined()]
    status = {s.name: s for s in reg.statuses()}["nodevice"]
    assert (status.status, status.devices) == ("ok", 0)
    assert "driver 5.1" in status.reason


def test_a_probe_returning_garbage_is_quarantined(reg: Registry) -> None:
    reg.register(_manual("garbage"), probe=lambda: [{"device": "garbage:0"}])  # type: ignore[list-item]
    assert reg.probe("garbage") == []
    record = {r.name: r for r in reg.quarantined()}["garbage"]
    assert record.stage == "probe"
    # one line (the CLI prints an error on one; pydantic's text spans four), naming the field
    assert (
        record.error == "ValidationError: DeviceInfo: backend: Field required; name: Field required"
    )
    assert "validation errors for DeviceInfo" in record.traceback  # the whole text stays there
    status = {s.name: s for s in reg.statuses()}["garbage"]
    assert "\n" not in status.reason


def test_a_probe_reporting_another_backend_s_device_is_quarantined(reg: Registry) -> None:
    """Its devices were listed (and selected) as the other backend's, even with that backend
    disabled."""
    other = DeviceInfo(backend="cpu", device="cpu:0", name="borrowed")
    reg.register(_manual("borrower"), probe=lambda: [other])
    assert reg.probe("borrower") == []
    record = {r.name: r for r in reg.quarantined()}["borrower"]
    assert record.stage == "probe"
    assert "reported a device of backend 'cpu'" in record.error


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        (["wrongkind:0", "cpu:0"], "reported cpu:0, not of its device kinds (wrongkind)"),
        (["wrongkind:0", "wrongkind:0"], "reported wrongkind:0 twice"),
    ],
)
def test_a_probe_reporting_a_device_it_cannot_drive_is_quarantined(
    reg: Registry, devices: list[str], message: str
) -> None:
    """A device of another kind, or one listed twice, became a candidate of select() its
    backend could not open (calibrate failed on it, twice)."""
    infos = [DeviceInfo(backend="wrongkind", device=d, name="d") for d in devices]
    reg.register(_manual("wrongkind"), probe=lambda: infos)
    assert reg.probe("wrongkind") == []
    record = {r.name: r for r in reg.quarantined()}["wrongkind"]
    assert record.stage == "probe"
    assert message in record.error


def test_a_backend_class_that_fails_to_import_is_quarantined_at_stage_import(
    reg: Registry,
) -> None:
    reg.register(_manual("noimport", backend_class="akt_no_such_module:Backend"))
    with pytest.raises(PluginLoadError, match="'noimport' failed to import"):
        reg.backend_class("noimport")
    record = {r.name: r for r in reg.quarantined()}["noimport"]
    assert record.stage == "import"
    assert "ModuleNotFoundError" in record.error
    assert "akt_no_such_module" in record.traceback


def test_a_backend_class_that_is_no_compute_backend_is_quarantined(reg: Registry) -> None:
    reg.register(_manual("notabackend", backend_class="accelkit.device:Device"))
    with pytest.raises(PluginLoadError, match="not a ComputeBackend subclass"):
        reg.backend_class("notabackend")
    assert {r.name: r.stage for r in reg.quarantined()}["notabackend"] == "import"


def test_rescan_lifts_a_quarantine_so_a_fixed_plugin_is_tried_again(reg: Registry) -> None:
    reg.quarantine("fakegpu", "initialize", DeviceError("context creation failed"))
    with pytest.raises(BackendNotFoundError, match=r"quarantined \(initialize\)"):
        accelkit.select(backend="fakegpu", registry=reg)
    reg.rescan()
    assert accelkit.select(backend="fakegpu", registry=reg).device == "fakegpu:1"
    assert "broken" in [r.name for r in reg.quarantined()]  # still broken after the rescan


# -- rescan after an install ------------------------------------------------------------------------
def test_rescan_sees_a_plugin_installed_after_the_first_scan(reg: Registry, site: Path) -> None:
    before = reg.names()
    assert "latecomer" not in before
    info = _install(
        site,
        "accelkit-latecomer",
        {"latecomer": "akt_latecomer:DESCRIPTOR"},
        {"akt_latecomer": _descriptor_module("latecomer", "akt_latecomer")},
    )
    assert "latecomer" not in reg.names()  # discovery is cached ...
    reg.rescan()  # ... until a rescan
    assert "latecomer" in reg.names()
    assert reg.descriptor("latecomer").distribution == "accelkit-latecomer"
    assert [d.device for d in reg.probe("latecomer")] == ["latecomer:0"]
    assert accelkit.select("latecomer", registry=reg).backend == "latecomer"

    for file in info.iterdir():  # uninstall
        file.unlink()
    info.rmdir()
    reg.rescan()
    assert "latecomer" not in reg.names()
    with pytest.raises(BackendNotFoundError, match="no backend named 'latecomer'"):
        reg.descriptor("latecomer")


def test_an_entry_point_whose_descriptor_has_another_name_is_quarantined(
    reg: Registry, site: Path
) -> None:
    _install(
        site,
        "accelkit-misnamed",
        {"misnamed": "akt_misnamed:DESCRIPTOR"},
        {"akt_misnamed": _descriptor_module("misnamed", "akt_misnamed", declared_name="other")},
    )
    reg.rescan()
    assert "misnamed" not in [d.name for d in reg.descriptors()]
    record = {r.name: r for r in reg.quarantined()}["misnamed"]
    assert record.stage == "load"
    assert "'misnamed'" in record.error
    assert "'other'" in record.error


def test_an_entry_point_that_is_not_a_descriptor_is_quarantined(reg: Registry, site: Path) -> None:
    _install(
        site,
        "accelkit-notadescriptor",
        {"notadescriptor": "akt_notadescriptor:DESCRIPTOR"},
        {"akt_notadescriptor": "DESCRIPTOR = {'name': 'notadescriptor'}\n"},
    )
    reg.rescan()
    assert "notadescriptor" not in [d.name for d in reg.descriptors()]
    record = {r.name: r for r in reg.quarantined()}["notadescriptor"]
    assert (record.stage, record.error.split(":")[0]) == ("load", "ValidationError")


def test_two_plugins_with_one_name_the_first_is_used_and_the_other_reported(
    reg: Registry, site: Path
) -> None:
    # `site` comes first on sys.path, so its plugin is the first one found
    _install(
        site,
        "accelkit-impostor",
        {"fakegpu": "akt_impostor:DESCRIPTOR"},
        {"akt_impostor": _descriptor_module("fakegpu", "akt_impostor")},
    )
    reg.rescan()
    desc = reg.descriptor("fakegpu")
    assert desc.distribution == "accelkit-fakegpu"  # the first one found is used
    assert [d.device for d in reg.probe("fakegpu")] == ["fakegpu:0"]
    shadowed = [r for r in reg.quarantined() if "two plugins named 'fakegpu'" in r.error]
    assert len(shadowed) == 1
    assert shadowed[0].name == "fakegpu"
    assert shadowed[0].distribution.replace("_", "-") == "accelkit-testplug-good"
    assert "(from accelkit-impostor) and" in shadowed[0].error  # both distributions named
    assert {s.name: s.status for s in reg.statuses()}["fakegpu"] == "ok"


# -- allow and deny lists ---------------------------------------------------------------------------
def test_allow_list_loads_only_the_listed_plugins(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELKIT_PLUGINS", "cpu, FakeGPU")
    monkeypatch.delitem(sys.modules, "accelkit_testplug_subset.descriptor", raising=False)
    monkeypatch.delitem(sys.modules, "accelkit_testplug_future.descriptor", raising=False)
    assert [d.name for d in reg.descriptors()] == ["cpu", "fakegpu"]
    assert {d.device for d in reg.devices()} == {"cpu:0", "fakegpu:0", "fakegpu:1"}
    # what is not allowed is not even read: no descriptor imported, nothing quarantined
    assert "accelkit_testplug_subset.descriptor" not in sys.modules
    assert "accelkit_testplug_future.descriptor" not in sys.modules
    assert reg.quarantined() == []
    statuses = {s.name: s for s in reg.statuses()}
    assert statuses["subset"].status == "disabled"
    assert statuses["subset"].reason == "not listed in ACCELKIT_PLUGINS"
    assert statuses["broken"].status == "disabled"
    with pytest.raises(BackendNotFoundError, match="'subset' is not listed in ACCELKIT_PLUGINS"):
        accelkit.select(backend="subset", registry=reg)


def test_deny_list_disables_a_plugin_and_wins_over_the_allow_list(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELKIT_DISABLE_PLUGINS", "fakegpu,broken")
    names = [d.name for d in reg.descriptors()]
    assert "fakegpu" not in names
    assert "cpu" in names
    assert "broken" not in [r.name for r in reg.quarantined()]  # never imported
    assert not any(d.backend == "fakegpu" for d in reg.devices())
    with pytest.raises(BackendNotFoundError, match="disabled by ACCELKIT_DISABLE_PLUGINS"):
        reg.descriptor("fakegpu")
    with pytest.raises(BackendNotFoundError, match="disabled by ACCELKIT_DISABLE_PLUGINS"):
        accelkit.select("fakegpu:1", backend="fakegpu", registry=reg)
    # a device of a kind only a disabled plugin drives: no silent substitute
    with pytest.raises(BackendNotFoundError, match="fakegpu"):
        accelkit.select("fakegpu:1", registry=reg)
    status = {s.name: s for s in reg.statuses()}["fakegpu"]
    assert (status.status, status.reason) == ("disabled", "disabled by ACCELKIT_DISABLE_PLUGINS")

    monkeypatch.setenv("ACCELKIT_PLUGINS", "cpu,fakegpu")
    assert [d.name for d in reg.descriptors()] == ["cpu"]


def test_allow_and_deny_lists_are_read_on_each_call(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "fakegpu" in [d.name for d in reg.descriptors()]
    monkeypatch.setenv("ACCELKIT_DISABLE_PLUGINS", "fakegpu")
    assert "fakegpu" not in [d.name for d in reg.descriptors()]
    monkeypatch.setenv("ACCELKIT_DISABLE_PLUGINS", "0")  # "0" is not a name ...
    with pytest.raises(InvalidArgumentError):
        reg.descriptors()
    monkeypatch.delenv("ACCELKIT_DISABLE_PLUGINS")
    assert "fakegpu" in [d.name for d in reg.descriptors()]
    monkeypatch.setenv("ACCELKIT_PLUGINS", "cpu")
    assert [d.name for d in reg.descriptors()] == ["cpu"]


def test_allow_list_keeps_unlisted_descriptors_unimported_in_a_fresh_interpreter(
    tmp_path: Path,
) -> None:
    out = _run(
        """
        import json, sys
        import accelkit
        names = [d.name for d in accelkit.registry.descriptors()]
        accelkit.devices()
        print(json.dumps({"names": names,
                          "plugins": sorted(m for m in sys.modules if "testplug" in m)}))
        """,
        tmp_path,
        ACCELKIT_PLUGINS="cpu",
    )
    assert out == {"names": ["cpu"], "plugins": []}


@pytest.mark.parametrize("variable", ["ACCELKIT_PLUGINS", "ACCELKIT_DISABLE_PLUGINS"])
@pytest.mark.parametrize("value", ["cpu;fakegpu", "fake gpu", "cpu,-x", "9lives"])
def test_a_malformed_plugin_list_is_an_error_naming_it(
    reg: Registry, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(InvalidArgumentError) as info:
        reg.descriptors()
    message = str(info.value)
    assert variable in message
    assert repr(value) in message
    assert "comma-separated" in message
    with pytest.raises(InvalidArgumentError, match=variable):
        accelkit.select(registry=reg)


# -- programmatic registration ----------------------------------------------------------------------
def _manual(
    name: str,
    *,
    backend_class: str = "accelkit.backends.cpu.backend:CPUBackend",
    api_version: str = "3.0",
    priority: int = 0,
) -> PluginDescriptor:
    return PluginDescriptor(
        name=name,
        distribution=f"accelkit-{name}",
        version="1.2.3",
        api_version=api_version,
        device_kinds=frozenset({name}),
        priority=priority,
        backend_class=backend_class,
    )


def test_register_and_unregister(reg: Registry) -> None:
    class InMemory(ComputeBackend):  # never instantiated: only its identity matters here
        name = "inmemory"

    reg.register(
        _manual("inmemory"),
        backend_class=InMemory,
        probe=lambda: [DeviceInfo(device="inmemory:0", backend="inmemory", name="RAM")],
    )
    assert "inmemory" in reg.names()
    assert "inmemory" in [d.name for d in reg.descriptors()]
    assert reg.descriptor("inmemory").version == "1.2.3"
    assert [d.device for d in reg.probe("inmemory")] == ["inmemory:0"]
    assert reg.backend_class("inmemory") is InMemory
    assert accelkit.select(backend="inmemory", registry=reg).device == "inmemory:0"
    reg.unregister("inmemory")
    assert "inmemory" not in reg.names()
    with pytest.raises(BackendNotFoundError, match="'inmemory'"):
        reg.descriptor("inmemory")
    with pytest.raises(BackendNotFoundError, match="'inmemory' was registered"):
        reg.unregister("inmemory")


def test_a_registered_plugin_shadows_an_installed_one_until_unregistered(reg: Registry) -> None:
    reg.probe("fakegpu")
    reg.register(_manual("fakegpu"), probe=lambda: [])
    assert reg.descriptor("fakegpu").distribution == "accelkit-fakegpu"
    assert reg.probe("fakegpu") == []  # the installed plugin's cached probe was forgotten
    reg.unregister("fakegpu")
    assert reg.descriptor("fakegpu").distribution == "accelkit-testplug-good"
    assert len(reg.probe("fakegpu")) == 2


def test_register_refuses_another_api_major_and_non_descriptors(reg: Registry) -> None:
    with pytest.raises(IncompatiblePluginError, match=r"4\.0.*3\.0"):
        reg.register(_manual("later", api_version="4.0"))
    assert "later" not in reg.names()
    with pytest.raises(
        IncompatiblePluginError,
        match=r"1\.0.*what changed: API 2\.0.*TensorKernels.*API 3\.0.*Opened.*_open_stream",
    ):
        reg.register(_manual("older", api_version="1.0"))
    # a 2.x plugin is told exactly what 3.0 changed, and only that
    with pytest.raises(IncompatiblePluginError, match=r"2\.0.*what changed: API 3\.0") as info:
        reg.register(_manual("twoish", api_version="2.0"))
    assert "API 2.0 (" not in str(info.value)
    for change in ("Opened", "install_kernels", "check_ready", "PositionStream", "KernelBase"):
        assert change in str(info.value)
    reg.register(_manual("minor", api_version="3.7"))  # a newer minor of the same major is fine
    assert "minor" in [d.name for d in reg.descriptors()]
    with pytest.raises(InvalidArgumentError, match="PluginDescriptor; got dict"):
        reg.register({"name": "x"})  # type: ignore[arg-type]


def test_a_registered_plugin_obeys_the_deny_list(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    reg.register(_manual("mine"), probe=lambda: [])
    monkeypatch.setenv("ACCELKIT_DISABLE_PLUGINS", "mine")
    assert "mine" not in [d.name for d in reg.descriptors()]
    with pytest.raises(BackendNotFoundError, match="disabled"):
        reg.descriptor("mine")


def test_an_unknown_backend_names_the_installed_ones_and_how_to_install(reg: Registry) -> None:
    with pytest.raises(BackendNotFoundError) as info:
        reg.descriptor("nope")
    assert "'nope'" in str(info.value)
    assert "cpu" in str(info.value)
    assert "fakegpu" in str(info.value)
    # a known plugin that is not installed (every one is, in the test environment: hidden here)
    with (
        _without_entry_point("dask"),
        pytest.raises(BackendNotFoundError, match=r"pip install 'accelkit-dask'"),
    ):
        Registry().descriptor("dask")


# -- descriptors are validated ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "Fake-GPU"),
        ("api_version", "1"),
        ("api_version", "one.zero"),
        ("backend_class", "no_colon_here"),
        ("probe", "pkg.module:"),
        ("device_kinds", frozenset({"CUDA"})),
    ],
)
def test_a_malformed_descriptor_is_rejected(field: str, value: object) -> None:
    fields: dict[str, object] = {
        "name": "ok",
        "distribution": "accelkit-ok",
        "version": "1",
        "api_version": "3.0",
        "device_kinds": frozenset({"ok"}),
        "backend_class": "pkg.module:Backend",
        field: value,
    }
    with pytest.raises(ValidationError, match=field):
        PluginDescriptor.model_validate(fields)


def test_descriptors_are_frozen_and_refuse_unknown_fields() -> None:
    desc = _manual("frozen")
    with pytest.raises(ValidationError):
        desc.priority = 5  # type: ignore[misc]
    with pytest.raises(ValidationError, match="colour"):
        PluginDescriptor.model_validate({**desc.model_dump(), "colour": "red"})
