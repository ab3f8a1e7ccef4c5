"""The Dask backend's TensorKernels: every kernel as a blockwise dask graph.

Each kernel maps its output's blocks to tasks that move as little data as the op allows, and
runs :mod:`accelkit_dask.blocks` (accelkit's CPU kernels) on each block:

- elementwise ops: one task per output block; broadcast operands are broadcast per block;
- reductions: a tree (partials per block, combined ``split_every`` at a time, divided once for
  a mean); arg-reductions gather the reduced axis into one block per row;
- GEMM, matmul, linear: one task per output block, from a row panel of ad and a column panel of
  bd (the reduction over kd inside the task);
- softmax, norms, cross-entropy: per block of rows, the normalised axis whole;
- attention: per block of (batch, KV-head group), sequence and head dimensions whole;
- conv2d: per block of images, the weights whole;
- gather, embedding: per block of indices, the indexed axis whole;
- scatter, and an arg-reduction over every axis, need all of their input in one task: they
  gather it, and say so in ``backend.plans``.

The core has validated every argument and allocated the outputs; a kernel only builds graphs.
"""

from __future__ import annotations

import string
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit import Tensor
from accelkit.sdk import Operand, TensorKernels, prod
from accelkit_dask import blocks
from accelkit_dask.submit import DaskComponent, unique

if TYPE_CHECKING:
    import dask.array as da

Chunks = tuple[tuple[int, ...], ...]
LETTERS = string.ascii_lowercase


def meta(dt: np.dtype[Any], ndim: int) -> Any:
    return np.empty((0,) * ndim, dt)


def conform(x: da.Array, shape: tuple[int, ...], chunks: Chunks) -> da.Array:
    """``x`` broadcast (NumPy's rules) to ``shape`` and chunked as ``chunks``."""
    import dask.array as da

    if x.shape == shape:
        return x if x.chunks == chunks else x.rechunk(chunks)
    off = len(shape) - x.ndim
    own = tuple(chunks[off + i] if n == shape[off + i] else (n,) for i, n in enumerate(x.shape))
    if x.chunks != own:
        x = x.rechunk(own)
    return da.broadcast_to(x, shape, chunks=chunks)


def whole(x: da.Array, axes: tuple[int, ...] | None = None) -> da.Array:
    """``x`` with ``axes`` (every axis when None) in one chunk."""
    if axes is None:
        axes = tuple(range(x.ndim))
    if all(len(x.chunks[a]) <= 1 for a in axes):
        return x
    return x.rechunk({a: -1 for a in axes})


