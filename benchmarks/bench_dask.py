"""Dask backend benchmarks on a local cluster of two worker processes, as ratios against NumPy in
the same process. Run with ``python benchmarks/bench_dask.py`` where accelkit-dask is installed
(``--quick`` for smaller sizes). Figures (issue 14's targets in brackets):

- f32 GEMM 8192 (64 MiB chunks: 2x2 blocks per matrix) vs NumPy's ``@`` on this process;
- a batch of 64 sequences through the core benchmark's transformer block, vs plain NumPy,
  with the number of tasks per op;
- per-op overhead of a small op (a 64x64 add): alone (submit and read back, one round trip
  through the scheduler) and in a chain of 200 read once [<= 5 ms];
- the event loop's worst lateness (a 1 ms heartbeat) while those run [<= 5 ms], beside what
  it is made of: the worst lateness of the same heartbeat in a separate, idle process over the
  same turns (the operating system's own, with the workers keeping the cores busy) and the
  longest pause of Python's garbage collector in this process;
- on paper, from dask's own task graphs built here: tasks and data moved per op at 2, 8 and
  64 workers.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import time
from typing import Any

import anyio
import numpy as np
from accelkit_dask.backend import DaskBackend
from accelkit_dask.cluster import LocalSize, system_memory

from accelkit.cli.bench import interleaved
from accelkit.workloads import (
    BlockConfig,
    block_weights,
    transformer_block,
    transformer_block_numpy,
    upload_weights,
)
from bench_webgpu import Heartbeat  # the same 1 ms heartbeat, beside this script

#: A 1 ms sleeper for a separate process: it prints (monotonic time, lateness) for each late
#: wake until its stdin closes (CLOCK_MONOTONIC is shared by the processes of a machine).
SLEEPER = """
import sys, threading, time
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
while not done.is_set():
    t0 = time.monotonic()
    time.sleep(0.001)
    late = time.monotonic() - t0 - 0.001
    if late > 0.0005:
        print(f"{time.monotonic()} {late}", flush=False)
