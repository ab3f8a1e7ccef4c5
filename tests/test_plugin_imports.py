"""Plugins are written against the public SDK: no plugin in this repository imports accelkit's
private modules (``accelkit._core``) or another backend's modules (``accelkit.backends`` or a
sibling plugin), so a refactor of the core cannot break them, and reaches tensors only through
their public properties and ``accelkit.sdk``'s tensor functions (``storage``, ``view_of``,
``last_writer``, ``mark_written``...), never their private slots. The example backend that
docs/plugins.md walks through is held to the same."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Every device plugin's package (the test plugins under tests/plugins extend the CPU backend on
#: purpose, for registry, fallback and doctor tests, and are not held to this).
PLUGIN_SOURCES = sorted(ROOT.glob("plugins/*/src/*"))
#: The example backend distribution, written only against accelkit.sdk and the public API.
EXAMPLE = ROOT / "tests" / "plugins" / "accelkit-example" / "src" / "accelkit_example"
#: A Tensor's private slots (``accelkit.tensor.Tensor.__slots__``).
TENSOR_SLOTS = {
    "_backend", "_buffer", "_data", "_device", "_dtype", "_seq", "_shape", "_size", "_stream",
}  # fmt: skip
#: A plugin's own attribute of the same name as a slot, read on another object of its class.


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
    return found


def _forbidden(module: str, own: str) -> str | None:
    if module == "accelkit._core" or module.startswith("accelkit._core."):
        return "accelkit._core is private; import what a backend needs from accelkit.sdk"
    if module == "accelkit.backends" or module.startswith("accelkit.backends."):
        return "another backend's modules; import from accelkit.sdk"
    top = module.split(".")[0]
    if top.startswith("accelkit_") and top != own:
        return f"another plugin's package ({top})"
    return None


@pytest.mark.parametrize("package", [*PLUGIN_SOURCES, EXAMPLE], ids=lambda p: p.name)
def test_a_plugin_imports_only_the_public_api(package: Path) -> None:
    assert package.is_dir(), package
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {module}: {why}"
        for path in sorted(package.rglob("*.py"))
        for line, module in _imports(path)
        if (why := _forbidden(module, package.name))
    ]
    assert not problems, "\n".join(problems)


def test_the_check_catches_a_private_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from accelkit._core.pool import CachingPool\nimport accelkit.backends.cpu\n")
    found = [_forbidden(m, "accelkit_bad") for _, m in _imports(bad)]
    assert all(found)
    assert len(found) == 2


def _slot_reads(path: Path) -> list[tuple[int, str]]:
    """``x._data`` and the like, on anything but ``self``."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        (node.lineno, f"{ast.unparse(node.value)}.{node.attr}")
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr in TENSOR_SLOTS
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    ]


@pytest.mark.parametrize("package", [*PLUGIN_SOURCES, EXAMPLE], ids=lambda p: p.name)
def test_a_plugin_reaches_tensors_through_the_sdk(package: Path) -> None:
    assert set(TENSOR_SLOTS) < set(__import__("accelkit").Tensor.__slots__)
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {expr}"
        for path in sorted(package.rglob("*.py"))
        for line, expr in _slot_reads(path)
    ]
    assert not problems, "\n".join(problems)


