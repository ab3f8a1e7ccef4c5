"""Run the test suite in parts, each in its own pytest process, and say how each part ended.

One backend whose driver aborts the process (a compiler's ``LLVM ERROR`` ends in ``abort()``)
must not take the rest of the suite, or its report, down with it. ``noxfile.py``'s ``tests``
session therefore runs the core tests, the conformance suite once per backend, and each device
plugin's own tests as separate pytest processes (:class:`Part`), each under
``python -X faulthandler`` (a fatal signal prints the Python stack of every thread) with its
output shown live and kept in a file, then prints one table (:func:`format_summary`) and a last
line ``N passed, N failed, N skipped`` that CI reads.

Counts come from this module itself, loaded into every part's pytest as a plugin
(``-p support.parts``, with ``tests/`` on ``PYTHONPATH``): it writes one JSON line per test event
to the file named by ``$ACCELKIT_PART_LOG``, flushed as it goes, so that a part killed by a signal
still says how many tests passed before, and which test was running when it died. It also
keeps what pytest captured from the test that died (native code's ``LLVM ERROR: ...`` line
included), and splits test files between the core and the per-backend parts (:func:`split`).

The session imports this file by path, with nothing but the standard library (nox runs outside
the session's virtual environment); keep it that way.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

__all__ = [
    "Counts",
    "LOG_ENV",
    "Part",
    "PartResult",
    "crash_line",
    "format_summary",
    "module_seconds",
    "part_command",
    "run_part",
    "run_parts",
    "session_failures",
    "shard",
    "totals",
    "totals_line",
]


#: The file each part's pytest writes its test events to (read by :func:`read_log`).
LOG_ENV = "ACCELKIT_PART_LOG"
#: The folder where each part's pytest keeps what it captures (see :func:`_keep_captures`).
CAPTURE_ENV = "ACCELKIT_PART_CAPTURES"
#: How a part splits test files between the per-backend parts and the core (see :func:`split`).
SPLIT_ENV = "ACCELKIT_PART_SPLIT"
#: ``I/N``: a part keeps every N-th of its tests, from the I-th (see :func:`shard`).
SHARD_ENV = "ACCELKIT_PART_SHARD"
#: This module, as the pytest plugin name (``tests/`` is put on ``PYTHONPATH``).
PLUGIN = "support.parts"
TESTS_DIR = Path(__file__).resolve().parent.parent
_TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class Part:
    """One pytest process: ``args`` (paths and options), extra environment ``env``.

    A part with a ``skip_reason`` is not run: it shows in the summary as ``no tests`` with the
    reason (a backend installed without a device, whose conformance suite cannot run here).

    A part run ``alongside`` runs in the background while the parts after it run, its output
    shown once they end: for a part that mostly waits (on a cluster's scheduler, say) rather
    than computes. ``timeout`` (seconds) replaces the runner's for this part. ``budget``
    (seconds) is the part's share of the run's time budget: the summary names a part that took
    longer (a warning, not a failure). A part with a ``command`` runs that command instead of
    pytest (a linter, a type checker): it passes or fails by its exit status.
    """

    name: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    skip_reason: str = ""
    alongside: bool = False
    timeout: float | None = None
    budget: float | None = None
    command: tuple[str, ...] = ()


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0  # failures and errors (setup, teardown, collection)
    skipped: int = 0  # skips and expected failures

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.passed + other.passed, self.failed + other.failed, self.skipped + other.skipped
        )

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped


@dataclass
class PartResult:
    """How one part ended. ``outcome`` is ``passed``, ``failed``, ``crashed``, ``timed out`` or
    ``no tests``; ``counts`` is None where nothing says (a part that died before its first
    test)."""

    name: str
    outcome: str
    returncode: int | None = None
    counts: Counts | None = None
    seconds: float = 0.0
    detail: str = ""
    output_path: str = ""
    running: list[str] = field(default_factory=list)
    #: Seconds spent in each test module (setup, call and teardown of its tests), from the log.
    modules: dict[str, float] = field(default_factory=dict)
    budget: float | None = None

    @property
    def over_budget(self) -> bool:
        return (
            self.budget is not None and self.returncode is not None and (self.seconds > self.budget)
        )

    @property
    def label(self) -> str:
        if self.outcome == "crashed" and self.returncode is not None:
            return f"crashed: {signal_name(self.returncode)}"
        return self.outcome


def signal_name(returncode: int) -> str:
    """``SIGABRT`` for -6: the signal that killed a process."""
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


# -- the pytest plugin: one JSON line per test event ------------------------------------------------

_log: TextIO | None = None


def _write(event: dict[str, Any]) -> None:
    if _log is not None:
        _log.write(json.dumps(event) + "\n")
        _log.flush()


def pytest_configure(config: Any) -> None:
    global _log
    path = os.environ.get(LOG_ENV)
    if path and _log is None:
        _log = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the whole session


def split(paths: Sequence[str], fixtures: Sequence[str], keep: str) -> dict[str, str]:
    """The environment that makes a part keep only some tests of ``paths`` (files or folders,
    from the repository root): with ``keep="backend"`` the tests parametrized by one of the
    ``fixtures`` (those whose params are the backends under test) and nothing outside ``paths``;
    with ``keep="other"`` everything else. Two such parts run each test of ``paths`` once."""
    return {SPLIT_ENV: json.dumps({"paths": list(paths), "fixtures": list(fixtures), "keep": keep})}


def shard(index: int, count: int) -> dict[str, str]:
    """The environment that makes a part keep every ``count``-th of its tests, from the
    ``index``-th (1-based): ``count`` such parts run each test once, side by side."""
    if not 1 <= index <= count:
        raise ValueError(f"shard {index}/{count}")
    return {SHARD_ENV: f"{index}/{count}"}


def _deselect(config: Any, items: list[Any], keep: list[Any]) -> None:
    if len(keep) != len(items):
        kept = {id(item) for item in keep}
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept])
        items[:] = keep


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Keep this part's tests: the split between core and per-backend parts, then the shard.
    (Another plugin's deselection, before or after this one, keeps the shards disjoint and
    whole: each test is in exactly one shard, whatever else drops it.)"""
    try:
        rule = json.loads(os.environ.get(SPLIT_ENV, "") or "null")
    except ValueError:
        rule = None
    if isinstance(rule, dict):
        root = Path(str(config.rootpath))
        under = [(root / p).resolve() for p in rule.get("paths", [])]
        fixtures = set(rule.get("fixtures", []))

        def per_backend(item: Any) -> bool:
            path = Path(str(item.path)).resolve()
            if not any(path == p or p in path.parents for p in under):
                return False
            params = getattr(getattr(item, "callspec", None), "params", {})
            return any(name in params for name in fixtures)

        want = rule.get("keep") == "backend"
        _deselect(config, items, [item for item in items if per_backend(item) == want])
    index, _, count = os.environ.get(SHARD_ENV, "").partition("/")
    if index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count):
        _deselect(config, items, items[int(index) - 1 :: int(count)])


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _write({"event": "collect", "id": report.nodeid or ".", "outcome": "failed"})


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    _write({"event": "start", "id": nodeid})


