"""The host kernel bodies (``accelkit.sdk.host``) and their accelerator: plain NumPy unless a
caller passes one; each body with a hot step asks the accelerator it is given, and runs NumPy's
code where it declines; the CPU JIT's ``prepare`` and its note; the CPU backend's ``prepare``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import accelkit as ak
from accelkit._core.host_jit import jit
from accelkit.errors import NotInitializedError
from accelkit.sdk import host as h

Array = np.ndarray[Any, Any]


class Recording:
    """A HostAccelerator that declines every call and records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def unary(self, op: str, x: Array, out: Array) -> bool:
        self.asked.append(f"unary {op}")
        return False

    def softmax_rows(
        self, s: Array, out: Array, *, empty_nan: bool, period: int = 0, base: int = 0
    ) -> bool:
        self.asked.append("softmax_rows")
        return False

    def attention(
        self,
        q: Array,
        k: Array,
        v: Array,
        mask: Array | None,
        out: Array,
        scale: float,
        causal: bool,
    ) -> bool:
        self.asked.append("attention")
        return False

    def layer_norm(
        self, x: Array, w: Array | None, b: Array | None, eps: float, out: Array
    ) -> bool:
        self.asked.append("layer_norm")
        return False

    def rms_norm(self, x: Array, w: Array | None, eps: float, out: Array) -> bool:
        self.asked.append("rms_norm")
        return False


def _calls(rng: np.random.Generator) -> dict[str, tuple[Any, Array]]:
    """Each body with a hot step: a call taking ``accel``, and the array it writes."""
    x = rng.standard_normal((6, 16)).astype(np.float32)
    w = rng.standard_normal(16).astype(np.float32)
    q = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    kv = rng.standard_normal((1, 1, 7, 8)).astype(np.float32)
    cache = rng.standard_normal((3, 4, 1, 8)).astype(np.float32)  # [blocks, size, Hkv, D]
    table, lens = np.array([[2, 0]], np.int32), np.array([6], np.int32)
    q1 = rng.standard_normal((1, 2, 8)).astype(np.float32)
    out, out4, out3 = np.empty_like(x), np.empty((1, 2, 5, 8), np.float32), np.empty_like(q1)
    summed = np.empty_like(x)
    return {
        "gelu_tanh": (lambda a: h.unary("gelu_tanh", x, out, accel=a), out),
        "softmax": (lambda a: h.softmax(x, -1, out, False, accel=a), out),
        "attention": (lambda a: h.attention(q, kv, kv, None, out4, 0.3, True, accel=a), out4),
        "layer_norm": (lambda a: h.layer_norm(x, w, None, 1e-5, out, accel=a), out),
        "rms_norm": (lambda a: h.rms_norm(x, w, 1e-5, out, accel=a), out),
        "rms_norm_residual": (
            lambda a: h.rms_norm_residual(x, x, w, 1e-5, out, summed, accel=a),
            out,
        ),
        "paged_attention": (
            lambda a: h.paged_attention(q1, cache, cache, table, lens, 0.3, out3, accel=a),
            out3,
        ),
    }


#: What each body asks its accelerator, in order, when it declines everything.
ASKED = {
    "gelu_tanh": ["unary gelu_tanh"],
    "softmax": ["softmax_rows", "softmax_rows"],  # on the input, then on its float32 copy
    "attention": ["attention", "softmax_rows"],  # the kernel, then the chunk's softmax
    "layer_norm": ["layer_norm"],
    "rms_norm": ["rms_norm"],
    "rms_norm_residual": ["rms_norm"],
    "paged_attention": ["softmax_rows"],  # one sequence
}


