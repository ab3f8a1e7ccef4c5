"""What the workers run: one block of one kernel, on the block's NumPy arrays.

Every function here is a task body of the graphs :mod:`accelkit_dask.tensor_kernels` builds. A
block runs accelkit's CPU kernels (:mod:`accelkit.sdk.host`, the bodies the CPU backend runs, with
the CPU JIT, ``accel=h.JIT``, where the CPU backend has it too), so a block's result is the CPU
backend's result on that block: promotion, integer wrapping, F16/BF16 computed in F32 and rounded
once, index errors raised as InvalidArgumentError. Functions
are module-level (they pickle by name: a worker needs accelkit-dask installed) and take their
parameters as arguments. Floating-point warnings are off, as on every accelkit backend.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import numpy as np

from accelkit.sdk import host as h
from accelkit_dask import worker

Array = np.ndarray[Any, Any]
#: Every function taking ``rt`` returns an array of that dtype (the result type; named so as not to
#: collide with the ``dtype`` argument of dask's map_blocks and blockwise).
F = TypeVar("F", bound=Callable[..., Any])

_LOW_KINDS = ("float16", "bfloat16")


def _quiet(fn: F) -> F:
    @wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return typing.cast(F, run)  # wraps keeps fn's signature


def _shape(*operands: Any) -> tuple[int, ...]:
    return np.broadcast_shapes(*(o.shape for o in operands if isinstance(o, np.ndarray)))


def accumulator(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype partial results of ``dtype`` are kept in: F32 for F16/BF16, else itself."""
    return np.dtype(np.float32) if dtype.name in _LOW_KINDS else dtype


# -- elementwise ----------------------------------------------------------------------------------
@_quiet
def unary(x: Array, op: str, rt: np.dtype[Any]) -> Array:
    out = np.empty(x.shape, rt)
    h.unary(op, x, out, accel=h.JIT)
    return out


@_quiet
def binary(a: Any, b: Any, op: str, rt: np.dtype[Any]) -> Array:
    out = np.empty(_shape(a, b), rt)
    h.binary(op, a, b, out)
    return out


@_quiet
def where(cond: Array, a: Any, b: Any, rt: np.dtype[Any]) -> Array:
    out = np.empty(_shape(cond, a, b), rt)
    h.where(cond, a, b, out)
    return out


@_quiet
def cast(x: Array, rt: np.dtype[Any]) -> Array:
    out = np.empty(x.shape, rt)
    h.cast_into(x, out)
    return out


@_quiet
def fill(value: Any, rt: np.dtype[Any], block_info: Any = None) -> Array:
    out = np.empty(block_info[None]["chunk-shape"], rt)
    out.fill(value)
    return out


def zeros(rt: np.dtype[Any], block_info: Any = None) -> Array:
    return np.zeros(block_info[None]["chunk-shape"], rt)


def reinterpret(raw: Array, shape: tuple[int, ...], rt: np.dtype[Any]) -> Array:
    """The bytes of a raw buffer (a flat array of any dtype) read as ``shape`` x ``rt``."""
    data = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    n = int(np.prod(shape, dtype=np.int64)) * rt.itemsize
    if data.size < n:
        data = np.concatenate([data, np.zeros(n - data.size, np.uint8)])
    return data[:n].view(rt).reshape(shape).copy()


# -- reductions: a tree of partial results --------------------------------------------------------
@_quiet
def reduce_chunk(
    x: Array, op: str, acc: np.dtype[Any], axis: tuple[int, ...], keepdims: bool = True
) -> Array:
    """One block's partial ``op`` over ``axis`` (kept as size-1 dims), in ``acc``."""
    shape = tuple(1 if i in axis else n for i, n in enumerate(x.shape))
    out = np.empty(shape, acc)
    if op == "mean":  # the partial of a mean is a sum (divided once at the end)
        np.sum(x.astype(acc, copy=False), axis=axis, keepdims=True, out=out)
    else:
        h.reduce(op, x, axis, True, out)
    return out


