"""Every kernel's blockwise plan on tensors that span several chunks (4 KiB chunks on a cluster
of two worker processes), against NumPy references; and what the backend says about ops that
must gather a whole tensor into one task."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.testing import assert_allclose as assert_close

from accelkit import ComputeBackend, Tensor
from accelkit.testing import reference as ref
from accelkit.testing.checks import assert_gemm_close

# Kernel checks: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def blocks_of(backend: Any, t: Tensor) -> int:
    return int(backend.tensor_ops.kernels.arr(t).npartitions)


async def test_elementwise_broadcasts_across_chunks(backend: ComputeBackend) -> None:
    a_h = rng().standard_normal((64, 48), dtype=np.float32)
    b_h = rng(1).standard_normal((48,), dtype=np.float32)
    f, ops = backend.tensor_factory, backend.tensor_ops
    a, b = f.from_host(a_h), f.from_host(b_h)
    assert blocks_of(backend, a) > 1
    np.testing.assert_array_equal(await ops.add(a, b).to_host(), a_h + b_h)
    np.testing.assert_array_equal(await ops.mul(a, 2.5).to_host(), a_h * np.float32(2.5))
    np.testing.assert_array_equal(
        await ops.where(ops.gt(a, 0.0), a, b).to_host(), np.where(a_h > 0, a_h, b_h)
    )
    i = f.from_host(np.arange(-40, 40, dtype=np.int8).repeat(40))
    np.testing.assert_array_equal(
        await ops.add(i, 100).to_host(), np.arange(-40, 40, dtype=np.int8).repeat(40) + np.int8(100)
    )


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
async def test_gemm_reduces_over_k_panels(
    backend: ComputeBackend, trans_a: bool, trans_b: bool
) -> None:
    m, k, n = 70, 90, 50
    a_h = rng(2).standard_normal((k, m) if trans_a else (m, k), dtype=np.float32)
    b_h = rng(3).standard_normal((n, k) if trans_b else (k, n), dtype=np.float32)
    c_h = rng(4).standard_normal((n,), dtype=np.float32)
    f = backend.tensor_factory
    a, b, c = f.from_host(a_h), f.from_host(b_h), f.from_host(c_h)
    assert blocks_of(backend, a) > 1
    assert blocks_of(backend, b) > 1
    y = backend.tensor_ops.gemm(a, b, c, trans_a=trans_a, trans_b=trans_b, alpha=0.5, beta=2.0)
    got = await y.to_host()
    a_op, b_op = (a_h.T if trans_a else a_h), (b_h.T if trans_b else b_h)
    assert_gemm_close(got, a_op, b_op, alpha=0.5, add=2.0 * c_h)


async def test_batched_matmul_broadcasts_and_linear_adds_the_bias(
    backend: ComputeBackend,
) -> None:
    a_h = rng(5).standard_normal((3, 1, 40, 30), dtype=np.float32)
    b_h = rng(6).standard_normal((2, 30, 20), dtype=np.float32)
    f, ops = backend.tensor_factory, backend.tensor_ops
    got = await ops.matmul(f.from_host(a_h), f.from_host(b_h)).to_host()
    assert_gemm_close(got, a_h, b_h)
    x_h = rng(7).standard_normal((4, 25, 64), dtype=np.float32)
    w_h = rng(8).standard_normal((48, 64), dtype=np.float32)
    bias_h = rng(9).standard_normal((48,), dtype=np.float32)
    got = await ops.linear(f.from_host(x_h), f.from_host(w_h), f.from_host(bias_h)).to_host()
    assert_gemm_close(got, x_h, w_h.T, add=bias_h)
    v = await ops.matmul(f.from_host(a_h[0, 0]), f.from_host(b_h[0, :, 0].copy())).to_host()
    assert_gemm_close(v, a_h[0, 0], b_h[0, :, 0])


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("axis", [0, 1, (0, 1), None])
async def test_reductions_are_trees(backend: Any, op: str, axis: Any) -> None:
    x_h = rng(10).uniform(0.5, 1.5, (96, 40)).astype(np.float32)
    x = backend.tensor_factory.from_host(x_h)
    assert blocks_of(backend, x) > 2
    got = await getattr(backend.tensor_ops, op)(x, axis=axis).to_host()
    want = getattr(np, "amax" if op == "max" else "amin" if op == "min" else op)(
        x_h.astype(np.float64), axis=axis
    )
    assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert not backend.plans  # no reduction gathered a whole tensor


async def test_integer_sums_wrap_like_the_kernel_and_arg_reductions(backend: Any) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    big = np.full((64, 64), 2**62, np.int64)  # partial sums overflow: they wrap, as NumPy's do
    got = await ops.sum(f.from_host(big), axis=0).to_host()
    np.testing.assert_array_equal(got, big.sum(axis=0))
    x_h = rng(11).standard_normal((96, 40), dtype=np.float32)
    x = f.from_host(x_h)
    np.testing.assert_array_equal(await ops.argmax(x, axis=0).to_host(), x_h.argmax(axis=0))
    assert not backend.plans
    np.testing.assert_array_equal(await ops.argmin(x).to_host(), x_h.argmin())
    assert backend.last_plan.gathered
    assert backend.last_plan.op == "argmin"


async def test_row_ops_keep_their_axis_whole(backend: ComputeBackend) -> None:
    x_h = rng(12).standard_normal((80, 72), dtype=np.float32)
    w_h = rng(13).standard_normal((72,), dtype=np.float32)
    b_h = rng(14).standard_normal((72,), dtype=np.float32)
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.from_host(x_h)
    assert_close(await ops.softmax(x, axis=0).to_host(), ref.softmax(x_h, 0), rtol=1e-5, atol=1e-6)
    got = await ops.layer_norm(x, f.from_host(w_h), f.from_host(b_h)).to_host()
    assert_close(got, ref.layer_norm(x_h, w_h, b_h, 1e-5), rtol=1e-4, atol=1e-5)
    got = await backend.kernel_ops.rms_norm(x, f.from_host(w_h)).to_host()
    assert_close(got, ref.rms_norm(x_h, w_h, 1e-6), rtol=1e-4, atol=1e-5)
    targets_h = rng(15).integers(0, 72, 80)
    loss, probs = ops.cross_entropy(x, f.from_host(targets_h))
    want_loss, want_probs = ref.cross_entropy(x_h, targets_h, "mean")
    assert_close(await loss.to_host(), want_loss, rtol=1e-5, atol=1e-6)
    assert_close(await probs.to_host(), want_probs, rtol=1e-5, atol=1e-6)


async def test_attention_splits_over_batch_and_kv_head_groups(backend: ComputeBackend) -> None:
    q_h = rng(16).standard_normal((2, 4, 24, 16), dtype=np.float32)
    k_h = rng(17).standard_normal((2, 2, 32, 16), dtype=np.float32)
    v_h = rng(18).standard_normal((2, 2, 32, 8), dtype=np.float32)
    mask_h = np.where(rng(19).random((24, 32)) < 0.2, -np.inf, 0.0).astype(np.float32)
    f = backend.tensor_factory
    q, k, v = f.from_host(q_h), f.from_host(k_h), f.from_host(v_h)
    for causal in (False, True):
        got = await backend.tensor_ops.attention(
            q, k, v, causal=causal, mask=f.from_host(mask_h)
        ).to_host()
        want = ref.attention(q_h, k_h, v_h, causal=causal, mask=mask_h)
        assert_close(got, want, rtol=1e-4, atol=1e-5)


async def test_conv2d_per_block_of_images(backend: ComputeBackend) -> None:
    x_h = rng(20).standard_normal((6, 3, 12, 12), dtype=np.float32)
    w_h = rng(21).standard_normal((4, 3, 3, 3), dtype=np.float32)
    b_h = rng(22).standard_normal((4,), dtype=np.float32)
    f = backend.tensor_factory
    got = await backend.tensor_ops.conv2d(
        f.from_host(x_h), f.from_host(w_h), f.from_host(b_h), stride=2, padding=1
    ).to_host()
    assert_close(got, ref.conv2d(x_h, w_h, b_h, (2, 2), (1, 1)), rtol=1e-4, atol=1e-4)


async def test_indexing_by_blocks_of_indices(backend: Any) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    w_h = rng(23).standard_normal((50, 40), dtype=np.float32)
    idx_h = rng(24).integers(0, 50, (30, 20))
    got = await ops.embedding(f.from_host(idx_h), f.from_host(w_h)).to_host()
    np.testing.assert_array_equal(got, w_h[idx_h])
    x_h = rng(25).standard_normal((60, 40), dtype=np.float32)
    gidx_h = rng(26).integers(-60, 60, (50, 30))
    got = await ops.gather(f.from_host(x_h), 0, f.from_host(gidx_h)).to_host()
    np.testing.assert_array_equal(got, np.take_along_axis(x_h[:, :30], gidx_h % 60, 0))
    assert not backend.plans
    flipped = await ops.flip(f.from_host(x_h), 0).to_host()  # dask's take: no gathering
    np.testing.assert_array_equal(flipped, x_h[::-1])
    s = ops.scatter(f.from_host(x_h), 0, f.from_host(np.zeros((1, 40), np.int64)), 7.0)
    want = x_h.copy()
    want[0] = 7.0
    np.testing.assert_array_equal(await s.to_host(), want)
    assert backend.last_plan.op == "scatter"
    assert backend.last_plan.gathered


async def test_views_large_transfers_and_scans(backend: Any) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    big_h = rng(27).standard_normal((600, 700), dtype=np.float32)  # > 1 MiB: scattered
    big = f.from_host(big_h)
    np.testing.assert_array_equal(
        await ops.reshape(big, (700, 600)).to_host(), big_h.reshape(700, 600)
    )
    np.testing.assert_array_equal(await big.to_host(), big_h)
    assert_close(
        await ops.cumsum(big, axis=1).to_host(), np.cumsum(big_h, 1, dtype=np.float64),
        rtol=1e-4, atol=1e-3,
    )  # fmt: skip
    s = f.from_host(np.float32(3.5))
    assert float(await ops.mul(s, 2.0).to_host()) == 7.0


async def test_long_chains_are_flushed_without_a_read(backend: Any) -> None:
    graphs = backend.graphs
    x = backend.tensor_factory.from_host(np.zeros((16, 16), np.float32))
    before = graphs.flushes
    ys = [backend.tensor_ops.add(x, float(i)) for i in range(300)]  # all alive: all pending
    await backend.default_stream.synchronize()  # the graphs were built (no flush of its own)
    assert graphs.flushes > before  # sent on their own, every FLUSH_EVERY writes
    np.testing.assert_array_equal(await ys[-1].to_host(), np.full((16, 16), 299.0, np.float32))


async def test_reading_a_lone_small_op_runs_one_task(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read of one small pending op sends one task: the op's own pending array and the
    array read are the same keys, persisted once (as two arrays they cost the fused path a
    task per array to pick its result out, a trip through the scheduler each)."""
    from accelkit_dask import blocks

    client = backend.graphs.client
    sent: list[str] = []
    submit = client.submit

    def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(fn.__name__)
        return submit(fn, *args, **kwargs)

    monkeypatch.setattr(client, "submit", counted)
    x_h = rng(30).standard_normal((8, 8), dtype=np.float32)
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.from_host(x_h)  # a literal (in the graphs that read it)
    np.testing.assert_array_equal(await ops.mul(ops.add(x, 1.0), 3.0).to_host(), (x_h + 1) * 3)
    assert sent == [blocks.run_graph_one.__name__]
    sent.clear()
    y, z = ops.add(x, 2.0), ops.mul(x, 4.0)  # two pending results, then one read: the fused
    np.testing.assert_array_equal(await z.to_host(), x_h * 4)  # task, and a pick for each
    assert sent.count(blocks.pick.__name__) == 2
    np.testing.assert_array_equal(await y.to_host(), x_h + 2)


async def test_batched_gemm_keeps_the_batch_as_a_blockwise_index(backend: Any) -> None:
    a_h = rng(28).standard_normal((6, 30, 40), dtype=np.float32)
    b_h = rng(29).standard_normal((6, 30, 20), dtype=np.float32)
    f = backend.tensor_factory
    a, b = f.from_host(a_h), f.from_host(b_h)
    assert blocks_of(backend, a) > 1
    got = await backend.tensor_ops.batched_gemm(a, b, trans_a=True, alpha=2.0).to_host()
    assert_gemm_close(got, np.swapaxes(a_h, 1, 2), b_h, alpha=2.0)
