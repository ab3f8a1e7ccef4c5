"""Graph keys: unique across the processes that share a scheduler, without a uuid per op."""

from __future__ import annotations

import multiprocessing
import sys

import pytest
from accelkit_dask.submit import unique


def _child_key(queue: multiprocessing.Queue[str]) -> None:
    queue.put(unique("add"))


def test_keys_differ_per_op_and_per_process() -> None:
    keys = {unique("add") for _ in range(1000)}
    assert len(keys) == 1000
    if sys.platform == "win32":
        pytest.skip("fork is a POSIX start method")
    # A forked child starts with this process's counter: its keys must still be its own.
    ctx = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[str] = ctx.Queue()
    child = ctx.Process(target=_child_key, args=(queue,))
    child.start()
    theirs = queue.get(timeout=60)
    child.join(timeout=60)
    mine = unique("add")
    assert theirs.split("-")[2] != mine.split("-")[2]  # the process part
    assert theirs not in keys
    assert theirs != mine