_COMBINE: dict[str, Callable[..., Any]] = {
    "sum": np.sum, "mean": np.sum, "prod": np.prod, "max": np.max, "min": np.min,
}  # fmt: skip


@_quiet
def reduce_combine(
    x: Array, op: str, acc: np.dtype[Any], axis: tuple[int, ...], keepdims: bool = True
) -> Array:
    """Partials combined into one partial (integers wrap in ``acc``, as the kernel does)."""
    if op in ("max", "min"):
        return np.asarray(_COMBINE[op](x, axis=axis, keepdims=True))
    return np.asarray(_COMBINE[op](x, axis=axis, keepdims=True, dtype=acc))


@_quiet
def reduce_aggregate(
    x: Array,
    op: str,
    acc: np.dtype[Any],
    rt: np.dtype[Any],
    count: int,
    axis: tuple[int, ...],
    keepdims: bool = False,
) -> Array:
    """The last combination, divided by ``count`` for a mean, stored in the result's dtype."""
    total = reduce_combine(x, op, acc, axis)
    if op == "mean":
        total = total / count
    if not keepdims:
        total = np.squeeze(total, axis=axis)
    out = np.empty(total.shape, rt)
    h.assign(out, np.asarray(total))
    return out


@_quiet
def reduce_whole(x: Array, op: str, axes: tuple[int, ...], keepdims: bool, rt: Any) -> Array:
    """A reduction whose reduced axes are whole in the block (arg-reductions, empty inputs);
    an arg-reduction over every axis of an n-d block indexes the flattened block."""
    if op in ("argmax", "argmin") and len(axes) == x.ndim and x.ndim != 1:
        shape: tuple[int, ...] = (1,) * x.ndim if keepdims else ()
    elif keepdims:
        shape = tuple(1 if i in axes else n for i, n in enumerate(x.shape))
    else:
        shape = tuple(n for i, n in enumerate(x.shape) if i not in axes)
    out = np.empty(shape, rt)
    h.reduce(op, x, axes, keepdims, out)
    return out


# -- linear algebra -------------------------------------------------------------------------------
@_quiet
def gemm(
    a: Array,
    b: Array,
    c: Array | None,
    trans_a: bool,
    trans_b: bool,
    alpha: float,
    beta: float,
    rt: np.dtype[Any],
) -> Array:
    """One output block from a row panel of A and a column panel of B (the reduction over K)."""
    params = {"trans_a": trans_a, "trans_b": trans_b, "alpha": alpha, "beta": beta}
    if a.ndim == 2 and (done := worker.offload("gemm", [a, b, c], params)) is not None:
        return done.astype(rt, copy=False)
    m = a.shape[-1] if trans_a else a.shape[-2]
    n = b.shape[-2] if trans_b else b.shape[-1]
    out = np.empty((*a.shape[:-2], m, n), rt)  # [batch, m, n] for a batched GEMM
    h.gemm(a, b, c, out, trans_a, trans_b, alpha, beta)
    return out


