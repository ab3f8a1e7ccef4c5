"""``accelkit doctor``: what is wrong with this installation, and how to fix it.

It checks, in order: the environment settings; every installed plugin (quarantined ones with
their errors and tracebacks, plugins built for another plugin API or another accelkit, disabled
ones and why); a short self-test of every installed backend that reports a device, each in a
child process with a timeout (:mod:`accelkit._core.selftest`: a driver that aborts the process,
hangs or computes wrong numbers makes that backend *broken*); the calibration file; and the
hardware present that no installed plugin drives (an NVIDIA GPU without accelkit-cuda), with the
pip command that fixes it.

Findings are *problems* (exit status 1) or *notes* (informational: a plugin an administrator
disabled on purpose, a driver registry a plugin could use). A healthy machine exits 0.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from accelkit._core import probe_check, selftest
from accelkit.cli.render import Progress, print_json, table
from accelkit.errors import AccelError, PluginLoadError

__all__ = ["Finding", "diagnose", "run"]

_PLUGIN_SETTINGS = ("ACCELKIT_PLUGINS", "ACCELKIT_DISABLE_PLUGINS")


@dataclass(frozen=True)
class Finding:
    level: Literal["problem", "note"]
    check: Literal[
        "settings", "plugin", "version", "selftest", "calibration", "isolation", "hardware"
    ]
    subject: str
    message: str
    fix: str = ""
    traceback: str = ""


@dataclass
class Diagnosis:
    findings: list[Finding]
    plugins: list[Any]  # PluginStatus
    hardware: list[dict[str, Any]]
    selftests: list[selftest.SelfTestReport] = field(default_factory=list)

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "problem"]

    @property
    def notes(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "note"]


def diagnose(
    *,
    selftests: bool = False,
    selftest_timeout: float = selftest.DEFAULT_TIMEOUT_S,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
) -> Diagnosis:
    """Every check; with ``selftests``, also the self-test of each installed backend that
    reports a device (``on_event(backend, event)`` sees their progress)."""
    from accelkit._core.hardware import detect_hardware

    findings: list[Finding] = []
    settings_ok = _check_plugin_settings(findings)
    core_ok = _check_core_settings(findings)
    statuses = []
    reports: list[selftest.SelfTestReport] = []
    if settings_ok:
        from accelkit import registry

        # before any probe runs in this process; a probe gets a self-test step's time
        for failure in probe_check.check_probes(selftest_timeout):
            _quarantine_probe(failure)
        statuses = registry.statuses()
        _check_plugins(findings, statuses)
        if statuses and not any(st.status == "ok" for st in statuses):
            findings.append(
                Finding(
                    "problem", "plugin", "every plugin",
                    f"no backend can be opened: {registry.default_registry.why_none()}",
                    fix="correct ACCELKIT_PLUGINS or ACCELKIT_DISABLE_PLUGINS, or fix the"
                    " quarantined plugins",
                )
            )  # fmt: skip
        _check_overrides(findings)
        if selftests and core_ok:  # else every self-test fails on the setting, said above
            reports = _run_selftests(findings, statuses, selftest_timeout, on_event)
    _check_calibration(findings)
    _check_isolation(findings)
    hardware = [
        _check_hardware(findings, item, statuses, settings_ok, reports)
        for item in detect_hardware()
    ]
    return Diagnosis(findings=findings, plugins=statuses, hardware=hardware, selftests=reports)


def selftest_targets(statuses: list[Any]) -> list[tuple[str, str]]:
    """(backend, device) for each plugin to self-test: loaded, reporting a device, and installed
    (a plugin registered only in this process cannot be opened by a child process); its first
    device."""
    from accelkit import registry
    from accelkit.plugins import ENTRY_POINT_GROUP

    installed = {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    targets = []
    for status in statuses:
        if status.status != "ok" or status.devices == 0 or status.name not in installed:
            continue
        devices = registry.probe(status.name)
        if devices:
            targets.append((status.name, str(devices[0].device)))  # a child process's argument
    return targets


def _run_selftests(
    findings: list[Finding],
    statuses: list[Any],
    timeout: float,
    on_event: Callable[[str, dict[str, Any]], None] | None,
) -> list[selftest.SelfTestReport]:
    by_name = {s.name: s for s in statuses}
    reports = []
    targets = selftest_targets(statuses)
    tested = {name for name, _ in targets}
    for status in statuses:
        if status.status == "ok" and status.devices and status.name not in tested:
            findings.append(
                Finding(
                    "note",
                    "selftest",
                    status.name,
                    "not self-tested: it is registered in this process only, and the self-test"
                    " runs in a child process, which cannot open it",
                )
            )
    for name, device in targets:

        def relay(event: dict[str, Any], name: str = name) -> None:
            if on_event is not None:
                on_event(name, event)

        report = selftest.run_selftest(name, device, timeout=timeout, on_event=relay)
        reports.append(report)
        # What the backend could not prepare (a CPU JIT kernel left out): a note, not a problem.
        prep = next((c for c in report.checks if c.name == selftest.PREPARE), None)
        if prep is not None and prep.status == "limited":
            findings.append(Finding("note", "selftest", name, prep.detail))
        if report.verdict == "ok":
            continue
        dist = by_name[name].distribution
        disable = f"ACCELKIT_DISABLE_PLUGINS={name}"
        if report.reason.startswith("timed out"):
            fix = (
                f"a first run may spend long compiling: try --selftest-timeout {2 * timeout:g};"
                f" if it still hangs, set {disable} and report it to the authors of {dist}"
            )
        else:
            fix = (
                f"see it fail with: {report.command}; until it is fixed, set {disable}"
                f" (or update its driver) and report it to the authors of {dist}"
            )
        findings.append(
            Finding(
                "problem",
                "selftest",
                name,
                f"self-test on {device} broken: {report.reason}",
                fix=fix,
                traceback=_stderr_excerpt(report),
            )
        )
    return reports


def _stderr_excerpt(report: selftest.SelfTestReport, lines: int = 40) -> str:
    """The end of the child's stderr (what ``--verbose`` shows under a broken self-test), with
    the stacks faulthandler dumps for threads other than the crashing one folded into a line
    each: idle helper threads would otherwise push the crash's own lines out of the excerpt."""
    tail = _fold_other_threads(report.stderr_tail.rstrip().splitlines())[-lines:]
    if not tail:
        return ""
    return f"self-test stderr (last {len(tail)} lines):\n" + "\n".join(tail)


