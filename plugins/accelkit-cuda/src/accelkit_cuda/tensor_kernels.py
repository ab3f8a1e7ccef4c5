"""The CUDA backend's TensorOps: each kernel hook launches CuPy (cuBLAS, CUB) kernels."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import cupy as cp
import numpy as np

from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError, UnsupportedOperationError
from accelkit.sdk import Operand, TensorKernels, buffer_of
from accelkit.tensor import Tensor
from accelkit_cuda import blas, blaslt
from accelkit_cuda import cupy_tensor as ck
from accelkit_cuda import stream as cuda_stream
from accelkit_cuda.fast_elementwise import (
    BIAS_DTYPES,
    BLOCK,
    UNARY_OPS,
    ElementwiseProgram,
    grid_for,
    permute_args,
    row_block,
)
from accelkit_cuda.submit import CUDAComponent, block_error, numpy_dtype, storage, xa

if TYPE_CHECKING:
    from accelkit_cuda.backend import CUDABackend
    from accelkit_cuda.stream import CUDAStream

__all__ = ["CUDATensorKernels", "range_error"]

_BLOCK = (BLOCK,)
_uintp = np.uintp
_NULL = np.uintp(0)
#: How many call signatures each table of launch configurations keeps (:func:`_kept`).
_RAW_CONFIGS = 256
_FLOATS = frozenset({DType.F16, DType.BF16, DType.F32, DType.F64})
_MAX_ROWS = (1 << 31) - 1  # grid.x of a row kernel
_UNKNOWN: Any = object()  # a key not in a table yet
_C = TypeVar("_C")


def _kept(table: dict[Any, _C], key: Any, config: _C) -> _C:
    """Keep ``config`` for ``key`` in one of the kernels' tables of launch configurations (at
    most :data:`_RAW_CONFIGS` signatures: a full table starts over) and return it."""
    if len(table) >= _RAW_CONFIGS:
        table.clear()
    table[key] = config
    return config


def range_error(op: str, what: str, low: int, high: int) -> Any:
    def error(_flag: int, value: int) -> BaseException:
        return InvalidArgumentError(f"{op}: {what} must lie in {low}..{high - 1}; got {value}")

    return error


# The raw launches below are module functions that a kernel hook queues as a ``partial`` of its
# arguments, not closures: two objects the garbage collector tracks a launch (the partial and
# its arguments) where a closure made one a captured variable (its cell), plus the function
# and the cells' tuple (nine for a binary op). They stay alive while the launch is queued, so
# a caller that runs ahead of the submission thread makes collections come that much sooner
# and cost that much more (``test_gc_tracked_objects_per_queued_op``).


def _binary(fn: Any, grid: Any, count: Any, stream: Any, ba: Any, bb: Any, bo: Any) -> None:
    """:meth:`CUDATensorKernels._launch_raw`'s launch: ``fn`` over three blocks' pointers."""
    pa, pb, po = ba.ptr, bb.ptr, bo.ptr
    if pa and pb and po:
        fn(grid, _BLOCK, (_uintp(pa), _uintp(pb), _uintp(po), count), stream=stream.cp)
    else:
        raise block_error(ba if not pa else bb if not pb else bo)


def _unary(fn: Any, grid: Any, count: Any, stream: Any, x: Tensor, out: Tensor) -> None:
    """:meth:`CUDATensorKernels.unary`'s raw launch (it holds the tensors)."""
    bx, bo = buffer_of(x).handle, buffer_of(out).handle
    px, po = bx.ptr, bo.ptr
    if px and po:
        fn(grid, _BLOCK, (_uintp(px), _uintp(po), count), stream=stream.cp)
    else:
        raise block_error(bo if px else bx)


