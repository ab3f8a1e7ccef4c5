"""Graph capture on every backend: a small decode step captured once and replayed after its
input changed gives the numbers of the float64 NumPy reference, and a host read inside a capture
is refused (:mod:`accelkit.capture`; the generic replay of recorded kernel calls, or the
backend's own graph)."""

from __future__ import annotations

import numpy as np
import pytest

from accelkit import CaptureError, ComputeBackend, DType

from .checks import assert_close, require_op
from .graphs import decode_reference, decode_step, make_decode_step, tolerance
from .test_attention_options import _attention

pytestmark = pytest.mark.anyio


async def test_a_captured_decode_step_replays_and_refuses_host_reads(
    backend: ComputeBackend,
) -> None:
    step = make_decode_step(backend)
    async with backend.capture() as graph:
        y = decode_step(backend, step)
    tol = tolerance()
    want = decode_reference(step.host, step.host["x"])
    np.testing.assert_allclose(await y.to_host(), want, rtol=tol, atol=tol)
    rng = np.random.default_rng(7)
    for _ in range(2):
        x = rng.standard_normal(step.host["x"].shape).astype(np.float32)
        await graph.write(step.x, x)
        graph.replay()
        got = await y.to_host()
        np.testing.assert_allclose(got, decode_reference(step.host, x), rtol=tol, atol=tol)
    # A host read inside a capture is refused, and the backend stays usable.
    x = backend.tensor_factory.ones((4,), DType.F32)
    with pytest.raises(CaptureError, match="inside a graph capture"):
        async with backend.capture():
            await backend.tensor_ops.add(x, x).to_host()
    np.testing.assert_array_equal(await backend.tensor_ops.add(x, x).to_host(), np.full(4, 2.0))


async def test_a_captured_sequence_major_attention_replays(backend: ComputeBackend) -> None:
    """``attention(..., layout="bshd")`` inside a capture, through TensorOps and KernelOps:
    the in-place kernel where the backend has one (recorded as any kernel call is), else the
    permutes around the head-major kernel; each replay after new queries are written gives
    the reference's numbers."""
    require_op(backend, "attention")
    rng = np.random.default_rng(17)
    heads = (0, 2, 1, 3)
    q_h, k_h, v_h = (
        rng.standard_normal(shape).astype(np.float32)
        for shape in ((2, 5, 4, 8), (2, 6, 2, 8), (2, 6, 2, 8))
    )
    f = backend.tensor_factory
    q, k, v = f.from_host(q_h), f.from_host(k_h), f.from_host(v_h)
    async with backend.capture() as graph:
        a = backend.tensor_ops.attention(q, k, v, causal=True, layout="bshd")
        b = backend.kernel_ops.attention(q, k, v, causal=True, layout="bshd")
    for _ in range(2):
        q_h = rng.standard_normal(q_h.shape).astype(np.float32)
        await graph.write(q, q_h)
        graph.replay()
        want = _attention(
            q_h.transpose(heads), k_h.transpose(heads), v_h.transpose(heads), causal=True
        )[0]
        for got in (a, b):
            assert_close(await got.to_host(), want.transpose(heads), DType.F32, scale=4.0)
