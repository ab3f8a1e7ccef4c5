"""Attention through cuDNN's fused SDPA engine, where NVIDIA's cuDNN frontend is installed.

``pip install 'accelkit-cuda[cuda13,cudnn13]'`` (or ``[cuda12,cudnn12]``; ``[cudnn]`` where a cuDNN
library is installed already) brings ``nvidia-cudnn-frontend`` (import name ``cudnn``; its Python
graph API takes raw device pointers and a stream pointer, so CuPy arrays serve) and the cuDNN
library. Where they are present, on compute capability 8.0 and up, the CUDA
backend's fused ``attention`` and ``paged_attention`` run cuDNN's flash-attention engine for:

- f16 and bf16 (f32 and f64 stay on the NVRTC kernel: cuDNN's SDPA has no f32 path);
- no mask, ``causal`` (aligned to the last key, as the contract says; a causal call with more
  queries than keys is left to the other routes, which give its key-less queries zeros), a BOOL
  ``mask`` (materialised as an additive bias, 0 or the dtype's lowest, of its broadcast batch and
  head extent; a query that sees no key gets zeros, as the contract says), or
  both (with more keys than queries the causal condition is folded into the bias: cuDNN's
  frontend refuses its bottom-right diagonal beside a bias); a float mask is left to the
  other routes;
- grouped KV heads (cuDNN takes fewer K/V heads natively);
- ``paged_attention`` through cuDNN's paged K/V tables (the cache read in place: the block table
  is cuDNN's page table, ``context_lens`` its per-sequence KV length).

One graph is built per :class:`GraphKey` (the op, dtype, shapes, mask kind and scale: every
tensor is contiguous, so the shapes are the layout) and kept for the backend's life. Building costs
milliseconds of host time and more (cuDNN's heuristics, plan finalisation), so it never runs on the
event loop nor in a submission: the first call of a key queues the build on the device's
submission thread and runs on the NVRTC kernel (or the composition) meanwhile; every later call of
that key, once built, runs on cuDNN. A key cuDNN refuses (``check_support`` or plan building
fails) is remembered with the reason and never built again.

Every call records which engine served it (:class:`EngineRoute`, in ``last_route`` and counted in
``routes``, logged at debug level on the ``accelkit.cuda`` logger), beside KernelOps's own
fused/composed record; ``backend.capabilities.extra["attention_engine"]`` says which engine serves
attention on the device (``"cudnn"`` or ``"nvrtc"``) and ``["attention_engine_note"]`` why.
``ACCELKIT_CUDA_CUDNN=0`` turns the cuDNN route off.

The library: the frontend finds ``libcudnn.so.9`` on ``LD_LIBRARY_PATH``, in its own site-packages
``nvidia/cudnn/lib`` or through the dynamic linker; :func:`load_frontend` first loads it from any
installed ``nvidia-cudnn-cu12``/``-cu13`` package (e.g. the one PyTorch installs; or the one
PyTorch loaded already), so a frontend installed elsewhere (a ``--target`` folder) finds it too.

Unverified on a GPU as written: the graph descriptions are tested without a device (with the real
frontend's graph objects where it is installed), the builds and launches only by the GPU check.
"""

from __future__ import annotations

import ctypes
import glob
import importlib
import importlib.util
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from accelkit.dtype import DType
from accelkit.sdk import env_str
from accelkit_cuda.flash_attention import stored_shape

if TYPE_CHECKING:
    from accelkit.tensor import Tensor
    from accelkit_cuda.fused_kernels import CUDAAttentionKernels

__all__ = [
    "MIN_CUDNN_VERSION",
    "CudnnAttention",
    "EngineRoute",
    "GraphKey",
    "attention_key",
    "causal_in_graph",
    "describe",
    "frontend_status",
    "load_frontend",
    "paged_key",
    "refusal",
]

log = logging.getLogger("accelkit.cuda")

#: The oldest cuDNN library the route uses (SDPA with paged K/V tables and bottom-right
#: diagonal alignment: 9.5.0). The ``cudnn`` extra pins 9.15.1 or newer.
MIN_CUDNN_VERSION = 90500
#: The widest head the route hands to cuDNN (its SDPA engines take up to 256 on sm90; it
#: refuses, through check_support, what it cannot run).
MAX_HEAD_DIM = 256

