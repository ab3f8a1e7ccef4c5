"""A split-KV ("flash-decoding") NVRTC kernel for ``paged_attention``: one query token a sequence.

On an H100 (cuDNN 9.19) a decode step of 16 sequences x 4096 tokens (32 query / 8 KV heads, head
dim 128) took 1425 us on cuDNN's paged SDPA graph against 98 us for PyTorch's dense SDPA over the
same keys. Where the time went was not measured on the device (the next bench prints the
device time by CUDA events); what is known: the route builds the clamped page table, lengths and
checks with about fifteen CuPy kernels a step, and cuDNN's SDPA engines tile the queries (64 or
128 rows a block), so with one query row a block per (sequence, head) likely walks all its keys
alone, each query head reading its KV head again. The older warp-per-row kernel is one warp per
(sequence, head): too few to keep an H100 busy on a memory-bound step. This kernel splits the
keys, in two launches:

- ``decode_split_g<GG>s<SL>_<dtype>``: a block (128 threads, four warps) takes one (sequence,
  KV head, chunk of :data:`CHUNK` keys) and all the query heads of that KV head (up to :data:`GROUP`; more
  make more blocks), so each key and value row is read from the cache once a step, directly
  through the block table (no gather). Warps take keys in turn, lanes four head dims each
  (8- or 16-byte loads); the scores of the chunk sit in shared memory (log2 domain), their
  maximum and sum and the unnormalised ``P V`` of the chunk go to float32 scratch. The variant
  (:func:`split_kind`) holds registers for ``GG`` query heads (the power of two at or above the
  block's, up to GROUP) and ``SL`` 128-dim slices of a head (1 for head dims up to 128): one
  kernel for GROUP heads and 256 dims took 128 registers a thread (four blocks an SM), and the
  H100 run of 2026-11-27 measured it at 312 us a step of the bench's decode (16 x 4096 keys,
  32/8 heads, d 128, f16; 0.86 TB/s) against 90 us for PyTorch's dense SDPA (cuDNN);
  ``split_g4s1`` takes 64 (eight blocks an SM), and the H100 run of 2026-11-28 measured it at
  160 us (1.7 TB/s, 0.45x PyTorch's step). Its scores were then summed over the warp one (key,
  head) at a time (five shuffles each: 80 a warp's four keys at four heads, about as many as
  its loads and FMAs); they now go through one butterfly per up to :data:`SUMS` values (each
  lane keeps half its values at each xor step, so that lane ``L`` ends with value ``L >> s``:
  18 shuffles for those 80, each sum bit for bit warp_sum's), 64 registers for ``g4s1`` still,
  96 for ``g8s1`` (80 before). Its time on a GPU: unmeasured.
- ``decode_split_g<GG>s1p_<dtype>``, the pipelined variants (head dims up to 128; compiled and
  used where :attr:`FlashDecode.has_pipelined`: ``ACCELKIT_CUDA_DECODE_PIPELINE=1`` when the
  backend opens, sm_80 and newer; off by default): the same arithmetic, but a warp's key and
  value rows go through a ring of shared-memory stages (``cp.async``: :data:`STAGES`, two for
  f32), copied ``ST - 1`` iterations ahead, the first value rows while the chunk's softmax
  runs: at 1.7 TB/s the plain variant was latency-bound, four rows a warp in flight and none
  while it computes. 64 registers and 24 KiB a block at the bench's shape (eight blocks an SM
  on an H100). Unmeasured.
- ``decode_combine_<dtype>``: one block per (sequence, query head) merges the chunks'
  partial results (rescaled by ``exp2(m_c - M)``) into the output; a sequence without keys gets
  zeros (the contract).

Bad lengths or block ids are found on the device as by the warp-per-row kernel (``err`` code 1:
a length outside ``0..max_blocks*block_size``, code 2: a used table entry naming no block), and
the rows they would address are never read.

It takes f16, bf16 and f32 with ``head_dim`` and ``head_dim_v`` multiples of 4 up to
:data:`MAX_HEAD_DIM`, an int32 block table and lengths (others are converted), and caches whose
pointers are 16-byte aligned. Like :mod:`accelkit_cuda.flash_attention` it is never trusted
before it has passed an on-device check (a child process runs every variant on small random
paged caches, odd lengths, grouped heads, more query heads than :data:`GROUP`, empty sequences,
against a float64 reference; the verdict is stored the same way, keyed by the binary and the
device). ``ACCELKIT_CUDA_FLASH_DECODE=0`` switches it off (``recheck`` runs the check again).
Unverified on a GPU as written: compiled by NVRTC and its indexing checked by a NumPy model
(:func:`model`) in the GPU-free tests only.
"""

from __future__ import annotations

import logging
import math
import sys
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError
from accelkit.sdk import env_str
from accelkit_cuda.flash_attention import GatedKernel, check_child, from_bits, to_bits
from accelkit_cuda.switches import env_switch

_log = logging.getLogger("accelkit.cuda")

if TYPE_CHECKING:
    from accelkit.tensor import Tensor
    from accelkit_cuda.driver import DeviceProps

__all__ = [
    "CHUNK",
    "GROUP",
    "MAX_HEAD_DIM",
    "SOURCE",
    "PIPE_VARIANTS",
    "SPLIT_VARIANTS",
    "STAGES",
    "SUMS",
    "THREADS",
    "FlashDecode",
    "geometry",
    "kernel_names",
    "combine_model",
    "launches",
    "model",
    "reference",
    "refusal",
    "run",
    "scratch_shapes",
    "source",
    "split_kind",
    "split_model",
]

CHUNK = 256  # keys a block
SUMS = 8  # dot products a warp sums in one butterfly (SOURCE's SUMS)
STAGES = 4  # a pipelined variant's ring of shared-memory stages (SOURCE's STAGES; f32: 2)
GROUP = 8  # query heads a block (of one KV head)
THREADS = 128  # four warps
MAX_HEAD_DIM = 256  # two 4-element slices a lane
_LOG2E = 1.4426950408889634
_SUFFIX = {DType.F16: "f16", DType.BF16: "bf16", DType.F32: "f32"}
_GRID_YZ_MAX = 65535


#: The split kernel's variants: (query heads a block holds registers for, 128-dim slices).
SPLIT_VARIANTS = tuple((g, sl) for sl in (1, 2) for g in (1, 2, 4, 8))
#: The pipelined split variants (``"split_g<GG>s1p"``), head dims up to 128 (one slice).
PIPE_VARIANTS = tuple((g, 1) for g in (1, 2, 4, 8))


