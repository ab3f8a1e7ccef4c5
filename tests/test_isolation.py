"""Isolated backends (``open_backend(name, isolate=True)``): the work runs in a worker process,
and its faults (a kill, an abort, a sticky device error, a hang) end in typed errors, no leak
and no hang in the user's process, and a backend that ``recover()`` brings back.

The faults come from the test backend of :mod:`support.isolation_faults` (user kernels in
Python, run in the worker)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pytest

import accelkit as ak
from accelkit._core.isolation import faults
from accelkit._core.isolation.backend import IsolatedBackend
from accelkit.cli import doctor
from accelkit.errors import (
    NotInitializedError,
    StaleHandleError,
    UnsupportedOperationError,
    WorkerLostError,
)
from support.isolation_faults import KERNELS

pytestmark = pytest.mark.anyio

FAULTY = "support.isolation_faults:FaultyBackend"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault log (and every other cache) in a folder of the test's own."""
    monkeypatch.setenv("ACCELKIT_CACHE_DIR", str(tmp_path / "cache"))


def _segments() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(f"accelkit-iso-{os.getpid()}-")}
    except OSError:
        return set()


async def _check_recovered(b: Any) -> None:
    """After recover(): correct results against NumPy, and the old world stale."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 48)).astype(np.float32)
    c = rng.standard_normal((48, 32)).astype(np.float32)
    ta, tc = b.tensor_factory.from_host(a), b.tensor_factory.from_host(c)
    got = await b.tensor_ops.matmul(ta, tc).to_host()
    eps = float(np.finfo(np.float32).eps)
    np.testing.assert_allclose(got, a @ c, rtol=64 * eps * 48, atol=64 * eps * 48)
    assert b.status.state is ak.LifecycleState.READY


async def test_isolated_cpu_computes_like_numpy(anyio_backend: str) -> None:
    async with ak.open_backend("cpu", isolate=True) as b:
        assert isinstance(b, IsolatedBackend)
        assert b.name == "cpu"
        pid = b.worker_pid
        assert pid is not None
        assert pid != os.getpid()
        x = np.linspace(-2, 2, 3000, dtype=np.float32).reshape(30, 100)
        t = b.tensor_factory.from_host(x)
        y = b.tensor_ops.unary("exp", t) * 2.0 + t
        eps = float(np.finfo(np.float32).eps)
        # exp within a few ulp, then two roundings; near x = -0.85 the sum cancels, so the
        # bound follows the magnitudes summed, not the result
        x64 = x.astype(np.float64)
        want = np.exp(x64) * 2 + x64
        bound = 8 * eps * (2 * np.exp(x64) + np.abs(x64))
        err = np.abs(await y.to_host() - want)
        assert np.all(err <= bound), float(np.max(err / bound))
        # a large transfer comes through shared memory
        big = np.arange(1 << 20, dtype=np.float32)
        tb = b.tensor_factory.from_host(big)
        np.testing.assert_array_equal(await (tb + 1.0).to_host(), big + 1)
        # large reads of other dtypes, and of a view, land in the caller's segment as they are
        rng = np.random.default_rng(5)
        for arr in (
            rng.standard_normal((512, 300)).astype(np.float16),
            rng.integers(-(2**40), 2**40, (300, 200), dtype=np.int64),
            rng.random((700, 500)) < 0.5,
        ):
            tt = b.tensor_factory.from_host(arr)
            np.testing.assert_array_equal(await tt.to_host(), arr)
            flat = b.tensor_ops.reshape(tt, (arr.size,))
            np.testing.assert_array_equal(await flat.to_host(), arr.reshape(-1))
        del tt, flat  # the memory check below counts live tensors
        # streams and events
        s = b.create_stream()
        with b.use_stream(s):
            z = t * 3.0
            ev = s.record_event()
        b.default_stream.wait_event(ev)
        w = z + 1.0
        np.testing.assert_allclose(await w.to_host(), x * 3 + 1, rtol=4 * eps)
        # raw buffers
        buf = b.memory_manager.allocate(4096)
        src = np.arange(1024, dtype=np.float32)
        await b.memory_manager.copy_htod(buf, src)
        out = np.empty(1024, np.float32)
        await b.memory_manager.copy_dtoh(out, buf)
        np.testing.assert_array_equal(out, src)
        b.memory_manager.free(buf)
        with pytest.raises(UnsupportedOperationError, match="DLPack"):
            t.__dlpack__()
        del t, y, tb, z, w, buf
        info = await b.worker_memory_info()
        assert info.used == 0, info
        assert not _segments()
    assert b.worker_used_at_shutdown == 0
    assert b.memory_manager.memory_info().used == 0
    assert not _alive(pid)


async def test_user_kernels_run_in_the_worker(anyio_backend: str) -> None:
    async with ak.open_backend("cpu") as _cpu:
        pass
    b = IsolatedBackend(FAULTY)
    await b.initialize("cpu:0")
    try:
        ex = b.kernel_executor
        assert ex is not None
        assert "python" in ex.languages
        h = await ex.load_kernel(KERNELS, "scale", language="python")
        x = np.arange(10, dtype=np.float32)
        t = b.tensor_factory.from_host(x)
        ex.execute_kernel(h, (1,), (1,), [t, 3.0])
        np.testing.assert_array_equal(await t.to_host(), x * 3)
        assert ex.kernel_info(h).name == "scale"
    finally:
        await b.shutdown()


async def _open_faulty(deadline: float | None = None) -> IsolatedBackend:
    b = IsolatedBackend(FAULTY, deadline=deadline)
    await b.initialize("cpu:0")
    return b


def _no_leak(pids: list[int]) -> None:
    assert not _segments()
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)]


async def _recovers_after(b: IsolatedBackend, pid: int) -> None:
    """The lost worker ``pid`` left nothing behind, and a recovered backend computes right;
    a stream of the lost worker is stale (``use_stream`` called it another backend's)."""
    _no_leak([pid])
    old = b.streams[0]  # (the default stream: default_stream refuses while the backend failed)
    with anyio.fail_after(60):
        await b.recover()
    await _check_recovered(b)
    with pytest.raises(StaleHandleError, match="before it was shut down"), b.use_stream(old):
        pass


async def test_worker_killed_mid_gemm(anyio_backend: str) -> None:
    b = await _open_faulty()
    try:
        pid = b.worker_pid
        assert pid is not None
        # Seconds of GEMMs on any machine the kill below can meet (12 x 17 GFLOP: 6 x 7 was
        # done before the kill 0.3 s in on a 2-core AVX-512 VM, and no await failed).
        n = 2048
        a = b.tensor_factory.from_host(np.ones((n, n), np.float32))
        outs = [b.tensor_ops.matmul(a, a) for _ in range(12)]
        errors: list[BaseException] = []

        async def wait(t: Any) -> None:
            try:
                await t.to_host()
            except BaseException as exc:
                errors.append(exc)

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for t in (outs[-1], outs[-2]):  # two awaits pending when the worker dies
                    tg.start_soon(wait, t)
                await anyio.sleep(0.3)
                os.kill(pid, signal.SIGKILL)
        assert len(errors) == 2, errors
        assert all(isinstance(e, WorkerLostError) for e in errors), errors
        assert all("SIGKILL" in str(e) for e in errors)
        with pytest.raises((WorkerLostError, StaleHandleError)):  # a new await: stale
            await outs[0].to_host()
        lost = errors[0]
        assert isinstance(lost, WorkerLostError)
        assert lost.cause == "SIGKILL"
        assert "SIGKILL" in (b.status.error or "")
        gen = b.generation
        with pytest.raises((NotInitializedError, StaleHandleError)):
            b.tensor_ops.unary("neg", a)
        _no_leak([pid])
        with anyio.fail_after(60):
            await b.recover()
        assert b.generation > gen
        assert b.worker_pid not in (None, pid)
        with pytest.raises(StaleHandleError):
            b.tensor_ops.unary("neg", a)
        await _check_recovered(b)
        assert b.last_fault is not None
        assert "recovered from" in (b.status.error or "")
    finally:
        await b.shutdown()


@pytest.mark.parametrize("kernel", ["abort", "poison"])
async def test_worker_abort_and_sticky_error(anyio_backend: str, kernel: str) -> None:
    b = await _open_faulty()
    try:
        pid = b.worker_pid
        assert pid is not None
        ex = b.kernel_executor
        assert ex is not None
        h = await ex.load_kernel(KERNELS, kernel, language="python")
        t = b.tensor_factory.from_host(np.zeros(8, np.float32))
        ex.execute_kernel(h, (1,), (1,), [t])
        with anyio.fail_after(20), pytest.raises(WorkerLostError) as info:
            await t.to_host()
        text = str(info.value)
        if kernel == "abort":
            assert info.value.cause == "SIGABRT"
            assert "the test kernel aborts on purpose" in text
            assert "the test kernel aborts on purpose" in info.value.stderr_tail
        else:
            assert "sticky" in text
            assert "illegal memory access" in text
        _no_leak([pid])
        # the fault is logged, and `accelkit doctor` (another process, later) shows it
        (entry,) = faults.read()
        assert (entry.pid, entry.generation) == (os.getpid(), b.generation - 1)  # it ended
        assert entry.cause == info.value.cause
        assert entry.message == text.split("\n", 1)[0]
        notes = [f for f in doctor.diagnose().findings if f.check == "isolation"]
        assert len(notes) == 1
        assert notes[0].level == "note"
        assert f"process {os.getpid()}" in notes[0].message
        assert f"({entry.cause}) at generation {entry.generation}" in notes[0].message
        with anyio.fail_after(60):
            await b.recover()
        await _check_recovered(b)
    finally:
        await b.shutdown()


async def test_hung_worker_past_the_deadline(anyio_backend: str) -> None:
    b = await _open_faulty(deadline=1.0)
    try:
        pid = b.worker_pid
        assert pid is not None
        ex = b.kernel_executor
        assert ex is not None
        h = await ex.load_kernel(KERNELS, "hang", language="python")
        t = b.tensor_factory.from_host(np.zeros(8, np.float32))
        ex.execute_kernel(h, (1,), (1,), [t])
        with anyio.fail_after(20), pytest.raises(WorkerLostError, match="hung") as info:
            await t.to_host()
        assert info.value.cause == "hang"
        await _recovers_after(b, pid)
    finally:
        await b.shutdown()


async def test_idle_hung_worker_is_found(anyio_backend: str) -> None:
    """A worker that stops answering while nothing is pending is found by the idle ping within
    about the deadline, without any work submitted."""
    deadline = 3.0  # pinged every 1.5 s; a loaded machine answers well within 3 s
    b = IsolatedBackend("cpu", deadline=deadline)
    await b.initialize()
    try:
        pid = b.worker_pid
        assert pid is not None
        t = b.tensor_factory.from_host(np.arange(8, dtype=np.float32))
        await t.to_host()
        await anyio.sleep(deadline + 0.5)  # idle past the deadline: answered pings keep it
        assert b.is_ready
        os.kill(pid, signal.SIGSTOP)  # hung: alive, but it answers nothing
        t0 = time.monotonic()
        with anyio.fail_after(30):
            while b.is_ready:  # noqa: ASYNC110 - the fault is noticed on another thread
                await anyio.sleep(0.05)
        assert time.monotonic() - t0 < 3 * deadline  # a ping's interval, then the deadline
        assert b.last_fault is not None
        assert b.last_fault.cause == "hang"
        with pytest.raises(StaleHandleError):
            await t.to_host()
        await _recovers_after(b, pid)
    finally:
        await b.shutdown()


async def test_restarts_are_rate_limited(anyio_backend: str) -> None:
    b = IsolatedBackend("cpu", max_restarts=1, restart_window=600)
    await b.initialize()
    try:
        for attempt in range(2):
            pid = b.worker_pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            with anyio.fail_after(20):
                while b.is_ready:  # noqa: ASYNC110 - the fault is noticed on another thread
                    await anyio.sleep(0.02)
            if attempt == 0:
                await b.recover()
            else:
                with pytest.raises(ak.DeviceError, match="restarted 1 times"):
                    await b.recover()
    finally:
        await b.shutdown()


async def test_auto_recover_starts_a_new_worker(anyio_backend: str) -> None:
    b = IsolatedBackend("cpu", auto_recover=True)
    await b.initialize()
    try:
        pid = b.worker_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with anyio.fail_after(60):
            while b.worker_pid in (None, pid) or not b.is_ready:  # noqa: ASYNC110 - a thread
                await anyio.sleep(0.05)
        assert b.last_fault is not None
        assert b.last_fault.cause == "SIGKILL"
        await _check_recovered(b)
    finally:
        await b.shutdown()
    _no_leak([pid])


async def test_auto_recover_under_concurrent_use(anyio_backend: str) -> None:
    """Several tasks computing when the worker is killed: each sees typed errors only, one new
    worker is started, and every task then computes correctly on it."""
    b = IsolatedBackend("cpu", auto_recover=True)
    await b.initialize()
    pid = b.worker_pid
    assert pid is not None
    seen: list[type[BaseException]] = []
    done: list[int] = []
    eps = float(np.finfo(np.float32).eps)

    async def user(i: int) -> None:
        a = np.random.default_rng(i).standard_normal((48, 48)).astype(np.float32)
        while True:
            before = b.worker_pid
            try:
                t = b.tensor_factory.from_host(a)
                got = await b.tensor_ops.matmul(t, t + float(i)).to_host()
            except (WorkerLostError, StaleHandleError, NotInitializedError) as exc:
                seen.append(type(exc))
                await anyio.sleep(0.01)
                continue
            np.testing.assert_allclose(got, a @ (a + i), rtol=48 * 8 * eps, atol=48 * 8 * eps)
            if before not in (None, pid):  # computed by the new worker
                done.append(i)
                return
            await anyio.sleep(0.001)

    try:
        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(user, i)
                await anyio.sleep(0.3)
                os.kill(pid, signal.SIGKILL)
        assert sorted(done) == [0, 1, 2, 3]
        assert seen, "no task saw the fault"
        assert b.restarts == 1
        assert b.last_fault is not None
        assert b.last_fault.cause == "SIGKILL"
    finally:
        await b.shutdown()
    _no_leak([pid])


async def test_cancelled_open_leaves_no_worker(anyio_backend: str) -> None:
    before = _children()
    with anyio.move_on_after(0.2):
        async with ak.open_backend("cpu", isolate=True):
            await anyio.sleep(30)
    deadline = time.monotonic() + 10
    while _children() - before and time.monotonic() < deadline:  # noqa: ASYNC110 - a process
        await anyio.sleep(0.05)
    assert not (_children() - before)


def _children() -> set[int]:
    try:
        import psutil  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        out = subprocess.run(
            ["ps", "-o", "pid=,stat=", "--ppid", str(os.getpid())],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        return {int(p) for p, st in (ln.split() for ln in out.splitlines()) if "Z" not in st}
    return {c.pid for c in psutil.Process().children() if c.status() != psutil.STATUS_ZOMBIE}


def test_worker_exits_when_its_parent_is_killed(tmp_path: Any) -> None:
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, anyio, accelkit as ak

            async def main():
                async with ak.open_backend("cpu", isolate=True) as b:
                    print(b.worker_pid, flush=True)
                    await anyio.sleep(600)

            anyio.run(main)
            """
        )
    )
    parent = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        worker = int(line)
        assert _alive(worker)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 5
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker), "the worker outlived its parent"


def _iso_threads() -> set[Any]:
    return {t for t in threading.enumerate() if t.name.startswith("accelkit-iso")}


async def test_shutdown_and_a_lost_worker_leave_no_thread(anyio_backend: str) -> None:
    """Each link's flusher thread ends with it: at shutdown and when its worker is lost (it
    waited on its condition for good, one thread and one link kept per backend opened)."""
    before = _iso_threads()
    for _ in range(2):
        async with ak.open_backend("cpu", isolate=True) as b:
            await b.tensor_factory.from_host(np.ones(4, np.float32)).to_host()
    b = await _open_faulty()
    try:
        pid = b.worker_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        # The op's own failure, or (where the reader reported the loss before the op, the
        # loop thread descheduled 20 ms under load) the failed backend's refusal
        with pytest.raises((WorkerLostError, NotInitializedError)):
            with anyio.fail_after(20):
                await b.tensor_factory.from_host(np.ones(4, np.float32)).to_host()
    finally:
        await b.shutdown()
    deadline = time.monotonic() + 10
    while (left := _iso_threads() - before) and time.monotonic() < deadline:  # noqa: ASYNC110 - threads ending: no event to await
        await anyio.sleep(0.05)
    assert not left, sorted(t.name for t in left)


async def test_a_send_to_a_lost_worker_fails_the_link_before_the_reader_says_so(
    anyio_backend: str,
) -> None:
    """A write to a dead worker's pipe makes the link faulty at once: a shutdown before the
    reader thread has seen the pipe's end took the healthy path, waited for the streams through
    the dead pipe, and raised WorkerLostError (CI, once in a few hundred runs). Here the reader
    is held until the shutdown has begun, so the order is the failing one every time."""
    b = await _open_faulty()
    link: Any = b._link
    real_lost = link.lost

    def late_lost(*args: Any, **kwargs: Any) -> None:
        deadline = time.monotonic() + 10
        while not link.closing and time.monotonic() < deadline:
            time.sleep(0.01)
        real_lost(*args, **kwargs)

    link.lost = late_lost
    pid = b.worker_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    link.proc.wait(10)
    with pytest.raises(WorkerLostError, match="cannot be reached"):
        with anyio.fail_after(20):
            await b.tensor_factory.from_host(np.ones(4, np.float32)).to_host()
    assert link.fault is not None
    assert b.worker_pid is None
    with anyio.fail_after(30):
        await b.shutdown()  # raised WorkerLostError


@pytest.mark.parametrize("then", ["recover", "shutdown"])
async def test_a_stop_before_the_reader_reports_a_loss_fails_the_other_awaits(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    """A failed send faults the link before the reader has seen the pipe's end; a recover()
    (what the error advises) or a shutdown in that window stopped the link, so the reader
    reported nothing: another task's await of queued work hung, and the fault was never
    recorded. The stop now lets the loss be reported first (here the reader is held until the
    link closes, so the stop reports it itself)."""
    from accelkit._core.isolation import backend as iso

    monkeypatch.setattr(iso, "_SETTLE_S", 0.5)
    b = await _open_faulty()
    link: Any = b._link
    real_lost = link.lost

    def late_lost(*args: Any, **kwargs: Any) -> None:
        deadline = time.monotonic() + 20
        while threading.current_thread() is link.reader and not link.closing:
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        real_lost(*args, **kwargs)

    link.lost = late_lost
    x = b.tensor_factory.from_host(np.ones(4, np.float32))
    await x.to_host()
    pid = b.worker_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    link.proc.wait(10)
    stream: Any = b.default_stream
    b.tensor_ops.add(x, 1.0)  # task B's work, queued
    position = stream.submitted
    got: list[str] = []

    async def task_b() -> None:
        try:
            with anyio.fail_after(15):
                await stream.wait_for(position)
            got.append("returned")
        except WorkerLostError:
            got.append("WorkerLostError")

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(task_b)
            with pytest.raises(WorkerLostError, match="cannot be reached"):  # task A
                await b.tensor_factory.from_host(np.ones(4, np.float32)).to_host()
            if then == "recover":
                await b.recover()
            else:
                await b.shutdown()
        assert got == ["WorkerLostError"]  # it hung
        assert b.last_fault is not None
        if then == "recover":
            with pytest.raises(StaleHandleError):
                b.memory_manager.free(x)  # of the old worker: it freed a new tensor's block
            z = b.tensor_factory.from_host(np.full(4, 5, np.float32))
            np.testing.assert_array_equal(await z.to_host(), np.full(4, 5, np.float32))
    finally:
        await b.shutdown()


async def test_a_stream_kept_past_shutdown_refuses_work(anyio_backend: str) -> None:
    """Its link may serve another backend next (a spare worker): a stream of the shut-down
    backend refuses work (a call was accepted, sent nowhere, and its synchronize hung)."""
    b = ak.create_backend("cpu", isolate=True)
    await b.initialize()
    stream: Any = b.default_stream
    other: Any = b.create_stream()
    event = other.record_event()
    await b.tensor_factory.from_host(np.ones((4, 4), np.float32)).to_host()
    submitted = stream.submitted
    await b.shutdown()
    calls: list[Callable[[], object]] = [
        lambda: stream.link.call(stream, ("t", "unary", (), {})),  # what an op's submission does
        lambda: stream.record_event(),
        lambda: stream.wait_event(event),
    ]
    for call in calls:
        with pytest.raises(StaleHandleError, match="the stream was closed"):
            call()
    assert stream.submitted == submitted
    with anyio.fail_after(5):
        await stream.synchronize()


async def _lost_worker(auto_recover: bool) -> tuple[IsolatedBackend, int]:
    """An isolated CPU backend whose worker was killed, seen by a failed request."""
    b = IsolatedBackend("cpu", auto_recover=auto_recover)
    await b.initialize()
    a = b.tensor_factory.from_host(np.ones((4, 4), np.float32))
    await a.to_host()
    pid = b.worker_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    # The op's own failure; or the failed backend's refusal, where the reader reported the
    # loss first (the loop descheduled 20 ms under load); or, once an automatic recovery has
    # finished, the stale tensor
    with (
        pytest.raises((WorkerLostError, NotInitializedError, StaleHandleError)),
        anyio.fail_after(20),
    ):
        await b.tensor_ops.add(a, a).to_host()
    return b, pid


@pytest.mark.parametrize("delay", [0.0, 0.2])
async def test_a_shutdown_during_an_automatic_recovery_stays_shut_down(
    anyio_backend: str, delay: float
) -> None:
    """The worker dies, the automatic recovery starts a new one on its thread, and the service
    shuts the backend down meanwhile: the backend stays shut down and the new worker is stopped
    (the recovery made it ready again, its worker running with nobody to stop it)."""
    b, pid = await _lost_worker(auto_recover=True)
    await anyio.sleep(delay)
    await b.shutdown()
    with anyio.fail_after(60):
        while b._recover_thread is not None:  # noqa: ASYNC110 - a thread
            await anyio.sleep(0.05)
    assert b.state is ak.LifecycleState.SHUT_DOWN
    assert b.worker_pid is None
    _no_leak([pid])


@pytest.mark.parametrize("auto_recover", [False, True], ids=["two-recovers", "auto-and-recover"])
async def test_recoveries_at_once_start_one_worker(anyio_backend: str, auto_recover: bool) -> None:
    """Two recover() calls at once (or one beside the automatic recovery) each started a worker;
    one was installed, and the other outlived shutdown."""
    before = _worker_children()
    b, pid = await _lost_worker(auto_recover=auto_recover)
    try:
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(b.recover)
        with anyio.fail_after(60):
            while b._recover_thread is not None:  # noqa: ASYNC110 - a thread
                await anyio.sleep(0.05)
        assert b.is_ready
        assert len(b._restarts) == 1, b._restarts
        assert len(_worker_children() - before) == 1  # the one installed
    finally:
        await b.shutdown()
    _no_leak([pid])
    deadline = time.monotonic() + 10
    while (left := _worker_children() - before) and time.monotonic() < deadline:  # noqa: ASYNC110 - processes ending
        await anyio.sleep(0.05)
    assert not left


def _worker_children() -> set[int]:
    """The isolated workers this process started that are alive (not zombies)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        state, ppid = fields[0], int(fields[1])
        if ppid == os.getpid() and state != "Z" and b"isolation.worker" in cmdline:
            found.add(int(entry))
    return found


async def test_a_recover_overlapping_a_shutdown_installs_no_worker(anyio_backend: str) -> None:
    """recover() starting a new worker while shutdown() runs and returns: it finds the backend
    shut down and stops that worker (it installed it, ready, once shutdown had cleared its
    flag)."""
    b, pid = await _lost_worker(auto_recover=False)
    errors: list[BaseException] = []
    ended = anyio.Event()

    async def recover() -> None:
        try:
            await b.recover()
        except NotInitializedError as exc:
            errors.append(exc)
        finally:
            ended.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(recover)
        with anyio.fail_after(30):  # until recover has begun the restart (or has ended)
            while not b._restarts and not ended.is_set():  # noqa: ASYNC110 - no event for it
                await anyio.sleep(0.001)
        await b.shutdown()
    assert b.state is ak.LifecycleState.SHUT_DOWN, (b.state, errors)
    assert b.worker_pid is None
    if b._restarts:  # the restart overlapped the shutdown: recover said why it stopped
        assert "shut down while its worker was restarted" in str(errors[0])
    _no_leak([pid])


@pytest.mark.parametrize("value", ["5s", "-1", "nan"])
def test_a_malformed_deadline_is_refused_when_the_backend_is_made(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """ACCELKIT_ISOLATE_DEADLINE_S='5s' became 300 s, '-1' killed the watchdog's thread (the
    backend ran on with no hang detection), 'nan' turned hang detection off."""
    monkeypatch.setenv("ACCELKIT_ISOLATE_DEADLINE_S", value)
    with pytest.raises(ak.InvalidArgumentError, match="ACCELKIT_ISOLATE_DEADLINE_S"):
        ak.create_backend("cpu", isolate=True)
    monkeypatch.delenv("ACCELKIT_ISOLATE_DEADLINE_S")
    with pytest.raises(ak.InvalidArgumentError, match="deadline"):
        IsolatedBackend("cpu", deadline=-1.0)
    assert IsolatedBackend("cpu", deadline=0.0).deadline == 0.0


def test_a_fault_log_line_nested_past_json_s_depth_is_skipped() -> None:
    """A corrupt line of ``[`` deeper than the json parser goes raised RecursionError out of
    faults.read (and so out of `accelkit doctor`)."""
    path = faults.log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("[" * 100_000 + "\n")
    assert faults.read() == []


def test_a_plugin_registered_in_process_is_refused_isolated_with_the_reason() -> None:
    """The worker process sees only installed plugins: it answered "no backend named 'local'
    is installed", and the plugin was quarantined at initialize."""
    from accelkit.backends.cpu.backend import CPUBackend
    from accelkit.device import Device, DeviceInfo
    from accelkit.plugins import PLUGIN_API_VERSION, PluginDescriptor
    from accelkit.registry import Registry

    class Local(CPUBackend):
        name = "local"
        device_kinds = frozenset({"cpu"})

    reg = Registry()
    reg.register(
        PluginDescriptor(
            name="local", distribution="", version="0.1", api_version=PLUGIN_API_VERSION,
            device_kinds=frozenset({"cpu"}), backend_class="x:Local",
        ),
        backend_class=Local,
        probe=lambda: [DeviceInfo(device=Device("cpu", 0), backend="local", name="local cpu")],
    )  # fmt: skip
    with pytest.raises(ak.InvalidArgumentError, match=r"'local' was registered in this process"):
        ak.create_backend("local", registry=reg, isolate=True)
    assert "local" not in [r.name for r in reg.quarantined()]
    assert ak.create_backend("local", registry=reg).name == "local"  # not isolated: as before


@pytest.mark.parametrize("after", [0.05, 0.3])
async def test_a_cancelled_initialize_leaves_no_worker_nor_thread(
    anyio_backend: str, after: float
) -> None:
    """The close of a worker whose open was cancelled ran inside the cancelled scope, so it was
    cancelled before it began: the killed worker stayed a zombie and its flusher thread ran on
    past shutdown."""
    warm = ak.create_backend("cpu", isolate=True)
    await warm.initialize()
    await warm.shutdown()
    before = set(threading.enumerate())
    b = ak.create_backend("cpu", isolate=True)
    with anyio.move_on_after(after):
        await b.initialize()
    await b.initialize()  # cancelled or not, the backend opens again
    np.testing.assert_array_equal(await b.tensor_factory.full((2,), 3.0).to_host(), 3.0)
    await b.shutdown()

    def new_threads() -> list[str]:  # (the async libraries' idle worker threads aside)
        idle = ("AnyIO worker thread", "Trio thread")
        return [
            t.name for t in threading.enumerate() if t not in before and not t.name.startswith(idle)
        ]

    with anyio.move_on_after(10):
        while new_threads():  # noqa: ASYNC110
            await anyio.sleep(0.05)
    assert new_threads() == []


def test_an_isolated_backend_leaves_an_addressed_device_to_its_worker() -> None:
    """The default supports_device refuses an address (an index-based backend cannot drive
    cpu://host:1); an isolated backend lets its worker decide (isolated Dask on a scheduler's
    address was refused, and the dask plugin quarantined)."""
    assert not ak.create_backend("cpu").supports_device("cpu://127.0.0.1:1")
    isolated = IsolatedBackend("cpu")
    assert isolated.supports_device("cpu:0")
    assert isolated.supports_device("cpu://127.0.0.1:1")  # the worker refuses it, if it must
    assert not isolated.supports_device("cuda:0")
