"""Attention on cuDNN and GEMMs on the workspace path, as ratios against PyTorch in one process.

Run with ``python benchmarks/bench_cuda_attention.py`` where accelkit-cuda, CuPy and PyTorch
(CUDA) are installed, with ``nvidia-cudnn-frontend`` for the cuDNN figures
(``pip install 'accelkit-cuda[cuda13,cudnn13]'``). Figures (issue 29's targets in brackets):

- causal attention, batch 8, 16 heads, seq 4096, head_dim 128, f16 and bf16, KernelOps (cuDNN
  where installed, else the NVRTC kernel: the engine is printed) vs
  ``torch.nn.functional.scaled_dot_product_attention`` [cuDNN >= 0.9x];
- one decode step over a paged KV cache (batch 16, 32 query heads, 8 KV heads, head_dim 128,
  4096 tokens a sequence in blocks of 16), ``paged_attention`` on the split-KV decode kernel
  (where its on-device check passed), plain and pipelined (``ACCELKIT_CUDA_DECODE_PIPELINE``),
  and without it (cuDNN's paged graph, or the warp-per-row
  kernel) vs SDPA over the same keys held densely (PyTorch has no paged attention: its dense
  decode is the yardstick) [>= 0.9x];
- GEMM 8192x8192x8192 in f16, bf16 and f32 (f32 exact, then TF32 with ``allow_tf32`` on both
  sides) vs ``torch.matmul`` [f16/bf16 >= 0.97x].

Timings are medians of interleaved repeats; a repeat queues ``CALLS`` calls (attention, GEMM) or
50 decode steps, then waits for the device, on both sides alike, so that the figure is the
device's throughput and not the latency of one synchronization (about 0.5 ms on the H100 run
that first measured this: one call a repeat made a 1.1 ms kernel look 1.5x slower). Both sides
are warmed up first (cuDNN's graph built, PyTorch's picked), and the engine that served every
timed call is counted and printed: a figure whose calls did not all run on the engine named
says so. The card and the engines are printed first.
"""

from __future__ import annotations

import os
from typing import Any

import anyio
import numpy as np

import accelkit as ak
from accelkit.cli.bench import interleaved

CALLS = 10  # calls a timed repeat (attention and GEMM)
ROUNDS = 7


def served(engines: Any, op: str, before: dict[str, int], expected: int) -> str:
    """Which engines served the timed calls of ``op`` since ``before`` (counts)."""
    after = engines.routes.get(op, {})
    got = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    got = {k: n for k, n in got.items() if n}
    engine = max(got, key=got.__getitem__) if got else "?"
    if got.get(engine, 0) != expected:
        return f"{engine}; NOT ALL TIMED CALLS: {got} of {expected}"
    return engine


def torch_backends(tqkv: list[Any]) -> str:
    """PyTorch's SDPA forced onto each of its backends (device ms a call, or why not): which
    one its default picks shows beside the default's figure."""
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch.nn.attention import SDPBackend, sdpa_kernel

    parts = []
    for label, kind in (
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("flash", SDPBackend.FLASH_ATTENTION),
    ):
        try:
            with sdpa_kernel(kind):
                F.scaled_dot_product_attention(*tqkv, is_causal=True)  # warm up
                torch.cuda.synchronize()
                ms = torch_device_ms(
                    lambda: F.scaled_dot_product_attention(*tqkv, is_causal=True), 5
                )
            parts.append(f"{label} {ms:.3f} ms")
        except Exception as exc:  # not built in, or refused for this shape
            parts.append(f"{label}: {type(exc).__name__}")
    return ", ".join(parts)


async def device_ms(backend: Any, call: Any, n: int) -> float:
    """Device milliseconds a call of ``call()`` (accelkit, CUDA events around ``n`` calls on the
    current stream): the kernels' time alone, without the host's or a synchronization's."""
    stream = backend.default_stream
    start = stream.record_event()
    for _ in range(n):
        call()
    end = stream.record_event()
    await backend.synchronize()
    return float(start.elapsed_ms(end)) / n


