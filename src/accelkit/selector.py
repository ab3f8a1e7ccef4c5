"""Choosing a backend and a device, and saying why.

:func:`select` ranks every (backend, device) candidate the registry knows: it rejects those that
cannot serve (wrong device, missing ops, dtypes or features, too little memory) with every reason,
and scores the rest by the policy:

- ``performance``: GEMM GFLOP/s for the required dtypes (F32 if none), measured by
  ``accelkit calibrate`` where present, declared by the plugin otherwise;
- ``memory``: device memory;
- ``power``: GFLOP/s per watt (devices of unknown power rank last);
- ``prefer:<kind>``: devices of that kind first, then by performance.

Ties go to the plugin's priority, then the name. ``ACCELKIT_BACKEND`` and ``ACCELKIT_DEVICE``
override the arguments. An explicitly requested backend or device never silently becomes another:
if it cannot serve, ``select`` raises BackendNotFoundError with the reasons.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from accelkit import calibration
from accelkit._core.env import env_name, env_str
from accelkit.capabilities import Requirements
from accelkit.device import Device, DeviceInfo
from accelkit.dtype import DType
from accelkit.errors import BackendNotFoundError, InvalidArgumentError
from accelkit.registry import Registry, default_registry, not_found_hint

__all__ = ["Candidate", "Rejection", "Selection", "SelectionReport", "select"]

POLICIES = ("performance", "memory", "power")


class Candidate(BaseModel):
    model_config = ConfigDict(frozen=True)

    backend: str
    device: Device
    name: str
    score: float
    basis: Literal["calibrated", "declared", "none"]
    priority: int
    detail: str


class Rejection(BaseModel):
    model_config = ConfigDict(frozen=True)

    backend: str
    #: The device turned down (None: the whole backend was).
    device: Device | None
    reasons: tuple[str, ...]


class SelectionReport(BaseModel):
    """Every candidate ranked with its score, and every rejection with its reasons."""

    model_config = ConfigDict(frozen=True)

    policy: str
    requested_backend: str | None
    requested_device: str | None
    candidates: tuple[Candidate, ...]
    rejected: tuple[Rejection, ...]

    def explain(self) -> str:
        lines = [f"policy: {self.policy}"]
        if self.requested_backend or self.requested_device:
            lines.append(
                f"requested: backend={self.requested_backend or 'any'}"
                f" device={self.requested_device or 'any'}"
            )
        lines.append("candidates (best first):")
        for i, c in enumerate(self.candidates, 1):
            lines.append(
                f"  {i}. {c.backend} on {c.device} ({c.name}): score {c.score:.4g} [{c.basis}]"
                f" {c.detail}"
            )
        if not self.candidates:
            lines.append("  none")
        if self.rejected:
            lines.append("rejected:")
            for r in self.rejected:
                where = f" on {r.device}" if r.device else ""
                lines.append(f"  {r.backend}{where}: " + "; ".join(r.reasons))
        return "\n".join(lines)


class Selection(BaseModel):
    """The chosen backend and device, with the report that explains the choice."""

    model_config = ConfigDict(frozen=True)

    backend: str
    #: The chosen device, parsed once here (``str(device)`` is ``"cuda:1"``).
    device: Device
    report: SelectionReport


def _policy(policy: str) -> tuple[str, str | None]:
    if policy in POLICIES:
        return policy, None
    if policy.startswith("prefer:") and policy[7:]:
        kind = policy[7:].strip().lower()  # case-insensitive, as kinds are everywhere else
        try:
            Device(kind)  # validates the kind's form
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"policy {policy!r}: {exc}") from None
        return "prefer", kind
    raise InvalidArgumentError(
        f"unknown policy {policy!r}; expected one of: performance, memory, power, prefer:<kind>"
        " (e.g. prefer:cuda)"
    )


def _device_filter(device: str | Device | None) -> tuple[str | None, Device | None]:
    """(kind, exact device): 'cuda' means any CUDA device, 'cuda:1' that one. ``select`` is a
    public boundary: a string is parsed here, once; a Device is taken as it is."""
    if device is None:
        return None, None
    if isinstance(device, Device):
        return device.kind, device
    if not isinstance(device, str):
        raise InvalidArgumentError(
            f"device must be a string like 'cuda' or 'cuda:0'; got {type(device).__name__}"
        )
    text = device.strip().lower()
    if ":" in text:
        d = Device.parse(text)
        return d.kind, d
    return Device(text).kind, None


def _score(
    info: DeviceInfo, requires: Requirements, mode: str, kind: str | None
) -> tuple[float, Literal["calibrated", "declared", "none"], str]:
    caps = info.capabilities
    if caps is None:
        return 0.0, "none", "(the probe reports no capabilities)"
    measured = calibration.lookup(info.backend, info.device, info.name)
    gflops_by = measured.gflops if measured else caps.performance.peak_gflops
    basis: Literal["calibrated", "declared", "none"] = "calibrated" if measured else "declared"
    # The slowest figure among the required dtypes that have one: a dtype without a figure
    # (integers usually) is unknown, not zero (requiring I32 scored every device 0, and the
    # ranking fell to plugin priority); with none, F32's figure stands for the device.
    dtypes = [d for d in sorted(requires.dtypes, key=lambda d: d.value) if d in gflops_by]
    dtypes = dtypes or [DType.F32]
    gflops = min(gflops_by.get(d, 0.0) for d in dtypes)
    perf = f"{gflops:.0f} GFLOP/s {'/'.join(d.value for d in dtypes)}"
    if mode == "memory":
        mem = caps.limits.memory_bytes or info.memory_bytes
        return mem / 2**30, "declared", f"{mem / 2**30:.1f} GiB; {perf}"  # (never calibrated)
    if mode == "power":
        watts = caps.performance.power_watts
        if not watts:
            return 0.0, basis, f"power unknown; {perf}"
        return gflops / watts, basis, f"{gflops / watts:.2f} GFLOP/s per W ({watts:.0f} W)"
    if mode == "prefer":
        bonus = 1e9 if info.device.kind == kind else 0.0
        return bonus + gflops, basis, perf + (f"; preferred kind {kind}" if bonus else "")
    return gflops, basis, perf


def select(
    device: str | Device | None = None,
    requires: Requirements | None = None,
    policy: str = "performance",
    *,
    backend: str | None = None,
    registry: Registry | None = None,
) -> Selection:
    """Choose the best (backend, device) for ``requires`` under ``policy`` (see the module
    docstring); raises BackendNotFoundError, with every reason, when nothing can serve."""
    return _select(device, requires, policy, backend, registry, env=True)


def _select(
    device: str | Device | None,
    requires: Requirements | None,
    policy: str,
    backend: str | None,
    registry: Registry | None,
    *,
    env: bool,
) -> Selection:
    """:func:`select`, with ``ACCELKIT_BACKEND`` and ``ACCELKIT_DEVICE`` applied where ``env``
    (not to the backend named as ``open_backend``'s fallback: the settings choose the primary
    backend, and a fallback turned into a second copy of it refuses what the first refused)."""
    reg = registry or default_registry
    requires = requires or Requirements()
    if not isinstance(requires, Requirements):
        raise InvalidArgumentError(
            f"requires must be a Requirements; got {type(requires).__name__}"
        )
    mode, kind_pref = _policy(policy)
    env_backend = env_name("ACCELKIT_BACKEND") if env else None
    env_device = env_str("ACCELKIT_DEVICE") if env else None
    if env_backend:
        backend = env_backend
    elif isinstance(backend, str) and backend not in (names := reg.names()):
        backend = next((n for n in names if n.lower() == backend.lower()), backend)  # "CPU"
    if env_device:
        try:
            device = (
                Device.parse(env_device) if ":" in env_device else Device(env_device.lower()).kind
            )
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"ACCELKIT_DEVICE: {exc}") from None
    want_kind, want_device = _device_filter(device)

    rejected: list[Rejection] = []
    scored: list[Candidate] = []
    descriptors = reg.descriptors()
    if backend is not None:
        try:
            descriptors = [reg.descriptor(backend)]  # raises, with the reason, if unusable
        except BackendNotFoundError as exc:
            if not env_backend:
                raise
            raise BackendNotFoundError(f"ACCELKIT_BACKEND={env_backend!r}: {exc}") from None
    for desc in descriptors:
        if want_kind is not None and want_kind not in desc.device_kinds:
            rejected.append(
                Rejection(
                    backend=desc.name,
                    device=None,
                    reasons=(f"drives {', '.join(sorted(desc.device_kinds))}, not {want_kind}",),
                )
            )
            continue
        infos = reg.probe(desc.name)
        if not infos:
            reason = reg.unavailable_reason(desc.name) or "no device"
            rejected.append(Rejection(backend=desc.name, device=None, reasons=(reason,)))
            continue
        for info in infos:
            dev = info.device  # a Device, parsed once where the probe's record was made
            if want_device is not None and dev != want_device:
                rejected.append(
                    Rejection(backend=desc.name, device=dev, reasons=(f"not {want_device}",))
                )
                continue
            if want_kind is not None and dev.kind != want_kind:
                continue
            caps = info.capabilities
            if caps is not None:
                check = caps.meets(requires)
                if not check.ok:
                    rejected.append(Rejection(backend=desc.name, device=dev, reasons=check.reasons))
                    continue
            elif requires != Requirements():
                rejected.append(
                    Rejection(
                        backend=desc.name,
                        device=dev,
                        reasons=("its probe reports no capabilities to check requirements",),
                    )
                )
                continue
            score, basis, detail = _score(info, requires, mode, kind_pref)
            scored.append(
                Candidate(
                    backend=desc.name,
                    device=dev,
                    name=info.name,
                    score=score,
                    basis=basis,
                    priority=desc.priority,
                    detail=detail,
                )
            )
    scored.sort(key=lambda c: (-c.score, -c.priority, c.backend, str(c.device)))
    report = SelectionReport(
        policy=policy,
        requested_backend=backend,
        requested_device=str(device) if device is not None else None,
        candidates=tuple(scored),
        rejected=tuple(rejected),
    )
    if not scored:
        what = " ".join(
            x
            for x in (
                f"backend {backend!r}" + (" (ACCELKIT_BACKEND)" if env_backend else "")
                if backend
                else "",
                f"device {device}" + (" (ACCELKIT_DEVICE)" if env_device else "")
                if device is not None
                else "",
            )
            if x
        )
        reasons = "; ".join(
            f"{r.backend}{f' on {r.device}' if r.device else ''}: {', '.join(r.reasons)}"
            for r in rejected
        )
        hint = ""
        # Over every installed plugin, not only the backend asked for (cpu is installed when
        # --backend example --device cpu finds nothing).
        kinds = [kind for d in reg.descriptors() for kind in d.device_kinds]
        if want_kind is not None and want_kind not in kinds:
            hint = f"; no installed plugin drives {want_kind}" + not_found_hint(want_kind, kinds)
        raise BackendNotFoundError(
            f"no backend can serve {what or 'this request'}"
            + (f" ({reasons})" if reasons else f" ({reg.why_none()})")
            + hint
        )
    best = scored[0]
    return Selection(backend=best.backend, device=best.device, report=report)