def _fold_other_threads(lines: list[str]) -> list[str]:
    folded: list[str] = []
    frames = 0
    header = ""
    for line in lines:
        if frames and line.startswith(("  File ", "  <no Python frame>", "  ...")):
            frames += 1
            folded[-1] = f"{header} ({frames - 1} frame(s) not shown)"
            continue
        frames = 0
        if line.startswith("Thread 0x") and line.endswith("(most recent call first):"):
            header = line.removesuffix(" (most recent call first):") + ": another thread"
            frames = 1
            line = header
        folded.append(line)
    return folded


def _quarantine_probe(failure: probe_check.ProbeFailure) -> None:
    """Quarantine a plugin whose probe crashed or hung the child, so that this process does not
    run it (the record's traceback ends with the child's stderr)."""
    from accelkit.registry import default_registry

    exc = PluginLoadError(f"its probe {failure.reason}")
    tail = failure.stderr.splitlines()[-40:]
    if tail:
        exc.add_note("the child process's stderr ended with:\n" + "\n".join(tail))
    try:
        distribution = default_registry.descriptor(failure.plugin).distribution
    except AccelError:
        distribution = ""
    default_registry.quarantine(failure.plugin, "probe", exc, distribution=distribution)


def _check_plugin_settings(findings: list[Finding]) -> bool:
    from accelkit import registry
    from accelkit._core.env import env_names

    ok = True
    installed: set[str] = set()
    for name in _PLUGIN_SETTINGS:
        try:
            names = env_names(name)
        except AccelError as exc:
            findings.append(
                Finding(
                    "problem",
                    "settings",
                    name,
                    f"{exc}; plugin checks are skipped until it is fixed",
                    fix=f"correct or unset {name}",
                )
            )
            ok = False
            continue
        if not names:
            continue
        installed = installed or set(registry.default_registry.names())
        for unknown in sorted(names - installed):
            findings.append(
                Finding(
                    "note",
                    "settings",
                    name,
                    f"names {unknown!r}, which is not installed (installed:"
                    f" {', '.join(sorted(installed)) or 'none'})",
                )
            )
    return ok


