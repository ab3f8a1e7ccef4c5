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

__all__ = ["VEC_NN", "VEC_NT", "gemm_source", "gemm_vec_source"]

#: Register blocks of the vector GEMMs: (rows, columns) per work-item, and the vector width.
VEC_NN = (4, 16)
VEC_NT = (4, 4, 8)


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


def gemm_vec_source(dtype: DType, with_c: bool, nt: bool) -> str:
    """Kernel ``gemm`` with the same arguments as :func:`gemm_source`, for one float dtype and
    contiguous rows, without local memory or barriers (PoCL runs those as loops and they cost
    more than they save on a CPU device; these are ~10x faster there than the tiled kernel).

    NN (``B`` rows contiguous along N): each work-item accumulates 4 rows x 16 columns as
    vectors along N; global (N/16, M/4, batch). NT (``A`` and ``B^T`` rows contiguous along K,
    as ``linear`` has them): 4 x 4 outputs, each a vector of 8 along K summed at the end;
    global (N/4, M/4, batch). The caller checks divisibility and strides.
    """
    t = load_type(dtype)
    st = STORE_TYPES[dtype]
    params = [
        f"__global {st}* out", f"__global const {st}* A", f"__global const {st}* B",
        *([f"__global const {st}* C"] if with_c else []),
        "int M", "int N", "int K",
        "long sam", "long sak", "long sbk", "long sbn", "long scm", "long scn",
        "long b1", "long b2",
        "long sab0", "long sab1", "long sab2", "long sbb0", "long sbb1", "long sbb2",
        "long scb0", "long scb1", "long scb2",
        "T alpha", "T beta",
    ]  # fmt: skip
    c_term = "v += beta * C[cb + (long)row * scm + (long)col * scn];" if with_c else ""
    head = (
        pragmas([t, st])
        + f"#define T {t}\n"
        + f"void store_out(__global {st}* out, __global const {st}* C, long cb, long scm,"
        " long scn, long bz, int M, int N, int row, int col, T acc, T alpha, T beta) {\n"
        f"    T v = alpha * acc; {c_term}\n"
        "    out[(bz * M + row) * (long)N + col] = v;\n}\n"
    )
    if with_c:
        store = "store_out(out, C, cb, scm, scn, bz, M, N, {row}, {col}, {acc}, alpha, beta);"
    else:
        store = "store_out(out, 0, cb, scm, scn, bz, M, N, {row}, {col}, {acc}, alpha, beta);"
    batch = """
    long bz = get_global_id(2);
    long i2 = bz % b2, q = bz / b2, i1 = q % b1, i0 = q / b1;
    long ab = i0 * sab0 + i1 * sab1 + i2 * sab2;
    long bb = i0 * sbb0 + i1 * sbb1 + i2 * sbb2;
    long cb = i0 * scb0 + i1 * scb1 + i2 * scb2;
"""
    if not nt:
        rm, rn = VEC_NN
        v = f"{t}{rn}"
        body = f"""
    int j0 = get_global_id(0) * {rn}, r0 = get_global_id(1) * {rm};{batch}
    {v} acc[{rm}];
    for (int r = 0; r < {rm}; ++r) acc[r] = ({v})(0);
    for (int k = 0; k < K; ++k) {{
        {v} bv = vload{rn}(0, B + bb + (long)k * sbk + j0);
        for (int r = 0; r < {rm}; ++r)
            acc[r] = mad(({v})(A[ab + (long)(r0 + r) * sam + (long)k * sak]), bv, acc[r]);
    }}
    T lane[{rn}];
    for (int r = 0; r < {rm}; ++r) {{
        vstore{rn}(acc[r], 0, lane);
        for (int c = 0; c < {rn}; ++c) {store.format(row="r0 + r", col="j0 + c", acc="lane[c]")}
    }}
"""
    else:
        rm, rn, w = VEC_NT
        v = f"{t}{w}"
        body = f"""
    int j0 = get_global_id(0) * {rn}, r0 = get_global_id(1) * {rm};{batch}
    {v} acc[{rm}][{rn}];
    for (int r = 0; r < {rm}; ++r) for (int c = 0; c < {rn}; ++c) acc[r][c] = ({v})(0);
    for (int k = 0; k < K; k += {w}) {{
        {v} av[{rm}];
        for (int r = 0; r < {rm}; ++r) av[r] = vload{w}(0, A + ab + (long)(r0 + r) * sam + k);
        for (int c = 0; c < {rn}; ++c) {{
            {v} bv = vload{w}(0, B + bb + (long)(j0 + c) * sbn + k);
            for (int r = 0; r < {rm}; ++r) acc[r][c] = mad(av[r], bv, acc[r][c]);
        }}
    }}
    for (int r = 0; r < {rm}; ++r) for (int c = 0; c < {rn}; ++c) {{
        {t}4 s4 = acc[r][c].lo + acc[r][c].hi;
        {t}2 s2 = s4.lo + s4.hi;
        {store.format(row="r0 + r", col="j0 + c", acc="(s2.x + s2.y)")}
    }}
"""
    return head + f"__kernel void gemm({', '.join(params)}) {{" + body + "}\n"
