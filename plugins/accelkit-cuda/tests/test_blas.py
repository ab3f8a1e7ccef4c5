"""The cuBLAS GEMM path (accelkit_cuda.blas) without a GPU.

:func:`~accelkit_cuda.blas.plan` turns row-major operands into a column-major cuBLAS call; the
call is replayed here by a NumPy emulation of ``cublasGemmEx`` / ``cublasGemmStridedBatchedEx``
over the operands' raw memory, and must give ``a @ b``. The TF32 switch is checked to reach the
GEMM on the backend over the CuPy stand-in (where cuBLAS itself is absent, ``cupy.matmul``
serves). The GEMMs themselves, and their speed, need a GPU (benchmarks/bench_cuda_attention.py).
"""

from __future__ import annotations

import ctypes
import importlib
from typing import Any

import numpy as np
import pytest
from accelkit_cuda import blas
from test_offloop import Plugin, plugin

from accelkit.device import Device

__all__ = ["plugin"]


def _emulate(p: tuple[Any, ...], first: Any, second: Any) -> Any:
    """cuBLAS's column-major GEMM over flat element buffers: C = op(A) op(B), batched."""
    ta, tb, m, n, k, lda, ldb, ldc, sa, sb, sc, batch = p
    c = np.zeros(sc * (batch - 1) + ldc * n)

    def op(flat: Any, offset: int, trans: int, rows: int, cols: int, ld: int) -> Any:
        if trans == 0:  # stored rows x cols, column-major
            return np.array([[flat[offset + i + j * ld] for j in range(cols)] for i in range(rows)])
        return np.array([[flat[offset + j + i * ld] for j in range(cols)] for i in range(rows)])

    for i in range(batch):
        prod = op(first, i * sa, ta, m, k, lda) @ op(second, i * sb, tb, k, n, ldb)
        for col in range(n):
            c[i * sc + col * ldc : i * sc + col * ldc + m] = prod[:, col]
    return c


@pytest.mark.parametrize(
    ("a_shape", "b_kind", "b_shape"),
    [
        ((5, 3), "c", (3, 4)),
        ((5, 3), "t", (3, 4)),  # linear's weight: the transpose of a C-contiguous [n, k]
        ((2, 5, 3), "c", (3, 4)),  # a batch folded into the rows
        ((2, 3, 5, 3), "t", (3, 1)),
        ((3, 5, 3), "batch", (3, 3, 4)),  # a strided batched GEMM
        ((1, 1), "t", (1, 1)),
    ],
)
def test_the_plan_computes_a_times_b(
    a_shape: tuple[int, ...], b_kind: str, b_shape: tuple[int, ...]
) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype(np.float32)
    if b_kind == "t":
        w = rng.standard_normal(b_shape[::-1]).astype(np.float32)
        b, b_memory = w.T, w.ravel()
    else:
        b = rng.standard_normal(b_shape).astype(np.float32)
        b_memory = b.ravel()
    p = blas.plan(a.shape, a.strides, b.shape, b.strides, a.itemsize)
    assert p is not None
    out = _emulate(p, b_memory, a.ravel())  # cuBLAS's first operand is b
    want = a @ b
    np.testing.assert_allclose(out[: want.size].reshape(want.shape), want, rtol=1e-5, atol=1e-5)


def test_layouts_the_plan_leaves_to_cupy() -> None:
    a = np.zeros((4, 3), np.float32)
    b = np.zeros((3, 2), np.float32)

    def plan(x: Any, y: Any) -> Any:
        return blas.plan(x.shape, x.strides, y.shape, y.strides, x.itemsize)

    assert plan(a, b) is not None
    assert plan(np.zeros((3, 4), np.float32).T, b) is None  # a transposed: not taken
    assert plan(a, np.zeros((3, 4), np.float32)[:, ::2]) is None  # b strided
    assert plan(a, np.zeros((2, 3), np.float32)) is None  # k differs
    assert plan(np.zeros((2, 4, 3), np.float32), np.zeros((3, 3, 2), np.float32)) is None
    assert plan(np.zeros((0, 3), np.float32), b) is None  # empty
    assert plan(np.zeros(3, np.float32), b) is None  # a vector
    assert blas.workspace_bytes((9, 0)) == 32 << 20
    assert blas.workspace_bytes((8, 0)) < 32 << 20