MaskKind = Literal["none", "causal", "bool", "bool+causal"]

# Variant-pack uids of the graphs' tensors (fixed, so a call fills the pack without lookups).
UID_Q, UID_K, UID_V, UID_O, UID_BIAS = 1, 2, 3, 4, 5
UID_TABLE_K, UID_TABLE_V, UID_SEQ_Q, UID_SEQ_KV = 6, 7, 8, 9

_DATA_TYPE = {DType.F16: "HALF", DType.BF16: "BFLOAT16"}
#: The bias of a masked position: the dtype's lowest finite value rather than -inf, so that no
#: tile of cuDNN's online softmax meets -inf - (-inf); with scores in F32 its weight is exactly
#: 0 wherever a row has a visible key, and rows without one are set to zeros afterwards.
_MASKED = {DType.F16: -65504.0, DType.BF16: -3.3895313892515355e38}


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineRoute:
    """Which engine served one fused attention call, and why: ``engine`` is ``"cudnn"`` (cuDNN's
    SDPA graph), ``"flash2"`` (the backend's tensor-core NVRTC kernel,
    :mod:`accelkit_cuda.flash_attention`), ``"simt"`` (its register-tiled f32 kernel,
    :mod:`accelkit_cuda.flash_simt`) or ``"warp"`` (its warp-per-row NVRTC kernel);
    ``reason`` says why cuDNN (and the tensor-core kernel) did not serve it where they did not."""

    op: str
    engine: str
    reason: str


@dataclass(frozen=True, slots=True)
class GraphKey:
    """What one cuDNN graph is built for. Tensors are contiguous, so shapes (and ``seq_major``)
    are the layout.

    ``attention``: q, k, v head-major ([B, H, Sq, D], [B, Hk, Sk, D], [B, Hk, Sk, Dv]), stored so
    or, with ``seq_major``, as [B, Sq, H, D] etc. (``attention_bshd``: cuDNN reads them in
    place through the strides); ``bias`` the extent of the materialised mask ([1|B, 1|H, Sq, Sk])
    or None. ``paged_attention``: q [B, H, D],
    k and v the caches [blocks, block_size, Hk, D], ``table`` the block table's [B, max_blocks].
    """

    op: Literal["attention", "paged_attention"]
    dtype: DType
    q: tuple[int, ...]
    k: tuple[int, ...]
    v: tuple[int, ...]
    mask: MaskKind
    scale: float
    bias: tuple[int, ...] | None = None
    table: tuple[int, ...] | None = None
    seq_major: bool = False


def _pad4(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (1,) * (4 - len(shape)) + tuple(shape)


def attention_key(
    q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...], dtype: DType,
    mask: tuple[int, ...] | None, causal: bool, scale: float, seq_major: bool = False,
) -> GraphKey:  # fmt: skip
    """The key of a dense attention call (head-major shapes, whatever ``seq_major`` says of
    the storage); ``mask`` is a BOOL mask's shape (or None)."""
    bias = None
    if mask is not None:
        m = _pad4(mask)
        bias = (q[0] if m[0] != 1 else 1, q[1] if m[1] != 1 else 1, q[2], k[2])
    kind: MaskKind = (
        ("bool+causal" if causal else "bool") if mask is not None else
        ("causal" if causal else "none")
    )  # fmt: skip
    return GraphKey(
        "attention", dtype, tuple(q), tuple(k), tuple(v), kind, float(scale), bias,
        seq_major=seq_major,
    )  # fmt: skip


def paged_key(
    q: tuple[int, ...], k_cache: tuple[int, ...], v_cache: tuple[int, ...],
    table: tuple[int, ...], dtype: DType, scale: float,
) -> GraphKey:  # fmt: skip
    """The key of a paged decode call."""
    return GraphKey(
        "paged_attention", dtype, tuple(q), tuple(k_cache), tuple(v_cache), "none", float(scale),
        table=tuple(table),
    )  # fmt: skip