class DaskTensorKernels(DaskComponent, TensorKernels):
    # -- helpers ----------------------------------------------------------------------------------
    def _elementwise(self, fn: Any, op: str, operands: list[Any], out: Tensor, *params: Any) -> Any:
        import dask.array as da

        dt = out.dtype.to_numpy()
        arrays = [self.operand(o) for o in operands]
        ref = next((a for a in arrays if isinstance(a, da.Array) and a.shape == out.shape), None)
        chunks = ref.chunks if ref is not None else self.chunks(out.shape, dt)
        index = LETTERS[: out.ndim]
        args: list[Any] = []
        for a in arrays:
            if isinstance(a, da.Array):
                args += [conform(a, out.shape, chunks), index]
            else:
                args += [a, None]
        for p in params:
            args += [p, None]
        # blockwise, not map_blocks: the same graph without inspecting fn's signature per op
        return da.blockwise(
            fn, index, *args, dtype=dt, meta=meta(dt, out.ndim), name=unique(op), concatenate=True
        )

    def _gathered(self, op: str, reason: str) -> None:
        self.backend.record_plan(op, gathered=True, reason=reason)

    # -- elementwise ------------------------------------------------------------------------------
    def unary(self, op: str, x: Tensor, out: Tensor) -> None:
        dt = out.dtype.to_numpy()
        self.launch(lambda: self._elementwise(blocks.unary, op, [x], out, op, dt), (x,), (out,))

    def binary(self, op: str, a: Operand, b: Operand, out: Tensor) -> None:
        dt = out.dtype.to_numpy()
        self.launch(
            lambda: self._elementwise(blocks.binary, op, [a, b], out, op, dt), (a, b), (out,)
        )

    def where(self, cond: Tensor, a: Operand, b: Operand, out: Tensor) -> None:
        dt = out.dtype.to_numpy()
        self.launch(
            lambda: self._elementwise(blocks.where, "where", [cond, a, b], out, dt),
            (cond, a, b),
            (out,),
        )

    def cast(self, x: Tensor, out: Tensor) -> None:
        dt = out.dtype.to_numpy()
        self.launch(lambda: self._elementwise(blocks.cast, "cast", [x], out, dt), (x,), (out,))

    # -- linear algebra ---------------------------------------------------------------------------
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
        import dask.array as da

        dt = out.dtype.to_numpy()

        def build() -> Any:
            # Output block (i, k) reads row panel i of A and column panel k of B: the reduction
            # over K happens inside the task, on the concatenated panels. A batched GEMM has
            # the batch as a leading blockwise index.
            ad, bd = self.arr(a), self.arr(b)
            lead = "z" if out.ndim == 3 else ""
            if lead:
                bc = ad.chunks[0]
                ad = conform(ad, a.shape, (bc, *ad.chunks[1:]))
                bd = conform(bd, b.shape, (bc, *bd.chunks[1:]))
            i_chunks = ad.chunks[-1] if trans_a else ad.chunks[-2]
            k_chunks = bd.chunks[-2] if trans_b else bd.chunks[-1]
            cd: Any = None
            if c is not None:
                cd = conform(self.arr(c), out.shape, (*ad.chunks[:-2], i_chunks, k_chunks))
            return da.blockwise(
                blocks.gemm,
                lead + "ik",
                ad,
                lead + ("ji" if trans_a else "ij"),
                bd,
                lead + ("kj" if trans_b else "jk"),
                cd,
                lead + "ik" if cd is not None else None,
                trans_a,
                None,
                trans_b,
                None,
                alpha,
                None,
                beta,
                None,
                dt,
                None,
                dtype=dt,
                meta=meta(dt, out.ndim),
                name=unique("gemm"),
                concatenate=True,
            )

        self.launch(build, (a, b, c), (out,))

    def matmul(self, a: Tensor, b: Tensor, out: Tensor) -> None:
        import dask.array as da

        dt = out.dtype.to_numpy()

        def build() -> Any:
            ad, bd = self.arr(a), self.arr(b)
            if ad.ndim < 2 or bd.ndim < 2:  # a vector operand: one task (vectors are small)
                return one_task(blocks.matmul, "matmul", [ad, bd], out.shape, dt, dt, out.shape)
            batch = out.shape[:-2]
            bc = _batch_chunks(batch, ad, bd)
            a2 = conform(ad, (*batch, *ad.shape[-2:]), (*bc, *ad.chunks[-2:]))
            b2 = conform(bd, (*batch, *bd.shape[-2:]), (*bc, *bd.chunks[-2:]))
            lead = LETTERS[: len(batch)]
            return da.blockwise(
                blocks.matmul,
                lead + "yz",
                a2,
                lead + "yx",
                b2,
                lead + "xz",
                dt,
                None,
                dtype=dt,
                meta=meta(dt, out.ndim),
                name=unique("matmul"),
                concatenate=True,
            )

        self.launch(build, (a, b), (out,))

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> None:
        import dask.array as da

        dt = out.dtype.to_numpy()

        def build() -> Any:
            xd, wd = self.arr(x), self.arr(weight)
            lead = LETTERS[: x.ndim - 1]
            biasd = self.arr(bias) if bias is not None else None
            return da.blockwise(
                blocks.linear,
                lead + "z",
                xd,
                lead + "y",
                wd,
                "zy",
                biasd,
                "z" if biasd is not None else None,
                dt,
                None,
                dtype=dt,
                meta=meta(dt, out.ndim),
                name=unique("linear"),
                concatenate=True,
            )

        self.launch(build, (x, weight, bias), (out,))

    # -- reductions -------------------------------------------------------------------------------
    def reduce(
        self, op: str, x: Tensor, axes: tuple[int, ...], keepdims: bool, out: Tensor
    ) -> None:
        dt = out.dtype.to_numpy()

        def build() -> Any:
            xd = self.arr(x)
            if op in ("argmax", "argmin") or xd.size == 0 or not axes:
                return self._reduce_whole(op, xd, axes, keepdims, out)
            return tree_reduce(xd, op, axes, keepdims, dt, self.backend.split_every)

        self.launch(build, (x,), (out,))

    def _reduce_whole(
        self, op: str, xd: da.Array, axes: tuple[int, ...], keepdims: bool, out: Tensor
    ) -> Any:
        import dask.array as da

        dt = out.dtype.to_numpy()
        flat = len(axes) == xd.ndim and xd.ndim != 1 and op in ("argmax", "argmin")
        if flat:
            if xd.npartitions > 1:
                self._gathered(op, f"{op} over every axis needs the whole tensor in one task")
            xd = whole(xd)
        else:
            xd = whole(xd, axes)
        chunks = tuple(
            ((1,) if keepdims else None) if i in axes or flat else c
            for i, c in enumerate(xd.chunks)
        )
        kept = tuple(c for c in chunks if c is not None)
        return da.map_blocks(
            blocks.reduce_whole,
            xd,
            op,
            axes,
            keepdims,
            dt,
            dtype=dt,
            meta=meta(dt, out.ndim),
            chunks=kept,
            name=unique(op),
            drop_axis=[] if keepdims else [i for i in range(xd.ndim) if i in axes or flat],
        )

    # -- shape ------------------------------------------------------------------------------------
    def permute(self, x: Tensor, axes: tuple[int, ...], out: Tensor) -> None:
        import dask.array as da

        self.launch(lambda: da.transpose(self.arr(x), axes), (x,), (out,))

    def concat(self, tensors: list[Tensor], axis: int, out: Tensor) -> None:
        import dask.array as da

        dt = out.dtype.to_numpy()

        def build() -> Any:
            res = da.concatenate([self.arr(t) for t in tensors], axis=axis)
            return res if res.dtype == dt else res.astype(dt)

        self.launch(build, tensors, (out,))

    def narrow(self, x: Tensor, axis: int, start: int, out: Tensor) -> None:
        def build() -> Any:
            index: list[Any] = [slice(None)] * x.ndim
            index[axis] = slice(start, start + out.shape[axis])
            return self.arr(x)[tuple(index)]

        self.launch(build, (x,), (out,))

    def gather(self, x: Tensor, axis: int, index: Tensor, out: Tensor) -> None:
        import dask.array as da

        dt = out.dtype.to_numpy()

        def build() -> Any:
            # Per block of indices; the gathered axis of x arrives whole (concatenated).
            xd, idx = self.arr(x), self.arr(index)
            corner = tuple(
                slice(None) if d == axis else slice(0, index.shape[d]) for d in range(x.ndim)
            )
            xd = xd[corner]
            ind = LETTERS[: x.ndim]
            x_ind = ind[:axis] + "z" + ind[axis + 1 :]
            return da.blockwise(
                blocks.gather,
                ind,
                xd,
                x_ind,
                idx,
                ind,
                axis,
                None,
                dtype=dt,
                meta=meta(dt, out.ndim),
                name=unique("gather"),
                concatenate=True,
            )

        self.launch(build, (x, index), (out,))

    def scatter(
        self, x: Tensor, axis: int, index: Tensor, src: Tensor | int | float, out: Tensor
    ) -> None:
        import dask.array as da

        dt = out.dtype.to_numpy()

        def build() -> Any:
            xd = self.arr(x)
            if xd.npartitions > 1:
                self._gathered("scatter", "scatter writes anywhere along its axis: one task")
            sd = whole(self.arr(src)) if isinstance(src, Tensor) else src
            return da.map_blocks(
                blocks.scatter,
                whole(xd),
                whole(self.arr(index)),
                sd,
                axis,
                dtype=dt,
                meta=meta(dt, out.ndim),
                chunks=tuple((n,) for n in out.shape),
                name=unique("scatter"),
            )

        self.launch(build, (x, index, src), (out,))

    # -- optional kernels: without them the core composes these from the ones above ----------------
    def take(self, x: Tensor, axis: int, index: np.ndarray[Any, Any] | range, out: Tensor) -> None:
        import dask.array as da

        idx = np.arange(index.start, index.stop, index.step) if isinstance(index, range) else index
        # dask's own take: each output block reads only the input blocks its indices touch.
        self.launch(
            lambda: da.take(self.arr(x), np.asarray(idx, np.int64), axis=axis), (x,), (out,)
        )

    def cumulative(
        self, op: str, x: Tensor, axis: int, exclusive: bool, reverse: bool, out: Tensor
    ) -> None:
        self._along(blocks.cumulative, f"cum{op}", x, axis, out, op, axis, exclusive, reverse)

    def argsort(self, x: Tensor, axis: int, descending: bool, out: Tensor) -> None:
        self._along(blocks.argsort, "argsort", x, axis, out, axis, descending)

    def scatter_reduce(
        self, op: str, x: Tensor, axis: int, index: Tensor, src: Tensor | int | float, out: Tensor
    ) -> None:
        import dask.array as da

        dt = out.dtype.to_numpy()

        def build() -> Any:
            xd = self.arr(x)
            if xd.npartitions > 1:
                self._gathered("scatter_reduce", "scatter writes anywhere along its axis: one task")
            sd = whole(self.arr(src)) if isinstance(src, Tensor) else src
            return da.map_blocks(
                blocks.scatter_reduce,
                whole(xd),
                whole(self.arr(index)),
                sd,
                op,
                axis,
                dtype=dt,
                meta=meta(dt, out.ndim),
                chunks=tuple((n,) for n in out.shape),
                name=unique(f"scatter_{op}"),
            )

        self.launch(build, (x, index, src), (out,))

    def _image(self, kind: str, x: Tensor, out: Tensor, *taps: Any) -> None:
        import dask.array as da

        dt = out.dtype.to_numpy()
        self.launch(
            lambda: da.map_blocks(
                blocks.image,
                whole(self.arr(x), (2, 3)),
                kind,
                dt,
                *taps,
                dtype=dt,
                meta=meta(dt, 4),
                name=unique(kind),
            ),
            (x,),
            (out,),
        )

    def depthwise(self, x: Tensor, kernel: np.ndarray[Any, Any], out: Tensor) -> None:
        self._image("depthwise", x, out, np.array(kernel, copy=True))

    def separable_filter(
        self, x: Tensor, col: np.ndarray[Any, Any], row: np.ndarray[Any, Any], out: Tensor
    ) -> None:
        self._image("separable", x, out, np.array(col, copy=True), np.array(row, copy=True))

    def sobel_magnitude(self, x: Tensor, out: Tensor) -> None:
        self._image("sobel", x, out)

    # -- neural-network ops -----------------------------------------------------------------------
    def conv2d(
        self,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        out: Tensor,
        stride: tuple[int, int],
        padding: tuple[int, int],
        dilation: tuple[int, int],
        groups: int,
    ) -> None:
        import dask.array as da

        dt = out.dtype.to_numpy()
        o, ho, wo = out.shape[1:]

        def build() -> Any:
            # Per block of images; channels, rows, columns and the weights whole in each task.
            xd = whole(self.arr(x), (1, 2, 3))
            wd = self.arr(weight)
            biasd = self.arr(bias) if bias is not None else None
            return da.blockwise(
                blocks.conv2d,
                "nabc",
                xd,
                "nabc",
                wd,
                "pqrs",
                biasd,
                "t" if biasd is not None else None,
                (ho, wo),
                None,
                stride,
                None,
                padding,
                None,
                dilation,
                None,
                groups,
                None,
                dt,
                None,
                dtype=dt,
                meta=meta(dt, 4),
                name=unique("conv2d"),
                concatenate=True,
                adjust_chunks={"a": o, "b": ho, "c": wo},
            )

        self.launch(build, (x, weight, bias), (out,))

    def attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        out: Tensor,
        scale: float,
        causal: bool,
    ) -> None:
        import dask.array as da

        dt = out.dtype.to_numpy()
        b, h, s, _ = q.shape
        hk, skv = k.shape[1], k.shape[2]
        group = h // hk

        def build() -> Any:
            # Split over batch and over groups of KV heads (with the query heads they serve);
            # sequences and head dimensions whole in each task.
            qd, kd, vd = self.arr(q), self.arr(k), self.arr(v)
            bc = qd.chunks[0]
            kc = kd.chunks[1]
            qc = tuple(c * group for c in kc)
            qd = conform(qd, q.shape, (bc, qc, (s,), (q.shape[3],)))
            kd = conform(kd, k.shape, (bc, kc, (skv,), (k.shape[3],)))
            vd = conform(vd, v.shape, (bc, kc, (skv,), (v.shape[3],)))
            md = None
            if mask is not None:
                md = conform(self.arr(mask), (b, h, s, skv), (bc, qc, (s,), (skv,)))
            return da.blockwise(
                blocks.attention,
                "bhse",
                qd,
                "bhsd",
                kd,
                "bhtd",
                vd,
                "bhte",
                md,
                "bhst" if md is not None else None,
                scale,
                None,
                causal,
                None,
                dt,
                None,
                dtype=dt,
                meta=meta(dt, 4),
                name=unique("attention"),
                concatenate=True,
                align_arrays=False,
            )

        self.launch(build, (q, k, v, mask), (out,))

    def softmax(self, x: Tensor, axis: int, out: Tensor, log: bool) -> None:
        self._along(blocks.softmax, "softmax", x, axis, out, axis, log)

    def _along(self, fn: Any, op: str, x: Tensor, axis: int, out: Tensor, *params: Any) -> None:
        """``fn(block, *params, result dtype)`` per block, ``axis`` whole in every block (an
        op along one axis: softmax, scans, sorts); out has x's shape."""
        import dask.array as da

        dt = out.dtype.to_numpy()
        self.launch(
            lambda: da.map_blocks(
                fn,
                whole(self.arr(x), (axis,)),
                *params,
                dt,
                dtype=dt,
                meta=meta(dt, out.ndim),
                name=unique(op),
            ),
            (x,),
            (out,),
        )

    def _rowwise(self, fn: Any, op: str, x: Tensor, params: list[Any], out: Tensor) -> Any:
        """``fn`` per block of rows, the last axis whole; 1-d ``params`` tensors along it."""
        import dask.array as da

        dt = out.dtype.to_numpy()
        xd = whole(self.arr(x), (x.ndim - 1,))
        ind = LETTERS[: x.ndim]
        args: list[Any] = []
        for p in params:
            if isinstance(p, Tensor):
                args += [whole(self.arr(p)), ind[-1]]
            else:
                args += [p, None]
        return da.blockwise(
            fn,
            ind,
            xd,
            ind,
            *args,
            dt,
            None,
            dtype=dt,
            meta=meta(dt, out.ndim),
            name=unique(op),
            concatenate=True,
        )

    def layer_norm(
        self, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, out: Tensor
    ) -> None:
        self.launch(
            lambda: self._rowwise(blocks.layer_norm, "layer_norm", x, [weight, bias, eps], out),
            (x, weight, bias),
            (out,),
        )

    def rms_norm(self, x: Tensor, weight: Tensor | None, eps: float, out: Tensor) -> None:
        self.launch(
            lambda: self._rowwise(blocks.rms_norm, "rms_norm", x, [weight, eps], out),
            (x, weight),
            (out,),
        )

    def cross_entropy(
        self, logits: Tensor, targets: Tensor, reduction: str, loss: Tensor, probs: Tensor
    ) -> None:
        import dask.array as da

        ldt, pdt = loss.dtype.to_numpy(), probs.dtype.to_numpy()
        acc = blocks.accumulator(ldt)

        def build() -> Any:
            ld = whole(self.arr(logits), (1,))
            td = self.arr(targets).rechunk((ld.chunks[0],))
            pd = da.blockwise(
                blocks.cross_entropy_rows,
                "nc",
                ld,
                "nc",
                td,
                "n",
                "probs",
                None,
                acc,
                None,
                pdt,
                None,
                dtype=pdt,
                meta=meta(pdt, 2),
                name=unique("probs"),
                concatenate=True,
            )
            rows = da.blockwise(
                blocks.cross_entropy_rows,
                "n",
                ld,
                "nc",
                td,
                "n",
                "loss",
                None,
                acc,
                None,
                pdt,
                None,
                dtype=np.float64,
                meta=meta(np.dtype(np.float64), 1),
                name=unique("loss_rows"),
                concatenate=True,
            )
            if reduction == "none":
                value = da.map_blocks(
                    blocks.cast, rows, ldt, dtype=ldt, meta=meta(ldt, 1), name=unique("loss")
                )
            elif rows.size == 0:
                value = self._reduce_whole(reduction, rows, (0,), False, loss)
            else:
                value = tree_reduce(rows, reduction, (0,), False, ldt, self.backend.split_every)
            return value, pd

        self.launch(build, (logits, targets), (loss, probs))

    def embedding(self, indices: Tensor, weight: Tensor, out: Tensor) -> None:
        import dask.array as da

        dt = out.dtype.to_numpy()

        def build() -> Any:
            idx, wd = self.arr(indices), self.arr(weight)
            ind = LETTERS[: indices.ndim]
            return da.blockwise(
                blocks.embedding,
                ind + "z",
                idx,
                ind,
                wd,
                "yz",
                dtype=dt,
                meta=meta(dt, out.ndim),
                name=unique("embedding"),
                concatenate=True,
            )

        self.launch(build, (indices, weight), (out,))

    def adam_update(
        self,
        param: Tensor,
        grad: Tensor,
        m: Tensor,
        v: Tensor,
        lr: float,
        beta1: float,
        beta2: float,
        eps: float,
        step: int,
        weight_decay: float,
    ) -> None:
        import dask.array as da

        def build() -> Any:
            pd = self.arr(param)
            gd, md, vd = (conform(self.arr(t), param.shape, pd.chunks) for t in (grad, m, v))
            hyper = (lr, beta1, beta2, eps, step, weight_decay)
            return tuple(
                da.map_blocks(
                    blocks.adam,
                    pd,
                    gd,
                    md,
                    vd,
                    which,
                    *hyper,
                    dtype=t.dtype.to_numpy(),
                    meta=meta(t.dtype.to_numpy(), t.ndim),
                    name=unique(f"adam{which}"),
                )
                for which, t in enumerate((param, m, v))
            )

        self.launch(build, (param, grad, m, v), (param, m, v))