def torch_device_ms(call: Any, n: int) -> float:
    """The same for PyTorch (its current stream)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        call()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / n


async def main() -> None:
    import torch
    import torch.nn.functional as F  # noqa: N812

    # The pipelined decode variants are compiled only where asked for when the backend opens
    # (and are then its default); the decode figures below pick plain or pipelined per run.
    os.environ.setdefault("ACCELKIT_CUDA_DECODE_PIPELINE", "1")
    async with ak.open_backend("cuda") as opened:
        backend: Any = opened  # a CUDABackend (attention_engines, allow_tf32)
        f, ops, kops = backend.tensor_factory, backend.tensor_ops, backend.kernel_ops
        extra = backend.capabilities.extra
        engines = backend.attention_engines
        print(f"device: {backend.device} ({extra['arch']}), torch {torch.__version__}", flush=True)
        print(f"attention engine: {extra['attention_engine']} ({extra['attention_engine_note']})")
        frontend = engines.frontend
        ours = (
            "-"
            if frontend is None
            else f"{frontend.backend_version()} (frontend {frontend.__version__})"
        )
        print(f"cuDNN: ours {ours}, PyTorch's {torch.backends.cudnn.version()}", flush=True)
        rng = np.random.default_rng(0)
        tdt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}

        print("[1/3] causal attention 8x16x4096x128 ...", flush=True)
        shape = (8, 16, 4096, 128)
        host = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
        for name in ("f16", "bf16"):
            qkv = [f.from_host(x, dtype=name) for x in host]
            tqkv = [torch.from_numpy(x).to("cuda", tdt[name]) for x in host]

            async def ak_attn(qkv: list[Any] = qkv, n: int = CALLS) -> None:
                for _ in range(n):
                    kops.attention(*qkv, causal=True)
                await backend.synchronize()

            def torch_sdpa(tqkv: list[Any] = tqkv) -> None:
                for _ in range(CALLS):
                    F.scaled_dot_product_attention(*tqkv, is_causal=True)
                torch.cuda.synchronize()

            await ak_attn(n=1)  # queues the cuDNN graph's build (the NVRTC kernel runs meanwhile)
            await ak_attn()
            torch_sdpa()
            before = dict(engines.routes.get("attention", {}))
            t_ak, t_th = await interleaved(ak_attn, torch_sdpa, ROUNDS)
            engine = served(engines, "attention", before, CALLS * ROUNDS)
            t_ak, t_th = t_ak / CALLS, t_th / CALLS
            flops = 4 * 8 * 16 * 4096 * 4096 * 128 / 2 / 1e12
            print(
                f"      {name}: accelkit ({engine}) {t_ak * 1e3:.2f} ms = {flops / t_ak:.0f}"
                f" TFLOP/s, SDPA {t_th * 1e3:.2f} ms: {t_th / t_ak:.2f}x torch"
                " (target >= 0.9x on cuDNN)"
            )
            d_ak = await device_ms(backend, lambda qkv=qkv: kops.attention(*qkv, causal=True), 5)
            d_th = torch_device_ms(
                lambda tqkv=tqkv: F.scaled_dot_product_attention(*tqkv, is_causal=True), 5
            )
            print(f"      {name}: device time a call (CUDA events) accelkit {d_ak:.3f} ms,"
                  f" SDPA {d_th:.3f} ms: {d_th / d_ak:.2f}x")  # fmt: skip
            print(f"      {name}: SDPA's own backends, device time a call: {torch_backends(tqkv)}")
            qkv.clear()
            tqkv.clear()

        print("[2/3] paged decode step: 16 seqs x 4096 tokens, 32/8 heads, d 128 ...", flush=True)
        b, h, hk, d, ctx, bs = 16, 32, 8, 128, 4096, 16
        per_seq = ctx // bs
        kd = rng.standard_normal((b, hk, ctx, d)).astype(np.float16)
        vd = rng.standard_normal((b, hk, ctx, d)).astype(np.float16)
        qh = rng.standard_normal((b, h, d)).astype(np.float16)
        # Sequence i's blocks, shuffled through the cache as an allocator would leave them.
        order = rng.permutation(b * per_seq).astype(np.int32)
        table = order.reshape(b, per_seq)
        cache_k = np.empty((b * per_seq, bs, hk, d), np.float16)
        cache_v = np.empty_like(cache_k)
        for i in range(b):
            for j in range(per_seq):
                cache_k[table[i, j]] = kd[i, :, j * bs : (j + 1) * bs].transpose(1, 0, 2)
                cache_v[table[i, j]] = vd[i, :, j * bs : (j + 1) * bs].transpose(1, 0, 2)
        lens = np.full(b, ctx, np.int32)
        args = [f.from_host(x) for x in (qh, cache_k, cache_v, table, lens)]
        tq = torch.from_numpy(qh).cuda().reshape(b, h, 1, d)
        tk, tv = torch.from_numpy(kd).cuda(), torch.from_numpy(vd).cuda()
        steps = 50

        async def ak_decode() -> None:
            for _ in range(steps):
                kops.paged_attention(*args)
            await backend.synchronize()

        def torch_decode() -> None:
            for _ in range(steps):
                F.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)
            torch.cuda.synchronize()

        decode = backend.flash_decode
        print(f"      split-KV decode kernel: {decode.describe()}")
        torch_decode()
        d_th = torch_device_ms(
            lambda: F.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True), 20
        )
        # The split-KV kernel (where verified), plain and pipelined, then cuDNN's paged graph
        # (or the warp kernel).
        pipelined = decode.pipelined
        for label, enabled, pipe in (
            ("split-KV", True, False), ("split-KV pipelined", True, True),
            ("without split-KV", False, False),
        ):  # fmt: skip
            if (enabled and not decode.verified) or (pipe and not decode.has_pipelined):
                continue
            decode.enabled, decode.pipelined = enabled, pipe
            kops.paged_attention(*args)  # queues cuDNN's graph build where that route is next
            await backend.synchronize()
            await ak_decode()
            before = dict(engines.routes.get("paged_attention", {}))
            t_ak, t_th = await interleaved(ak_decode, torch_decode, ROUNDS)
            engine = served(engines, "paged_attention", before, steps * ROUNDS)
            d_ak = await device_ms(backend, lambda: kops.paged_attention(*args), 20)
            print(
                f"      {label}: accelkit paged ({engine}) {t_ak / steps * 1e6:.1f} us/step,"
                f" torch dense SDPA {t_th / steps * 1e6:.1f} us/step: {t_th / t_ak:.2f}x torch"
                " (target >= 0.9x)"
            )
            print(
                f"      {label}: device time a step (CUDA events) accelkit {d_ak * 1e3:.1f} us,"
                f" SDPA {d_th * 1e3:.1f} us: {d_th / d_ak:.2f}x"
            )
        decode.enabled, decode.pipelined = True, pipelined
        args.clear()

        print("[3/3] GEMM 8192 ...", flush=True)
        n = 8192
        a_h = (rng.standard_normal((n, n)) * 0.1).astype(np.float32)
        tflops = 2 * n**3 / 1e12
        for name, tf32 in (("f16", False), ("bf16", False), ("f32", False), ("f32", True)):
            pair = [f.from_host(a_h, dtype=name), torch.from_numpy(a_h).to("cuda", tdt[name])]
            backend.allow_tf32 = tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32

            async def ak_gemm(pair: list[Any] = pair) -> None:
                for _ in range(CALLS):
                    ops.matmul(pair[0], pair[0])
                await backend.synchronize()

            def torch_gemm(pair: list[Any] = pair) -> None:
                for _ in range(CALLS):
                    torch.matmul(pair[1], pair[1])
                torch.cuda.synchronize()

            await ak_gemm()
            torch_gemm()
            t_ak, t_th = await interleaved(ak_gemm, torch_gemm, ROUNDS)
            t_ak, t_th = t_ak / CALLS, t_th / CALLS
            label = f"{name}{' tf32' if tf32 else ''}"
            print(
                f"      {label:8s} accelkit {tflops / t_ak:.0f} TFLOP/s, torch"
                f" {tflops / t_th:.0f} TFLOP/s: {t_th / t_ak:.2f}x torch"
                + (" (target >= 0.97x)" if name != "f32" else "")
            )
            pair.clear()
        backend.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        print(f"routes: {engines.routes}")


if __name__ == "__main__":
    anyio.run(main)