def refusal(key: GraphKey) -> str | None:
    """Why cuDNN is not asked to build ``key`` (None: ask it; check_support has the last word)."""
    if key.dtype not in _DATA_TYPE:
        return f"cuDNN's SDPA takes f16 and bf16, not {key.dtype.value}"
    d, dv = key.q[-1], key.v[-1]
    if d % 8 or dv % 8 or not 0 < d <= MAX_HEAD_DIM or not 0 < dv <= MAX_HEAD_DIM:
        return f"head dims {d}/{dv}: cuDNN's SDPA takes multiples of 8 up to {MAX_HEAD_DIM}"
    if key.op == "attention":
        b, h, sq, _ = key.q
        sk = key.k[2]
        if b * h * sq == 0 or sk == 0:
            return "empty input"
        if "causal" in key.mask and sq > sk:
            return "a causal call with more queries than keys (its first queries see no key)"
    else:
        b, h, _ = key.q
        nb, bs = key.k[:2]
        assert key.table is not None
        if b * h == 0 or nb == 0 or bs == 0 or key.table[1] == 0:
            return "empty input"
    return None


def causal_in_graph(key: GraphKey) -> bool:
    """Whether the graph of ``key`` carries the causal mask itself (cuDNN's diagonal band).

    cuDNN's frontend refuses a bottom-right diagonal together with a bias ("Bottom right causal
    mask is only supported with is_bias=False", its SDPA node's validation): a causal call with
    a BOOL mask and more keys than queries has the causal condition folded into the bias
    instead (the bias is [.., Sq, Sk] anyway). Square calls keep the top-left band with the
    bias, so cuDNN still skips the tiles above the diagonal."""
    if "causal" not in key.mask:
        return False
    return key.bias is None or key.q[2] == key.k[2]


def _strides(shape: tuple[int, ...], seq_major: bool = False) -> list[int]:
    """Strides of a contiguous ``shape``; with ``seq_major``, of a head-major [B, H, S, D]
    stored [B, S, H, D]."""
    if seq_major:
        _, h, s, d = shape
        return [s * h * d, d, h * d, 1]
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def describe(cudnn: Any, key: GraphKey, handle: Any = None) -> Any:
    """The cuDNN graph of ``key`` (a ``cudnn.pygraph``, described but not built: no device
    needed). Tensors carry the fixed uids ``UID_*``."""
    dt = getattr(cudnn.data_type, _DATA_TYPE[key.dtype])
    f32 = cudnn.data_type.FLOAT
    graph = cudnn.pygraph(
        io_data_type=dt, intermediate_data_type=f32, compute_data_type=f32, handle=handle
    )

    def tensor(
        name: str, uid: int, dim: tuple[int, ...], stride: list[int], dtype: Any = dt
    ) -> Any:
        return graph.tensor(name=name, dim=list(dim), stride=stride, data_type=dtype, uid=uid)

    options: dict[str, Any] = {"generate_stats": False, "attn_scale": key.scale}
    if key.op == "attention":
        b, h, sq, _ = key.q
        sk = key.k[2]
        major = key.seq_major
        q = tensor("q", UID_Q, key.q, _strides(key.q, major))
        k = tensor("k", UID_K, key.k, _strides(key.k, major))
        v = tensor("v", UID_V, key.v, _strides(key.v, major))
        out_dim = (b, h, sq, key.v[3])
        out_stride = _strides(out_dim, major)
        if key.bias is not None:
            options["bias"] = tensor("bias", UID_BIAS, key.bias, _strides(key.bias))
        if causal_in_graph(key):
            # Query i sees keys j <= i + Sk - Sq (bottom-right); the same as top-left at Sq == Sk.
            options["diagonal_alignment"] = (
                cudnn.diagonal_alignment.TOP_LEFT if sq == sk
                else cudnn.diagonal_alignment.BOTTOM_RIGHT
            )  # fmt: skip
            options["diagonal_band_right_bound"] = 0
    else:
        b, h, d = key.q
        nb, bs, hk, dk = key.k
        dv = key.v[3]
        assert key.table is not None
        mb = key.table[1]
        # q [B, H, D] as [B, H, 1, D]; the caches [blocks, block_size, Hk, D] read in place as
        # cuDNN's containers [blocks, Hk, block_size, D].
        q = tensor("q", UID_Q, (b, h, 1, d), [h * d, d, d, 1])
        k = tensor("k", UID_K, (nb, hk, bs, dk), [bs * hk * dk, dk, hk * dk, 1])
        v = tensor("v", UID_V, (nb, hk, bs, dv), [bs * hk * dv, dv, hk * dv, 1])
        out_dim = (b, h, 1, dv)
        out_stride = [h * dv, dv, dv, 1]
        i32 = cudnn.data_type.INT32
        table = (b, 1, mb, 1)
        one = (b, 1, 1, 1)
        options.update(
            use_padding_mask=True,
            seq_len_q=tensor("seq_len_q", UID_SEQ_Q, one, [1, 1, 1, 1], i32),
            seq_len_kv=tensor("seq_len_kv", UID_SEQ_KV, one, [1, 1, 1, 1], i32),
            paged_attention_k_table=tensor("table_k", UID_TABLE_K, table, [mb, mb, 1, 1], i32),
            paged_attention_v_table=tensor("table_v", UID_TABLE_V, table, [mb, mb, 1, 1], i32),
            paged_attention_max_seq_len_kv=mb * bs,
        )
    o, _stats = graph.sdpa(q, k, v, name="sdpa", **options)
    o.set_output(True).set_dim(list(out_dim)).set_stride(out_stride).set_uid(UID_O)
    return graph


