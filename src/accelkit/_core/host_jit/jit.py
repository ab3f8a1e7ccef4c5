"""Optional JIT kernels for the host's costliest float32 steps, compiled by Numba.

With ``pip install "accelkit[jit]"`` the CPU backend (and any host backend that passes
``accelkit.sdk.host.JIT`` to the NumPy bodies) runs GELU (tanh), SiLU, sigmoid, exp, softmax,
attention, layer_norm and rms_norm on float32 as one fused pass per row or element, in place of
NumPy's chain of passes, and splits large ones between the cores. Without Numba, or with
``ACCELKIT_CPU_JIT=0``, the NumPy kernels run, with the same results to within float32 rounding
(docs/backends/cpu.md). The entry points (:func:`unary`, :func:`softmax_rows`, :func:`attention`,
:func:`layer_norm`, :func:`rms_norm`) are those of a
:class:`~accelkit._core.host_kernels.HostAccelerator`.

Each kernel is checked once, when first wanted, against the NumPy kernel it replaces, on inputs
that include NaN, infinities and subnormal results. A kernel that fails to compile or to agree is
never used in this process, and the reason is logged (``accelkit.cpu.jit``) and shown by
:func:`status`. The first time on a machine, the kernels are compiled and checked in a child
process before this one runs them (:mod:`.verify`): one whose machine code crashes or hangs
the child is never used on that machine. By default (``ACCELKIT_CPU_JIT=auto``) kernels compile on a background thread and
the NumPy kernel runs until then, so a first call never waits for the compiler (seconds on a cold
cache; Numba caches compiled kernels on disk). ``ACCELKIT_CPU_JIT=eager`` compiles on first use, in
the calling thread, so that every call after the first takes the JIT path (the conformance tests
run so).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

__all__ = [
    "ENV", "KERNELS", "attention", "describe", "disabled", "layer_norm", "rms_norm",
    "softmax_rows", "status", "unary", "wait",
]  # fmt: skip

log = logging.getLogger("accelkit.cpu.jit")

Array = np.ndarray[Any, Any]
ENV = "ACCELKIT_CPU_JIT"
_F32 = np.dtype(np.float32)

#: The kernels, with the time each takes per element on one core (measured on a Zen 4 core:
#: what decides when a call is worth splitting between threads).
KERNELS: dict[str, float] = {
    "exp": 0.8e-9,
    "sigmoid": 1.0e-9,
    "silu": 1.0e-9,
    "gelu_tanh": 1.2e-9,
    "softmax_rows": 1.3e-9,
    "layer_norm": 0.35e-9,
    "rms_norm": 0.25e-9,
    "attention": 0.12e-9,  # per query-key pair and head dimension (of D + Dv)
}
#: Calls estimated to take longer than this are split between threads, in parts of at least
#: half of it: waking a helper costs tens of microseconds.
_SPLIT_S = 300e-6

_ready: dict[str, Callable[..., None]] = {}  # checked kernels: the fast path reads only this
_failed: dict[str, str] = {}  # kernel -> why it is not used
_pending: set[str] = set()
_lock = threading.Lock()  # bookkeeping only: never held while compiling
_compile_lock = threading.Lock()  # one compilation at a time
_module: Any = None  # accelkit._core.host_jit._numba_kernels once imported; False if it cannot be
_import_error = ["Numba is not installed: pip install 'accelkit[jit]'"]
_warm_queue: queue.SimpleQueue[str] | None = None
_helpers: ThreadPoolExecutor | None = None
_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


#: ACCELKIT_CPU_JIT's values (lower-cased) and the mode each means; any other is auto, reported.
_MODES = (
    dict.fromkeys(("0", "off", "false", "no"), "off")
    | dict.fromkeys(("", "1", "on", "true", "yes", "auto"), "auto")
    | {"eager": "eager"}
)


def _mode() -> str:
    mode = _MODES.get(os.environ.get(ENV, "auto").strip().lower())
    if mode is None:
        log.warning("%s: using auto", bad_setting())
    return mode or "auto"


def bad_setting() -> str | None:
    """What is wrong with ``ACCELKIT_CPU_JIT`` (None: nothing); a bad value is taken as auto
    (the CPU backend still works), and ``accelkit doctor`` reports it."""
    if os.environ.get(ENV, "auto").strip().lower() in _MODES:
        return None
    return f"{ENV}={os.environ.get(ENV)!r} is not one of auto, eager, 0"


_disabled = 0  # > 0 inside disabled()


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """NumPy's kernels in place of the JIT kernels in this process while the block runs (a
    benchmark's A/B in one process)."""
    global _disabled
    _disabled += 1
    try:
        yield
    finally:
        _disabled -= 1


