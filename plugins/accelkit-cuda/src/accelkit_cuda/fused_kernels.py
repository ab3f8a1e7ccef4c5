"""The CUDA backend's KernelOps: the NVRTC kernels of :mod:`accelkit_cuda.cuda_fused`.

The fused program is compiled once per device architecture and NVRTC version (about 4 s) and
cached on disk; ``CUDABackend.initialize`` awaits loading it on a worker thread. sample_token
runs as CuPy kernels (sort, scan, Gumbel argmax) on the device with exactly the arithmetic of
the composition and its noise from the same device generator as ``tensor_factory.uniform``
(:func:`accelkit_cuda.factory_kernels.device_draw`), so both routes draw the same token for a
seed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import cupy as cp
import cupyx
import numpy as np

from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError, UnsupportedOperationError
from accelkit.quant import QuantFormat
from accelkit.sdk import (
    GUMBEL_UNIFORM_MAX,
    FusedKernels,
    GeluApproximation,
    RandomDraw,
    SamplingParams,
    buffer_of,
    rotary_inv_freq,
)
from accelkit.tensor import Tensor
from accelkit_cuda.cuda_fused import (
    FLASH_ROWS,
    MAX_DV,
    SOURCE,
    flash_shared_bytes,
    kernel_names,
)
from accelkit_cuda.factory_kernels import device_draw, random_dtype
from accelkit_cuda.flash_attention import geometry, launch_args, stored_shape
from accelkit_cuda.flash_simt import geometry as simt_geometry
from accelkit_cuda.flash_simt import launch_args as simt_args
from accelkit_cuda.submit import CUDAComponent, block_error, storage

if TYPE_CHECKING:
    from accelkit_cuda.backend import CUDABackend

__all__ = ["CUDAFusedKernels", "FusedProgram"]

_SUFFIX = {DType.F32: "f32", DType.F16: "f16", DType.F64: "f64", DType.BF16: "bf16"}
_THREADS = 256
_SMEM_DEFAULT = 48 * 1024
#: How a route's reason names the layout it read (``attention_bshd``: sequence-major).
_LAYOUT = {False: "", True: ", sequence-major in place"}


def _ptr(t: Tensor | None) -> Any:
    return t  # resolved by _Fused._run on the submission thread (None: a null pointer)


def _resolve(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Kernel arguments with tensors replaced by their device pointers (submission thread):
    what CuPy passes a raw kernel for an array, without making one (an ``UnownedMemory``, a
    ``MemoryPointer`` and an ``ndarray`` a tensor, each launch: the attention launch passes
    four). A non-empty tensor whose block has no memory raises its allocation's error, as
    making its array did."""
    return tuple(_pointer(a) if type(a) is Tensor else a for a in args)


def _pointer(t: Tensor) -> Any:
    block = buffer_of(t).handle
    ptr = block.ptr
    if ptr or not t.size:  # an empty tensor's array has a null pointer too
        return np.uintp(ptr)
    raise block_error(block)


class FusedProgram:
    """The fused kernels of one backend, compiled (or read from the disk cache) by
    :meth:`load`, which the backend awaits at initialize, so no call waits for NVRTC."""

    def __init__(self, backend: CUDABackend) -> None:
        self._backend = backend
        self._module: Any = None
        self._error: BaseException | None = None
        self._functions: dict[str, Any] = {}

    async def load(self) -> None:
        """Compile on a worker thread (about 4 s on a cold cache), then load the module and
        look up every kernel on the submission thread, so a launch needs no driver call to
        find its function. A failure (no NVRTC, an architecture NVRTC does not know) is kept:
        fused calls then refuse, and the dispatcher and TensorOps run their compositions."""
        from accelkit_cuda.nvrtc import compile_cached

        try:
            compiled = await anyio.to_thread.run_sync(
                compile_cached, SOURCE, self._backend._arch, (), "accelkit_fused.cu"
            )
            self._functions = await self._backend.thread.call(lambda: _load(compiled.binary))
            self._module = True
        except Exception as exc:
            self._error = exc

    def function(self, name: str) -> Any:
        """The loaded kernel ``name`` (a dict lookup: no CUDA call)."""
        fn = self._functions.get(name)
        if fn is None:
            raise UnsupportedOperationError(
                f"the CUDA fused kernels are unavailable: {self._error or 'not loaded'}"
                if self._module is None
                else f"the CUDA fused program has no kernel {name!r}"
            )
        return fn


