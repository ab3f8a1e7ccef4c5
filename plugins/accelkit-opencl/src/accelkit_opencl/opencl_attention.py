"""Attention as one flash-style kernel: the score matrix never exists beyond a tile.

One work-group handles ``BQ`` consecutive query rows of one (batch, head); each work-item owns
one query row (its ``q`` and its output accumulator live in private memory). The group walks the
keys in tiles of ``BK``: it loads the tile's K and V rows into local memory together, then every
work-item scores its row against the tile, folds the tile into a running maximum and sum
(online softmax, rescaling the accumulator when the maximum grows) and moves on. So the memory
a call needs is one K/V tile per group, whatever the sequence lengths.

Causal attention is aligned bottom-right (query ``i`` sees keys ``j <= i + Skv - Sq``); a group
stops at the last key its last row can see. The optional mask is read through four element
strides over [B, H, Sq, Skv] (0 along broadcast dimensions), so a broadcast mask is never
expanded; a BOOL mask keeps True positions, a float mask is added to the scores. A row whose
every score is ``-inf`` (or that sees no key) is written as zeros. Everything accumulates in
float (double for F64).
"""

from __future__ import annotations

from accelkit.dtype import DType
from accelkit_opencl.opencl_types import STORE_TYPES, load_type, pragmas

__all__ = ["attention_key_tile", "attention_source"]


def attention_key_tile(dtype: DType, d: int, dv: int, local_mem: int) -> int:
    """Keys per tile: up to 32, as many as local memory holds (0 when not even one fits)."""
    item = 8 if dtype is DType.F64 else 4
    row = (max(d, 1) + max(dv, 1)) * item
    return min(32, (local_mem // 2) // row)


def attention_source(
    dtype: DType, mask: DType | None, d: int, dv: int, bq: int, bk: int, causal: bool
) -> str:
    """Kernel ``attention(out, q, k, v, [mask], heads, group, sq, skv, scale, [mask strides])``
    over a global size of ``(ceil(Sq / BQ) * BQ, B * H)`` with work-groups of ``(BQ, 1)``.

    ``group`` is ``H / Hkv``: query head ``h`` reads KV head ``h / group``.
    """
    t = load_type(dtype)
    s = STORE_TYPES[dtype]
    params = [
        f"__global {s}* out", f"__global const {s}* q", f"__global const {s}* k",
        f"__global const {s}* v",
    ]  # fmt: skip
    if mask is not None:
        params.append(f"__global const {STORE_TYPES[mask]}* mask")
    params += ["long heads", "long group", "long sq", "long skv", f"{t} scale"]
    if mask is not None:
        params += ["long ms0", "long ms1", "long ms2", "long ms3"]
    if mask is None:
        score_mask = ""
    elif mask is DType.BOOL:
        score_mask = "if (!mrow[j * ms3]) sc = -INFINITY;"
    else:
        score_mask = "sc += (T)mrow[j * ms3];"
    causal_limit = "min(skv, q_last + skv - sq + 1)" if causal else "skv"
    row_limit = "min((long)tile_n, i + skv - sq + 1 - j0)" if causal else "tile_n"
    body = f"""
#define T {t}
#define S {s}
#define D {d}
#define DV {dv}
#define DA {max(d, 1)}
#define DVA {max(dv, 1)}
#define BQ {bq}
#define BK {bk}
__kernel __attribute__((reqd_work_group_size(BQ, 1, 1))) void attention({", ".join(params)}) {{
    int lid = get_local_id(0);
    long i = get_global_id(0);
    long bh = get_global_id(1);
    long kvh = (bh / heads) * (heads / group) + (bh % heads) / group;
    long q_last = min((long)get_group_id(0) * BQ + BQ, sq) - 1;
    long kend = {causal_limit};
    bool active = i < sq;
    __local T kt[BK][DA];
    __local T vt[BK][DVA];
    T qr[DA];
    T acc[DVA];
    T sc_tile[BK];
    __global const S* qrow = q + (bh * sq + (active ? i : 0)) * D;
    for (int c = 0; c < D; ++c) qr[c] = (T)qrow[c] * scale;
    for (int c = 0; c < DV; ++c) acc[c] = 0;
    T run_max = -INFINITY;
    T run_sum = 0;
    int nan_seen = 0;  /* fmax skips NaN: a NaN score must still make the row NaN */
    {"__global const " + STORE_TYPES[mask] + "* mrow = mask + (bh / heads) * ms0 + (bh % heads) * ms1 + (active ? i : 0) * ms2;" if mask is not None else ""}
    __global const S* kbase = k + kvh * skv * D;
    __global const S* vbase = v + kvh * skv * DV;
    for (long j0 = 0; j0 < kend; j0 += BK) {{
        int tile_n = (int)min((long)BK, kend - j0);
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int e = lid; e < tile_n * D; e += BQ) kt[e / DA][e % DA] = (T)kbase[j0 * D + e];
        for (int e = lid; e < tile_n * DV; e += BQ) vt[e / DVA][e % DVA] = (T)vbase[j0 * DV + e];
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!active) continue;
        int n = (int){row_limit};
        T tile_max = -INFINITY;
        for (int jj = 0; jj < n; ++jj) {{
            long j = j0 + jj;
            T sc = 0;
            for (int c = 0; c < D; ++c) sc += qr[c] * kt[jj][c];
            {score_mask}
            sc_tile[jj] = sc;
            nan_seen |= isnan(sc);
            tile_max = fmax(tile_max, sc);
        }}
        if (n <= 0 || tile_max == -INFINITY) continue;
        T new_max = fmax(run_max, tile_max);
        T corr = exp(run_max - new_max);
        run_sum *= corr;
        for (int c = 0; c < DV; ++c) acc[c] *= corr;
        for (int jj = 0; jj < n; ++jj) {{
            T p = exp(sc_tile[jj] - new_max);
            run_sum += p;
            for (int c = 0; c < DV; ++c) acc[c] += p * vt[jj][c];
        }}
        run_max = new_max;
    }}
    if (!active) return;
    __global S* orow = out + (bh * sq + i) * DV;
    T inv = nan_seen ? (T)NAN : (run_sum > 0 ? (T)1 / run_sum : (T)0);
    for (int c = 0; c < DV; ++c) orow[c] = (S)(acc[c] * inv);
}}
"""
    types = [t, s] + ([STORE_TYPES[mask]] if mask is not None else [])
    return pragmas(types) + body