def _kernel(name: str) -> Callable[..., None] | None:
    """The checked kernel, or None (and a compile started) while it is not ready."""
    if _disabled:
        return None
    fn = _ready.get(name)
    if fn is not None:
        return fn
    if name in _failed or name in _pending:
        return None
    mode = _mode()
    if mode == "off":
        return None
    if mode == "eager":
        _prepare(name)
        return _ready.get(name)
    _start_warming(name)
    return None


def _start_warming(name: str) -> None:
    global _warm_queue
    with _lock:
        if name in _pending or name in _ready or name in _failed:
            return
        _pending.add(name)
        if _warm_queue is None:
            _warm_queue = queue.SimpleQueue()
            threading.Thread(
                target=_warm_loop, args=(_warm_queue,), name="accelkit-cpu-jit", daemon=True
            ).start()
        _warm_queue.put(name)


def _warm_loop(q: queue.SimpleQueue[str]) -> None:
    while True:
        _prepare(q.get())


class _Refused(Exception):
    """A kernel that failed in a child process on this machine (:mod:`.verify`)."""


def _prepare(name: str) -> None:
    """Import Numba, have ``name`` compiled and checked in a child process once per machine
    (:mod:`.verify`), then compile it here (from Numba's cache) and check it again."""
    global _module
    with _compile_lock:
        if name in _ready or name in _failed:
            _pending.discard(name)
            return
        try:
            if _module is None:
                _module = False
                try:
                    from accelkit._core.host_jit import _numba_kernels
                except ImportError as e:
                    _import_error[0] = f"Numba is not installed ({e}): pip install 'accelkit[jit]'"
                    raise
                _module = _numba_kernels
            if _module is False:
                raise ImportError(_import_error[0])
            from accelkit._core.host_jit import verify

            refused = verify.refusal(name, list(KERNELS))
            if refused is not None:
                raise _Refused(refused)
            fn = getattr(_module, name)
            _CHECKS[name](fn)
        except ImportError:
            _failed[name] = _import_error[0]
            log.debug("the %s JIT kernel is not used: %s", name, _failed[name])
        except _Refused as e:  # the verdict of a child process (verify)
            _failed[name] = str(e)
            log.warning("the %s JIT kernel is not used: %s", name, _failed[name])
        except Exception as e:  # a compiler error or a wrong result: never use this kernel
            _failed[name] = f"{type(e).__name__}: {e}"
            log.warning("the %s JIT kernel is not used: %s", name, _failed[name])
        else:
            _ready[name] = fn
        finally:
            _pending.discard(name)


def wait(names: list[str] | None = None) -> dict[str, str]:
    """Prepare the kernels ``names`` (all by default) now, in this thread, unless the JIT is
    off; returns :func:`status`. Benchmarks call it so that warm-up is not what they time."""
    if _mode() != "off":
        for name in names or list(KERNELS):
            _prepare(name)
    return status()