def _check_plugins(findings: list[Finding], statuses: list[Any]) -> None:
    from accelkit import registry

    records = registry.quarantined()
    shown: set[int] = set()
    for status in statuses:
        if status.status == "disabled":
            findings.append(Finding("note", "plugin", status.name, status.reason))
        elif status.status == "quarantined":
            record = next(
                (
                    r
                    for r in records
                    if r.name == status.name and f"{r.stage}: {r.error}" == status.reason
                ),
                None,
            )
            if record is not None:
                shown.add(id(record))
            _report_quarantine(findings, status.name, status.distribution, record, status.reason)
        elif status.devices == 0:
            findings.append(
                Finding("note", "plugin", status.name, f"no device: {status.reason or 'none'}")
            )
        if status.status != "disabled" and status.distribution:
            _check_accelkit_requirement(findings, status.name, status.distribution)
    # Records no status stands for: a plugin shadowed by another of the same name, or one
    # quarantined in this process under a name no longer registered.
    disabled = {s.name for s in statuses if s.status == "disabled"}
    for record in records:
        if id(record) not in shown:
            level: Literal["problem", "note"] = "note" if record.name in disabled else "problem"
            _report_quarantine(findings, record.name, record.distribution, record, "", level)


def _report_quarantine(
    findings: list[Finding],
    name: str,
    distribution: str,
    record: Any,
    reason: str,
    level: Literal["problem", "note"] = "problem",
) -> None:
    dist = (record.distribution if record else "") or distribution
    if record is not None and record.stage == "version":
        fix = f"pip install --upgrade '{dist}'" if dist else ""
        findings.append(Finding(level, "version", name, record.error, fix=fix))
        return
    message = f"quarantined at {record.stage}: {record.error}" if record else reason
    fix = f"pip install --force-reinstall '{dist}', or report it to its authors" if dist else ""
    if record is not None and record.error.startswith("two plugins named"):
        fix = _duplicate_fix(record.error, dist)
    findings.append(
        Finding(
            level,
            "plugin",
            name,
            message,
            fix=fix,
            traceback=record.traceback if record else "",
        )
    )


def _normalized(distribution: str) -> str:
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _duplicate_fix(error: str, shadowed: str) -> str:
    """The advice for two plugins of one name: which distributions to choose between (the
    advice named only the shadowed one, as if it were the one to remove)."""
    match = re.search(r"\(from (.+?)\) and .* \(from (.+?)\); the first one is used", error)
    used = match.group(1) if match else ""
    if not used or used == "?":
        return f"uninstall the one you do not want (this one: pip uninstall '{shadowed}')"
    if _normalized(used) == "accelkit":  # a built-in backend's name, taken by a plugin
        return f"pip uninstall '{shadowed}', or have its authors rename its entry point"
    if _normalized(used) == _normalized(shadowed):
        return (
            f"'{used}' is installed twice (in two folders on sys.path): pip uninstall '{used}'"
            " until pip finds none, then install it once"
        )
    return (
        f"uninstall the one you do not want: pip uninstall '{shadowed}' (shadowed now) or"
        f" pip uninstall '{used}' (used now)"
    )


def _check_accelkit_requirement(findings: list[Finding], plugin: str, dist: str) -> None:
    """A plugin whose distribution declares it needs another accelkit than this one."""
    from accelkit import __version__

    if dist == "accelkit":
        return
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion

    try:
        requires = importlib.metadata.distribution(dist).requires or []
    except importlib.metadata.PackageNotFoundError:
        return  # without the metadata this check cannot be made
    for text in requires:
        try:
            req = Requirement(text)
            if req.name.lower() != "accelkit" or (req.marker and not req.marker.evaluate()):
                continue
            if not req.specifier.contains(__version__, prereleases=True):
                findings.append(
                    Finding(
                        "problem",
                        "version",
                        plugin,
                        f"{dist} requires {text}; this is accelkit {__version__}",
                        fix=f"pip install --upgrade '{dist}' (or install the accelkit it needs)",
                    )
                )
        except (InvalidRequirement, InvalidVersion):
            continue


def _check_overrides(findings: list[Finding]) -> None:
    """ACCELKIT_BACKEND / ACCELKIT_DEVICE must name something that can serve."""
    from accelkit._core.env import env_str
    from accelkit.selector import select

    names = [n for n in ("ACCELKIT_BACKEND", "ACCELKIT_DEVICE") if env_str(n)]
    if not names:
        return
    try:
        select()
    except AccelError as exc:
        findings.append(
            Finding(
                "problem",
                "settings",
                " and ".join(names),
                f"every selection will fail: {exc}",
                fix=f"correct or unset {' and '.join(names)}",
            )
        )