def _ptrs(
    fn: Any, grid: Any, block: Any, tail: tuple[Any, ...], stream: Any, *tensors: Tensor | None
) -> None:
    """:meth:`CUDATensorKernels._launch_ptrs`'s launch: the tensors' pointers (0 for None),
    then ``tail`` (it holds the tensors)."""
    args = []
    for t in tensors:
        if t is None:
            args.append(_NULL)
            continue
        b = buffer_of(t).handle
        ptr = b.ptr
        if not ptr:
            raise block_error(b)
        args.append(_uintp(ptr))
    fn(grid, block, (*args, *tail), stream=stream.cp)


def _linear(
    config: tuple[Any, ...], stream: Any, x: Tensor, weight: Tensor, bias: Tensor | None,
    out: Tensor, tf32: bool,
) -> None:  # fmt: skip
    """:meth:`CUDATensorKernels._raw_linear`'s launch for its signature's ``config``."""
    p, grid, count, cols, in_type, compute, fn, lt = config
    bx, bw, bo = buffer_of(x).handle, buffer_of(weight).handle, buffer_of(out).handle
    bb = None if bias is None else buffer_of(bias).handle
    px, pw, po = bx.ptr, bw.ptr, bo.ptr
    pb = 1 if bb is None else bb.ptr
    if not (px and pw and po and pb):
        raise block_error(next(b for b in (bx, bw, bo, bb) if b is not None and not b.ptr))
    if lt is not None and blaslt.linear_bias(cp, lt, px, pw, pb, po):
        return
    if bb is not None and fn is None:  # cuBLASLt found no algorithm: CuPy's path
        ck.linear(storage(x), storage(weight), xa(bias), storage(out), tf32)
        return
    blas.gemm_ptrs(cp, p, px, pw, po, in_type, in_type, compute)
    if fn is not None:
        fn(grid, _BLOCK, (_uintp(pb), _uintp(po), count, cols), stream=stream.cp)


def _composed_norm(
    composed: Callable[..., None], x: Tensor, params: tuple[Tensor | None, ...], eps: float,
    out: Tensor,
) -> None:  # fmt: skip
    """:meth:`CUDATensorKernels._norm`'s CuPy path: ``composed`` over the CuPy arrays."""
    composed(storage(x), *[xa(p) for p in params], eps, storage(out))