def pytest_runtest_logreport(report: Any) -> None:
    _write(
        {
            "event": "report",
            "id": report.nodeid,
            "when": report.when,
            "outcome": report.outcome,
            "s": round(float(getattr(report, "duration", 0.0) or 0.0), 4),
        }
    )


def pytest_unconfigure(config: Any) -> None:
    global _log
    if _log is not None:
        _write({"event": "end"})
        _log.close()
        _log = None


def _keep_captures(folder: str) -> None:
    """pytest captures file descriptors 1 and 2 into *unlinked* temporary files, so what a
    test's native code writes just before it kills the process (a compiler's ``LLVM ERROR:
    ...``) dies with the process. Make them named files in ``folder`` instead, which the runner
    reads after a crash. (Relies on ``_pytest.capture.TemporaryFile``; where a pytest lacks it,
    nothing changes but that this detail is lost.)"""
    try:
        import _pytest.capture as _capture
    except ImportError:  # pragma: no cover - not under pytest
        return
    capture: Any = _capture  # a private module: its TemporaryFile is not exported
    if not callable(getattr(capture, "TemporaryFile", None)):  # pragma: no cover
        return
    numbers = itertools.count()
    os.makedirs(folder, exist_ok=True)

    def named_file(*args: Any, **kwargs: Any) -> Any:
        path = os.path.join(folder, f"capture-{os.getpid()}-{next(numbers)}")
        return open(path, "w+b", buffering=0)  # pytest owns and closes it

    capture.TemporaryFile = named_file


