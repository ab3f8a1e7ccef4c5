"""The functions users call first: ``devices``, ``create_backend`` and ``open_backend``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import TYPE_CHECKING, NoReturn

import anyio

from accelkit.device import Device, DeviceInfo
from accelkit.errors import InvalidArgumentError, UnsupportedOperationError

if TYPE_CHECKING:
    from accelkit.abc.backend import ComputeBackend
    from accelkit.capabilities import Requirements
    from accelkit.registry import Registry
    from accelkit.selector import Selection

__all__ = ["BackendContext", "create_backend", "devices", "open_backend"]


def devices(refresh: bool = False) -> list[DeviceInfo]:
    """Every device of every usable backend plugin (probed once, cached; no backend imported)."""
    from accelkit.registry import default_registry

    return default_registry.devices(refresh=refresh)


def _resolve(
    target: str | Device | Selection | None,
    requires: Requirements | None,
    policy: str,
    registry: Registry | None,
    env: bool = True,
) -> tuple[str, Device]:
    """(backend name, device) for what the user asked for. The public boundary: a device's
    string form is parsed here, once; everything further in takes the :class:`Device`.
    ``env``: whether ``ACCELKIT_BACKEND`` and ``ACCELKIT_DEVICE`` apply (not to a fallback)."""
    from accelkit.registry import default_registry
    from accelkit.selector import Selection, _select

    reg = registry or default_registry
    if isinstance(target, Selection):
        return target.backend, target.device
    if isinstance(target, str):
        text = target.strip()
        if ":" in text:  # a device ('cuda:1', 'dask://host:8786'): the best backend for it
            target = Device.parse(text)
        else:
            return _resolve_name(text.lower(), requires, policy, reg, env)
    if target is None or isinstance(target, Device):
        sel = _select(target, requires, policy, None, reg, env=env)
        return sel.backend, sel.device
    raise InvalidArgumentError(
        "expected a backend name ('cpu'), a device ('cuda:0'), a Device or a Selection; got"
        f" {type(target).__name__}"
    )


def _resolve_name(
    text: str, requires: Requirements | None, policy: str, reg: Registry, env: bool
) -> tuple[str, Device]:
    """(backend name, device) for a backend name ('cpu': its best device) or a device kind
    ('cuda': the best backend and device of that kind)."""
    from accelkit.selector import _select

    if text in reg.names():
        sel = _select(None, requires, policy, text, reg, env=env)
        return sel.backend, sel.device
    kinds = {kind for d in reg.descriptors() for kind in d.device_kinds}
    if text not in kinds:
        from accelkit.errors import BackendNotFoundError
        from accelkit.registry import not_found_hint

        raise BackendNotFoundError(
            f"no backend named {text!r} is installed, and no installed backend drives devices of"
            f" kind {text!r} (installed: {', '.join(reg.names()) or 'none'})"
            + not_found_hint(text, [*reg.names(), *kinds])
        )
    sel = _select(text, requires, policy, None, reg, env=env)  # a device kind ('cuda')
    return sel.backend, sel.device


def create_backend(
    target: str | Device | Selection | None = None,
    *,
    requires: Requirements | None = None,
    policy: str = "performance",
    registry: Registry | None = None,
    isolate: bool = False,
) -> ComputeBackend:
    """A backend, not yet initialized, for a backend name (``"cpu"``), a device kind
    (``"cuda"``), a device (``"cuda:1"``), a :class:`Selection`, or the best one (None).

    The backend's class is imported here (the first time), not when plugins are listed. Pass the
    returned backend's ``device`` hint to ``initialize``: ``await b.initialize(b.selected_device)``.

    ``isolate=True`` runs the backend in a supervised worker process
    (:class:`~accelkit.IsolatedBackend`, docs/isolation.md): a crash or a sticky device error
    there fails its pending work with :class:`~accelkit.errors.WorkerLostError` instead of
    ending the user's process, and ``await backend.recover()`` starts a new worker.
    """
    from accelkit.registry import default_registry

    return _create(target, requires, policy, registry or default_registry, isolate)[1]


def _create(
    target: str | Device | Selection | None,
    requires: Requirements | None,
    policy: str,
    reg: Registry,
    isolate: bool,
    env: bool = True,
) -> tuple[str, ComputeBackend]:
    """(the plugin's name, its new backend) for :func:`create_backend`."""
    name, device = _resolve(target, requires, policy, reg, env)
    if isolate:
        from accelkit._core.isolation.backend import IsolatedBackend

        if reg.registered_in_process(name):  # the worker would not find it, or another one
            raise InvalidArgumentError(
                f"backend {name!r} was registered in this process (registry.register): an"
                " isolated backend runs in a worker process, which sees only installed plugins"
                " (it would run an installed plugin of that name, not this one); install it as"
                " a plugin (an entry point in the accelkit.backends group), unregister it to"
                " isolate the installed one, or open it without isolate=True"
            )

        backend: ComputeBackend = IsolatedBackend(name)
    else:
        backend = reg.backend_class(name)()
    backend.selected_device = device
    return name, backend


class BackendContext(AbstractAsyncContextManager["ComputeBackend"]):
    """What :func:`open_backend` returns: an *async* context manager that yields the initialized
    backend and shuts it down on exit. A plain ``with`` raises a TypeError that says how to use
    it (``async with``, inside an async function)."""

    __slots__ = ("_cm",)

    def __init__(self, cm: AbstractAsyncContextManager[ComputeBackend]) -> None:
        self._cm = cm

    async def __aenter__(self) -> ComputeBackend:
        return await self._cm.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._cm.__aexit__(exc_type, exc, tb)

    def __enter__(self) -> NoReturn:
        raise TypeError(
            "open_backend() is an async context manager: write"
            " `async with ak.open_backend(...) as backend:` inside an async function, and run"
            " that function with anyio.run(main) (or asyncio.run(main()))"
        )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # only there so that a plain ``with`` reaches ``__enter__`` and its message
        return None


def open_backend(
    target: str | Device | Selection | None = None,
    *,
    requires: Requirements | None = None,
    policy: str = "performance",
    registry: Registry | None = None,
    fallback: str | Device | None = None,
    isolate: bool = False,
) -> BackendContext:
    """Select, create and initialize a backend; shut it down on exit, whatever happens::

        async with ak.open_backend("cpu") as backend:
            ...

    An async context manager: use it with ``async with`` inside an async function (a plain
    ``with`` raises a TypeError saying so). The backend is chosen and initialized on entry.

    A backend whose ``initialize`` fails is quarantined (``accelkit doctor`` shows why) and the
    error propagates: an explicit request never turns silently into another backend.

    ``fallback`` (a backend name or device, e.g. ``"cpu"`` or ``Device("cpu")``) opts in to
    running the operations the backend refuses on that one instead; ``backend.fallback.events``
    reports each.

    ``target`` and ``fallback`` are where a device's string form (``"cuda:1"``) is parsed, once;
    the backend is handed the :class:`~accelkit.Device`.

    ``isolate=True`` runs the backend in a supervised worker process (see
    :func:`create_backend` and docs/isolation.md).
    """
    return BackendContext(
        _open_backend(
            target,
            requires=requires,
            policy=policy,
            registry=registry,
            fallback=fallback,
            isolate=isolate,
        )
    )


@asynccontextmanager
async def _open_backend(
    target: str | Device | Selection | None = None,
    *,
    requires: Requirements | None = None,
    policy: str = "performance",
    registry: Registry | None = None,
    fallback: str | Device | None = None,
    isolate: bool = False,
    env: bool = True,
) -> AsyncIterator[ComputeBackend]:
    from accelkit.registry import default_registry

    reg = registry or default_registry
    name, backend = _create(target, requires, policy, reg, isolate, env)
    distribution = reg.descriptor(name).distribution
    try:
        await backend.initialize(backend.selected_device)
    except (InvalidArgumentError, UnsupportedOperationError):
        raise  # the caller's input or settings ("cannot drive device X"): not the plugin's fault
    except Exception as exc:  # the plugin resolved, not the class's name (a subclass may share it)
        reg.quarantine(name, "initialize", exc, distribution=distribution)
        raise
    except BaseException:  # cancelled while opening: release what was opened (a worker)
        with anyio.CancelScope(shield=True):
            await backend.shutdown()
        raise
    try:
        if fallback is None:
            yield backend
            return
        async with _open_backend(fallback, registry=reg, env=False) as spare:
            backend.enable_fallback(spare)
            yield backend
    finally:
        await backend.shutdown()