@dataclass
class _Built:
    graph: Any
    workspace: int


# -- loading the frontend -----------------------------------------------------------------------------
def _preload_library() -> None:
    """Load ``libcudnn.so.9`` from an installed nvidia-cudnn package (PyTorch's, say), so the
    frontend's own search finds it loaded whatever folder the frontend was installed in."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return
    for folder in spec.submodule_search_locations:
        # nvidia/cudnn/lib (nvidia-cudnn-cu12 and -cu13), or a per-CUDA folder (nvidia/cu13/lib).
        found = glob.glob(os.path.join(folder, "cudnn", "lib", "libcudnn.so.*[0-9]"))
        found += glob.glob(os.path.join(folder, "cu[0-9]*", "lib", "libcudnn.so.*[0-9]"))
        for lib in found:
            try:
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
            except OSError as exc:
                log.debug("cannot load %s: %s", lib, exc)
                continue
            return


def frontend_status() -> str | None:
    """None where the cuDNN route may be tried (the frontend is installed and not turned off);
    else why not. Cheap: no import (the probe uses it)."""
    value = (env_str("ACCELKIT_CUDA_CUDNN") or "1").lower()
    if value in ("0", "false", "no", "off"):
        return "turned off (ACCELKIT_CUDA_CUDNN=0)"
    if importlib.util.find_spec("cudnn") is None:
        return (
            "nvidia-cudnn-frontend is not installed (pip install 'accelkit-cuda[cuda13,cudnn13]',"
            " or [cuda12,cudnn12])"
        )
    return None


def load_frontend() -> tuple[Any, str | None]:
    """Import the frontend and check its cuDNN library: ``(module, None)``, or ``(None, why
    not)``. Blocking (it loads the library): call it off the event loop."""
    why = frontend_status()
    if why is not None:
        return None, why
    try:
        _preload_library()
        cudnn = importlib.import_module("cudnn")
        version = int(cudnn.backend_version())
    except Exception as exc:
        return None, f"the cuDNN library could not be loaded: {exc}"
    if version < MIN_CUDNN_VERSION:
        return None, f"cuDNN {version} is older than {MIN_CUDNN_VERSION} (9.5.0)"
    return cudnn, None


# -- the engine ----------------------------------------------------------------------------------------
class CudnnAttention:
    """One backend's cuDNN attention: the graph cache, the handle and the engine records.

    ``schedule`` queues a job on the device's submission thread (where builds and launches run,
    the handle's one thread); ``compute_capability`` is the device's.
    """

    def __init__(
        self, frontend: Any, unavailable: str | None, compute_capability: tuple[int, int],
        schedule: Callable[[Callable[[], None]], None],
    ) -> None:  # fmt: skip
        if frontend is not None and compute_capability < (8, 0):
            frontend, unavailable = None, "cuDNN's SDPA needs compute capability 8.0 or newer"
        self.frontend = frontend
        #: Why cuDNN serves no attention here (None where it may).
        self.unavailable = unavailable if frontend is None else None
        self._schedule = schedule
        self._handle: Any = None
        self._lock = threading.Lock()
        #: Built graphs, and the reasons of refused keys (a key is in one of the three at most).
        self._built: dict[GraphKey, _Built] = {}
        self._refused: dict[GraphKey, str] = {}
        self._pending: set[GraphKey] = set()
        #: The engine of the most recent fused attention call (None before the first).
        self.last_route: EngineRoute | None = None
        #: Calls per op and engine: ``{"attention": {"cudnn": 3, "flash2": 1}}``.
        self.routes: dict[str, dict[str, int]] = {}
        #: Graphs built (the cache's size; each key is built once at most).
        self.builds = 0
        #: False routes every call to the NVRTC kernels (built graphs are kept): for
        #: comparisons such as ``benchmarks/bench_cuda_flash.py``.
        self.enabled = True

    @property
    def engine(self) -> str:
        """``"cudnn"`` where cuDNN serves attention, else ``"nvrtc"``."""
        return "nvrtc" if self.frontend is None else "cudnn"

    def record(self, op: str, engine: str, reason: str) -> None:
        """Note the engine of one call (see the module docstring)."""
        self.last_route = EngineRoute(op=op, engine=engine, reason=reason)
        counts = self.routes.setdefault(op, {})
        counts[engine] = counts.get(engine, 0) + 1
        log.debug("%s: %s (%s)", op, engine, reason)

    def state(self, key: GraphKey) -> str:
        """``"built"``, ``"refused"``, ``"pending"`` or ``"new"`` (tests and diagnostics)."""
        with self._lock:
            if key in self._built:
                return "built"
            if key in self._refused:
                return "refused"
            return "pending" if key in self._pending else "new"

    def reason(self, key: GraphKey) -> str | None:
        """Why ``key`` was refused (None if it was not)."""
        with self._lock:
            return self._refused.get(key)

    def lookup(self, key: GraphKey) -> _Built | str:
        """The built graph of ``key``, or why it cannot serve this call (its build queued when
        the key is new). Runs on the caller's thread and makes no CUDA call."""
        if self.frontend is None:
            return f"cuDNN unavailable: {self.unavailable}"
        if not self.enabled:
            return "cuDNN is switched off for this backend (enabled = False)"
        with self._lock:
            built = self._built.get(key)
            if built is not None:
                return built
            why = self._refused.get(key)
            if why is not None:
                return f"cuDNN refused this shape: {why}"
            if key in self._pending:
                return "its cuDNN graph is being built"
            why = refusal(key)
            if why is not None:
                self._refused[key] = why
                return f"cuDNN refused this shape: {why}"
            self._pending.add(key)
        self._schedule(lambda: self._build(key))
        return "its cuDNN graph is being built (queued now)"

    def handle(self) -> Any:
        """The cuDNN handle (made on first use, on the submission thread)."""
        if self._handle is None:
            self._handle = self.frontend.create_handle()
        return self._handle

    def _build(self, key: GraphKey) -> None:
        """On the submission thread: build ``key``'s graph, or note why cuDNN refuses it."""
        cudnn = self.frontend
        try:
            graph = describe(cudnn, key, self.handle())
            graph.validate()
            graph.build_operation_graph()
            graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            graph.check_support()
            graph.build_plans()
            built = _Built(graph, int(graph.get_workspace_size()))
        except Exception as exc:  # cudnnGraphNotSupportedError, or a failure to build
            why = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            with self._lock:
                self._pending.discard(key)
                self._refused[key] = why
            log.info("cuDNN refused %s: %s", key, why)
            return
        with self._lock:
            self._pending.discard(key)
            self._built[key] = built
            self.builds += 1

    def close(self) -> Callable[[], None] | None:
        """A job that destroys the handle (for the submission thread), or None."""
        handle, self._handle = self._handle, None
        self._built.clear()
        cudnn = self.frontend
        if handle is None or cudnn is None:
            return None

        def destroy() -> None:
            try:
                cudnn.destroy_handle(handle)
            except Exception as exc:  # pragma: no cover - teardown
                log.debug("destroying the cuDNN handle failed: %s", exc)

        return destroy

    # -- the ops ----------------------------------------------------------------------------------
    def attention(
        self, kernels: CUDAAttentionKernels, q: Tensor, k: Tensor, v: Tensor,
        mask: Tensor | None, out: Tensor, scale: float, causal: bool, seq_major: bool = False,
    ) -> str | None:  # fmt: skip
        """Submit the call on cuDNN and return None, or return why cuDNN does not serve it
        (nothing submitted). Records the engine when it serves. ``seq_major``: q, k, v and
        out are stored [B, S, H, D] (``attention_bshd``), read in place."""
        if mask is not None and mask.dtype is not DType.BOOL:
            return "cuDNN is given BOOL masks only (a float mask runs elsewhere)"
        qs, ks, vs = (stored_shape(t.shape, seq_major) for t in (q, k, v))
        key = attention_key(
            qs, ks, vs, q.dtype, None if mask is None else mask.shape, causal, scale, seq_major
        )
        found = self.lookup(key)
        if isinstance(found, str):
            return found
        stream = kernels.current_stream  # its CuPy stream is read on the thread
        launch = _dense_launch(self, found, key, q, k, v, mask, out, stream)
        kernels.launch(launch, (q, k, v, mask), (out,), what="cuDNN attention")
        layout = ", sequence-major" if seq_major else ""
        self.record(
            "attention", "cudnn", f"cuDNN SDPA graph ({key.dtype.value}, {key.mask}{layout})"
        )
        return None

    def paged_attention(
        self, kernels: CUDAAttentionKernels, q: Tensor, k_cache: Tensor, v_cache: Tensor,
        block_table: Tensor, context_lens: Tensor, scale: float, out: Tensor,
        error: Callable[[int, int], BaseException],
    ) -> str | None:  # fmt: skip
        """As :meth:`attention`, for paged decode; bad table entries or lengths raise
        ``error(code, value)`` at the await (code 1: a length, 2: a block id), as the NVRTC
        kernel's do, and are clamped for cuDNN so that it never reads outside the cache."""
        key = paged_key(q.shape, k_cache.shape, v_cache.shape, block_table.shape, q.dtype, scale)
        found = self.lookup(key)
        if isinstance(found, str):
            return found
        stream = kernels.current_stream  # its CuPy stream is read on the thread
        run = _paged_launch(
            self, found, key, q, k_cache, v_cache, block_table, context_lens, out, stream
        )
        kernels._launch_checked(
            run, (q, k_cache, v_cache, block_table, context_lens), (out,), error
        )
        self.record("paged_attention", "cudnn", f"cuDNN paged SDPA graph ({key.dtype.value})")
        return None