def describe() -> dict[str, str | None]:
    """What ``accelkit info`` shows, without importing Numba: its version (None if absent) and
    the mode ACCELKIT_CPU_JIT sets."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        numba_version: str | None = version("numba")
    except PackageNotFoundError:
        numba_version = None
    return {"numba": numba_version, "mode": _mode()}


def status() -> dict[str, str]:
    """Each kernel's state: ``ready``, ``compiling``, ``not used: <why>`` or ``not wanted yet``
    (and ``off`` for all with ACCELKIT_CPU_JIT=0)."""
    off = _mode() == "off"
    out = {}
    for name in KERNELS:
        if name in _ready:
            out[name] = "ready"
        elif name in _failed:
            out[name] = f"not used: {_failed[name]}"
        elif off:
            out[name] = "off"
        else:
            out[name] = "compiling" if name in _pending else "not wanted yet"
    return out


def _reset_after_fork() -> None:
    global _helpers, _warm_queue
    _helpers = None  # its threads did not survive the fork
    _warm_queue = None
    _pending.clear()  # what the dead warm-up thread was doing starts again when wanted
    for lock in (_lock, _compile_lock):
        lock._at_fork_reinit()  # type: ignore[attr-defined]  # CPython's, not in typeshed


os.register_at_fork(after_in_child=_reset_after_fork)


def _split(rows: int, seconds: float, body: Callable[[int, int], None]) -> None:
    """``body(lo, hi)`` over ``0 .. rows``, in parts run by this thread and helper threads
    when ``seconds`` of work (on one core) are enough to gain from it."""
    global _helpers
    parts = min(_cores, rows, int(seconds / (_SPLIT_S / 2)))
    if parts < 2 or seconds < _SPLIT_S:
        body(0, rows)
        return
    if _helpers is None:
        with _lock:
            if _helpers is None:
                _helpers = ThreadPoolExecutor(_cores - 1, thread_name_prefix="accelkit-cpu-jit")
    bounds = [rows * p // parts for p in range(parts + 1)]
    futures: list[Future[None]] = [
        _helpers.submit(body, bounds[p], bounds[p + 1]) for p in range(1, parts)
    ]
    try:
        body(bounds[0], bounds[1])
    finally:
        for f in futures:
            f.result()


def _run(name: str, fn: Callable[..., None], rows: int, per_row: int, *arrays: Any) -> None:
    """``fn(*arrays)``, its array arguments split by rows (their first axis, ``rows`` long)
    between this thread and helper threads when the work is long enough to gain from it."""

    def body(lo: int, hi: int) -> None:
        fn(*(a[lo:hi] if isinstance(a, np.ndarray) and len(a) == rows else a for a in arrays))

    _split(rows, rows * per_row * KERNELS[name], body)


def _plain(*arrays: Array) -> bool:
    return all(a.dtype == _F32 and a.flags.c_contiguous for a in arrays)


# -- the entry points: each runs the JIT kernel and returns True, or returns False --------------


def unary(op: str, x: Array, out: Array) -> bool:
    """``out = op(x)`` for exp, sigmoid, silu and gelu_tanh on float32."""
    fn = _ready.get(op)
    if (
        fn is not None
        and not _disabled
        and x.dtype is _F32
        and out.dtype is _F32
        and x.shape == out.shape
        and x.flags.c_contiguous
        and out.flags.c_contiguous
    ):
        # A ready kernel on plain F32 arrays (the common case): called directly when the work
        # is too short to split between threads, as _run would after its checks.
        n = x.size
        if n * KERNELS[op] < _SPLIT_S:
            fn(x.reshape(-1), out.reshape(-1))
        else:
            _run(op, fn, n, 1, x.reshape(-1), out.reshape(-1))
        return True
    if op not in KERNELS or not _plain(x, out) or x.shape != out.shape:
        return False
    fn = _kernel(op)
    if fn is None:
        return False
    _run(op, fn, x.size, 1, x.reshape(-1), out.reshape(-1))
    return True


def softmax_rows(s: Array, out: Array, *, empty_nan: bool, period: int = 0, base: int = 0) -> bool:
    """Softmax over the last axis of ``s`` into ``out`` (which may be ``s``); with ``period``
    > 0, flattened row ``i`` sees the keys up to ``i % period + base`` (a causal mask)."""
    if s.ndim == 0 or s.shape[-1] == 0 or not _plain(s, out) or s.shape != out.shape:
        return False
    fn = _kernel("softmax_rows")
    if fn is None:
        return False
    k = s.shape[-1]
    s2, o2 = s.reshape(-1, k), out.reshape(-1, k)
    if period > 0:
        # Row i of a part starting at row r sees up to (r + i) % period + base: give each part
        # its own base by splitting at multiples of the period.
        groups = s2.shape[0] // period

        def per_group(sg: Array, og: Array) -> None:
            fn(sg.reshape(-1, k), og.reshape(-1, k), period, base, empty_nan)

        _run(
            "softmax_rows",
            per_group,
            groups,
            period * k,
            s2.reshape(groups, period, k),
            o2.reshape(groups, period, k),
        )
    else:
        _run(
            "softmax_rows",
            lambda a, b: fn(a, b, 0, 0, empty_nan),
            s2.shape[0],
            k,
            s2,
            o2,
        )
    return True


def layer_norm(x: Array, w: Array | None, b: Array | None, eps: float, out: Array) -> bool:
    """Layer norm over the last axis on float32, with an optional per-column weight and bias."""
    if x.ndim == 0 or x.shape[-1] == 0 or not _plain(x, out) or x.shape != out.shape:
        return False
    d = x.shape[-1]
    wv, bv = _vector(w, d), _vector(b, d)
    if wv is None or bv is None:
        return False
    fn = _kernel("layer_norm")
    if fn is None:
        return False
    x2, o2 = x.reshape(-1, d), out.reshape(-1, d)
    _run("layer_norm", lambda a, o: fn(a, wv, bv, float(eps), o), x2.shape[0], d, x2, o2)
    return True


def rms_norm(x: Array, w: Array | None, eps: float, out: Array) -> bool:
    """RMS norm over the last axis on float32, with an optional per-column weight."""
    if x.ndim == 0 or x.shape[-1] == 0 or not _plain(x, out) or x.shape != out.shape:
        return False
    d = x.shape[-1]
    wv = _vector(w, d)
    if wv is None:
        return False
    fn = _kernel("rms_norm")
    if fn is None:
        return False
    x2, o2 = x.reshape(-1, d), out.reshape(-1, d)
    _run("rms_norm", lambda a, o: fn(a, wv, float(eps), o), x2.shape[0], d, x2, o2)
    return True


def attention(
    q: Array, k: Array, v: Array, mask: Array | None, out: Array, scale: float, causal: bool
) -> bool:
    """Grouped-KV attention without a mask (causal or not) on float32: q [B, H, Sq, D], k
    [B, Hk, Sk, D], v [B, Hk, Sk, Dv], out [B, H, Sq, Dv]."""
    if mask is not None or not _plain(q, k, v, out) or q.ndim != 4:
        return False
    b, h, sq, d = q.shape
    hk, sk, dv = k.shape[1], k.shape[2], v.shape[3]
    if 0 in (b, h, sq, d, dv) or sk == 0:
        return False
    fn = _kernel("attention")
    if fn is None:
        return False
    q3, o3 = q.reshape(b * h, sq, d), out.reshape(b * h, sq, dv)
    k3, v3 = k.reshape(b * hk, sk, d), v.reshape(b * hk, sk, dv)
    keys = min(sk, (sk + max(0, sk - sq)) / 2 + 1) if causal else sk  # seen per row, on average
    seconds = b * h * sq * keys * (d + dv) * KERNELS["attention"]
    _split(
        b * h,
        seconds,
        lambda lo, hi: fn(q3, k3, v3, o3, float(scale), causal, h, hk, lo, hi),
    )
    return True


_NONE = np.empty(0, _F32)


def _vector(v: Array | None, d: int) -> Array | None:
    """A per-column parameter as the kernels take it (empty for none); None where they cannot."""
    if v is None:
        return _NONE
    if v.shape != (d,) or not _plain(v):
        return None
    return v


# -- the checks: each JIT kernel against the NumPy kernel it replaces ---------------------------


def _probe_values() -> Array:
    rng = np.random.default_rng(20261126)
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-3, -1e-3, 1.0, -1.0, 20.0, -20.0]
    edges = [88.0, 88.7, 88.73, 89.0, -87.3, -87.4, -95.0, -103.9, -104.0, -110.0, 1e30, -1e30]
    return np.concatenate(
        [np.array(special + edges, np.float32), (rng.standard_normal(4096) * 12).astype(np.float32)]
    )


def _same_nans(got: Array, want: Array, what: str) -> None:
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {got.shape}, expected {want.shape}")
    if (np.isnan(got) != np.isnan(want)).any():
        raise AssertionError(f"{what}: NaN at different places from the NumPy kernel")


def _same(got: Array, want: Array, what: str, rtol: float = 2e-6, atol: float = 1e-30) -> None:
    """NaN at the same places, equal infinities, and the rest within the tolerances. The norms
    take a looser one: their JIT kernels sum in float64, NumPy's in float32."""
    _same_nans(got, want, what)
    ok = ~np.isnan(want)
    close = np.isclose(got[ok], want[ok], rtol=rtol, atol=atol)
    if not close.all():
        i = int(np.flatnonzero(~close)[0])
        raise AssertionError(f"{what}: {got[ok][i]!r} where the NumPy kernel gives {want[ok][i]!r}")


