"""What isolation costs: the CPU backend in a worker process (``open_backend("cpu",
isolate=True)``) against the same backend in-process, timed interleaved in one process.

Run with ``python benchmarks/bench_isolation.py [--quick] [--json PATH]``. Figures:

- host time per small op: a 64x64 f32 ``x + 1.0`` through TensorOps, N submissions in a row
  (the caller's time to submit them; the work itself runs in the worker meanwhile), and N
  submissions plus the await of the last (throughput). Target: isolated at most 2x in-process;
- a 256 MiB ``to_host`` against a plain shared-memory copy: the same bytes copied once into a
  fresh shared-memory segment in this process, without a second process (the least a transfer
  through shared memory costs). Target: ``to_host`` at 50 % of that speed or better;
- a 256 MiB upload (``from_host``), against the same copy;
- the round trip of one small op (submit, await, read back 16 KiB);
- the CPU time that the user's process and the worker spend per chained small op and per
  round trip (Linux: the worker's from ``/proc/PID/stat``): steadier than wall time on a
  machine that other jobs load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import accelkit as ak

# isort: split
import anyio
import numpy as np

from accelkit._core.isolation.proto import Segment


def _proc_cpu(pid: int) -> float:
    """A process's CPU time (user and system) in seconds, from ``/proc``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[-1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _timed(fn: Callable[[], Awaitable[float]], reps: int) -> float:
    return statistics.median([await fn() for _ in range(reps)])


async def main(quick: bool) -> dict[str, Any]:
    n_ops = 500 if quick else 2000
    reps = 3 if quick else 7
    big = 256 << 20
    results: dict[str, Any] = {}
    async with (
        ak.open_backend("cpu") as local,
        ak.open_backend("cpu", isolate=True) as iso,
    ):
        backends = {"in-process": local, "isolated": iso}
        xs = {
            k: b.tensor_factory.from_host(np.ones((64, 64), np.float32))
            for k, b in backends.items()
        }

        def submit(name: str) -> Callable[[], Awaitable[float]]:
            async def run() -> float:
                x = xs[name]
                t0 = time.perf_counter()
                for _ in range(n_ops):
                    y = x + 1.0
                dt = time.perf_counter() - t0
                await y.to_host()
                return dt / n_ops * 1e6

            return run

        def through(name: str) -> Callable[[], Awaitable[float]]:
            async def run() -> float:
                x = xs[name]
                t0 = time.perf_counter()
                for _ in range(n_ops):
                    y = x + 1.0
                await y.to_host()
                return (time.perf_counter() - t0) / n_ops * 1e6

            return run

        def roundtrip(name: str) -> Callable[[], Awaitable[float]]:
            async def run() -> float:
                x = xs[name]
                t0 = time.perf_counter()
                for _ in range(50):
                    await (x + 1.0).to_host()
                return (time.perf_counter() - t0) / 50 * 1e6

            return run

        for label, make in (
            ("submit_us", submit),
            ("submit_and_complete_us", through),
            ("roundtrip_us", roundtrip),
        ):
            got: dict[str, list[float]] = {k: [] for k in backends}
            for _ in range(reps):  # interleaved
                for k in backends:
                    got[k].append(await make(k)())
            med = {k: statistics.median(v) for k, v in got.items()}
            results[label] = {**med, "ratio": med["isolated"] / med["in-process"]}

        pid = getattr(iso, "worker_pid", None)
        if pid is not None and sys.platform == "linux":
            x = xs["isolated"]
            cpu: dict[str, float] = {}
            for label, n, chain in (("chain", 4000, 500), ("roundtrip", 1000, 1)):
                u0, w0 = time.process_time(), _proc_cpu(pid)
                for _ in range(n // chain):
                    for _ in range(chain):
                        y = x + 1.0
                    await y.to_host()
                cpu[f"{label}_user_us"] = (time.process_time() - u0) / n * 1e6
                cpu[f"{label}_worker_us"] = (_proc_cpu(pid) - w0) / n * 1e6
            results["cpu_per_op"] = cpu

        host = np.random.default_rng(0).standard_normal(big // 4).astype(np.float32)
        tb = iso.tensor_factory.from_host(host)
        await tb.to_host()

        async def shm_copy() -> float:
            t0 = time.perf_counter()
            seg = Segment(big)
            np.copyto(seg.array(), host.view(np.uint8))
            dt = time.perf_counter() - t0
            seg.unlink()
            return dt

        async def to_host() -> float:
            t0 = time.perf_counter()
            out = await tb.to_host()
            dt = time.perf_counter() - t0
            assert out.shape == host.shape
            return dt

        async def from_host() -> float:
            t0 = time.perf_counter()
            t = iso.tensor_factory.from_host(host)
            await iso.synchronize()
            dt = time.perf_counter() - t0
            del t
            return dt

        times: dict[str, list[float]] = {"shm_copy": [], "to_host": [], "from_host": []}
        for _ in range(reps):
            for k, fn in (("shm_copy", shm_copy), ("to_host", to_host), ("from_host", from_host)):
                times[k].append(await fn())
        med = {k: statistics.median(v) for k, v in times.items()}
        gib = big / 2**30
        results["transfer_256MiB"] = {
            "shm_copy_GiB_s": gib / med["shm_copy"],
            "to_host_GiB_s": gib / med["to_host"],
            "from_host_GiB_s": gib / med["from_host"],
            "to_host_vs_shm_copy": med["shm_copy"] / med["to_host"],
            "from_host_vs_shm_copy": med["shm_copy"] / med["from_host"],
        }
        np.testing.assert_array_equal(await tb.to_host(), host)
    return results


def report(results: dict[str, Any]) -> None:
    for label in ("submit_us", "submit_and_complete_us", "roundtrip_us"):
        r = results[label]
        print(
            f"{label:24s} in-process {r['in-process']:8.2f} us  isolated {r['isolated']:8.2f} us"
            f"  ratio {r['ratio']:.2f}x"
        )
    c = results.get("cpu_per_op")
    if c:
        print(
            f"CPU per chained op: your process {c['chain_user_us']:.1f} us, worker"
            f" {c['chain_worker_us']:.1f} us; per round trip: {c['roundtrip_user_us']:.0f} us,"
            f" {c['roundtrip_worker_us']:.0f} us"
        )
    t = results["transfer_256MiB"]
    print(
        f"256 MiB: plain shared-memory copy {t['shm_copy_GiB_s']:.2f} GiB/s, to_host"
        f" {t['to_host_GiB_s']:.2f} GiB/s ({t['to_host_vs_shm_copy']:.0%} of it), from_host"
        f" {t['from_host_GiB_s']:.2f} GiB/s ({t['from_host_vs_shm_copy']:.0%})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    res = anyio.run(main, args.quick)
    report(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
