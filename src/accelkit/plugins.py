"""Plugin descriptors: how a backend describes itself before it is imported.

A plugin distribution registers one entry point in the group ``accelkit.backends``, pointing at a
:class:`PluginDescriptor` in a module that imports no driver library. accelkit reads descriptors
to list, gate and rank backends; it imports the backend class (named by import path) only when a
backend is created, and the plugin's probe (also named by import path) only to enumerate devices.

A probe is a function ``probe() -> list[DeviceInfo]`` that must be cheap (no context, no heavy
import where a lighter way exists) and must answer "no devices" (an empty list, or raising
``DeviceError`` with the reason) on a machine without the hardware or the driver.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from accelkit._core.op_names import KERNEL_OPS, TENSOR_OPS

__all__ = [
    "ENTRY_POINT_GROUP",
    "KERNEL_OPS",
    "API_CHANGES",
    "PLUGIN_API_VERSION",
    "api_change_hint",
    "TENSOR_OPS",
    "PluginDescriptor",
    "api_major",
]

#: The plugin API this accelkit implements ("MAJOR.MINOR"). A plugin built for another MAJOR is
#: refused before its backend is imported; a newer MINOR of the same MAJOR is accepted.
PLUGIN_API_VERSION = "3.0"

#: What changed for a plugin author at each major version of the plugin API (the version gate
#: quotes it when it refuses a plugin built for an older major).
API_CHANGES: dict[int, str] = {
    2: (
        "API 2.0 (accelkit 0.2): a backend implements kernel objects from accelkit.sdk"
        " (TensorKernels, FactoryKernels, optional FusedKernels) and hands them to"
        " ComputeBackend.install_kernels() in _initialize, instead of subclassing TensorOps,"
        " TensorFactory and the six KernelOps sub-interfaces and overriding their _k_* hooks"
        " (the hooks lost their _k_ prefix: _k_unary -> TensorKernels.unary); KernelOps is one"
        " FusedKernels class whose methods default to the core's compositions; a plugin imports"
        " accelkit.sdk, never accelkit._core or accelkit.backends; capabilities list TensorOps"
        " names in ops and fused KernelOps names in fused_ops; sdk.StreamBackend owns streams,"
        " pool and counters. docs/backend-authors.md walks through it"
    ),
    3: (
        "API 3.0 (accelkit 0.3): _initialize returns an accelkit.sdk.Opened record (streams,"
        " memory, tensor, factory, dtypes, optional fused, executor, capabilities) instead of"
        " setting _streams/_pool/_memory_manager/_caps/_kernel_executor and calling"
        " install_kernels (gone); create_stream is concrete and calls the hook _open_stream;"
        " StreamBackend is generic in its stream type and its members are public"
        " (check_ready replaces _require_ready; pool_config, streams, prune_streams,"
        " after_events, report_error, mark_failed, reopen); streams derive from"
        " sdk.PositionStream (wait_quietly is wait_for_quietly); kernel objects derive from"
        " sdk.KernelBase (hooks make_storage, reshape_storage, check_output,"
        " before_allocation, submit) and get empty/view/launch/skip; the memory manager is the"
        " core's (it checks every argument) over Opened.memory, an sdk.MemoryKernels that"
        " holds the pool and frees, writes, reads and copies (PooledMemoryManager is gone);"
        " FactoryKernels.random(out, RandomDraw) draws random numbers (default: NumPy's PCG64"
        " on the host); the user facades moved from accelkit.abc to accelkit.ops, the kernel"
        " contracts into accelkit.sdk.kernels, KERNEL_OP_GROUPS became KERNEL_OPS_IN_ORDER,"
        " KernelDispatcher became backend.kernel_ops.twin(); plugins may use no underscore"
        " member of the SDK's classes. docs/backend-authors.md lists the contract"
    ),
}


def api_change_hint(plugin_api: str) -> str:
    """What changed between a plugin's API major and this accelkit's (empty if nothing known)."""
    try:
        old = api_major(plugin_api)
    except ValueError:
        return ""
    new = api_major(PLUGIN_API_VERSION)
    notes = [API_CHANGES[m] for m in range(old + 1, new + 1) if m in API_CHANGES]
    return ("; what changed: " + "; ".join(notes)) if notes else ""


ENTRY_POINT_GROUP = "accelkit.backends"

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def api_major(version: str) -> int:
    return int(version.split(".", 1)[0])


class PluginDescriptor(BaseModel):
    """What accelkit knows about a backend plugin without importing it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="backend name, e.g. 'cuda' (lower case, [a-z0-9_])")
    distribution: str = Field(description="the distribution that ships it, e.g. 'accelkit-cuda'")
    version: str = Field(description="the plugin's version")
    api_version: str = Field(description="the accelkit plugin API it was built for, 'MAJOR.MINOR'")
    device_kinds: frozenset[str] = Field(description="device kinds it drives, e.g. {'cuda'}")
    priority: int = Field(
        0, description="tie-breaker between equally good candidates (higher wins)"
    )
    backend_class: str = Field(description="'module:Class' of the ComputeBackend subclass")
    probe: str | None = Field(None, description="'module:function' listing its devices cheaply")
    summary: str = ""
    hardware_hint: str = Field(
        "", description="how to tell that hardware for it is present (for `accelkit doctor`)"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"plugin name must match [a-z][a-z0-9_]*; got {v!r}")
        return v

    @field_validator("api_version")
    @classmethod
    def _api(cls, v: str) -> str:
        if not re.fullmatch(r"\d+\.\d+", v):
            raise ValueError(f"api_version must be 'MAJOR.MINOR'; got {v!r}")
        return v

    @field_validator("backend_class", "probe")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None and not _IMPORT_PATH.match(v):
            raise ValueError(f"expected an import path 'package.module:Name'; got {v!r}")
        return v

    @field_validator("device_kinds")
    @classmethod
    def _kinds(cls, v: frozenset[str]) -> frozenset[str]:
        for kind in v:
            if not _NAME.match(kind):
                raise ValueError(f"device kind must match [a-z][a-z0-9_]*; got {kind!r}")
        return v
