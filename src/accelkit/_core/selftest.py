"""A short self-test of one backend on one device, run in a child process (``accelkit doctor``).

A plugin that loads and lists a device can still be unusable: its driver's compiler may abort the
process on the first real kernel, hang, or compute wrong numbers. ``doctor`` finds out by running
a few operations of each kind (elementwise, reductions, matmuls of 128x128 and 256x256, softmax,
layer_norm, a small conv2d, and a couple of fused KernelOps where the backend has them) and
checking each against NumPy -- in a *child* process, so that an abort or a segfault in a driver
is reported and never takes the caller down::

    python -X faulthandler -m accelkit._core.selftest --backend opencl --device opencl:0

Before the checks, the child has the backend do its one-time preparation
(:meth:`~accelkit.abc.ComputeBackend.prepare`: the CPU backend compiles and checks its JIT
kernels, the OpenCL backend verifies its kernel variants), so that the checks run on what a
user's program gets and a kernel that crashes the process does it here, where it is reported.

The child prints its progress on stderr (one line per check, readable) and, for the parent, one
line per event on stdout: ``ACCELKIT_SELFTEST {json}``. :func:`run_selftest` starts the child,
with a timeout on each step (start-up, then each check: a slow machine or a first compile makes
the whole run long, but only a step that stops making progress is a hang), and turns what it
saw into a :class:`SelfTestReport`: ``ok`` with the checks that passed, or ``broken`` with the
reason (the signal that killed it and the check it was running, with the last meaningful line
of its stderr; a timeout; an exception; a wrong result).

The child inherits the environment unchanged: driver caches (``POCL_CACHE_DIR``, the plugins' own
caches) are where the backend normally puts them, so the self-test sees what a user's program
would. Importing this module imports neither NumPy nor any backend.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from accelkit._core.child import crash_line, run_child, signal_name

if TYPE_CHECKING:
    import numpy as np

    from accelkit.abc.backend import ComputeBackend

__all__ = [
    "CheckResult",
    "DEFAULT_TIMEOUT_S",
    "SelfTestReport",
    "crash_line",
    "main",
    "run_checks",
    "run_selftest",
    "signal_name",
]

DEFAULT_TIMEOUT_S = 120.0
MARKER = "ACCELKIT_SELFTEST "
#: Largest relative error (max |got - want| / max(1, max |want|)) accepted for f32 results.
TOLERANCE = 1e-3
#: Checks whose progress step names the backend's initialization and shutdown.
INITIALIZE = "initialize"
SHUTDOWN = "shutdown"
#: The step that awaits the backend's ``prepare`` (any backend: most have nothing to prepare).
PREPARE = "prepare"

#: ``limited``: a step that ran, but part of what it prepares is left out, the detail says why
#: (the note ``prepare`` returned: a JIT kernel not used, NumPy's runs instead); no fault of the
#: backend.
CheckStatus = Literal["ok", "limited", "error", "wrong", "skipped"]


@dataclass
class CheckResult:
    name: str
    status: CheckStatus
    detail: str = ""
    max_error: float | None = None
    seconds: float = 0.0


@dataclass
class SelfTestReport:
    """What one self-test found. ``verdict`` is ``ok`` or ``broken`` (with ``reason``)."""

    backend: str
    device: str
    verdict: Literal["ok", "broken"]
    reason: str = ""
    checks: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0
    returncode: int | None = None
    stderr_tail: str = ""
    command: str = ""

    @property
    def passed(self) -> list[str]:
        return [
            c.name
            for c in self.checks
            if c.status == "ok" and c.name not in (INITIALIZE, PREPARE, SHUTDOWN)
        ]

    def summary(self) -> str:
        """One line: ``ok (11 checks, 1.2 s)`` or ``broken: <reason>``."""
        if self.verdict == "ok":
            skipped = sum(c.status == "skipped" and c.name != PREPARE for c in self.checks)
            extra = f", {skipped} not applicable" if skipped else ""
            return f"ok ({len(self.passed)} checks{extra}, {self.seconds:.1f} s)"
        return f"broken: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["summary"] = self.summary()
        return data


# -- the parent ------------------------------------------------------------------------------------


def _command(backend: str, device: str, loop: str) -> list[str]:
    return [
        sys.executable,
        "-X",
        "faulthandler",
        "-m",
        "accelkit._core.selftest",
        "--backend",
        backend,
        "--device",
        device,
        "--loop",
        loop,
        "--events",
    ]


def run_selftest(
    backend: str,
    device: str,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    loop: str = "asyncio",
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> SelfTestReport:
    """Self-test ``backend`` on ``device`` in a child process (see the module docstring).

    ``timeout`` bounds each step: the child's start-up until its first event, then each check
    (from one event to the next), then its exit. A step that takes longer is reported as
    ``timed out after <timeout> s during <check>`` and the child's process group is killed.

    ``on_event`` is called (from a reader thread) with each protocol event as it arrives:
    ``{"event": "plan", "checks": [...]}``, ``{"event": "start", "check": ...}``,
    ``{"event": "progress", "check": ..., "line": ...}`` (a line of the backend's ``prepare``),
    ``{"event": "check", ...}`` (a :class:`CheckResult` as a dict), ``{"event": "done"}``. Each
    event, a progress line included, starts a new step of ``timeout``.
    """
    cmd = _command(backend, device, loop)
    shown = shlex.join(cmd[:-1])  # what a user runs to watch it: the same, without --events
    try:
        run = run_child(cmd, step_timeout=timeout, marker=MARKER, on_event=on_event)
    except OSError as exc:
        return SelfTestReport(
            backend, device, "broken", f"could not start the self-test: {exc}", command=shown
        )
    report = _interpret(
        backend, device, run.events, run.returncode, run.timed_out, timeout, run.stderr
    )
    report.seconds = run.seconds
    report.returncode = run.returncode
    report.stderr_tail = run.stderr
    report.command = shown
    return report


def _interpret(
    backend: str,
    device: str,
    events: list[dict[str, Any]],
    returncode: int,
    timed_out: bool,
    timeout: float,
    stderr: str,
) -> SelfTestReport:
    checks: list[CheckResult] = []
    running: str | None = None
    done = False
    for event in events:
        kind = event.get("event")
        if kind == "start":
            running = str(event.get("check", ""))
        elif kind == "check":
            fields = {k: event[k] for k in ("name", "status", "detail", "max_error", "seconds")}
            checks.append(CheckResult(**fields))
            running = None
        elif kind == "done":
            done = True
    if running is not None:
        where = f"during {running}"
    elif done:
        where = "at exit, after every check had run"
    elif checks:
        where = f"after {checks[-1].name}"
    else:
        where = "at start-up"
    reason = ""
    if timed_out:
        reason = f"timed out after {timeout:g} s {where}"
    elif returncode < 0:
        line = crash_line(stderr)
        reason = f"process killed by {signal_name(returncode)} {where}" + (
            f" ({line})" if line else ""
        )
    failed = [c for c in checks if c.status in ("error", "wrong")]
    if failed:
        first = failed[0]
        text = (
            f"wrong result in {first.name}: {first.detail}"
            if first.status == "wrong"
            else f"{first.name}: {first.detail}"
        )
        more = f" (and {len(failed) - 1} more check(s) failed)" if len(failed) > 1 else ""
        reason = f"{text}{more}" + (f"; then {reason}" if reason else "")
    elif not reason and (returncode != 0 or not done):
        line = crash_line(stderr)
        reason = f"self-test exited with status {returncode} {where}" + (
            f" ({line})" if line else ""
        )
    verdict: Literal["ok", "broken"] = "broken" if reason else "ok"
    return SelfTestReport(backend, device, verdict, reason, checks)


# -- the child -------------------------------------------------------------------------------------

Check = Callable[["ComputeBackend", "np.random.Generator"], Awaitable[tuple[Any, Any]]]


def _checks() -> list[tuple[str, str | None, Check]]:
    """(name, the fused KernelOps op it needs or None, the check). Each check returns (got, want)
    as NumPy arrays; got from the backend, want computed in float64 by NumPy."""
    import numpy as np

    def data(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> Any:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    async def add(b: ComputeBackend, rng: np.random.Generator) -> tuple[Any, Any]:
        x, y = data(rng, 4096), data(rng, 4096)
        f = b.tensor_factory
        return await b.tensor_ops.add(f.from_host(x), f.from_host(y)).to_host(), x + y

    async def mul(b: ComputeBackend, rng: np.random.Generator) -> tuple[Any, Any]:
        x, y = data(rng, 64, 64), data(rng, 64)
        f = b.tensor_factory
        return await b.tensor_ops.mul(f.from_host(x), f.from_host(y)).to_host(), x * y

    async def exp(b: ComputeBackend, rng: np.random.Generator) -> tuple[Any, Any]:
        x = data(rng, 4096, scale=2.0)
        got = await b.tensor_ops.exp(b.tensor_factory.from_host(x)).to_host()
        return got, np.exp(x.astype(np.float64))

    async def reduce_sum(b: ComputeBackend, rng: np.random.Generator) -> tuple[Any, Any]:
        x = data(rng, 256, 512)
        got = await b.tensor_ops.sum(b.tensor_factory.from_host(x), axis=-1).to_host()
        return got, x.astype(np.float64).sum(axis=-1)

    async def reduce_max(b: ComputeBackend, rng: np.random.Generator) -> tuple[Any, Any]:
        x = data(rng, 256, 512)
        got = await b.tensor_ops.max(b.tensor_factory.from_host(x)).to_host()
        return got, x.max()

    def matmul(n: int) -> Check:
        async def check(b: ComputeBackend, rng: np.random.Generator) -> tuple[Any, Any]:
            x, y = data(rng, n, n), data(rng, n, n)
            f = b.tensor_factory
            got = await b.tensor_ops.matmul(f.from_host(x), f.from_host(y)).to_host()
            return got, x.astype(np.float64) @ y.astype(np.float64)

        return check

    async def softmax(b: ComputeBackend, rng: np.random.Generator) -> tuple[Any, Any]:
        x = data(rng, 64, 256, scale=3.0)
        got = await b.tensor_ops.softmax(b.tensor_factory.from_host(x), axis=-1).to_host()
        e = np.exp(x - x.max(axis=-1, keepdims=True)).astype(np.float64)
        return got, e / e.sum(axis=-1, keepdims=True)

    def layer_norm_ref(x: Any, w: Any, bias: Any) -> Any:
        x64 = x.astype(np.float64)
        mean = x64.mean(axis=-1, keepdims=True)
        var = x64.var(axis=-1, keepdims=True)
        return (x64 - mean) / np.sqrt(var + 1e-5) * w + bias

    async def layer_norm(b: ComputeBackend, rng: np.random.Generator) -> tuple[Any, Any]:
        x, w, bias = data(rng, 64, 256), data(rng, 256), data(rng, 256)
        f = b.tensor_factory
        got = await b.tensor_ops.layer_norm(
            f.from_host(x), f.from_host(w), f.from_host(bias)
        ).to_host()
        return got, layer_norm_ref(x, w, bias)

    async def conv2d(b: ComputeBackend, rng: np.random.Generator) -> tuple[Any, Any]:
        x, w, bias = data(rng, 2, 3, 16, 16), data(rng, 8, 3, 3, 3), data(rng, 8)
        f = b.tensor_factory
        got = await b.tensor_ops.conv2d(
            f.from_host(x), f.from_host(w), f.from_host(bias), padding=1
        ).to_host()
        padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
        windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
        want = np.einsum("nchwij,ocij->nohw", windows, w.astype(np.float64))
        return got, want + bias[None, :, None, None]

    async def k_rms_norm(b: ComputeBackend, rng: np.random.Generator) -> tuple[Any, Any]:
        x, w = data(rng, 64, 256), data(rng, 256)
        f = b.tensor_factory
        got = await b.kernel_ops.rms_norm(f.from_host(x), f.from_host(w)).to_host()
        x64 = x.astype(np.float64)
        return got, x64 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + 1e-6) * w

    async def k_layer_norm(b: ComputeBackend, rng: np.random.Generator) -> tuple[Any, Any]:
        x, w, bias = data(rng, 64, 256), data(rng, 256), data(rng, 256)
        f = b.tensor_factory
        got = await b.kernel_ops.layer_norm(
            f.from_host(x), f.from_host(w), f.from_host(bias)
        ).to_host()
        return got, layer_norm_ref(x, w, bias)

    async def k_silu_mul(b: ComputeBackend, rng: np.random.Generator) -> tuple[Any, Any]:
        gate, up = data(rng, 64, 256), data(rng, 64, 256)
        f = b.tensor_factory
        got = await b.kernel_ops.silu_mul(f.from_host(gate), f.from_host(up)).to_host()
        g64 = gate.astype(np.float64)
        return got, g64 / (1.0 + np.exp(-g64)) * up

    return [
        ("add f32 [4096]", None, add),
        ("mul f32 [64x64] * [64]", None, mul),
        ("exp f32 [4096]", None, exp),
        ("sum f32 [256x512] axis -1", None, reduce_sum),
        ("max f32 [256x512]", None, reduce_max),
        ("matmul 128x128 f32", None, matmul(128)),
        ("matmul 256x256 f32", None, matmul(256)),
        ("softmax f32 [64x256]", None, softmax),
        ("layer_norm f32 [64x256]", None, layer_norm),
        ("conv2d f32 [2x3x16x16] * [8x3x3x3]", None, conv2d),
        ("kernel_ops rms_norm f32 [64x256]", "rms_norm", k_rms_norm),
        ("kernel_ops layer_norm f32 [64x256]", "layer_norm", k_layer_norm),
        ("kernel_ops silu_mul f32 [64x256]", "silu_mul", k_silu_mul),
    ]


def check_names() -> list[str]:
    return [name for name, _, _ in _checks()]


def _compare(got: Any, want: Any) -> tuple[float, str]:
    """(the relative max error, or inf; what is wrong with the shape, or "")."""
    import numpy as np

    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return float("inf"), f"shape {got.shape}, expected {want.shape}"
    if got.size == 0:
        return 0.0, ""
    diff = np.abs(got.astype(np.float64) - want)
    if not np.all(np.isfinite(diff)):
        return float("inf"), "non-finite values"
    scale = max(1.0, float(np.abs(want).max()))
    return float(diff.max()) / scale, ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


async def run_checks(
    backend_name: str,
    device: str,
    emit: Callable[[dict[str, Any]], None] | None = None,
    *,
    seed: int = 0,
) -> list[CheckResult]:
    """Open ``backend_name`` on ``device`` (public API: :func:`accelkit.create_backend`), run
    every check against NumPy, shut it down; ``emit`` receives the protocol events. An error in
    initialize or shutdown is a failed check of that name; a failed check does not stop the
    others."""
    import numpy as np

    import accelkit

    def send(event: dict[str, Any]) -> None:
        if emit is not None:
            emit(event)

    checks = _checks()
    results: list[CheckResult] = []

    def record(result: CheckResult) -> None:
        results.append(result)
        send({"event": "check", **asdict(result)})

    plan = [INITIALIZE, PREPARE, *[n for n, _, _ in checks], SHUTDOWN]
    send({"event": "plan", "checks": plan})
    send({"event": "start", "check": INITIALIZE})
    t0 = time.perf_counter()
    try:
        backend = accelkit.create_backend(backend_name)
        await backend.initialize(device)
    except Exception as exc:
        record(CheckResult(INITIALIZE, "error", _first_line(exc), None, time.perf_counter() - t0))
        return results
    record(CheckResult(INITIALIZE, "ok", f"{backend.name} {backend.version}", None, 0.0))
    try:
        await _prepare(backend, send, record)
        rng = np.random.default_rng(seed)
        for name, group, fn in checks:
            if group is not None and group not in backend.kernel_ops.ops:
                record(CheckResult(name, "skipped", f"the backend has no fused {group}"))
                continue
            send({"event": "start", "check": name})
            t0 = time.perf_counter()
            try:
                got, want = await fn(backend, rng)
            except Exception as exc:
                record(CheckResult(name, "error", _first_line(exc), None, time.perf_counter() - t0))
                continue
            seconds = time.perf_counter() - t0
            err, problem = _compare(got, want)
            if problem or err > TOLERANCE:
                detail = problem or f"max error {err:.2e} (tolerance {TOLERANCE:.0e})"
                record(CheckResult(name, "wrong", detail, err, seconds))
            else:
                record(CheckResult(name, "ok", "", err, seconds))
    finally:
        send({"event": "start", "check": SHUTDOWN})
        t0 = time.perf_counter()
        try:
            await backend.shutdown()
        except Exception as exc:
            record(CheckResult(SHUTDOWN, "error", _first_line(exc), None, time.perf_counter() - t0))
        else:
            record(CheckResult(SHUTDOWN, "ok", "", None, time.perf_counter() - t0))
    return results


async def _prepare(
    backend: ComputeBackend,
    send: Callable[[dict[str, Any]], None],
    record: Callable[[CheckResult], None],
) -> None:
    """Await ``backend.prepare`` (:meth:`~accelkit.abc.ComputeBackend.prepare`), relaying its
    progress lines as events. What it could not prepare is no fault of the backend (the CPU
    backend's NumPy code runs where a JIT kernel is left out): the step is then ``limited``,
    with the note it returned; otherwise ``ok``, with its last progress line."""
    send({"event": "start", "check": PREPARE})
    t0 = time.perf_counter()
    lines: list[str] = []

    def progress(line: str) -> None:  # called from the loop's thread or a worker thread
        lines.append(line)
        send({"event": "progress", "check": PREPARE, "line": line})

    try:
        note = await backend.prepare(progress)
    except Exception as exc:
        record(CheckResult(PREPARE, "error", _first_line(exc), None, time.perf_counter() - t0))
        return
    seconds = time.perf_counter() - t0
    if note:
        record(CheckResult(PREPARE, "limited", note, None, seconds))
    else:
        record(CheckResult(PREPARE, "ok", lines[-1] if lines else "", None, seconds))


def _child_emit(device: str, events: bool) -> Callable[[dict[str, Any]], None]:
    total = len(_checks()) + 3
    index = {"n": 0}

    def emit(event: dict[str, Any]) -> None:
        if events:
            sys.stdout.write(MARKER + json.dumps(event) + "\n")
            sys.stdout.flush()
        kind = event["event"]
        if kind == "start":
            index["n"] += 1
            line = f"[{index['n']}/{total}] {event['check']} ..."
        elif kind == "progress":
            line = f"[{index['n']}/{total}] {event['check']}: {event['line']}"
        elif kind == "check":
            if event["status"] == "skipped":
                index["n"] += 1
            err = event.get("max_error")
            detail = event["detail"] or (f"max error {err:.1e}" if err is not None else "")
            line = f"[{index['n']}/{total}] {event['name']}: {event['status']}" + (
                f" ({detail}, {event['seconds']:.2f} s)"
                if detail
                else f" ({event['seconds']:.2f} s)"
            )
        else:
            return
        sys.stderr.write(f"accelkit selftest: {device}: {line}\n")
        sys.stderr.flush()

    return emit


def main(argv: Sequence[str] | None = None) -> int:
    """The child: run the checks, print the events; exit 0 when every check passed, else 1."""
    parser = argparse.ArgumentParser(
        prog="python -m accelkit._core.selftest",
        description="Self-test one accelkit backend on one device against NumPy.",
    )
    parser.add_argument("--backend", required=True, help="a backend name, e.g. cpu, opencl")
    parser.add_argument("--device", required=True, help="a device, e.g. opencl:0")
    parser.add_argument("--loop", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument(
        "--events",
        action="store_true",
        help=f"print one '{MARKER.strip()} {{json}}' line per event",
    )
    args = parser.parse_args(argv)

    import anyio

    emit = _child_emit(args.device, args.events)
    results = anyio.run(run_checks, args.backend, args.device, emit, backend=args.loop)
    emit({"event": "done"})
    ok = all(r.status in ("ok", "limited", "skipped") for r in results)
    if not args.events:
        failed = [
            f"{r.name}: {r.status} ({r.detail})" for r in results if r.status in ("error", "wrong")
        ]
        print(
            f"{args.backend} on {args.device}: " + ("ok" if ok else "broken: " + "; ".join(failed))
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