def _core_settings() -> list[tuple[str, Callable[[], object], str]]:
    """The core's settings read when a backend opens: each with its strict parser and the
    backends whose initialize fails on a malformed value ("every": all of them)."""
    from accelkit._core import sched
    from accelkit._core.isolation.backend import deadline_s

    return [
        ("ACCELKIT_LOOP_SLICE_US", sched.loop_slice_us, "every"),
        ("ACCELKIT_SWITCH_INTERVAL_US", sched.switch_interval_us, "every"),
        ("ACCELKIT_ISOLATE_DEADLINE_S", deadline_s, "every isolated"),
    ]


def _check_core_settings(findings: list[Finding]) -> bool:
    """A malformed core setting makes every backend's initialize fail: said once, here, with
    the variable to fix (not as every plugin being broken); False then."""
    ok = True
    for name, parse, which in _core_settings():
        try:
            parse()
        except AccelError as exc:
            ok = ok and which != "every"
            findings.append(
                Finding(
                    "problem", "settings", name,
                    f"{exc}; {which} backend's initialize will fail",
                    fix=f"correct or unset {name}",
                )
            )  # fmt: skip
    from accelkit._core.host_jit import jit

    if (problem := jit.bad_setting()) is not None:
        findings.append(
            Finding(
                "problem", "settings", jit.ENV, f"{problem}; the CPU kernels run as with auto",
                fix=f"correct or unset {jit.ENV}",
            )
        )  # fmt: skip
    return ok


def _check_calibration(findings: list[Finding]) -> None:
    from accelkit import calibration

    try:
        path = calibration.calibration_path()
    except AccelError as exc:  # pragma: no cover - cache_dir() raises only on odd platforms
        findings.append(Finding("problem", "calibration", "cache", str(exc)))
        return
    if path.parent.exists() and not path.parent.is_dir():
        findings.append(
            Finding(
                "problem",
                "calibration",
                str(path.parent),
                "the cache directory is a file; calibration cannot be stored",
                fix="remove it, or point ACCELKIT_CACHE_DIR elsewhere",
            )
        )
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", calibration.CalibrationWarning)
        calibration.load()
    for w in caught:
        if issubclass(w.category, calibration.CalibrationWarning):
            findings.append(
                Finding(
                    "note",
                    "calibration",
                    str(path),
                    str(w.message),
                    fix="accelkit calibrate",
                )
            )


#: How far back ``accelkit doctor`` shows isolated workers' faults, and how many at most.
ISOLATION_WINDOW_S = 7 * 24 * 3600.0
ISOLATION_SHOWN = 5


def _check_isolation(findings: list[Finding]) -> None:
    """The faults isolated workers survived lately (``open_backend(..., isolate=True)``), from
    their log in the cache folder: notes, since the user's process recovered or can."""
    import datetime

    from accelkit._core.isolation import faults

    recent = faults.read(since=faults.now() - ISOLATION_WINDOW_S)
    for entry in recent[-ISOLATION_SHOWN:]:
        when = datetime.datetime.fromtimestamp(entry.time).isoformat(sep=" ", timespec="seconds")
        findings.append(
            Finding(
                "note",
                "isolation",
                f"{entry.backend} (isolated, {entry.device})",
                f"{when}: the worker of process {entry.pid} was lost ({entry.cause}) at"
                f" generation {entry.generation}: {entry.message}",
                fix=f"{len(recent)} fault(s) in the last 7 days, logged in {faults.log_path()}",
            )
        )


def _check_hardware(
    findings: list[Finding],
    item: Any,
    statuses: list[Any],
    settings_ok: bool,
    reports: list[selftest.SelfTestReport],
) -> dict[str, Any]:
    """Match one piece of hardware to the plugin that would drive it; returns its table row."""
    by_name = {s.name: s for s in statuses}
    broken = {r.backend for r in reports if r.verdict == "broken"}
    status = by_name.get(item.plugin)
    physical = item.kind == "gpu"
    level: Literal["problem", "note"] = "problem" if physical else "note"
    if not settings_ok:
        state = "unknown (settings)"
    elif status is None:
        state = "no plugin installed"
        findings.append(
            Finding(
                level,
                "hardware",
                item.name,
                f"{'present' if physical else 'found'} ({item.source}), but no installed plugin"
                f" drives it; the {item.plugin} plugin would",
                fix=item.install_command,
            )
        )
    elif status.status == "disabled":
        state = f"{item.plugin} plugin disabled"
        findings.append(
            Finding(
                "note",
                "hardware",
                item.name,
                f"the {item.plugin} plugin would drive it, but it is {status.reason}",
            )
        )
    elif status.status == "quarantined":
        state = f"{item.plugin} plugin quarantined"
    elif status.devices == 0:
        state = f"{item.plugin} plugin finds no device"
        findings.append(
            Finding(
                level,
                "hardware",
                item.name,
                f"present, but the {item.plugin} plugin finds no device: {status.reason}",
                fix="check the driver (e.g. nvidia-smi for NVIDIA GPUs)"
                if item.vendor == "NVIDIA"
                else "",
            )
        )
    else:
        state = f"driven by {item.plugin} ({status.devices} device(s))"
        if item.plugin in broken:
            state += "; its self-test is broken"
    return {**item.model_dump(mode="json"), "status": state}


