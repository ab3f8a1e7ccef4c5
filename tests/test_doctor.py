"""``accelkit doctor``'s self-test: each installed backend runs a few operations against NumPy in
a child process, so that a driver that aborts the process, hangs or computes wrong numbers is
reported as *broken* (exit status 1) while the user's process lives on; and the hardware line
agrees with the plugin table.

The failures come from ``accelkit-testplug-crash`` (tests/plugins), whose matmul aborts the
process, hangs, raises or returns wrong numbers as ``ACCELKIT_TESTPLUG_CRASH`` says.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from accelkit import registry
from accelkit.__main__ import main
from accelkit._core import hardware, selftest
from accelkit.cli import doctor
from accelkit.plugins import PLUGIN_API_VERSION, PluginDescriptor

detect_hardware = hardware.detect_hardware  # the real one; the fixture below stubs it out


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Only the CPU plugin unless a test says otherwise, no overrides, a fresh cache folder, and
    no hardware."""
    monkeypatch.setenv("ACCELKIT_PLUGINS", "cpu")
    for name in ("ACCELKIT_DISABLE_PLUGINS", "ACCELKIT_BACKEND", "ACCELKIT_DEVICE"):
        monkeypatch.delenv(name, raising=False)
    cache = tmp_path / "cache"
    monkeypatch.setenv("ACCELKIT_CACHE_DIR", str(cache))
    monkeypatch.setattr(hardware, "detect_hardware", lambda *a, **k: [])
    registry.rescan()
    yield cache
    registry.rescan()


@pytest.fixture
def crash_plugin(monkeypatch: pytest.MonkeyPatch) -> str:
    """The crash test plugin, allowed next to the CPU one; its mode is set by each test."""
    try:
        metadata.distribution("accelkit-testplug-crash")
    except metadata.PackageNotFoundError:
        pytest.skip("the test plugin accelkit-testplug-crash is not installed")
    monkeypatch.setenv("ACCELKIT_PLUGINS", "cpu,crash")
    registry.rescan()
    return "crash"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def section(out: str, title: str) -> str:
    return out.split(f"\n{title}", 1)[1].split("\n\n", 1)[0]


# -- the checks themselves, in this process ---------------------------------------------------------


@pytest.mark.anyio
async def test_every_check_passes_on_the_cpu_backend(anyio_backend: str) -> None:
    events: list[dict[str, Any]] = []
    results = await selftest.run_checks("cpu", "cpu:0", events.append)
    assert [r.status for r in results] == ["ok"] * len(results), results
    names = [r.name for r in results]
    assert names[0] == selftest.INITIALIZE
    assert names[-1] == selftest.SHUTDOWN
    for wanted in (
        "add f32 [4096]",
        "exp f32 [4096]",
        "sum f32 [256x512] axis -1",
        "max f32 [256x512]",
        "matmul 128x128 f32",
        "matmul 256x256 f32",
        "softmax f32 [64x256]",
        "layer_norm f32 [64x256]",
        "conv2d f32 [2x3x16x16] * [8x3x3x3]",
        "kernel_ops rms_norm f32 [64x256]",
        "kernel_ops silu_mul f32 [64x256]",
    ):
        assert wanted in names
    assert names[1] == selftest.PREPARE  # the JIT compiled and checked before the op checks
    assert all(r.max_error is not None and r.max_error < 1e-5 for r in results[2:-1])
    assert events[0] == {"event": "plan", "checks": names}
    starts = [e["check"] for e in events if e["event"] == "start"]
    assert starts == names


@pytest.mark.anyio
async def test_a_backend_that_cannot_be_opened_is_one_failed_check(anyio_backend: str) -> None:
    results = await selftest.run_checks("nosuchbackend", "cpu:0")
    (only,) = results
    assert (only.name, only.status) == (selftest.INITIALIZE, "error")
    assert only.detail.startswith("BackendNotFoundError: no backend named 'nosuchbackend'")


