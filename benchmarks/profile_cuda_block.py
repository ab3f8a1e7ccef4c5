"""Where the CUDA transformer block's time goes, on a GPU: a diagnosis for issue 29, not a figure.

``benchmarks/bench_cuda.py`` says *how* slow the eager block is against PyTorch (0.17x on an
H100, 2026-11-27) and that its submission thread was busy for 2.8 ms of a 3.8 ms step while the
GPU had 0.8 ms of work (the captured replay). This script says *where*:

1. each op's closures on the submission thread, in the block's order: the median time the
   thread spent in them (``us busy``), labelled with the TensorOps method that submitted them;
   then (1b) the same with the closures held behind a gate until the caller has submitted them
   all: what a closure costs when the caller's Python is not competing for the GIL;
2. cProfile inside those closures (enabled and disabled on the submission thread around each
   one), the functions with the most own time and the most cumulative time a step;
3. every kernel the device ran (PyTorch's profiler over CUPTI, which sees CuPy's, NVRTC's and
   cuBLAS's kernels as well as its own): per step, for accelkit eager, accelkit's captured
   graph and PyTorch eager, the kernels by device time, their count and sum;
4. a BF16 and an F16 GEMM at 4096 against PyTorch, device time by CUDA events;
5. the block's causal f32 attention on the register-tiled kernel (head-major, and
   sequence-major as the block now calls it), the warp-per-row kernel and
   the cuBLAS route: device time, how long 20 calls take to submit and to finish, the error
   against float64 NumPy (and the engine each ran on);
6. a paged decode step (``bench_cuda_attention.py``'s: 16 sequences x 4096 tokens, 32/8 heads,
   head dim 128, f16) and PyTorch's dense SDPA over the same keys: every kernel of each;
7. a causal f16 attention at the benchmark's shape (B8 H16 S4096 D128) on accelkit's route
   (cuDNN where it serves) and on PyTorch's SDPA held to cuDNN: every kernel of each (on
   2026-11-28 accelkit's took 1.142 ms of device time a call against 1.078 ms, with the same
   cuDNN 9.19: what runs beside the attention kernel, or which engine, is what this says).

Run with ``python benchmarks/profile_cuda_block.py`` where accelkit-cuda, CuPy and PyTorch
(CUDA) are installed (the GPU check's ``profile`` step); without them it says why and exits
with status 2. About 45 s.
"""

from __future__ import annotations

import cProfile
import math
import pstats
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np

from accelkit import Tensor
from accelkit.workloads import transformer_block

from bench_core import _torch_block  # isort: skip
from bench_cuda import block_inputs, on_cuda  # isort: skip
from bench_cuda_attention import device_ms, torch_device_ms  # isort: skip

STEPS = 20
TOP = 18


def _label() -> str:
    """The TensorOps method the block (accelkit.workloads) called that led to this submission,
    with the block's line."""
    f: Any = sys._getframe(2)
    prev = None
    while f is not None:
        if f.f_code.co_filename.endswith("workloads.py"):
            return f"{prev.f_code.co_name}@{f.f_lineno}" if prev is not None else "?"
        prev, f = f, f.f_back
    return "(outside the block)"


class ClosureProbe:
    """Wraps the submission thread's ``submit`` (as ``SubmissionThread.start_trace`` does):
    each closure is labelled at submission and timed where it runs, optionally under cProfile."""

    def __init__(self, thread: Any, profile: cProfile.Profile | None = None) -> None:
        self.thread = thread
        self.profile = profile
        self.rows: list[tuple[str, float]] = []

    def __enter__(self) -> ClosureProbe:
        plain = type(self.thread).submit
        rows, prof = self.rows, self.profile

        def submit(fn: Callable[[], None], owner: object = None) -> None:
            label = _label()

            def timed() -> None:
                t0 = time.perf_counter()
                if prof is not None:
                    prof.enable()
                try:
                    fn()
                finally:
                    if prof is not None:
                        prof.disable()
                    rows.append((label, time.perf_counter() - t0))

            plain(self.thread, timed, owner)

        self.thread.__dict__["submit"] = submit
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.__dict__.pop("submit", None)