def _load(binary: bytes) -> dict[str, Any]:
    """On the submission thread: load the fused module and look up its kernels."""
    module = cp.cuda.function.Module()
    module.load(binary)
    return {name: module.get_function(name) for name in kernel_names()} | {"": module}


class _Fused(CUDAComponent):
    backend: CUDABackend

    def _fn(self, op: str, dtype: DType) -> Any:
        suffix = _SUFFIX.get(dtype)
        if suffix is None:
            raise UnsupportedOperationError(f"no fused CUDA {op} kernel for {dtype.value}")
        return self.backend.fused.function(f"{op}_{suffix}")

    def _run(
        self, fn: Any, grid: int | tuple[int, ...], block: int,
        args: tuple[Any, ...] | Callable[[], tuple[Any, ...]], inputs: Any, outputs: Any,
        smem: int = 0,
    ) -> None:  # fmt: skip
        """Launch ``fn`` on the current stream. ``args`` may be a function building them: it
        runs inside the launch, on the stream and device, so that conversions it makes (CuPy
        kernels) are ordered after the inputs' writers and before the kernel."""
        g = grid if isinstance(grid, tuple) else (grid,)
        stream = self.current_stream

        def run() -> None:
            values = _resolve(args() if callable(args) else args)
            fn(g, (block,), values, shared_mem=smem, stream=stream.cp)

        # A plain launch where the arguments are given (a function building them may run
        # CuPy kernels, which allocate).
        self.launch(run, inputs, outputs, what="a fused kernel", inline=not callable(args))

    def _rows(self, x: Tensor) -> tuple[int, int]:
        d = x.shape[-1] if x.shape else 1
        return (x.size // d if d else 0), d

    def _elementwise_grid(self, n: int) -> int:
        return max(1, min((n + _THREADS - 1) // _THREADS, 65535))


class CUDANormKernels(_Fused):
    def rms_norm(self, x: Tensor, weight: Tensor | None, eps: float, out: Tensor) -> None:
        rows, d = self._rows(x)
        if rows == 0 or d == 0:
            raise UnsupportedOperationError("empty rows: the composition handles them")
        fn = self._fn("rms_norm", x.dtype)
        args = (x, _ptr(weight), out, np.int64(d), np.float64(eps))
        self._run(fn, rows, _THREADS, args, (x, weight), (out,))

    def rms_norm_residual(
        self, x: Tensor, residual: Tensor, weight: Tensor | None, eps: float, normed: Tensor,
        summed: Tensor,
    ) -> None:  # fmt: skip
        rows, d = self._rows(x)
        if rows == 0 or d == 0:
            raise UnsupportedOperationError("empty rows: the composition handles them")
        fn = self._fn("rms_norm_residual", x.dtype)
        args = (
            x, residual, _ptr(weight), normed, summed, np.int64(d),
            np.float64(eps),
        )  # fmt: skip
        self._run(fn, rows, _THREADS, args, (x, residual, weight), (normed, summed))

    def layer_norm(
        self, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, out: Tensor
    ) -> None:
        rows, d = self._rows(x)
        if rows == 0 or d == 0:
            raise UnsupportedOperationError("empty rows: the composition handles them")
        fn = self._fn("layer_norm", x.dtype)
        args = (x, _ptr(weight), _ptr(bias), out, np.int64(d), np.float64(eps))
        self._run(fn, rows, _THREADS, args, (x, weight, bias), (out,))


class CUDAPositionKernels(_Fused):
    def rotary_embedding(
        self, x: Tensor, positions: Tensor | None, base: float, offset: int, out: Tensor
    ) -> None:
        b, h, s, d = x.shape
        n = b * h * s * (d // 2)
        if n == 0:
            raise UnsupportedOperationError("empty input: the composition handles it")
        fn = self._fn("rotary", x.dtype)
        acc = np.float64 if x.dtype is DType.F64 else np.float32
        inv_host = rotary_inv_freq(d, base).astype(acc)
        batched = np.int32(positions is not None and positions.ndim == 2)

        def args() -> tuple[Any, ...]:
            # CuPy's pool is stream-ordered: these temporaries live until the kernel is done.
            inv = cp.asarray(inv_host)
            pos = None if positions is None else storage(positions).astype(cp.int64, copy=False)
            return (
                storage(x), pos, inv, storage(out), np.int64(b), np.int64(h), np.int64(s),
                np.int64(d), batched, np.int64(offset),
            )  # fmt: skip

        self._run(fn, self._elementwise_grid(n), _THREADS, args, (x, positions), (out,))


class CUDAAttentionKernels(_Fused):
    def can_flash(self, q: Tensor, k: Tensor, v: Tensor) -> bool:
        if q.dtype not in _SUFFIX or v.shape[3] > MAX_DV or q.size == 0 or k.shape[2] == 0:
            return False
        if q.shape[0] * q.shape[1] > 65535:  # grid.y
            return False
        item = 8 if q.dtype is DType.F64 else 4
        return flash_shared_bytes(q.shape[3], v.shape[3], item) <= _SMEM_DEFAULT

    def attention(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, out: Tensor, scale: float,
        causal: bool,
    ) -> None:  # fmt: skip
        engines = self.backend.attention_engines
        declined = engines.attention(self, q, k, v, mask, out, scale, causal)  # cuDNN's route
        if declined is None:
            return
        if mask is not None:
            raise UnsupportedOperationError(
                f"the flash kernel takes no explicit mask (cuDNN: {declined})"
            )
        if not self.can_flash(q, k, v):
            raise UnsupportedOperationError(
                f"the flash kernel needs f16/bf16/f32/f64, head_dim_v <= {MAX_DV}, and its tiles in"
                f" {_SMEM_DEFAULT // 1024} KiB of shared memory (cuDNN: {declined})"
            )
        why = self._tiled(q, k, v, out, scale, causal, False, declined)
        if why is None:
            return
        b, h, sq, d = q.shape
        hk, sk, dv = k.shape[1], k.shape[2], v.shape[3]
        item = 8 if q.dtype is DType.F64 else 4
        fn = self._fn("flash_attention", q.dtype)
        args = (
            q, k, v, out, np.int32(h), np.int32(hk), np.int64(sq),
            np.int64(sk), np.int32(d), np.int32(dv), np.float64(scale), np.int32(causal),
        )  # fmt: skip
        grid = ((sq + FLASH_ROWS - 1) // FLASH_ROWS, b * h)
        self._run(
            fn, grid, 32 * FLASH_ROWS, args, (q, k, v), (out,), flash_shared_bytes(d, dv, item)
        )
        engines.record("attention", "warp", f"{declined}; {why}")

    def attention_bshd(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, out: Tensor, scale: float,
        causal: bool,
    ) -> None:  # fmt: skip
        """:meth:`attention` on sequence-major q [B, Sq, H, D], k and v [B, Sk, Hkv, D] and out
        [B, Sq, H, Dv], read and written in place (no permute): cuDNN through the strides, or
        the tiled f32 or tensor-core kernel. Declined (UnsupportedOperationError, nothing
        queued) where neither serves: the core then permutes around :meth:`attention`."""
        engines = self.backend.attention_engines
        declined = engines.attention(self, q, k, v, mask, out, scale, causal, seq_major=True)
        if declined is None:
            return
        if mask is not None:
            raise UnsupportedOperationError(f"the flash kernels take no mask (cuDNN: {declined})")
        why = self._tiled(q, k, v, out, scale, causal, True, declined)
        if why is not None:
            raise UnsupportedOperationError(f"sequence-major attention: {why} (cuDNN: {declined})")

    def _tiled(
        self, q: Tensor, k: Tensor, v: Tensor, out: Tensor, scale: float, causal: bool,
        seq_major: bool, declined: str,
    ) -> str | None:  # fmt: skip
        """Launch the gated kernel for the dtype (the tiled f32 one, or the tensor-core one for
        f16/bf16) and record it, returning None; or return why it does not serve the call
        (nothing queued). ``seq_major``: the tensors are stored [B, S, H, D]."""
        b, h, sq, d = stored_shape(q.shape, seq_major)
        hk, sk = stored_shape(k.shape, seq_major)[1:3]
        if q.dtype is DType.F32:
            which, simt = "f32 tiled kernel", self.backend.flash_simt
            why = "no f32 tiled kernel" if simt is None else simt.refusal(q, k, v, seq_major)
            if simt is not None and why is None:
                grid3, block3, smem3 = simt_geometry(b, h, sq, d)
                args3 = simt_args(q, k, v, out, h, hk, sq, sk, scale, causal, seq_major)
                self._run(simt.function(d), grid3, block3[0], args3, (q, k, v), (out,), smem3)
                self.backend.attention_engines.record(
                    "attention",
                    "simt",
                    f"the f32 tiled kernel (verified here){_LAYOUT[seq_major]}; {declined}",
                )
                return None
        else:
            which, flash2 = "tensor-core kernel", self.backend.flash2
            why = "no tensor-core kernel" if flash2 is None else flash2.refusal(q, k, v, seq_major)
            if flash2 is not None and why is None:
                grid2, block2, smem2 = geometry(b, h, sq, d)
                args2 = launch_args(q, k, v, out, h, hk, sq, sk, scale, causal, seq_major)
                fn2 = flash2.function(q.dtype, d)
                self._run(fn2, grid2, block2[0], args2, (q, k, v), (out,), smem2)
                self.backend.attention_engines.record(
                    "attention",
                    "flash2",
                    f"the tensor-core kernel (verified here){_LAYOUT[seq_major]}; {declined}",
                )
                return None
        return f"{which}: {why}"

    def paged_attention(
        self, q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor,
        context_lens: Tensor, scale: float, out: Tensor,
    ) -> None:  # fmt: skip
        b, h, d = q.shape
        nb, bs, hk = k_cache.shape[:3]
        mb = block_table.shape[1]
        max_len = mb * bs

        def error(code: int, value: int) -> BaseException:
            if code == 1:
                return InvalidArgumentError(
                    f"paged_attention: context_lens must lie in 0..{max_len} (max_blocks *"
                    f" block_size); got {value}"
                )
            return InvalidArgumentError(
                f"paged_attention: block_table refers to block {value}; the cache has blocks"
                f" 0..{nb - 1}"
            )

        engines = self.backend.attention_engines
        decode = self.backend.flash_decode
        why_not = "no split-KV kernel" if decode is None else decode.refusal(
            q, k_cache, v_cache, block_table
        )  # fmt: skip
        if decode is not None and why_not is None:
            why_not = self._flash_decode(
                decode, q, k_cache, v_cache, block_table, context_lens, scale, out, error
            )
            if why_not is None:
                from accelkit_cuda.flash_decode import split_kind

                piped = split_kind(h, hk, d, v_cache.shape[3], decode.pipelined).endswith("p")
                engines.record(
                    "paged_attention", "flash_decode",
                    "the split-KV decode kernel" + (", pipelined" if piped else ""),
                )  # fmt: skip
                return
        declined = engines.paged_attention(
            self, q, k_cache, v_cache, block_table, context_lens, scale, out, error
        )  # cuDNN's route
        if declined is None:
            return
        declined = f"{declined}; split-KV kernel: {why_not}"
        if q.dtype not in _SUFFIX or d > MAX_DV or b * h == 0:
            raise UnsupportedOperationError(
                f"paged_attention: the composition handles this case (cuDNN: {declined})"
            )
        fn = self._fn("paged_attention", q.dtype)
        stream = self.current_stream

        def run() -> Any:
            table = storage(block_table).astype(cp.int64, copy=False)
            lens = storage(context_lens).astype(cp.int64, copy=False)
            err = cp.zeros(2, cp.int64)
            fn(
                (b * h,), (32,),
                (
                    storage(q), storage(k_cache), storage(v_cache), table, lens, storage(out), np.int32(h),
                    np.int32(hk), np.int32(d), np.int64(nb), np.int32(bs), np.int32(mb),
                    np.float64(scale), err,
                ),
                stream=stream.cp,
            )  # fmt: skip
            return err

        self._launch_checked(run, (q, k_cache, v_cache, block_table, context_lens), (out,), error)
        engines.record("paged_attention", "warp", declined)

    def _flash_decode(
        self, decode: Any, q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor,
        context_lens: Tensor, scale: float, out: Tensor, error: Callable[[int, int], BaseException],
    ) -> str | None:  # fmt: skip
        """Submit paged decode on the split-KV kernel (None), or say why not (nothing queued)."""
        from accelkit_cuda.flash_decode import run as run_decode

        stream = self.current_stream
        dtype = q.dtype
        pipelined = decode.pipelined  # (as it is when submitted)

        def aligned(a: Any) -> Any:
            # The kernel loads 8 or 16 bytes at a time: a view at an odd offset is copied (a
            # fresh block of the pool is aligned).
            a = cp.ascontiguousarray(a)
            return a if a.data.ptr % 16 == 0 else a.copy()

        def run() -> Any:
            o = storage(out)
            dst = aligned(o)
            err = run_decode(
                decode.function, aligned(storage(q)), aligned(storage(k_cache)),
                aligned(storage(v_cache)), storage(block_table), storage(context_lens), dst,
                dtype, scale, stream.cp, pipelined,
            )  # fmt: skip
            if dst is not o:
                cp.copyto(o, dst)
            return err

        self._launch_checked(run, (q, k_cache, v_cache, block_table, context_lens), (out,), error)
        return None


class CUDAActivationKernels(_Fused):
    def silu_mul(self, gate: Tensor, up: Tensor, out: Tensor) -> None:
        n = gate.size
        if n == 0:
            return self.skip([out])
        fn = self._fn("silu_mul", gate.dtype)
        self._run(
            fn, self._elementwise_grid(n), _THREADS, (gate, up, out, np.int64(n)),
            (gate, up), (out,),
        )  # fmt: skip
        return None

    def gelu(self, x: Tensor, approximate: GeluApproximation, out: Tensor) -> None:
        n = x.size
        if n == 0:
            return self.skip([out])
        fn = self._fn("gelu_erf" if approximate == "none" else "gelu_tanh", x.dtype)
        self._run(
            fn,
            self._elementwise_grid(n),
            _THREADS,
            (x, out, np.int64(n)),
            (x,),
            (out,),
        )
        return None


class CUDALinearKernels(_Fused):
    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> None:
        # cuBLAS (through TensorOps) is the fused kernel here: one GEMM with the bias added.
        self.backend.tensor_ops.kernels.linear(x, weight, bias, out)

    def quantized_linear(
        self, x: Tensor, qweight: Tensor, scales: Tensor, bias: Tensor | None,
        format: QuantFormat, out: Tensor,
    ) -> None:  # fmt: skip
        k = x.shape[-1]
        m, n = (x.size // k if k else 0), qweight.shape[0]
        if m * n == 0 or k == 0:
            raise UnsupportedOperationError("empty input: the composition handles it")
        fn = self._fn(f"qlinear_{format}", x.dtype)
        blocks = (m * n * 32 + _THREADS - 1) // _THREADS

        def args() -> tuple[Any, ...]:
            sc = storage(scales).astype(cp.float32, copy=False)
            return (
                storage(x), storage(qweight), sc, _ptr(bias), storage(out), np.int64(m), np.int64(n),
                np.int64(k),
            )  # fmt: skip

        self._run(fn, blocks, _THREADS, args, (x, qweight, scales, bias), (out,))


class CUDASamplingKernels(_Fused):
    def argmax(self, logits: Tensor, out: Tensor) -> None:
        rows, d = self._rows(logits)
        if rows == 0 or d == 0:
            raise UnsupportedOperationError("empty input: the composition handles it")
        fn = self._fn("argmax_rows", logits.dtype)
        self._run(fn, rows, _THREADS, (logits, out, np.int64(d)), (logits,), (out,))

    def sample_token(
        self, logits: Tensor, previous_tokens: Tensor | None, params: SamplingParams, out: Tensor
    ) -> None:
        vocab = logits.shape[-1]
        rows = logits.size // vocab if vocab else 0

        # The composition's noise: tensor_factory.uniform((rows, vocab), seed=seed) (F32), drawn
        # by the same device generator (factory_kernels.device_draw), so both routes agree.
        draw = RandomDraw("uniform", 0.0, 1.0, (rows, vocab), params.seed)
        program = getattr(self.backend, "philox", None)

        def run() -> Any:
            noise = None
            if params.temperature != 0.0:
                noise = device_draw(draw, random_dtype(draw), None, program)
            return _sample(storage(logits), _data(previous_tokens), params, noise, storage(out))

        def error(_code: int, value: int) -> BaseException:
            return InvalidArgumentError(
                f"sample_token: previous_tokens must lie in 0..{vocab - 1} (negative entries are"
                f" padding); got {value}"
            )

        self._launch_checked(run, (logits, previous_tokens), (out,), error)


def _data(t: Tensor | None) -> Any:
    return None if t is None else storage(t)


def _softmax(z: Any) -> Any:
    m = cp.max(z, axis=-1, keepdims=True)
    m = cp.where(cp.isfinite(m), m, 0)
    e = cp.exp(z - m)
    total = cp.sum(e, axis=-1, keepdims=True)
    return cp.where(total > 0, e / cp.where(total > 0, total, 1), 0)


def _nucleus(z: Any, top_p: float) -> Any:
    """As the host composition: a token stays when the mass strictly above it is < top_p."""
    p = _softmax(z)
    order = cp.argsort(-p, axis=-1)  # CuPy's sort is stable
    ps = cp.take_along_axis(p, order, axis=-1)
    before = cp.cumsum(ps, axis=-1) - ps
    starts = cp.ones(ps.shape, cp.bool_)
    starts[:, 1:] = ps[:, 1:] != ps[:, :-1]
    # The first index of each run of equal values (no host synchronization: no nonzero()).
    rows, n = ps.shape
    run_id = cp.cumsum(starts, axis=-1) - 1
    index = cp.broadcast_to(cp.arange(n), ps.shape)
    run_start = cp.full(ps.shape, n, cp.int64)
    flat = (cp.arange(rows)[:, None] * n + run_id).reshape(-1)
    cupyx.scatter_min(run_start.reshape(-1), flat, index.reshape(-1))
    first = cp.take_along_axis(run_start, run_id, axis=-1)
    keep_sorted = cp.take_along_axis(before, first, axis=-1) < top_p
    keep = cp.empty_like(keep_sorted)
    cp.put_along_axis(keep, order, keep_sorted, axis=-1)
    return keep


def _sample(logits: Any, previous: Any, params: SamplingParams, noise: Any, out: Any) -> Any:
    vocab = logits.shape[-1]
    ct = cp.float64 if logits.dtype == cp.float64 else cp.float32
    z = logits.reshape(-1, vocab).astype(ct)
    flag = cp.zeros(2, cp.int64)
    if previous is not None and params.repetition_penalty != 1.0:
        prev = previous.reshape(z.shape[0], -1).astype(cp.int64)
        if prev.size:
            bad = prev >= vocab
            flag = cp.stack([bad.any().astype(cp.int64), cp.max(prev)])
            valid = (prev >= 0) & ~bad
            # Invalid entries mark a spare column (no boolean-mask indexing: no host sync).
            seen = cp.zeros((z.shape[0], vocab + 1), cp.bool_)
            rows = cp.broadcast_to(cp.arange(z.shape[0])[:, None], prev.shape)
            seen[rows, cp.where(valid, prev, vocab)] = True
            seen = seen[:, :vocab]
            pen = ct(params.repetition_penalty)
            z = cp.where(seen, cp.where(z > 0, z / pen, z * pen), z)
    if params.temperature == 0.0:
        out[...] = cp.argmax(z, axis=-1).reshape(out.shape)
        return flag
    z = z / ct(params.temperature)
    special = ~(z < cp.inf)  # a NaN or +inf is never masked (the special-values rule)
    if 0 < params.top_k < vocab:
        kth = cp.partition(z, vocab - params.top_k, axis=-1)[:, vocab - params.top_k, None]
        z = cp.where((z >= kth) | special, z, -cp.inf).astype(ct)
    if params.top_p < 1.0:
        z = cp.where(_nucleus(z, params.top_p) | special, z, -cp.inf).astype(ct)
    u = cp.minimum(cp.asarray(noise), cp.float32(GUMBEL_UNIFORM_MAX)).astype(ct)
    gumbel = -cp.log(-cp.log(u))
    out[...] = cp.argmax(z + gumbel, axis=-1).reshape(out.shape)
    return flag


class CUDAFusedKernels(
    CUDANormKernels,
    CUDAPositionKernels,
    CUDAAttentionKernels,
    CUDAActivationKernels,
    CUDALinearKernels,
    CUDASamplingKernels,
    FusedKernels,
):
    """Every fused op, from the group mixins above."""