#: Each unary op in float64 from its textbook formula, and the argument of its exponential:
#: the truth both kernels are measured against, and how much an argument's rounding costs.
_TRUTH: dict[str, tuple[Callable[[Array], Array], Callable[[Array], Array]]] = {
    "exp": (np.exp, lambda x: x),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), lambda x: x),
    "silu": (lambda x: x / (1 + np.exp(-x)), lambda x: x),
    "gelu_tanh": (  # 0.5 x (1 + tanh(u)) without float64's cancellation for u below -19
        lambda x: x / (1 + np.exp(-1.5957691216057308 * (x + 0.044715 * x**3))),
        lambda x: 1.5957691216057308 * (x + 0.044715 * x**3),
    ),
}


def _check_unary(op: str) -> Callable[[Callable[..., None]], None]:
    """NaN where the NumPy kernel has NaN, and elsewhere errors against the float64 truth, in
    units of the float32 rounding of the exponential's argument (an error of one ulp in ``u``
    is ``|u|`` ulp in ``exp(u)``, for either kernel), at most twice the NumPy kernel's worst."""

    def check(fn: Callable[..., None]) -> None:
        from accelkit._core.host_kernels.elementwise import _unary_numpy

        x = _probe_values()
        got, want = np.empty_like(x), np.empty_like(x)
        fn(x, got)
        truth_of, arg_of = _TRUTH[op]
        with np.errstate(all="ignore"):
            _unary_numpy(op, x, want)
            x64 = x.astype(np.float64)
            truth = truth_of(x64)
            scale = np.abs(truth) * (1 + np.abs(arg_of(x64)))
        _same_nans(got, want, op)
        if (np.isinf(got) != np.isinf(want)).any() or (
            got[np.isinf(got)] != want[np.isinf(got)]
        ).any():
            raise AssertionError(f"{op}: infinities at different places from the NumPy kernel")
        ok = np.isfinite(want) & (truth != 0) & (np.abs(truth) > 1e-37)  # no subnormals here
        with np.errstate(all="ignore"):
            err_jit = np.abs(got[ok] - truth[ok]) / scale[ok]
            err_np = np.abs(want[ok] - truth[ok]) / scale[ok]
        tiny = (np.abs(truth) <= 1e-37) & np.isfinite(truth)  # subnormal results: absolute
        worst = float(err_jit.max(initial=0))
        if (
            worst > 2 * float(err_np.max(initial=0)) + 2.4e-7
            or (
                np.abs(got[tiny] - truth[tiny]) > 2 * np.abs(want[tiny] - truth[tiny]) + 3e-45
            ).any()
        ):
            i = int(np.argmax(err_jit))
            raise AssertionError(
                f"{op}({x[ok][i]!r}) = {got[ok][i]!r}; the NumPy kernel gives {want[ok][i]!r},"
                f" float64 {truth[ok][i]!r}"
            )

    return check


