"""Normalisation and losses: batch_norm (inference, and training with running statistics
updated in place), group_norm, instance_norm, layer_norm/rms_norm with their statistics,
cross_entropy with class weights, ignore_index and label smoothing, mse_loss and
binary_cross_entropy_with_logits, against float64 NumPy formulas written here."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from accelkit import ComputeBackend, DType
from accelkit.errors import AccelError

from .checks import assert_close, fetch, ids, require_dtype, require_op, sample

# A kernel check: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]

Array = np.ndarray[Any, Any]
FLOATS = [DType.F32, DType.F64, DType.F16, DType.BF16]


def _normalise(x: Array, axes: tuple[int, ...], eps: float) -> tuple[Array, Array, Array]:
    x = x.astype(np.float64)
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    return (x - mean) * rstd, mean, rstd


def _channel(v: Array, ndim: int) -> Array:
    return v.astype(np.float64).reshape((1, -1) + (1,) * (ndim - 2))


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
async def test_batch_norm_inference(backend: ComputeBackend, dtype: DType) -> None:
    require_op(backend, "batch_norm")
    require_dtype(backend, dtype)
    x_h = sample((4, 6, 5, 3), dtype, seed=61)
    rm, rv = sample((6,), dtype, seed=62), sample((6,), dtype, low=0.5, high=2.0, seed=63)
    w, b = sample((6,), dtype, seed=64), sample((6,), dtype, seed=65)
    f = backend.tensor_factory
    got = backend.tensor_ops.batch_norm(
        f.from_host(x_h), f.from_host(rm), f.from_host(rv), f.from_host(w), f.from_host(b),
        eps=1e-3,
    )  # fmt: skip
    want = (x_h - _channel(rm, 4)) / np.sqrt(_channel(rv, 4) + 1e-3) * _channel(w, 4) + _channel(
        b, 4
    )
    assert_close(await fetch(got, dtype), want, dtype, scale=4.0)


@pytest.mark.parametrize("dtype", [DType.F32, DType.F64], ids=ids([DType.F32, DType.F64]))
async def test_batch_norm_training_updates_running_statistics(
    backend: ComputeBackend, dtype: DType
) -> None:
    require_op(backend, "batch_norm")
    require_dtype(backend, dtype)
    x_h = sample((4, 3, 7), dtype, seed=66)
    rm, rv = sample((3,), dtype, seed=67), sample((3,), dtype, low=0.5, high=2.0, seed=68)
    f = backend.tensor_factory
    t_rm, t_rv = f.from_host(rm), f.from_host(rv)
    got = backend.tensor_ops.batch_norm(f.from_host(x_h), t_rm, t_rv, training=True, momentum=0.25)
    normed, mean, _ = _normalise(x_h, (0, 2), 1e-5)
    assert_close(await fetch(got, dtype), normed, dtype, scale=4.0)
    count = 4 * 7
    unbiased = x_h.astype(np.float64).var(axis=(0, 2), ddof=1)
    assert_close(await fetch(t_rm), 0.75 * rm + 0.25 * mean.reshape(3), dtype, scale=4.0)
    assert_close(await fetch(t_rv), 0.75 * rv + 0.25 * unbiased, dtype, scale=4.0)
    assert count > 1
    # Without running statistics, training uses the batch's and touches nothing else.
    again = backend.tensor_ops.batch_norm(f.from_host(x_h), training=True)
    assert_close(await fetch(again), normed, dtype, scale=4.0)


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
async def test_group_and_instance_norm(backend: ComputeBackend, dtype: DType) -> None:
    require_op(backend, "group_norm", "instance_norm")
    require_dtype(backend, dtype)
    x_h = sample((2, 6, 4, 5), dtype, seed=69)
    w, b = sample((6,), dtype, seed=70), sample((6,), dtype, seed=71)
    f, ops = backend.tensor_factory, backend.tensor_ops
    for groups in (1, 2, 3, 6):
        got = ops.group_norm(f.from_host(x_h), groups, f.from_host(w), f.from_host(b), eps=1e-4)
        grouped, _, _ = _normalise(x_h.reshape(2, groups, -1), (2,), 1e-4)
        want = grouped.reshape(x_h.shape) * _channel(w, 4) + _channel(b, 4)
        assert_close(await fetch(got, dtype), want, dtype, scale=4.0)
    per_channel, _, _ = _normalise(x_h, (2, 3), 1e-5)
    assert_close(
        await fetch(ops.instance_norm(f.from_host(x_h)), dtype), per_channel, dtype, scale=4.0
    )


async def test_row_norms_of_an_empty_last_axis_are_empty(backend: ComputeBackend) -> None:
    """[5, 0] normalises to [5, 0], on every route (the CPU's NumPy kernels raised "cannot
    reshape array of size 0 into shape (0)" at the await)."""
    x = backend.tensor_factory.zeros((5, 0))
    ops, kops = backend.tensor_ops, backend.kernel_ops
    results = [ops.layer_norm(x), ops.rms_norm(x)]
    if kops is not None:
        results += [kops.layer_norm(x), kops.rms_norm(x), *kops.rms_norm_residual(x, x)]
    for got in results:
        assert (await fetch(got)).shape == (5, 0)


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
async def test_row_norms_return_their_statistics(backend: ComputeBackend, dtype: DType) -> None:
    require_op(backend, "layer_norm_with_stats", "rms_norm_with_stats")
    require_dtype(backend, dtype)
    x_h = sample((3, 4, 16), dtype, seed=72)
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.from_host(x_h)
    out, mean, rstd = ops.layer_norm_with_stats(x, eps=1e-5)
    normed, m, r = _normalise(x_h, (2,), 1e-5)
    stat_dtype = DType.F64 if dtype is DType.F64 else DType.F32
    assert mean.dtype is stat_dtype
    assert rstd.dtype is stat_dtype
    assert_close(await fetch(out, dtype), normed, dtype, scale=4.0)
    assert_close(await fetch(mean), m[..., 0], stat_dtype, scale=4.0)
    assert_close(await fetch(rstd), r[..., 0], stat_dtype, scale=4.0)
    out, rstd = ops.rms_norm_with_stats(x, eps=1e-6)
    x64 = x_h.astype(np.float64)
    r_rms = 1.0 / np.sqrt((x64**2).mean(axis=-1) + 1e-6)
    assert_close(await fetch(out, dtype), x64 * r_rms[..., None], dtype, scale=4.0)
    assert_close(await fetch(rstd, stat_dtype), r_rms, stat_dtype, scale=4.0)


def _cross_entropy(
    logits: Array, targets: Array, weight: Array | None, ignore: int | None, eps: float,
    reduction: str,
) -> Array:  # fmt: skip
    """PyTorch's definition, from its documentation."""
    z = logits.astype(np.float64)
    logp = z - z.max(axis=1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(axis=1, keepdims=True))
    n, c = z.shape
    w = np.ones(c) if weight is None else weight.astype(np.float64)
    valid = np.ones(n, bool) if ignore is None else targets != ignore
    t = np.where(valid, targets, 0)
    nll = -logp[np.arange(n), t] * w[t] * valid
    smooth = -(logp * w).sum(axis=1) * valid
    loss = (1 - eps) * nll + eps / c * smooth
    if reduction == "none":
        return np.asarray(loss)
    if reduction == "sum":
        return np.asarray(loss.sum())
    return np.asarray(loss.sum() / (w[t] * valid).sum())


CE_OPTIONS: list[dict[str, Any]] = [
    {"weight": True}, {"ignore_index": -100}, {"label_smoothing": 0.1},
    {"weight": True, "ignore_index": 2, "label_smoothing": 0.3},
]  # fmt: skip


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("options", range(len(CE_OPTIONS)))
async def test_cross_entropy_options(backend: ComputeBackend, reduction: str, options: int) -> None:
    require_op(backend, "cross_entropy")
    opts = dict(CE_OPTIONS[options])
    logits_h = sample((9, 5), DType.F32, low=-4, high=4, seed=73)
    targets_h = np.array([0, 4, 2, -100, 1, 3, 3, 2, 0], np.int64)
    if opts.get("ignore_index") != -100:
        targets_h = np.abs(targets_h) % 5
    weight_h = sample((5,), DType.F32, low=0.5, high=2.0, seed=74)
    f = backend.tensor_factory
    if opts.pop("weight", False):
        opts["weight"] = f.from_host(weight_h)
    loss, probs = backend.tensor_ops.cross_entropy(
        f.from_host(logits_h), f.from_host(targets_h), reduction, **opts
    )
    want = _cross_entropy(
        logits_h, targets_h, weight_h if "weight" in opts else None, opts.get("ignore_index"),
        opts.get("label_smoothing", 0.0), reduction,
    )  # fmt: skip
    assert_close(await fetch(loss, DType.F32), want, DType.F32, scale=4.0)
    e = np.exp(logits_h.astype(np.float64) - logits_h.max(axis=1, keepdims=True))
    assert_close(await fetch(probs), e / e.sum(axis=1, keepdims=True), DType.F32, scale=4.0)


async def test_cross_entropy_with_every_target_ignored_is_nan(backend: ComputeBackend) -> None:
    require_op(backend, "cross_entropy")
    f = backend.tensor_factory
    loss, _ = backend.tensor_ops.cross_entropy(
        f.ones((2, 3)), f.from_host(np.array([-1, -1])), ignore_index=-1
    )
    assert np.isnan(await fetch(loss))


async def test_cross_entropy_reports_a_target_out_of_range(backend: ComputeBackend) -> None:
    require_op(backend, "cross_entropy")
    f = backend.tensor_factory
    loss, _ = backend.tensor_ops.cross_entropy(
        f.ones((2, 3)), f.from_host(np.array([0, 3])), label_smoothing=0.1
    )
    with pytest.raises(AccelError):
        await loss.to_host()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
async def test_mse_and_bce_with_logits(
    backend: ComputeBackend, reduction: str, dtype: DType
) -> None:
    require_op(backend, "mse_loss", "binary_cross_entropy_with_logits")
    require_dtype(backend, dtype)
    a = sample((3, 4), dtype, low=-8, high=8, seed=75)
    y = sample((3, 4), dtype, low=0, high=1, seed=76)
    w = sample((4,), dtype, low=0, high=2, seed=77)
    pw = sample((4,), dtype, low=0.5, high=3, seed=78)
    f, ops = backend.tensor_factory, backend.tensor_ops

    def reduce(v: Array) -> Array:
        return np.asarray(v.mean() if reduction == "mean" else v.sum() if reduction == "sum" else v)

    a64, y64 = a.astype(np.float64), y.astype(np.float64)
    got = ops.mse_loss(f.from_host(a), f.from_host(y), reduction)
    assert_close(await fetch(got, dtype), reduce((a64 - y64) ** 2), dtype, scale=4.0)
    log_sig = -np.log1p(np.exp(-a64))
    log_one_minus = -np.log1p(np.exp(a64))
    bce = -(pw.astype(np.float64) * y64 * log_sig + (1 - y64) * log_one_minus) * w
    got = ops.binary_cross_entropy_with_logits(
        f.from_host(a), f.from_host(y), f.from_host(w), f.from_host(pw), reduction
    )
    assert_close(await fetch(got, dtype), reduce(bce), dtype, scale=8.0)


BAD_CALLS: list[tuple[str, Any, str]] = [
    ("batch_norm", lambda o, t: o.batch_norm(t["x"]), "needs running_mean"),
    ("batch_norm", lambda o, t: o.batch_norm(t["x"], t["c4"], None, training=True), "together"),
    ("batch_norm", lambda o, t: o.batch_norm(t["x"], t["c3"], t["c3"]), r"must be \[4\]"),
    ("batch_norm", lambda o, t: o.batch_norm(t["x"], training=True, momentum=2.0), "momentum"),
    ("group_norm", lambda o, t: o.group_norm(t["x"], 3), "divide"),
    ("group_norm", lambda o, t: o.group_norm(t["i"], 2), "floating"),
    ("instance_norm", lambda o, t: o.instance_norm(t["row"]), r"\[N, C, \.\.\.\]"),
    ("cross_entropy", lambda o, t: o.cross_entropy(t["l"], t["tg"], weight=t["c3"]), r"must be \[4\]"),
    ("cross_entropy", lambda o, t: o.cross_entropy(t["l"], t["tg"], label_smoothing=1.5), "label_smoothing"),
    ("mse_loss", lambda o, t: o.mse_loss(t["x"], t["l"]), "same shape"),
    ("mse_loss", lambda o, t: o.mse_loss(t["l"], t["l"], "avg"), "reduction"),
    ("binary_cross_entropy_with_logits",
     lambda o, t: o.binary_cross_entropy_with_logits(t["l"], t["l"], pos_weight=t["c3"]), "broadcast"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("op", "call", "message"), BAD_CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)]
)
async def test_bad_arguments_are_refused_before_allocating(
    backend: ComputeBackend, op: str, call: Any, message: str
) -> None:
    require_op(backend, op)
    f = backend.tensor_factory
    inputs = {
        "x": f.ones((2, 4, 3)), "c4": f.ones((4,)), "c3": f.ones((3,)), "i": f.ones((2, 4, 3), "i32"),
        "row": f.ones((5,)), "l": f.ones((2, 4)), "tg": f.zeros((2,), "i64"),
    }  # fmt: skip
    await backend.synchronize()
    used = backend.memory_manager.memory_info().used
    with pytest.raises(AccelError, match=message):
        call(backend.tensor_ops, inputs)
    assert backend.memory_manager.memory_info().used == used
