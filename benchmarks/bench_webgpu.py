"""WebGPU backend benchmarks on its first adapter, as ratios against NumPy in the same process.

Run with ``python benchmarks/bench_webgpu.py`` where accelkit-webgpu is installed (wgpu-py finds
Mesa's llvmpipe through OpenGL on a machine without a GPU: a software adapter, for correctness
and regressions, not speed). Figures (issue 13's targets on llvmpipe in brackets):

- f32 GEMM 1024x1024x1024 throughput vs NumPy's ``@`` [>= 15 %];
- causal attention B4 H8 S256 D64 vs a NumPy softmax(QK^T)V;
- a 4M-element f32 add vs NumPy's [<= 3x NumPy's time];
- the transformer block of the core benchmark, end to end on the adapter, vs plain NumPy;
- the event loop's worst lateness (a 1 ms heartbeat) while those kernels run [<= 5 ms].

An op the backend does not run yet is reported as such, not timed.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio
import numpy as np

import accelkit as ak
from accelkit.cli.bench import interleaved
from accelkit.errors import AccelError
from accelkit.workloads import (
    BlockConfig,
    block_weights,
    transformer_block,
    transformer_block_numpy,
    upload_weights,
)


class Heartbeat:
    """A 1 ms sleeper on the event loop recording how late it wakes while accelkit's work runs
    (``active``); the NumPy peers run on the loop's thread and block it by design, so their
    turns are not counted."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.running = True
        self.active = False
        self.turn = 0  # counts starts and ends of the subject's turns

    async def run(self) -> None:
        while self.running:
            turn, was_active = self.turn, self.active
            t0 = time.perf_counter()
            await anyio.sleep(0.001)
            # only sleeps that began and ended inside one turn of accelkit's work count
            if was_active and self.active and turn == self.turn:
                self.worst = max(self.worst, time.perf_counter() - t0 - 0.001)

    def wrap(self, subject: Callable[[], Awaitable[object]]) -> Callable[[], Awaitable[None]]:
        async def measured() -> None:
            self.turn += 1
            self.active = True
            try:
                await subject()
            finally:
                self.active = False
                self.turn += 1

        return measured


def attention_numpy(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    n = s.shape[-1]
    s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v  # type: ignore[no-any-return]


async def timed(
    name: str,
    subject: Callable[[], Awaitable[object]],
    peer: Callable[[], object],
    rounds: int,
    beat: Heartbeat,
) -> tuple[float, float] | None:
    subject = beat.wrap(subject)
    try:
        await subject()
    except AccelError as exc:
        print(f"      {name}: not run on this backend yet ({type(exc).__name__}: {exc})")
        return None
    return await interleaved(subject, peer, rounds)


async def main() -> None:
    async with ak.open_backend("webgpu") as backend:
        f, ops = backend.tensor_factory, backend.tensor_ops
        caps = backend.capabilities
        kind = "software" if caps.extra.get("software") else "hardware"
        print(f"device: {backend.device} ({caps.extra.get('description')}, {kind},"
              f" {caps.extra.get('backend_type')})")  # fmt: skip
        rng = np.random.default_rng(0)
        beat = Heartbeat()
        async with anyio.create_task_group() as tg:
            tg.start_soon(beat.run)

            print("[1/4] f32 GEMM 1024 ...", flush=True)
            n = 1024
            a_h = rng.standard_normal((n, n)).astype(np.float32)
            a = f.from_host(a_h)

            async def gemm() -> None:
                ops.matmul(a, a)
                await backend.synchronize()

            r = await timed("GEMM", gemm, lambda: a_h @ a_h, 3, beat)
            if r:
                t, t_np = r
                print(f"      accelkit-webgpu {2 * n**3 / t / 1e9:.2f} GFLOP/s, NumPy"
                      f" {2 * n**3 / t_np / 1e9:.1f} GFLOP/s: {t_np / t:.1%} of NumPy"
                      " (target >= 15 %)")  # fmt: skip

            print("[2/4] causal attention B4 H8 S256 D64 ...", flush=True)
            q_h = rng.standard_normal((4, 8, 256, 64)).astype(np.float32)
            q = f.from_host(q_h)

            async def attn() -> None:
                ops.attention(q, q, q, causal=True)
                await backend.synchronize()

            r = await timed("attention", attn, lambda: attention_numpy(q_h, q_h, q_h), 3, beat)
            if r:
                t, t_np = r
                print(f"      accelkit-webgpu {1e3 * t:.1f} ms, NumPy {1e3 * t_np:.1f} ms:"
                      f" {t / t_np:.2f}x NumPy's time")  # fmt: skip

            print("[3/4] f32 add, 4M elements ...", flush=True)
            x_h = rng.standard_normal(1 << 22).astype(np.float32)
            x = f.from_host(x_h)

            async def add() -> None:
                ops.add(x, x)
                await backend.synchronize()

            r = await timed("add", add, lambda: x_h + x_h, 7, beat)
            if r:
                t, t_np = r
                print(f"      accelkit-webgpu {1e3 * t:.2f} ms, NumPy {1e3 * t_np:.2f} ms:"
                      f" {t / t_np:.2f}x NumPy's time (target <= 3x)")  # fmt: skip

            print("[4/4] transformer block end to end ...", flush=True)
            cfg = BlockConfig()
            x_h3 = rng.standard_normal((cfg.batch, cfg.seq, cfg.width)).astype(np.float32)
            w_h = block_weights(cfg)
            w = upload_weights(backend, w_h)
            xb = f.from_host(x_h3)

            async def block() -> None:
                await transformer_block(backend, xb, w, cfg).to_host()

            r = await timed(
                "block", block, lambda: transformer_block_numpy(x_h3, w_h, cfg), 2, beat
            )
            if r:
                t, t_np = r
                got = await transformer_block(backend, xb, w, cfg).to_host()
                want = transformer_block_numpy(x_h3, w_h, cfg)
                err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
                print(f"      accelkit-webgpu {1e3 * t:.0f} ms, plain NumPy {1e3 * t_np:.0f} ms"
                      f" ({t / t_np:.2f}x NumPy's time); max relative error {err:.1e}")  # fmt: skip
            beat.running = False
        print(f"event loop: worst heartbeat lateness {1e3 * beat.worst:.2f} ms while the kernels"
              " ran (target <= 5 ms)")  # fmt: skip


if __name__ == "__main__":
    anyio.run(main)
