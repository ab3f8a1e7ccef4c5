"""Graph capture on every backend: a small decode step captured once and replayed after its
input changed gives the numbers of the float64 NumPy reference, and a host read inside a capture
is refused (:mod:`accelkit.capture`; the generic replay of recorded kernel calls, or the
backend's own graph)."""

from __future__ import annotations

import numpy as np
import pytest

from accelkit import CaptureError, ComputeBackend, DType

from .graphs import decode_reference, decode_step, make_decode_step, tolerance

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
