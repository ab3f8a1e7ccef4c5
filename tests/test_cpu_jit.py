"""The CPU JIT kernels (accelkit._core.host_jit, Numba; ``accelkit.sdk.host.JIT``): each against a
float64 reference written from the textbook formula, special values included; the split between
threads; the check that refuses a wrong kernel; and the clean fallback without Numba, with
ACCELKIT_CPU_JIT=0, and while a kernel compiles."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import accelkit as ak
from accelkit._core.host_jit import JIT, jit
from accelkit._core.host_jit import verify as jit_verify
from accelkit._core.host_kernels import elementwise as ew
from accelkit._core.host_kernels import nn
from accelkit.testing import reference

Array = np.ndarray[Any, Any]

# The NumPy kernels, kept before any test forbids them.
UNARY_NUMPY = ew._unary_numpy
SOFTMAX_NUMPY = nn._softmax_rows_numpy

pytest.importorskip("numba", reason="the JIT kernels need Numba: pip install 'accelkit[jit]'")

SPECIAL = np.array(
    [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-6, -1e-6, 0.5, -0.5, 3.0, -3.0, 20.0, -20.0, 88.0,
     88.72, 89.0, -87.0, -90.0, -100.0, -103.0, -104.5, -200.0, 1e20, -1e20],
    np.float32,
)  # fmt: skip


@pytest.fixture
def fresh_jit(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """jit's process-wide state, emptied for the test and put back after it."""
    saved = (dict(jit._ready), dict(jit._failed), set(jit._pending), jit._module)
    jit._ready.clear()
    jit._failed.clear()
    jit._pending.clear()
    yield
    jit._ready.clear()
    jit._ready.update(saved[0])
    jit._failed.clear()
    jit._failed.update(saved[1])
    jit._pending.clear()
    jit._pending.update(saved[2])
    jit._module = saved[3]


