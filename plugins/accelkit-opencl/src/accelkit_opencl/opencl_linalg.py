"""The GEMM kernel behind gemm, batched_gemm, matmul and linear.

``out[b] = alpha * A[b] B[b] + beta * C[b]`` with every operand read through element strides,
so transposes, broadcast batch dimensions, a broadcast ``C`` and ``linear``'s ``W^T`` need no
copies. Tiled: each work-group stages TS x TS tiles of A and B in local memory; each work-item
accumulates a WPT x WPT register block of the output (register blocking cuts the local-memory
traffic per multiply-add by WPT).
"""

from __future__ import annotations

from accelkit.dtype import DType
from accelkit_opencl.opencl_types import STORE_TYPES, load_type, pragmas

__all__ = ["gemm_source"]


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
