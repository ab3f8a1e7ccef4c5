"""On a GPU: a service's first requests build no CuPy kernel (skipped with the reason elsewhere).

CuPy builds each kernel in the process at its first launch (NVRTC, or a read of its disk
cache, then the module load), holding the interpreter lock the event loop needs for parts of
it (issue 27). ``initialize``'s warm-up launches the ordinary ops' kernels, so the first
``/mlp``-like request and a transformer block's ops that follow must build none: counted in a
fresh process (CuPy keeps built kernels per process), through the function every CuPy kernel
build goes through (``cupy.cuda.compiler._compile_module_with_cache``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, threading
    import numpy as np
    import cupy.cuda.compiler as compiler

    builds = []
    real = compiler._compile_module_with_cache

    def counting(source, *args, **kwargs):
        head = next((ln for ln in source.splitlines() if "__global__" in ln), source[:120])
        builds.append(head.strip()[:160])
        return real(source, *args, **kwargs)

    compiler._compile_module_with_cache = counting
    import accelkit as ak

    async def main():
        out = {}
        async with ak.open_backend("cuda") as b:
            await b.synchronize()
            out["at_initialize"] = len(builds)
            builds.clear()
            f, ops = b.tensor_factory, b.tensor_ops
            rng = np.random.default_rng(0)
            for rows, dim, hidden in ((64, 512, 1024), (8, 1024, 4096)):
                x = f.from_host(rng.standard_normal((rows, dim), np.float32))
                w1 = f.from_host(rng.standard_normal((dim, hidden), np.float32) / dim**0.5)
                w2 = f.from_host(rng.standard_normal((hidden, dim), np.float32) / hidden**0.5)
                g, be = f.ones((dim,)), f.zeros((dim,))
                h = ops.gelu(ops.matmul(x, w1))
                h = ops.layer_norm(ops.matmul(h, w2), g, be, eps=1e-5)
                p = ops.softmax(h, axis=-1)
                n = f.normal((rows, dim), seed=1) + f.uniform((rows, dim), -1.0, 1.0, seed=2)
                r = ops.silu(ops.rms_norm(n, g)) * ops.sigmoid(h)
                t = ops.reduce("sum", r, axis=-1) + ops.reduce("max", p, axis=-1)
                m = ops.reduce("mean", h, axis=-1)
                await p.to_host(); await t.to_host(); await m.to_host()
        out["first_requests"] = builds
        print("RESULT " + json.dumps(out))

    asyncio.run(main())
    """
)


def test_first_requests_build_no_cupy_kernel() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=240
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    output = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, output
    assert line is not None, output
    result = json.loads(line.removeprefix("RESULT "))
    # the hook is reached: the warm-up built (or read from CuPy's cache) its kernels
    assert result["at_initialize"] > 0, result
    print(
        f"CuPy kernel builds: {result['at_initialize']} at initialize, "
        f"{len(result['first_requests'])} in the first requests"
    )
    assert not result["first_requests"], (
        f"{len(result['first_requests'])} CuPy kernels built at the first requests (each holds"
        f" the GIL for part of its build): {result['first_requests']}"
    )
