"""How the example backend's components allocate outputs and submit work.

The twist of this backend: its memory is untyped. A tensor's storage is the flat ``uint8`` array of
its pool block, and a kernel sees it typed and shaped only through :func:`array`, the way device
code reinterprets a raw pointer. Every kernel runs on the current stream's worker thread, after
the work that writes its inputs on other streams.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit import Tensor
from accelkit.dtype import DType
from accelkit.sdk import HostStream, last_writer, mark_written, new_tensor, prod, storage, view_of

if TYPE_CHECKING:
    from accelkit_example.backend import ExampleBackend

Array = np.ndarray[Any, Any]


def array(x: Any) -> Any:
    """The typed, shaped NumPy view of a tensor's bytes (a Python scalar or None as it is)."""
    if not isinstance(x, Tensor):
        return x
    raw: Array = storage(x)
    return raw[: x.nbytes].view(x.dtype.to_numpy()).reshape(x.shape)


class ExampleComponent:
    """Allocation and submission shared by the example backend's components."""

    def __init__(self, backend: ExampleBackend) -> None:
        self._backend = backend

    @property
    def backend(self) -> ExampleBackend:
        return self._backend

    def empty(self, shape: tuple[int, ...], dtype: DType) -> Tensor:
        backend = self._backend
        buf = backend.pool.allocate(prod(shape) * dtype.itemsize)
        stream = backend.current_stream
        return new_tensor(backend, buf, buf.handle, shape, dtype, stream.device, stream)

    def view(self, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        return view_of(x, shape)  # the same bytes: nothing to reshape

    def launch(
        self, fn: Callable[[], None], inputs: Iterable[Any], outputs: Iterable[Tensor]
    ) -> None:
        """Run ``fn`` on the current stream's worker after the inputs' writers on other streams;
        the outputs are then written by it. ``fn`` reaches the tensors through its closure, which
        keeps their blocks out of the pool until it has run."""
        stream: HostStream = self._backend.current_stream  # type: ignore[assignment]
        deps: list[tuple[HostStream, int]] = []
        for t in inputs:
            if isinstance(t, Tensor):
                writer, seq = last_writer(t)
                if writer is not stream:
                    deps.append((writer, seq))  # type: ignore[arg-type]
        seq = stream.submit(fn, True, deps)
        mark_written(outputs, stream, seq)
