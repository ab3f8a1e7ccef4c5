"""Event-loop responsiveness of an async web service on accelkit, cold caches and warm.

The scenario of ``tests/test_service.py``, outside pytest and with more load: the example service
(``tests/service_app.py``: Starlette, one backend opened in the lifespan) runs under a real uvicorn
server in its own process; an httpx client keeps 16 ``POST /mlp`` requests in flight (matmul
[64, 512] x [512, 1024], gelu, matmul back, layer_norm, softmax) while probing ``GET /health``
every 20 ms. Two phases on the same server: *cold* (the first requests after start, with empty
compiler caches unless ``--cache-dir`` names a folder to reuse) and *warm* (the next ones).

For each phase it prints the server loop's lag (measured inside the server by a heartbeat task
that sleeps 5 ms and records how late it wakes: the figure that matters), the /health latency
seen by the client (which also includes the client's own scheduling on a busy machine), the
request latency and the throughput. Target (the issue): server-side p99 lag under 10 ms.

Run (in an environment with accelkit, uvicorn, starlette and httpx installed)::

    python benchmarks/bench_service.py                      # cpu backend
    python benchmarks/bench_service.py --backend opencl     # needs accelkit-opencl and a device
    python benchmarks/bench_service.py --backend opencl --requests 128 --loop trio --json out.json
    python benchmarks/bench_service.py --backend opencl --cache-dir /tmp/ak-caches  # reuse caches

``--check`` also verifies every answer against float64 NumPy. Exit status 1 when the server
dies (its exit code and stderr tail are printed) or a request fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from service_app import (
    ScenarioResult,
    ServerDied,
    ServiceServer,
    drive,
    make_weights,
    numpy_reference,
    server_lag,
)

CACHE_VARS = (
    ("ACCELKIT_CACHE_DIR", "accelkit"),
    ("ACCELKIT_OPENCL_CACHE", "accelkit-opencl"),
    ("ACCELKIT_CUDA_CACHE", "accelkit-cuda"),
    ("POCL_CACHE_DIR", "pocl"),
    ("PYOPENCL_CACHE_DIR", "pyopencl"),
)


def _stats(values: list[float], scale: float = 1.0) -> dict[str, float]:
    data = np.asarray(values, dtype=np.float64) * scale
    if not data.size:
        return {}
    return {
        "p50_ms": float(np.percentile(data, 50)),
        "p99_ms": float(np.percentile(data, 99)),
        "max_ms": float(data.max()),
    }


def _fmt(stats: dict[str, Any]) -> str:
    keys = ("p50_ms", "p99_ms", "max_ms")
    if not all(k in stats for k in keys):
        return "n/a"
    return "  ".join(f"{k[:-3]} {stats[k]:8.1f} ms" for k in keys)


def _check(result: ScenarioResult) -> list[str]:
    weights, problems = make_weights(), []
    for seed, status, body in result.responses:
        if status != 200:
            problems.append(f"seed {seed}: HTTP {status}: {str(body)[:300]}")
            continue
        ref = numpy_reference(seed, weights)
        for key in ("expected_col", "row_max"):
            if not np.allclose(body[key], ref[key], rtol=1e-3, atol=1e-6):
                problems.append(f"seed {seed}: {key} differs from NumPy")
    return problems


async def run(args: argparse.Namespace, server: ServiceServer) -> tuple[dict[str, Any], bool]:
    report: dict[str, Any] = {"backend": args.backend, "loop": args.loop, "phases": {}}
    startup = await server_lag(server.base_url, reset=True)  # drop the beats from before phase 1
    report["startup_s"] = startup.get("startup_s")
    print(f"backend {args.backend}: server up, lifespan startup {startup['startup_s']:.2f} s")
    ok = True
    seed = 0
    for phase in ("cold", "warm"):
        result = await drive(
            server.base_url,
            requests=args.requests,
            concurrency=args.concurrency,
            health_interval=args.health_interval,
            time_limit=args.time_limit,
            first_seed=seed,
        )
        seed += args.requests
        died = server.describe_exit()
        lag: dict[str, Any] = {}
        if not died:
            try:
                lag = await server_lag(server.base_url, reset=True)
            except Exception as exc:  # died just now, or hangs
                died = server.describe_exit() or f"GET /lag failed: {exc!r}"
        answered = sum(1 for _s, status, _b in result.responses if status == 200)
        entry = {
            "requests": args.requests,
            "answered_200": answered,
            "wall_s": result.wall_s,
            "throughput_rps": answered / result.wall_s if result.wall_s else 0.0,
            "server_lag": lag,
            "health": result.health_stats(),
            "request_latency": _stats(result.request_s, 1e3),
            "errors": result.errors[:5] + result.health_errors[:5],
            "timed_out": result.timed_out,
        }
        if args.check and not died:
            entry["check_problems"] = _check(result)[:5]
        report["phases"][phase] = entry
        print(
            f"\n[{phase}] {answered}/{args.requests} answered in {result.wall_s:.2f} s"
            f" ({entry['throughput_rps']:.1f} req/s), {args.concurrency} in flight"
            f"{'  (TIME LIMIT REACHED)' if result.timed_out else ''}"
        )
        print(f"  server loop lag ({lag.get('count', 0):5d} beats)   {_fmt(lag)}")
        print(
            f"  client /health  ({entry['health'].get('count', 0):5d} probes)  {_fmt(entry['health'])}"
        )
        print(
            f"  /mlp latency    ({len(result.request_s):5d} requests) {_fmt(entry['request_latency'])}"
        )
        for err in entry["errors"]:
            print(f"  error: {err}")
        for problem in entry.get("check_problems", []):
            print(f"  wrong answer: {problem}")
        if died:
            print(f"\n{died}")
            report["server_died"] = died
            return report, False
        ok = ok and answered == args.requests and not entry.get("check_problems")
    return report, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="cpu", help="accelkit backend name (default cpu)")
    parser.add_argument("--requests", type=int, default=256, help="requests per phase (256)")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight (16)")
    parser.add_argument("--health-interval", type=float, default=0.02, help="seconds (0.02)")
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per phase")
    parser.add_argument("--loop", choices=("asyncio", "trio"), default="asyncio", help="client")
    parser.add_argument("--cache-dir", help="compiler caches to use (default: a fresh one)")
    parser.add_argument("--check", action="store_true", help="verify answers against NumPy")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="accelkit-bench-caches-") as fresh:
        caches = Path(args.cache_dir or fresh)
        env = {var: str(caches / sub) for var, sub in CACHE_VARS}
        print(f"compiler caches: {caches}{'' if args.cache_dir else ' (fresh: cold start)'}")
        try:
            with ServiceServer(args.backend, env=env) as server:
                report, ok = anyio.run(run, args, server, backend=args.loop)
        except (ServerDied, TimeoutError) as exc:
            print(f"the server did not start: {exc}", file=sys.stderr)
            return 1
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