def _progress_relay(bar: Progress) -> Callable[[str, dict[str, Any]], None]:
    def relay(backend: str, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "plan":
            bar.total, bar.done = max(1, len(event.get("checks", []))), 0
            bar.label = f"self-test {backend}"
            bar.show()
        elif kind == "start":
            bar.show(str(event.get("check", "")))
        elif kind == "progress":  # a line of the backend's prepare
            bar.show(str(event.get("line", "")))
        elif kind == "check":
            bar.advance(str(event.get("name", "")))

    return relay


def _hardware_note(diagnosis: Diagnosis) -> str:
    """The line under an empty hardware table: what the installed plugins found anyway."""
    found = [
        f"{s.name} ({s.devices} device(s))"
        for s in diagnosis.plugins
        if s.status == "ok" and s.devices and s.name != "cpu"
    ]
    if not found:
        return "  (no GPU, OpenCL or Vulkan driver found)"
    return (
        "  (no GPU or driver registry found on disk; the plugins find devices through drivers"
        f" of their own: {', '.join(found)})"
    )


def run(args: argparse.Namespace) -> int:
    run_selftests = not getattr(args, "no_selftest", False)
    bar = Progress(
        1, enabled=getattr(args, "progress", False) or sys.stderr.isatty(), label="self-test"
    )
    try:
        diagnosis = diagnose(
            selftests=run_selftests,
            selftest_timeout=getattr(args, "selftest_timeout", selftest.DEFAULT_TIMEOUT_S),
            on_event=_progress_relay(bar),
        )
    finally:
        bar.close()
    problems, notes = diagnosis.problems, diagnosis.notes
    args.verdict = 1 if problems else 0  # the status, even if the reader leaves (a closed pipe)
    if args.json:
        print_json(
            {
                "healthy": not problems,
                "problems": [asdict(f) for f in problems],
                "notes": [asdict(f) for f in notes],
                "plugins": diagnosis.plugins,
                "selftest": [_selftest_json(r) for r in diagnosis.selftests],
                "hardware": diagnosis.hardware,
            }
        )
        return 1 if problems else 0
    print(
        "accelkit doctor: "
        + (f"{len(problems)} problem(s)" if problems else "healthy")
        + (f", {len(notes)} note(s)" if notes else "")
    )
    if diagnosis.plugins:
        print()
        print("plugins")
        rows = [[s.name, s.status, s.version, s.distribution, s.devices] for s in diagnosis.plugins]
        print(table(("name", "status", "version", "distribution", "devices"), rows, right=(4,)))
    print()
    if run_selftests:
        print("self-test (each backend on its first device, in a child process, against NumPy)")
        if diagnosis.selftests:
            rows = [[r.backend, r.device, r.summary()] for r in diagnosis.selftests]
            print(table(("backend", "device", "result"), rows))
        else:
            print("  (no backend with a device to test)")
    else:
        print("self-test: skipped (--no-selftest)")
    print()
    print("hardware")
    if diagnosis.hardware:
        rows = [[h["kind"], h["name"], h["plugin"], h["status"]] for h in diagnosis.hardware]
        print(table(("kind", "name", "plugin", "status"), rows))
    else:
        print(_hardware_note(diagnosis))
    for title, items in (("problems", problems), ("notes", notes)):
        if not items:
            continue
        print()
        print(title)
        for i, f in enumerate(items, 1):
            print(f"  {i}. [{f.check}] {f.subject}: {f.message}")
            if f.fix:
                print(f"     fix: {f.fix}")
            if f.traceback:
                if args.verbose:
                    print("     " + f.traceback.rstrip().replace("\n", "\n     "))
                else:
                    what = "its stderr" if f.check == "selftest" else "the traceback"
                    print(f"     (run 'accelkit doctor --verbose' for {what})")
    return 1 if problems else 0


def _selftest_json(report: selftest.SelfTestReport) -> dict[str, Any]:
    data = report.to_json()
    data.pop("stderr_tail", None)  # in the problem's "traceback", where it is broken
    return data
