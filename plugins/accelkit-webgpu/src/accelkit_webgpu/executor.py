"""The KernelExecutor for user compute shaders: WGSL (and SPIR-V where the adapter takes it).

A kernel is a ``@compute`` entry point of a WGSL module. Its arguments are its resource
bindings, all in ``@group(0)``, numbered ``0..n-1`` and declared ``var<storage, read>`` or
``var<storage, read_write>``; ``execute_kernel``'s ``args[k]`` is bound at ``@binding(k)``:

- a runtime-sized array binding (``array<f32>``) takes a Tensor or a DeviceBuffer;
- any other storage binding (``u32``, ``vec4<f32>``, a struct, ``array<u32, 4>``) takes a
  scalar (``f32``/``i32``/``u32``/``bool``-typed: a Python or NumPy number, converted to the
  declared type and range-checked), a sequence of numbers (``vecN<T>``), raw bytes or a NumPy
  array (anything else), or a Tensor / DeviceBuffer; scalars go to a small buffer made for the
  launch. ``var<uniform>`` bindings are refused (use ``var<storage, read>``): the backend binds
  storage buffers only.

WGSL fixes the workgroup size in the source (``@workgroup_size(x, y, z)``), so ``block`` must
equal it (or be omitted with ``dispatch_compute``); ``grid`` counts workgroups per dimension.
Workgroup sizes are checked against the device's limits when the kernel is loaded, workgroup
counts and bindings when it is launched, each refusal an InvalidArgumentError.

Caches. WebGPU has no pipeline binaries: a pipeline is compiled by the driver every time a process
creates it. What is cached:

- in memory, per backend: the compiled pipeline, keyed by source and entry point (the second
  ``load_kernel`` of a source compiles nothing: ``gpu.compiles`` is unchanged);
- on disk (``$ACCELKIT_CACHE_DIR/webgpu-kernels``, else the platform cache folder's, one JSON file
  per key): the metadata of a source that *validated* on this adapter: its entry points, their
  workgroup sizes and its bindings, so a later process skips parsing and reflection; the key
  hashes the source, the language, wgpu-py's version and the adapter.

What is not cached: the pipeline itself (recompiled once per process and source) and any source
that failed to compile.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import struct
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np

from accelkit.calibration import cache_dir
from accelkit.errors import (
    InvalidArgumentError,
    KernelCompileError,
    StaleHandleError,
    UnsupportedOperationError,
)
from accelkit.sdk import (
    DeviceBuffer,
    KernelExecutor,
    KernelHandle,
    KernelInfo,
    check_launch_dims,
    check_tensor,
    storage,
)
from accelkit.tensor import Tensor
from accelkit_webgpu.gpu import Block
from accelkit_webgpu.submit import WebGPUComponent

if TYPE_CHECKING:
    from accelkit_webgpu.backend import WebGPUBackend

__all__ = [
    "BindingDecl",
    "ShaderMeta",
    "WebGPUKernelExecutor",
    "kernel_cache_dir",
    "reflect_spirv",
    "reflect_wgsl",
]

_FORMAT = "accelkit-webgpu-kernel"
_VERSION = 1


def kernel_cache_dir() -> Path:
    """Where the metadata of validated kernels goes: ``$ACCELKIT_WEBGPU_CACHE``, else
    ``<cache_dir>/webgpu-kernels``, where ``cache_dir`` is ``ACCELKIT_CACHE_DIR`` or the
    platform's user cache folder."""
    own = os.environ.get("ACCELKIT_WEBGPU_CACHE")
    return Path(own) if own else cache_dir() / "webgpu-kernels"


# -- metadata ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BindingDecl:
    """One resource declaration of a shader."""

    group: int
    binding: int
    name: str
    space: str  # "storage", "uniform", or another address space / resource kind
    access: str  # "read" or "read_write"
    type: str  # the WGSL type as written ("" for SPIR-V)
    runtime_array: bool  # a runtime-sized array (takes a tensor)

    @property
    def writable(self) -> bool:
        return self.access == "read_write"


