"""The GEMM kernels behind gemm, batched_gemm, matmul and linear.

``out[b] = alpha * A[b] B[b] + beta * C[b]`` with every operand read through element strides,
so transposes, broadcast batch dimensions, a broadcast ``C`` and ``linear``'s ``W^T`` need no
copies. Two ways to compute it:

- packed (float dtypes): ``pack`` copies A and B once into panels (``[row block][k][row in
  block]``, zero-padded to whole blocks), so that the multiply kernel ``gemm_packed`` streams
  both contiguously and needs no bounds checks in its inner loop; each work-item keeps an
  ``RM x RN`` block of the output in vector registers. The loops are unrolled here, in the
  generated source, because PoCL leaves private arrays indexed by loops in memory (measured:
  unrolled, fused multiply-adds in registers run ~5x faster than the same block as arrays), and
  the packing pays for itself many times over on a CPU device (strided panels thrash its caches).
- tiled (every other dtype): each work-group stages TS x TS tiles of A and B in local memory;
  each work-item accumulates a WPT x WPT register block of the output.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from accelkit.dtype import DType
from accelkit_opencl.opencl_types import STORE_TYPES, load_type, pragmas

__all__ = ["GemmBlock", "gemm_pack_source", "gemm_packed_source", "gemm_source"]


@dataclass(frozen=True)
class GemmBlock:
    """How the packed GEMM divides the work: each work-item computes ``rows x cols`` outputs as
    vectors of ``width`` along a row, ``k_unroll`` steps of K per loop trip; ``local`` is the
    preferred work-group shape (blocks along N, blocks along M)."""

    rows: int
    cols: int
    width: int
    k_unroll: int
    local: tuple[int, int]

    def label(self) -> str:
        return f"{self.rows}x{self.cols}/{self.width} k{self.k_unroll} wg{self.local[0]}x{self.local[1]}"


# Cached: a pure function of its arguments, called at every GEMM launch (as opencl_elementwise's
# builders are).
@functools.lru_cache(maxsize=1024)
def gemm_source(a: DType, b: DType, c: DType | None, out: DType, ts: int, wpt: int) -> str:
    """Kernel ``gemm``. Work-group (TS/WPT, TS/WPT, 1); global (ceil(N/TS)*TS/WPT,
    ceil(M/TS)*TS/WPT, batch). Batch index decomposes over three (collapsed) batch dims."""
    t = load_type(out)
    sa, sb, so = STORE_TYPES[a], STORE_TYPES[b], STORE_TYPES[out]
    sc = STORE_TYPES[c] if c is not None else "float"
    params = [
        f"__global {so}* out", f"__global const {sa}* A", f"__global const {sb}* B",
        *([f"__global const {sc}* C"] if c is not None else []),
        "int M", "int N", "int K",
        "long sam", "long sak", "long sbk", "long sbn", "long scm", "long scn",
        "long b1", "long b2",
        "long sab0", "long sab1", "long sab2", "long sbb0", "long sbb1", "long sbb2",
        "long scb0", "long scb1", "long scb2",
        "T alpha", "T beta",
    ]  # fmt: skip
    c_term = "v += beta * (T)C[cb + (long)row * scm + (long)col * scn];" if c is not None else ""
    return (
        pragmas([t, sa, sb, sc, so])
        + f"#define T {t}\n#define TS {ts}\n#define WPT {wpt}\n#define RTS (TS / WPT)\n"
        + "__kernel __attribute__((reqd_work_group_size(RTS, RTS, 1)))\n"
        + f"void gemm({', '.join(params)}) {{\n"
        + """
    int tc = get_local_id(0), tr = get_local_id(1);
    int col0 = get_group_id(0) * TS, row0 = get_group_id(1) * TS;
    long bz = get_global_id(2);
    long i2 = bz % b2, q = bz / b2, i1 = q % b1, i0 = q / b1;
    long ab = i0 * sab0 + i1 * sab1 + i2 * sab2;
    long bb = i0 * sbb0 + i1 * sbb1 + i2 * sbb2;
    long cb = i0 * scb0 + i1 * scb1 + i2 * scb2;
    __local T As[TS][TS + 1];
    __local T Bs[TS][TS + 1];
    T acc[WPT][WPT];
    for (int i = 0; i < WPT; ++i) for (int j = 0; j < WPT; ++j) acc[i][j] = 0;
    for (int k0 = 0; k0 < K; k0 += TS) {
        for (int i = 0; i < WPT; ++i) for (int j = 0; j < WPT; ++j) {
            int r = tr + i * RTS, cc = tc + j * RTS;
            int ar = row0 + r, ak = k0 + cc;
            As[r][cc] = (ar < M && ak < K) ? (T)A[ab + (long)ar * sam + (long)ak * sak] : (T)0;
            int bk = k0 + r, bc = col0 + cc;
            Bs[r][cc] = (bk < K && bc < N) ? (T)B[bb + (long)bk * sbk + (long)bc * sbn] : (T)0;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int p = 0; p < TS; ++p) {
            T bv[WPT];
            for (int j = 0; j < WPT; ++j) bv[j] = Bs[p][tc + j * RTS];
            for (int i = 0; i < WPT; ++i) {
                T av = As[tr + i * RTS][p];
                for (int j = 0; j < WPT; ++j) acc[i][j] += av * bv[j];
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int i = 0; i < WPT; ++i) for (int j = 0; j < WPT; ++j) {
        int row = row0 + tr + i * RTS, col = col0 + tc + j * RTS;
        if (row < M && col < N) {
            T v = alpha * acc[i][j];
            """
        + c_term
        + f"""
            out[(bz * M + row) * (long)N + col] = ({so})v;
        }}
    }}
}}
"""
    )


def gemm_pack_source(src: DType, dst: DType, block: int) -> str:
    """Kernel ``pack``: ``P[z][r / block][k][r % block] = X[z][r][k]`` for r < Rp, k < Kp (zero
    beyond R and K), converting to ``dst``'s compute type. ``X`` is read through the strides
    (row, k, three batch dims); a packed batch is ``pz`` elements apart. Global (Kp, Rp / block,
    batch): each work-item writes one k of one block, so the batch arithmetic (64-bit divisions)
    is paid once per block and neighbouring work-items read neighbouring k."""
    t = load_type(dst)
    s = STORE_TYPES[src]
    return (
        pragmas([t, s])
        + f"__kernel void pack(__global {t}* P, __global const {s}* X, int R, int K, int Kp,"
        " long sr, long sk, long b1, long b2, long sb0, long sb1, long sb2, long pz) {\n"
        "    int k = get_global_id(0), r0 = get_global_id(1) * " + str(block) + ";\n"
        "    long z = get_global_id(2), xb = 0;\n"
        "    if (z) {\n"
        "        long i2 = z % b2, q = z / b2, i1 = q % b1, i0 = q / b1;\n"
        "        xb = i0 * sb0 + i1 * sb1 + i2 * sb2;\n"
        "    }\n"
        f"    __global {t}* p = P + z * pz + ((long)r0 * Kp + (long)k * {block});\n"
        "    const __global " + s + "* x = X + xb + (long)r0 * sr + (long)k * sk;\n"
        f"    if (k < K && r0 + {block} <= R) {{\n"
        f"        for (int i = 0; i < {block}; ++i) p[i] = ({t})x[i * sr];\n"
        "    } else {\n"
        f"        for (int i = 0; i < {block}; ++i)\n"
        f"            p[i] = (k < K && r0 + i < R) ? ({t})x[i * sr] : ({t})0;\n"
        "    }\n"
        "}\n"
    )


def gemm_packed_source(dtype: DType, with_c: bool, block: GemmBlock) -> str:
    """Kernel ``gemm_packed``: the product of panels packed by :func:`gemm_pack_source` (A in
    blocks of ``block.rows``, B^T in blocks of ``block.cols``, K padded to ``block.k_unroll``).
    Global (Np / cols, Mp / rows, batch); packed batches are ``pa``/``pb`` elements apart (0 for
    a broadcast operand); ``C`` is read through strides as in :func:`gemm_source`; ``out`` is
    contiguous."""
    t, st = load_type(dtype), STORE_TYPES[dtype]
    rm, rn, w, ku = block.rows, block.cols, block.width, block.k_unroll
    nv = rn // w
    v = f"{t}{w}"
    acc = [(r, c) for r in range(rm) for c in range(nv)]
    lines = [f"    {v} c{r}_{c} = ({v})(0);" for r, c in acc]
    lines.append(f"    {v} av, {', '.join(f'bv{c}' for c in range(nv))};")
    lines.append(f"    for (int k = 0; k < Kp; k += {ku}) {{")
    for u in range(ku):
        lines += [f"        bv{c} = vload{w}(0, bp + {u * rn + c * w});" for c in range(nv)]
        for r in range(rm):
            lines.append(f"        av = ({v})(ap[{u * rm + r}]);")
            # a*b+c, contracted by the compiler into its target's FMA, rather than fma(): PoCL
            # links the fma() of its built-in library for the host's widest ISA, which its
            # code generator may not target (LLVM 14 compiles for znver3 on Zen 4 but links the
            # AVX-512 library: 16-wide fma aborts the compiler, 8-wide runs 3x slower).
            lines += [f"        c{r}_{c} = av * bv{c} + c{r}_{c};" for c in range(nv)]
    lines.append(f"        ap += {rm * ku}; bp += {rn * ku};\n    }}")
    c_arg = f"__global const {st}* C, " if with_c else ""
    c_term = " + beta * C[cb + (long)row * scm + (long)col * scn]" if with_c else ""
    # Whole blocks without C store vectors; edge blocks and C go element by element.
    fast = (
        "    if (!HAS_C && r0 + RM <= M && j0 + RN <= N) {\n"
        + "".join(
            f"        vstore{w}(alpha * c{r}_{c}, 0, o + (long)(r0 + {r}) * N + j0 + {c * w});\n"
            for r, c in acc
        )
        + "        return;\n    }\n"
    )
    slow = f"    {t} lane[{w}];\n" + "".join(
        f"    vstore{w}(c{r}_{c}, 0, lane);\n"
        f"    for (int e = 0; e < {w}; ++e) store(o, C, cb, scm, scn, M, N, r0 + {r},"
        f" j0 + {c * w} + e, lane[e], alpha, beta);\n"
        for r, c in acc
    )
    return (
        pragmas([t, st])
        + f"#define T {t}\n#define RM {rm}\n#define RN {rn}\n#define HAS_C {int(with_c)}\n"
        + f"void store(__global {st}* o, __global const {st}* C, long cb, long scm, long scn,"
        " int M, int N, int row, int col, T acc, T alpha, T beta) {\n"
        f"    if (row < M && col < N) o[(long)row * N + col] = ({st})(alpha * acc{c_term});\n}}\n"
        + f"__kernel void gemm_packed(__global {st}* out, __global const T* Ap,"
        f" __global const T* Bp, {c_arg}int M, int N, int Kp, long pa, long pb,"
        " long scm, long scn, long b1, long b2, long scb0, long scb1, long scb2,"
        " T alpha, T beta) {\n"
        "    int jb = get_global_id(0), ib = get_global_id(1);\n"
        "    long bz = get_global_id(2);\n"
        "    long i2 = bz % b2, q = bz / b2, i1 = q % b1, i0 = q / b1;\n"
        "    long cb = i0 * scb0 + i1 * scb1 + i2 * scb2;\n"
        + ("" if with_c else "    __global const T* C = 0;\n")
        + "    const __global T* ap = Ap + bz * pa + (long)ib * Kp * RM;\n"
        "    const __global T* bp = Bp + bz * pb + (long)jb * Kp * RN;\n"
        + "\n".join(lines)
        + "\n    int r0 = ib * RM, j0 = jb * RN;\n"
        "    __global " + st + "* o = out + bz * M * (long)N;\n" + fast + slow + "}\n"
    )