# -- in a child process -----------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_the_child_self_test_of_the_cpu_backend_is_ok(loop: str) -> None:
    seen: list[dict[str, Any]] = []
    report = selftest.run_selftest("cpu", "cpu:0", loop=loop, on_event=seen.append)
    assert report.verdict == "ok", report.reason + report.stderr_tail
    assert report.returncode == 0
    assert "matmul 256x256 f32" in report.passed
    assert report.summary().startswith(f"ok ({len(report.passed)} checks, ")
    assert seen[0]["event"] == "plan"
    assert seen[-1] == {"event": "done"}
    # progress, one line per check, on the child's stderr
    assert "accelkit selftest: cpu:0: [8/16] matmul 128x128 f32 ..." in report.stderr_tail
    assert "-X faulthandler -m accelkit._core.selftest --backend cpu" in report.command


def _prepare_step(report: selftest.SelfTestReport) -> selftest.CheckResult:
    return next(c for c in report.checks if c.name == selftest.PREPARE)


def test_the_cpu_self_test_compiles_and_checks_the_jit_kernels_first() -> None:
    """In the child, before the checks (which then run on them), whatever the mode: a kernel
    that crashed the process would do it there. The step is the backend's prepare, whose
    progress lines come as events and on the child's stderr."""
    pytest.importorskip("numba")
    from accelkit._core.host_jit import jit

    seen: list[dict[str, Any]] = []
    report = selftest.run_selftest("cpu", "cpu:0", on_event=seen.append)
    assert report.verdict == "ok", report.reason
    n = len(jit.KERNELS)
    step = _prepare_step(report)
    assert (step.status, step.detail) == ("ok", f"CPU JIT kernels: {n} of {n} ready")
    assert [c.name for c in report.checks][:2] == [selftest.INITIALIZE, selftest.PREPARE]
    assert selftest.PREPARE not in report.passed  # a preparation, not one of the op checks
    lines = [e["line"] for e in seen if e["event"] == "progress"]
    assert lines[-1] == step.detail
    assert f"[2/16] prepare: CPU JIT kernels: {n} of {n} ready" in report.stderr_tail


@pytest.mark.anyio
async def test_the_prepare_step_asks_any_backend_and_knows_none(anyio_backend: str) -> None:
    """The step awaits the backend's prepare, whatever the backend: None is ``ok`` (with the
    last progress line), a note is ``limited`` (no fault: the backend still works), and an
    exception is an error."""
    from accelkit.backends.cpu.backend import CPUBackend

    class Prepared(CPUBackend):
        outcome: str | Exception | None = None

        async def prepare(self, progress: Callable[[str], None] | None = None) -> str | None:
            assert progress is not None
            progress("warming up")
            progress("all warm")
            if isinstance(self.outcome, Exception):
                raise self.outcome
            return self.outcome

    events: list[dict[str, Any]] = []
    results: list[selftest.CheckResult] = []
    backend = Prepared()
    await backend.initialize()
    try:
        for outcome, want in (
            (None, ("ok", "all warm")),
            ("2 of 3 kernels: one left out", ("limited", "2 of 3 kernels: one left out")),
            (RuntimeError("no warmth\nat all"), ("error", "RuntimeError: no warmth")),
        ):
            backend.outcome = outcome
            await selftest._prepare(backend, events.append, results.append)
            assert (results[-1].name, results[-1].status, results[-1].detail) == (
                selftest.PREPARE,
                *want,
            )
    finally:
        await backend.shutdown()
    assert [e["line"] for e in events if e["event"] == "progress"] == ["warming up", "all warm"] * 3


