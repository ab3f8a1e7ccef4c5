"""The split-KV decode kernel of paged_attention (accelkit_cuda.flash_decode).

Without a GPU: both kernels of every dtype compile with NVRTC for sm_80 and sm_90 (no spills, no
warnings), the constants of SOURCE and the Python side agree, the launch arguments follow the
kernels' signatures, the NumPy port of the kernels (``split_model``/``combine_model``: the same
flat offsets, chunk and head-group split and combine) matches the float64 reference on the
on-device check's shapes and flags bad tables and lengths, and the whole route runs through the
backend over the CuPy stand-in with the ports launched in the kernels' place, under asyncio and
trio: the verdict decides the route, the engine is recorded, errors surface at the await. On a
GPU, the backend's own on-device check (a child) and test_gpu_cudnn.py's decode test run it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import test_offloop
from accelkit_cuda import flash_decode as fd
from nvrtc_checks import assert_compiles_without_spills

from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError

plugin = test_offloop.plugin


@pytest.mark.parametrize("pipelined", [False, True], ids=["plain", "with-pipelined"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_both_kernels_compile_without_spills(arch: str, pipelined: bool) -> None:
    assert_compiles_without_spills(
        fd.source(pipelined), arch, fd.kernel_names(pipelined), "decode.cu"
    )


def _xor_tree(lanes: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """warp_sum of SOURCE on each column of ``lanes`` [32, n] (float32): at each xor offset a
    lane adds its partner's value; every lane ends with the same sum."""
    v = lanes.copy()
    for o in (16, 8, 4, 2, 1):
        v = v + v[np.arange(32) ^ o]
    return v