class CUDATensorKernels(CUDAComponent, TensorKernels):
    def __init__(self, backend: CUDABackend) -> None:
        super().__init__(backend)
        #: Raw NVRTC kernels of the commonest binary ops, the float unary ops, softmax and the
        #: norms (loaded during initialize, else compiled off the loop from the first such op
        #: on; CuPy's path until they are loaded).
        self.fast = ElementwiseProgram(backend)
        #: Raw launches' (grid, int64 count) per element count (:meth:`_raw_config`).
        self._raw_configs: dict[int, tuple[tuple[int], Any]] = {}
        #: Row kernels' (grid, block, trailing arguments) per call signature (:meth:`_row_config`).
        self._row_configs: dict[Any, tuple[tuple[int], tuple[int], tuple[Any, ...]]] = {}
        #: :meth:`permute`'s kernel arguments per (shape, axes, dtype) (:meth:`_permute_config`).
        self._permute_configs: dict[Any, tuple[bool, tuple[int], tuple[Any, ...]] | None] = {}
        #: :meth:`_raw_linear`'s launch per call signature (:meth:`_linear_config`: cuBLAS
        #: plan, bias grid, element count, row length, cudaDataType, compute type, bias kernel,
        #: cuBLASLt signature).
        self._linear_configs: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        #: Whether eager GEMMs take cuBLAS's workspace route (``ACCELKIT_CUDA_GEMM_WORKSPACE``,
        #: read once here: :meth:`_raw_linear` reads it per call otherwise).
        self._gemm_route = blas.workspace_route()
        #: Whether a linear's bias goes to cuBLASLt's epilogue (``ACCELKIT_CUDA_LT``, read once).
        self._lt_route = blaslt.enabled()

    # -- elementwise ------------------------------------------------------------------------------
    def unary(self, op: str, x: Tensor, out: Tensor) -> None:
        dt = out.dtype
        if (
            op in UNARY_OPS
            and x.dtype is dt
            and dt in _FLOATS
            and (n := out.size)
            and (fn := self.fast.function("u_" + op, dt)) is not None
        ):
            # As binary's raw launch (:meth:`_launch_raw`): the grid and count kept per
            # element count. The launch holds the tensors: a block whose tensor died goes to
            # the pool's cache, and a full device's cudaMalloc retry on the submission thread
            # frees cached blocks in place, before this launch has run.
            grid, count = self._raw_configs.get(n) or self._raw_config(n)
            run = partial(_unary, fn, grid, count, self.current_stream, x, out)
            self.launch(run, (x,), (out,), what=op, inline=True)
            return
        self.launch(lambda: ck.unary(op, storage(x), storage(out)), (x,), (out,), what=op)

    def _row_kernel(self, op: str, x: Tensor, out: Tensor, *params: Tensor | None) -> Any:
        """The loaded one-launch row kernel of ``op`` for ``x`` (rows over its last axis, into
        ``out`` of its dtype and shape; ``params`` of its dtype and the row's length), or None:
        CuPy's path then."""
        dt = x.dtype
        if dt not in _FLOATS or out.dtype is not dt or not x.ndim or not x.size:
            return None
        n = x.shape[-1]
        if x.size // n > _MAX_ROWS or out.shape != x.shape:
            return None
        for p in params:
            if p is not None and (p.dtype is not dt or p.shape != (n,)):
                return None
        return self.fast.function("row_" + op, dt)

    def _row_config(
        self, size: int, n: int, eps: tuple[float, bool] | None
    ) -> tuple[tuple[int], tuple[int], tuple[Any, ...]]:
        """A row kernel's grid, block and trailing arguments over ``size`` elements in rows of
        ``n``: the row length as int64, then a norm's ``eps`` (``(eps, f64)``: in the float of
        its accumulation). Kept per call signature, at most :data:`_RAW_CONFIGS` (the table
        starts over when full): a model repeats its shapes, and a call then makes no grid, no
        NumPy scalars and no tuples of its own."""
        key = (size, n, eps)
        config = self._row_configs.get(key)
        if config is None:
            tail: tuple[Any, ...] = (np.int64(n),)
            if eps is not None:
                tail += (np.float64(eps[0]) if eps[1] else np.float32(eps[0]),)
            config = _kept(self._row_configs, key, ((size // n,), row_block(n), tail))
        return config

    def _launch_ptrs(
        self, fn: Any, what: str, inputs: tuple[Tensor, ...], optional: tuple[Tensor | None, ...],
        out: Tensor, grid: tuple[int], block: tuple[int], tail: tuple[Any, ...],
    ) -> None:  # fmt: skip
        """One raw kernel with the pointers of ``inputs``, then of ``optional`` (0 for None),
        then of ``out``, then ``tail``; a block without memory (a failed allocation) raises its
        allocation's error for the await that covers the output, as CuPy's path would. The
        launch holds the tensors (see :meth:`unary`)."""
        run = partial(_ptrs, fn, grid, block, tail, self.current_stream, *inputs, *optional, out)
        self.launch(run, (*inputs, *optional), (out,), what=what, inline=True)

    def binary(self, op: str, a: Operand, b: Operand, out: Tensor) -> None:
        if type(a) is Tensor and type(b) is Tensor:
            dt = out.dtype
            shape = out.shape
            if (
                (n := out.size)
                and a.dtype is dt
                and b.dtype is dt
                and a.shape == shape
                and b.shape == shape
                and (fn := self.fast.function(op, dt)) is not None
            ):
                self._launch_raw(fn, op, a, b, out, n)
                return
        if op == "add" and type(a) is Tensor and type(b) is Tensor and a.dtype is b.dtype:
            self.launch(
                lambda: cp.add(storage(a), storage(b), out=storage(out)), (a, b), (out,), what=op
            )
            return
        self.launch(lambda: ck.binary(op, xa(a), xa(b), storage(out)), (a, b), (out,), what=op)

    def _launch_raw(self, fn: Any, op: str, a: Tensor, b: Tensor, out: Tensor, n: int) -> None:
        """One raw kernel over the three blocks' pointers (read on the submission thread,
        where the blocks' cudaMalloc ran): the grid and the element count are computed here,
        once per element count (:meth:`_raw_config`). The launch holds the blocks, not the
        tensors: an output the caller drops goes back to the pool at once (stream order keeps
        its next user after this launch; with more streams the stream holds the tensors until
        the work is done), so a loop whose launches lag reuses one block instead of
        allocating. A block without memory (a failed allocation) raises its allocation's error
        for the await that covers the output, as CuPy's path would."""
        ba, bb, bo = buffer_of(a).handle, buffer_of(b).handle, buffer_of(out).handle
        grid, count = self._raw_configs.get(n) or self._raw_config(n)
        stream = self.current_stream
        run = partial(_binary, fn, grid, count, stream, ba, bb, bo)
        self.launch(run, (a, b), (out,), what=op, inline=True)
        # A full device's cudaMalloc retry on the submission thread trims the pool's cache in
        # place, where a block whose tensor died after this was queued may sit: its free waits
        # for this launch (Block.use, DeviceMemory.free).
        ba.use = bb.use = bo.use = stream.thread.queued

    def _raw_config(self, n: int) -> tuple[tuple[int], Any]:
        """The grid and the ``int64`` element count of a raw launch over ``n`` elements, kept
        per ``n`` (at most :data:`_RAW_CONFIGS` counts; the table starts over when full)."""
        return _kept(self._raw_configs, n, (grid_for(n), np.int64(n)))

    def where(self, cond: Tensor, a: Operand, b: Operand, out: Tensor) -> None:
        self.launch(
            lambda: ck.where(storage(cond), xa(a), xa(b), storage(out)), (cond, a, b), (out,),
            what="where",
        )  # fmt: skip

    def cast(self, x: Tensor, out: Tensor) -> None:
        self.launch(lambda: ck.cast_into(storage(x), storage(out)), (x,), (out,), what="cast")

    # -- linear algebra ---------------------------------------------------------------------------
    def gemm(
        self, a: Tensor, b: Tensor, c: Tensor | None, out: Tensor, trans_a: bool, trans_b: bool,
        alpha: float, beta: float,
    ) -> None:  # fmt: skip
        tf32 = self.backend.allow_tf32
        self.launch(
            lambda: ck.gemm(
                storage(a), storage(b), xa(c), storage(out), trans_a, trans_b, alpha, beta, tf32
            ),
            (a, b, c), (out,), what="gemm",
        )  # fmt: skip

    def matmul(self, a: Tensor, b: Tensor, out: Tensor) -> None:
        tf32 = self.backend.allow_tf32
        self.launch(
            lambda: ck.matmul(storage(a), storage(b), storage(out), tf32), (a, b), (out,),
            what="matmul",
        )  # fmt: skip

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> None:
        tf32 = self.backend.allow_tf32
        if self._raw_linear(x, weight, bias, out, tf32):
            return
        self.launch(
            lambda: ck.linear(storage(x), storage(weight), xa(bias), storage(out), tf32),
            (x, weight, bias),
            (out,), what="linear",
        )  # fmt: skip

    def _raw_linear(
        self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor, tf32: bool
    ) -> bool:
        """``x @ weight.T (+ bias)`` on the blocks' pointers, the batch folded into the rows: with
        a bias, one cuBLASLt launch with the bias in its epilogue (:mod:`accelkit_cuda.blaslt`,
        as PyTorch's ``addmm``) where cuBLASLt serves; else cuBLAS's GEMM into the output, then
        the bias added in place by one raw kernel. The submission thread makes no CuPy array,
        no view and no ufunc dispatch for it (``cupy_tensor.linear``'s path, 190-310 us of that
        thread a call on an H100 host, 2026-11-27). The arithmetic is that path's: F32 (F64)
        accumulation, the bias added to the product before it is rounded to the output's type
        (cuBLASLt) or added in the output's type to the rounded product (F32/F64: the same
        rounding up to one ulp). False (nothing queued: that path serves) where cuBLAS has not
        been found yet (the first GEMM, on the submission thread, finds it), for mixed dtypes,
        an empty operand, ``ACCELKIT_CUDA_GEMM_WORKSPACE=0``, or a bias that neither cuBLASLt
        (an F16/BF16 bias without it, or ``ACCELKIT_CUDA_LT=0``) nor the loaded bias kernel
        takes. Where cuBLASLt finds no algorithm for a call, the call takes the two-launch
        path, or CuPy's (an F16/BF16 bias), on the submission thread."""
        # One lookup for a signature seen before (the commonest case: a model's layers repeat
        # their shapes); what makes a call eligible is worked out once per signature
        # (:meth:`_linear_config`) and only eligible signatures are kept.
        key = (
            x.shape,
            weight.shape,
            x.dtype,
            weight.dtype,
            None if bias is None else bias.dtype,
            tf32,
        )
        config = self._linear_configs.get(key)
        if config is None:
            config = self._linear_config(x, weight, bias, out, tf32)
            if config is None:
                return False
            _kept(self._linear_configs, key, config)
        stream = self.current_stream
        run = partial(_linear, config, stream, x, weight, bias, out, tf32)
        inline = cuda_stream.INLINE and self._plain_linear(config, stream, x, weight, bias, out)
        self.launch(run, (x, weight, bias), (out,), what="linear", inline=inline)
        return True

    def _plain_linear(
        self, config: tuple[Any, ...], stream: CUDAStream, x: Tensor, weight: Tensor,
        bias: Tensor | None, out: Tensor,
    ) -> bool | Callable[[], bool]:  # fmt: skip
        """Whether :func:`_linear` is a plain launch for these tensors (it may then be made on
        the caller's thread, :data:`accelkit_cuda.stream.INLINE`): the submission thread has
        made its cuBLAS handle and this stream's workspace, and, with a bias, has the bias
        kernel a declined plan falls back to (not CuPy's path, whose cuBLAS handle is per OS
        thread) and has looked for cuBLASLt's plan for these pointers (its heuristic runs
        there): asked in the thread's turn (a function), since the thread may drop its plans
        meanwhile."""
        thread = stream.thread
        if not blas.ready_on(thread, stream.cp):
            return False
        if bias is None:
            return True
        lt = config[7]
        if config[6] is None:
            return False
        if lt is None:
            return True
        ptr = [buffer_of(t).handle.ptr for t in (x, weight, bias, out)]
        return partial(blaslt.planned, thread, lt, ptr[0], ptr[1], ptr[2], ptr[3])

    def _linear_config(
        self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor, tf32: bool
    ) -> tuple[Any, ...] | None:
        """What :meth:`_raw_linear` launches for a signature (GEMM plan, bias grid and counts,
        cuBLAS types, bias kernel, cuBLASLt's signature), or None where it cannot (see
        there)."""
        dt = out.dtype
        if not blas.ready() or x.dtype is not dt or weight.dtype is not dt or not out.size:
            return None
        if x.ndim == 0 or weight.ndim != 2 or not self._gemm_route:
            return None
        in_type = blas.type_of(numpy_dtype(dt))
        compute = None if in_type is None else blas.compute_type(in_type, in_type, tf32)
        if in_type is None or compute is None:
            return None
        k, n = x.shape[-1], weight.shape[0]
        if not k or weight.shape[1] != k:
            return None
        rows = x.size // k
        p = blas.linear_plan(rows, n, k)
        fn = lt = None
        if bias is not None:
            if bias.dtype is not dt or bias.shape != (n,):
                return None
            if self._lt_route and blaslt.available():
                lt = blaslt.signature(p, in_type, compute)
            fn = self.fast.function("bias_add", dt)  # F32, F64
            if fn is None and (lt is None or dt in BIAS_DTYPES):
                # (F32/F64 wait for the bias kernel, their path where cuBLASLt declines: a
                # signature kept without it would take CuPy's path for good)
                return None
        return (p, grid_for(rows * n), np.int64(rows * n), np.int64(n), in_type, compute, fn, lt)

    # -- reductions -------------------------------------------------------------------------------
    def reduce(
        self, op: str, x: Tensor, axes: tuple[int, ...], keepdims: bool, out: Tensor
    ) -> None:
        self.launch(
            lambda: ck.reduce(op, storage(x), axes, keepdims, storage(out)), (x,), (out,), what=op
        )

    # -- shape ------------------------------------------------------------------------------------
    def permute(self, x: Tensor, axes: tuple[int, ...], out: Tensor) -> None:
        """One raw copy kernel (:data:`~accelkit_cuda.fast_elementwise.PERMUTE_CORE`) for up
        to four dims: ``cupy.copyto`` of a transposed view cost the submission thread 60-100 us
        a call on an H100 host (2026-11-27, the block's four permutes), a raw launch a few;
        CuPy's path for more dims, until the kernels are loaded, and for 16-byte elements."""
        key = (x.shape, axes, x.dtype)
        config = self._permute_configs.get(key, _UNKNOWN)
        if config is _UNKNOWN:
            config = self._permute_config(key)
        if config is not None:
            wide, grid, tail = config
            fn = self.fast.permute_function(x.dtype.itemsize, wide)
            if fn is not None:
                self._launch_ptrs(fn, "permute", (x,), (), out, grid, _BLOCK, tail)
                return

        def fallback() -> None:  # (made here: the raw launch above needs no closure)
            cp.copyto(storage(out), cp.transpose(storage(x), axes))

        self.launch(fallback, (x,), (out,), what="permute")

    def _permute_config(
        self, key: tuple[tuple[int, ...], tuple[int, ...], DType]
    ) -> tuple[bool, tuple[int], tuple[Any, ...]] | None:
        """:meth:`permute`'s kernel arguments for (shape, axes, dtype), kept (at most
        :data:`_RAW_CONFIGS`; the table starts over when full): the index width, the grid and
        the int64 arguments, or None (CuPy's path: more than four dims, no element, 16-byte
        elements). Computed on the caller's thread once per shape, not per call."""
        shape, axes, dtype = key
        found = permute_args(shape, axes) if dtype.itemsize in (1, 2, 4, 8) else None
        config = None
        if found is not None:
            wide, args = found
            config = (wide, grid_for(args[0]), tuple(np.int64(v) for v in args))
        return _kept(self._permute_configs, key, config)

    def concat(self, tensors: list[Tensor], axis: int, out: Tensor) -> None:
        self.launch(
            lambda: cp.concatenate([storage(t) for t in tensors], axis=axis, out=storage(out)),
            tensors, (out,), what="concat",
        )  # fmt: skip

    def narrow(self, x: Tensor, axis: int, start: int, out: Tensor) -> None:
        def run() -> None:
            index: list[Any] = [slice(None)] * x.ndim
            index[axis] = slice(start, start + out.shape[axis])
            cp.copyto(storage(out), storage(x)[tuple(index)])

        self.launch(run, (x,), (out,), what="narrow")

    def take(self, x: Tensor, axis: int, index: Any, out: Tensor) -> None:
        self.launch(
            lambda: ck.take(storage(x), axis, index, storage(out)), (x,), (out,), what="take"
        )

    def cumulative(
        self, op: str, x: Tensor, axis: int, exclusive: bool, reverse: bool, out: Tensor
    ) -> None:
        self.launch(
            lambda: ck.cumulative(op, storage(x), axis, exclusive, reverse, storage(out)),
            (x,), (out,), what=f"cum{op}",
        )  # fmt: skip

    def argsort(self, x: Tensor, axis: int, descending: bool, out: Tensor) -> None:
        self.launch(
            lambda: ck.argsort(storage(x), axis, descending, storage(out)), (x,), (out,),
            what="argsort",
        )  # fmt: skip

    def _corner(self, t: Any, index: Tensor, axis: int) -> Any:
        return t[
            tuple(slice(0, d) if i != axis else slice(None) for i, d in enumerate(index.shape))
        ]

    def gather(self, x: Tensor, axis: int, index: Tensor, out: Tensor) -> None:
        dim = x.shape[axis]

        def run() -> Any:
            idx = storage(index).astype(cp.int64)
            flag = ck.range_flag(idx, -dim, dim)
            idx = cp.clip(cp.where(idx < 0, idx + dim, idx), 0, max(dim - 1, 0))
            if out.size:
                src = self._corner(storage(x), index, axis)
                cp.copyto(storage(out), cp.take_along_axis(src, idx, axis=axis))
            return flag

        self._launch_checked(run, (x, index), (out,), range_error("gather", "index", -dim, dim))

    def scatter(
        self, x: Tensor, axis: int, index: Tensor, src: Tensor | int | float, out: Tensor
    ) -> None:
        dim = x.shape[axis]

        def run() -> Any:
            idx = storage(index).astype(cp.int64)
            flag = ck.range_flag(idx, -dim, dim)
            idx = cp.clip(cp.where(idx < 0, idx + dim, idx), 0, max(dim - 1, 0))
            cp.copyto(storage(out), storage(x))
            if isinstance(src, Tensor):
                values = storage(src)[tuple(slice(0, d) for d in index.shape)]
            else:
                values = cp.full(index.shape, src, dtype=storage(out).dtype)
            region = self._corner(storage(out), index, axis)
            if index.size:
                ck.put_last(region, idx, values, axis)
            return flag

        self._launch_checked(
            run, (x, index, src), (out,), range_error("scatter", "index", -dim, dim)
        )

    # -- neural-network ops -----------------------------------------------------------------------
    def conv2d(
        self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor,
        stride: tuple[int, int], padding: tuple[int, int], dilation: tuple[int, int], groups: int,
    ) -> None:  # fmt: skip
        self.launch(
            lambda: ck.conv2d(
                storage(x), storage(weight), xa(bias), storage(out), stride, padding, dilation, groups
            ),
            (x, weight, bias), (out,), what="conv2d",
        )  # fmt: skip

    def attention(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, out: Tensor, scale: float,
        causal: bool,
    ) -> None:  # fmt: skip
        flash = self.backend._fused_kernels
        # The flash kernel: no score matrix in memory at all.
        if flash is not None and mask is None and flash.can_flash(q, k, v):
            try:
                flash.attention(q, k, v, None, out, scale, causal)
                return
            except UnsupportedOperationError:
                pass  # the fused program is unavailable (no NVRTC): cuBLAS below
        ct = DType.F64 if q.dtype is DType.F64 else DType.F32  # the scores' dtype
        fn = self.fast.function("row_attn_softmax", ct) if q.dtype in _FLOATS else None
        weights = None if fn is None else self._attention_weights(fn)
        self.launch(
            lambda: ck.attention(
                storage(q), storage(k), storage(v), xa(mask), storage(out), scale, causal, weights
            ),
            (q, k, v, mask), (out,), what="attention",
        )  # fmt: skip

    def attention_bshd(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, out: Tensor, scale: float,
        causal: bool,
    ) -> None:  # fmt: skip
        """Sequence-major attention read and written in place (a transformer block's q, k and
        v straight from their projections: no permute before or after) on cuDNN or the gated
        flash kernels; declined where neither serves, and the core permutes."""
        flash = self.backend._fused_kernels
        if flash is None:
            raise UnsupportedOperationError("no fused kernels (NVRTC) for sequence-major attention")
        flash.attention_bshd(q, k, v, mask, out, scale, causal)

    def _attention_weights(self, fn: Any) -> Any:
        """The composed attention's softmax as one launch of ``fn`` (``row_attn_softmax``) over
        a chunk of scores (a new C-contiguous F32/F64 array, on the submission thread)."""
        stream = self.current_stream

        def weights(s: Any) -> Any:
            n = s.shape[-1]
            if not n or not s.size or not s.flags.c_contiguous:
                return ck.softmax_rows(s)
            res = cp.empty_like(s)
            args = (np.uintp(s.data.ptr), np.uintp(res.data.ptr), np.int64(n))
            fn((s.size // n,), row_block(n), args, stream=stream.cp)
            return res

        return weights

    def softmax(self, x: Tensor, axis: int, out: Tensor, log: bool) -> None:
        op = "log_softmax" if log else "softmax"
        if axis in (-1, x.ndim - 1) and (fn := self._row_kernel(op, x, out)) is not None:
            grid, block, tail = self._row_config(x.size, x.shape[-1], None)
            self._launch_ptrs(fn, op, (x,), (), out, grid, block, tail)
            return
        self.launch(
            lambda: ck.softmax(storage(x), axis, storage(out), log), (x,), (out,), what="softmax"
        )

    def layer_norm(
        self, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, out: Tensor
    ) -> None:
        self._norm("layer_norm", x, (weight, bias), eps, out, ck.layer_norm)

    def rms_norm(self, x: Tensor, weight: Tensor | None, eps: float, out: Tensor) -> None:
        self._norm("rms_norm", x, (weight,), eps, out, ck.rms_norm)

    def _norm(
        self, op: str, x: Tensor, params: tuple[Tensor | None, ...], eps: float, out: Tensor,
        composed: Callable[..., None],
    ) -> None:  # fmt: skip
        """A norm over the last axis: the one-launch row kernel where it is loaded and serves,
        else ``composed(x, *params, eps, out)`` on the CuPy arrays (CuPy's path; queued as a
        partial, made only there)."""
        if (fn := self._row_kernel(op, x, out, *params)) is not None:
            grid, block, tail = self._row_config(x.size, x.shape[-1], (eps, x.dtype is DType.F64))
            self._launch_ptrs(fn, op, (x,), params, out, grid, block, tail)
            return
        run = partial(_composed_norm, composed, x, params, eps, out)
        self.launch(run, (x, *params), (out,), what=op)

    def cross_entropy(
        self, logits: Tensor, targets: Tensor, reduction: str, loss: Tensor, probs: Tensor
    ) -> None:
        n = logits.shape[1]
        self._launch_checked(
            lambda: ck.cross_entropy(
                storage(logits), storage(targets), reduction, storage(loss), storage(probs)
            ),
            (logits, targets), (loss, probs), range_error("cross_entropy", "targets", 0, n),
        )  # fmt: skip

    def embedding(self, indices: Tensor, weight: Tensor, out: Tensor) -> None:
        n = weight.shape[0]
        self._launch_checked(
            lambda: ck.embedding(storage(indices), storage(weight), storage(out)),
            (indices, weight), (out,), range_error("embedding", "indices", 0, n),
        )  # fmt: skip

    def adam_update(
        self, param: Tensor, grad: Tensor, m: Tensor, v: Tensor, lr: float, beta1: float,
        beta2: float, eps: float, step: int, weight_decay: float,
    ) -> None:  # fmt: skip
        self.launch(
            lambda: ck.adam_update(
                storage(param), storage(grad), storage(m), storage(v), lr, beta1, beta2, eps, step,
                weight_decay,
            ),
            (param, grad, m, v), (param, m, v), what="adam_update",
        )  # fmt: skip