if __name__ == PLUGIN and os.environ.get(CAPTURE_ENV) and os.environ.get(LOG_ENV):
    # Loaded by ``-p support.parts``: before pytest starts capturing.
    _keep_captures(os.environ[CAPTURE_ENV])


def read_captures(folder: Path | str) -> str:
    """What pytest had captured (and not yet reported) when the process died."""
    texts = []
    for path in sorted(Path(folder).glob("capture-*")):
        try:
            text = path.read_bytes().decode("utf-8", "replace")
        except OSError:
            continue
        if text.strip():
            texts.append(text)
    return "\n".join(texts)


# -- reading what a part left ----------------------------------------------------------------------


def read_log(path: Path | str) -> tuple[Counts, list[str]] | None:
    """The counts a part's event log gives, and the tests it started and never finished (the
    one running when the process died); None when there is no log."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    counts = Counts()
    outcome: dict[str, str] = {}
    finished: set[str] = set()
    order: list[str] = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line cut short by the crash
        kind, nodeid = event.get("event"), event.get("id", "")
        if kind == "collect":
            counts.failed += 1
        elif kind == "start":
            if nodeid not in outcome:
                order.append(nodeid)
            outcome.setdefault(nodeid, "")
        elif kind == "report":
            state, result = outcome.get(nodeid, ""), event.get("outcome")
            if result == "failed":
                outcome[nodeid] = "failed"
            elif state != "failed" and (event.get("when") == "call" or result == "skipped"):
                outcome[nodeid] = str(result)
            if event.get("when") == "teardown":
                finished.add(nodeid)
    for nodeid in order:
        if nodeid not in finished:
            continue
        state = outcome[nodeid] or "passed"
        if state == "failed":
            counts.failed += 1
        elif state == "skipped":
            counts.skipped += 1
        else:
            counts.passed += 1
    return counts, [n for n in order if n not in finished]


def module_seconds(path: Path | str) -> dict[str, float]:
    """Seconds spent in each test module of a part (the sum of its tests' setup, call and
    teardown durations), from the event log; empty when there is none."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    seconds: dict[str, float] = {}
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "report" and isinstance(event.get("s"), (int, float)):
            module = str(event.get("id", "")).split("::")[0]
            seconds[module] = seconds.get(module, 0.0) + float(event["s"])
    return seconds


_SUMMARY_LINE = re.compile(r"^=+ (?P<body>.*?) in [\d.]+s(?: \([^)]*\))? =+$")
_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?)")


def counts_from_output(output: str) -> Counts | None:
    """The counts of pytest's last summary line (``=== 3 passed, 1 skipped in 0.1s ===``)."""
    for line in reversed(output.splitlines()):
        m = _SUMMARY_LINE.match(line.strip())
        if not m:
            continue
        counts = Counts()
        for number, word in _COUNT.findall(m["body"]):
            n = int(number)
            if word in ("passed", "xpassed"):
                counts.passed += n
            elif word in ("failed", "error", "errors"):
                counts.failed += n
            elif word in ("skipped", "xfailed"):
                counts.skipped += n
        return counts
    return None


#: Lines that say what went wrong, in native code or in Python.
_ERROR_LINE = re.compile(
    r"(LLVM ERROR|terminate called|Assertion .* failed|Segmentation fault|\bpanicked at\b|"
    r"\berror\b|\bError\b|ERROR|\bexception\b|\bException\b|\babort)"
)
#: Noise when looking for the reason: faulthandler's stack dump, warnings, pytest's progress.
_NOISE_LINE = re.compile(
    r"^(\s|File \"|Current thread|Thread 0x|Extension modules|Stack \(most recent|"
    r"warning:|.*Warning:|\d+ warnings? generated|Traceback|<no Python frame>|"
    r"\S+\.py [.sxXFE]+|\[\s*\d+%\]|=+ |_+ )"
)


