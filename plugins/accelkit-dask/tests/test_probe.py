"""The probe: the local device without starting anything, a configured scheduler with its
workers, or with the reason it cannot be reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from accelkit_dask import probe as probe_module
from accelkit_dask.backend import DaskBackend
from accelkit_dask.cluster import local_size, normalize_address

from accelkit.device import Device
from accelkit.errors import InvalidArgumentError
from conftest import free_port


def test_the_probe_lists_the_local_cluster_without_starting_or_importing_it() -> None:
    # In a fresh interpreter: listing devices must not import distributed, let alone start it.
    code = (
        "import sys, json; from accelkit_dask.probe import probe;"
        " d = probe(); print(json.dumps([str(d[0].device), d[0].compute_units,"
        " 'distributed' in sys.modules, 'dask.array' in sys.modules]))"
    )
    env = {k: v for k, v in os.environ.items() if k != "ACCELKIT_DASK_SCHEDULER"}
    env["ACCELKIT_DASK_WORKERS"] = "3"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    device, units, imported_distributed, imported_array = json.loads(
        out.stdout.strip().splitlines()[-1]
    )
    assert device == "dask:0"
    assert units == 3 * max(1, (os.cpu_count() or 1) // 3)
    assert not imported_distributed
    assert not imported_array


def test_worker_counts_from_the_environment_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELKIT_DASK_WORKERS", "0")
    with pytest.raises(InvalidArgumentError, match="ACCELKIT_DASK_WORKERS"):
        local_size()
    monkeypatch.setenv("ACCELKIT_DASK_WORKERS", "two")
    with pytest.raises(InvalidArgumentError, match="positive integer"):
        local_size()


def test_the_workers_nice_value_from_the_environment_is_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from accelkit_dask.cluster import Cluster
    from accelkit_dask.priority import WORKER_NICE, worker_nice

    assert worker_nice() == WORKER_NICE == 0  # off unless asked for
    monkeypatch.setenv("ACCELKIT_DASK_WORKER_NICE", "10")
    assert worker_nice() == 10
    for bad in ("-5", "20", "low"):
        monkeypatch.setenv("ACCELKIT_DASK_WORKER_NICE", bad)
        with pytest.raises(InvalidArgumentError, match="ACCELKIT_DASK_WORKER_NICE"):
            Cluster.start_local()  # refused before a process starts


def test_an_unreachable_scheduler_is_listed_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()  # nothing listens there
    monkeypatch.setenv("ACCELKIT_DASK_SCHEDULER", f"127.0.0.1:{port}")
    monkeypatch.setenv("ACCELKIT_DASK_PROBE_TIMEOUT", "1")
    probe_module._remote_cache.clear()
    start = time.monotonic()
    devices = probe_module.probe()
    took = time.monotonic() - start
    remote = devices[1]
    assert remote.device == f"dask://127.0.0.1:{port}"
    assert remote.extra["reachable"] is False
    assert remote.extra["reason"]
    assert "unreachable" in remote.name
    assert took < 30, f"the probe waited {took:.1f} s for a scheduler that is not there"


def test_a_reachable_scheduler_is_listed_with_its_workers(
    shared_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELKIT_DASK_SCHEDULER", shared_cluster.address)
    probe_module._remote_cache.clear()
    remote = probe_module.probe()[1]
    assert remote.extra == {"reachable": True, "workers": 2, "threads": 2}
    assert remote.memory_bytes > 0
    assert remote.compute_units == 2
    assert remote.device == "dask://" + shared_cluster.address.removeprefix("tcp://")


def test_devices_and_addresses() -> None:
    backend = DaskBackend()
    assert backend.supports_device("dask")
    assert backend.supports_device("dask:0")
    assert backend.supports_device("dask://10.0.0.5:8786")
    assert not backend.supports_device("dask:1")
    assert not backend.supports_device("cpu:0")
    assert Device.parse("dask://10.0.0.5:8786").address == "10.0.0.5:8786"
    assert normalize_address("dask://h:1") == "tcp://h:1"
    assert normalize_address("h:1") == "tcp://h:1"
    assert normalize_address("tls://h:1") == "tls://h:1"


def test_bad_options_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidArgumentError, match="chunk_bytes"):
        DaskBackend(chunk_bytes=0)
    with pytest.raises(InvalidArgumentError, match="split_every"):
        DaskBackend(split_every=1)
    monkeypatch.setenv("ACCELKIT_DASK_CHUNK_BYTES", "lots")
    with pytest.raises(InvalidArgumentError, match="ACCELKIT_DASK_CHUNK_BYTES"):
        DaskBackend()


def test_the_default_device_follows_the_configured_scheduler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert DaskBackend()._default_device() == "dask:0"
    monkeypatch.setenv("ACCELKIT_DASK_SCHEDULER", "tcp://10.1.2.3:8786")
    assert str(DaskBackend()._default_device()) == "dask://10.1.2.3:8786"
