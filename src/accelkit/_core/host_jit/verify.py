"""The CPU JIT kernels, compiled and checked in a child process once per machine.

Numba compiles for the CPU it finds (LLVM's name and feature list for the host). A feature that
the CPU reports but does not have (a virtual machine that passes AVX-512 through wrongly, say)
gives machine code that kills the process with SIGILL, or a compiler that aborts, rather than a
wrong number that :mod:`accelkit._core.host_jit.jit`'s check could catch. So before a process
uses a kernel for the first time on a machine, a child process (``python -m
accelkit._core.host_jit.verify NAME...``) compiles and checks every kernel not yet judged, one
at a time, saying on its stdout which one it is on: a crash or a hang costs the child, and the
kernel it was on is recorded as failed; a later child goes on with the rest.

Verdicts are kept in a JSON file (:func:`store_path`: ``$ACCELKIT_CPU_JIT_VERDICTS``, else
``cpu-jit-verdicts.json`` in :func:`accelkit.calibration.cache_dir`), keyed by what decides the
machine code: Numba's and llvmlite's versions, Python's, the CPU name and features LLVM sees
(or ``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES``) and the kernels' source. A failed kernel is not
tried again under the same key; delete the file to try again. The child also fills Numba's disk
cache, so the process that asked loads the kernels from it instead of compiling them again.

``ACCELKIT_CPU_JIT_VERIFY=0`` skips the child (the in-process check still runs).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["ENV", "main", "refusal", "store_path"]

log = logging.getLogger("accelkit.cpu.jit")

ENV = "ACCELKIT_CPU_JIT_VERIFY"
STORE_ENV = "ACCELKIT_CPU_JIT_VERDICTS"
#: Seconds one kernel may take in the child (compiling included) before it counts as hung.
TIMEOUT = 180.0
#: The module the child runs (a test points it at a wrapper that crashes on purpose).
CHILD_MODULE = "accelkit._core.host_jit.verify"

#: Entries (keys) the file keeps: a new Numba, or an edit of the kernels, adds one.
_KEEP = 16

_key: str | None = None
_memo: dict[str, dict[str, Any]] | None = None  # this process's view of its machine's verdicts
_no_child = False  # a child judged nothing in this process: none is started again


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def store_path() -> Path:
    override = os.environ.get(STORE_ENV, "").strip()
    if override:
        return Path(override)
    from accelkit.calibration import cache_dir

    return cache_dir() / "cpu-jit-verdicts.json"


def machine_key() -> str:
    """What decides the kernels' machine code (see the module docstring); imports llvmlite."""
    global _key
    if _key is None:
        import llvmlite
        import llvmlite.binding as llvm
        import numba

        from accelkit._core.host_jit import _numba_kernels, jit

        cpu = os.environ.get("NUMBA_CPU_NAME") or llvm.get_host_cpu_name()
        features = os.environ.get("NUMBA_CPU_FEATURES") or llvm.get_host_cpu_features().flatten()
        from accelkit import __version__

        source = hashlib.sha256(__version__.encode())
        for module in (_numba_kernels, jit):
            with contextlib.suppress(OSError, TypeError):  # no file: the version stands for it
                source.update(Path(module.__file__).read_bytes())  # type: ignore[arg-type]  # a module loaded from a file
        _key = (
            f"numba {numba.__version__}, llvmlite {llvmlite.__version__},"
            f" python {sys.version_info[0]}.{sys.version_info[1]}, cpu {cpu},"
            f" features {hashlib.sha256(features.encode()).hexdigest()[:16]},"
            f" kernels {source.hexdigest()[:16]}"
        )
    return _key


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as e:  # (nesting deeper than json parses)
        log.warning("ignoring the JIT verdicts in %s: %s", path, e)
        return {}
    machines = data.get("machines") if isinstance(data, dict) else None
    return machines if isinstance(machines, dict) else {}


