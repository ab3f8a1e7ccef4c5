"""The Dask backend's fused KernelOps: where one task (or one task per block) beats the
composition's dozens of blockwise ops. The others compose from the TensorOps kernels.

- ``sample_token``: one task on the whole logits (its noise is drawn for the whole batch from
  one seed, so the batch cannot be split without changing the draw); the composition is
  hundreds of small ops.
- ``silu_mul``: one task per block, instead of three elementwise graphs.
- ``rms_norm_residual``: per block of rows, the sum and the norm in one pass.
"""

from __future__ import annotations

from typing import Any

from accelkit import Tensor
from accelkit.sdk import FusedKernels, SamplingParams
from accelkit_dask import blocks
from accelkit_dask.submit import DaskComponent, unique
from accelkit_dask.tensor_kernels import LETTERS, conform, meta, one_task, whole


class DaskFusedKernels(DaskComponent, FusedKernels):
    def silu_mul(self, gate: Tensor, up: Tensor, out: Tensor) -> None:
        import dask.array as da

        dt = out.dtype.to_numpy()

        def build() -> Any:
            g = self.arr(gate)
            u = conform(self.arr(up), out.shape, g.chunks) if g.shape == out.shape else None
            if u is None:
                u = self.arr(up)
                g = conform(g, out.shape, u.chunks)
            return da.map_blocks(
                blocks.silu_mul,
                g,
                u,
                dt,
                dtype=dt,
                meta=meta(dt, out.ndim),
                name=unique("silu_mul"),
            )

        self.launch(build, (gate, up), (out,))

    def rms_norm_residual(
        self,
        x: Tensor,
        residual: Tensor,
        weight: Tensor | None,
        eps: float,
        normed: Tensor,
        summed: Tensor,
    ) -> None:
        import dask.array as da

        ndt, sdt = normed.dtype.to_numpy(), summed.dtype.to_numpy()

        def build() -> Any:
            xd = whole(self.arr(x), (x.ndim - 1,))
            rd = conform(self.arr(residual), x.shape, xd.chunks)
            ind = LETTERS[: x.ndim]
            wd = whole(self.arr(weight)) if weight is not None else None
            return tuple(
                da.blockwise(
                    blocks.rms_norm_residual,
                    ind,
                    xd,
                    ind,
                    rd,
                    ind,
                    wd,
                    ind[-1] if wd is not None else None,
                    eps,
                    None,
                    which,
                    None,
                    ndt,
                    None,
                    sdt,
                    None,
                    dtype=(ndt, sdt)[which],
                    meta=meta((ndt, sdt)[which], x.ndim),
                    name=unique(f"rms_norm_residual{which}"),
                    concatenate=True,
                )
                for which in (0, 1)
            )

        self.launch(build, (x, residual, weight), (normed, summed))

    def sample_token(
        self, logits: Tensor, previous_tokens: Tensor | None, params: SamplingParams, out: Tensor
    ) -> None:
        dt = out.dtype.to_numpy()

        def build() -> Any:
            ld = self.arr(logits)
            if ld.npartitions > 1:
                self.backend.record_plan(
                    "sample_token",
                    gathered=True,
                    reason="the noise is drawn for the whole batch from one seed: one task",
                )
            head: tuple[None, ...] = ()
            if previous_tokens is None:
                arrays, head = [ld], (None,)  # the kernel's `previous` argument
            else:
                arrays = [ld, self.arr(previous_tokens)]
            return one_task(
                blocks.sample_token,
                "sample_token",
                arrays,
                out.shape,
                dt,
                *head,
                params,
                out.shape,
                dt,
            )

        self.launch(build, (logits, previous_tokens), (out,))
