"""The ``accelkit`` command: every subcommand in-process through ``main([...])``, a few through
``python -m accelkit``; tables, ``--json`` structures, exit statuses and one-line errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from accelkit import registry
from accelkit.__main__ import main
from accelkit._core import hardware
from accelkit.plugins import PLUGIN_API_VERSION, PluginDescriptor

detect_hardware = hardware.detect_hardware  # the real one; the fixture below stubs it out


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Only the CPU plugin (other test plugins may be installed alongside), no overrides, a
    fresh cache folder, and no hardware: what the commands see does not depend on the machine."""
    monkeypatch.setenv("ACCELKIT_PLUGINS", "cpu")
    for name in ("ACCELKIT_DISABLE_PLUGINS", "ACCELKIT_BACKEND", "ACCELKIT_DEVICE"):
        monkeypatch.delenv(name, raising=False)
    cache = tmp_path / "cache"
    monkeypatch.setenv("ACCELKIT_CACHE_DIR", str(cache))
    monkeypatch.setattr(hardware, "detect_hardware", lambda *a, **k: [])
    registry.rescan()
    yield cache
    registry.rescan()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    status, out, _err = run(capsys, *argv, "--json")
    return status, json.loads(out)


def assert_one_line_error(err: str, command: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"accelkit {command}: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], err


# -- the entry point ------------------------------------------------------------------------------


def test_import_of_main_is_cheap() -> None:
    code = (
        "import sys, accelkit.__main__; "
        "print(','.join(m for m in ('numpy', 'anyio', 'pydantic', 'accelkit.registry',"
        " 'accelkit.cli.doctor') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == ""


def test_python_dash_m_runs_the_command(isolated: Path) -> None:
    env = {**os.environ, "ACCELKIT_PLUGINS": "cpu", "ACCELKIT_CACHE_DIR": str(isolated)}
    ok = subprocess.run(
        [sys.executable, "-m", "accelkit", "devices", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert [d["device"] for d in json.loads(ok.stdout)["devices"]] == ["cpu:0"]

    bad = subprocess.run(
        [sys.executable, "-m", "accelkit", "select", "--device", "cuda:"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert_one_line_error(bad.stderr, "select", "malformed device 'cuda:'", "'kind:index'")


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "--help")
    assert status == 0
    for command in ("info", "devices", "select", "doctor", "calibrate", "bench", "demo"):
        assert command in out
    status, _, err = run(capsys)
    assert status == 2
    assert "usage: accelkit" in err
    status, _, err = run(capsys, "devices", "--no-such-option")
    assert status == 2
    assert "unrecognized arguments" in err


# -- info and devices -----------------------------------------------------------------------------


def test_a_cell_of_several_lines_keeps_its_row_on_one_line() -> None:
    """A quarantined plugin's error with its traceback's text broke the info table's rows."""
    from accelkit.cli.render import table

    out = table(("name", "note"), [["bad", "\nImportError: no module\n  File x.py\n"], ["ok", ""]])
    lines = out.splitlines()
    assert len(lines) == 4, out
    assert table(("a", "b"), [["x\ry", "z"]]).splitlines()[2].split() == ["x", "...", "z"]
    assert lines[2].split() == ["bad", "ImportError:", "no", "module", "..."]
    assert lines[3].strip() == "ok"


def test_info_table(capsys: pytest.CaptureFixture[str]) -> None:
    from accelkit import __version__

    status, out, err = run(capsys, "info")
    assert status == 0, err
    first = out.splitlines()[0]
    assert f"accelkit {__version__}" in first
    assert f"plugin API {PLUGIN_API_VERSION}" in first
    plugins = out.split("plugins\n", 1)[1].split("\n\n", 1)[0]
    assert plugins.splitlines()[0].split() == [
        "name",
        "status",
        "version",
        "distribution",
        "devices",
        "note",
    ]
    cpu_row = next(line.split() for line in plugins.splitlines() if line.split()[0] == "cpu")
    assert cpu_row[:5] == ["cpu", "ok", __version__, "accelkit", "1"]
    assert "cpu:0" in out.split("devices\n", 1)[1]
    assert "CPU JIT kernels: Numba " in out


def test_info_json(capsys: pytest.CaptureFixture[str]) -> None:
    from accelkit import __version__

    status, data = run_json(capsys, "info")
    assert status == 0
    assert {
        "accelkit",
        "plugin_api",
        "python",
        "platform",
        "cache_dir",
        "calibration_file",
        "calibrated_devices",
        "plugins",
        "devices",
        "cpu_jit",
    } <= set(data)
    assert data["accelkit"] == __version__
    from importlib.metadata import version

    assert data["cpu_jit"]["numba"] == version("numba")  # the tests session installs [jit]
    assert data["plugin_api"] == PLUGIN_API_VERSION
    cpu = next(p for p in data["plugins"] if p["name"] == "cpu")
    assert cpu["status"] == "ok"
    assert cpu["devices"] == 1
    # every other installed plugin is reported as disabled, with the reason
    for p in data["plugins"]:
        if p["name"] != "cpu":
            assert p["status"] == "disabled"
            assert "ACCELKIT_PLUGINS" in p["reason"]
    assert [d["device"] for d in data["devices"]] == ["cpu:0"]


def test_devices_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "devices")
    assert status == 0
    header, rule, row = out.splitlines()[:3]
    assert header.split()[:5] == ["device", "backend", "name", "memory", "units"]
    assert set(rule.replace(" ", "")) == {"-"}
    assert row.split()[:2] == ["cpu:0", "cpu"]
    assert row.rstrip().endswith("declared")

    status, data = run_json(capsys, "devices", "--backend", "cpu")
    assert status == 0
    assert set(data) == {"devices", "unavailable"}
    (cpu,) = data["devices"]
    assert cpu["device"] == "cpu:0"
    assert cpu["backend"] == "cpu"
    assert "f32" in cpu["capabilities"]["dtypes"]
    assert cpu["capabilities"]["ops"] == sorted(cpu["capabilities"]["ops"])  # stable order


# -- select ---------------------------------------------------------------------------------------


def test_select_table_and_explain(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "select")
    assert status == 0
    assert out.startswith("selected: cpu on cpu:0")
    assert "candidates" not in out

    status, out, _ = run(
        capsys,
        "select",
        "--explain",
        "--require",
        "attention,matmul",
        "--dtype",
        "f16",
        "--feature",
        "fp16",
        "--min-memory",
        "1MiB",
        "--policy",
        "memory",
    )
    assert status == 0
    assert "policy: memory" in out
    candidates = out.split("candidates (best first)\n", 1)[1]
    header, _, first = candidates.splitlines()[:3]
    assert header.split() == ["#", "backend", "device", "name", "score", "basis", "detail"]
    assert first.split()[:3] == ["1", "cpu", "cpu:0"]
    assert "declared" in first


def test_select_json_structure(capsys: pytest.CaptureFixture[str]) -> None:
    status, data = run_json(capsys, "select", "--device", "cpu", "--policy", "prefer:cpu")
    assert status == 0
    assert set(data) == {"backend", "device", "report"}
    assert (data["backend"], data["device"]) == ("cpu", "cpu:0")
    report = data["report"]
    assert set(report) == {
        "policy",
        "requested_backend",
        "requested_device",
        "candidates",
        "rejected",
    }
    assert report["policy"] == "prefer:cpu"
    (best,) = report["candidates"]
    assert {"backend", "device", "name", "score", "basis", "priority", "detail"} <= set(best)


def test_select_requirement_no_backend_meets(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "select", "--require", "no_such_op")
    assert status == 2
    assert out == ""
    assert_one_line_error(err, "select", "no backend can serve", "no_such_op")

    status, _, err = run(capsys, "select", "--min-memory", "1000000TiB")
    assert status == 2
    assert_one_line_error(err, "select", "memory")


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["select", "--device", "cuda:"], ["malformed device 'cuda:'", "'kind:index'", "cuda:0"]),
        (["select", "--device", "gpu:x"], ["malformed device 'gpu:x'", "'kind:index'"]),
        (["select", "--device", "cuda:-1"], ["malformed device 'cuda:-1'", "non-negative"]),
        (["select", "--device", "cuda:0"], ["cuda", "pip install 'accelkit-cuda"]),
        (["select", "--backend", "nope"], ["no backend named 'nope'", "installed: "]),
        (["select", "--policy", "fastest"], ["unknown policy 'fastest'", "prefer:<kind>"]),
        (["select", "--dtype", "f99"], ["unknown dtype 'f99'", "f32"]),
        (["select", "--feature", "warp"], ["unknown feature 'warp'", "fp16"]),
        (["select", "--min-memory", "lots"], ["--min-memory 'lots'", "8GiB"]),
        (["devices", "--backend", "nope"], ["no backend named 'nope'"]),
        (["calibrate", "--backend", "nope"], ["no backend named 'nope'"]),
        (["bench", "--backend", "nope"], ["no backend named 'nope'"]),
        (["select", "--backend", "cpuu"], ["no backend named 'cpuu'", "did you mean 'cpu'?"]),
        (["select", "--device", "cpuu"], ["no backend can serve", "did you mean 'cpu'?"]),
        (["bench", "--backend", "cpuu"], ["did you mean 'cpu'?"]),
        (["calibrate", "--backend", "cpuu"], ["did you mean 'cpu'?"]),
        (["demo", "--backend", "nope"], ["no backend named 'nope'"]),
        (["demo", "--repeats", "0"], ["--repeats must be at least 1"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], fragments: list[str]
) -> None:
    status, out, err = run(capsys, *argv)
    assert status == 2
    assert out == ""
    assert_one_line_error(err, argv[0], *fragments)


@pytest.mark.parametrize(
    ("variable", "value", "command", "fragments"),
    [
        ("ACCELKIT_PLUGINS", "cpu,Bad-1", "info", ["ACCELKIT_PLUGINS='cpu,Bad-1'", "'bad-1'"]),
        ("ACCELKIT_PLUGINS", "cpu,Bad-1", "devices", ["ACCELKIT_PLUGINS", "comma-separated"]),
        ("ACCELKIT_DISABLE_PLUGINS", "a b", "select", ["ACCELKIT_DISABLE_PLUGINS", "'a b'"]),
        ("ACCELKIT_DEVICE", "cuda:", "select", ["ACCELKIT_DEVICE", "malformed device 'cuda:'"]),
        ("ACCELKIT_BACKEND", "nope", "demo", ["no backend named 'nope'"]),
    ],
)
def test_malformed_environment_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    value: str,
    command: str,
    fragments: list[str],
) -> None:
    monkeypatch.setenv(variable, value)
    status, out, err = run(capsys, command)
    assert status == 2
    assert out == ""
    assert_one_line_error(err, command, *fragments)


def test_verbose_error_adds_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "select", "--device", "gpu:x", "--verbose")
    assert status == 2
    assert err.startswith("accelkit select: malformed device")
    assert "Traceback" in err
    assert "InvalidArgumentError" in err


def test_errors_from_a_task_group_are_one_line_and_bugs_keep_their_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import accelkit.cli.devices
    from accelkit.errors import DeviceError

    def grouped(args: Any) -> int:
        raise ExceptionGroup("unhandled errors in a TaskGroup", [DeviceError("device lost")])

    monkeypatch.setattr(accelkit.cli.devices, "run", grouped)
    status, _, err = run(capsys, "devices")
    assert status == 2
    assert_one_line_error(err, "devices", "device lost")

    def bug(args: Any) -> int:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(accelkit.cli.devices, "run", bug)
    with pytest.raises(ZeroDivisionError):
        main(["devices"])


# -- doctor ---------------------------------------------------------------------------------------


def test_doctor_healthy(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "doctor")
    assert status == 0
    assert out.startswith("accelkit doctor: healthy")
    assert "(no GPU, OpenCL or Vulkan driver found)" in out
    status, data = run_json(capsys, "doctor")
    assert status == 0
    assert set(data) == {"healthy", "problems", "notes", "plugins", "selftest", "hardware"}
    assert data["healthy"] is True
    assert data["problems"] == []


def _fake_nvidia_machine(root: Path) -> None:
    gpu = root / "proc/driver/nvidia/gpus/0000:01:00.0"
    gpu.mkdir(parents=True)
    (gpu / "information").write_text(
        "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\nBus Location: \t 0000:01:00.0\n"
    )
    (root / "proc/driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
    )


def test_doctor_reports_a_gpu_no_plugin_drives(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    _fake_nvidia_machine(root)
    monkeypatch.setattr(hardware, "detect_hardware", lambda: detect_hardware(root, run_tools=False))
    # Where accelkit-cuda is installed, this is the machine without it: hide its entry point.
    entry_points: Callable[..., Any] = metadata.entry_points

    def without_cuda(**kw: Any) -> Any:
        # Only accelkit's group: the patch is process-wide, and another thread (the CPU JIT's
        # warm-up, whose Numba scans every group on its first compile) may call it meanwhile;
        # handing it a filtered list once disabled a JIT kernel for the rest of the process.
        if kw.get("group") != "accelkit.backends":
            return entry_points(**kw)
        return [ep for ep in entry_points(**kw) if ep.name != "cuda"]

    monkeypatch.setattr(metadata, "entry_points", without_cuda)
    registry.rescan()
    status, out, _ = run(capsys, "doctor")
    assert status == 1
    assert out.startswith("accelkit doctor: 1 problem(s)")
    hw = out.split("hardware\n", 1)[1].split("\n\n", 1)[0]
    assert "NVIDIA H100 80GB HBM3" in hw
    assert "no plugin installed" in hw
    problems = out.split("problems\n", 1)[1]
    assert "[hardware] NVIDIA H100 80GB HBM3" in problems
    assert "the cuda plugin would" in problems
    assert "fix: pip install 'accelkit-cuda[cuda12]'" in problems

    status, data = run_json(capsys, "doctor")
    assert status == 1
    assert data["healthy"] is False
    (problem,) = data["problems"]
    assert problem["check"] == "hardware"
    assert problem["fix"] == "pip install 'accelkit-cuda[cuda12]'"
    (gpu,) = data["hardware"]
    assert gpu["kind"] == "gpu"
    assert gpu["plugin"] == "cuda"
    assert gpu["status"] == "no plugin installed"
    assert gpu["detail"] == "driver 550.54"


def test_doctor_shows_a_quarantined_plugin_with_its_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def probe() -> list[Any]:
        raise RuntimeError("the flaky driver fell over")

    desc = PluginDescriptor(
        name="flaky",
        distribution="accelkit-flaky",
        version="0.0.1",
        api_version=PLUGIN_API_VERSION,
        device_kinds=frozenset({"flaky"}),
        backend_class="accelkit.backends.cpu.backend:CPUBackend",
    )
    registry.register(desc, probe=probe)
    monkeypatch.setenv("ACCELKIT_PLUGINS", "cpu,flaky")
    try:
        status, out, _ = run(capsys, "doctor")
        assert status == 1
        assert (
            "[plugin] flaky: quarantined at probe: RuntimeError: the flaky driver fell over" in out
        )
        assert "pip install --force-reinstall 'accelkit-flaky'" in out
        assert "run 'accelkit doctor --verbose' for the traceback" in out
        assert "Traceback" not in out

        status, out, _ = run(capsys, "doctor", "--verbose")
        assert status == 1
        assert "Traceback (most recent call last)" in out
        assert "in probe" in out

        status, data = run_json(capsys, "doctor")
        (problem,) = data["problems"]
        assert problem["subject"] == "flaky"
        assert "Traceback" in problem["traceback"]
        assert next(p for p in data["plugins"] if p["name"] == "flaky")["status"] == "quarantined"
    finally:
        registry.unregister("flaky")


def test_doctor_reports_quarantine_records_no_plugin_status_covers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # e.g. a plugin shadowed by another of the same name, or one whose initialize failed and
    # that was unregistered since
    registry.quarantine("ghost", "initialize", RuntimeError("no context"), distribution="gh")
    status, data = run_json(capsys, "doctor")
    assert status == 1
    (problem,) = data["problems"]
    assert problem["subject"] == "ghost"
    assert problem["message"] == "quarantined at initialize: RuntimeError: no context"
    assert "RuntimeError: no context" in problem["traceback"]


@pytest.mark.parametrize(
    ("used", "shadowed", "advice"),
    [
        ("accelkit-fakegpu", "accelkit-impostor", "pip uninstall 'accelkit-fakegpu' (used now)"),
        ("accelkit_fakegpu", "accelkit-fakegpu", "'accelkit_fakegpu' is installed twice"),
        ("accelkit.fakegpu", "Accelkit-FakeGPU", "'accelkit.fakegpu' is installed twice"),
        ("accelkit", "accelkit-impostor", "have its authors rename its entry point"),
    ],
)
def test_doctor_s_advice_for_two_plugins_of_one_name_names_both(
    used: str, shadowed: str, advice: str
) -> None:
    """It told the user to uninstall the shadowed one, as if it were the one to remove; and
    for one distribution installed twice, to uninstall it (which removed the first copy)."""
    from accelkit.cli.doctor import _report_quarantine
    from accelkit.registry import QuarantineRecord

    error = (
        f"two plugins named 'fakegpu': a:DESCRIPTOR (from {used}) and b:DESCRIPTOR (from"
        f" {shadowed}); the first one is used"
    )
    record = QuarantineRecord(name="fakegpu", stage="load", error=error, distribution=shadowed)
    findings: list[Any] = []
    _report_quarantine(findings, "fakegpu", shadowed, record, "")
    (finding,) = findings
    assert advice in finding.fix
    pep503 = re.compile(r"[-_.]+")
    assert pep503.sub("-", shadowed).lower() in pep503.sub("-", finding.fix).lower()


def test_doctor_keeps_its_verdict_when_the_reader_leaves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`accelkit doctor | true` (under pipefail) exited 0 on a machine with problems: the closed
    pipe's BrokenPipeError returned 0 before the verdict."""
    from accelkit.cli import main

    class ClosedPipe:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

        def isatty(self) -> bool:
            return False

        def fileno(self) -> int:
            raise OSError("not a file")

    registry.quarantine("ghost", "initialize", RuntimeError("no context"), distribution="gh")
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["doctor", "--no-selftest"]) == 1


def test_doctor_reports_plugin_api_version_mismatch(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        metadata.distribution("accelkit-testplug-future")
    except metadata.PackageNotFoundError:
        pytest.skip("the test plugin accelkit-testplug-future is not installed")
    monkeypatch.setenv("ACCELKIT_PLUGINS", "cpu,future")
    status, data = run_json(capsys, "doctor")
    assert status == 1
    (problem,) = data["problems"]
    assert problem["check"] == "version"
    assert problem["subject"] == "future"
    assert "plugin API" in problem["message"]
    assert problem["fix"] == "pip install --upgrade 'accelkit-testplug-future'"


@pytest.mark.parametrize(
    ("variable", "value", "fragment"),
    [
        ("ACCELKIT_DISABLE_PLUGINS", "x-y", "ACCELKIT_DISABLE_PLUGINS"),
        ("ACCELKIT_BACKEND", "cuda", "every selection will fail"),
        ("ACCELKIT_DEVICE", "gpu:x", "malformed device 'gpu:x'"),
        ("ACCELKIT_LOOP_SLICE_US", "100us", "every backend's initialize will fail"),
        ("ACCELKIT_ISOLATE_DEADLINE_S", "5s", "every isolated backend's initialize"),
        ("ACCELKIT_CPU_JIT", "maybe", "the CPU kernels run as with auto"),
    ],
)
def test_doctor_reports_bad_settings(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    value: str,
    fragment: str,
) -> None:
    monkeypatch.setenv(variable, value)
    status, out, err = run(capsys, "doctor")
    assert status == 1, err
    problems = out.split("problems\n", 1)[1]
    assert "[settings]" in problems
    assert fragment in problems
    assert f"fix: correct or unset {variable}" in problems


def test_doctor_notes_disabled_plugins(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELKIT_PLUGINS", "cpu,example,nosuchplugin")
    monkeypatch.setenv("ACCELKIT_DISABLE_PLUGINS", "cpu")
    status, data = run_json(capsys, "doctor")
    assert status == 0  # disabling is a choice, not a problem
    notes = {(n["check"], n["subject"]): n["message"] for n in data["notes"]}
    assert notes[("plugin", "cpu")] == "disabled by ACCELKIT_DISABLE_PLUGINS"
    assert "'nosuchplugin', which is not installed" in notes[("settings", "ACCELKIT_PLUGINS")]


@pytest.mark.parametrize(("allow", "deny"), [("cpuu", ""), ("cpu", "CPU")])
def test_disabling_every_plugin_is_a_problem_said_as_such(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, allow: str, deny: str
) -> None:
    """A typo in the allow-list or the deny-list (compared without case) leaving no plugin
    (separators alone are a malformed setting: the next test): doctor said "healthy" and exited 0, select said "no plugin is
    installed"."""
    monkeypatch.setenv("ACCELKIT_PLUGINS", allow)
    monkeypatch.setenv("ACCELKIT_DISABLE_PLUGINS", deny)
    status, data = run_json(capsys, "doctor")
    assert status == 1
    problems = {(p["check"], p["subject"]): p["message"] for p in data["problems"]}
    assert "no backend can be opened" in problems[("plugin", "every plugin")]
    status, _out, err = run(capsys, "select")
    assert status != 0
    assert "installed plugins disabled by ACCELKIT_PLUGINS or ACCELKIT_DISABLE_PLUGINS" in err
    assert "no plugin is installed" not in err


def test_an_allow_list_naming_nothing_is_a_malformed_setting(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ACCELKIT_PLUGINS=',' disabled every plugin without a word about the value."""
    monkeypatch.setenv("ACCELKIT_PLUGINS", " , ")
    status, data = run_json(capsys, "doctor")
    assert status == 1
    problems = {(p["check"], p["subject"]): p["message"] for p in data["problems"]}
    assert "names no plugin" in problems[("settings", "ACCELKIT_PLUGINS")]
    status, _out, err = run(capsys, "select")
    assert status == 2
    assert "ACCELKIT_PLUGINS=',' names no plugin" in err  # the value, stripped


def test_a_malformed_setting_is_the_user_s_error_not_the_plugin_s(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A malformed core setting: calibrate exits 2 with one line (it reported every backend as
    failed and exited 1), and the plugin is not quarantined (it stayed unusable after the
    setting was fixed)."""
    import anyio

    import accelkit

    monkeypatch.setenv("ACCELKIT_LOOP_SLICE_US", "100us")
    status, _out, err = run(capsys, "calibrate", "--quick")
    assert status == 2
    assert_one_line_error(err, "calibrate", "ACCELKIT_LOOP_SLICE_US='100us'")

    async def open_cpu() -> None:
        async with accelkit.open_backend("cpu"):
            pass

    with pytest.raises(accelkit.InvalidArgumentError, match="ACCELKIT_LOOP_SLICE_US"):
        anyio.run(open_cpu)
    assert not registry.quarantined()
    monkeypatch.delenv("ACCELKIT_LOOP_SLICE_US")
    anyio.run(open_cpu)


def test_json_output_is_strict_json_with_nan_and_infinities_as_null(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A broken backend's self-test error is infinite; ``--json`` printed ``Infinity``, which
    strict parsers (JSON.parse, ``json.loads(parse_constant=...)``) refuse."""
    from accelkit.cli.render import print_json

    print_json({"max_error": float("inf"), "low": float("-inf"), "nan": float("nan"), "ok": 1.5})

    def refuse(name: str) -> None:
        raise ValueError(name)

    data = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert data == {"max_error": None, "low": None, "nan": None, "ok": 1.5}


# -- calibrate, bench, demo -----------------------------------------------------------------------


def test_calibrate_stores_figures_that_select_then_uses(
    capsys: pytest.CaptureFixture[str], isolated: Path
) -> None:
    status, out, err = run(capsys, "calibrate", "--quick")
    assert status == 0, err
    assert err == ""  # no progress bar: stderr is not a terminal and --progress was not given
    header, _, row = out.splitlines()[:3]
    assert header.split()[:3] == ["backend", "device", "name"]
    assert "f32 GFLOP/s" in header
    assert "copy GB/s" in header
    assert row.split()[:2] == ["cpu", "cpu:0"]
    path = isolated / "calibration.json"
    assert f"stored in {path}" in out
    stored = json.loads(path.read_text())
    assert stored["format"] == "accelkit-calibration"
    assert stored["entries"]["cpu/cpu:0"]["gflops"]["f32"] > 0

    status, out, _ = run(capsys, "select", "--explain")
    assert status == 0
    first = out.split("candidates (best first)\n", 1)[1].splitlines()[2]
    assert first.split()[:3] == ["1", "cpu", "cpu:0"]
    assert "calibrated" in first
    status, out, _ = run(capsys, "devices")
    assert out.splitlines()[2].rstrip().endswith("calibrated")


def test_calibrate_json_and_progress(capsys: pytest.CaptureFixture[str], isolated: Path) -> None:
    status, out, err = run(
        capsys, "calibrate", "--backend", "cpu", "--quick", "--progress", "--json"
    )
    assert status == 0
    data = json.loads(out)
    assert set(data) == {"path", "entries", "failed"}
    assert data["path"] == str(isolated / "calibration.json")
    (entry,) = data["entries"]
    assert entry["backend"] == "cpu"
    assert entry["device"] == "cpu:0"
    assert {"gflops", "bandwidth_gbs", "launch_latency_us", "measured_at"} <= set(entry)
    assert data["failed"] == []
    # the bar: one line redrawn with \r, counting to the end, then cleared
    assert "\r" in err
    assert "\n" not in err
    assert "cpu on cpu:0 [" in err
    assert "launch latency" in err
    assert "] 5/5 " in err


def test_calibrate_reports_a_device_that_fails_and_quarantines_its_plugin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, isolated: Path
) -> None:
    from accelkit.backends.cpu.backend import CPUBackend
    from accelkit.device import DeviceInfo

    desc = PluginDescriptor(
        name="flaky",
        distribution="accelkit-flaky",
        version="0.0.1",
        api_version=PLUGIN_API_VERSION,
        device_kinds=frozenset({"flaky"}),
        backend_class="accelkit.backends.cpu.backend:CPUBackend",
    )

    class Flaky(CPUBackend):
        name = "flaky"

    # the CPU backend's class cannot initialize device flaky:0: a driver failing at initialize
    registry.register(
        desc,
        backend_class=Flaky,
        probe=lambda: [DeviceInfo(device="flaky:0", backend="flaky", name="Flaky")],
    )
    monkeypatch.setenv("ACCELKIT_PLUGINS", "cpu,flaky")
    try:
        status, out, err = run(capsys, "calibrate", "--quick")
        assert status == 1
        assert out.splitlines()[2].split()[:2] == ["cpu", "cpu:0"]  # the others are measured
        assert err == (
            "accelkit calibrate: flaky on flaky:0 failed: backend 'flaky' cannot drive device"
            " flaky:0; it drives cpu\n"
        )
        assert "cpu/cpu:0" in json.loads((isolated / "calibration.json").read_text())["entries"]
        status, data = run_json(capsys, "doctor")
        assert status == 1
        (problem,) = data["problems"]
        assert problem["subject"] == "flaky"
        assert problem["message"].startswith("quarantined at initialize")
    finally:
        registry.unregister("flaky")


def test_corrupt_calibration_file_is_a_warning_not_an_error(
    capsys: pytest.CaptureFixture[str], isolated: Path
) -> None:
    isolated.mkdir()
    (isolated / "calibration.json").write_text("{ not json")
    status, out, err = run(capsys, "select", "--explain")
    assert status == 0
    assert err.startswith("accelkit select: warning: ignoring the calibration file")
    assert "Traceback" not in err
    assert "declared" in out
    assert (isolated / "calibration.json.corrupt").exists()


def test_bench_quick(capsys: pytest.CaptureFixture[str]) -> None:
    status, data = run_json(capsys, "bench", "--quick")
    assert status == 0
    assert (data["backend"], data["device"], data["quick"]) == ("cpu", "cpu:0", True)
    assert data["full"] is False
    names = [r["name"] for r in data["results"]]
    assert len(names) == 4
    assert names[0].startswith("64x64 f32 add")
    assert "matmul" in names[1]
    assert "softmax" in names[2]
    assert "transformer block" in names[3]
    for r in data["results"]:
        assert r["error"] == ""
        assert r["accelkit_s"] > 0
        assert r["numpy_s"] > 0
        assert r["ratio"] == pytest.approx(r["numpy_s"] / r["accelkit_s"])
        assert r["max_rel_err"] < 1e-4


def test_bench_quick_and_full_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "bench", "--quick", "--full")
    assert status == 2
    assert out == ""
    assert "not allowed with argument" in err


def test_bench_default_is_bounded_by_its_time_budget() -> None:
    """The default run stops adding rounds once a benchmark has spent its budget (at least
    MIN_ROUNDS run), so that a slow or busy machine still finishes in seconds; --full does not."""
    import anyio

    from accelkit.cli.bench import MIN_ROUNDS, PLANS, interleaved

    assert PLANS["default"].budget_s is not None
    assert PLANS["full"].budget_s is None
    calls = {"subject": 0, "peer": 0}

    async def subject() -> None:
        calls["subject"] += 1
        await anyio.sleep(0.001)

    def peer() -> None:
        calls["peer"] += 1

    anyio.run(lambda: interleaved(subject, peer, 50, budget_s=0.0))
    assert calls == {"subject": MIN_ROUNDS, "peer": MIN_ROUNDS}
    anyio.run(lambda: interleaved(subject, peer, 5))
    assert calls == {"subject": MIN_ROUNDS + 5, "peer": MIN_ROUNDS + 5}


def test_bench_table_with_progress(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "bench", "--quick", "--progress")
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == "accelkit bench: cpu on cpu:0, each against NumPy in this process"
    assert lines[1].split() == ["benchmark", "accelkit", "NumPy", "vs", "NumPy", "check"]
    rows = lines[3:7]
    assert all("x  max rel err" in row for row in rows)
    assert "] 4/4 done" in err


def test_demo(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "demo", "--repeats", "1")
    assert status == 0, err
    assert out.startswith("selected: cpu on cpu:0")
    assert "candidates (best first)" in out
    assert "transformer block, run 1/1" in out
    from accelkit._core.host_jit import jit

    n = len(jit.KERNELS)
    assert f"CPU JIT kernels: {n} of {n} ready" in out  # the tests session installs [jit]
    assert "image pipeline" in out
    assert "result: OK, matches NumPy" in out


def test_demo_json_on_trio(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("trio")
    status, data = run_json(capsys, "demo", "--repeats", "1", "--loop", "trio")
    assert status == 0
    assert data["loop"] == "trio"
    assert data["selection"]["backend"] == "cpu"
    assert data["ok"] is True
    assert {"transformer_block", "transformer_block_numpy", "image_pipeline"} <= set(
        data["timings_ms"]
    )
    assert data["errors"]["transformer_block"] < 1e-3
