"""Opt-in per-operation fallback: refused ops run elsewhere, are reported and counted."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import accelkit as ak
from accelkit.errors import UnsupportedOperationError

pytestmark = pytest.mark.anyio

pytest.importorskip("accelkit_testplug_subset", reason="the subset test plugin is not installed")


def _qkv(f: ak.TensorFactory) -> tuple[ak.Tensor, ak.Tensor, ak.Tensor]:
    rng = np.random.default_rng(0)
    return tuple(  # type: ignore[return-value]
        f.from_host(rng.standard_normal((1, 2, 5, 4)).astype(np.float32)) for _ in range(3)
    )


def _reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    out: np.ndarray = (p / p.sum(-1, keepdims=True)) @ v
    return out


async def test_without_fallback_the_refusal_is_loud() -> None:
    async with ak.open_backend("subset") as backend:
        q, k, v = _qkv(backend.tensor_factory)
        with pytest.raises(UnsupportedOperationError):
            backend.tensor_ops.attention(q, k, v)
        assert backend.fallback is None


async def test_refused_op_runs_on_the_fallback_and_is_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with ak.open_backend("subset", fallback="cpu") as backend:
        f, ops = backend.tensor_factory, backend.tensor_ops
        q, k, v = _qkv(f)
        with caplog.at_level(logging.WARNING, logger="accelkit.fallback"):
            out = ops.attention(q, k, v)
            out2 = ops.attention(q, k, v)
        # The result is a tensor of the primary backend, and it is right.
        assert out.backend is backend
        want = _reference(q.numpy(), k.numpy(), v.numpy())
        np.testing.assert_allclose(await out.to_host(), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(await out2.to_host(), want, rtol=1e-5, atol=1e-6)
        fb = backend.fallback
        assert fb is not None
        assert fb.counts["attention"] == 2
        assert [e.op for e in fb.events] == ["attention", "attention"]
        assert fb.events[0].backend == "subset"
        assert fb.events[0].fallback == "cpu"
        # Logged once per op, not once per call.
        assert sum("attention runs on cpu" in r.getMessage() for r in caplog.records) == 1


async def test_supported_ops_stay_on_the_primary() -> None:
    async with ak.open_backend("subset", fallback="cpu") as backend:
        f = backend.tensor_factory
        x = f.from_host(np.arange(6, dtype=np.float32))
        y = x + x  # operators route through the same (wrapped) TensorOps
        np.testing.assert_array_equal(await y.to_host(), 2 * np.arange(6, dtype=np.float32))
        assert backend.fallback is not None
        assert not backend.fallback.events


async def test_fallback_needs_an_initialized_other_backend() -> None:
    async with ak.open_backend("cpu") as backend:
        with pytest.raises(ak.InvalidArgumentError):
            backend.enable_fallback(backend)
        spare = ak.create_backend("cpu")
        with pytest.raises(ak.InvalidArgumentError):
            backend.enable_fallback(spare)


async def test_an_in_place_op_on_the_fallback_writes_the_caller_s_tensors() -> None:
    """``adam_update`` (in place on param, m and v) refused and run on the fallback: the
    caller's param, m and v hold the step's result, as on the CPU backend without a fallback
    (the fallback updated its own copies, and the optimizer's state never changed), and the
    result is the caller's param."""
    rng = np.random.default_rng(3)
    start = [rng.standard_normal(8).astype(np.float32) for _ in range(4)]  # param, grad, m, v
    start[3] = np.abs(start[3])

    async def step(backend: ak.ComputeBackend) -> tuple[ak.Tensor, list[ak.Tensor]]:
        p, g, m, v = (backend.tensor_factory.from_host(a) for a in start)
        out = backend.tensor_ops.adam_update(p, g, m, v, lr=0.1, step=3, weight_decay=0.01)
        return out, [p, m, v]

    async with ak.open_backend("cpu") as cpu:
        _, want = await step(cpu)
        expected = [await t.to_host() for t in want]
    async with ak.open_backend("subset", fallback="cpu") as backend:
        out, got = await step(backend)
        assert backend.fallback is not None
        assert backend.fallback.counts["adam_update"] == 1
        assert out is got[0]
        for name, t, e in zip(("param", "m", "v"), got, expected, strict=True):
            assert not np.array_equal(e, start[("param", "grad", "m", "v").index(name)])
            np.testing.assert_array_equal(await t.to_host(), e, err_msg=name)


@pytest.mark.parametrize(
    ("variable", "value"), [("ACCELKIT_BACKEND", "subset"), ("ACCELKIT_DEVICE", "subset:0")]
)
async def test_the_override_settings_choose_the_primary_not_the_fallback(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """ACCELKIT_BACKEND made the fallback a second copy of the primary (which refuses what the
    first refused), and ACCELKIT_DEVICE made opening the fallback fail."""
    monkeypatch.setenv(variable, value)
    async with ak.open_backend(None, fallback="cpu") as backend:
        assert backend.name == "subset"
        fb = backend.fallback
        assert fb is not None
        assert fb.fallback_backend.name == "cpu"
        q, k, v = _qkv(backend.tensor_factory)
        out = backend.tensor_ops.attention(q, k, v)
        want = _reference(q.numpy(), k.numpy(), v.numpy())
        np.testing.assert_allclose(await out.to_host(), want, rtol=1e-5, atol=1e-6)
        assert [e.fallback for e in fb.events] == ["cpu"]
