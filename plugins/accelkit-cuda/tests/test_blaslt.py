"""A linear's bias in cuBLASLt's epilogue (``accelkit_cuda.blaslt``), without a GPU: the
descriptors the plan makes, against the real ``libcublasLt`` where one is installed (its host
calls run without a device) and a recorder of the ctypes calls; the arithmetic and the routes
end to end over the stand-ins for CuPy, cuBLAS and cuBLASLt. Its speed and its numbers on a
device are the GPU check's (``test_gpu.py``'s linear cases, conformance's, bench_cuda)."""

from __future__ import annotations

import ctypes
import glob
import importlib
import os
import site
from collections.abc import Callable
from typing import Any

import fake_cupy
import ml_dtypes
import numpy as np
import pytest
from test_offloop import Plugin, _open, plugin

from accelkit.sdk import buffer_of
from accelkit.workloads import BlockConfig, block_weights, transformer_block, upload_weights

__all__ = ["plugin"]


def _libs(monkeypatch: pytest.MonkeyPatch, algorithms: bool = True) -> fake_cupy.CublasLt:
    """The stand-ins for cuBLAS and cuBLASLt, as the plugin's (fresh) modules find the
    libraries CuPy loaded on a GPU."""
    monkeypatch.setattr(
        importlib.import_module("accelkit_cuda.blas"), "_cublas", fake_cupy.Cublas()
    )
    lt = fake_cupy.CublasLt(algorithms)
    monkeypatch.setattr(importlib.import_module("accelkit_cuda.blaslt"), "_lt", lt)
    return lt


def _names() -> list[str]:
    return [name for name, _ in fake_cupy.CALLS]


def _dtype(name: str) -> np.dtype[Any]:
    return np.dtype(ml_dtypes.bfloat16 if name == "bfloat16" else name)


def _tolerance(x: Any, w: Any, b: Any, dt: np.dtype[Any]) -> Any:
    """|error| of x @ w.T + b with F32 (F64) accumulation, the bias added before one rounding
    to ``dt``: k + 1 roundings of the accumulator's eps over the magnitudes summed, plus half
    an ulp of the stored type (an eps bound, twice that)."""
    acc = float(np.finfo(np.float64 if dt == np.float64 else np.float32).eps)
    store = float(ml_dtypes.finfo(dt).eps) if dt.itemsize == 2 else 0.0
    mag = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T + np.abs(b)
    ref = x.astype(np.float64) @ w.astype(np.float64).T + b.astype(np.float64)
    return (x.shape[-1] + 1) * acc * mag + store * np.abs(ref), ref


pytestmark = pytest.mark.anyio


def _operands(seed: int, x_shape: tuple[int, ...], n: int, dt: Any) -> tuple[Any, Any, Any]:
    """x, a weight of n rows (scaled to keep the sums unit-sized) and a bias, of ``dt``."""
    rng = np.random.default_rng(seed)
    x_h = rng.standard_normal(x_shape).astype(dt)
    w_h = (rng.standard_normal((n, x_shape[-1])) / 4).astype(dt)
    return x_h, w_h, rng.standard_normal(n).astype(dt)


async def _linears(
    plugin: Plugin, x_h: Any, w_h: Any, b_h: Any, calls: int, before: Any = None
) -> tuple[list[Any], list[list[str]], int]:
    """``calls`` linears with a bias on a fresh backend (its raw kernels loaded), each awaited:
    the results, the stand-in's calls of each, and the bias's device pointer. ``before(backend,
    ops, x, w, b)`` runs first (awaited), its calls not counted."""
    backend = await _open(plugin)
    try:
        await backend.tensor_ops.kernels.fast.load()
        f, ops = backend.tensor_factory, backend.tensor_ops
        x, w, b = f.from_host(x_h), f.from_host(w_h), f.from_host(b_h)
        if before is not None:
            await before(backend, ops, x, w, b)
        results, names = [], []
        for _ in range(calls):
            fake_cupy.CALLS.clear()
            results.append(await ops.linear(x, w, b).to_host())
            names.append(_names())
        return results, names, buffer_of(b).handle.ptr
    finally:
        await backend.shutdown()