def split_kind(heads: int, kv_heads: int, d: int, dv: int, pipelined: bool = False) -> str:
    """The split kernel variant of a call (``"split_g<GG>s<SL>"``): the fewest registers that
    hold a block's query heads (at most GROUP) and its head dims; with ``pipelined``, the
    variant whose rows go through shared memory (``...p``) where there is one (one slice)."""
    per_block = min(GROUP, max(1, heads // kv_heads))
    gg = next(g for g, _sl in SPLIT_VARIANTS if g >= per_block)
    sl = 1 if max(d, dv) <= 128 else 2
    return f"split_g{gg}s{sl}" + ("p" if pipelined and (gg, sl) in PIPE_VARIANTS else "")


def kernel_names(pipelined: bool = False) -> list[str]:
    """Every variant of the split kernel and the combine kernel, of every dtype; with
    ``pipelined``, the pipelined split variants too (:func:`source`)."""
    names = []
    for s in _SUFFIX.values():
        names += [f"decode_split_g{g}s{sl}_{s}" for g, sl in SPLIT_VARIANTS]
        if pipelined:
            names += [f"decode_split_g{g}s{sl}p_{s}" for g, sl in PIPE_VARIANTS]
        names.append(f"decode_combine_{s}")
    return names


def source(pipelined: bool = False) -> str:
    """The program to compile: :data:`SOURCE`, with the pipelined split variants where asked
    (they double its compile time, which a backend opening with a cold cache waits for)."""
    return f"#define PIPELINED {int(pipelined)}\n{SOURCE}"


def geometry(
    batch: int, heads: int, kv_heads: int, max_keys: int
) -> tuple[tuple[int, int, int], tuple[int, int, int], int, int]:
    """``(split grid, combine grid, chunks, groups)``: the split kernel's grid is (chunks,
    kv_heads * groups, batch), groups = ceil((heads / kv_heads) / GROUP); the combine kernel's
    (batch * heads, 1, 1)."""
    chunks = max(1, -(-max_keys // CHUNK))
    groups = -(-(heads // kv_heads) // GROUP)
    return (chunks, kv_heads * groups, batch), (batch * heads, 1, 1), chunks, groups


def refusal(
    dtype: DType, q: tuple[int, ...], k_cache: tuple[int, ...], v_cache: tuple[int, ...],
    table: tuple[int, ...],
) -> str | None:  # fmt: skip
    """None when the kernel takes this call (shapes: q [B, H, D], caches [blocks, block_size,
    Hk, D|Dv], table [B, max_blocks]), else why not."""
    if dtype not in _SUFFIX:
        return f"the split-KV decode kernel takes f16/bf16/f32, not {dtype.value}"
    b, h, d = q
    nb, bs, hk = k_cache[:3]
    dv = v_cache[3]
    if d % 4 or dv % 4 or not 0 < d <= MAX_HEAD_DIM or not 0 < dv <= MAX_HEAD_DIM:
        return (
            f"the split-KV decode kernel takes head dims that are multiples of 4 up to"
            f" {MAX_HEAD_DIM}; got {d}/{dv}"
        )
    if b * h == 0 or nb == 0 or bs == 0 or table[1] == 0:
        return "empty input"
    grid = geometry(b, h, hk, table[1] * bs)[0]
    if grid[2] > _GRID_YZ_MAX or grid[1] > _GRID_YZ_MAX:
        return f"batch or kv_heads * groups > {_GRID_YZ_MAX}"
    return None


def reference(
    q: np.ndarray[Any, Any], kc: np.ndarray[Any, Any], vc: np.ndarray[Any, Any],
    table: np.ndarray[Any, Any], lens: np.ndarray[Any, Any], scale: float,
) -> np.ndarray[Any, Any]:  # fmt: skip
    """Paged decode in float64, directly from the definition: [B, H, Dv]; no key: zeros."""
    b, h, _ = q.shape
    bs, hk = kc.shape[1], kc.shape[2]
    out = np.zeros((b, h, vc.shape[3]))
    for i in range(b):
        n = int(lens[i])
        if n == 0:
            continue
        blocks = np.array([table[i, t // bs] for t in range(n)])
        rows = np.arange(n) % bs
        keys = kc[blocks, rows].astype(np.float64)  # [n, Hk, D]
        vals = vc[blocks, rows].astype(np.float64)
        for j in range(h):
            g = j // (h // hk)
            s = keys[:, g] @ q[i, j].astype(np.float64) * scale
            p = np.exp(s - s.max())
            out[i, j] = (p / p.sum()) @ vals[:, g]
    return out


def launches(
    q: Any, kc: Any, vc: Any, table32: Any, lens32: Any, part_o: Any, part_ml: Any, out: Any,
    err: Any, scale: float, pipelined: bool = False,
) -> list[tuple[str, tuple[int, int, int], tuple[int, int, int], tuple[Any, ...]]]:  # fmt: skip
    """The two launches of one call, ``(kind, grid, block, args)`` (``kind``: the split
    variant, :func:`split_kind`, then ``"combine"``), the arguments in the kernels' parameter
    order (arrays as given: CuPy's on the device, NumPy's in :func:`model`)."""
    b, h, d = q.shape
    nb, bs, hk = kc.shape[:3]
    dv = vc.shape[3]
    mb = table32.shape[1]
    grid, grid2, chunks, _ = geometry(b, h, hk, mb * bs)
    split = (
        q, kc, vc, table32, lens32, part_o, part_ml, np.int32(h), np.int32(hk), np.int32(d),
        np.int32(dv), np.int64(nb), np.int32(bs), np.int32(mb), np.float32(scale * _LOG2E),
        np.int32(chunks), err,
    )  # fmt: skip
    combine = (part_o, part_ml, out, np.int32(dv), np.int32(chunks))
    kind = split_kind(h, hk, d, dv, pipelined)
    return [(kind, grid, (THREADS, 1, 1), split), ("combine", grid2, (THREADS, 1, 1), combine)]


def scratch_shapes(b: int, h: int, kv_heads: int, max_keys: int, dv: int) -> tuple[int, int]:
    """Elements of ``part_o`` and ``part_ml`` (float32) for one call."""
    chunks = geometry(b, h, kv_heads, max_keys)[2]
    return b * h * chunks * dv, b * h * chunks * 2


def split_model(grid: tuple[int, int, int], args: tuple[Any, ...]) -> None:
    """``decode_split``, block by block as SOURCE computes it (the flat offsets, the chunk and
    head-group split, the lanes' four-dim slices, the log2-domain softmax), on NumPy arrays
    given in the kernel's parameter order (the GPU-free tests launch it in the kernel's place)."""
    q, kc, vc, table, lens, part_o, part_ml, h, hkv, d, dv, nb, bs, mb, scale_log2, chunks, err = (
        args
    )
    h, hkv, d, dv, nb, bs, mb, chunks = (int(x) for x in (h, hkv, d, dv, nb, bs, mb, chunks))
    qf, kf, vf = (np.asarray(x).reshape(-1).astype(np.float32) for x in (q, kc, vc))
    tf, lf = np.asarray(table).reshape(-1), np.asarray(lens).reshape(-1)
    po, pm, ef = (np.asarray(x).reshape(-1) for x in (part_o, part_ml, err))
    g_all = h // hkv
    groups = -(-g_all // GROUP)
    inf = np.float32(np.inf)

    def set_error(code: int, value: int) -> None:
        if ef[0] == 0:
            ef[0], ef[1] = code, value

    for bz in range(grid[2]):
        for by in range(grid[1]):
            for bx in range(grid[0]):
                kvh, g0 = by // groups, (by % groups) * GROUP
                gn = min(GROUP, g_all - g0)
                n = int(lf[bz])
                if n < 0 or n > mb * bs:
                    if bx == 0 and by == 0:
                        set_error(1, n)
                    n = 0
                start = bx * CHUNK
                cnt = min(CHUNK, n - start)
                slot0 = (bz * h + kvh * g_all + g0) * chunks + bx
                if cnt <= 0:
                    for gi in range(gn):
                        pm[(slot0 + gi * chunks) * 2 : (slot0 + gi * chunks) * 2 + 2] = (-inf, 0)
                    continue
                roff = np.full(CHUNK, -1, np.int64)
                for j in range(cnt):
                    t = start + j
                    blk = int(tf[bz * mb + t // bs])
                    if blk < 0 or blk >= nb:
                        set_error(2, blk)
                    else:
                        roff[j] = (blk * bs + t % bs) * hkv + kvh
                heads = [bz * h + kvh * g_all + g0 + gi for gi in range(gn)]
                qs = np.stack([qf[x * d : x * d + d] for x in heads]) * np.float32(scale_log2)
                s = np.full((GROUP, CHUNK), -inf, np.float32)
                for j in range(cnt):
                    if roff[j] < 0:
                        continue
                    prod = qs * kf[roff[j] * d : roff[j] * d + d][None, :]  # [gn, d]
                    # Lane l holds dims 4l..4l+3 and 128+4l..: its sum, then the warp's.
                    lanes = np.zeros((gn, 2, 32, 4), np.float32)
                    lanes.reshape(gn, -1)[:, :d] = prod
                    s[:gn, j] = lanes.sum(axis=(1, 3), dtype=np.float32).sum(1, dtype=np.float32)
                for gi in range(gn):
                    m = np.fmax.reduce(s[gi, :cnt], initial=-inf)  # fmaxf: skips NaN
                    p = np.zeros(CHUNK, np.float32)
                    if m != -inf:
                        p[:cnt] = np.exp2(s[gi, :cnt] - m)
                    nan_seen = bool(np.isnan(s[gi, :cnt]).any())
                    s[gi] = p
                    total = np.float32(np.nan) if nan_seen else p.sum()
                    pm[(slot0 + gi * chunks) * 2 : (slot0 + gi * chunks) * 2 + 2] = (m, total)
                o = np.zeros((gn, dv), np.float32)
                for j in range(cnt):
                    if roff[j] >= 0:
                        o += s[:gn, j : j + 1] * vf[roff[j] * dv : roff[j] * dv + dv][None, :]
                for gi in range(gn):
                    po[(slot0 + gi * chunks) * dv : (slot0 + gi * chunks + 1) * dv] = o[gi]


def combine_model(grid: tuple[int, int, int], args: tuple[Any, ...]) -> None:
    """``decode_combine`` on NumPy arrays in the kernel's parameter order; ``out`` is written
    in its own dtype (rounded once, as the kernel's store)."""
    part_o, part_ml, out, dv, chunks = args
    dv, chunks = int(dv), int(chunks)
    po, pm = np.asarray(part_o).reshape(-1), np.asarray(part_ml).reshape(-1)
    of = np.asarray(out).reshape(-1)
    for bh in range(grid[0]):
        ml = pm[bh * chunks * 2 : (bh + 1) * chunks * 2].reshape(chunks, 2)
        live = ml[:, 1] != 0  # a NaN sum counts, and makes the row NaN
        big = np.fmax.reduce(ml[live, 0]) if live.any() else -np.inf
        with np.errstate(invalid="ignore"):  # -inf - -inf where a NaN row has no finite max
            w = np.where(live, np.exp2(np.where(live, ml[:, 0], 0) - big), 0).astype(np.float32)
            total = np.float32((ml[:, 1] * w).sum())
            parts = po[bh * chunks * dv : (bh + 1) * chunks * dv].reshape(chunks, dv)
            o = (np.where(live[:, None], parts, 0) * w[:, None]).sum(0, dtype=np.float32)
            of[bh * dv : (bh + 1) * dv] = o / total if total > 0 or np.isnan(total) else 0


def model(
    q: np.ndarray[Any, Any], kc: np.ndarray[Any, Any], vc: np.ndarray[Any, Any],
    table: np.ndarray[Any, Any], lens: np.ndarray[Any, Any], scale: float,
) -> tuple[np.ndarray[Any, Any], list[int]]:  # fmt: skip
    """Both kernels' arithmetic and indexing in NumPy (:func:`split_model`, then
    :func:`combine_model`, with :func:`launches`' packing): ``(out [B, H, Dv] float32, err)``.
    The GPU-free tests check it against :func:`reference`."""
    b, h, _ = q.shape
    hk, dv = kc.shape[2], vc.shape[3]
    n_o, n_ml = scratch_shapes(b, h, hk, table.shape[1] * kc.shape[1], dv)
    part_o = np.full(n_o, np.nan, np.float32)
    part_ml = np.full(n_ml, np.nan, np.float32)
    out = np.full((b, h, dv), np.nan, np.float32)
    err = np.zeros(2, np.int64)
    plan = launches(
        q, kc, vc, table.astype(np.int32), lens.astype(np.int32), part_o, part_ml, out, err,
        scale,
    )  # fmt: skip
    for kind, grid, _block, args in plan:
        (split_model if kind.startswith("split") else combine_model)(grid, args)
    return out, err.tolist()


#: The shapes of the on-device check: (batch, heads, kv_heads, head_dim, head_dim_v,
#: block_size, lengths). Lengths not a multiple of a block or a chunk, several chunks, an empty
#: sequence, more query heads a KV head than GROUP, MQA, a narrow value head.
CHECK_SHAPES: tuple[tuple[int, int, int, int, int, int, tuple[int, ...]], ...] = (
    (3, 8, 2, 128, 128, 16, (700, 0, 257)),  # split_g4s1
    (2, 18, 1, 64, 64, 16, (33, 530)),  # split_g8s1, three head groups
    (2, 4, 4, 256, 96, 8, (1, 300)),  # split_g1s2
    (2, 2, 1, 128, 64, 16, (300, 17)),  # split_g2s1
    (1, 3, 3, 32, 32, 16, (290,)),  # split_g1s1
    (2, 6, 3, 160, 128, 16, (40, 270)),  # split_g2s2
    (1, 12, 3, 192, 200, 8, (300,)),  # split_g4s2
    (1, 8, 1, 128, 256, 16, (520,)),  # split_g8s2
    (2, 4, 2, 68, 36, 16, (300, 41)),  # split_g2s1 on rows of 8-byte copies (pipelined)
    (1, 4, 4, 64, 36, 16, (300,)),  # split_g1s1: keys in 16-byte pieces, values in 8 (pipelined)
)


def _check_case(
    rng: np.random.Generator, dtype: DType, shape: tuple[int, int, int, int, int, int, tuple[int, ...]],
) -> tuple[list[np.ndarray[Any, Any]], float]:  # fmt: skip
    """Random inputs of one check case (a shuffled table, -1 past each length) and its scale."""
    b, h, hk, d, dv, bs, lens = shape
    mb = max(1, -(-max(lens) // bs))
    nb = b * mb + 3
    order = rng.permutation(nb)[: b * mb].reshape(b, mb).astype(np.int32)
    for i, n in enumerate(lens):
        order[i, -(-n // bs) :] = -1
    arrays = [
        rng.standard_normal((b, h, d)), rng.standard_normal((nb, bs, hk, d)),
        rng.standard_normal((nb, bs, hk, dv)),
    ]  # fmt: skip
    if dtype is not DType.F32:
        arrays = [from_bits(to_bits(a, dtype), dtype) for a in arrays]
    return [*arrays, order, np.array(lens, np.int32)], 1.0 / math.sqrt(d)


def tolerance(dtype: DType, keys: int, head_dim: int) -> float:
    """The largest error of an output element relative to ``max |v|``: the output's rounding
    (eps/2 of its type) and f32 accumulation over the keys and dims, twice for safety."""
    eps = {DType.F16: 2.0**-10, DType.BF16: 2.0**-7, DType.F32: 2.0**-23}[dtype]
    return 2.0 * (eps + (keys + head_dim) * 2.0**-23)


class FlashDecode(GatedKernel):
    """The split-KV decode kernel of one backend: compiled, checked on the device (a child
    process, the verdict stored) and loaded by :meth:`load`, as the tensor-core kernel is.
    ``enabled = False`` routes decode to cuDNN's paged graph or the warp-per-row kernel;
    :attr:`pipelined` picks the split variants whose rows go through shared memory."""

    def __init__(self, backend: Any, props: DeviceProps) -> None:
        super().__init__(backend, props)
        #: Whether the pipelined split variants were asked for (``ACCELKIT_CUDA_DECODE_PIPELINE=1``
        #: when the backend opens) on a device of compute capability 8.0 or newer (``cp.async``;
        #: before, shared memory holds fewer blocks an SM and the copies would not overlap):
        #: they are then compiled, checked on the device with the others, and used
        #: (:attr:`pipelined`).
        asked = env_switch(
            "ACCELKIT_CUDA_DECODE_PIPELINE", "the decode kernel's plain variants are used"
        )
        self.has_pipelined = asked and props.compute_capability >= (8, 0)
        if asked and not self.has_pipelined:
            _log.info(
                "ACCELKIT_CUDA_DECODE_PIPELINE=1: compute capability %d.%d has no cp.async;"
                " the decode kernel's plain variants are used", *props.compute_capability,
            )  # fmt: skip
        self._pipelined = self.has_pipelined
        #: Why the pipelined variants were dropped after failing their on-device check (the
        #: plain ones are then checked alone), or "".
        self.pipelined_failure = ""

    @property
    def pipelined(self) -> bool:
        """Whether head dims up to 128 take the pipelined split variants (``...p``: each warp's
        key and value rows copied into a ring of shared-memory stages ahead of their use). Off
        by default until a GPU run says it pays; settable where they were compiled
        (:attr:`has_pipelined`; ``benchmarks/bench_cuda_attention.py`` compares both)."""
        return self._pipelined

    @pipelined.setter
    def pipelined(self, on: bool) -> None:
        if on and not self.has_pipelined:
            raise InvalidArgumentError(
                "the pipelined decode variants were not compiled: set"
                " ACCELKIT_CUDA_DECODE_PIPELINE=1 before the backend opens (compute capability"
                " 8.0 or newer)"
            )
        self._pipelined = bool(on)

    async def load(self) -> None:
        """Compile (a worker thread; cached on disk), check in a child, load on the submission
        thread. Never raises: a failure leaves the other routes and says why."""
        switch = env_str("ACCELKIT_CUDA_FLASH_DECODE")
        if switch in ("0", "off", "false", "no"):
            self.state, self.reason = "unavailable", "switched off (ACCELKIT_CUDA_FLASH_DECODE=0)"
            return
        await self._compile_check_load(self.has_pipelined, switch == "recheck")
        if self.state == "failed" and self.has_pipelined:
            # One program, one verdict: a fault of the experiment must not cost the plain kernel.
            self.pipelined_failure = self.reason
            self.has_pipelined = self._pipelined = False
            _log.warning(
                "the pipelined decode variants failed (%s); checking the plain ones alone",
                self.reason,
            )
            await self._compile_check_load(False, switch == "recheck")

    async def _compile_check_load(self, pipelined: bool, recheck: bool) -> None:
        await self.compile_check_load(
            source(pipelined), "accelkit_flash_decode.cu", "accelkit_cuda.flash_decode",
            "flash-decode", recheck, partial(_load, pipelined=pipelined),
        )  # fmt: skip

    def refusal(
        self, q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor
    ) -> str | None:
        """None when the kernel takes this ``paged_attention`` call, else why not."""
        gate = self.gate_refusal("split-KV decode kernel")
        if gate is not None:
            return gate
        return refusal(q.dtype, q.shape, k_cache.shape, v_cache.shape, block_table.shape)

    def function(self, kind: str, dtype: DType) -> Any:
        """The loaded kernel (``kind``: ``"split"`` or ``"combine"``; a dict lookup)."""
        return self._functions[f"decode_{kind}_{_SUFFIX[dtype]}"]


def run(
    functions: Any, q: Any, kc: Any, vc: Any, table: Any, lens: Any, out: Any, dtype: DType,
    scale: float, stream: Any = None, pipelined: bool = False,
) -> Any:  # fmt: skip
    """Launch both kernels on CuPy arrays (the submission thread, or the check's child):
    returns the int64 ``err`` pair (the scratch is kept alive by CuPy's stream-ordered pool
    until the launches are done). ``functions(kind, dtype)`` gives a kernel; ``pipelined``
    takes the pipelined split variant where there is one (:func:`split_kind`)."""
    import cupy as cp

    b, h, _ = q.shape
    hk, dv = kc.shape[2], vc.shape[3]
    # int32 for the kernel; wider ids and lengths are clipped first, so that one too large for
    # int32 stays out of range (and is reported) instead of wrapping onto a valid one.
    top = 2**31 - 1
    table32 = table if table.dtype == cp.int32 else cp.clip(table, -1, top).astype(cp.int32)
    lens32 = lens if lens.dtype == cp.int32 else cp.clip(lens, -1, top).astype(cp.int32)
    n_o, n_ml = scratch_shapes(b, h, hk, table.shape[1] * kc.shape[1], dv)
    part_o = cp.empty(n_o, cp.float32)
    part_ml = cp.empty(n_ml, cp.float32)
    err = cp.zeros(2, cp.int64)
    kw = {} if stream is None else {"stream": stream}
    plan = launches(q, kc, vc, table32, lens32, part_o, part_ml, out, err, scale, pipelined)
    for kind, grid, block, args in plan:
        functions(kind, dtype)(grid, block, args, **kw)
    return err


def main(argv: list[str]) -> int:
    """The child of the verdict: ``python -m accelkit_cuda.flash_decode DEVICE CUBIN``
    (:func:`~accelkit_cuda.flash_attention.check_child`)."""
    return check_child(argv, _load, _check)


def _load(binary: bytes, pipelined: bool | None = None) -> dict[str, Any]:
    """Load the program and its kernels: the pipelined variants too where it was compiled
    with them (``pipelined``; None, as in the check's child: where the cubin names them)."""
    import cupy as cp

    module = cp.cuda.function.Module()
    module.load(binary)
    if pipelined is None:
        pipelined = all(n.encode() + b"\0" in binary for n in kernel_names(True))
    return {"": module} | {name: module.get_function(name) for name in kernel_names(pipelined)}


def _check(functions: dict[str, Any]) -> str | None:
    """Every dtype on :data:`CHECK_SHAPES` against :func:`reference`, plus a bad block id and a
    bad length (their error codes). None, or the first failure."""
    import cupy as cp

    np_dt = {DType.F16: np.float16, DType.BF16: np.uint16, DType.F32: np.float32}

    def fn(kind: str, dtype: DType) -> Any:
        return functions[f"decode_{kind}_{_SUFFIX[dtype]}"]

    def device(x: np.ndarray[Any, Any], dtype: DType) -> Any:
        if dtype is DType.BF16:
            return cp.asarray(to_bits(x, dtype))
        return cp.asarray(x.astype(np_dt[dtype]))

    rng = np.random.default_rng(31)
    stream = cp.cuda.Stream(non_blocking=True)
    piped = any(name.startswith("decode_split_") and name.endswith(("p_f16", "p_bf16", "p_f32"))
                for name in functions)  # fmt: skip
    cases = [
        (shape, pipe) for shape in CHECK_SHAPES for pipe in (False, piped)
        if not pipe or split_kind(*shape[1:5], True) != split_kind(*shape[1:5])
    ]  # fmt: skip
    cases = list(dict.fromkeys(cases))  # (without the pipelined ones: each shape once)
    with stream:
        for dtype in _SUFFIX:
            for shape, pipe in cases:
                (qh, kh, vh, table, lens), scale = _check_case(rng, dtype, shape)
                b, h = qh.shape[:2]
                dv = vh.shape[3]
                out = cp.full((b, h, dv), 0xFFFF if dtype is not DType.F32 else np.nan,
                              cp.uint16 if dtype is not DType.F32 else cp.float32)  # fmt: skip
                err = run(
                    fn, device(qh, dtype), device(kh, dtype), device(vh, dtype),
                    cp.asarray(table), cp.asarray(lens), out, dtype, scale, None, pipe,
                )  # fmt: skip
                got = out.get()
                got = got.astype(np.float64) if dtype is DType.F32 else from_bits(
                    got.view(np.uint16) if dtype is DType.BF16 else got, dtype
                )  # fmt: skip
                ref = reference(qh, kh, vh, table, lens, scale)
                bound = tolerance(dtype, max(shape[6]), shape[3]) * float(np.max(np.abs(vh)))
                e = np.abs(got - ref)
                kind = split_kind(*shape[1:5], pipe)
                name = f"decode_{kind}_{_SUFFIX[dtype]} on {shape[:6]} lens {shape[6]}"
                if int(err.get()[0]) != 0:
                    return f"{name}: an error was flagged on good input: {err.get().tolist()}"
                if not np.all(e <= bound):
                    worst = float(np.nanmax(e)) if np.isfinite(e).any() else math.nan
                    return f"{name}: max error {worst:.3g} > {bound:.3g}"
                bad = table.copy()
                bad[-1, 0] = kh.shape[0] + 5
                err = run(
                    fn, device(qh, dtype), device(kh, dtype), device(vh, dtype),
                    cp.asarray(bad), cp.asarray(lens), out, dtype, scale, None, pipe,
                )  # fmt: skip
                if err.get().tolist() != [2, kh.shape[0] + 5]:
                    return f"{name}: a bad block id gave err {err.get().tolist()}"
                long = lens.copy()
                long[0] = table.shape[1] * kh.shape[1] + 1
                err = run(
                    fn, device(qh, dtype), device(kh, dtype), device(vh, dtype),
                    cp.asarray(table), cp.asarray(long), out, dtype, scale, None, pipe,
                )  # fmt: skip
                if err.get().tolist()[0] not in (1, 2):
                    return f"{name}: a bad length gave err {err.get().tolist()}"
    stream.synchronize()
    return None


SOURCE = r"""
typedef long long i64;
typedef unsigned short u16;

// No headers (NVRTC has no include path on a bare machine): f16 and bf16 widened with PTX and
// bit shifts, narrowed to nearest even.
__device__ __forceinline__ float h2f(u16 h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ u16 f2h(float f) {
    u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ float b2f(u16 h) { return __uint_as_float(((unsigned int)h) << 16); }
__device__ __forceinline__ u16 f2b(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

struct F16 { typedef u16 T; typedef uint2 Raw; };
struct BF16 { typedef u16 T; typedef uint2 Raw; };
struct F32 { typedef float T; typedef float4 Raw; };

// Four consecutive elements (8 or 16 bytes, aligned: offsets are multiples of 4), loaded raw
// (so that several rows are in flight before any is used) and widened afterwards.
__device__ __forceinline__ uint2 raw4(const u16* p, i64 i) { return *(const uint2*)(p + i); }
__device__ __forceinline__ float4 raw4(const float* p, i64 i) { return *(const float4*)(p + i); }
__device__ __forceinline__ void widen(uint2 r, float* x, F16) {
    x[0] = h2f((u16)(r.x & 0xffffu)); x[1] = h2f((u16)(r.x >> 16));
    x[2] = h2f((u16)(r.y & 0xffffu)); x[3] = h2f((u16)(r.y >> 16));
}
__device__ __forceinline__ void widen(uint2 r, float* x, BF16) {
    x[0] = __uint_as_float(r.x << 16); x[1] = __uint_as_float(r.x & 0xffff0000u);
    x[2] = __uint_as_float(r.y << 16); x[3] = __uint_as_float(r.y & 0xffff0000u);
}
__device__ __forceinline__ void widen(float4 r, float* x, F32) {
    x[0] = r.x; x[1] = r.y; x[2] = r.z; x[3] = r.w;
}
template <typename K> __device__ __forceinline__ void load4(const typename K::T* p, i64 i, float* x) {
    widen(raw4(p, i), x, K());
}
__device__ __forceinline__ void store(u16* p, i64 i, float v, F16) { p[i] = f2h(v); }
__device__ __forceinline__ void store(u16* p, i64 i, float v, BF16) { p[i] = f2b(v); }
__device__ __forceinline__ void store(float* p, i64 i, float v, F32) { p[i] = v; }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
template <int N> struct Log2 { enum { value = 1 + Log2<N / 2>::value }; };
template <> struct Log2<1> { enum { value = 0 }; };

// Sums over the warp of C values a lane (C a power of two, at most 32) at once: at each xor
// offset O a lane keeps half of its values (the upper half where its bit O is set), adds the
// partner's copy of that half and sends the other; once one value is left, plain xor steps.
// Lane L ends with the sum of value (L >> (5 - log2 C)) in v[0].
template <int C, int O> struct Butterfly {
    static __device__ __forceinline__ void run(float* v, int lane) {
        enum { H = C > 1 ? C / 2 : 1 };
        if (C > 1) {
            bool up = (lane & O) != 0;
#pragma unroll
            for (int i = 0; i < H; ++i) {
                float send = up ? v[i] : v[i + H];
                float keep = up ? v[i + H] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
            }
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], O);
        }
        Butterfly<H, O / 2>::run(v, lane);
    }
};
template <int C> struct Butterfly<C, 0> {
    static __device__ __forceinline__ void run(float*, int) {}
};

__device__ __forceinline__ void set_error(i64* err, i64 code, i64 value) {
    if (atomicCAS((unsigned long long*)err, 0ull, (unsigned long long)code) == 0ull) err[1] = value;
}

// The pipelined split variants are compiled only where asked (PIPELINED 1: the backend asks for
// them with ACCELKIT_CUDA_DECODE_PIPELINE=1 on sm_80 and newer): they double this program's
// compile time, which every backend opening with a cold cache waits for.
#ifndef PIPELINED
#define PIPELINED 0
#endif

// Copies into shared memory that run while the thread goes on (sm_80's cp.async; 8 bytes through
// L1, 16 bytes straight from L2), in groups: wait<N> returns once at most the N newest groups of
// this thread are still in flight, and its copies are then visible to it (to the rest of the
// warp after a __syncwarp). Before sm_80, plain loads and stores (nothing in flight).
#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
__device__ __forceinline__ void cp_async(uint2* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;"
                 :: "r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async(float4* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                 :: "r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async(uint4* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                 :: "r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
#else
__device__ __forceinline__ void cp_async(uint2* d, const void* src) { *d = *(const uint2*)src; }
__device__ __forceinline__ void cp_async(float4* d, const void* src) { *d = *(const float4*)src; }
__device__ __forceinline__ void cp_async(uint4* d, const void* src) { *d = *(const uint4*)src; }
__device__ __forceinline__ void cp_commit() {}
template <int N> __device__ __forceinline__ void cp_wait() {}
#endif

#define CHUNK 256
#define GROUP 8
#define THREADS 128
#define NWARPS 4
#define SLICES 2
#define UNROLL 4  // key rows a warp has in flight
#define SUMS 8  // dot products a warp sums in one butterfly (registers: a lane holds them all)
#define STAGES 4  // a pipelined variant's rows in flight a warp: STAGES * UNROLL (8-byte rows)

// The pipelined variants (PIPE; one slice, head dims up to 128): a warp's key and value rows go
// through shared memory in a ring of ST stages of UNROLL rows, copied ST - 1 iterations ahead,
// and the first value rows are on their way while the scores' softmax runs. A stage holds its
// rows as they lie in the cache ([UNROLL][32] raw slots: lane L reads slot L of a row, its four
// elements); the copies are 16 bytes where rows allow (straight from L2: f32 always, each lane
// its own slot; 2-byte types with head dims that are multiples of 8, half a warp a row of 128,
// and a lane then reads slots another lane copied: a __syncwarp after each wait and before each
// refill), else 8 bytes a lane (through L1).
template <typename K> struct Stages {
    enum { ST = sizeof(typename K::Raw) > 8 ? STAGES / 2 : STAGES };  // 16 KiB a block
};

// A warp's rows j0 .. j0 + UNROLL - 1 of the chunk (roff; -1: none) into one stage ``buf``.
template <typename K> __device__ __forceinline__ void fetch(
        typename K::Raw* buf, const typename K::T* src, int dm, const i64* roff, int j0, int cnt,
        int lane) {
    if (sizeof(typename K::Raw) == 8 && (dm & 7) == 0) {  // 16-byte pieces of the rows
        const int per_row = dm >> 3;  // (at most 16)
        for (int k = lane; k < UNROLL * per_row; k += 32) {
            int u = k / per_row, c = k - u * per_row;
            i64 o = j0 + u < cnt ? roff[j0 + u] : -1;
            if (o >= 0) cp_async((uint4*)&buf[u * 32 + 2 * c], src + o * dm + 8 * c);
        }
        return;
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        i64 o = j0 + u < cnt ? roff[j0 + u] : -1;
        int i0 = 4 * lane;
        if (o >= 0 && i0 < dm) cp_async(&buf[u * 32 + lane], src + o * dm + i0);
    }
}

// grid (chunks, Hkv * groups, B), THREADS threads. part_o [B*H*chunks, Dv], part_ml [.., 2]
// (the chunk's max score, log2 domain, and its sum of exp2(s - max)).
// GG: query heads a block holds registers for (a power of two >= its heads, <= GROUP); SL:
// 128-dim slices a lane holds (1: head dims <= 128). Fewer make fewer registers (128 with
// GROUP and two slices: four blocks an SM, latency-bound on an H100, 2026-11-27).
// Iteration i's rows (keys j0 ..., of ``src``, rows of ``dm`` elements) into registers: the
// lane's four elements of each slice of each row (ro: the rows' offsets, -1 for none). PIPE:
// first the copy of the stage ST - 1 iterations ahead (the one the warp read last time), then
// a wait for stage i's, from the ring; else straight from the cache.
template <typename K, int SL, bool PIPE> __device__ __forceinline__ void rows(
        typename K::Raw (&r)[UNROLL][SL], i64 (&ro)[UNROLL], typename K::Raw* mine,
        const typename K::T* src, int dm, const i64* roff, int i, int iters, int j0, int warp,
        int cnt, int lane) {
    enum { ST = Stages<K>::ST, RING = UNROLL * SL * 32 };
    if (PIPE) {
        __syncwarp();  // the stage refilled next was read by the whole warp last time
        int ahead = i + ST - 1;
        if (ahead < iters)
            fetch<K>(mine + (ahead % ST) * RING, src, dm, roff, (warp + ahead * NWARPS) * UNROLL,
                     cnt, lane);
        cp_commit();
        cp_wait<ST - 1>();
        __syncwarp();  // the rest of the warp's copies of stage i, seen by this lane
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        ro[u] = j0 + u < cnt ? roff[j0 + u] : -1;
#pragma unroll
        for (int it = 0; it < SL; ++it) {
            int i0 = 4 * lane + 128 * it;
            if (ro[u] >= 0 && i0 < dm)
                r[u][it] = PIPE ? mine[(i % ST) * RING + (u * SL + it) * 32 + lane]
                                : raw4(src, ro[u] * dm + i0);
        }
    }
}

template <typename K, int GG, int SL, bool PIPE> __device__ void split_impl(
        const typename K::T* q, const typename K::T* kc, const typename K::T* vc,
        const int* table, const int* lens, float* part_o, float* part_ml, int H, int Hkv, int D,
        int Dv, i64 NB, int BS, int MB, float scale_log2, int chunks, i64* err) {
    __shared__ float s[GG][CHUNK];
    __shared__ float red[GG][128 * SL];
    __shared__ i64 roff[CHUNK];
    typedef typename K::Raw Raw;
    static_assert(!PIPE || SL == 1, "the pipelined variants hold one slice (fetch's layout)");
    enum { ST = Stages<K>::ST, RING = UNROLL * SL * 32 };  // a stage: RING raw slots (SL 1)
    __shared__ __align__(16) Raw ring[PIPE ? NWARPS * ST * RING : 1];
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    Raw* mine = ring + (PIPE ? warp * ST * RING : 0);  // this warp's stages
    int G = H / Hkv, groups = (G + GROUP - 1) / GROUP;
    int kvh = blockIdx.y / groups, g0 = (blockIdx.y % groups) * GROUP;
    int gn = min(GROUP, G - g0);
    i64 b = blockIdx.z;
    i64 n = lens[b];
    if (n < 0 || n > (i64)MB * BS) {
        if (blockIdx.x == 0 && blockIdx.y == 0 && tid == 0) set_error(err, 1, n);
        n = 0;
    }
    i64 start = (i64)blockIdx.x * CHUNK;
    int cnt = (int)min((i64)CHUNK, n - start);
    i64 slot0 = (b * H + (i64)kvh * G + g0) * chunks + blockIdx.x;  // head gi: + gi * chunks
    if (cnt <= 0) {
        if (tid < gn) {
            part_ml[(slot0 + (i64)tid * chunks) * 2] = -__int_as_float(0x7f800000);
            part_ml[(slot0 + (i64)tid * chunks) * 2 + 1] = 0.0f;
        }
        return;
    }
    for (int j = tid; j < cnt; j += THREADS) {
        int t = (int)start + j;  // < n <= INT_MAX (lens are int32): a 32-bit division
        i64 blk = table[b * MB + t / BS];
        if (blk < 0 || blk >= NB) {
            set_error(err, 2, blk);
            roff[j] = -1;
        } else {
            roff[j] = (blk * BS + t % BS) * Hkv + kvh;
        }
    }
    for (int i = tid; i < GG * 128 * SL; i += THREADS) (&red[0][0])[i] = 0.0f;
    // This lane's slices of the group's queries (scaled into the log2 domain).
    float qr[GG][SL][4];
    enum { UB = GG * UNROLL > SUMS ? (SUMS / GG > 0 ? SUMS / GG : 1) : UNROLL };
    enum { SHIFT = 5 - Log2<UB * GG>::value };
#pragma unroll
    for (int gi = 0; gi < GG; ++gi)
#pragma unroll
        for (int it = 0; it < SL; ++it) {
            int i0 = 4 * lane + 128 * it;
            float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (gi < gn && i0 < D) load4<K>(q, (b * H + (i64)kvh * G + g0 + gi) * D + i0, x);
#pragma unroll
            for (int e = 0; e < 4; ++e) qr[gi][it][e] = x[e] * scale_log2;
        }
    __syncthreads();
    // Scores: warps take UNROLL keys in turn (iterations i: keys j0 = (warp + i NWARPS) UNROLL
    // onwards), lanes four dims of each slice.
    const int iters =
        cnt > warp * UNROLL ? (cnt - warp * UNROLL + NWARPS * UNROLL - 1) / (NWARPS * UNROLL) : 0;
    if (PIPE)
#pragma unroll
        for (int i = 0; i < ST - 1; ++i) {
            if (i < iters)
                fetch<K>(mine + i * RING, kc, D, roff, (warp + i * NWARPS) * UNROLL, cnt, lane);
            cp_commit();
        }
    for (int i = 0; i < iters; ++i) {
        const int j0 = (warp + i * NWARPS) * UNROLL;
        Raw r[UNROLL][SL];
        i64 ro[UNROLL];
        rows<K, SL, PIPE>(r, ro, mine, kc, D, roff, i, iters, j0, warp, cnt, lane);
        // The dot products summed over the warp UB keys at a time (UB x GG values, at most
        // SUMS) in one butterfly each: UB*GG - 1 shuffles and log2(32 / (UB*GG)) more, not 5 a
        // value. A lane's sum is that of value (lane >> SHIFT), each the very sum warp_sum
        // would give (the same pairs, in the same order).
#pragma unroll
        for (int u0 = 0; u0 < UNROLL; u0 += UB) {
            float part[UB * GG];  // key u0 + v, head gi: part[v * GG + gi]
#pragma unroll
            for (int v = 0; v < UB; ++v) {
                int u = u0 + v;
#pragma unroll
                for (int gi = 0; gi < GG; ++gi) part[v * GG + gi] = 0.0f;
#pragma unroll
                for (int it = 0; it < SL; ++it) {
                    int i0 = 4 * lane + 128 * it;
                    if (ro[u] >= 0 && i0 < D) {
                        float x[4];
                        widen(r[u][it], x, K());
#pragma unroll
                        for (int gi = 0; gi < GG; ++gi)
#pragma unroll
                            for (int e = 0; e < 4; ++e) part[v * GG + gi] += qr[gi][it][e] * x[e];
                    }
                }
            }
            Butterfly<UB * GG, 16>::run(part, lane);
            int idx = lane >> SHIFT, j = j0 + u0 + idx / GG, gi = idx % GG;
            if ((lane & ((1 << SHIFT) - 1)) == 0 && gi < gn && j < cnt)
                s[gi][j] = roff[j] >= 0 ? part[0] : -__int_as_float(0x7f800000);
        }
    }
    __syncthreads();
    if (PIPE)  // the first value rows, on their way during the softmax (the key stages are read:
               // the __syncthreads above)
#pragma unroll
        for (int i = 0; i < ST - 1; ++i) {
            if (i < iters)
                fetch<K>(mine + i * RING, vc, Dv, roff, (warp + i * NWARPS) * UNROLL, cnt,
                             lane);
            cp_commit();
        }
    // The chunk's softmax statistics: a warp a head.
    for (int gi = warp; gi < gn; gi += NWARPS) {
        float m = -__int_as_float(0x7f800000);
        for (int j = lane; j < cnt; j += 32) m = fmaxf(m, s[gi][j]);
        m = warp_max(m);
        float l = 0.0f;
        for (int j = lane; j < cnt; j += 32) {
            float p = m == -__int_as_float(0x7f800000) ? 0.0f : exp2f(s[gi][j] - m);
            s[gi][j] = p;
            l += p;
        }
        l = warp_sum(l);
        // fmaxf skips NaN: a NaN score must still make the row NaN (as the other routes do).
        bool nan_seen = false;
        for (int j = lane; j < cnt; j += 32) nan_seen |= isnan(s[gi][j]) != 0;
        if (__any_sync(0xffffffffu, nan_seen)) l = __int_as_float(0x7fc00000);
        if (lane == 0) {
            part_ml[(slot0 + (i64)gi * chunks) * 2] = m;
            part_ml[(slot0 + (i64)gi * chunks) * 2 + 1] = l;
        }
    }
    __syncthreads();
    // P V: warps take keys in turn, lanes four value dims of each slice.
    float acc[GG][SL][4];
#pragma unroll
    for (int gi = 0; gi < GG; ++gi)
#pragma unroll
        for (int it = 0; it < SL; ++it)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[gi][it][e] = 0.0f;
    for (int i = 0; i < iters; ++i) {
        const int j0 = (warp + i * NWARPS) * UNROLL;
        Raw r[UNROLL][SL];
        i64 ro[UNROLL];
        rows<K, SL, PIPE>(r, ro, mine, vc, Dv, roff, i, iters, j0, warp, cnt, lane);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (ro[u] < 0) continue;
#pragma unroll
            for (int it = 0; it < SL; ++it) {
                int i0 = 4 * lane + 128 * it;
                if (i0 < Dv) {
                    float x[4];
                    widen(r[u][it], x, K());
#pragma unroll
                    for (int gi = 0; gi < GG; ++gi) {
                        float p = gi < gn ? s[gi][j0 + u] : 0.0f;
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc[gi][it][e] += p * x[e];
                    }
                }
            }
        }
    }
#pragma unroll
    for (int gi = 0; gi < GG; ++gi)
#pragma unroll
        for (int it = 0; it < SL; ++it) {
            int i0 = 4 * lane + 128 * it;
            if (gi < gn && i0 < Dv)
#pragma unroll
                for (int e = 0; e < 4; ++e) atomicAdd(&red[gi][i0 + e], acc[gi][it][e]);
        }
    __syncthreads();
    for (int i = tid; i < gn * Dv; i += THREADS) {
        int gi = i / Dv, c = i % Dv;
        part_o[(slot0 + (i64)gi * chunks) * Dv + c] = red[gi][c];
    }
}

// grid (B * H), THREADS threads: merge the chunks of one (sequence, head); no key: zeros.
template <typename K> __device__ void combine_impl(
        const float* part_o, const float* part_ml, typename K::T* out, int Dv, int chunks) {
    i64 bh = blockIdx.x;
    const float* ml = part_ml + bh * chunks * 2;
    float big = -__int_as_float(0x7f800000), total = 0.0f;
    for (int c = 0; c < chunks; ++c)
        if (ml[2 * c + 1] != 0.0f) big = fmaxf(big, ml[2 * c]);  // NaN sums count (and spread)
    for (int c = 0; c < chunks; ++c)
        if (ml[2 * c + 1] != 0.0f) total += ml[2 * c + 1] * exp2f(ml[2 * c] - big);
    for (int i = threadIdx.x; i < Dv; i += THREADS) {
        float o = 0.0f;
        for (int c = 0; c < chunks; ++c)
            if (ml[2 * c + 1] != 0.0f) o += part_o[(bh * chunks + c) * Dv + i] * exp2f(ml[2 * c] - big);
        store(out, bh * Dv + i, total > 0.0f || isnan(total) ? o / total : 0.0f, K());
    }
}

// (THREADS, 2): ptxas's register allocation without spills for every variant (with THREADS alone,
// split_g8s1 spilled 12 bytes on sm_80 and sm_90). The pipelined variants of up to four heads
// ask for eight blocks an SM where that costs no spill (64 registers: 72 otherwise, seven
// blocks, and the bench's 2048 blocks in three rounds on 132 SMs instead of two); of eight
// heads, five (126 registers and four blocks on sm_90 otherwise; six spill).
#define SPLIT_AS(K, S, GG, SL, PIPE, TAG, MINB)                                                   \
extern "C" __global__ void __launch_bounds__(THREADS, MINB) decode_split_g##GG##s##SL##TAG##_##S( \
        const K::T* q, const K::T* kc, const K::T* vc, const int* table, const int* lens,       \
        float* part_o, float* part_ml, int H, int Hkv, int D, int Dv, i64 NB, int BS, int MB,    \
        float scale_log2, int chunks, i64* err)                                                   \
    { split_impl<K, GG, SL, PIPE>(q, kc, vc, table, lens, part_o, part_ml, H, Hkv, D, Dv, NB,   \
                                  BS, MB, scale_log2, chunks, err); }
#define SPLIT(K, S, GG, SL) SPLIT_AS(K, S, GG, SL, false, , 2)
#define SPLIT_PIPE(K, S, GG, MINB) SPLIT_AS(K, S, GG, 1, true, p, MINB)
#if PIPELINED
#define PIPES(K, S, MINB4)                                                                        \
SPLIT_PIPE(K, S, 1, 8) SPLIT_PIPE(K, S, 2, 8) SPLIT_PIPE(K, S, 4, MINB4) SPLIT_PIPE(K, S, 8, 5)
#else
#define PIPES(K, S, MINB4)
#endif
#define INSTANTIATE(K, S, MINB4)                                                                  \
SPLIT(K, S, 1, 1) SPLIT(K, S, 2, 1) SPLIT(K, S, 4, 1) SPLIT(K, S, 8, 1)                          \
SPLIT(K, S, 1, 2) SPLIT(K, S, 2, 2) SPLIT(K, S, 4, 2) SPLIT(K, S, 8, 2)                          \
PIPES(K, S, MINB4)                                                                                \
extern "C" __global__ void __launch_bounds__(THREADS) decode_combine_##S(                        \
        const float* part_o, const float* part_ml, K::T* out, int Dv, int chunks)                \
    { combine_impl<K>(part_o, part_ml, out, Dv, chunks); }

INSTANTIATE(F16, f16, 8)
INSTANTIATE(BF16, bf16, 8)
INSTANTIATE(F32, f32, 2)  // (eight blocks: 24 bytes spilled)
"""


if __name__ == "__main__":
    sys.exit(main(sys.argv))
