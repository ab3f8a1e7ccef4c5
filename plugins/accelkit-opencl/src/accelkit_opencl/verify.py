"""The verifying child: ``python -m accelkit_opencl.verify '<job JSON>'``.

Run by :class:`accelkit_opencl.variants.Verifier`, never by hand in normal use. The job names a
device and candidates (``[[family, label], ...]``). For each candidate the child prints
``{"start": id}``, builds the kernels of that variant through the real backend (the variant
forced) and checks what they compute against NumPy on awkward shapes (sizes that are not
multiples of any block), then prints ``{"done": id, "ok": ..., "reason": ..., "log": ...}``, one
JSON object per line, flushed. If the compiler kills the process, the parent sees a ``start``
without its ``done`` and records that candidate as failed with the signal and stderr's tail.

``ACCELKIT_OPENCL_VERIFY_FAULTS`` (JSON ``{candidate id: fault}``) injects faults, to prove the
machinery on any host: ``abort`` (the process dies as a crashing compiler does), ``hang`` (never
answers), ``nokernel`` (every build yields a program without kernels), ``wrong`` (the kernels
compute a wrong result).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np

__all__ = ["main"]


def _emit(**msg: Any) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def _close(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], rtol: float) -> str | None:
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if want.dtype.kind in "iu":
        bad = int(np.count_nonzero(got != want))
        return None if bad == 0 else f"{bad} integer elements differ"
    scale = float(np.abs(want).max()) if want.size else 0.0
    err = float(np.abs(got.astype(np.float64) - want).max()) if want.size else 0.0
    if not np.isfinite(err) or err > rtol * max(scale, 1.0):
        return f"max error {err:.3g} against a NumPy reference of scale {scale:.3g}"
    return None


async def _check(backend: Any, family: str, wrong: bool) -> str | None:
    """Run ``family``'s kernels (its variant forced) and compare; the first mismatch, or None."""
    f, ops = backend.tensor_factory, backend.tensor_ops
    rng = np.random.default_rng(7)

    async def run(result: Any) -> np.ndarray[Any, Any]:
        host: np.ndarray[Any, Any] = await result.to_host()
        return host * 1.5 if wrong else host

    def rnd(shape: tuple[int, ...], dt: Any) -> np.ndarray[Any, Any]:
        return rng.standard_normal(shape).astype(dt)

    if family.startswith("gemm_packed."):
        dt = np.float32 if family.endswith("f32") else np.float64
        rtol = 1e-4 if dt is np.float32 else 1e-10
        for m, k, n in ((130, 97, 75), (128, 128, 128), (64, 200, 72)):
            a, b = rnd((m, k), dt), rnd((k, n), dt)
            got = await run(ops.matmul(f.from_host(a), f.from_host(b)))
            problem = _close(got, a.astype(np.float64) @ b, rtol)
            if problem:
                return f"matmul {m}x{k}x{n}: {problem}"
        return None
    if family == "gemm_tiled":
        ai = rng.integers(-50, 50, (40, 33)).astype(np.int32)
        bi = rng.integers(-50, 50, (33, 29)).astype(np.int32)
        got = await run(ops.matmul(f.from_host(ai), f.from_host(bi)))
        problem = _close(got.astype(np.int32), ai @ bi, 0.0) if not wrong else "wrong result"
        if problem:
            return f"i32 matmul 40x33x29: {problem}"
        a, b = rnd((21, 30), np.float32), rnd((30, 13), np.float32)
        got = await run(ops.matmul(f.from_host(a), f.from_host(b)))
        problem = _close(got, a.astype(np.float64) @ b, 1e-4)
        return f"f32 matmul 21x30x13: {problem}" if problem else None
    if family == "attention_rows":
        q = rnd((2, 4, 37, 16), np.float32)
        keys, values = rnd((2, 2, 45, 16), np.float32), rnd((2, 2, 45, 16), np.float32)
        for causal in (False, True):
            qt, kt, vt = f.from_host(q), f.from_host(keys), f.from_host(values)
            got = await run(ops.attention(qt, kt, vt, causal=causal))
            problem = _close(got, _attention(q, keys, values, causal), 1e-4)
            if problem:
                return f"attention 2x4x37x16 (causal={causal}): {problem}"
        return None
    if family in ("reduce_wg", "fp64"):
        dt = np.float64 if family == "fp64" else np.float32
        rtol = 1e-10 if family == "fp64" else 1e-4
        x = rnd((37, 1001), dt)
        xt = f.from_host(x)
        ref = x.astype(np.float64)
        checks: list[tuple[str, Any, np.ndarray[Any, Any]]] = [
            ("sum", ops.reduce("sum", xt, axis=-1), ref.sum(axis=-1)),
            ("max", ops.reduce("max", xt, axis=-1), ref.max(axis=-1)),
        ]
        e = np.exp(ref - ref.max(axis=-1, keepdims=True))
        checks.append(("softmax", ops.softmax(xt, axis=-1), e / e.sum(axis=-1, keepdims=True)))
        mu, var = ref.mean(axis=-1, keepdims=True), ref.var(axis=-1, keepdims=True)
        checks.append(
            ("layer_norm", ops.layer_norm(xt, eps=1e-5), (ref - mu) / np.sqrt(var + 1e-5))
        )
        if family == "fp64":
            checks.append(("exp", ops.exp(xt), np.exp(ref)))
            checks.append(("add", ops.add(xt, xt), ref + ref))
        for name, result, want in checks:
            problem = _close(await run(result), want, rtol * 10)
            if problem:
                return f"{name} of 37x1001 {np.dtype(dt).name}: {problem}"
        return None
    return f"unknown family {family!r}"


