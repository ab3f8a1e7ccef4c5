"""The Dask backend's FactoryKernels: fills (a graph, computed on the workers) and host arrays
(put in the graph when small, scattered to the workers when large)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from accelkit import Tensor
from accelkit.sdk import FactoryKernels, buffer_of
from accelkit.sdk import host as h
from accelkit_dask import blocks
from accelkit_dask.submit import SCATTER_BYTES, DaskComponent, unique

Array = np.ndarray[Any, Any]
#: Host arrays up to this size are literals: embedded in each graph that reads them.
LITERAL_BYTES = 64 << 10


class DaskFactoryKernels(DaskComponent, FactoryKernels):
    def fill(self, out: Tensor, value: int | float | bool) -> None:
        import dask.array as da

        dt = out.dtype.to_numpy()
        chunks = self.chunks(out.shape, dt)
        self.launch(
            lambda: da.map_blocks(
                blocks.fill,
                value,
                dt,
                dtype=dt,
                chunks=chunks,
                meta=np.empty((0,) * out.ndim, dt),
                name=unique("fill"),
            ),
            (),
            (out,),
        )

    def from_host(self, out: Tensor, array: Array) -> None:
        # Snapshot now (the caller may reuse its array at once), in the tensor's dtype.
        typed = np.empty(out.shape, out.dtype.to_numpy())
        h.assign(typed, np.asarray(array))
        self.put(out, typed)

    def generate(self, out: Tensor, make: Callable[[], Array]) -> None:
        # Random tensors are made on the host, in stream order, then sent like host data.
        def run() -> None:
            typed = np.empty(out.shape, out.dtype.to_numpy())
            h.assign(typed, make())
            self.graphs.upload(buffer_of(out), typed, self.chunks(typed.shape, typed.dtype))

        self.run_heavy(run, (out,))

    def put(self, out: Tensor, typed: Array) -> None:
        """``typed`` (a private array of out's shape and dtype) as out's content."""
        chunks = self.chunks(typed.shape, typed.dtype)
        if typed.nbytes <= LITERAL_BYTES:  # tiny: a literal in the graphs that use it
            self.launch(lambda: self.graphs.scatter(typed, chunks), (), (out,), literal=True)
            return
        if typed.nbytes <= SCATTER_BYTES:  # small: in the graph, sent with the next flush
            self.launch(lambda: self.graphs.scatter(typed, chunks), (), (out,))
            return

        def run() -> None:  # large: sent off the event loop
            self.graphs.upload(buffer_of(out), typed, chunks)

        self.run_heavy(run, (out,))
