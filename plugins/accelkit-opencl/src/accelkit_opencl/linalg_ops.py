"""The OpenCL backend's GEMM hooks (``gemm``, ``matmul``, ``linear``).

F32 and F64 products pack A and B^T into zero-padded panels, then run the register-blocked
``gemm_packed`` kernel of :mod:`accelkit_opencl.opencl_linalg` (block shape from
:mod:`accelkit_opencl.gemm_tuning`); other dtypes run the local-memory tiled kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from accelkit.dtype import DType
from accelkit.errors import KernelCompileError, UnsupportedOperationError
from accelkit.sdk import broadcast_shapes, prod, storage
from accelkit.tensor import Tensor
from accelkit_opencl.opencl_linalg import (
    GemmBlock,
    gemm_pack_source,
    gemm_packed_source,
    gemm_source,
)
from accelkit_opencl.opencl_types import broadcast_strides, collapse, load_type, numpy_scalar
from accelkit_opencl.programs import enqueue_kernel
from accelkit_opencl.submit import CLComponent, launch

__all__ = ["CLLinalgOps"]

_i64 = np.int64
#: Dtypes the packed GEMM computes in (the others run the tiled kernel).
_PACKED_DTYPES = (DType.F32, DType.F64)
#: Products of fewer multiply-adds (all batch items together) run the tiled kernel: one launch
#: instead of three. On PoCL a launch costs 0.1-0.3 ms, and a 64^3 product took 0.7 ms tiled
#: against 1.1 ms packed (128^3: 1.9 ms tiled, 1.2 ms packed).
PACKED_MIN_WORK = 64**3


class CLLinalgOps(CLComponent):
    """The linear-algebra hooks of ``OpenCLTensorKernels``."""

    def _gemm_launch(
        self,
        out: Tensor,
        a: Tensor,
        b: Tensor,
        c: Tensor | None,
        mnk: tuple[int, int, int],
        a_mk: tuple[int, int],
        b_kn: tuple[int, int],
        c_mn: tuple[int, int],
        batch: tuple[int, ...],
        batch_strides: list[tuple[int, ...]],
        alpha: float,
        beta: float,
    ) -> None:
        m, n, k = mnk
        if out.size == 0:
            self.skip([out])
            return
        bshape, bstrides = collapse(batch, batch_strides) if batch else ((1,), [(0,)] * 3)
        if len(bshape) > 3:
            raise UnsupportedOperationError(
                f"opencl: matmul over {len(bshape)} independent broadcast batch dimensions"
                " (at most 3) is not implemented yet"
            )
        pad = 3 - len(bshape)
        bshape = (1,) * pad + bshape
        bstrides = [(0,) * pad + s for s in bstrides]
        nbatch = prod(bshape)
        packed = out.dtype in _PACKED_DTYPES and (c is None or c.dtype is out.dtype)
        tiled = self._tiled_gemm(out, a, b, c, mnk, a_mk, b_kn, c_mn, bshape, bstrides, alpha, beta)
        if k and packed and m * n * k * nbatch >= PACKED_MIN_WORK:
            self._packed_gemm(
                out, a, b, c, mnk, a_mk, b_kn, c_mn, bshape, bstrides, alpha, beta, tiled
            )
            return
        self.launch(tiled, [a, b, c], [out])

    def _tiled_gemm(
        self,
        out: Tensor,
        a: Tensor,
        b: Tensor,
        c: Tensor | None,
        mnk: tuple[int, int, int],
        a_mk: tuple[int, int],
        b_kn: tuple[int, int],
        c_mn: tuple[int, int],
        bshape: tuple[int, ...],
        bstrides: list[tuple[int, ...]],
        alpha: float,
        beta: float,
    ) -> Callable[[Any, list[Any] | None], Any]:
        """The launch of the local-memory tiled kernel (every dtype)."""
        m, n, k = mnk
        nbatch = prod(bshape)
        ts, wpt = self.backend._gemm_tiles(out.dtype)
        rts = ts // wpt
        source = gemm_source(
            a.dtype, b.dtype, c.dtype if c is not None else None, out.dtype, ts, wpt
        )
        kernel = self.backend._kernel(source, "gemm")
        global_size = (-(-n // ts) * rts, -(-m // ts) * rts, nbatch)
        local_size = (rts, rts, 1)
        t = load_type(out.dtype)
        args: list[Any] = [storage(out), storage(a), storage(b)]
        if c is not None:
            args.append(storage(c))
        args += [np.int32(m), np.int32(n), np.int32(k)]
        args += [_i64(s) for s in (*a_mk, *b_kn, *c_mn)]
        args += [_i64(bshape[1]), _i64(bshape[2])]
        for strides in bstrides:
            args += [_i64(s) for s in strides]
        args += [numpy_scalar(t, alpha), numpy_scalar(t, beta)]
        run: Callable[[Any, list[Any] | None], Any] = launch(kernel, args, global_size, local_size)
        return run

    #: The packed GEMM's block per dtype, filled on first use (``gemm_tuning.tune`` sets it).
    _gemm_blocks: dict[DType, GemmBlock]

    def _gemm_block(self, dtype: DType) -> GemmBlock:
        """The packed GEMM's block for ``dtype``: the one ``gemm_tuning.tune`` is timing, else
        the device's verified variant (the portable block until verification ends)."""
        block = self.__dict__.get("_gemm_blocks", {}).get(dtype)
        if block is None:
            block = self.backend._variant(f"gemm_packed.{dtype.value}")
        return block  # type: ignore[no-any-return]  # variants' values are Any (per family)

    def _packed_gemm(
        self,
        out: Tensor,
        a: Tensor,
        b: Tensor,
        c: Tensor | None,
        mnk: tuple[int, int, int],
        a_mk: tuple[int, int],
        b_kn: tuple[int, int],
        c_mn: tuple[int, int],
        bshape: tuple[int, ...],
        bstrides: list[tuple[int, ...]],
        alpha: float,
        beta: float,
        tiled: Callable[[Any, list[Any] | None], Any],
    ) -> None:
        """Pack A and B^T into zero-padded panels (once per batch item; once in all for an
        operand broadcast over the batch), then multiply the panels (``opencl_linalg``)."""
        m, n, k = mnk
        dt = out.dtype
        block = self._gemm_block(dt)
        rm, rn = block.rows, block.cols
        mp, np_, kp = -(-m // rm) * rm, -(-n // rn) * rn, -(-k // block.k_unroll) * block.k_unroll
        nbatch = prod(bshape)
        batch_args = [_i64(bshape[1]), _i64(bshape[2])]
        launches: list[tuple[Any, list[Any], tuple[int, ...], Any]] = []
        packed: list[Tensor] = []
        pz: list[int] = []
        # (operand, rows, row stride, k stride, batch strides, rows per block)
        for x, rows, sr, sk, sb, blk in (
            (a, m, a_mk[0], a_mk[1], bstrides[0], rm),
            (b, n, b_kn[1], b_kn[0], bstrides[1], rn),
        ):
            rp = -(-rows // blk) * blk
            nb = nbatch if any(sb) else 1
            p = self.empty((nb * rp * kp,), dt)
            kernel = self.backend._kernel(gemm_pack_source(x.dtype, dt, blk), "pack")
            args = [storage(p), storage(x), np.int32(rows), np.int32(k), np.int32(kp), _i64(sr)]
            args += [_i64(sk), *batch_args, *(_i64(s) for s in sb), _i64(rp * kp)]
            launches.append((kernel, args, (kp, rp // blk, nb), None))
            packed.append(p)
            pz.append(rp * kp if nb > 1 else 0)
        kernel = self.backend._kernel(gemm_packed_source(dt, c is not None, block), "gemm_packed")
        t = load_type(dt)
        args = [storage(out), storage(packed[0]), storage(packed[1])]
        if c is not None:
            args.append(storage(c))
        args += [np.int32(m), np.int32(n), np.int32(kp), _i64(pz[0]), _i64(pz[1])]
        args += [_i64(c_mn[0]), _i64(c_mn[1]), *batch_args, *(_i64(s) for s in bstrides[2])]
        args += [numpy_scalar(t, alpha), numpy_scalar(t, beta)]
        gsize = (np_ // rn, mp // rm, nbatch)
        # The work-group shape matters on PoCL (each group runs as one loop nest on one core);
        # where the preferred one does not divide the grid, its largest divisor that does.
        local = (math.gcd(gsize[0], block.local[0]), math.gcd(gsize[1], block.local[1]), 1)
        launches.append((kernel, args, gsize, local))

        family = f"gemm_packed.{dt.value}"

        def run(queue: Any, wait_for: list[Any] | None) -> Any:
            try:  # build all three first: nothing is enqueued unless all of them built
                for kern, *_ in launches:
                    kern.get()
            except KernelCompileError as exc:
                # A verified block that does not build here after all: the tiled kernel runs
                # (this time and from now on), and the route is recorded.
                self.backend._variant_failed(family, exc)
                return tiled(queue, wait_for)
            event = None
            for kern, kargs, g, loc in launches:
                event = enqueue_kernel(queue, kern, kargs, g, loc, wait_for)
                wait_for = None  # the queue is in order
            return event

        self.launch(run, [a, b, c], [out], keepalive=packed)

    def gemm(
        self,
        a: Tensor,
        b: Tensor,
        c: Tensor | None,
        out: Tensor,
        trans_a: bool,
        trans_b: bool,
        alpha: float,
        beta: float,
    ) -> None:
        batched = out.ndim == 3
        m, n = out.shape[-2], out.shape[-1]
        k = a.shape[-2] if trans_a else a.shape[-1]
        ra, rb = a.shape[-1], b.shape[-1]
        a_mk = (1, ra) if trans_a else (ra, 1)
        b_kn = (1, rb) if trans_b else (rb, 1)
        c_strides = broadcast_strides(c.shape, out.shape) if c is not None else (0,) * out.ndim
        batch: tuple[int, ...] = ()
        bstrides: list[tuple[int, ...]] = [(), (), ()]
        if batched:
            batch = (out.shape[0],)
            bstrides = [(a.shape[-2] * ra,), (b.shape[-2] * rb,), (c_strides[0],)]
        self._gemm_launch(
            out,
            a,
            b,
            c,
            (m, n, k),
            a_mk,
            b_kn,
            (c_strides[-2], c_strides[-1]),
            batch,
            bstrides,
            alpha,
            beta,
        )

    def matmul(self, a: Tensor, b: Tensor, out: Tensor) -> None:
        a2 = a.shape if a.ndim > 1 else (1, a.shape[0])
        b2 = b.shape if b.ndim > 1 else (b.shape[0], 1)
        m, k, n = a2[-2], a2[-1], b2[-1]
        batch = broadcast_shapes(a2[:-2], b2[:-2])
        sa = tuple(s * m * k for s in broadcast_strides(a2[:-2], batch))
        sb = tuple(s * k * n for s in broadcast_strides(b2[:-2], batch))
        self._gemm_launch(
            out, a, b, None, (m, n, k), (k, 1), (n, 1), (0, 0), batch,
            [sa, sb, (0,) * len(batch)], 1.0, 0.0,
        )  # fmt: skip

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> None:
        k = weight.shape[1]
        n = weight.shape[0]
        m = x.size // k if k else prod(x.shape[:-1])
        self._gemm_launch(
            out, x, weight, bias, (m, n, k), (k, 1), (1, k), (0, 1), (), [(), (), ()],
            1.0, 1.0 if bias is not None else 0.0,
        )  # fmt: skip
