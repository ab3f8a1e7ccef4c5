"""Training kernels: softmax cross-entropy and the AdamW step.

``cross_entropy`` is two kernels. The first runs one work-group per row (a work-group tree for
the row's maximum and sum, as in ``opencl_reduction``), writes the row's probabilities and its
loss in the compute type; the second, one work-group, sums the row losses into the 0-d loss for
"mean" and "sum". A target outside ``0..C-1`` is never clamped: its row's loss is NaN and the
first such target is recorded in an error record (``[flag, value]`` as two longs), which the
host reads back to report it.

``adam_update`` is one elementwise kernel updating ``param``, ``m`` and ``v`` in place.
"""

from __future__ import annotations

from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError
from accelkit_opencl.opencl_reduction import _tree
from accelkit_opencl.opencl_types import STORE_TYPES, load_type, pragmas

__all__ = ["adam_source", "cross_entropy_rows_source", "loss_reduce_source", "target_error"]


def cross_entropy_rows_source(dtype: DType, target: DType, wg: int) -> str:
    """Kernel ``ce_rows(probs, rows, err, logits, targets, c)``: one work-group per row of
    ``c`` logits; ``rows`` receives the row losses in the compute type."""
    t = load_type(dtype)
    s = STORE_TYPES[dtype]
    tt = STORE_TYPES[target]
    signed = target.is_signed
    below = "tg < 0 || " if signed else ""
    return (
        pragmas([t, s])
        + f"#define WG {wg}\n#define T {t}\n#define S {s}\n"
        + "__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void ce_rows("
        f"__global S* probs, __global T* rows, __global long* err, __global const S* logits,"
        f" __global const {tt}* targets, long c) {{\n"
        "    long g = get_group_id(0); int lid = get_local_id(0);\n"
        "    __global const S* row = logits + g * c;\n"
        "    __local T scratch[WG];\n"
        "    T m = -INFINITY;\n"
        "    for (long i = lid; i < c; i += WG) { T x = (T)row[i]; m = (x > m || x != x) ? x : m; }\n"
        + _tree("m", "((u > w || u != u) ? u : w)", "mx")
        + "    T sum = 0;\n"
        "    for (long i = lid; i < c; i += WG) sum += exp((T)row[i] - mx);\n"
        + _tree("sum", "u + w", "total")
        + "    for (long i = lid; i < c; i += WG) probs[g * c + i] = (S)(exp((T)row[i] - mx) / total);\n"
        "    if (lid == 0) {\n"
        f"        {tt} tg = targets[g];\n"
        f"        if ({below}(ulong)tg >= (ulong)c) {{\n"
        "            rows[g] = NAN;\n"
        "            if (atomic_cmpxchg((volatile __global int*)err, 0, 1) == 0) err[1] = (long)tg;\n"
        "        } else {\n"
        "            rows[g] = -(((T)row[tg] - mx) - log(total));\n"
        "        }\n"
        "    }\n"
        "}\n"
    )


def loss_reduce_source(dtype: DType, mean: bool, wg: int) -> str:
    """Kernel ``loss_reduce(loss, rows, n)``: one work-group sums ``n`` row losses (the mean of
    no rows is NaN, their sum 0)."""
    t = load_type(dtype)
    s = STORE_TYPES[dtype]
    final = "total / (T)n" if mean else "total"
    return (
        pragmas([t, s])
        + f"#define WG {wg}\n#define T {t}\n"
        + "__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void loss_reduce("
        f"__global {s}* loss, __global const T* rows, long n) {{\n"
        "    int lid = get_local_id(0);\n"
        "    __local T scratch[WG];\n"
        "    T acc = 0;\n"
        "    for (long i = lid; i < n; i += WG) acc += rows[i];\n"
        + _tree("acc", "u + w", "total")
        + f"    if (lid == 0) loss[0] = ({s})({final});\n"
        "}\n"
    )


def adam_source(dtype: DType, decay: bool) -> str:
    """Kernel ``adam(param, grad, m, v, n, lr, beta1, beta2, eps, bc1, bc2, weight_decay)``:
    one work-item per element; ``bc1``, ``bc2`` are the bias corrections ``1 - beta^step``."""
    t = load_type(dtype)
    s = STORE_TYPES[dtype]
    decay_line = "        u += weight_decay * p;\n" if decay else ""
    return (
        pragmas([t, s]) + f"#define T {t}\n#define S {s}\n"
        "__kernel void adam(__global S* param, __global const S* grad, __global S* m,"
        " __global S* v, long n, T lr, T beta1, T beta2, T eps, T bc1, T bc2,"
        " T weight_decay) {\n"
        "    long i = get_global_id(0);\n"
        "    if (i < n) {\n"
        "        T p = (T)param[i], g = (T)grad[i];\n"
        "        T mi = beta1 * (T)m[i] + ((T)1 - beta1) * g;\n"
        "        T vi = beta2 * (T)v[i] + ((T)1 - beta2) * g * g;\n"
        "        T u = (mi / bc1) / (sqrt(vi / bc2) + eps);\n"
        + decay_line
        + "        param[i] = (S)(p - lr * u);\n"
        "        m[i] = (S)mi;\n"
        "        v[i] = (S)vi;\n"
        "    }\n"
        "}\n"
    )


def target_error(classes: int, value: int) -> InvalidArgumentError:
    """The error a target outside ``0..classes-1`` is reported with."""
    return InvalidArgumentError(f"cross_entropy: targets must lie in 0..{classes - 1}; got {value}")
