"""A small transformer-like decode step for the graph-capture tests (the conformance suite's
``test_capture`` and the core's ``tests/test_capture.py``): an RMS norm, a query projection,
attention over a fixed K/V cache, the output projection and the residual add, with its NumPy
reference in float64."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from accelkit.abc.backend import ComputeBackend
from accelkit.tensor import Tensor

__all__ = ["DecodeStep", "decode_reference", "decode_step", "tolerance"]

#: Model width, heads, cache length (small: the suite runs on every backend).
D, H, S = 32, 4, 8


@dataclass
class DecodeStep:
    """The step's tensors: ``x`` (the input a replay reads) and its weights and cache."""

    x: Tensor
    norm: Tensor
    wq: Tensor
    wo: Tensor
    k: Tensor
    v: Tensor
    host: dict[str, np.ndarray[Any, Any]]


def make_decode_step(backend: ComputeBackend, seed: int = 0) -> DecodeStep:
    """The step's tensors on ``backend``, from a seeded generator (F32)."""
    rng = np.random.default_rng(seed)
    host = {
        "x": rng.standard_normal((1, D)),
        "norm": rng.uniform(0.5, 1.5, D),
        "wq": rng.standard_normal((D, D)) / np.sqrt(D),
        "wo": rng.standard_normal((D, D)) / np.sqrt(D),
        "k": rng.standard_normal((1, H, S, D // H)),
        "v": rng.standard_normal((1, H, S, D // H)),
    }
    host = {k: v.astype(np.float32) for k, v in host.items()}
    f = backend.tensor_factory
    return DecodeStep(**{k: f.from_host(v) for k, v in host.items()}, host=host)


def decode_step(backend: ComputeBackend, t: DecodeStep) -> Tensor:
    """Submit one step: ``x + attention(rms_norm(x) @ wq, k, v) @ wo``."""
    ops, kops = backend.tensor_ops, backend.kernel_ops
    h = kops.rms_norm(t.x, t.norm, 1e-6)
    q = ops.reshape(ops.matmul(h, t.wq), (1, H, 1, D // H))
    a = kops.attention(q, t.k, t.v)
    o = ops.matmul(ops.reshape(a, (1, D)), t.wo)
    return ops.add(t.x, o)


def decode_reference(host: dict[str, np.ndarray[Any, Any]], x: np.ndarray[Any, Any]) -> Any:
    """The step in float64 NumPy for the input ``x``."""
    x = x.astype(np.float64)
    h = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6) * host["norm"]
    q = (h @ host["wq"]).reshape(1, H, 1, D // H)
    s = q @ np.swapaxes(host["k"].astype(np.float64), -1, -2) / np.sqrt(D // H)
    p = np.exp(s - s.max(-1, keepdims=True))
    a = (p / p.sum(-1, keepdims=True)) @ host["v"]
    return x + a.reshape(1, D) @ host["wo"]


def tolerance() -> float:
    """F32 rounding over the step's sums (D terms each, a few ops deep): 64 * D * eps."""
    return float(64 * D * np.finfo(np.float32).eps)