def one_task(
    fn: Any, op: str, arrays: list[da.Array], shape: tuple[int, ...], dt: Any, *params: Any
) -> Any:
    """``fn(*arrays, *params)`` as one task on whole arrays, giving one block of ``shape``."""
    import dask.array as da

    out_ind = LETTERS[: len(shape)]
    args: list[Any] = []
    used = len(shape)
    for a in arrays:
        args += [a, LETTERS[used : used + a.ndim]]
        used += a.ndim
    for p in params:
        args += [p, None]
    return da.blockwise(
        fn,
        out_ind,
        *args,
        new_axes=dict(zip(out_ind, shape, strict=True)),
        concatenate=True,
        dtype=dt,
        meta=meta(np.dtype(dt), len(shape)),
        name=unique(op),
    )


def tree_reduce(
    xd: da.Array,
    op: str,
    axes: tuple[int, ...],
    keepdims: bool,
    dt: np.dtype[Any],
    split_every: int | None,
) -> Any:
    """``op`` over ``axes`` as a tree: a partial per block, combined ``split_every`` at a time."""
    import dask.array as da

    acc = np.dtype(np.float64) if op == "mean" else blocks.accumulator(dt)
    count = prod(tuple(xd.shape[a] for a in axes))
    out_ndim = xd.ndim if keepdims else xd.ndim - len(axes)
    return da.reduction(
        xd,
        partial(blocks.reduce_chunk, op=op, acc=acc),
        partial(blocks.reduce_aggregate, op=op, acc=acc, rt=dt, count=count),
        combine=partial(blocks.reduce_combine, op=op, acc=acc),
        axis=axes,
        keepdims=keepdims,
        dtype=dt,
        split_every=split_every,
        meta=meta(dt, out_ndim),
        name=f"accelkit-{op}",
        concatenate=True,
    )


def _batch_chunks(batch: tuple[int, ...], *arrays: da.Array) -> tuple[tuple[int, ...], ...]:
    """Chunks of the broadcast batch dimensions: an operand's where it has the dimension."""
    chunks = []
    for d, n in enumerate(batch):
        found: tuple[int, ...] = (n,)
        for a in arrays:
            off = len(batch) - (a.ndim - 2)
            i = d - off
            if i >= 0 and a.shape[i] == n and n > 1:
                found = a.chunks[i]
                break
        chunks.append(found)
    return tuple(chunks)
