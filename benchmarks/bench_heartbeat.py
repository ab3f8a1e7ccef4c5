"""How late does the event loop wake while the CPU backend runs 4096x4096 matmuls?

A 1 ms heartbeat runs on the loop while three matmuls run on the backend's worker (and
OpenBLAS's threads); prints the worst and 99th-percentile lateness of each of three rounds, and of
a fourth round as long with the loop idle (on a shared VM the host's scheduling alone makes an
idle loop late by several ms now and then).
The loop's thread runs with the short time slice ``initialize`` asks for (docs/execution-model.md);
``ACCELKIT_LOOP_SLICE_US=0`` measures without it. ``--policy idle`` also puts every thread but the
loop's under Linux's SCHED_IDLE policy, the experiment behind issue 11's note (the loop then wakes
within about 1 ms, at the price of starving that compute whenever anything else wants the CPU).

    [ACCELKIT_LOOP_SLICE_US=0] python benchmarks/bench_heartbeat.py [--policy normal|idle]
        [--loop asyncio|trio]
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import anyio
import numpy as np

import accelkit as ak


async def main(policy: str) -> None:
    async with ak.open_backend("cpu") as backend:
        f, ops = backend.tensor_factory, backend.tensor_ops
        a = f.from_host(np.random.default_rng(0).standard_normal((4096, 4096)).astype(np.float32))
        ops.matmul(a, a)
        await backend.synchronize()  # the BLAS threads exist from here
        if policy == "idle":
            loop_thread = threading.get_native_id()
            for tid in map(int, os.listdir("/proc/self/task")):
                if tid != loop_thread:
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        rounds = []
        seconds = 0.0
        for work in ("matmuls",) * 3 + ("idle",):
            late: list[float] = []
            done = anyio.Event()

            async def beat(late: list[float] = late, done: anyio.Event = done) -> None:
                while not done.is_set():
                    t0 = time.perf_counter()
                    await anyio.sleep(0.001)
                    late.append(1e3 * (time.perf_counter() - t0 - 0.001))

            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                tg.start_soon(beat)
                await anyio.sleep(0.01)
                if work == "idle":  # the same loop with nothing running: the machine's own cost
                    await anyio.sleep(seconds)
                else:
                    for _ in range(3):
                        ops.matmul(a, a)
                    await backend.synchronize()
                await anyio.sleep(0.01)
                done.set()
            seconds = time.perf_counter() - t0
            rounds.append(
                f"{work}: worst {max(late):.2f} ms, p99 {np.percentile(late, 99):.2f} ms,"
                f" {sum(x > 1.5 for x in late)}/{len(late)} beats over 1.5 ms ({seconds:.2f} s)"
            )
        print(f"policy {policy}, loop thread {backend.loop_thread_scheduling}:")
        for line in rounds:
            print("  " + line)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", choices=("normal", "idle"), default="normal")
    parser.add_argument("--loop", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args()
    anyio.run(main, args.policy, backend=args.loop)