def test_the_jit_step_says_why_kernels_are_not_used(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ACCELKIT_CPU_JIT", "0")
    report = selftest.run_selftest("cpu", "cpu:0")
    assert (_prepare_step(report).status, _prepare_step(report).detail) == (
        "ok",
        "CPU JIT kernels: off (ACCELKIT_CPU_JIT=0)",
    )
    status, out, _ = run(capsys, "doctor")
    assert "CPU JIT kernels" not in out  # off on purpose: nothing to say

    # Numba that cannot be imported, in the child: the backend is healthy, and a note says why
    # the kernels are not used and how to get them.
    (tmp_path / "numba").mkdir()
    (tmp_path / "numba" / "__init__.py").write_text('raise ImportError("no Numba here")\n')
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    monkeypatch.setenv("ACCELKIT_CPU_JIT", "eager")
    status, out, _ = run(capsys, "doctor")
    assert status == 0
    assert out.startswith("accelkit doctor: healthy")
    notes = out.split("\nnotes\n", 1)[1]
    assert (
        "[selftest] cpu: CPU JIT kernels: none used: Numba is not installed (no Numba here):"
        " pip install 'accelkit[jit]'" in notes
    )


def test_a_jit_kernel_left_out_is_a_note_not_a_problem(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    detail = "7 of 8 ready; exp: not used: AssertionError: exp differs from NumPy's kernel"

    def fake(backend: str, device: str, **_: Any) -> selftest.SelfTestReport:
        checks = [
            selftest.CheckResult(
                selftest.PREPARE, "limited", f"CPU JIT kernels: {detail}", None, 1.0
            )
        ]
        return selftest.SelfTestReport(backend, device, "ok", "", checks)

    monkeypatch.setattr(selftest, "run_selftest", fake)
    status, out, _ = run(capsys, "doctor")
    assert status == 0
    assert f"[selftest] cpu: CPU JIT kernels: {detail}" in out.split("\nnotes\n", 1)[1]


def test_doctor_self_tests_the_cpu_backend(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "doctor")
    assert status == 0
    assert out.startswith("accelkit doctor: healthy")
    rows = section(out, "self-test").splitlines()
    cpu = next(r for r in rows if r.split()[:1] == ["cpu"])
    assert cpu.split()[:3] == ["cpu", "cpu:0", "ok"]
    status, out, _ = run(capsys, "doctor", "--json")
    data = json.loads(out)
    (report,) = data["selftest"]
    assert (report["backend"], report["device"], report["verdict"]) == ("cpu", "cpu:0", "ok")
    assert report["summary"].startswith("ok (")
    assert {c["name"] for c in report["checks"]} >= {"matmul 128x128 f32", "softmax f32 [64x256]"}
    assert "stderr_tail" not in report


def test_no_selftest_skips_it(capsys: pytest.CaptureFixture[str], crash_plugin: str) -> None:
    status, out, _ = run(capsys, "doctor", "--no-selftest")
    assert status == 0
    assert "self-test: skipped (--no-selftest)" in out
    status, out, _ = run(capsys, "doctor", "--no-selftest", "--json")
    assert json.loads(out)["selftest"] == []


def test_a_backend_whose_matmul_aborts_the_process_is_broken(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, crash_plugin: str
) -> None:
    monkeypatch.setenv("ACCELKIT_TESTPLUG_CRASH", "abort")
    status, out, _ = run(capsys, "doctor")
    # still here: the abort killed the child, not this process
    assert status == 1
    assert out.startswith("accelkit doctor: 1 problem(s)")
    rows = {r.split()[0]: r for r in section(out, "self-test").splitlines()[3:]}
    assert rows["cpu"].split()[2] == "ok"
    expected = (
        "broken: process killed by SIGABRT during matmul 128x128 f32 (LLVM ERROR: Cannot select:"
        " fma (accelkit-testplug-crash aborts in matmul on purpose))"
    )
    assert rows["crash"].split(None, 2)[2] == expected
    problems = out.split("\nproblems\n", 1)[1]
    assert "1. [selftest] crash: self-test on crash:0 broken: process killed by SIGABRT" in problems
    assert "ACCELKIT_DISABLE_PLUGINS=crash" in problems
    assert "-m accelkit._core.selftest --backend crash --device crash:0" in problems
    assert "run 'accelkit doctor --verbose' for its stderr" in problems

    status, out, _ = run(capsys, "doctor", "--verbose")
    assert status == 1
    assert "self-test stderr (last" in out
    assert "accelkit selftest: crash:0: [8/16] matmul 128x128 f32 ..." in out

    status, out, _ = run(capsys, "doctor", "--json")
    data = json.loads(out)
    assert data["healthy"] is False
    (problem,) = data["problems"]
    assert (problem["check"], problem["subject"]) == ("selftest", "crash")
    broken = next(r for r in data["selftest"] if r["backend"] == "crash")
    assert broken["verdict"] == "broken"
    assert broken["returncode"] == -signal.SIGABRT
    assert [c["name"] for c in broken["checks"] if c["status"] == "ok"][-1] == "max f32 [256x512]"


def test_through_the_command_the_exit_status_is_1(crash_plugin: str, isolated: Path) -> None:
    env = {
        **os.environ,
        "ACCELKIT_PLUGINS": "cpu,crash",
        "ACCELKIT_TESTPLUG_CRASH": "abort",
        "ACCELKIT_CACHE_DIR": str(isolated),
    }
    done = subprocess.run(
        [sys.executable, "-m", "accelkit", "doctor"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "broken: process killed by SIGABRT during matmul 128x128 f32" in done.stdout


@pytest.mark.parametrize(
    ("mode", "fragment"),
    [
        ("hang", "broken: timed out after 5 s during matmul 128x128 f32"),
        ("wrong", "broken: wrong result in matmul 128x128 f32: max error"),
        (
            "raise",
            "broken: matmul 128x128 f32: DeviceError: the crash device lost its context (on"
            " purpose)",
        ),
        (
            "exit",
            "broken: process killed by SIGABRT at exit, after every check had run"
            " (accelkit-testplug-crash: fatal error: still holding a context at exit)",
        ),
    ],
)
def test_every_way_a_backend_breaks_is_reported(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    crash_plugin: str,
    mode: str,
    fragment: str,
) -> None:
    monkeypatch.setenv("ACCELKIT_TESTPLUG_CRASH", mode)
    # Each step before the broken one must finish within the 5 s; with the CPU JIT on, the child
    # would also load (or, where another process rewrote Numba's cache, compile) its kernels,
    # which is not under test here and took more than 5 s on a loaded 2-core machine.
    monkeypatch.setenv("ACCELKIT_CPU_JIT", "0")
    status, out, _ = run(capsys, "doctor", "--selftest-timeout", "5")
    assert status == 1
    row = next(r for r in section(out, "self-test").splitlines() if r.split()[:1] == ["crash"])
    assert fragment in row
    if mode == "hang":
        assert "try --selftest-timeout 10" in out


def test_the_timeout_is_per_step_so_a_slow_run_is_no_hang(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, crash_plugin: str
) -> None:
    """Each of the two matmul checks sleeps 2.5 s (a slow first compile, say): the whole
    self-test runs longer than the 4 s timeout, yet no step does, so it is no hang (it once
    timed out in CI because a Numba compile made the whole run longer than its timeout). (With
    sleeps of 1.5 s and 3 s, the child's exit once took over 3 s on a loaded 2-core machine.)"""
    monkeypatch.setenv("ACCELKIT_TESTPLUG_CRASH", "slow")
    monkeypatch.setenv("ACCELKIT_CPU_JIT", "0")  # steps of milliseconds, but for the sleeps
    events: list[dict[str, Any]] = []
    report = selftest.run_selftest("crash", "crash:0", timeout=4.0, on_event=events.append)
    assert report.verdict == "ok", report.reason
    assert report.seconds > 4.0
    matmuls = [c for c in report.checks if c.name.startswith("matmul")]
    assert len(matmuls) == 2
    assert all(c.seconds >= 2.5 for c in matmuls)
    assert events[-1] == {"event": "done"}


def test_the_stderr_excerpt_folds_the_stacks_of_other_threads() -> None:
    """faulthandler dumps every thread; an idle helper's stack (the CPU JIT's warm-up thread,
    say) must not push the crash's own lines out of the 40 shown."""
    helper = [f'  File "/lib/threading.py", line {n} in run' for n in range(60)]
    stderr = [
        "accelkit selftest: crash:0: [8/16] matmul 128x128 f32 ...",
        "LLVM ERROR: Cannot select: fma",
        "Fatal Python error: Aborted",
        "",
        "Thread 0x00007f01 (most recent call first):",
        *helper,
        "",
        "Current thread 0x00007f02 (most recent call first):",
        '  File "/x/backend.py", line 43 in matmul',
        "",
        "Extension modules: numpy (total: 1)",
    ]
    report = selftest.SelfTestReport(
        "crash", "crash:0", "broken", "x", stderr_tail="\n".join(stderr)
    )
    excerpt = doctor._stderr_excerpt(report).splitlines()
    assert excerpt[0] == "self-test stderr (last 10 lines):"
    assert excerpt[1:] == [
        *stderr[:4],
        "Thread 0x00007f01: another thread (60 frame(s) not shown)",
        *stderr[-5:],
    ]


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("abort", "crashed the process (SIGABRT): fatal: the crash driver's probe aborts on"
         " purpose"),
        ("exit", "ended the process (status 3)"),
        ("exit0", "ended the process (status 0)"),
        ("hang", "did not return within 5 s (a hang)"),
    ],
)  # fmt: skip
def test_a_probe_that_crashes_or_hangs_is_quarantined_not_the_end_of_doctor(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    crash_plugin: str,
    mode: str,
    reason: str,
) -> None:
    """The probes run in a child first: a probe that aborted or hung took doctor down with no
    output at all (only the self-test ran in a child)."""
    monkeypatch.setenv("ACCELKIT_TESTPLUG_CRASH_PROBE", mode)
    # a probe gets a self-test step's time: 5 s for the hang (and then no self-test, whose
    # first step, compiling the CPU backend's kernels, may take longer)
    argv = ["--no-selftest", "--selftest-timeout", "5"] if mode == "hang" else []
    status, out, _ = run(capsys, "doctor", "--json", *argv)
    assert status == 1
    data = json.loads(out)
    (problem,) = data["problems"]
    assert (problem["check"], problem["subject"]) == ("plugin", "crash")
    assert problem["message"] == f"quarantined at probe: PluginLoadError: its probe {reason}"
    plugins = {p["name"]: p["status"] for p in data["plugins"] if p["status"] != "disabled"}
    assert plugins == {"cpu": "ok", "crash": "quarantined"}
    if mode != "hang":  # the other backend's self-test still runs
        assert [(r["backend"], r["verdict"]) for r in data["selftest"]] == [("cpu", "ok")]
    if mode == "abort":  # the child's stderr ends the record's traceback (--verbose)
        assert "the child process's stderr ended with:" in problem["traceback"]
        assert "Fatal Python error: Aborted" in problem["traceback"]


def test_a_well_behaved_crash_plugin_is_healthy(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, crash_plugin: str
) -> None:
    monkeypatch.setenv("ACCELKIT_TESTPLUG_CRASH", "none")
    status, out, _ = run(capsys, "doctor")
    assert status == 0, out
    assert out.startswith("accelkit doctor: healthy")


def test_selftest_timeout_must_be_a_positive_number(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("0", "-1", "soon", "inf"):
        status, out, err = run(capsys, "doctor", "--selftest-timeout", bad)
        assert status == 2
        assert out == ""
        assert "expected a positive number of seconds" in err


# -- reading a crashed child's stderr --------------------------------------------------------------


def test_crash_line_picks_the_fatal_error_not_the_noise() -> None:
    stderr = (
        "accelkit selftest: opencl:0: [8/16] matmul 128x128 f32 ...\n"
        "warning: /tmp/x.cl:34:15: AVX vector return of type 'float16' changes the ABI\n"
        "104 warnings generated.\n"
        "/venv/pyopencl/__init__.py:570: CompilerWarning: Non-empty compiler output encountered.\n"
        "  lambda: self._prg.build(options_bytes, devices),\n"
        "LLVM ERROR: Cannot select: 0x55c3b6de03e8: i64 = fma 0x55c3b6e10320, 0x55c3b6de1220,"
        " 0x55c3b6e0f828\n"
        "  0x55c3b6e10320: i64,ch = CopyFromReg 0x55c3b6554b48, Register:i64 %0\n"
        "In function: _Z7_cl_fmaDv16_fS_S_\n"
    )
    assert selftest.crash_line(stderr) == (
        "LLVM ERROR: Cannot select: i64 = fma (In function: _Z7_cl_fmaDv16_fS_S_)"
    )
    faulthandler = (
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call"
        ' first):\n  File "x.py", line 3 in f\n'
    )
    assert selftest.crash_line(faulthandler) == "Fatal Python error: Segmentation fault"
    assert (
        selftest.crash_line("terminate called after throwing an instance of 'std::bad_alloc'\n")
        == "terminate called after throwing an instance of 'std::bad_alloc'"
    )
    assert selftest.crash_line("") == ""
    assert len(selftest.crash_line("error: " + "x" * 1000)) == 200


def test_signal_names() -> None:
    assert selftest.signal_name(-signal.SIGABRT) == "SIGABRT"
    assert selftest.signal_name(-signal.SIGSEGV) == "SIGSEGV"


# -- the hardware line agrees with the plugin table ------------------------------------------------


def test_hardware_line_names_the_devices_plugins_found_where_no_driver_is_on_disk(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelkit.device import DeviceInfo

    def probe() -> list[DeviceInfo]:
        return [DeviceInfo(device="inproc:0", backend="inproc", name="In-process device")]

    desc = PluginDescriptor(
        name="inproc",
        distribution="accelkit-inproc",
        version="0.0.1",
        api_version=PLUGIN_API_VERSION,
        device_kinds=frozenset({"inproc"}),
        backend_class="accelkit.backends.cpu.backend:CPUBackend",
    )
    registry.register(desc, probe=probe)
    monkeypatch.setenv("ACCELKIT_PLUGINS", "cpu,inproc")
    try:
        status, out, _ = run(capsys, "doctor")
    finally:
        registry.unregister("inproc")
    assert status == 0, out
    hw = section(out, "hardware")
    assert "(no GPU, OpenCL or Vulkan driver found)" not in hw
    assert "inproc (1 device(s))" in hw
    # a plugin registered only in this process cannot be opened by a child: said, not tested
    notes = out.split("\nnotes\n", 1)[1]
    assert "[selftest] inproc: not self-tested" in notes


def test_a_python_package_icd_is_driven_by_the_opencl_plugin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """pyopencl[pocl] keeps its ICD in site-packages/pyopencl/.libs, not /etc/OpenCL/vendors:
    the hardware table shows it, driven by the opencl plugin where that reports a device."""
    from accelkit.device import DeviceInfo

    site = tmp_path / "site"
    libs = site / "akt_fake_pyopencl" / ".libs"
    libs.mkdir(parents=True)
    (libs.parent / "__init__.py").write_text("raise RuntimeError('never imported')\n")
    (libs / "pocl.icd").write_text("libpocl-1234.so\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(hardware, "ICD_PACKAGES", ("akt_fake_pyopencl",))
    empty = tmp_path / "root"
    empty.mkdir()
    items = detect_hardware(empty, run_tools=False, python_packages=True)
    (icd,) = items
    assert (icd.kind, icd.name, icd.plugin) == ("opencl-icd", "OpenCL driver pocl", "opencl")
    assert icd.source == str(libs / "pocl.icd")
    assert icd.detail == "libpocl-1234.so; shipped inside the Python package akt_fake_pyopencl"
    assert "akt_fake_pyopencl" not in sys.modules  # located, never imported

    monkeypatch.setattr(hardware, "detect_hardware", lambda *a, **k: items)

    def probe() -> list[DeviceInfo]:
        return [DeviceInfo(device="opencl:0", backend="opencl", name="pthread-CPU")]

    desc = PluginDescriptor(
        name="opencl",
        distribution="accelkit-opencl",
        version="0.0.1",
        api_version=PLUGIN_API_VERSION,
        device_kinds=frozenset({"opencl"}),
        backend_class="accelkit.backends.cpu.backend:CPUBackend",
    )
    registry.register(desc, probe=probe)
    monkeypatch.setenv("ACCELKIT_PLUGINS", "cpu,opencl")
    try:
        status, out, _ = run(capsys, "doctor", "--no-selftest")
    finally:
        registry.unregister("opencl")
    assert status == 0, out
    row = section(out, "hardware").splitlines()[-1]
    assert row.split(None, 4)[:4] == ["opencl-icd", "OpenCL", "driver", "pocl"]
    assert row.endswith("opencl  driven by opencl (1 device(s))")