def _check_softmax(fn: Callable[..., None]) -> None:
    from accelkit._core.host_kernels.nn import _softmax_rows_numpy

    x = _probe_values()[: 37 * 24].reshape(37, 24).copy()
    x[5] = -np.inf
    x[6, :3] = np.inf
    x[7] = np.nan
    x[8, :] = -np.inf
    x[8, 4] = np.nan
    for empty_nan in (True, False):
        got, want = np.empty_like(x), x.copy()
        fn(x, got, 0, 0, empty_nan)
        with np.errstate(all="ignore"):
            _softmax_rows_numpy(want, empty_rows="nan" if empty_nan else "zero")
        _same(got, want, "softmax")
    # causal: row i sees keys 0 .. i % 8 + base
    for base in (-3, 0, 5):
        got, want = np.empty_like(x), x.copy()
        fn(x, got, 8, base, False)
        hidden = np.arange(24)[None, :] > (np.arange(37) % 8)[:, None] + base
        want[hidden] = -np.inf
        with np.errstate(all="ignore"):
            _softmax_rows_numpy(want, empty_rows="zero")
        _same(got, want, f"causal softmax (base {base})")


def _check_layer_norm(fn: Callable[..., None]) -> None:
    from accelkit._core.host_kernels.nn import _layer_norm_numpy

    x = (_probe_values()[: 40 * 64].reshape(40, 64) + 3).astype(np.float32)
    rng = np.random.default_rng(1)
    w, b = rng.standard_normal((2, 64)).astype(np.float32)
    for wv, bv in ((w, b), (w, None), (None, b), (None, None)):
        got, want = np.empty_like(x), np.empty_like(x)
        fn(x, _vector(wv, 64), _vector(bv, 64), 1e-5, got)
        with np.errstate(all="ignore"):
            _layer_norm_numpy(x, wv, bv, 1e-5, want)
        _same(got, want, "layer_norm", rtol=1e-4, atol=1e-4)


