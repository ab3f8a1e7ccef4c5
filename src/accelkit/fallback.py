"""Opt-in fallback: an operation a backend refuses runs on another backend, and says so.

``open_backend("opencl", fallback="cpu")`` wraps the backend's TensorOps: a call that raises
:class:`~accelkit.errors.UnsupportedOperationError` (refused at submission, so nothing was queued)
is run on the fallback backend instead. Its tensor arguments travel through the host, and the
result comes back the same way, as a tensor of the primary backend. Every such event is logged
(a warning, the first time per op), recorded in ``events`` and counted in ``counts``: a fallback
is never silent. The transfers block the calling thread; fallback is for correctness on a backend
with gaps, not for speed.
"""

from __future__ import annotations

import inspect
import logging
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from accelkit.errors import UnsupportedOperationError
from accelkit.routes import Route
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit.abc.backend import ComputeBackend
    from accelkit.ops.tensor_ops import TensorOps

__all__ = ["IN_PLACE", "FallbackEvent", "FallbackTensorOps"]

log = logging.getLogger("accelkit.fallback")


#: One operation that ran on the fallback backend: a :class:`~accelkit.routes.Route` with
#: ``route="fallback"`` (the shape KernelOps records its routes in).
FallbackEvent = Route


class FallbackTensorOps:
    """The primary backend's TensorOps, with refused operations run on ``fallback``."""

    def __init__(self, primary: ComputeBackend, primary_ops: TensorOps, fallback: ComputeBackend):
        self._backend = primary
        self._ops = primary_ops
        self._fallback = fallback
        self.events: list[FallbackEvent] = []
        self.counts: Counter[str] = Counter()

    @property
    def fallback_backend(self) -> ComputeBackend:
        return self._fallback

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._ops, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            except UnsupportedOperationError as exc:
                return self._run_elsewhere(name, args, kwargs, exc)

        call.__name__ = name
        call.__doc__ = attr.__doc__
        return call

    def _run_elsewhere(
        self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any], exc: Exception
    ) -> Any:
        fb = self._fallback
        event = Route(
            op=op, backend=self._backend.name, route="fallback", reason=str(exc), fallback=fb.name
        )
        if not self.counts[op]:
            log.warning("%s: %s runs on %s instead (%s)", self._backend.name, op, fb.name, exc)
        self.events.append(event)
        self.counts[op] += 1
        copies: list[tuple[Tensor, Tensor]] = []  # (the caller's tensor, its fallback copy)

        def to_fb(t: Tensor) -> Tensor:
            copy = fb.tensor_factory.from_host(t.numpy(), dtype=t.dtype)
            copies.append((t, copy))
            return copy

        mapped = _mapper(to_fb)
        result = getattr(fb.tensor_ops, op)(*mapped(args), **mapped(kwargs))
        primary = self._backend.tensor_factory
        # What the op writes in place is written back into the caller's tensors (an optimizer
        # step updated host copies, and the caller's state never changed), and a result that is
        # one of them is the caller's tensor, as without the fallback.
        written = _written(getattr(self._ops, op), op, args, kwargs)
        back: dict[int, Tensor] = {}
        for orig, copy in copies:
            if id(orig) in written:
                staged = primary.from_host(copy.numpy(), dtype=orig.dtype)
                self._backend.memory_manager.copy_dtod(orig, staged)
                back[id(copy)] = orig

        def to_primary(t: Tensor) -> Tensor:
            orig = back.get(id(t))
            return orig if orig is not None else primary.from_host(t.numpy(), dtype=t.dtype)

        return _mapper(to_primary)(result)


#: The TensorOps methods that write some of their tensor arguments in place, and which.
IN_PLACE: dict[str, tuple[str, ...]] = {
    "adam_update": ("param", "m", "v"),
    "batch_norm": ("running_mean", "running_var"),
}


def _written(
    method: Callable[..., Any], op: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> set[int]:
    """The ids of the tensors ``op`` writes in place in this call (:data:`IN_PLACE`)."""
    names = IN_PLACE.get(op)
    if not names:
        return set()
    bound = inspect.signature(method).bind(*args, **kwargs).arguments
    return {id(bound[n]) for n in names if isinstance(bound.get(n), Tensor)}


def _mapper(convert: Callable[[Tensor], Tensor]) -> Callable[[Any], Any]:
    def walk(value: Any) -> Any:
        if isinstance(value, Tensor):
            return convert(value)
        if isinstance(value, tuple):
            return tuple(walk(v) for v in value)
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        return value

    return walk