def _butterfly(lanes: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """SOURCE's ``Butterfly<C, 16>::run`` step by step on ``lanes`` [32, C] (float32): a lane
    keeps the half of its values that its bit at the offset names, adds the partner's copy of
    that half (the partner sends it); one value left, plain xor steps. Each lane's v[0]."""
    v = [lanes[:, i].copy() for i in range(lanes.shape[1])]
    c, idx = len(v), np.arange(32)
    for o in (16, 8, 4, 2, 1):
        if c > 1:
            h = c // 2
            up = (idx & o) != 0
            send = [np.where(up, v[i], v[i + h]) for i in range(h)]
            keep = [np.where(up, v[i + h], v[i]) for i in range(h)]
            v = [keep[i] + send[i][idx ^ o] for i in range(h)] + v[h:c]
            c = h
        else:
            v[0] = v[0] + v[0][idx ^ o]
    return v[0]


@pytest.mark.parametrize("count", [1, 2, 4, 8, 16, 32])
def test_the_butterfly_gives_each_lane_warp_sums_sum_of_its_value(count: int) -> None:
    """The scores' butterfly (SOURCE's Butterfly, as :func:`_butterfly` steps it): lane L ends
    with value ``L >> (5 - log2 count)``'s sum over the warp, bit for bit warp_sum's (the same
    pairs in the same order), so the split kernel's scores are what they were with warp_sum."""
    rng = np.random.default_rng(count)
    lanes = rng.standard_normal((32, count)) * 10.0 ** rng.integers(-3, 4, (32, count))
    lanes = lanes.astype(np.float32)
    got = _butterfly(lanes)
    want = _xor_tree(lanes)
    shift = 5 - int(math.log2(count))
    for lane in range(32):
        assert got[lane] == want[lane, lane >> shift]
    assert np.allclose(want[0], lanes.sum(0, dtype=np.float64), rtol=1e-5, atol=1e-3)


def _keys_a_butterfly(gg: int) -> tuple[int, int]:
    """SOURCE's ``UB`` (the keys a butterfly sums, at ``gg`` heads: ``GG * UB`` at most SUMS,
    one key at the least) and its ``UNROLL``."""
    unroll = int(re.search(r"#define UNROLL (\d+)", fd.SOURCE).group(1))  # type: ignore[union-attr]
    assert re.search(
        r"enum \{ UB = GG \* UNROLL > SUMS \? \(SUMS / GG > 0 \? SUMS / GG : 1\) : UNROLL \};",
        fd.SOURCE,
    )  # the formula below is SOURCE's
    return (max(fd.SUMS // gg, 1) if gg * unroll > fd.SUMS else unroll), unroll


@pytest.mark.parametrize("gg", sorted({g for g, _sl in fd.SPLIT_VARIANTS}))
def test_the_scores_loop_writes_each_score_once(gg: int) -> None:
    """SOURCE's scores loop, step by step for one warp (:func:`_butterfly` for its butterflies,
    SHIFT, and the lane that writes ``s[gi][j]``): every (head < gn, key < cnt) score is
    written exactly once, with the warp's sum of its lanes' products, -inf for a key whose row
    offset is -1 (a bad block id), and nothing for heads at or past gn or keys at or past cnt,
    for every head count and the tail of a chunk."""
    ub, unroll = _keys_a_butterfly(gg)
    assert ub * gg <= max(fd.SUMS, gg)
    assert unroll % ub == 0
    shift = 5 - int(math.log2(ub * gg))
    rng = np.random.default_rng(gg)
    j0 = 8  # this warp's first key in the chunk
    roff = [-1 if j % 3 == 0 else j for j in range(j0 + unroll)]
    for gn in range(1, gg + 1):
        for cnt in range(j0 + 1, j0 + unroll + 1):
            lanes = rng.standard_normal((unroll, gg, 32)).astype(np.float32)
            written: dict[tuple[int, int], float] = {}
            for u0 in range(0, unroll, ub):
                part = np.zeros((32, ub * gg), np.float32)
                for v in range(ub):
                    j = j0 + u0 + v
                    if j < cnt and roff[j] >= 0:  # ro[u] (-1 past cnt): the lanes add nothing
                        part[:, v * gg : (v + 1) * gg] = lanes[u0 + v].T
                got = _butterfly(part)
                for lane in range(32):
                    idx = lane >> shift
                    j, gi = j0 + u0 + idx // gg, idx % gg
                    if (lane & ((1 << shift) - 1)) == 0 and gi < gn and j < cnt:
                        assert (gi, j) not in written, (gi, j)
                        written[(gi, j)] = float(got[lane]) if roff[j] >= 0 else -math.inf
            want = {
                (gi, j): (float(_xor_tree(lanes[j - j0, gi][:, None])[0, 0])
                          if roff[j] >= 0 else -math.inf)
                for gi in range(gn) for j in range(j0, cnt)
            }  # fmt: skip
            assert written == want, (gn, cnt)


#: The lines of SOURCE's pipelined loops that :func:`_pipelined_lane` steps through, in their
#: order: a prologue (keys, then values), and ``rows``, which each loop calls an iteration.
_PROLOGUE_LINES = (
    "for (int i = 0; i < ST - 1; ++i) {",
    "if (i < iters)",
    "fetch<K>(mine + i * RING, ",
    "cp_commit();",
)
_ROWS_LINES = (
    "__syncwarp();  // the stage refilled next",
    "int ahead = i + ST - 1;",
    "if (ahead < iters)",
    "fetch<K>(mine + (ahead % ST) * RING, src, dm, roff, (warp + ahead * NWARPS) * UNROLL,",
    "cp_commit();",
    "cp_wait<ST - 1>();",
    "__syncwarp();  // the rest of the warp's copies",
    "r[u][it] = PIPE ? mine[(i % ST) * RING + (u * SL + it) * 32 + lane]",
)


def _in_order(text: str, lines: tuple[str, ...], start: int = 0) -> int:
    """Where the last of ``lines`` ends in ``text``, each found after the one before it."""
    at = start
    for line in lines:
        found = text.find(line, at)
        assert found >= 0, f"{line!r} not found after offset {at}"
        at = found + len(line)
    return at


def _pipelined_lane(st: int, iters: int, early: bool) -> list[tuple[str, int]]:
    """One lane of a pipelined split variant, as SOURCE runs it: the key loop (ST - 1 stages
    copied ahead, then at each iteration the one ST - 1 ahead, a commit and ``cp_wait<ST - 1>``
    before the stage is read), the value prologue (before the softmax), the value loop. A
    copy lands when it is issued (``early``: a later copy must not overwrite a stage not read
    yet) or as late as ``cp.async.wait_group`` allows (only when a wait needs its group: a read
    must not find a stage not landed yet). Returns what each read found."""
    ring: list[tuple[str, int] | None] = [None] * st
    pending: list[list[tuple[int, tuple[str, int]]]] = []  # committed groups not landed
    group: list[tuple[int, tuple[str, int]]] = []
    found: list[tuple[str, int]] = []

    def fetch(stage: int, rows: tuple[str, int]) -> None:
        group.append((stage, rows))
        if early:
            ring[stage] = rows

    def commit() -> None:
        pending.append(list(group))
        group.clear()

    def wait(newest: int) -> None:
        while len(pending) > newest:
            for stage, rows in pending.pop(0):
                ring[stage] = rows

    def prologue(name: str) -> None:
        for i in range(st - 1):
            if i < iters:
                fetch(i, (name, i))
            commit()

    def loop(name: str) -> None:
        for i in range(iters):
            ahead = i + st - 1
            if ahead < iters:
                fetch(ahead % st, (name, ahead))
            commit()
            wait(st - 1)
            got = ring[i % st]
            assert got is not None
            found.append(got)

    prologue("k")
    loop("k")
    prologue("v")  # issued before the softmax
    loop("v")
    return found


@pytest.mark.parametrize("iters", [0, 1, 2, 3, 4, 5, 9, 16])
@pytest.mark.parametrize("st", [2, 4])
def test_the_pipelined_loops_read_each_iterations_rows(st: int, iters: int) -> None:
    """The pipelined variants' ring of stages (SOURCE's lines, stepped by
    :func:`_pipelined_lane`): iteration i reads iteration i's key rows, then its value rows,
    however early or late within the PTX rules each copy lands; ST of SOURCE is 4 (8-byte
    rows) or 2 (16-byte rows)."""
    rows = fd.SOURCE[fd.SOURCE.index("void rows(") : fd.SOURCE.index("void split_impl(")]
    _in_order(rows, _ROWS_LINES)
    body = fd.SOURCE[fd.SOURCE.index("void split_impl(") :]
    loop = ("for (int i = 0; i < iters; ++i) {", "const int j0 = (warp + i * NWARPS) * UNROLL;")
    keys = _in_order(body, (*_PROLOGUE_LINES, *loop, "rows<K, SL, PIPE>(r, ro, mine, kc, D, roff,"))
    assert "(warp + i * NWARPS) * UNROLL, cnt, lane);" in body[:keys]  # the prologue's rows
    prologue = _in_order(body, _PROLOGUE_LINES, keys)  # the value prologue,
    assert prologue < body.index("// The chunk's softmax statistics")  # before the softmax
    _in_order(body, (*loop, "rows<K, SL, PIPE>(r, ro, mine, vc, Dv, roff,"), body.index("// P V:"))
    assert body.count("rows<K, SL, PIPE>(") == 2
    assert re.search(r"ST = sizeof\(typename K::Raw\) > 8 \? STAGES / 2 : STAGES", fd.SOURCE)
    assert st in (int(re.search(r"#define STAGES (\d+)", fd.SOURCE).group(1)) // k for k in (1, 2))  # type: ignore[union-attr]
    want = [("k", i) for i in range(iters)] + [("v", i) for i in range(iters)]
    for early in (False, True):
        assert _pipelined_lane(st, iters, early) == want


@pytest.mark.parametrize("raw_bytes", [8, 16], ids=["2-byte", "f32"])
@pytest.mark.parametrize("dm", [4, 32, 60, 64, 68, 96, 128])
def test_a_stage_holds_exactly_the_slots_its_readers_read(dm: int, raw_bytes: int) -> None:
    """SOURCE's ``fetch`` (ported line by line below) fills, of each row of a stage, exactly the
    raw slots the lanes read afterwards (lane L reads slot L where ``4 L < dm``), nothing past
    the row's ``dm`` elements: 16-byte pieces (two slots each, ``dm`` a multiple of 8, 2-byte
    types) or a lane's own slot."""
    for line in (
        "if (sizeof(typename K::Raw) == 8 && (dm & 7) == 0) {",
        "const int per_row = dm >> 3;",
        "for (int k = lane; k < UNROLL * per_row; k += 32) {",
        "int u = k / per_row, c = k - u * per_row;",
        "if (o >= 0) cp_async((uint4*)&buf[u * 32 + 2 * c], src + o * dm + 8 * c);",
        "if (o >= 0 && i0 < dm) cp_async(&buf[u * 32 + lane], src + o * dm + i0);",
        "if (ro[u] >= 0 && i0 < dm)",
        "r[u][it] = PIPE ? mine[(i % ST) * RING + (u * SL + it) * 32 + lane]",
    ):
        assert line in fd.SOURCE, line
    unroll = int(re.search(r"#define UNROLL (\d+)", fd.SOURCE).group(1))  # type: ignore[union-attr]
    written: list[tuple[int, int]] = []
    if raw_bytes == 8 and dm % 8 == 0:
        per_row = dm >> 3
        for lane in range(32):
            for k in range(lane, unroll * per_row, 32):
                u, c = k // per_row, k - (k // per_row) * per_row
                assert 8 * c + 8 <= dm  # elements 8c .. 8c + 7 of the row
                written += [(u, 2 * c), (u, 2 * c + 1)]
    else:
        written = [(u, lane) for u in range(unroll) for lane in range(32) if 4 * lane < dm]
    read = [(u, lane) for u in range(unroll) for lane in range(32) if 4 * lane < dm]
    assert sorted(written) == read  # each slot read is written once, and no other


def test_the_source_and_python_agree() -> None:
    defines = dict(re.findall(r"#define (\w+) (\d+)", fd.SOURCE))
    assert int(defines["CHUNK"]) == fd.CHUNK
    assert int(defines["GROUP"]) == fd.GROUP
    assert int(defines["SUMS"]) == fd.SUMS
    assert int(defines["THREADS"]) == fd.THREADS
    assert int(defines["NWARPS"]) * 32 == fd.THREADS
    assert int(defines["SLICES"]) * 128 == fd.MAX_HEAD_DIM  # 4 dims a lane a slice
    assert int(defines["STAGES"]) >= 2
    plain = [f"decode_combine_{s}" for s in ("f16", "bf16", "f32")] + [
        f"decode_split_g{g}s{sl}_{s}" for g in (1, 2, 4, 8) for sl in (1, 2)
        for s in ("f16", "bf16", "f32")
    ]  # fmt: skip
    assert sorted(fd.kernel_names()) == sorted(plain)
    assert sorted(fd.kernel_names(True)) == sorted(
        plain + [f"decode_split_g{g}s1p_{s}" for g in (1, 2, 4, 8) for s in ("f16", "bf16", "f32")]
    )
    assert fd.source(True) == "#define PIPELINED 1\n" + fd.SOURCE
    assert fd.source() == "#define PIPELINED 0\n" + fd.SOURCE
    # Every split variant is instantiated, and the on-device check runs every one of them.
    for g, sl in fd.SPLIT_VARIANTS:
        assert f"SPLIT(K, S, {g}, {sl})" in fd.SOURCE
    for g, _sl in fd.PIPE_VARIANTS:
        assert re.search(rf"SPLIT_PIPE\(K, S, {g}, \w+\)", fd.SOURCE), g
    checked = {
        fd.split_kind(h, hk, d, dv, pipe)
        for _b, h, hk, d, dv, _bs, _n in fd.CHECK_SHAPES for pipe in (False, True)
    }  # fmt: skip
    assert checked == {f"split_g{g}s{sl}" for g, sl in fd.SPLIT_VARIANTS} | {
        f"split_g{g}s{sl}p" for g, sl in fd.PIPE_VARIANTS
    }


@pytest.mark.parametrize(
    ("heads", "kv_heads", "d", "dv", "kind", "pipelined"),
    [
        (32, 8, 128, 128, "split_g4s1", "split_g4s1p"),  # the bench's decode step
        (32, 32, 64, 64, "split_g1s1", "split_g1s1p"),  # MHA
        (18, 1, 64, 64, "split_g8s1", "split_g8s1p"),  # MQA: blocks of GROUP heads
        (12, 4, 128, 132, "split_g4s2", "split_g4s2"),  # a value head past 128: two slices
        (6, 2, 256, 64, "split_g4s2", "split_g4s2"),  # three heads a block: registers for four
    ],
)
def test_the_split_variant_holds_the_block_in_the_fewest_registers(
    heads: int, kv_heads: int, d: int, dv: int, kind: str, pipelined: str
) -> None:
    assert fd.split_kind(heads, kv_heads, d, dv) == kind
    assert fd.split_kind(heads, kv_heads, d, dv, pipelined=True) == pipelined  # (one slice)


def test_launch_args_follow_the_kernel_signatures() -> None:
    q, kc, vc = np.zeros((3, 8, 64)), np.zeros((10, 16, 2, 64)), np.zeros((10, 16, 2, 32))
    table, lens = np.zeros((3, 40), np.int32), np.zeros(3, np.int32)
    po, pm, out, err = object(), object(), object(), object()
    (k1, g1, b1, a1), (k2, g2, b2, a2) = fd.launches(
        q, kc, vc, table, lens, po, pm, out, err, 0.125
    )  # fmt: skip
    chunks = math.ceil(40 * 16 / fd.CHUNK)
    assert (k1, g1, b1) == ("split_g4s1", (chunks, 2, 3), (fd.THREADS, 1, 1))
    assert (k2, g2, b2) == ("combine", (24, 1, 1), (fd.THREADS, 1, 1))
    assert a1[:7] == (q, kc, vc, table, lens, po, pm)
    assert a1[-1] is err
    kinds = [type(a) for a in a1[7:-1]]
    assert kinds == [np.int32] * 4 + [np.int64, np.int32, np.int32, np.float32, np.int32]
    assert a1[7:14] == (8, 2, 64, 32, 10, 16, 40)
    assert a1[14] == np.float32(0.125 * math.log2(math.e))
    assert a1[15] == chunks
    assert a2 == (po, pm, out, 32, chunks)
    piped = fd.launches(q, kc, vc, table, lens, po, pm, out, err, 0.125, pipelined=True)
    assert [p[:3] for p in piped] == [("split_g4s1p", g1, b1), ("combine", g2, b2)]
    assert piped[0][3][7:] == a1[7:]  # the same parameters
    for name, args in (("split_g##GG##s##SL##TAG##_##S", a1), ("combine_##S", a2)):
        sig = re.search(rf"decode_{name}\((.*?)\)", fd.SOURCE, re.S)
        assert sig is not None
        params = [p.split()[-1] for p in sig.group(1).replace("\\", " ").split(",")]
        assert len(params) == len(args), (name, params)
        pointers = [p.startswith("*") or "*" in p for p in sig.group(1).split(",")]
        scalars = [type(a) in (np.int32, np.int64, np.float32) for a in args]
        assert [not s for s in scalars] == pointers, name


def test_the_geometry_splits_heads_and_keys() -> None:
    grid, grid2, chunks, groups = fd.geometry(16, 32, 8, 4096)
    assert (grid, grid2, chunks, groups) == ((16, 8, 16), (512, 1, 1), 16, 1)
    grid, _, chunks, groups = fd.geometry(2, 18, 1, 1)  # MQA, 18 heads: three groups
    assert (grid, chunks, groups) == ((1, 3, 2), 1, 3)


@pytest.mark.parametrize(
    ("dtype", "q", "kc", "vc", "table", "why"),
    [
        (DType.F16, (2, 8, 128), (9, 16, 2, 128), (9, 16, 2, 128), (2, 4), None),
        (DType.F32, (2, 8, 256), (9, 16, 2, 256), (9, 16, 2, 64), (2, 4), None),
        (DType.F64, (2, 8, 128), (9, 16, 2, 128), (9, 16, 2, 128), (2, 4), "f16/bf16/f32"),
        (DType.BF16, (2, 8, 66), (9, 16, 2, 66), (9, 16, 2, 66), (2, 4), "multiples of 4"),
        (DType.BF16, (2, 8, 512), (9, 16, 2, 512), (9, 16, 2, 512), (2, 4), "multiples of 4"),
        (DType.F16, (0, 8, 128), (9, 16, 2, 128), (9, 16, 2, 128), (0, 4), "empty"),
    ],
)
def test_refusals(dtype: DType, q: Any, kc: Any, vc: Any, table: Any, why: str | None) -> None:
    got = fd.refusal(dtype, q, kc, vc, table)
    assert (got is None) if why is None else (got is not None and why in got), got


@pytest.mark.parametrize("shape", fd.CHECK_SHAPES)
@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16, DType.F32])
def test_the_model_of_the_kernels_computes_paged_attention(shape: Any, dtype: DType) -> None:
    rng = np.random.default_rng(3)
    (q, kc, vc, table, lens), scale = fd._check_case(rng, dtype, shape)
    out, err = fd.model(q, kc, vc, table, lens, scale)
    assert err == [0, 0]
    ref = fd.reference(q, kc, vc, table, lens, scale)
    bound = fd.tolerance(dtype, max(shape[6]), shape[3]) * float(np.abs(vc).max())
    np.testing.assert_array_less(np.abs(out - ref), bound)
    assert not out[list(shape[6]).index(0)].any() if 0 in shape[6] else True
    # The -1 entries past each length are never read; a used entry out of range is flagged.
    bad = table.copy()
    bad[-1, 0] = kc.shape[0] + 5
    assert fd.model(q, kc, vc, bad, lens, scale)[1] == [2, kc.shape[0] + 5]
    long = lens.copy()
    long[0] = table.shape[1] * kc.shape[1] + 1
    assert fd.model(q, kc, vc, table, long, scale)[1] == [1, int(long[0])]


def test_a_nan_makes_its_row_nan() -> None:
    """fmaxf skips NaN: the kernels carry a NaN score through the chunk's sum to the output, as
    the warp-per-row kernel and the composition do; other rows stay finite."""
    rng = np.random.default_rng(5)
    (q, kc, vc, table, lens), scale = fd._check_case(rng, DType.F32, fd.CHECK_SHAPES[0])
    q[0, 3, 7] = np.nan
    out, err = fd.model(q, kc, vc, table, lens, scale)
    assert err == [0, 0]
    assert np.isnan(out[0, 3]).all()
    assert np.isfinite(np.delete(out.reshape(-1, out.shape[-1]), 3, axis=0)).all()


def test_check_cases_cover_what_the_kernel_splits() -> None:
    """The on-device check meets several chunks, a partial chunk, an empty sequence, more
    query heads a KV head than a block takes, and head dims of both slices."""
    lens = [n for s in fd.CHECK_SHAPES for n in s[6]]
    assert max(lens) > 2 * fd.CHUNK
    assert any(n % fd.CHUNK for n in lens)
    assert 0 in lens
    assert any(s[1] // s[2] > fd.GROUP for s in fd.CHECK_SHAPES)
    assert any(s[3] > 128 for s in fd.CHECK_SHAPES)
    assert any(s[3] != s[4] for s in fd.CHECK_SHAPES)
    # The pipelined variants' two ways of copying 2-byte rows: 16-byte pieces (head dims that
    # are multiples of 8) and a lane's 8 bytes (others).
    piped = [s for s in fd.CHECK_SHAPES if fd.split_kind(*s[1:5], True).endswith("p")]
    assert any(s[3] % 8 == 0 for s in piped)
    assert any(s[3] % 8 and s[4] % 8 for s in piped)
    assert any(s[3] % 8 == 0 and s[4] % 8 for s in piped)  # one of each in one call


# -- the route, through the backend over the stand-in for CuPy ------------------------------------
def _launch_models(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Make the stand-in's launches of the decode kernels run their NumPy ports."""
    import fake_cupy

    launched: list[tuple[str, Any]] = []
    original = fake_cupy.Function.__call__

    def call(self: Any, grid: Any, block: Any, args: Any, **kwargs: Any) -> None:
        if self.name.startswith("decode_split_"):
            fd_module = __import__("accelkit_cuda.flash_decode", fromlist=["split_model"])
            fd_module.split_model(grid, args)
        elif self.name.startswith("decode_combine_"):
            fd_module = __import__("accelkit_cuda.flash_decode", fromlist=["combine_model"])
            fd_module.combine_model(grid, args)
        launched.append((self.name, grid))
        original(self, grid, block, args, **kwargs)

    monkeypatch.setattr(fake_cupy.Function, "__call__", call)
    return launched


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("passed", "pipelined"), [(True, False), (True, True), (False, False)],
    ids=["verified", "verified-pipelined", "failed"],
)  # fmt: skip
async def test_decode_runs_on_the_split_kernel_once_verified(
    plugin: Any, passed: bool, pipelined: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib

    monkeypatch.setenv("ACCELKIT_CUDA_VERDICTS", str(tmp_path))
    fa = importlib.import_module("accelkit_cuda.flash_attention")  # over the stand-in
    answer = None if passed else "decode_f16 on ...: max error 2"
    monkeypatch.setattr(fa, "_run_child", lambda *a: (answer, True))
    monkeypatch.setenv("ACCELKIT_CUDA_DECODE_PIPELINE", "1" if pipelined else "0")
    launched = _launch_models(monkeypatch)
    backend = plugin.backend.CUDABackend()
    await backend.initialize("cuda:0")
    try:
        decode = backend.flash_decode
        assert decode.pipelined is pipelined
        assert decode.state == ("verified" if passed else "failed")
        assert backend.capabilities.extra["flash_decode"] == decode.describe()
        f, kops, engines = backend.tensor_factory, backend.kernel_ops, backend.attention_engines
        rng = np.random.default_rng(11)
        shape = (3, 18, 2, 64, 64, 16, (300, 0, 41))  # two head groups a KV head, two chunks
        (qh, kc, vc, table, lens), scale = fd._check_case(rng, DType.F16, shape)
        host = [x.astype(np.float16) for x in (qh, kc, vc)]
        args = [f.from_host(x) for x in (*host, table, lens)]
        out = kops.paged_attention(*args)
        route = engines.last_route
        assert route is not None
        assert route.op == "paged_attention"
        if not passed:
            assert route.engine != "flash_decode"
            assert "max error 2" in route.reason
            await out.to_host()
            return
        assert route.engine == "flash_decode", route
        assert route.reason.endswith("kernel, pipelined" if pipelined else "kernel"), route
        got = (await out.to_host()).astype(np.float64)
        names = [n for n, _ in launched if n.startswith("decode_")]
        split = "decode_split_g8s1p_f16" if pipelined else "decode_split_g8s1_f16"
        assert names == [split, "decode_combine_f16"]  # 9 heads a KV head
        ref = fd.reference(*host, table, lens, scale)
        bound = fd.tolerance(DType.F16, 300, 64) * float(np.abs(host[2]).max())
        np.testing.assert_array_less(np.abs(got - ref), bound)
        assert not got[1].any()  # length 0: zeros
        # An int64 table and lengths are converted; results alike.
        wide = [f.from_host(table.astype(np.int64)), f.from_host(lens.astype(np.int64))]
        got64 = (await kops.paged_attention(*args[:3], *wide).to_host()).astype(np.float64)
        np.testing.assert_array_equal(got64, got)
        bad = table.copy()
        bad[2, 1] = 99  # a used entry naming no block of the cache
        out = kops.paged_attention(*args[:3], f.from_host(bad), args[4])
        with pytest.raises(InvalidArgumentError, match="refers to block 99"):
            await out.to_host()
        long = lens.copy()
        long[0] = table.shape[1] * 16 + 3
        out = kops.paged_attention(*args[:4], f.from_host(long))
        with pytest.raises(InvalidArgumentError, match="context_lens must lie in"):
            await out.to_host()
        decode.enabled = False  # the other routes, with the reason recorded
        await kops.paged_attention(*args).to_host()
        assert engines.last_route.engine != "flash_decode"
        assert "switched off" in engines.last_route.reason
        assert engines.routes["paged_attention"]["flash_decode"] == 4
    finally:
        await backend.shutdown()


@pytest.mark.anyio
async def test_pipelined_variants_that_fail_their_check_leave_the_plain_ones(
    plugin: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Asked for, the pipelined variants are one program with the plain ones, under one
    verdict: where that program fails its on-device check, the plain program is checked
    alone and serves decode, and why the pipelined ones were dropped is kept."""
    import importlib

    from accelkit_cuda import nvrtc

    monkeypatch.setenv("ACCELKIT_CUDA_VERDICTS", str(tmp_path))
    monkeypatch.setenv("ACCELKIT_CUDA_DECODE_PIPELINE", "1")
    stand_in = nvrtc.compile_cached

    def compile_cached(source: str, *args: Any, **kwargs: Any) -> Any:
        compiled = stand_in(source, *args, **kwargs)
        if source.startswith("#define PIPELINED 1"):  # another binary, as NVRTC's would be
            return nvrtc.Compiled(compiled.binary + b"-pipelined", "cubin", "", "piped")
        return compiled

    monkeypatch.setattr(nvrtc, "compile_cached", compile_cached)
    fa = importlib.import_module("accelkit_cuda.flash_attention")
    checked: list[bytes] = []

    def run_child(binary: bytes, *args: Any) -> tuple[str | None, bool]:
        checked.append(binary)
        if binary.endswith(b"-pipelined"):
            return "decode_split_g4s1p_f16 on ...: max error 3", True
        return None, True

    monkeypatch.setattr(fa, "_run_child", run_child)
    launched = _launch_models(monkeypatch)
    backend = plugin.backend.CUDABackend()
    await backend.initialize("cuda:0")
    try:
        decode = backend.flash_decode
        assert decode.verified, decode.describe()
        assert checked.count(compile_cached(fd.source(True), "sm_90").binary) == 1
        assert decode.pipelined_failure.startswith("the on-device check failed: decode_split_g4s1p")
        assert decode.has_pipelined is False
        assert decode.pipelined is False
        with pytest.raises(InvalidArgumentError, match="were not compiled"):
            decode.pipelined = True
        f, kops = backend.tensor_factory, backend.kernel_ops
        rng = np.random.default_rng(2)
        (qh, kc, vc, table, lens), _ = fd._check_case(rng, DType.F16, fd.CHECK_SHAPES[0])
        args = [f.from_host(x.astype(np.float16)) for x in (qh, kc, vc)]
        await kops.paged_attention(*args, f.from_host(table), f.from_host(lens)).to_host()
        names = [n for n, _ in launched if n.startswith("decode_split")]
        assert names == ["decode_split_g4s1_f16"]
        assert backend.attention_engines.last_route.engine == "flash_decode"
    finally:
        await backend.shutdown()


def test_the_on_device_check_passes_the_model_and_fails_a_wrong_kernel(plugin: Any) -> None:
    """The gate's own check (``_check``, as the child runs it), over the stand-in for CuPy with
    the NumPy ports in the kernels' place: it passes them, and names the case a kernel with a
    wrong head-group offset fails on."""
    import importlib

    import ml_dtypes

    module = importlib.import_module("accelkit_cuda.flash_decode")  # over the stand-in
    views = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32}

    def as_values(a: Any, sfx: str) -> Any:
        return a.view(views[sfx]) if a.dtype == np.uint16 else a

    class Kernel:
        def __init__(self, name: str, wrong: bool = False) -> None:
            self.name, self.wrong = name, wrong

        def __call__(self, grid: Any, block: Any, args: Any, **kwargs: Any) -> None:
            sfx = self.name.rsplit("_", 1)[1]
            if "split" in self.name:
                args = (*(as_values(np.asarray(a), sfx) for a in args[:3]), *args[3:])
                if self.wrong:  # every query head reads the first KV head's keys
                    kc = np.asarray(args[1])
                    kc = np.repeat(kc[:, :, :1], kc.shape[2], axis=2)
                    args = (args[0], kc, *args[2:])
                module.split_model(grid, args)
            else:
                out = as_values(np.asarray(args[2]), sfx)
                module.combine_model(grid, (args[0], args[1], out, *args[3:]))

    plain = {n: Kernel(n) for n in module.kernel_names()}
    assert module._check(plain) is None  # (the plain program: no pipelined case)
    good = {n: Kernel(n) for n in module.kernel_names(True)}
    assert module._check(good) is None
    # The first check shape's (4 heads a KV head, d 128), plain and pipelined: each is checked.
    for wrong in ("decode_split_g4s1_f16", "decode_split_g4s1p_f16"):
        bad = dict(good, **{wrong: Kernel(wrong, wrong=True)})
        failure = module._check(bad)
        assert failure is not None
        assert failure.startswith(f"{wrong} on (3, 8, 2, 128, 128, 16)"), failure
        assert "max error" in failure


@pytest.mark.parametrize(
    ("value", "on", "warned"),
    [(None, False, False), ("1", True, False), ("off", False, False), ("pipe", False, True)],
)
def test_the_pipelined_switch_reads_the_environment(
    value: str | None, on: bool, warned: bool, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """``ACCELKIT_CUDA_DECODE_PIPELINE`` asks for the pipelined variants when a backend is made
    (compiled and used on sm_80 and newer); a value that is no flag is warned about and read
    as off; ``pipelined`` can be set only where they were compiled."""
    if value is None:
        monkeypatch.delenv("ACCELKIT_CUDA_DECODE_PIPELINE", raising=False)
    else:
        monkeypatch.setenv("ACCELKIT_CUDA_DECODE_PIPELINE", value)
    from accelkit_cuda.driver import Attr, DeviceProps

    def props(major: int, minor: int) -> DeviceProps:
        cc = {Attr.COMPUTE_CAPABILITY_MAJOR: major, Attr.COMPUTE_CAPABILITY_MINOR: minor}
        return DeviceProps(0, "GPU", 1 << 30, cc, 12040)

    with caplog.at_level("WARNING", logger="accelkit.cuda"):
        decode = fd.FlashDecode(None, props(9, 0))
    assert decode.pipelined is on
    assert decode.has_pipelined is on
    # Before sm_80 (no cp.async; fewer blocks an SM): never compiled, whatever the switch.
    assert fd.FlashDecode(None, props(7, 5)).has_pipelined is False
    decode.pipelined = False  # settable both ways where compiled, only off where not
    if on:
        decode.pipelined = True
        assert decode.pipelined
    else:
        with pytest.raises(InvalidArgumentError, match="ACCELKIT_CUDA_DECODE_PIPELINE=1"):
            decode.pipelined = True
    assert (
        any("ACCELKIT_CUDA_DECODE_PIPELINE='pipe'" in r.getMessage() for r in caplog.records)
        is warned
    )
