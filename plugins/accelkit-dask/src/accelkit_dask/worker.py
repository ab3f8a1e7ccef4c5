"""The accelkit backend a worker runs its heavy blocks on.

By default a worker runs every block with accelkit's CPU kernels (:mod:`accelkit.sdk.host`).
A worker with an accelerator can run its GEMM, matmul, linear, attention and conv2d blocks on
another accelkit backend instead: ``ACCELKIT_DASK_WORKER_BACKEND=cuda`` (a backend name or a
device, ``cuda:1``) in the worker's environment, or ``DaskBackend(worker_backend="cuda")``,
which installs it on every worker of the cluster (new ones included) through a worker plugin.
Each worker process opens that backend once, on an event loop of its own (an anyio blocking
portal), and sends each block there and back; a backend that cannot open is reported once and
the worker goes on with the CPU kernels.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from typing import Any

import numpy as np

ENV = "ACCELKIT_DASK_WORKER_BACKEND"
#: Ops whose blocks go to the worker's backend (compute-bound: worth the copies).
HEAVY = frozenset({"gemm", "matmul", "linear", "attention", "conv2d"})

Array = np.ndarray[Any, Any]
_log = logging.getLogger("accelkit_dask.worker")
_lock = threading.Lock()
_chosen: str | None = None  # set by the worker plugin; the environment otherwise
_opened: WorkerBackend | None = None
_failed: str | None = None
#: Blocks run on the worker's backend, by op (``client.run(accelkit_dask.worker.stats)``).
_counts: Counter[str] = Counter()


class WorkerBackend:
    """An accelkit backend open in this worker process, driven from the task threads."""

    def __init__(self, target: str) -> None:
        from anyio.from_thread import start_blocking_portal

        import accelkit

        self.target = target
        self._portal_cm = start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        try:
            self.backend = accelkit.create_backend(target)
            self._portal.call(self.backend.initialize)
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            raise

    def run(self, op: str, arrays: list[Array | None], params: dict[str, Any]) -> Array:
        return self._portal.call(self._run, op, arrays, params)

    async def _run(self, op: str, arrays: list[Array | None], params: dict[str, Any]) -> Array:
        f, ops = self.backend.tensor_factory, self.backend.tensor_ops
        t = [f.from_host(a) if a is not None else None for a in arrays]
        # The arg-type ignores below: t holds None only where the op takes None (a bias,
        # a mask, gemm's c); the operands it requires are always sent.
        if op == "gemm":
            y = ops.gemm(t[0], t[1], t[2], **params)  # type: ignore[arg-type]
        elif op == "matmul":
            y = ops.matmul(t[0], t[1])  # type: ignore[arg-type]
        elif op == "linear":
            y = ops.linear(t[0], t[1], t[2])  # type: ignore[arg-type]
        elif op == "attention":
            y = ops.attention(t[0], t[1], t[2], mask=t[3], **params)  # type: ignore[arg-type]
        elif op == "conv2d":
            y = ops.conv2d(t[0], t[1], t[2], **params)  # type: ignore[arg-type]
        else:  # pragma: no cover - HEAVY lists the ops above
            raise ValueError(op)
        return await y.to_host()

    def close(self) -> None:
        try:
            self._portal.call(self.backend.shutdown)
        finally:
            self._portal_cm.__exit__(None, None, None)


def choose(target: str | None) -> None:
    """This process's worker backend from now on (None: the environment's, or the CPU)."""
    global _chosen, _opened, _failed
    with _lock:
        _chosen = target
        old, _opened, _failed = _opened, None, None
    if old is not None:
        old.close()


def current() -> WorkerBackend | None:
    """The backend this worker runs heavy blocks on, opened on first use; None for the CPU."""
    global _opened, _failed
    target = _chosen or os.environ.get(ENV, "").strip() or "cpu"
    if target == "cpu":
        return None
    with _lock:
        if _opened is not None and _opened.target == target:
            return _opened
        if _failed is not None:
            return None
        try:
            _opened = WorkerBackend(target)
        except Exception as exc:
            _failed = f"{type(exc).__name__}: {exc}"
            _log.warning("accelkit-dask: cannot open %r on this worker (%s)", target, _failed)
            return None
        return _opened


def offload(op: str, arrays: list[Array | None], params: dict[str, Any]) -> Array | None:
    """``op`` on the worker's backend (the result, in the kernel's dtype), or None to run it
    with the CPU kernels."""
    backend = current()
    if backend is None:
        return None
    result = backend.run(op, arrays, params)
    with _lock:
        _counts[op] += 1
    return result


def stats() -> dict[str, Any]:
    """What this worker ran where: its backend, the blocks sent to it, why it could not open."""
    with _lock:
        return {
            "backend": _opened.target if _opened is not None else "cpu",
            "blocks": dict(_counts),
            "failed": _failed,
        }


def plugin(target: str) -> Any:
    """A distributed worker plugin that sets the worker backend on every worker (and on workers
    that join later), and unsets it when removed."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class WorkerBackendPlugin(WorkerPlugin):  # type: ignore[misc]  # distributed is untyped
        name = f"accelkit-worker-backend-{target}"

        def setup(self, worker: Any) -> None:
            choose(target)

        def teardown(self, worker: Any) -> None:
            choose(None)

    return WorkerBackendPlugin()