def _kernel_table(prof: Any, steps: int) -> list[str]:
    """The device's kernels in ``prof`` (a torch.profiler run over ``steps`` steps), per step."""
    per: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        t = getattr(ev, "device_time", None)
        if t is None:
            t = getattr(ev, "cuda_time", 0.0)
        if not t:
            continue
        per[ev.name][0] += t
        per[ev.name][1] += 1
    total = sum(r[0] for r in per.values()) / steps
    count = sum(r[1] for r in per.values()) / steps
    lines = [f"{count:.0f} kernels a step, {total:.0f} us of device time a step"]
    for name, (t, n) in sorted(per.items(), key=lambda kv: -kv[1][0])[:TOP]:
        lines.append(f"  {t / steps:8.1f} us {n / steps:5.1f}x  {name[:110]}")
    return lines


async def _kernels_of(
    say: Callable[[str], None], runs: list[tuple[str, Callable[[], Any]]], steps: int
) -> None:
    """For each ``(name, run)``: one warm-up run, then ``steps`` runs under PyTorch's profiler
    (CUPTI) and their kernels per step (:func:`_kernel_table`)."""
    from torch.profiler import ProfilerActivity, profile

    for name, run in runs:
        say(f"  {name}:")
        await run()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(steps):
                await run()
        for line in _kernel_table(p, steps):
            say(f"    {line}")


def _closure_table(
    steps: list[list[tuple[str, float]]], say: Callable[[str], None], note: str
) -> None:
    """Each closure's median time over the steps (the last row of each step is its wall time,
    not a closure), and their sum."""
    n = min(len(s) for s in steps)
    busy = 0.0
    for i in range(n):
        label = steps[0][i][0]
        us = statistics.median(s[i][1] for s in steps) * 1e6
        busy += 0.0 if label.startswith("(") else us
        say(f"  {i:2d} {label:28s} {us:8.1f} us")
    say(f"  closures: {n - 1}, busy {busy:.0f} us a step{note}")


