"""``accelkit bench``: a few operations on one backend, each timed against NumPy in the same
process, as ratios (above 1: faster than NumPy).

A compact, in-package check of "is this backend worth using here": the cost of a small op, a GEMM,
a softmax and a transformer block. Each is checked against NumPy before it is timed, and the two
sides run alternately (a round of one, a round of the other) so that both see the same machine.

Three sizes: ``--quick`` (small sizes, a few seconds), the default (mid sizes, and each benchmark
stops adding rounds once it has spent its time budget, so that a busy or slow machine still
finishes in seconds, not minutes), and ``--full`` (the largest sizes and every round, no budget).
``benchmarks/bench_core.py`` is the fuller benchmark, with PyTorch as a peer.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from accelkit.cli.render import Progress, print_json, table

if TYPE_CHECKING:
    from accelkit.abc.backend import ComputeBackend

__all__ = ["BenchPlan", "BenchResult", "PLANS", "interleaved", "run"]

STEPS = 4

Mode = Literal["quick", "default", "full"]


@dataclass(frozen=True)
class BenchPlan:
    """Sizes and rounds of one ``accelkit bench`` mode."""

    add_calls: int  # 64x64 adds submitted per round
    add_rounds: int
    matmul_n: int
    matmul_rounds: int
    softmax_rows: int  # of 1024 columns
    softmax_rounds: int
    block: tuple[int, int, int, int]  # batch, seq, width, heads
    block_rounds: int
    budget_s: float | None  # per benchmark, after MIN_ROUNDS; None: every round


PLANS: dict[Mode, BenchPlan] = {
    "quick": BenchPlan(50, 10, 512, 3, 256, 5, (1, 128, 256, 4), 3, 1.0),
    "default": BenchPlan(200, 20, 1024, 7, 2048, 15, (1, 256, 512, 8), 7, 2.0),
    "full": BenchPlan(200, 30, 1024, 7, 2048, 15, (4, 256, 512, 8), 7, None),
}
MIN_ROUNDS = 3


@dataclass(frozen=True)
class BenchResult:
    name: str
    accelkit_s: float = 0.0
    numpy_s: float = 0.0
    max_rel_err: float = 0.0
    error: str = ""

    @property
    def ratio(self) -> float:
        """NumPy's time over accelkit's: above 1, accelkit is faster."""
        return self.numpy_s / self.accelkit_s if self.accelkit_s else 0.0


async def interleaved(
    subject: Callable[[], Awaitable[object]],
    peer: Callable[[], object],
    rounds: int,
    *,
    budget_s: float | None = None,
    min_rounds: int = MIN_ROUNDS,
) -> tuple[float, float]:
    """Median seconds of ``await subject()`` and ``peer()`` (awaited too where it returns an
    awaitable), run alternately so that both see the same machine (on a shared machine, a block of one then a block of the other measures
    the neighbours as much as the code). The benchmarks under ``benchmarks/`` use it too.

    With ``budget_s``, no new round starts once the rounds so far took that long, provided at
    least ``min_rounds`` ran: the time a run takes is bounded on a slow or busy machine."""
    ts: list[float] = []
    tp: list[float] = []
    start = time.perf_counter()
    for i in range(rounds):
        if budget_s is not None and i >= min_rounds and time.perf_counter() - start > budget_s:
            break
        t0 = time.perf_counter()
        await subject()
        ts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        result = peer()
        if inspect.isawaitable(result):
            await result
        tp.append(time.perf_counter() - t0)
    return statistics.median(ts), statistics.median(tp)


def _rel_err(got: Any, want: Any) -> float:
    import numpy as np

    scale = float(np.max(np.abs(want))) or 1.0
    return float(np.max(np.abs(np.asarray(got, np.float64) - want))) / scale


async def _small_add(backend: ComputeBackend, plan: BenchPlan) -> BenchResult:
    """A 64x64 f32 add: mostly the cost of submitting an op (per call, ``calls`` in a row and one
    synchronize, so a GPU's launches pipeline as they would in real code)."""
    import numpy as np

    ops, f = backend.tensor_ops, backend.tensor_factory
    a_h = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    b_h = a_h * 2
    a, b = f.from_host(a_h), f.from_host(b_h)
    err = _rel_err(await ops.add(a, b).to_host(), a_h + b_h)
    calls = plan.add_calls

    async def subject() -> None:
        for _ in range(calls):
            ops.add(a, b)
        await backend.synchronize()

    def peer() -> None:
        for _ in range(calls):
            np.add(a_h, b_h)

    t_ak, t_np = await interleaved(subject, peer, plan.add_rounds, budget_s=plan.budget_s)
    return BenchResult("64x64 f32 add (per call)", t_ak / calls, t_np / calls, err)


async def _matmul(backend: ComputeBackend, plan: BenchPlan) -> BenchResult:
    import numpy as np

    n = plan.matmul_n
    rng = np.random.default_rng(1)
    a_h = rng.standard_normal((n, n)).astype(np.float32)
    b_h = rng.standard_normal((n, n)).astype(np.float32)
    f, ops = backend.tensor_factory, backend.tensor_ops
    a, b = f.from_host(a_h), f.from_host(b_h)
    err = _rel_err(await ops.matmul(a, b).to_host(), a_h.astype(np.float64) @ b_h)

    async def subject() -> None:
        ops.matmul(a, b)
        await backend.synchronize()

    t_ak, t_np = await interleaved(
        subject, lambda: a_h @ b_h, plan.matmul_rounds, budget_s=plan.budget_s
    )
    return BenchResult(f"{n}x{n} f32 matmul", t_ak, t_np, err)


async def _softmax(backend: ComputeBackend, plan: BenchPlan) -> BenchResult:
    import numpy as np

    rows = plan.softmax_rows
    x_h = np.random.default_rng(2).standard_normal((rows, 1024)).astype(np.float32)
    x = backend.tensor_factory.from_host(x_h)

    def peer() -> Any:
        e = np.exp(x_h - x_h.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    err = _rel_err(await backend.tensor_ops.softmax(x, axis=-1).to_host(), peer())

    async def subject() -> None:
        backend.tensor_ops.softmax(x, axis=-1)
        await backend.synchronize()

    t_ak, t_np = await interleaved(subject, peer, plan.softmax_rounds, budget_s=plan.budget_s)
    return BenchResult(f"softmax {rows}x1024 f32", t_ak, t_np, err)


async def _block(backend: ComputeBackend, plan: BenchPlan) -> BenchResult:
    import numpy as np

    from accelkit.workloads import (
        BlockConfig,
        block_weights,
        transformer_block,
        transformer_block_numpy,
        upload_weights,
    )

    batch, seq, width, heads = plan.block
    cfg = BlockConfig(batch=batch, seq=seq, width=width, heads=heads)
    x_h = np.random.default_rng(3).standard_normal((cfg.batch, cfg.seq, cfg.width))
    x_h = x_h.astype(np.float32)
    w_h = block_weights(cfg)
    w = upload_weights(backend, w_h)
    x = backend.tensor_factory.from_host(x_h)

    def peer() -> Any:
        return transformer_block_numpy(x_h, w_h, cfg)

    err = _rel_err(await transformer_block(backend, x, w, cfg).to_host(), peer())

    async def subject() -> None:
        await transformer_block(backend, x, w, cfg).to_host()

    t_ak, t_np = await interleaved(subject, peer, plan.block_rounds, budget_s=plan.budget_s)
    name = f"transformer block {cfg.batch}x{cfg.seq}x{cfg.width}"
    return BenchResult(name, t_ak, t_np, err)


_BENCHES = (
    ("small-op overhead", _small_add),
    ("matmul", _matmul),
    ("softmax", _softmax),
    ("transformer block", _block),
)


async def _run_all(selection: Any, plan: BenchPlan, bar: Progress) -> tuple[str, list[BenchResult]]:
    from accelkit._api import open_backend
    from accelkit.errors import AccelError

    results = []
    async with open_backend(selection) as backend:
        where = f"{backend.name} on {backend.device}"
        for i, (label, bench) in enumerate(_BENCHES):
            bar.show(label)
            try:
                results.append(await bench(backend, plan))
            except AccelError as exc:  # e.g. an op this backend does not support
                results.append(BenchResult(label, error=str(exc)))
            bar.done = i + 1
        bar.show("done")
    return where, results


def _time(seconds: float) -> str:
    if seconds <= 0:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def run(args: argparse.Namespace) -> int:
    import anyio

    from accelkit.selector import select

    backend = args.backend.strip().lower() if args.backend else None
    selection = select(None, None, args.policy, backend=backend)
    mode: Mode = "quick" if args.quick else "full" if args.full else "default"
    bar = Progress(STEPS, enabled=args.progress or sys.stderr.isatty(), label="bench")
    try:
        where, results = anyio.run(_run_all, selection, PLANS[mode], bar)
    finally:
        bar.close()
    if args.json:
        print_json(
            {
                "backend": selection.backend,
                "device": str(selection.device),
                "quick": mode == "quick",
                "full": mode == "full",
                "results": [{**asdict(r), "ratio": r.ratio} for r in results],
            }
        )
        return 0
    print(f"accelkit bench: {where}, each against NumPy in this process")
    rows = [
        [
            r.name,
            _time(r.accelkit_s),
            _time(r.numpy_s),
            f"{r.ratio:.2f}x" if r.ratio else "-",
            f"max rel err {r.max_rel_err:.1e}" if not r.error else f"skipped: {r.error}",
        ]
        for r in results
    ]
    print(table(("benchmark", "accelkit", "NumPy", "vs NumPy", "check"), rows, right=(1, 2, 3)))
    print("vs NumPy: NumPy's time over accelkit's (above 1: accelkit is faster)")
    return 0
