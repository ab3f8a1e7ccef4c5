"""Kernel variants are verified in a child process before use, whatever the host.

The faults are injected (``ACCELKIT_OPENCL_VERIFY_FAULTS``) so that these tests prove the
machinery on any machine: a candidate whose build kills the child (as PoCL's compiler does with
16-wide ``fma`` on some AMD hosts), one that hangs, one whose build yields no kernel, one that
computes a wrong result, and a corrupt verdict store. Each must end in a verified variant (the
portable one where every better candidate failed), recorded with its reason, with this process
alive and its memory accounting unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import accelkit_opencl.variants as variants
import anyio
import numpy as np
import pytest
from accelkit_opencl.probe import cl_devices
from accelkit_opencl.variants import candidates, forget_verifiers, verifier_for

from accelkit.dtype import DType
from accelkit.errors import KernelCompileError, UnsupportedOperationError
from accelkit.testing.checks import assert_gemm_close

FAMILY = "gemm_packed.f32"
FAULTS = ("abort", "nokernel")


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opencl_cache: Path) -> Iterator[Path]:
    """A fresh verdict store for the test, and no verifier of another test's store; program
    caches of its own too (opencl_cache), so that every candidate is really built here, not
    loaded from what an earlier test of the run compiled."""
    path = tmp_path / "variants.json"
    monkeypatch.setenv("ACCELKIT_OPENCL_VARIANTS_FILE", str(path))
    monkeypatch.delenv("ACCELKIT_OPENCL_VERIFY", raising=False)
    forget_verifiers()
    yield path
    forget_verifiers()


def _device() -> Any:
    return cl_devices()[0]


def _inject(monkeypatch: pytest.MonkeyPatch, faults: dict[str, str]) -> None:
    monkeypatch.setenv("ACCELKIT_OPENCL_VERIFY_FAULTS", json.dumps(faults))


def test_every_family_ends_in_its_portable_variant() -> None:
    dev = _device()
    for family in variants.families(dev):
        cands = candidates(dev, family)
        if family == "fp64":  # an extension: no portable form (refused when it fails)
            assert [c.portable for c in cands] == [False]
            continue
        assert cands[-1].portable
        assert not any(c.portable for c in cands[:-1])
        assert len({c.label for c in cands}) == len(cands), "candidates are distinct"


def test_crashing_empty_and_wrong_candidates_fall_to_a_verified_one(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev = _device()
    cands = candidates(dev, FAMILY)
    better = cands[:-1]
    faults = {c.id: FAULTS[i % len(FAULTS)] for i, c in enumerate(better)}
    _inject(monkeypatch, faults)
    messages: list[str] = []
    v = verifier_for(dev, 0)
    v.run(progress=messages.append, families=[FAMILY])

    results = json.loads(store.read_text())["devices"][v.key][FAMILY]
    for c in better:
        r = results["results"][c.label]
        assert r["ok"] is False, c.id
        fault = faults[c.id]
        if r["reason"].startswith("not tried"):
            # a block at least as wide as one that crashed: recorded failed without a build
            assert "SIGABRT" in r["reason"]
            assert any(faults[o.id] == "abort" and o.value.width <= c.value.width for o in better)
        elif fault == "abort":
            assert "SIGABRT" in r["reason"]
        elif fault == "nokernel":
            assert "KernelCompileError" in r["reason"]
    assert results["chosen"] == cands[-1].label
    assert results["results"][cands[-1].label]["ok"] is True
    cand, choice = v.choice(FAMILY)
    assert cand.portable
    assert choice.state == "verified"
    assert any("[1/" in m for m in messages), "progress is reported"


def test_hanging_and_wrong_candidates_are_rejected(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev = _device()
    cands = candidates(dev, "reduce_wg")
    faults = {c.id: ("hang", "wrong")[i % 2] for i, c in enumerate(cands[:-1])}
    faults[cands[-1].id] = "wrong"  # even the portable one: nothing passes
    _inject(monkeypatch, faults)
    monkeypatch.setattr(variants, "CANDIDATE_TIMEOUT", 15.0)
    v = verifier_for(dev, 0)
    v.run(families=["reduce_wg"])
    cand, choice = v.choice("reduce_wg")
    assert choice.state == "failed"
    assert cand.portable  # what runs when nothing verified: the portable variant
    assert "timed out" in choice.reason or len(cands) == 1
    assert "max error" in choice.reason


@pytest.mark.parametrize("corrupt", ["{ not json", "[" * 100_000], ids=["not-json", "too-deep"])
def test_verdicts_are_reused_and_a_corrupt_store_is_rebuilt(
    store: Path, monkeypatch: pytest.MonkeyPatch, corrupt: str
) -> None:
    dev = _device()
    store.write_text(corrupt, encoding="utf-8")
    v = verifier_for(dev, 0)
    assert "reduce_wg" in v.pending()
    v.run(families=["reduce_wg"])
    data = json.loads(store.read_text())
    assert data["format"] == "accelkit-opencl-variants"
    chosen = data["devices"][v.key]["reduce_wg"]["chosen"]
    assert chosen == candidates(dev, "reduce_wg")[0].label  # no fault: the best one passes

    # A new process (here: a new verifier) reads the verdict and runs no child.
    forget_verifiers()
    spawned: list[object] = []
    monkeypatch.setattr(variants.Verifier, "_run_child", lambda *a: spawned.append(a) or [])
    again = verifier_for(dev, 0)
    assert "reduce_wg" not in again.pending()
    again.run(families=["reduce_wg"])
    assert spawned == []
    assert again.choice("reduce_wg")[0].label == chosen


@pytest.mark.anyio
async def test_until_verified_the_portable_variant_runs(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelkit_opencl.backend import OpenCLBackend

    monkeypatch.setattr(variants.Verifier, "start", lambda self, progress=None: None)
    b = OpenCLBackend()
    await b.initialize("opencl:0")
    try:
        a = np.random.default_rng(0).standard_normal((96, 200)).astype(np.float32)
        x = b.tensor_factory.from_host(a)
        got = await b.tensor_ops.matmul(x, b.tensor_factory.from_host(a.T.copy())).to_host()
        assert_gemm_close(got, a, a.T)
        route = {c.family: c for c in b.kernel_variants()}[FAMILY]
        assert route.state == "pending"
        assert route.variant == candidates(b._cl_device, FAMILY)[-1].label
    finally:
        await b.shutdown()


@pytest.mark.anyio
async def test_a_verified_block_that_fails_to_build_here_falls_back_and_is_recorded(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import accelkit_opencl.linalg_ops as linalg_ops
    from accelkit_opencl.backend import OpenCLBackend

    monkeypatch.setenv("ACCELKIT_OPENCL_VERIFY", "0")
    real = linalg_ops.gemm_packed_source

    def broken(*args: Any) -> str:
        return real(*args).replace("__kernel", "__kernel this_does_not_compile", 1)

    monkeypatch.setattr(linalg_ops, "gemm_packed_source", broken)
    b = OpenCLBackend()
    await b.initialize("opencl:0")
    try:
        used = b.memory_manager.memory_info().used
        a = np.random.default_rng(1).standard_normal((80, 120)).astype(np.float32)
        w = np.random.default_rng(2).standard_normal((120, 90)).astype(np.float32)
        f, ops = b.tensor_factory, b.tensor_ops
        x, y = f.from_host(a), f.from_host(w)
        z = ops.matmul(x, y)
        got = await z.to_host()
        assert_gemm_close(got, a, w)
        route = {c.family: c for c in b.kernel_variants()}[FAMILY]
        assert route.state == "fallback"
        assert "KernelCompileError" in route.reason
        monkeypatch.setattr(b._verifier, "run", lambda progress=None: None)
        note = await b.prepare()  # the fallback is noted
        assert note is not None
        assert note.startswith(f"OpenCL kernel variants: {FAMILY}: fallback (")
        assert "KernelCompileError" in note
        del x, y, z
        await b.synchronize()
        # nothing leaked: the packed panels of the failed route went back with the tensors
        assert b.memory_manager.memory_info().used == used
    finally:
        await b.shutdown()


@pytest.mark.anyio
async def test_f64_that_failed_verification_is_refused_with_the_reason(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelkit_opencl.backend import OpenCLBackend

    dev = _device()
    if "fp64" not in variants.families(dev):
        pytest.skip("this OpenCL device reports no cl_khr_fp64")
    _inject(monkeypatch, {candidates(dev, "fp64")[0].id: "abort"})
    verifier_for(dev, 0).run(families=["fp64"])
    b = OpenCLBackend()
    await b.initialize("opencl:0")
    try:
        assert DType.F64 not in b.supported_dtypes
        route = {c.family: c for c in b.kernel_variants()}["fp64"]
        assert route.state == "failed"
        assert "SIGABRT" in route.reason
        with pytest.raises(UnsupportedOperationError):
            b._require_fp64()
        # prepare (the rest of the families verified: stubbed here) notes the refused family
        monkeypatch.setattr(b._verifier, "run", lambda progress=None: None)
        note = await b.prepare()
        assert note is not None
        assert "fp64: failed (" in note
        assert "SIGABRT" in note
    finally:
        await b.shutdown()


@pytest.mark.anyio
async def test_a_cached_program_without_kernels_is_discarded_and_rebuilt(
    store: Path, monkeypatch: pytest.MonkeyPatch, opencl_cache: Path
) -> None:
    """What a crashed compiler leaves behind (INVALID_KERNEL_NAME on the next run)."""
    import pyopencl as cl
    from accelkit_opencl.backend import OpenCLBackend

    monkeypatch.setenv("ACCELKIT_OPENCL_VERIFY", "0")
    b = OpenCLBackend()
    await b.initialize("opencl:0")
    try:
        source = "__kernel void twice(__global float* x) { x[get_global_id(0)] *= 2.0f; }\n"
        empty = cl.Program(b._context, "/* nothing */\n").build()
        key = b._programs.key(source, ())
        binary = empty.get_info(cl.program_info.BINARIES)[0]
        await anyio.Path(opencl_cache).mkdir(parents=True, exist_ok=True)
        await anyio.Path(opencl_cache / f"{key}.bin").write_bytes(binary)
        ref = b._kernel(source, "twice")
        assert ref.get() is not None
        assert b._programs.hits["discarded"] >= 1
        # A program that yields no kernel even from the cache in memory is rebuilt once.
        b._kernels.clear()
        b._programs._programs[key] = empty
        assert b._kernel(source, "twice").get() is not None
    finally:
        await b.shutdown()


@pytest.mark.anyio
async def test_user_kernel_errors_are_typed_with_the_log(backend: Any) -> None:
    ex = backend.kernel_executor
    with pytest.raises(KernelCompileError) as info:
        await ex.load_kernel("__kernel void k(__global float* x) { x[0] = oops; }", "k")
    assert "oops" in (info.value.log or "")


def test_a_build_without_kernels_is_retried_with_a_new_define(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A driver cache poisoned by a crashed compiler (PoCL's is keyed by source and options)
    hands back a program with no kernels: the build is retried once with options new to it."""
    import pyopencl as cl
    from accelkit_opencl import programs

    dev = _device()
    ctx = cl.Context([dev])
    cache = programs.ProgramCache(ctx, dev)
    cache.persistent = False
    real = programs.ProgramCache._build
    seen: list[tuple[str, ...]] = []

    def poisoned(self: Any, source: str | bytes, options: Any) -> Any:
        seen.append(tuple(options))
        if len(seen) == 1:  # the driver's cached entry: no kernels
            raise programs._NoKernels("")
        return real(self, source, options)

    monkeypatch.setattr(programs.ProgramCache, "_build", poisoned)
    source = "__kernel void twice(__global float* x) { x[get_global_id(0)] *= 2.0f; }\n"
    _, program = cache.get(source)
    assert programs.program_kernel_names(program) == ["twice"]
    assert len(seen) == 2
    assert any(o.startswith("-DACCELKIT_REBUILD=") for o in seen[1])

    # Poisoned twice: a typed error, with the reason.
    monkeypatch.setattr(
        programs.ProgramCache, "_build", lambda *a: (_ for _ in ()).throw(programs._NoKernels("x"))
    )
    with pytest.raises(KernelCompileError, match="no kernels"):
        cache.get(source.replace("twice", "thrice"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_a_verifying_child_does_not_outlive_its_parent(store: Path, tmp_path: Path) -> None:
    """A child stuck in a compiler (injected: it hangs) ends when the process that started
    verification ends, even when that process is killed and runs no exit handler."""
    dev = _device()
    faults = {c.id: "hang" for c in candidates(dev, "reduce_wg")}
    env = {**os.environ, "ACCELKIT_OPENCL_VERIFY_FAULTS": json.dumps(faults)}
    script = (
        "from accelkit_opencl.probe import cl_devices\n"
        "from accelkit_opencl.variants import verifier_for\n"
        "verifier_for(cl_devices()[0], 0).run(families=['reduce_wg'],"
        " progress=lambda m: print(m, flush=True))\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        # The child has started its first candidate (and hangs in it) once the parent says so;
        # killed any earlier, it would die anyway at its first write to the closed pipe.
        for line in parent.stdout:
            if "[1/" in line:
                break
        child = _child_of(parent.pid, "accelkit_opencl.verify")
        assert child is not None, "the verifying child never started"
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the verifying child outlived its parent"
    finally:
        parent.kill()


def _child_of(pid: int, marker: str) -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and marker in cmdline:
            return int(entry.name)
    return None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
