"""The probe: the ``dask`` device (a local cluster, described without starting it) and, when
``ACCELKIT_DASK_SCHEDULER`` names one, the remote scheduler's device ``dask://host:port``.

The probe never starts a cluster. It connects only to a scheduler it was given, with a short
timeout (``ACCELKIT_DASK_PROBE_TIMEOUT``, 2 s), and lists that device either way: with its
workers, threads and memory when it answered, and with the reason when it did not.
"""

from __future__ import annotations

import importlib.util
import time
from typing import Any

from accelkit.capabilities import BackendCapabilities, Features, Limits, PerformanceHints
from accelkit.device import Device, DeviceInfo
from accelkit.dtype import DType
from accelkit.errors import DeviceError
from accelkit.sdk import TENSOR_OPS, env_str
from accelkit_dask.cluster import device_address, local_size, normalize_address

#: Every dtype: the workers run the CPU backend's kernels.
DTYPES = frozenset(DType)
#: The KernelOps with a kernel of their own (accelkit_dask.fused_kernels).
FUSED_OPS = frozenset({"sample_token", "silu_mul", "rms_norm_residual"})
#: How long a probe waits for a configured scheduler.
PROBE_TIMEOUT_S = 2.0
_CACHE_S = 30.0
_remote_cache: dict[str, tuple[float, DeviceInfo]] = {}


def capabilities(
    device: Device, threads: int, memory: int, extra: dict[str, Any]
) -> BackendCapabilities:
    return BackendCapabilities(
        backend="dask",
        device=str(device),
        dtypes=DTYPES,
        ops=TENSOR_OPS,
        fused_ops=FUSED_OPS,  # the rest compose from the blockwise TensorOps
        features=Features(fp16=True, bf16=True, fp64=True),
        limits=Limits(memory_bytes=memory, max_alloc_bytes=memory, compute_units=threads),
        performance=PerformanceHints(
            # Declared low on purpose (half the CPU backend's per-core figure): every op is a
            # round trip through the scheduler, so a machine's own CPU backend ranks first.
            peak_gflops={DType.F32: 20.0 * threads, DType.F64: 10.0 * threads},
            bandwidth_gbs=1.0,
            launch_latency_us=5000.0,
        ),
        extra=extra,
    )


def capabilities_of(info: DeviceInfo) -> BackendCapabilities:
    """The capabilities of a probed device (the probe always fills them in)."""
    caps = info.capabilities
    assert caps is not None
    return caps


def local_info() -> DeviceInfo:
    size = local_size()
    threads = size.workers * size.threads_per_worker
    memory = size.workers * size.memory_per_worker
    extra = {
        "cluster": "local (started by the backend on initialize)",
        "workers": size.workers,
        "threads_per_worker": size.threads_per_worker,
    }
    device = Device("dask", 0)
    return DeviceInfo(
        device=device,
        backend="dask",
        name=f"local Dask cluster ({size.workers} worker processes x {size.threads_per_worker}"
        " threads)",
        vendor="Dask",
        memory_bytes=memory,
        compute_units=threads,
        capabilities=capabilities(device, threads, memory, extra),
    )


def remote_info(address: str, timeout: float = PROBE_TIMEOUT_S) -> DeviceInfo:
    """The scheduler's device: its workers when it answers within ``timeout``, the reason if
    not (cached for 30 s: listing devices must stay quick)."""
    now = time.monotonic()
    hit = _remote_cache.get(address)
    if hit is not None and now - hit[0] < _CACHE_S:
        return hit[1]
    device = Device("dask", address=device_address(address))
    try:
        from distributed import Client

        with Client(normalize_address(address), timeout=timeout, set_as_default=False) as c:
            workers = c.scheduler_info(n_workers=-1).get("workers", {})
    except Exception as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        extra = {"reachable": False, "reason": reason}
        info = DeviceInfo(
            device=device,
            backend="dask",
            name=f"Dask scheduler at {normalize_address(address)} (unreachable: {reason})",
            vendor="Dask",
            capabilities=capabilities(device, 0, 0, extra),
            extra=extra,
        )
    else:
        threads = sum(int(w.get("nthreads", 0)) for w in workers.values())
        memory = sum(int(w.get("memory_limit") or 0) for w in workers.values())
        extra = {"reachable": True, "workers": len(workers), "threads": threads}
        info = DeviceInfo(
            device=device,
            backend="dask",
            name=f"Dask cluster at {normalize_address(address)} ({len(workers)} workers,"
            f" {threads} threads)",
            vendor="Dask",
            memory_bytes=memory,
            compute_units=threads,
            capabilities=capabilities(device, threads, memory, extra),
            extra=extra,
        )
    _remote_cache[address] = (now, info)
    return info


def probe_timeout() -> float:
    value = env_str("ACCELKIT_DASK_PROBE_TIMEOUT")
    try:
        return float(value) if value is not None else PROBE_TIMEOUT_S
    except ValueError:
        return PROBE_TIMEOUT_S


def probe() -> list[DeviceInfo]:
    if importlib.util.find_spec("distributed") is None:
        raise DeviceError("dask.distributed is not installed: pip install 'dask[distributed]'")
    devices = [local_info()]
    address = env_str("ACCELKIT_DASK_SCHEDULER")
    if address is not None:
        devices.append(remote_info(address, probe_timeout()))
    return devices
