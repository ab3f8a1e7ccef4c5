"""A stand-in for NVIDIA's cuDNN frontend (``import cudnn``) over host memory, for the tests.

Enough of the graph API for :mod:`accelkit_cuda.cudnn_attention`: ``pygraph`` records tensors
and the ``sdpa`` node; ``validate`` .. ``build_plans`` record the build steps (``refuse`` makes
``check_support`` fail); ``execute`` reads the variant pack's pointers as host memory (which they
are under ``fake_cupy``) with the described dims and strides and computes the attention in
float64 as cuDNN defines it (a -inf bias row gives NaN, as cuDNN's softmax does), so that what
the plugin hands cuDNN (pointers, layouts, tables, lengths, bias) is checked by the result.
``validate`` applies the real frontend's SDPA validation rules the plugin's graphs can meet
(``_frontend_rules``: a bottom-right causal diagonal beside a bias is refused, as cuDNN 9.19 with
frontend 1.28 refused it on an H100).
"""

from __future__ import annotations

import ctypes
import threading
import types
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

CALLS: list[tuple[str, int]] = []

_DTYPES = {
    "HALF": np.dtype(np.float16), "BFLOAT16": np.dtype(ml_dtypes.bfloat16),
    "FLOAT": np.dtype(np.float32), "INT32": np.dtype(np.int32),
}  # fmt: skip


def _record(name: str) -> None:
    CALLS.append((name, threading.get_ident()))


class Tensor:
    def __init__(self, name: str, dim: list[int], stride: list[int], data_type: str, uid: int):
        self.name, self.dim, self.stride, self.data_type, self.uid = (
            name, list(dim), list(stride), data_type, uid,
        )  # fmt: skip
        self.output = False

    def set_output(self, value: bool) -> Tensor:
        self.output = value
        return self

    def set_dim(self, dim: list[int]) -> Tensor:
        self.dim = list(dim)
        return self

    def set_stride(self, stride: list[int]) -> Tensor:
        self.stride = list(stride)
        return self

    def set_uid(self, uid: int) -> Tensor:
        self.uid = uid
        return self


def _view(ptr: int, t: Tensor, dtype: str | None = None) -> np.ndarray[Any, Any]:
    dt = _DTYPES[dtype or t.data_type]
    extent = 1 + sum((d - 1) * s for d, s in zip(t.dim, t.stride, strict=True))
    buf = (ctypes.c_char * (extent * dt.itemsize)).from_address(ptr)
    return np.ndarray(
        tuple(t.dim), dt, buffer=buf, strides=tuple(s * dt.itemsize for s in t.stride)
    )


def _frontend_rules(graph: pygraph) -> str | None:
    """The SDPA node validation rules of cudnn-frontend (1.2x, ``scaled_dot_product_flash_
    attention.h``) that the plugin's graphs can meet; the real frontend raises at validate()."""
    o = graph.options
    bottom_right = (
        o.get("diagonal_band_right_bound") is not None
        and o.get("diagonal_alignment") == "BOTTOM_RIGHT"
    )
    s_q, s_kv = graph.q.dim[2], graph.k.dim[2]
    if bottom_right and not o.get("use_padding_mask") and s_q > s_kv:
        return "Bottom right causal mask does not support max_s_q > max_s_kv."
    if bottom_right and o.get("bias") is not None:
        return (
            "Bottom right causal mask is only supported with is_bias=False, is_alibi=False,"
            " is_dropout=False."
        )
    if (o.get("generate_stats") is None) == (o.get("is_inference") is None):
        return "Exactly one of {generate_stats, is_inference} must be set"
    return None


def _step(name: str) -> Callable[..., None]:
    def step(self: pygraph, *args: Any) -> None:
        _record(name)
        self.steps.append(name)
        if name == "validate":
            why = _frontend_rules(self)
            if why is not None:
                raise RuntimeError(f"cudnnGraphNotSupportedError: {why}")
        if name == "check_support":
            why = type(self).refuse(self)
            if why is not None:
                raise RuntimeError(f"cudnnGraphNotSupportedError: {why}")

    return step


