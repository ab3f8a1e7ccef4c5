"""The service test's stall sampler (``service_app.StallSampler``) names where the loop waited:
the loop thread's own long call, and another thread that kept the GIL while the loop was ready.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator

import anyio
import pytest

from service_app import LagMeter, StallSampler, format_stall_sites

pytestmark = pytest.mark.anyio


def _python_busy_on_the_loop(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _python_busy_on_a_thread(seconds: float) -> None:
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1


@pytest.fixture
def python_switch_interval() -> Iterator[None]:
    """Python's default switch interval (5 ms) while the test runs: an opened backend may have
    lowered it to 1 ms in this process, and then the hog would delay no beat past 3 ms."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


async def test_the_sampler_names_the_loops_long_call_and_the_gil_holder(
    python_switch_interval: None,
) -> None:
    sampler = StallSampler()
    meter = LagMeter(sampler)
    async with anyio.create_task_group() as tg:
        tg.start_soon(meter.run)
        await anyio.sleep(0.05)
        # The loop itself: 100 ms late, ~45 samples. A sampler thread starved of the CPU may
        # wake only after a burst (CI, loaded: 1 run in ~130 had no sample in it): another
        # burst, until one is sampled (at most 20).
        for _ in range(20):
            _python_busy_on_the_loop(0.1)
            await anyio.sleep(0.02)
            if any("_python_busy_on_the_loop" in site for site in sampler.loop_sites):
                break
        worker = threading.Thread(target=_python_busy_on_a_thread, args=(0.5,), name="hog")
        worker.start()
        await anyio.sleep(0.55)  # the loop is ready, but the hog runs Python: the GIL
        worker.join()
        await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    report = sampler.report(top=20)
    text = format_stall_sites(report)
    assert report["stalls"] > 0, text
    assert any("_python_busy_on_the_loop" in site for site, _ in report["loop"]), text
    # The hog keeps the GIL for up to the switch interval (5 ms) at each handoff: beats late
    # by more than 3 ms, sampled when the hog lets go.
    assert any(
        "[hog]" in site and "_python_busy_on_a_thread" in site for site, _ in report["others"]
    ), text
    late = [1e3 * v for v in meter.samples]
    assert max(late) >= 90, late  # the 100 ms on the loop was measured
