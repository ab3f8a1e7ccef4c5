"""``python -m accelkit_dask.serve``: run a local Dask cluster for other processes to share.

Starts a ``LocalCluster`` of worker processes, prints its scheduler address (and writes it to
``--address-file``), and runs until interrupted or, with ``--until-stdin-closes``, until its
standard input closes (so a parent that dies takes it along). Point backends at it with
``ACCELKIT_DASK_SCHEDULER=<address>`` or the device ``dask://<address>``; the conformance suite's
CI run uses it so that thousands of tests share one cluster.

The ``dask`` device runs its own local cluster this way too, in a process of its own: a
``LocalCluster`` started in the application's process would run the scheduler there, and the
scheduler's Python work would take the interpreter from the application's event loop.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Any


def local_cluster(
    workers: int, threads: int, memory: int | str, nice: int, local_directory: str | None
) -> Any:
    """A ``LocalCluster`` of ``workers`` processes, its scheduler in this process; workers at
    nice ``nice`` when it is not 0 (see :mod:`accelkit_dask.priority`)."""
    from distributed import LocalCluster

    extra: dict[str, Any] = {}
    if nice:
        from accelkit_dask.priority import Background

        extra["plugins"] = (Background(nice),)  # a worker the nanny restarts gets it too
    if local_directory:
        extra["local_directory"] = local_directory
    return LocalCluster(
        n_workers=workers,
        threads_per_worker=threads,
        memory_limit=memory,
        processes=True,
        dashboard_address=None,
        worker_dashboard_address=None,
        silence_logs=logging.ERROR,
        **extra,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accelkit_dask.serve", description=__doc__)
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--threads", type=int, default=1, help="threads per worker (1)")
    parser.add_argument("--memory", default="auto", help="memory limit per worker (auto)")
    parser.add_argument(
        "--nice", type=int, default=0, help="the workers' nice value, 0-19 (0: left as is)"
    )
    parser.add_argument("--local-directory", help="the workers' scratch folder")
    parser.add_argument("--address-file", help="write the scheduler address here")
    parser.add_argument("--until-stdin-closes", action="store_true")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.threads < 1:
        parser.error("--workers and --threads must be positive")
    if not 0 <= args.nice <= 19:
        parser.error("--nice must be from 0 to 19")
    memory = int(args.memory) if args.memory.isdigit() else args.memory

    cluster = local_cluster(args.workers, args.threads, memory, args.nice, args.local_directory)
    address = cluster.scheduler_address
    print(address, flush=True)
    if args.address_file:
        tmp = args.address_file + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(address + "\n")
        os.replace(tmp, args.address_file)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    if args.until_stdin_closes:

        def watch() -> None:
            sys.stdin.read()
            done.set()

        threading.Thread(target=watch, daemon=True).start()
    done.wait()
    cluster.close(timeout=20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
