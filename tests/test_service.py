"""A real async web service on accelkit keeps its event loop responsive under load.

The service (``tests/service_app.py``: Starlette, one backend opened in the lifespan) runs under a
real uvicorn server in its own process, with cold compiler caches; a real HTTP client (httpx,
under asyncio and under trio) keeps 16 ``POST /mlp`` requests in flight while probing
``GET /health`` every 20 ms. Every answer must be right (checked against float64 NumPy), and
the server's event loop must never stall for long: its lag is measured inside the server by a
heartbeat task that sleeps 5 ms and records how late it wakes.

It runs on every installed backend that finds a device (cpu, opencl, cuda, webgpu, dask), and
skips the others with the reason.

Timing bounds: this suite asserts no speed, because machines are noisy, but a loop that stalls is
the behaviour under test here. By default only a stall of 2 s or more fails (a kernel built on
the loop's thread, say) and the p99 lag is reported; only with ``ACCELKIT_STRICT_TIMING=1`` is
the service-level target asserted: p99 lag under 10 ms (25 ms for the in-process CPU backend,
which shares the GIL and the cores with the loop: docs/backends/cpu.md). The measured figures are always printed (``pytest -s``) and recorded as properties
(``--junitxml``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import service_app
from accelkit._core.env import env_flag
from service_app import (
    ServerDied,
    ServiceServer,
    drive,
    format_stall_sites,
    numpy_reference,
    server_lag,
)

REQUESTS = 32
CONCURRENCY = 16
# No new request after this; in-flight ones get REQUEST_TIMEOUT_S more. Generous: on a loaded
# 2-core machine, OpenCL on PoCL compiles every kernel of the cold service on the CPU (62 s seen).
TIME_LIMIT_S = 150.0
REQUEST_TIMEOUT_S = 90.0

STRICT_P99_MS = 10.0
#: The in-process CPU backend's p99 under this load: it computes on the server's own process,
#: sharing the GIL (the 5 ms switch interval) and the cores (BLAS's threads) with the loop, so it
#: promises this, not 10 ms (docs/backends/cpu.md); ``isolate=True`` ("isolated:cpu") does.
IN_PROCESS_CPU_P99_MS = 25.0
LOOSE_MAX_MS = 2000.0
#: The stall bound for a device that computes on the host's own cores (see below).
HOST_DEVICE_MAX_MS = 10000.0


#: Every backend the service runs on where it is installed and finds a device.
BACKENDS = ["cpu", "opencl", "cuda", "webgpu", "dask", "isolated:cpu", "isolated:cuda"]


def _unavailable(name: str) -> str | None:
    """Why backend ``name`` cannot serve here (not installed, no device), or None when it can."""
    from accelkit.registry import default_registry

    name = name.removeprefix("isolated:")  # the isolated form: a worker process
    if name not in default_registry.names():
        return f"accelkit-{name} is not installed"
    try:
        found = default_registry.probe(name)
    except Exception as exc:
        return f"its probe failed: {exc}"
    if not found:
        return default_registry.unavailable_reason(name) or "no device found"
    if name == "webgpu" and all(_software(d) for d in found):
        # llvmpipe runs every shader on the CPU cores the test's load competes for; the loop
        # stall it showed there (3.7 s, CI) is a WebGPU-on-llvmpipe figure, measured by
        # plugins/accelkit-webgpu's own tests, not the service's. On a GPU adapter it runs.
        return "only a software adapter (it runs shaders on the CPU)"
    return None


def _on_host_cores(name: str) -> bool:
    """Whether backend ``name``'s devices here are the host's CPU under another API (OpenCL on
    PoCL, a software WebGPU adapter), as their probe says."""
    if name.removeprefix("isolated:") == "cpu":
        return False
    from accelkit.registry import default_registry

    # An isolated backend's devices are its inner backend's (the registry knows no
    # "isolated:" names: probing one raised BackendNotFoundError on the H100 run of 2026-11-27).
    found = default_registry.probe(name.removeprefix("isolated:"))
    return bool(found) and all(
        _software(d)
        or "CPU" in str(getattr(getattr(d, "capabilities", None), "extra", {}).get("device_type"))
        for d in found
    )


def _software(device: object) -> bool:
    caps = getattr(device, "capabilities", None)
    return bool(getattr(caps, "extra", {}).get("software", False))


@pytest.fixture(params=BACKENDS)
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServiceServer]:
    """The service on one backend, in a fresh uvicorn process with empty compiler caches; the
    process is stopped (and killed if it must be) whatever the test does."""
    name = str(request.param)
    reason = _unavailable(name)
    if reason is not None:
        pytest.skip(f"{name}: {reason}")
    caches = tmp_path / "caches"
    env = {
        var: str(caches / sub)
        for var, sub in (
            ("ACCELKIT_CACHE_DIR", "accelkit"),
            ("ACCELKIT_OPENCL_CACHE", "accelkit-opencl"),
            ("ACCELKIT_CUDA_CACHE", "accelkit-cuda"),
            ("POCL_CACHE_DIR", "pocl"),
            ("PYOPENCL_CACHE_DIR", "pyopencl"),
        )
    }
    # ready_timeout: the lifespan runs backend.prepare() (cold caches: the CPU JIT's compile and
    # check, OpenCL's kernel variants verified in child processes, 76 s on 2 loaded cores)
    server = ServiceServer(name, env=env, ready_timeout=300.0)
    try:  # the finally also covers a failure inside start()
        try:
            server.start()
        except (ServerDied, TimeoutError) as exc:
            pytest.fail(f"the {name} service did not start: {exc}", pytrace=False)
        yield server
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.anyio
async def test_service_answers_right_and_keeps_loop_responsive(
    service: ServiceServer, record_property: Callable[[str, object], None]
) -> None:
    result = await drive(
        service.base_url,
        requests=REQUESTS,
        concurrency=CONCURRENCY,
        time_limit=TIME_LIMIT_S,
        request_timeout=REQUEST_TIMEOUT_S,
    )
    if result.errors:  # perhaps the server died: give its exit a moment to be seen
        for _ in range(40):  # 2 s at most
            if service.describe_exit() is not None:
                break
            await anyio.sleep(0.05)
    died = service.describe_exit()
    lag: dict[str, Any] = {}
    if died is None:
        try:
            lag = await server_lag(service.base_url)
        except Exception as exc:  # the server died right now, or hangs
            died = service.describe_exit() or f"GET /lag failed: {exc!r}"
    health = result.health_stats()

    def fmt(stats: dict[str, float]) -> str:
        keys = ("p50_ms", "p99_ms", "max_ms")
        return " ".join(f"{k[:-3]}={stats[k]:.1f}ms" for k in keys if k in stats) or "none"

    summary = (
        f"[{service.backend_name}] {len(result.responses)}/{REQUESTS} /mlp answered in"
        f" {result.wall_s:.1f} s (startup {lag.get('startup_s') or float('nan'):.1f} s);"
        f" server loop lag ({lag.get('count', 0)} beats): {fmt(lag)};"
        f" client-side /health ({health['count']} probes): {fmt(health)}"
    )
    if result.health_errors:
        summary += f"; {len(result.health_errors)} /health errors: {result.health_errors[:3]}"
    if lag:  # where the loop waited (the server's stall sampler), in every report
        summary += "\n" + format_stall_sites(lag.get("stall_sites"))
    print(summary)
    record_property("service_summary", summary)
    for key in ("p50_ms", "p99_ms", "max_ms"):
        if key in lag:
            record_property(f"server_lag_{key}", round(lag[key], 3))
        if key in health:
            record_property(f"health_{key}", round(health[key], 3))

    assert died is None, f"{died}\n{summary}"
    assert not result.errors, f"/mlp transport errors: {result.errors[:5]}\n{summary}"
    assert not result.timed_out, f"the load did not finish in {TIME_LIMIT_S:.0f} s\n{summary}"
    assert len(result.responses) == REQUESTS, summary

    bad = [(seed, status, body) for seed, status, body in result.responses if status != 200]
    assert not bad, f"/mlp failed: {str(bad[:3])[:2000]}\n{summary}"
    weights = service_app.make_weights()
    for seed, _status, body in sorted(result.responses, key=lambda r: r[0]):
        ref = numpy_reference(seed, weights)
        for key in ("expected_col", "row_max"):
            np.testing.assert_allclose(
                body[key], ref[key], rtol=1e-3, atol=1e-6, err_msg=f"seed {seed}: {key}"
            )
    assert lag.get("count", 0) > 0, f"the heartbeat recorded nothing\n{summary}"
    if env_flag("ACCELKIT_STRICT_TIMING"):
        target = IN_PROCESS_CPU_P99_MS if service.backend_name == "cpu" else STRICT_P99_MS
        assert lag["p99_ms"] < target, f"server loop p99 lag >= {target} ms\n{summary}"
    elif lag["p99_ms"] >= STRICT_P99_MS:
        # Reported, not asserted: shared CI cores make the p99 noisy (ACCELKIT_STRICT_TIMING=1
        # asserts it where the machine is quiet enough to mean something).
        print(
            f"note: server loop p99 lag {lag['p99_ms']:.1f} ms is over the {STRICT_P99_MS} ms target"
        )
    # A stall of seconds (a kernel built or a device waited for on the loop's thread) is a
    # failure on any machine. A device that computes on the host's own cores (OpenCL on PoCL)
    # shares them with the load, PoCL's worker threads and, in `nox -s tests`, the other parts:
    # there a 6 s stall was seen on 2 loaded cores (cause not found: PoCL's builds and first
    # launches release the GIL, 7-99 ms measured), so its bound is 10 s, which a service that
    # built its dozens of kernels on the loop's thread, seconds each, would still cross.
    bound = HOST_DEVICE_MAX_MS if _on_host_cores(service.backend_name) else LOOSE_MAX_MS
    if lag["max_ms"] >= LOOSE_MAX_MS:
        print(f"note: server loop stalled {lag['max_ms']:.0f} ms once")
    assert lag["max_ms"] < bound, f"server loop stalled >= {bound} ms\n{summary}"
    assert not result.health_errors, f"/health failed: {result.health_errors[:5]}\n{summary}"
    assert health["count"] > 0, summary