def _write(path: Path, key: str, kernels: dict[str, Any]) -> None:
    """Merge ``kernels`` into the file's entry for ``key`` (atomically: a reader sees the old
    file or the new one)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        machines = _read(path)
        entry = machines.pop(key, {})
        entry.update(kernels)
        machines[key] = entry  # the newest last: the oldest go first beyond _KEEP
        while len(machines) > _KEEP:
            del machines[next(iter(machines))]
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cpu-jit-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"machines": machines}, f, indent=1)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("could not record the JIT verdicts in %s: %s", path, e)


def refusal(name: str, names: Sequence[str]) -> str | None:
    """Why kernel ``name`` must not be used on this machine, or None when it may (verified in
    a child, or verification off or impossible). Verifies ``names`` not yet judged first, in
    one child; called by jit.py with its compile lock held."""
    global _memo
    global _no_child
    if not enabled():
        return None
    key = machine_key()
    if _memo is None:
        _memo = _read(store_path()).get(key, {})
    if name not in _memo and not _no_child:
        todo = [n for n in names if n not in _memo]
        if name not in todo:
            todo.append(name)
        found = _verify(todo)
        if found:
            _memo.update(found)
            _write(store_path(), key, found)
        else:
            _no_child = True
    verdict = _memo.get(name)
    if verdict is None or verdict.get("ok"):
        return None
    return str(verdict.get("reason") or "failed in a child process")


def _verify(names: list[str]) -> dict[str, dict[str, Any]]:
    """Children over ``names`` until each has a verdict; a kernel a child never reached (the
    child could not start or import) gets none, and the caller trusts the in-process check."""
    found: dict[str, dict[str, Any]] = {}
    left = list(names)
    log.info(
        "checking %d CPU JIT kernel(s) in a child process first (once on this machine): %s",
        len(left),
        ", ".join(left),
    )
    while left:
        got = _run_child(left)
        if not got:
            break
        found.update(got)
        left = [n for n in left if n not in found]
    return found


def _run_child(names: list[str]) -> dict[str, dict[str, Any]]:
    from accelkit._core.child import ending, run_child

    def progress(msg: dict[str, Any]) -> None:
        if msg.get("done") in names:
            log.info(
                "CPU JIT kernel %s: %s (%.1f s, in a child process)",
                msg["done"],
                "ok" if msg.get("ok") else f"not used: {msg.get('reason')}",
                float(msg.get("seconds", 0.0)),
            )

    env = {**os.environ, ENV: "0", "PYTHONFAULTHANDLER": "1"}
    try:
        run = run_child(
            [sys.executable, "-m", CHILD_MODULE, *names],
            step_timeout=TIMEOUT,
            on_event=progress,
            env=env,
        )
    except OSError as e:
        log.warning("could not start a process to check the JIT kernels in (%s)", e)
        return {}
    found: dict[str, dict[str, Any]] = {}
    current: str | None = None  # the kernel the child was on when it ended
    for msg in run.events:
        if msg.get("start") in names:
            current = msg["start"]
        elif msg.get("done") in names:
            verdict: dict[str, Any] = {"ok": bool(msg.get("ok"))}
            if not verdict["ok"]:
                verdict["reason"] = str(msg.get("reason", ""))
            found[msg["done"]] = verdict
            current = None
    if current is not None:
        reason = ending(run, f"hung: no result in {TIMEOUT:.0f} s while compiling or checking it")
        reason = f"{reason} (in a child process checking it on this machine)"
        found[current] = {"ok": False, "reason": reason}
        log.info("CPU JIT kernel %s: not used: %s", current, reason)
    elif not found:
        tail = run.stderr.strip().splitlines()[-3:]
        log.warning(
            "the process checking the JIT kernels ended before checking any (status %s%s);"
            " checking them in this process only",
            run.returncode,
            f": {' / '.join(tail)}" if tail else "",
        )
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """The child: compile and check each kernel named, one JSON line before and after each."""
    from accelkit._core.host_jit import _numba_kernels, jit

    for name in argv if argv is not None else sys.argv[1:]:
        print(json.dumps({"start": name}), flush=True)
        t0 = time.perf_counter()
        try:
            jit._CHECKS[name](getattr(_numba_kernels, name))
        except Exception as e:
            reason = f"{type(e).__name__}: {e}"[:500]
            print(json.dumps({"done": name, "ok": False, "reason": reason}), flush=True)
        else:
            seconds = round(time.perf_counter() - t0, 2)
            print(json.dumps({"done": name, "ok": True, "seconds": seconds}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