@pytest.mark.anyio
async def test_tf32_is_off_unless_allowed(plugin: Plugin, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, bool]] = []
    module = importlib.import_module("accelkit_cuda.blas")

    def matmul(a: Any, b: Any, out: Any = None, tf32: bool = False, wide: bool = False) -> None:
        seen.append((a.dtype.name, tf32))
        return None  # cupy.matmul serves

    monkeypatch.setattr(module, "matmul", matmul)
    monkeypatch.delenv("ACCELKIT_CUDA_ALLOW_TF32", raising=False)
    backend = plugin.backend.CUDABackend()
    await backend.initialize(Device("cuda", 0))
    try:
        assert backend.allow_tf32 is False
        assert backend.capabilities.extra["tf32"] is True  # the device has TF32 cores
        f, ops = backend.tensor_factory, backend.tensor_ops
        x = f.from_host(np.eye(4, dtype=np.float32) * 2)
        y = ops.matmul(x, x)
        np.testing.assert_array_equal(await y.to_host(), np.eye(4) * 4)
        backend.allow_tf32 = True
        await ops.linear(x, x).to_host()
        await backend.synchronize()
    finally:
        await backend.shutdown()
    assert ("float32", False) in seen
    assert ("float32", True) in seen
    monkeypatch.setenv("ACCELKIT_CUDA_ALLOW_TF32", "1")
    assert plugin.backend.CUDABackend().allow_tf32 is True


# (in dtype, out dtype, tf32) -> (cudaDataType in, out, cublasComputeType_t, scalar type)
_COMBOS = {
    ("float16", "float16", False): (2, 2, 68, "c_float"),
    ("float16", "float32", False): (2, 0, 68, "c_float"),
    ("bfloat16", "bfloat16", False): (14, 14, 68, "c_float"),
    ("bfloat16", "float32", False): (14, 0, 68, "c_float"),
    ("float32", "float32", False): (0, 0, 68, "c_float"),
    ("float32", "float32", True): (0, 0, 77, "c_float"),
    ("float64", "float64", False): (1, 1, 70, "c_double"),
}


@pytest.mark.parametrize(("combo", "want"), list(_COMBOS.items()), ids=lambda c: str(c))
@pytest.mark.parametrize("batched", [False, True], ids=["gemm", "batched"])
def test_the_exact_arguments_of_gemm_ex(
    plugin: Plugin,
    monkeypatch: pytest.MonkeyPatch,
    combo: tuple[str, str, bool],
    want: tuple[int, int, int, str],
    batched: bool,
) -> None:
    """Every (in, out, compute) combination :func:`blas.compute_type` takes: the arguments
    that reach ``cublasGemmEx`` / ``cublasGemmStridedBatchedEx``, and ``alpha``/``beta`` as the
    host scalars cuBLAS reads for that compute type (float for the 32F types, double for 64F;
    the stand-in reads them so, and computes with them)."""
    import fake_cupy
    import ml_dtypes

    mod = importlib.import_module("accelkit_cuda.blas")
    from accelkit_cuda.capturing import capturing

    lib = fake_cupy.Cublas()
    monkeypatch.setattr(mod, "_cublas", lib)
    in_name, out_name, tf32 = combo
    dtypes = {"bfloat16": ml_dtypes.bfloat16}
    in_dt, out_dt = (np.dtype(dtypes.get(n, n)) for n in (in_name, out_name))
    rng = np.random.default_rng(1)
    a_shape, b_shape = ((3, 5, 4), (3, 4, 2)) if batched else ((5, 4), (4, 2))
    a = rng.standard_normal(a_shape).astype(in_dt).view(fake_cupy.ndarray)
    b = rng.standard_normal(b_shape).astype(in_dt).view(fake_cupy.ndarray)
    c0 = rng.standard_normal((*a_shape[:-1], 2)).astype(out_dt)
    out = c0.copy().view(fake_cupy.ndarray)
    with capturing(0x5EED):
        assert mod.matmul_into(a, b, out, tf32, alpha=2.5, beta=-0.5)
    name, args = lib.calls[-1]
    t_in, t_out, compute, scalar = want
    handle = 0x6B1A5
    assert lib.calls[0] == ("cublasSetStream", (handle, 0x5EED))
    assert lib.calls[1][0] == "cublasSetWorkspace"
    assert lib.calls[1][1][2] == 32 << 20
    assert lib.calls[2] == ("cublasSetPointerMode", (handle, 0))
    if batched:
        assert name == "cublasGemmStridedBatchedEx"
        want_args = (
            handle, 0, 0, 2, 5, 4, None, b.ctypes.data, t_in, 2, 8, a.ctypes.data, t_in, 4, 20,
            None, out.ctypes.data, t_out, 2, 10, 3, compute, -1,
        )  # fmt: skip
        alpha, beta = args[6], args[15]
    else:
        assert name == "cublasGemmEx"
        want_args = (
            handle, 0, 0, 2, 5, 4, None, b.ctypes.data, t_in, 2, a.ctypes.data, t_in, 4, None,
            out.ctypes.data, t_out, 2, compute, -1,
        )  # fmt: skip
        alpha, beta = args[6], args[13]
    assert tuple(None if x in (alpha, beta) else x for x in args) == want_args
    assert isinstance(alpha, int)  # host pointers (pointer mode host)
    assert isinstance(beta, int)
    assert all(type(s) is getattr(ctypes, scalar) for s in mod.scalars(compute, 2.5, -0.5))
    # The stand-in read alpha and beta as cuBLAS does for `compute` (a float read as a double,
    # or the reverse, is garbage): the result shows they were of that type and value.
    f64 = np.float64
    want = 2.5 * (a.astype(f64) @ b.astype(f64)) - 0.5 * c0.astype(f64)
    eps = float(np.finfo(np.float32 if out_dt.itemsize < 4 else out_dt).eps)
    if out_dt.itemsize == 2:
        eps = float(ml_dtypes.finfo(out_dt).eps)
    np.testing.assert_allclose(np.asarray(out).astype(f64), want, rtol=4 * eps, atol=8 * eps)