def crash_line(output: str, limit: int = 200) -> str:
    """The last meaningful line of a crashed process's output: the last line naming an error
    (``LLVM ERROR: ...``, ``terminate called ...``), else ``Fatal Python error: ...``, else "".
    (Nearly the rule of ``accelkit._core.selftest.crash_line``, which this file cannot import.)"""
    # pytest's progress dots leave no newline before a fatal error's first line
    text = output.replace("Fatal Python error", "\nFatal Python error")
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    candidates = [line for line in lines if not _NOISE_LINE.match(line)]
    fatal = [line for line in candidates if line.startswith("Fatal Python error")]
    errors = [
        line
        for line in candidates
        if _ERROR_LINE.search(line) and not line.startswith("Fatal Python error")
    ]
    pick = (errors or fatal or [""])[-1]
    if pick.startswith("LLVM ERROR"):
        after = candidates[candidates.index(pick) + 1 :]
        where = next((line for line in after if line.startswith("In function:")), "")
        if where:
            pick += f" ({where})"
    pick = re.sub(r"\s*\b0x[0-9a-fA-F]{6,}\b:?", "", pick)
    pick = re.sub(r"(\s*,)+(?=\s*(\(|$))", "", pick).strip()
    return pick if len(pick) <= limit else pick[: limit - 3] + "..."


# -- running parts ---------------------------------------------------------------------------------


def part_command(python: str, part: Part, extra_args: Sequence[str] = ()) -> list[str]:
    if part.command:
        return list(part.command)
    return [
        python,
        "-X",
        "faulthandler",
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-p",
        PLUGIN,
        *part.args,
        *extra_args,
    ]


#: The parts' processes running now (so that an interruption of the runner ends them all).
_LIVE: set[subprocess.Popen[bytes]] = set()


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "part"


def run_part(
    part: Part,
    *,
    python: str = sys.executable,
    cwd: Path | str = ".",
    env: Mapping[str, str] | None = None,
    log_dir: Path | str,
    extra_args: Sequence[str] = (),
    out: TextIO | None = None,
    timeout: float | None = None,
    empty_ok: bool = False,
) -> PartResult:
    """Run one part; its output goes to ``out`` (stdout) as it comes and to a file in
    ``log_dir``. ``empty_ok``: a part that selects no test is ``no tests``, not a failure."""
    out = out or sys.stdout
    if part.skip_reason:
        return PartResult(part.name, "no tests", detail=part.skip_reason)
    if part.timeout is not None:
        timeout = part.timeout
    folder = Path(log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    slug = _slug(part.name)
    log_path, output_path = folder / f"{slug}.events.jsonl", folder / f"{slug}.out"
    captures = folder / f"{slug}.captures"
    log_path.unlink(missing_ok=True)
    shutil.rmtree(captures, ignore_errors=True)
    child_env = dict(os.environ if env is None else env)
    child_env.update(part.env)
    child_env[LOG_ENV] = str(log_path)
    child_env[CAPTURE_ENV] = str(captures)
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(TESTS_DIR), child_env.get("PYTHONPATH", "")) if p
    )
    cmd = part_command(python, part, extra_args)
    shown = " ".join(cmd if part.command else cmd[1:])
    print(f"\n=== part {part.name}: {shown}", file=out, flush=True)
    start = time.monotonic()
    tail = bytearray()
    with open(output_path, "wb") as saved:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a timeout or Ctrl-C ends the part's helpers too
        )
        _LIVE.add(proc)

        def pump() -> None:
            assert proc.stdout is not None
            fd = proc.stdout.fileno()
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            while chunk := os.read(fd, 65536):
                saved.write(chunk)
                tail.extend(chunk)
                del tail[:-_TAIL_BYTES]
                out.write(decoder.decode(chunk))
                out.flush()
            out.write(decoder.decode(b"", final=True))

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
        except BaseException:  # Ctrl-C: stop the part, then let the interruption through
            _signal_group(proc, signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
            raise
        finally:
            _LIVE.discard(proc)
            reader.join(timeout=10)
    seconds = time.monotonic() - start
    output = tail.decode("utf-8", "replace")
    if proc.returncode != 0 and (lost := read_captures(captures)):
        # What the test that died wrote, which pytest had captured and never got to show.
        shown_lost = f"--- captured by pytest when the process ended ---\n{lost.rstrip()}\n---\n"
        out.write(shown_lost)
        out.flush()
        with open(output_path, "ab") as saved:
            saved.write(shown_lost.encode("utf-8", "replace"))
        output = f"{output}\n{lost}"
    shutil.rmtree(captures, ignore_errors=True)
    result = _interpret(part, proc.returncode, timed_out, timeout, output, log_path, empty_ok)
    result.seconds = seconds
    result.output_path = str(output_path)
    result.modules = module_seconds(log_path)
    result.budget = part.budget
    print(
        f"=== part {part.name}: {result.label}"
        + (f" ({result.detail})" if result.detail else "")
        + f" in {seconds:.0f} s",
        file=out,
        flush=True,
    )
    return result


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, sig)


