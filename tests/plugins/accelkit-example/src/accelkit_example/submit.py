"""How the example backend's components allocate outputs and submit work.

The twist of this backend: its memory is untyped. A tensor's storage is the flat ``uint8`` array of
its pool block, and a kernel sees it typed and shaped only through :func:`array`, the way device
code reinterprets a raw pointer. Every kernel runs on the current stream's worker thread, after
the work that writes its inputs on other streams.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit import Tensor
from accelkit.sdk import HostStream, KernelBase, storage

if TYPE_CHECKING:
    from accelkit_example.backend import ExampleBackend

Array = np.ndarray[Any, Any]


def array(x: Any) -> Any:
    """The typed, shaped NumPy view of a tensor's bytes (a Python scalar or None as it is)."""
    if not isinstance(x, Tensor):
        return x
    raw: Array = storage(x)
    return raw[: x.nbytes].view(x.dtype.to_numpy()).reshape(x.shape)


class ExampleComponent(KernelBase[HostStream]):
    """Allocation and submission shared by the example backend's components.

    :class:`accelkit.sdk.KernelBase` allocates outputs from the pool on the current stream,
    makes views, and launches work after the writers of its inputs on other streams; this class
    says how a stream takes work. A tensor's storage is its pool block (the default), and a view
    shares it (nothing to reshape: the bytes are the same).
    """

    backend: ExampleBackend

    def submit(
        self,
        stream: HostStream,
        fn: Callable[..., Any],
        deps: list[tuple[Any, int]],
        hold: tuple[Any, ...],
        **options: Any,
    ) -> int:
        """Run ``fn`` on the stream's worker after ``deps``; the stream holds the tensors until
        it has run, which keeps their blocks out of the pool meanwhile."""
        return stream.submit(fn, True, deps, hold)