@_quiet
def matmul(a: Array, b: Array, rt: np.dtype[Any], shape: tuple[int, ...] | None = None) -> Array:
    if shape is None and (done := worker.offload("matmul", [a, b], {})) is not None:
        return done.astype(rt, copy=False)
    if shape is None:  # both operands at least 2-d (a vector's result shape is given)
        shape = (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
    out = np.empty(shape, rt)
    h.matmul(a, b, out)
    return out


@_quiet
def linear(x: Array, w: Array, bias: Array | None, rt: np.dtype[Any]) -> Array:
    if (done := worker.offload("linear", [x, w, bias], {})) is not None:
        return done.astype(rt, copy=False)
    out = np.empty((*x.shape[:-1], w.shape[0]), rt)
    h.linear(x, w, bias, out)
    return out


# -- indexing -------------------------------------------------------------------------------------
@_quiet
def gather(x: Array, index: Array, axis: int) -> Array:
    out = np.empty(index.shape, x.dtype)
    h.gather(x, axis, index, out)
    return out


@_quiet
def scatter(x: Array, index: Array, src: Any, axis: int) -> Array:
    out = np.empty(x.shape, x.dtype)
    h.scatter(x, axis, index, src, out)
    return out


@_quiet
def embedding(indices: Array, weight: Array) -> Array:
    out = np.empty((*indices.shape, weight.shape[1]), weight.dtype)
    h.embedding(indices, weight, out)
    return out


# -- neural-network ops ---------------------------------------------------------------------------
@_quiet
def conv2d(
    x: Array,
    w: Array,
    bias: Array | None,
    out_hw: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    groups: int,
    rt: np.dtype[Any],
) -> Array:
    params = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    if (done := worker.offload("conv2d", [x, w, bias], params)) is not None:
        return done.astype(rt, copy=False)
    out = np.empty((x.shape[0], w.shape[0], *out_hw), rt)
    h.conv2d(x, w, bias, out, stride, padding, dilation, groups)
    return out


@_quiet
def attention(
    q: Array,
    k: Array,
    v: Array,
    mask: Array | None,
    scale: float,
    causal: bool,
    rt: np.dtype[Any],
) -> Array:
    params = {"scale": scale, "causal": causal}
    if (done := worker.offload("attention", [q, k, v, mask], params)) is not None:
        return done.astype(rt, copy=False)
    out = np.empty((*q.shape[:3], v.shape[3]), rt)
    h.attention(q, k, v, mask, out, scale, causal, accel=h.JIT)
    return out


@_quiet
def softmax(x: Array, axis: int, log: bool, rt: np.dtype[Any]) -> Array:
    out = np.empty(x.shape, rt)
    h.softmax(x, axis, out, log, accel=h.JIT)
    return out


@_quiet
def layer_norm(
    x: Array, w: Array | None, bias: Array | None, eps: float, rt: np.dtype[Any]
) -> Array:
    out = np.empty(x.shape, rt)
    h.layer_norm(x, w, bias, eps, out, accel=h.JIT)
    return out


@_quiet
def rms_norm(x: Array, w: Array | None, eps: float, rt: np.dtype[Any]) -> Array:
    out = np.empty(x.shape, rt)
    h.rms_norm(x, w, eps, out, accel=h.JIT)
    return out


@_quiet
def cross_entropy_rows(
    logits: Array, targets: Array, which: str, loss_dtype: Any, probs_dtype: Any
) -> Array:
    """Per-row losses (``which="loss"``, in F64 for the tree that sums them) or the
    probabilities (``"probs"``) of a block of rows."""
    loss = np.empty(logits.shape[:1], loss_dtype)
    probs = np.empty(logits.shape, probs_dtype)
    h.cross_entropy(logits, targets, "none", loss, probs)
    return loss.astype(np.float64) if which == "loss" else probs


@_quiet
def adam(
    p: Array,
    g: Array,
    m: Array,
    v: Array,
    which: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    step: int,
    weight_decay: float,
) -> Array:
    """One of Adam's three results (0: the parameter, 1: m, 2: v) for a block."""
    p, m, v = p.copy(), m.copy(), v.copy()
    h.adam_update(p, g, m, v, lr, beta1, beta2, eps, step, weight_decay)
    return (p, m, v)[which]


# -- optional kernels -----------------------------------------------------------------------------
@_quiet
def cumulative(x: Array, op: str, axis: int, exclusive: bool, reverse: bool, rt: Any) -> Array:
    out = np.empty(x.shape, rt)
    h.cumulative(op, x, axis, exclusive, reverse, out)
    return out


@_quiet
def argsort(x: Array, axis: int, descending: bool, rt: Any) -> Array:
    out = np.empty(x.shape, rt)
    h.argsort(x, axis, descending, out)
    return out


@_quiet
def scatter_reduce(x: Array, index: Array, src: Any, op: str, axis: int) -> Array:
    out = np.empty(x.shape, x.dtype)
    h.scatter_reduce(op, x, axis, index, src, out)
    return out


@_quiet
def image(x: Array, kind: str, rt: Any, *taps: Array) -> Array:
    """An image filter on a block of whole NCHW planes: ``depthwise`` (one 2-d kernel),
    ``separable`` (column and row taps) or ``sobel``."""
    out = np.empty(x.shape, rt)
    if kind == "depthwise":
        h.depthwise(x, taps[0], out)
    elif kind == "separable":
        h.separable_filter(x, taps[0], taps[1], out)
    else:
        h.sobel_magnitude(x, out)
    return out


# -- fused graphs ---------------------------------------------------------------------------------
def run_graph(blob: bytes, *deps: Any) -> tuple[tuple[bool, Any], ...]:
    """A whole graph in one task: ``blob`` pickles the graph, the keys to return and the keys
    it reads from the cluster, whose values are ``deps`` (keys travel pickled: as arguments,
    the scheduler would take them for references). A chain of small ops then costs one trip
    through the scheduler instead of one per op.

    The tasks run in dask's order, each once. The result is ``(True, value)`` or
    ``(False, exception)`` per key: a task that raises fails only the results downstream of it.
    """
    import pickle

    from dask._task_spec import DataNode, convert_legacy_graph
    from dask.order import order

    tasks, out_keys, dep_keys = pickle.loads(blob)
    graph = dict(tasks)
    for key, value in zip(dep_keys, deps, strict=True):
        graph[key] = DataNode(key, value)
    graph = convert_legacy_graph(graph)  # literal values as nodes
    priorities = order(graph)
    cache: dict[Any, Any] = {}
    failed: dict[Any, BaseException] = {}
    with np.errstate(all="ignore"):
        for key, node in sorted(graph.items(), key=lambda item: priorities[item[0]]):
            cause = next((failed[d] for d in node.dependencies if d in failed), None)
            if cause is not None:
                failed[key] = cause
                continue
            try:
                cache[key] = node(cache)
            except Exception as exc:
                failed[key] = exc
    return tuple((False, failed[k]) if k in failed else (True, cache[k]) for k in out_keys)


def run_graph_one(blob: bytes, *deps: Any) -> Any:
    """:func:`run_graph` for a graph read for one result: that value (or its exception,
    raised), so that the result is this task's and reading it needs no :func:`pick` task (a
    second trip through the scheduler)."""
    ok, value = run_graph(blob, *deps)[0]
    if not ok:
        raise value
    return value


def pick(results: tuple[tuple[bool, Any], ...], i: int) -> Any:
    """Result ``i`` of :func:`run_graph`, or its exception raised."""
    ok, value = results[i]
    if not ok:
        raise value
    return value


# -- fused KernelOps ------------------------------------------------------------------------------
@_quiet
def silu_mul(gate: Array, up: Array, rt: Any) -> Array:
    out = np.empty(np.broadcast_shapes(gate.shape, up.shape), rt)
    h.silu_mul(gate, up, out)
    return out


@_quiet
def rms_norm_residual(
    x: Array,
    residual: Array,
    w: Array | None,
    eps: float,
    which: int,
    normed_rt: Any,
    summed_rt: Any,
) -> Array:
    """One of the two results (0: normed, 1: summed) for a block of rows."""
    normed = np.empty(x.shape, normed_rt)
    summed = np.empty(x.shape, summed_rt)
    h.rms_norm_residual(x, residual, w, eps, normed, summed, accel=h.JIT)
    return (normed, summed)[which]


@_quiet
def sample_token(
    logits: Array, previous: Array | None, params: Any, shape: tuple[int, ...], rt: Any
) -> Array:
    out = np.empty(shape, rt)
    h.sample_token(logits, previous, params, out)
    return out