def _check_rms_norm(fn: Callable[..., None]) -> None:
    from accelkit._core.host_kernels.nn import _rms_norm_numpy

    x = _probe_values()[: 40 * 64].reshape(40, 64).copy()
    w = np.random.default_rng(2).standard_normal(64).astype(np.float32)
    for wv in (w, None):
        got, want = np.empty_like(x), np.empty_like(x)
        fn(x, _vector(wv, 64), 1e-5, got)
        with np.errstate(all="ignore"):
            _rms_norm_numpy(x, wv, 1e-5, want)
        _same(got, want, "rms_norm", rtol=1e-4, atol=1e-4)


def _check_attention(fn: Callable[..., None]) -> None:
    from accelkit._core.host_kernels.nn import _attention_chunked

    rng = np.random.default_rng(3)
    # Head dimensions that are and are not a multiple of the kernel's four per pass.
    for b, h, hk, sq, sk, d, causal in ((2, 4, 2, 9, 13, 8, True), (1, 2, 2, 12, 5, 6, True),
                                        (2, 2, 1, 7, 7, 3, False)):  # fmt: skip
        q = rng.standard_normal((b, h, sq, d)).astype(np.float32)
        k = rng.standard_normal((b, hk, sk, d)).astype(np.float32)
        v = rng.standard_normal((b, hk, sk, 5)).astype(np.float32)
        k[0, 0, sk // 2, 1] = np.nan
        q[-1, -1, 1, 0] = np.inf
        got, want = np.empty((b, h, sq, 5), np.float32), np.empty((b, h, sq, 5), np.float32)
        g3 = got.reshape(b * h, sq, 5)
        fn(q.reshape(b * h, sq, d), k.reshape(b * hk, sk, d), v.reshape(b * hk, sk, 5), g3,
           0.3, causal, h, hk, 0, b * h)  # fmt: skip
        with np.errstate(all="ignore"):
            _attention_chunked(q, k, v, None, want, 0.3, causal)  # NumPy's softmax
        what = f"attention ({'causal' if causal else 'full'}, Sq {sq}, Sk {sk})"
        _same(got, want, what, rtol=1e-4, atol=1e-4)


_CHECKS: dict[str, Callable[[Callable[..., None]], None]] = {
    "exp": _check_unary("exp"),
    "sigmoid": _check_unary("sigmoid"),
    "silu": _check_unary("silu"),
    "gelu_tanh": _check_unary("gelu_tanh"),
    "softmax_rows": _check_softmax,
    "layer_norm": _check_layer_norm,
    "rms_norm": _check_rms_norm,
    "attention": _check_attention,
}