@dataclass(frozen=True)
class ShaderMeta:
    """What a shader declares: ``@compute`` entry points (name -> workgroup size, None where the
    size is not a literal) and bindings (sorted by group and binding)."""

    entries: dict[str, tuple[int, int, int] | None]
    bindings: tuple[BindingDecl, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "entries": {k: list(v) if v else None for k, v in self.entries.items()},
            "bindings": [b.__dict__ for b in self.bindings],
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> ShaderMeta:
        entries: dict[str, tuple[int, int, int] | None] = {}
        for k, v in data["entries"].items():
            entries[str(k)] = None if v is None else (int(v[0]), int(v[1]), int(v[2]))
        bindings = tuple(BindingDecl(**b) for b in data["bindings"])
        return ShaderMeta(entries, bindings)


def _strip_comments(src: str) -> str:
    """``src`` with comments blanked out (line structure kept); block comments nest in WGSL."""
    out: list[str] = []
    i, n, depth = 0, len(src), 0
    while i < n:
        two = src[i : i + 2]
        if depth == 0 and two == "//":
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif two == "/*":
            depth += 1
            out.append("  ")
            i += 2
        elif depth and two == "*/":
            depth -= 1
            out.append("  ")
            i += 2
        elif depth:
            out.append("\n" if src[i] == "\n" else " ")
            i += 1
        else:
            out.append(src[i])
            i += 1
    return "".join(out)


_ATTRS = r"((?:@\s*\w+\s*(?:\([^)]*\))?\s*)+)"
_VAR = re.compile(_ATTRS + r"var\s*(?:<([^>]*)>)?\s*(\w+)\s*:\s*([^;=]+?)\s*;")
_FN = re.compile(_ATTRS + r"fn\s+(\w+)\s*\(")
_ATTR = re.compile(r"@\s*(\w+)\s*(?:\(([^)]*)\))?")
_CONST = re.compile(r"\b(?:const|override)\s+(\w+)\s*(?::\s*\w+\s*)?=\s*([0-9a-fA-Fx]+)[iu]?\s*;")


def _attrs(text: str) -> dict[str, str]:
    return {m.group(1): (m.group(2) or "").strip() for m in _ATTR.finditer(text)}


def _int_literal(text: str, consts: dict[str, int]) -> int | None:
    t = text.strip()
    if t in consts:
        return consts[t]
    t = t.rstrip("iu")
    try:
        return int(t, 0)
    except ValueError:
        return None


def reflect_wgsl(source: str) -> ShaderMeta:
    """Entry points and bindings of a WGSL module, parsed from its text (the compiler validates
    it afterwards; this only reads declarations)."""
    text = _strip_comments(source)
    consts: dict[str, int] = {}
    for m in _CONST.finditer(text):
        with contextlib.suppress(ValueError):
            consts[m.group(1)] = int(m.group(2), 0)
    entries: dict[str, tuple[int, int, int] | None] = {}
    for m in _FN.finditer(text):
        attrs = _attrs(m.group(1))
        if "compute" not in attrs:
            continue
        size: tuple[int, int, int] | None = None
        if "workgroup_size" in attrs:
            parts = [p for p in attrs["workgroup_size"].split(",") if p.strip()]
            dims = [_int_literal(p, consts) for p in parts]
            if dims and all(d is not None for d in dims):
                full = [int(d) for d in dims if d is not None] + [1] * (3 - len(dims))
                size = (full[0], full[1], full[2])
        entries[m.group(2)] = size
    bindings: list[BindingDecl] = []
    for m in _VAR.finditer(text):
        attrs = _attrs(m.group(1))
        if "binding" not in attrs:
            continue
        space_access = [p.strip() for p in (m.group(2) or "").split(",") if p.strip()]
        space = space_access[0] if space_access else "handle"
        access = space_access[1] if len(space_access) > 1 else "read"
        wtype = " ".join(m.group(4).split())
        runtime = bool(re.fullmatch(r"array\s*<[^,]*(<[^>]*>)?[^,]*>", wtype))
        bindings.append(
            BindingDecl(
                group=_int_literal(attrs.get("group", "0"), consts) or 0,
                binding=_int_literal(attrs["binding"], consts) or 0,
                name=m.group(3),
                space=space,
                access=access,
                type=wtype,
                runtime_array=runtime,
            )
        )
    bindings.sort(key=lambda b: (b.group, b.binding))
    return ShaderMeta(entries, tuple(bindings))


_SPIRV_MAGIC = 0x07230203


def reflect_spirv(code: bytes) -> ShaderMeta:
    """Compute entry points (with ``LocalSize``) and storage-buffer bindings of a SPIR-V module,
    read from its instructions. A buffer is read-only when it (or every member of its block) is
    decorated ``NonWritable``. InvalidArgumentError if ``code`` is not SPIR-V."""
    if len(code) < 20 or len(code) % 4:
        raise InvalidArgumentError("not a SPIR-V module: its length is not a whole number of words")
    words = list(struct.unpack(f"<{len(code) // 4}I", code))
    if words[0] != _SPIRV_MAGIC:
        swapped = list(struct.unpack(f">{len(code) // 4}I", code))
        if swapped[0] != _SPIRV_MAGIC:
            raise InvalidArgumentError("not a SPIR-V module: no magic number 0x07230203")
        words = swapped
    names: dict[int, str] = {}
    entry_ids: dict[int, str] = {}
    sizes: dict[int, tuple[int, int, int] | None] = {}
    deco: dict[int, dict[int, int]] = {}
    member_nonwritable: dict[int, set[int]] = {}
    members: dict[int, int] = {}
    pointers: dict[int, tuple[int, int]] = {}  # pointer type id -> (storage class, pointee)
    variables: list[tuple[int, int, int]] = []  # (result id, pointer type, storage class)

    def string(at: int, end: int) -> str:
        raw = struct.pack(f"<{end - at}I", *words[at:end])
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")

    i = 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if count == 0 or i + count > len(words):
            raise InvalidArgumentError("not a valid SPIR-V module: a truncated instruction")
        ops = words[i + 1 : i + count]
        if op == 15 and ops[0] == 5:  # OpEntryPoint GLCompute
            entry_ids[ops[1]] = string(i + 3, i + count)
        elif op == 16 and len(ops) >= 5 and ops[1] == 17:  # OpExecutionMode LocalSize
            sizes[ops[0]] = (ops[2], ops[3], ops[4])
        elif op == 16 and len(ops) >= 2 and ops[1] == 38:  # LocalSizeId: not a literal
            sizes.setdefault(ops[0], None)
        elif op == 5:  # OpName
            names[ops[0]] = string(i + 2, i + count)
        elif op == 71 and len(ops) >= 2:  # OpDecorate
            deco.setdefault(ops[0], {})[ops[1]] = ops[2] if len(ops) > 2 else 1
        elif op == 72 and len(ops) >= 3 and ops[2] == 24:  # OpMemberDecorate NonWritable
            member_nonwritable.setdefault(ops[0], set()).add(ops[1])
        elif op == 30:  # OpTypeStruct
            members[ops[0]] = len(ops) - 1
        elif op == 32:  # OpTypePointer
            pointers[ops[0]] = (ops[1], ops[2])
        elif op == 59:  # OpVariable
            variables.append((ops[1], ops[0], ops[2]))
        i += count
    entries = {name: sizes.get(fid) for fid, name in entry_ids.items()}
    bindings: list[BindingDecl] = []
    for vid, ptype, sclass in variables:
        d = deco.get(vid, {})
        if 33 not in d:  # no Binding decoration: not a resource
            continue
        pointee = pointers.get(ptype, (sclass, 0))[1]
        pd = deco.get(pointee, {})
        if sclass == 12 or (sclass == 2 and 3 in pd):  # StorageBuffer, or Uniform+BufferBlock
            space = "storage"
        elif sclass == 2:
            space = "uniform"
        else:
            space = "handle"
        nw = member_nonwritable.get(pointee, set())
        readonly = 24 in d or (members.get(pointee, -1) > 0 and len(nw) == members[pointee])
        bindings.append(
            BindingDecl(
                group=d.get(34, 0),
                binding=d[33],
                name=names.get(vid, f"%{vid}"),
                space=space,
                access="read" if readonly else "read_write",
                type="",
                runtime_array=True,
            )
        )
    bindings.sort(key=lambda b: (b.group, b.binding))
    return ShaderMeta(entries, tuple(bindings))


# -- scalar arguments -------------------------------------------------------------------------------
_SCALARS: dict[str, Any] = {"f32": np.float32, "i32": np.int32, "u32": np.uint32, "f16": np.float16}
_VEC = re.compile(r"vec([234])\s*(?:<\s*(\w+)\s*>|([fiuh]))$")


def _scalar_bytes(decl: BindingDecl, value: Any, index: int) -> bytes:
    """``value`` as the bytes of ``decl``'s type (scalars and vectors converted and checked;
    other types take raw bytes)."""
    t = decl.type
    vec = _VEC.match(t)
    if t in _SCALARS or t == "bool" or vec:
        if vec:
            n = int(vec.group(1))
            elem = vec.group(2) or {"f": "f32", "i": "i32", "u": "u32", "h": "f16"}[vec.group(3)]
            if isinstance(value, str | bytes) or not isinstance(value, Sequence | np.ndarray):
                raise InvalidArgumentError(
                    f"execute_kernel: args[{index}] binds {decl.name}: {t}; pass a sequence of"
                    f" {n} numbers, not {type(value).__name__}"
                )
            items = list(np.asarray(value).reshape(-1)) if isinstance(value, np.ndarray) else value
            if len(items) != n:
                raise InvalidArgumentError(
                    f"execute_kernel: args[{index}] binds {decl.name}: {t}; got {len(items)} values"
                )
        else:
            elem, items = ("u32" if t == "bool" else t), [value]
        kind = _SCALARS.get(elem)
        if kind is None:
            raise InvalidArgumentError(f"execute_kernel: args[{index}]: cannot pass a {t}")
        out = []
        for v in items:
            if isinstance(v, Tensor | DeviceBuffer) or not isinstance(
                v, bool | int | float | np.number | np.bool_
            ):
                raise InvalidArgumentError(
                    f"execute_kernel: args[{index}] binds {decl.name}: {t}; expected a number, got"
                    f" {type(v).__name__}"
                )
            np_kind = np.dtype(kind)
            if np_kind.kind in "iu":
                if isinstance(v, float | np.floating):
                    raise InvalidArgumentError(
                        f"execute_kernel: args[{index}] binds {decl.name}: {t} (an integer); got"
                        f" the float {v}"
                    )
                info = np.iinfo(np_kind)
                if not info.min <= int(v) <= info.max:
                    raise InvalidArgumentError(
                        f"execute_kernel: args[{index}] = {v} does not fit {decl.name}: {t}"
                    )
            out.append(np.array(v).astype(kind))
        data = b"".join(a.tobytes() for a in out)
    elif isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
    elif isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value).tobytes()
    else:
        raise InvalidArgumentError(
            f"execute_kernel: args[{index}] binds {decl.name}: {t}; pass a Tensor, a DeviceBuffer,"
            f" bytes or a NumPy array, not {type(value).__name__}"
        )
    if not data:
        raise InvalidArgumentError(f"execute_kernel: args[{index}] is empty")
    return data + b"\0" * (-len(data) % 16)