_EXIT_MEANING = {
    2: "interrupted, or errors during collection",
    3: "pytest internal error",
    4: "pytest usage error",
}


def _interpret(
    part: Part,
    returncode: int,
    timed_out: bool,
    timeout: float | None,
    output: str,
    log_path: Path,
    empty_ok: bool,
) -> PartResult:
    logged = read_log(log_path)
    counts, running = logged if logged is not None else (None, [])
    if counts is None or (counts.total == 0 and returncode >= 0):
        counts = counts_from_output(output) or counts
    result = PartResult(part.name, "passed", returncode, counts, running=running)
    at = f"in {running[-1]}" if running else ""
    if timed_out:
        result.outcome = "timed out"
        result.detail = " ".join(x for x in (f"after {timeout:g} s", at) if x)
    elif returncode < 0:
        result.outcome = "crashed"
        where = at or ("after the last test" if logged and logged[0].total else "before any test")
        line = crash_line(output)
        result.detail = where + (f": {line}" if line else "")
    elif part.command:
        result.outcome = "passed" if returncode == 0 else "failed"
        if returncode != 0:
            result.detail = f"exit status {returncode}"
    elif returncode == 5:
        result.outcome = "no tests"
        if not empty_ok:
            result.detail = "pytest collected no test, where this part should have some"
    elif returncode != 0:
        result.outcome = "failed"
        if returncode in _EXIT_MEANING:
            result.detail = f"exit status {returncode}: {_EXIT_MEANING[returncode]}"
    if result.outcome in ("crashed", "timed out") and running:
        # The test that never finished failed, whatever the process could not write about it.
        result.counts = (result.counts or Counts()) + Counts(failed=len(running))
    elif result.outcome in ("crashed", "timed out") and result.counts is None:
        result.counts = Counts(failed=1)
    return result


def run_parts(
    parts: Iterable[Part],
    *,
    python: str = sys.executable,
    cwd: Path | str = ".",
    env: Mapping[str, str] | None = None,
    log_dir: Path | str,
    extra_args: Sequence[str] = (),
    out: TextIO | None = None,
    timeout: float | None = None,
    empty_ok: bool = False,
    jobs: int = 1,
) -> list[PartResult]:
    """Run every part, whatever the earlier ones did; the results in the parts' order.

    Parts ``alongside`` start at once and run in the background; the others run ``jobs`` at a
    time, in the order given (put the longest first). With one job a part's output is shown
    as it comes; with more, each part's output is shown whole when it ends (a line says when
    each starts), so that parts never interleave. A part that crashes or hangs ends only
    itself: each is its own process group."""
    shown = out or sys.stdout
    lock = threading.Lock()
    results: dict[int, PartResult] = {}
    background: list[tuple[threading.Thread, io.StringIO]] = []

    def run(i: int, part: Part, to: TextIO) -> None:
        results[i] = run_part(
            part,
            python=python,
            cwd=cwd,
            env=env,
            log_dir=log_dir,
            extra_args=() if part.command else extra_args,
            out=to,
            timeout=timeout,
            empty_ok=empty_ok,
        )

    def say(text: str) -> None:
        with lock:
            shown.write(text)
            shown.flush()

    queue: list[tuple[int, Part]] = []
    for i, part in enumerate(parts):
        if part.alongside and not part.skip_reason:
            buffer = io.StringIO()
            thread = threading.Thread(target=run, args=(i, part, buffer), daemon=True)
            thread.start()
            background.append((thread, buffer))
            say(f"\n=== part {part.name}: runs alongside the next parts; its output follows\n")
        else:
            queue.append((i, part))

    if jobs <= 1:
        for i, part in queue:
            run(i, part, shown)
    else:
        pending = iter(queue)

        def worker() -> None:
            while True:
                with lock:
                    nxt = next(pending, None)
                if nxt is None:
                    return
                i, part = nxt
                if not part.skip_reason:
                    say(f"\n=== part {part.name}: started\n")
                buffer = io.StringIO()
                try:
                    run(i, part, buffer)
                finally:
                    say(buffer.getvalue())

        workers = [threading.Thread(target=worker, daemon=True) for _ in range(jobs)]
        for w in workers:
            w.start()
        try:
            for w in workers:
                w.join()
        except BaseException:  # Ctrl-C: the parts run in threads, so stop their processes here
            for proc in list(_LIVE):
                _signal_group(proc, signal.SIGINT)
            raise
    for thread, buffer in background:
        thread.join()
        say(buffer.getvalue())
    return [results[i] for i in sorted(results)]