def test_combinations_not_taken() -> None:
    mod = importlib.import_module("accelkit_cuda.blas")
    assert mod.compute_type(0, 2) is None  # f32 into f16
    assert mod.compute_type(2, 14) is None  # f16 into bf16
    assert mod.compute_type(1, 0) is None  # f64 into f32
    assert mod.compute_type(2, 2, tf32=True) == 68  # TF32 is for f32 operands only
    a, b = mod.scalars(70, 2.0, 0.5)
    assert (type(a), a.value, type(b), b.value) == (ctypes.c_double, 2.0, ctypes.c_double, 0.5)
    a, b = mod.scalars(77, 2.0, 0.5)
    assert (type(a), type(b)) == (ctypes.c_float, ctypes.c_float)


@pytest.mark.parametrize("c_dtype", ["float32", None])
@pytest.mark.parametrize("in_name", ["bfloat16", "float16"])
def test_a_half_gemm_into_f32_is_rounded_once(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch, in_name: str, c_dtype: str | None
) -> None:
    """gemm of f16/bf16 operands into f32 (with or without an f32 addend) on the cuBLAS path:
    the product stays F32 (the H100's conformance run, before: bf16-bf16-f32-f32 off by 6e-3,
    the product rounded to bf16 first)."""
    import fake_cupy
    import ml_dtypes

    mod = importlib.import_module("accelkit_cuda.blas")
    ck = importlib.import_module("accelkit_cuda.cupy_tensor")
    monkeypatch.setattr(mod, "_cublas", fake_cupy.Cublas())
    monkeypatch.setenv("ACCELKIT_CUDA_GEMM_WORKSPACE", "1")
    dt = np.dtype(ml_dtypes.bfloat16 if in_name == "bfloat16" else np.float16)
    rng = np.random.default_rng(2)
    a_h = rng.uniform(-2, 2, (2, 3)).astype(dt)
    b_h = rng.uniform(-2, 2, (3, 4)).astype(dt)
    c_h = rng.standard_normal((2, 4)).astype(np.float32)
    a, b = a_h.view(fake_cupy.ndarray), b_h.view(fake_cupy.ndarray)
    c = None if c_dtype is None else c_h.view(fake_cupy.ndarray)
    out = np.empty((2, 4), np.float32).view(fake_cupy.ndarray)
    ck.gemm(a, b, c, out, False, False, 1.0, 1.0)
    want = a_h.astype(np.float64) @ b_h.astype(np.float64)
    if c is not None:
        want = want + c_h
    eps = float(np.finfo(np.float32).eps)
    np.testing.assert_allclose(np.asarray(out), want, rtol=16 * eps, atol=16 * eps)


#: Stand-in calls that are a kernel launch on a GPU (a CuPy routine, a ufunc, a copy, a fill,
#: a cast, an indexed store; views and allocations are not).
def _launches(calls: list[tuple[str, int]]) -> list[str]:
    quiet = ("ndarray op", "ndarray", "empty", "asarray", "Event", "Stream", "runtime.", "pool.")
    names = [name for name, _ in calls if not name.startswith(quiet) or name.startswith("ndarray.")]
    # A CuPy routine that is a ufunc is recorded twice (the routine, then its ufunc): one launch.
    return [n for i, n in enumerate(names) if not (i and n == f"ufunc {names[i - 1]}")]


