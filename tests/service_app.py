"""An example async web service on accelkit, and the tools to serve it and put it under load.

Used by ``tests/test_service.py`` and ``benchmarks/bench_service.py``. Three parts:

- ``create_app(backend_name)``: a Starlette app whose lifespan opens one accelkit backend (the
  name from the argument or ``$ACCELKIT_SERVICE_BACKEND``, default ``cpu``), uploads the weights
  of a small MLP once, and runs a heartbeat task that measures the event loop's lag (it sleeps
  5 ms and records how late it wakes). Routes: ``POST /mlp`` (JSON ``{"seed": N}``) runs
  matmul, gelu, matmul, layer_norm and softmax on a [64, 512] input made from ``seed`` and
  answers two per-row checksums; ``GET /health`` answers at once; ``GET /lag`` answers the
  heartbeat's p50/p99/max lateness in ms (``?reset=1`` starts a new window).
  Serve it with ``python -m uvicorn service_app:create_app --factory --app-dir tests``.
- ``ServiceServer``: runs that app under a real uvicorn server in a subprocess (its own event
  loop, as in production) on 127.0.0.1, waits until it answers, and kills it on exit.
- ``drive(...)``: the client side, under asyncio or trio (httpx through anyio): keeps N ``/mlp``
  requests in flight while probing ``/health`` every 20 ms, bounded in count and time.

The inputs come from NumPy's generator with fixed seeds, not from accelkit's, so that the
client can compute the expected checksums with NumPy alone (``numpy_reference``).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import numpy as np

ROWS, DIM, HIDDEN = 64, 512, 1024
BANK_ROWS = 4099  # prime: the seeds' row picks differ
EPS = 1e-5
HEARTBEAT_S = 0.005
BACKEND_ENV = "ACCELKIT_SERVICE_BACKEND"
APP_DIR = Path(__file__).resolve().parent

# ------------------------------------------------------------------------------------- the model


def make_weights() -> dict[str, np.ndarray]:
    """The MLP's parameters (float32), the same in every process."""
    rng = np.random.default_rng(20240611)
    f32 = np.float32
    return {
        "w1": (rng.standard_normal((DIM, HIDDEN)) / math.sqrt(DIM)).astype(f32),
        "w2": (rng.standard_normal((HIDDEN, DIM)) / math.sqrt(HIDDEN)).astype(f32),
        "gamma": (1.0 + 0.1 * rng.standard_normal(DIM)).astype(f32),
        "beta": (0.1 * rng.standard_normal(DIM)).astype(f32),
    }


@functools.cache
def _input_bank() -> np.ndarray:
    return np.random.default_rng(20240612).standard_normal((BANK_ROWS, DIM)).astype(np.float32)


def make_input(seed: int) -> np.ndarray:
    """The request's input: ROWS rows of a bank of normal draws made once, picked and scaled by
    the seed (about 30 us; a request's own payload, not work of the app's). Drawing 32K normals
    a request instead (0.5-0.8 ms of NumPy holding the GIL) was the stall sampler's top site on
    every backend of the H100 run of 2026-11-27, in the loop or, moved to a worker thread, in
    the GIL's hand-offs: a measure of the app, where this test measures the backend."""
    rows = (np.arange(ROWS) * 7 + seed * 13) % BANK_ROWS
    return _input_bank()[rows] * np.float32(1.0 + (seed % 7) / 10)


# Each row of the softmax output sums to 1, so its plain sum says nothing: the checksums are the
# row's "expected column" (positive weights in [0, 1), no cancellation) and the row's maximum.
_COLUMN_WEIGHTS = np.arange(DIM, dtype=np.float64) / DIM


def checksums(probs: np.ndarray) -> dict[str, list[float]]:
    p = np.asarray(probs, dtype=np.float64)
    return {"expected_col": (p @ _COLUMN_WEIGHTS).tolist(), "row_max": p.max(axis=1).tolist()}


def numpy_reference(seed: int, weights: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
    """The same chain as ``POST /mlp``, in float64 NumPy."""
    from scipy.special import erf  # type: ignore[import-untyped]

    w = {k: v.astype(np.float64) for k, v in (weights or make_weights()).items()}
    x = make_input(seed).astype(np.float64)
    h = x @ w["w1"]
    h = 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)))
    h = h @ w["w2"]
    mu = h.mean(axis=-1, keepdims=True)
    var = h.var(axis=-1, keepdims=True)
    h = (h - mu) / np.sqrt(var + EPS) * w["gamma"] + w["beta"]
    h = np.exp(h - h.max(axis=-1, keepdims=True))
    return checksums(h / h.sum(axis=-1, keepdims=True))