def _execute(engine: CudnnAttention, built: _Built, pack: dict[int, int], stream: int) -> None:
    """On the submission thread: run ``built`` on ``stream`` (a pointer)."""
    import cupy as cp

    handle = engine.handle()
    engine.frontend.set_stream(handle, stream)
    # A stream-ordered temporary of CuPy's pool (alive until the work is done); handed over as
    # the array, so the frontend reads its size too. Operands are bare pointers: the frontend
    # lends them the graph's own dims and strides, the cheapest form it takes.
    workspace = cp.empty(built.workspace, cp.uint8) if built.workspace else None
    built.graph.execute(pack, workspace, handle=handle)


def _dense_launch(
    engine: CudnnAttention, built: _Built, key: GraphKey, q: Tensor, k: Tensor, v: Tensor,
    mask: Tensor | None, out: Tensor, stream: Any,
) -> Callable[[], None]:  # fmt: skip
    from accelkit_cuda.submit import storage

    def run() -> None:
        import cupy as cp

        o = storage(out)
        pack = {
            UID_Q: storage(q).data.ptr, UID_K: storage(k).data.ptr, UID_V: storage(v).data.ptr,
            UID_O: o.data.ptr,
        }  # fmt: skip
        if mask is not None:
            assert key.bias is not None
            b, h, sq, sk = key.q[0], key.q[1], key.q[2], key.k[2]
            m = storage(mask).reshape(_pad4(mask.shape))
            keep = cp.broadcast_to(m, (key.bias[0], key.bias[1], sq, sk))
            # A stream-ordered temporary (CuPy's pool), alive until the work is done.
            masked = cp.float32(_MASKED[key.dtype])
            if "causal" in key.mask:
                tri = cp.arange(sk)[None, :] <= cp.arange(sq)[:, None] + (sk - sq)
                keep = keep & tri
            # The bias carries the causal condition too where the graph does not (see
            # causal_in_graph); where it does, the two agree.
            bias = cp.where(keep, cp.float32(0), masked).astype(o.dtype)
            pack[UID_BIAS] = bias.data.ptr
            # A query that sees no key gets zeros (the contract); cuDNN gives NaN there.
            visible = keep.any(axis=-1)[..., None]
            _execute(engine, built, pack, stream.cp.ptr)
            seen = cp.broadcast_to(visible, (b, h, sq, 1))
            if key.seq_major:  # out is stored [B, Sq, H, Dv]
                seen = seen.transpose(0, 2, 1, 3)
            cp.copyto(o, cp.where(seen, o.astype(cp.float32), cp.float32(0)).astype(o.dtype))
            return
        _execute(engine, built, pack, stream.cp.ptr)

    return run