class pygraph:  # noqa: N801 - the frontend's name
    refuse: Callable[[pygraph], str | None] = staticmethod(lambda g: None)

    def __init__(self, io_data_type: str, intermediate_data_type: str, compute_data_type: str,
                 handle: Any = None) -> None:  # fmt: skip
        self.io = io_data_type
        self.tensors: dict[int, Tensor] = {}
        self.options: dict[str, Any] = {}
        self.steps: list[str] = []
        self.out: Tensor | None = None

    def tensor(
        self, name: str, dim: list[int], stride: list[int], data_type: str, uid: int
    ) -> Tensor:
        t = Tensor(name, dim, stride, data_type, uid)
        self.tensors[uid] = t
        return t

    def sdpa(self, q: Tensor, k: Tensor, v: Tensor, name: str = "", **options: Any) -> list[Any]:
        self.q, self.k, self.v = q, k, v
        self.options = options
        self.out = Tensor("O", [], [], self.io, 0)
        return [self.out, None]

    validate = _step("validate")
    build_operation_graph = _step("build_operation_graph")
    create_execution_plans = _step("create_execution_plans")
    check_support = _step("check_support")
    build_plans = _step("build_plans")

    def get_workspace_size(self) -> int:
        return 1024

    def execute(self, pack: dict[int, int], workspace: Any, handle: Any = None) -> None:
        _record("execute")
        assert self.steps[-1] == "build_plans", self.steps
        assert workspace is not None, "a workspace was asked for"
        assert workspace.nbytes >= self.get_workspace_size()
        assert all(type(p) is int for p in pack.values())  # bare device pointers
        o = self.out
        assert o is not None
        assert o.uid in pack
        q = _view(pack[self.q.uid], self.q).astype(np.float64)
        k = _view(pack[self.k.uid], self.k).astype(np.float64)
        v = _view(pack[self.v.uid], self.v).astype(np.float64)
        scale = self.options["attn_scale"]
        table = self.options.get("paged_attention_k_table")
        if table is not None:
            out = self._paged(pack, q, k, v, scale, table)
        else:
            out = self._dense(pack, q, k, v, scale)
        dst = _view(pack[o.uid], o)
        dst[...] = out.astype(dst.dtype)

    def _dense(self, pack: dict[int, int], q: Any, k: Any, v: Any, scale: float) -> Any:
        _b, h, sq, _ = q.shape
        hk, sk = k.shape[1], k.shape[2]
        kk = np.repeat(k, h // hk, axis=1)
        vv = np.repeat(v, h // hk, axis=1)
        s = np.einsum("bhqd,bhkd->bhqk", q, kk) * scale
        bias = self.options.get("bias")
        if bias is not None:
            s = s + _view(pack[bias.uid], bias).astype(np.float64)
        if self.options.get("diagonal_band_right_bound") == 0:
            shift = 0 if self.options["diagonal_alignment"] == "TOP_LEFT" else sk - sq
            keep = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + shift
            s = np.where(keep, s, -np.inf)
        with np.errstate(invalid="ignore"):
            p = np.exp(s - s.max(-1, keepdims=True))
            p = p / p.sum(-1, keepdims=True)
        return np.einsum("bhqk,bhkd->bhqd", p, vv)

    def _paged(self, pack: dict[int, int], q: Any, k: Any, v: Any, scale: float,
               table_t: Tensor) -> Any:  # fmt: skip
        table = _view(pack[table_t.uid], table_t)
        lens = _view(pack[self.options["seq_len_kv"].uid], self.options["seq_len_kv"])
        b, h, _, d = q.shape
        hk, bs = k.shape[1], k.shape[2]
        out = np.full((b, h, 1, v.shape[3]), np.nan)
        for i in range(b):
            n = int(lens[i, 0, 0, 0])
            rows = [(int(table[i, 0, t // bs, 0]), t % bs) for t in range(n)]
            for j in range(h if n else 0):
                g = j // (h // hk)
                ks = np.array([k[blk, g, r] for blk, r in rows]).reshape(n, d)
                vs = np.array([v[blk, g, r] for blk, r in rows]).reshape(n, -1)
                s = ks @ q[i, j, 0] * scale
                p = np.exp(s - s.max())
                out[i, j, 0] = (p / p.sum()) @ vs
        return out


def install() -> types.ModuleType:
    """A fresh stand-in module (give it to ``load_frontend``'s callers)."""
    cudnn = types.ModuleType("cudnn")
    cudnn.data_type = types.SimpleNamespace(**{n: n for n in _DTYPES})  # type: ignore[attr-defined]
    cudnn.diagonal_alignment = types.SimpleNamespace(  # type: ignore[attr-defined]
        TOP_LEFT="TOP_LEFT", BOTTOM_RIGHT="BOTTOM_RIGHT"
    )
    cudnn.heur_mode = types.SimpleNamespace(A="A", FALLBACK="FALLBACK")  # type: ignore[attr-defined]
    graph = type("pygraph", (pygraph,), {})
    cudnn.pygraph = graph  # type: ignore[attr-defined]

    def create_handle() -> object:
        _record("create_handle")
        return object()

    cudnn.create_handle = create_handle  # type: ignore[attr-defined]
    cudnn.set_stream = lambda handle, stream: _record("set_stream")  # type: ignore[attr-defined]
    cudnn.destroy_handle = lambda handle: _record("destroy_handle")  # type: ignore[attr-defined]
    cudnn.backend_version = lambda: 91501  # type: ignore[attr-defined]
    return cudnn


__all__ = ["CALLS", "install"]
