"""sample_token's two routes on the CUDA backend without a GPU, over the stand-in for CuPy
(``fake_cupy``, which runs the Philox kernels' NumPy port, and whose ``cupy.random`` generator,
the fallback without NVRTC, is NumPy's PCG64 in place of CuPy's XORWOW): the fused route must
draw its Gumbel noise from the same device generator, with the same seed, shape and dtype, as
the composition's ``tensor_factory.uniform`` (the H100's conformance run: the fused route drew
NumPy's ``default_rng(seed).uniform`` on the host, and the routes disagreed), and draw it on the
submission thread."""

from __future__ import annotations

import threading
from typing import Any

import fake_cupy
import numpy as np
import pytest
import test_offloop
from test_offloop import Plugin, _open

from accelkit.testing import test_special_values as special

pytestmark = pytest.mark.anyio

plugin = test_offloop.plugin


@pytest.mark.parametrize("philox", [True, False], ids=["philox", "no-nvrtc"])
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"top_k": 20}, {"top_p": 0.9, "temperature": 0.7}, {"top_k": 50, "top_p": 0.8}],
    ids=["plain", "top_k", "top_p", "both"],
)
async def test_fused_and_composed_sampling_agree_for_a_seed(
    plugin: Plugin, kwargs: dict[str, Any], philox: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelkit_cuda.philox import PhiloxProgram

    if not philox:  # as if NVRTC were missing: CuPy's generator draws on both routes
        monkeypatch.setattr(PhiloxProgram, "function", lambda *a: None)
    drawn_by = "launch philox_uniform_f32_f32" if philox else "random.Generator.random"
    backend = await _open(plugin)
    try:
        rng = np.random.default_rng(8)
        logits = backend.tensor_factory.from_host(
            (rng.standard_normal((6, 300)) * 2).astype(np.float32)
        )
        fused = backend.kernel_ops.twin()
        composed = backend.kernel_ops.twin("composed")
        await backend.synchronize()
        fake_cupy.CALLS.clear()
        a = fused.sample_token(logits, seed=11, **kwargs)
        assert fused.last_route is not None
        assert fused.last_route.route == "fused"
        a_host = await a.to_host()
        # The fused route's own draw: on the device generator, on the submission thread.
        draws = [ident for name, ident in fake_cupy.CALLS if name == drawn_by]
        b = composed.sample_token(logits, seed=11, **kwargs)
        assert composed.last_route is not None
        assert composed.last_route.route == "composed"
        b_host = await b.to_host()
        again = await fused.sample_token(logits, seed=11, **kwargs).to_host()
        other = await fused.sample_token(logits, seed=12, **kwargs).to_host()
    finally:
        await backend.shutdown()
    assert a_host.tolist() == b_host.tolist() == again.tolist()
    assert other.tolist() != a_host.tolist()  # the seed matters (6 rows of 300: not by chance)
    assert len(draws) == 1
    assert threading.get_ident() not in draws


@pytest.mark.parametrize("route", ["fused", "composed"])
@pytest.mark.parametrize("options", list(special.SAMPLING), ids=list(special.SAMPLING))
async def test_sampling_outside_its_precondition_over_the_stand_in(
    plugin: Plugin, options: str, route: str
) -> None:
    """The conformance suite's special-values rule for sample_token (the first NaN, else the
    first +inf, 0 for a row of only -inf), on both routes: the fused route's top-k and top-p
    masks dropped a NaN or +inf to -inf (CuPy's arithmetic is NumPy's, which the stand-in runs;
    the GPU check runs the same test on the device)."""
    backend = await _open(plugin)
    try:
        await special.test_sampling_outside_its_precondition(backend, options, route)
    finally:
        await backend.shutdown()