@pytest.mark.anyio
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
async def test_a_linear_with_a_bias_is_two_launches(plugin: Plugin, dtype: str) -> None:
    """F32/F64: the GEMM into the output, then the bias added in place (it was three launches:
    the GEMM into a temporary, the add into another, the copy). The half types add the bias to
    the F32 product and round once, as before. Against float64 NumPy, within the half-ulp of
    the stored result plus the sum's rounding (k products of magnitude <= |x||w|)."""
    import fake_cupy
    import ml_dtypes

    np_dtype = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    rng = np.random.default_rng(4)
    x_h = rng.standard_normal((2, 5, 16)).astype(np_dtype)
    w_h = rng.standard_normal((12, 16)).astype(np_dtype)
    b_h = rng.standard_normal(12).astype(np_dtype)
    backend = plugin.backend.CUDABackend()
    await backend.initialize(Device("cuda", 0))
    try:
        f, ops = backend.tensor_factory, backend.tensor_ops
        x, w, b = f.from_host(x_h), f.from_host(w_h), f.from_host(b_h)
        await backend.synchronize()
        fake_cupy.CALLS.clear()
        y = ops.linear(x, w, b)
        await backend.synchronize()
        launched = _launches(list(fake_cupy.CALLS))
        got = (await y.to_host()).astype(np.float64)
    finally:
        await backend.shutdown()
    ref = x_h.astype(np.float64) @ w_h.astype(np.float64).T + b_h.astype(np.float64)
    eps = float(ml_dtypes.finfo(np_dtype).eps)
    k = x_h.shape[-1]
    acc_eps = eps if dtype in ("float32", "float64") else float(np.finfo(np.float32).eps)
    bound = np.abs(x_h.astype(np.float64)) @ np.abs(w_h.astype(np.float64)).T + np.abs(b_h)
    tol = (k + 1) * acc_eps * bound + eps * np.abs(ref)
    assert np.all(np.abs(got - ref) <= tol)
    if dtype in ("float32", "float64"):
        assert launched == ["matmul", "add"], launched


@pytest.mark.parametrize(
    ("setting", "in_name", "wide", "to_cublas"),
    [
        (None, "bfloat16", False, True),  # CuPy 14 has no BF16 GEMM
        (None, "float16", False, True),
        (None, "float16", True, True),  # F16 into F32: no F32 copies
        (None, "float32", False, True),  # no weight copy, no pointer arrays, no gufunc
        (None, "float64", False, True),
        ("0", "bfloat16", False, False),  # the way back: cupy.matmul
        ("0", "float16", True, False),
        ("0", "float32", False, False),
        ("1", "float32", False, True),
    ],
)
def test_the_eager_gemm_route(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch, setting: str | None, in_name: str, wide: bool,
    to_cublas: bool,
) -> None:  # fmt: skip
    """Which eager GEMMs go to cuBLAS through blas.py (all but with the switch at 0; the H100
    run of 2026-11-27: BF16 through CuPy's F32 fallback at 0.06x PyTorch, through cuBLAS 0.98x
    device time; the block's linears copied their weights through cupy.matmul), and that they
    are right: ``a @ b`` against float64 NumPy, within the F32 accumulation of k products plus the
    stored result's rounding."""
    import fake_cupy
    import ml_dtypes

    mod = importlib.import_module("accelkit_cuda.blas")
    ck = importlib.import_module("accelkit_cuda.cupy_tensor")
    monkeypatch.setattr(mod, "_cublas", fake_cupy.Cublas())
    if setting is None:
        monkeypatch.delenv("ACCELKIT_CUDA_GEMM_WORKSPACE", raising=False)
    else:
        monkeypatch.setenv("ACCELKIT_CUDA_GEMM_WORKSPACE", setting)
    dt = np.dtype(ml_dtypes.bfloat16 if in_name == "bfloat16" else in_name)
    rng = np.random.default_rng(5)
    k = 7
    a_h = rng.uniform(-2, 2, (3, k)).astype(dt)
    b_h = rng.uniform(-2, 2, (k, 4)).astype(dt)
    a, b = a_h.view(fake_cupy.ndarray), b_h.view(fake_cupy.ndarray)
    fake_cupy.CALLS.clear()
    res = np.asarray(ck._mm(a, b, wide=wide))
    assert (sum(name == "cublasGemmEx" for name, _ in fake_cupy.CALLS) == 1) is to_cublas
    # CuPy's BF16 fallback gives the F32 product (its callers round it once, when stored).
    f32_product = wide or (in_name == "bfloat16" and not to_cublas)
    assert res.dtype == (np.float32 if f32_product else dt)
    want = a_h.astype(np.float64) @ b_h.astype(np.float64)
    stored = float(np.finfo(res.dtype).eps) if res.dtype != dt or in_name != "bfloat16" else 2.0**-7
    acc = (
        k
        * float(np.finfo(np.float32).eps)
        * (np.abs(a_h.astype(np.float64)) @ np.abs(b_h.astype(np.float64)))
    )
    np.testing.assert_array_less(
        np.abs(res.astype(np.float64) - want), acc + stored * np.abs(want) + 1e-30
    )