def test_the_slot_check_catches_a_private_read(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f(x, self):\n    return x._data, self._data, x.shape\n")
    assert [expr for _, expr in _slot_reads(bad)] == ["x._data"]


#: The SDK classes a plugin derives from or holds (``MemoryManager``, from accelkit.ops: a
#: backend's ``memory_manager``); their underscore members are theirs alone.
SDK_CLASSES = (
    "StreamBackend", "QueuedBackend", "MemoryKernels", "MemoryManager", "KernelBase",
    "PositionStream", "TensorKernels", "FactoryKernels", "FusedKernels", "CachingPool",
    "DeviceBuffer", "DeviceErrors", "Waiters",
)  # fmt: skip
#: Hooks: underscore methods a plugin defines (overrides) and may call on ``super()``.
HOOKS = {
    "_initialize", "_shutdown", "_synchronize", "_device_count", "_device_capabilities",
    "_open_stream", "_event_done", "_default_device", "_capture_graph",
}  # fmt: skip


def _privates_of(cls: type) -> set[str]:
    """The underscore names ``cls`` and its accelkit bases define: class members and ``self._x``
    attributes assigned in their source (not dunders, not hooks)."""
    import inspect

    names: set[str] = set()
    for c in cls.__mro__:
        if not c.__module__.startswith("accelkit."):
            continue
        names.update(vars(c))
        for node in ast.walk(ast.parse(inspect.getsource(c))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")} - HOOKS


def _sdk_privates() -> dict[str, set[str]]:
    import accelkit.ops as ops
    import accelkit.sdk as sdk

    return {
        name: _privates_of(getattr(sdk, name, None) or getattr(ops, name)) for name in SDK_CLASSES
    }


def _private_uses(paths: list[Path], sdk: dict[str, set[str]]) -> list[tuple[Path, int, str]]:
    """Uses of the SDK classes' underscore members: ``self._x`` in a class deriving (through the
    package's own classes too) from an SDK class that defines ``_x``, and ``obj._x`` on any
    other object where ``_x`` is an SDK class's, even if a class of the package has an ``_x``
    of its own: without types, ``obj`` may be the SDK's object (a backend) as well as the
    package's. A hook's name on ``super()`` is allowed (hooks are not in the sets)."""
    trees = {path: ast.parse(path.read_text(), str(path)) for path in paths}
    bases: dict[str, list[str]] = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = [ast.unparse(b).split("[")[0].split(".")[-1] for b in node.bases]

    def inherited(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        if name in sdk:
            return sdk[name]
        found: set[str] = set()
        for b in bases.get(name, []):
            if b not in seen:
                found |= inherited(b, seen | {name})
        return found

    every = set().union(*sdk.values())
    found: list[tuple[Path, int, str]] = []
    for path, tree in trees.items():
        in_class: dict[int, set[str]] = {}
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            banned = inherited(cls.name)
            for node in ast.walk(cls):
                in_class[id(node)] = banned
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
                continue
            on_self = isinstance(node.value, ast.Name) and node.value.id == "self"
            banned = in_class.get(id(node), set()) if on_self else every
            if node.attr in banned:
                found.append((path, node.lineno, f"{ast.unparse(node.value)}.{node.attr}"))
    return found


@pytest.mark.parametrize("package", [*PLUGIN_SOURCES, EXAMPLE], ids=lambda p: p.name)
def test_a_plugin_touches_no_private_member_of_the_sdk(package: Path) -> None:
    sdk = _sdk_privates()
    assert {"_streams", "_pool", "_stream_var", "_state", "_caps"} <= sdk["StreamBackend"]
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {expr}"
        for path, line, expr in _private_uses(sorted(package.rglob("*.py")), sdk)
    ]
    assert not problems, (
        "a plugin uses the SDK classes' public members and hooks only:\n" + "\n".join(problems)
    )


def test_the_private_member_check_catches_a_use(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "class B(StreamBackend):\n"
        "    async def _initialize(self, d):\n"
        "        await super()._initialize(d)\n"
        "        self._streams = []\n"
        "        return self._own\n"
        "class Other:\n"
        "    def __init__(self, backend):\n"
        "        self._pool = None\n"
        "        backend._stream_var.get()\n"
        "        self._pool, backend._pool\n"
    )
    found = [e for _, _, e in _private_uses([bad], _sdk_privates())]
    # ``self._pool`` is Other's own; ``backend._pool`` may be the SDK backend's private pool
    assert sorted(found) == ["backend._pool", "backend._stream_var", "self._streams"]


def test_the_sdk_and_its_host_bodies_load_no_backend() -> None:
    """What a plugin imports sits on no backend: a fresh interpreter that imports
    ``accelkit.sdk.host`` (the NumPy bodies, and the CPU JIT a host backend may pass them) has
    loaded nothing under ``accelkit.backends``, and not Numba (the JIT imports it when a kernel
    is first wanted)."""
    code = (
        "import json, sys\n"
        "import accelkit.sdk, accelkit.sdk.host\n"
        "print(json.dumps(sorted(m for m in sys.modules"
        " if m.startswith(('accelkit.backends', 'numba')))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