@pytest.fixture
def eager(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(jit.ENV, "eager")


def numpy_path_forbidden(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the NumPy kernels raise, so a test proves that the JIT kernel ran (after the
    kernels' checks, which run the NumPy kernels)."""
    assert set(jit.wait().values()) == {"ready"}, jit.status()

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the NumPy kernel ran where the JIT kernel should have")

    for module, name in (
        (ew, "_unary_numpy"),
        (nn, "_softmax_rows_numpy"),
        (nn, "_layer_norm_numpy"),
        (nn, "_rms_norm_numpy"),
    ):
        monkeypatch.setattr(module, name, forbidden)


def inputs(n: int, seed: int = 0, scale: float = 6.0) -> Array:
    rng = np.random.default_rng(seed)
    body = (rng.standard_normal(n) * scale).astype(np.float32)
    return np.concatenate([SPECIAL, body])


def assert_close_f32(got: Array, want: Array, rtol: float = 2e-6, atol: float = 0.0) -> None:
    """NaN where the reference is NaN, equal infinities, and float32-rounding closeness."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    fin = np.isfinite(want)
    np.testing.assert_array_equal(got[~fin & ~np.isnan(want)], want[~fin & ~np.isnan(want)])
    np.testing.assert_allclose(got[fin], want[fin], rtol=rtol, atol=atol)


def _gelu_tanh(x: Array) -> Array:
    """0.5 x (1 + tanh(u)) as x / (1 + exp(-2u)): the same function, without float64's
    cancellation in 1 + tanh(u) for u below -19."""
    out: Array = x / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    return out


REFERENCE: dict[str, Callable[[Array], Array]] = {
    "exp": np.exp,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "gelu_tanh": _gelu_tanh,
}


def numpy_unary(op: str, x: Array) -> Array:
    out = np.empty_like(x)
    with np.errstate(all="ignore"):
        UNARY_NUMPY(op, x, out)
    return out


@pytest.mark.usefixtures("fresh_jit", "eager")
@pytest.mark.parametrize("op", sorted(REFERENCE))
@pytest.mark.parametrize("n", [0, 7, 1 << 10, (1 << 19) + 13])  # the last is split over threads
def test_unary_kernels_agree_with_float64(op: str, n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    numpy_path_forbidden(monkeypatch)
    x = inputs(n)
    out = np.empty_like(x)
    ew.unary(op, x, out, accel=JIT)
    assert jit.status()[op] == "ready"
    with np.errstate(all="ignore"):
        x64 = x.astype(np.float64)
        want = REFERENCE[op](x64)
        # The argument of the exponential each formula computes in float32.
        arg = {"exp": x64, "gelu_tanh": -1.5957691216057308 * (x64 + 0.044715 * x64**3)}.get(
            op, -x64
        )
    # Special values as NumPy's kernel gives them, and where float32's exp overflows (sigmoid
    # of -90: 1 / (1 + inf) is 0, float64 says 8e-40), NumPy's kernel's value too.
    ref32 = numpy_unary(op, x)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref32))
    np.testing.assert_array_equal(out[np.isinf(ref32)], ref32[np.isinf(ref32)])
    over = (arg > 88.7228) & ~np.isnan(ref32)  # log(FLT_MAX) = 88.72284
    np.testing.assert_array_equal(out[over], ref32[over])
    # Elsewhere the float64 truth: an error of one ulp in the exponential's argument is |arg|
    # ulp of the result, for NumPy's kernel as well, so the tolerance grows with it.
    ok = np.isfinite(out) & np.isfinite(want) & np.isfinite(x) & ~over
    tol = 1.2e-7 * (4 + 2 * np.abs(arg[ok])) * np.abs(want[ok]) + 1.2e-38
    bad = np.abs(out[ok] - want[ok]) > tol
    assert not bad.any(), (x[ok][bad][:5], out[ok][bad][:5], want[ok][bad][:5])


def softmax_reference(x: Array, visible: Array, empty_nan: bool) -> Array:
    """Float64 softmax over the last axis of the visible entries, zeros where hidden; a row with
    NaN or +inf among its visible entries is NaN; a row that sees only -inf is NaN or zeros."""
    x64 = np.where(visible, x.astype(np.float64), -np.inf)
    out = np.zeros_like(x64)
    for i in np.ndindex(x64.shape[:-1]):
        row, vis = x64[i], visible[i]
        if np.isnan(x[i][vis]).any() or (x[i][vis] == np.inf).any():
            out[i] = np.nan
        elif not np.isfinite(row).any():
            out[i] = np.nan if empty_nan else 0.0
        else:
            e = np.exp(row - row.max())
            out[i] = e / e.sum()
    return out


def softmax_input(rows: int, k: int, seed: int = 1) -> Array:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, k)) * 8).astype(np.float32)
    if rows >= 6:
        x[1, min(3, k - 1)] = np.nan
        x[2, 0] = np.inf
        x[3] = -np.inf
        x[4, ::2] = -np.inf  # all of a one-key row
        x[5] = -np.inf
        x[5, -1] = np.nan
    return x


@pytest.mark.usefixtures("fresh_jit", "eager")
@pytest.mark.parametrize("empty_nan", [True, False])
@pytest.mark.parametrize("shape", [(6, 1), (9, 37), (3000, 256)])  # the last is split
def test_softmax_kernel_agrees_with_float64(
    shape: tuple[int, int], empty_nan: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    numpy_path_forbidden(monkeypatch)
    x = softmax_input(*shape)
    out = np.empty_like(x)
    assert jit.softmax_rows(x, out, empty_nan=empty_nan)
    want = softmax_reference(x, np.ones(x.shape, bool), empty_nan)
    assert_close_f32(out, want, rtol=2e-6, atol=1e-9)


@pytest.mark.usefixtures("fresh_jit", "eager")
@pytest.mark.parametrize(("period", "base"), [(8, 0), (8, -3), (8, 40), (32, 224), (1, 5)])
@pytest.mark.parametrize("groups", [3, 260])  # 260 groups of 32 x 256 is split over threads
def test_causal_softmax_kernel_sees_only_its_keys(
    period: int, base: int, groups: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    numpy_path_forbidden(monkeypatch)
    k = 256 if groups > 3 else 48
    x = softmax_input(groups * period, k, seed=period)
    out = x.copy()
    assert jit.softmax_rows(out, out, empty_nan=False, period=period, base=base)  # in place
    i = np.arange(x.shape[0])[:, None] % period
    visible = np.arange(k)[None, :] <= i + base
    assert_close_f32(out, softmax_reference(x, visible, False), rtol=2e-6, atol=1e-9)


def norm_reference(x: Array, w: Array | None, b: Array | None, eps: float, rms: bool) -> Array:
    x64 = x.astype(np.float64)
    return reference.rms_norm(x64, w, eps) if rms else reference.layer_norm(x64, w, b, eps)


@pytest.mark.usefixtures("fresh_jit", "eager")
@pytest.mark.parametrize(
    ("rms", "affine"),
    [(False, "both"), (False, "weight"), (False, "bias"), (False, "none"), (True, "weight"),
     (True, "none")],
)  # fmt: skip
@pytest.mark.parametrize("shape", [(1, 1), (5, 3, 33), (8192, 512)])  # the last is split
def test_norm_kernels_agree_with_float64(
    rms: bool, affine: str, shape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    numpy_path_forbidden(monkeypatch)
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(shape) * 3 + 100).astype(np.float32)  # an offset: cancellation
    d = shape[-1]
    if x.shape[0] > 2:
        x.reshape(-1, d)[1, 0] = np.nan
        x.reshape(-1, d)[2, -1] = np.inf
    w = rng.standard_normal(d).astype(np.float32) if affine in ("both", "weight") else None
    b = rng.standard_normal(d).astype(np.float32) if affine in ("both", "bias") else None
    out = np.empty_like(x)
    if rms:
        nn.rms_norm(x, w, 1e-5, out, accel=JIT)
    else:
        nn.layer_norm(x, w, b, 1e-5, out, accel=JIT)
    with np.errstate(all="ignore"):
        want = norm_reference(x, w, b, 1e-5, rms)
    np.testing.assert_array_equal(np.isnan(out), ~np.isfinite(want) | np.isnan(want))
    ok = np.isfinite(want)
    np.testing.assert_allclose(out[ok], want[ok], rtol=1e-5, atol=2e-5)


@pytest.mark.usefixtures("fresh_jit", "eager")
@pytest.mark.parametrize(
    ("mask", "causal", "shape"),
    [
        (None, True, (2, 4, 2, 200, 230, 16)),  # the attention kernel
        (None, False, (2, 4, 2, 200, 230, 16)),
        (None, True, (2, 4, 2, 230, 200, 16)),  # more queries than keys: 30 rows see none
        (None, True, (8, 8, 4, 128, 128, 32)),  # split between threads
        (None, True, (2, 3, 1, 37, 41, 13)),  # head dim not a multiple of 4, odd lengths
        (None, False, (1, 2, 2, 5, 3, 2)),
        ("bool", True, (2, 4, 2, 200, 230, 16)),  # NumPy's chunks with the JIT softmax
        ("float", True, (2, 4, 2, 200, 230, 16)),
    ],
)
def test_attention_kernels_agree_with_float64(
    mask: str | None,
    causal: bool,
    shape: tuple[int, ...],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Grouped-KV attention with a NaN key that only the rows that see it may turn NaN, and
    rows that see no key (zeros): against a float64 reference. Without a mask the attention
    kernel runs (NumPy's chunked attention is forbidden); with one, NumPy's chunks with the JIT
    softmax."""
    numpy_path_forbidden(monkeypatch)
    if mask is None:
        monkeypatch.setattr(nn, "_attention_chunked", numpy_path_forbidden_fn)
    rng = np.random.default_rng(3)
    b, h, hk, sq, sk, d = shape
    q = rng.standard_normal((b, h, sq, d)).astype(np.float32)
    k = rng.standard_normal((b, hk, sk, d)).astype(np.float32)
    v = rng.standard_normal((b, hk, sk, d)).astype(np.float32)
    # seen by batch 0's heads of KV group 1 (or the last), from query 100 - (Sk - Sq) (or so)
    k[0, min(1, hk - 1), min(100, sk - 1)] = np.nan
    m: Array | None = None
    if mask == "bool":
        m = rng.random((b, 1, sq, sk)) > 0.2
    elif mask == "float":
        m = (rng.standard_normal((1, h, sq, sk)) * 0.5).astype(np.float32)
    out = np.empty_like(q)
    nn.attention(q, k, v, m, out, 0.25, causal, accel=JIT)
    # float64 reference
    kk, vv = np.repeat(k, h // hk, axis=1).astype(np.float64), np.repeat(v, h // hk, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), kk) * 0.25
    visible = np.ones((sq, sk), bool)
    if causal:
        visible = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
    visible = np.broadcast_to(visible, s.shape)
    if mask == "bool":
        assert m is not None
        visible = visible & np.broadcast_to(m, s.shape)
    elif m is not None:
        s = s + m
    p = softmax_reference(s, visible, empty_nan=False)
    with np.errstate(invalid="ignore"):
        want = np.einsum("bhqk,bhkd->bhqd", np.where(visible, p, 0), vv.astype(np.float64))
    nan_rows = np.isnan(p).any(-1)
    want[nan_rows] = np.nan
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    group = h // hk
    nan_group = min(1, hk - 1)
    nan_heads = slice(nan_group * group, (nan_group + 1) * group)
    assert np.isnan(out[0, nan_heads]).any()  # the rows that see the NaN key
    assert not np.isnan(out[0, : nan_group * group]).any()  # the heads of the other KV group
    if causal and sq > sk:
        assert (out[:, :, : sq - sk] == 0).all()  # rows that see no key
    ok = ~np.isnan(want)
    np.testing.assert_allclose(out[ok], want[ok], rtol=1e-4, atol=1e-5)


def numpy_path_forbidden_fn(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("NumPy's kernel ran where the JIT kernel should have")


@pytest.mark.usefixtures("fresh_jit", "eager")
async def test_backend_ops_take_the_jit_path(
    backend: ak.ComputeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through TensorOps, under asyncio and trio: GELU, softmax, layer_norm and causal
    attention of a block's sizes (split between threads) on float32 give the float64 answers,
    with NumPy's kernels forbidden."""
    numpy_path_forbidden(monkeypatch)
    ops, f = backend.tensor_ops, backend.tensor_factory
    rng = np.random.default_rng(5)
    x_h = rng.standard_normal((4, 256, 512)).astype(np.float32)
    w_h, b_h = rng.standard_normal((2, 512)).astype(np.float32)
    x, w, b = f.from_host(x_h), f.from_host(w_h), f.from_host(b_h)
    gelu = await ops.gelu(x, approximate="tanh").to_host()
    soft = await ops.softmax(x, axis=-1).to_host()
    norm = await ops.layer_norm(x, w, b, 1e-5).to_host()
    monkeypatch.setattr(nn, "_attention_chunked", numpy_path_forbidden_fn)
    heads = ops.permute(ops.reshape(x, (4, 256, 8, 64)), (0, 2, 1, 3))
    att = await ops.attention(heads, heads, heads, causal=True).to_host()
    x64 = x_h.astype(np.float64)
    np.testing.assert_allclose(gelu, _gelu_tanh(x64), rtol=1e-5, atol=1e-6)
    want = softmax_reference(x_h, np.ones(x_h.shape, bool), True)
    np.testing.assert_allclose(soft, want, rtol=2e-6, atol=1e-9)
    np.testing.assert_allclose(
        norm, norm_reference(x_h, w_h, b_h, 1e-5, False), rtol=1e-5, atol=2e-5
    )
    qh = x64.reshape(4, 256, 8, 64).transpose(0, 2, 1, 3)
    scores = np.einsum("bhqd,bhkd->bhqk", qh, qh) / 8
    scores[..., np.triu_indices(256, 1)[0], np.triu_indices(256, 1)[1]] = -np.inf
    e = np.exp(scores - scores.max(-1, keepdims=True))
    want_att = np.einsum("bhqk,bhkd->bhqd", e / e.sum(-1, keepdims=True), qh)
    np.testing.assert_allclose(att, want_att, rtol=1e-4, atol=1e-5)


@pytest.mark.usefixtures("fresh_jit", "eager")
@pytest.mark.parametrize("fault", ["wrong results", "no compile"])
def test_a_faulty_kernel_is_refused_and_numpy_runs(
    fault: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The check refuses a kernel that compiles but computes wrongly (1e-5 too much on every
    other element), or that the compiler cannot build for this CPU; it logs why, and NumPy's
    kernel runs."""
    import accelkit._core.host_jit._numba_kernels as real

    def faulty(x: Array, out: Array) -> None:
        if fault == "no compile":
            raise RuntimeError("LLVM ERROR: Cannot select (as on a CPU the compiler mistook)")
        real.gelu_tanh(x, out)
        out[::2] = np.nextafter(out[::2], np.float32(np.inf)) * np.float32(1 + 1e-5)

    class Fake:
        def __getattr__(self, name: str) -> Any:
            return faulty if name == "gelu_tanh" else getattr(real, name)

    jit._module = Fake()
    x = inputs(1000)
    out = np.empty_like(x)
    with caplog.at_level("WARNING", logger="accelkit.cpu.jit"):
        ew.unary("gelu_tanh", x, out, accel=JIT)
    error = "AssertionError" if fault == "wrong results" else "RuntimeError: LLVM ERROR"
    assert jit.status()["gelu_tanh"].startswith(f"not used: {error}")
    assert "gelu_tanh JIT kernel is not used" in caplog.text
    np.testing.assert_array_equal(out, numpy_unary("gelu_tanh", x))
    assert jit.unary("exp", x, out)  # the other kernels are not affected
    assert jit.status()["exp"] == "ready"


# A stand-in for the verifying child that fails on gelu_tanh the way a kernel compiled for
# features the CPU lacks does (SIGILL), or hangs; every other kernel is checked for real.
FAULTY_CHILD = """
import os, signal, sys, time
from accelkit._core.host_jit import jit, verify as jit_verify

def crash(fn):
    os.kill(os.getpid(), signal.SIGILL)

def hang(fn):
    time.sleep(120)

jit._CHECKS["gelu_tanh"] = {"crash": crash, "hang": hang}[os.environ["ACCELKIT_TEST_FAULT"]]
sys.exit(jit_verify.main())
"""


@pytest.fixture
def verdicts(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A verdict file of the test's own, and no verdicts remembered by this process."""
    path = tmp_path / "verdicts.json"
    monkeypatch.setenv(jit_verify.STORE_ENV, str(path))
    monkeypatch.delenv(jit_verify.ENV, raising=False)
    monkeypatch.setattr(jit_verify, "_memo", None)
    monkeypatch.setattr(jit_verify, "_no_child", False)
    return path


def faulty_child(fault: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "faulty_jit_child.py").write_text(FAULTY_CHILD)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    monkeypatch.setenv("ACCELKIT_TEST_FAULT", fault)
    monkeypatch.setattr(jit_verify, "CHILD_MODULE", "faulty_jit_child")


def child_forbidden(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(names: Any) -> Any:
        raise AssertionError(f"a child process was started for {names}")

    monkeypatch.setattr(jit_verify, "_run_child", forbidden)


@pytest.mark.usefixtures("fresh_jit", "eager")
@pytest.mark.parametrize("fault", ["crash", "hang"])
def test_a_kernel_that_kills_its_checking_process_is_never_used(
    fault: str, verdicts: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kernels are first compiled and checked in a child process: the one the child dies or
    hangs on is refused, the rest are checked by a second child and used; the verdicts are
    stored, so the next process runs no child and refuses the same kernel."""
    if fault == "hang":
        # Compiled here first (Numba's disk cache, which the child shares), so that no
        # kernel but the hanging one comes near the short timeout on a loaded machine.
        monkeypatch.setenv(jit_verify.ENV, "0")
        assert set(jit.wait().values()) == {"ready"}
        jit._ready.clear()
        monkeypatch.delenv(jit_verify.ENV)
        monkeypatch.setattr(jit_verify, "TIMEOUT", 8.0)
    faulty_child(fault, tmp_path, monkeypatch)
    status = jit.wait()
    why = status.pop("gelu_tanh")
    if fault == "crash":
        assert why.startswith("not used: crashed the process (SIGILL)"), why
    else:
        assert why.startswith("not used: hung: no result in 8 s"), why
    assert "in a child process checking it on this machine" in why
    assert set(status.values()) == {"ready"}, status
    x = inputs(1000)
    out = np.empty_like(x)
    assert not jit.unary("gelu_tanh", x, out)  # the caller runs NumPy's kernel
    assert jit.unary("silu", x, out)

    stored = json.loads(verdicts.read_text())["machines"][jit_verify.machine_key()]
    assert stored["gelu_tanh"]["ok"] is False
    assert {k for k, v in stored.items() if v["ok"]} == set(jit.KERNELS) - {"gelu_tanh"}

    # A later process: the stored verdicts, and no child.
    jit._ready.clear()
    jit._failed.clear()
    monkeypatch.setattr(jit_verify, "_memo", None)
    child_forbidden(monkeypatch)
    again = jit.wait()
    assert again["gelu_tanh"] == f"not used: {stored['gelu_tanh']['reason']}"
    assert {k for k, v in again.items() if v == "ready"} == set(jit.KERNELS) - {"gelu_tanh"}


@pytest.mark.usefixtures("fresh_jit", "eager")
def test_verdicts_of_another_machine_or_numba_are_not_used(
    verdicts: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verdict is keyed by what decides the machine code: one recorded under another key
    (another CPU, Numba or kernel source) does not refuse the kernel here; a child checks it.
    The file keeps the newest keys only."""
    others = [f"numba 0.{i}, llvmlite 0.1, python 3.0, cpu other, features 0, kernels 0"
              for i in range(jit_verify._KEEP)]  # fmt: skip
    assert jit_verify.machine_key() not in others
    failed = {"ok": False, "reason": "crashed the process (SIGILL)"}
    verdicts.write_text(json.dumps({"machines": {o: {"gelu_tanh": failed} for o in others}}))
    assert jit.wait(["gelu_tanh"])["gelu_tanh"] == "ready"
    machines = json.loads(verdicts.read_text())["machines"]
    assert list(machines) == [*others[1:], jit_verify.machine_key()]  # the oldest made room
    assert all(machines[o] == {"gelu_tanh": failed} for o in others[1:])
    assert machines[jit_verify.machine_key()]["gelu_tanh"] == {"ok": True}


@pytest.mark.usefixtures("fresh_jit", "eager")
def test_without_a_child_the_kernels_are_checked_here(
    verdicts: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A child that cannot run the check (here: its module is missing) stores nothing and
    says so; the kernels are still checked in this process and used. With
    ACCELKIT_CPU_JIT_VERIFY=0 no child is started at all."""
    monkeypatch.setattr(jit_verify, "CHILD_MODULE", "accelkit_no_such_module")
    with caplog.at_level("WARNING", logger="accelkit.cpu.jit"):
        assert jit.wait(["exp"])["exp"] == "ready"
    assert "ended before checking any" in caplog.text
    assert "No module named accelkit_no_such_module" in caplog.text
    assert not verdicts.exists()
    child_forbidden(monkeypatch)  # one failed child is enough: the other kernels start none
    assert jit.wait(["silu"])["silu"] == "ready"

    jit._ready.clear()
    monkeypatch.setattr(jit_verify, "_no_child", False)
    monkeypatch.setattr(jit_verify, "_memo", None)
    monkeypatch.setenv(jit_verify.ENV, "0")
    assert jit.wait(["exp"])["exp"] == "ready"


@pytest.mark.usefixtures("fresh_jit")
def test_auto_mode_runs_numpy_until_the_kernel_is_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """By default the first call starts the compiler on a background thread and returns False
    (the caller runs NumPy's kernel) rather than waiting for it."""
    monkeypatch.setenv(jit.ENV, "auto")
    import threading

    release = threading.Event()
    real_check = jit._CHECKS["silu"]

    def slow_check(fn: Any) -> None:
        release.wait(30)
        real_check(fn)

    monkeypatch.setitem(jit._CHECKS, "silu", slow_check)
    x = inputs(100)
    out = np.empty_like(x)
    assert not jit.unary("silu", x, out)  # compiling: the caller falls back
    assert jit.status()["silu"] == "compiling"
    release.set()
    for _ in range(600):
        if jit.status()["silu"] == "ready":
            break
        threading.Event().wait(0.05)
    assert jit.status()["silu"] == "ready"
    assert jit.unary("silu", x, out)


@pytest.mark.usefixtures("fresh_jit")
def test_off_means_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(jit.ENV, "0")
    x = inputs(100)
    out = np.empty_like(x)
    assert not jit.unary("exp", x, out)
    assert set(jit.status().values()) == {"off"}
    assert jit.wait() == jit.status()


def test_without_numba_everything_runs_on_numpy(tmp_path: Any) -> None:
    """Numba made unimportable: the kernels say why they are not used, and GELU, softmax,
    layer_norm and attention still give the float64 answers."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["numba"] = None  # import numba raises ImportError
        import os
        os.environ["ACCELKIT_CPU_JIT"] = "eager"
        import numpy as np
        from accelkit.sdk import host as h
        x = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
        g = np.empty_like(x); h.unary("gelu_tanh", x, g, accel=h.JIT)
        s = np.empty_like(x); h.softmax(x, -1, s, False, accel=h.JIT)
        n = np.empty_like(x); h.layer_norm(x, None, None, 1e-5, n, accel=h.JIT)
        x64 = x.astype(np.float64)
        want = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3)))
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)
        e = np.exp(x64 - x64.max(-1, keepdims=True))
        np.testing.assert_allclose(s, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-8)
        z = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
        np.testing.assert_allclose(n, z, rtol=1e-4, atol=1e-5)
        st = h.JIT.status()
        assert st["gelu_tanh"] == st["softmax_rows"] == st["layer_norm"], st
        assert "Numba is not installed" in st["gelu_tanh"], st
        print("fallback ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "fallback ok" in done.stdout


def _child_gelu(q: Any) -> None:
    x = inputs(1 << 20)
    out = np.empty_like(x)
    ok = jit.unary("gelu_tanh", x, out)
    q.put(
        (
            ok,
            bool(
                np.allclose(out[100:], _gelu_tanh(x[100:].astype(np.float64)), rtol=1e-5, atol=1e-6)
            ),
        )
    )


@pytest.mark.skipif(sys.platform != "linux", reason="fork is the Linux default start method")
@pytest.mark.usefixtures("eager")
def test_a_forked_child_gets_helper_threads_of_its_own() -> None:
    """The helper threads do not survive a fork; the child makes its own rather than waiting
    forever on the parent's."""
    x = inputs(1 << 20)
    out = np.empty_like(x)
    assert jit.unary("gelu_tanh", x, out)  # the parent's helpers now exist
    assert jit._helpers is not None
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_gelu, args=(q,))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert q.get(timeout=5) == (True, True)