@pytest.mark.parametrize(
    ("dtype", "x_shape"),
    [("float32", (2, 5, 16)), ("float64", (3, 16)), ("float16", (2, 3, 16)),
     ("bfloat16", (4, 16))],
)  # fmt: skip
async def test_a_linear_with_a_bias_is_one_cublaslt_launch(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch, dtype: str, x_shape: tuple[int, ...]
) -> None:
    """F32 and F64 were two launches (the GEMM, then the bias kernel), F16 and BF16 CuPy's
    path (an F32 product, the bias added, a cast); each is now one ``cublasLtMatmul`` with the
    bias in its epilogue, rounded once, and the plan is made at the first call only."""
    lt = _libs(monkeypatch)
    dt = _dtype(dtype)
    x_h, w_h, b_h = _operands(11, x_shape, 12, dt)
    (first, got), (made, names), bias_ptr = await _linears(plugin, x_h, w_h, b_h, 2)
    tol, ref = _tolerance(x_h, w_h, b_h, dt)
    for result in (first, got):
        assert result.dtype == dt
        assert np.all(np.abs(result.astype(np.float64) - ref) <= tol)
    assert made.count("cublasLtMatmulAlgoGetHeuristic") == 1
    assert names.count("cublasLtMatmul") == 1
    assert "cublasLtMatmulAlgoGetHeuristic" not in names  # the plan is kept
    assert "cublasGemmEx" not in names
    assert not [m for m in names if m.startswith(("launch eb_add", "ufunc", "ndarray"))], names
    # the epilogue and the bias's type as cuBLASLt wants them, the bias set at every call
    sets = [args for name, args in lt.calls if name == "cublasLtMatmulDescSetAttribute"]
    attrs = {attr: value for _desc, attr, value in sets}
    assert attrs[7] == 4  # CUBLASLT_EPILOGUE_BIAS
    assert attrs[26] == {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 14}[dtype]
    assert [s for s in sets if s[1] == 8][-1][2] == bias_ptr


@pytest.mark.parametrize("dtype", ["float32", "float16"])
async def test_where_cublaslt_has_no_algorithm_the_linear_takes_its_old_path(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch, dtype: str
) -> None:
    """No algorithm for the descriptors: F32 takes the GEMM and the bias kernel, F16 CuPy's
    path, with the same numbers; the heuristic is asked once per signature and the
    descriptors it refused are freed."""
    lt = _libs(monkeypatch, algorithms=False)
    dt = _dtype(dtype)
    x_h, w_h, b_h = _operands(12, (3, 8), 5, dt)
    results, per_call, _ = await _linears(plugin, x_h, w_h, b_h, 2)
    names = [name for call in per_call for name in call]
    tol, ref = _tolerance(x_h, w_h, b_h, dt)
    if dtype == "float16":  # CuPy's path over the stand-in may round the product first
        mag = np.abs(x_h.astype(np.float64)) @ np.abs(w_h.astype(np.float64)).T
        tol = tol + float(np.finfo(dt).eps) * (mag + np.abs(b_h))
    for got in results:
        assert np.all(np.abs(got.astype(np.float64) - ref) <= tol)
    assert names.count("cublasLtMatmulAlgoGetHeuristic") == 1
    assert "cublasLtMatmul" not in names
    if dtype == "float32":
        assert names.count("cublasGemmEx") == 2
        assert names.count("launch eb_add_f32") == 2
    else:
        assert [m for m in names if m.startswith(("ufunc", "ndarray"))]
    assert (lt.live("desc"), lt.live("layout"), lt.live("pref")) == (0, 0, 0)