"""


class AttributedHeartbeat(Heartbeat):
    """The heartbeat, per phase of the benchmark, beside what its lateness is made of: the same
    sleeper in a separate idle process over the same turns of accelkit's work (lateness that
    process shared came from the operating system: a busy core, a stalled virtual CPU) and the
    longest garbage-collector pause of this process inside them."""

    def __init__(self) -> None:
        self._active = False
        self.turns: list[list[float]] = []
        #: per phase: name, first turn, the loop's worst lateness, the longest GC pause
        self.phases: list[list[Any]] = []
        self._gc_start = 0.0
        super().__init__()
        gc.callbacks.append(self._gc)
        self._peer = subprocess.Popen(
            [sys.executable, "-c", SLEEPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip

    def phase(self, name: str) -> None:
        """Turns from now on belong to ``name``."""
        self._close_phase()
        self.phases.append([name, len(self.turns), 0.0, 0.0])
        self.worst = 0.0

    def _close_phase(self) -> None:
        if self.phases:
            self.phases[-1][2] = max(self.phases[-1][2], self.worst)

    @property
    def active(self) -> bool:
        return self._active

    @active.setter
    def active(self, value: bool) -> None:
        if value and not self._active:
            self.turns.append([time.monotonic(), float("inf")])
        elif self._active and not value:
            self.turns[-1][1] = time.monotonic()
        self._active = value

    def _gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif self._active and self.phases:
            self.phases[-1][3] = max(self.phases[-1][3], time.perf_counter() - self._gc_start)

    def report(self) -> list[str]:
        """Per phase: the loop's worst lateness, the idle process's, the longest GC pause
        (stops the separate process)."""
        self._close_phase()
        out, _ = self._peer.communicate("")
        gc.callbacks.remove(self._gc)
        late = [tuple(map(float, line.split())) for line in out.splitlines()]
        bounds = [p[1] for p in self.phases] + [len(self.turns)]
        rows = []
        for i, (name, _, loop, pause) in enumerate(self.phases):
            turns = self.turns[bounds[i] : bounds[i + 1]]
            floor = max(
                (d for t, d in late if any(a <= t - d and t <= b for a, b in turns)), default=0.0
            )
            rows.append(
                f"{name:<28} event loop {loop * 1e3:6.1f} ms   idle process {floor * 1e3:6.1f} ms"
                f"   GC pause {pause * 1e3:5.1f} ms"
            )
        return rows


def scaling_table(n: int, itemsize: int = 4) -> list[str]:
    """Tasks and data moved for a GEMM n and a sum over n x n, with chunks that give every
    worker a block, counted from dask's own graphs (built, never run)."""
    import dask.array as da

    rows = ["workers  chunk      GEMM tasks  GEMM data moved   sum tasks  sum data moved"]
    for workers in (2, 8, 64):
        side = 1
        while side * side < workers:
            side *= 2
        c = max(1, n // side)
        a = da.zeros((n, n), chunks=(c, c), dtype=np.float32)
        gemm = da.blockwise(np.matmul, "ik", a, "ij", a, "jk", dtype=np.float32, concatenate=True)
        s = a.sum()
        g_tasks = len(dict(gemm.__dask_graph__())) - a.npartitions
        s_tasks = len(dict(s.__dask_graph__())) - a.npartitions
        blocks_out = gemm.npartitions
        panel = n * c * itemsize
        moved = blocks_out * 2 * panel  # each output block reads a row and a column panel
        s_moved = (s_tasks - a.npartitions) * 8  # partial sums only
        rows.append(
            f"{workers:7d}  {c:5d}^2  {g_tasks:11d}  {moved / 2**30:12.1f} GiB  {s_tasks:10d}"
            f"  {max(s_moved, 0) / 1024:10.1f} KiB"
        )
    return rows


async def main(quick: bool) -> None:
    size = LocalSize(2, 1, int(system_memory() * 0.7) // 2)
    backend = DaskBackend(local_size=size)
    print(f"cluster: local, {size.workers} worker processes x {size.threads_per_worker} thread"
          f" ({os.cpu_count()} cores here)", flush=True)  # fmt: skip
    t0 = time.perf_counter()
    await backend.initialize("dask:0")
    print(f"      started in {time.perf_counter() - t0:.1f} s", flush=True)
    f, ops = backend.tensor_factory, backend.tensor_ops
    rng = np.random.default_rng(0)
    beat = AttributedHeartbeat()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(beat.run)

            n = 2048 if quick else 8192
            print(f"[1/4] f32 GEMM {n} ...", flush=True)
            beat.phase(f"GEMM {n}")
            a_h = rng.standard_normal((n, n), dtype=np.float32)
            b_h = rng.standard_normal((n, n), dtype=np.float32)
            t0 = time.perf_counter()
            a, b = f.from_host(a_h), f.from_host(b_h)
            await backend.synchronize()
            print(f"      upload of two {a_h.nbytes >> 20} MiB matrices: "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)  # fmt: skip
            holder: list[object] = []

            async def gemm() -> None:
                holder[:] = [ops.matmul(a, b)]
                await backend.synchronize()  # computed on the cluster, left there

            t, t_np = await interleaved(beat.wrap(gemm), lambda: a_h @ b_h, 2 if quick else 1)
            fl = 2 * n**3
            print(f"      accelkit-dask {fl / t / 1e9:.1f} GFLOP/s, NumPy {fl / t_np / 1e9:.1f}"
                  f" GFLOP/s: {t_np / t:.2f}x NumPy's throughput", flush=True)  # fmt: skip
            t0 = time.perf_counter()
            await holder[0].to_host()  # type: ignore[attr-defined]
            print(f"      reading the {n}x{n} result back: {time.perf_counter() - t0:.2f} s")
            holder.clear()

            cfg = BlockConfig(batch=64, seq=64 if quick else 128, width=256, heads=4)
            print(f"[2/4] transformer block, batch {cfg.batch} x seq {cfg.seq} x width"
                  f" {cfg.width} ...", flush=True)  # fmt: skip
            beat.phase("transformer block")
            w_h = block_weights(cfg)
            x_h = rng.standard_normal((cfg.batch, cfg.seq, cfg.width), dtype=np.float32)
            w = upload_weights(backend, w_h)
            x = f.from_host(x_h)
            backend.chunk_bytes = 1 << 20  # a block per few sequences: work for both workers

            async def block() -> None:
                await transformer_block(backend, x, w, cfg).to_host()

            t, t_np = await interleaved(
                beat.wrap(block), lambda: transformer_block_numpy(x_h, w_h, cfg), 3
            )
            tok = cfg.batch * cfg.seq
            print(f"      accelkit-dask {tok / t:,.0f} tokens/s, NumPy {tok / t_np:,.0f}"
                  f" tokens/s: {t_np / t:.2f}x NumPy's throughput", flush=True)  # fmt: skip
            backend.chunk_bytes = 64 << 20

            print("[3/4] per-op overhead of a small op (64x64 f32 add) ...", flush=True)
            beat.phase("small ops, alone")
            s_h = rng.standard_normal((64, 64), dtype=np.float32)
            s = f.from_host(s_h)
            await s.to_host()
            lone = []
            for _ in range(30):
                beat.turn += 1
                beat.active = True
                t0 = time.perf_counter()
                await ops.add(s, 1.0).to_host()
                lone.append(time.perf_counter() - t0)
                beat.active = False
                beat.turn += 1
            beat.phase("small ops, chained")
            beat.active = True
            beat.turn += 1
            t0 = time.perf_counter()
            y = s
            for _ in range(200):
                y = ops.add(y, 1.0)
            got = await y.to_host()
            chain = (time.perf_counter() - t0) / 200
            beat.active = False
            beat.turn += 1
            assert np.allclose(got, s_h + 200)
            t0 = time.perf_counter()
            for _ in range(1000):
                s_h + 1.0
            numpy_add = (time.perf_counter() - t0) / 1000
            client = backend.graphs.client  # type: ignore[attr-defined]

            def distributed_alone() -> list[float]:
                # the peer: the same add through distributed's own client, submit + result
                times = []
                for _ in range(30):
                    t0 = time.perf_counter()
                    client.submit(np.add, s_h, 1.0, pure=False).result()
                    times.append(time.perf_counter() - t0)
                return times

            peer = await anyio.to_thread.run_sync(distributed_alone)
            print(f"      alone (submit + read back): median {np.median(lone) * 1e3:.1f} ms;"
                  f" distributed's own client.submit + result of the same add: median"
                  f" {np.median(peer) * 1e3:.1f} ms ({np.median(lone) / np.median(peer):.2f}x);"
                  f" NumPy's add {numpy_add * 1e6:.1f} us")  # fmt: skip
            print(f"      in a chain of 200, read once: {chain * 1e3:.2f} ms per op (target <= 5)")

            print("[4/4] event loop lateness and scaling on paper ...", flush=True)
            beat.running = False
            print("      worst lateness of a 1 ms heartbeat while accelkit ran [<= 5 ms], beside"
                  " the same sleeper's in an idle separate process over the same turns, and the"
                  " longest garbage-collector pause here:")  # fmt: skip
            for line in beat.report():
                print("      " + line)
            for line in scaling_table(8192):
                print("      " + line)
    finally:
        await backend.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    anyio.run(main, parser.parse_args().quick)