async def diagnose(
    backend: Any, torch: Any, steps: int = STEPS, gemm_n: int = 4096,
    decode_shape: tuple[int, int, int, int, int, int] = (16, 32, 8, 128, 4096, 16),
    attention_shape: tuple[int, int, int, int] = (8, 16, 4096, 128),
) -> list[str]:  # fmt: skip
    """Parts 1-7 of the module docstring on an open CUDA ``backend``; prints each line and
    returns them all. A part that fails says so and the next one runs."""
    out: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        out.append(line)

    f = backend.tensor_factory
    cfg, x_h, w_h, x, w = block_inputs(backend)
    for _ in range(3):
        await transformer_block(backend, x, w, cfg).to_host()

    async def closures(gated: bool) -> list[tuple[str, float]]:
        """One step's closures, labelled and timed; with ``gated``, held behind a gate on the
        submission thread until the caller has submitted them all. The last row: the step's
        wall time (from the gate's opening where gated)."""
        import threading

        gate = threading.Event()
        if gated:
            backend.thread.submit(gate.wait)  # the thread waits here, the GIL released
        probe = ClosureProbe(backend.thread)
        t0 = time.perf_counter()
        with probe:
            y = transformer_block(backend, x, w, cfg)
        if gated:
            t0 = time.perf_counter()
            gate.set()
        await y.to_host()
        return [
            *probe.rows,
            ("(gate to result)" if gated else "(step wall)", time.perf_counter() - t0),
        ]

    for part, gated, title, note in (
        ("1", False, f"the submission thread's closures, median of {steps} steps", ""),
        ("1b", True, "the same, the closures run after the caller is done (held behind a gate)",
         " (the caller idle)"),
    ):  # fmt: skip
        say(f"[{part}/7] {title}")
        try:
            _closure_table([await closures(gated) for _ in range(steps)], say, note)
        except Exception as exc:
            say(f"  not measured ({type(exc).__name__}: {exc})")

    # cProfile's times are wall times: a function the thread was in while another thread held
    # the GIL is charged with the wait (where the submission thread loses the GIL shows here).
    say("[2/7] cProfile inside the closures (all threads while one runs), us a step")
    try:
        prof = cProfile.Profile()
        probe = ClosureProbe(backend.thread, prof)
        for _ in range(steps):
            with probe:
                y = transformer_block(backend, x, w, cfg)
            await y.to_host()
        table: Any = pstats.Stats(prof).stats  # type: ignore[attr-defined]
        for col, what in ((2, "own"), (3, "cumulative")):
            say(f"  by {what} time:")
            rows = sorted(table.items(), key=lambda kv: -kv[1][col])[:TOP]
            for (file, line, name), (_cc, nc, tt, ct, _callers) in rows:
                where = f"{file.rsplit('/', 2)[-1]}:{line}" if line else file
                say(f"    own {tt / steps * 1e6:8.1f} cum {ct / steps * 1e6:8.1f}"
                    f" calls {nc / steps:6.1f}  {name} ({where})")  # fmt: skip
    except Exception as exc:
        say(f"  not measured ({type(exc).__name__}: {exc})")

    say("[3/7] the device's kernels (CUPTI through torch.profiler), per step")
    try:
        tw = {k: torch.from_numpy(v).cuda() for k, v in w_h.items()}
        tx = torch.from_numpy(x_h).cuda()
        async with backend.capture() as graph:
            y_cap = transformer_block(backend, x, w, cfg)
        graph.replay()
        await y_cap.to_host()

        async def ak_eager() -> None:
            transformer_block(backend, x, w, cfg)
            await backend.synchronize()

        async def ak_graph() -> None:
            graph.replay()
            await backend.synchronize()

        async def th_eager() -> None:
            with torch.inference_mode():
                _torch_block(torch, tx, tw, cfg)
            torch.cuda.synchronize()

        await _kernels_of(
            say, [("accelkit eager", ak_eager), ("accelkit graph", ak_graph),
                  ("torch eager", th_eager)], 10,
        )  # fmt: skip
    except Exception as exc:
        say(f"  not measured ({type(exc).__name__}: {exc})")

    say(f"[4/7] GEMM {gemm_n}, device time a GEMM (CUDA events)")
    ops = backend.tensor_ops
    rng = np.random.default_rng(0)
    a32 = (rng.standard_normal((gemm_n, gemm_n), dtype=np.float32) * 0.1).astype(np.float32)
    for name, tdt in (("bf16", torch.bfloat16), ("f16", torch.float16)):
        try:
            a = f.from_host(a32, dtype=name)
            ta = torch.from_numpy(a32).cuda().to(tdt)
            got = (await ops.matmul(a, a).to_host()).astype(np.float64)
            want = a32.astype(np.float64) @ a32.astype(np.float64)
            err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
            d_ak = d_th = math.inf
            for _ in range(3):  # alternated, the best of each: clocks ramp on an idle GPU
                d_ak = min(d_ak, await device_ms(backend, lambda a=a: ops.matmul(a, a), 10))
                d_th = min(d_th, torch_device_ms(lambda ta=ta: torch.matmul(ta, ta), 10))
            ratio = d_th / d_ak if d_ak else math.nan
            say(f"  {name}: accelkit {d_ak:.3f} ms, torch {d_th:.3f} ms: {ratio:.2f}x"
                f" torch; max error / max |a @ a| {err:.1e}")  # fmt: skip
        except Exception as exc:
            say(f"  {name}: not measured ({type(exc).__name__}: {exc})")

    say("[5/7] causal f32 attention at the block's shapes: the tiled kernel, the warp-per-row"
        " kernel, the cuBLAS route")  # fmt: skip
    b, h, sq, hd = cfg.batch, cfg.heads, cfg.seq, cfg.head_dim
    qh = rng.standard_normal((b, h, sq, hd)).astype(np.float32)
    q = f.from_host(qh)
    scores = qh.astype(np.float64) @ np.swapaxes(qh, -1, -2) / math.sqrt(hd)
    scores = np.where(np.tril(np.ones((sq, sq), bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ qh
    flash = backend._fused_kernels
    simt = backend.flash_simt
    say(f"  (the tiled kernel: {simt.describe() if simt is not None else 'absent'})")
    # The block's own call: [B, S, H, D] read in place (layout="bshd"), no permutes.
    qs = f.from_host(np.ascontiguousarray(qh.transpose(0, 2, 1, 3)))
    calls: dict[str, Callable[[], Tensor]] = {
        "tiled": lambda: ops.attention(q, q, q, causal=True),
        "tiled, sequence-major": lambda: ops.attention(qs, qs, qs, causal=True, layout="bshd"),
        "warp-per-row": lambda: ops.attention(q, q, q, causal=True),
        "cuBLAS": lambda: ops.attention(q, q, q, causal=True),
    }
    for route, call in calls.items():
        try:
            backend._fused_kernels = None if route == "cuBLAS" else flash
            if simt is not None:
                simt.enabled = route.startswith("tiled")
            got = await call().to_host()
            if "sequence-major" in route:
                got = got.transpose(0, 2, 1, 3)
            err = float(np.max(np.abs(got - want)))
            d = await device_ms(backend, call, 10)
            t0 = time.perf_counter()
            for _ in range(20):
                call()
            t1 = time.perf_counter()
            await backend.synchronize()
            t2 = time.perf_counter()
            engine = backend.attention_engines.last_route
            route = f"{route} ({engine.engine if engine and route != 'cuBLAS' else 'composed'})"
            say(f"  {route}: device {d * 1e3:.1f} us a call; 20 calls submitted in"
                f" {(t1 - t0) * 1e3:.2f} ms, done in {(t2 - t0) * 1e3:.2f} ms; max abs error"
                f" {err:.1e}")  # fmt: skip
        except Exception as exc:
            say(f"  {route}: not measured ({type(exc).__name__}: {exc})")
        finally:
            backend._fused_kernels = flash
            if simt is not None:
                simt.enabled = True

    say(f"[6/7] a paged decode step ({decode_shape[0]} seqs x {decode_shape[4]} tokens,"
        f" {decode_shape[1]}/{decode_shape[2]} heads, d {decode_shape[3]}, f16): its kernels")  # fmt: skip
    try:
        from accelkit_cuda.flash_decode import reference

        b, h, hk, d, ctx, bs = decode_shape
        per_seq = ctx // bs
        kd = rng.standard_normal((b, hk, ctx, d)).astype(np.float16)
        vd = rng.standard_normal((b, hk, ctx, d)).astype(np.float16)
        qd = rng.standard_normal((b, h, d)).astype(np.float16)
        table = rng.permutation(b * per_seq).astype(np.int32).reshape(b, per_seq)

        def paged(x: Any) -> Any:  # [b, hk, ctx, d] -> the cache's [blocks, bs, hk, d]
            cache = np.empty((b * per_seq, bs, hk, d), x.dtype)
            cache[table.reshape(-1)] = (
                x.reshape(b, hk, per_seq, bs, d).transpose(0, 2, 3, 1, 4).reshape(-1, bs, hk, d)
            )
            return cache

        lens = np.full(b, ctx, np.int32)
        host = [qd, paged(kd), paged(vd), table, lens]
        args = [f.from_host(a) for a in host]
        kops = backend.kernel_ops
        got = await kops.paged_attention(*args).to_host()
        small = (slice(0, 2),)  # the float64 reference of two sequences (seconds, not minutes)
        want = reference(qd[small], host[1], host[2], table[small], lens[small], 1 / math.sqrt(d))
        say(f"  max abs error (2 sequences, float64 reference):"
            f" {float(np.max(np.abs(got[small] - want))):.1e};"
            f" routes {dict(backend.attention_engines.routes.get('paged_attention', {}))}")  # fmt: skip

        tq = torch.from_numpy(qd).cuda().reshape(b, h, 1, d)
        tk, tv = torch.from_numpy(kd).cuda(), torch.from_numpy(vd).cuda()
        sdpa = torch.nn.functional.scaled_dot_product_attention

        async def ak_step() -> None:
            kops.paged_attention(*args)
            await backend.synchronize()

        async def th_step() -> None:
            sdpa(tq, tk, tv, enable_gqa=True)
            torch.cuda.synchronize()

        await _kernels_of(say, [("accelkit", ak_step), ("torch dense SDPA", th_step)], 10)
    except Exception as exc:
        say(f"  not measured ({type(exc).__name__}: {exc})")

    say(f"[7/7] causal f16 attention {list(attention_shape)}: accelkit's kernels (cuDNN where"
        " it serves) against PyTorch's SDPA on cuDNN")  # fmt: skip
    try:
        kops = backend.kernel_ops
        host = [
            rng.standard_normal(attention_shape, dtype=np.float32).astype(np.float16)
            for _ in range(3)
        ]
        q, k, v = (f.from_host(a) for a in host)
        kops.attention(q, k, v, causal=True)  # a cuDNN graph is built off the caller's thread
        await backend.synchronize()

        async def ak_attention() -> None:
            kops.attention(q, k, v, causal=True)
            await backend.synchronize()

        await ak_attention()
        say(f"  accelkit's route: {backend.attention_engines.last_route}")
        from torch.nn.attention import SDPBackend, sdpa_kernel

        tq, tk, tv = (torch.from_numpy(a).cuda() for a in host)

        async def th_attention() -> None:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
            torch.cuda.synchronize()

        await _kernels_of(
            say, [("accelkit", ak_attention), ("torch SDPA (cuDNN)", th_attention)], 5
        )
    except Exception as exc:
        say(f"  not measured ({type(exc).__name__}: {exc})")
    return out


async def main() -> int:
    async def body(backend: Any) -> None:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        await diagnose(backend, torch)

    return await on_cuda("profile_cuda_block", body)


if __name__ == "__main__":
    sys.exit(anyio.run(main))