async def test_a_launch_cublaslt_refuses_takes_the_old_path_and_drops_the_plan(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cublasLtMatmul`` returning an error status launched nothing: the call takes the GEMM
    and the bias kernel, the plan is freed and not tried again (as PyTorch's gemm_and_bias
    falls back to the unfused GEMM)."""
    lt = _libs(monkeypatch)
    lt.launch_status = 15  # CUBLAS_STATUS_NOT_SUPPORTED
    blaslt = importlib.import_module("accelkit_cuda.blaslt")
    x_h, w_h, b_h = _operands(16, (3, 8), 5, np.float32)
    results, per_call, _ = await _linears(plugin, x_h, w_h, b_h, 3)
    names = [name for call in per_call for name in call]
    tol, ref = _tolerance(x_h, w_h, b_h, np.dtype(np.float32))
    for got in results:
        assert np.all(np.abs(got - ref) <= tol)
    assert names.count("cublasLtMatmul") == 1  # tried once
    assert names.count("cublasGemmEx") == 3
    assert names.count("launch eb_add_f32") == 3
    assert blaslt.stats["launch_failed"] == 1
    assert (lt.live("desc"), lt.live("layout")) == (0, 0)


async def test_an_f32_linear_before_the_bias_kernel_loads_is_not_kept_on_cupys_path(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signature first seen before the bias kernel is loaded is not kept: once it is, a call
    cuBLASLt declines takes the GEMM and the bias kernel, not CuPy's path for good."""
    _libs(monkeypatch, algorithms=False)
    x_h, w_h, b_h = _operands(17, (3, 8), 5, np.float32)

    async def before(backend: Any, ops: Any, x: Any, w: Any, b: Any) -> None:
        fast = backend.tensor_ops.kernels.fast
        loaded = fast.function

        def no_bias_kernel(op: str, dtype: Any) -> Any:
            return None if op == "bias_add" else loaded(op, dtype)

        monkeypatch.setattr(fast, "function", no_bias_kernel)
        await ops.linear(x, w, b).to_host()  # no bias kernel yet: CuPy's path
        monkeypatch.setattr(fast, "function", loaded)

    (got,), (names,), _ = await _linears(plugin, x_h, w_h, b_h, 1, before)
    tol, ref = _tolerance(x_h, w_h, b_h, np.dtype(np.float32))
    assert np.all(np.abs(got - ref) <= tol)
    assert names.count("cublasGemmEx") == 1
    assert names.count("launch eb_add_f32") == 1


async def test_the_epilogue_route_can_be_turned_off(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    _libs(monkeypatch)
    monkeypatch.setenv("ACCELKIT_CUDA_LT", "0")
    x_h, w_h, b_h = _operands(13, (3, 8), 5, np.float32)
    (_, got), (_, names), _ = await _linears(plugin, x_h, w_h, b_h, 2)
    tol, ref = _tolerance(x_h, w_h, b_h, np.dtype(np.float32))
    assert np.all(np.abs(got - ref) <= tol)
    assert not [m for m in names if m.startswith("cublasLt")]
    assert names.count("cublasGemmEx") == 1
    assert names.count("launch eb_add_f32") == 1


async def test_the_transformer_block_runs_its_six_biases_in_the_epilogue(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench_core's block: its six linears are six cuBLASLt launches, no GEMM and no bias
    kernel besides; the MLP half's numbers are float64 NumPy's (the stand-in runs no fused
    attention kernel: test_gpu.py checks the whole block)."""
    _libs(monkeypatch)
    cfg = BlockConfig(batch=2, seq=8, width=32, heads=4)
    w_h = block_weights(cfg)
    x_h = np.random.default_rng(14).standard_normal((2, 8, 32)).astype(np.float32)
    backend = await _open(plugin)
    try:
        await backend.tensor_ops.kernels.fast.load()
        ops = backend.tensor_ops
        w = upload_weights(backend, w_h)
        x = backend.tensor_factory.from_host(x_h)

        def mlp() -> Any:
            m = ops.gelu(ops.linear(x, w["w_1"], w["b_1"]), approximate="tanh")
            return ops.add(x, ops.linear(m, w["w_2"], w["b_2"]))

        await mlp().to_host()
        got = await mlp().to_host()
        await transformer_block(backend, x, w, cfg).to_host()
        fake_cupy.CALLS.clear()
        await transformer_block(backend, x, w, cfg).to_host()
        block = _names()
    finally:
        await backend.shutdown()
    f64 = {k: v.astype(np.float64) for k, v in w_h.items()}
    m = x_h.astype(np.float64) @ f64["w_1"].T + f64["b_1"]
    m = 0.5 * m * (1 + np.tanh(0.7978845608028654 * (m + 0.044715 * m**3)))
    want = x_h + m @ f64["w_2"].T + f64["b_2"]
    eps = float(np.finfo(np.float32).eps)
    np.testing.assert_allclose(got, want, rtol=0, atol=8 * 4 * 32 * eps * np.abs(want).max())
    assert block.count("cublasLtMatmul") == 6
    assert "cublasGemmEx" not in block
    assert not [n for n in block if n.startswith("launch eb_add")]


# -- the plans, directly --------------------------------------------------------------------------
def _device_array(shape: tuple[int, ...], dt: Any, offset: int, values: Any) -> tuple[int, Any]:
    """``values`` at ``offset`` bytes past a 256-byte aligned host block (the stand-in's device
    memory): its pointer and the block."""
    nbytes = int(np.prod(shape)) * np.dtype(dt).itemsize
    block = np.zeros(nbytes + 512, np.uint8)
    ptr = (block.ctypes.data + 255) // 256 * 256 + offset
    view = np.ndarray(shape, dt, buffer=block, offset=ptr - block.ctypes.data)
    view[...] = values
    return ptr, (block, view)


def test_a_plan_declares_the_alignment_of_its_pointers(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heuristic is told the lowest alignment of the four pointers (cuBLASLt assumes 256
    bytes otherwise, and an algorithm chosen for 256 may fault on less): a call at 4-byte
    aligned operands gets a plan of its own, and a later aligned call the 256-byte one."""
    lt = _libs(monkeypatch)
    blas = importlib.import_module("accelkit_cuda.blas")
    blaslt = importlib.import_module("accelkit_cuda.blaslt")
    import cupy

    rng = np.random.default_rng(15)
    rows, n, k = 6, 5, 7
    x_v, w_v = rng.standard_normal((rows, k)), rng.standard_normal((n, k))
    b_v = rng.standard_normal(n)
    sig = blaslt.signature(blas.linear_plan(rows, n, k), 0, 68)  # f32, CUBLAS_COMPUTE_32F
    assert sig is not None
    for offset, declared in ((4, 4), (0, 256), (8, 8)):
        px, keep_x = _device_array((rows, k), np.float32, offset, x_v)
        pw, keep_w = _device_array((n, k), np.float32, 0, w_v)
        pb, keep_b = _device_array((n,), np.float32, 0, b_v)
        po, keep_o = _device_array((rows, n), np.float32, 0, 0)
        lt.calls.clear()
        assert blaslt.linear_bias(cupy, sig, px, pw, pb, po)
        prefs = {
            args[1]: args[2] for name, args in lt.calls
            if name == "cublasLtMatmulPreferenceSetAttribute"
        }  # fmt: skip
        assert {prefs[a] for a in (5, 6, 7, 8)} == {declared}
        want = x_v @ w_v.T + b_v
        eps = float(np.finfo(np.float32).eps)
        tol = (k + 1) * eps * (np.abs(x_v) @ np.abs(w_v).T + np.abs(b_v)) + eps * np.abs(want)
        assert np.all(np.abs(keep_o[1] - want) <= tol)
        del keep_x, keep_w, keep_b
    assert lt.live("desc") == 3  # one plan an alignment; the preferences freed
    assert lt.live("pref") == 0


def test_a_thread_keeps_a_bounded_number_of_plans(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    lt = _libs(monkeypatch)
    blas = importlib.import_module("accelkit_cuda.blas")
    blaslt = importlib.import_module("accelkit_cuda.blaslt")
    monkeypatch.setattr(blaslt, "_PLANS", 3)
    import cupy

    for n in range(2, 9):
        sig = blaslt.signature(blas.linear_plan(2, n, 4), 0, 68)
        assert sig is not None
        px, _kx = _device_array((2, 4), np.float32, 0, 1.0)
        pw, _kw = _device_array((n, 4), np.float32, 0, 1.0)
        pb, _kb = _device_array((n,), np.float32, 0, 0.5)
        po, ko = _device_array((2, n), np.float32, 0, 0)
        assert blaslt.linear_bias(cupy, sig, px, pw, pb, po)
        np.testing.assert_array_equal(ko[1], np.full((2, n), 4.5, np.float32))
        assert lt.live("desc") <= 3
        assert lt.live("layout") == 3 * lt.live("desc")


def test_a_batched_gemm_or_a_vector_is_not_a_signature() -> None:
    from accelkit_cuda import blas, blaslt

    p = blas.plan((2, 3, 4), (48, 16, 4), (2, 4, 5), (80, 20, 4), 4)
    assert p is not None
    assert p[-1] == 2
    assert blaslt.signature(p, 0, 68) is None
    # a row or column vector (PyTorch keeps them off cuBLASLt too)
    for rows, n, k in ((1, 5, 7), (6, 1, 7), (6, 5, 1)):
        assert blaslt.signature(blas.linear_plan(rows, n, k), 0, 68) is None
    assert blaslt.signature(blas.linear_plan(2, 2, 2), 0, 68) is not None


# -- ctypes ---------------------------------------------------------------------------------------
def test_the_setters_keep_the_interpreter_lock_and_the_launch_releases_it() -> None:
    from accelkit_cuda import blaslt

    seen: list[tuple[str, str, tuple[Any, ...]]] = []

    class Fn:
        def __init__(self, lib: str, name: str) -> None:
            self.lib, self.name = lib, name
            self.argtypes: list[Any] = []
            self.restype: Any = None

        def __call__(self, *args: Any) -> int:
            seen.append((self.name, self.lib, args))
            if self.name.endswith("Create"):
                ctypes.cast(args[0], ctypes.POINTER(ctypes.c_void_p))[0] = 0x50
            return 0

    class Lib:
        def __init__(self, kind: str) -> None:
            self.kind = kind

        def __getattr__(self, name: str) -> Fn:
            return Fn(self.kind, name)

    lt = blaslt.CublasLt(Lib("CDLL"), Lib("PyDLL"))
    assert lt.desc_create(68, 0) == 0x50
    lt.desc_set(0x50, 7, ctypes.c_uint32(4))
    lt.set_bias(0x50, ctypes.c_void_p(0x1000))
    lt.pref_set(0x60, 1, ctypes.c_uint64(1 << 25))
    lt.matmul(*range(16))
    where = {name: lib for name, lib, _ in seen}
    assert where == {
        "cublasLtMatmulDescCreate": "PyDLL", "cublasLtMatmulDescSetAttribute": "PyDLL",
        "cublasLtMatmulPreferenceSetAttribute": "PyDLL", "cublasLtMatmul": "CDLL",
    }  # fmt: skip
    sizes = [args[3] for name, _, args in seen if name.endswith("SetAttribute")]
    assert sizes == [4, 8, 8]  # uint32_t, a pointer, uint64_t


def _real_cublaslt() -> str | None:
    """A ``libcublasLt`` on this machine (``ACCELKIT_TEST_CUBLASLT``, the ``nvidia-cublas``
    wheel's, or the loader's), or None."""
    found = os.environ.get("ACCELKIT_TEST_CUBLASLT")
    if found:
        return found
    for root in site.getsitepackages():
        hits = glob.glob(os.path.join(root, "nvidia", "*", "lib", "libcublasLt.so.*"))
        if hits:
            return hits[0]
    for name in ("libcublasLt.so.13", "libcublasLt.so.12"):
        try:
            ctypes.CDLL(name)
            return name
        except OSError:
            continue
    return None


def _getter(lib: Any, name: str) -> Callable[[int, int, Any], Any]:
    """``cublasLt<name>GetAttribute`` as ``get(object, attr, ctype)`` -> the value read back."""
    fn = getattr(lib, f"cublasLt{name}GetAttribute")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                   ctypes.POINTER(ctypes.c_size_t)]  # fmt: skip
    fn.restype = ctypes.c_int

    def get(obj: int, attr: int, kind: Any) -> Any:
        value, written = kind(), ctypes.c_size_t()
        status = fn(obj, attr, ctypes.byref(value), ctypes.sizeof(value), ctypes.byref(written))
        assert status == 0, (name, attr, status)
        assert written.value == ctypes.sizeof(value), (name, attr, written.value)
        return value.value

    return get


@pytest.mark.parametrize(
    ("in_type", "compute", "scale"),
    [(0, 68, 0), (0, 77, 0), (1, 70, 1), (2, 68, 0), (14, 68, 0)],
)  # f32, TF32, f64, f16, bf16
def test_the_real_cublaslt_holds_the_plan_as_built(in_type: int, compute: int, scale: int) -> None:
    """``_build`` against the real library (its host calls need no device; only the heuristic,
    which reads the device, is stood in for): every attribute read back from the real
    descriptors with its C size, as ``cublasLt.h`` defines them; a value of the wrong size is
    refused (CUBLAS_STATUS_INVALID_VALUE)."""
    path = _real_cublaslt()
    if path is None:
        pytest.skip("no libcublasLt here (the nvidia-cublas wheel or a CUDA toolkit brings one)")
    from accelkit_cuda import blas, blaslt

    raw = ctypes.CDLL(path)
    lt = blaslt.CublasLt(raw, ctypes.PyDLL(path))
    desc_get, layout_get = _getter(raw, "MatmulDesc"), _getter(raw, "MatrixLayout")
    pref_get = _getter(raw, "MatmulPreference")
    seen: dict[str, Any] = {}

    def heuristic(handle: int, desc: int, a: int, b: int, c: int, d: int, pref: int) -> Any:
        u32, i32, u64, i64 = ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64, ctypes.c_int64
        seen["desc"] = {attr: desc_get(desc, attr, kind) for attr, kind in (
            (0, i32), (1, i32), (3, i32), (4, i32), (7, u32), (8, ctypes.c_void_p), (26, i32),
        )}  # fmt: skip
        layout_attrs = ((0, u32), (2, u64), (3, u64), (4, i64))
        seen["layouts"] = [
            tuple(layout_get(m, attr, kind) for attr, kind in layout_attrs) for m in (a, b, c, d)
        ]
        seen["pref"] = {attr: pref_get(pref, attr, kind) for attr, kind in (
            (1, u64), (3, u32), (5, u32), (6, u32), (7, u32), (8, u32),
        )}  # fmt: skip
        return (ctypes.c_char * blaslt.HEURISTIC_BYTES)()

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(lt, "heuristic", heuristic)
    try:
        rows, n, k = 6, 5, 7
        sig = blaslt.signature(blas.linear_plan(rows, n, k), in_type, compute)
        assert sig is not None
        plan = blaslt._build(lt, 0x1234, sig, 16, 32 << 20)
    finally:
        monkeypatch.undo()
    assert plan is not None
    # op(A) = the weight [n, k] row-major read transposed, B the input, D the output (n x rows)
    assert seen["desc"] == {0: compute, 1: scale, 3: 1, 4: 0, 7: 4, 8: 16, 26: in_type}
    assert seen["layouts"] == [
        (in_type, k, n, k), (in_type, k, rows, k), (in_type, n, rows, n), (in_type, n, rows, n),
    ]  # fmt: skip
    assert seen["pref"] == {1: 32 << 20, 3: 2, 5: 16, 6: 16, 7: 16, 8: 16}
    with pytest.raises(RuntimeError, match="status 7"):  # INVALID_VALUE: a wrong size
        lt.desc_set(plan.desc, blaslt._DESC_EPILOGUE, ctypes.c_uint64(4))
    plan.free(lt)