@pytest.mark.parametrize("name", sorted(ASKED))
def test_a_body_asks_its_accelerator_and_runs_numpy_where_it_declines(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default is plain NumPy: the JIT is never asked (any JIT kernel wanted would reach
    ``jit._kernel``, which raises here). A declining accelerator is asked for the hot steps
    and the result is NumPy's, bit for bit."""

    def forbidden(name: str) -> None:
        raise AssertionError(f"the JIT's {name} kernel was wanted without JIT passed")

    monkeypatch.setattr(jit, "_kernel", forbidden)
    call, out = _calls(np.random.default_rng(0))[name]
    with np.errstate(all="ignore"):
        call(h.NUMPY_ONLY)
        plain = out.copy()
        rec = Recording()
        call(rec)
    assert rec.asked == ASKED[name]
    np.testing.assert_array_equal(out, plain)
    assert np.isfinite(plain).all()


def test_an_accelerator_that_computes_a_step_replaces_numpy_there() -> None:
    """What the accelerator writes is the result: NumPy's code does not run after it."""

    class Halves(Recording):
        def rms_norm(self, x: Array, w: Array | None, eps: float, out: Array) -> bool:
            out[...] = 0.5
            return True

    x = np.ones((2, 4), np.float32)
    normed, summed = np.empty_like(x), np.empty_like(x)
    h.rms_norm_residual(x, x, None, 1e-5, normed, summed, accel=Halves())
    np.testing.assert_array_equal(summed, 2.0)
    np.testing.assert_array_equal(normed, 0.5)


# -- the JIT's prepare ----------------------------------------------------------------------------
def _states(**unused: str) -> dict[str, str]:
    return {name: unused.get(name, "ready") for name in jit.KERNELS}


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("states", "note"),
    [
        (_states(), None),
        (
            _states(exp="not used: AssertionError: exp differs"),
            "CPU JIT kernels: 7 of 8 ready; exp: not used: AssertionError: exp differs",
        ),
        (
            {name: "not used: Numba is not installed: pip it" for name in jit.KERNELS},
            "CPU JIT kernels: none used: Numba is not installed: pip it",
        ),
    ],
)
async def test_the_jit_prepares_off_the_loop_and_notes_what_it_left_out(
    anyio_backend: str,
    states: dict[str, str],
    note: str | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    monkeypatch.setenv(jit.ENV, "auto")
    loop_thread = threading.get_ident()
    waited_in: list[int] = []

    def wait(names: list[str] | None = None) -> dict[str, str]:
        waited_in.append(threading.get_ident())
        return states

    monkeypatch.setattr(jit, "wait", wait)
    monkeypatch.setattr(jit, "status", lambda: {name: "not wanted yet" for name in jit.KERNELS})
    lines: list[str] = []
    assert await h.JIT.prepare(lines.append) == note
    assert len(waited_in) == 1
    assert waited_in[0] != loop_thread  # on a worker thread
    assert lines[0].startswith("CPU JIT kernels: compiling and checking them")
    assert lines[-1] == (note or "CPU JIT kernels: 8 of 8 ready")


@pytest.mark.anyio
async def test_the_jit_off_on_purpose_is_nothing_to_note(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(jit.ENV, "0")
    lines: list[str] = []
    assert await h.JIT.prepare(lines.append) is None
    assert lines == ["CPU JIT kernels: off (ACCELKIT_CPU_JIT=0)"]


# -- the CPU backend's prepare --------------------------------------------------------------------
@pytest.mark.anyio
async def test_the_cpu_backend_prepares_its_jit(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``prepare`` warms and checks the JIT kernels (the CPU backend passes them to its
    bodies); it refuses before ``initialize``, as every backend entry does."""
    pytest.importorskip("numba")
    from accelkit.backends.cpu.backend import CPUBackend

    monkeypatch.setenv(jit.ENV, "auto")
    backend = CPUBackend()
    with pytest.raises(NotInitializedError):
        await backend.prepare()
    await backend.initialize()
    try:
        lines: list[str] = []
        assert await backend.prepare(lines.append) is None
        n = len(jit.KERNELS)
        assert lines[-1] == f"CPU JIT kernels: {n} of {n} ready"
        assert set(h.JIT.status().values()) == {"ready"}
        x = backend.tensor_factory.from_host(np.linspace(-3, 3, 64, dtype=np.float32))
        got = await backend.tensor_ops.sigmoid(x).to_host()
        np.testing.assert_allclose(got, 1 / (1 + np.exp(-np.linspace(-3, 3, 64))), rtol=2e-6)
    finally:
        await backend.shutdown()


@pytest.mark.anyio
async def test_a_backend_with_nothing_to_prepare_returns_none(anyio_backend: str) -> None:
    """StreamBackend's default (the example backend keeps it)."""
    example = ak.create_backend("example")
    await example.initialize()
    try:
        lines: list[str] = []
        assert await example.prepare(lines.append) is None
        assert lines == []
    finally:
        await example.shutdown()


def test_the_numpy_norms_sum_squares_in_float64_as_the_jit_does() -> None:
    """A finite F32 row of 1e20s: its sum of squares overflows float32. NumPy's bodies made
    it 0 (NaN for layer_norm) and the JIT's (float64 sums) the right answer, so one call gave
    two results on the CPU backend, before and after the JIT had compiled."""
    x = np.array([[1e20, 1e20, -1e20, 1e20], [1.0, 2.0, 3.0, 4.0]], np.float32)
    x64 = x.astype(np.float64)
    rms = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6)
    centred = x64 - x64.mean(-1, keepdims=True)
    ln = centred / np.sqrt((centred * centred).mean(-1, keepdims=True) + 1e-5)
    out = np.empty_like(x)
    h.rms_norm(x, None, 1e-6, out, accel=h.NUMPY_ONLY)
    np.testing.assert_allclose(out, rms, rtol=4 * float(np.finfo(np.float32).eps))
    h.layer_norm(x, None, None, 1e-5, out, accel=h.NUMPY_ONLY)
    np.testing.assert_allclose(out, ln, rtol=8 * float(np.finfo(np.float32).eps), atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize(
    ("a", "b"),
    [
        (0.0, 1.0),
        (-1.0, 1e-3),
        (0.1, 0.1000001),
        (-np.inf, np.inf),
        (3e38, np.inf),
        (-np.inf, -1e300),
        (1.0, 1.0),
        (2.0, 1.0),
        (1.0, -np.inf),
        (-np.inf, -np.inf),
        (np.inf, np.inf),
        (np.nan, 1.0),
        (0.0, np.nan),
    ],
)
def test_uniform_range_is_the_dtypes_first_and_last_value_in_a_b(
    a: float, b: float, dtype: Any
) -> None:
    """``sdk.uniform_range``: the smallest value of the dtype at or above ``a`` and the largest
    below ``b``, each checked against its neighbour (which must fall outside ``[a, b)``); None
    where no value is in the range, ``b = -inf`` and NaN bounds included (it looped forever
    on ``b = -inf``)."""
    from accelkit.sdk import uniform_range

    t = np.dtype(dtype)
    got = uniform_range(a, b, t)
    if not a < b:
        assert got is None
        return
    with np.errstate(over="ignore"):
        up = np.array(a, t)  # a rounded to nearest: the first value from a on is it or the next
    if float(up) < a:
        up = np.nextafter(up, np.array(np.inf, t))
    if got is None:  # only where the dtype holds nothing in [a, b)
        assert float(up) >= b
        return
    assert got[0] == float(up)
    low, high = (np.array(v, t) for v in got)
    assert float(low) == got[0]  # exact in the dtype
    assert float(high) == got[1]
    assert a <= float(low) <= float(high) < b
    assert float(np.nextafter(low, np.array(-np.inf, t))) < a or np.isneginf(low)
    with np.errstate(over="ignore"):
        assert float(np.nextafter(high, np.array(np.inf, t))) >= b