def _attention(
    q: np.ndarray[Any, Any], k: np.ndarray[Any, Any], v: np.ndarray[Any, Any], causal: bool
) -> np.ndarray[Any, Any]:
    """Attention in float64 (grouped KV heads; causal aligned bottom-right, as accelkit's)."""
    rep = q.shape[1] // k.shape[1]
    k64 = np.repeat(k.astype(np.float64), rep, axis=1)
    v64 = np.repeat(v.astype(np.float64), rep, axis=1)
    s = q.astype(np.float64) @ k64.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if causal:
        sq, sk = s.shape[-2:]
        s = np.where(np.tril(np.ones((sq, sk), bool), sk - sq), s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    out: np.ndarray[Any, Any] = (e / e.sum(axis=-1, keepdims=True)) @ v64
    return out


def _inject_nokernel() -> Callable[[], None]:
    """Every build yields a program without kernels (what a poisoned driver cache gives);
    returns the undo."""
    from accelkit_opencl import programs

    original = programs.ProgramCache._compile
    original_load = programs.ProgramCache._load

    def empty(self: Any, source: str | bytes, options: Any) -> Any:
        if isinstance(source, str):
            source = "/* no kernels */\n"
            import pyopencl as cl

            program = cl.Program(self.context, source)
            program.build(devices=[self.device])
            return program
        return original(self, source, options)

    # Patching the class's methods for this child process (undone below) on purpose:
    programs.ProgramCache._compile = empty  # type: ignore[method-assign]
    programs.ProgramCache._load = lambda self, key, options: None  # type: ignore[method-assign]

    def undo() -> None:  # restores the methods patched above
        programs.ProgramCache._compile = original  # type: ignore[method-assign]
        programs.ProgramCache._load = original_load  # type: ignore[method-assign]

    return undo


async def _main(job: dict[str, Any]) -> None:
    import accelkit as ak
    from accelkit_opencl.backend import OpenCLBackend

    faults: dict[str, str] = json.loads(os.environ.get("ACCELKIT_OPENCL_VERIFY_FAULTS") or "{}")
    backend = OpenCLBackend()
    await backend.initialize(ak.Device("opencl", int(job["device"])))
    passed: set[str] = set()
    try:
        for family, label in job["candidates"]:
            cid = f"{family}/{label}"
            if family in passed and not job.get("exhaustive"):
                # candidates come best first: the rest of the family can wait
                _emit(skip=cid)
                continue
            _emit(start=cid)
            started = time.perf_counter()
            fault = faults.get(cid)
            if fault == "abort":
                os.abort()
            if fault == "hang":
                await anyio.sleep_forever()
            undo = _inject_nokernel() if fault == "nokernel" else None
            backend._force_variant(family, label)
            try:
                problem = await _check(backend, family, wrong=fault == "wrong")
                if problem is None:
                    passed.add(family)
                seconds = round(time.perf_counter() - started, 2)
                _emit(done=cid, ok=problem is None, reason=problem or "", seconds=seconds)
            except ak.AccelError as exc:
                log = getattr(exc, "log", "") or ""
                _emit(done=cid, ok=False, reason=f"{type(exc).__name__}: {exc}"[:500], log=log)
            finally:
                backend._force_variant(family, None)
                backend._kernels.clear()
                backend._programs.clear()
                if undo is not None:
                    undo()
    finally:
        await backend.shutdown()


def _die_with_parent(parent: int | None) -> None:
    """End this process when the verifying parent ends (a child stuck in a compiler must not
    outlive it): the kernel's parent-death signal on Linux, and a watch on the parent's pid."""
    import signal
    import threading

    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if parent is None:
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(3)

    if os.getppid() != parent:
        os._exit(3)
    threading.Thread(target=watch, name="accelkit-verify-parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    job = json.loads(args[0])
    _die_with_parent(job.get("parent"))
    anyio.run(_main, job)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