# -- the verdict -----------------------------------------------------------------------------------


def totals(results: Iterable[PartResult]) -> Counts:
    total = Counts()
    for r in results:
        total = total + (r.counts or Counts())
    return total


def totals_line(results: Iterable[PartResult]) -> str:
    """``N passed, N failed, N skipped``: the line CI reads."""
    t = totals(results)
    return f"{t.passed} passed, {t.failed} failed, {t.skipped} skipped"


def session_failures(results: Sequence[PartResult], *, empty_ok: bool = False) -> list[str]:
    """Why the session fails (empty: it passes). A part that failed, crashed or timed out fails
    it; so does one that collected no test, unless ``empty_ok`` (the developer's arguments
    filtered the tests) -- and even then, a session where no part ran a test fails, as pytest
    does when nothing is selected. A part not run for a reason (``skip_reason``) fails nothing."""
    reasons = []
    for r in results:
        if r.outcome in ("failed", "crashed", "timed out"):
            reasons.append(f"{r.name}: {r.label}" + (f" ({r.detail})" if r.detail else ""))
        elif r.outcome == "no tests" and r.returncode == 5 and not empty_ok:
            reasons.append(f"{r.name}: no tests collected")
    ran = [r for r in results if r.returncode is not None]
    if ran and all(r.outcome == "no tests" for r in ran) and empty_ok:
        reasons.append("no part selected any test")
    return reasons


def _fmt_count(counts: Counts | None, attr: str) -> str:
    return "-" if counts is None else str(getattr(counts, attr))


def format_summary(results: Sequence[PartResult], *, slowest: int = 3) -> str:
    """The table of parts (time against each part's share of the budget), the failures'
    details, the parts over their share, each part's ``slowest`` test modules, and the totals
    line (last, alone)."""
    header = ("part", "outcome", "passed", "failed", "skipped", "time", "share")
    rows = [
        (
            r.name,
            r.label,
            _fmt_count(r.counts, "passed"),
            _fmt_count(r.counts, "failed"),
            _fmt_count(r.counts, "skipped"),
            f"{r.seconds:.0f} s" if r.returncode is not None else "-",
            (f"{r.budget:.0f} s" + (" !" if r.over_budget else "")) if r.budget else "-",
        )
        for r in results
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    right = {2, 3, 4, 5, 6}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    lines = ["test parts", line(header), line(["-" * w for w in widths])]
    lines += [line(row) for row in rows]
    notes = [r for r in results if r.detail]
    if notes:
        lines.append("")
        for r in notes:
            lines.append(f"{r.name}: {r.label}: {r.detail}")
            if r.outcome in ("crashed", "timed out", "failed") and r.output_path:
                lines.append(f"  (its whole output: {r.output_path})")
    over = [r for r in results if r.over_budget]
    if over:
        lines.append("")
        for r in over:
            lines.append(
                f"warning: part {r.name} took {r.seconds:.0f} s, over its share of the budget"
                f" ({r.budget:.0f} s)"
            )
    timed = [r for r in results if r.modules]
    if timed and slowest > 0:
        lines.append("")
        lines.append(f"slowest test modules (seconds in tests, top {slowest} of each part):")
        for r in timed:
            top = sorted(r.modules.items(), key=lambda kv: -kv[1])[:slowest]
            lines.append(f"  {r.name}: " + ", ".join(f"{m} {t:.0f} s" for m, t in top))
    lines.append("")
    lines.append(totals_line(results))
    return "\n".join(lines)
