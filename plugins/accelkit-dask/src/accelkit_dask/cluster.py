"""The cluster a backend runs on: a local one it starts and owns, or a scheduler it connects to.

Everything here blocks (starting processes, connecting, closing): the backend calls it from a
worker thread, never from the event loop. The client is distributed's synchronous ``Client``,
whose own asyncio loop runs on a thread of its own; that is what lets the backend be used from
asyncio and trio alike (distributed itself is asyncio-only).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

from accelkit.errors import DeviceError, InvalidArgumentError
from accelkit.sdk import env_str

__all__ = ["Cluster", "LocalSize", "WorkerInfo", "local_size", "normalize_address"]

#: Seconds to wait for a scheduler before saying it cannot be reached.
CONNECT_TIMEOUT_S = 10.0

#: One client per external scheduler per process, shared by the backends connected to it.
_pool_lock = threading.Lock()
_clients: dict[str, Any] = {}


def close_connections() -> None:
    """Close the pooled connections to external schedulers (done at exit; the backends using
    one must be shut down first). The clusters themselves keep running."""
    with _pool_lock:
        clients = list(_clients.values())
        _clients.clear()
    for client in clients:
        with contextlib.suppress(Exception):  # a scheduler that is gone
            client.close(timeout=5)


atexit.register(close_connections)


@dataclass(frozen=True)
class LocalSize:
    """The local cluster the ``dask`` device starts: worker processes, threads, memory each."""

    workers: int
    threads_per_worker: int
    memory_per_worker: int


@dataclass(frozen=True)
class WorkerInfo:
    address: str
    name: str
    threads: int
    memory_limit: int
    memory_used: int


def _env_int(name: str) -> int | None:
    value = env_str(name)
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        raise InvalidArgumentError(f"{name} must be a positive integer; got {value!r}") from None
    if n < 1:
        raise InvalidArgumentError(f"{name} must be a positive integer; got {value!r}")
    return n


def system_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def local_size() -> LocalSize:
    """Sized to the machine: one single-threaded worker process per core (at most 16), the
    memory shared between them; ``ACCELKIT_DASK_WORKERS`` and ``ACCELKIT_DASK_THREADS``
    override the counts."""
    cores = os.cpu_count() or 1
    workers = _env_int("ACCELKIT_DASK_WORKERS") or min(cores, 16)
    threads = _env_int("ACCELKIT_DASK_THREADS") or max(1, cores // workers)
    return LocalSize(workers, threads, int(system_memory() * 0.8) // workers)


def normalize_address(address: str) -> str:
    """``host:port``, ``tcp://host:port`` or ``dask://host:port`` as distributed's address."""
    text = address.strip()
    if text.startswith("dask://"):
        text = text[len("dask://") :]
    if "://" not in text:
        text = "tcp://" + text
    if not text.split("://", 1)[1]:
        raise InvalidArgumentError(f"a Dask scheduler address like 'host:8786'; got {address!r}")
    return text


def device_address(address: str) -> str:
    """The part of a scheduler address that names the device: ``dask://<this>``."""
    text = normalize_address(address)
    return text[len("tcp://") :] if text.startswith("tcp://") else text


def _quiet_large_graphs() -> None:
    """Host arrays up to 32 MiB travel inside graphs on purpose (see submit.GRAPH_BYTES)."""
    import dask

    dask.config.set({"distributed.admin.large-graph-warning-threshold": "128MB"})


#: Seconds a local cluster may take to start (processes, imports) and to close.
START_TIMEOUT_S = 120.0
CLOSE_TIMEOUT_S = 30.0