# ----------------------------------------------------------------------------------- the server


#: A heartbeat later than this (ms) has the stall sampler look at what every thread is doing.
STALL_SAMPLE_MS = 3.0
#: How often (ms) the sampler looks again while the heartbeat stays late.
STALL_RESAMPLE_MS = 2.0

# Innermost frames that mean "this thread waits" (a pool worker on its queue, a selector, a lock):
# such a thread holds no GIL and is left out of the other threads' sites.
_IDLE_FUNCS = frozenset(
    {"wait", "get", "select", "poll", "_worker", "acquire", "sleep", "_wait_for_tstate_lock",
     "epoll", "run_forever", "_run_once", "accept", "recv", "read", "readinto", "join"}
)  # fmt: skip


def _site(frame: Any, depth: int = 3) -> str:
    """The ``depth`` innermost frames of a stack, innermost first: ``file:line func < ...``; an
    import in progress shows as ``import NAME`` in place of the import machinery's frames."""
    parts: list[str] = []
    importing: str | None = None
    while frame is not None and len(parts) < depth:
        code = frame.f_code
        if code.co_filename.startswith("<frozen importlib"):
            if code.co_name == "_find_and_load":
                importing = str(frame.f_locals.get("name", "?"))
        else:
            if importing is not None:
                parts.append(f"import {importing}")
                importing = None
            parts.append(f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return " < ".join(parts[:depth])


class StallSampler:
    """A watchdog thread: when the heartbeat is more than ``STALL_SAMPLE_MS`` late, it samples the
    loop thread's stack and the other busy threads' (``sys._current_frames``), every
    ``STALL_RESAMPLE_MS`` while the beat stays late, and counts the sites.

    The loop thread's site says what kept the loop busy (a kernel built on it, a long call), or,
    when it sits in the selector, that it was ready but waited for the GIL: then the other
    threads' sites (a backend's worker in a long call that holds the GIL) say who held it. The
    watchdog itself needs the GIL to sample, so a sample is taken when the holder lets go: it
    shows where the holder was at the switch. A thread blocked in a C call (a pipe read, a wait
    the idle list does not know) shows the Python line that made the call, as does one that
    holds the GIL in a long C call: the sites say where, not who held the lock. Off with
    ``ACCELKIT_SERVICE_SAMPLER=0``."""

    def __init__(self) -> None:
        self.loop_sites: collections.Counter[str] = collections.Counter()
        self.other_sites: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self.stalls = 0
        self._due = math.inf  # perf_counter time when the pending beat is due
        self._beat = 0  # the pending beat's number
        self._loop_ident = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False

    def start(self) -> None:
        self._loop_ident = threading.get_ident()
        self._thread = threading.Thread(target=self._run, name="stall-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()

    def beat_pending(self, due: float) -> None:
        """The heartbeat sleeps until ``due``."""
        with self._cond:
            self._beat += 1
            self._due = due
            self._cond.notify()

    def beat_done(self) -> None:
        self._due = math.inf

    def _run(self) -> None:
        late_s = STALL_SAMPLE_MS / 1e3
        again_s = STALL_RESAMPLE_MS / 1e3
        me = threading.get_ident()
        with self._cond:
            while not self._stop:
                due, beat = self._due, self._beat
                if due == math.inf:
                    self._cond.wait()
                    continue
                wait = due + late_s - time.perf_counter()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                counted = False
                while not self._stop and self._beat == beat and self._due != math.inf:
                    if not counted:
                        self.stalls += 1
                        counted = True
                    self._sample(me)
                    self._cond.wait(again_s)
                while (
                    not self._stop and self._beat == beat
                ):  # the late beat came: wait for the next
                    self._cond.wait()

    def _sample(self, me: int) -> None:
        frames = sys._current_frames()
        self.samples += 1
        loop = frames.get(self._loop_ident)
        if loop is not None:
            self.loop_sites[_site(loop)] += 1
        for ident, frame in frames.items():
            if ident in (me, self._loop_ident) or frame.f_code.co_name in _IDLE_FUNCS:
                continue
            name = next((t.name for t in threading.enumerate() if t.ident == ident), "?")
            self.other_sites[f"[{name}] {_site(frame)}"] += 1

    def report(self, top: int = 5) -> dict[str, Any]:
        return {
            "stalls": self.stalls,
            "samples": self.samples,
            "loop": self.loop_sites.most_common(top),
            "others": self.other_sites.most_common(top),
        }

    def reset(self) -> None:
        self.loop_sites.clear()
        self.other_sites.clear()
        self.samples = self.stalls = 0


class LagMeter:
    """Lateness of a task that sleeps ``HEARTBEAT_S`` in a loop: how long the event loop was busy
    with something else when the timer was due. With a ``StallSampler``, a late beat also says
    where the loop waited."""

    def __init__(self, sampler: StallSampler | None = None) -> None:
        self.samples: collections.deque[float] = collections.deque(maxlen=200_000)
        self.since = time.perf_counter()
        self.sampler = sampler

    async def run(self) -> None:
        sampler = self.sampler
        if sampler is not None:
            sampler.start()
        try:
            while True:
                t0 = time.perf_counter()
                if sampler is not None:
                    sampler.beat_pending(t0 + HEARTBEAT_S)
                await anyio.sleep(HEARTBEAT_S)
                t1 = time.perf_counter()
                if sampler is not None:
                    sampler.beat_done()
                self.samples.append(max(0.0, t1 - t0 - HEARTBEAT_S))
        finally:
            if sampler is not None:
                sampler.stop()

    def stats(self, reset: bool = False) -> dict[str, Any]:
        data = np.asarray(self.samples, dtype=np.float64) * 1e3
        now = time.perf_counter()
        out: dict[str, Any] = {"count": int(data.size), "window_s": now - self.since}
        if data.size:
            out.update(
                p50_ms=float(np.percentile(data, 50)),
                p99_ms=float(np.percentile(data, 99)),
                max_ms=float(data.max()),
            )
        if self.sampler is not None:
            out["stall_sites"] = self.sampler.report()
        if reset:
            self.samples.clear()
            self.since = now
            if self.sampler is not None:
                self.sampler.reset()
        return out


def create_app(backend_name: str | None = None) -> Any:
    """The Starlette app (see the module docstring); ``uvicorn --factory`` calls this."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    import accelkit

    name = backend_name or os.environ.get(BACKEND_ENV) or "cpu"
    state: dict[str, Any] = {}
    sampler = None if os.environ.get("ACCELKIT_SERVICE_SAMPLER", "1") == "0" else StallSampler()
    meter = LagMeter(sampler)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        t0 = time.perf_counter()
        # "isolated:cpu": the backend in a worker process (docs/isolation.md).
        isolate = name.startswith("isolated:")
        async with accelkit.open_backend(
            name.removeprefix("isolated:"), isolate=isolate
        ) as backend:
            factory = backend.tensor_factory
            state["backend"] = backend
            state["weights"] = {k: factory.from_host(v) for k, v in make_weights().items()}
            # The one-time work (imports, JIT compiles) now, off the loop, not in the first
            # requests: what a latency-sensitive service does (docs/execution-model.md).
            await backend.prepare()
            await backend.synchronize()
            # np.percentile (the meter's stats) imports numpy.ma on its first call: 1-2 ms of
            # the loop's time, sampled in the first requests of an H100 run (2026-11-27).
            np.percentile(np.zeros(1), 99)
            make_input(0)  # the input bank, made once
            state["startup_s"] = time.perf_counter() - t0
            async with anyio.create_task_group() as tg:
                tg.start_soon(meter.run)
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
            state.clear()

    async def mlp(request: Request) -> JSONResponse:
        body = await request.json()
        seed = int(body["seed"])
        backend = state["backend"]
        ops, w = backend.tensor_ops, state["weights"]
        x = backend.tensor_factory.from_host(make_input(seed))
        h = ops.gelu(ops.matmul(x, w["w1"]))
        h = ops.layer_norm(ops.matmul(h, w["w2"]), w["gamma"], w["beta"], eps=EPS)
        probs = await ops.softmax(h, axis=-1).to_host()
        return JSONResponse({"seed": seed, "backend": backend.name, **checksums(probs)})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    async def lag(request: Request) -> JSONResponse:
        reset = request.query_params.get("reset", "0") not in ("0", "", "false", "no")
        out: dict[str, Any] = dict(meter.stats(reset=reset))
        out["backend"] = name
        out["startup_s"] = state.get("startup_s")
        return JSONResponse(out)

    return Starlette(
        routes=[
            Route("/mlp", mlp, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/lag", lag, methods=["GET"]),
        ],
        lifespan=lifespan,
    )


# ------------------------------------------------------------------------- serving in a process


class ServerDied(RuntimeError):
    """The server process exited; the message has its exit code and the tail of its stderr."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServiceServer:
    """``create_app`` under ``python -m uvicorn`` in a subprocess on 127.0.0.1.

    ``with ServiceServer("cpu") as server:`` starts it and waits (at most ``ready_timeout``
    seconds) until ``/health`` answers; leaving the block stops it (SIGTERM, then SIGKILL). Its
    stderr goes to a file: ``describe_exit()`` tells how it ended and shows the tail."""

    def __init__(
        self,
        backend_name: str,
        *,
        env: Mapping[str, str] | None = None,
        ready_timeout: float = 120.0,
    ) -> None:
        self.backend_name = backend_name
        self.extra_env = dict(env or {})
        self.ready_timeout = ready_timeout
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_dir = tempfile.TemporaryDirectory(prefix="accelkit-service-")
        self.stderr_path = Path(self._log_dir.name) / "server.stderr"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServiceServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        for attempt in range(3):  # a port taken between probing and binding: try another
            self.port = _free_port()
            env = {**os.environ, **self.extra_env, BACKEND_ENV: self.backend_name}
            env["PYTHONUNBUFFERED"] = "1"
            argv = [
                sys.executable, "-m", "uvicorn", "service_app:create_app", "--factory",
                "--app-dir", str(APP_DIR), "--host", "127.0.0.1", "--port", str(self.port),
                "--log-level", "warning", "--no-access-log", "--lifespan", "on",
            ]  # fmt: skip
            with open(self.stderr_path, "wb") as err:
                self.proc = subprocess.Popen(
                    argv, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err
                )
            try:
                self._wait_ready()
                return
            except ServerDied:
                if attempt < 2 and "address already in use" in self.stderr_tail().lower():
                    continue
                raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        with httpx.Client(base_url=self.base_url, timeout=2.0) as client:
            while time.monotonic() < deadline:
                self.check_alive("while starting")
                try:
                    if client.get("/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        self.check_alive("while starting")
        raise TimeoutError(
            f"the {self.backend_name} service did not answer /health within"
            f" {self.ready_timeout:.0f} s\n{self.stderr_tail()}"
        )

    def stderr_tail(self, chars: int = 4000) -> str:
        try:
            text = self.stderr_path.read_bytes().decode("utf-8", "replace")
        except OSError:
            return "(no stderr)"
        return ("stderr tail:\n" + text[-chars:]) if text.strip() else "(stderr empty)"

    def describe_exit(self) -> str | None:
        """None while the server runs, else its exit code (or signal) and its stderr tail."""
        if self.proc is None or self.proc.poll() is None:
            return None
        rc = self.proc.returncode
        how = f"exit code {rc}"
        if rc < 0:
            with contextlib.suppress(ValueError):
                how += f" (killed by {signal.Signals(-rc).name})"
        return f"the {self.backend_name} server process died: {how}\n{self.stderr_tail()}"

    def check_alive(self, when: str = "") -> None:
        died = self.describe_exit()
        if died is not None:
            raise ServerDied(f"{died}\n({when})" if when else died)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if proc is not None:
            self.proc = proc  # keep the exit code for describe_exit()
        # the log folder lives as long as this object, so a report can still read the tail


# ---------------------------------------------------------------------------------- the client


@dataclass
class ScenarioResult:
    """What ``drive`` saw: every ``/mlp`` answer (or error), the health latencies, and whether the
    run was cut short by its time limit."""

    responses: list[tuple[int, int, Any]] = field(default_factory=list)  # seed, status, json
    errors: list[str] = field(default_factory=list)
    request_s: list[float] = field(default_factory=list)
    health_ms: list[float] = field(default_factory=list)
    health_errors: list[str] = field(default_factory=list)
    timed_out: bool = False
    wall_s: float = 0.0

    def health_stats(self) -> dict[str, float | int]:
        data = np.asarray(self.health_ms, dtype=np.float64)
        if not data.size:
            return {"count": 0}
        return {
            "count": int(data.size),
            "p50_ms": float(np.percentile(data, 50)),
            "p99_ms": float(np.percentile(data, 99)),
            "max_ms": float(data.max()),
        }


async def drive(
    base_url: str,
    *,
    requests: int = 64,
    concurrency: int = 16,
    health_interval: float = 0.02,
    time_limit: float = 60.0,
    request_timeout: float = 120.0,
    health_timeout: float = 10.0,
    first_seed: int = 0,
) -> ScenarioResult:
    """Keep ``concurrency`` ``POST /mlp`` requests in flight until ``requests`` were sent or
    ``time_limit`` seconds passed, probing ``GET /health`` every ``health_interval`` seconds
    meanwhile (on its own connection, so it never queues behind the load). Runs under asyncio
    or trio. Requests already in flight when the time limit passes get ``request_timeout``
    more seconds at most; nothing waits longer than ``time_limit + request_timeout``. A probe
    unanswered after ``health_timeout`` seconds is reported in ``health_errors`` and counted
    in ``health_ms`` with the time it waited (a lower bound of the stall)."""
    result = ScenarioResult()
    next_seed = first_seed
    end_seed = first_seed + requests
    done = anyio.Event()
    t_start = time.perf_counter()
    stop_issuing_at = t_start + time_limit

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal next_seed
        while next_seed < end_seed and time.perf_counter() < stop_issuing_at:
            seed, next_seed = next_seed, next_seed + 1
            t0 = time.perf_counter()
            try:
                resp = await client.post("/mlp", json={"seed": seed})
            except httpx.HTTPError as exc:
                result.errors.append(f"seed {seed}: {type(exc).__name__}: {exc}")
                if isinstance(exc, httpx.TransportError):
                    return  # the server is gone or overwhelmed: stop this worker
                continue
            result.request_s.append(time.perf_counter() - t0)
            body: Any = None
            with contextlib.suppress(ValueError):
                body = resp.json()
            result.responses.append(
                (seed, resp.status_code, body if body is not None else resp.text)
            )

    async def prober(client: httpx.AsyncClient) -> None:
        tick = time.perf_counter()
        failures = 0
        while not done.is_set():
            t0 = time.perf_counter()
            try:
                resp = await client.get("/health")
                if resp.status_code == 200:
                    result.health_ms.append(1e3 * (time.perf_counter() - t0))
                else:
                    result.health_errors.append(f"status {resp.status_code}")
            except httpx.TimeoutException:
                # the loop did not answer in health_timeout: a stall, counted as one (its real
                # length is at least this) and reported; the probing goes on
                waited = time.perf_counter() - t0
                result.health_ms.append(1e3 * waited)
                result.health_errors.append(f"/health got no answer in {waited:.1f} s")
            except httpx.HTTPError as exc:
                failures += 1
                result.health_errors.append(f"{type(exc).__name__}: {exc}")
                if failures >= 5:  # the server is gone
                    return
            tick += health_interval
            delay = tick - time.perf_counter()
            if delay < 0:  # late (the probe itself took longer): do not burst to catch up
                tick = time.perf_counter()
                delay = 0
            with anyio.move_on_after(delay):
                await done.wait()

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(request_timeout, connect=10.0)
    probe_timeout = httpx.Timeout(health_timeout, connect=health_timeout)
    async with (
        httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits) as load,
        httpx.AsyncClient(base_url=base_url, timeout=probe_timeout) as probe,
    ):
        with anyio.move_on_after(time_limit + request_timeout) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(prober, probe)
                async with anyio.create_task_group() as workers:
                    for _ in range(concurrency):
                        workers.start_soon(worker, load)
                done.set()
        result.timed_out = scope.cancelled_caught or (
            next_seed < end_seed and time.perf_counter() >= stop_issuing_at
        )
    result.wall_s = time.perf_counter() - t_start
    return result


def format_stall_sites(sites: Mapping[str, Any] | None) -> str:
    """The ``stall_sites`` of ``GET /lag`` as text: where the loop thread was, and what the other
    busy threads did, while the heartbeat was late (most-sampled first)."""
    if not sites:
        return "stall sites: (no sampler)"
    lines = [
        f"stall sites: {sites['stalls']} late beats (> {STALL_SAMPLE_MS:g} ms),"
        f" {sites['samples']} samples"
    ]
    for title, key in (("loop thread", "loop"), ("other busy threads", "others")):
        rows = sites.get(key) or []
        if rows:
            lines.append(f"  {title}:")
            lines.extend(f"    {count:4d} x {site}" for site, count in rows)
    return "\n".join(lines)


async def server_lag(base_url: str, *, reset: bool = False) -> dict[str, Any]:
    """The server loop's lag (``GET /lag``), in ms."""
    async with httpx.AsyncClient(base_url=base_url, timeout=30.0) as client:
        resp = await client.get("/lag", params={"reset": "1" if reset else "0"})
        resp.raise_for_status()
        out: dict[str, Any] = resp.json()
        return out
