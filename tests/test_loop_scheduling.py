"""The event loop's thread asks Linux for a short time slice at ``initialize`` (so that it wakes
on time while compute keeps every core busy), threads started later keep the default slice, and
``ACCELKIT_LOOP_SLICE_US`` sets or disables it, a bad value refused before anything opens. The
interpreter's switch interval is lowered from Python's default the same way
(``ACCELKIT_SWITCH_INTERVAL_US``), an application's own kept. OpenBLAS's idle threads are told to
stop spinning soon where accelkit is imported before NumPy."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

import accelkit as ak
from accelkit._core import sched
from accelkit.capabilities import LifecycleState
from accelkit.errors import InvalidArgumentError

pytestmark = pytest.mark.anyio


def _supported() -> str | None:
    """Why per-thread slices cannot be used here, or None where they can."""
    numbers = sched._syscalls()
    return numbers if isinstance(numbers, str) else None


# A sandbox (a container's seccomp profile) may refuse the calls on a kernel that has them.
_SANDBOXED = ("Operation not permitted", "Function not implemented")


def _skip_if_sandboxed(status: str | None) -> None:
    if status is not None and any(reason in status for reason in _SANDBOXED):
        pytest.skip(f"this sandbox refuses sched_setattr: {status}")


async def test_initialize_gives_the_loop_thread_a_short_slice_and_not_later_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ACCELKIT_LOOP_SLICE_US", raising=False)
    reason = _supported()
    backend = ak.create_backend("cpu")
    await backend.initialize()
    try:
        if reason is not None:
            assert backend.loop_thread_scheduling == f"left alone: {reason}"
            pytest.skip(f"per-thread time slices are not available: {reason}")
        _skip_if_sandboxed(backend.loop_thread_scheduling)
        assert backend.loop_thread_scheduling == f"slice {sched.DEFAULT_SLICE_US} us"
        assert sched.read_slice_ns() == sched.DEFAULT_SLICE_US * 1000
        seen: list[int | None] = []
        worker = threading.Thread(target=lambda: seen.append(sched.read_slice_ns()))
        worker.start()
        worker.join()
        assert seen[0] is not None
        assert seen[0] != sched.DEFAULT_SLICE_US * 1000  # reset on fork: the default slice
    finally:
        await backend.shutdown()


async def test_the_slice_can_be_set_or_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELKIT_LOOP_SLICE_US", "0")
    backend = ak.create_backend("cpu")
    await backend.initialize()
    try:
        assert backend.loop_thread_scheduling == "left alone (ACCELKIT_LOOP_SLICE_US=0)"
    finally:
        await backend.shutdown()
    if _supported() is None:
        # Run in a fresh thread (its own slice), as a loop started on another thread would be.
        monkeypatch.setenv("ACCELKIT_LOOP_SLICE_US", "250")
        seen: list[object] = []

        def other_loop_thread() -> None:
            seen.append(sched.request_loop_slice())
            seen.append(sched.read_slice_ns())

        worker = threading.Thread(target=other_loop_thread)
        worker.start()
        worker.join()
        _skip_if_sandboxed(str(seen[0]))
        assert seen == ["slice 250 us", 250_000]


@pytest.mark.parametrize(
    ("name", "value"),
    [("ACCELKIT_LOOP_SLICE_US", "-5"), ("ACCELKIT_LOOP_SLICE_US", "fast"),
     ("ACCELKIT_LOOP_SLICE_US", "1.5"), ("ACCELKIT_SWITCH_INTERVAL_US", "-1"),
     ("ACCELKIT_SWITCH_INTERVAL_US", "soon")],
)  # fmt: skip
async def test_a_bad_scheduling_setting_is_refused_before_the_backend_opens(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    backend = ak.create_backend("cpu")
    with pytest.raises(InvalidArgumentError, match=name):
        await backend.initialize()
    assert backend.status.state is LifecycleState.CREATED


@pytest.fixture
def python_switch_interval() -> Iterator[None]:
    """The interpreter's switch interval at Python's default for the test, restored after."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@pytest.mark.usefixtures("python_switch_interval")
async def test_initialize_lowers_the_interpreters_switch_interval_from_pythons_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A backend's worker thread running Python code (a Dask flush, wgpu-py) would keep a woken
    loop waiting up to 5 ms for the GIL; initialize makes that 1 ms."""
    monkeypatch.delenv("ACCELKIT_SWITCH_INTERVAL_US", raising=False)
    async with ak.open_backend("cpu") as backend:
        assert backend.interpreter_switch_interval == f"{sched.DEFAULT_SWITCH_US} us"
        assert sys.getswitchinterval() == pytest.approx(sched.DEFAULT_SWITCH_US / 1e6)
    monkeypatch.setenv("ACCELKIT_SWITCH_INTERVAL_US", "2000")
    sys.setswitchinterval(0.005)
    async with ak.open_backend("cpu") as backend:
        assert backend.interpreter_switch_interval == "2000 us"
        assert sys.getswitchinterval() == pytest.approx(0.002)


@pytest.mark.usefixtures("python_switch_interval")
async def test_an_applications_own_switch_interval_is_kept_and_zero_leaves_it_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ACCELKIT_SWITCH_INTERVAL_US", raising=False)
    sys.setswitchinterval(0.0002)  # the application's choice
    async with ak.open_backend("cpu") as backend:
        assert backend.interpreter_switch_interval == "left at the application's 200 us"
        assert sys.getswitchinterval() == pytest.approx(0.0002)
    sys.setswitchinterval(0.005)
    monkeypatch.setenv("ACCELKIT_SWITCH_INTERVAL_US", "0")
    async with ak.open_backend("cpu") as backend:
        assert backend.interpreter_switch_interval == "left alone (ACCELKIT_SWITCH_INTERVAL_US=0)"
        assert sys.getswitchinterval() == pytest.approx(0.005)


@pytest.mark.parametrize(
    ("before", "want"),
    [
        ("import accelkit, numpy", "14"),  # accelkit first: the short spin
        ("import numpy, accelkit", None),  # too late for OpenBLAS: left alone
        ("import os; os.environ['OPENBLAS_THREAD_TIMEOUT'] = '28'; import accelkit", "28"),
    ],
)
def test_openblas_threads_stop_spinning_soon_where_accelkit_comes_first(
    before: str, want: str | None
) -> None:
    """OpenBLAS's idle workers spin for tens of ms after a GEMM unless told otherwise before
    it loads; accelkit tells it, when it is imported before NumPy and nobody else has."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    script = f"{before}; import os; print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(want)