def test_the_cublas_type_of_a_dtype() -> None:
    """cudaDataType by dtype (looked up by the dtype object, not its Python-level name)."""
    import ml_dtypes

    cases = [
        (np.dtype(np.float16), 2), (np.dtype(ml_dtypes.bfloat16), 14), (np.dtype(np.float32), 0),
        (np.dtype(np.float64), 1), (np.dtype(np.int32), None), (np.dtype(np.complex64), None),
    ]  # fmt: skip
    for _ in range(2):  # the second time from the cache
        for dtype, want in cases:
            assert blas._type(dtype) == want, dtype
    assert blas._type("float32") == 0  # a name still works


def test_the_setters_keep_the_interpreter_lock_and_the_gemms_release_it() -> None:
    """:class:`blas.Cublas` takes the three setters from the ``PyDLL`` of the library (a call
    keeps the interpreter lock: no hand-off to the loop's or the completer's thread for a few
    host instructions) and the GEMMs from its ``CDLL`` (a call releases it)."""

    class Fn:
        def __init__(self, lib: str, name: str) -> None:
            self.lib, self.name = lib, name
            self.argtypes: list[Any] = []
            self.restype: Any = None

        def __call__(self, *args: Any) -> int:
            seen.append((self.name, self.lib))
            return 0

    class Lib:
        def __init__(self, kind: str) -> None:
            self.kind = kind

        def __getattr__(self, name: str) -> Fn:
            return Fn(self.kind, name)

    seen: list[tuple[str, str]] = []
    lib = blas.Cublas(Lib("CDLL"), Lib("PyDLL"))
    lib.set_stream(1, 2)
    lib.set_workspace(1, 3, 4)
    lib.set_pointer_mode(1, 0)
    lib.gemm_ex(*range(19))
    lib.gemm_strided_batched_ex(*range(23))
    assert seen == [
        ("cublasSetStream_v2", "PyDLL"), ("cublasSetWorkspace_v2", "PyDLL"),
        ("cublasSetPointerMode_v2", "PyDLL"), ("cublasGemmEx", "CDLL"),
        ("cublasGemmStridedBatchedEx", "CDLL"),
    ]  # fmt: skip
    seen.clear()
    blas.Cublas(Lib("CDLL")).set_stream(1, 2)  # one library: everything through it
    assert seen == [("cublasSetStream_v2", "CDLL")]


def test_a_thread_asks_cupy_for_its_device_and_handle_once(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device, cuBLAS handle and workspace of a thread are looked up at its first GEMM, not
    at each (``cudaGetDevice`` twice, a handle lookup and a lock a GEMM before); every GEMM
    still sets the stream, the stream's workspace and the pointer mode (a CuPy cuBLAS call in
    between resets the workspace), and a second thread gets its own."""
    import threading

    import fake_cupy

    mod = importlib.import_module("accelkit_cuda.blas")
    lib = fake_cupy.Cublas()
    monkeypatch.setattr(mod, "_cublas", lib)
    monkeypatch.setattr(mod, "_thread", mod._ThreadState())
    a = np.ones((4, 3), np.float32).view(fake_cupy.ndarray)
    w = np.ones((5, 3), np.float32).view(fake_cupy.ndarray)

    def gemms() -> None:
        for _ in range(10):
            out = np.zeros((4, 5), np.float32).view(fake_cupy.ndarray)
            assert mod.matmul(a, w.T, out) is out
            np.testing.assert_array_equal(np.asarray(out), np.full((4, 5), 3.0, np.float32))

    fake_cupy.CALLS.clear()
    gemms()
    thread = threading.Thread(target=gemms)
    thread.start()
    thread.join()
    names = [name for name, _ in fake_cupy.CALLS]
    assert names.count("get_cublas_handle") == 2  # once a thread
    assert names.count("cublasGemmEx") == 20
    for setter in ("cublasSetStream", "cublasSetWorkspace", "cublasSetPointerMode"):
        assert names.count(setter) == 20
    workspaces = {args[1] for name, args in lib.calls if name == "cublasSetWorkspace"}
    assert len(workspaces) == 1  # one stream (the null stream), one workspace
