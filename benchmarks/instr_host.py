"""Executed instructions per small op (accelkit's CPU backend, PyTorch CPU, NumPy), by callgrind.

Wall-clock figures of a few microseconds move by half from run to run on a shared machine;
instruction counts do not. Each case of ``benchmarks/bench_host.py`` runs ``N`` times between
two calls of ``os.getppid()``, at which callgrind dumps its counters; the empty loop is taken
out. Run (minutes: valgrind runs Python about 50 times slower; the CPU JIT off, as Numba's
compilation under valgrind would take longer still)::

    mkdir -p /tmp/cg && cd /tmp/cg && ACCELKIT_CPU_JIT=0 valgrind --tool=callgrind \\
        --dump-before=getppid --dump-instr=no python /path/to/benchmarks/instr_host.py run 2000
    python /path/to/benchmarks/instr_host.py report 2000 /tmp/cg
"""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Callable
from typing import Any

SIDES = ("accelkit", "torch", "numpy")


def names() -> list[str]:
    from bench_host import CASES

    return [f"{c}/{s}" for c in ["noop", *(c[0] for c in CASES)] for s in SIDES]


async def run(n: int) -> None:
    import numpy as np
    import torch

    import accelkit as ak
    from bench_host import CASES

    torch.set_num_threads(1)

    def loop(fn: Callable[[], object]) -> None:
        for _ in range(n):
            fn()

    async with ak.open_backend("cpu") as backend:
        f, ops = backend.tensor_factory, backend.tensor_ops
        rng = np.random.default_rng(0)
        a_h = rng.standard_normal((64, 64)).astype(np.float32)
        b_h = rng.standard_normal((64, 64)).astype(np.float32)
        a, b = f.from_host(a_h), f.from_host(b_h)
        ta, tb = torch.from_numpy(a_h), torch.from_numpy(b_h)
        sides: list[tuple[Callable[[], object], ...]] = [(lambda: None,) * 3]
        for _, ak_call, torch_call, np_call in CASES:
            sides.append(
                (
                    lambda c=ak_call: c(ops, a, b),
                    lambda c=torch_call: c(torch, ta, tb),
                    lambda c=np_call: c(a_h, b_h),
                )
            )
        for calls in sides:
            for fn in calls:
                loop(fn)
                loop(fn)  # warm: pools filled, caches seen
                os.getppid()  # callgrind dumps what came before (not counted)
                loop(fn)
                os.getppid()  # callgrind dumps the loop


def report(n: int, folder: str) -> None:
    files = sorted(
        glob.glob(os.path.join(folder, "callgrind.out.*.*")),
        key=lambda p: int(p.rsplit(".", 1)[1]),
    )
    totals: list[int] = []
    for path in files:
        with open(path) as fh:
            for line in fh:
                if line.startswith(("summary:", "totals:")):
                    totals.append(int(line.split()[1]))
                    break
    per: dict[str, float] = dict(zip(names(), (t / n for t in totals[1::2]), strict=False))
    base = {s: per.get(f"noop/{s}", 0.0) for s in SIDES}
    print(f"{'op (64x64 f32)':<16}{'accelkit':>10}{'torch':>10}{'numpy':>10}   instructions/call")
    cases = dict.fromkeys(k.split("/")[0] for k in names())
    for case in list(cases)[1:]:
        row: list[Any] = [per.get(f"{case}/{s}") for s in SIDES]
        cells = "".join(
            f"{v - base[s]:>10.0f}" if v is not None else f"{'-':>10}"
            for v, s in zip(row, SIDES, strict=True)
        )
        print(f"{case:<16}{cells}")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "run":
        import anyio

        anyio.run(run, int(sys.argv[2]))
    elif len(sys.argv) >= 4 and sys.argv[1] == "report":
        report(int(sys.argv[2]), sys.argv[3])
    else:
        sys.exit(__doc__)