# -- the executor -----------------------------------------------------------------------------------
class _Loaded:
    __slots__ = ("code", "entry", "language", "meta", "writable")

    def __init__(self, code: str | bytes, entry: str, language: str, meta: ShaderMeta) -> None:
        self.code = code
        self.entry = entry
        self.language = language
        self.meta = meta
        self.writable = tuple(b.writable for b in meta.bindings)


class WebGPUKernelExecutor(WebGPUComponent, KernelExecutor):
    """User compute shaders (``language="wgsl"``; ``"spirv"`` on Vulkan adapters). See the
    module docstring for the argument convention and what is cached where."""

    languages = frozenset({"wgsl"})

    def __init__(self, backend: WebGPUBackend) -> None:
        super().__init__(backend)
        self._loaded: dict[tuple[str, str], _Loaded] = {}
        self._meta: dict[str, ShaderMeta] = {}
        self._lock = threading.Lock()
        #: Where load_kernel found kernels' metadata: this process's memory, the disk cache, or
        #: nowhere (parsed from the source). Pipelines: see ``gpu.compiles``.
        self.hits = {"memory": 0, "disk": 0, "parsed": 0}
        self.languages = frozenset({"wgsl", "spirv"} if self.spirv_supported else {"wgsl"})

    @property
    def spirv_supported(self) -> bool:
        """Whether the adapter takes SPIR-V: wgpu-native translates SPIR-V modules for Vulkan
        adapters; on GL (and elsewhere) they are refused."""
        return self._backend_type().lower() == "vulkan"

    def _backend_type(self) -> str:
        try:
            return str(dict(self.gpu.adapter.info).get("backend_type", ""))
        except Exception:
            return ""

    # -- loading ----------------------------------------------------------------------------------
    def _key(self, code: str | bytes, language: str) -> str:
        import wgpu

        h = hashlib.sha256()
        h.update(language.encode())
        h.update(b"\0")
        h.update(code.encode() if isinstance(code, str) else code)
        info = dict(self.gpu.adapter.info)
        for part in (wgpu.__version__, info.get("device", ""), info.get("description", "")):
            h.update(b"\0" + str(part).encode())
        h.update(b"\0" + self._backend_type().encode())
        return h.hexdigest()[:40]

    def _read_disk(self, key: str) -> ShaderMeta | None:
        path = kernel_cache_dir() / f"{key}.json"
        try:
            data = json.loads(path.read_text())
            if data.get("format") != _FORMAT or data.get("version") != _VERSION:
                return None
            return ShaderMeta.from_json(data)
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            return None

    def _write_disk(self, key: str, meta: ShaderMeta) -> None:
        folder = kernel_cache_dir()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
            with os.fdopen(fd, "w") as fh:
                json.dump({"format": _FORMAT, "version": _VERSION, **meta.to_json()}, fh)
            os.replace(tmp, folder / f"{key}.json")
        except OSError:  # a read-only or full cache folder only costs the next process a parse
            pass

    def _metadata(self, code: str | bytes, key: str) -> tuple[ShaderMeta, str]:
        """Memory, then disk, then reflection (written to disk only once it compiled)."""
        with self._lock:
            meta = self._meta.get(key)
        if meta is not None:
            self.hits["memory"] += 1
            return meta, "memory"
        meta = self._read_disk(key)
        if meta is not None:
            self.hits["disk"] += 1
            return meta, "disk"
        self.hits["parsed"] += 1
        meta = reflect_wgsl(code) if isinstance(code, str) else reflect_spirv(code)
        return meta, "parsed"

    def _check_meta(self, meta: ShaderMeta, entry: str | None, what: str) -> str:
        """The entry point to use; the bindings and workgroup size checked against what the
        backend binds and the device's limits."""
        if not meta.entries:
            raise InvalidArgumentError(f"{what}: the shader has no @compute entry point")
        if entry is None:
            if len(meta.entries) != 1:
                raise InvalidArgumentError(
                    f"{what}: the shader has several @compute entry points"
                    f" ({', '.join(meta.entries)}); load the one you want with load_kernel"
                )
            entry = next(iter(meta.entries))
        elif entry not in meta.entries:
            raise InvalidArgumentError(
                f"{what}: the shader has no @compute entry point {entry!r}; it defines:"
                f" {', '.join(meta.entries)}"
            )
        for k, b in enumerate(meta.bindings):
            if b.group != 0:
                raise UnsupportedOperationError(
                    f"{what}: {b.name} is in @group({b.group}); the webgpu backend binds"
                    " @group(0) only"
                )
            if b.space != "storage":
                raise UnsupportedOperationError(
                    f"{what}: {b.name} is a var<{b.space}> binding; the webgpu backend binds"
                    " storage buffers only: declare it var<storage, read> (scalars are passed"
                    " that way too)"
                )
            if b.binding != k:
                raise InvalidArgumentError(
                    f"{what}: bindings must be numbered 0..{len(meta.bindings) - 1} without gaps;"
                    f" {b.name} is @binding({b.binding})"
                )
        gpu = self.gpu
        if len(meta.bindings) > gpu.max_storage_buffers:
            raise InvalidArgumentError(
                f"{what}: {len(meta.bindings)} storage bindings; {self.backend.device} allows"
                f" {gpu.max_storage_buffers} per shader stage"
            )
        self._check_workgroup(meta.entries[entry], what)
        return entry

    def _check_workgroup(self, size: tuple[int, int, int] | None, what: str) -> None:
        if size is None:
            return
        gpu = self.gpu
        for axis, d, limit in zip("xyz", size, gpu.max_wg_size, strict=True):
            if d > limit:
                raise InvalidArgumentError(
                    f"{what}: @workgroup_size {size}: {axis} = {d} exceeds {self.backend.device}'s"
                    f" limit of {limit} (maxComputeWorkgroupSize{axis.upper()})"
                )
        total = size[0] * size[1] * size[2]
        if total > gpu.max_invocations:
            raise InvalidArgumentError(
                f"{what}: @workgroup_size {size} has {total} invocations; {self.backend.device}"
                f" allows {gpu.max_invocations} (maxComputeInvocationsPerWorkgroup)"
            )

    def _check_code(self, code: Any, language: str, what: str) -> str | bytes:
        if language == "wgsl":
            if not isinstance(code, str) or not code.strip():
                raise InvalidArgumentError(f"{what}: WGSL source must be a non-empty string")
            return code
        if language == "spirv":
            if not isinstance(code, bytes | bytearray | memoryview):
                raise InvalidArgumentError(
                    f"{what}: a SPIR-V module is bytes; got {type(code).__name__}"
                )
            if not self.spirv_supported:
                raise UnsupportedOperationError(
                    f"{what}: {self.backend.device} is a {self._backend_type() or 'non-Vulkan'}"
                    " adapter, which takes no SPIR-V (wgpu-native translates SPIR-V for Vulkan"
                    " adapters only); pass WGSL source instead"
                )
            return bytes(code)
        raise UnsupportedOperationError(
            f"the webgpu backend runs WGSL (language='wgsl')"
            f"{' or SPIR-V (language=' + repr('spirv') + ')' if self.spirv_supported else ''};"
            f" got {language!r}"
        )

    async def load_kernel(
        self, source: str, name: str, *, language: str = "wgsl", options: Sequence[str] = ()
    ) -> KernelHandle:
        """Compile the ``@compute`` entry point ``name`` of ``source`` into a pipeline (off the
        event loop), or fetch it from the caches. WGSL errors raise KernelCompileError with
        wgpu's message (line and column). ``options`` must be empty: WGSL has no compiler
        options (use ``override`` constants or generate the source)."""
        backend = self.backend
        backend.check_ready()
        self.gpu.check()
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError("load_kernel: name must be a non-empty string")
        if isinstance(options, str) or any(not isinstance(o, str) for o in options):
            raise InvalidArgumentError("load_kernel: options must be a sequence of strings")
        if tuple(options):
            raise InvalidArgumentError(
                f"load_kernel: WGSL takes no compiler options; got {tuple(options)}"
            )
        if isinstance(source, bytes | bytearray | memoryview) and language == "wgsl":
            language = "spirv"  # bytes are a SPIR-V module
        code = self._check_code(source, language, "load_kernel")
        key = self._key(code, language)
        meta, found = self._metadata(code, key)
        entry = self._check_meta(meta, name, "load_kernel")
        loaded = _Loaded(code, entry, language, meta)
        await anyio.to_thread.run_sync(self._pipeline, loaded)
        with self._lock:
            self._meta[key] = meta
            self._loaded[(key, entry)] = loaded
        if found == "parsed":  # validated now: later processes skip the parse
            await anyio.to_thread.run_sync(self._write_disk, key, meta)
        return KernelHandle(
            name=entry,
            language=language,
            key=key,
            backend="webgpu",
            device=str(backend.device),
            generation=backend.generation,
        )

    def _pipeline(self, loaded: _Loaded) -> Any:
        """The compute pipeline (on a worker thread): gpu.pipeline for WGSL; SPIR-V through the
        same layout, its errors as KernelCompileError."""
        gpu = self.gpu
        if isinstance(loaded.code, str):
            return gpu.pipeline(loaded.code, loaded.writable, loaded.entry)
        # SPIR-V pipelines share the device's cache (its keys are (source, entry) pairs).
        cache = gpu._pipelines
        key = (loaded.code, loaded.entry)
        found = cache.get(key)
        if found is not None:
            return found
        with gpu.lock:
            gpu.check()
            _, layout = gpu._layout(loaded.writable)
            try:
                module = gpu.device.create_shader_module(code=loaded.code)
                found = gpu.device.create_compute_pipeline(
                    layout=layout, compute={"module": module, "entry_point": loaded.entry}
                )
            except Exception as exc:
                raise KernelCompileError(
                    f"the SPIR-V module failed on {gpu.label} ({self._backend_type()}):\n{exc}"
                ) from None
            gpu.compiles += 1
            cache[key] = found
        return found

    def _get(self, handle: KernelHandle) -> _Loaded:
        self.backend.check_ready()
        if not isinstance(handle, KernelHandle):
            raise InvalidArgumentError(f"expected a KernelHandle; got {type(handle).__name__}")
        loaded = self._loaded.get((handle.key, handle.name))
        if (
            loaded is None
            or handle.backend != "webgpu"
            or handle.generation != self.backend.generation
        ):
            raise StaleHandleError(
                f"kernel {handle.name!r} was unloaded, or belongs to another backend or session"
            )
        return loaded

    # -- launching --------------------------------------------------------------------------------
    def _groups(self, grid: Any, what: str) -> tuple[int, int, int]:
        dims = check_launch_dims(grid, what)
        full = (*dims, *(1,) * (3 - len(dims)))
        limit = self.gpu.max_groups
        for axis, d in zip("xyz", full, strict=True):
            if d > limit:
                raise InvalidArgumentError(
                    f"execute_kernel: {what}.{axis} = {d} workgroups exceeds"
                    f" {self.backend.device}'s limit of {limit}"
                    " (maxComputeWorkgroupsPerDimension); split the dispatch"
                )
        return full[0], full[1], full[2]

    def _bind(
        self, meta: ShaderMeta, args: Sequence[Any], name: str
    ) -> tuple[list[Any], list[Tensor], list[Tensor], list[Any]]:
        """Per binding: a Block and size, or scalar bytes; the tensors read and written; the
        buffers the launch keeps alive."""
        if isinstance(args, str | bytes) or not isinstance(args, Sequence):
            raise InvalidArgumentError("execute_kernel: args must be a sequence")
        decls = meta.bindings
        if len(args) != len(decls):
            listed = ", ".join(
                f"@binding({b.binding}) {b.name}: {b.type or '?'} ({b.access})" for b in decls
            )
            raise InvalidArgumentError(
                f"execute_kernel: {name} declares {len(decls)} bindings ({listed or 'none'});"
                f" got {len(args)} arguments"
            )
        resources: list[Any] = []
        reads: list[Tensor] = []
        writes: list[Tensor] = []
        keep: list[Any] = []
        limit = self.gpu.max_binding
        for i, (decl, arg) in enumerate(zip(decls, args, strict=True)):
            if isinstance(arg, Tensor):
                check_tensor(self.backend, arg, f"args[{i}]")
                blk: Block = storage(arg)
                size = arg.size * arg.dtype.itemsize
                reads.append(arg)
                if decl.writable:
                    writes.append(arg)
                resources.append((blk, size))
            elif isinstance(arg, DeviceBuffer):
                buf = self.backend.memory_manager.owned_buffer(arg, f"args[{i}]")
                keep.append(buf)
                size = int(buf.nbytes)
                resources.append((buf.handle, size))
            else:
                if decl.runtime_array:
                    raise InvalidArgumentError(
                        f"execute_kernel: args[{i}] binds {decl.name}: {decl.type or 'a buffer'}"
                        f" (a runtime-sized array); pass a Tensor or a DeviceBuffer, not"
                        f" {type(arg).__name__}"
                    )
                if decl.writable:
                    raise InvalidArgumentError(
                        f"execute_kernel: args[{i}] binds {decl.name}, which is read_write; a"
                        " scalar argument needs var<storage, read>, or pass a Tensor"
                    )
                data = _scalar_bytes(decl, arg, i)
                size = len(data)
                resources.append(data)
            if size > limit:
                raise InvalidArgumentError(
                    f"execute_kernel: args[{i}] has {size} bytes; one storage binding of"
                    f" {self.backend.device} holds {limit} (maxStorageBufferBindingSize)"
                )
        return resources, reads, writes, keep

    def _submit(
        self,
        loaded: _Loaded,
        groups: tuple[int, int, int],
        resources: list[Any],
        reads: list[Tensor],
        writes: list[Tensor],
        keep: list[Any],
    ) -> None:
        gpu = self.gpu
        wgpu = gpu.wgpu

        def run(_keep: list[Any] = keep) -> None:
            pipe = self._pipeline(loaded)
            with gpu.lock:
                gpu.check()
                entries = []
                for k, res in enumerate(resources):
                    if isinstance(res, bytes):
                        buf = gpu.device.create_buffer_with_data(
                            data=res, usage=wgpu.BufferUsage.STORAGE
                        )
                        size = len(res)
                    else:
                        blk, nbytes = res
                        buf = blk.buffer()
                        size = max(4, -(-nbytes // 4) * 4)
                    entries.append(
                        {"binding": k, "resource": {"buffer": buf, "offset": 0, "size": size}}
                    )
                bgl, _ = gpu._layout(loaded.writable)
                group = gpu.device.create_bind_group(layout=bgl, entries=entries)
                enc = gpu.device.create_command_encoder()
                cpass = enc.begin_compute_pass()
                cpass.set_pipeline(pipe)
                cpass.set_bind_group(0, group)
                cpass.dispatch_workgroups(*groups)
                cpass.end()
                gpu.queue.submit([enc.finish()])

        self.launch(run, reads, writes)

    def execute_kernel(
        self,
        handle: KernelHandle,
        grid: Sequence[int],
        block: Sequence[int],
        args: Sequence[Any],
    ) -> None:
        """Dispatch ``grid`` workgroups of the kernel on the current stream. ``block`` must be
        the shader's ``@workgroup_size`` (WGSL fixes it in the source). Tensors bound
        ``read_write`` are written by the launch; later work on them waits for it."""
        loaded = self._get(handle)
        self.gpu.check()
        groups = self._groups(grid, "grid")
        dims = check_launch_dims(block, "block")
        block3 = (*dims, *(1,) * (3 - len(dims)))
        size = loaded.meta.entries.get(loaded.entry)
        self._check_workgroup((block3[0], block3[1], block3[2]), "execute_kernel: block")
        if size is not None and tuple(block3) != size:
            raise InvalidArgumentError(
                f"execute_kernel: block {tuple(dims)} must equal {handle.name}'s"
                f" @workgroup_size {size}: WGSL fixes the workgroup size in the source"
            )
        resources, reads, writes, keep = self._bind(loaded.meta, args, handle.name)
        self._submit(loaded, groups, resources, reads, writes, keep)

    def dispatch_compute(
        self,
        shader: bytes | str,
        bindings: Sequence[Any],
        push_constants: bytes = b"",
        workgroups: Sequence[int] = (1, 1, 1),
    ) -> None:
        """Run the one ``@compute`` entry point of a WGSL source (or a SPIR-V module where the
        adapter takes them) over ``workgroups``, ``bindings[k]`` at ``@binding(k)`` as for
        :meth:`execute_kernel`. Arguments, bindings and limits are checked at once; the
        pipeline is compiled (once per source) on the stream's worker, so a compile error is
        raised (KernelCompileError) when a tensor it writes is awaited. WebGPU has no push
        constants: pass them as a ``var<storage, read>`` binding instead."""
        self.backend.check_ready()
        self.gpu.check()
        if push_constants:
            raise UnsupportedOperationError(
                "dispatch_compute: WebGPU has no push constants; declare a var<storage, read>"
                " binding and pass the values (or bytes) as one of the bindings"
            )
        language = "wgsl" if isinstance(shader, str) else "spirv"
        code = self._check_code(shader, language, "dispatch_compute")
        key = self._key(code, language)
        with self._lock:
            meta = self._meta.get(key)
        if meta is None:
            meta = reflect_wgsl(code) if isinstance(code, str) else reflect_spirv(code)
        entry = self._check_meta(meta, None, "dispatch_compute")
        with self._lock:
            self._meta.setdefault(key, meta)
        loaded = _Loaded(code, entry, language, meta)
        groups = self._groups(workgroups, "workgroups")
        resources, reads, writes, keep = self._bind(meta, bindings, entry)
        self._submit(loaded, groups, resources, reads, writes, keep)

    # -- info -------------------------------------------------------------------------------------
    def kernel_info(self, handle: KernelHandle) -> KernelInfo:
        loaded = self._get(handle)
        size = loaded.meta.entries.get(loaded.entry)
        code = loaded.code
        shared = _workgroup_bytes(code) if isinstance(code, str) else 0
        return KernelInfo(
            name=handle.name,
            max_threads_per_block=(size[0] * size[1] * size[2]) if size else 0,
            shared_memory_bytes=shared,
            extra={
                "language": loaded.language,
                "workgroup_size": list(size) if size else None,
                "bindings": [
                    {"binding": b.binding, "name": b.name, "access": b.access, "type": b.type}
                    for b in loaded.meta.bindings
                ],
                "entry_points": sorted(loaded.meta.entries),
                "max_invocations": self.gpu.max_invocations,
                "max_workgroups_per_dimension": self.gpu.max_groups,
            },
        )

    def unload_kernel(self, handle: KernelHandle) -> None:
        loaded = self._get(handle)
        with self._lock:
            self._loaded.pop((handle.key, handle.name), None)
        # The pipeline stays in the device's cache only while a handle uses it.
        if not any(
            v.code == loaded.code and v.entry == loaded.entry for v in self._loaded.values()
        ):
            with self.gpu.lock:
                self.gpu._pipelines.pop((loaded.code, loaded.entry), None)


_WG_VAR = re.compile(r"var\s*<\s*workgroup\s*>\s*\w+\s*:\s*([^;]+);")
_SIZES = {"f32": 4, "i32": 4, "u32": 4, "f16": 2, "bool": 4}


def _type_bytes(t: str) -> int:
    t = "".join(t.split())
    if t.startswith("atomic<"):
        return 4
    if t in _SIZES:
        return _SIZES[t]
    vec = re.fullmatch(r"vec([234])<(\w+)>", t)
    if vec:
        n = int(vec.group(1))
        return (4 if n == 3 else n) * _SIZES.get(vec.group(2), 4)
    arr = re.fullmatch(r"array<(.+),(\w+)>", t)
    if arr:
        try:
            return _type_bytes(arr.group(1)) * int(arr.group(2).rstrip("iu"), 0)
        except ValueError:
            return 0
    return 0


def _workgroup_bytes(source: str) -> int:
    """The bytes of the module's ``var<workgroup>`` declarations (0 for types not sized here)."""
    return sum(_type_bytes(m.group(1)) for m in _WG_VAR.finditer(_strip_comments(source)))
