"""The plugin registry: discovery through entry points, gating, quarantine, device probes.

Listing is cheap and safe: reading a descriptor imports only the plugin's descriptor module (which
imports no driver); the backend class is imported on first use; the probe only to list devices.
A plugin that fails to load, probe, import or initialize is quarantined with its traceback (shown
by ``accelkit doctor``) and never takes the process down.

Administrators choose what may load: ``ACCELKIT_PLUGINS`` (comma-separated names: only these are
loaded) and ``ACCELKIT_DISABLE_PLUGINS`` (never loaded). Both are read each time they matter, and
filter by entry-point name *before* anything of the plugin is imported.

The module-level functions act on one process-wide :class:`Registry`.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import threading
import traceback
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from accelkit._core.env import env_names
from accelkit.device import DeviceInfo
from accelkit.errors import (
    BackendNotFoundError,
    DeviceError,
    IncompatiblePluginError,
    InvalidArgumentError,
    PluginLoadError,
)
from accelkit.plugins import (
    ENTRY_POINT_GROUP,
    PLUGIN_API_VERSION,
    PluginDescriptor,
    api_change_hint,
    api_major,
)

if TYPE_CHECKING:
    from accelkit.abc.backend import ComputeBackend

__all__ = [
    "PluginStatus",
    "QuarantineRecord",
    "Registry",
    "backend_class",
    "default_registry",
    "descriptor",
    "descriptors",
    "devices",
    "not_found_hint",
    "probe",
    "quarantine",
    "quarantined",
    "register",
    "rescan",
    "statuses",
    "unregister",
]

Stage = Literal["load", "version", "probe", "import", "initialize"]
ProbeFn = Callable[[], list[DeviceInfo]]


class QuarantineRecord(BaseModel):
    """Why a plugin is out of service."""

    model_config = ConfigDict(frozen=True)

    name: str
    stage: Stage
    error: str
    traceback: str = ""
    distribution: str = ""


class PluginStatus(BaseModel):
    """One installed plugin as ``accelkit info`` and ``doctor`` show it."""

    model_config = ConfigDict(frozen=True)

    name: str
    distribution: str = ""
    version: str = ""
    status: Literal["ok", "disabled", "quarantined"]
    reason: str = ""
    devices: int = 0


class Registry:
    """Plugins known to this process (see the module docstring)."""

    def __init__(self, group: str = ENTRY_POINT_GROUP) -> None:
        self._group = group
        self._lock = threading.RLock()
        self._entry_points: dict[str, importlib.metadata.EntryPoint] | None = None
        self._loaded: dict[str, PluginDescriptor] = {}
        self._manual: dict[str, tuple[PluginDescriptor, type[Any] | None, ProbeFn | None]] = {}
        self._quarantine: dict[str, QuarantineRecord] = {}
        self._probes: dict[str, list[DeviceInfo]] = {}
        self._unavailable: dict[str, str] = {}
        self._classes: dict[str, type[Any]] = {}

    # -- discovery --------------------------------------------------------------------------------
    def _eps(self) -> dict[str, importlib.metadata.EntryPoint]:
        if self._entry_points is None:
            found: dict[str, importlib.metadata.EntryPoint] = {}
            for ep in importlib.metadata.entry_points(group=self._group):
                if ep.name in found:
                    dist = ep.dist.name if ep.dist else "?"
                    first = found[ep.name]
                    first_dist = first.dist.name if first.dist else "?"
                    # Keyed apart from the name: the first plugin stays usable, as the message
                    # says; the record only makes the shadowed one visible to `accelkit doctor`.
                    self._quarantine.setdefault(
                        f"{ep.name} ({dist}, shadowed)",
                        QuarantineRecord(
                            name=ep.name,
                            stage="load",
                            error=f"two plugins named {ep.name!r}: {first.value} (from"
                            f" {first_dist}) and {ep.value} (from {dist}); the first one is used",
                            distribution=dist,
                        ),
                    )
                    continue
                found[ep.name] = ep
            self._entry_points = found
        return self._entry_points

    @staticmethod
    def _allowed(name: str) -> tuple[bool, str]:
        """Whether plugin ``name`` passes ACCELKIT_PLUGINS and ACCELKIT_DISABLE_PLUGINS (names
        compared case-insensitively, as the lists are read: an entry point named 'WebGPU2' was
        imported under ACCELKIT_DISABLE_PLUGINS=webgpu2)."""
        allow = env_names("ACCELKIT_PLUGINS")
        deny = env_names("ACCELKIT_DISABLE_PLUGINS") or frozenset()
        key = name.lower()
        if key in deny:
            return False, "disabled by ACCELKIT_DISABLE_PLUGINS"
        if allow is not None and key not in allow:
            return False, "not listed in ACCELKIT_PLUGINS"
        return True, ""

    def why_none(self) -> str:
        """Why no plugin can serve at all, in words: none installed, or every installed one
        disabled or quarantined (said as "no plugin is installed" before, with twelve
        installed)."""
        names = self.names()
        if not names:
            return "no plugin is installed"
        disabled = [n for n in names if not self._allowed(n)[0]]
        quarantined = sorted({r.name for r in self.quarantined()} - set(disabled))
        parts = []
        if disabled:
            parts.append(
                f"{len(disabled)} of {len(names)} installed plugins disabled by"
                " ACCELKIT_PLUGINS or ACCELKIT_DISABLE_PLUGINS"
            )
        if quarantined:
            parts.append(f"quarantined: {', '.join(quarantined)} ('accelkit doctor' says why)")
        return "; ".join(parts) or "no installed plugin can serve"

    def _load(self, name: str) -> PluginDescriptor | None:
        """The descriptor of entry point ``name`` (loading it once), or None if quarantined."""
        if name in self._loaded:
            return self._loaded[name]
        if name in self._quarantine and name not in self._manual:
            return None
        ep = self._eps().get(name)
        if ep is None:
            return None
        dist = ep.dist.name if ep.dist else ""
        try:
            obj = ep.load()
            desc = (
                obj if isinstance(obj, PluginDescriptor) else PluginDescriptor.model_validate(obj)
            )
        except (Exception, SystemExit) as exc:  # a broken plugin must not break accelkit
            self.quarantine(name, "load", exc, distribution=dist)
            return None
        if desc.name != name:
            self.quarantine(
                name,
                "load",
                PluginLoadError(
                    f"entry point {name!r} names a descriptor for {desc.name!r}; they must match"
                ),
                distribution=dist,
            )
            return None
        if api_major(desc.api_version) != api_major(PLUGIN_API_VERSION):
            self.quarantine(
                name,
                "version",
                IncompatiblePluginError(
                    f"plugin {name!r} ({desc.distribution} {desc.version}) was built for the"
                    f" accelkit plugin API {desc.api_version}; this accelkit implements"
                    f" {PLUGIN_API_VERSION}. Install a version of {desc.distribution} built for"
                    f" API {api_major(PLUGIN_API_VERSION)}.x" + api_change_hint(desc.api_version)
                ),
                distribution=desc.distribution,
            )
            return None
        self._loaded[name] = desc
        return desc

    def names(self) -> list[str]:
        """Every installed or registered plugin name, allowed or not (nothing is imported)."""
        with self._lock:
            return sorted(set(self._eps()) | set(self._manual))

    def descriptors(self) -> list[PluginDescriptor]:
        """Descriptors of the plugins that are allowed, load, and match the plugin API."""
        out = []
        with self._lock:
            for name in self.names():
                if not self._allowed(name)[0]:
                    continue
                if name in self._manual:
                    out.append(self._manual[name][0])
                elif (desc := self._load(name)) is not None:
                    out.append(desc)
        return out

    def descriptor(self, name: str) -> PluginDescriptor:
        """The descriptor of ``name``; BackendNotFoundError saying why when it is not usable."""
        with self._lock:
            allowed, why = self._allowed(name)
            if name in self._manual and allowed:
                return self._manual[name][0]
            if name not in self.names():
                known = ", ".join(self.names()) or "none"
                raise BackendNotFoundError(
                    f"no backend named {name!r} is installed (installed: {known})"
                    + not_found_hint(name, self.names())
                )
            if not allowed:
                raise BackendNotFoundError(f"backend {name!r} is {why}")
            desc = self._load(name)
            if desc is None:
                record = self._quarantine[name]
                raise BackendNotFoundError(
                    f"backend {name!r} is quarantined ({record.stage}): {record.error}"
                )
            return desc

    # -- programmatic registration ----------------------------------------------------------------
    def register(
        self,
        descriptor: PluginDescriptor,
        backend_class: type[ComputeBackend] | None = None,
        probe: ProbeFn | None = None,
    ) -> None:
        """Register a plugin in this process (it shadows an installed one of the same name)."""
        if not isinstance(descriptor, PluginDescriptor):
            raise InvalidArgumentError(
                f"register takes a PluginDescriptor; got {type(descriptor).__name__}"
            )
        if api_major(descriptor.api_version) != api_major(PLUGIN_API_VERSION):
            raise IncompatiblePluginError(
                f"plugin {descriptor.name!r} was built for the accelkit plugin API"
                f" {descriptor.api_version}; this accelkit implements {PLUGIN_API_VERSION}"
                + api_change_hint(descriptor.api_version)
            )
        with self._lock:
            self._manual[descriptor.name] = (descriptor, backend_class, probe)
            self._forget(descriptor.name)

    def registered_in_process(self, name: str) -> bool:
        """Whether ``name`` was registered in this process (:meth:`register`), which another
        process (an isolated backend's worker, doctor's self-test) cannot see."""
        with self._lock:
            return name in self._manual

    def unregister(self, name: str) -> None:
        with self._lock:
            if name not in self._manual:
                raise BackendNotFoundError(f"no plugin named {name!r} was registered in-process")
            del self._manual[name]
            self._forget(name)

    def _forget(self, name: str) -> None:
        for cache in (self._probes, self._unavailable, self._classes, self._quarantine):
            cache.pop(name, None)

    def rescan(self) -> None:
        """Forget what was discovered, so plugins installed (or removed) since are seen."""
        with self._lock:
            importlib.invalidate_caches()
            self._entry_points = None
            self._loaded.clear()
            self._quarantine.clear()
            self._probes.clear()
            self._unavailable.clear()
            self._classes.clear()

    # -- quarantine -------------------------------------------------------------------------------
    def quarantine(
        self, name: str, stage: Stage, exc: BaseException, distribution: str = ""
    ) -> QuarantineRecord:
        record = QuarantineRecord(
            name=name,
            stage=stage,
            error=f"{type(exc).__name__}: {one_line(exc)}",
            traceback="".join(traceback.format_exception(exc)),
            distribution=distribution,
        )
        with self._lock:
            self._quarantine[name] = record
            self._probes.pop(name, None)
        return record

    def quarantined(self) -> list[QuarantineRecord]:
        with self._lock:
            self._eps()
            return sorted(self._quarantine.values(), key=lambda r: r.name)

    # -- devices ----------------------------------------------------------------------------------
    def probe(self, name: str, refresh: bool = False) -> list[DeviceInfo]:
        """The devices plugin ``name`` reports (cached; ``refresh`` probes again)."""
        with self._lock:
            if not refresh and name in self._probes:
                return self._probes[name]
            desc = self.descriptor(name)
            if name in self._quarantine:
                return []
            fn: ProbeFn | None = self._manual[name][2] if name in self._manual else None
            try:
                if fn is None:
                    if desc.probe is None:
                        self._unavailable[name] = "the plugin has no probe"
                        self._probes[name] = []
                        return []
                    fn = _import_path(desc.probe)
                found = fn()
                infos = [
                    d if isinstance(d, DeviceInfo) else DeviceInfo.model_validate(d) for d in found
                ]
                seen: set[str] = set()
                for info in infos:  # listed as another backend's, they were selected as that
                    if info.backend != name:
                        raise PluginLoadError(
                            f"the probe of plugin {name!r} reported a device of backend"
                            f" {info.backend!r} ({info.device}); a probe reports its own"
                        )
                    # a device outside the plugin's kinds, or listed twice, became a candidate
                    # of select() that its backend could not open (calibrate failed on it)
                    if info.device.kind not in desc.device_kinds:
                        raise PluginLoadError(
                            f"the probe of plugin {name!r} reported {info.device}, not of its"
                            f" device kinds ({', '.join(sorted(desc.device_kinds))})"
                        )
                    if str(info.device) in seen:
                        raise PluginLoadError(
                            f"the probe of plugin {name!r} reported {info.device} twice"
                        )
                    seen.add(str(info.device))
            except DeviceError as exc:  # the plugin's clean "no device here, because..."
                self._unavailable[name] = str(exc)
                self._probes[name] = []
                return []
            except (Exception, SystemExit) as exc:
                self.quarantine(name, "probe", exc, distribution=desc.distribution)
                return []
            self._unavailable.pop(name, None)
            if not infos:
                self._unavailable[name] = "its probe found no device"
            self._probes[name] = infos
            return infos

    def unavailable_reason(self, name: str) -> str | None:
        """Why plugin ``name`` reports no device (after a probe), if it reports none."""
        with self._lock:
            if name in self._quarantine:
                record = self._quarantine[name]
                return f"quarantined ({record.stage}): {record.error}"
            return self._unavailable.get(name)

    def devices(self, refresh: bool = False) -> list[DeviceInfo]:
        """Every device of every usable plugin, probed once and cached."""
        out: list[DeviceInfo] = []
        for desc in self.descriptors():
            out.extend(self.probe(desc.name, refresh=refresh))
        return out

    # -- backend classes --------------------------------------------------------------------------
    def backend_class(self, name: str) -> type[ComputeBackend]:
        """Import (once) and return the backend class of plugin ``name``."""
        from accelkit.abc.backend import ComputeBackend

        with self._lock:
            if name in self._classes:
                return self._classes[name]
            desc = self.descriptor(name)
            cls = self._manual[name][1] if name in self._manual else None
            try:
                if cls is None:
                    cls = _import_path(desc.backend_class)
                if not (isinstance(cls, type) and issubclass(cls, ComputeBackend)):
                    raise PluginLoadError(f"{desc.backend_class} is not a ComputeBackend subclass")
                if cls.name != name:  # the name its errors, records and fallback events carry
                    raise PluginLoadError(
                        f"{cls.__module__}:{cls.__qualname__}.name is {cls.name!r}, not the"
                        f" plugin's name {name!r} (a subclass of another backend sets its own"
                        f" `name = {name!r}`)"
                    )
            except (Exception, SystemExit) as exc:
                self.quarantine(name, "import", exc, distribution=desc.distribution)
                raise PluginLoadError(
                    f"backend {name!r} failed to import and is quarantined: {one_line(exc)}"
                ) from exc
            self._classes[name] = cls
            return cls

    def statuses(self, probe: bool = True) -> list[PluginStatus]:
        """Every installed or registered plugin with its status (for ``accelkit info``)."""
        out = []
        for name in self.names():
            allowed, why = self._allowed(name)
            if not allowed:
                out.append(PluginStatus(name=name, status="disabled", reason=why))
                continue
            try:
                desc = self.descriptor(name)
            except BackendNotFoundError:
                record = self._quarantine.get(name)
                out.append(
                    PluginStatus(
                        name=name,
                        distribution=record.distribution if record else "",
                        status="quarantined",
                        reason=f"{record.stage}: {record.error}" if record else "",
                    )
                )
                continue
            n = len(self.probe(name)) if probe else 0
            record = self._quarantine.get(name)
            out.append(
                PluginStatus(
                    name=name,
                    distribution=desc.distribution,
                    version=desc.version,
                    status="quarantined" if record else "ok",
                    reason=(f"{record.stage}: {record.error}" if record else "")
                    or (self.unavailable_reason(name) or "" if probe and not n else ""),
                    devices=n,
                )
            )
        return out


def one_line(exc: BaseException) -> str:
    """``exc``'s message on one line, as the CLI prints an error: a pydantic ValidationError's
    errors as ``title: field: message; ...`` (its text spans several lines and a link), any
    other message's lines joined with ``; ``. The record's traceback keeps the whole text."""
    if isinstance(exc, ValidationError):
        parts = [f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors()]
        return f"{exc.title}: {'; '.join(parts)}"
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def _import_path(path: str) -> Any:
    module, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


_KNOWN_PLUGINS = {
    "opencl": "accelkit-opencl[pocl]",
    "cuda": "accelkit-cuda[cuda12]",
    "webgpu": "accelkit-webgpu",
    "dask": "accelkit-dask",
}


def _install_hint(name: str) -> str:
    dist = _KNOWN_PLUGINS.get(name)
    return f"; install it with: pip install '{dist}'" if dist else ""


def not_found_hint(name: str, known: Iterable[str]) -> str:
    """The end of a "no such backend" message: how to install ``name`` where it is a known
    plugin, and the closest of ``known`` (installed backend names, device kinds) where ``name``
    looks like a misspelling of it: ``"; did you mean 'cpu'?"`` for ``"cpuu"``."""
    choices = sorted({k for k in known if k and k != name})
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.75)
    return _install_hint(name) + (f"; did you mean {close[0]!r}?" if close else "")


default_registry = Registry()

descriptors = default_registry.descriptors
descriptor = default_registry.descriptor
register = default_registry.register
unregister = default_registry.unregister
rescan = default_registry.rescan
quarantine = default_registry.quarantine
quarantined = default_registry.quarantined
probe = default_registry.probe
devices = default_registry.devices
backend_class = default_registry.backend_class
statuses = default_registry.statuses
