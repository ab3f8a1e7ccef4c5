"""The packed GEMM at the edges of its blocks, and choosing its block (gemm_tuning)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from accelkit_opencl import gemm_tuning, linalg_ops
from accelkit_opencl.backend import OpenCLBackend
from accelkit_opencl.opencl_linalg import GemmBlock

from accelkit.dtype import DType
from accelkit.testing.checks import assert_gemm_close

# Kernel checks: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]

RNG = np.random.default_rng(1)
SMALL = GemmBlock(4, 16, 8, 2, (2, 2))


@pytest.fixture(autouse=True)
def fresh_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gemm_tuning, "_stored", None)
    # Every product takes the packed kernel here, the tiny ones too (they test block edges).
    monkeypatch.setattr(linalg_ops, "PACKED_MIN_WORK", 0)


async def test_tiny_products_take_one_tiled_launch(
    backend: OpenCLBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(linalg_ops, "PACKED_MIN_WORK", 32**3)
    f, o = backend.tensor_factory, backend.tensor_ops
    a = RNG.standard_normal((32, 31)).astype(np.float32)
    got = await o.matmul(f.from_host(a), f.from_host(a.T.copy())).to_host()
    assert_gemm_close(got, a, a.T)
    assert {name for _, name in backend._kernels} == {"gemm"}
    b = RNG.standard_normal((32, 32)).astype(np.float32)
    got = await o.matmul(f.from_host(b), f.from_host(b)).to_host()
    assert_gemm_close(got, b, b)
    assert {"pack", "gemm_packed"} <= {name for _, name in backend._kernels}


@pytest.mark.parametrize("dtype", [DType.F32, DType.F64])
@pytest.mark.parametrize(("m", "k", "n"), [(1, 1, 1), (9, 5, 33), (64, 64, 64), (70, 131, 47)])
async def test_packed_gemm_edges(
    backend: OpenCLBackend, dtype: DType, m: int, k: int, n: int
) -> None:
    """Blocks cut by M, N and K; every transpose; a broadcast C; batches, one broadcast."""
    if dtype not in backend.supported_dtypes:
        pytest.skip(f"no {dtype.value} on this device")
    f, o = backend.tensor_factory, backend.tensor_ops
    npd = dtype.to_numpy()
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype is DType.F32 else {"rtol": 1e-10, "atol": 1e-10}
    for trans_a in (False, True):
        for trans_b in (False, True):
            a = RNG.standard_normal((k, m) if trans_a else (m, k)).astype(npd)
            b = RNG.standard_normal((n, k) if trans_b else (k, n)).astype(npd)
            c = RNG.standard_normal((m, 1)).astype(npd)
            got = await o.gemm(
                f.from_host(a), f.from_host(b), f.from_host(c),
                trans_a=trans_a, trans_b=trans_b, alpha=-1.5, beta=0.25,
            ).to_host()  # fmt: skip
            want = -1.5 * ((a.T if trans_a else a) @ (b.T if trans_b else b)) + 0.25 * c
            np.testing.assert_allclose(got, want, **tol, err_msg=f"{trans_a=} {trans_b=}")
    ab = RNG.standard_normal((2, 3, m, k)).astype(npd)
    bb = RNG.standard_normal((k, n)).astype(npd)
    got = await o.matmul(f.from_host(ab), f.from_host(bb)).to_host()
    np.testing.assert_allclose(got, ab @ bb, **tol)
    bb3 = RNG.standard_normal((3, k, n)).astype(npd)
    got = await o.matmul(f.from_host(ab), f.from_host(bb3)).to_host()
    np.testing.assert_allclose(got, ab @ bb3, **tol)


async def test_other_block_same_result(backend: OpenCLBackend) -> None:
    f, o = backend.tensor_factory, backend.tensor_ops
    a = RNG.standard_normal((37, 29)).astype(np.float32)
    b = RNG.standard_normal((29, 51)).astype(np.float32)
    o.__dict__.setdefault("_gemm_blocks", {})[DType.F32] = SMALL
    got = await o.matmul(f.from_host(a), f.from_host(b)).to_host()
    assert_gemm_close(got, a, b)


async def test_tune_times_only_verified_blocks_and_stores_the_winner(
    backend: OpenCLBackend, monkeypatch: pytest.MonkeyPatch, opencl_cache: Path, tmp_path: Path
) -> None:
    """Tuning verifies every block in a child process first and times only those that pass: a
    block that crashes the compiler (injected: the child aborts on it) is never built here."""
    from accelkit_opencl import variants

    monkeypatch.setenv("ACCELKIT_OPENCL_VARIANTS_FILE", str(tmp_path / "variants.json"))
    monkeypatch.delenv("ACCELKIT_OPENCL_VERIFY", raising=False)
    variants.forget_verifiers()
    try:
        backend._verifier = variants.verifier_for(backend._cl_device, 0)
        cands = variants.candidates(backend._cl_device, "gemm_packed.f32")
        # the 16-wide blocks crash (as on PoCL 3.0 / Zen 4); the narrower ones are safe
        crashing = [c for c in cands if c.value.width >= 16]
        safe = [c for c in cands if c.value.width < 16]
        assert crashing
        assert len(safe) >= 2
        faults = {c.id: "abort" for c in crashing}
        monkeypatch.setenv("ACCELKIT_OPENCL_VERIFY_FAULTS", json.dumps(faults))
        lines: list[str] = []
        winners = await gemm_tuning.tune(backend, size=64, rounds=1, progress=lines.append)
    finally:
        variants.forget_verifiers()
    assert winners[DType.F32] in {c.value for c in safe}
    compiled = [line for line in lines if "compiling" in line]
    assert len(compiled) == len(safe), lines
    for c in crashing:
        # crashed in its child, or not tried after a block as wide crashed
        assert any(c.id in line and ("SIGABRT" in line or "skipped" in line) for line in lines)
        assert not any(c.value.label() in line for line in compiled)
    assert "stored in" in lines[-1]
    path = gemm_tuning.tuning_path()
    assert path.parent == opencl_cache
    data = json.loads(path.read_text())
    assert data["format"] == "accelkit-opencl-gemm-tuning"
    monkeypatch.setattr(gemm_tuning, "_stored", None)
    assert gemm_tuning.block_for(backend._cl_device, DType.F32) == winners[DType.F32]
    # The stored winner is what the family runs from now on (it is verified).
    verifier = variants.verifier_for(backend._cl_device, 0)
    try:
        assert verifier.choice("gemm_packed.f32")[0].value == winners[DType.F32]
    finally:
        variants.forget_verifiers()


def _store(path: Path, block: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    key = "platform | device | driver"
    devices = {key: {"f32": block}}
    path.write_text(json.dumps({"format": "accelkit-opencl-gemm-tuning", "version": 1,
                                "devices": devices}))  # fmt: skip


class _Device:
    class platform:  # noqa: N801 - mimics pyopencl.Device.platform
        name = "platform"

    name = "device"
    driver_version = "driver"
    native_vector_width_float = 16
    native_vector_width_double = 8


def test_block_for_reads_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    _store(gemm_tuning.tuning_path(), vars(SMALL))
    assert gemm_tuning.block_for(_Device(), DType.F32) == SMALL
    assert gemm_tuning.block_for(_Device(), DType.F64) == gemm_tuning.DEFAULT_BLOCKS[DType.F64]
    monkeypatch.setenv("ACCELKIT_OPENCL_GEMM_TUNING", "0")
    assert gemm_tuning.block_for(_Device(), DType.F32) == gemm_tuning.DEFAULT_BLOCKS[DType.F32]


@pytest.mark.parametrize(
    "text",
    ["{not json", '{"format": "other", "version": 1}', "[" * 100_000],  # (RecursionError)
    ids=["not-json", "foreign", "too-deep"],
)
def test_unusable_store_means_default(text: str) -> None:
    path = gemm_tuning.tuning_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    assert gemm_tuning.block_for(_Device(), DType.F32) == gemm_tuning.DEFAULT_BLOCKS[DType.F32]


def test_invalid_block_is_rejected() -> None:
    _store(gemm_tuning.tuning_path(), {**vars(SMALL), "width": 3})
    assert gemm_tuning.block_for(_Device(), DType.F32) == gemm_tuning.DEFAULT_BLOCKS[DType.F32]


def test_default_block_follows_the_vector_width() -> None:
    avx2 = _Device()
    avx2.native_vector_width_float = 8
    avx2.native_vector_width_double = 4
    assert gemm_tuning.default_block(_Device(), DType.F32) == gemm_tuning.DEFAULT_BLOCKS[DType.F32]
    assert gemm_tuning.default_block(avx2, DType.F32) == GemmBlock(6, 16, 8, 4, (4, 4))
    assert gemm_tuning.default_block(avx2, DType.F64) == GemmBlock(6, 8, 4, 4, (4, 4))
