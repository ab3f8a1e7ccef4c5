"""The tensor-core attention kernel (accelkit_cuda.flash_attention).

Without a GPU: every variant compiles with NVRTC for sm_80 and sm_90 (no spills, no warnings),
the launch geometry and argument packing, the bit conversions, the reference, the stored
on-device verdict and the gate's refusals; and a NumPy model of one block runs the kernel's
fragment addressing (ldmatrix and mma.sync m16n8k16 as the PTX ISA defines them) against the
reference. On a GPU (marked ``gpu``): the kernel through KernelOps against NumPy, f16 and bf16,
head_dim 64 and 128, causal or not, grouped KV heads, odd lengths.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import test_offloop
from accelkit_cuda import flash_attention as fa
from accelkit_cuda import flash_simt as fs
from accelkit_cuda.driver import Attr, DeviceProps
from nvrtc_checks import assert_compiles_without_spills

from accelkit.dtype import DType

F16_EPS, BF16_EPS, F32_EPS = 2.0**-10, 2.0**-7, 2.0**-23

#: The plugin imported over the stand-in for CuPy (test_offloop's fixture).
plugin = test_offloop.plugin


def _props(name: str = "Stand-in GPU", cc: tuple[int, int] = (9, 0), optin: int = 227 << 10) -> Any:
    attrs = {
        Attr.COMPUTE_CAPABILITY_MAJOR: cc[0], Attr.COMPUTE_CAPABILITY_MINOR: cc[1],
        Attr.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: optin,
    }  # fmt: skip
    return DeviceProps(0, name, 1 << 30, attrs, 12040)


# -- compilation ----------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_variant_compiles_without_spills(arch: str) -> None:
    assert_compiles_without_spills(fa.SOURCE, arch, fa.kernel_names(), "flash2.cu")


def test_the_kernel_names_and_the_sm80_gate() -> None:
    assert fa.kernel_names() == ["fa2_f16_d64", "fa2_f16_d128", "fa2_bf16_d64", "fa2_bf16_d128"]
    assert fa.kernel_name(DType.BF16, 128) == "fa2_bf16_d128"
    for arch, ok in [("sm_75", False), ("sm_70", False), ("sm_80", True), ("sm_86", True),
                     ("sm_90", True), ("sm_90a", True), ("sm_100", True), ("compute_80", True),
                     ("bogus", False)]:  # fmt: skip
        assert fa.arch_supported(arch) is ok, arch


# -- launch geometry and arguments -----------------------------------------------------------------
@pytest.mark.parametrize(("b", "h", "sq", "d"), [(8, 16, 4096, 128), (1, 3, 1, 64), (2, 4, 65, 64)])
def test_geometry(b: int, h: int, sq: int, d: int) -> None:
    grid, block, smem = fa.geometry(b, h, sq, d)
    assert grid == (math.ceil(sq / fa.BLOCK_M), b * h)
    assert grid[0] * fa.BLOCK_M >= sq > (grid[0] - 1) * fa.BLOCK_M  # every row, no empty block
    assert block == (fa.THREADS,)
    assert fa.THREADS == 32 * fa.BLOCK_M // 16
    # Q's tile and two K and two V tiles of 16-bit elements, rows padded by 16 bytes
    assert smem == (fa.BLOCK_M + 4 * fa.BLOCK_N) * (d + 8) * 2
    assert (d + 8) * 2 % 16 == 0  # cp.async and ldmatrix need 16-byte aligned rows


def test_shared_memory_fits_every_sm80_class_device() -> None:
    assert fa.shared_bytes(64) <= 48 * 1024  # no opt-in needed at head_dim 64
    assert fa.shared_bytes(128) <= 99 * 1024  # sm_86/sm_89 allow 99 KiB; sm_80 163, sm_90 227


def test_launch_args_follow_the_kernel_signature() -> None:
    q, k, v, o = object(), object(), object(), object()
    args = fa.launch_args(q, k, v, o, 16, 4, 4096, 4100, 0.125, True)
    assert args[:4] == (q, k, v, o)
    kinds = [type(a) for a in args[4:]]
    assert kinds == [np.int32, np.int32, np.int64, np.int64, np.float32, np.int32, np.int32]
    assert args[4:8] == (16, 4, 4096, 4100)
    assert args[8] == np.float32(0.125 * math.log2(math.e))  # the log2 domain of exp2
    assert args[9] == 1
    assert args[10] == 0  # head-major unless told
    assert fa.launch_args(q, k, v, o, 16, 4, 1, 1, 1.0, False, True)[10] == 1
    sig = re.search(r"fa2_##S##_d##D\((.*?)\)", fa.SOURCE, re.S)
    assert sig is not None
    params = [p.split()[0] for p in sig.group(1).replace("\\", " ").split(",")]
    assert params == [
        "const", "const", "const", "u16*", "int", "int", "i64", "i64", "float", "int", "int"
    ]  # fmt: skip


# -- conversions, reference and tolerance ----------------------------------------------------------
def test_bit_conversions_round_to_nearest_even() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(1000) * 10, [0.0, -0.0, 1.0, 65504.0, 1e-6]])
    x = x.astype(np.float32)
    np.testing.assert_array_equal(
        fa.from_bits(fa.to_bits(x, DType.F16), DType.F16), x.astype(np.float16).astype(np.float64)
    )
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf = x.astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(fa.to_bits(x, DType.BF16), bf.view(np.uint16))
    np.testing.assert_array_equal(
        fa.from_bits(bf.view(np.uint16), DType.BF16), bf.astype(np.float64)
    )


def test_reference_matches_the_direct_formula() -> None:
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s) for s in ((1, 4, 5, 8), (1, 2, 3, 8), (1, 2, 3, 8)))
    got = fa.reference(q, k, v, 0.3, causal=True)
    for h in range(4):
        for i in range(5):
            visible = [j for j in range(3) if j <= i + (3 - 5)]
            if not visible:
                assert np.all(got[0, h, i] == 0)  # a row that sees no key is zero
                continue
            s = np.array([q[0, h, i] @ k[0, h // 2, j] * 0.3 for j in visible])
            p = np.exp(s - s.max())
            want = (p / p.sum()) @ v[0, h // 2, visible]
            np.testing.assert_allclose(got[0, h, i], want, rtol=1e-12, atol=1e-12)


def test_tolerance_follows_eps_and_lengths() -> None:
    assert fa.tolerance(DType.F16, 0, 0) == 2 * F16_EPS
    assert fa.tolerance(DType.BF16, 0, 0) == 2 * BF16_EPS
    assert fa.tolerance(DType.F16, 4096, 128) == 2 * (F16_EPS + 4224 * F32_EPS)
    assert fa.tolerance(DType.F16, 4096, 128) < 0.01  # tight enough to catch a wrong fragment


# -- the gate -------------------------------------------------------------------------------------
def _t(dtype: DType, shape: tuple[int, ...]) -> Any:
    return SimpleNamespace(dtype=dtype, shape=shape, size=math.prod(shape))


def _gate(state: fa.Flash2State = "verified") -> fa.Flash2Attention:
    g = fa.Flash2Attention(SimpleNamespace(_arch="sm_90"), _props())
    g.state, g.reason = state, "" if state == "verified" else "a reason"
    return g


@pytest.mark.parametrize(
    ("dt", "qs", "ks", "vs", "why"),
    [
        (DType.F16, (2, 8, 70, 128), (2, 2, 33, 128), (2, 2, 33, 128), None),
        (DType.BF16, (1, 4, 1, 64), (1, 4, 9, 64), (1, 4, 9, 64), None),
        (DType.F32, (1, 4, 9, 64), (1, 4, 9, 64), (1, 4, 9, 64), "f16/bf16"),
        (DType.F16, (1, 4, 9, 96), (1, 4, 9, 96), (1, 4, 9, 96), "head_dim"),
        (DType.F16, (1, 4, 9, 64), (1, 4, 9, 64), (1, 4, 9, 128), "head_dim"),
        (DType.F16, (1, 4, 9, 64), (1, 4, 0, 64), (1, 4, 0, 64), "empty"),
        (DType.F16, (65536, 1, 9, 64), (65536, 1, 9, 64), (65536, 1, 9, 64), "batch * heads"),
    ],
)
def test_refusals(dt: DType, qs: Any, ks: Any, vs: Any, why: str | None) -> None:
    got = _gate().refusal(_t(dt, qs), _t(dt, ks), _t(dt, vs))
    assert got is None if why is None else (got is not None and why in got), got


@pytest.mark.parametrize("state", ["unverified", "failed", "unavailable"])
def test_an_unverified_kernel_is_refused(state: fa.Flash2State) -> None:
    t = _t(DType.F16, (1, 1, 8, 64))
    why = _gate(state).refusal(t, t, t)
    assert why is not None
    assert state in why
    assert "a reason" in why


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("arch", "optin", "env", "expect"),
    [
        ("sm_75", 64 << 10, None, "sm_80 or newer"),
        ("sm_80", 64 << 10, None, "shared memory"),
        ("sm_90", 227 << 10, "0", "ACCELKIT_CUDA_FLASH2=0"),
    ],
)
async def test_load_leaves_the_old_kernel_where_the_device_cannot_run_it(
    arch: str, optin: int, env: str | None, expect: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if env is not None:
        monkeypatch.setenv("ACCELKIT_CUDA_FLASH2", env)
    gate = fa.Flash2Attention(SimpleNamespace(_arch=arch), _props(optin=optin))
    await gate.load()  # these cases decide before any compile or device call
    assert gate.state == "unavailable"
    assert expect in gate.reason
    assert not gate.verified
    assert gate.describe().startswith("unavailable: ")


def test_the_verdict_is_checked_once_per_binary_and_device(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ACCELKIT_CUDA_VERDICTS", str(tmp_path / "verdicts"))
    runs: list[int] = []
    answers = iter([(None, True), ("fa2_f16_d64 on ...: max error 1 > 0.002", True)])

    def child(
        binary: bytes, device: int, timeout: float, module: str = ""
    ) -> tuple[str | None, bool]:
        runs.append(device)
        return next(answers)

    monkeypatch.setattr(fa, "_run_child", child)
    assert fa.verdict(b"cubin", _props()) is None
    assert fa.verdict(b"cubin", _props()) is None  # stored
    assert len(runs) == 1
    failed = fa.verdict(b"cubin", _props("Another GPU"))  # another device: checked again
    assert failed is not None
    assert "max error" in failed
    assert len(runs) == 2
    again = fa.verdict(b"cubin", _props("Another GPU"))
    assert again is not None
    assert "stored verdict" in again
    assert len(runs) == 2
    assert len(list((tmp_path / "verdicts").glob("flash2-*.verdict"))) == 2
    assert fa.verdict_folder() == tmp_path / "verdicts"
    monkeypatch.setenv("ACCELKIT_CUDA_FLASH2", "recheck")  # the stored verdict is ignored
    monkeypatch.setattr(fa, "_run_child", lambda *a: (None, True))
    assert fa.verdict(b"cubin", _props("Another GPU")) is None
    monkeypatch.delenv("ACCELKIT_CUDA_FLASH2")
    assert fa.verdict(b"cubin", _props("Another GPU")) is None  # and replaced


def test_a_check_that_did_not_run_is_not_stored(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ACCELKIT_CUDA_VERDICTS", str(tmp_path))
    answers = iter([("the check did not finish in 180 s", False), (None, True)])
    monkeypatch.setattr(fa, "_run_child", lambda *a: next(answers))
    assert fa.verdict(b"cubin", _props()) == "the check did not finish in 180 s"
    assert not list(tmp_path.glob("*.verdict"))
    assert fa.verdict(b"cubin", _props()) is None  # checked again
    (path,) = tmp_path.glob("*.verdict")
    path.write_text('{"unexpected": 1}')  # a damaged entry: checked again, not an error
    monkeypatch.setattr(fa, "_run_child", lambda *a: ("a failure", True))
    assert fa.verdict(b"cubin", _props()) == "a failure"


def test_a_child_that_fails_to_run_is_a_failed_check() -> None:
    # Here no GPU (or no CuPy): the child exits with an error, which is the verdict's reason.
    why, ran = fa._run_child(b"not a cubin", 0, timeout=120)
    assert why is not None
    assert "exited with" in why
    assert ran


# -- a NumPy model of one block, with the kernel's fragment addressing ------------------------------
def _ldmatrix_x4(smem: np.ndarray[Any, Any], rows: list[int], cols: list[int], trans: bool) -> Any:
    """PTX ldmatrix.m8n8.x4.b16: lanes 8i..8i+7 give the rows of matrix i (address = row, col);
    lane l receives, of each matrix, row l/4 elements 2(l%4), 2(l%4)+1 (of the transpose with
    .trans). Returns regs[lane][matrix] = (lo, hi)."""
    mats = [np.stack([smem[rows[8 * i + r], cols[8 * i + r] : cols[8 * i + r] + 8]
                      for r in range(8)]) for i in range(4)]  # fmt: skip
    if trans:
        mats = [m.T for m in mats]
    return [[(m[x // 4, 2 * (x % 4)], m[x // 4, 2 * (x % 4) + 1]) for m in mats] for x in range(32)]


def _mma(c: Any, a: Any, b0: Any, b1: Any) -> None:
    """PTX mma.m16n8k16.row.col: rebuild A (16x16) and B (16x8) from the lanes' fragments
    (groupID g = lane/4, t = lane%4: a0 (g, 2t), a1 (g+8, 2t), a2 (g, 2t+8), a3 (g+8, 2t+8);
    b0 (k 2t, n g), b1 (k 2t+8, n g); c0 (g, 2t), c2 (g+8, 2t)), multiply, scatter D."""
    am, bm = np.zeros((16, 16)), np.zeros((16, 8))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for reg, (r, col) in enumerate(
            ((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))
        ):
            am[r, col : col + 2] = a[lane][reg]
        bm[2 * t : 2 * t + 2, g] = b0[lane]
        bm[2 * t + 8 : 2 * t + 10, g] = b1[lane]
    dm = am @ bm
    for lane in range(32):
        g, t = lane // 4, lane % 4
        c[lane][0:2] += dm[g, 2 * t : 2 * t + 2]
        c[lane][2:4] += dm[g + 8, 2 * t : 2 * t + 2]


def _model_block(q: Any, k: Any, v: Any, m0: int, scale: float, causal: bool) -> Any:
    """One block of fa2_impl for one (batch, head), in float64 (no rounding of P): the kernel's
    loop with its tile loads, ldmatrix addresses, fragment reuse, masks and online softmax."""
    sq, d = q.shape
    sk = k.shape[0]
    bm, bn = fa.BLOCK_M, fa.BLOCK_N

    def tile(x: Any, r0: int, n: int) -> Any:  # rows past the end zero-filled (cp.async)
        return np.stack([x[r0 + r] if r0 + r < x.shape[0] else np.zeros(d) for r in range(n)])

    q_s = tile(q, m0, bm)
    offset = sk - sq
    last = min(sq - 1, m0 + bm - 1)
    kend = min(sk, last + offset + 1) if causal else sk
    ntiles = -(-kend // bn) if kend > 0 else 0
    out = np.zeros((bm, d))
    for warp in range(4):
        lanes = range(32)
        lr, li = [la & 7 for la in lanes], [la >> 3 for la in lanes]
        qf = [_ldmatrix_x4(q_s, [warp * 16 + lr[x] + 8 * (li[x] & 1) for x in lanes],
                           [kk * 16 + 8 * (li[x] >> 1) for x in lanes], False)
              for kk in range(d // 16)]  # fmt: skip
        o = [[np.zeros(4) for _ in lanes] for _ in range(d // 8)]
        mrow = [[-np.inf, -np.inf] for _ in lanes]
        lrow = [[0.0, 0.0] for _ in lanes]
        for j in range(ntiles):
            k_t, v_t = tile(k, j * bn, bn), tile(v, j * bn, bn)
            s = [[np.zeros(4) for _ in lanes] for _ in range(bn // 8)]
            for kk in range(d // 16):
                for nn in range(bn // 16):
                    r = _ldmatrix_x4(k_t, [nn * 16 + lr[x] + 8 * (li[x] >> 1) for x in lanes],
                                     [kk * 16 + 8 * (li[x] & 1) for x in lanes], False)  # fmt: skip
                    _mma(s[2 * nn], qf[kk], [r[x][0] for x in lanes], [r[x][1] for x in lanes])
                    _mma(s[2 * nn + 1], qf[kk], [r[x][2] for x in lanes], [r[x][3] for x in lanes])
            pf: list[list[list[Any]]] = [[[None] * 4 for _ in lanes] for _ in range(bn // 16)]
            for x in lanes:
                g, t = x // 4, x % 4
                rows = (m0 + warp * 16 + g, m0 + warp * 16 + g + 8)
                for nt in range(bn // 8):
                    for e in range(4):
                        val = s[nt][x][e] * scale
                        key = j * bn + nt * 8 + 2 * t + (e & 1)
                        if key >= sk or (causal and key > rows[e // 2] + offset):
                            val = -np.inf
                        s[nt][x][e] = val
            for x in lanes:  # the four lanes of a row share its maximum (the shuffles)
                grp = range(x - x % 4, x - x % 4 + 4)
                for i in range(2):
                    mx = max([mrow[x][i]] + [s[nt][y][2 * i + e] for nt in range(bn // 8)
                                             for y in grp for e in range(2)])  # fmt: skip
                    base = 0.0 if mx == -np.inf else mx
                    corr = math.exp(mrow[x][i] - base) if mrow[x][i] != -np.inf else 0.0
                    mrow[x][i], lrow[x][i] = mx, lrow[x][i] * corr
                    for dt in range(d // 8):
                        o[dt][x][2 * i : 2 * i + 2] *= corr
                    for nt in range(bn // 8):
                        p = np.exp(s[nt][x][2 * i : 2 * i + 2] - base)
                        lrow[x][i] += p.sum()
                        pf[nt >> 1][x][(nt & 1) * 2 + i] = tuple(p)
            for kk in range(bn // 16):
                for dd in range(d // 16):
                    r = _ldmatrix_x4(v_t, [kk * 16 + lr[x] + 8 * (li[x] & 1) for x in lanes],
                                     [dd * 16 + 8 * (li[x] >> 1) for x in lanes], True)  # fmt: skip
                    _mma(o[2 * dd], pf[kk], [r[x][0] for x in lanes], [r[x][1] for x in lanes])
                    _mma(o[2 * dd + 1], pf[kk], [r[x][2] for x in lanes], [r[x][3] for x in lanes])
        for x in lanes:
            g, t = x // 4, x % 4
            grp = range(x - x % 4, x - x % 4 + 4)
            for i in range(2):
                total = sum(lrow[y][i] for y in grp)
                inv = 0.0 if total == 0 else 1.0 / total
                for dt in range(d // 8):
                    out[warp * 16 + g + 8 * i, dt * 8 + 2 * t : dt * 8 + 2 * t + 2] = (
                        o[dt][x][2 * i : 2 * i + 2] * inv
                    )
    return out[: max(0, min(bm, sq - m0))]


#: The kernel's expressions the model copies (whitespace aside): if the source changes, so must
#: the model.
MODELLED = (
    "ldsm_x4(qf[kk], smem_u32(Qs + (warp * 16 + lr + 8 * (li & 1)) * LD + kk * 16 + 8 * (li >> 1)))",
    "ldsm_x4(r, smem_u32(Kt + (nn * 16 + lr + 8 * (li >> 1)) * LD + kk * 16 + 8 * (li & 1)))",
    "Mma<T>::run(s[2 * nn], qf[kk], r[0], r[1]); Mma<T>::run(s[2 * nn + 1], qf[kk], r[2], r[3]);",
    "ldsm_x4_trans(r, smem_u32(Vt + (kk * 16 + lr + 8 * (li & 1)) * LD + dd * 16 + 8 * (li >> 1)))",
    "Mma<T>::run(o[2 * dd], pf[kk], r[0], r[1]); Mma<T>::run(o[2 * dd + 1], pf[kk], r[2], r[3]);",
    "pf[nt >> 1][(nt & 1) * 2 + 0] = Mma<T>::pack(p0, p1);",
    "pf[nt >> 1][(nt & 1) * 2 + 1] = Mma<T>::pack(p2, p3);",
    "if (key >= Sk || (causal && key > row + offset)) x = NEG_INF;",
    "i64 key = n0 + nt * 8 + 2 * t + (e & 1);",
    "*(u32*)(ob + r0 * qrs + col) = Mma<T>::pack(o[dt][0] * inv0, o[dt][1] * inv0);",
    # where a (batch, head)'s rows start and how far apart they lie, in either layout
    "const i64 qrs = seq_major ? (i64)H * D : D, krs = seq_major ? (i64)Hkv * D : D;",
    "const i64 qoff = seq_major ? (b * Sq * H + h) * D : bh * Sq * D;",
    "const i64 koff = seq_major ? (b * Sk * Hkv + hk) * D : (b * Hkv + hk) * Sk * D;",
    "const u16* s = src + (ok ? (row0 + r) * rs + col : 0);",
)


def test_the_model_copies_the_kernel() -> None:
    source = " ".join(fa.SOURCE.split())
    for expr in MODELLED:
        assert " ".join(expr.split()) in source, expr


@pytest.mark.parametrize("seq_major", [False, True], ids=["bhsd", "bshd"])
def test_the_row_addressing_finds_every_element(seq_major: bool) -> None:
    # The kernel's (modelled) offsets, row strides and row loads: element (b, h, row, c) of
    # the head-major q and out, and (b, hk, key, c) of k and v, at ``off + row * rs + c``.
    bsz, d = 2, 16
    for heads, seq in ((6, 5), (3, 7)):  # q/out: H, Sq; k/v: Hkv, Sk
        logical = np.arange(bsz * heads * seq * d).reshape(bsz, heads, seq, d)
        flat = fa.stored(logical, seq_major).ravel()  # the buffer as the kernel sees it
        rs = heads * d if seq_major else d
        for b in range(bsz):
            for h in range(heads):
                off = (b * seq * heads + h) * d if seq_major else (b * heads + h) * seq * d
                rows = [flat[off + r * rs : off + r * rs + d] for r in range(seq)]
                np.testing.assert_array_equal(np.stack(rows), logical[b, h])


@pytest.mark.parametrize(("sq", "sk", "causal"), [(70, 93, False), (70, 93, True), (80, 20, True)])
def test_the_fragment_addressing_computes_attention(sq: int, sk: int, causal: bool) -> None:
    rng = np.random.default_rng(7)
    d = 64  # 128 takes the same paths, twice as long
    q, k, v = (rng.standard_normal((n, d)) for n in (sq, sk, sk))
    ref = fa.reference(q[None, None], k[None, None], v[None, None], 0.125, causal)[0, 0]
    m0 = fa.BLOCK_M  # the second block: rows past Sq, the tail key tile, the diagonal
    got = _model_block(q, k, v, m0, 0.125, causal)
    np.testing.assert_allclose(got, ref[m0 : m0 + fa.BLOCK_M], rtol=1e-10, atol=1e-10)


# -- on a GPU -------------------------------------------------------------------------------------
def _bf16() -> Any:
    return pytest.importorskip("ml_dtypes").bfloat16


#: (heads, kv_heads, seq_q, seq_k, causal): odd lengths (no multiple of a 64-row tile), grouped
#: KV heads, several tiles, queries longer than the keys under the causal mask.
GPU_CASES = [
    (4, 4, 77, 77, True), (8, 2, 130, 197, False), (8, 2, 130, 197, True), (2, 1, 99, 40, True),
]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.anyio
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
async def test_flash2_matches_numpy_on_the_gpu(backend: Any, dtype: str) -> None:
    flash2 = backend.flash2
    if flash2 is None or flash2.state == "unavailable":
        pytest.skip(f"the tensor-core kernel cannot run here: {flash2 and flash2.reason}")
    assert flash2.verified, flash2.describe()  # a device that can run it must pass its check
    assert backend.capabilities.extra["flash2_attention"] == "verified"
    if dtype == "bf16" and DType.BF16 not in backend.capabilities.dtypes:
        pytest.skip("no bf16 tensors with this CuPy")
    np_dtype = np.float16 if dtype == "f16" else _bf16()
    eps = F16_EPS if dtype == "f16" else BF16_EPS
    f, b = backend.tensor_factory, 2
    for d in (64, 128):
        for h, hk, sq, sk, causal in GPU_CASES:
            rng = np.random.default_rng(d + sq)
            q = rng.standard_normal((b, h, sq, d)).astype(np_dtype)
            k = rng.standard_normal((b, hk, sk, d)).astype(np_dtype)
            v = rng.standard_normal((b, hk, sk, d)).astype(np_dtype)
            got = await backend.kernel_ops.attention(
                f.from_host(q), f.from_host(k), f.from_host(v), causal=causal
            ).to_host()
            route = backend.attention_engines.last_route
            assert route is not None
            # every (d, case) is a new shape: where cuDNN is installed, its graph for it is only
            # queued at this first call, which runs on the NVRTC kernels
            assert route.engine == "flash2", route
            ref = fa.reference(q, k, v, 1 / math.sqrt(d), causal)
            # P rounded once to the dtype (<= eps/2 of max|v|), the output rounded once
            # (<= eps/2), f32 sums over sk keys and d dims; twice that.
            bound = 2 * (eps + (sk + d) * F32_EPS) * float(np.max(np.abs(v.astype(np.float64))))
            err = np.abs(got.astype(np.float64) - ref)
            case = f"d={d} h={h}/{hk} sq={sq} sk={sk} causal={causal}"
            assert float(err.max()) <= bound, (case, float(err.max()), bound)


@pytest.mark.anyio
async def test_prepare_says_which_kernel_serves_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelkit_cuda.backend import CUDABackend

    b = CUDABackend()
    monkeypatch.setattr(b, "check_ready", lambda: None)  # prepare's own logic, no device
    lines: list[str] = []
    b._flash2 = _gate("failed")
    note = await b.prepare(lines.append)
    assert note is not None
    assert "warp-per-row" in note
    assert "failed: a reason" in note
    assert lines == ["tensor-core attention kernel: failed: a reason"]
    b._flash2 = _gate("verified")
    assert await b.prepare() is None
    # The tiled f32 kernel's state is told as well, beside the tensor-core kernel's.
    b._flash_simt = _gate("failed")
    lines.clear()
    note = await b.prepare(lines.append)
    assert note == "attention: the warp-per-row kernel serves f32 (failed: a reason)"
    assert lines == [
        "tensor-core attention kernel: verified",
        "f32 tiled attention kernel: failed: a reason",
    ]
    b._flash2 = _gate("failed")
    note = await b.prepare()
    assert note is not None
    assert note.count("warp-per-row") == 2
    b._flash2 = b._flash_simt = _gate("verified")
    assert await b.prepare() is None


# -- the backend over the stand-in for CuPy (no GPU): the gate's outcome decides the route -------
@pytest.fixture
def stand_in(plugin: Any) -> Any:
    return plugin


@pytest.mark.anyio
@pytest.mark.parametrize("passed", [True, False])
async def test_the_verdict_decides_the_attention_route(
    stand_in: Any, passed: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib

    import fake_cupy

    monkeypatch.setenv("ACCELKIT_CUDA_VERDICTS", str(tmp_path))
    module = importlib.import_module("accelkit_cuda.flash_attention")  # over the stand-in
    answer = None if passed else "fa2_f16_d64 on B1 H4/2 Sq70 Sk133 causal=False: max error 3"
    monkeypatch.setattr(module, "_run_child", lambda *a: (answer, True))
    launches: list[tuple[str, Any, Any, int]] = []

    def call(self: Any, grid: Any, block: Any, args: Any, **kwargs: Any) -> None:
        launches.append((self.name, grid, block, kwargs.get("shared_mem", 0)))

    monkeypatch.setattr(fake_cupy.Function, "__call__", call)
    backend = stand_in.backend.CUDABackend()
    await backend.initialize("cuda:0")
    try:
        flash2 = backend.flash2
        assert flash2.state == ("verified" if passed else "failed")
        assert backend.capabilities.extra["flash2_attention"] == flash2.describe()
        f = backend.tensor_factory
        q = f.from_host(np.zeros((2, 8, 70, 128), np.float16))
        kv = f.from_host(np.zeros((2, 2, 33, 128), np.float16))
        await backend.kernel_ops.attention(q, kv, kv, causal=True).to_host()
        route = backend.attention_engines.last_route
        assert route is not None
        if passed:
            assert launches[-1] == ("fa2_f16_d128", (2, 16), (128,), fa.shared_bytes(128))
            assert route.engine == "flash2"
            assert await backend.prepare() is None
        else:
            assert launches[-1][0] == "flash_attention_f16"
            assert route.engine == "warp"
            assert "max error 3" in route.reason
            note = await backend.prepare()
            assert note is not None
            assert "max error 3" in note
        q32 = f.from_host(np.zeros((1, 2, 5, 64), np.float32))
        await backend.kernel_ops.attention(q32, q32, q32).to_host()  # f32: the tiled kernel
        # (its verdict comes from the same child: accelkit_cuda.flash_simt's check)
        assert backend.flash_simt.state == ("verified" if passed else "failed")
        assert backend.capabilities.extra["flash_simt_attention"] == backend.flash_simt.describe()
        if passed:
            assert launches[-1] == ("simt_attention_f32_d64", (1, 2), (256,), fs.shared_bytes(64))
        else:
            assert launches[-1][0] == "flash_attention_f32"
        counts = backend.attention_engines.routes["attention"]
        assert counts == ({"flash2": 1, "simt": 1} if passed else {"warp": 2})
    finally:
        await backend.shutdown()


@pytest.mark.parametrize("failure", [None, "row 3 differs"])
def test_the_check_child_prints_its_verdict_as_its_last_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    failure: str | None,
) -> None:
    """The body both gated kernels' children run (``python -m ... DEVICE CUBIN``): the cubin
    loaded and checked on the device named, the verdict as the last line's JSON."""
    import contextlib
    import json
    import sys

    devices: list[int] = []

    def device(index: int) -> Any:
        devices.append(index)
        return contextlib.nullcontext()

    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(cuda=SimpleNamespace(Device=device)))
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"CUBIN")
    seen: list[object] = []

    def load(binary: bytes) -> dict[str, Any]:
        seen.append(binary)
        return {"k": binary}

    def check(functions: dict[str, Any]) -> str | None:
        seen.append(functions)
        return failure

    assert fa.check_child(["prog", "3", str(cubin)], load, check) == 0
    assert devices == [3]
    assert seen == [b"CUBIN", {"k": b"CUBIN"}]
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == {"failure": failure}
