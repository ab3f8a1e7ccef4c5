"""A service's first requests on CUDA find everything built at initialize: checked over the
stand-in for CuPy (no GPU; ``tests/test_gpu.py`` counts CuPy's real kernel builds on a GPU).

CuPy builds a kernel at its first launch and a lazy import runs at its first use, both holding
the interpreter lock the event loop needs (issue 27: a 58 ms stall at a cold service's first
requests on an H100). After ``initialize`` the first call of each ordinary op (the service's
``/mlp`` chain and a transformer block's ops) must import no module, compile nothing (no NVRTC
program: the raw elementwise kernels are loaded at initialize), and call only CuPy routines that
initialize's warm-up already launched.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import fake_cupy
import numpy as np
import pytest
from test_offloop import Plugin, _open
from test_offloop import plugin as plugin  # the fixture

pytestmark = pytest.mark.anyio


async def test_first_requests_import_and_compile_nothing(
    plugin: Plugin,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from accelkit_cuda import nvrtc

    compiles: list[tuple[str, int]] = []
    stand_in = nvrtc.compile_cached

    def compile_cached(*args: Any, **kwargs: Any) -> Any:
        name = args[3] if len(args) > 3 else kwargs.get("name")
        compiles.append((str(name), threading.get_ident()))
        return stand_in(*args, **kwargs)

    monkeypatch.setattr(nvrtc, "compile_cached", compile_cached)
    backend = await _open(plugin)
    try:
        assert compiles, "initialize compiled nothing: the stand-in's hook is not reached"
        assert backend.tensor_ops is not None
        warmed = {name for name, _ in fake_cupy.CALLS}
        assert "ufunc matmul" in warmed, "initialize's warm-up did not run"
        # The Philox kernels loaded: CuPy's generator (their fallback) is not warmed (a state
        # initialised for nothing); ACCELKIT_CUDA_PHILOX=0 warms it (test_fast_rows.py).
        assert backend.philox.ready
        assert "random.default_rng" not in warmed
        fake_cupy.CALLS.clear()
        compiles.clear()
        rng = np.random.default_rng(0)  # the test's own host data (NumPy's generator)
        modules = set(sys.modules)
        f, ops = backend.tensor_factory, backend.tensor_ops
        # the service's /mlp chain
        x = f.from_host(rng.standard_normal((64, 512), np.float32))
        w1 = f.from_host(rng.standard_normal((512, 1024), np.float32))
        w2 = f.from_host(rng.standard_normal((1024, 512), np.float32))
        gamma, beta = f.ones((512,)), f.zeros((512,))
        h = ops.gelu(ops.matmul(x, w1))
        h = ops.layer_norm(ops.matmul(h, w2), gamma, beta, eps=1e-5)
        probs = ops.softmax(h, axis=-1)
        # a transformer block's other ordinary ops
        n = f.normal((64, 512), seed=1)
        u = f.uniform((64, 512), -1.0, 1.0, seed=2)
        r = ops.rms_norm(n + u, gamma)  # a same-shape add: the raw elementwise kernel
        s = ops.silu(r) * ops.sigmoid(u)
        t = ops.reduce("sum", s, axis=-1)
        m = ops.reduce("mean", probs, axis=-1)
        mx = ops.reduce("max", h, axis=-1)
        got = [await a.to_host() for a in (probs, t, m, mx)]
        assert all(np.all(np.isfinite(g)) for g in got)
        new = sorted(name for name in set(sys.modules) - modules if not name.startswith("test"))
        assert not new, f"the first requests imported {new}"
        assert not compiles, f"the first requests compiled {compiles}"
        used = {name for name, _ in fake_cupy.CALLS if _builds_a_kernel(name)}
        cold = sorted(used - warmed)
        assert not cold, f"CuPy routines first launched by a request (not warmed up): {cold}"
    finally:
        await backend.shutdown()


#: Calls that build no CuPy kernel (copies, streams, events, memory, raw NVRTC launches).
_NO_KERNEL = ("Event", "Stream", "alloc_pinned_memory", "runtime.", "launch ", "pool.", "driver.")


def _builds_a_kernel(name: str) -> bool:
    """Whether the stand-in's call ``name`` is one that real CuPy launches a kernel for, built
    (or read from its disk cache) at its first launch."""
    return not name.startswith(_NO_KERNEL)