def _paged_launch(
    engine: CudnnAttention, built: _Built, key: GraphKey, q: Tensor, k_cache: Tensor,
    v_cache: Tensor, block_table: Tensor, context_lens: Tensor, out: Tensor, stream: Any,
) -> Callable[[], Any]:  # fmt: skip
    from accelkit_cuda.submit import storage

    def run() -> Any:
        import cupy as cp

        assert key.table is not None
        b, mb = key.table
        nb, bs = key.k[:2]
        lens = storage(context_lens).astype(cp.int64).reshape(b)
        table = storage(block_table).astype(cp.int64).reshape(b, mb)
        bad_len = (lens < 0) | (lens > mb * bs)
        # Entries past a sequence's length are never read (they may hold -1); the others must
        # name a block of the cache.
        used = cp.arange(mb)[None, :] * bs < cp.clip(lens, 0, mb * bs)[:, None]
        bad_block = used & ((table < 0) | (table >= nb))
        any_len, any_block = bad_len.any(), bad_block.any()
        code = cp.where(any_len, 1, cp.where(any_block, 2, 0)).astype(cp.int64)
        value = cp.where(
            any_len,
            cp.take(lens, cp.argmax(bad_len)),
            cp.take(table.reshape(-1), cp.argmax(bad_block.reshape(-1))),
        )
        err = cp.stack([code, value.astype(cp.int64)])
        safe_lens = cp.clip(lens, 0, mb * bs).astype(cp.int32).reshape(b, 1, 1, 1)
        safe_table = cp.where(used & ~bad_block, table, 0).astype(cp.int32).reshape(b, 1, mb, 1)
        ones = cp.ones((b, 1, 1, 1), cp.int32)
        o = storage(out)
        kc, vc = storage(k_cache).data.ptr, storage(v_cache).data.ptr
        pack = {
            UID_Q: storage(q).data.ptr, UID_K: kc, UID_V: vc, UID_O: o.data.ptr,
            UID_TABLE_K: safe_table.data.ptr, UID_TABLE_V: safe_table.data.ptr,
            UID_SEQ_Q: ones.data.ptr, UID_SEQ_KV: safe_lens.data.ptr,
        }  # fmt: skip
        _execute(engine, built, pack, stream.cp.ptr)
        # A sequence of length 0 gets zeros (the contract).
        live = safe_lens.reshape(b, 1, 1) > 0
        cp.copyto(o, cp.where(live, o.astype(cp.float32), cp.float32(0)).astype(o.dtype))
        return err

    return run