class Served:
    """A local cluster in a process of its own (``python -m accelkit_dask.serve``), which ends
    when its standard input closes: at :meth:`close`, or when this process dies."""

    def __init__(self, proc: subprocess.Popen[bytes], folder: str, address: str) -> None:
        self.proc = proc
        self.folder = folder
        self.address = address

    @classmethod
    def start(cls, size: LocalSize, nice: int) -> Served:
        folder = tempfile.mkdtemp(prefix="accelkit-dask-")
        address_file = os.path.join(folder, "address")
        log_path = os.path.join(folder, "cluster.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [
                    sys.executable, "-m", "accelkit_dask.serve",
                    "--workers", str(size.workers), "--threads", str(size.threads_per_worker),
                    "--memory", str(size.memory_per_worker), "--nice", str(nice),
                    "--local-directory", os.path.join(tempfile.gettempdir(), "accelkit-dask"),
                    "--address-file", address_file, "--until-stdin-closes",
                ],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        served = cls(proc, folder, "")
        deadline = time.monotonic() + START_TIMEOUT_S
        while not os.path.exists(address_file):
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(log_path, "rb") as fh:
                    tail = fh.read().decode(errors="replace")[-2000:].strip()
                served.close()
                why = "it exited" if proc.returncode is not None else "it timed out"
                raise DeviceError(
                    f"cannot start a local Dask cluster ({why}); its log ends:\n{tail}"
                )
            time.sleep(0.05)
        with open(address_file, encoding="utf-8") as fh:
            served.address = fh.read().strip()
        return served

    def close(self) -> None:
        with contextlib.suppress(OSError):  # already gone
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


class Cluster:
    """A connected client, and the local cluster behind it when the backend started one."""

    def __init__(self, client: Any, local: Any | None, address: str) -> None:
        _quiet_large_graphs()
        self.client = client
        self.local = local
        self.address = address

    @property
    def owned(self) -> bool:
        """Whether the backend started this cluster (and so closes it)."""
        return self.local is not None

    @classmethod
    def start_local(cls, size: LocalSize | None = None) -> Cluster:
        """Start a local cluster in a process of its own (``python -m accelkit_dask.serve``:
        its scheduler's work stays out of this process) and connect to it."""
        from distributed import Client

        from accelkit_dask.priority import worker_nice

        size = size or local_size()
        nice = worker_nice()  # a bad setting is refused before any process starts
        served = Served.start(size, nice)
        try:
            client = Client(served.address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
        except Exception as exc:
            served.close()
            raise DeviceError(f"cannot connect to the local Dask cluster: {exc}") from None
        return cls(client, served, served.address)

    @classmethod
    def connect(cls, address: str, timeout: float = CONNECT_TIMEOUT_S) -> Cluster:
        """Connect to an existing scheduler. Connections are pooled per process: backends on
        the same scheduler share one client (a connection costs a handshake and a thread)."""
        from distributed import Client

        addr = normalize_address(address)
        with _pool_lock:
            client = _clients.get(addr)
            if client is not None and str(client.status) != "running":
                _clients.pop(addr)
                client = None
            if client is None:
                try:
                    client = Client(addr, timeout=timeout, set_as_default=False)
                except Exception as exc:
                    raise DeviceError(
                        f"cannot reach the Dask scheduler at {addr} within {timeout:g} s: {exc}"
                    ) from None
                _clients[addr] = client
        return cls(client, None, addr)

    def workers(self) -> list[WorkerInfo]:
        info = self.client.scheduler_info(n_workers=-1)
        return [
            WorkerInfo(
                address=addr,
                name=str(w.get("name", addr)),
                threads=int(w.get("nthreads", 0)),
                memory_limit=int(w.get("memory_limit") or 0),
                memory_used=int((w.get("metrics") or {}).get("managed_bytes", 0)),
            )
            for addr, w in info.get("workers", {}).items()
        ]

    @property
    def connected(self) -> bool:
        return str(getattr(self.client, "status", "")) == "running"

    def close(self) -> None:
        """Close the cluster when this backend started it; an external cluster keeps running
        (and its pooled connection stays open for the next backend, unless the scheduler is
        gone)."""
        if self.local is None:
            if not self.connected:
                with _pool_lock:
                    if _clients.get(self.address) is self.client:
                        _clients.pop(self.address)
                with contextlib.suppress(Exception):  # its scheduler is gone
                    self.client.close(timeout=5)
            return
        with contextlib.suppress(Exception):
            self.client.close(timeout=10)
        self.local.close()
